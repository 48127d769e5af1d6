//! PostgreSQL's bulk operations: the statements of [`crate::bulk`], each one statement in
//! autocommit on a pooled connection (a retry after a lost connection does what the first
//! try did). Counts of a filter are `read::entity_count`.

use super::conn::{Conn, Failure};
use crate::Millis;
use crate::bulk::{self, BulkAdvance, BulkRow};

type R<T> = std::result::Result<T, Failure>;

pub(super) fn get(c: &mut Conn, request_id: &str) -> R<Option<BulkRow>> {
    c.opt(&bulk::select_one(), &[&request_id])?.map(|r| bulk::decode(&r)).transpose()
}

pub(super) fn list(c: &mut Conn, limit: u64) -> R<Vec<BulkRow>> {
    let limit = limit.min(i64::MAX as u64) as i64;
    c.query(&bulk::select_newest(), &[&limit])?.iter().map(bulk::decode).collect()
}

pub(super) fn start(c: &mut Conn, row: &BulkRow) -> R<(BulkRow, bool)> {
    let params_text = (!row.params.is_null()).then(|| row.params.to_string());
    let (rate, total) = (i64::from(row.rate), row.total.min(i64::MAX as u64) as i64);
    let inserted = c.exec(
        bulk::INSERT,
        &[
            &row.request_id,
            &row.action,
            &row.event,
            &params_text,
            &row.filter.to_string(),
            &row.reason,
            &rate,
            &total,
            &row.created_at,
            &row.priority,
        ],
    )?;
    let stored =
        get(c, &row.request_id)?.ok_or_else(|| Failure::Corrupt("a bulk operation just stored is gone".into()))?;
    Ok((stored, inserted == 1))
}

pub(super) fn claim(c: &mut Conn, owner: &str, now: Millis, lease_until: Millis) -> R<Option<BulkRow>> {
    c.opt(&bulk::claim(), &[&owner, &lease_until, &now])?.map(|r| bulk::decode(&r)).transpose()
}

pub(super) fn advance(c: &mut Conn, a: &BulkAdvance) -> R<bool> {
    let (done, failed) = (a.done.min(i64::MAX as u64) as i64, a.failed.min(i64::MAX as u64) as i64);
    let n = c.exec(
        bulk::ADVANCE,
        &[&a.request_id, &a.owner, &a.cursor, &done, &failed, &a.last_error, &a.now, &a.lease_until, &a.finished],
    )?;
    Ok(n == 1)
}

pub(super) fn cancel(c: &mut Conn, request_id: &str, now: Millis) -> R<Option<BulkRow>> {
    c.exec(bulk::CANCEL, &[&request_id, &now])?;
    get(c, request_id)
}
