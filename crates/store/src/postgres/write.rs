//! The write path: a [`Batch`] in one transaction, the same semantics as the SQLite store
//! (see `sqlite.rs`), written for concurrent engine instances: claims and timer firing
//! skip rows another instance has locked, and change notices are ordered against the
//! subscriber's snapshot (see [`notify_predecessors`]).

use super::Failure;
use super::conn::Conn;
use super::read::{entity_from_row, inbox_from_row, task_from_row};
use crate::sql::{ENTITY_COLS, TASK_COLS, json_text, needs_savepoint, report_push, task_refusal};
use crate::types::*;

/// Why an operation stopped: its own failure (rolled back alone) or the database's.
pub(crate) enum Fail {
    Op(OpError),
    Db(Failure),
}

impl From<postgres::Error> for Fail {
    fn from(e: postgres::Error) -> Self {
        Fail::Db(Failure::Pg(e))
    }
}

impl From<Failure> for Fail {
    fn from(e: Failure) -> Self {
        Fail::Db(e)
    }
}

type R<T> = std::result::Result<T, Failure>;

/// When an entity is next due, from its current columns (`$2`: now); see `sqlite.rs`.
const DUE_EXPR: &str = "CASE
    WHEN run_status IN ('paused', 'failed', 'killed') THEN NULL
    WHEN run_status IN ('sleeping', 'fault') THEN sleep_until
    WHEN lease_owner IS NOT NULL THEN lease_until
    WHEN EXISTS (SELECT 1 FROM inbox i WHERE i.entity_id = entities.id) THEN $2::bigint
    WHEN auto_at IS NULL THEN timer_at
    WHEN timer_at IS NULL THEN auto_at
    ELSE LEAST(auto_at, timer_at) END";

/// Opens an operation; `Some(id)` of the existing one if its request id was seen before.
fn open_operation(c: &mut Conn, now: Millis, op: &OpenOperation, machine: &str, key: &str) -> R<Option<i64>> {
    let inserted = c.exec(
        "INSERT INTO operations (request_id, name, machine, entity_key, started_at, dimensions)
         VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (request_id) DO NOTHING",
        &[&op.request_id, &op.name, &machine, &key, &now, &json_text(&op.dimensions)],
    )?;
    if inserted == 1 {
        return Ok(None);
    }
    let row = c.one("SELECT id FROM operations WHERE request_id = $1", &[&op.request_id])?;
    Ok(Some(row.try_get(0)?))
}

/// Ends the operation `request_id` if nothing it reached is still busy or queued.
fn complete_operation(c: &mut Conn, request_id: &str, now: Millis) -> R<()> {
    c.exec(
        "UPDATE operations SET ended_at = $2,
            outcome = CASE WHEN canceled THEN 'canceled' WHEN error_seen THEN 'failed' ELSE 'success' END
         WHERE request_id = $1 AND ended_at IS NULL
           AND NOT EXISTS (SELECT 1 FROM entities WHERE request_id = $1 AND busy)
           AND NOT EXISTS (SELECT 1 FROM inbox WHERE request_id = $1)",
        &[&request_id, &now],
    )?;
    Ok(())
}

fn select_entity(c: &mut Conn, id: i64) -> R<EntityRow> {
    let row = c.one(&format!("SELECT {ENTITY_COLS} FROM entities WHERE id = $1"), &[&id])?;
    entity_from_row(&row)
}

fn insert_notice(c: &mut Conn, entity_id: i64, request_id: Option<&str>, now: Millis) -> R<()> {
    c.exec(
        "INSERT INTO inbox (entity_id, event, params, request_id, kind, created_at)
         VALUES ($1, $2, '{}', $3, 'notice', $4)",
        &[&entity_id, &InboxKind::NOTICE_EVENT, &request_id, &now],
    )?;
    Ok(())
}

fn insert_entity(c: &mut Conn, now: Millis, e: &NewEntity) -> Result<Applied, Fail> {
    if let Some(op) = &e.operation {
        if let Some(operation_id) = open_operation(c, now, op, &e.machine, &e.key)? {
            return Ok(Applied::Replayed { operation_id });
        }
        // The caller's answer (the entity exists) is this commit.
        c.exec("UPDATE operations SET first_response_at = $2 WHERE request_id = $1", &[&op.request_id, &now])?;
    }
    let inserted = c.opt(
        "INSERT INTO entities (machine, key, state, properties, version, retry, created_at, entered_at, auto_at,
            due_at, request_id, busy, machine_hash)
         VALUES ($1, $2, $3, $4, 1, 0, $5, $5, $6, $6, $7, $8, $9)
         ON CONFLICT (machine, key) DO NOTHING RETURNING id",
        &[
            &e.machine.as_str(),
            &e.key.as_str(),
            &e.state.as_str(),
            &json_text(&e.properties),
            &now,
            &e.auto_at,
            &e.request_id,
            &(e.auto_at.is_some() || e.offer.is_some()),
            &e.machine_hash,
        ],
    )?;
    let Some(row) = inserted else {
        return Err(Fail::Op(OpError::AlreadyExists { machine: e.machine.to_string(), key: e.key.to_string() }));
    };
    let id: i64 = row.try_get(0).map_err(Failure::Pg)?;
    c.exec(
        "INSERT INTO history (entity_id, from_state, to_state, kind, retry, request_id, at, machine_hash,
            ordinal, transition_kind, end_health, entry_time, start_time, outcome)
         VALUES ($1, NULL, $2, 'create', 0, $3, $4, $5, 1, 'create', $6, $4, $4, 'ok')",
        &[&id, &e.state.as_str(), &e.request_id, &now, &e.machine_hash, &e.health],
    )?;
    if e.notify_self {
        insert_notice(c, id, e.request_id.as_deref(), now)?;
    }
    if !e.timers.is_empty() {
        set_timers(c, id, &e.timers)?;
    }
    if let Some(offer) = &e.offer {
        offer_task(c, now, id, e.state.as_str(), 1, 0, e.request_id.as_deref(), offer)?;
    }
    if e.notify_self || !e.timers.is_empty() {
        refresh_due(c, id, now, !e.timers.is_empty())?;
    }
    if e.operation.is_some()
        && let Some(r) = &e.request_id
        && e.auto_at.is_none()
        && e.offer.is_none()
        && !e.notify_self
    {
        complete_operation(c, r, now)?;
    }
    Ok(Applied::Created(select_entity(c, id)?))
}

