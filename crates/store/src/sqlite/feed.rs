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
    feed::read(after, filter, limit, bound(c)?, |sql, numbers, values, history| {
        let mut params: Vec<&dyn ToSql> = numbers.iter().map(|n| n as &dyn ToSql).collect();
        params.extend(values.iter().map(|v| v as &dyn ToSql));
        let mut stmt = c.prepare_cached(&sqlite(sql))?;
        let mut rows = stmt.query(params.as_slice())?;
        let mut items = Vec::new();
        while let Some(r) = rows.next()? {
            items.push(if history {
                let row = history_from_row(r)?;
                FeedItem::Transition {
                    pos: FeedPos::history(r.get(11)?, row.id),
                    machine: r.get(12)?,
                    key: r.get(13)?,
                    row,
                }
            } else {
                let row = operation_from_row(r)?;
                FeedItem::Operation { pos: FeedPos::operation(r.get(12)?, row.id), row }
            });
        }
        Ok(items)
    })
}
