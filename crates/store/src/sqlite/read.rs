//! The read side (reports, listings) of the SQLite store; rows are decoded by `crate::decode`.

use rusqlite::{Connection, Row};
use settle_core::{ActionName, EventName, StateName};

use super::db_err;
use crate::{
    AgentTask, EntityCount, EntityRow, ErrorStats, EventRow, HistoryKind, HistoryRow, InboxItem, MetricsSnapshot,
    Millis, MinuteCount, OperationRow, OperationStats, Overview, Result, RunStatus, Stats, TimerRow, TransitionCount,
    TransitionStats, percentile,
};

pub(crate) fn conversion(col: usize, e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> rusqlite::Error {
    rusqlite::Error::FromSqlConversionFailure(col, rusqlite::types::Type::Text, e.into())
}

pub(crate) fn entity_from_row(r: &Row<'_>) -> rusqlite::Result<EntityRow> {
    crate::decode::entity(r)
}

/// The columns an `InboxItem` is decoded from ([`inbox_from_row`]), in order.
pub(crate) const INBOX_COLS: &str = "id, entity_id, event, params, request_id, created_at, kind, reply";

pub(crate) fn inbox_from_row(r: &Row<'_>) -> rusqlite::Result<InboxItem> {
    crate::decode::inbox(r)
}

pub(crate) fn task_from_row(r: &Row<'_>) -> rusqlite::Result<AgentTask> {
    crate::decode::task(r)
}

pub(crate) fn history_from_row(r: &Row<'_>) -> rusqlite::Result<HistoryRow> {
    let kind: String = r.get(4)?;
    Ok(HistoryRow {
        id: r.get(0)?,
        entity_id: r.get(1)?,
        from: r.get::<_, Option<String>>(2)?.map(StateName::from),
        to: r.get::<_, Option<String>>(3)?.map(StateName::from),
        kind: HistoryKind::parse(&kind).ok_or_else(|| conversion(4, format!("unknown history kind `{kind}`")))?,
        action: r.get::<_, Option<String>>(5)?.map(ActionName::from),
        event: r.get::<_, Option<String>>(6)?.map(EventName::from),
        retry: r.get(7)?,
        request_id: r.get(8)?,
        at: r.get(9)?,
        detail: r.get(10)?,
    })
}

pub(crate) fn operation_from_row(r: &Row<'_>) -> rusqlite::Result<OperationRow> {
    crate::decode::operation(r)
}

pub(crate) fn event_from_row(r: &Row<'_>) -> rusqlite::Result<EventRow> {
    Ok(EventRow {
        id: r.get(0)?,
        request_id: r.get(1)?,
        event: EventName::new(r.get_ref(2)?.as_str()?),
        kind: r.get(3)?,
        start_state: StateName::new(r.get_ref(4)?.as_str()?),
        end_state: r.get::<_, Option<String>>(5)?.map(StateName::from),
        start_time: r.get(6)?,
        end_time: r.get(7)?,
        rejected: r.get(8)?,
        failed: r.get(9)?,
        error: r.get(10)?,
        exception: r.get(11)?,
        reason: r.get(12)?,
        entered: r.get::<_, Option<String>>(13)?.map(StateName::from),
    })
}

pub(crate) fn timer_from_row(r: &Row<'_>) -> rusqlite::Result<TimerRow> {
    crate::decode::timer(r)
}

/// Runs `read` in one read transaction: WAL gives it a consistent snapshot.
pub(crate) fn in_read_transaction<T>(
    c: &Connection,
    read: impl FnOnce(&Connection) -> rusqlite::Result<T>,
) -> Result<T> {
    c.execute_batch("BEGIN").map_err(db_err)?;
    let out = read(c);
    c.execute_batch("COMMIT").map_err(db_err)?;
    out.map_err(db_err)
}

fn count(n: i64) -> u64 {
    n.max(0) as u64
}

/// The KPIs of [`Store::stats`](crate::Store::stats): counts in SQL, duration percentiles from the sorted
/// durations.
pub(crate) fn read_stats(c: &Connection, since: Millis) -> rusqlite::Result<Stats> {
    let mut operations: Vec<OperationStats> = c
        .prepare_cached(
            "SELECT name, COUNT(*), COUNT(ended_at), SUM(ended_at IS NOT NULL AND outcome = 'success')
             FROM operations WHERE started_at >= ?1 GROUP BY name ORDER BY name",
        )?
        .query_map([since], |r| {
            let (ended, success) = (count(r.get(2)?), count(r.get(3)?));
            Ok(OperationStats {
                name: r.get(0)?,
                count: count(r.get(1)?),
                ended,
                success,
                success_rate: if ended == 0 { 0.0 } else { success as f64 / ended as f64 },
                p50_ms: 0,
                p99_ms: 0,
            })
        })?
        .collect::<rusqlite::Result<_>>()?;
    let mut durations: std::collections::HashMap<String, Vec<i64>> = std::collections::HashMap::new();
    let mut stmt = c.prepare_cached(
        "SELECT name, ended_at - started_at FROM operations
         WHERE started_at >= ?1 AND ended_at IS NOT NULL ORDER BY name, 2",
    )?;
    let mut rows = stmt.query([since])?;
    while let Some(r) = rows.next()? {
        durations.entry(r.get(0)?).or_default().push(r.get(1)?);
    }
    for op in &mut operations {
        let sorted = durations.remove(&op.name).unwrap_or_default();
        op.p50_ms = percentile(&sorted, 0.50);
        op.p99_ms = percentile(&sorted, 0.99);
    }
    let transitions = c
        .prepare_cached(
            "SELECT machine, start_state, end_state, COUNT(*), AVG(outcome = 'error'), AVG(retry_count)
             FROM transitions WHERE end_time >= ?1
             GROUP BY machine, start_state, end_state ORDER BY machine, start_state, end_state",
        )?
        .query_map([since], |r| {
            Ok(TransitionStats {
                machine: r.get(0)?,
                from: r.get(1)?,
                to: r.get(2)?,
                count: count(r.get(3)?),
                error_rate: r.get::<_, Option<f64>>(4)?.unwrap_or(0.0),
                mean_retries: r.get::<_, Option<f64>>(5)?.unwrap_or(0.0),
            })
        })?
        .collect::<rusqlite::Result<_>>()?;
    let top_errors = c
        .prepare_cached(
            "SELECT kind, details, COUNT(*) FROM errors WHERE at >= ?1
             GROUP BY kind, details ORDER BY COUNT(*) DESC, kind, details LIMIT 10",
        )?
        .query_map([since], |r| Ok(ErrorStats { kind: r.get(0)?, details: r.get(1)?, count: count(r.get(2)?) }))?
        .collect::<rusqlite::Result<_>>()?;
    Ok(Stats { operations, transitions, top_errors })
}

/// Entities per machine, state and run status, from the counts the commits keep.
pub(super) fn entity_counts(c: &Connection) -> rusqlite::Result<Vec<EntityCount>> {
    c.prepare_cached(
        "SELECT machine, state, run_status, n FROM entity_counts WHERE n > 0 ORDER BY machine, state, run_status",
    )?
    .query_map([], |r| {
        let status = r.get_ref(2)?.as_str()?;
        Ok(EntityCount {
            machine: r.get(0)?,
            state: r.get(1)?,
            run_status: RunStatus::parse(status)
                .ok_or_else(|| conversion(2, format!("unknown run status `{status}`")))?,
            count: count(r.get(3)?),
        })
    })?
    .collect()
}

/// Operations per outcome (`open`: not ended), from the counts the commits keep.
fn operation_counts(c: &Connection) -> rusqlite::Result<Vec<(String, u64)>> {
    c.prepare_cached("SELECT outcome, n FROM operation_counts WHERE n > 0 ORDER BY outcome")?
        .query_map([], |r| Ok((r.get(0)?, count(r.get(1)?))))?
        .collect()
}

/// Open agent tasks per queue and status.
fn task_counts(c: &Connection) -> rusqlite::Result<Vec<(String, String, u64)>> {
    c.prepare_cached(
        "SELECT queue, status, COUNT(*) FROM agent_tasks WHERE status IN ('ready', 'leased')
         GROUP BY queue, status ORDER BY queue, status",
    )?
    .query_map([], |r| Ok((r.get(0)?, r.get(1)?, count(r.get(2)?))))?
    .collect()
}

fn due_backlog(c: &Connection, now: Millis) -> rusqlite::Result<u64> {
    c.prepare_cached("SELECT COUNT(*) FROM entities WHERE due_at <= ?1")?
        .query_row([now], |r| r.get::<_, i64>(0))
        .map(count)
}

/// The counters and gauges of [`Store::metrics_snapshot`](crate::Store::metrics_snapshot).
pub(crate) fn read_metrics(c: &Connection, now: Millis) -> rusqlite::Result<MetricsSnapshot> {
    let scalar = |sql: &str| -> rusqlite::Result<u64> {
        c.prepare_cached(sql)?.query_row([], |r| r.get::<_, i64>(0)).map(count)
    };
    let transitions = c
        .prepare_cached(
            "SELECT machine, start_state, end_state, COUNT(*) FROM transitions
             GROUP BY machine, start_state, end_state ORDER BY machine, start_state, end_state",
        )?
        .query_map([], |r| {
            Ok(TransitionCount { machine: r.get(0)?, from: r.get(1)?, to: r.get(2)?, count: count(r.get(3)?) })
        })?
        .collect::<rusqlite::Result<_>>()?;
    let entities = entity_counts(c)?;
    let parked = entities.iter().filter(|e| e.run_status == RunStatus::Failed).map(|e| e.count).sum();
    Ok(MetricsSnapshot {
        tasks: task_counts(c)?,
        transitions,
        events_rejected: scalar("SELECT COUNT(*) FROM events WHERE rejected = 1")?,
        faults: scalar("SELECT COUNT(*) FROM errors WHERE kind <> 'failure'")?,
        parked,
        entities,
        due_backlog: due_backlog(c, now)?,
        operations: operation_counts(c)?,
    })
}

/// [`Store::overview`](crate::Store::overview): only maintained counts and indexes.
pub(crate) fn read_overview(c: &Connection, now: Millis, since: Millis) -> rusqlite::Result<Overview> {
    let minutes = c
        .prepare_cached(
            "SELECT minute, transitions, errors FROM minute_counts WHERE minute >= ?1 / 60000 ORDER BY minute",
        )?
        .query_map([since], |r| {
            Ok(MinuteCount {
                minute: r.get::<_, i64>(0)? * 60_000,
                transitions: count(r.get(1)?),
                errors: count(r.get(2)?),
            })
        })?
        .collect::<rusqlite::Result<_>>()?;
    Ok(Overview::new(entity_counts(c)?, due_backlog(c, now)?, operation_counts(c)?, task_counts(c)?, minutes))
}

/// A page of entities ([`Store::entity_list`](crate::Store::entity_list)), read through the
/// index [`page_sql`](crate::page::page_sql) picks.
pub(crate) fn entity_list(c: &Connection, f: &crate::EntityFilter) -> rusqlite::Result<Vec<EntityRow>> {
    let present = present(c, f)?;
    let Some((sql, params)) = crate::page::page_sql(f, &present, false) else {
        return Ok(Vec::new());
    };
    let values = params.into_iter().map(|p| match p {
        crate::page::Param::Text(t) => rusqlite::types::Value::Text(t),
        crate::page::Param::Int(i) => rusqlite::types::Value::Integer(i),
    });
    c.prepare_cached(&sql)?.query_map(rusqlite::params_from_iter(values), entity_from_row)?.collect()
}

/// The entities having `entity_id` as a successor, by id.
pub(crate) fn predecessor_list(c: &Connection, entity_id: i64) -> rusqlite::Result<Vec<EntityRow>> {
    let cols = crate::sql::ENTITY_COLS.split(", ").map(|col| format!("e.{col}")).collect::<Vec<_>>().join(", ");
    c.prepare_cached(&format!(
        "SELECT {cols} FROM entities e JOIN successors s ON s.predecessor_id = e.id
         WHERE s.successor_id = ?1 ORDER BY e.id"
    ))?
    .query_map([entity_id], entity_from_row)?
    .collect()
}

/// The entity's newest `limit` errors, newest first (index `errors_entity`).
pub(crate) fn error_list(c: &Connection, entity_id: i64, limit: u64) -> rusqlite::Result<Vec<crate::ErrorRow>> {
    c.prepare_cached(
        "SELECT id, request_id, at, kind, details, cause FROM errors WHERE entity_id = ?1 ORDER BY id DESC LIMIT CAST(?2 AS INTEGER)",
    )?
    .query_map(rusqlite::params![entity_id, limit as i64], |r| {
        Ok(crate::ErrorRow {
            id: r.get(0)?,
            request_id: r.get(1)?,
            at: r.get(2)?,
            kind: r.get(3)?,
            details: r.get(4)?,
            cause: crate::CauseRef::decode(r.get::<_, Option<String>>(5)?.as_deref()),
        })
    })?
    .collect()
}

/// What the operation of `request_id` touched (see [`Store::operation_trace`](crate::Store::operation_trace)).
pub(crate) fn operation_trace(c: &Connection, request_id: &str, limit: u64) -> rusqlite::Result<crate::OperationTrace> {
    use rusqlite::OptionalExtension;
    let Some((ids, truncated)) = reached(c, request_id, limit)? else {
        return Ok(crate::OperationTrace::default());
    };
    let mut trace = crate::OperationTrace { truncated, ..Default::default() };
    let mut entity = c.prepare_cached(&format!("SELECT {} FROM entities WHERE id = ?1", crate::sql::ENTITY_COLS))?;
    let mut history = c.prepare_cached(
        "SELECT id, entity_id, from_state, to_state, kind, action, event, retry, request_id, at, detail
         FROM history WHERE entity_id = ?1 AND request_id = ?2 ORDER BY id",
    )?;
    for id in ids {
        trace.entities.extend(entity.query_row([id], entity_from_row).optional()?);
        for row in history.query_map(rusqlite::params![id, request_id], history_from_row)? {
            trace.transitions.push(row?);
        }
    }
    Ok(trace)
}

/// The entities operation `request_id` reached, after id `after` in id order, at most
/// `limit` (see [`Store::operation_reached`](crate::Store::operation_reached)).
pub(crate) fn operation_reached(
    c: &Connection,
    request_id: &str,
    after: Option<i64>,
    limit: u64,
) -> rusqlite::Result<Vec<crate::EntityRow>> {
    use rusqlite::OptionalExtension;
    let Some((ids, _)) = reached(c, request_id, crate::detail::REACHED_MAX)? else {
        return Ok(Vec::new());
    };
    let mut entity = c.prepare_cached(&format!("SELECT {} FROM entities WHERE id = ?1", crate::sql::ENTITY_COLS))?;
    let mut rows = Vec::new();
    for id in ids.into_iter().filter(|id| after.is_none_or(|a| *id > a)).take(limit as usize) {
        rows.extend(entity.query_row([id], entity_from_row).optional()?);
    }
    Ok(rows)
}

/// The ids of the entities operation `request_id` reached (its own, those its events
/// reached, those it created), sorted, at most `limit`, and whether some were left out;
/// `None`: no such operation.
fn reached(c: &Connection, request_id: &str, limit: u64) -> rusqlite::Result<Option<(Vec<i64>, bool)>> {
    use rusqlite::OptionalExtension;
    let Some(op_id) = c
        .prepare_cached("SELECT id FROM operations WHERE request_id = ?1")?
        .query_row([request_id], |r| r.get::<_, i64>(0))
        .optional()?
    else {
        return Ok(None);
    };
    // Its own entity, then those its events reached (index `events_operation`).
    let own: Option<i64> = c
        .prepare_cached(
            "SELECT e.id FROM operations o JOIN entities e ON e.machine = o.machine AND e.key = o.entity_key
             WHERE o.id = ?1",
        )?
        .query_row([op_id], |r| r.get(0))
        .optional()?;
    let reached: Vec<i64> = c
        .prepare_cached("SELECT DISTINCT entity_id FROM events WHERE operation_id = ?1 ORDER BY entity_id LIMIT CAST(?2 AS INTEGER)")?
        .query_map(rusqlite::params![op_id, limit as i64 + 1], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    let (ids, truncated) = crate::detail::trace_ids(own, reached, limit);
    let mut created =
        c.prepare_cached("SELECT successor_id FROM successors WHERE predecessor_id = ?1 AND request_id = ?2")?;
    let (ids, more) = crate::detail::with_created(ids, limit.max(1), |id| {
        created.query_map(rusqlite::params![id, request_id], |r| r.get(0))?.collect::<rusqlite::Result<Vec<i64>>>()
    })?;
    Ok(Some((ids, truncated || more)))
}

/// The (machine, state) pairs that hold entities, when `f`'s statement needs them.
pub(super) fn present(c: &Connection, f: &crate::EntityFilter) -> rusqlite::Result<Vec<(String, String)>> {
    if !crate::page::reads_pairs(f) {
        return Ok(Vec::new());
    }
    c.prepare_cached("SELECT machine, state FROM entity_counts WHERE n > 0 GROUP BY machine, state")?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect()
}

fn values(params: Vec<crate::page::Param>) -> impl Iterator<Item = rusqlite::types::Value> {
    params.into_iter().map(|p| match p {
        crate::page::Param::Text(t) => rusqlite::types::Value::Text(t),
        crate::page::Param::Int(i) => rusqlite::types::Value::Integer(i),
    })
}

pub(super) fn entity_count(c: &Connection, f: &crate::EntityFilter, bound: u64) -> rusqlite::Result<u64> {
    if let Some(n) = crate::page::count_from_counts(f, &entity_counts(c)?) {
        return Ok(n.min(bound.saturating_add(1)));
    }
    let present = present(c, f)?;
    let Some((sql, params)) = crate::page::count_sql(f, &present, bound, false) else { return Ok(0) };
    let n: i64 = c.prepare_cached(&sql)?.query_row(rusqlite::params_from_iter(values(params)), |r| r.get(0))?;
    Ok(n.max(0) as u64)
}