fn push_event(c: &mut Conn, now: Millis, p: &Push) -> Result<Applied, Fail> {
    // Locked so that a concurrent commit releasing the entity cannot miss this event
    // (see `recheck_due`).
    let found = c.opt(
        "SELECT id FROM entities WHERE machine = $1 AND key = $2 FOR NO KEY UPDATE",
        &[&p.machine.as_str(), &p.key.as_str()],
    )?;
    let Some(found) = found else {
        return Err(Fail::Op(OpError::NotFound { machine: p.machine.to_string(), key: p.key.to_string() }));
    };
    let entity_id: i64 = found.try_get(0).map_err(Failure::Pg)?;
    if let Some(op) = &p.operation
        && let Some(operation_id) = open_operation(c, now, op, &p.machine, &p.key)?
    {
        return Ok(Applied::Replayed { operation_id });
    }
    let row = c.one(
        "INSERT INTO inbox (entity_id, event, params, request_id, kind, created_at)
         VALUES ($1, $2, $3, $4, $5, $6) RETURNING id",
        &[&entity_id, &p.event.as_str(), &json_text(&p.params), &p.request_id, &p.kind.as_str(), &now],
    )?;
    let inbox_id: i64 = row.try_get(0).map_err(Failure::Pg)?;
    if let Some(pred) = p.join_from {
        add_successor(c, now, pred, entity_id, p.request_id.as_deref())?;
    }
    c.exec(
        "UPDATE entities SET due_at = $2
         WHERE id = $1 AND lease_owner IS NULL AND run_status = 'active' AND (due_at IS NULL OR due_at > $2)",
        &[&entity_id, &now],
    )?;
    Ok(Applied::Pushed { inbox_id, entity_id })
}

pub(crate) fn inbox_head(c: &mut Conn, entity_id: i64) -> R<Option<InboxItem>> {
    c.opt(
        "SELECT id, entity_id, event, params, request_id, created_at, kind FROM inbox
         WHERE entity_id = $1 ORDER BY id LIMIT 1",
        &[&entity_id],
    )?
    .map(|r| inbox_from_row(&r))
    .transpose()
}

