//! The write side of the SQLite store: the [`Dialect`] the batch plan writes through, row
//! by row with cached statements (SQLite runs in-process: a statement costs microseconds,
//! not a round trip), and the operations applied alone (operator commands, agent tasks,
//! renewals, hung operations), timers and claims.

use std::sync::atomic::{AtomicBool, Ordering};

use rusqlite::types::Value as SqlValue;
use rusqlite::{Connection, OptionalExtension, params};
use serde_json::Value;

use super::DUE_EXPR;
use super::read::{entity_from_row, inbox_from_row, task_from_row, timer_from_row};
use crate::plan::rows::*;
use crate::plan::{Dialect, Finish, Other, ReadSet, Reads, Writes};
use crate::sql::{ENTITY_COLS, TASK_COLS, json_text, report_push, task_refusal};
use crate::{
    AgentReport, AgentTask, Applied, Claim, Claimed, Command, InboxItem, Millis, Op, OpError, OpenOperation, RunStatus,
    SqlStatement, TaskResult, TimerRow,
};

/// The writer's connection inside a batch's transaction, as the plan's [`Dialect`].
/// The writer's transaction, and whether any agent task may be open (see
/// `Inner::tasks_open`).
pub(crate) struct Tx<'a>(pub(crate) &'a Connection, pub(crate) &'a AtomicBool);

const INBOX_COLS: &str = "id, entity_id, event, params, request_id, created_at, kind";

fn current_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Current> {
    let status = r.get_ref(13)?.as_str()?;
    Ok(Current {
        id: r.get(0)?,
        machine: r.get(1)?,
        key: r.get(2)?,
        state: r.get(3)?,
        version: r.get(4)?,
        retry: r.get(5)?,
        entered_at: r.get(6)?,
        auto_at: r.get(7)?,
        due_at: r.get(8)?,
        lease_owner: r.get(9)?,
        lease_until: r.get(10)?,
        request_id: r.get(11)?,
        timer_at: r.get(12)?,
        run_status: RunStatus::parse(status)
            .ok_or_else(|| super::read::conversion(13, format!("unknown run status `{status}`")))?,
        sleep_until: r.get(14)?,
        busy: r.get(15)?,
        event_id: r.get(16)?,
        ordinal: r.get(17)?,
        has_predecessors: r.get(18)?,
        machine_hash: r.get(19)?,
    })
}

