//! The PostgreSQL [`Dialect`] of the batch plan: every set of rows is one statement over
//! arrays (`unnest`), so a batch costs the same few round trips whatever its size.
//!
//! Concurrency: [`Dialect::lock`] takes every entity row the segment writes `FOR NO KEY
//! UPDATE`, in id order, in one statement. Pushes and change notices of other instances
//! lock their target row the same way before inserting, so while a segment holds its rows
//! nobody can add to their inboxes; the inbox reads that follow run after the locks are
//! granted, so they see every item committed before. Claims and timer firing skip locked
//! rows.

use postgres::Row;

use super::Failure;
use super::conn::{Conn, Recovery, recovery};
use super::read::{entity_from_row_at, inbox_from_row, timer_from_row};
use super::write::{Fail, apply_other, cancel_tasks_of, fire_timers};
use crate::plan::rows::*;
use crate::plan::{Dialect, Other};
use crate::sql::ENTITY_COLS;
use crate::types::*;

type R<T> = std::result::Result<T, Failure>;

/// A batch's transaction on the writer's connection, as the plan's [`Dialect`].
pub(crate) struct Tx<'a>(pub(crate) &'a mut Conn);

const INBOX_COLS: &str = "i.id, i.entity_id, i.event, i.params, i.request_id, i.created_at, i.kind";

fn current_from_row(r: &Row) -> R<Current> {
    let status: &str = r.try_get(13)?;
    Ok(Current {
        id: r.try_get(0)?,
        machine: r.try_get(1)?,
        key: r.try_get(2)?,
        state: r.try_get(3)?,
        version: r.try_get(4)?,
        retry: r.try_get(5)?,
        entered_at: r.try_get(6)?,
        auto_at: r.try_get(7)?,
        due_at: r.try_get(8)?,
        lease_owner: r.try_get(9)?,
        lease_until: r.try_get(10)?,
        request_id: r.try_get(11)?,
        timer_at: r.try_get(12)?,
        run_status: RunStatus::parse(status)
            .ok_or_else(|| Failure::Corrupt(format!("unknown run status `{status}`")))?,
        sleep_until: r.try_get(14)?,
        busy: r.try_get(15)?,
        event_id: r.try_get(16)?,
        ordinal: r.try_get(17)?,
        has_predecessors: r.try_get(18)?,
        machine_hash: r.try_get(19)?,
    })
}

/// The ids an insert returned, in the order of its rows; each row's returned entity id
/// (column 1) must be the one it was given.
fn checked_ids(rows: Vec<Row>, expected: impl ExactSizeIterator<Item = i64>, what: &str) -> R<Vec<i64>> {
    if rows.len() != expected.len() {
        return Err(Failure::Corrupt(format!("{what}: {} rows inserted, {} expected", rows.len(), expected.len())));
    }
    let mut ids = Vec::with_capacity(rows.len());
    for (r, want) in rows.iter().zip(expected) {
        let got: i64 = r.try_get(1)?;
        if got != want {
            return Err(Failure::Corrupt(format!("{what}: rows returned out of order")));
        }
        ids.push(r.try_get(0)?);
    }
    Ok(ids)
}

