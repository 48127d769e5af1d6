//! The SQLite [`Dialect`] of the batch plan: each set of rows the plan reads or writes runs
//! row by row with cached statements (SQLite runs in-process: a statement costs
//! microseconds, not a round trip). The writer is the file's only one: reading is locking,
//! and the ids after the largest taken are free for the batch.

use std::sync::atomic::{AtomicBool, Ordering};

use rusqlite::types::Value as SqlValue;
use rusqlite::{Connection, OptionalExtension, params};
use serde_json::Value;

use super::read::{INBOX_COLS, inbox_from_row, timer_from_row};
use super::write;
use crate::plan::rows::*;
use crate::plan::{Dialect, Finish, Other, ReadSet, Reads, Writes};
use crate::{Claimed, InboxItem, Millis, Op, OpError, SqlStatement, TimerRow};

/// The writer's connection inside a batch's transaction, as the plan's [`Dialect`], and
/// whether any agent task may be open (see `Inner::tasks_open`).
pub(crate) struct Tx<'a>(pub(crate) &'a Connection, pub(crate) &'a AtomicBool);

impl Columns for rusqlite::Row<'_> {
    type Error = rusqlite::Error;
    fn int(&self, col: usize) -> rusqlite::Result<i64> {
        self.get(col)
    }
    fn opt_int(&self, col: usize) -> rusqlite::Result<Option<i64>> {
        self.get(col)
    }
    fn text(&self, col: usize) -> rusqlite::Result<String> {
        self.get(col)
    }
    fn opt_text(&self, col: usize) -> rusqlite::Result<Option<String>> {
        self.get(col)
    }
    fn flag(&self, col: usize) -> rusqlite::Result<bool> {
        self.get(col)
    }
    fn with_text<T>(&self, col: usize, f: impl FnOnce(&str) -> T) -> rusqlite::Result<T> {
        Ok(f(self.get_ref(col)?.as_str()?))
    }
    fn corrupt(col: usize, message: String) -> rusqlite::Error {
        super::read::conversion(col, message)
    }
}

fn current_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Current> {
    Current::from_columns(r)
}

impl Tx<'_> {
    fn lock(&mut self, r: &Reads) -> rusqlite::Result<Vec<Current>> {
        let (ids, keys) = (&r.ids, &r.keys);
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
        for id in &r.notify {
            for row in preds.query_map([id], current_from_row)? {
                out.push(row?);
            }
        }
        let mut succs = tx.prepare_cached(&format!(
            "SELECT {CURRENT_COLS} FROM entities
             WHERE id IN (SELECT successor_id FROM successors WHERE predecessor_id = ?1)"
        ))?;
        for id in &r.successors {
            for row in succs.query_map([id], current_from_row)? {
                out.push(row?);
            }
        }
        Ok(out)
    }

    /// The (predecessor, successor) edges whose `end` (`successor_id` or `predecessor_id`)
    /// is one of `ids`.
    fn edges(&mut self, end: &str, ids: &[i64]) -> rusqlite::Result<Vec<(i64, i64)>> {
        let mut stmt =
            self.0.prepare_cached(&format!("SELECT predecessor_id, successor_id FROM successors WHERE {end} = ?1"))?;
        let mut out = Vec::new();
        for id in ids {
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

    /// Deletes the consumed items; answers the request ids of the change notices deleted
    /// (their operations may end now: the plan reads them on PostgreSQL, here the delete
    /// returns them).
    fn delete_inbox(&mut self, rows: &[InboxDelete]) -> rusqlite::Result<Vec<String>> {
        let mut stmt = self.0.prepare_cached(
            "DELETE FROM inbox WHERE entity_id = ?1 AND (id = ?2 OR (kind = 'notice' AND id <= ?3))
             RETURNING CASE WHEN kind = 'notice' THEN request_id END",
        )?;
        let mut notices: Vec<String> = Vec::new();
        for r in rows {
            for request_id in stmt.query_map([r.entity_id, r.consume, r.notices_upto], |row| row.get(0))? {
                if let Some(id) = request_id?
                    && !notices.contains(&id)
                {
                    notices.push(id);
                }
            }
        }
        Ok(notices)
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
            write::cancel_tasks(self.0, id, now)?;
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
            write::complete_operation(self.0, r, now)?;
        }
        Ok(())
    }
}

impl Dialect for Tx<'_> {
    type Error = rusqlite::Error;

    fn read(&mut self, r: &Reads) -> rusqlite::Result<ReadSet> {
        let mut out = ReadSet { rows: self.lock(r)?, ..ReadSet::default() };
        if !r.notify.is_empty() {
            out.edges = self.edges("successor_id", &r.notify)?;
        }
        if !r.successors.is_empty() {
            out.successor_edges = self.edges("predecessor_id", &r.successors)?;
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
        let notices = if w.deletes.is_empty() { Vec::new() } else { self.delete_inbox(&w.deletes)? };
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
        let notices: Vec<String> = notices.into_iter().filter(|r| !w.complete.contains(r)).collect();
        if !notices.is_empty() {
            self.complete_operations(&notices, w.now)?;
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
        match write::apply_other(self.0, now, op) {
            Ok(other) => Ok(Ok(other)),
            Err(write::Fail::Op(e)) => Ok(Err(e)),
            Err(write::Fail::Db(e)) => Err(e),
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
            write::fire_timers(self.0, f.now, 1_000)?;
            claimed = write::claim_due(self.0, f.now, claim)?;
            machines = &claim.machines;
        }
        let next_due = write::next_due_of(self.0, machines)?;
        self.0.execute_batch("COMMIT")?;
        Ok((claimed, next_due))
    }
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
