//! SQLite's bulk operations: the statements of [`crate::bulk`], run on the reader (reads)
//! or the writer (changes). Counts of a filter are `read::entity_count`.

use rusqlite::{Connection, OptionalExtension, params};

use crate::Millis;
use crate::bulk::{self, BulkAdvance, BulkRow};

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
        row.priority,
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
