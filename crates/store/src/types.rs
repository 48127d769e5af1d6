//! The data the store persists and the batches the engine writes.
//!
//! Times are integer milliseconds since the Unix epoch ([`Millis`]); properties and
//! parameters are JSON, stored as text, so every backend agrees.

use serde_json::Value;
use settle_core::{ActionName, EntityKey, EventName, MachineName, Properties, StateName};

/// Milliseconds since the Unix epoch.
pub type Millis = i64;

/// A stored entity.
#[derive(Debug, Clone, PartialEq)]
pub struct EntityRow {
    /// Store-assigned id.
    pub id: i64,
    /// The entity's machine.
    pub machine: MachineName,
    /// The user's key, unique within the machine.
    pub key: EntityKey,
    /// The current state.
    pub state: StateName,
    /// The entity's properties.
    pub properties: Properties,
    /// Bumped by every transition: the fencing token of commits.
    pub version: i64,
    /// Retry count of the current state entry.
    pub retry: u32,
    /// When the entity was created.
    pub created_at: Millis,
    /// When the current state was entered.
    pub entered_at: Millis,
    /// When the auto action of the current (unstable) state is due; `None` when at rest.
    pub auto_at: Option<Millis>,
    /// When the entity next has work: the earliest of its queued events (now), its auto
    /// action, and, while leased, its lease expiry. `None`: dormant.
    pub due_at: Option<Millis>,
    /// The engine instance holding the lease, if any.
    pub lease_owner: Option<String>,
    /// Until when the lease is held.
    pub lease_until: Option<Millis>,
    /// The request that caused the latest state entry; auto actions carry it on.
    pub request_id: Option<String>,
    /// Subscription events already fired during the current state entry.
    pub fired: Vec<EventName>,
    /// The earliest due time of the entity's timers.
    pub timer_at: Option<Millis>,
    /// Lifecycle status beside the machine state.
    pub run_status: RunStatus,
    /// Until when a `sleeping` or `fault` entity waits.
    pub sleep_until: Option<Millis>,
    /// Times of the entity's recent errors, as its fault policy keeps them.
    pub recent_errors: Vec<Millis>,
    /// The telemetry event whose workflow the entity is in.
    pub event_id: Option<i64>,
    /// The definition version of the entity's latest transition.
    pub machine_hash: Option<String>,
}

/// An entity's lifecycle status, beside its machine state (DESIGN §4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum RunStatus {
    /// Runs normally.
    #[default]
    Active,
    /// Nothing runs; events queue and run on resume.
    Paused,
    /// Nothing runs until `sleep_until` (an operator's `sleep`); events queue.
    Sleeping,
    /// Backing off after an error until `sleep_until`, then the state is re-entered.
    Fault,
    /// Parked by the fault policy for an operator.
    Failed,
    /// Terminal: never runs again; its pending work was canceled.
    Killed,
}

impl RunStatus {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Active => "active",
            RunStatus::Paused => "paused",
            RunStatus::Sleeping => "sleeping",
            RunStatus::Fault => "fault",
            RunStatus::Failed => "failed",
            RunStatus::Killed => "killed",
        }
    }
    /// Parses the stored name.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "active" => RunStatus::Active,
            "paused" => RunStatus::Paused,
            "sleeping" => RunStatus::Sleeping,
            "fault" => RunStatus::Fault,
            "failed" => RunStatus::Failed,
            "killed" => RunStatus::Killed,
            _ => return None,
        })
    }
}

/// An operator command on an entity's run status (DESIGN §4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// Stop auto actions and timers; events queue.
    Pause,
    /// Back to `active` from paused, sleeping, fault or failed (clears the error count).
    Resume,
    /// Sleep until a time.
    Sleep {
        /// Wake-up time.
        until: Millis,
    },
    /// Terminal: cancel pending work (queued events, timers); never run again.
    Kill,
    /// Drop the lease now so any instance may continue.
    Release,
    /// Run the pending auto action now (after a backoff, a retry delay or parking).
    Retry,
}

impl Command {
    /// The command's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Command::Pause => "pause",
            Command::Resume => "resume",
            Command::Sleep { .. } => "sleep",
            Command::Kill => "kill",
            Command::Release => "release",
            Command::Retry => "retry",
        }
    }
}