fn apply_commit(c: &mut Conn, now: Millis, cm: &Commit) -> Result<Applied, Fail> {
    let f = &cm.fence;
    let hold = matches!(cm.after, AfterCommit::Hold);
    for &(entity_id, expected) in &cm.preconditions {
        // FOR SHARE: nobody may change it between this check and our commit.
        let found: i64 = match c.opt("SELECT version FROM entities WHERE id = $1 FOR SHARE", &[&entity_id])? {
            Some(r) => r.try_get(0).map_err(Failure::Pg)?,
            None => 0,
        };
        if found != expected {
            return Err(Fail::Op(OpError::Precondition { entity_id, expected, found }));
        }
    }
    let fired = cm.fired.as_ref().map(|f| json_text(&f.iter().map(|e| e.as_str()).collect::<Vec<_>>()));
    let (status, sleep_until) = match cm.run_status {
        Some((s, until)) => (Some(s.as_str()), until),
        None => (None, None),
    };
    let to = cm.to.as_deref();
    let retry = i64::from(cm.retry);
    let consume = cm.consume.unwrap_or(-1);
    let has_event = cm.telemetry.event.is_some();
    // The fence: only the lease holder, at the version it read, may write (see sqlite.rs).
    let updated = c.opt(
        "UPDATE entities SET
            state = COALESCE($4::text, state),
            version = version + CASE WHEN $4::text IS NOT NULL THEN 1 ELSE 0 END,
            retry = CASE WHEN $4::text IS NOT NULL THEN $5::bigint ELSE retry END,
            entered_at = CASE WHEN $4::text IS NOT NULL THEN $6::bigint ELSE entered_at END,
            auto_at = CASE WHEN $4::text IS NOT NULL THEN $7::bigint ELSE auto_at END,
            busy = CASE WHEN $4::text IS NOT NULL THEN $7::bigint IS NOT NULL AND COALESCE($11::text, run_status) <> 'failed'
                        ELSE busy AND COALESCE($11::text, run_status) <> 'failed' END,
            request_id = CASE WHEN $4::text IS NOT NULL THEN COALESCE($8::text, request_id) ELSE request_id END,
            properties = COALESCE($9::text, properties),
            fired = COALESCE($10::text, fired),
            run_status = COALESCE($11::text, run_status),
            sleep_until = CASE WHEN $11::text IS NOT NULL THEN $12::bigint ELSE sleep_until END,
            recent_errors = COALESCE($13::text, recent_errors),
            machine_hash = COALESCE($14::text, machine_hash),
            ordinal = CASE WHEN $4::text IS NULL THEN ordinal WHEN $17::boolean THEN 1 ELSE ordinal + 1 END,
            event_id = CASE WHEN $18::boolean THEN NULL WHEN $4::text IS NOT NULL AND $17::boolean THEN $16::bigint
                            ELSE event_id END,
            lease_owner = CASE WHEN $15::boolean AND COALESCE($11::text, run_status) = 'active' THEN lease_owner END,
            lease_until = CASE WHEN $15::boolean AND COALESCE($11::text, run_status) = 'active' THEN lease_until END,
            due_at = CASE
                WHEN COALESCE($11::text, run_status) IN ('paused', 'failed', 'killed') THEN NULL
                WHEN COALESCE($11::text, run_status) IN ('sleeping', 'fault') THEN
                    CASE WHEN $11::text IS NOT NULL THEN $12::bigint ELSE sleep_until END
                WHEN $15::boolean THEN due_at
                WHEN EXISTS (SELECT 1 FROM inbox WHERE entity_id = $1 AND id <> $16::bigint) THEN $6::bigint
                WHEN (CASE WHEN $4::text IS NOT NULL THEN $7::bigint ELSE auto_at END) IS NULL THEN timer_at
                WHEN timer_at IS NULL THEN CASE WHEN $4::text IS NOT NULL THEN $7::bigint ELSE auto_at END
                ELSE LEAST(CASE WHEN $4::text IS NOT NULL THEN $7::bigint ELSE auto_at END, timer_at) END
         WHERE id = $1 AND version = $2 AND lease_owner = $3
         RETURNING lease_owner IS NOT NULL, has_predecessors, machine, key, ordinal",
        &[
            &f.entity_id,
            &f.version,
            &f.owner,
            &to,
            &retry,
            &now,
            &cm.auto_at,
            &cm.request_id,
            &cm.properties.as_ref().map(json_text),
            &fired,
            &status,
            &sleep_until,
            &cm.recent_errors.as_ref().map(json_text),
            &cm.machine_hash,
            &hold,
            &consume,
            &has_event,
            &cm.telemetry.at_rest,
        ],
    )?;
    let Some(updated) = updated else {
        return Err(Fail::Op(OpError::LeaseLost { entity_id: f.entity_id }));
    };
    let held: bool = updated.try_get(0).map_err(Failure::Pg)?;
    let has_predecessors: bool = updated.try_get(1).map_err(Failure::Pg)?;
    let machine: String = updated.try_get(2).map_err(Failure::Pg)?;
    let key: String = updated.try_get(3).map_err(Failure::Pg)?;
    let ordinal: i64 = updated.try_get(4).map_err(Failure::Pg)?;
    if let Some(id) = cm.consume {
        c.exec("DELETE FROM inbox WHERE id = $1 AND entity_id = $2", &[&id, &f.entity_id])?;
    }
    if let Some(upto) = cm.consume_notices_upto {
        c.exec("DELETE FROM inbox WHERE entity_id = $1 AND kind = 'notice' AND id <= $2", &[&f.entity_id, &upto])?;
    }
    let t = &cm.telemetry;
    let event_id = if t.event.is_some() && cm.to.is_some() { cm.consume } else { t.current_event };
    if !cm.quiet {
        let tr = if cm.to.is_some() { t.transition.as_ref() } else { None };
        c.exec(
            "INSERT INTO history (entity_id, from_state, to_state, kind, action, event, retry, request_id, at, detail,
                machine_hash, event_id, ordinal, transition_kind, start_health, end_health, entry_time, start_time,
                action_start_time, outcome)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20)",
            &[
                &f.entity_id,
                &cm.from.as_str(),
                &to,
                &cm.kind.as_str(),
                &cm.action.as_deref(),
                &cm.event.as_deref(),
                &retry,
                &cm.request_id,
                &now,
                &cm.detail,
                &cm.machine_hash,
                &tr.and(event_id),
                &tr.map(|_| ordinal),
                &tr.map(|t| t.kind),
                &tr.and_then(|t| t.start_health),
                &tr.map(|t| t.end_health),
                &tr.map(|t| t.entry_time),
                &tr.map(|t| t.start_time),
                &tr.and_then(|t| t.action_start_time),
                &tr.map(|t| t.outcome),
            ],
        )?;
    }
    write_telemetry(c, now, cm, event_id, &machine, &key)?;
    for (index, stmt) in cm.sql.iter().enumerate() {
        if let Err(e) = c.exec_dynamic(&stmt.sql, &stmt.params) {
            // A lost connection or race is the batch's to retry; anything else is this
            // statement's fault.
            if super::conn::recovery(&e) != super::conn::Recovery::Fail {
                return Err(e.into());
            }
            return Err(Fail::Op(OpError::Sql { index, message: super::pg_message(&e) }));
        }
    }
    let mut created = Vec::with_capacity(cm.creates.len());
    for e in &cm.creates {
        let Applied::Created(row) = insert_entity(c, now, e)? else {
            unreachable!("entities created by actions open no operation")
        };
        add_successor(c, now, f.entity_id, row.id, cm.request_id.as_deref())?;
        created.push(row.id);
    }
    for p in &cm.pushes {
        push_event(c, now, p)?;
    }
    if cm.notify_predecessors && has_predecessors {
        notify_predecessors(c, f.entity_id, now, cm.request_id.as_deref())?;
    }
    if cm.notify_self {
        insert_notice(c, f.entity_id, cm.request_id.as_deref(), now)?;
    }
    if let Some(plans) = &cm.timers {
        set_timers(c, f.entity_id, plans)?;
    }
    let version = if cm.to.is_some() { f.version + 1 } else { f.version };
    if cm.to.is_some() {
        cancel_tasks(c, f.entity_id, now)?;
    }
    if let Some(offer) = &cm.offer {
        let state = cm.to.as_ref().unwrap_or(&cm.from);
        offer_task(c, now, f.entity_id, state, version, cm.retry, cm.request_id.as_deref(), offer)?;
        c.exec("UPDATE entities SET auto_at = NULL, busy = run_status <> 'failed' WHERE id = $1", &[&f.entity_id])?;
    }
    if cm.timers.is_some() || cm.notify_self || cm.consume_notices_upto.is_some() || cm.offer.is_some() {
        refresh_due(c, f.entity_id, now, cm.timers.is_some())?;
    }
    if cm.telemetry.complete
        && let Some(r) = &cm.request_id
    {
        complete_operation(c, r, now)?;
    }
    if !held {
        recheck_due(c, f.entity_id, now)?;
    }
    let inbox_head = if held { inbox_head(c, f.entity_id)? } else { None };
    Ok(Applied::Committed { held, version, inbox_head, created })
}

