//! The SQLite dialect's round of pruning: candidates read per end state through the partial
//! index `entities_ended`, then each chosen entity's rows deleted table by table with
//! cached statements, and the other kinds' rows past their time (see `plan/prune.rs`). The
//! newest row of a table stays (see `plan/ops/prune.rs`): SQLite hands a new row the
//! largest id plus one, so removing it would give its id to the next.

use rusqlite::{OptionalExtension, params};

use super::dialect::Tx;
use crate::Prune;
use crate::plan::ops::prune::Candidate;
use crate::plan::prune::{Counter, PruneRead, PruneWrite, PruneWritten};

/// An entity's rows in each table it touches, deleted in an order the foreign keys allow
/// (each statement takes the entity's id); the counters they add to.
const ENTITY_DELETES: &[(&str, Counter)] = &[
    ("DELETE FROM exceptions WHERE error_id IN (SELECT id FROM errors WHERE entity_id = ?1)", |r| &mut r.exceptions),
    ("DELETE FROM errors WHERE entity_id = ?1", |r| &mut r.errors),
    ("DELETE FROM events WHERE entity_id = ?1", |r| &mut r.events),
    ("DELETE FROM history WHERE entity_id = ?1", |r| &mut r.history),
    ("DELETE FROM inbox WHERE entity_id = ?1", |r| &mut r.inbox),
    ("DELETE FROM timers WHERE entity_id = ?1", |r| &mut r.timers),
    ("DELETE FROM agent_tasks WHERE entity_id = ?1", |r| &mut r.agent_tasks),
    ("DELETE FROM successors WHERE predecessor_id = ?1 OR successor_id = ?1", |r| &mut r.successors),
    ("DELETE FROM entities WHERE id = ?1", |r| &mut r.entities),
];

impl Tx<'_> {
    pub(super) fn prune_candidates(&mut self, p: &Prune, page: usize) -> rusqlite::Result<PruneRead> {
        let mut stmt = self.0.prepare_cached(
            "SELECT e.id, e.key, e.ended_at, e.lease_owner IS NOT NULL, e.busy,
                    EXISTS (SELECT 1 FROM inbox i WHERE i.entity_id = e.id),
                    EXISTS (SELECT 1 FROM successors s JOIN entities o ON o.id = s.successor_id
                             WHERE s.predecessor_id = e.id AND o.ended_at IS NULL)
                    OR EXISTS (SELECT 1 FROM successors s JOIN entities o ON o.id = s.predecessor_id
                             WHERE s.successor_id = e.id AND o.ended_at IS NULL),
                    e.id IN (SELECT max(id) FROM entities
                             UNION ALL SELECT entity_id FROM history WHERE id = (SELECT max(id) FROM history)
                             UNION ALL SELECT entity_id FROM errors WHERE id = (SELECT max(id) FROM errors)
                             UNION ALL SELECT r.entity_id FROM exceptions x JOIN errors r ON r.id = x.error_id
                                        WHERE x.id = (SELECT max(id) FROM exceptions)
                             UNION ALL SELECT entity_id FROM agent_tasks WHERE id = (SELECT max(id) FROM agent_tasks))
             FROM entities e
             WHERE e.machine = ?1 AND e.state = ?2 AND e.ended_at IS NOT NULL AND e.ended_at < ?3
               AND (e.ended_at, e.id) > (?4, ?5)
             ORDER BY e.ended_at, e.id LIMIT CAST(?6 AS INTEGER)",
        )?;
        let mut pages = Vec::with_capacity(p.ended.len());
        for rule in &p.ended {
            let (after_at, after_id) = rule.after.unwrap_or((i64::MIN, i64::MIN));
            let rows = stmt
                .query_map(params![rule.machine, rule.state, rule.before, after_at, after_id, page as i64], |r| {
                    Candidate::from_columns(r, rule)
                })?;
            pages.push(rows.collect::<rusqlite::Result<Vec<_>>>()?);
        }
        Ok(PruneRead { busy: false, pages })
    }

    pub(super) fn prune_rows(&mut self, w: &PruneWrite<'_>) -> rusqlite::Result<PruneWritten> {
        let mut out = PruneWritten::default();
        // What the entities were, for their counts.
        let mut gone: Vec<(String, String, String)> = Vec::with_capacity(w.entities.len());
        {
            let mut stmt = self.0.prepare_cached("SELECT machine, state, run_status FROM entities WHERE id = ?1")?;
            for id in w.entities {
                if let Some(row) = stmt.query_row([id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?))).optional()? {
                    gone.push(row);
                }
            }
        }
        for (sql, counter) in ENTITY_DELETES {
            let mut stmt = self.0.prepare_cached(sql)?;
            for id in w.entities {
                *counter(&mut out.rows) += stmt.execute(params![id])? as u64;
            }
        }
        let changes = gone.iter().filter_map(|(machine, state, status)| {
            let status = crate::RunStatus::parse(status)?.as_str();
            Some((machine.as_str(), state.as_str(), status, -1))
        });
        super::counts::add(self.0, &crate::plan::rows::count_deltas(changes))?;
        let limit = w.rows as i64;
        let p = w.prune;
        if let Some(before) = p.operations_before {
            let ids: Vec<i64> = self
                .0
                .prepare_cached(
                    "SELECT id FROM operations WHERE ended_at IS NOT NULL AND ended_at < ?1
                       AND id < (SELECT max(id) FROM operations)
                     ORDER BY ended_at, id LIMIT CAST(?2 AS INTEGER)",
                )?
                .query_map(params![before, limit], |r| r.get(0))?
                .collect::<rusqlite::Result<_>>()?;
            // Events of live entities keep their rows; the operation they were part of goes.
            let mut unlink = self.0.prepare_cached("UPDATE events SET operation_id = NULL WHERE operation_id = ?1")?;
            let mut delete = self.0.prepare_cached("DELETE FROM operations WHERE id = ?1 RETURNING outcome")?;
            let mut tally = super::counts::Tally::default();
            for id in &ids {
                unlink.execute(params![id])?;
                for outcome in delete.query_map(params![id], |r| r.get::<_, Option<String>>(0))? {
                    tally.outcome(outcome?.as_deref(), -1);
                    out.rows.operations += 1;
                }
            }
            tally.flush(self.0)?;
            out.full |= ids.len() >= w.rows;
        }
        if let Some(before) = p.tasks_before {
            let n = self
                .0
                .prepare_cached(
                    "DELETE FROM agent_tasks WHERE id IN (SELECT id FROM agent_tasks
                  WHERE finished_at IS NOT NULL AND finished_at < ?1 AND id < (SELECT max(id) FROM agent_tasks)
                  ORDER BY finished_at, id LIMIT CAST(?2 AS INTEGER))",
                )?
                .execute(params![before, limit])?;
            out.rows.agent_tasks += n as u64;
            out.full |= n >= w.rows;
        }
        if let Some(before) = p.minutes_before {
            let n = self
                .0
                .prepare_cached(
                    "DELETE FROM minute_counts WHERE minute IN (SELECT minute FROM minute_counts
                  WHERE minute < ?1 ORDER BY minute LIMIT CAST(?2 AS INTEGER))",
                )?
                .execute(params![before.div_euclid(60_000), limit])?;
            out.rows.minute_counts += n as u64;
            out.full |= n >= w.rows;
        }
        Ok(out)
    }
}