/// An operation opened by an external request (DESIGN §1 "Operations").
#[derive(Debug, Clone, PartialEq)]
pub struct OpenOperation {
    /// Caller-supplied idempotency key, or generated.
    pub request_id: String,
    /// What was asked, e.g. `server.create` or `server:new` or `server.pause`.
    pub name: String,
    /// Free-form dimensions (JSON object).
    pub dimensions: Value,
}

/// A stored operation.
#[derive(Debug, Clone, PartialEq)]
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

/// Telemetry written with a commit (DESIGN §6).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Telemetry {
    /// The inbox event this commit processes.
    pub event: Option<EventRecord>,
    /// The state entry this commit makes.
    pub transition: Option<TransitionRecord>,
    /// The error this commit records.
    pub error: Option<ErrorRecord>,
    /// The entity is at rest after the commit: its event's workflow ends.
    pub at_rest: bool,
    /// The operation of the commit's request may be complete: check it.
    pub complete: bool,
    /// The event whose workflow the entity was in before this commit.
    pub current_event: Option<i64>,
}

/// A processed event, for the `events` table.
#[derive(Debug, Clone, PartialEq)]
pub struct EventRecord {
    /// raised | nested | subscription | timer.
    pub kind: &'static str,
    /// Its inbox id.
    pub seq: i64,
    /// When it was raised.
    pub raised_at: Millis,
    /// Rejected in the entity's state.
    pub rejected: bool,
    /// Its action failed.
    pub failed: bool,
}

/// A state entry, for the `transitions` table.
#[derive(Debug, Clone, PartialEq)]
pub struct TransitionRecord {
    /// create | event | event_action | auto_action.
    pub kind: &'static str,
    /// Health of the state left (`None` on creation).
    pub start_health: Option<&'static str>,
    /// Health of the state entered.
    pub end_health: &'static str,
    /// When the state left was entered.
    pub entry_time: Millis,
    /// When transitioning started: the event was received, or the action started.
    pub start_time: Millis,
    /// When the action started, if one ran.
    pub action_start_time: Option<Millis>,
    /// ok | retry | error.
    pub outcome: &'static str,
}

/// An error, for the `errors` table (and `exceptions` for panics).
#[derive(Debug, Clone, PartialEq)]
pub struct ErrorRecord {
    /// action_error | panic | refused | commit_failed.
    pub kind: &'static str,
    /// What went wrong.
    pub details: String,
    /// Exception details (a panic's message), if any.
    pub exception: Option<String>,
}

/// An event waiting in an entity's durable inbox.
#[derive(Debug, Clone, PartialEq)]
pub struct InboxItem {
    /// Store-assigned, increasing: the processing order.
    pub id: i64,
    /// The entity it was raised on.
    pub entity_id: i64,
    /// The event's name.
    pub event: EventName,
    /// Its parameters (a JSON object, or null).
    pub params: Value,
    /// The request that raised it.
    pub request_id: Option<String>,
    /// Where it came from.
    pub kind: InboxKind,
    /// When it was raised.
    pub created_at: Millis,
}

/// Where an inbox item came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum InboxKind {
    /// Raised by a caller of the API.
    #[default]
    Raised,
    /// Raised by another entity's action.
    Nested,
    /// Raised by a timer.
    Timer,
    /// A notice that a successor changed state: the entity's subscriptions are to be
    /// evaluated. Its `event` is [`InboxKind::NOTICE_EVENT`].
    Notice,
    /// An agent's report on a task (DESIGN §5): the outcome of the entity's agent-bound
    /// auto action. Its `event` is [`InboxKind::AGENT_EVENT`]; its params are an
    /// [`AgentReport`] with the task's id, attempt and state entry.
    Agent,
}

impl InboxKind {
    /// The event name of notices.
    pub const NOTICE_EVENT: &'static str = "$successors";
    /// The event name of agent reports.
    pub const AGENT_EVENT: &'static str = "$agent";

    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            InboxKind::Raised => "raised",
            InboxKind::Nested => "nested",
            InboxKind::Timer => "timer",
            InboxKind::Notice => "notice",
            InboxKind::Agent => "agent",
        }
    }
    /// Parses the stored name.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "raised" => InboxKind::Raised,
            "nested" => InboxKind::Nested,
            "timer" => InboxKind::Timer,
            "notice" => InboxKind::Notice,
            "agent" => InboxKind::Agent,
            _ => return None,
        })
    }
}