/// Writes the commit's `events`, `errors` and `exceptions` rows (see sqlite.rs).
fn write_telemetry(c: &mut Conn, now: Millis, cm: &Commit, event_id: Option<i64>, machine: &str, key: &str) -> R<()> {
    let t = &cm.telemetry;
    let f = &cm.fence;
    let mut error_id: Option<i64> = None;
    if let Some(err) = &t.error {
        let row = c.one(
            "INSERT INTO errors (entity_id, operation_id, request_id, at, kind, details)
             VALUES ($1, (SELECT id FROM operations WHERE request_id = $2), $2, $3, $4, $5) RETURNING id",
            &[&f.entity_id, &cm.request_id, &now, &err.kind, &err.details],
        )?;
        let id: i64 = row.try_get(0)?;
        error_id = Some(id);
        if let Some(details) = &err.exception {
            c.exec("INSERT INTO exceptions (error_id, at, details) VALUES ($1, $2, $3)", &[&id, &now, details])?;
        }
        if let Some(r) = &cm.request_id {
            c.exec(
                "UPDATE operations SET error_seen = TRUE, error = COALESCE(error, $2) WHERE request_id = $1",
                &[r, &err.details],
            )?;
        }
    }
    if let (Some(ev), Some(name)) = (&t.event, &cm.event) {
        let ended = cm.to.is_none();
        if !ended && let Some(previous) = t.current_event {
            c.exec(
                "UPDATE events SET end_state = $2, end_time = $3 WHERE id = $1 AND end_time IS NULL",
                &[&previous, &cm.from.as_str(), &now],
            )?;
        }
        c.exec(
            "INSERT INTO events (id, operation_id, request_id, seq, entity_id, machine, entity_key, event, kind,
                start_state, start_time, rejected, failed, error_id, exception, end_state, end_time)
             VALUES ($1, (SELECT id FROM operations WHERE request_id = $2), $2, $1, $3, $4, $5, $6, $7, $8, $9, $10,
                $11, $12, $13, CASE WHEN $14::boolean THEN $8 END, CASE WHEN $14::boolean THEN $15::bigint END)",
            &[
                &ev.seq,
                &cm.request_id,
                &f.entity_id,
                &machine,
                &key,
                &name.as_str(),
                &ev.kind,
                &cm.from.as_str(),
                &ev.raised_at,
                &ev.rejected,
                &ev.failed,
                &error_id,
                &t.error.as_ref().and_then(|e| e.exception.clone()),
                &ended,
                &now,
            ],
        )?;
        if ev.kind == "raised"
            && let Some(r) = &cm.request_id
        {
            c.exec(
                "UPDATE operations SET first_response_at = COALESCE(first_response_at, $2) WHERE request_id = $1",
                &[r, &now],
            )?;
        }
    }
    if t.transition.as_ref().is_some_and(|tr| tr.end_health == "error")
        && cm.to.is_some()
        && let Some(r) = &cm.request_id
    {
        let message = format!("entered error state `{}`", cm.to.as_deref().unwrap_or_default());
        c.exec(
            "UPDATE operations SET error_seen = TRUE, error = COALESCE(error, $2) WHERE request_id = $1",
            &[r, &message],
        )?;
    }
    if t.at_rest
        && cm.to.is_some()
        && let Some(id) = event_id
    {
        c.exec(
            "UPDATE events SET end_state = $2, end_time = $3 WHERE id = $1 AND end_time IS NULL",
            &[&id, &cm.to.as_deref(), &now],
        )?;
    }
    Ok(())
}

fn add_successor(c: &mut Conn, now: Millis, pred: i64, succ: i64, request_id: Option<&str>) -> R<()> {
    if pred == succ {
        return Ok(());
    }
    c.exec(
        "INSERT INTO successors (predecessor_id, successor_id, request_id, created_at) VALUES ($1, $2, $3, $4)
         ON CONFLICT (predecessor_id, successor_id) DO NOTHING",
        &[&pred, &succ, &request_id, &now],
    )?;
    c.exec("UPDATE entities SET has_predecessors = TRUE WHERE id = $1 AND NOT has_predecessors", &[&succ])?;
    Ok(())
}

/// Recomputes an entity's due time (and, when its timers changed, its timer time).
pub(crate) fn refresh_due(c: &mut Conn, id: i64, now: Millis, timers_changed: bool) -> R<()> {
    if timers_changed {
        c.exec(
            "UPDATE entities SET timer_at = (SELECT MIN(due_at) FROM timers WHERE entity_id = $1) WHERE id = $1",
            &[&id],
        )?;
    }
    c.exec(&format!("UPDATE entities SET due_at = {DUE_EXPR} WHERE id = $1"), &[&id, &now])?;
    recheck_due(c, id, now)
}

/// Makes a free entity with queued events due now, in a statement of its own.
///
/// Under READ COMMITTED a statement that waited for a row lock re-reads that row but not
/// the rest of the database: a commit that releases an entity while another instance
/// pushes an event to it (locking the entity's row first, see `push_event` and
/// `notify_predecessors`) computes the due time without seeing that event. This next
/// statement sees it (its snapshot is taken after the wait), so no event is stranded on a
/// free entity.
fn recheck_due(c: &mut Conn, id: i64, now: Millis) -> R<()> {
    c.exec(
        "UPDATE entities SET due_at = $2
         WHERE id = $1 AND lease_owner IS NULL AND run_status = 'active' AND (due_at IS NULL OR due_at > $2)
           AND EXISTS (SELECT 1 FROM inbox WHERE entity_id = $1)",
        &[&id, &now],
    )?;
    Ok(())
}

