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
use postgres::error::SqlState;
use postgres::types::ToSql;

use super::conn::{Failure, Recovery, pg_message, recovery};
use super::read::{entity_from_row_at, inbox_from_row, timer_from_row};
use super::stmt::{Slots, Stmt, bools, col, ints, merge, one, opt_ints, opt_strings, strings};
use super::write::{Fail, apply_other};
use super::writer::{CommitError, WriterConn};
use crate::plan::rows::*;
use crate::plan::{Dialect, Finish, Other, ReadSet, Reads, Writes};
use crate::sql::ENTITY_COLS;
use crate::{Claimed, Millis, Op, OpError, SqlStatement};

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

const INBOX_COLS: &str = "i.id, i.entity_id, i.event, i.params, i.request_id, i.created_at, i.kind";

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

/// The ids an insert returned, in the order of its rows; each row's returned entity id
/// (column 1) must be the one it was given.
fn checked_ids(rows: &[Row], expected: impl ExactSizeIterator<Item = i64>, what: &str) -> R<Vec<i64>> {
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

/// A unique violation on `entities`: another instance created the key meanwhile.
fn entity_race(e: postgres::Error) -> Failure {
    match e.as_db_error() {
        Some(db) if *db.code() == SqlState::UNIQUE_VIOLATION && db.table() == Some("entities") => {
            Failure::Race(format!("an entity was created concurrently ({})", db.message()))
        }
        _ => Failure::Pg(e),
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
                    UNION SELECT s.successor_id FROM successors s WHERE s.predecessor_id = ANY($5::bigint[]))
                 ORDER BY id FOR NO KEY UPDATE"
            ),
            vec![
                col(r.ids.clone()),
                strings(&r.keys, |k| &k.0),
                strings(&r.keys, |k| &k.1),
                col(r.notify.clone()),
                col(r.successors.clone()),
            ],
        ));
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
                    "SELECT {INBOX_COLS} FROM unnest($1::bigint[], $2::bigint[], $3::bigint[]) AS c(entity_id, consume, upto)
                     CROSS JOIN LATERAL (SELECT * FROM inbox
                         WHERE entity_id = c.entity_id AND id <> c.consume AND NOT (kind = 'notice' AND id <= c.upto)
                         ORDER BY id LIMIT 1) i"
                ),
                vec![
                    ints(&r.heads, |h| h.entity_id),
                    ints(&r.heads, |h| h.consume),
                    ints(&r.heads, |h| h.notices_upto),
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
                        first_response_at)
                    SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::text[],
                        $7::bigint[])
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
        if let Some(i) = reserve {
            let row = &rows[i][0];
            out.entity_ids = row.try_get(0)?;
            out.error_ids = row.try_get(1)?;
        }
        Ok(out)
    }

    fn write(&mut self, w: &Writes) -> R<Vec<i64>> {
        // Sets no other set of the phase reads: one statement.
        let mut merged = Vec::new();
        // Sets that must see the rows written by the others.
        let mut p = Slots::default();
        if !w.entities.is_empty() {
            let e = &w.entities;
            merged.push(Stmt::new(
                "INSERT INTO entities (id, machine, key, state, properties, version, retry, created_at, entered_at,
                    auto_at, due_at, request_id, busy, machine_hash, timer_at, has_predecessors)
                 SELECT v.id, v.machine, v.key, v.state, v.properties, 1, 0, v.created_at, v.created_at, v.auto_at,
                    v.due_at, v.request_id, v.busy, v.machine_hash, v.timer_at, v.has_predecessors
                 FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::text[], $6::bigint[],
                    $7::bigint[], $8::bigint[], $9::text[], $10::boolean[], $11::text[], $12::bigint[], $13::boolean[])
                    AS v(id, machine, key, state, properties, created_at, auto_at, due_at, request_id, busy,
                         machine_hash, timer_at, has_predecessors)",
                vec![
                    ints(e, |e| e.id),
                    strings(e, |e| &e.machine),
                    strings(e, |e| &e.key),
                    strings(e, |e| &e.state),
                    strings(e, |e| &e.properties),
                    ints(e, |e| e.created_at),
                    opt_ints(e, |e| e.auto_at),
                    opt_ints(e, |e| e.due_at),
                    opt_strings(e, |e| e.request_id.as_deref()),
                    bools(e, |e| e.busy),
                    opt_strings(e, |e| e.machine_hash.as_deref()),
                    opt_ints(e, |e| e.timer_at),
                    bools(e, |e| e.has_predecessors),
                ],
            ));
        }
        if !w.updates.is_empty() {
            let u = &w.updates;
            merged.push(Stmt::new(
                "UPDATE entities e SET state = v.state, version = v.version, retry = v.retry,
                    entered_at = v.entered_at, auto_at = v.auto_at, due_at = v.due_at, lease_owner = v.lease_owner,
                    lease_until = v.lease_until, request_id = v.request_id, timer_at = v.timer_at,
                    run_status = v.run_status, sleep_until = v.sleep_until, busy = v.busy, event_id = v.event_id,
                    ordinal = v.ordinal, has_predecessors = v.has_predecessors, machine_hash = v.machine_hash,
                    properties = COALESCE(v.properties, e.properties), fired = COALESCE(v.fired, e.fired),
                    recent_errors = COALESCE(v.recent_errors, e.recent_errors)
                 FROM unnest($1::bigint[], $2::text[], $3::bigint[], $4::bigint[], $5::bigint[], $6::bigint[],
                    $7::bigint[], $8::text[], $9::bigint[], $10::text[], $11::bigint[], $12::text[], $13::bigint[],
                    $14::boolean[], $15::bigint[], $16::bigint[], $17::boolean[], $18::text[], $19::text[],
                    $20::text[], $21::text[])
                    AS v(id, state, version, retry, entered_at, auto_at, due_at, lease_owner, lease_until,
                         request_id, timer_at, run_status, sleep_until, busy, event_id, ordinal, has_predecessors,
                         machine_hash, properties, fired, recent_errors)
                 WHERE e.id = v.id",
                vec![
                    ints(u, |u| u.row.id),
                    strings(u, |u| &u.row.state),
                    ints(u, |u| u.row.version),
                    ints(u, |u| u.row.retry),
                    ints(u, |u| u.row.entered_at),
                    opt_ints(u, |u| u.row.auto_at),
                    opt_ints(u, |u| u.row.due_at),
                    opt_strings(u, |u| u.row.lease_owner.as_deref()),
                    opt_ints(u, |u| u.row.lease_until),
                    opt_strings(u, |u| u.row.request_id.as_deref()),
                    opt_ints(u, |u| u.row.timer_at),
                    strings(u, |u| u.row.run_status.as_str()),
                    opt_ints(u, |u| u.row.sleep_until),
                    bools(u, |u| u.row.busy),
                    opt_ints(u, |u| u.row.event_id),
                    ints(u, |u| u.row.ordinal),
                    bools(u, |u| u.row.has_predecessors),
                    opt_strings(u, |u| u.row.machine_hash.as_deref()),
                    opt_strings(u, |u| u.properties.as_deref()),
                    opt_strings(u, |u| u.fired.as_deref()),
                    opt_strings(u, |u| u.recent_errors.as_deref()),
                ],
            ));
        }
        if !w.deletes.is_empty() {
            let d = &w.deletes;
            merged.push(Stmt::new(
                "DELETE FROM inbox i USING unnest($1::bigint[], $2::bigint[], $3::bigint[]) AS c(entity_id, consume, upto)
                 WHERE i.entity_id = c.entity_id AND (i.id = c.consume OR (i.kind = 'notice' AND i.id <= c.upto))",
                vec![ints(d, |d| d.entity_id), ints(d, |d| d.consume), ints(d, |d| d.notices_upto)],
            ));
        }
        let inbox = (!w.inbox.is_empty()).then(|| {
            let i = &w.inbox;
            Stmt::new(
                "INSERT INTO inbox (entity_id, event, params, request_id, kind, created_at)
                 SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::text[], $6::bigint[])
                 RETURNING id, entity_id",
                vec![
                    ints(i, |i| i.entity_id),
                    strings(i, |i| &i.event),
                    strings(i, |i| &i.params),
                    opt_strings(i, |i| i.request_id.as_deref()),
                    strings(i, |i| i.kind),
                    ints(i, |i| i.created_at),
                ],
            )
        });
        if !w.history.is_empty() {
            let h = &w.history;
            merged.push(Stmt::new(
                "INSERT INTO history (entity_id, from_state, to_state, kind, action, event, retry, request_id, at,
                    detail, machine_hash, event_id, ordinal, transition_kind, start_health, end_health, entry_time,
                    start_time, action_start_time, outcome)
                 SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[],
                    $7::bigint[], $8::text[], $9::bigint[], $10::text[], $11::text[], $12::bigint[], $13::bigint[],
                    $14::text[], $15::text[], $16::text[], $17::bigint[], $18::bigint[], $19::bigint[], $20::text[])",
                vec![
                    ints(h, |h| h.entity_id),
                    opt_strings(h, |h| h.from_state.as_deref()),
                    opt_strings(h, |h| h.to_state.as_deref()),
                    strings(h, |h| h.kind),
                    opt_strings(h, |h| h.action.as_deref()),
                    opt_strings(h, |h| h.event.as_deref()),
                    ints(h, |h| h.retry),
                    opt_strings(h, |h| h.request_id.as_deref()),
                    ints(h, |h| h.at),
                    opt_strings(h, |h| h.detail.as_deref()),
                    opt_strings(h, |h| h.machine_hash.as_deref()),
                    opt_ints(h, |h| h.event_id),
                    opt_ints(h, |h| h.ordinal),
                    opt_strings(h, |h| h.transition_kind),
                    opt_strings(h, |h| h.start_health),
                    opt_strings(h, |h| h.end_health),
                    opt_ints(h, |h| h.entry_time),
                    opt_ints(h, |h| h.start_time),
                    opt_ints(h, |h| h.action_start_time),
                    opt_strings(h, |h| h.outcome),
                ],
            ));
        }
        if !w.successors.is_empty() {
            let s = &w.successors;
            merged.push(Stmt::new(
                "INSERT INTO successors (predecessor_id, successor_id, request_id, created_at)
                 SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::text[], $4::bigint[])
                 ON CONFLICT (predecessor_id, successor_id) DO NOTHING",
                vec![
                    ints(s, |s| s.predecessor_id),
                    ints(s, |s| s.successor_id),
                    opt_strings(s, |s| s.request_id.as_deref()),
                    ints(s, |s| s.created_at),
                ],
            ));
        }
        if !w.timer_entities.is_empty() {
            // The new timers, inserted by a later statement, see these deleted.
            merged.push(Stmt::new(
                "DELETE FROM timers WHERE entity_id = ANY($1::bigint[])",
                vec![col(w.timer_entities.clone())],
            ));
            if !w.timers.is_empty() {
                let t = &w.timers;
                p.add(Stmt::new(
                    "INSERT INTO timers (entity_id, name, event, due_at, every_ms)
                     SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[], $4::bigint[], $5::bigint[])",
                    vec![
                        ints(t, |t| t.entity_id),
                        strings(t, |t| &t.name),
                        strings(t, |t| t.event.as_str()),
                        ints(t, |t| t.due_at),
                        opt_ints(t, |t| t.every_ms),
                    ],
                ));
            }
        }
        if !w.cancel.is_empty() {
            // The offers, inserted by a later statement, see these canceled.
            merged.push(Stmt::new(
                "UPDATE agent_tasks SET status = 'canceled', outcome = 'canceled', finished_at = $2
                 WHERE entity_id = ANY($1::bigint[]) AND status IN ('ready', 'leased')",
                vec![col(w.cancel.clone()), one(w.now)],
            ));
        }
        if !w.offers.is_empty() {
            let t = &w.offers;
            // One open task per entity (the entity rows are locked): a repeated offer keeps it.
            p.add(Stmt::new(
                "INSERT INTO agent_tasks (entity_id, queue, action, state, entity_version, retry, lock_ms, request_id,
                    status, available_at, created_at)
                 SELECT v.entity_id, v.queue, v.action, v.state, v.entity_version, v.retry, v.lock_ms, v.request_id,
                    'ready', v.available_at, v.created_at
                 FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::bigint[],
                    $7::bigint[], $8::text[], $9::bigint[], $10::bigint[])
                    AS v(entity_id, queue, action, state, entity_version, retry, lock_ms, request_id, available_at,
                         created_at)
                 WHERE NOT EXISTS (SELECT 1 FROM agent_tasks t
                                   WHERE t.entity_id = v.entity_id AND t.status IN ('ready', 'leased'))",
                vec![
                    ints(t, |t| t.entity_id),
                    strings(t, |t| &t.queue),
                    strings(t, |t| &t.action),
                    strings(t, |t| &t.state),
                    ints(t, |t| t.entity_version),
                    ints(t, |t| t.retry),
                    ints(t, |t| t.lock_ms),
                    opt_strings(t, |t| t.request_id.as_deref()),
                    ints(t, |t| t.available_at),
                    ints(t, |t| t.created_at),
                ],
            ));
        }
        if !w.errors.is_empty() {
            let e = &w.errors;
            merged.push(Stmt::new(
                "INSERT INTO errors (id, entity_id, operation_id, request_id, at, kind, details)
                 SELECT v.id, v.entity_id, (SELECT o.id FROM operations o WHERE o.request_id = v.request_id),
                    v.request_id, v.at, v.kind, v.details
                 FROM unnest($1::bigint[], $2::bigint[], $3::text[], $4::bigint[], $5::text[], $6::text[])
                    AS v(id, entity_id, request_id, at, kind, details)",
                vec![
                    ints(e, |e| e.id),
                    ints(e, |e| e.entity_id),
                    opt_strings(e, |e| e.request_id.as_deref()),
                    ints(e, |e| e.at),
                    strings(e, |e| e.kind),
                    strings(e, |e| &e.details),
                ],
            ));
        }
        if !w.exceptions.is_empty() {
            let x = &w.exceptions;
            merged.push(Stmt::new(
                "INSERT INTO exceptions (error_id, at, details)
                 SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::text[])",
                vec![ints(x, |x| x.error_id), ints(x, |x| x.at), strings(x, |x| &x.details)],
            ));
        }
        if !w.events.is_empty() {
            let e = &w.events;
            merged.push(Stmt::new(
                "INSERT INTO events (id, operation_id, request_id, seq, entity_id, machine, entity_key, event, kind,
                    start_state, start_time, rejected, failed, error_id, exception, end_state, end_time, reason, entered)
                 SELECT v.id, (SELECT o.id FROM operations o WHERE o.request_id = v.request_id), v.request_id, v.id,
                    v.entity_id, v.machine, v.entity_key, v.event, v.kind, v.start_state, v.start_time, v.rejected,
                    v.failed, v.error_id, v.exception, v.end_state, v.end_time, v.reason, v.entered
                 FROM unnest($1::bigint[], $2::text[], $3::bigint[], $4::text[], $5::text[], $6::text[], $7::text[],
                    $8::text[], $9::bigint[], $10::boolean[], $11::boolean[], $12::bigint[], $13::text[], $14::text[],
                    $15::bigint[], $16::text[], $17::text[])
                    AS v(id, request_id, entity_id, machine, entity_key, event, kind, start_state, start_time,
                         rejected, failed, error_id, exception, end_state, end_time, reason, entered)",
                vec![
                    ints(e, |e| e.id),
                    opt_strings(e, |e| e.request_id.as_deref()),
                    ints(e, |e| e.entity_id),
                    strings(e, |e| &e.machine),
                    strings(e, |e| &e.entity_key),
                    strings(e, |e| &e.event),
                    strings(e, |e| e.kind),
                    strings(e, |e| &e.start_state),
                    ints(e, |e| e.start_time),
                    bools(e, |e| e.rejected),
                    bools(e, |e| e.failed),
                    opt_ints(e, |e| e.error_id),
                    opt_strings(e, |e| e.exception.as_deref()),
                    opt_strings(e, |e| e.end_state.as_deref()),
                    opt_ints(e, |e| e.end_time),
                    opt_strings(e, |e| e.reason.as_deref()),
                    opt_strings(e, |e| e.entered.as_deref()),
                ],
            ));
        }
        if !w.ends.is_empty() {
            let e = &w.ends;
            merged.push(Stmt::new(
                "UPDATE events e SET end_state = v.end_state, end_time = v.end_time
                 FROM unnest($1::bigint[], $2::text[], $3::bigint[]) AS v(id, end_state, end_time)
                 WHERE e.id = v.id AND e.end_time IS NULL",
                vec![ints(e, |e| e.id), strings(e, |e| &e.end_state), ints(e, |e| e.end_time)],
            ));
        }
        if !w.unopen.is_empty() {
            p.add(Stmt::new("DELETE FROM operations WHERE request_id = ANY($1::text[])", vec![col(w.unopen.clone())]));
        }
        if !w.op_updates.is_empty() {
            let u = &w.op_updates;
            merged.push(Stmt::new(
                "UPDATE operations o SET first_response_at = COALESCE(o.first_response_at, v.first_response_at),
                    error_seen = o.error_seen OR v.error_seen, error = COALESCE(o.error, v.error)
                 FROM unnest($1::text[], $2::bigint[], $3::boolean[], $4::text[])
                    AS v(request_id, first_response_at, error_seen, error)
                 WHERE o.request_id = v.request_id",
                vec![
                    strings(u, |u| &u.request_id),
                    opt_ints(u, |u| u.first_response_at),
                    bools(u, |u| u.error_seen),
                    opt_strings(u, |u| u.error.as_deref()),
                ],
            ));
        }
        if !w.complete.is_empty() {
            p.add(Stmt::new(
                "UPDATE operations SET ended_at = $2,
                    outcome = CASE WHEN canceled THEN 'canceled' WHEN error_seen THEN 'failed' ELSE 'success' END
                 WHERE request_id = ANY($1::text[]) AND ended_at IS NULL
                   AND NOT EXISTS (SELECT 1 FROM entities e WHERE e.request_id = operations.request_id AND e.busy)
                   AND NOT EXISTS (SELECT 1 FROM inbox i WHERE i.request_id = operations.request_id)",
                vec![col(w.complete.clone()), one(w.now)],
            ));
        }
        let has_inbox = inbox.is_some();
        let mut stmts = Vec::with_capacity(1 + p.0.len());
        stmts.extend(merge(merged, inbox));
        stmts.extend(p.0);
        if stmts.is_empty() {
            return Ok(Vec::new());
        }
        let rows = self.c.send(&stmts).map_err(entity_race)?;
        match has_inbox {
            true => checked_ids(&rows[0], w.inbox.iter().map(|i| i.entity_id), "inbox"),
            false => Ok(Vec::new()),
        }
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

    fn other(&mut self, now: Millis, op: &Op) -> R<Result<Other, OpError>> {
        match apply_other(self.c, now, op) {
            Ok(other) => Ok(Ok(other)),
            Err(Fail::Op(e)) => Ok(Err(e)),
            Err(Fail::Db(e)) => Err(e),
        }
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

    fn finish(&mut self, f: &Finish<'_>) -> R<(Vec<Claimed>, Option<Millis>)> {
        let mut p = Slots::default();
        let mut params: Vec<Box<dyn ToSql + Sync + Send>> = Vec::new();
        // The claim (if any) as CTEs, then one row: when the next entity and timer are
        // due, and the batch's notifications (others learn of it when it commits: work to
        // claim, entities moved), joined with the claimed rows.
        let mut sql = String::new();
        let claiming = f.claim.is_some();
        let next_entity = if let Some(claim) = f.claim {
            // A timer created by another instance since is missed here at worst once: its
            // entity is due (by `timer_at`), and this batch reads the earliest timer again.
            if f.now >= self.next_timer.load(std::sync::atomic::Ordering::Relaxed) {
                p.add(fire_timers(f.now, 1_000));
            }
            sql.push_str(&format!(
                "WITH picked AS (
                    SELECT id, due_at AS was_due FROM entities
                    WHERE due_at <= $1 AND (cardinality($5::text[]) = 0 OR machine = ANY($5::text[]))
                    ORDER BY due_at LIMIT $4 FOR UPDATE SKIP LOCKED),
                 claimed AS (
                    UPDATE entities e SET lease_owner = $2, lease_until = $3, due_at = $3, sleep_until = NULL,
                        run_status = CASE WHEN run_status IN ('sleeping', 'fault') THEN 'active' ELSE run_status END
                    FROM picked p WHERE e.id = p.id
                    RETURNING p.was_due, {}),
                 tail AS (SELECT ",
                ENTITY_COLS.split(", ").map(|c| format!("e.{c}")).collect::<Vec<_>>().join(", ")
            ));
            params.extend([
                one(f.now),
                one(claim.owner.clone()),
                one(f.now + claim.lease_ms),
                one(claim.limit as i64),
                col(claim.machines.clone()),
            ]);
            // The statement sees the claimed rows as they were (due now): they are due
            // again when their lease ends.
            "LEAST((SELECT MIN(due_at) FROM entities
                    WHERE due_at IS NOT NULL AND (cardinality($5::text[]) = 0 OR machine = ANY($5::text[]))
                      AND id NOT IN (SELECT id FROM claimed)),
                   (SELECT MAX($3::bigint) FROM claimed))"
                .to_string()
        } else {
            sql.push_str("SELECT ");
            "(SELECT MIN(due_at) FROM entities WHERE due_at IS NOT NULL)".to_string()
        };
        sql.push_str(&next_entity);
        sql.push_str(", (SELECT MIN(due_at) FROM timers)");
        if f.others_due {
            let n = params.len();
            sql.push_str(&format!(", pg_notify(${}, ${})", n + 1, n + 2));
            params.extend([one(self.channel.to_string()), one(self.me.to_string())]);
        }
        let payloads = crate::changes::encode(self.me, &f.changed);
        let width = sql_tail_width(f.others_due, !payloads.is_empty());
        if !payloads.is_empty() {
            let n = params.len();
            sql.push_str(&format!(
                ", (SELECT count(pg_notify(${}, payload)) FROM unnest(${}::text[]) AS payload)",
                n + 1,
                n + 2
            ));
            params.extend([one(self.changes_channel.to_string()), col(payloads)]);
        }
        if claiming {
            sql.push_str(&format!(
                ")
                 SELECT t.*, c.*, {INBOX_COLS} FROM tail t
                 LEFT JOIN claimed c ON TRUE
                 LEFT JOIN LATERAL (SELECT * FROM inbox WHERE entity_id = c.id ORDER BY id LIMIT 1) i ON TRUE"
            ));
        }
        let at = p.add(Stmt::new(sql, params));
        let rows = self.c.send_and_commit(&p.0).map_err(|e| match e {
            CommitError::Failed(e) => Failure::Pg(e),
            CommitError::Unknown(e) => Failure::CommitUnknown(e),
        })?;
        let rows = &rows[at];
        let first =
            rows.first().ok_or_else(|| Failure::Corrupt("the batch's last statement returned no row".into()))?;
        let next: Option<Millis> = first.try_get(0)?;
        let next_timer: Option<Millis> = first.try_get(1)?;
        self.next_timer.store(next_timer.unwrap_or(Millis::MAX), std::sync::atomic::Ordering::Relaxed);
        let mut claimed = Vec::new();
        if claiming {
            let entity_width = ENTITY_COLS.split(", ").count();
            let mut picked = Vec::with_capacity(rows.len());
            for r in rows {
                // No row claimed: the tail's one row, joined with nothing.
                let Some(was) = r.try_get::<_, Option<i64>>(width)? else { continue };
                let entity = entity_from_row_at(r, width + 1)?;
                let head_at = width + 1 + entity_width;
                let inbox_head = match r.try_get::<_, Option<i64>>(head_at)? {
                    Some(_) => Some(super::read::inbox_from_row_at(r, head_at)?),
                    None => None,
                };
                picked.push((was, Claimed { entity, inbox_head }));
            }
            // Oldest due first, as claimed.
            picked.sort_by_key(|(was, c)| (*was, c.entity.id));
            claimed = picked.into_iter().map(|(_, c)| c).collect();
        }
        Ok((claimed, next))
    }
}

