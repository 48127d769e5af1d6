//! settle-api: the JSON types of Settle's HTTP API — what requests carry and responses
//! hold — shared by the server (`settle-server`) and the client (`settle-client`), so the
//! two cannot drift apart. They are the deliberate serializable boundary (the store's and
//! core's types are not `Serialize`); their shapes are also those of `settle ... --json`.
//! Times are milliseconds since the Unix epoch.
//!
//! Features: `openapi` derives `utoipa::ToSchema` (the server's `/openapi.json`); `store`
//! adds conversions from the store's rows.

mod bulk;
mod cancel;
mod deploy;
mod feed;
mod limits;
mod schedule;

pub use bulk::{Bulk, BulkDryRun, BulkFilter, BulkList, BulkRequest};
pub use cancel::{CancelRequest, CancelResult, CanceledEntity};
pub use deploy::{DeployFile, DeployRequest, DeployResult, Deployed, Stranded};
pub use feed::Change;
pub use limits::{EntityLimit, LimitList, LimitUsage, spacing};
pub use schedule::{Schedule, ScheduleList};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// An entity.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
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
    /// The version (hash) of its machine's definition it runs under (`graph?version=`
    /// draws that one).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub machine_version: Option<String>,
    /// `error` when its state is declared `health = "error"` (a failure: `…/why` says
    /// why), else `ok`; absent when the server does not serve its machine.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub health: Option<String>,
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
    /// The operator commands, each with whether it would change anything now and, if not,
    /// why (single-entity reads only).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub commands: Option<Vec<CommandOffer>>,
    /// Its newest recorded error (lists with `errors=latest` only).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub last_error: Option<ErrorEntry>,
    /// Events queued in its inbox, in processing order (single-entity reads only).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub inbox: Option<Vec<QueuedEvent>>,
    /// The calendar schedules that reach it in its state, with their next fires
    /// (single-entity reads only).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub next_fires: Option<Vec<NextFire>>,
    /// The concurrency limit whose slot it holds or waits for, if any (single-entity reads
    /// only).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub limits: Option<Vec<EntityLimit>>,
}

/// A calendar schedule's next fire on an entity its states reach.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NextFire {
    /// The schedule.
    pub schedule: String,
    /// What it does (`raise EVENT in [STATES]`).
    pub does: String,
    /// When it next fires (ms; null when paused, not stored yet, or none to come).
    pub at: Option<i64>,
    /// Paused by an operator.
    pub paused: bool,
}

/// An operator command as offered for an entity now.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CommandOffer {
    /// `pause`, `resume`, `retry`, `release`, `sleep` or `kill`.
    pub name: String,
    /// It would change something now.
    pub applies: bool,
    /// Why it would not (when it does not apply).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub why: Option<String>,
}

/// An event waiting in an entity's inbox.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct QueuedEvent {
    /// The event (`$successors` for a change notice, `$agent` for an agent's report).
    pub event: String,
    /// Its parameters.
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub params: Value,
}

/// A page of entities.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EntityPage {
    /// The entities, by id.
    pub items: Vec<Entity>,
    /// The cursor of the next page (pass it as `after`), or null on the last page.
    pub next: Option<String>,
    /// With `total=true`: how many match in all (`after` aside), counted through the page's
    /// index up to a bound.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub total: Option<Total>,
}

/// `GET /v1/entities/error-groups`: the newest errors of the entities a filter matches,
/// grouped by their text with numbers as `#`, the largest group first.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ErrorGroups {
    /// The groups, largest first.
    pub groups: Vec<ErrorGroup>,
    /// How many entities were looked at (at most 10,000, in the list's order).
    pub examined: u64,
    /// Every entity the filter matches was looked at: the counts are exact.
    pub exact: bool,
}

/// Entities whose newest error reads the same but for its numbers.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ErrorGroup {
    /// The text, each run of digits as `#` (pass it as the list's `error` to page through
    /// the group), or null for entities with no error recorded.
    pub error: Option<String>,
    /// How many of those examined.
    pub count: u64,
    /// One of them, as `machine/key`, with its error as recorded.
    pub example: String,
    /// The example's error as recorded.
    pub details: Option<String>,
}

/// A count kept exact up to a bound: `exact` false means "at least `count`" (the count
/// stopped at its bound: of entities, or, with criteria no index holds, of those examined).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Total {
    /// How many (at most the bound).
    pub count: u64,
    /// `false`: at least `count` match.
    pub exact: bool,
}

