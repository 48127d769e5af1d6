//! The PostgreSQL dialect's round of pruning. One instance prunes at a time: a round first
//! takes the schema's pruning lock for its transaction (`pg_try_advisory_xact_lock`) and,
//! if another instance holds it, does nothing. Candidates are read per end state through
//! the partial index `entities_ended` and locked (`SKIP LOCKED`: an entity another
//! transaction holds waits for the next round); every table's deletes then go in one
//! pipeline, each statement over the array of chosen ids (see `plan/prune.rs`).

use super::conn::Failure;
use super::counts::add_counts;
use super::dialect::Tx;
use super::stmt::{Stmt, one};
use crate::Prune;
use crate::plan::ops::prune::Candidate;
use crate::plan::prune::{Counter, PruneRead, PruneWrite, PruneWritten};

type R<T> = std::result::Result<T, Failure>;

/// An entity's rows in each table it touches, in an order the foreign keys allow (each
/// statement takes the array of chosen ids); the counters they add to.
const ENTITY_DELETES: &[(&str, Counter)] = &[
    (
        "WITH d AS (DELETE FROM exceptions WHERE error_id IN (SELECT id FROM errors WHERE entity_id = ANY($1::bigint[]))
         RETURNING 1) SELECT count(*) FROM d",
        |r| &mut r.exceptions,
    ),
    (
        "WITH d AS (DELETE FROM errors WHERE entity_id = ANY($1::bigint[]) RETURNING 1) SELECT count(*) FROM d",
        |r| &mut r.errors,
    ),
    (
        "WITH d AS (DELETE FROM events WHERE entity_id = ANY($1::bigint[]) RETURNING 1) SELECT count(*) FROM d",
        |r| &mut r.events,
    ),
    (
        "WITH d AS (DELETE FROM history WHERE entity_id = ANY($1::bigint[]) RETURNING 1) SELECT count(*) FROM d",
        |r| &mut r.history,
    ),
    (
        "WITH d AS (DELETE FROM inbox WHERE entity_id = ANY($1::bigint[]) RETURNING 1) SELECT count(*) FROM d",
        |r| &mut r.inbox,
    ),
    (
        "WITH d AS (DELETE FROM timers WHERE entity_id = ANY($1::bigint[]) RETURNING 1) SELECT count(*) FROM d",
        |r| &mut r.timers,
    ),
    (
        "WITH d AS (DELETE FROM agent_tasks WHERE entity_id = ANY($1::bigint[]) RETURNING 1) SELECT count(*) FROM d",
        |r| &mut r.agent_tasks,
    ),
    (
        "WITH d AS (DELETE FROM successors WHERE predecessor_id = ANY($1::bigint[])
                     OR successor_id = ANY($1::bigint[]) RETURNING 1) SELECT count(*) FROM d",
        |r| &mut r.successors,
    ),
    (
        concat!(
            "WITH d AS (DELETE FROM entities WHERE id = ANY($1::bigint[]) RETURNING machine, state, run_status),
             counted AS (",
            add_counts!("SELECT machine, state, run_status, -1 FROM d"),
            ") SELECT count(*) FROM d"
        ),
        |r| &mut r.entities,
    ),
];

const CANDIDATES: &str = "SELECT e.id, e.key, e.ended_at, e.lease_owner IS NOT NULL, e.busy,
        EXISTS (SELECT 1 FROM inbox i WHERE i.entity_id = e.id),
        EXISTS (SELECT 1 FROM successors s JOIN entities o ON o.id = s.successor_id
                 WHERE s.predecessor_id = e.id AND o.ended_at IS NULL)
        OR EXISTS (SELECT 1 FROM successors s JOIN entities o ON o.id = s.predecessor_id
                 WHERE s.successor_id = e.id AND o.ended_at IS NULL),
        false -- ids come from sequences: never handed out again
     FROM entities e
     WHERE e.machine = $1 AND e.state = $2 AND e.ended_at IS NOT NULL AND e.ended_at < $3
       AND (e.ended_at, e.id) > ($4, $5)
     ORDER BY e.ended_at, e.id LIMIT $6
     FOR UPDATE OF e SKIP LOCKED";

fn count(rows: &[postgres::Row]) -> R<u64> {
    Ok(rows.first().map(|r| r.try_get::<_, i64>(0)).transpose()?.unwrap_or(0) as u64)
}

