//! The change feed (DESIGN §9): every history row (transitions, rejections, faults,
//! commands) and every operation's end, in the order they committed, from a [`FeedPos`]
//! a client can resume from.
//!
//! A position is `(commit, kind, id)`: `commit` is the writing transaction's id on
//! PostgreSQL (`pg_current_xact_id`) and the write's number on SQLite (`feed_clock`);
//! `kind` puts a commit's history rows before its operation ends; `id` is the row's. A read
//! takes only commits that can no longer be joined by an older one — on PostgreSQL those
//! older than the oldest transaction still running anywhere (`pg_snapshot_xmin`), which
//! makes a position safe to resume from whichever instance wrote what; on SQLite every
//! committed write, as the file has one writer. So a client that resumes from the last
//! position it saw misses nothing (within the retention window: pruned rows are gone).

use std::fmt;
use std::str::FromStr;

use crate::{HistoryRow, OperationRow};

/// Where a history row or an operation's end sits in the feed; ordered as committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct FeedPos {
    /// The commit (PostgreSQL transaction id, SQLite write number).
    pub commit: i64,
    /// 0: a history row; 1: an operation's end; 2: the whole commit (a reader's bound).
    pub kind: u8,
    /// The row's id.
    pub id: i64,
}

impl FeedPos {
    /// Before everything the feed holds.
    pub const START: FeedPos = FeedPos { commit: 0, kind: 0, id: 0 };
    const HISTORY: u8 = 0;
    const OPERATION: u8 = 1;
    const WHOLE: u8 = 2;

    /// Just after every row of commits up to and including `commit`.
    pub fn after_commit(commit: i64) -> FeedPos {
        FeedPos { commit, kind: Self::WHOLE, id: 0 }
    }

    /// The position of history row `id` of `commit`.
    pub fn history(commit: i64, id: i64) -> FeedPos {
        FeedPos { commit, kind: Self::HISTORY, id }
    }

    /// The position of the end of operation `id` in `commit`.
    pub fn operation(commit: i64, id: i64) -> FeedPos {
        FeedPos { commit, kind: Self::OPERATION, id }
    }

    /// The row id after which rows of `kind` in this position's commit come after it
    /// (the bound of a `commit = c AND id > bound` condition).
    pub(crate) fn id_bound(self, kind: u8) -> i64 {
        match self.kind.cmp(&kind) {
            std::cmp::Ordering::Less => i64::MIN,
            std::cmp::Ordering::Equal => self.id,
            std::cmp::Ordering::Greater => i64::MAX,
        }
    }
}

/// `commit-kind-id`, e.g. `8812-0-1534`; `0` is [`FeedPos::START`].
impl fmt::Display for FeedPos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}-{}", self.commit, self.kind, self.id)
    }
}

impl FromStr for FeedPos {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad =
            || format!("`{s}` is not a feed position (an event's `id`, like `8812-0-1534`, or `0` for the start)");
        if s == "0" {
            return Ok(FeedPos::START);
        }
        let mut parts = s.split('-');
        let (Some(c), Some(k), Some(i), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
            return Err(bad());
        };
        let commit: i64 = c.parse().map_err(|_| bad())?;
        let kind: u8 = k.parse().map_err(|_| bad())?;
        let id: i64 = i.parse().map_err(|_| bad())?;
        if commit < 0 || kind > Self::WHOLE || (kind == Self::WHOLE && id != 0) {
            return Err(bad());
        }
        Ok(FeedPos { commit, kind, id })
    }
}

/// Which changes a reader wants; every field narrows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FeedFilter {
    /// The entity's machine.
    pub machine: Option<String>,
    /// The entity's key (with `machine`, one entity).
    pub key: Option<String>,
    /// History rows that entered this state (operation ends have none: not sent).
    pub state: Option<String>,
    /// The request that caused it.
    pub request_id: Option<String>,
    /// History rows (transitions, rejections, faults, commands).
    pub transitions: bool,
    /// Operations' ends.
    pub operations: bool,
}

impl FeedFilter {
    /// Everything.
    pub fn all() -> FeedFilter {
        FeedFilter { transitions: true, operations: true, ..FeedFilter::default() }
    }

    fn wants_operations(&self) -> bool {
        self.operations && self.state.is_none()
    }
}

/// One change.
#[derive(Debug, Clone, PartialEq)]
pub enum FeedItem {
    /// A history row of an entity.
    Transition {
        /// Where it sits.
        pos: FeedPos,
        /// The entity's machine and key (`None` once the entity was purged).
        machine: Option<String>,
        /// The entity's key.
        key: Option<String>,
        /// The row.
        row: HistoryRow,
    },
    /// An operation that ended.
    Operation {
        /// Where it sits.
        pos: FeedPos,
        /// The operation as it ended.
        row: OperationRow,
    },
}

