//! The API's JSON types: what requests carry and responses hold. They are the deliberate
//! serializable boundary (the store's and core's types are not `Serialize`), and their
//! shapes match `settle ... --json` of the CLI. Times are milliseconds since the Unix epoch.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use settle_engine::EventOutcome;
use settle_store::{EntityRow, HistoryRow, OperationRow};
use utoipa::{IntoParams, ToSchema};

/// An entity.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Entity {
    /// Its machine.
    pub machine: String,
    /// Its key, unique within the machine.
    pub key: String,
    /// The current state.
    pub state: String,
    /// Bumped by every transition.
    pub version: i64,
    /// Retry count of the current state entry.
    pub retry: u32,
    /// The entity's properties.
    #[schema(value_type = Object)]
    pub properties: Map<String, Value>,
    /// When it was created (ms).
    pub created_at: i64,
    /// When the current state was entered (ms).
    pub entered_at: i64,
    /// When it next has work (ms); null when dormant.
    pub due_at: Option<i64>,
    /// The engine instance holding its lease, if any.
    pub lease_owner: Option<String>,
    /// active, paused, sleeping, fault, failed or killed.
    pub run_status: String,
    /// Until when a sleeping or backing-off entity waits (ms).
    pub sleep_until: Option<i64>,
    /// The events valid in the current state (single-entity reads only).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub permitted_events: Option<Vec<String>>,
    /// When the lease ends (single-entity reads only).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub lease_until: Option<i64>,
    /// Errors the entity's fault policy counts now (single-entity reads only).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub recent_errors: Option<u32>,
    /// Events queued in its inbox, in processing order (single-entity reads only).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub inbox: Option<Vec<QueuedEvent>>,
}

/// An event waiting in an entity's inbox.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct QueuedEvent {
    /// The event (`$successors` for a change notice, `$agent` for an agent's report).
    pub event: String,
    /// Its parameters.
    #[schema(value_type = Object)]
    pub params: Value,
}

impl From<&EntityRow> for Entity {
    fn from(e: &EntityRow) -> Self {
        Entity {
            machine: e.machine.to_string(),
            key: e.key.to_string(),
            state: e.state.to_string(),
            version: e.version,
            retry: e.retry,
            properties: e.properties.clone(),
            created_at: e.created_at,
            entered_at: e.entered_at,
            due_at: e.due_at,
            lease_owner: e.lease_owner.clone(),
            run_status: e.run_status.as_str().to_string(),
            sleep_until: e.sleep_until,
            permitted_events: None,
            lease_until: None,
            recent_errors: None,
            inbox: None,
        }
    }
}

/// A page of entities.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct EntityPage {
    /// The entities, by id.
    pub items: Vec<Entity>,
    /// The cursor of the next page (pass it as `after`), or null on the last page.
    pub next: Option<String>,
}

/// One row of an entity's history.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct HistoryEntry {
    /// The state before (null on creation).
    pub from: Option<String>,
    /// The state entered (null when nothing was entered: rejections, failures, commands).
    pub to: Option<String>,
    /// create, event, auto, rejected, fault or command.
    pub kind: String,
    /// The action that ran.
    pub action: Option<String>,
    /// The event processed.
    pub event: Option<String>,
    /// Retry count of the entry.
    pub retry: u32,
    /// The request that caused it.
    pub request_id: Option<String>,
    /// When it was committed (ms).
    pub at: i64,
    /// Rejection reason, error text or command.
    pub detail: Option<String>,
}

impl From<&HistoryRow> for HistoryEntry {
    fn from(h: &HistoryRow) -> Self {
        HistoryEntry {
            from: h.from.as_deref().map(str::to_string),
            to: h.to.as_deref().map(str::to_string),
            kind: h.kind.as_str().to_string(),
            action: h.action.as_deref().map(str::to_string),
            event: h.event.as_deref().map(str::to_string),
            retry: h.retry,
            request_id: h.request_id.clone(),
            at: h.at,
            detail: h.detail.clone(),
        }
    }
}

/// An operation: what one request set in motion.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Operation {
    /// Its request id (the `Idempotency-Key`, or generated).
    pub request_id: String,
    /// What was asked, e.g. `server.create`, `server:new`, `server.pause`.
    pub name: String,
    /// The entity's machine.
    pub machine: Option<String>,
    /// The entity's key.
    pub key: Option<String>,
    /// When it started (ms).
    pub started_at: i64,
    /// When every entity it reached was at rest again (ms); null while open.
    pub ended_at: Option<i64>,
    /// When its first event was processed (ms).
    pub first_response_at: Option<i64>,
    /// success, failed, canceled or hung; null while open.
    pub outcome: Option<String>,
    /// The first error, if any.
    pub error: Option<String>,
    /// Engine restarts it lived through.
    pub restart_count: u32,
    /// Free-form dimensions.
    #[schema(value_type = Object)]
    pub dimensions: Value,
}