/// One row of an entity's history.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct HistoryEntry {
    /// The state before (null on creation).
    pub from: Option<String>,
    /// The state entered (null when nothing was entered: rejections, failures, commands).
    pub to: Option<String>,
    /// create, event, auto, rejected, fault, command, internal, ignored, or limit (a
    /// limit held its auto action back or admitted it; see `detail`).
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

/// An operation: what one request set in motion.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub dimensions: Value,
}

/// A page of operations, newest first.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct OperationList {
    /// The operations.
    pub items: Vec<Operation>,
    /// The cursor of the next (older) page (pass it as `before`), or null on the last.
    #[serde(default)]
    pub next: Option<String>,
}

/// `GET /v1/overview`: the fleet at a glance, read from counts the store keeps in every
/// commit (its cost does not grow with the fleet).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Overview {
    /// When it was read (ms).
    pub now: i64,
    /// Entities in all.
    pub entities: u64,
    /// Entities parked for an operator (run status `failed`) or backing off after faults
    /// (`fault`).
    pub parked: u64,
    /// Entities failing: in a state declared `health = "error"` (killed ones aside).
    pub failing: u64,
    /// Entities whose due time has passed: work waiting to be claimed.
    pub due_backlog: u64,
    /// Entities per machine, state and run status (only those with entities).
    pub counts: Vec<StateCount>,
    /// Operations per outcome (`success`, `failed`, `canceled`, `hung`, `open`).
    pub operations: Vec<OutcomeCount>,
    /// Open agent tasks per queue and status (`ready`, `leased`).
    pub tasks: Vec<TaskCount>,
    /// Transitions and errors per minute over the window asked for, oldest first, one
    /// entry per minute (zeros included).
    pub minutes: Vec<MinuteRate>,
}

/// How many entities of a machine are in one state with one run status.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StateCount {
    /// The machine.
    pub machine: String,
    /// The (leaf) state.
    pub state: String,
    /// The state with its parents, outermost first (`active/running`).
    pub path: String,
    /// The run status.
    pub run_status: String,
    /// `error` when the state is declared `health = "error"`, else `ok`.
    pub health: String,
    /// How many.
    pub count: u64,
}

/// How many operations ended with one outcome (`open`: not ended).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct OutcomeCount {
    /// The outcome.
    pub outcome: String,
    /// How many.
    pub count: u64,
}

/// Open agent tasks of one queue with one status.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TaskCount {
    /// The queue.
    pub queue: String,
    /// `ready` (waiting for an agent) or `leased`.
    pub status: String,
    /// How many.
    pub count: u64,
}

/// Transitions and errors in one minute.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct MinuteRate {
    /// The minute's start (ms).
    pub at: i64,
    /// State entries in it.
    pub transitions: u64,
    /// Errors in it (faults of actions and commits).
    pub errors: u64,
}

/// A served machine.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct MachineSummary {
    /// Its name.
    pub name: String,
    /// Content hash of its definition (the definition version).
    pub hash: String,
    /// Its states.
    pub states: Vec<String>,
    /// Its events.
    pub events: Vec<String>,
    /// How long an entity is kept after entering each end state (terminal or deleted),
    /// from the definition and the deployment's defaults (README "Retention").
    #[serde(default)]
    pub retention: Vec<StateRetention>,
    /// What a live entity keeps of its history, events and errors: `forever`, a duration,
    /// `latest N`, or both (`90d, latest 1000`); the latest row is always kept.
    #[serde(default)]
    pub history: String,
    /// Whether an entity retention removes is archived first.
    #[serde(default)]
    pub archived: bool,
}

/// How long an entity is kept after entering an end state.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StateRetention {
    /// The end state.
    pub state: String,
    /// A duration (`30d`, `1h30m`) or `forever`.
    pub keep: String,
}

/// The served machines, by name.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct MachineList {
    /// The machines.
    pub items: Vec<MachineSummary>,
}

/// `POST /v1/machines/{machine}/entities`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CreateEntity {
    /// The new entity's key: 1 to 256 characters, no control characters.
    pub key: String,
    /// Constructor properties: a JSON object (default `{}`).
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    #[serde(default)]
    pub properties: Option<Value>,
}

/// `POST .../sleep`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SleepRequest {
    /// Wake-up time: RFC 3339 (`2026-11-22T10:00:00Z`, any offset) or from now (`+10m`).
    pub until: String,
}

