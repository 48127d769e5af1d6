//! The PostgreSQL store's writes outside the batch plan: operator commands, agent task
//! operations, renewals and hung operations (each applied alone, in batch order),
//! definition upgrades and lease reclaiming. The plan's set-based writes (and timer firing)
//! are in `dialect.rs`.

use super::conn::Failure;
use super::read::{entity_from_row, task_from_row};
use super::writer::WriterConn as Conn;
use crate::plan::Other;
use crate::sql::{ENTITY_COLS, TASK_COLS, json_text};
use crate::{AgentReport, AgentTask, Applied, Command, EntityRow, Millis, Op, OpError, OpenOperation};

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

/// When an entity is next due, from its current columns (`$2`: now); see `sqlite/write.rs`.
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

/// An operator command (see `sqlite/write.rs`).
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
        cancel_tasks_of(c, &[id], now)?;
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

/// An operation applied alone (see [`Dialect::other`](crate::plan::Dialect::other)).
pub(crate) fn apply_other(c: &mut Conn, now: Millis, op: &Op) -> Result<Other, Fail> {
    let applied = match op {
        Op::Command { machine, key, command, operation } => {
            apply_command(c, now, machine, key, *command, operation.as_ref())?
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
            Applied::MarkedHung(n)
        }
        Op::TaskLease { queue, agent, limit, token_prefix } => {
            Applied::Leased(lease_tasks(c, now, queue, agent, *limit, token_prefix)?)
        }
        Op::TaskHeartbeat { task, token } => {
            let lock_ms = check_task(c, now, *task, token, false)?.expect("a heartbeat is never a replay");
            let until = now + lock_ms;
            c.exec("UPDATE agent_tasks SET locked_until = $2, available_at = $2 WHERE id = $1", &[task, &until])?;
            Applied::Extended { locked_until: until }
        }
        Op::TaskReport { task, token, result } => {
            if check_task(c, now, *task, token, true)?.is_none() {
                return Ok(Other::Applied(Applied::ReportReplayed { task: *task }));
            }
            let (outcome, error) = result.outcome();
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
            let push =
                report.push(row.try_get(0).map_err(get)?, row.try_get(1).map_err(get)?, row.try_get(6).map_err(get)?);
            return Ok(Other::Push(push));
        }
        Op::Renew { ids, owner, until } => {
            // Rows another instance has locked this moment (it is pushing an event to one)
            // are skipped: waiting for them while this batch holds other rows could close a
            // cycle of waits, and their leases have two thirds left; the next renewal takes
            // them.
            let n = c.exec(
                "UPDATE entities SET lease_until = $3, due_at = $3
                 WHERE id IN (SELECT id FROM entities WHERE id = ANY($1) AND lease_owner = $2
                              FOR NO KEY UPDATE SKIP LOCKED)",
                &[ids, owner, until],
            )?;
            Applied::Renewed(n)
        }
        other => unreachable!("a plan operation is not applied alone: {other:?}"),
    };
    Ok(Other::Applied(applied))
}

/// Cancels the open tasks of these entities: their reports are refused from now on.
pub(crate) fn cancel_tasks_of(c: &mut Conn, entities: &[i64], now: Millis) -> R<()> {
    c.exec(
        "UPDATE agent_tasks SET status = 'canceled', outcome = 'canceled', finished_at = $2
         WHERE entity_id = ANY($1::bigint[]) AND status IN ('ready', 'leased')",
        &[&entities, &now],
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

/// Checks that `token` holds task `task` now (locking the task row;
/// [`crate::task::lease`]; `report`: for a report): its lock time, `None` for a replayed
/// report, or why not.
fn check_task(c: &mut Conn, now: Millis, task: i64, token: &str, report: bool) -> Result<Option<i64>, Fail> {
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
    match crate::task::lease(&status, held.as_deref(), locked_until, attempt as u32, token, now, report) {
        crate::task::Lease::Held => Ok(Some(lock_ms)),
        crate::task::Lease::Replay => Ok(None),
        crate::task::Lease::Refused(reason) => Err(Fail::Op(OpError::TaskRefused { task, reason })),
    }
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
