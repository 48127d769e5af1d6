//! The PostgreSQL [`Dialect`] of the batch plan: every set of rows is one statement over
//! arrays (`unnest`), and each phase — a segment's reads, its writes, the batch's finish —
//! is one pipeline: sent at once, waited for once. A batch costs the same few round trips
//! whatever its size.
//!
//! Concurrency: the read phase locks every entity row the segment writes `FOR NO KEY
//! UPDATE`, in id order, in one statement. Pushes and change notices of other instances
//! lock their target row the same way before inserting, so while a segment holds its rows
//! nobody can add to their inboxes; the inbox reads run as statements of their own after
//! the locks are granted, so they see every item committed before. Claims and timer firing
//! skip locked rows.

use postgres::Row;

use super::conn::{Failure, Recovery, pg_message, recovery};
use super::read::{entity_from_row_at, inbox_from_row, task_from_row, timer_from_row};
use super::stmt::{Slots, Stmt, col, ints, one, opt_ints, strings};
use super::writer::WriterConn;
use crate::plan::limits::Val;
use crate::plan::rows::*;
use crate::plan::{Dialect, Finish, ReadSet, Reads, Writes};
use crate::sql::{ENTITY_COLS, TASK_COLS};
use crate::{Claimed, EntityRow, Millis, OpError, SqlStatement, Trigger};

type R<T> = std::result::Result<T, Failure>;

/// A batch's transaction on the writer's connection, as the plan's [`Dialect`]; the
/// channels and `me` name its notifications.
pub(crate) struct Tx<'a> {
    pub(crate) c: &'a mut WriterConn,
    /// The wake-up channel.
    pub(crate) channel: &'a str,
    /// The channel of entity changes.
    pub(crate) changes_channel: &'a str,
    pub(crate) me: &'a str,
    /// When the earliest timer is due, as the previous batch read it (`i64::MIN`: not
    /// known): timers are fired only from then on.
    pub(crate) next_timer: &'a std::sync::atomic::AtomicI64,
}

pub(super) const INBOX_COLS: &str = "i.id, i.entity_id, i.event, i.params, i.request_id, i.created_at, i.kind, i.reply";

impl Columns for Row {
    type Error = Failure;
    fn int(&self, col: usize) -> R<i64> {
        Ok(self.try_get(col)?)
    }
    fn opt_int(&self, col: usize) -> R<Option<i64>> {
        Ok(self.try_get(col)?)
    }
    fn text(&self, col: usize) -> R<String> {
        Ok(self.try_get(col)?)
    }
    fn opt_text(&self, col: usize) -> R<Option<String>> {
        Ok(self.try_get(col)?)
    }
    fn with_opt_text<T>(&self, col: usize, f: impl FnOnce(&str) -> T) -> R<Option<T>> {
        Ok(self.try_get::<_, Option<&str>>(col)?.map(f))
    }
    fn flag(&self, col: usize) -> R<bool> {
        Ok(self.try_get(col)?)
    }
    fn with_text<T>(&self, col: usize, f: impl FnOnce(&str) -> T) -> R<T> {
        Ok(f(self.try_get(col)?))
    }
    fn corrupt(_col: usize, message: String) -> Failure {
        Failure::Corrupt(message)
    }
}

