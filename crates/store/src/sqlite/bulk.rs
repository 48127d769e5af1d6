//! SQLite's bulk operations and counts: the statements of [`crate::bulk`] and
//! [`crate::page::count_sql`], run on the reader (reads) or the writer (changes).

use rusqlite::{Connection, OptionalExtension, params};

use crate::bulk::{self, BulkAdvance, BulkRow};
use crate::{EntityFilter, Millis};

/// The (machine, state) pairs that hold entities, when `f`'s statement needs them.
pub(super) fn present(c: &Connection, f: &EntityFilter) -> rusqlite::Result<Vec<(String, String)>> {
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

pub(super) fn entity_count(c: &Connection, f: &EntityFilter, bound: u64) -> rusqlite::Result<u64> {
    if let Some(n) = crate::page::count_from_counts(f, &super::read::entity_counts(c)?) {
        return Ok(n.min(bound.saturating_add(1)));
    }
    let present = present(c, f)?;
    let Some((sql, params)) = crate::page::count_sql(f, &present, bound, false) else { return Ok(0) };
    let n: i64 = c.prepare_cached(&sql)?.query_row(rusqlite::params_from_iter(values(params)), |r| r.get(0))?;
    Ok(n.max(0) as u64)
}

pub(super) fn get(c: &Connection, request_id: &str) -> rusqlite::Result<Option<BulkRow>> {
    c.prepare_cached(&bulk::sqlite(&bulk::select_one()))?.query_row([request_id], |r| bulk::decode(r)).optional()
}

pub(super) fn list(c: &Connection, limit: u64) -> rusqlite::Result<Vec<BulkRow>> {
    let limit = limit.min(i64::MAX as u64) as i64;
    c.prepare_cached(&bulk::sqlite(&bulk::select_newest()))?.query_map([limit], |r| bulk::decode(r))?.collect()
}

pub(super) fn start(c: &Connection, row: &BulkRow) -> rusqlite::Result<(BulkRow, bool)> {
    let params_text = (!row.params.is_null()).then(|| row.params.to_string());
    let inserted = c.prepare_cached(&bulk::sqlite(bulk::INSERT))?.execute(params![
        row.request_id,
        row.action,
        row.event,
        params_text,
        row.filter.to_string(),
        row.reason,
        i64::from(row.rate),
        row.total.min(i64::MAX as u64) as i64,
        row.created_at,
    ])?;
    let stored = get(c, &row.request_id)?.ok_or(rusqlite::Error::QueryReturnedNoRows)?;
    Ok((stored, inserted == 1))
}

pub(super) fn claim(
    c: &Connection,
    owner: &str,
    now: Millis,
    lease_until: Millis,
) -> rusqlite::Result<Option<BulkRow>> {
    c.prepare_cached(&bulk::sqlite(&bulk::claim()))?
        .query_row(params![owner, lease_until, now], |r| bulk::decode(r))
        .optional()
}

pub(super) fn advance(c: &Connection, a: &BulkAdvance) -> rusqlite::Result<bool> {
    let n = c.prepare_cached(&bulk::sqlite(bulk::ADVANCE))?.execute(params![
        a.request_id,
        a.owner,
        a.cursor,
        a.done.min(i64::MAX as u64) as i64,
        a.failed.min(i64::MAX as u64) as i64,
        a.last_error,
        a.now,
        a.lease_until,
        a.finished,
    ])?;
    Ok(n == 1)
}

pub(super) fn cancel(c: &Connection, request_id: &str, now: Millis) -> rusqlite::Result<Option<BulkRow>> {
    c.prepare_cached(&bulk::sqlite(bulk::CANCEL))?.execute(params![request_id, now])?;
    get(c, request_id)
}
