//! The read side (reports, listings) of the PostgreSQL store; rows are decoded by `crate::decode`.

use postgres::Row;
use settle_core::{ActionName, EventName, StateName};

use super::conn::{Conn, Failure};
use crate::sql::{ENTITY_COLS, EVENT_COLS, OPERATION_COLS, TASK_COLS};
use crate::{
    AgentTask, EntityCount, EntityFilter, EntityRow, ErrorStats, EventRow, HistoryKind, HistoryRow, InboxItem,
    MachineRecord, MetricsSnapshot, Millis, MinuteCount, OperationRow, OperationStats, Overview, RunStatus, Stats,
    SuccessorSnapshot, TaskFilter, TimerRow, TransitionCount, TransitionStats, percentile,
};

type R<T> = std::result::Result<T, Failure>;

pub(crate) fn count(r: &Row, col: usize) -> R<u64> {
    Ok(r.try_get::<_, i64>(col)?.max(0) as u64)
}

fn small(r: &Row, col: usize) -> R<u32> {
    Ok(r.try_get::<_, i64>(col)?.clamp(0, u32::MAX as i64) as u32)
}

pub(crate) fn entity_from_row(r: &Row) -> R<EntityRow> {
    entity_from_row_at(r, 0)
}

/// An entity whose columns ([`ENTITY_COLS`]) start at column `at` of the row.
pub(crate) fn entity_from_row_at(r: &Row, at: usize) -> R<EntityRow> {
    crate::decode::entity(&crate::decode::At(r, at))
}

pub(crate) fn inbox_from_row(r: &Row) -> R<InboxItem> {
    inbox_from_row_at(r, 0)
}

/// An inbox item whose columns start at column `at` of the row.
pub(crate) fn inbox_from_row_at(r: &Row, at: usize) -> R<InboxItem> {
    crate::decode::inbox(&crate::decode::At(r, at))
}

pub(crate) fn task_from_row(r: &Row) -> R<AgentTask> {
    crate::decode::task(r)
}

pub(crate) fn task_list(c: &mut Conn, f: &TaskFilter) -> R<Vec<AgentTask>> {
    // Only the filters given, so that a lookup by id or entity uses its index (the
    // statement is built from fixed fragments; values are bound).
    let mut sql = format!("SELECT {TASK_COLS} FROM agent_tasks t JOIN entities e ON e.id = t.entity_id WHERE TRUE");
    let mut params: Vec<&(dyn postgres::types::ToSql + Sync)> = Vec::new();
    if let Some(id) = &f.id {
        params.push(id);
        sql.push_str(&format!(" AND t.id = ${}", params.len()));
    }
    if let Some(entity) = &f.entity_id {
        params.push(entity);
        sql.push_str(&format!(" AND t.entity_id = ${}", params.len()));
    }
    if let Some(queue) = &f.queue {
        params.push(queue);
        sql.push_str(&format!(" AND t.queue = ${}", params.len()));
    }
    if f.open_only {
        sql.push_str(" AND t.status IN ('ready', 'leased')");
    }
    let limit = f.limit.map(|l| l.min(i64::MAX as u64) as i64);
    params.push(&limit);
    sql.push_str(&format!(" ORDER BY t.id DESC LIMIT ${}", params.len()));
    let rows = c.query(&sql, &params)?;
    all(rows, task_from_row)
}

pub(crate) fn history_from_row(r: &Row) -> R<HistoryRow> {
    let kind: &str = r.try_get(4)?;
    Ok(HistoryRow {
        id: r.try_get(0)?,
        entity_id: r.try_get(1)?,
        from: r.try_get::<_, Option<&str>>(2)?.map(StateName::from),
        to: r.try_get::<_, Option<&str>>(3)?.map(StateName::from),
        kind: HistoryKind::parse(kind).ok_or_else(|| Failure::Corrupt(format!("unknown history kind `{kind}`")))?,
        action: r.try_get::<_, Option<&str>>(5)?.map(ActionName::from),
        event: r.try_get::<_, Option<&str>>(6)?.map(EventName::from),
        retry: small(r, 7)?,
        request_id: r.try_get(8)?,
        at: r.try_get(9)?,
        detail: r.try_get(10)?,
    })
}