/// What a history row records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HistoryKind {
    /// The entity was created and entered its initial state.
    Create,
    /// An event's action moved the entity.
    Event,
    /// An auto action moved the entity (including re-entry for a retry).
    Auto,
    /// An event was rejected; nothing changed.
    Rejected,
    /// An action failed (error, panic, refused or failed commit); see `detail`.
    Fault,
    /// An operator command (pause, resume, sleep, kill, release, retry); see `detail`.
    Command,
}

impl HistoryKind {
    /// The lowercase name stored in the `kind` column.
    pub fn as_str(self) -> &'static str {
        match self {
            HistoryKind::Create => "create",
            HistoryKind::Event => "event",
            HistoryKind::Auto => "auto",
            HistoryKind::Rejected => "rejected",
            HistoryKind::Fault => "fault",
            HistoryKind::Command => "command",
        }
    }
    /// Parses the stored name.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "create" => HistoryKind::Create,
            "event" => HistoryKind::Event,
            "auto" => HistoryKind::Auto,
            "rejected" => HistoryKind::Rejected,
            "fault" => HistoryKind::Fault,
            "command" => HistoryKind::Command,
            _ => return None,
        })
    }
}

/// One row of an entity's append-only transition history.
#[derive(Debug, Clone, PartialEq)]
pub struct HistoryRow {
    /// Store-assigned, increasing.
    pub id: i64,
    /// The entity.
    pub entity_id: i64,
    /// The state before (`None` on creation).
    pub from: Option<StateName>,
    /// The state entered (`None` when nothing was entered: rejections, failed events).
    pub to: Option<StateName>,
    /// What happened.
    pub kind: HistoryKind,
    /// The action that ran, if any.
    pub action: Option<ActionName>,
    /// The event processed, if any.
    pub event: Option<EventName>,
    /// Retry count of the entry.
    pub retry: u32,
    /// The request that caused it.
    pub request_id: Option<String>,
    /// When it was committed.
    pub at: Millis,
    /// Rejection reason or error text.
    pub detail: Option<String>,
}

/// A stored machine definition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineRecord {
    /// The machine's name.
    pub name: MachineName,
    /// Content hash of the definition.
    pub hash: String,
    /// Canonical JSON of the definition.
    pub definition: String,
    /// When this version was first stored.
    pub created_at: Millis,
}

/// Which entities to list.
#[derive(Debug, Clone, Default)]
pub struct EntityFilter {
    /// Only this machine.
    pub machine: Option<String>,
    /// Only this state.
    pub state: Option<String>,
    /// Only entities with id greater than this (cursor).
    pub after_id: Option<i64>,
    /// At most this many (`None`: all).
    pub limit: Option<u64>,
    /// Only this run status (its stored name, e.g. `paused`; see [`RunStatus::as_str`]).
    pub run_status: Option<String>,
}

/// A new entity to insert.
#[derive(Debug, Clone, PartialEq)]
pub struct NewEntity {
    /// Its machine.
    pub machine: MachineName,
    /// Its key.
    pub key: EntityKey,
    /// The initial state.
    pub state: StateName,
    /// Constructor properties.
    pub properties: Properties,
    /// When its auto action is due (unstable initial state), else `None`.
    pub auto_at: Option<Millis>,
    /// The request that created it.
    pub request_id: Option<String>,
    /// The timers of its initial state.
    pub timers: Vec<TimerPlan>,
    /// Queue a change notice to itself (its initial state has subscriptions).
    pub notify_self: bool,
    /// Opens this operation (an external create); replays of its request id create nothing.
    pub operation: Option<OpenOperation>,
    /// The definition version it is created under.
    pub machine_hash: Option<String>,
    /// Health of the initial state (`ok` or `error`), for telemetry.
    pub health: &'static str,
    /// The agent task its initial state offers (its auto action is agent-bound).
    pub offer: Option<TaskOffer>,
}

/// An agent task offered by a commit (DESIGN §5): the entity's state has an agent-bound
/// auto action. The entity then has no `auto_at` of its own; the task carries the time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskOffer {
    /// The agent queue.
    pub queue: String,
    /// The action the agent executes.
    pub action: ActionName,
    /// How long a lease on the task lasts.
    pub lock_ms: i64,
    /// When agents may lease it (the state's `wait`, a retry delay or a backoff).
    pub available_at: Millis,
}

