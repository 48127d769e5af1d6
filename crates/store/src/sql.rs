//! What the SQL backends share: column lists (both schemas have the same columns in the
//! same order), JSON text encoding, and which batch operations need a savepoint.

use crate::types::Op;

/// The columns an `EntityRow` is decoded from, in order.
pub(crate) const ENTITY_COLS: &str = "id, machine, key, state, properties, version, retry, created_at, entered_at, \
     auto_at, due_at, lease_owner, lease_until, request_id, fired, timer_at, run_status, sleep_until, recent_errors, \
     event_id, machine_hash";

/// The columns an `OperationRow` is decoded from, in order.
pub(crate) const OPERATION_COLS: &str = "id, request_id, name, machine, entity_key, started_at, ended_at, \
     first_response_at, outcome, error, restart_count, dimensions";

/// JSON stored as text (properties, params, fired events, recent errors, dimensions).
pub(crate) fn json_text(v: &impl serde::Serialize) -> String {
    serde_json::to_string(v).expect("JSON values serialize")
}

/// Whether an op can fail after writing something, so it needs a savepoint to undo alone.
/// (On PostgreSQL a failing statement also aborts the transaction; the ops that can fail
/// in the database, e.g. through application SQL, are the same ones.)
pub(crate) fn needs_savepoint(op: &Op) -> bool {
    match op {
        Op::Commit(c) => {
            !(c.sql.is_empty() && c.creates.is_empty() && c.pushes.is_empty() && c.preconditions.is_empty())
        }
        Op::Command { .. } => true,
        Op::Create(_) | Op::Push(_) | Op::Release(_) | Op::Renew { .. } | Op::MarkHung { .. } => false,
    }
}