pub(crate) fn operation_from_row(r: &Row) -> R<OperationRow> {
    crate::decode::operation(r)
}

pub(crate) fn timer_from_row(r: &Row) -> R<TimerRow> {
    crate::decode::timer(r)
}

pub(crate) fn all<T>(rows: Vec<Row>, f: impl Fn(&Row) -> R<T>) -> R<Vec<T>> {
    rows.iter().map(f).collect()
}

pub(crate) fn entity_get(c: &mut Conn, machine: &str, key: &str) -> R<Option<EntityRow>> {
    c.opt(&format!("SELECT {ENTITY_COLS} FROM entities WHERE machine = $1 AND key = $2"), &[&machine, &key])?
        .map(|r| entity_from_row(&r))
        .transpose()
}

pub(crate) fn entity_list(c: &mut Conn, f: &EntityFilter) -> R<Vec<EntityRow>> {
    let present = present(c, f)?;
    let Some((sql, params)) = crate::page::page_sql(f, &present, true) else {
        return Ok(Vec::new());
    };
    let values = values(params);
    let refs: Vec<&(dyn postgres::types::ToSql + Sync)> = values.iter().map(|v| v.as_ref()).collect();
    all(c.query(&sql, &refs)?, entity_from_row)
}

pub(crate) fn entity_count_by_state(c: &mut Conn, machine: &str) -> R<Vec<(String, u64)>> {
    let rows =
        c.query("SELECT state, COUNT(*) FROM entities WHERE machine = $1 GROUP BY state ORDER BY state", &[&machine])?;
    all(rows, |r| Ok((r.try_get(0)?, count(r, 1)?)))
}

pub(crate) fn entity_count_pending(c: &mut Conn) -> R<u64> {
    count(&c.one("SELECT COUNT(*) FROM entities WHERE due_at IS NOT NULL", &[])?, 0)
}

pub(crate) fn history_list(c: &mut Conn, entity_id: i64) -> R<Vec<HistoryRow>> {
    let rows = c.query(
        "SELECT id, entity_id, from_state, to_state, kind, action, event, retry, request_id, at, detail
         FROM history WHERE entity_id = $1 ORDER BY id",
        &[&entity_id],
    )?;
    all(rows, history_from_row)
}

/// The successors and the newest notice, holding the subscriber's row `FOR UPDATE`: every
/// notice up to the newest one read is committed (see `write::notify_predecessors`).
pub(crate) fn successor_snapshot(c: &mut Conn, entity_id: i64) -> R<SuccessorSnapshot> {
    c.batch("BEGIN")?;
    c.query("SELECT 1 FROM entities WHERE id = $1 FOR UPDATE", &[&entity_id])?;
    let newest_notice: Option<i64> =
        c.one("SELECT MAX(id) FROM inbox WHERE entity_id = $1 AND kind = 'notice'", &[&entity_id])?.try_get(0)?;
    let successors = related(c, "successor_id", "predecessor_id", entity_id)?;
    c.batch("COMMIT")?;
    Ok(SuccessorSnapshot { successors, newest_notice })
}

pub(crate) fn timer_list(c: &mut Conn, entity_id: i64) -> R<Vec<TimerRow>> {
    let rows = c.query(
        "SELECT entity_id, name, event, due_at, every_ms FROM timers WHERE entity_id = $1 ORDER BY name",
        &[&entity_id],
    )?;
    all(rows, timer_from_row)
}

pub(crate) fn inbox_list(c: &mut Conn, entity_id: i64) -> R<Vec<InboxItem>> {
    let rows = c.query(
        "SELECT id, entity_id, event, params, request_id, created_at, kind, reply FROM inbox WHERE entity_id = $1 ORDER BY id",
        &[&entity_id],
    )?;
    all(rows, inbox_from_row)
}

pub(crate) fn machine_list(c: &mut Conn) -> R<Vec<MachineRecord>> {
    let rows = c.query(crate::machine::LIST, &[])?;
    all(rows, crate::machine::decode)
}

