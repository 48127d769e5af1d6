//! Operations (DESIGN §1): what an external request asked for, opened by its first write
//! ([`OpenOperation`]) and ended once nothing it reached is busy or queued ([`OperationRow`]).

use serde_json::Value;

use crate::Millis;

/// An operation opened by an external request (DESIGN §1 "Operations").
#[derive(Debug, Clone, PartialEq)]
pub struct OpenOperation {
    /// Caller-supplied idempotency key, or generated.
    pub request_id: String,
    /// What was asked, e.g. `server.create` or `server:new` or `server.pause`.
    pub name: String,
    /// Free-form dimensions (JSON object).
    pub dimensions: Value,
    /// Its priority (higher first): the work it starts waits in a limit's line by it.
    pub priority: i64,
}

/// A stored operation.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct OperationRow {
    /// Store id.
    pub id: i64,
    /// Its request id.
    pub request_id: String,
    /// What was asked.
    pub name: String,
    /// The entity's machine.
    pub machine: Option<String>,
    /// The entity's key.
    pub entity_key: Option<String>,
    /// When it started.
    pub started_at: Millis,
    /// When every entity it reached was at rest again.
    pub ended_at: Option<Millis>,
    /// When its first event was processed.
    pub first_response_at: Option<Millis>,
    /// `success`, `failed`, `canceled` or `hung`.
    pub outcome: Option<String>,
    /// The first error, if any.
    pub error: Option<String>,
    /// Engine restarts it lived through.
    pub restart_count: u32,
    /// Free-form dimensions.
    pub dimensions: Value,
}

/// Which operations a windowed page keeps ([`Store::operation_scan`](crate::Store::operation_scan)):
/// every criterion given must hold. Times are epoch ms; `after` inclusive, `before`
/// exclusive.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OperationFilter {
    /// This outcome (`success`, `failed`, `canceled`, `hung`), or `open`: not ended.
    pub outcome: Option<String>,
    /// Started on an entity of this machine.
    pub machine: Option<String>,
    /// This operation name.
    pub name: Option<String>,
    /// Started at or after.
    pub started_after: Option<Millis>,
    /// Started before.
    pub started_before: Option<Millis>,
}

/// A windowed page of operations: those of the window that pass the filter, newest first,
/// and where the window ended.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OperationWindow {
    /// The operations kept, newest first (at most the limit asked for).
    pub items: Vec<OperationRow>,
    /// The oldest store id the window looked at, when it was full (older ones remain to
    /// be looked at); `None`: the window reached the oldest operation.
    pub low: Option<i64>,
}