/// An agent task as stored, with what an agent needs to execute it.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentTask {
    /// Its id.
    pub id: i64,
    /// The queue it is offered on.
    pub queue: String,
    /// The entity's machine.
    pub machine: MachineName,
    /// The entity's key.
    pub key: EntityKey,
    /// The entity's id.
    pub entity_id: i64,
    /// The state whose auto action it is.
    pub state: StateName,
    /// The action to execute.
    pub action: ActionName,
    /// The entity's version at the offer (the state entry the task belongs to).
    pub entity_version: i64,
    /// The entity's retry count of that state entry.
    pub retry: u32,
    /// The entity's properties now.
    pub properties: Properties,
    /// How many errors the entity's fault policy counts now.
    pub errors: u32,
    /// The request the work belongs to.
    pub request_id: Option<String>,
    /// ready | leased | done | canceled.
    pub status: String,
    /// How many times it was leased (this lease included).
    pub attempt: u32,
    /// The current lease's token (only shown to the agent that leased it).
    pub token: Option<String>,
    /// The agent holding or last holding it.
    pub agent: Option<String>,
    /// When the current lease ends.
    pub locked_until: Option<Millis>,
    /// How long a lease lasts.
    pub lock_ms: i64,
    /// When it may be leased next (while ready or leased).
    pub available_at: Millis,
    /// When it was offered.
    pub created_at: Millis,
    /// complete | fail | canceled, once finished.
    pub outcome: Option<String>,
    /// The error an agent reported.
    pub error: Option<String>,
}

/// What an agent reports on a task it leased.
#[derive(Debug, Clone, PartialEq)]
pub enum TaskResult {
    /// The action is done: move to `target` (one of the action's declared targets) with
    /// these property changes (`null` removes a property).
    Complete {
        /// The state to enter.
        target: StateName,
        /// Properties to set.
        properties: Properties,
    },
    /// The action failed: a fault of the entity, decided by its fault policy; a
    /// non-retryable failure parks the entity for an operator at once.
    Fail {
        /// What went wrong.
        error: String,
        /// Whether trying again may help.
        retryable: bool,
    },
}

/// An agent report as queued in the entity's inbox ([`InboxKind::Agent`] params).
#[derive(Debug, Clone, PartialEq)]
pub struct AgentReport {
    /// The task.
    pub task: i64,
    /// The state entry (entity version) the task belongs to.
    pub entity_version: i64,
    /// The lease attempt that reported.
    pub attempt: u32,
    /// When that lease began.
    pub leased_at: Millis,
    /// The agent that reported.
    pub agent: Option<String>,
    /// The result.
    pub result: TaskResult,
}

impl AgentReport {
    /// The inbox params encoding.
    pub fn to_json(&self) -> Value {
        let result = match &self.result {
            TaskResult::Complete { target, properties } => {
                serde_json::json!({"complete": {"target": target.as_str(), "properties": properties}})
            }
            TaskResult::Fail { error, retryable } => {
                serde_json::json!({"fail": {"error": error, "retryable": retryable}})
            }
        };
        serde_json::json!({
            "task": self.task,
            "entity_version": self.entity_version,
            "attempt": self.attempt,
            "leased_at": self.leased_at,
            "agent": self.agent,
            "result": result,
        })
    }
    /// Decodes [`AgentReport::to_json`]; `None` if it is not one.
    pub fn from_json(v: &Value) -> Option<Self> {
        let result = v.get("result")?;
        let result = if let Some(c) = result.get("complete") {
            TaskResult::Complete {
                target: StateName::new(c.get("target")?.as_str()?),
                properties: c.get("properties")?.as_object()?.clone().into_iter().collect(),
            }
        } else {
            let f = result.get("fail")?;
            TaskResult::Fail { error: f.get("error")?.as_str()?.to_string(), retryable: f.get("retryable")?.as_bool()? }
        };
        Some(AgentReport {
            task: v.get("task")?.as_i64()?,
            entity_version: v.get("entity_version")?.as_i64()?,
            attempt: u32::try_from(v.get("attempt")?.as_u64()?).ok()?,
            leased_at: v.get("leased_at")?.as_i64()?,
            agent: v.get("agent").and_then(Value::as_str).map(str::to_string),
            result,
        })
    }
}

/// Which agent tasks to list.
#[derive(Debug, Clone, Default)]
pub struct TaskFilter {
    /// Only this task.
    pub id: Option<i64>,
    /// Only this queue.
    pub queue: Option<String>,
    /// Only this entity's tasks.
    pub entity_id: Option<i64>,
    /// Only ready or leased tasks.
    pub open_only: bool,
    /// At most this many, newest first (`None`: all).
    pub limit: Option<u64>,
}

