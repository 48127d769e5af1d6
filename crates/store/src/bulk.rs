//! Bulk operations (DESIGN §9): one command or event applied to every entity matching a
//! filter, as one durable operation. The store keeps each as a row of `bulk_operations`
//! ([`BulkRow`]): what to do, the filter (opaque JSON, resolved by the engine on every
//! page), the reason, the rate, and its progress — where the next page starts, how many
//! entities were done and failed. An engine instance runs one at a time under a lease
//! ([`Store::bulk_claim`](crate::Store::bulk_claim)); each page's progress is written with
//! [`Store::bulk_advance`](crate::Store::bulk_advance) after its commands, which carry a
//! request id per entity, so a page run again after a crash replays rather than repeats.
//!
//! The statements are written once for both stores (`$N`, in order of first appearance;
//! SQLite reads them as `?N`).

use serde_json::Value;

use crate::Millis;

/// A bulk operation as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct BulkRow {
    /// Its request id: how it is named, and the prefix of its entities' request ids.
    pub request_id: String,
    /// `pause`, `resume`, `retry`, `release`, `kill`, or `raise` (with `event`).
    pub action: String,
    /// The event raised, for `raise`.
    pub event: Option<String>,
    /// The event's parameters (null: none).
    pub params: Value,
    /// Which entities: the filter as given (machine, state, status, prefix, health).
    pub filter: Value,
    /// Why, as the operator said.
    pub reason: String,
    /// At most this many entities a second.
    pub rate: u32,
    /// `running`, `done` or `canceled`.
    pub status: String,
    /// How many matched when it started (counted up to a bound).
    pub total: u64,
    /// Where the next page starts (`None`: at the beginning).
    pub cursor: Option<String>,
    /// Entities commanded (or, for a replay, found commanded).
    pub done: u64,
    /// Entities whose command was refused.
    pub failed: u64,
    /// The latest refusal, if any.
    pub last_error: Option<String>,
    /// The engine instance running it, while leased.
    pub owner: Option<String>,
    /// When it was started, last advanced, and ended.
    pub created_at: Millis,
    /// When it last advanced.
    pub updated_at: Millis,
    /// When it ended (done or canceled).
    pub ended_at: Option<Millis>,
    /// For `raise`: the priority of the work its events start (`None`: their event's
    /// declared priority, less `settle_core::limits::BACKGROUND`: below a request's).
    pub priority: Option<i64>,
}

impl BulkRow {
    /// A new bulk operation, running from the start.
    pub fn new(request_id: String, action: String, filter: Value, reason: String, rate: u32, now: Millis) -> BulkRow {
        BulkRow {
            request_id,
            action,
            event: None,
            params: Value::Null,
            filter,
            reason,
            rate,
            status: "running".into(),
            total: 0,
            cursor: None,
            done: 0,
            failed: 0,
            last_error: None,
            owner: None,
            created_at: now,
            updated_at: now,
            ended_at: None,
            priority: None,
        }
    }
}

/// One page of a bulk operation done: what [`Store::bulk_advance`](crate::Store::bulk_advance)
/// writes, fenced by the owner's lease.
#[derive(Debug, Clone, PartialEq)]
pub struct BulkAdvance {
    /// The bulk operation.
    pub request_id: String,
    /// The instance holding it.
    pub owner: String,
    /// Now.
    pub now: Millis,
    /// The lease, renewed until then.
    pub lease_until: Millis,
    /// Where the next page starts.
    pub cursor: Option<String>,
    /// Entities of the page commanded.
    pub done: u64,
    /// Entities of the page refused.
    pub failed: u64,
    /// The page's latest refusal.
    pub last_error: Option<String>,
    /// The last page: it is done.
    pub finished: bool,
}

pub(crate) const BULK_COLS: &str = "request_id, action, event, params, filter, reason, rate, status, total, cursor, \
     done, failed, last_error, owner, created_at, updated_at, ended_at, priority";

/// Inserts a new one; a request id seen before inserts nothing.
pub(crate) const INSERT: &str = "INSERT INTO bulk_operations (request_id, action, event, params, filter, reason, rate, \
     status, total, done, failed, created_at, updated_at, priority) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, 'running', $8, 0, 0, $9, $9, $10) ON CONFLICT (request_id) DO NOTHING";

pub(crate) fn select_one() -> String {
    format!("SELECT {BULK_COLS} FROM bulk_operations WHERE request_id = $1")
}

pub(crate) fn select_newest() -> String {
    format!("SELECT {BULK_COLS} FROM bulk_operations ORDER BY id DESC LIMIT $1")
}

/// The oldest running one whose lease is free (or the caller's), leased to the caller. The
/// outer condition repeats the inner one: a concurrent claim re-checks it on the row it
/// waited for, so two instances never both take it.
pub(crate) fn claim() -> String {
    let free = "status = 'running' AND (owner IS NULL OR owner = $1 OR lease_until < $3)";
    format!(
        "UPDATE bulk_operations SET owner = $1, lease_until = $2 \
         WHERE id = (SELECT id FROM bulk_operations WHERE {free} ORDER BY id LIMIT 1) AND {free} \
         RETURNING {BULK_COLS}"
    )
}

/// A page's progress, only by the owner of a running one.
pub(crate) const ADVANCE: &str = "UPDATE bulk_operations SET cursor = $3, done = done + $4, failed = failed + $5, \
     last_error = COALESCE($6, last_error), updated_at = $7, lease_until = $8, \
     status = CASE WHEN $9 THEN 'done' ELSE status END, ended_at = CASE WHEN $9 THEN $7 ELSE ended_at END \
     WHERE request_id = $1 AND owner = $2 AND status = 'running'";

/// Cancels a running one.
pub(crate) const CANCEL: &str = "UPDATE bulk_operations SET status = 'canceled', ended_at = $2, updated_at = $2, \
     owner = NULL WHERE request_id = $1 AND status = 'running'";

/// The statement for SQLite: `?N` for `$N`.
pub(crate) fn sqlite(sql: &str) -> String {
    sql.replace('$', "?")
}

/// A bulk operation, from `SELECT {BULK_COLS}`.
pub(crate) fn decode<C: crate::decode::Columns>(r: &C) -> Result<BulkRow, C::Error> {
    let count = |col| r.int(col).map(|n| n.max(0) as u64);
    Ok(BulkRow {
        request_id: r.text(0)?,
        action: r.text(1)?,
        event: r.opt_text(2)?,
        params: match r.opt_text(3)? {
            Some(t) => serde_json::from_str(&t).unwrap_or(Value::Null),
            None => Value::Null,
        },
        filter: r.json(4)?,
        reason: r.text(5)?,
        rate: r.small(6)?,
        status: r.text(7)?,
        total: count(8)?,
        cursor: r.opt_text(9)?,
        done: count(10)?,
        failed: count(11)?,
        last_error: r.opt_text(12)?,
        owner: r.opt_text(13)?,
        created_at: r.int(14)?,
        updated_at: r.int(15)?,
        ended_at: r.opt_int(16)?,
        priority: r.opt_int(17)?,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn sqlite_reads_numbered_parameters() {
        assert_eq!(super::sqlite("a = $1 AND b = $12"), "a = ?1 AND b = ?12");
        assert!(!super::claim().contains('?'));
    }
}
