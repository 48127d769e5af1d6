//! Agent queues (DESIGN §5): leasing tasks, heartbeats, and reports — `complete` with the
//! action's whole outcome, or `fail`.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// A lease request.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct LeaseRequest {
    /// Who leases (recorded with the task; e.g. `dns-agent-3`).
    pub agent: String,
    /// At most this many tasks (1 to 100, default 1).
    #[serde(default, deserialize_with = "json_integer")]
    pub max: Option<u64>,
    /// How long to wait for a task, in ms (default 20000, capped by the server).
    #[serde(default, deserialize_with = "json_integer")]
    pub wait_ms: Option<u64>,
}

/// An optional non-negative integer as JSON numbers carry it: `5` or `5.0` (JSON does not
/// tell the two apart, and neither does the schema's `integer`), not `5.5` or `-1`.
pub(crate) fn json_integer<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    use serde::de::Error;
    let Some(n) = Option::<serde_json::Number>::deserialize(d)? else { return Ok(None) };
    if let Some(u) = n.as_u64() {
        return Ok(Some(u));
    }
    match n.as_f64() {
        Some(f) if f >= 0.0 && f.fract() == 0.0 && f < u64::MAX as f64 => Ok(Some(f as u64)),
        _ => Err(D::Error::custom(format!("expected a non-negative integer, not {n}"))),
    }
}

/// An integer as JSON numbers carry it: `5`, `-5` or `5.0`, not `5.5`.
fn json_i64<'de, D: serde::Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
    use serde::de::Error;
    let n = serde_json::Number::deserialize(d)?;
    if let Some(i) = n.as_i64() {
        return Ok(i);
    }
    match n.as_f64() {
        Some(f) if f.fract() == 0.0 && f > i64::MIN as f64 && f < i64::MAX as f64 => Ok(f as i64),
        _ => Err(D::Error::custom(format!("expected an integer, not {n}"))),
    }
}

/// A leased task: what to do, for which entity, and the lease token.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Task {
    /// The task id.
    pub id: i64,
    /// The queue.
    pub queue: String,
    /// The entity's machine.
    pub machine: String,
    /// The entity's key.
    pub key: String,
    /// The state whose auto action this is.
    pub state: String,
    /// The action to carry out.
    pub action: String,
    /// The action's declared targets (what `complete` may name).
    pub targets: Vec<String>,
    /// The properties the entity must have to enter each target (its own and its
    /// ancestors' `requires`): a completion without them is a fault of the action.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub requires: Map<String, Value>,
    /// The machines whose entities the action may create (`may_create`): a report that
    /// creates another is refused.
    #[serde(default)]
    pub may_create: Vec<String>,
    /// The events the action may raise on other entities (`may_raise`): a report that
    /// raises another is refused.
    #[serde(default)]
    pub may_raise: Vec<String>,
    /// How many times the task was leased (1 on the first lease).
    pub attempt: u32,
    /// How many times the entity re-entered the state for a retry.
    pub retry: u32,
    /// Errors the entity's fault policy counts now.
    pub errors: u32,
    /// The entity's properties.
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub properties: Map<String, Value>,
    /// The request the work belongs to.
    pub request_id: Option<String>,
    /// The event whose workflow the task's state entry belongs to: the one whose action
    /// entered the state, or began the chain of auto actions that did (absent: none, e.g.
    /// the state the entity was created in).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<String>,
    /// That event's parameters (null: none).
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub params: Value,
    /// The lease token: send it with heartbeats and reports.
    pub token: String,
    /// The lease ends then (ms since the epoch) unless a heartbeat extends it.
    pub locked_until: i64,
    /// How long a lease or heartbeat holds the task (ms).
    pub lock_ms: i64,
}

/// Tasks leased.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Leased {
    /// The tasks (empty: none came within the wait).
    pub tasks: Vec<Task>,
}

/// A heartbeat.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct HeartbeatRequest {
    /// The lease token.
    pub token: String,
}

/// The lease after a heartbeat.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Extended {
    /// The lease now ends then (ms since the epoch).
    pub locked_until: i64,
}

/// A successful result: the action's whole outcome (DESIGN §5), as a Rust handler returns
/// it, committed in one transaction with the entity's transition.
///
/// `{"token": "…", "target": "ready", "properties": {"ip": "10.0.0.7"}}` moves to `ready`;
/// `{"token": "…", "delay_ms": 5000}` runs the action again in 5 s; `create` and `raise`
/// reach other entities (a created entity becomes a successor; `join` makes the raised-on
/// entity one). Everything is checked before anything is queued: a report that names an
/// undeclared target, an unknown machine or event, or leaves out a required parameter or
/// property is refused 422 with the field at fault (`target`, `create[0]`, `raise[1]`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CompleteRequest {
    /// The lease token.
    pub token: String,
    /// The state to move to: one of the action's declared targets. Absent: the same state
    /// again (a retry: its auto action runs again, after `delay_ms` or the state's wait).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// How long (ms) before the entered state's auto action runs; overrides its declared
    /// wait.
    #[serde(default, deserialize_with = "json_integer", skip_serializing_if = "Option::is_none")]
    pub delay_ms: Option<u64>,
    /// Properties to set on the entity (`null` removes one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub properties: Option<Value>,
    /// Why the action failed, when `target` is an error-health state: recorded in the
    /// entity's errors (kind `failure`) with the entry, and shown by `settle why` and the
    /// dashboard as the failure's cause.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Entities to create, in order; each becomes this entity's successor.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub create: Vec<ReportCreate>,
    /// Events to raise, in order, on entities named by machine and key or by relation.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub raise: Vec<ReportRaise>,
    /// Lease the next tasks in the same request, once the report is accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<NextTasks>,
}