/// Writes a change notice to every predecessor of `id` and makes the free ones due.
///
/// The predecessors' rows are locked *before* the notices get their ids (which also
/// orders this against a commit releasing them, see `recheck_due`). A
/// subscriber reads its successors and newest notice holding its own row `FOR UPDATE`
/// (`successor_snapshot`), so no notice with a smaller id than the newest it saw can be
/// still uncommitted: consuming notices "up to" that id never drops one it did not cover.
fn notify_predecessors(c: &mut Conn, id: i64, now: Millis, request_id: Option<&str>) -> R<()> {
    let locked = c.query(
        "SELECT e.id FROM entities e WHERE e.id IN (SELECT predecessor_id FROM successors WHERE successor_id = $1)
         ORDER BY e.id FOR NO KEY UPDATE",
        &[&id],
    )?;
    if locked.is_empty() {
        return Ok(());
    }
    c.exec(
        "INSERT INTO inbox (entity_id, event, params, request_id, kind, created_at)
         SELECT predecessor_id, $2, '{}', $3, 'notice', $4 FROM successors WHERE successor_id = $1",
        &[&id, &InboxKind::NOTICE_EVENT, &request_id, &now],
    )?;
    c.exec(
        "UPDATE entities SET due_at = $2
         WHERE id IN (SELECT predecessor_id FROM successors WHERE successor_id = $1)
           AND lease_owner IS NULL AND run_status = 'active' AND (due_at IS NULL OR due_at > $2)",
        &[&id, &now],
    )?;
    Ok(())
}

fn set_timers(c: &mut Conn, id: i64, plans: &[TimerPlan]) -> R<()> {
    let names: Vec<&str> = plans.iter().map(|p| p.name.as_str()).collect();
    c.exec("DELETE FROM timers WHERE entity_id = $1 AND NOT (name = ANY($2))", &[&id, &names])?;
    for p in plans {
        let sql = if p.restart {
            "INSERT INTO timers (entity_id, name, event, due_at, every_ms) VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (entity_id, name) DO UPDATE SET
                event = excluded.event, due_at = excluded.due_at, every_ms = excluded.every_ms"
        } else {
            "INSERT INTO timers (entity_id, name, event, due_at, every_ms) VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (entity_id, name) DO NOTHING"
        };
        c.exec(sql, &[&id, &p.name, &p.event.as_str(), &p.due_at, &p.every_ms])?;
    }
    Ok(())
}

/// Turns due timers of active entities into inbox events (see sqlite.rs). Timers whose
/// row or entity another instance has locked are left for the next claim.
fn fire_timers(c: &mut Conn, now: Millis, limit: i64) -> R<()> {
    let due = c.query(
        "SELECT t.entity_id, t.name, t.event, t.due_at, t.every_ms FROM timers t JOIN entities e ON e.id = t.entity_id
         WHERE t.due_at <= $1 AND e.run_status = 'active' ORDER BY t.due_at LIMIT $2
         FOR UPDATE OF t, e SKIP LOCKED",
        &[&now, &limit],
    )?;
    for row in &due {
        let t = super::read::timer_from_row(row)?;
        c.exec(
            "INSERT INTO inbox (entity_id, event, params, request_id, kind, created_at)
             VALUES ($1, $2, $3, NULL, 'timer', $4)",
            &[&t.entity_id, &t.event.as_str(), &json_text(&serde_json::json!({ "timer": t.name })), &now],
        )?;
        match t.every_ms {
            Some(every) if every > 0 => {
                let next = (t.due_at + every).max(now + 1);
                c.exec(
                    "UPDATE timers SET due_at = $3 WHERE entity_id = $1 AND name = $2",
                    &[&t.entity_id, &t.name, &next],
                )?;
            }
            _ => {
                c.exec("DELETE FROM timers WHERE entity_id = $1 AND name = $2", &[&t.entity_id, &t.name])?;
            }
        }
        refresh_due(c, t.entity_id, now, true)?;
    }
    Ok(())
}