impl From<&OperationRow> for Operation {
    fn from(o: &OperationRow) -> Self {
        Operation {
            request_id: o.request_id.clone(),
            name: o.name.clone(),
            machine: o.machine.clone(),
            key: o.entity_key.clone(),
            started_at: o.started_at,
            ended_at: o.ended_at,
            first_response_at: o.first_response_at,
            outcome: o.outcome.clone(),
            error: o.error.clone(),
            restart_count: o.restart_count,
            dimensions: o.dimensions.clone(),
        }
    }
}

/// A page of operations, newest first.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct OperationList {
    /// The operations.
    pub items: Vec<Operation>,
}

/// A served machine.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct MachineSummary {
    /// Its name.
    pub name: String,
    /// Content hash of its definition (the definition version).
    pub hash: String,
    /// Its states.
    pub states: Vec<String>,
    /// Its events.
    pub events: Vec<String>,
}

/// The served machines, by name.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct MachineList {
    /// The machines.
    pub items: Vec<MachineSummary>,
}

/// `POST /v1/machines/{machine}/entities`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateEntity {
    /// The new entity's key: 1 to 256 characters, no control characters.
    pub key: String,
    /// Constructor properties: a JSON object (default `{}`).
    #[schema(value_type = Option<Object>)]
    #[serde(default)]
    pub properties: Option<Value>,
}

/// `POST .../sleep`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SleepRequest {
    /// Wake-up time: RFC 3339 UTC (`2026-11-22T10:00:00Z`) or from now (`+10m`).
    pub until: String,
}

/// What became of a raised event.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(tag = "result", rename_all = "lowercase")]
pub enum Outcome {
    /// The event's action committed; the entity entered `state`.
    Accepted {
        /// The state entered.
        state: String,
    },
    /// The event was not valid in `state`; nothing changed.
    Rejected {
        /// The state the entity was in.
        state: String,
        /// The declared reason, or the default one.
        reason: String,
    },
    /// The event's action failed; nothing changed.
    Failed {
        /// What went wrong.
        error: String,
    },
}

impl From<&EventOutcome> for Outcome {
    fn from(o: &EventOutcome) -> Self {
        match o {
            EventOutcome::Accepted { state } => Outcome::Accepted { state: state.to_string() },
            EventOutcome::Rejected { state, reason } => {
                Outcome::Rejected { state: state.to_string(), reason: reason.clone() }
            }
            EventOutcome::Failed { error } => Outcome::Failed { error: error.clone() },
        }
    }
}

/// The answer of a raise without `wait` (202), or of a replayed one.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct RaiseAccepted {
    /// The request id (the operation's id).
    pub request_id: String,
    /// Where the operation is: `/v1/operations/{request_id}`.
    pub operation: String,
    /// The request id had been used before: nothing was raised again.
    #[serde(default)]
    pub replayed: bool,
}

/// The answer of a raise with `wait=stable` (200).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct RaiseDone {
    /// The request id (the operation's id).
    pub request_id: String,
    /// What became of the event (null for a replayed request id).
    pub outcome: Option<Outcome>,
    /// The entity when it was at rest again (as it is now, for a replay).
    pub entity: Option<Entity>,
    /// The request id had been used before: nothing was raised again.
    #[serde(default)]
    pub replayed: bool,
}

/// `GET /healthz`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Health {
    /// Always `ok` while the server runs.
    pub status: String,
}

/// Query of `GET /v1/entities`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct EntityQuery {
    /// Only this machine.
    pub machine: Option<String>,
    /// Only this state.
    pub state: Option<String>,
    /// Only this run status: active, paused, sleeping, fault, failed, killed.
    pub status: Option<String>,
    /// The cursor: `next` of the previous page.
    pub after: Option<String>,
    /// At most this many (default 100, at most 1000).
    pub limit: Option<String>,
}

/// Query of `GET /v1/operations`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct OperationQuery {
    /// Only this outcome: success, failed, canceled, hung, or open (not finished).
    pub outcome: Option<String>,
    /// At most this many (default 100, at most 1000).
    pub limit: Option<String>,
}

/// Query of `POST .../events/{event}`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct RaiseQuery {
    /// `stable`: answer 200 once the entity is at rest again (or the event was rejected or
    /// failed). Absent: answer 202 once the event is durably queued.
    pub wait: Option<String>,
    /// How long to wait with `wait=stable` (e.g. `30s`; default 30s, at most the server's
    /// `--max-wait`).
    pub timeout: Option<String>,
}

/// Query of `GET .../graph`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct GraphQuery {
    /// `mermaid` (default) or `dot`.
    pub format: Option<String>,
}
