//! The SQLite [`Dialect`] of the batch plan: each set of rows the plan reads or writes runs
//! row by row with cached statements (SQLite runs in-process: a statement costs
//! microseconds, not a round trip). The writer is the file's only one: reading is locking,
//! and the ids after the largest taken are free for the batch. This file reads; the writes
//! are in `sets.rs`, the batch's end (timers, claims) in `claim.rs`.

use std::sync::atomic::AtomicBool;

use rusqlite::types::Value as SqlValue;
use rusqlite::{Connection, OptionalExtension, params};
use serde_json::Value;

use super::claim;
use super::read::{INBOX_COLS, entity_from_row, inbox_from_row, task_from_row, timer_from_row};
use crate::plan::limits::Val;
use crate::plan::rows::*;
use crate::plan::{Dialect, Finish, ReadSet, Reads, Writes};
use crate::sql::{ENTITY_COLS, TASK_COLS};
use crate::{AgentTask, Claimed, EntityRow, InboxItem, Millis, OpError, SqlStatement, TimerRow, Trigger};

/// The writer's connection inside a batch's transaction, as the plan's [`Dialect`], whether
/// any agent task may be open (see `Inner::tasks_open`), and the batch's number in the
/// change feed once taken (0: not yet; see `sets.rs::feed_clock`).
pub(crate) struct Tx<'a>(pub(crate) &'a Connection, pub(crate) &'a AtomicBool, pub(crate) i64);

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
    fn with_opt_text<T>(&self, col: usize, f: impl FnOnce(&str) -> T) -> rusqlite::Result<Option<T>> {
        Ok(self.get_ref(col)?.as_str_or_null()?.map(f))
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
    /// Reads (locks) the segment's entities and those related to them; answers them and the
    /// `notify` entities that have predecessors to read.
    fn lock(&mut self, r: &Reads) -> rusqlite::Result<(Vec<Current>, Vec<i64>)> {
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
        let mut of_task = tx.prepare_cached(&format!(
            "SELECT {CURRENT_COLS} FROM entities WHERE id = (SELECT entity_id FROM agent_tasks WHERE id = ?1)"
        ))?;
        for task in &r.reported {
            out.extend(of_task.query_row([task], current_from_row).optional()?);
        }
        // Predecessors of the `notify` entities, successors of the `successors` ones. An
        // entity whose row says it has no predecessors has no edge to read (the flag is set
        // with its first edge and never cleared while one is left); edges joined in this
        // segment the plan knows already.
        let with_predecessors: crate::decode::HashSet<i64> =
            out.iter().filter(|c| c.has_predecessors).map(|c| c.id).collect();
        let notify: Vec<i64> = r.notify.iter().copied().filter(|id| with_predecessors.contains(id)).collect();
        for (ids, other, end) in
            [(&notify, "predecessor_id", "successor_id"), (&r.successors, "successor_id", "predecessor_id")]
        {
            let mut related = tx.prepare_cached(&related_sql(other, end))?;
            for id in ids {
                let first = out.len();
                for row in related.query_map([id], current_from_row)? {
                    out.push(row?);
                }
                // In id order, as `id IN (...)` would give them (the join follows the edges).
                out[first..].sort_unstable_by_key(|c| c.id);
            }
        }
        Ok((out, notify))
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
        // The oldest internal event goes first (a probe of the small partial index, only after
        // consuming one: they head the inbox, so nothing else is consumed while one waits),
        // else the oldest item.
        let mut internal = self.0.prepare_cached(&format!(
            "SELECT {INBOX_COLS} FROM inbox
             WHERE entity_id = ?1 AND id <> ?2 AND kind = 'internal' ORDER BY id LIMIT 1"
        ))?;
        let mut stmt = self.0.prepare_cached(&format!(
            "SELECT {INBOX_COLS} FROM inbox
             WHERE entity_id = ?1 AND id <> ?2 AND NOT (kind = 'notice' AND id <= ?3) ORDER BY id LIMIT 1"
        ))?;
        let mut out = Vec::with_capacity(rows.len());
        for r in rows {
            let first = match r.internal {
                true => internal.query_row([r.entity_id, r.consume], inbox_from_row).optional()?,
                false => None,
            };
            let first = match first {
                Some(item) => Some(item),
                None => stmt.query_row([r.entity_id, r.consume, r.notices_upto], inbox_from_row).optional()?,
            };
            out.extend(first);
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
            "INSERT INTO operations (request_id, name, machine, entity_key, started_at, dimensions, first_response_at,
                priority)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) ON CONFLICT (request_id) DO NOTHING",
        )?;
        let mut existing = self.0.prepare_cached("SELECT id FROM operations WHERE request_id = ?1")?;
        let mut out = Vec::with_capacity(rows.len());
        let mut opened = 0;
        for o in rows {
            let n = insert.execute(params![
                o.request_id,
                o.name,
                o.machine,
                o.entity_key,
                o.started_at,
                o.dimensions,
                o.first_response_at,
                o.priority
            ])?;
            if n == 1 {
                out.push((self.0.last_insert_rowid(), false));
                opened += 1;
            } else {
                out.push((existing.query_row([&o.request_id], |r| r.get(0))?, true));
            }
        }
        // The new operations are open: one change to their count (no trigger keeps it).
        let mut tally = super::counts::Tally::default();
        tally.outcome(None, opened);
        tally.flush(self.0)?;
        Ok(out)
    }

    /// Each commanded entity's whole row and what it holds.
    fn commanded(&mut self, keys: &[(String, String)]) -> rusqlite::Result<Vec<(EntityRow, Facts)>> {
        let tx = self.0;
        let mut entity =
            tx.prepare_cached(&format!("SELECT {ENTITY_COLS} FROM entities WHERE machine = ?1 AND key = ?2"))?;
        let mut inbox = tx.prepare_cached("SELECT EXISTS (SELECT 1 FROM inbox WHERE entity_id = ?1)")?;
        let mut requests = tx.prepare_cached(
            "SELECT DISTINCT request_id FROM inbox WHERE entity_id = ?1 AND request_id IS NOT NULL ORDER BY 1",
        )?;
        let mut task = tx.prepare_cached(
            "SELECT EXISTS (SELECT 1 FROM agent_tasks WHERE entity_id = ?1 AND status IN ('ready', 'leased'))",
        )?;
        let mut out = Vec::with_capacity(keys.len());
        for (machine, key) in keys {
            let Some(e) = entity.query_row([machine, key], entity_from_row).optional()? else { continue };
            let facts = Facts {
                inbox: inbox.query_row([e.id], |r| r.get(0))?,
                inbox_requests: requests.query_map([e.id], |r| r.get(0))?.collect::<rusqlite::Result<_>>()?,
                open_task: task.query_row([e.id], |r| r.get(0))?,
            };
            out.push((e, facts));
        }
        Ok(out)
    }

    fn tasks(&mut self, ids: &[i64]) -> rusqlite::Result<Vec<TaskRow>> {
        let mut stmt = self.0.prepare_cached(&format!("SELECT {TASK_ROW_COLS} FROM agent_tasks WHERE id = ?1"))?;
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            out.extend(stmt.query_row([id], |r| TaskRow::from_columns(r)).optional()?);
        }
        Ok(out)
    }

    fn leasable(&mut self, queue: &str, limit: usize, now: Millis) -> rusqlite::Result<Vec<AgentTask>> {
        self.0
            .prepare_cached(&format!(
                "SELECT {TASK_COLS} FROM agent_tasks t JOIN entities e ON e.id = t.entity_id
                 WHERE t.queue = ?1 AND t.status IN ('ready', 'leased') AND t.available_at <= ?2
                   AND e.run_status = 'active'
                 ORDER BY t.available_at, t.id LIMIT CAST(?3 AS INTEGER)"
            ))?
            .query_map(params![queue, now, limit as i64], task_from_row)?
            .collect()
    }

    fn renewable(&mut self, ids: &[i64]) -> rusqlite::Result<Vec<(i64, Option<String>)>> {
        let mut stmt = self.0.prepare_cached("SELECT id, lease_owner FROM entities WHERE id = ?1")?;
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            out.extend(stmt.query_row([id], |r| Ok((r.get(0)?, r.get(1)?))).optional()?);
        }
        Ok(out)
    }

    fn open_operations_before(&mut self, before: Millis) -> rusqlite::Result<Vec<OpenOperation>> {
        self.0
            .prepare_cached(
                "SELECT o.request_id, o.started_at,
                    (SELECT MAX(e.entered_at) FROM entities e WHERE e.request_id = o.request_id AND e.busy = 1),
                    (SELECT MAX(i.created_at) FROM inbox i WHERE i.request_id = o.request_id)
                 FROM operations o WHERE o.ended_at IS NULL AND o.outcome IS NULL AND o.started_at < ?1",
            )?
            .query_map([before], |r| {
                Ok(OpenOperation {
                    request_id: r.get(0)?,
                    started_at: r.get(1)?,
                    last_entered: r.get(2)?,
                    last_queued: r.get(3)?,
                })
            })?
            .collect()
    }

    fn leased(&mut self) -> rusqlite::Result<Vec<(i64, i64, String)>> {
        self.0
            .prepare(
                // A leased entity is due (at its lease's end, or its sleep's) unless paused or
                // parked: the two partial indexes find every one without reading the fleet at
                // rest (a full scan took ~100 ms at a million entities, at every start).
                "SELECT id, version, lease_owner FROM entities WHERE due_at IS NOT NULL AND lease_owner IS NOT NULL
                 UNION
                 SELECT id, version, lease_owner FROM entities WHERE run_status <> 'active' AND lease_owner IS NOT NULL",
            )?
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
            .collect()
    }
}