/// An operator command (see sqlite.rs).
fn apply_command(
    c: &mut Conn,
    now: Millis,
    machine: &str,
    key: &str,
    command: Command,
    operation: Option<&OpenOperation>,
) -> Result<Applied, Fail> {
    let current = c.opt(
        "SELECT id, state, run_status, request_id FROM entities WHERE machine = $1 AND key = $2",
        &[&machine, &key],
    )?;
    let Some(current) = current else {
        return Err(Fail::Op(OpError::NotFound { machine: machine.to_string(), key: key.to_string() }));
    };
    let id: i64 = current.try_get(0).map_err(Failure::Pg)?;
    let state: String = current.try_get(1).map_err(Failure::Pg)?;
    let status: String = current.try_get(2).map_err(Failure::Pg)?;
    let entity_request: Option<String> = current.try_get(3).map_err(Failure::Pg)?;
    if let Some(op) = operation
        && let Some(operation_id) = open_operation(c, now, op, machine, key)?
    {
        return Ok(Applied::Replayed { operation_id });
    }
    if status == "killed" && command != Command::Kill {
        return Err(Fail::Op(OpError::Killed { machine: machine.to_string(), key: key.to_string() }));
    }
    match command {
        Command::Pause => {
            c.exec("UPDATE entities SET run_status = 'paused', sleep_until = NULL WHERE id = $1", &[&id])?;
        }
        Command::Resume => {
            c.exec(
                "UPDATE entities SET run_status = 'active', sleep_until = NULL, recent_errors = '[]',
                    auto_at = CASE WHEN auto_at IS NOT NULL AND $3::text IN ('fault', 'failed') THEN $2 ELSE auto_at END,
                    busy = auto_at IS NOT NULL OR EXISTS (SELECT 1 FROM agent_tasks t
                        WHERE t.entity_id = $1 AND t.status IN ('ready', 'leased'))
                 WHERE id = $1",
                &[&id, &now, &status],
            )?;
        }
        Command::Sleep { until } => {
            c.exec("UPDATE entities SET run_status = 'sleeping', sleep_until = $2 WHERE id = $1", &[&id, &until])?;
        }
        Command::Kill => {
            c.exec(
                "UPDATE entities SET run_status = 'killed', sleep_until = NULL, version = version + 1, busy = FALSE,
                    lease_owner = NULL, lease_until = NULL, auto_at = NULL, timer_at = NULL
                 WHERE id = $1",
                &[&id],
            )?;
        }
        Command::Release => {
            c.exec("UPDATE entities SET lease_owner = NULL, lease_until = NULL WHERE id = $1", &[&id])?;
        }
        Command::Retry => {
            c.exec(
                "UPDATE entities SET run_status = 'active', sleep_until = NULL,
                    auto_at = CASE WHEN auto_at IS NOT NULL THEN $2 ELSE auto_at END,
                    busy = auto_at IS NOT NULL OR EXISTS (SELECT 1 FROM agent_tasks t
                        WHERE t.entity_id = $1 AND t.status IN ('ready', 'leased'))
                 WHERE id = $1",
                &[&id, &now],
            )?;
        }
    }
    if command == Command::Retry {
        // A task waiting for its delay or backoff is offered now.
        c.exec("UPDATE agent_tasks SET available_at = $2 WHERE entity_id = $1 AND status = 'ready'", &[&id, &now])?;
    }
    let request_id = operation.map(|o| o.request_id.clone());
    if command == Command::Kill {
        let mut canceled: Vec<String> = c
            .query("SELECT DISTINCT request_id FROM inbox WHERE entity_id = $1 AND request_id IS NOT NULL", &[&id])?
            .iter()
            .map(|r| r.try_get(0))
            .collect::<Result<_, _>>()
            .map_err(Failure::Pg)?;
        canceled.extend(entity_request);
        c.exec("DELETE FROM inbox WHERE entity_id = $1", &[&id])?;
        c.exec("DELETE FROM timers WHERE entity_id = $1", &[&id])?;
        cancel_tasks(c, id, now)?;
        for r in &canceled {
            c.exec("UPDATE operations SET canceled = TRUE WHERE request_id = $1 AND ended_at IS NULL", &[r])?;
            complete_operation(c, r, now)?;
        }
    }
    c.exec(
        "INSERT INTO history (entity_id, from_state, to_state, kind, retry, request_id, at, detail)
         VALUES ($1, $2, NULL, 'command', 0, $3, $4, $5)",
        &[&id, &state, &request_id, &now, &command.as_str()],
    )?;
    refresh_due(c, id, now, false)?;
    if let Some(r) = &request_id {
        c.exec(
            "UPDATE operations SET first_response_at = $2, ended_at = $2, outcome = 'success'
             WHERE request_id = $1 AND ended_at IS NULL",
            &[r, &now],
        )?;
    }
    Ok(Applied::Commanded(select_entity(c, id)?))
}

fn apply_op(c: &mut Conn, now: Millis, op: &Op) -> Result<Applied, Fail> {
    match op {
        Op::Create(e) => insert_entity(c, now, e),
        Op::Push(p) => push_event(c, now, p),
        Op::Commit(cm) => apply_commit(c, now, cm),
        Op::Command { machine, key, command, operation } => {
            apply_command(c, now, machine, key, *command, operation.as_ref())
        }
        Op::MarkHung { before } => {
            let n = c.exec(
                "UPDATE operations SET outcome = 'hung'
                 WHERE ended_at IS NULL AND outcome IS NULL AND started_at < $1
                   AND NOT EXISTS (SELECT 1 FROM entities e WHERE e.request_id = operations.request_id
                                      AND e.busy AND e.entered_at >= $1)
                   AND NOT EXISTS (SELECT 1 FROM inbox i WHERE i.request_id = operations.request_id
                                      AND i.created_at >= $1)",
                &[before],
            )?;
            Ok(Applied::MarkedHung(n))
        }
        Op::Release(f) => {
            let n = c.exec(
                "UPDATE entities SET lease_owner = NULL, lease_until = NULL
                 WHERE id = $1 AND version = $2 AND lease_owner = $3",
                &[&f.entity_id, &f.version, &f.owner],
            )?;
            if n == 0 {
                return Err(Fail::Op(OpError::LeaseLost { entity_id: f.entity_id }));
            }
            refresh_due(c, f.entity_id, now, false)?;
            Ok(Applied::Released)
        }
        Op::TaskLease { queue, agent, limit, token_prefix } => {
            Ok(Applied::Leased(lease_tasks(c, now, queue, agent, *limit, token_prefix)?))
        }
        Op::TaskHeartbeat { task, token } => {
            let lock_ms = check_task(c, now, *task, token)?;
            let until = now + lock_ms;
            c.exec("UPDATE agent_tasks SET locked_until = $2, available_at = $2 WHERE id = $1", &[task, &until])?;
            Ok(Applied::Extended { locked_until: until })
        }
        Op::TaskReport { task, token, result } => {
            check_task(c, now, *task, token)?;
            let (outcome, error) = match result {
                TaskResult::Complete { .. } => ("complete", None),
                TaskResult::Fail { error, .. } => ("fail", Some(error.as_str())),
            };
            let row = c.one(
                "UPDATE agent_tasks t SET status = 'done', finished_at = $2, outcome = $3, error = $4
                 FROM entities e WHERE t.id = $1 AND e.id = t.entity_id
                 RETURNING e.machine, e.key, t.entity_version, t.attempt, t.leased_at, t.agent, t.request_id",
                &[task, &now, &outcome, &error],
            )?;
            let get = |e: postgres::Error| Fail::Db(Failure::Pg(e));
            let attempt: i64 = row.try_get(3).map_err(get)?;
            let report = AgentReport {
                task: *task,
                entity_version: row.try_get(2).map_err(get)?,
                attempt: attempt as u32,
                leased_at: row.try_get(4).map_err(get)?,
                agent: row.try_get(5).map_err(get)?,
                result: result.clone(),
            };
            let push = report_push(
                row.try_get(0).map_err(get)?,
                row.try_get(1).map_err(get)?,
                &report,
                row.try_get(6).map_err(get)?,
            );
            push_event(c, now, &push)
        }
        Op::Renew { ids, owner, until } => {
            let n = c.exec(
                "UPDATE entities SET lease_until = $3, due_at = $3 WHERE id = ANY($1) AND lease_owner = $2",
                &[ids, owner, until],
            )?;
            Ok(Applied::Renewed(n))
        }
    }
}

