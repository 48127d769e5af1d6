//! The SQLite dialect's writes: each set of rows a segment decided ([`Writes`]), row by row
//! with cached statements, in the order of its fields.

use std::sync::atomic::Ordering;

use rusqlite::{OptionalExtension, params};

use super::counts::Tally;
use super::dialect::Tx;
use crate::plan::Writes;
use crate::plan::rows::*;
use crate::{Millis, TimerRow};

/// When operations end (`now`, the batch's place `xid` in the change feed) and the outcome
/// of those an ending statement applies to (`old`: none, or `hung`).
#[derive(Clone, Copy)]
struct End<'a> {
    now: Millis,
    xid: i64,
    old: Option<&'a str>,
}

impl Tx<'_> {
    /// Writes the sets of `w`; answers the ids of the new inbox items, in order.
    pub(super) fn write_sets(&mut self, w: &Writes) -> rusqlite::Result<Vec<i64>> {
        // What the statements below change in the operation and minute counts.
        let mut tally = Tally::default();
        if !w.entities.is_empty() {
            self.insert_entities(&w.entities)?;
        }
        if !w.updates.is_empty() {
            self.update_entities(&w.updates)?;
        }
        let notices = if w.deletes.is_empty() { Vec::new() } else { self.delete_inbox(&w.deletes)? };
        let ids = if w.inbox.is_empty() { Vec::new() } else { self.insert_inbox(&w.inbox)? };
        // The change feed's position of this write's history rows and operation ends.
        let ends = !w.op_done.is_empty() || !w.complete.is_empty() || !notices.is_empty();
        let xid = if w.history.is_empty() && !ends { 0 } else { self.feed_clock()? };
        if !w.inbox_clear.is_empty() {
            self.clear_inbox(&w.inbox_clear)?;
        }
        if !w.inbox_drop.is_empty() {
            self.drop_inbox(&w.inbox_drop)?;
        }
        if !w.history.is_empty() {
            self.insert_history(&w.history, xid, &mut tally)?;
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
        if !w.task_updates.is_empty() {
            self.update_tasks(&w.task_updates)?;
        }
        if !w.offer_now.is_empty() {
            self.offer_now(&w.offer_now, w.now)?;
        }
        if !w.offers.is_empty() {
            self.offer_tasks(&w.offers)?;
        }
        if !w.errors.is_empty() {
            self.insert_errors(&w.errors, &mut tally)?;
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
            self.delete_operations(&w.unopen, &mut tally)?;
        }
        if !w.op_updates.is_empty() {
            self.update_operations(&w.op_updates)?;
        }
        if !w.op_cancel.is_empty() {
            self.cancel_operations(&w.op_cancel)?;
        }
        let notices: Vec<String> = notices.into_iter().filter(|r| !w.complete.contains(r)).collect();
        if !w.op_done.is_empty() || !w.complete.is_empty() || !notices.is_empty() {
            // An open operation's outcome is none or `hung`. Ending one as a success runs
            // once for each old outcome it counts down (`hung` only while some operation
            // is); ending one that nothing waits on any more reads its outcome first.
            if !w.op_done.is_empty() {
                let hung = self.hung_count()? > 0;
                for old in [None, Some("hung")].into_iter().take(if hung { 2 } else { 1 }) {
                    self.end_operations(&w.op_done, End { now: w.now, xid, old }, &mut tally)?;
                }
            }
            if !w.complete.is_empty() {
                self.complete_operations(&w.complete, w.now, xid, &mut tally)?;
            }
            if !notices.is_empty() {
                self.complete_operations(&notices, w.now, xid, &mut tally)?;
            }
        }
        if !w.hung.is_empty() {
            self.mark_hung(&w.hung, &mut tally)?;
        }
        if !w.renewals.is_empty() {
            self.renew(&w.renewals)?;
        }
        if w.restarted {
            self.0.execute("UPDATE operations SET restart_count = restart_count + 1 WHERE ended_at IS NULL", [])?;
        }
        if !w.counts.is_empty() {
            super::counts::add(self.0, &w.counts)?;
        }
        tally.flush(self.0)?;
        for (entity_id, t) in &w.trims {
            let (before, rows) = crate::sql::trim_params(t);
            for sql in crate::sql::TRIM {
                self.0.prepare_cached(sql)?.execute(params![entity_id, before, rows])?;
            }
        }
        Ok(ids)
    }

    fn insert_entities(&mut self, rows: &[EntityInsert]) -> rusqlite::Result<()> {
        let mut stmt = self.0.prepare_cached(
            "INSERT INTO entities (machine, key, state, properties, version, retry, created_at, entered_at, auto_at,
                due_at, request_id, busy, machine_hash, timer_at, has_predecessors, id, lease_owner, lease_until)
             VALUES (?1, ?2, ?3, ?4, 1, 0, ?5, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)",
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
                e.id,
                e.lease_owner,
                e.lease_until
            ])?;
        }
        Ok(())
    }

    fn update_entities(&mut self, rows: &[EntityUpdate]) -> rusqlite::Result<()> {
        // SQLite rewrites every index whose column the SET list names, whatever its value:
        // an indexed column is set only when it changed (at most 64 statements, cached).
        // Rows (distinct entities) go by statement, each statement taken from the cache once.
        let mut order: Vec<&EntityUpdate> = rows.iter().collect();
        order.sort_by_key(|u| u.indexed.0);
        for same in order.chunk_by(|a, b| a.indexed == b.indexed) {
            let mut stmt = self.0.prepare_cached(update_sql(same[0].indexed))?;
            for u in same {
                Self::update_entity(&mut stmt, u)?;
            }
        }
        Ok(())
    }

    /// Runs `stmt`, the `UPDATE` for `u.indexed`, for `u`.
    fn update_entity(stmt: &mut rusqlite::CachedStatement<'_>, u: &EntityUpdate) -> rusqlite::Result<()> {
        let r = &u.row;
        let run_status = r.run_status.as_str();
        // In the order of `UPDATE_SET`.
        let values: [&dyn rusqlite::ToSql; UPDATE_SET.len()] = [
            &r.state,
            &r.version,
            &r.retry,
            &r.entered_at,
            &r.auto_at,
            &r.due_at,
            &r.lease_owner,
            &r.lease_until,
            &r.request_id,
            &r.busy,
            &r.timer_at,
            &run_status,
            &r.sleep_until,
            &r.event_id,
            &r.ordinal,
            &r.has_predecessors,
            &r.machine_hash,
            &u.properties,
            &u.fired,
            &u.recent_errors,
            &r.ended_at,
        ];
        stmt.raw_bind_parameter(1, r.id)?;
        for (n, ((_, set), value)) in UPDATE_SET.iter().zip(values).enumerate() {
            if set(u.indexed) {
                stmt.raw_bind_parameter(n + 2, value)?;
            }
        }
        stmt.raw_execute().map(drop)
    }

    /// Deletes the consumed items; answers the request ids of the change notices deleted
    /// (their operations may end now: the plan reads them on PostgreSQL, here the delete
    /// returns them).
    fn delete_inbox(&mut self, rows: &[InboxDelete]) -> rusqlite::Result<Vec<String>> {
        let mut stmt = self.0.prepare_cached(
            "DELETE FROM inbox WHERE entity_id = ?1 AND (id = ?2 OR (kind = 'notice' AND id <= ?3))
             RETURNING CASE WHEN kind = 'notice' THEN request_id END",
        )?;
        // The usual case, no notice consumed: without `RETURNING`, which has SQLite gather the
        // deleted rows in a temporary table first.
        let mut plain = self.0.prepare_cached("DELETE FROM inbox WHERE id = ?2 AND entity_id = ?1")?;
        let mut notices: Vec<String> = Vec::new();
        for r in rows {
            if r.notices_upto < 0 {
                plain.execute([r.entity_id, r.consume])?;
                continue;
            }
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
            "INSERT INTO inbox (entity_id, event, params, request_id, kind, created_at, reply)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        )?;
        let mut ids = Vec::with_capacity(rows.len());
        for i in rows {
            stmt.execute(params![i.entity_id, i.event, i.params, i.request_id, i.kind, i.created_at, i.reply])?;
            ids.push(self.0.last_insert_rowid());
        }
        Ok(ids)
    }

    /// This batch's number in the file's change feed (see the `0014_feed` migration): taken
    /// by its first write of history or operation ends, kept for the others.
    fn feed_clock(&mut self) -> rusqlite::Result<i64> {
        if self.2 == 0 {
            self.2 = self
                .0
                .prepare_cached("UPDATE feed_clock SET seq = seq + 1 RETURNING seq")?
                .query_row([], |r| r.get(0))?;
        }
        Ok(self.2)
    }

    fn insert_history(&mut self, rows: &[HistoryInsert], xid: i64, tally: &mut Tally) -> rusqlite::Result<()> {
        let mut stmt = self.0.prepare_cached(
            "INSERT INTO history (entity_id, from_state, to_state, kind, action, event, retry, request_id, at, detail,
                machine_hash, event_id, ordinal, transition_kind, start_health, end_health, entry_time, start_time,
                action_start_time, outcome, xid)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21)",
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
                h.outcome,
                xid
            ])?;
            // A state entered by the workflow (not an operator's or an upgrade's move).
            if h.to_state.is_some() && h.transition_kind.is_some() {
                tally.transition(h.at);
            }
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
        let mut stmt = self.0.prepare_cached(
            "UPDATE agent_tasks SET status = 'canceled', outcome = 'canceled', finished_at = ?2
             WHERE entity_id = ?1 AND status IN ('ready', 'leased')",
        )?;
        for &id in entities {
            stmt.execute(params![id, now])?;
        }
        Ok(())
    }

    fn offer_tasks(&mut self, rows: &[TaskInsert]) -> rusqlite::Result<()> {
        self.1.store(true, Ordering::Relaxed);
        // One open task per entity: a repeated offer (e.g. after a resume) keeps the open one.
        let mut stmt = self.0.prepare_cached(
            "INSERT INTO agent_tasks (entity_id, queue, action, state, entity_version, retry, lock_ms, request_id,
                status, available_at, created_at, event_id)
             SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, 'ready', ?9, ?10, ?11
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
                t.created_at,
                t.event_id
            ])?;
        }
        Ok(())
    }

    fn insert_errors(&mut self, rows: &[ErrorInsert], tally: &mut Tally) -> rusqlite::Result<()> {
        let mut stmt = self.0.prepare_cached(
            "INSERT INTO errors (id, entity_id, operation_id, request_id, at, kind, details, cause)
             VALUES (?6, ?1, (SELECT id FROM operations WHERE request_id = ?2), ?2, ?3, ?4, ?5, ?7)",
        )?;
        for e in rows {
            stmt.execute(params![e.entity_id, e.request_id, e.at, e.kind, e.details, e.id, e.cause])?;
            tally.error(e.at);
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
                start_state, start_time, rejected, failed, error_id, exception, end_state, end_time, reason, entered,
                params, reply)
             VALUES (?1, (SELECT id FROM operations WHERE request_id = ?2), ?2, ?1, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10,
                ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19)",
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
                e.entered,
                e.params,
                e.reply
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

    fn delete_operations(&mut self, request_ids: &[String], tally: &mut Tally) -> rusqlite::Result<()> {
        let mut stmt = self.0.prepare_cached("DELETE FROM operations WHERE request_id = ?1 RETURNING outcome")?;
        for r in request_ids {
            for outcome in stmt.query_map([r], |row| row.get::<_, Option<String>>(0))? {
                tally.outcome(outcome?.as_deref(), -1);
            }
        }
        Ok(())
    }

    /// How many operations are marked hung (and not ended).
    fn hung_count(&mut self) -> rusqlite::Result<i64> {
        let mut stmt = self.0.prepare_cached("SELECT n FROM operation_counts WHERE outcome = 'hung'")?;
        Ok(stmt.query_row([], |r| r.get(0)).optional()?.unwrap_or(0))
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

    /// Ends those of the open operations `request_ids` that nothing waits on any more.
    ///
    /// Each is read first, by its key, with what it waits on: most that cannot end need
    /// nothing else (a workflow that took an entity over names the operation it worked for,
    /// long ended; each child at rest names its parent's, whose other children still run),
    /// and an `UPDATE` opens a cursor on every index of the table before it tests a row. One
    /// that ends is updated by its row id with the outcome its row gives. The single
    /// writer's transaction holds both statements, so nothing changes between them.
    fn complete_operations(
        &mut self,
        request_ids: &[String],
        now: Millis,
        xid: i64,
        tally: &mut Tally,
    ) -> rusqlite::Result<()> {
        let mut open = self.0.prepare_cached(
            // Correlated, the tests of what it waits on run after the row is found open
            // (with `?1` in them SQLite runs them first).
            "SELECT o.id, o.outcome, o.canceled, o.error_seen FROM operations o
             WHERE o.request_id = ?1 AND o.ended_at IS NULL
               AND NOT EXISTS (SELECT 1 FROM entities e WHERE e.request_id = o.request_id AND e.busy = 1)
               AND NOT EXISTS (SELECT 1 FROM inbox i WHERE i.request_id = o.request_id)",
        )?;
        let mut end =
            self.0.prepare_cached("UPDATE operations SET ended_at = ?2, end_xid = ?3, outcome = ?4 WHERE id = ?1")?;
        for r in request_ids {
            let row = open
                .query_row([r], |row| {
                    Ok((
                        row.get::<_, i64>(0)?,
                        row.get::<_, Option<String>>(1)?,
                        row.get::<_, bool>(2)?,
                        row.get::<_, bool>(3)?,
                    ))
                })
                .optional()?;
            let Some((id, old, canceled, error_seen)) = row else { continue };
            let new = ended_outcome(canceled, error_seen);
            end.execute(params![id, now, xid, new])?;
            tally.moved(old.as_deref(), Some(new), 1);
        }
        Ok(())
    }

    fn clear_inbox(&mut self, entities: &[i64]) -> rusqlite::Result<()> {
        let mut stmt = self.0.prepare_cached("DELETE FROM inbox WHERE entity_id = ?1")?;
        for id in entities {
            stmt.execute([id])?;
        }
        Ok(())
    }

    fn drop_inbox(&mut self, items: &[(i64, String)]) -> rusqlite::Result<()> {
        let mut stmt = self.0.prepare_cached("DELETE FROM inbox WHERE entity_id = ?1 AND request_id = ?2")?;
        for (id, request_id) in items {
            stmt.execute(params![id, request_id])?;
        }
        Ok(())
    }

    fn update_tasks(&mut self, rows: &[TaskRow]) -> rusqlite::Result<()> {
        let mut stmt = self.0.prepare_cached(
            "UPDATE agent_tasks SET status = ?2, attempt = ?3, token = ?4, agent = ?5, leased_at = ?6,
                locked_until = ?7, available_at = ?8, finished_at = ?9, outcome = ?10, error = ?11
             WHERE id = ?1",
        )?;
        for t in rows {
            stmt.execute(params![
                t.id,
                t.status,
                t.attempt,
                t.token,
                t.agent,
                t.leased_at,
                t.locked_until,
                t.available_at,
                t.finished_at,
                t.outcome,
                t.error
            ])?;
        }
        Ok(())
    }

    fn offer_now(&mut self, entities: &[i64], now: Millis) -> rusqlite::Result<()> {
        let mut stmt = self
            .0
            .prepare_cached("UPDATE agent_tasks SET available_at = ?2 WHERE entity_id = ?1 AND status = 'ready'")?;
        for id in entities {
            stmt.execute(params![id, now])?;
        }
        Ok(())
    }

    fn cancel_operations(&mut self, request_ids: &[String]) -> rusqlite::Result<()> {
        let mut stmt =
            self.0.prepare_cached("UPDATE operations SET canceled = 1 WHERE request_id = ?1 AND ended_at IS NULL")?;
        for r in request_ids {
            stmt.execute([r])?;
        }
        Ok(())
    }

    /// Ends those of the operations `request_ids` whose outcome is `old` (none, or `hung`) as
    /// a success.
    fn end_operations(&mut self, request_ids: &[String], at: End, tally: &mut Tally) -> rusqlite::Result<()> {
        let End { now, xid, old } = at;
        let mut stmt = self.0.prepare_cached(
            "UPDATE operations SET first_response_at = ?2, ended_at = ?2, outcome = 'success', end_xid = ?3
             WHERE request_id = ?1 AND ended_at IS NULL AND outcome IS ?4",
        )?;
        for r in request_ids {
            let ended = stmt.execute(params![r, now, xid, old])?;
            tally.moved(old, Some("success"), ended as i64);
        }
        Ok(())
    }

    fn mark_hung(&mut self, request_ids: &[String], tally: &mut Tally) -> rusqlite::Result<()> {
        let mut stmt = self.0.prepare_cached(
            "UPDATE operations SET outcome = 'hung' WHERE request_id = ?1 AND ended_at IS NULL AND outcome IS NULL",
        )?;
        for r in request_ids {
            let marked = stmt.execute([r])?;
            tally.moved(None, Some("hung"), marked as i64);
        }
        Ok(())
    }

    fn renew(&mut self, rows: &[Renewal]) -> rusqlite::Result<()> {
        let mut stmt = self.0.prepare_cached("UPDATE entities SET lease_until = ?2, due_at = ?2 WHERE id = ?1")?;
        for r in rows {
            stmt.execute(params![r.id, r.until])?;
        }
        Ok(())
    }
}

/// The columns an entity's UPDATE sets, in the order of their parameters (`?2` on; `?1` is
/// the id), each with when it is set: an indexed column when it changed, the others always
/// (the JSON columns only when given: `COALESCE`).
const UPDATE_SET: [(&str, SetWhen); 21] = [
    ("state", |i| i.has(Indexed::STATE)),
    ("version", |_| true),
    ("retry", |_| true),
    ("entered_at", |i| i.has(Indexed::ENTERED_AT)),
    ("auto_at", |_| true),
    ("due_at", |i| i.has(Indexed::DUE_AT)),
    ("lease_owner", |_| true),
    ("lease_until", |_| true),
    ("request_id", |i| i.has(Indexed::BUSY)),
    ("busy", |i| i.has(Indexed::BUSY)),
    ("timer_at", |_| true),
    ("run_status", |i| i.has(Indexed::RUN_STATUS)),
    ("sleep_until", |_| true),
    ("event_id", |_| true),
    ("ordinal", |_| true),
    ("has_predecessors", |_| true),
    ("machine_hash", |_| true),
    ("properties", |_| true),
    ("fired", |_| true),
    ("recent_errors", |_| true),
    ("ended_at", |i| i.has(Indexed::ENDED_AT)),
];

/// The outcome an operation ends with when nothing waits on it any more: canceled if it
/// was, failed if an error was seen on its way, else a success (PostgreSQL's statement
/// says the same in SQL).
fn ended_outcome(canceled: bool, error_seen: bool) -> &'static str {
    if canceled {
        "canceled"
    } else if error_seen {
        "failed"
    } else {
        "success"
    }
}