impl FeedItem {
    /// Where it sits.
    pub fn pos(&self) -> FeedPos {
        match self {
            FeedItem::Transition { pos, .. } | FeedItem::Operation { pos, .. } => *pos,
        }
    }
}

/// What a read of the feed answers.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct FeedPage {
    /// The changes after the position read from, in order.
    pub items: Vec<FeedItem>,
    /// Everything up to here was read: the position to read on from (past `items`, and past
    /// the changes the filter left out).
    pub until: FeedPos,
    /// More may be readable at once (the page was full).
    pub more: bool,
}

/// Largest page a read answers.
pub const MAX_PAGE: usize = 1000;

/// The statement reading history rows of the feed: `$1` commit after, `$2` id bound within
/// it, `$3` the first commit not readable, `$4` limit, then the filter's values in the
/// order of [`history_filters`]. Columns: the history row's (as `history_list` reads
/// them), then `xid` (11), the entity's machine (12) and key (13).
fn history_sql(f: &FeedFilter) -> String {
    let mut sql = String::from(
        "SELECT h.id, h.entity_id, h.from_state, h.to_state, h.kind, h.action, h.event, h.retry, \
         h.request_id, h.at, h.detail, h.xid, e.machine, e.key \
         FROM history h LEFT JOIN entities e ON e.id = h.entity_id \
         WHERE h.xid >= $1 AND h.xid < $3 AND (h.xid > $1 OR h.id > $2)",
    );
    let mut n = 4;
    for (column, value) in
        [("e.machine", &f.machine), ("e.key", &f.key), ("h.to_state", &f.state), ("h.request_id", &f.request_id)]
    {
        if value.is_some() {
            n += 1;
            sql.push_str(&format!(" AND {column} = ${n}"));
        }
    }
    sql.push_str(" ORDER BY h.xid, h.id LIMIT $4");
    sql
}

/// The filter's values for [`history_sql`], in order.
fn history_filters(f: &FeedFilter) -> Vec<&str> {
    [&f.machine, &f.key, &f.state, &f.request_id].into_iter().filter_map(|v| v.as_deref()).collect()
}

/// The statement reading operation ends of the feed; parameters as [`history_sql`]'s, the
/// filter's values in the order of [`operation_filters`]. Columns: `OPERATION_COLS`, then
/// `end_xid` (12).
fn operation_sql(f: &FeedFilter) -> String {
    let mut sql = format!(
        "SELECT {}, o.end_xid FROM operations o \
         WHERE o.end_xid >= $1 AND o.end_xid < $3 AND (o.end_xid > $1 OR o.id > $2)",
        crate::sql::OPERATION_COLS.split(", ").map(|c| format!("o.{}", c.trim())).collect::<Vec<_>>().join(", ")
    );
    let mut n = 4;
    for (column, value) in [("o.machine", &f.machine), ("o.entity_key", &f.key), ("o.request_id", &f.request_id)] {
        if value.is_some() {
            n += 1;
            sql.push_str(&format!(" AND {column} = ${n}"));
        }
    }
    sql.push_str(" ORDER BY o.end_xid, o.id LIMIT $4");
    sql
}

/// The filter's values for [`operation_sql`], in order.
fn operation_filters(f: &FeedFilter) -> Vec<&str> {
    [&f.machine, &f.key, &f.request_id].into_iter().filter_map(|v| v.as_deref()).collect()
}

/// A page of the feed after `after`, below commit `bound` (read first, by the dialect):
/// `query(sql, numbers, values, history)` runs a statement of [`history_sql`] (`history`)
/// or [`operation_sql`] with `numbers` as `$1`–`$4` and the filter's `values` after them,
/// and decodes its rows.
pub(crate) fn read<E>(
    after: FeedPos,
    filter: &FeedFilter,
    limit: usize,
    bound: i64,
    mut query: impl FnMut(&str, [i64; 4], &[&str], bool) -> Result<Vec<FeedItem>, E>,
) -> Result<FeedPage, E> {
    let limit = limit.clamp(1, MAX_PAGE);
    let n = limit as i64;
    let history = if filter.transitions {
        let numbers = [after.commit, after.id_bound(FeedPos::HISTORY), bound, n];
        query(&history_sql(filter), numbers, &history_filters(filter), true)?
    } else {
        Vec::new()
    };
    let operations = if filter.wants_operations() {
        let numbers = [after.commit, after.id_bound(FeedPos::OPERATION), bound, n];
        query(&operation_sql(filter), numbers, &operation_filters(filter), false)?
    } else {
        Vec::new()
    };
    Ok(page(after, bound, limit, history, operations))
}