/// Whether other instances may have work because of this batch (wake them).
pub(crate) fn shares_work(batch: &Batch) -> bool {
    batch.ops.iter().any(|op| match op {
        Op::Create(_) | Op::Push(_) | Op::Command { .. } | Op::Release(_) => true,
        Op::Commit(c) => {
            !c.pushes.is_empty()
                || !c.creates.is_empty()
                || c.notify_predecessors
                || matches!(c.after, AfterCommit::Release)
        }
        // A report makes its entity due (whoever claims it); leases and heartbeats only
        // concern agents.
        Op::TaskReport { .. } => true,
        Op::MarkHung { .. } | Op::Renew { .. } | Op::TaskLease { .. } | Op::TaskHeartbeat { .. } => false,
    })
}

/// Writes an agent task for the entity's state entry `version` (see sqlite.rs).
#[allow(clippy::too_many_arguments)]
fn offer_task(
    c: &mut Conn,
    now: Millis,
    entity_id: i64,
    state: &str,
    version: i64,
    retry: u32,
    request_id: Option<&str>,
    o: &TaskOffer,
) -> R<()> {
    // The entity's row is locked by the commit (or was just inserted): one open task each.
    c.exec(
        "INSERT INTO agent_tasks (entity_id, queue, action, state, entity_version, retry, lock_ms, request_id,
            status, available_at, created_at)
         SELECT $1, $2, $3, $4, $5, $6, $7, $8, 'ready', $9, $10
         WHERE NOT EXISTS (SELECT 1 FROM agent_tasks WHERE entity_id = $1 AND status IN ('ready', 'leased'))",
        &[
            &entity_id,
            &o.queue,
            &o.action.as_str(),
            &state,
            &version,
            &i64::from(retry),
            &o.lock_ms,
            &request_id,
            &o.available_at,
            &now,
        ],
    )?;
    Ok(())
}

/// Cancels the entity's open tasks: their reports are refused from now on.
fn cancel_tasks(c: &mut Conn, entity_id: i64, now: Millis) -> R<()> {
    c.exec(
        "UPDATE agent_tasks SET status = 'canceled', outcome = 'canceled', finished_at = $2
         WHERE entity_id = $1 AND status IN ('ready', 'leased')",
        &[&entity_id, &now],
    )?;
    Ok(())
}

/// Leases available tasks of `queue`, skipping those another instance is leasing.
fn lease_tasks(
    c: &mut Conn,
    now: Millis,
    queue: &str,
    agent: &str,
    limit: usize,
    token_prefix: &str,
) -> R<Vec<AgentTask>> {
    let ids: Vec<i64> = c
        .query(
            "SELECT t.id FROM agent_tasks t JOIN entities e ON e.id = t.entity_id
             WHERE t.queue = $1 AND t.status IN ('ready', 'leased') AND t.available_at <= $2
               AND e.run_status = 'active'
             ORDER BY t.available_at, t.id LIMIT $3 FOR UPDATE OF t SKIP LOCKED",
            &[&queue, &now, &(limit as i64)],
        )?
        .iter()
        .map(|r| r.try_get(0))
        .collect::<Result<_, _>>()
        .map_err(Failure::Pg)?;
    let mut tasks = Vec::with_capacity(ids.len());
    for id in ids {
        c.exec(
            "UPDATE agent_tasks SET status = 'leased', attempt = attempt + 1, token = $2::text || id::text, agent = $3,
                leased_at = $4, locked_until = $4 + lock_ms, available_at = $4 + lock_ms
             WHERE id = $1",
            &[&id, &token_prefix, &agent, &now],
        )?;
        let row = c.one(
            &format!("SELECT {TASK_COLS} FROM agent_tasks t JOIN entities e ON e.id = t.entity_id WHERE t.id = $1"),
            &[&id],
        )?;
        tasks.push(task_from_row(&row)?);
    }
    Ok(tasks)
}