/// An event to append to an entity's inbox.
#[derive(Debug, Clone, PartialEq)]
pub struct Push {
    /// The entity's machine.
    pub machine: MachineName,
    /// The entity's key.
    pub key: EntityKey,
    /// The event.
    pub event: EventName,
    /// Its parameters.
    pub params: Value,
    /// The request raising it.
    pub request_id: Option<String>,
    /// Where it comes from.
    pub kind: InboxKind,
    /// Records this entity as a predecessor of the target (the event joins the target into
    /// its workflow).
    pub join_from: Option<i64>,
    /// Opens this operation (an external raise); replays of its request id push nothing.
    pub operation: Option<OpenOperation>,
}

/// A timer an entity should have after a commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimerPlan {
    /// Unique per entity.
    pub name: String,
    /// The event it raises.
    pub event: EventName,
    /// When it is next due.
    pub due_at: Millis,
    /// Period, for periodic timers.
    pub every_ms: Option<i64>,
    /// Reset the due time even if the timer exists (a new state entry); otherwise an
    /// existing timer keeps its schedule.
    pub restart: bool,
}

/// A stored timer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimerRow {
    /// The entity.
    pub entity_id: i64,
    /// The timer's name.
    pub name: String,
    /// The event it raises.
    pub event: EventName,
    /// When it is next due.
    pub due_at: Millis,
    /// Period, for periodic timers.
    pub every_ms: Option<i64>,
}

/// A raw SQL statement run inside a commit. Parameters are bound, never interpolated.
#[derive(Debug, Clone, PartialEq)]
pub struct SqlStatement {
    /// SQL text with placeholders (`?1`, `?2`, ... on SQLite).
    pub sql: String,
    /// Bound parameters: null, bool, numbers and strings map to SQL values; arrays and
    /// objects are bound as JSON text.
    pub params: Vec<Value>,
}

/// The lease a commit is fenced by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    /// The entity.
    pub entity_id: i64,
    /// Its version as read by the lease holder.
    pub version: i64,
    /// The lease holder.
    pub owner: String,
}

/// What becomes of the lease after a commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterCommit {
    /// Keep the lease (the holder continues right away). Its lease time is unchanged:
    /// `Op::Renew` extends it, so a chain of steps does not rewrite the due-time index.
    Hold,
    /// Drop the lease. The entity is next due at its `auto_at`, or at once if its inbox
    /// holds events (checked inside the commit, so no event is ever stranded).
    Release,
}

/// One atomic, fenced change of one entity, with its effects.
#[derive(Debug, Clone, PartialEq)]
pub struct Commit {
    /// The lease this commit is fenced by.
    pub fence: Fence,
    /// The state before.
    pub from: StateName,
    /// The state entered, or `None` (rejection, failed event): state and version unchanged.
    pub to: Option<StateName>,
    /// Retry count of the entry.
    pub retry: u32,
    /// When the entered state's auto action is due (`None`: at rest). Ignored when `to` is
    /// `None`: the entity keeps its auto action's due time.
    pub auto_at: Option<Millis>,
    /// New properties, when they changed.
    pub properties: Option<Properties>,
    /// History kind.
    pub kind: HistoryKind,
    /// The action that ran.
    pub action: Option<ActionName>,
    /// The event processed.
    pub event: Option<EventName>,
    /// The inbox item consumed by this commit.
    pub consume: Option<i64>,
    /// The request id recorded in history.
    pub request_id: Option<String>,
    /// Rejection reason or error text recorded in history.
    pub detail: Option<String>,
    /// What happens to the lease.
    pub after: AfterCommit,
    /// Raw SQL run in the same transaction.
    pub sql: Vec<SqlStatement>,
    /// Entities created in the same transaction.
    pub creates: Vec<NewEntity>,
    /// Events pushed to other entities' inboxes in the same transaction.
    pub pushes: Vec<Push>,
    /// Versions the entities read "with lock" must still have, or the commit fails.
    pub preconditions: Vec<(i64, i64)>,
    /// The timers the entity has after this commit (`None`: unchanged). Timers not listed
    /// are deleted.
    pub timers: Option<Vec<TimerPlan>>,
    /// The subscription events fired during the current state entry after this commit
    /// (`None`: unchanged).
    pub fired: Option<Vec<EventName>>,
    /// Write a change notice to every predecessor (the state changed).
    pub notify_predecessors: bool,
    /// Write a change notice to the entity itself (it entered a state with subscriptions).
    pub notify_self: bool,
    /// Write no history row (a notice that fired nothing).
    pub quiet: bool,
    /// Also consume every change notice up to this inbox id (they were all covered by the
    /// subscription evaluation this commit concludes).
    pub consume_notices_upto: Option<i64>,
    /// New run status and its `sleep_until` (fault policy), if it changes.
    pub run_status: Option<(RunStatus, Option<Millis>)>,
    /// The entity's recent errors after this commit, if they change.
    pub recent_errors: Option<Vec<Millis>>,
    /// The definition version the commit ran under.
    pub machine_hash: Option<String>,
    /// Telemetry rows written with the commit.
    pub telemetry: Telemetry,
    /// An agent task to offer (the entity then waits for the agent; its `auto_at` is
    /// cleared). Whenever the state is entered (`to` set), earlier open tasks of the entity
    /// are canceled first.
    pub offer: Option<TaskOffer>,
}