pub(crate) fn meta_get(c: &mut Conn, key: &str) -> R<Option<String>> {
    Ok(c.opt("SELECT value FROM meta WHERE key = $1", &[&key])?.map(|r| r.try_get(0)).transpose()?)
}

pub(crate) fn operation_get(c: &mut Conn, request_id: &str) -> R<Option<OperationRow>> {
    c.opt(&format!("SELECT {OPERATION_COLS} FROM operations WHERE request_id = $1"), &[&request_id])?
        .map(|r| operation_from_row(&r))
        .transpose()
}

pub(crate) fn operations_ended(c: &mut Conn, request_ids: &[String]) -> R<Vec<OperationRow>> {
    let rows = c.query(
        &format!("SELECT {OPERATION_COLS} FROM operations WHERE request_id = ANY($1) AND ended_at IS NOT NULL"),
        &[&request_ids],
    )?;
    all(rows, operation_from_row)
}

pub(crate) fn operation_list(
    c: &mut Conn,
    outcome: Option<&str>,
    before: Option<i64>,
    limit: u64,
) -> R<Vec<OperationRow>> {
    let limit = limit.min(i64::MAX as u64) as i64;
    let rows = c.query(
        &format!(
            "SELECT {OPERATION_COLS} FROM operations
             WHERE ($1::text IS NULL OR ($1 = 'open' AND ended_at IS NULL) OR outcome = $1)
               AND ($3::bigint IS NULL OR id < $3)
             ORDER BY id DESC LIMIT $2"
        ),
        &[&outcome, &limit, &before],
    )?;
    all(rows, operation_from_row)
}

/// See [`Store::operation_scan`](crate::Store::operation_scan): one statement.
pub(crate) fn operation_scan(
    c: &mut Conn,
    f: &crate::OperationFilter,
    before: Option<i64>,
    window: u64,
    limit: u64,
) -> R<crate::OperationWindow> {
    let (window, limit) = (window.min(i64::MAX as u64) as i64, limit.min(i64::MAX as u64) as i64);
    let rows = c.query(
        &crate::sql::operation_scan_sql(true),
        &[&before, &window, &f.outcome, &f.machine, &f.name, &f.started_after, &f.started_before, &limit],
    )?;
    let mut out = crate::OperationWindow::default();
    for r in &rows {
        let (low, n): (Option<i64>, i64) = (r.try_get(12)?, r.try_get(13)?);
        out.low = low.filter(|_| n == window);
        if r.try_get::<_, Option<i64>>(0)?.is_some() {
            out.items.push(operation_from_row(r)?);
        }
    }
    Ok(out)
}

pub(crate) fn machine_versions(c: &mut Conn) -> R<Vec<(MachineRecord, u64)>> {
    let rows = c.query(crate::machine::VERSIONS, &[])?;
    all(rows, |r| Ok((crate::machine::decode(r)?, count(r, 5)?)))
}

fn event_from_row(r: &Row) -> R<EventRow> {
    Ok(EventRow {
        id: r.try_get(0)?,
        request_id: r.try_get(1)?,
        event: EventName::new(r.try_get::<_, &str>(2)?),
        kind: r.try_get(3)?,
        start_state: StateName::new(r.try_get::<_, &str>(4)?),
        end_state: r.try_get::<_, Option<&str>>(5)?.map(StateName::from),
        start_time: r.try_get(6)?,
        end_time: r.try_get(7)?,
        rejected: r.try_get(8)?,
        failed: r.try_get(9)?,
        error: r.try_get(10)?,
        exception: r.try_get(11)?,
        reason: r.try_get(12)?,
        entered: r.try_get::<_, Option<&str>>(13)?.map(StateName::from),
    })
}

pub(crate) fn events_list(c: &mut Conn, entity_id: i64) -> R<Vec<EventRow>> {
    let rows = c.query(
        &format!(
            "SELECT {EVENT_COLS} FROM events ev
             WHERE ev.entity_id = $1 ORDER BY ev.id"
        ),
        &[&entity_id],
    )?;
    all(rows, event_from_row)
}

pub(crate) fn events_by_id(c: &mut Conn, ids: &[i64]) -> R<Vec<EventRow>> {
    let rows = c.query(
        &format!(
            "SELECT {EVENT_COLS} FROM events ev
             WHERE ev.id = ANY($1::bigint[])"
        ),
        &[&ids],
    )?;
    all(rows, event_from_row)
}

