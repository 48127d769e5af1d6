//! The bodies of bulk operations (`/v1/bulk`): one command or event for every entity
//! matching a filter, as one durable operation with a reason, a rate and its progress.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::Entity;

/// Which entities: every criterion given must hold, and at least one must be given.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct BulkFilter {
    /// Only this machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine: Option<String>,
    /// Only this state (a parent state: its substates).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// Only this run status: active, paused, sleeping, fault, failed, killed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    /// Only keys starting with this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    /// Only states of this health: `error` (the failing) or `ok`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<String>,
    /// Only entities for which this property expression holds (the guards' language:
    /// `props.region == "eu" && in_state('up')`); one it cannot be evaluated on does not.
    #[serde(default, rename = "where", skip_serializing_if = "Option::is_none")]
    pub expr: Option<String>,
    /// Only entities whose newest error contains this text (ignoring case).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Only entities created at or after this time: RFC 3339, or `-2h` (that long ago).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_after: Option<String>,
    /// Only entities created before this time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_before: Option<String>,
    /// Only entities that entered their state at or after this time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entered_after: Option<String>,
    /// Only entities that entered their state before this time (`-1h`: in it for more
    /// than an hour).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entered_before: Option<String>,
}

/// The time members of a stored filter (epoch ms) as the API writes them (RFC 3339).
#[cfg(feature = "store")]
fn filter_from_stored(stored: &Value) -> BulkFilter {
    let mut v = stored.clone();
    if let Some(o) = v.as_object_mut() {
        // A kill's cascade (the engine's own): its reason names the entity.
        o.remove("successors_of");
        // An operation's cancel (the engine's own): its reason names the operation.
        o.remove("reached_by");
        for (_, member) in o.iter_mut() {
            if let Some(ms) = member.as_i64() {
                *member = Value::String(settle_core::time::format_time(ms));
            }
        }
    }
    serde_json::from_value(v).unwrap_or_default()
}

/// `POST /v1/bulk`: what to do to which entities. With `dry_run`, nothing is done: the
/// answer says how many match and shows a sample.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct BulkRequest {
    /// `pause`, `resume`, `retry`, `release`, `kill`, or `raise` (with `event`).
    pub action: String,
    /// The event to raise (`raise` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<String>,
    /// The event's parameters (`raise` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub params: Option<Value>,
    /// Which entities.
    pub filter: BulkFilter,
    /// Why (required unless `dry_run`): recorded with the operation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// At most this many entities a second (default 1000, at most 100000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<u32>,
    /// For `raise`: the priority of the work its events start, from -1000 to 1000
    /// (default: each event's declared priority less 10, below live requests).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i64>,
    /// Only count and sample what matches.
    #[serde(default)]
    pub dry_run: bool,
}

/// A dry run's answer: how many match now (exactly up to `bound`, then `more`), and the
/// first few.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BulkDryRun {
    /// The action asked for.
    pub action: String,
    /// The filter, as understood.
    pub filter: BulkFilter,
    /// How many match.
    pub count: u64,
    /// More than `bound` match.
    pub more: bool,
    /// The bound of an exact count.
    pub bound: u64,
    /// The first few, by id.
    pub sample: Vec<Entity>,
}

/// A bulk operation and its progress.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Bulk {
    /// Its request id (each entity's command carries `{request_id}/{entity id}`).
    pub request_id: String,
    /// `pause`, `resume`, `retry`, `release`, `kill` or `raise`; `cancel` for an
    /// operation's cancel.
    pub action: String,
    /// The event raised, for `raise`.
    pub event: Option<String>,
    /// The event's parameters (null: none, as for a command).
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub params: Value,
    /// Which entities.
    pub filter: BulkFilter,
    /// Why.
    pub reason: String,
    /// Entities a second at most.
    pub rate: u32,
    /// For `raise`: the priority its events were raised with (absent: their default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i64>,
    /// `running`, `done` or `canceled`.
    pub status: String,
    /// How many matched when it started.
    pub total: u64,
    /// Entities commanded.
    pub done: u64,
    /// Entities whose command was refused.
    pub failed: u64,
    /// How many of `total` are left (0 once it ended).
    pub remaining: u64,
    /// The latest refusal (`machine/key: why`).
    pub last_error: Option<String>,
    /// When it started (ms).
    pub created_at: i64,
    /// When it last advanced (ms).
    pub updated_at: i64,
    /// When it ended (ms).
    pub ended_at: Option<i64>,
}

/// `GET /v1/bulk`: the newest bulk operations, newest first.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BulkList {
    /// The bulk operations.
    pub items: Vec<Bulk>,
}

#[cfg(feature = "store")]
impl From<&settle_store::BulkRow> for Bulk {
    fn from(b: &settle_store::BulkRow) -> Self {
        let filter = filter_from_stored(&b.filter);
        let remaining = if b.status == "running" { b.total.saturating_sub(b.done + b.failed) } else { 0 };
        Bulk {
            request_id: b.request_id.clone(),
            action: b.action.clone(),
            event: b.event.clone(),
            params: b.params.clone(),
            filter,
            reason: b.reason.clone(),
            rate: b.rate,
            priority: b.priority,
            status: b.status.clone(),
            total: b.total,
            done: b.done,
            failed: b.failed,
            remaining,
            last_error: b.last_error.clone(),
            created_at: b.created_at,
            updated_at: b.updated_at,
            ended_at: b.ended_at,
        }
    }
}