impl Commit {
    /// A commit with no state change, effects or history detail: set what applies.
    pub fn new(fence: Fence, from: StateName, kind: HistoryKind, after: AfterCommit) -> Self {
        Commit {
            fence,
            from,
            to: None,
            retry: 0,
            auto_at: None,
            properties: None,
            kind,
            action: None,
            event: None,
            consume: None,
            request_id: None,
            detail: None,
            after,
            sql: Vec::new(),
            creates: Vec::new(),
            pushes: Vec::new(),
            preconditions: Vec::new(),
            timers: None,
            fired: None,
            notify_predecessors: false,
            notify_self: false,
            quiet: false,
            consume_notices_upto: None,
            run_status: None,
            recent_errors: None,
            machine_hash: None,
            telemetry: Telemetry::default(),
            offer: None,
        }
    }
}

/// What a subscriber sees when it evaluates its subscriptions: its successors, and the
/// newest change notice in its inbox, read in one snapshot (every notice up to it is
/// covered by these successor states).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SuccessorSnapshot {
    /// The successors, by id.
    pub successors: Vec<EntityRow>,
    /// The newest change notice of the subscriber, if any.
    pub newest_notice: Option<i64>,
}

/// One operation of a [`Batch`]; each is atomic on its own.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// Insert an entity (history: `create`).
    Create(NewEntity),
    /// Append an event to an inbox; the entity becomes due unless leased.
    Push(Push),
    /// Commit an entity's step.
    Commit(Box<Commit>),
    /// Drop the lease without a transition; the entity is due at its `auto_at`, or now if
    /// its inbox holds events.
    Release(Fence),
    /// An operator command on an entity.
    Command {
        /// The entity's machine.
        machine: MachineName,
        /// The entity's key.
        key: EntityKey,
        /// What to do.
        command: Command,
        /// Opens this operation; replays of its request id do nothing.
        operation: Option<OpenOperation>,
    },
    /// Marks operations with no progress since `before` as hung.
    MarkHung {
        /// The progress deadline.
        before: Millis,
    },
    /// Leases up to `limit` available tasks of `queue` (offered and not yet leased, or
    /// whose lease expired) for their lock time, to `agent`. Only tasks of active entities
    /// are leased. Each lease's token is `token_prefix` followed by the task id.
    TaskLease {
        /// The queue.
        queue: String,
        /// Who leases (recorded).
        agent: String,
        /// At most this many.
        limit: usize,
        /// Unique per call: makes each lease's token unguessable and unique.
        token_prefix: String,
    },
    /// Extends the lease of task `task` by its lock time, if `token` still holds it.
    TaskHeartbeat {
        /// The task.
        task: i64,
        /// The lease token.
        token: String,
    },
    /// An agent's report on task `task`: if `token` still holds it, the task is done and the
    /// report is queued in the entity's inbox (as [`InboxKind::Agent`]).
    TaskReport {
        /// The task.
        task: i64,
        /// The lease token.
        token: String,
        /// The result.
        result: TaskResult,
    },
    /// Extend leases held by `owner` on `ids` until `until` (due at that time too).
    Renew {
        /// Entities.
        ids: Vec<i64>,
        /// The holder.
        owner: String,
        /// New lease end.
        until: Millis,
    },
}