/// What became of a raised event.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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
    /// The event was accepted and dropped: `state` (or a state containing it) ignores it;
    /// nothing changed.
    Ignored {
        /// The state the entity was in.
        state: String,
    },
    /// The event's action failed; nothing changed.
    Failed {
        /// What went wrong.
        error: String,
    },
}

/// What an event would do to an entity if raised now (`POST …/events/{event}/check`):
/// guards are evaluated against the entity's properties and the given parameters.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EventCheck {
    /// The event.
    pub event: String,
    /// The entity's state now.
    pub state: String,
    /// The verdict.
    pub verdict: Verdict,
}

/// Whether an event would fire, and how.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "result", rename_all = "lowercase")]
pub enum Verdict {
    /// It would run `action` (its guard, if any, holds).
    Fires {
        /// The action chosen.
        action: String,
        /// Whether it is an internal transition (no state is left or entered).
        internal: bool,
    },
    /// It would be accepted and dropped: `state` (the entity's or one containing it)
    /// ignores it.
    Ignored {
        /// The state that ignores it.
        state: String,
    },
    /// It would be rejected: not valid here, rejected by an alternative, no guard holds,
    /// or a guard cannot be evaluated.
    Refused {
        /// Why.
        reason: String,
    },
}

/// The answer of a raise without `wait` (202), or of a replayed one.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RaiseAccepted {
    /// The request id (the operation's id).
    pub request_id: String,
    /// Where the operation is: `/v1/operations/{request_id}`.
    pub operation: String,
    /// The request id had been used before: nothing was raised again.
    #[serde(default)]
    pub replayed: bool,
}

/// The answer of a raise with `wait=stable` or `wait=operation` (200).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RaiseDone {
    /// The request id (the operation's id).
    pub request_id: String,
    /// What became of the event (null for a replayed request id).
    pub outcome: Option<Outcome>,
    /// The entity when the wait ended: at rest again (`stable`), or as the operation left
    /// it (`operation`); as it is now, for a replay.
    pub entity: Option<Entity>,
    /// The request id had been used before: nothing was raised again.
    #[serde(default)]
    pub replayed: bool,
    /// With `wait=operation`: the operation, ended; its `outcome` says how (`failed`
    /// with its `error` when something it reached failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation: Option<Operation>,
}

/// `GET /healthz`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Health {
    /// Always `ok` while the server runs.
    pub status: String,
}

mod agents;
pub use agents::*;

/// `GET /v1/session`: whether the presented token is accepted and who it is, so a client
/// (the dashboard) can sign in and show what the caller may do.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Session {
    /// Whether the token (or, on a server without tokens, no token) is accepted for reads.
    pub signed_in: bool,
    /// Why not, when not signed in: no token, an unknown token, or a role that may not read.
    pub reason: Option<String>,
    /// `admin`, `operator` or `reader` (with no token configured: `admin`); null when not
    /// signed in.
    pub role: Option<String>,
    /// The token's name, if it has one.
    pub name: Option<String>,
    /// Whether the role may create entities, raise events and send lifecycle commands.
    pub can_write: bool,
    /// The server runs without tokens (loopback only): anyone is an admin.
    pub open: bool,
}

/// A timer of an entity, due to raise its event.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Timer {
    /// The timer's name.
    pub name: String,
    /// The event it raises.
    pub event: String,
    /// When it is next due (ms).
    pub due_at: i64,
    /// Its period (ms), for a periodic timer.
    pub every_ms: Option<i64>,
}

/// An error recorded for an entity.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ErrorEntry {
    /// When it happened (ms).
    pub at: i64,
    /// `action_error`, `panic`, `refused` or `commit_failed`.
    pub kind: String,
    /// What went wrong.
    pub details: String,
    /// The request whose work failed, if any.
    pub request_id: Option<String>,
    /// A `failure`'s cause: the entities whose states fired it (a subscription's matches).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cause: Vec<EntityRef>,
}

/// An entity named by machine and key, in the state it was seen in.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EntityRef {
    /// Its machine.
    pub machine: String,
    /// Its key.
    pub key: String,
    /// Its state then.
    pub state: String,
}

/// `GET …/entities/{key}/why`: why an entity failed, down to the first cause. The chain
/// in depth-first order: the entity asked about first (depth 0), then each entity its
/// failure names as a cause (depth 1), each followed by its own causes.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Why {
    /// The entity is failing now: in an error-health state, or parked.
    pub failing: bool,
    /// The entities of the chain.
    pub chain: Vec<WhyStep>,
    /// Where the entity stands with the concurrency limit of its state: the slot it holds
    /// or the line it waits in (what holds its work back, failing or not).
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub limits: Vec<EntityLimit>,
}

