//! The SQLite store's writes outside the plan's row sets: the operations applied alone, in
//! batch order (operator commands, agent task lease, heartbeat and report, renewals, hung
//! operations), and the batch's finish (timers fired, due entities claimed, the next due
//! time); definition upgrades and lease reclaiming.

use rusqlite::{Connection, OptionalExtension, params};

use super::read::{INBOX_COLS, entity_from_row, inbox_from_row, task_from_row, timer_from_row};
use crate::plan::Other;
use crate::sql::{ENTITY_COLS, TASK_COLS, json_text};
use crate::{AgentReport, AgentTask, Applied, Claim, Claimed, Command, Millis, Op, OpError, OpenOperation, TimerRow};

/// When an entity is next due, from its current columns: never while paused, parked or
/// killed; at the end of a sleep or backoff; at its lease expiry while leased; now if its
/// inbox holds events; else at its auto action or first timer. Named parameter: `:now`.
const DUE_EXPR: &str = "CASE
    WHEN run_status IN ('paused', 'failed', 'killed') THEN NULL
    WHEN run_status IN ('sleeping', 'fault') THEN sleep_until
    WHEN lease_owner IS NOT NULL THEN lease_until
    WHEN EXISTS (SELECT 1 FROM inbox i WHERE i.entity_id = entities.id) THEN :now
    WHEN auto_at IS NULL THEN timer_at
    WHEN timer_at IS NULL THEN auto_at
    ELSE MIN(auto_at, timer_at) END";

/// Drops every lease; those entities become due (see `Store::lease_release_all`).
pub(crate) fn release_all(tx: &Connection, now: Millis) -> rusqlite::Result<u64> {
    let ids: Vec<i64> = tx
        .prepare(
            // A leased entity is due (at its lease's end, or its sleep's) unless paused or
            // parked: the two partial indexes find every one without reading the fleet at
            // rest (a full scan took ~100 ms at a million entities, at every start).
            "UPDATE entities SET lease_owner = NULL, lease_until = NULL WHERE id IN (
                 SELECT id FROM entities WHERE due_at IS NOT NULL AND lease_owner IS NOT NULL
                 UNION ALL
                 SELECT id FROM entities WHERE run_status <> 'active' AND lease_owner IS NOT NULL)
             RETURNING id",
        )
        .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())?;
    for &id in &ids {
        refresh_due(tx, id, now, false)?;
    }
    // A previous engine died with work in flight: the open operations live on through
    // this restart.
    if !ids.is_empty() {
        tx.execute("UPDATE operations SET restart_count = restart_count + 1 WHERE ended_at IS NULL", [])?;
    }
    Ok(ids.len() as u64)
}

/// Why an operation applied alone stopped: its own failure (rolled back alone) or the
/// database's.
pub(super) enum Fail {
    Op(OpError),
    Db(rusqlite::Error),
}

impl From<rusqlite::Error> for Fail {
    fn from(e: rusqlite::Error) -> Self {
        Fail::Db(e)
    }
}

/// Opens an operation; `Some(id)` of the existing one if its request id was seen before.
fn open_operation(
    tx: &Connection,
    now: Millis,
    op: &OpenOperation,
    machine: &str,
    key: &str,
) -> rusqlite::Result<Option<i64>> {
    let inserted = tx
        .prepare_cached(
            "INSERT INTO operations (request_id, name, machine, entity_key, started_at, dimensions)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT (request_id) DO NOTHING",
        )?
        .execute(params![op.request_id, op.name, machine, key, now, json_text(&op.dimensions)])?;
    if inserted == 1 {
        return Ok(None);
    }
    tx.prepare_cached("SELECT id FROM operations WHERE request_id = ?1")?
        .query_row([&op.request_id], |r| r.get(0))
        .map(Some)
}

/// Ends the operation `request_id` if nothing it reached is still busy or queued.
pub(super) fn complete_operation(tx: &Connection, request_id: &str, now: Millis) -> rusqlite::Result<()> {
    tx.prepare_cached(
        "UPDATE operations SET ended_at = ?2,
            outcome = CASE WHEN canceled = 1 THEN 'canceled' WHEN error_seen = 1 THEN 'failed' ELSE 'success' END
         WHERE request_id = ?1 AND ended_at IS NULL
           AND NOT EXISTS (SELECT 1 FROM entities WHERE request_id = ?1 AND busy = 1)
           AND NOT EXISTS (SELECT 1 FROM inbox WHERE request_id = ?1)",
    )?
    .execute(params![request_id, now])?;
    Ok(())
}

