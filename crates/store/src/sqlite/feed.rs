//! SQLite's change feed: the statements of [`crate::feed`] on a read connection. The file
//! has one writer, which numbers its writes (`feed_clock`): every write up to the number
//! read first is committed, so it bounds the read.

use rusqlite::Connection;
use rusqlite::types::ToSql;

use super::read::{history_from_row, operation_from_row};
use crate::bulk::sqlite;
use crate::feed::{self, FeedFilter, FeedItem, FeedPage, FeedPos};

fn bound(c: &Connection) -> rusqlite::Result<i64> {
    c.prepare_cached("SELECT seq + 1 FROM feed_clock")?.query_row([], |r| r.get(0))
}

pub(super) fn head(c: &Connection) -> rusqlite::Result<FeedPos> {
    Ok(FeedPos::after_commit(bound(c)? - 1))
}

pub(super) fn read(c: &Connection, after: FeedPos, filter: &FeedFilter, limit: usize) -> rusqlite::Result<FeedPage> {
    let limit = limit.clamp(1, feed::MAX_PAGE);
    let bound = bound(c)?;
    let n = limit as i64;
    let mut history = Vec::new();
    if filter.transitions {
        let id = after.id_bound(0);
        let mut params: Vec<&dyn ToSql> = vec![&after.commit, &id, &bound, &n];
        let values = feed::history_filters(filter);
        params.extend(values.iter().map(|v| v as &dyn ToSql));
        let mut stmt = c.prepare_cached(&sqlite(&feed::history_sql(filter)))?;
        let mut rows = stmt.query(params.as_slice())?;
        while let Some(r) = rows.next()? {
            let row = history_from_row(r)?;
            history.push(FeedItem::Transition {
                pos: FeedPos::history(r.get(11)?, row.id),
                machine: r.get(12)?,
                key: r.get(13)?,
                row,
            });
        }
    }
    let mut operations = Vec::new();
    if filter.wants_operations() {
        let id = after.id_bound(1);
        let mut params: Vec<&dyn ToSql> = vec![&after.commit, &id, &bound, &n];
        let values = feed::operation_filters(filter);
        params.extend(values.iter().map(|v| v as &dyn ToSql));
        let mut stmt = c.prepare_cached(&sqlite(&feed::operation_sql(filter)))?;
        let mut rows = stmt.query(params.as_slice())?;
        while let Some(r) = rows.next()? {
            let row = operation_from_row(r)?;
            operations.push(FeedItem::Operation { pos: FeedPos::operation(r.get(12)?, row.id), row });
        }
    }
    Ok(feed::page(after, bound, limit, history, operations))
}