/// One entity of a failure's chain of causes.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WhyStep {
    /// 0 for the entity asked about, 1 for what caused its failure, and so on.
    pub depth: u32,
    /// Its machine.
    pub machine: String,
    /// Its key.
    pub key: String,
    /// Its state now (null: not stored any more).
    pub state: Option<String>,
    /// Its run status now.
    pub run_status: Option<String>,
    /// Failing now: in an error-health state, or parked.
    pub failing: bool,
    /// When it failed (ms); null when no failure of it is recorded.
    pub at: Option<i64>,
    /// `failure` (it entered an error-health state), or the kind of error that parked it.
    pub kind: Option<String>,
    /// Why it failed.
    pub details: Option<String>,
    /// The request whose work failed.
    pub request_id: Option<String>,
}

/// `GET …/entities/{key}/related`: the entity's predecessors and successors, and how far
/// each subscription valid in its state is from firing.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Related {
    /// Entities that have this one as a successor, by id.
    pub predecessors: Vec<Entity>,
    /// This entity's successors, by id.
    pub successors: Vec<Entity>,
    /// The subscriptions valid in the entity's state, evaluated over its successors now.
    pub subscriptions: Vec<SubscriptionProgress>,
}

/// How far a subscription is from firing.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SubscriptionProgress {
    /// The subscription event.
    pub event: String,
    /// Its pattern, e.g. `all(replica) in [ready]`.
    pub pattern: String,
    /// Successors the pattern's filter selects.
    pub selected: u64,
    /// Of those, how many satisfy its condition.
    pub satisfying: u64,
    /// Whether the pattern holds now.
    pub holds: bool,
    /// Whether it already fired during the current state entry.
    pub fired: bool,
}

/// One history row of an operation's trace, with the entity it belongs to.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TraceEntry {
    /// The entity's machine.
    pub machine: String,
    /// The entity's key.
    pub key: String,
    /// The history row.
    #[serde(flatten)]
    pub entry: HistoryEntry,
}

/// `GET /v1/operations/{id}/trace`: every entity and transition an operation touched.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct OperationTrace {
    /// The operation.
    pub operation: Operation,
    /// The entities it started on or its events reached, by id.
    pub entities: Vec<Entity>,
    /// The history rows its request id caused, by entity then time.
    pub transitions: Vec<TraceEntry>,
    /// More entities were touched than listed (the list stops at 1000).
    pub truncated: bool,
}

/// A stored version of a machine's definition.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct MachineVersion {
    /// The definition's content hash.
    pub hash: String,
    /// When it was first stored (ms).
    pub stored_at: i64,
    /// Entities whose latest transition ran under it.
    pub entities: u64,
    /// Whether it is the version the server serves.
    pub current: bool,
    /// Who deployed it: `built-in` for the `settle` binary's built-in machines (the demo's,
    /// the benchmarks'), empty for a deploy of definitions given by a user.
    #[serde(default)]
    pub origin: String,
}

#[cfg(feature = "store")]
mod from_store;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_are_tagged_by_result() {
        let o = Outcome::Rejected { state: "open".into(), reason: "already open".into() };
        let v = serde_json::to_value(&o).unwrap();
        assert_eq!(v, serde_json::json!({"result": "rejected", "state": "open", "reason": "already open"}));
        let back: Outcome = serde_json::from_value(v).unwrap();
        assert!(matches!(back, Outcome::Rejected { .. }));
    }

    #[test]
    fn single_entity_fields_are_left_out_of_lists() {
        let e = Entity {
            machine: "m".into(),
            key: "k".into(),
            state: "s".into(),
            version: 1,
            retry: 0,
            properties: Map::new(),
            created_at: 1,
            entered_at: 1,
            due_at: None,
            lease_owner: None,
            run_status: "active".into(),
            machine_version: None,
            health: None,
            sleep_until: None,
            permitted_events: None,
            lease_until: None,
            recent_errors: None,
            commands: None,
            last_error: None,
            inbox: None,
            next_fires: None,
            limits: None,
        };
        let v = serde_json::to_value(&e).unwrap();
        for absent in ["permitted_events", "lease_until", "recent_errors", "inbox", "next_fires", "limits"] {
            assert!(v.get(absent).is_none(), "{absent} in {v}");
        }
        let back: Entity = serde_json::from_value(v).unwrap();
        assert_eq!(back.key, "k");
    }
}