/// Claim due entities at the end of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// The claiming engine instance.
    pub owner: String,
    /// Lease length.
    pub lease_ms: i64,
    /// At most this many.
    pub limit: usize,
    /// Only entities of these machines (the ones the claiming engine serves); empty: any.
    pub machines: Vec<String>,
}

/// Many operations written in one transaction (one fsync): the group commit.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Batch {
    /// The engine's clock for this batch.
    pub now: Millis,
    /// Operations, applied in order; a failing one leaves no trace and does not stop the rest.
    pub ops: Vec<Op>,
    /// Claim due entities after the operations, in the same transaction.
    pub claim: Option<Claim>,
}

/// The successful result of one [`Op`].
#[derive(Debug, Clone, PartialEq)]
pub enum Applied {
    /// The entity inserted.
    Created(EntityRow),
    /// The event is in the inbox.
    Pushed {
        /// Its inbox id.
        inbox_id: i64,
        /// The entity's id.
        entity_id: i64,
    },
    /// The request id was seen before: the operation exists and nothing was done again.
    Replayed {
        /// The operation first opened with this request id.
        operation_id: i64,
    },
    /// The command is applied; the entity afterwards.
    Commanded(EntityRow),
    /// Operations marked hung.
    MarkedHung(u64),
    /// The commit is applied.
    Committed {
        /// Whether the lease is still held (a `Hold` commit on an active entity).
        held: bool,
        /// The entity's version afterwards.
        version: i64,
        /// The first event now waiting in the inbox (only reported when the lease is held).
        inbox_head: Option<InboxItem>,
        /// Ids of created entities.
        created: Vec<i64>,
    },
    /// The lease was dropped.
    Released,
    /// Leases renewed: how many.
    Renewed(u64),
    /// Tasks leased (possibly none).
    Leased(Vec<AgentTask>),
    /// The task's lease now ends at `locked_until`.
    Extended {
        /// The new lease end.
        locked_until: Millis,
    },
}

/// Why one [`Op`] failed; nothing of it is visible.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpError {
    /// No such entity.
    #[error("no entity `{key}` of machine `{machine}`")]
    NotFound {
        /// Machine.
        machine: String,
        /// Key.
        key: String,
    },
    /// An entity with this machine and key exists.
    #[error("entity `{key}` of machine `{machine}` already exists")]
    AlreadyExists {
        /// Machine.
        machine: String,
        /// Key.
        key: String,
    },
    /// The lease is no longer ours, or the version moved: another writer owns the entity.
    #[error("lease lost on entity {entity_id}")]
    LeaseLost {
        /// The entity.
        entity_id: i64,
    },
    /// An entity read "with lock" changed since it was read.
    #[error("entity {entity_id} changed since it was read (version {expected}, now {found})")]
    Precondition {
        /// The entity.
        entity_id: i64,
        /// The version read.
        expected: i64,
        /// The version now (0: gone).
        found: i64,
    },
    /// The entity was killed; it takes no commands but `kill`.
    #[error("entity `{key}` of machine `{machine}` was killed")]
    Killed {
        /// Machine.
        machine: String,
        /// Key.
        key: String,
    },
    /// An agent's heartbeat or report was refused: the lease expired or was superseded,
    /// the task was already reported or canceled, or it does not exist. Nothing changed.
    #[error("task {task}: {reason}")]
    TaskRefused {
        /// The task.
        task: i64,
        /// Why.
        reason: String,
    },
    /// A raw SQL statement of the commit failed (constraint, syntax, ...).
    #[error("sql statement {index} failed: {message}")]
    Sql {
        /// Index of the statement in the commit.
        index: usize,
        /// The database's message.
        message: String,
    },
}

/// An entity claimed for processing, with the first event of its inbox.
#[derive(Debug, Clone, PartialEq)]
pub struct Claimed {
    /// The entity, now leased.
    pub entity: EntityRow,
    /// The first inbox event, if any.
    pub inbox_head: Option<InboxItem>,
}

/// Results of a [`Batch`], in operation order.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct BatchResult {
    /// One result per operation.
    pub results: Vec<Result<Applied, OpError>>,
    /// Entities claimed.
    pub claimed: Vec<Claimed>,
    /// The earliest `due_at` still pending after the batch (for the engine's wake-up).
    pub next_due: Option<Millis>,
}