/// The next tasks a report asks for: leased from `queue` as `agent` once the report is
/// accepted, without waiting (answered in [`Accepted::tasks`], possibly none). One round
/// trip per task while a queue has work: report one, get the next.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct NextTasks {
    /// The queue to lease from.
    pub queue: String,
    /// Who leases (as in a lease request).
    pub agent: String,
    /// At most this many tasks (1 to 100, default 1).
    #[serde(default, deserialize_with = "json_integer")]
    pub max: Option<u64>,
}

/// An entity a report creates: it becomes the reporting entity's successor, so the
/// reporter's subscriptions see its states.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ReportCreate {
    /// Its machine.
    pub machine: String,
    /// Its key, unique within the machine.
    pub key: String,
    /// Constructor properties.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub properties: Option<Value>,
    /// A first event raised on it in the same commit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<String>,
    /// That event's parameters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub params: Option<Value>,
    /// A sync nested event (with `event`): an event of the reporter's machine raised on
    /// the reporter when the first event's workflow ends on the created entity, with what
    /// came of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply: Option<String>,
}

/// An event a report raises: on one entity named by `machine` and `key`, on every entity
/// related to the reporter `on` that way (`predecessors` or `successors`), or on the
/// reporter itself (`on: "self"`: an internal event, processed right after the report's
/// commit, before anything else queued).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ReportRaise {
    /// The event.
    pub event: String,
    /// Its parameters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub params: Option<Value>,
    /// The entity's machine (with `key`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine: Option<String>,
    /// The entity's key (with `machine`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// `predecessors`, `successors` or `self` (instead of `machine` and `key`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on: Option<String>,
    /// The entity joins the reporter's workflow: it becomes a successor (with `machine`
    /// and `key`; default false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub join: Option<bool>,
    /// A sync nested event (with `machine` and `key`): an event of the reporter's machine
    /// raised on the reporter when this event's workflow ends on that entity (rejected,
    /// ignored or failed, or the entity at rest again), with what came of it: `machine`,
    /// `key`, `event`, `outcome` (`accepted`, `rejected`, `ignored`, `failed`,
    /// `interrupted`), `state`, `reason`, those the reply event declares.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply: Option<String>,
}

/// A failed result.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct FailRequest {
    /// The lease token.
    pub token: String,
    /// What went wrong (recorded in the entity's history and the errors table).
    pub error: String,
    /// Whether trying again may help (default true): retried by the fault policy, or
    /// parked for an operator at once.
    #[serde(default)]
    pub retryable: Option<bool>,
    /// Lease the next tasks in the same request, once the report is accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<NextTasks>,
}

/// Many reports in one request (`POST /v1/tasks/reports`): each on its own task, each
/// applied or refused on its own (one refused leaves the others), all queued in the same
/// batch of the engine's writer; `next` leases the next tasks once they are handled.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ReportMany {
    /// The reports (1 to 100).
    pub reports: Vec<TaskReport>,
    /// Lease the next tasks in the same request, once the reports are handled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<NextTasks>,
}

/// One report of [`ReportMany`]: a task and either `complete` or `fail`, as their own
/// requests' bodies (without `next`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct TaskReport {
    /// The task.
    #[serde(deserialize_with = "json_i64")]
    pub task: i64,
    /// A successful result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub complete: Option<CompleteRequest>,
    /// A failed result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fail: Option<FailRequest>,
}

/// What became of each report of [`ReportMany`], in order, and the next tasks.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ReportsHandled {
    /// One per report, in the request's order.
    pub results: Vec<ReportResult>,
    /// The tasks leased for `next` (present only when it asked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tasks: Option<Vec<Task>>,
}

/// One report's fate: accepted (possibly a replay), or refused with the problem its own
/// request would have answered (its `field` prefixed with `reports[i].`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ReportResult {
    /// The task.
    pub task: i64,
    /// Accepted: queued durably for the entity.
    pub accepted: bool,
    /// The same report was applied before; this one changed nothing.
    #[serde(default)]
    pub replayed: bool,
    /// Why it was refused (a problem document), when it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub problem: Option<Value>,
}

/// A report was accepted: it is queued durably for the entity.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Accepted {
    /// Always true.
    pub accepted: bool,
    /// The same lease token reported before: this report is a replay and changed nothing
    /// (the first report stands).
    #[serde(default)]
    pub replayed: bool,
    /// The tasks leased for the report's `next` (present only when it asked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tasks: Option<Vec<Task>>,
}
