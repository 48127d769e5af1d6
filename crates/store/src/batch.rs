//! The write path's vocabulary: a [`Batch`] of [`Op`]s (creates, pushes, fenced [`Commit`]s,
//! releases, commands, agent task operations, renewals), optionally followed by a [`Claim`],
//! and what it answers ([`BatchResult`]: an [`Applied`] or an [`OpError`] per operation, the
//! entities [`Claimed`]).

use serde_json::Value;
use settle_core::{ActionName, EntityKey, EventName, MachineName, Properties, StateName};

use crate::{
    AgentTask, Command, EntityRow, HistoryKind, InboxItem, Millis, NewEntity, OpenOperation, Prune, Pruned, Push,
    PushRelated, RunStatus, TaskCheck, TaskOffer, TaskRefusal, TaskResult, Telemetry, TimerPlan,
};

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
    /// Whether that item is an internal event (one the entity raised on itself): only then
    /// may others be queued behind it, and the next head is looked for among them first.
    /// An item of any other kind is consumed only when no internal event is queued, as
    /// internal events head the inbox.
    pub consumes_internal: bool,
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
    /// Events pushed to every predecessor or successor of the entity, in the same
    /// transaction (after its creates and pushes).
    pub push_related: Vec<PushRelated>,
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
    /// The state entered (`to`) is an end state (terminal or deleted): the entity's
    /// `ended_at` is set, from which its retention counts.
    pub ended: bool,
    /// Trim the entity's past to its retention in the same transaction (the engine asks
    /// now and then, not with every commit).
    pub trim: Option<crate::Trim>,
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
    /// An internal transition (with `to` `None`): the entity stays in its state entry, but
    /// its version moves (its properties or effects changed it), and the history row and
    /// its `transitions` row stay in the state.
    pub internal: bool,
    /// The commit ends the entity's limited action (a transition, a retry, a fault): the
    /// slots it holds are given back and handed to the first in line, and a place it holds
    /// in a line is given up, in the same transaction ([`Op::Acquire`]).
    pub leave_limits: bool,
    /// With `leave_limits`: the entity holds every slot its action asked for (so it waits
    /// in no line) and its action ran in an engine (so no agent's call of it can be in
    /// flight): its leaving looks up neither. Only a holder that knows both says so.
    pub held_all: bool,
    /// The commit enters a limited state whose auto action the holder runs next (an `Hold`
    /// commit): the slots of its limits are asked for in the same transaction, as by
    /// [`Op::Acquire`] (after the slots of the state left go back), saving a batch. The
    /// answer is [`Applied::Committed`]'s `acquired`; nothing is asked if the lease is not
    /// held after the commit or events wait in its inbox (they go first; the holder asks
    /// later).
    pub acquire: Option<Vec<SlotAsk>>,
    /// The commit ends the entity's workflow (it leaves it at rest, in a stable state): the
    /// slots of limits of workflows it holds go back, to the first in line, in the same
    /// transaction. Set by a holder for machines that declare limits of workflows.
    pub leave_workflows: bool,
    /// The commit processes an event that starts a workflow limits of workflows count: their
    /// slots are taken first, in the same transaction, as by an [`Op::Acquire`] with
    /// `workflow` at the priority of `request_id`'s request. No room (or the entity stopped
    /// meanwhile): the commit is not applied, the entity waits in line at rest with its lease
    /// dropped, and the result is that of the ask ([`Applied::Waiting`],
    /// [`Applied::Released`]). Saves the batch an ask of its own costs.
    pub take_first: Option<Vec<SlotAsk>>,
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
            consumes_internal: false,
            request_id: None,
            detail: None,
            after,
            sql: Vec::new(),
            creates: Vec::new(),
            pushes: Vec::new(),
            push_related: Vec::new(),
            preconditions: Vec::new(),
            timers: None,
            fired: None,
            notify_predecessors: false,
            notify_self: false,
            quiet: false,
            ended: false,
            trim: None,
            consume_notices_upto: None,
            run_status: None,
            recent_errors: None,
            machine_hash: None,
            telemetry: Telemetry::default(),
            offer: None,
            internal: false,
            leave_limits: false,
            held_all: false,
            acquire: None,
            leave_workflows: false,
            take_first: None,
        }
    }
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
    /// Cancels an operation on one entity it reached (see [`Cancel`]). Answers
    /// [`Applied::Canceled`].
    Cancel(Box<Cancel>),
    /// A round of pruning: removes what retention lets go (see [`Prune`]). Answers
    /// [`Applied::Pruned`].
    Prune(Box<Prune>),
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
        /// What the caller may do besides holding the lease.
        check: TaskCheck,
    },
    /// An agent's report on task `task`: if `token` still holds it, the task is done and the
    /// report is queued in the entity's inbox (as [`InboxKind::Agent`](crate::InboxKind::Agent)),
    /// in the same transaction.
    TaskReport {
        /// The task.
        task: i64,
        /// The lease token.
        token: String,
        /// The result.
        result: TaskResult,
        /// What the caller may do besides holding the lease, and the targets its action
        /// declares.
        check: TaskCheck,
    },
    /// Takes the slots of the concurrency limits an auto action needs before it starts
    /// (see [`Acquire`]). Answers [`Applied::Acquired`] or [`Applied::Waiting`].
    Acquire(Box<Acquire>),
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