pub(crate) fn entities_by_id(c: &mut Conn, ids: &[i64]) -> R<Vec<EntityRow>> {
    let rows = c.query(&format!("SELECT {ENTITY_COLS} FROM entities WHERE id = ANY($1::bigint[])"), &[&ids])?;
    all(rows, entity_from_row)
}

/// The KPIs of `Store::stats`, read in one repeatable-read snapshot.
pub(crate) fn stats(c: &mut Conn, since: Millis) -> R<Stats> {
    c.batch(&format!("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; {}", super::conn::REPORT_SETTINGS))?;
    let out = read_stats(c, since);
    c.batch("COMMIT")?;
    out
}

fn read_stats(c: &mut Conn, since: Millis) -> R<Stats> {
    let rows = c.query(
        "SELECT name, COUNT(*), COUNT(ended_at), COUNT(*) FILTER (WHERE ended_at IS NOT NULL AND outcome = 'success')
         FROM operations WHERE started_at >= $1 GROUP BY name ORDER BY name",
        &[&since],
    )?;
    let mut operations = all(rows, |r| {
        let (ended, success) = (count(r, 2)?, count(r, 3)?);
        Ok(OperationStats {
            name: r.try_get(0)?,
            count: count(r, 1)?,
            ended,
            success,
            success_rate: if ended == 0 { 0.0 } else { success as f64 / ended as f64 },
            p50_ms: 0,
            p99_ms: 0,
        })
    })?;
    let mut durations: std::collections::HashMap<String, Vec<i64>> = std::collections::HashMap::new();
    for r in c.query(
        "SELECT name, ended_at - started_at FROM operations
         WHERE started_at >= $1 AND ended_at IS NOT NULL ORDER BY name, 2",
        &[&since],
    )? {
        durations.entry(r.try_get(0)?).or_default().push(r.try_get(1)?);
    }
    for op in &mut operations {
        let sorted = durations.remove(&op.name).unwrap_or_default();
        op.p50_ms = percentile(&sorted, 0.50);
        op.p99_ms = percentile(&sorted, 0.99);
    }
    let rows = c.query(
        "SELECT machine, start_state, end_state, COUNT(*), AVG((outcome = 'error')::int)::float8,
            AVG(retry_count)::float8
         FROM transitions WHERE end_time >= $1
         GROUP BY machine, start_state, end_state ORDER BY machine, start_state NULLS FIRST, end_state",
        &[&since],
    )?;
    let transitions = all(rows, |r| {
        Ok(TransitionStats {
            machine: r.try_get(0)?,
            from: r.try_get(1)?,
            to: r.try_get(2)?,
            count: count(r, 3)?,
            error_rate: r.try_get::<_, Option<f64>>(4)?.unwrap_or(0.0),
            mean_retries: r.try_get::<_, Option<f64>>(5)?.unwrap_or(0.0),
        })
    })?;
    let rows = c.query(
        "SELECT kind, details, COUNT(*) FROM errors WHERE at >= $1
         GROUP BY kind, details ORDER BY COUNT(*) DESC, kind, details LIMIT 10",
        &[&since],
    )?;
    let top_errors =
        all(rows, |r| Ok(ErrorStats { kind: r.try_get(0)?, details: r.try_get(1)?, count: count(r, 2)? }))?;
    Ok(Stats { operations, transitions, top_errors })
}

/// The counters and gauges of `Store::metrics_snapshot`, in one snapshot.
pub(crate) fn metrics(c: &mut Conn, now: Millis) -> R<MetricsSnapshot> {
    c.batch(&format!("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; {}", super::conn::REPORT_SETTINGS))?;
    let out = read_metrics(c, now);
    c.batch("COMMIT")?;
    out
}