/// Whether an update sets a column, given what changed.
type SetWhen = fn(Indexed) -> bool;

/// An entity's UPDATE setting the columns of [`UPDATE_SET`] that `changed` asks for: one
/// string per combination, built on first use (formatting it for every row cost the writer
/// more than the statement cache's lookup by it).
fn update_sql(changed: Indexed) -> &'static str {
    static ALL: std::sync::LazyLock<Vec<String>> =
        std::sync::LazyLock::new(|| (0..Indexed::COMBINATIONS).map(|m| build_update_sql(Indexed(m as u8))).collect());
    &ALL[usize::from(changed.0)]
}

/// The text of [`update_sql`]'s statement for `changed`.
fn build_update_sql(changed: Indexed) -> String {
    use std::fmt::Write;
    let mut sql = String::with_capacity(512);
    sql.push_str("UPDATE entities SET ");
    for (n, (column, set)) in UPDATE_SET.iter().enumerate() {
        if !set(changed) {
            continue;
        }
        if !sql.ends_with("SET ") {
            sql.push_str(", ");
        }
        let _ = match *column {
            "properties" | "fired" | "recent_errors" => write!(sql, "{column} = COALESCE(?{}, {column})", n + 2),
            _ => write!(sql, "{column} = ?{}", n + 2),
        };
    }
    sql.push_str(" WHERE id = ?1");
    sql
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RunStatus;

    fn indexes_set(sql: &str) -> Vec<&'static str> {
        ["state =", "entered_at =", "due_at =", "request_id =", "busy =", "run_status =", "ended_at ="]
            .into_iter()
            .filter(|c| sql.contains(&format!(" {c}")) || sql.contains(&format!(",{c}")))
            .collect()
    }

    /// An update names an indexed column only when its value changes, and every one when all
    /// do; the other columns always.
    #[test]
    fn an_update_sets_the_indexed_columns_that_changed() {
        assert!(indexes_set(update_sql(Indexed::default())).is_empty(), "{}", update_sql(Indexed::default()));
        let all = Indexed::STATE
            | Indexed::ENTERED_AT
            | Indexed::DUE_AT
            | Indexed::BUSY
            | Indexed::RUN_STATUS
            | Indexed::ENDED_AT;
        assert_eq!(indexes_set(update_sql(all)).len(), 7, "{}", update_sql(all));
        let due = Indexed::DUE_AT;
        assert_eq!(indexes_set(update_sql(due)), ["due_at ="]);
        let before = Current { state: "a".into(), request_id: Some("r".into()), busy: true, ..Current::default() };
        let same = Indexed::between(&before, &Current { version: 9, lease_owner: Some("me".into()), ..before.clone() });
        assert_eq!(same, Indexed::default());
        let moved = Current { state: "b".into(), busy: false, run_status: RunStatus::Paused, ..before.clone() };
        assert_eq!(Indexed::between(&before, &moved), Indexed::STATE | Indexed::BUSY | Indexed::RUN_STATUS);
    }

    /// Each of the 64 combinations has its own statement, kept from first use, and each
    /// names exactly the indexed columns of its combination.
    #[test]
    fn every_combination_has_its_own_statement() {
        let mut seen = std::collections::HashSet::new();
        for m in 0..Indexed::COMBINATIONS {
            let changed = Indexed(m as u8);
            let sql = update_sql(changed);
            assert_eq!(sql, build_update_sql(changed));
            assert!(std::ptr::eq(sql, update_sql(changed)), "built again: {sql}");
            let named = indexes_set(sql).len();
            let changed_count = m.count_ones() as usize + usize::from(changed.has(Indexed::BUSY));
            assert_eq!(named, changed_count, "{m:06b}: {sql}");
            assert!(seen.insert(sql), "two combinations share {sql}");
        }
    }

    /// What an update with some indexed columns left out writes: its values where they
    /// changed, the row's where they did not, and the indexes follow.
    #[test]
    fn a_partial_update_writes_the_row_and_its_indexes() {
        let c = super::super::schema::migrated_in_memory();
        c.execute_batch(
            "INSERT INTO entities (id, machine, key, state, version, created_at, entered_at, request_id, busy, due_at)
             VALUES (1, 'm', 'k', 'idle', 1, 0, 5, 'r1', 1, 50)",
        )
        .unwrap();
        let open = std::sync::atomic::AtomicBool::new(false);
        let mut tx = super::super::dialect::Tx(&c, &open, 0);
        let before = Current {
            id: 1,
            machine: "m".into(),
            key: "k".into(),
            state: "idle".into(),
            version: 1,
            entered_at: 5,
            due_at: Some(50),
            request_id: Some("r1".into()),
            busy: true,
            ..Current::default()
        };
        let after = Current { version: 2, due_at: Some(70), busy: false, ..before.clone() };
        let update = |row: Current| EntityUpdate {
            indexed: Indexed::between(&before, &row),
            row,
            properties: None,
            fired: None,
            recent_errors: None,
        };
        tx.update_entities(&[update(after)]).unwrap();
        let row: (String, i64, i64, Option<i64>, bool, String) = c
            .query_row(
                "SELECT state, version, entered_at, due_at, busy, run_status FROM entities WHERE id = 1",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?)),
            )
            .unwrap();
        assert_eq!(row, ("idle".into(), 2, 5, Some(70), false, "active".into()));
        let busy: i64 = c
            .query_row(
                "SELECT count(*) FROM entities INDEXED BY entities_busy_request WHERE request_id = 'r1' AND busy = 1",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(busy, 0, "no longer busy for r1");
        let due: Vec<i64> = c
            .prepare("SELECT id FROM entities INDEXED BY entities_due WHERE due_at = 70")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        assert_eq!(due, [1]);
        let check: String = c.query_row("PRAGMA integrity_check", [], |r| r.get(0)).unwrap();
        assert_eq!(check, "ok");
    }
}