impl Tx<'_> {
    fn claim_due(&mut self, now: Millis, claim: &Claim) -> rusqlite::Result<Vec<Claimed>> {
        let tx = self.0;
        let until = now + claim.lease_ms;
        let ids: Vec<i64> = if claim.machines.is_empty() {
            tx.prepare_cached("SELECT id FROM entities WHERE due_at <= ?1 ORDER BY due_at LIMIT ?2")?
                .query_map(params![now, claim.limit as i64], |r| r.get(0))?
                .collect::<rusqlite::Result<_>>()?
        } else {
            tx.prepare_cached(
                // Walk the due index, not the (machine, key) one, which would visit every
                // entity of the machines.
                "SELECT id FROM entities INDEXED BY entities_due
                 WHERE due_at <= ?1 AND machine IN (SELECT value FROM json_each(?3))
                 ORDER BY due_at LIMIT ?2",
            )?
            .query_map(params![now, claim.limit as i64, json_text(&claim.machines)], |r| r.get(0))?
            .collect::<rusqlite::Result<_>>()?
        };
        let mut claimed = Vec::with_capacity(ids.len());
        let mut update = tx.prepare_cached(
            // A sleeping or backing-off entity that comes due wakes up: it is active again.
            "UPDATE entities SET lease_owner = ?2, lease_until = ?3, due_at = ?3, sleep_until = NULL,
                run_status = CASE WHEN run_status IN ('sleeping', 'fault') THEN 'active' ELSE run_status END
             WHERE id = ?1",
        )?;
        let mut select = tx.prepare_cached(&format!("SELECT {ENTITY_COLS} FROM entities WHERE id = ?1"))?;
        let mut head =
            tx.prepare_cached(&format!("SELECT {INBOX_COLS} FROM inbox WHERE entity_id = ?1 ORDER BY id LIMIT 1"))?;
        for id in ids {
            update.execute(params![id, claim.owner, until])?;
            let entity = select.query_row([id], entity_from_row)?;
            let inbox_head = head.query_row([id], inbox_from_row).optional()?;
            claimed.push(Claimed { entity, inbox_head });
        }
        Ok(claimed)
    }

    fn next_due_of(&mut self, machines: &[String]) -> rusqlite::Result<Option<Millis>> {
        if machines.is_empty() {
            self.0
                .prepare_cached("SELECT MIN(due_at) FROM entities WHERE due_at IS NOT NULL")?
                .query_row([], |r| r.get(0))
        } else {
            self.0
                .prepare_cached(
                    "SELECT MIN(due_at) FROM entities INDEXED BY entities_due WHERE due_at IS NOT NULL
                       AND machine IN (SELECT value FROM json_each(?1))",
                )?
                .query_row([json_text(&machines)], |r| r.get(0))
        }
    }

    fn lock(&mut self, ids: &[i64], keys: &[(String, String)], notify: &[i64]) -> rusqlite::Result<Vec<Current>> {
        // The writer's transaction is the only one: reading is locking.
        let tx = self.0;
        let mut out = Vec::with_capacity(ids.len() + keys.len());
        let mut by_id = tx.prepare_cached(&format!("SELECT {CURRENT_COLS} FROM entities WHERE id = ?1"))?;
        for id in ids {
            out.extend(by_id.query_row([id], current_from_row).optional()?);
        }
        let mut by_key =
            tx.prepare_cached(&format!("SELECT {CURRENT_COLS} FROM entities WHERE machine = ?1 AND key = ?2"))?;
        for (machine, key) in keys {
            out.extend(by_key.query_row([machine, key], current_from_row).optional()?);
        }
        let mut preds = tx.prepare_cached(&format!(
            "SELECT {CURRENT_COLS} FROM entities
             WHERE id IN (SELECT predecessor_id FROM successors WHERE successor_id = ?1)"
        ))?;
        for id in notify {
            for row in preds.query_map([id], current_from_row)? {
                out.push(row?);
            }
        }
        Ok(out)
    }

    fn edges(&mut self, successors: &[i64]) -> rusqlite::Result<Vec<(i64, i64)>> {
        let mut stmt =
            self.0.prepare_cached("SELECT predecessor_id, successor_id FROM successors WHERE successor_id = ?1")?;
        let mut out = Vec::new();
        for id in successors {
            for edge in stmt.query_map([id], |r| Ok((r.get(0)?, r.get(1)?)))? {
                out.push(edge?);
            }
        }
        Ok(out)
    }

    fn inbox_heads(&mut self, rows: &[InboxDelete]) -> rusqlite::Result<Vec<InboxItem>> {
        let mut stmt = self.0.prepare_cached(&format!(
            "SELECT {INBOX_COLS} FROM inbox
             WHERE entity_id = ?1 AND id <> ?2 AND NOT (kind = 'notice' AND id <= ?3) ORDER BY id LIMIT 1"
        ))?;
        let mut out = Vec::with_capacity(rows.len());
        for r in rows {
            out.extend(stmt.query_row([r.entity_id, r.consume, r.notices_upto], inbox_from_row).optional()?);
        }
        Ok(out)
    }

    fn timers(&mut self, entities: &[i64]) -> rusqlite::Result<Vec<TimerRow>> {
        let mut stmt = self
            .0
            .prepare_cached("SELECT entity_id, name, event, due_at, every_ms FROM timers WHERE entity_id = ?1")?;
        let mut out = Vec::new();
        for id in entities {
            for t in stmt.query_map([id], timer_from_row)? {
                out.push(t?);
            }
        }
        Ok(out)
    }

    fn open_operations(&mut self, rows: &[OperationInsert]) -> rusqlite::Result<Vec<(i64, bool)>> {
        let mut insert = self.0.prepare_cached(
            "INSERT INTO operations (request_id, name, machine, entity_key, started_at, dimensions, first_response_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) ON CONFLICT (request_id) DO NOTHING",
        )?;
        let mut existing = self.0.prepare_cached("SELECT id FROM operations WHERE request_id = ?1")?;
        let mut out = Vec::with_capacity(rows.len());
        for o in rows {
            let n = insert.execute(params![
                o.request_id,
                o.name,
                o.machine,
                o.entity_key,
                o.started_at,
                o.dimensions,
                o.first_response_at
            ])?;
            if n == 1 {
                out.push((self.0.last_insert_rowid(), false));
            } else {
                out.push((existing.query_row([&o.request_id], |r| r.get(0))?, true));
            }
        }
        Ok(out)
    }

    fn insert_entities(&mut self, rows: &[EntityInsert]) -> rusqlite::Result<()> {
        let mut stmt = self.0.prepare_cached(
            "INSERT INTO entities (machine, key, state, properties, version, retry, created_at, entered_at, auto_at,
                due_at, request_id, busy, machine_hash, timer_at, has_predecessors, id)
             VALUES (?1, ?2, ?3, ?4, 1, 0, ?5, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
        )?;
        for e in rows {
            stmt.execute(params![
                e.machine,
                e.key,
                e.state,
                e.properties,
                e.created_at,
                e.auto_at,
                e.due_at,
                e.request_id,
                e.busy,
                e.machine_hash,
                e.timer_at,
                e.has_predecessors,
                e.id
            ])?;
        }
        Ok(())
    }

    fn update_entities(&mut self, rows: &[EntityUpdate]) -> rusqlite::Result<()> {
        let mut stmt = self.0.prepare_cached(
            "UPDATE entities SET state = ?2, version = ?3, retry = ?4, entered_at = ?5, auto_at = ?6, due_at = ?7,
                lease_owner = ?8, lease_until = ?9, request_id = ?10, timer_at = ?11, run_status = ?12,
                sleep_until = ?13, busy = ?14, event_id = ?15, ordinal = ?16, has_predecessors = ?17,
                machine_hash = ?18, properties = COALESCE(?19, properties), fired = COALESCE(?20, fired),
                recent_errors = COALESCE(?21, recent_errors)
             WHERE id = ?1",
        )?;
        for u in rows {
            let r = &u.row;
            stmt.execute(params![
                r.id,
                r.state,
                r.version,
                r.retry,
                r.entered_at,
                r.auto_at,
                r.due_at,
                r.lease_owner,
                r.lease_until,
                r.request_id,
                r.timer_at,
                r.run_status.as_str(),
                r.sleep_until,
                r.busy,
                r.event_id,
                r.ordinal,
                r.has_predecessors,
                r.machine_hash,
                u.properties,
                u.fired,
                u.recent_errors
            ])?;
        }
        Ok(())
    }

    fn delete_inbox(&mut self, rows: &[InboxDelete]) -> rusqlite::Result<()> {
        let mut stmt = self
            .0
            .prepare_cached("DELETE FROM inbox WHERE entity_id = ?1 AND (id = ?2 OR (kind = 'notice' AND id <= ?3))")?;
        for r in rows {
            stmt.execute([r.entity_id, r.consume, r.notices_upto])?;
        }
        Ok(())
    }

    fn insert_inbox(&mut self, rows: &[InboxInsert]) -> rusqlite::Result<Vec<i64>> {
        let mut stmt = self.0.prepare_cached(
            "INSERT INTO inbox (entity_id, event, params, request_id, kind, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        )?;
        let mut ids = Vec::with_capacity(rows.len());
        for i in rows {
            stmt.execute(params![i.entity_id, i.event, i.params, i.request_id, i.kind, i.created_at])?;
            ids.push(self.0.last_insert_rowid());
        }
        Ok(ids)
    }

    fn insert_history(&mut self, rows: &[HistoryInsert]) -> rusqlite::Result<()> {
        let mut stmt = self.0.prepare_cached(
            "INSERT INTO history (entity_id, from_state, to_state, kind, action, event, retry, request_id, at, detail,
                machine_hash, event_id, ordinal, transition_kind, start_health, end_health, entry_time, start_time,
                action_start_time, outcome)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20)",
        )?;
        for h in rows {
            stmt.execute(params![
                h.entity_id,
                h.from_state,
                h.to_state,
                h.kind,
                h.action,
                h.event,
                h.retry,
                h.request_id,
                h.at,
                h.detail,
                h.machine_hash,
                h.event_id,
                h.ordinal,
                h.transition_kind,
                h.start_health,
                h.end_health,
                h.entry_time,
                h.start_time,
                h.action_start_time,
                h.outcome
            ])?;
        }
        Ok(())
    }

    fn insert_successors(&mut self, rows: &[SuccessorInsert]) -> rusqlite::Result<()> {
        let mut stmt = self.0.prepare_cached(
            "INSERT INTO successors (predecessor_id, successor_id, request_id, created_at) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT (predecessor_id, successor_id) DO NOTHING",
        )?;
        for s in rows {
            stmt.execute(params![s.predecessor_id, s.successor_id, s.request_id, s.created_at])?;
        }
        Ok(())
    }

    fn replace_timers(&mut self, entities: &[i64], rows: &[TimerRow]) -> rusqlite::Result<()> {
        let mut delete = self.0.prepare_cached("DELETE FROM timers WHERE entity_id = ?1")?;
        for id in entities {
            delete.execute([id])?;
        }
        let mut insert = self.0.prepare_cached(
            "INSERT INTO timers (entity_id, name, event, due_at, every_ms) VALUES (?1, ?2, ?3, ?4, ?5)",
        )?;
        for t in rows {
            insert.execute(params![t.entity_id, t.name, t.event.as_str(), t.due_at, t.every_ms])?;
        }
        Ok(())
    }

    fn cancel_tasks(&mut self, entities: &[i64], now: Millis) -> rusqlite::Result<()> {
        // Without agents, nothing to cancel: spare a statement per state entered.
        if !self.1.load(Ordering::Relaxed) {
            return Ok(());
        }
        for &id in entities {
            cancel_tasks(self.0, id, now)?;
        }
        Ok(())
    }

    fn offer_tasks(&mut self, rows: &[TaskInsert]) -> rusqlite::Result<()> {
        self.1.store(true, Ordering::Relaxed);
        // One open task per entity: a repeated offer (e.g. after a resume) keeps the open one.
        let mut stmt = self.0.prepare_cached(
            "INSERT INTO agent_tasks (entity_id, queue, action, state, entity_version, retry, lock_ms, request_id,
                status, available_at, created_at)
             SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, 'ready', ?9, ?10
             WHERE NOT EXISTS (SELECT 1 FROM agent_tasks WHERE entity_id = ?1 AND status IN ('ready', 'leased'))",
        )?;
        for t in rows {
            stmt.execute(params![
                t.entity_id,
                t.queue,
                t.action,
                t.state,
                t.entity_version,
                t.retry,
                t.lock_ms,
                t.request_id,
                t.available_at,
                t.created_at
            ])?;
        }
        Ok(())
    }

    fn insert_errors(&mut self, rows: &[ErrorInsert]) -> rusqlite::Result<()> {
        let mut stmt = self.0.prepare_cached(
            "INSERT INTO errors (id, entity_id, operation_id, request_id, at, kind, details)
             VALUES (?6, ?1, (SELECT id FROM operations WHERE request_id = ?2), ?2, ?3, ?4, ?5)",
        )?;
        for e in rows {
            stmt.execute(params![e.entity_id, e.request_id, e.at, e.kind, e.details, e.id])?;
        }
        Ok(())
    }

    fn insert_exceptions(&mut self, rows: &[ExceptionInsert]) -> rusqlite::Result<()> {
        let mut stmt = self.0.prepare_cached("INSERT INTO exceptions (error_id, at, details) VALUES (?1, ?2, ?3)")?;
        for e in rows {
            stmt.execute(params![e.error_id, e.at, e.details])?;
        }
        Ok(())
    }

    fn insert_events(&mut self, rows: &[EventInsert]) -> rusqlite::Result<()> {
        let mut stmt = self.0.prepare_cached(
            "INSERT INTO events (id, operation_id, request_id, seq, entity_id, machine, entity_key, event, kind,
                start_state, start_time, rejected, failed, error_id, exception, end_state, end_time, reason, entered)
             VALUES (?1, (SELECT id FROM operations WHERE request_id = ?2), ?2, ?1, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10,
                ?11, ?12, ?13, ?14, ?15, ?16, ?17)",
        )?;
        for e in rows {
            stmt.execute(params![
                e.id,
                e.request_id,
                e.entity_id,
                e.machine,
                e.entity_key,
                e.event,
                e.kind,
                e.start_state,
                e.start_time,
                e.rejected,
                e.failed,
                e.error_id,
                e.exception,
                e.end_state,
                e.end_time,
                e.reason,
                e.entered
            ])?;
        }
        Ok(())
    }

    fn end_events(&mut self, rows: &[EventEnd]) -> rusqlite::Result<()> {
        let mut stmt = self
            .0
            .prepare_cached("UPDATE events SET end_state = ?2, end_time = ?3 WHERE id = ?1 AND end_time IS NULL")?;
        for e in rows {
            stmt.execute(params![e.id, e.end_state, e.end_time])?;
        }
        Ok(())
    }

    fn delete_operations(&mut self, request_ids: &[String]) -> rusqlite::Result<()> {
        let mut stmt = self.0.prepare_cached("DELETE FROM operations WHERE request_id = ?1")?;
        for r in request_ids {
            stmt.execute([r])?;
        }
        Ok(())
    }

    fn update_operations(&mut self, rows: &[OperationUpdate]) -> rusqlite::Result<()> {
        let mut stmt = self.0.prepare_cached(
            "UPDATE operations SET first_response_at = COALESCE(first_response_at, ?2),
                error_seen = (error_seen OR ?3), error = COALESCE(error, ?4)
             WHERE request_id = ?1",
        )?;
        for u in rows {
            stmt.execute(params![u.request_id, u.first_response_at, u.error_seen, u.error])?;
        }
        Ok(())
    }

    fn complete_operations(&mut self, request_ids: &[String], now: Millis) -> rusqlite::Result<()> {
        for r in request_ids {
            complete_operation(self.0, r, now)?;
        }
        Ok(())
    }
}