/// Entities per machine, state and run status, from the counts the commits keep.
pub(super) fn entity_counts(c: &mut Conn) -> R<Vec<EntityCount>> {
    let rows = c.query(
        "SELECT machine, state, run_status, SUM(n)::bigint FROM entity_counts
         GROUP BY machine, state, run_status HAVING SUM(n) > 0 ORDER BY machine, state, run_status",
        &[],
    )?;
    all(rows, |r| {
        let status: &str = r.try_get(2)?;
        Ok(EntityCount {
            machine: r.try_get(0)?,
            state: r.try_get(1)?,
            run_status: RunStatus::parse(status)
                .ok_or_else(|| Failure::Corrupt(format!("unknown run status `{status}`")))?,
            count: count(r, 3)?,
        })
    })
}

/// Operations per outcome (`open`: not ended), from the counts the commits keep.
fn operation_counts(c: &mut Conn) -> R<Vec<(String, u64)>> {
    let rows = c.query(
        "SELECT outcome, SUM(n)::bigint FROM operation_counts GROUP BY outcome HAVING SUM(n) > 0 ORDER BY outcome",
        &[],
    )?;
    all(rows, |r| Ok((r.try_get(0)?, count(r, 1)?)))
}

/// Open agent tasks per queue and status.
fn task_counts(c: &mut Conn) -> R<Vec<(String, String, u64)>> {
    let rows = c.query(
        "SELECT queue, status, COUNT(*) FROM agent_tasks WHERE status IN ('ready', 'leased')
         GROUP BY queue, status ORDER BY queue, status",
        &[],
    )?;
    all(rows, |r| Ok((r.try_get(0)?, r.try_get(1)?, count(r, 2)?)))
}

fn due_backlog(c: &mut Conn, now: Millis) -> R<u64> {
    count(&c.one("SELECT COUNT(*) FROM entities WHERE due_at <= $1", &[&now])?, 0)
}

fn read_metrics(c: &mut Conn, now: Millis) -> R<MetricsSnapshot> {
    let rows = c.query(
        "SELECT machine, start_state, end_state, COUNT(*) FROM transitions
         GROUP BY machine, start_state, end_state ORDER BY machine, start_state NULLS FIRST, end_state",
        &[],
    )?;
    let transitions = all(rows, |r| {
        Ok(TransitionCount { machine: r.try_get(0)?, from: r.try_get(1)?, to: r.try_get(2)?, count: count(r, 3)? })
    })?;
    let entities = entity_counts(c)?;
    let parked = entities.iter().filter(|e| e.run_status == RunStatus::Failed).map(|e| e.count).sum();
    let counts = c.one(
        "SELECT (SELECT COUNT(*) FROM events WHERE rejected), (SELECT COUNT(*) FROM errors WHERE kind <> 'failure')",
        &[],
    )?;
    Ok(MetricsSnapshot {
        tasks: task_counts(c)?,
        transitions,
        events_rejected: count(&counts, 0)?,
        faults: count(&counts, 1)?,
        parked,
        entities,
        due_backlog: due_backlog(c, now)?,
        operations: operation_counts(c)?,
    })
}

/// [`Store::overview`](crate::Store::overview), in one snapshot: only maintained counts
/// and indexes.
pub(crate) fn overview(c: &mut Conn, now: Millis, since: Millis) -> R<Overview> {
    c.batch("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")?;
    let out = read_overview(c, now, since);
    c.batch("COMMIT")?;
    out
}

fn read_overview(c: &mut Conn, now: Millis, since: Millis) -> R<Overview> {
    let rows = c.query(
        "SELECT minute, SUM(transitions)::bigint, SUM(errors)::bigint FROM minute_counts
         WHERE minute >= $1::bigint / 60000 GROUP BY minute ORDER BY minute",
        &[&since],
    )?;
    let minutes = all(rows, |r| {
        Ok(MinuteCount { minute: r.try_get::<_, i64>(0)? * 60_000, transitions: count(r, 1)?, errors: count(r, 2)? })
    })?;
    Ok(Overview::new(entity_counts(c)?, due_backlog(c, now)?, operation_counts(c)?, task_counts(c)?, minutes))
}

/// The entities having `entity_id` as a successor, by id.
pub(crate) fn predecessor_list(c: &mut Conn, entity_id: i64) -> R<Vec<EntityRow>> {
    related(c, "predecessor_id", "successor_id", entity_id)
}

