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
    let bound = bound(c)?;
    feed::read(after, filter, limit, bound, |sql, numbers, values, history| {
        let mut params: Vec<&(dyn ToSql + Sync)> = numbers.iter().map(|n| n as &(dyn ToSql + Sync)).collect();
        params.extend(values.iter().map(|v| v as &(dyn ToSql + Sync)));
        let rows = c.query(sql, &params)?;
        rows.iter()
            .map(|r| {
                Ok(if history {
                    let row = history_from_row(r)?;
                    FeedItem::Transition {
                        pos: FeedPos::history(r.try_get(11)?, row.id),
                        machine: r.try_get(12)?,
                        key: r.try_get(13)?,
                        row,
                    }
                } else {
                    let row = operation_from_row(r)?;
                    FeedItem::Operation { pos: FeedPos::operation(r.try_get(12)?, row.id), row }
                })
            })
            .collect()
    })
}