impl Dialect for Tx<'_> {
    type Error = rusqlite::Error;

    fn read(&mut self, r: &Reads) -> rusqlite::Result<ReadSet> {
        let mut out = ReadSet { rows: self.lock(&r.ids, &r.keys, &r.notify)?, ..ReadSet::default() };
        if !r.notify.is_empty() {
            out.edges = self.edges(&r.notify)?;
        }
        if !r.heads.is_empty() {
            out.heads = self.inbox_heads(&r.heads)?;
        }
        if !r.timers.is_empty() {
            out.timers = self.timers(&r.timers)?;
        }
        if !r.operations.is_empty() {
            out.operations = self.open_operations(&r.operations)?;
        }
        // The only writer: ids after the largest taken are free for this batch.
        let next = |table: &str| -> rusqlite::Result<i64> {
            self.0.prepare_cached(&format!("SELECT COALESCE(MAX(id), 0) + 1 FROM {table}"))?.query_row([], |r| r.get(0))
        };
        if r.new_entities > 0 {
            let first = next("entities")?;
            out.entity_ids = (first..first + r.new_entities as i64).collect();
        }
        if r.new_errors > 0 {
            let first = next("errors")?;
            out.error_ids = (first..first + r.new_errors as i64).collect();
        }
        Ok(out)
    }

    fn write(&mut self, w: &Writes) -> rusqlite::Result<Vec<i64>> {
        if !w.entities.is_empty() {
            self.insert_entities(&w.entities)?;
        }
        if !w.updates.is_empty() {
            self.update_entities(&w.updates)?;
        }
        if !w.deletes.is_empty() {
            self.delete_inbox(&w.deletes)?;
        }
        let ids = if w.inbox.is_empty() { Vec::new() } else { self.insert_inbox(&w.inbox)? };
        if !w.history.is_empty() {
            self.insert_history(&w.history)?;
        }
        if !w.successors.is_empty() {
            self.insert_successors(&w.successors)?;
        }
        if !w.timer_entities.is_empty() {
            self.replace_timers(&w.timer_entities, &w.timers)?;
        }
        if !w.cancel.is_empty() {
            self.cancel_tasks(&w.cancel, w.now)?;
        }
        if !w.offers.is_empty() {
            self.offer_tasks(&w.offers)?;
        }
        if !w.errors.is_empty() {
            self.insert_errors(&w.errors)?;
        }
        if !w.exceptions.is_empty() {
            self.insert_exceptions(&w.exceptions)?;
        }
        if !w.events.is_empty() {
            self.insert_events(&w.events)?;
        }
        if !w.ends.is_empty() {
            self.end_events(&w.ends)?;
        }
        if !w.unopen.is_empty() {
            self.delete_operations(&w.unopen)?;
        }
        if !w.op_updates.is_empty() {
            self.update_operations(&w.op_updates)?;
        }
        if !w.complete.is_empty() {
            self.complete_operations(&w.complete, w.now)?;
        }
        Ok(ids)
    }

    fn user_sql(&mut self, statements: &[SqlStatement]) -> rusqlite::Result<Result<(), OpError>> {
        for (index, stmt) in statements.iter().enumerate() {
            let params: Vec<SqlValue> = stmt.params.iter().map(json_to_sql).collect();
            let run = self.0.prepare_cached(&stmt.sql).and_then(|mut s| s.execute(rusqlite::params_from_iter(params)));
            if let Err(e) = run {
                return Ok(Err(OpError::Sql { index, message: e.to_string() }));
            }
        }
        Ok(Ok(()))
    }

    fn other(&mut self, now: Millis, op: &Op) -> rusqlite::Result<Result<Other, OpError>> {
        match apply_other(self.0, now, op) {
            Ok(other) => Ok(Ok(other)),
            Err(Fail::Op(e)) => Ok(Err(e)),
            Err(Fail::Db(e)) => Err(e),
        }
    }

    fn savepoint(&mut self) -> rusqlite::Result<()> {
        self.0.execute_batch("SAVEPOINT op")
    }

    fn release_savepoint(&mut self) -> rusqlite::Result<()> {
        self.0.execute_batch("RELEASE op")
    }

    fn rollback_savepoint(&mut self) -> rusqlite::Result<()> {
        self.0.execute_batch("ROLLBACK TO op; RELEASE op")
    }

    fn finish(&mut self, f: &Finish<'_>) -> rusqlite::Result<(Vec<Claimed>, Option<Millis>)> {
        let mut claimed = Vec::new();
        let mut machines: &[String] = &[];
        if let Some(claim) = f.claim {
            fire_timers(self.0, f.now, 1_000)?;
            claimed = self.claim_due(f.now, claim)?;
            machines = &claim.machines;
        }
        let next_due = self.next_due_of(machines)?;
        self.0.execute_batch("COMMIT")?;
        Ok((claimed, next_due))
    }
}