/// The entities at the `end` side of the successor edges whose `from` side is `entity_id`
/// (`successor_id`, `predecessor_id`: its successors), by id.
fn related(c: &mut Conn, end: &str, from: &str, entity_id: i64) -> R<Vec<EntityRow>> {
    let cols = ENTITY_COLS.split(", ").map(|col| format!("e.{col}")).collect::<Vec<_>>().join(", ");
    let sql =
        format!("SELECT {cols} FROM entities e JOIN successors s ON s.{end} = e.id WHERE s.{from} = $1 ORDER BY e.id");
    all(c.query(&sql, &[&entity_id])?, entity_from_row)
}

/// The entity's newest `limit` errors, newest first (index `errors_entity`).
pub(crate) fn error_list(c: &mut Conn, entity_id: i64, limit: u64) -> R<Vec<crate::ErrorRow>> {
    let rows = c.query(
        "SELECT id, request_id, at, kind, details, cause FROM errors WHERE entity_id = $1 ORDER BY id DESC LIMIT $2",
        &[&entity_id, &(limit as i64)],
    )?;
    all(rows, |r| {
        Ok(crate::ErrorRow {
            id: r.try_get(0)?,
            request_id: r.try_get(1)?,
            at: r.try_get(2)?,
            kind: r.try_get(3)?,
            details: r.try_get(4)?,
            cause: crate::CauseRef::decode(r.try_get::<_, Option<&str>>(5)?),
        })
    })
}

/// The newest error of each of `ids` that has one, in the order of `ids`: one statement,
/// one index range of `errors (entity_id, id)` each.
pub(crate) fn error_newest(c: &mut Conn, ids: &[i64]) -> R<Vec<(i64, crate::ErrorRow)>> {
    let rows = c.query(
        "SELECT DISTINCT ON (entity_id) entity_id, id, request_id, at, kind, details, cause FROM errors
         WHERE entity_id = ANY($1) ORDER BY entity_id, id DESC",
        &[&ids],
    )?;
    let mut found: std::collections::HashMap<i64, crate::ErrorRow> = all(rows, |r| {
        Ok((
            r.try_get::<_, i64>(0)?,
            crate::ErrorRow {
                id: r.try_get(1)?,
                request_id: r.try_get(2)?,
                at: r.try_get(3)?,
                kind: r.try_get(4)?,
                details: r.try_get(5)?,
                cause: crate::CauseRef::decode(r.try_get::<_, Option<&str>>(6)?),
            },
        ))
    })?
    .into_iter()
    .collect();
    Ok(ids.iter().filter_map(|id| found.remove(id).map(|e| (*id, e))).collect())
}

/// What the operation of `request_id` touched (see [`Store::operation_trace`](crate::Store::operation_trace)),
/// in one repeatable-read snapshot.
pub(crate) fn operation_trace(c: &mut Conn, request_id: &str, limit: u64) -> R<crate::OperationTrace> {
    c.batch("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")?;
    let trace = (|| {
        let Some((ids, truncated)) = reached(c, request_id, limit)? else {
            return Ok(crate::OperationTrace::default());
        };
        let rows = c.query(&format!("SELECT {ENTITY_COLS} FROM entities WHERE id = ANY($1) ORDER BY id"), &[&ids])?;
        let entities = all(rows, entity_from_row)?;
        let rows = c.query(
            "SELECT id, entity_id, from_state, to_state, kind, action, event, retry, request_id, at, detail
             FROM history WHERE entity_id = ANY($1) AND request_id = $2 ORDER BY entity_id, id",
            &[&ids, &request_id],
        )?;
        let transitions = all(rows, history_from_row)?;
        Ok(crate::OperationTrace { entities, transitions, truncated })
    })();
    match trace {
        Ok(t) => {
            c.batch("COMMIT")?;
            Ok(t)
        }
        Err(e) => {
            let _ = c.batch("ROLLBACK");
            Err(e)
        }
    }
}

