//! PostgreSQL's change feed: the statements of [`crate::feed`] on a pooled connection,
//! bounded by the oldest transaction still running anywhere (`pg_snapshot_xmin`), read
//! first: every transaction below it has ended, so the reads after it see all they wrote,
//! and whatever commits later has a larger id.

use postgres::types::ToSql;

use super::conn::{Conn, Failure};
use super::read::{history_from_row, operation_from_row};
use crate::feed::{self, FeedFilter, FeedItem, FeedPage, FeedPos};

type R<T> = std::result::Result<T, Failure>;

fn bound(c: &mut Conn) -> R<i64> {
    Ok(c.one("SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint", &[])?.try_get(0)?)
}

pub(super) fn head(c: &mut Conn) -> R<FeedPos> {
    Ok(FeedPos::after_commit(bound(c)? - 1))
}

pub(super) fn read(c: &mut Conn, after: FeedPos, filter: &FeedFilter, limit: usize) -> R<FeedPage> {
    let limit = limit.clamp(1, feed::MAX_PAGE);
    let bound = bound(c)?;
    let n = limit as i64;
    let mut history = Vec::new();
    if filter.transitions {
        let id = after.id_bound(0);
        let values = feed::history_filters(filter);
        let mut params: Vec<&(dyn ToSql + Sync)> = vec![&after.commit, &id, &bound, &n];
        params.extend(values.iter().map(|v| v as &(dyn ToSql + Sync)));
        for r in c.query(&feed::history_sql(filter), &params)? {
            let row = history_from_row(&r)?;
            history.push(FeedItem::Transition {
                pos: FeedPos::history(r.try_get(11)?, row.id),
                machine: r.try_get(12)?,
                key: r.try_get(13)?,
                row,
            });
        }
    }
    let mut operations = Vec::new();
    if filter.wants_operations() {
        let id = after.id_bound(1);
        let values = feed::operation_filters(filter);
        let mut params: Vec<&(dyn ToSql + Sync)> = vec![&after.commit, &id, &bound, &n];
        params.extend(values.iter().map(|v| v as &(dyn ToSql + Sync)));
        for r in c.query(&feed::operation_sql(filter), &params)? {
            let row = operation_from_row(&r)?;
            operations.push(FeedItem::Operation { pos: FeedPos::operation(r.try_get(12)?, row.id), row });
        }
    }
    Ok(feed::page(after, bound, limit, history, operations))
}