/// The rows of the entities related to one (`?1`) by an edge: `end` is the column of the
/// edge that names it, `other` the one naming them. A join from the edges' index to each
/// row by id: `WHERE id IN (SELECT ...)` had SQLite build and sort a list of the ids on
/// every run (about 27,000 instructions a row in `bench fanout`, where each child's
/// completion reads its parent).
fn related_sql(other: &str, end: &str) -> String {
    format!(
        "SELECT {CURRENT_COLS} FROM (SELECT {other} AS related FROM successors WHERE {end} = ?1) JOIN entities ON id = related"
    )
}

impl Dialect for Tx<'_> {
    type Error = rusqlite::Error;

    fn read(&mut self, r: &Reads) -> rusqlite::Result<ReadSet> {
        let (rows, notify) = self.lock(r)?;
        let mut out = ReadSet { rows, ..ReadSet::default() };
        if !notify.is_empty() {
            out.edges = self.edges("successor_id", &notify)?;
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
        if !r.commanded.is_empty() {
            out.commanded = self.commanded(&r.commanded)?;
        }
        if !r.tasks.is_empty() {
            out.tasks = self.tasks(&r.tasks)?;
        }
        if let Some((queue, limit, now)) = &r.leasable {
            out.leasable = self.leasable(queue, *limit, *now)?;
        }
        if let Some((ids, _)) = &r.renew {
            out.renewable = self.renewable(ids)?;
        }
        if let Some(before) = r.open_before {
            out.open_operations = self.open_operations_before(before)?;
        }
        if r.leased {
            out.leased = self.leased()?;
        }
        Ok(out)
    }

    fn write(&mut self, w: &Writes) -> rusqlite::Result<Vec<i64>> {
        self.write_sets(w)
    }

    const LOCK: &'static str = "";

    fn rows(&mut self, sql: &str, params: &[Val]) -> rusqlite::Result<Vec<Vec<Val>>> {
        let bind: Vec<SqlValue> = params
            .iter()
            .map(|v| match v {
                Val::Int(n) => SqlValue::Integer(*n),
                Val::Text(s) => SqlValue::Text(s.clone()),
                Val::Null => SqlValue::Null,
            })
            .collect();
        // `$N` is a name to SQLite (numbered by first appearance); `?N` is the number.
        let mut stmt = self.0.prepare_cached(&crate::bulk::sqlite(sql))?;
        let width = stmt.column_count();
        let rows = stmt.query_map(rusqlite::params_from_iter(bind), |r| {
            (0..width)
                .map(|i| {
                    Ok(match r.get::<_, SqlValue>(i)? {
                        SqlValue::Integer(n) => Val::Int(n),
                        SqlValue::Text(s) => Val::Text(s),
                        _ => Val::Null,
                    })
                })
                .collect::<rusqlite::Result<Vec<Val>>>()
        })?;
        rows.collect()
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

    fn prune_read(&mut self, p: &crate::Prune, page: usize) -> rusqlite::Result<crate::plan::prune::PruneRead> {
        self.prune_candidates(p, page)
    }

    fn prune_write(
        &mut self,
        w: &crate::plan::prune::PruneWrite<'_>,
    ) -> rusqlite::Result<crate::plan::prune::PruneWritten> {
        self.prune_rows(w)
    }

    fn savepoint(&mut self) -> rusqlite::Result<()> {
        self.0.prepare_cached("SAVEPOINT op")?.execute([]).map(drop)
    }

    fn release_savepoint(&mut self) -> rusqlite::Result<()> {
        self.0.prepare_cached("RELEASE op")?.execute([]).map(drop)
    }

    fn rollback_savepoint(&mut self) -> rusqlite::Result<()> {
        self.0.execute_batch("ROLLBACK TO op; RELEASE op")?;
        // The feed's number, if taken after the savepoint, went back with it.
        if self.2 != 0 {
            let seq: i64 = self.0.prepare_cached("SELECT seq FROM feed_clock")?.query_row([], |r| r.get(0))?;
            if seq < self.2 {
                self.2 = 0;
            }
        }
        Ok(())
    }

    /// In process, a leased row is read back by its id for less than a claim costs.
    const TAKES_RAISED: bool = true;

    fn taken_rows(&mut self, ids: &[i64]) -> rusqlite::Result<Vec<(EntityRow, Option<Trigger>)>> {
        let mut stmt = self.0.prepare_cached(&format!("SELECT {ENTITY_COLS} FROM entities WHERE id = ?1"))?;
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            let entity = stmt.query_row([id], entity_from_row)?;
            let trigger = match entity.event_id {
                Some(event_id) => claim::trigger(self.0, event_id)?,
                None => None,
            };
            out.push((entity, trigger));
        }
        Ok(out)
    }

    fn finish(&mut self, f: &Finish<'_>) -> rusqlite::Result<(Vec<Claimed>, Option<Millis>)> {
        let mut claimed = Vec::new();
        let mut machines: &[String] = &[];
        if let Some(claim) = f.claim {
            claim::fire_timers(self.0, f.now, 1_000)?;
            claimed = claim::claim_due(self.0, f.now, claim)?;
            machines = &claim.machines;
        }
        let next_due = claim::next_due_of(self.0, machines)?;
        // Cached, as BEGIN is: not parsed and planned again every batch.
        self.0.prepare_cached("COMMIT")?.execute([])?;
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

#[cfg(test)]
mod tests {
    use rusqlite::StatementStatus;

    use super::*;

    /// A batch that raises on an entity at rest and may take it leases it as it writes the
    /// event: the claim's statements do not run for it, and it is answered with its row,
    /// the event at its inbox's head and the trigger of the workflow it is in (here one
    /// waiting mid-workflow, as a parent waits for its children), as the claim answers.
    #[test]
    fn an_entity_raised_on_is_leased_without_a_claim() {
        use crate::{Batch, Claim, Op, Push};
        let c = super::super::schema::migrated_in_memory();
        c.execute_batch(
            "INSERT INTO entities (id, machine, key, state, version, created_at, entered_at, has_predecessors, event_id)
             VALUES (1, 'm', 'a', 'waiting', 1, 0, 0, 0, 5);
             INSERT INTO events (id, seq, entity_id, machine, entity_key, event, kind, start_state, start_time, params)
             VALUES (5, 5, 1, 'm', 'a', 'start', 'raised', 'idle', 0, '{\"n\": 1}');",
        )
        .unwrap();
        let push = Op::Push(Push::raised("m", "a", "go", serde_json::json!({})));
        let runs = |c: &Connection| c.prepare_cached(claim::LEASE).unwrap().get_status(StatementStatus::Run);
        let open = AtomicBool::new(false);
        for (take_raised, claim_runs) in [(true, 0), (false, 1)] {
            c.execute_batch("BEGIN").unwrap();
            let before = runs(&c);
            let mut tx = Tx(&c, &open, 0);
            let batch = Batch {
                now: 10,
                ops: vec![push.clone()],
                claim: Some(Claim { take_raised, ..Claim::new("me", 1_000, 10) }),
            };
            let r = crate::plan::apply_batch(&mut tx, &batch).unwrap();
            let [taken] = r.claimed.as_slice() else { panic!("one claimed: {:?}", r.claimed) };
            assert_eq!((taken.entity.lease_owner.as_deref(), taken.entity.due_at), (Some("me"), Some(1_010)));
            assert_eq!(taken.inbox_head.as_ref().map(|h| h.event.as_str()), Some("go"));
            let trigger = taken.trigger.as_ref().map(|t| (t.event.as_str(), t.params.clone()));
            assert_eq!(trigger, Some(("start", serde_json::json!({"n": 1}))), "take_raised {take_raised}");
            assert_eq!(runs(&c) - before, claim_runs, "take_raised {take_raised}");
            // At rest again for the next round.
            c.execute_batch(
                "DELETE FROM inbox; UPDATE entities SET lease_owner = NULL, lease_until = NULL, due_at = NULL",
            )
            .unwrap();
        }
    }

    /// Predecessors are read only for the entities whose row says they have some: a
    /// workflow with no parent costs no edge or related-row query per transition.
    #[test]
    fn only_entities_with_predecessors_have_them_read() {
        let c = super::super::schema::migrated_in_memory();
        c.execute_batch(
            "INSERT INTO entities (id, machine, key, state, version, created_at, entered_at, has_predecessors)
             VALUES (1, 'm', 'parent', 'idle', 1, 0, 0, 0), (2, 'm', 'child', 'idle', 1, 0, 0, 1),
                    (3, 'm', 'alone', 'idle', 1, 0, 0, 0);
             INSERT INTO successors (predecessor_id, successor_id, created_at) VALUES (1, 2, 0);",
        )
        .unwrap();
        let open = AtomicBool::new(false);
        let mut tx = Tx(&c, &open, 0);
        let related = super::related_sql("predecessor_id", "successor_id");
        let runs = |c: &Connection| c.prepare_cached(&related).unwrap().get_status(StatementStatus::Run);
        let read = tx.read(&Reads { ids: vec![3], notify: vec![3], ..Reads::default() }).unwrap();
        assert!(read.edges.is_empty());
        assert_eq!(runs(&c), 0, "no predecessor query for an entity without predecessors");
        let read = tx.read(&Reads { ids: vec![2, 3], notify: vec![2, 3], ..Reads::default() }).unwrap();
        assert_eq!(read.edges, [(1, 2)]);
        assert_eq!(read.rows.iter().map(|r| r.id).collect::<Vec<_>>(), [2, 3, 1], "the parent is read and locked");
        assert_eq!(runs(&c), 1, "one query, for the child");
    }
}