/// Drops every lease; those entities become due (see `Store::lease_release_all`).
pub(crate) fn release_all(tx: &Connection, now: Millis) -> rusqlite::Result<u64> {
    let ids: Vec<i64> = tx
        .prepare(
            "UPDATE entities SET lease_owner = NULL, lease_until = NULL WHERE lease_owner IS NOT NULL RETURNING id",
        )
        .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())?;
    for &id in &ids {
        refresh_due(tx, id, now, false)?;
    }
    // A previous engine died with work in flight: the open operations live on through
    // this restart.
    if !ids.is_empty() {
        tx.execute("UPDATE operations SET restart_count = restart_count + 1 WHERE ended_at IS NULL", [])?;
    }
    Ok(ids.len() as u64)
}

enum Fail {
    Op(OpError),
    Db(rusqlite::Error),
}

impl From<rusqlite::Error> for Fail {
    fn from(e: rusqlite::Error) -> Self {
        Fail::Db(e)
    }
}

/// Opens an operation; `Some(id)` of the existing one if its request id was seen before.
fn open_operation(
    tx: &Connection,
    now: Millis,
    op: &OpenOperation,
    machine: &str,
    key: &str,
) -> rusqlite::Result<Option<i64>> {
    let inserted = tx
        .prepare_cached(
            "INSERT INTO operations (request_id, name, machine, entity_key, started_at, dimensions)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT (request_id) DO NOTHING",
        )?
        .execute(params![op.request_id, op.name, machine, key, now, json_text(&op.dimensions)])?;
    if inserted == 1 {
        return Ok(None);
    }
    tx.prepare_cached("SELECT id FROM operations WHERE request_id = ?1")?
        .query_row([&op.request_id], |r| r.get(0))
        .map(Some)
}

