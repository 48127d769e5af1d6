//! The PostgreSQL dialect's writes: each set of rows a segment decided ([`Writes`]) as one
//! statement over arrays (`unnest`); the sets no other set of the phase reads merged into
//! one statement, the others after it, all in one pipeline.

use postgres::Row;
use postgres::error::SqlState;

use super::conn::Failure;
use super::stmt::{Slots, Stmt, bools, col, ints, merge, one, opt_ints, opt_strings, strings};
use super::writer::WriterConn;
use crate::plan::Writes;

type R<T> = std::result::Result<T, Failure>;

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

/// Writes the sets of `w`, in one pipeline; answers the ids of the new inbox items, in order.
pub(super) fn write_sets(c: &mut WriterConn, w: &Writes) -> R<Vec<i64>> {
    // Sets no other set of the phase reads: one statement.
    let mut merged = Vec::new();
    // Sets that must see the rows written by the others.
    let mut p = Slots::default();
    if !w.entities.is_empty() {
        let e = &w.entities;
        merged.push(Stmt::new(
            "INSERT INTO entities (id, machine, key, state, properties, version, retry, created_at, entered_at,
                auto_at, due_at, request_id, busy, machine_hash, timer_at, has_predecessors, lease_owner, lease_until)
             SELECT v.id, v.machine, v.key, v.state, v.properties, 1, 0, v.created_at, v.created_at, v.auto_at,
                v.due_at, v.request_id, v.busy, v.machine_hash, v.timer_at, v.has_predecessors, v.lease_owner,
                v.lease_until
             FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::text[], $6::bigint[],
                $7::bigint[], $8::bigint[], $9::text[], $10::boolean[], $11::text[], $12::bigint[], $13::boolean[],
                $14::text[], $15::bigint[])
                AS v(id, machine, key, state, properties, created_at, auto_at, due_at, request_id, busy,
                     machine_hash, timer_at, has_predecessors, lease_owner, lease_until)",
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
                opt_strings(e, |e| e.lease_owner.as_deref()),
                opt_ints(e, |e| e.lease_until),
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
                recent_errors = COALESCE(v.recent_errors, e.recent_errors), ended_at = v.ended_at
             FROM unnest($1::bigint[], $2::text[], $3::bigint[], $4::bigint[], $5::bigint[], $6::bigint[],
                $7::bigint[], $8::text[], $9::bigint[], $10::text[], $11::bigint[], $12::text[], $13::bigint[],
                $14::boolean[], $15::bigint[], $16::bigint[], $17::boolean[], $18::text[], $19::text[],
                $20::text[], $21::text[], $22::bigint[])
                AS v(id, state, version, retry, entered_at, auto_at, due_at, lease_owner, lease_until,
                     request_id, timer_at, run_status, sleep_until, busy, event_id, ordinal, has_predecessors,
                     machine_hash, properties, fired, recent_errors, ended_at)
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
                opt_ints(u, |u| u.row.ended_at),
            ],
        ));
    }
    if !w.counts.is_empty() {
        merged.push(super::counts::deltas(&w.counts));
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
            "INSERT INTO inbox (entity_id, event, params, request_id, kind, created_at, reply)
             SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::text[], $6::bigint[],
                $7::text[])
             RETURNING id, entity_id",
            vec![
                ints(i, |i| i.entity_id),
                strings(i, |i| &i.event),
                strings(i, |i| &i.params),
                opt_strings(i, |i| i.request_id.as_deref()),
                strings(i, |i| i.kind),
                ints(i, |i| i.created_at),
                opt_strings(i, |i| i.reply.as_deref()),
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
    if !w.task_updates.is_empty() {
        // After the cancellations (a report of this segment stands), before the offers
        // (which see the task done).
        let t = &w.task_updates;
        p.add(Stmt::new(
            "UPDATE agent_tasks t SET status = v.status, attempt = v.attempt, token = v.token, agent = v.agent,
                leased_at = v.leased_at, locked_until = v.locked_until, available_at = v.available_at,
                finished_at = v.finished_at, outcome = v.outcome, error = v.error
             FROM unnest($1::bigint[], $2::text[], $3::bigint[], $4::text[], $5::text[], $6::bigint[],
                $7::bigint[], $8::bigint[], $9::bigint[], $10::text[], $11::text[])
                AS v(id, status, attempt, token, agent, leased_at, locked_until, available_at, finished_at,
                     outcome, error)
             WHERE t.id = v.id",
            vec![
                ints(t, |t| t.id),
                strings(t, |t| &t.status),
                ints(t, |t| i64::from(t.attempt)),
                opt_strings(t, |t| t.token.as_deref()),
                opt_strings(t, |t| t.agent.as_deref()),
                opt_ints(t, |t| t.leased_at),
                opt_ints(t, |t| t.locked_until),
                ints(t, |t| t.available_at),
                opt_ints(t, |t| t.finished_at),
                opt_strings(t, |t| t.outcome.as_deref()),
                opt_strings(t, |t| t.error.as_deref()),
            ],
        ));
    }
    if !w.offer_now.is_empty() {
        merged.push(Stmt::new(
            "UPDATE agent_tasks SET available_at = $2 WHERE entity_id = ANY($1::bigint[]) AND status = 'ready'",
            vec![col(w.offer_now.clone()), one(w.now)],
        ));
    }
    if !w.offers.is_empty() {
        let t = &w.offers;
        // One open task per entity (the entity rows are locked): a repeated offer keeps it.
        p.add(Stmt::new(
            "INSERT INTO agent_tasks (entity_id, queue, action, state, entity_version, retry, lock_ms, request_id,
                status, available_at, created_at, event_id)
             SELECT v.entity_id, v.queue, v.action, v.state, v.entity_version, v.retry, v.lock_ms, v.request_id,
                'ready', v.available_at, v.created_at, v.event_id
             FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::bigint[],
                $7::bigint[], $8::text[], $9::bigint[], $10::bigint[], $11::bigint[])
                AS v(entity_id, queue, action, state, entity_version, retry, lock_ms, request_id, available_at,
                     created_at, event_id)
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
                opt_ints(t, |t| t.event_id),
            ],
        ));
    }
    if !w.errors.is_empty() {
        let e = &w.errors;
        merged.push(Stmt::new(
            "INSERT INTO errors (id, entity_id, operation_id, request_id, at, kind, details, cause)
             SELECT v.id, v.entity_id, (SELECT o.id FROM operations o WHERE o.request_id = v.request_id),
                v.request_id, v.at, v.kind, v.details, v.cause
             FROM unnest($1::bigint[], $2::bigint[], $3::text[], $4::bigint[], $5::text[], $6::text[], $7::text[])
                AS v(id, entity_id, request_id, at, kind, details, cause)",
            vec![
                ints(e, |e| e.id),
                ints(e, |e| e.entity_id),
                opt_strings(e, |e| e.request_id.as_deref()),
                ints(e, |e| e.at),
                strings(e, |e| e.kind),
                strings(e, |e| &e.details),
                opt_strings(e, |e| e.cause.as_deref()),
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
                start_state, start_time, rejected, failed, error_id, exception, end_state, end_time, reason, entered,
                params, reply)
             SELECT v.id, (SELECT o.id FROM operations o WHERE o.request_id = v.request_id), v.request_id, v.id,
                v.entity_id, v.machine, v.entity_key, v.event, v.kind, v.start_state, v.start_time, v.rejected,
                v.failed, v.error_id, v.exception, v.end_state, v.end_time, v.reason, v.entered, v.params, v.reply
             FROM unnest($1::bigint[], $2::text[], $3::bigint[], $4::text[], $5::text[], $6::text[], $7::text[],
                $8::text[], $9::bigint[], $10::boolean[], $11::boolean[], $12::bigint[], $13::text[], $14::text[],
                $15::bigint[], $16::text[], $17::text[], $18::text[], $19::text[])
                AS v(id, request_id, entity_id, machine, entity_key, event, kind, start_state, start_time,
                     rejected, failed, error_id, exception, end_state, end_time, reason, entered, params, reply)",
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
                opt_strings(e, |e| e.params.as_deref()),
                opt_strings(e, |e| e.reply.as_deref()),
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
    if !w.inbox_clear.is_empty() {
        // After the new items: a kill drops them too.
        p.add(Stmt::new("DELETE FROM inbox WHERE entity_id = ANY($1::bigint[])", vec![col(w.inbox_clear.clone())]));
    }
    if !w.inbox_drop.is_empty() {
        // After the new items: a cancel drops those of its operation queued in this batch.
        let (ids, requests): (Vec<i64>, Vec<String>) = w.inbox_drop.iter().cloned().unzip();
        p.add(Stmt::new(
            "DELETE FROM inbox i USING UNNEST($1::bigint[], $2::text[]) AS d(entity_id, request_id)
             WHERE i.entity_id = d.entity_id AND i.request_id = d.request_id",
            vec![col(ids), col(requests)],
        ));
    }
    if !w.op_cancel.is_empty() {
        p.add(Stmt::new(
            "UPDATE operations SET canceled = TRUE WHERE request_id = ANY($1::text[]) AND ended_at IS NULL",
            vec![col(w.op_cancel.clone())],
        ));
    }
    if !w.op_done.is_empty() {
        p.add(Stmt::new(
            "UPDATE operations SET first_response_at = $2, ended_at = $2, outcome = 'success',
                end_xid = pg_current_xact_id()::text::bigint
             WHERE request_id = ANY($1::text[]) AND ended_at IS NULL",
            vec![col(w.op_done.clone()), one(w.now)],
        ));
    }
    if !w.complete.is_empty() {
        p.add(Stmt::new(
            "UPDATE operations SET ended_at = $2, end_xid = pg_current_xact_id()::text::bigint,
                outcome = CASE WHEN canceled THEN 'canceled' WHEN error_seen THEN 'failed' ELSE 'success' END
             WHERE request_id = ANY($1::text[]) AND ended_at IS NULL
               AND NOT EXISTS (SELECT 1 FROM entities e WHERE e.request_id = operations.request_id AND e.busy)
               AND NOT EXISTS (SELECT 1 FROM inbox i WHERE i.request_id = operations.request_id)",
            vec![col(w.complete.clone()), one(w.now)],
        ));
    }
    if !w.hung.is_empty() {
        p.add(Stmt::new(
            "UPDATE operations SET outcome = 'hung'
             WHERE request_id = ANY($1::text[]) AND ended_at IS NULL AND outcome IS NULL",
            vec![col(w.hung.clone())],
        ));
    }
    if !w.renewals.is_empty() {
        let r = &w.renewals;
        p.add(Stmt::new(
            "UPDATE entities e SET lease_until = v.until, due_at = v.until
             FROM unnest($1::bigint[], $2::bigint[]) AS v(id, until) WHERE e.id = v.id",
            vec![ints(r, |r| r.id), ints(r, |r| r.until)],
        ));
    }
    if w.restarted {
        p.add(Stmt::new("UPDATE operations SET restart_count = restart_count + 1 WHERE ended_at IS NULL", vec![]));
    }
    for (entity_id, t) in &w.trims {
        let (before, rows) = crate::sql::trim_params(t);
        for sql in crate::sql::TRIM {
            p.add(Stmt::new(sql, vec![one(*entity_id), one(before), one(rows)]));
        }
    }
    let has_inbox = inbox.is_some();
    let mut stmts = Vec::with_capacity(1 + p.0.len());
    stmts.extend(merge(merged, inbox));
    stmts.extend(p.0);
    if stmts.is_empty() {
        return Ok(Vec::new());
    }
    let rows = c.send(&stmts).map_err(entity_race)?;
    match has_inbox {
        true => checked_ids(&rows[0], w.inbox.iter().map(|i| i.entity_id), "inbox"),
        false => Ok(Vec::new()),
    }
}