/// The entities operation `request_id` reached, after id `after` in id order, at most
/// `limit` (see [`Store::operation_reached`](crate::Store::operation_reached)).
pub(crate) fn operation_reached(
    c: &mut Conn,
    request_id: &str,
    after: Option<i64>,
    limit: u64,
) -> R<Vec<crate::EntityRow>> {
    c.batch("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")?;
    let rows = (|| {
        let Some((ids, _)) = reached(c, request_id, crate::detail::REACHED_MAX)? else {
            return Ok(Vec::new());
        };
        let ids: Vec<i64> = ids.into_iter().filter(|id| after.is_none_or(|a| *id > a)).take(limit as usize).collect();
        let rows = c.query(&format!("SELECT {ENTITY_COLS} FROM entities WHERE id = ANY($1) ORDER BY id"), &[&ids])?;
        all(rows, entity_from_row)
    })();
    match rows {
        Ok(t) => {
            c.batch("COMMIT")?;
            Ok(t)
        }
        Err(e) => {
            let _ = c.batch("ROLLBACK");
            Err(e)
        }
    }
}

/// The ids of the entities operation `request_id` reached (its own, those its events
/// reached, those it created), sorted, at most `limit`, and whether some were left out;
/// `None`: no such operation.
fn reached(c: &mut Conn, request_id: &str, limit: u64) -> R<Option<(Vec<i64>, bool)>> {
    let Some(op) = c.opt("SELECT id FROM operations WHERE request_id = $1", &[&request_id])? else {
        return Ok(None);
    };
    let op_id: i64 = op.try_get(0)?;
    let own: Option<i64> = c
        .opt(
            "SELECT e.id FROM operations o JOIN entities e ON e.machine = o.machine AND e.key = o.entity_key
             WHERE o.id = $1",
            &[&op_id],
        )?
        .map(|r| r.try_get(0))
        .transpose()?;
    let reached = c.query(
        "SELECT DISTINCT entity_id FROM events WHERE operation_id = $1 ORDER BY entity_id LIMIT $2",
        &[&op_id, &(limit as i64 + 1)],
    )?;
    let reached = all(reached, |r| Ok(r.try_get::<_, i64>(0)?))?;
    let (ids, truncated) = crate::detail::trace_ids(own, reached, limit);
    let (ids, more) = crate::detail::with_created(ids, limit.max(1), |id| {
        let rows = c.query(
            "SELECT successor_id FROM successors WHERE predecessor_id = $1 AND request_id = $2",
            &[&id, &request_id],
        )?;
        all(rows, |r| Ok(r.try_get::<_, i64>(0)?))
    })?;
    Ok(Some((ids, truncated || more)))
}

/// The (machine, state) pairs that hold entities, when `f`'s statement needs them.
pub(super) fn present(c: &mut Conn, f: &EntityFilter) -> R<Vec<(String, String)>> {
    if !crate::page::reads_pairs(f) {
        return Ok(Vec::new());
    }
    let rows = c.query(
        "SELECT machine, state FROM entity_counts GROUP BY machine, state HAVING SUM(n) > 0 ORDER BY machine, state",
        &[],
    )?;
    rows.iter().map(|r| Ok((r.try_get(0)?, r.try_get(1)?))).collect()
}

/// The values of a page statement's parameters.
pub(super) fn values(params: Vec<crate::page::Param>) -> Vec<Box<dyn postgres::types::ToSql + Sync>> {
    params
        .into_iter()
        .map(|p| -> Box<dyn postgres::types::ToSql + Sync> {
            match p {
                crate::page::Param::Text(t) => Box::new(t),
                crate::page::Param::Int(i) => Box::new(i),
            }
        })
        .collect()
}

pub(super) fn entity_count(c: &mut Conn, f: &EntityFilter, bound: u64) -> R<u64> {
    if let Some(n) = crate::page::count_from_counts(f, &entity_counts(c)?) {
        return Ok(n.min(bound.saturating_add(1)));
    }
    let present = present(c, f)?;
    let Some((sql, params)) = crate::page::count_sql(f, &present, bound, true) else { return Ok(0) };
    let values = values(params);
    let refs: Vec<&(dyn postgres::types::ToSql + Sync)> = values.iter().map(|v| v.as_ref()).collect();
    let n: i64 = c.one(&sql, &refs)?.try_get(0)?;
    Ok(n.max(0) as u64)
}