/// Ends the operation `request_id` if nothing it reached is still busy or queued.
fn complete_operation(tx: &Connection, request_id: &str, now: Millis) -> rusqlite::Result<()> {
    tx.prepare_cached(
        "UPDATE operations SET ended_at = ?2,
            outcome = CASE WHEN canceled = 1 THEN 'canceled' WHEN error_seen = 1 THEN 'failed' ELSE 'success' END
         WHERE request_id = ?1 AND ended_at IS NULL
           AND NOT EXISTS (SELECT 1 FROM entities WHERE request_id = ?1 AND busy = 1)
           AND NOT EXISTS (SELECT 1 FROM inbox WHERE request_id = ?1)",
    )?
    .execute(params![request_id, now])?;
    Ok(())
}

fn json_to_sql(v: &Value) -> SqlValue {
    match v {
        Value::Null => SqlValue::Null,
        Value::Bool(b) => SqlValue::Integer(*b as i64),
        Value::Number(n) => match n.as_i64() {
            Some(i) => SqlValue::Integer(i),
            None => SqlValue::Real(n.as_f64().unwrap_or(f64::NAN)),
        },
        Value::String(s) => SqlValue::Text(s.clone()),
        other => SqlValue::Text(other.to_string()),
    }
}

/// Recomputes an entity's due time (and, when its timers changed, its timer time).
fn refresh_due(tx: &Connection, id: i64, now: Millis, timers_changed: bool) -> rusqlite::Result<()> {
    if timers_changed {
        tx.prepare_cached(
            "UPDATE entities SET timer_at = (SELECT MIN(due_at) FROM timers WHERE entity_id = ?1) WHERE id = ?1",
        )?
        .execute([id])?;
    }
    tx.prepare_cached(&format!("UPDATE entities SET due_at = {DUE_EXPR} WHERE id = :id"))?
        .execute(rusqlite::named_params! {":id": id, ":now": now})?;
    Ok(())
}

