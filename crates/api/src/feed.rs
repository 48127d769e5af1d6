//! The change feed's data (`GET /v1/feed`): each server-sent event carries one [`Change`],
//! and its `id` is the position a client resumes after (`Last-Event-ID`).

use serde::{Deserialize, Serialize};

use crate::{HistoryEntry, Operation};

/// One change: a history row of an entity (a transition, rejection, fault or operator
/// command), or an operation that ended.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Change {
    /// Its position in the feed (the event's `id`): resume after it.
    pub id: String,
    /// `transition` or `operation`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The entity's machine (null for a transition of an entity since purged).
    pub machine: Option<String>,
    /// The entity's key.
    pub key: Option<String>,
    /// The history row (a `transition`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transition: Option<HistoryEntry>,
    /// The operation as it ended (an `operation`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation: Option<Operation>,
}

#[cfg(feature = "store")]
impl From<&settle_store::FeedItem> for Change {
    fn from(item: &settle_store::FeedItem) -> Self {
        match item {
            settle_store::FeedItem::Transition { pos, machine, key, row } => Change {
                id: pos.to_string(),
                kind: "transition".into(),
                machine: machine.clone(),
                key: key.clone(),
                transition: Some(HistoryEntry::from(row)),
                operation: None,
            },
            settle_store::FeedItem::Operation { pos, row } => Change {
                id: pos.to_string(),
                kind: "operation".into(),
                machine: row.machine.clone(),
                key: row.entity_key.clone(),
                transition: None,
                operation: Some(Operation::from(row)),
            },
        }
    }
}