/// Recomputes an entity's due time (and, when its timers changed, its timer time).
fn refresh_due(tx: &Connection, id: i64, now: Millis, timers_changed: bool) -> rusqlite::Result<()> {
    if timers_changed {
        tx.prepare_cached(
            "UPDATE entities SET timer_at = (SELECT MIN(due_at) FROM timers WHERE entity_id = ?1) WHERE id = ?1",
        )?
        .execute([id])?;
    }
    tx.prepare_cached(&format!("UPDATE entities SET due_at = {DUE_EXPR} WHERE id = :id"))?
        .execute(rusqlite::named_params! {":id": id, ":now": now})?;
    Ok(())
}

/// Turns due timers of active entities into inbox events (one-shot timers are deleted,
/// periodic ones rescheduled) in the claiming transaction; the params name the timer. A
/// paused or sleeping entity's timers wait.
pub(super) fn fire_timers(tx: &Connection, now: Millis, limit: usize) -> rusqlite::Result<()> {
    let due: Vec<TimerRow> = tx
        .prepare_cached(
            "SELECT t.entity_id, t.name, t.event, t.due_at, t.every_ms FROM timers t JOIN entities e ON e.id = t.entity_id
             WHERE t.due_at <= ?1 AND e.run_status = 'active' ORDER BY t.due_at LIMIT ?2",
        )?
        .query_map(params![now, limit as i64], timer_from_row)?
        .collect::<rusqlite::Result<_>>()?;
    for t in &due {
        tx.prepare_cached(
            "INSERT INTO inbox (entity_id, event, params, request_id, kind, created_at)
             VALUES (?1, ?2, ?3, NULL, 'timer', ?4)",
        )?
        .execute(params![
            t.entity_id,
            t.event.as_str(),
            json_text(&serde_json::json!({ "timer": t.name })),
            now
        ])?;
        match t.every_ms {
            Some(every) if every > 0 => {
                let next = (t.due_at + every).max(now + 1);
                tx.prepare_cached("UPDATE timers SET due_at = ?3 WHERE entity_id = ?1 AND name = ?2")?
                    .execute(params![t.entity_id, t.name, next])?;
            }
            _ => {
                tx.prepare_cached("DELETE FROM timers WHERE entity_id = ?1 AND name = ?2")?
                    .execute(params![t.entity_id, t.name])?;
            }
        }
        refresh_due(tx, t.entity_id, now, true)?;
    }
    Ok(())
}