/// A held entity asks for the slots of the concurrency limits its auto action counts
/// against (DESIGN §10), all or none, in the order given (by name: two entities never wait
/// for each other's). A slot it holds already stays held (asking again is harmless). Where a
/// limit's key value has a slot free, the entity takes it; where none is, the entity waits
/// in line for that limit (by `priority`, then arrival; keeping its place if it waits
/// already), keeps the slots it took, and its lease is dropped: it is due again when a
/// commit that ends another's action hands it the slot, or when an event arrives.
#[derive(Debug, Clone, PartialEq)]
pub struct Acquire {
    /// The lease it asks under.
    pub fence: Fence,
    /// The slots: limit, key value, and the limit's `max` as the entity's definition
    /// declares it (the stored `max` follows the newest asked for).
    pub slots: Vec<SlotAsk>,
    /// Its place among those waiting of its fairness value: higher first (`None`: its
    /// workflow's, the priority of the request its entity works for, 0 without one).
    pub priority: Option<i64>,
    /// The slots are for the workflow the event at the head of its inbox starts (its
    /// limits of workflows): held until the entity comes to rest
    /// ([`Commit::leave_workflows`]); waiting, it stays at rest, not due for its own inbox
    /// (the event waits, and what is queued behind it). `false`: for its auto action.
    pub workflow: bool,
    /// With `priority` `None`: the request whose priority it waits at (a workflow's: the
    /// queued event's; `None`: the request its entity works for).
    pub request_id: Option<String>,
}

/// One slot an [`Acquire`] asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotAsk {
    /// The limit's name.
    pub limit: String,
    /// The value of its key for the entity (`""`: a limit without a key).
    pub key: String,
    /// How many may hold a slot of this key value at once (`None`: a limit of rate only).
    pub max: Option<u32>,
    /// At most this many starts per period, spaced evenly (`None`: no rate).
    pub rate: Option<Rate>,
    /// The value of the limit's `fair_by` for the entity (`""`: none): a line is admitted
    /// round-robin across these values.
    pub fair: String,
}

/// A limit's rate: at most `starts` per `per_ms` milliseconds, each start at least
/// `per_ms / starts` after the one before (rounded up to the microsecond), so that no
/// window of `per_ms` ever sees more than `starts`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    /// Starts per period.
    pub starts: u32,
    /// The period, in milliseconds.
    pub per_ms: u64,
}

impl Rate {
    /// The least time between two starts, in microseconds.
    pub fn spacing_us(self) -> i64 {
        let per_us = i128::from(self.per_ms) * 1_000;
        let starts = i128::from(self.starts.max(1));
        i64::try_from((per_us + starts - 1) / starts).unwrap_or(i64::MAX)
    }
}

/// Canceling operation `canceled` on one entity it reached: its queued events of the
/// operation are dropped; the work it does in the operation is stopped (its version moves,
/// so a result in flight is refused; its lease is dropped; its open agent tasks are
/// canceled); where its state is the operation's doing and its machine's cancel event is
/// valid there, that event is queued (as the operation `operation`, whose end is its
/// undo's end); work stopped with no undo leaves it paused. The operation `canceled` ends
/// as canceled once nothing of it is busy or queued.
#[derive(Debug, Clone, PartialEq)]
pub struct Cancel {
    /// The entity's machine.
    pub machine: MachineName,
    /// The entity's key.
    pub key: EntityKey,
    /// The request id of the operation canceled.
    pub canceled: String,
    /// Its machine's cancel event and where it is valid (`None`: it declares none).
    pub undo: Option<Undo>,
    /// Opens this operation (the entity's part of the cancel); replays of its request id
    /// do nothing.
    pub operation: Option<OpenOperation>,
}