/// Turns due timers of active entities into inbox events (one-shot timers are deleted,
/// periodic ones rescheduled) in the claiming transaction; the params name the timer. A
/// paused or sleeping entity's timers wait.
fn fire_timers(tx: &Connection, now: Millis, limit: usize) -> rusqlite::Result<()> {
    let due: Vec<TimerRow> = tx
        .prepare_cached(
            "SELECT t.entity_id, t.name, t.event, t.due_at, t.every_ms FROM timers t JOIN entities e ON e.id = t.entity_id
             WHERE t.due_at <= ?1 AND e.run_status = 'active' ORDER BY t.due_at LIMIT ?2",
        )?
        .query_map(params![now, limit as i64], timer_from_row)?
        .collect::<rusqlite::Result<_>>()?;
    for t in &due {
        tx.prepare_cached(
            "INSERT INTO inbox (entity_id, event, params, request_id, kind, created_at)
             VALUES (?1, ?2, ?3, NULL, 'timer', ?4)",
        )?
        .execute(params![
            t.entity_id,
            t.event.as_str(),
            json_text(&serde_json::json!({ "timer": t.name })),
            now
        ])?;
        match t.every_ms {
            Some(every) if every > 0 => {
                let next = (t.due_at + every).max(now + 1);
                tx.prepare_cached("UPDATE timers SET due_at = ?3 WHERE entity_id = ?1 AND name = ?2")?
                    .execute(params![t.entity_id, t.name, next])?;
            }
            _ => {
                tx.prepare_cached("DELETE FROM timers WHERE entity_id = ?1 AND name = ?2")?
                    .execute(params![t.entity_id, t.name])?;
            }
        }
        refresh_due(tx, t.entity_id, now, true)?;
    }
    Ok(())
}