/// An operator command. Kill bumps the version (any commit in flight is refused) and
/// cancels queued events and timers; release drops the lease; the others set the run
/// status. Recorded in history; the entity's due time follows its new status.
fn apply_command(
    tx: &Connection,
    now: Millis,
    machine: &str,
    key: &str,
    command: Command,
    operation: Option<&OpenOperation>,
) -> Result<Applied, Fail> {
    let current: Option<(i64, String, String, Option<String>)> = tx
        .prepare_cached("SELECT id, state, run_status, request_id FROM entities WHERE machine = ?1 AND key = ?2")?
        .query_row(params![machine, key], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .optional()?;
    let Some((id, state, status, entity_request)) = current else {
        return Err(Fail::Op(OpError::NotFound { machine: machine.to_string(), key: key.to_string() }));
    };
    if let Some(op) = operation
        && let Some(operation_id) = open_operation(tx, now, op, machine, key)?
    {
        return Ok(Applied::Replayed { operation_id });
    }
    if status == "killed" && command != Command::Kill {
        return Err(Fail::Op(OpError::Killed { machine: machine.to_string(), key: key.to_string() }));
    }
    let sql = match command {
        Command::Pause => "UPDATE entities SET run_status = 'paused', sleep_until = NULL WHERE id = ?1",
        Command::Resume => {
            "UPDATE entities SET run_status = 'active', sleep_until = NULL, recent_errors = '[]',
                auto_at = CASE WHEN auto_at IS NOT NULL AND ?3 IN ('fault', 'failed') THEN ?2 ELSE auto_at END,
                busy = auto_at IS NOT NULL OR EXISTS (SELECT 1 FROM agent_tasks t
                    WHERE t.entity_id = ?1 AND t.status IN ('ready', 'leased'))
             WHERE id = ?1"
        }
        Command::Sleep { .. } => "UPDATE entities SET run_status = 'sleeping', sleep_until = ?4 WHERE id = ?1",
        Command::Kill => {
            "UPDATE entities SET run_status = 'killed', sleep_until = NULL, version = version + 1, busy = 0,
                lease_owner = NULL, lease_until = NULL, auto_at = NULL, timer_at = NULL
             WHERE id = ?1"
        }
        Command::Release => "UPDATE entities SET lease_owner = NULL, lease_until = NULL WHERE id = ?1",
        Command::Retry => {
            "UPDATE entities SET run_status = 'active', sleep_until = NULL,
                auto_at = CASE WHEN auto_at IS NOT NULL THEN ?2 ELSE auto_at END,
                busy = auto_at IS NOT NULL OR EXISTS (SELECT 1 FROM agent_tasks t
                    WHERE t.entity_id = ?1 AND t.status IN ('ready', 'leased'))
             WHERE id = ?1"
        }
    };
    let until = match command {
        Command::Sleep { until } => Some(until),
        _ => None,
    };
    let (p3, p4) = (status.as_str(), until);
    match command {
        Command::Resume => tx.prepare_cached(sql)?.execute(params![id, now, p3])?,
        Command::Sleep { .. } => tx.prepare_cached(sql)?.execute(params![id, now, p3, p4])?,
        Command::Retry => tx.prepare_cached(sql)?.execute(params![id, now])?,
        _ => tx.prepare_cached(sql)?.execute(params![id])?,
    };
    if command == Command::Retry {
        // A task waiting for its delay or backoff is offered now.
        tx.prepare_cached("UPDATE agent_tasks SET available_at = ?2 WHERE entity_id = ?1 AND status = 'ready'")?
            .execute(params![id, now])?;
    }
    let request_id = operation.map(|o| o.request_id.clone());
    if command == Command::Kill {
        // Cancel pending work; the operations it belonged to end as canceled.
        let mut canceled: Vec<String> = tx
            .prepare_cached("SELECT DISTINCT request_id FROM inbox WHERE entity_id = ?1 AND request_id IS NOT NULL")?
            .query_map([id], |r| r.get(0))?
            .collect::<rusqlite::Result<_>>()?;
        canceled.extend(entity_request);
        tx.prepare_cached("DELETE FROM inbox WHERE entity_id = ?1")?.execute([id])?;
        tx.prepare_cached("DELETE FROM timers WHERE entity_id = ?1")?.execute([id])?;
        cancel_tasks(tx, id, now)?;
        for r in &canceled {
            tx.prepare_cached("UPDATE operations SET canceled = 1 WHERE request_id = ?1 AND ended_at IS NULL")?
                .execute([r])?;
            complete_operation(tx, r, now)?;
        }
    }
    tx.prepare_cached(
        "INSERT INTO history (entity_id, from_state, to_state, kind, retry, request_id, at, detail)
         VALUES (?1, ?2, NULL, 'command', 0, ?3, ?4, ?5)",
    )?
    .execute(params![id, state, request_id, now, command.as_str()])?;
    refresh_due(tx, id, now, false)?;
    if let Some(r) = &request_id {
        // A command is done when it is applied.
        tx.prepare_cached(
            "UPDATE operations SET first_response_at = ?2, ended_at = ?2, outcome = 'success'
             WHERE request_id = ?1 AND ended_at IS NULL",
        )?
        .execute(params![r, now])?;
    }
    let row = tx
        .prepare_cached(&format!("SELECT {ENTITY_COLS} FROM entities WHERE id = ?1"))?
        .query_row([id], entity_from_row)?;
    Ok(Applied::Commanded(row))
}

/// Cancels the entity's open tasks (it left the state, or was killed): their reports
/// are refused from now on.
pub(super) fn cancel_tasks(tx: &Connection, entity_id: i64, now: Millis) -> rusqlite::Result<()> {
    tx.prepare_cached(
        "UPDATE agent_tasks SET status = 'canceled', outcome = 'canceled', finished_at = ?2
         WHERE entity_id = ?1 AND status IN ('ready', 'leased')",
    )?
    .execute(params![entity_id, now])?;
    Ok(())
}

fn lease_tasks(
    tx: &Connection,
    now: Millis,
    queue: &str,
    agent: &str,
    limit: usize,
    token_prefix: &str,
) -> rusqlite::Result<Vec<AgentTask>> {
    let ids: Vec<i64> = tx
        .prepare_cached(
            "SELECT t.id FROM agent_tasks t JOIN entities e ON e.id = t.entity_id
             WHERE t.queue = ?1 AND t.status IN ('ready', 'leased') AND t.available_at <= ?2 AND e.run_status = 'active'
             ORDER BY t.available_at, t.id LIMIT ?3",
        )?
        .query_map(params![queue, now, limit as i64], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    let mut tasks = Vec::with_capacity(ids.len());
    for id in ids {
        tx.prepare_cached(
            "UPDATE agent_tasks SET status = 'leased', attempt = attempt + 1, token = ?2 || id, agent = ?3,
                leased_at = ?4, locked_until = ?4 + lock_ms, available_at = ?4 + lock_ms
             WHERE id = ?1",
        )?
        .execute(params![id, token_prefix, agent, now])?;
        tasks.push(
            tx.prepare_cached(&format!(
                "SELECT {TASK_COLS} FROM agent_tasks t JOIN entities e ON e.id = t.entity_id WHERE t.id = ?1"
            ))?
            .query_row([id], task_from_row)?,
        );
    }
    Ok(tasks)
}

/// Checks that `token` holds task `task` now ([`crate::task::lease`]; `report`: for a
/// report): its lock time, `None` for a replayed report, or why not.
fn check_task(tx: &Connection, now: Millis, task: i64, token: &str, report: bool) -> Result<Option<i64>, Fail> {
    type Lease = (String, Option<String>, Option<i64>, i64, u32);
    let row: Option<Lease> = tx
        .prepare_cached("SELECT status, token, locked_until, lock_ms, attempt FROM agent_tasks WHERE id = ?1")?
        .query_row([task], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)))
        .optional()?;
    let Some((status, held, locked_until, lock_ms, attempt)) = row else {
        return Err(Fail::Op(OpError::TaskRefused { task, reason: "no such task".into() }));
    };
    match crate::task::lease(&status, held.as_deref(), locked_until, attempt, token, now, report) {
        crate::task::Lease::Held => Ok(Some(lock_ms)),
        crate::task::Lease::Replay => Ok(None),
        crate::task::Lease::Refused(reason) => Err(Fail::Op(OpError::TaskRefused { task, reason })),
    }
}