impl Tx<'_> {
    pub(super) fn prune_candidates(&mut self, p: &Prune, page: usize) -> R<PruneRead> {
        let lock = self.c.send(&[Stmt::new(
            "SELECT pg_try_advisory_xact_lock(hashtext(current_schema() || '.settle.prune'))",
            vec![],
        )])?;
        let held: bool = lock[0][0].try_get(0)?;
        if !held {
            return Ok(PruneRead { busy: true, pages: Vec::new() });
        }
        let stmts: Vec<Stmt> = p
            .ended
            .iter()
            .map(|rule| {
                let (after_at, after_id) = rule.after.unwrap_or((i64::MIN, i64::MIN));
                Stmt::new(
                    CANDIDATES,
                    vec![
                        one(rule.machine.clone()),
                        one(rule.state.clone()),
                        one(rule.before),
                        one(after_at),
                        one(after_id),
                        one(page as i64),
                    ],
                )
            })
            .collect();
        let results = if stmts.is_empty() { Vec::new() } else { self.c.send(&stmts)? };
        let mut pages = Vec::with_capacity(results.len());
        for (rule, rows) in p.ended.iter().zip(results) {
            let page = rows.iter().map(|r| Candidate::from_columns(r, rule)).collect::<R<Vec<_>>>()?;
            pages.push(page);
        }
        Ok(PruneRead { busy: false, pages })
    }

    pub(super) fn prune_rows(&mut self, w: &PruneWrite<'_>) -> R<PruneWritten> {
        let mut stmts = Vec::new();
        let mut counters: Vec<Option<Counter>> = Vec::new();
        if !w.entities.is_empty() {
            for (sql, counter) in ENTITY_DELETES {
                stmts.push(Stmt::new(*sql, vec![one(w.entities.to_vec())]));
                counters.push(Some(*counter));
            }
        }
        let limit = w.rows as i64;
        let p = w.prune;
        let mut aged = Vec::new();
        if let Some(before) = p.operations_before {
            // Events of live entities keep their rows; the operation they were part of goes.
            let chosen = "SELECT id FROM operations WHERE ended_at IS NOT NULL AND ended_at < $1
                          ORDER BY ended_at, id LIMIT $2";
            stmts.push(Stmt::new(
                format!(
                    "WITH u AS (UPDATE events SET operation_id = NULL WHERE operation_id IN ({chosen}) RETURNING 1)
                         SELECT count(*) FROM u"
                ),
                vec![one(before), one(limit)],
            ));
            counters.push(None);
            stmts.push(Stmt::new(
                format!("WITH d AS (DELETE FROM operations WHERE id IN ({chosen}) RETURNING 1) SELECT count(*) FROM d"),
                vec![one(before), one(limit)],
            ));
            counters.push(Some(|r| &mut r.operations));
            aged.push(stmts.len() - 1);
        }
        if let Some(before) = p.tasks_before {
            stmts.push(Stmt::new(
                "WITH d AS (DELETE FROM agent_tasks WHERE id IN (SELECT id FROM agent_tasks
                   WHERE finished_at IS NOT NULL AND finished_at < $1 ORDER BY finished_at, id LIMIT $2)
                   RETURNING 1) SELECT count(*) FROM d",
                vec![one(before), one(limit)],
            ));
            counters.push(Some(|r| &mut r.agent_tasks));
            aged.push(stmts.len() - 1);
        }
        if let Some(before) = p.minutes_before {
            stmts.push(Stmt::new(
                "WITH d AS (DELETE FROM minute_counts WHERE minute IN (SELECT minute FROM minute_counts
                   WHERE minute < $1 ORDER BY minute LIMIT $2) RETURNING 1) SELECT count(*) FROM d",
                vec![one(before.div_euclid(60_000)), one(limit)],
            ));
            counters.push(Some(|r| &mut r.minute_counts));
            aged.push(stmts.len() - 1);
        }
        let mut out = PruneWritten::default();
        if stmts.is_empty() {
            return Ok(out);
        }
        let results = self.c.send(&stmts)?;
        for (i, (rows, counter)) in results.iter().zip(counters).enumerate() {
            let n = count(rows)?;
            if let Some(counter) = counter {
                *counter(&mut out.rows) += n;
            }
            out.full |= aged.contains(&i) && n >= w.rows as u64;
        }
        Ok(out)
    }
}