/// An operator command. Kill bumps the version (any commit in flight is refused) and
/// cancels queued events and timers; release drops the lease; the others set the run
/// status. Recorded in history; the entity's due time follows its new status.
fn apply_command(
    tx: &Connection,
    now: Millis,
    machine: &str,
    key: &str,
    command: Command,
    operation: Option<&OpenOperation>,
) -> Result<Applied, Fail> {
    let current: Option<(i64, String, String, Option<String>)> = tx
        .prepare_cached("SELECT id, state, run_status, request_id FROM entities WHERE machine = ?1 AND key = ?2")?
        .query_row(params![machine, key], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .optional()?;
    let Some((id, state, status, entity_request)) = current else {
        return Err(Fail::Op(OpError::NotFound { machine: machine.to_string(), key: key.to_string() }));
    };
    if let Some(op) = operation
        && let Some(operation_id) = open_operation(tx, now, op, machine, key)?
    {
        return Ok(Applied::Replayed { operation_id });
    }
    if status == "killed" && command != Command::Kill {
        return Err(Fail::Op(OpError::Killed { machine: machine.to_string(), key: key.to_string() }));
    }
    let sql = match command {
        Command::Pause => "UPDATE entities SET run_status = 'paused', sleep_until = NULL WHERE id = ?1",
        Command::Resume => {
            "UPDATE entities SET run_status = 'active', sleep_until = NULL, recent_errors = '[]',
                auto_at = CASE WHEN auto_at IS NOT NULL AND ?3 IN ('fault', 'failed') THEN ?2 ELSE auto_at END,
                busy = auto_at IS NOT NULL OR EXISTS (SELECT 1 FROM agent_tasks t
                    WHERE t.entity_id = ?1 AND t.status IN ('ready', 'leased'))
             WHERE id = ?1"
        }
        Command::Sleep { .. } => "UPDATE entities SET run_status = 'sleeping', sleep_until = ?4 WHERE id = ?1",
        Command::Kill => {
            "UPDATE entities SET run_status = 'killed', sleep_until = NULL, version = version + 1, busy = 0,
                lease_owner = NULL, lease_until = NULL, auto_at = NULL, timer_at = NULL
             WHERE id = ?1"
        }
        Command::Release => "UPDATE entities SET lease_owner = NULL, lease_until = NULL WHERE id = ?1",
        Command::Retry => {
            "UPDATE entities SET run_status = 'active', sleep_until = NULL,
                auto_at = CASE WHEN auto_at IS NOT NULL THEN ?2 ELSE auto_at END,
                busy = auto_at IS NOT NULL OR EXISTS (SELECT 1 FROM agent_tasks t
                    WHERE t.entity_id = ?1 AND t.status IN ('ready', 'leased'))
             WHERE id = ?1"
        }
    };
    let until = match command {
        Command::Sleep { until } => Some(until),
        _ => None,
    };
    let (p3, p4) = (status.as_str(), until);
    match command {
        Command::Resume => tx.prepare_cached(sql)?.execute(params![id, now, p3])?,
        Command::Sleep { .. } => tx.prepare_cached(sql)?.execute(params![id, now, p3, p4])?,
        Command::Retry => tx.prepare_cached(sql)?.execute(params![id, now])?,
        _ => tx.prepare_cached(sql)?.execute(params![id])?,
    };
    if command == Command::Retry {
        // A task waiting for its delay or backoff is offered now.
        tx.prepare_cached("UPDATE agent_tasks SET available_at = ?2 WHERE entity_id = ?1 AND status = 'ready'")?
            .execute(params![id, now])?;
    }
    let request_id = operation.map(|o| o.request_id.clone());
    if command == Command::Kill {
        // Cancel pending work; the operations it belonged to end as canceled.
        let mut canceled: Vec<String> = tx
            .prepare_cached("SELECT DISTINCT request_id FROM inbox WHERE entity_id = ?1 AND request_id IS NOT NULL")?
            .query_map([id], |r| r.get(0))?
            .collect::<rusqlite::Result<_>>()?;
        canceled.extend(entity_request);
        tx.prepare_cached("DELETE FROM inbox WHERE entity_id = ?1")?.execute([id])?;
        tx.prepare_cached("DELETE FROM timers WHERE entity_id = ?1")?.execute([id])?;
        cancel_tasks(tx, id, now)?;
        for r in &canceled {
            tx.prepare_cached("UPDATE operations SET canceled = 1 WHERE request_id = ?1 AND ended_at IS NULL")?
                .execute([r])?;
            complete_operation(tx, r, now)?;
        }
    }
    tx.prepare_cached(
        "INSERT INTO history (entity_id, from_state, to_state, kind, retry, request_id, at, detail)
         VALUES (?1, ?2, NULL, 'command', 0, ?3, ?4, ?5)",
    )?
    .execute(params![id, state, request_id, now, command.as_str()])?;
    refresh_due(tx, id, now, false)?;
    if let Some(r) = &request_id {
        // A command is done when it is applied.
        tx.prepare_cached(
            "UPDATE operations SET first_response_at = ?2, ended_at = ?2, outcome = 'success'
             WHERE request_id = ?1 AND ended_at IS NULL",
        )?
        .execute(params![r, now])?;
    }
    let row = tx
        .prepare_cached(&format!("SELECT {ENTITY_COLS} FROM entities WHERE id = ?1"))?
        .query_row([id], entity_from_row)?;
    Ok(Applied::Commanded(row))
}

/// Cancels the entity's open tasks (it left the state, or was killed): their reports
/// are refused from now on.
fn cancel_tasks(tx: &Connection, entity_id: i64, now: Millis) -> rusqlite::Result<()> {
    tx.prepare_cached(
        "UPDATE agent_tasks SET status = 'canceled', outcome = 'canceled', finished_at = ?2
         WHERE entity_id = ?1 AND status IN ('ready', 'leased')",
    )?
    .execute(params![entity_id, now])?;
    Ok(())
}

fn lease_tasks(
    tx: &Connection,
    now: Millis,
    queue: &str,
    agent: &str,
    limit: usize,
    token_prefix: &str,
) -> rusqlite::Result<Vec<AgentTask>> {
    let ids: Vec<i64> = tx
        .prepare_cached(
            "SELECT t.id FROM agent_tasks t JOIN entities e ON e.id = t.entity_id
             WHERE t.queue = ?1 AND t.status IN ('ready', 'leased') AND t.available_at <= ?2 AND e.run_status = 'active'
             ORDER BY t.available_at, t.id LIMIT ?3",
        )?
        .query_map(params![queue, now, limit as i64], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    let mut tasks = Vec::with_capacity(ids.len());
    for id in ids {
        tx.prepare_cached(
            "UPDATE agent_tasks SET status = 'leased', attempt = attempt + 1, token = ?2 || id, agent = ?3,
                leased_at = ?4, locked_until = ?4 + lock_ms, available_at = ?4 + lock_ms
             WHERE id = ?1",
        )?
        .execute(params![id, token_prefix, agent, now])?;
        tasks.push(
            tx.prepare_cached(&format!(
                "SELECT {TASK_COLS} FROM agent_tasks t JOIN entities e ON e.id = t.entity_id WHERE t.id = ?1"
            ))?
            .query_row([id], task_from_row)?,
        );
    }
    Ok(tasks)
}

/// Checks that `token` holds task `task` now; answers its lock time, or why not.
fn check_task(tx: &Connection, now: Millis, task: i64, token: &str) -> Result<(i64,), Fail> {
    type Lease = (String, Option<String>, Option<i64>, i64, u32);
    let row: Option<Lease> = tx
        .prepare_cached("SELECT status, token, locked_until, lock_ms, attempt FROM agent_tasks WHERE id = ?1")?
        .query_row([task], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)))
        .optional()?;
    let Some((status, held, locked_until, lock_ms, attempt)) = row else {
        return Err(Fail::Op(OpError::TaskRefused { task, reason: "no such task".into() }));
    };
    task_refusal(&status, held.as_deref(), locked_until, attempt, token, now)
        .map(|reason| Err(Fail::Op(OpError::TaskRefused { task, reason })))
        .unwrap_or(Ok((lock_ms,)))
}