/// An operation applied alone (see [`Dialect::other`](crate::plan::Dialect::other)).
pub(super) fn apply_other(tx: &Connection, now: Millis, op: &Op) -> Result<Other, Fail> {
    let applied = match op {
        Op::Command { machine, key, command, operation } => {
            apply_command(tx, now, machine, key, *command, operation.as_ref())?
        }
        Op::MarkHung { before } => {
            // No progress since `before`: nothing it reached entered a state (or retried)
            // since, and no event of it was queued since.
            let n = tx
                .prepare_cached(
                    "UPDATE operations SET outcome = 'hung'
                     WHERE ended_at IS NULL AND outcome IS NULL AND started_at < ?1
                       AND NOT EXISTS (SELECT 1 FROM entities e WHERE e.request_id = operations.request_id
                                          AND e.busy = 1 AND e.entered_at >= ?1)
                       AND NOT EXISTS (SELECT 1 FROM inbox i WHERE i.request_id = operations.request_id
                                          AND i.created_at >= ?1)",
                )?
                .execute([before])?;
            Applied::MarkedHung(n as u64)
        }
        Op::TaskLease { queue, agent, limit, token_prefix } => {
            Applied::Leased(lease_tasks(tx, now, queue, agent, *limit, token_prefix)?)
        }
        Op::TaskHeartbeat { task, token } => {
            let lock_ms = check_task(tx, now, *task, token, false)?.expect("a heartbeat is never a replay");
            let until = now + lock_ms;
            tx.prepare_cached("UPDATE agent_tasks SET locked_until = ?2, available_at = ?2 WHERE id = ?1")?
                .execute(params![task, until])?;
            Applied::Extended { locked_until: until }
        }
        Op::TaskReport { task, token, result } => {
            if check_task(tx, now, *task, token, true)?.is_none() {
                return Ok(Other::Applied(Applied::ReportReplayed { task: *task }));
            }
            let (outcome, error) = result.outcome();
            tx.prepare_cached(
                "UPDATE agent_tasks SET status = 'done', finished_at = ?2, outcome = ?3, error = ?4 WHERE id = ?1",
            )?
            .execute(params![task, now, outcome, error])?;
            let push = tx
                .prepare_cached(
                    "SELECT e.machine, e.key, t.entity_version, t.attempt, t.leased_at, t.agent, t.request_id
                     FROM agent_tasks t JOIN entities e ON e.id = t.entity_id WHERE t.id = ?1",
                )?
                .query_row([task], |r| {
                    let report = AgentReport {
                        task: *task,
                        entity_version: r.get(2)?,
                        attempt: r.get(3)?,
                        leased_at: r.get(4)?,
                        agent: r.get(5)?,
                        result: result.clone(),
                    };
                    Ok(report.push(r.get(0)?, r.get(1)?, r.get(6)?))
                })?;
            return Ok(Other::Push(push));
        }
        Op::Renew { ids, owner, until } => {
            let mut stmt = tx.prepare_cached(
                "UPDATE entities SET lease_until = ?3, due_at = ?3 WHERE id = ?1 AND lease_owner = ?2",
            )?;
            let mut n = 0;
            for id in ids {
                n += stmt.execute(params![id, owner, until])? as u64;
            }
            Applied::Renewed(n)
        }
        other => unreachable!("a plan operation is not applied alone: {other:?}"),
    };
    Ok(Other::Applied(applied))
}