impl Dialect for Tx<'_> {
    type Error = Failure;

    fn lock(&mut self, ids: &[i64], keys: &[(String, String)], notify: &[i64]) -> R<Vec<Current>> {
        let machines: Vec<&str> = keys.iter().map(|k| k.0.as_str()).collect();
        let names: Vec<&str> = keys.iter().map(|k| k.1.as_str()).collect();
        let rows = self.0.query(
            &format!(
                "SELECT {CURRENT_COLS} FROM entities WHERE id IN (
                    SELECT unnest($1::bigint[])
                    UNION SELECT e.id FROM entities e
                        JOIN unnest($2::text[], $3::text[]) AS k(machine, key) ON e.machine = k.machine AND e.key = k.key
                    UNION SELECT s.predecessor_id FROM successors s WHERE s.successor_id = ANY($4::bigint[]))
                 ORDER BY id FOR NO KEY UPDATE"
            ),
            &[&ids, &machines, &names, &notify],
        )?;
        rows.iter().map(current_from_row).collect()
    }

    fn edges(&mut self, successors: &[i64]) -> R<Vec<(i64, i64)>> {
        let rows = self.0.query(
            "SELECT predecessor_id, successor_id FROM successors WHERE successor_id = ANY($1::bigint[])",
            &[&successors],
        )?;
        rows.iter().map(|r| Ok((r.try_get(0)?, r.try_get(1)?))).collect()
    }

    fn inbox_heads(&mut self, rows: &[InboxDelete]) -> R<Vec<InboxItem>> {
        let entities: Vec<i64> = rows.iter().map(|r| r.entity_id).collect();
        let consume: Vec<i64> = rows.iter().map(|r| r.consume).collect();
        let upto: Vec<i64> = rows.iter().map(|r| r.notices_upto).collect();
        let rows = self.0.query(
            &format!(
                "SELECT {INBOX_COLS} FROM unnest($1::bigint[], $2::bigint[], $3::bigint[]) AS c(entity_id, consume, upto)
                 CROSS JOIN LATERAL (SELECT * FROM inbox
                     WHERE entity_id = c.entity_id AND id <> c.consume AND NOT (kind = 'notice' AND id <= c.upto)
                     ORDER BY id LIMIT 1) i"
            ),
            &[&entities, &consume, &upto],
        )?;
        rows.iter().map(inbox_from_row).collect()
    }

    fn timers(&mut self, entities: &[i64]) -> R<Vec<TimerRow>> {
        let rows = self.0.query(
            "SELECT entity_id, name, event, due_at, every_ms FROM timers WHERE entity_id = ANY($1::bigint[])",
            &[&entities],
        )?;
        rows.iter().map(timer_from_row).collect()
    }

    fn open_operations(&mut self, rows: &[OperationInsert]) -> R<Vec<(i64, bool)>> {
        let request_ids: Vec<&str> = rows.iter().map(|o| o.request_id.as_str()).collect();
        let names: Vec<&str> = rows.iter().map(|o| o.name.as_str()).collect();
        let machines: Vec<&str> = rows.iter().map(|o| o.machine.as_str()).collect();
        let keys: Vec<&str> = rows.iter().map(|o| o.entity_key.as_str()).collect();
        let started: Vec<i64> = rows.iter().map(|o| o.started_at).collect();
        let dimensions: Vec<&str> = rows.iter().map(|o| o.dimensions.as_str()).collect();
        let first: Vec<Option<i64>> = rows.iter().map(|o| o.first_response_at).collect();
        let inserted = self.0.query(
            "INSERT INTO operations (request_id, name, machine, entity_key, started_at, dimensions, first_response_at)
             SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::text[], $7::bigint[])
             ON CONFLICT (request_id) DO NOTHING RETURNING request_id, id",
            &[&request_ids, &names, &machines, &keys, &started, &dimensions, &first],
        )?;
        let mut found = std::collections::HashMap::with_capacity(rows.len());
        for r in &inserted {
            found.insert(r.try_get::<_, String>(0)?, (r.try_get::<_, i64>(1)?, false));
        }
        if found.len() < rows.len() {
            let missing: Vec<&str> = request_ids.iter().copied().filter(|r| !found.contains_key(*r)).collect();
            for r in
                self.0.query("SELECT request_id, id FROM operations WHERE request_id = ANY($1::text[])", &[&missing])?
            {
                found.insert(r.try_get::<_, String>(0)?, (r.try_get::<_, i64>(1)?, true));
            }
        }
        request_ids
            .iter()
            .map(|r| found.get(*r).copied().ok_or_else(|| Failure::Corrupt(format!("operation `{r}` vanished"))))
            .collect()
    }

    fn insert_entities(&mut self, rows: &[EntityInsert]) -> R<Vec<i64>> {
        let machines: Vec<&str> = rows.iter().map(|e| e.machine.as_str()).collect();
        let keys: Vec<&str> = rows.iter().map(|e| e.key.as_str()).collect();
        let states: Vec<&str> = rows.iter().map(|e| e.state.as_str()).collect();
        let props: Vec<&str> = rows.iter().map(|e| e.properties.as_str()).collect();
        let created: Vec<i64> = rows.iter().map(|e| e.created_at).collect();
        let auto_at: Vec<Option<i64>> = rows.iter().map(|e| e.auto_at).collect();
        let due_at: Vec<Option<i64>> = rows.iter().map(|e| e.due_at).collect();
        let request_ids: Vec<Option<&str>> = rows.iter().map(|e| e.request_id.as_deref()).collect();
        let busy: Vec<bool> = rows.iter().map(|e| e.busy).collect();
        let hashes: Vec<Option<&str>> = rows.iter().map(|e| e.machine_hash.as_deref()).collect();
        let timer_at: Vec<Option<i64>> = rows.iter().map(|e| e.timer_at).collect();
        let preds: Vec<bool> = rows.iter().map(|e| e.has_predecessors).collect();
        let inserted = self.0.query(
            "INSERT INTO entities (machine, key, state, properties, version, retry, created_at, entered_at, auto_at,
                due_at, request_id, busy, machine_hash, timer_at, has_predecessors)
             SELECT v.machine, v.key, v.state, v.properties, 1, 0, v.created_at, v.created_at, v.auto_at, v.due_at,
                v.request_id, v.busy, v.machine_hash, v.timer_at, v.has_predecessors
             FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::bigint[], $7::bigint[],
                $8::text[], $9::boolean[], $10::text[], $11::bigint[], $12::boolean[])
                AS v(machine, key, state, properties, created_at, auto_at, due_at, request_id, busy, machine_hash,
                     timer_at, has_predecessors)
             ON CONFLICT (machine, key) DO NOTHING RETURNING id, machine, key",
            &[
                &machines,
                &keys,
                &states,
                &props,
                &created,
                &auto_at,
                &due_at,
                &request_ids,
                &busy,
                &hashes,
                &timer_at,
                &preds,
            ],
        )?;
        if inserted.len() != rows.len() {
            // Another instance created one of these keys after this batch looked.
            return Err(Failure::Race("an entity was created concurrently".into()));
        }
        let mut by_key = std::collections::HashMap::with_capacity(rows.len());
        for r in &inserted {
            by_key.insert((r.try_get::<_, String>(1)?, r.try_get::<_, String>(2)?), r.try_get::<_, i64>(0)?);
        }
        rows.iter()
            .map(|e| {
                by_key
                    .get(&(e.machine.clone(), e.key.clone()))
                    .copied()
                    .ok_or_else(|| Failure::Corrupt(format!("entity `{}` of `{}` not inserted", e.key, e.machine)))
            })
            .collect()
    }

    fn update_entities(&mut self, rows: &[EntityUpdate]) -> R<()> {
        let ids: Vec<i64> = rows.iter().map(|u| u.row.id).collect();
        let states: Vec<&str> = rows.iter().map(|u| u.row.state.as_str()).collect();
        let versions: Vec<i64> = rows.iter().map(|u| u.row.version).collect();
        let retries: Vec<i64> = rows.iter().map(|u| u.row.retry).collect();
        let entered: Vec<i64> = rows.iter().map(|u| u.row.entered_at).collect();
        let auto_at: Vec<Option<i64>> = rows.iter().map(|u| u.row.auto_at).collect();
        let due_at: Vec<Option<i64>> = rows.iter().map(|u| u.row.due_at).collect();
        let owners: Vec<Option<&str>> = rows.iter().map(|u| u.row.lease_owner.as_deref()).collect();
        let until: Vec<Option<i64>> = rows.iter().map(|u| u.row.lease_until).collect();
        let request_ids: Vec<Option<&str>> = rows.iter().map(|u| u.row.request_id.as_deref()).collect();
        let timer_at: Vec<Option<i64>> = rows.iter().map(|u| u.row.timer_at).collect();
        let status: Vec<&str> = rows.iter().map(|u| u.row.run_status.as_str()).collect();
        let sleep: Vec<Option<i64>> = rows.iter().map(|u| u.row.sleep_until).collect();
        let busy: Vec<bool> = rows.iter().map(|u| u.row.busy).collect();
        let event_ids: Vec<Option<i64>> = rows.iter().map(|u| u.row.event_id).collect();
        let ordinals: Vec<i64> = rows.iter().map(|u| u.row.ordinal).collect();
        let preds: Vec<bool> = rows.iter().map(|u| u.row.has_predecessors).collect();
        let hashes: Vec<Option<&str>> = rows.iter().map(|u| u.row.machine_hash.as_deref()).collect();
        let props: Vec<Option<&str>> = rows.iter().map(|u| u.properties.as_deref()).collect();
        let fired: Vec<Option<&str>> = rows.iter().map(|u| u.fired.as_deref()).collect();
        let errors: Vec<Option<&str>> = rows.iter().map(|u| u.recent_errors.as_deref()).collect();
        self.0.exec(
            "UPDATE entities e SET state = v.state, version = v.version, retry = v.retry, entered_at = v.entered_at,
                auto_at = v.auto_at, due_at = v.due_at, lease_owner = v.lease_owner, lease_until = v.lease_until,
                request_id = v.request_id, timer_at = v.timer_at, run_status = v.run_status,
                sleep_until = v.sleep_until, busy = v.busy, event_id = v.event_id, ordinal = v.ordinal,
                has_predecessors = v.has_predecessors, machine_hash = v.machine_hash,
                properties = COALESCE(v.properties, e.properties), fired = COALESCE(v.fired, e.fired),
                recent_errors = COALESCE(v.recent_errors, e.recent_errors)
             FROM unnest($1::bigint[], $2::text[], $3::bigint[], $4::bigint[], $5::bigint[], $6::bigint[],
                $7::bigint[], $8::text[], $9::bigint[], $10::text[], $11::bigint[], $12::text[], $13::bigint[],
                $14::boolean[], $15::bigint[], $16::bigint[], $17::boolean[], $18::text[], $19::text[], $20::text[],
                $21::text[])
                AS v(id, state, version, retry, entered_at, auto_at, due_at, lease_owner, lease_until, request_id,
                     timer_at, run_status, sleep_until, busy, event_id, ordinal, has_predecessors, machine_hash,
                     properties, fired, recent_errors)
             WHERE e.id = v.id",
            &[
                &ids,
                &states,
                &versions,
                &retries,
                &entered,
                &auto_at,
                &due_at,
                &owners,
                &until,
                &request_ids,
                &timer_at,
                &status,
                &sleep,
                &busy,
                &event_ids,
                &ordinals,
                &preds,
                &hashes,
                &props,
                &fired,
                &errors,
            ],
        )?;
        Ok(())
    }

    fn delete_inbox(&mut self, rows: &[InboxDelete]) -> R<()> {
        let entities: Vec<i64> = rows.iter().map(|r| r.entity_id).collect();
        let consume: Vec<i64> = rows.iter().map(|r| r.consume).collect();
        let upto: Vec<i64> = rows.iter().map(|r| r.notices_upto).collect();
        self.0.exec(
            "DELETE FROM inbox i USING unnest($1::bigint[], $2::bigint[], $3::bigint[]) AS c(entity_id, consume, upto)
             WHERE i.entity_id = c.entity_id AND (i.id = c.consume OR (i.kind = 'notice' AND i.id <= c.upto))",
            &[&entities, &consume, &upto],
        )?;
        Ok(())
    }

    fn insert_inbox(&mut self, rows: &[InboxInsert]) -> R<Vec<i64>> {
        let entities: Vec<i64> = rows.iter().map(|i| i.entity_id).collect();
        let events: Vec<&str> = rows.iter().map(|i| i.event.as_str()).collect();
        let params: Vec<&str> = rows.iter().map(|i| i.params.as_str()).collect();
        let request_ids: Vec<Option<&str>> = rows.iter().map(|i| i.request_id.as_deref()).collect();
        let kinds: Vec<&str> = rows.iter().map(|i| i.kind).collect();
        let created: Vec<i64> = rows.iter().map(|i| i.created_at).collect();
        let inserted = self.0.query(
            "INSERT INTO inbox (entity_id, event, params, request_id, kind, created_at)
             SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::text[], $6::bigint[])
             RETURNING id, entity_id",
            &[&entities, &events, &params, &request_ids, &kinds, &created],
        )?;
        checked_ids(inserted, entities.iter().copied(), "inbox")
    }

    fn insert_history(&mut self, rows: &[HistoryInsert]) -> R<()> {
        let entities: Vec<i64> = rows.iter().map(|h| h.entity_id).collect();
        let from: Vec<Option<&str>> = rows.iter().map(|h| h.from_state.as_deref()).collect();
        let to: Vec<Option<&str>> = rows.iter().map(|h| h.to_state.as_deref()).collect();
        let kinds: Vec<&str> = rows.iter().map(|h| h.kind).collect();
        let actions: Vec<Option<&str>> = rows.iter().map(|h| h.action.as_deref()).collect();
        let events: Vec<Option<&str>> = rows.iter().map(|h| h.event.as_deref()).collect();
        let retries: Vec<i64> = rows.iter().map(|h| h.retry).collect();
        let request_ids: Vec<Option<&str>> = rows.iter().map(|h| h.request_id.as_deref()).collect();
        let at: Vec<i64> = rows.iter().map(|h| h.at).collect();
        let details: Vec<Option<&str>> = rows.iter().map(|h| h.detail.as_deref()).collect();
        let hashes: Vec<Option<&str>> = rows.iter().map(|h| h.machine_hash.as_deref()).collect();
        let event_ids: Vec<Option<i64>> = rows.iter().map(|h| h.event_id).collect();
        let ordinals: Vec<Option<i64>> = rows.iter().map(|h| h.ordinal).collect();
        let tkinds: Vec<Option<&str>> = rows.iter().map(|h| h.transition_kind).collect();
        let start_health: Vec<Option<&str>> = rows.iter().map(|h| h.start_health).collect();
        let end_health: Vec<Option<&str>> = rows.iter().map(|h| h.end_health).collect();
        let entry: Vec<Option<i64>> = rows.iter().map(|h| h.entry_time).collect();
        let start: Vec<Option<i64>> = rows.iter().map(|h| h.start_time).collect();
        let action_start: Vec<Option<i64>> = rows.iter().map(|h| h.action_start_time).collect();
        let outcomes: Vec<Option<&str>> = rows.iter().map(|h| h.outcome).collect();
        self.0.exec(
            "INSERT INTO history (entity_id, from_state, to_state, kind, action, event, retry, request_id, at, detail,
                machine_hash, event_id, ordinal, transition_kind, start_health, end_health, entry_time, start_time,
                action_start_time, outcome)
             SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[],
                $7::bigint[], $8::text[], $9::bigint[], $10::text[], $11::text[], $12::bigint[], $13::bigint[],
                $14::text[], $15::text[], $16::text[], $17::bigint[], $18::bigint[], $19::bigint[], $20::text[])",
            &[
                &entities,
                &from,
                &to,
                &kinds,
                &actions,
                &events,
                &retries,
                &request_ids,
                &at,
                &details,
                &hashes,
                &event_ids,
                &ordinals,
                &tkinds,
                &start_health,
                &end_health,
                &entry,
                &start,
                &action_start,
                &outcomes,
            ],
        )?;
        Ok(())
    }

    fn insert_successors(&mut self, rows: &[SuccessorInsert]) -> R<()> {
        let preds: Vec<i64> = rows.iter().map(|s| s.predecessor_id).collect();
        let succs: Vec<i64> = rows.iter().map(|s| s.successor_id).collect();
        let request_ids: Vec<Option<&str>> = rows.iter().map(|s| s.request_id.as_deref()).collect();
        let created: Vec<i64> = rows.iter().map(|s| s.created_at).collect();
        self.0.exec(
            "INSERT INTO successors (predecessor_id, successor_id, request_id, created_at)
             SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::text[], $4::bigint[])
             ON CONFLICT (predecessor_id, successor_id) DO NOTHING",
            &[&preds, &succs, &request_ids, &created],
        )?;
        Ok(())
    }

    fn replace_timers(&mut self, entities: &[i64], rows: &[TimerRow]) -> R<()> {
        self.0.exec("DELETE FROM timers WHERE entity_id = ANY($1::bigint[])", &[&entities])?;
        if rows.is_empty() {
            return Ok(());
        }
        let ids: Vec<i64> = rows.iter().map(|t| t.entity_id).collect();
        let names: Vec<&str> = rows.iter().map(|t| t.name.as_str()).collect();
        let events: Vec<&str> = rows.iter().map(|t| t.event.as_str()).collect();
        let due: Vec<i64> = rows.iter().map(|t| t.due_at).collect();
        let every: Vec<Option<i64>> = rows.iter().map(|t| t.every_ms).collect();
        self.0.exec(
            "INSERT INTO timers (entity_id, name, event, due_at, every_ms)
             SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[], $4::bigint[], $5::bigint[])",
            &[&ids, &names, &events, &due, &every],
        )?;
        Ok(())
    }

    fn cancel_tasks(&mut self, entities: &[i64], now: Millis) -> R<()> {
        cancel_tasks_of(self.0, entities, now)
    }

    fn offer_tasks(&mut self, rows: &[TaskInsert]) -> R<()> {
        let entities: Vec<i64> = rows.iter().map(|t| t.entity_id).collect();
        let queues: Vec<&str> = rows.iter().map(|t| t.queue.as_str()).collect();
        let actions: Vec<&str> = rows.iter().map(|t| t.action.as_str()).collect();
        let states: Vec<&str> = rows.iter().map(|t| t.state.as_str()).collect();
        let versions: Vec<i64> = rows.iter().map(|t| t.entity_version).collect();
        let retries: Vec<i64> = rows.iter().map(|t| t.retry).collect();
        let locks: Vec<i64> = rows.iter().map(|t| t.lock_ms).collect();
        let request_ids: Vec<Option<&str>> = rows.iter().map(|t| t.request_id.as_deref()).collect();
        let available: Vec<i64> = rows.iter().map(|t| t.available_at).collect();
        let created: Vec<i64> = rows.iter().map(|t| t.created_at).collect();
        // One open task per entity (the entity rows are locked): a repeated offer keeps it.
        self.0.exec(
            "INSERT INTO agent_tasks (entity_id, queue, action, state, entity_version, retry, lock_ms, request_id,
                status, available_at, created_at)
             SELECT v.entity_id, v.queue, v.action, v.state, v.entity_version, v.retry, v.lock_ms, v.request_id,
                'ready', v.available_at, v.created_at
             FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::bigint[], $7::bigint[],
                $8::text[], $9::bigint[], $10::bigint[])
                AS v(entity_id, queue, action, state, entity_version, retry, lock_ms, request_id, available_at,
                     created_at)
             WHERE NOT EXISTS (SELECT 1 FROM agent_tasks t
                               WHERE t.entity_id = v.entity_id AND t.status IN ('ready', 'leased'))",
            &[&entities, &queues, &actions, &states, &versions, &retries, &locks, &request_ids, &available, &created],
        )?;
        Ok(())
    }

    fn insert_errors(&mut self, rows: &[ErrorInsert]) -> R<Vec<i64>> {
        let entities: Vec<i64> = rows.iter().map(|e| e.entity_id).collect();
        let request_ids: Vec<Option<&str>> = rows.iter().map(|e| e.request_id.as_deref()).collect();
        let at: Vec<i64> = rows.iter().map(|e| e.at).collect();
        let kinds: Vec<&str> = rows.iter().map(|e| e.kind).collect();
        let details: Vec<&str> = rows.iter().map(|e| e.details.as_str()).collect();
        let inserted = self.0.query(
            "INSERT INTO errors (entity_id, operation_id, request_id, at, kind, details)
             SELECT v.entity_id, (SELECT o.id FROM operations o WHERE o.request_id = v.request_id), v.request_id,
                v.at, v.kind, v.details
             FROM unnest($1::bigint[], $2::text[], $3::bigint[], $4::text[], $5::text[])
                AS v(entity_id, request_id, at, kind, details)
             RETURNING id, entity_id",
            &[&entities, &request_ids, &at, &kinds, &details],
        )?;
        checked_ids(inserted, entities.iter().copied(), "errors")
    }

    fn insert_exceptions(&mut self, rows: &[ExceptionInsert]) -> R<()> {
        let errors: Vec<i64> = rows.iter().map(|e| e.error_id).collect();
        let at: Vec<i64> = rows.iter().map(|e| e.at).collect();
        let details: Vec<&str> = rows.iter().map(|e| e.details.as_str()).collect();
        self.0.exec(
            "INSERT INTO exceptions (error_id, at, details) SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::text[])",
            &[&errors, &at, &details],
        )?;
        Ok(())
    }

    fn insert_events(&mut self, rows: &[EventInsert]) -> R<()> {
        let ids: Vec<i64> = rows.iter().map(|e| e.id).collect();
        let request_ids: Vec<Option<&str>> = rows.iter().map(|e| e.request_id.as_deref()).collect();
        let entities: Vec<i64> = rows.iter().map(|e| e.entity_id).collect();
        let machines: Vec<&str> = rows.iter().map(|e| e.machine.as_str()).collect();
        let keys: Vec<&str> = rows.iter().map(|e| e.entity_key.as_str()).collect();
        let events: Vec<&str> = rows.iter().map(|e| e.event.as_str()).collect();
        let kinds: Vec<&str> = rows.iter().map(|e| e.kind).collect();
        let start_states: Vec<&str> = rows.iter().map(|e| e.start_state.as_str()).collect();
        let start_times: Vec<i64> = rows.iter().map(|e| e.start_time).collect();
        let rejected: Vec<bool> = rows.iter().map(|e| e.rejected).collect();
        let failed: Vec<bool> = rows.iter().map(|e| e.failed).collect();
        let error_ids: Vec<Option<i64>> = rows.iter().map(|e| e.error_id).collect();
        let exceptions: Vec<Option<&str>> = rows.iter().map(|e| e.exception.as_deref()).collect();
        let end_states: Vec<Option<&str>> = rows.iter().map(|e| e.end_state.as_deref()).collect();
        let end_times: Vec<Option<i64>> = rows.iter().map(|e| e.end_time).collect();
        let reasons: Vec<Option<&str>> = rows.iter().map(|e| e.reason.as_deref()).collect();
        let entered: Vec<Option<&str>> = rows.iter().map(|e| e.entered.as_deref()).collect();
        self.0.exec(
            "INSERT INTO events (id, operation_id, request_id, seq, entity_id, machine, entity_key, event, kind,
                start_state, start_time, rejected, failed, error_id, exception, end_state, end_time, reason, entered)
             SELECT v.id, (SELECT o.id FROM operations o WHERE o.request_id = v.request_id), v.request_id, v.id,
                v.entity_id, v.machine, v.entity_key, v.event, v.kind, v.start_state, v.start_time, v.rejected,
                v.failed, v.error_id, v.exception, v.end_state, v.end_time, v.reason, v.entered
             FROM unnest($1::bigint[], $2::text[], $3::bigint[], $4::text[], $5::text[], $6::text[], $7::text[],
                $8::text[], $9::bigint[], $10::boolean[], $11::boolean[], $12::bigint[], $13::text[], $14::text[],
                $15::bigint[], $16::text[], $17::text[])
                AS v(id, request_id, entity_id, machine, entity_key, event, kind, start_state, start_time, rejected,
                     failed, error_id, exception, end_state, end_time, reason, entered)",
            &[
                &ids,
                &request_ids,
                &entities,
                &machines,
                &keys,
                &events,
                &kinds,
                &start_states,
                &start_times,
                &rejected,
                &failed,
                &error_ids,
                &exceptions,
                &end_states,
                &end_times,
                &reasons,
                &entered,
            ],
        )?;
        Ok(())
    }

    fn end_events(&mut self, rows: &[EventEnd]) -> R<()> {
        let ids: Vec<i64> = rows.iter().map(|e| e.id).collect();
        let states: Vec<&str> = rows.iter().map(|e| e.end_state.as_str()).collect();
        let times: Vec<i64> = rows.iter().map(|e| e.end_time).collect();
        self.0.exec(
            "UPDATE events e SET end_state = v.end_state, end_time = v.end_time
             FROM unnest($1::bigint[], $2::text[], $3::bigint[]) AS v(id, end_state, end_time)
             WHERE e.id = v.id AND e.end_time IS NULL",
            &[&ids, &states, &times],
        )?;
        Ok(())
    }

    fn delete_operations(&mut self, request_ids: &[String]) -> R<()> {
        self.0.exec("DELETE FROM operations WHERE request_id = ANY($1::text[])", &[&request_ids])?;
        Ok(())
    }

    fn update_operations(&mut self, rows: &[OperationUpdate]) -> R<()> {
        let request_ids: Vec<&str> = rows.iter().map(|u| u.request_id.as_str()).collect();
        let first: Vec<Option<i64>> = rows.iter().map(|u| u.first_response_at).collect();
        let seen: Vec<bool> = rows.iter().map(|u| u.error_seen).collect();
        let errors: Vec<Option<&str>> = rows.iter().map(|u| u.error.as_deref()).collect();
        self.0.exec(
            "UPDATE operations o SET first_response_at = COALESCE(o.first_response_at, v.first_response_at),
                error_seen = o.error_seen OR v.error_seen, error = COALESCE(o.error, v.error)
             FROM unnest($1::text[], $2::bigint[], $3::boolean[], $4::text[])
                AS v(request_id, first_response_at, error_seen, error)
             WHERE o.request_id = v.request_id",
            &[&request_ids, &first, &seen, &errors],
        )?;
        Ok(())
    }

    fn complete_operations(&mut self, request_ids: &[String], now: Millis) -> R<()> {
        self.0.exec(
            "UPDATE operations SET ended_at = $2,
                outcome = CASE WHEN canceled THEN 'canceled' WHEN error_seen THEN 'failed' ELSE 'success' END
             WHERE request_id = ANY($1::text[]) AND ended_at IS NULL
               AND NOT EXISTS (SELECT 1 FROM entities e WHERE e.request_id = operations.request_id AND e.busy)
               AND NOT EXISTS (SELECT 1 FROM inbox i WHERE i.request_id = operations.request_id)",
            &[&request_ids, &now],
        )?;
        Ok(())
    }

    fn user_sql(&mut self, statements: &[SqlStatement]) -> R<Result<(), OpError>> {
        for (index, stmt) in statements.iter().enumerate() {
            if let Err(e) = self.0.exec_dynamic(&stmt.sql, &stmt.params) {
                // A lost connection or race is the batch's to retry; anything else is this
                // statement's fault.
                if recovery(&e) != Recovery::Fail {
                    return Err(Failure::Pg(e));
                }
                return Ok(Err(OpError::Sql { index, message: super::pg_message(&e) }));
            }
        }
        Ok(Ok(()))
    }

    fn other(&mut self, now: Millis, op: &Op) -> R<Result<Other, OpError>> {
        match apply_other(self.0, now, op) {
            Ok(other) => Ok(Ok(other)),
            Err(Fail::Op(e)) => Ok(Err(e)),
            Err(Fail::Db(e)) => Err(e),
        }
    }

    fn savepoint(&mut self) -> R<()> {
        Ok(self.0.batch("SAVEPOINT op")?)
    }

    fn release_savepoint(&mut self) -> R<()> {
        Ok(self.0.batch("RELEASE SAVEPOINT op")?)
    }

    fn rollback_savepoint(&mut self) -> R<()> {
        Ok(self.0.batch("ROLLBACK TO SAVEPOINT op; RELEASE SAVEPOINT op")?)
    }

    fn fire_timers(&mut self, now: Millis, limit: usize) -> R<()> {
        fire_timers(self.0, now, limit as i64)
    }

    fn claim(&mut self, now: Millis, claim: &Claim) -> R<Vec<Claimed>> {
        let until = now + claim.lease_ms;
        let rows = self.0.query(
            &format!(
                "WITH picked AS (
                    SELECT id, due_at AS was_due FROM entities
                    WHERE due_at <= $1 AND (cardinality($5::text[]) = 0 OR machine = ANY($5::text[]))
                    ORDER BY due_at LIMIT $4 FOR UPDATE SKIP LOCKED)
                 UPDATE entities e SET lease_owner = $2, lease_until = $3, due_at = $3, sleep_until = NULL,
                    run_status = CASE WHEN run_status IN ('sleeping', 'fault') THEN 'active' ELSE run_status END
                 FROM picked p WHERE e.id = p.id
                 RETURNING p.was_due, {}",
                ENTITY_COLS.split(", ").map(|c| format!("e.{c}")).collect::<Vec<_>>().join(", ")
            ),
            &[&now, &claim.owner, &until, &(claim.limit as i64), &claim.machines],
        )?;
        let mut picked = Vec::with_capacity(rows.len());
        for r in &rows {
            let was: i64 = r.try_get(0)?;
            picked.push((was, entity_from_row_at(r, 1)?));
        }
        // Oldest due first, as claimed.
        picked.sort_by_key(|(was, e)| (*was, e.id));
        if picked.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<i64> = picked.iter().map(|(_, e)| e.id).collect();
        let mut heads = std::collections::HashMap::new();
        for r in self.0.query(
            &format!(
                "SELECT {INBOX_COLS} FROM unnest($1::bigint[]) AS c(id)
                 CROSS JOIN LATERAL (SELECT * FROM inbox WHERE entity_id = c.id ORDER BY id LIMIT 1) i"
            ),
            &[&ids],
        )? {
            let item = inbox_from_row(&r)?;
            heads.insert(item.entity_id, item);
        }
        Ok(picked.into_iter().map(|(_, entity)| Claimed { inbox_head: heads.remove(&entity.id), entity }).collect())
    }

    fn next_due(&mut self, machines: &[String]) -> R<Option<Millis>> {
        Ok(self
            .0
            .one(
                "SELECT MIN(due_at) FROM entities
                 WHERE due_at IS NOT NULL AND (cardinality($1::text[]) = 0 OR machine = ANY($1::text[]))",
                &[&machines],
            )?
            .try_get(0)?)
    }
}