/// Columns of the finish statement's tail: the next due entity and timer, and one per
/// notification kind sent.
fn sql_tail_width(wake: bool, changes: bool) -> usize {
    2 + usize::from(wake) + usize::from(changes)
}

/// Turns due timers of active entities into inbox events (one-shot timers deleted,
/// periodic ones rescheduled), in one statement. Timers whose row or entity another
/// instance has locked are left for the next claim (it never waits for a lock, so it
/// cannot deadlock with a commit replacing that entity's timers).
fn fire_timers(now: Millis, limit: i64) -> Stmt {
    Stmt::new(
        // `due` walks the due index (a scalar subquery, which the planner cannot turn into
        // a join starting from `entities`).
        "WITH due AS MATERIALIZED (
            SELECT t.entity_id, t.name, t.event, t.due_at, t.every_ms FROM timers t
            WHERE t.due_at <= $1 AND (SELECT e.run_status FROM entities e WHERE e.id = t.entity_id) = 'active'
            ORDER BY t.due_at LIMIT $2 FOR UPDATE OF t SKIP LOCKED),
         held AS MATERIALIZED (
            SELECT e.id FROM entities e WHERE e.id IN (SELECT entity_id FROM due) AND e.run_status = 'active'
            FOR NO KEY UPDATE SKIP LOCKED),
         fired AS MATERIALIZED (SELECT d.* FROM due d WHERE d.entity_id IN (SELECT id FROM held)),
         queued AS (
            INSERT INTO inbox (entity_id, event, params, request_id, kind, created_at)
            SELECT entity_id, event, jsonb_build_object('timer', name)::text, NULL, 'timer', $1
            FROM fired ORDER BY due_at, entity_id, name),
         moved AS (
            UPDATE timers t SET due_at = GREATEST(f.due_at + f.every_ms, $1 + 1) FROM fired f
            WHERE t.entity_id = f.entity_id AND t.name = f.name AND f.every_ms > 0
            RETURNING t.entity_id, t.due_at),
         gone AS (
            DELETE FROM timers t USING fired f
            WHERE t.entity_id = f.entity_id AND t.name = f.name AND COALESCE(f.every_ms, 0) <= 0)
         UPDATE entities e SET
            timer_at = LEAST(
                (SELECT MIN(t.due_at) FROM timers t WHERE t.entity_id = e.id
                    AND NOT EXISTS (SELECT 1 FROM fired f WHERE f.entity_id = t.entity_id AND f.name = t.name)),
                (SELECT MIN(m.due_at) FROM moved m WHERE m.entity_id = e.id)),
            due_at = CASE WHEN e.lease_owner IS NOT NULL THEN e.lease_until ELSE $1 END
         WHERE e.id IN (SELECT entity_id FROM fired)",
        vec![one(now), one(limit)],
    )
}