/// Leases up to `claim.limit` due entities (oldest due first) to the claiming engine, with
/// the first event of each one's inbox.
pub(super) fn claim_due(tx: &Connection, now: Millis, claim: &Claim) -> rusqlite::Result<Vec<Claimed>> {
    let until = now + claim.lease_ms;
    let ids: Vec<i64> = if claim.machines.is_empty() {
        tx.prepare_cached("SELECT id FROM entities WHERE due_at <= ?1 ORDER BY due_at LIMIT ?2")?
            .query_map(params![now, claim.limit as i64], |r| r.get(0))?
            .collect::<rusqlite::Result<_>>()?
    } else {
        tx.prepare_cached(
            // Walk the due index, not the (machine, key) one, which would visit every
            // entity of the machines.
            "SELECT id FROM entities INDEXED BY entities_due
             WHERE due_at <= ?1 AND machine IN (SELECT value FROM json_each(?3))
             ORDER BY due_at LIMIT ?2",
        )?
        .query_map(params![now, claim.limit as i64, json_text(&claim.machines)], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?
    };
    let mut claimed = Vec::with_capacity(ids.len());
    let mut update = tx.prepare_cached(
        // A sleeping or backing-off entity that comes due wakes up: it is active again.
        "UPDATE entities SET lease_owner = ?2, lease_until = ?3, due_at = ?3, sleep_until = NULL,
            run_status = CASE WHEN run_status IN ('sleeping', 'fault') THEN 'active' ELSE run_status END
         WHERE id = ?1",
    )?;
    let mut select = tx.prepare_cached(&format!("SELECT {ENTITY_COLS} FROM entities WHERE id = ?1"))?;
    let mut head =
        tx.prepare_cached(&format!("SELECT {INBOX_COLS} FROM inbox WHERE entity_id = ?1 ORDER BY id LIMIT 1"))?;
    for id in ids {
        update.execute(params![id, claim.owner, until])?;
        let entity = select.query_row([id], entity_from_row)?;
        let inbox_head = head.query_row([id], inbox_from_row).optional()?;
        claimed.push(Claimed { entity, inbox_head });
    }
    Ok(claimed)
}

/// The earliest due time left, among the entities of `machines` (empty: all).
pub(super) fn next_due_of(tx: &Connection, machines: &[String]) -> rusqlite::Result<Option<Millis>> {
    if machines.is_empty() {
        tx.prepare_cached("SELECT MIN(due_at) FROM entities WHERE due_at IS NOT NULL")?.query_row([], |r| r.get(0))
    } else {
        tx.prepare_cached(
            "SELECT MIN(due_at) FROM entities INDEXED BY entities_due WHERE due_at IS NOT NULL
                   AND machine IN (SELECT value FROM json_each(?1))",
        )?
        .query_row([json_text(&machines)], |r| r.get(0))
    }
}

/// Moves entities of `machine` from old to new state names (see `Store::machine_migrate`).
pub(super) fn migrate_states(
    tx: &Connection,
    machine: &str,
    moves: &[(String, String)],
    hash: &str,
    now: Millis,
) -> rusqlite::Result<u64> {
    let mut moved = 0;
    for (old, new) in moves {
        tx.execute(
            "INSERT INTO history (entity_id, from_state, to_state, kind, retry, at, detail, machine_hash)
             SELECT id, state, ?3, 'command', 0, ?4, 'upgrade: state renamed', ?5
             FROM entities WHERE machine = ?1 AND state = ?2",
            params![machine, old, new, now, hash],
        )?;
        // A renamed state keeps its open agent task, fenced by the entity's new version.
        tx.execute(
            "UPDATE agent_tasks SET state = ?3, entity_version = entity_version + 1
             WHERE status IN ('ready', 'leased')
               AND entity_id IN (SELECT id FROM entities WHERE machine = ?1 AND state = ?2)",
            params![machine, old, new],
        )?;
        moved += tx.execute(
            "UPDATE entities SET state = ?3, version = version + 1, machine_hash = ?4
             WHERE machine = ?1 AND state = ?2",
            params![machine, old, new, hash],
        )? as u64;
    }
    Ok(moved)
}
