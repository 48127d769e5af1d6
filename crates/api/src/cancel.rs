//! Canceling an operation: `POST /v1/operations/{id}/cancel`.

use serde::{Deserialize, Serialize};

use crate::{Bulk, Entity, Operation};

/// `POST /v1/operations/{id}/cancel`: why, and how long to wait.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CancelRequest {
    /// Why: recorded with the cancel (default: "cancel of operation …").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Also wait until the operation and every entity's undo have ended (at most 30 s);
    /// otherwise the answer comes once every entity's work in it has stopped.
    #[serde(default)]
    pub undone: bool,
}

/// What canceling an operation did.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CancelResult {
    /// The operation canceled, as it is now (it ends `canceled` once nothing of it is busy
    /// or queued).
    pub operation: Operation,
    /// The bulk operation that went through the entities it reached
    /// (`{request id}/cancel`).
    pub bulk: Bulk,
    /// The cancel had been asked before: nothing was started again.
    pub replayed: bool,
    /// The entities it reached, each with its part of the cancel.
    pub entities: Vec<CanceledEntity>,
}

/// One entity an operation reached, and what its cancel did there.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CanceledEntity {
    /// The entity as it is now.
    pub entity: Entity,
    /// Its part of the cancel (`{request id}/cancel/{entity id}`): open while its undo
    /// runs; null until the cancel reached it.
    pub part: Option<Operation>,
    /// What the cancel did there, as its history records it (null: nothing of the
    /// operation was there).
    pub did: Option<String>,
}