/// One processed event of an entity, as the `events` telemetry table holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct EventRow {
    /// Its id (the inbox id it had).
    pub id: i64,
    /// The request that raised it.
    pub request_id: Option<String>,
    /// The event's name.
    pub event: EventName,
    /// raised | nested | subscription | timer.
    pub kind: String,
    /// The state it was processed in.
    pub start_state: StateName,
    /// The state the entity was at rest in afterwards (`None` while its workflow runs).
    pub end_state: Option<StateName>,
    /// When it was raised.
    pub start_time: Millis,
    /// When the entity was at rest again (`None` while its workflow runs).
    pub end_time: Option<Millis>,
    /// Rejected in the entity's state.
    pub rejected: bool,
    /// Its action failed.
    pub failed: bool,
    /// The error recorded with it, if any.
    pub error: Option<String>,
    /// Exception details (a panic's message), if any.
    pub exception: Option<String>,
    /// Why it was rejected, or how its action failed.
    pub reason: Option<String>,
    /// The state its action entered (when accepted).
    pub entered: Option<StateName>,
}

/// Key performance indicators read back from the telemetry tables (see [`crate::Store::stats`]).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Stats {
    /// Per operation name, by name.
    pub operations: Vec<OperationStats>,
    /// Per machine transition (machine, start state, end state), in that order.
    pub transitions: Vec<TransitionStats>,
    /// The most frequent errors (kind and details), most frequent first.
    pub top_errors: Vec<ErrorStats>,
}

/// Statistics of the operations with one name.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct OperationStats {
    /// The operation name, e.g. `server.create`.
    pub name: String,
    /// Operations started.
    pub count: u64,
    /// Of those, ended (with any outcome).
    pub ended: u64,
    /// Of those, ended with `success`.
    pub success: u64,
    /// `success / ended`, or 0 when none ended.
    pub success_rate: f64,
    /// Median duration (end − start) of the ended ones, in ms (nearest rank; 0 when none).
    pub p50_ms: i64,
    /// 99th percentile duration of the ended ones, in ms (nearest rank; 0 when none).
    pub p99_ms: i64,
}

/// Statistics of one transition of one machine.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TransitionStats {
    /// The machine.
    pub machine: String,
    /// The state left (`None`: the entity was created).
    pub from: Option<String>,
    /// The state entered.
    pub to: String,
    /// How many times it happened.
    pub count: u64,
    /// Share of them with outcome `error`, in [0, 1].
    pub error_rate: f64,
    /// Mean retry count of the entries.
    pub mean_retries: f64,
}

/// How often one error occurred.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ErrorStats {
    /// action_error | panic | refused | commit_failed.
    pub kind: String,
    /// What went wrong.
    pub details: String,
    /// Occurrences.
    pub count: u64,
}

/// Counters and gauges for a metrics exposition (Prometheus), read in one snapshot (see
/// [`crate::Store::metrics_snapshot`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MetricsSnapshot {
    /// Transitions ever made, per machine, start state (`None`: creation) and end state.
    pub transitions: Vec<TransitionCount>,
    /// Events rejected.
    pub events_rejected: u64,
    /// Errors recorded (faults of actions and commits).
    pub faults: u64,
    /// Entities parked for an operator (run status `failed`).
    pub parked: u64,
    /// Entities per machine, state and run status.
    pub entities: Vec<EntityCount>,
    /// Entities whose due time has passed: work waiting to be claimed.
    pub due_backlog: u64,
    /// Operations per outcome; unfinished ones without an outcome count as `open`.
    pub operations: Vec<(String, u64)>,
    /// Open agent tasks per queue and status (`ready`: waiting for an agent, `leased`).
    pub tasks: Vec<(String, String, u64)>,
}

/// How many times one transition happened.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TransitionCount {
    /// The machine.
    pub machine: String,
    /// The state left (`None`: the entity was created).
    pub from: Option<String>,
    /// The state entered.
    pub to: String,
    /// How many times.
    pub count: u64,
}

/// How many entities are in one state with one run status.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EntityCount {
    /// The machine.
    pub machine: String,
    /// The state.
    pub state: String,
    /// The run status.
    pub run_status: RunStatus,
    /// How many.
    pub count: u64,
}

/// The value at quantile `q` (in [0, 1]) of ascending `sorted` values by nearest rank:
/// index `round((n − 1) · q)`; 0 when empty.
pub fn percentile(sorted: &[i64], q: f64) -> i64 {
    if sorted.is_empty() {
        return 0;
    }
    let idx = ((sorted.len() as f64 - 1.0) * q.clamp(0.0, 1.0)).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}