/// One page of the feed from the two reads: `history` and `operations` each as read (at
/// most `limit` rows, in order, below commit `bound`); the page ends where the shorter
/// of the full reads ended, or at the bound.
fn page(after: FeedPos, bound: i64, limit: usize, history: Vec<FeedItem>, operations: Vec<FeedItem>) -> FeedPage {
    let mut until = FeedPos::after_commit(bound - 1).max(after);
    for read in [&history, &operations] {
        if read.len() >= limit
            && let Some(last) = read.last()
        {
            until = until.min(last.pos());
        }
    }
    let mut items: Vec<FeedItem> = history.into_iter().chain(operations).filter(|i| i.pos() <= until).collect();
    items.sort_by_key(FeedItem::pos);
    items.truncate(limit);
    if items.len() == limit
        && let Some(last) = items.last()
    {
        until = last.pos();
    }
    let more = until < FeedPos::after_commit(bound - 1);
    FeedPage { items, until, more }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::HistoryKind;

    fn transition(commit: i64, id: i64) -> FeedItem {
        FeedItem::Transition {
            pos: FeedPos::history(commit, id),
            machine: None,
            key: None,
            row: HistoryRow {
                id,
                entity_id: 1,
                from: None,
                to: None,
                kind: HistoryKind::Create,
                action: None,
                event: None,
                retry: 0,
                request_id: None,
                at: 0,
                detail: None,
            },
        }
    }

    fn ended(commit: i64, id: i64) -> FeedItem {
        FeedItem::Operation {
            pos: FeedPos::operation(commit, id),
            row: OperationRow {
                id,
                request_id: String::new(),
                name: String::new(),
                machine: None,
                entity_key: None,
                started_at: 0,
                ended_at: None,
                first_response_at: None,
                outcome: None,
                error: None,
                restart_count: 0,
                dimensions: serde_json::Value::Null,
            },
        }
    }

    #[test]
    fn positions_print_parse_and_order_as_committed() {
        let p = FeedPos::history(8812, 1534);
        assert_eq!(p.to_string(), "8812-0-1534");
        assert_eq!("8812-0-1534".parse::<FeedPos>(), Ok(p));
        assert_eq!("0".parse::<FeedPos>(), Ok(FeedPos::START));
        for bad in ["", "x", "1-2", "1-0-2-3", "-1-0-0", "1-3-0", "1-2-5", "1-0-x"] {
            let e = bad.parse::<FeedPos>().unwrap_err();
            assert!(e.contains("not a feed position"), "{bad}: {e}");
        }
        // A commit's history rows, then its operation ends, then the next commit.
        assert!(FeedPos::history(5, 900) < FeedPos::operation(5, 1));
        assert!(FeedPos::operation(5, 900) < FeedPos::after_commit(5));
        assert!(FeedPos::after_commit(5) < FeedPos::history(6, 1));
        assert_eq!(FeedPos::history(5, 7).id_bound(0), 7);
        assert_eq!(FeedPos::history(5, 7).id_bound(1), i64::MIN, "every end of commit 5 comes after");
        assert_eq!(FeedPos::after_commit(5).id_bound(1), i64::MAX, "nothing of commit 5 comes after");
    }

    #[test]
    fn a_page_ends_where_a_full_read_ended_or_at_the_bound() {
        // Both reads short: everything below the bound was read.
        let p = page(FeedPos::START, 10, 3, vec![transition(4, 1)], vec![ended(4, 9)]);
        assert_eq!(
            p.items.iter().map(FeedItem::pos).collect::<Vec<_>>(),
            [FeedPos::history(4, 1), FeedPos::operation(4, 9)]
        );
        assert_eq!(p.until, FeedPos::after_commit(9));
        assert!(!p.more);
        // History full at commit 6: operation ends after it wait for the next page.
        let p = page(FeedPos::START, 10, 2, vec![transition(5, 1), transition(6, 2)], vec![ended(7, 3)]);
        assert_eq!(p.items.len(), 2);
        assert_eq!(p.until, FeedPos::history(6, 2));
        assert!(p.more);
        // Interleaved and more than a page together: the first `limit` in order.
        let p = page(FeedPos::START, 10, 2, vec![transition(5, 1), transition(7, 2)], vec![ended(6, 3)]);
        assert_eq!(
            p.items.iter().map(FeedItem::pos).collect::<Vec<_>>(),
            [FeedPos::history(5, 1), FeedPos::operation(6, 3)]
        );
        assert_eq!(p.until, FeedPos::operation(6, 3));
        assert!(p.more);
        // Nothing new and nothing readable past the position: it stays.
        let p = page(FeedPos::history(20, 4), 10, 5, vec![], vec![]);
        assert_eq!(p.until, FeedPos::history(20, 4));
        assert!(!p.more);
    }
}