/// An operation applied alone (see [`Dialect::other`]).
fn apply_other(tx: &Connection, now: Millis, op: &Op) -> Result<Other, Fail> {
    let applied = match op {
        Op::Command { machine, key, command, operation } => {
            apply_command(tx, now, machine, key, *command, operation.as_ref())?
        }
        Op::MarkHung { before } => {
            // No progress since `before`: nothing it reached entered a state (or retried)
            // since, and no event of it was queued since.
            let n = tx
                .prepare_cached(
                    "UPDATE operations SET outcome = 'hung'
                     WHERE ended_at IS NULL AND outcome IS NULL AND started_at < ?1
                       AND NOT EXISTS (SELECT 1 FROM entities e WHERE e.request_id = operations.request_id
                                          AND e.busy = 1 AND e.entered_at >= ?1)
                       AND NOT EXISTS (SELECT 1 FROM inbox i WHERE i.request_id = operations.request_id
                                          AND i.created_at >= ?1)",
                )?
                .execute([before])?;
            Applied::MarkedHung(n as u64)
        }
        Op::TaskLease { queue, agent, limit, token_prefix } => {
            Applied::Leased(lease_tasks(tx, now, queue, agent, *limit, token_prefix)?)
        }
        Op::TaskHeartbeat { task, token } => {
            let (lock_ms,) = check_task(tx, now, *task, token)?;
            let until = now + lock_ms;
            tx.prepare_cached("UPDATE agent_tasks SET locked_until = ?2, available_at = ?2 WHERE id = ?1")?
                .execute(params![task, until])?;
            Applied::Extended { locked_until: until }
        }
        Op::TaskReport { task, token, result } => {
            check_task(tx, now, *task, token)?;
            let (outcome, error) = match result {
                TaskResult::Complete { .. } => ("complete", None),
                TaskResult::Fail { error, .. } => ("fail", Some(error.as_str())),
            };
            tx.prepare_cached(
                "UPDATE agent_tasks SET status = 'done', finished_at = ?2, outcome = ?3, error = ?4 WHERE id = ?1",
            )?
            .execute(params![task, now, outcome, error])?;
            let push = tx
                .prepare_cached(
                    "SELECT e.machine, e.key, t.entity_version, t.attempt, t.leased_at, t.agent, t.request_id
                     FROM agent_tasks t JOIN entities e ON e.id = t.entity_id WHERE t.id = ?1",
                )?
                .query_row([task], |r| {
                    let report = AgentReport {
                        task: *task,
                        entity_version: r.get(2)?,
                        attempt: r.get(3)?,
                        leased_at: r.get(4)?,
                        agent: r.get(5)?,
                        result: result.clone(),
                    };
                    Ok(report_push(r.get::<_, String>(0)?, r.get::<_, String>(1)?, &report, r.get(6)?))
                })?;
            return Ok(Other::Push(push));
        }
        Op::Renew { ids, owner, until } => {
            let mut stmt = tx.prepare_cached(
                "UPDATE entities SET lease_until = ?3, due_at = ?3 WHERE id = ?1 AND lease_owner = ?2",
            )?;
            let mut n = 0;
            for id in ids {
                n += stmt.execute(params![id, owner, until])? as u64;
            }
            Applied::Renewed(n)
        }
        other => unreachable!("a plan operation is not applied alone: {other:?}"),
    };
    Ok(Other::Applied(applied))
}