/// A machine's cancel event (`cancel = "EVENT"`) and the leaf states where it is valid.
#[derive(Debug, Clone, PartialEq)]
pub struct Undo {
    /// The event.
    pub event: EventName,
    /// The states where it is valid.
    pub states: Vec<StateName>,
}

/// What canceling an operation did to one entity it reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelOutcome {
    /// Nothing of the operation was there (or it is killed): unchanged.
    Untouched,
    /// Its queued events of the operation were dropped; nothing else of it was there.
    Dropped,
    /// Its machine's cancel event is queued: its part is being undone (`stopped`: its work
    /// in the operation was stopped first).
    Undone {
        /// Work of the operation was stopped.
        stopped: bool,
    },
    /// Its work in the operation was stopped and no cancel event is valid in its state:
    /// paused for an operator.
    Paused,
}

impl CancelOutcome {
    /// The outcome's name: `untouched`, `dropped`, `undone` or `paused`.
    pub fn as_str(self) -> &'static str {
        match self {
            CancelOutcome::Untouched => "untouched",
            CancelOutcome::Dropped => "dropped",
            CancelOutcome::Undone { .. } => "undone",
            CancelOutcome::Paused => "paused",
        }
    }
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
    /// Lease the entities this batch creates that are due at once (an auto action, no
    /// event queued) to the claiming engine as they are inserted, within `limit` and before
    /// older due work; the claim takes the rest of `limit`. Saves the claim's statements for
    /// each (a parent's children, mostly). Set it only when nothing older waits: when the
    /// engine's last claim took less than its limit.
    pub take_created: bool,
    /// Likewise lease the existing entities this batch gives an event that are due at once
    /// for it: free, active and at rest before (no due time: nothing queued, nothing
    /// scheduled). A raise on an entity at rest (and a notice to an entity waiting for it)
    /// then costs no claim. The same condition as `take_created`.
    /// A store whose dialect reads the leased rows back cheaply does it (SQLite); the
    /// others leave these entities to the claim, which takes them in the same batch.
    pub take_raised: bool,
}

impl Claim {
    /// A claim of up to `limit` due entities of any machine for `owner`, leased for
    /// `lease_ms`, that takes none of the entities its batch creates.
    pub fn new(owner: impl Into<String>, lease_ms: i64, limit: usize) -> Claim {
        Claim { owner: owner.into(), lease_ms, limit, machines: Vec::new(), take_created: false, take_raised: false }
    }
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
    /// An operation is canceled on the entity: the entity afterwards, and what became of
    /// its part.
    Canceled {
        /// The entity afterwards.
        entity: Box<EntityRow>,
        /// What became of its part in the operation.
        outcome: CancelOutcome,
    },
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
        /// The answer to the commit's ask for the slots of the state it entered
        /// ([`Commit::acquire`]): [`Applied::Acquired`], or [`Applied::Waiting`] (then
        /// `held` is false: it waits in line, its lease dropped); `None`: not asked.
        acquired: Option<Box<Applied>>,
    },
    /// The lease was dropped.
    Released,
    /// Leases renewed: how many.
    Renewed(u64),
    /// Tasks leased (possibly none).
    Leased(Vec<AgentTask>),
    /// An agent's report again with the lease token whose report was applied already: a
    /// replay; nothing changed (the first report stands).
    ReportReplayed {
        /// The task.
        task: i64,
    },
    /// The task's lease now ends at `locked_until`.
    Extended {
        /// The new lease end.
        locked_until: Millis,
    },
    /// A round of pruning: what it removed (or, dry, would remove).
    Pruned(Box<Pruned>),
    /// The entity holds every slot it asked for ([`Op::Acquire`]); its lease is kept.
    Acquired,
    /// The entity waits in line for a slot of `limit` (key value `key`); its lease is
    /// dropped.
    Waiting {
        /// The limit whose slots are all taken.
        limit: String,
        /// Its key value.
        key: String,
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
    /// An agent's heartbeat or report was refused; nothing changed.
    #[error(transparent)]
    Task(#[from] TaskRefusal),
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
    /// The event whose workflow the entity is in (its `event_id`), with its parameters:
    /// what its auto actions run for.
    pub trigger: Option<Trigger>,
}

/// The event whose workflow an entity is in: the one whose action entered its state, or
/// began the chain of auto actions that did, as stored in the `events` table.
#[derive(Debug, Clone, PartialEq)]
pub struct Trigger {
    /// The event's name.
    pub event: EventName,
    /// Its parameters (null: none).
    pub params: Value,
    /// The reply its workflow's end owes (a sync nested event), if it asked for one.
    pub reply: Option<crate::Reply>,
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