impl Dialect for Tx<'_> {
    type Error = Failure;

    fn read(&mut self, r: &Reads) -> R<ReadSet> {
        let mut p = Slots::default();
        let lock = p.add(Stmt::new(
            format!(
                "SELECT {CURRENT_COLS} FROM entities WHERE id IN (
                    SELECT unnest($1::bigint[])
                    UNION SELECT e.id FROM entities e
                        JOIN unnest($2::text[], $3::text[]) AS k(machine, key) ON e.machine = k.machine AND e.key = k.key
                    UNION SELECT s.predecessor_id FROM successors s WHERE s.successor_id = ANY($4::bigint[])
                    UNION SELECT s.successor_id FROM successors s WHERE s.predecessor_id = ANY($5::bigint[])
                    UNION SELECT t.entity_id FROM agent_tasks t WHERE t.id = ANY($6::bigint[]))
                 ORDER BY id FOR NO KEY UPDATE"
            ),
            vec![
                col(r.ids.clone()),
                strings(&r.keys, |k| &k.0),
                strings(&r.keys, |k| &k.1),
                col(r.notify.clone()),
                col(r.successors.clone()),
                col(r.reported.clone()),
            ],
        ));
        // Read after the locks are granted (statements of their own): what the locked rows
        // hold as of then.
        let commanded = (!r.commanded.is_empty()).then(|| {
            p.add(Stmt::new(
                format!(
                    "SELECT {}, EXISTS (SELECT 1 FROM inbox i WHERE i.entity_id = e.id),
                        ARRAY(SELECT DISTINCT i.request_id FROM inbox i
                              WHERE i.entity_id = e.id AND i.request_id IS NOT NULL ORDER BY 1),
                        EXISTS (SELECT 1 FROM agent_tasks t WHERE t.entity_id = e.id AND t.status IN ('ready', 'leased'))
                     FROM entities e
                     JOIN unnest($1::text[], $2::text[]) AS k(machine, key) ON e.machine = k.machine AND e.key = k.key",
                    ENTITY_COLS.split(", ").map(|c| format!("e.{c}")).collect::<Vec<_>>().join(", ")
                ),
                vec![strings(&r.commanded, |k| &k.0), strings(&r.commanded, |k| &k.1)],
            ))
        });
        let tasks = (!r.tasks.is_empty()).then(|| {
            p.add(Stmt::new(
                format!("SELECT {TASK_ROW_COLS} FROM agent_tasks WHERE id = ANY($1::bigint[]) ORDER BY id FOR UPDATE"),
                vec![col(r.tasks.clone())],
            ))
        });
        let leasable = r.leasable.as_ref().map(|(queue, limit, now)| {
            // Tasks another instance is leasing this moment are skipped, not waited for.
            p.add(Stmt::new(
                format!(
                    "SELECT {TASK_COLS} FROM agent_tasks t JOIN entities e ON e.id = t.entity_id
                     WHERE t.queue = $1 AND t.status IN ('ready', 'leased') AND t.available_at <= $2
                       AND e.run_status = 'active'
                     ORDER BY t.available_at, t.id LIMIT $3 FOR UPDATE OF t SKIP LOCKED"
                ),
                vec![one(queue.clone()), one(*now), one(*limit as i64)],
            ))
        });
        let renewable = r.renew.as_ref().map(|(ids, owner)| {
            // Rows another instance has locked this moment (it is pushing an event to one)
            // are skipped: waiting for them while this batch holds other rows could close a
            // cycle of waits, and their leases have two thirds left; the next renewal takes
            // them.
            p.add(Stmt::new(
                "SELECT id, lease_owner FROM entities WHERE id = ANY($1::bigint[]) AND lease_owner = $2
                 FOR NO KEY UPDATE SKIP LOCKED",
                vec![col(ids.clone()), one(owner.clone())],
            ))
        });
        let open_operations = r.open_before.map(|before| {
            p.add(Stmt::new(
                "SELECT o.request_id, o.started_at,
                    (SELECT MAX(e.entered_at) FROM entities e WHERE e.request_id = o.request_id AND e.busy),
                    (SELECT MAX(i.created_at) FROM inbox i WHERE i.request_id = o.request_id)
                 FROM operations o WHERE o.ended_at IS NULL AND o.outcome IS NULL AND o.started_at < $1",
                vec![one(before)],
            ))
        });
        let leased = r.leased.then(|| {
            p.add(Stmt::new(
                "SELECT id, version, lease_owner FROM entities WHERE lease_owner IS NOT NULL ORDER BY id",
                vec![],
            ))
        });
        let edges = (!r.notify.is_empty()).then(|| {
            p.add(Stmt::new(
                "SELECT predecessor_id, successor_id FROM successors WHERE successor_id = ANY($1::bigint[])",
                vec![col(r.notify.clone())],
            ))
        });
        let successor_edges = (!r.successors.is_empty()).then(|| {
            p.add(Stmt::new(
                "SELECT predecessor_id, successor_id FROM successors WHERE predecessor_id = ANY($1::bigint[])",
                vec![col(r.successors.clone())],
            ))
        });
        let heads = (!r.heads.is_empty()).then(|| {
            p.add(Stmt::new(
                format!(
                    "SELECT {INBOX_COLS}
                     FROM unnest($1::bigint[], $2::bigint[], $3::bigint[], $4::boolean[]) AS c(entity_id, consume, upto, internal)
                     CROSS JOIN LATERAL ({}) i",
                    crate::sql::inbox_head(
                        "entity_id = c.entity_id AND id <> c.consume AND NOT (kind = 'notice' AND id <= c.upto)",
                        "c.internal"
                    )
                ),
                vec![
                    ints(&r.heads, |h| h.entity_id),
                    ints(&r.heads, |h| h.consume),
                    ints(&r.heads, |h| h.notices_upto),
                    col(r.heads.iter().map(|h| h.internal).collect::<Vec<bool>>()),
                ],
            ))
        });
        let consuming: Vec<&InboxDelete> = r.heads.iter().filter(|h| h.notices_upto >= 0).collect();
        let consumed = (!consuming.is_empty()).then(|| {
            p.add(Stmt::new(
                "SELECT DISTINCT i.request_id FROM unnest($1::bigint[], $2::bigint[]) AS c(entity_id, upto)
                 JOIN inbox i ON i.entity_id = c.entity_id AND i.kind = 'notice' AND i.id <= c.upto
                 WHERE i.request_id IS NOT NULL",
                vec![ints(&consuming, |h| h.entity_id), ints(&consuming, |h| h.notices_upto)],
            ))
        });
        let timers = (!r.timers.is_empty()).then(|| {
            p.add(Stmt::new(
                "SELECT entity_id, name, event, due_at, every_ms FROM timers WHERE entity_id = ANY($1::bigint[])",
                vec![col(r.timers.clone())],
            ))
        });
        let ops = &r.operations;
        let operations = (!ops.is_empty()).then(|| {
            // Opened now (`false`), or seen before (`true`).
            p.add(Stmt::new(
                "WITH opened AS (
                    INSERT INTO operations (request_id, name, machine, entity_key, started_at, dimensions,
                        first_response_at, priority)
                    SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::text[],
                        $7::bigint[], $8::bigint[])
                    ON CONFLICT (request_id) DO NOTHING RETURNING request_id, id)
                 SELECT request_id, id, FALSE FROM opened
                 UNION ALL
                 SELECT o.request_id, o.id, TRUE FROM operations o WHERE o.request_id = ANY($1::text[])",
                vec![
                    strings(ops, |o| &o.request_id),
                    strings(ops, |o| &o.name),
                    strings(ops, |o| &o.machine),
                    strings(ops, |o| &o.entity_key),
                    ints(ops, |o| o.started_at),
                    strings(ops, |o| &o.dimensions),
                    opt_ints(ops, |o| o.first_response_at),
                    ints(ops, |o| o.priority),
                ],
            ))
        });
        let reserve = (r.new_entities > 0 || r.new_errors > 0).then(|| {
            p.add(Stmt::new(
                "SELECT ARRAY(SELECT nextval('entities_id_seq') FROM generate_series(1, $1::bigint)),
                        ARRAY(SELECT nextval('errors_id_seq') FROM generate_series(1, $2::bigint))",
                vec![one(r.new_entities as i64), one(r.new_errors as i64)],
            ))
        });
        let rows = self.c.send(&p.0)?;
        let mut out =
            ReadSet { rows: rows[lock].iter().map(Current::from_columns).collect::<R<_>>()?, ..ReadSet::default() };
        if let Some(i) = edges {
            out.edges = rows[i].iter().map(|r| Ok((r.try_get(0)?, r.try_get(1)?))).collect::<R<_>>()?;
        }
        if let Some(i) = successor_edges {
            out.successor_edges = rows[i].iter().map(|r| Ok((r.try_get(0)?, r.try_get(1)?))).collect::<R<_>>()?;
        }
        if let Some(i) = heads {
            out.heads = rows[i].iter().map(inbox_from_row).collect::<R<_>>()?;
        }
        if let Some(i) = consumed {
            out.consumed = rows[i].iter().map(|r| r.try_get(0)).collect::<Result<_, _>>()?;
        }
        if let Some(i) = timers {
            out.timers = rows[i].iter().map(timer_from_row).collect::<R<_>>()?;
        }
        if let Some(i) = operations {
            let mut found = std::collections::HashMap::with_capacity(ops.len());
            for row in &rows[i] {
                let (request_id, id, existed): (String, i64, bool) =
                    (row.try_get(0)?, row.try_get(1)?, row.try_get(2)?);
                // Opened now wins over the same row seen (it is not: one snapshot).
                found.entry(request_id).and_modify(|e: &mut (i64, bool)| e.1 &= existed).or_insert((id, existed));
            }
            let missing: Vec<String> =
                ops.iter().filter(|o| !found.contains_key(&o.request_id)).map(|o| o.request_id.clone()).collect();
            if !missing.is_empty() {
                // Opened by another instance whose transaction committed while this
                // statement waited for it: a replay, read now.
                let stmt = Stmt::new(
                    "SELECT request_id, id FROM operations WHERE request_id = ANY($1::text[])",
                    vec![col(missing)],
                );
                for row in &self.c.send(std::slice::from_ref(&stmt))?[0] {
                    found.insert(row.try_get(0)?, (row.try_get(1)?, true));
                }
            }
            out.operations = ops
                .iter()
                .map(|o| {
                    found.get(&o.request_id).copied().ok_or_else(|| {
                        Failure::Corrupt(format!("operation `{}` neither opened nor found", o.request_id))
                    })
                })
                .collect::<R<_>>()?;
        }
        if let Some(i) = commanded {
            let width = ENTITY_COLS.split(", ").count();
            for row in &rows[i] {
                let facts = Facts {
                    inbox: row.try_get(width)?,
                    inbox_requests: row.try_get(width + 1)?,
                    open_task: row.try_get(width + 2)?,
                };
                out.commanded.push((entity_from_row_at(row, 0)?, facts));
            }
        }
        if let Some(i) = tasks {
            out.tasks = rows[i].iter().map(TaskRow::from_columns).collect::<R<_>>()?;
        }
        if let Some(i) = leasable {
            out.leasable = rows[i].iter().map(task_from_row).collect::<R<_>>()?;
        }
        if let Some(i) = renewable {
            out.renewable = rows[i].iter().map(|r| Ok((r.try_get(0)?, r.try_get(1)?))).collect::<R<_>>()?;
        }
        if let Some(i) = open_operations {
            out.open_operations = rows[i]
                .iter()
                .map(|r| {
                    Ok(OpenOperation {
                        request_id: r.try_get(0)?,
                        started_at: r.try_get(1)?,
                        last_entered: r.try_get(2)?,
                        last_queued: r.try_get(3)?,
                    })
                })
                .collect::<R<_>>()?;
        }
        if let Some(i) = leased {
            out.leased = rows[i].iter().map(|r| Ok((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?))).collect::<R<_>>()?;
        }
        if let Some(i) = reserve {
            let row = &rows[i][0];
            out.entity_ids = row.try_get(0)?;
            out.error_ids = row.try_get(1)?;
        }
        Ok(out)
    }

    const LOCK: &'static str = " FOR NO KEY UPDATE";

    fn rows(&mut self, sql: &str, params: &[Val]) -> R<Vec<Vec<Val>>> {
        let bind: Vec<Box<dyn postgres::types::ToSql + Sync>> = params
            .iter()
            .map(|v| -> Box<dyn postgres::types::ToSql + Sync> {
                match v {
                    Val::Int(n) => Box::new(*n),
                    Val::Text(s) => Box::new(s.clone()),
                    Val::Null => Box::new(None::<i64>),
                }
            })
            .collect();
        let refs: Vec<&(dyn postgres::types::ToSql + Sync)> = bind.iter().map(|b| b.as_ref()).collect();
        let rows = self.c.query(sql, &refs)?;
        rows.iter()
            .map(|r| {
                (0..r.len())
                    .map(|i| {
                        use postgres::types::Type;
                        Ok(match *r.columns()[i].type_() {
                            Type::INT8 => r.try_get::<_, Option<i64>>(i)?.map_or(Val::Null, Val::Int),
                            Type::INT4 => r.try_get::<_, Option<i32>>(i)?.map_or(Val::Null, |n| Val::Int(n.into())),
                            _ => r.try_get::<_, Option<String>>(i)?.map_or(Val::Null, Val::Text),
                        })
                    })
                    .collect()
            })
            .collect()
    }

    fn user_sql(&mut self, statements: &[SqlStatement]) -> R<Result<(), OpError>> {
        for (index, stmt) in statements.iter().enumerate() {
            if let Err(e) = self.c.exec_dynamic(&stmt.sql, &stmt.params) {
                // A lost connection or race is the batch's to retry; anything else is this
                // statement's fault.
                if recovery(&e) != Recovery::Fail {
                    return Err(Failure::Pg(e));
                }
                return Ok(Err(OpError::Sql { index, message: pg_message(&e) }));
            }
        }
        Ok(Ok(()))
    }

    fn prune_read(&mut self, p: &crate::Prune, page: usize) -> R<crate::plan::prune::PruneRead> {
        self.prune_candidates(p, page)
    }

    fn prune_write(&mut self, w: &crate::plan::prune::PruneWrite<'_>) -> R<crate::plan::prune::PruneWritten> {
        self.prune_rows(w)
    }

    fn savepoint(&mut self) -> R<()> {
        Ok(self.c.batch("SAVEPOINT op")?)
    }

    fn release_savepoint(&mut self) -> R<()> {
        Ok(self.c.batch("RELEASE SAVEPOINT op")?)
    }

    fn rollback_savepoint(&mut self) -> R<()> {
        Ok(self.c.batch("ROLLBACK TO SAVEPOINT op; RELEASE SAVEPOINT op")?)
    }

    fn write(&mut self, w: &Writes) -> R<Vec<i64>> {
        super::sets::write_sets(self.c, w)
    }

    fn finish(&mut self, f: &Finish<'_>) -> R<(Vec<Claimed>, Option<Millis>)> {
        self.finish_batch(f)
    }

    /// The claim statement of `finish` takes raised entities in the batch's last round
    /// trip: reading their rows back would be one more.
    const TAKES_RAISED: bool = false;

    fn taken_rows(&mut self, ids: &[i64]) -> R<Vec<(EntityRow, Option<Trigger>)>> {
        let cols = ENTITY_COLS.split(", ").map(|c| format!("e.{c}")).collect::<Vec<_>>().join(", ");
        let width = ENTITY_COLS.split(", ").count();
        let stmt = Stmt::new(
            format!(
                "SELECT {cols}, v.event, v.params, v.reply FROM entities e LEFT JOIN events v ON v.id = e.event_id
                 WHERE e.id = ANY($1::bigint[]) ORDER BY e.id"
            ),
            vec![col(ids.to_vec())],
        );
        self.c.send(std::slice::from_ref(&stmt))?[0]
            .iter()
            .map(|r| Ok((entity_from_row_at(r, 0)?, crate::decode::trigger(&crate::decode::At(r, width))?)))
            .collect()
    }
}
