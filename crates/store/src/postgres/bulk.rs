//! PostgreSQL's bulk operations and counts: the statements of [`crate::bulk`] and
//! [`crate::page::count_sql`]. Each is one statement in autocommit, on a pooled
//! connection (a retry after a lost connection does what the first try did).

use postgres::types::ToSql;

use super::conn::{Conn, Failure};
use crate::bulk::{self, BulkAdvance, BulkRow};
use crate::{EntityFilter, Millis};

type R<T> = std::result::Result<T, Failure>;

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
pub(super) fn values(params: Vec<crate::page::Param>) -> Vec<Box<dyn ToSql + Sync>> {
    params
        .into_iter()
        .map(|p| -> Box<dyn ToSql + Sync> {
            match p {
                crate::page::Param::Text(t) => Box::new(t),
                crate::page::Param::Int(i) => Box::new(i),
            }
        })
        .collect()
}

pub(super) fn entity_count(c: &mut Conn, f: &EntityFilter, bound: u64) -> R<u64> {
    if let Some(n) = crate::page::count_from_counts(f, &super::read::entity_counts(c)?) {
        return Ok(n.min(bound.saturating_add(1)));
    }
    let present = present(c, f)?;
    let Some((sql, params)) = crate::page::count_sql(f, &present, bound, true) else { return Ok(0) };
    let values = values(params);
    let refs: Vec<&(dyn ToSql + Sync)> = values.iter().map(|v| v.as_ref()).collect();
    let n: i64 = c.one(&sql, &refs)?.try_get(0)?;
    Ok(n.max(0) as u64)
}

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