/// Checks that `token` holds task `task` now (locking the task row); answers its lock time.
fn check_task(c: &mut Conn, now: Millis, task: i64, token: &str) -> Result<i64, Fail> {
    let row = c.opt(
        "SELECT status, token, locked_until, lock_ms, attempt FROM agent_tasks WHERE id = $1 FOR UPDATE",
        &[&task],
    )?;
    let Some(row) = row else {
        return Err(Fail::Op(OpError::TaskRefused { task, reason: "no such task".into() }));
    };
    let get = |e: postgres::Error| Fail::Db(Failure::Pg(e));
    let status: String = row.try_get(0).map_err(get)?;
    let held: Option<String> = row.try_get(1).map_err(get)?;
    let locked_until: Option<i64> = row.try_get(2).map_err(get)?;
    let lock_ms: i64 = row.try_get(3).map_err(get)?;
    let attempt: i64 = row.try_get(4).map_err(get)?;
    match task_refusal(&status, held.as_deref(), locked_until, attempt as u32, token, now) {
        Some(reason) => Err(Fail::Op(OpError::TaskRefused { task, reason })),
        None => Ok(lock_ms),
    }
}

/// The body of a batch's transaction (the caller begins and commits it).
pub(crate) fn apply_batch(c: &mut Conn, batch: &Batch, wake: Option<(&str, &str)>) -> R<BatchResult> {
    let now = batch.now;
    let mut results = Vec::with_capacity(batch.ops.len());
    for op in &batch.ops {
        let savepoint = needs_savepoint(op);
        if savepoint {
            c.batch("SAVEPOINT op")?;
        }
        match apply_op(c, now, op) {
            Ok(applied) => {
                if savepoint {
                    c.batch("RELEASE SAVEPOINT op")?;
                }
                results.push(Ok(applied));
            }
            Err(Fail::Op(e)) => {
                if savepoint {
                    c.batch("ROLLBACK TO SAVEPOINT op; RELEASE SAVEPOINT op")?;
                }
                results.push(Err(e));
            }
            Err(Fail::Db(e)) => return Err(e),
        }
    }
    let mut claimed = Vec::new();
    if let Some(claim) = &batch.claim {
        fire_timers(c, now, 1_000)?;
        let until = now + claim.lease_ms;
        let limit = claim.limit as i64;
        let ids: Vec<i64> = c
            .query(
                "SELECT id FROM entities WHERE due_at <= $1 ORDER BY due_at LIMIT $2 FOR UPDATE SKIP LOCKED",
                &[&now, &limit],
            )?
            .iter()
            .map(|r| r.try_get(0))
            .collect::<Result<_, _>>()?;
        if !ids.is_empty() {
            let rows = c.query(
                &format!(
                    "UPDATE entities SET lease_owner = $2, lease_until = $3, due_at = $3, sleep_until = NULL,
                        run_status = CASE WHEN run_status IN ('sleeping', 'fault') THEN 'active' ELSE run_status END
                     WHERE id = ANY($1) RETURNING {ENTITY_COLS}"
                ),
                &[&ids, &claim.owner, &until],
            )?;
            let mut by_id = std::collections::HashMap::with_capacity(rows.len());
            for r in &rows {
                let e = entity_from_row(r)?;
                by_id.insert(e.id, e);
            }
            let mut heads = std::collections::HashMap::new();
            for r in c.query(
                "SELECT DISTINCT ON (entity_id) id, entity_id, event, params, request_id, created_at, kind
                 FROM inbox WHERE entity_id = ANY($1) ORDER BY entity_id, id",
                &[&ids],
            )? {
                let item = inbox_from_row(&r)?;
                heads.insert(item.entity_id, item);
            }
            for id in ids {
                if let Some(entity) = by_id.remove(&id) {
                    let inbox_head = heads.remove(&id);
                    claimed.push(Claimed { entity, inbox_head });
                }
            }
        }
    }
    let next_due: Option<Millis> =
        c.one("SELECT MIN(due_at) FROM entities WHERE due_at IS NOT NULL", &[])?.try_get(0)?;
    if let Some((channel, me)) = wake
        && shares_work(batch)
    {
        c.exec("SELECT pg_notify($1, $2)", &[&channel, &me])?;
    }
    Ok(BatchResult { results, claimed, next_due })
}

/// Moves entities of `machine` from old to new state names (see `Store::machine_migrate`).
pub(crate) fn migrate_states(
    c: &mut Conn,
    machine: &str,
    moves: &[(String, String)],
    hash: &str,
    now: Millis,
) -> R<u64> {
    let mut moved = 0;
    for (old, new) in moves {
        c.exec(
            "INSERT INTO history (entity_id, from_state, to_state, kind, retry, at, detail, machine_hash)
             SELECT id, state, $3, 'command', 0, $4, 'upgrade: state renamed', $5
             FROM entities WHERE machine = $1 AND state = $2",
            &[&machine, old, new, &now, &hash],
        )?;
        // A renamed state keeps its open agent task, fenced by the entity's new version.
        c.exec(
            "UPDATE agent_tasks SET state = $3, entity_version = entity_version + 1
             WHERE status IN ('ready', 'leased')
               AND entity_id IN (SELECT id FROM entities WHERE machine = $1 AND state = $2)",
            &[&machine, old, new],
        )?;
        moved += c.exec(
            "UPDATE entities SET state = $3, version = version + 1, machine_hash = $4 WHERE machine = $1 AND state = $2",
            &[&machine, old, new, &hash],
        )?;
    }
    Ok(moved)
}

/// Drops every lease (see `Store::lease_release_all`).
pub(crate) fn release_all(c: &mut Conn, now: Millis) -> R<u64> {
    let ids: Vec<i64> = c
        .query(
            "UPDATE entities SET lease_owner = NULL, lease_until = NULL WHERE lease_owner IS NOT NULL RETURNING id",
            &[],
        )?
        .iter()
        .map(|r| r.try_get(0))
        .collect::<Result<_, _>>()?;
    for &id in &ids {
        refresh_due(c, id, now, false)?;
    }
    if !ids.is_empty() {
        c.exec("UPDATE operations SET restart_count = restart_count + 1 WHERE ended_at IS NULL", &[])?;
    }
    Ok(ids.len() as u64)
}
