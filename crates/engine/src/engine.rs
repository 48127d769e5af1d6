//! The engine's public face: [`Engine`] creates entities, raises events, applies operator
//! commands, serves agents, and waits for entities; everything it writes goes through the
//! scheduler's channel. Start one with [`crate::EngineBuilder`].

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use settle_core::step::{self, Properties};
use settle_core::{EventName, Machine, StateKind, StateName};
use settle_store::{
    AgentTask, Applied, Command, EntityRow, HistoryRow, ManualClock, Millis, Op, OperationRow, RunStatus, SharedClock,
    Store, TaskCheck, TaskFilter, TaskResult,
};
use tokio::sync::{mpsc, oneshot};

use crate::api::{Commanded, Created, EventOutcome, RaiseOptions, Raised, Wait};
use crate::error::{Error, Result};
use crate::msg::Msg;
use crate::ops::{command_op, create_op, push_op};
use crate::opwatch::OpWatch;
use crate::registry::Registry;
use crate::watch::{Hub, Want, first_of};

/// What every clone of an [`Engine`] shares.
pub(crate) struct Inner<S> {
    pub(crate) store: S,
    /// The machines and handlers, replaced whole by a deploy.
    pub(crate) registries: Arc<crate::registry::Registries>,
    pub(crate) clock: SharedClock,
    /// The deployment's retention ([`crate::Config::retention`]).
    pub(crate) retention: settle_core::retention::Defaults,
    /// Most entities a round of pruning removes ([`crate::Config::prune_limit`]).
    pub(crate) prune_limit: usize,
    /// Where entities removed by retention are archived first ([`crate::Config::archive`]).
    pub(crate) archive: crate::archive::Shared,
    pub(crate) tx: mpsc::UnboundedSender<Msg>,
    /// Notified when this engine offered agent tasks.
    pub(crate) offered: Arc<tokio::sync::Notify>,
    /// Counts the batches this engine committed that wrote anything (followers of the
    /// change feed read again).
    pub(crate) committed: Arc<tokio::sync::watch::Sender<u64>>,
    /// Callers waiting on entities another instance moves (shared stores only).
    pub(crate) hub: Option<Hub>,
    /// Callers waiting for operations to end.
    pub(crate) ops: OpWatch,
    /// Set (and `offered` pulsed) when waiting agent long polls should end.
    pub(crate) closing: std::sync::atomic::AtomicBool,
    pub(crate) task: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Wakes the bulk operations' runner (a bulk operation was started).
    pub(crate) bulk: Arc<tokio::sync::Notify>,
    /// Pulsed when a page of a bulk operation was written (callers of `bulk_wait`).
    pub(crate) bulk_progress: tokio::sync::Notify,
    /// Wakes the schedules' task (a schedule was paused or resumed).
    pub(crate) schedules: Arc<tokio::sync::Notify>,
    /// Held while a deploy checks and stores its versions (one at a time per engine).
    pub(crate) deploying: tokio::sync::Mutex<()>,
    /// How often the store is looked at for what other instances did ([`crate::Config::poll`]).
    pub(crate) poll: std::time::Duration,
    /// The last deploy marker read from the store (see `crate::deploy`).
    pub(crate) deployed: std::sync::Mutex<Option<String>>,
    /// It writes nothing ([`crate::Config::read_only`]; `Inner::writable`).
    pub(crate) read_only: bool,
    /// It claims due work (`max_inflight` above 0): its machines' actions need handlers.
    pub(crate) processes: bool,
    /// Turns to narrow pages by expressions, one per core ([`Engine::narrowed`]).
    pub(crate) narrowing: tokio::sync::Semaphore,
    /// How long narrowing one page may take ([`crate::Config::narrow_budget`]).
    pub(crate) narrow_budget: Duration,
}

impl<S> Inner<S> {
    /// The machines and handlers now.
    pub(crate) fn registry(&self) -> Arc<Registry> {
        self.registries.load()
    }
}

/// How far one subscription of an entity is from firing (see
/// [`Engine::subscription_progress`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscriptionProgress {
    /// The subscription event.
    pub event: EventName,
    /// Its pattern, as canonical text.
    pub pattern: String,
    /// Successors selected, satisfying, and whether the pattern holds.
    pub progress: settle_core::pattern::Progress,
    /// Whether it already fired during the current state entry.
    pub fired: bool,
}

/// A running engine. Cheap to clone. Stop it with [`Engine::shutdown`].
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use settle_core::MachineBuilder;
/// use settle_engine::{Engine, RaiseOptions, Wait};
/// use settle_store::SqliteStore;
///
/// let door = MachineBuilder::new("door")
///     .state("closed").initial()
///     .state("open")
///     .event("open", ["closed"], "swing")
///     .action("swing", ["open"])
///     .build()?;
/// let engine = Engine::builder(SqliteStore::open("doors.db")?).machine(door).start().await?;
/// engine.create("door", "front", Default::default()).await?;
/// let raised = engine.raise("door", "front", "open", RaiseOptions::wait(Wait::Stable)).await?;
/// assert_eq!(raised.entity.unwrap().state, "open");
/// engine.shutdown().await;
/// # Ok(()) }
/// ```
pub struct Engine<S: Store> {
    pub(crate) inner: Arc<Inner<S>>,
}

impl<S: Store> Clone for Engine<S> {
    fn clone(&self) -> Self {
        Engine { inner: self.inner.clone() }
    }
}

impl<S: Store> Engine<S> {
    /// The store.
    pub fn store(&self) -> &S {
        &self.inner.store
    }

    /// The current version of the registered machine `name`.
    pub fn machine(&self, name: &str) -> Result<Arc<Machine>> {
        self.inner.registry().machine(name).cloned()
    }

    /// The current version of every registered machine, by name.
    pub fn machines(&self) -> Vec<Arc<Machine>> {
        let mut all: Vec<Arc<Machine>> = self.inner.registry().machines.values().cloned().collect();
        all.sort_by(|a, b| a.name().cmp(b.name()));
        all
    }

    /// The version `entity` runs under (its own, which may be older than its machine's
    /// current one while it is pinned), with that version's content hash.
    pub fn version_of(&self, entity: &EntityRow) -> Result<(String, Arc<Machine>)> {
        self.inner.registry().version_of(entity)
    }

    /// The clock this engine counts time on.
    pub fn clock(&self) -> &SharedClock {
        &self.inner.clock
    }

    pub(crate) fn send(&self, msg: Msg) -> Result<()> {
        self.inner.tx.send(msg).map_err(|_| Error::Stopped)
    }

    /// Creates an entity in its machine's initial state (durably). If that state is
    /// unstable, its auto action runs.
    pub async fn create(&self, machine: &str, key: &str, properties: Properties) -> Result<EntityRow> {
        let created = self.create_with(machine, key, properties, None).await?;
        Ok(created.entity)
    }

    /// Creates an entity as an operation with `request_id` as its idempotency key (a new
    /// one when `None`). Replaying a key creates nothing and returns the entity as it is.
    pub async fn create_with(
        &self,
        machine: &str,
        key: &str,
        properties: Properties,
        request_id: Option<String>,
    ) -> Result<Created> {
        self.create_at(machine, key, properties, request_id, 0).await
    }

    /// [`Engine::create_with`], the work the creation starts (its initial state's auto
    /// actions) of `priority` (a schedule's creates: below requests').
    pub(crate) async fn create_at(
        &self,
        machine: &str,
        key: &str,
        properties: Properties,
        request_id: Option<String>,
        priority: i64,
    ) -> Result<Created> {
        let request_id = request_id.unwrap_or_else(|| uuid::Uuid::now_v7().to_string());
        let now = self.inner.clock.now_ms();
        let new = create_op(&self.inner.registry(), machine, key, properties, &request_id, priority, now)?;
        let (reply, rx) = oneshot::channel();
        self.send(Msg::Create { new, reply })?;
        match rx.await.map_err(|_| Error::Stopped)?? {
            Some(entity) => Ok(Created { entity, request_id, replayed: false }),
            None => {
                self.same_request(&request_id, &format!("{machine}:new"), machine, key).await?;
                let entity = self.get(machine, key).await?.ok_or_else(|| not_found(machine, key))?;
                Ok(Created { entity, request_id, replayed: true })
            }
        }
    }

    /// Applies an operator command (pause, resume, sleep, kill, release, retry) as an
    /// operation with `request_id` as its idempotency key.
    pub async fn command(
        &self,
        machine: &str,
        key: &str,
        command: Command,
        request_id: Option<String>,
    ) -> Result<Commanded> {
        self.command_with_reason(machine, key, command, request_id, None).await
    }

    /// [`Engine::command`] with the operator's reason: kept with the operation (its
    /// dimension `reason`) and in the entity's history (`pause: <reason>`).
    pub async fn command_with_reason(
        &self,
        machine: &str,
        key: &str,
        command: Command,
        request_id: Option<String>,
        reason: Option<&str>,
    ) -> Result<Commanded> {
        let request_id = request_id.unwrap_or_else(|| uuid::Uuid::now_v7().to_string());
        let op = command_op(&self.inner.registry(), machine, key, command, &request_id, reason)?;
        let (reply, rx) = oneshot::channel();
        self.send(Msg::Command { op, reply })?;
        let done = match rx.await.map_err(|_| Error::Stopped)?? {
            Some(entity) => Commanded { entity, request_id, replayed: false },
            None => {
                // The key was used before: for this same command, or it is refused.
                self.same_request(&request_id, &format!("{machine}.{}", command.as_str()), machine, key).await?;
                let entity = self.get(machine, key).await?.ok_or_else(|| not_found(machine, key))?;
                Commanded { entity, request_id, replayed: true }
            }
        };
        if command == Command::Kill && self.inner.registry().machine(machine)?.cascades("kill") {
            self.cascade_kill(&done, reason).await?;
        }
        Ok(done)
    }

    /// The operation opened with `request_id`.
    pub async fn operation(&self, request_id: &str) -> Result<Option<OperationRow>> {
        Ok(self.inner.store.operation_get(request_id).await?)
    }

    /// Raises `event` on an entity: checks the event and its parameters, writes it to the
    /// entity's durable inbox, then waits as `options.wait` says.
    pub async fn raise(&self, machine: &str, key: &str, event: &str, options: RaiseOptions) -> Result<Raised> {
        let request_id = options.request_id.clone().unwrap_or_else(|| uuid::Uuid::now_v7().to_string());
        let span = tracing::info_span!("operation", request_id = %request_id, machine, key, event);
        tracing::Instrument::instrument(self.raise_in(machine, key, event, options, request_id), span).await
    }

    async fn raise_in(
        &self,
        machine: &str,
        key: &str,
        event: &str,
        options: RaiseOptions,
        request_id: String,
    ) -> Result<Raised> {
        let m = self.inner.registry().machine(machine)?.clone();
        let declared = step::check_raise(&m, event, &options.params)?;
        let priority = step::priority_of(&m, declared, options.priority, options.background)?;
        if options.refuse_at_rest
            && let Some((entity, rejection)) =
                self.refusal_at_rest(&m, key, event, options.request_id.as_deref()).await?
        {
            let outcome = EventOutcome::Rejected { state: rejection.state, reason: rejection.reason };
            return Ok(Raised {
                request_id,
                inbox_id: None,
                replayed: false,
                refused: true,
                outcome: Some(outcome),
                entity: Some(entity),
                operation: None,
            });
        }
        let push = push_op(&m, key, event, options.params, &request_id, priority);
        let (ack, ack_rx) = oneshot::channel();
        let (done, done_rx) = match options.wait {
            Wait::Queued => (None, None),
            Wait::Outcome | Wait::Stable | Wait::Operation => {
                let (tx, rx) = oneshot::channel();
                (Some(tx), Some(rx))
            }
        };
        let mark = self.inner.hub.as_ref().map(Hub::mark);
        let wait = options.wait;
        self.send(Msg::Raise { push, wait, ack, done })?;
        let started = tokio::time::Instant::now();
        let Some((inbox_id, entity_id)) = ack_rx.await.map_err(|_| Error::Stopped)?? else {
            // The key was used before: that operation stands, nothing is raised again.
            self.same_request(&request_id, &format!("{machine}.{event}"), machine, key).await?;
            let operation = match wait {
                Wait::Operation => Some(self.wait_operation(&request_id, options.timeout).await?),
                _ => None,
            };
            let entity = self.get(machine, key).await?;
            return Ok(Raised {
                request_id,
                inbox_id: None,
                replayed: true,
                refused: false,
                outcome: None,
                entity,
                operation,
            });
        };
        let mut raised = Raised {
            request_id,
            inbox_id: Some(inbox_id),
            replayed: false,
            refused: false,
            outcome: None,
            entity: None,
            operation: None,
        };
        if let Some(rx) = done_rx {
            // This engine answers if it processes the event; the hub if another instance does.
            let remote = match (&self.inner.hub, mark) {
                (Some(hub), Some(mark)) => {
                    let (reply, remote) = oneshot::channel();
                    let want = Want::Event {
                        inbox_id,
                        stable: wait == Wait::Stable,
                        machine: m.clone(),
                        accepted: None,
                        reply,
                    };
                    hub.watch(entity_id, mark, want);
                    Some(remote)
                }
                _ => None,
            };
            match tokio::time::timeout(options.timeout, first_of(rx, remote)).await {
                Ok(Some((outcome, entity))) => {
                    raised.outcome = Some(outcome);
                    raised.entity = Some(entity);
                }
                Ok(None) => return Err(Error::Stopped),
                Err(_) => return Err(Error::Timeout { request_id: raised.request_id, waited: options.timeout }),
            }
        }
        if wait == Wait::Operation {
            let left = options.timeout.saturating_sub(started.elapsed());
            let op = self.wait_operation(&raised.request_id, left).await.map_err(|e| match e {
                Error::Timeout { request_id, .. } => Error::Timeout { request_id, waited: options.timeout },
                e => e,
            })?;
            // The entity as the operation left it.
            if let Some(entity) = self.get(machine, key).await? {
                raised.entity = Some(entity);
            }
            raised.operation = Some(op);
        }
        Ok(raised)
    }

    /// Waits until the operation `request_id` has ended (every entity it reached at rest
    /// again), at most `timeout`: the operation as it ended. [`Error::Timeout`] when the
    /// time runs out first, or when no operation of that request id exists by then.
    ///
    /// The engine answers as the commit that ends it lands, whichever instance of a shared
    /// store commits it: nothing polls.
    pub async fn wait_operation(&self, request_id: &str, timeout: Duration) -> Result<OperationRow> {
        let rx = self.inner.ops.wait(request_id.to_string());
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(op)) => Ok(op),
            Ok(Err(_)) => Err(Error::Stopped),
            Err(_) => Err(Error::Timeout { request_id: request_id.to_string(), waited: timeout }),
        }
    }

    /// A replayed request id must name the request it was first used for (`name` on
    /// `machine`/`key`); otherwise [`Error::KeyReused`].
    async fn same_request(&self, request_id: &str, name: &str, machine: &str, key: &str) -> Result<()> {
        let Some(op) = self.operation(request_id).await? else { return Ok(()) };
        if op.name == name && op.machine.as_deref() == Some(machine) && op.entity_key.as_deref() == Some(key) {
            return Ok(());
        }
        Err(Error::KeyReused {
            request_id: request_id.to_string(),
            used_for: op.name,
            entity: format!("{}/{}", op.machine.unwrap_or_default(), op.entity_key.unwrap_or_default()),
        })
    }

    /// The rule of [`step::refuse_at_rest`] applied to the entity as stored: its state, its
    /// pending auto action, its lease and its inbox. `None` as well when the entity does not
    /// exist or was killed (the raise answers that), or when `request_id` was used before
    /// (a replay answers as the first time did).
    async fn refusal_at_rest(
        &self,
        m: &Machine,
        key: &str,
        event: &str,
        request_id: Option<&str>,
    ) -> Result<Option<(EntityRow, step::Rejection)>> {
        let Some(e) = self.get(m.name(), key).await? else { return Ok(None) };
        if e.run_status == RunStatus::Killed {
            return Ok(None);
        }
        let moving = e.auto_at.is_some() || e.lease_owner.is_some();
        // The inbox is read only when the rest of the rule would refuse.
        if step::refuse_at_rest(m, &e.state, event, moving).is_none() {
            return Ok(None);
        }
        if let Some(id) = request_id
            && self.operation(id).await?.is_some()
        {
            return Ok(None);
        }
        let queued = !self.inner.store.inbox_list(e.id).await?.is_empty();
        Ok(step::refuse_at_rest(m, &e.state, event, queued).map(|r| (e, r)))
    }

    /// The entity `key` of `machine`, as stored.
    pub async fn get(&self, machine: &str, key: &str) -> Result<Option<EntityRow>> {
        Ok(self.inner.store.entity_get(machine, key).await?)
    }

    /// The entity's history, oldest first.
    pub async fn history(&self, machine: &str, key: &str) -> Result<Vec<HistoryRow>> {
        let e = self.get(machine, key).await?.ok_or_else(|| not_found(machine, key))?;
        Ok(self.inner.store.history_list(e.id).await?)
    }

    /// The events valid in the entity's current state (declared for it or a state it is a
    /// substate of), guards aside: [`Engine::can_fire`] evaluates them for given
    /// parameters.
    pub async fn permitted_events(&self, machine: &str, key: &str) -> Result<Vec<EventName>> {
        let m = self.inner.registry().machine(machine)?.clone();
        let e = self.get(machine, key).await?.ok_or_else(|| not_found(machine, key))?;
        Ok(m.permitted_events(&e.state).map(|ev| ev.name.clone()).collect())
    }

    /// What `event`, raised now with `params`, would do to the entity (DESIGN §1: "can it
    /// fire?"): run an action, be ignored, or be refused and why. Guards are evaluated
    /// against the entity's properties and `params`; nothing is written. Unknown events
    /// and bad parameters are errors, as for [`Engine::raise`]; a killed entity refuses
    /// everything.
    pub async fn can_fire(
        &self,
        machine: &str,
        key: &str,
        event: &str,
        params: &serde_json::Value,
    ) -> Result<(EntityRow, step::Permission)> {
        let m = self.inner.registry().machine(machine)?.clone();
        step::check_raise(&m, event, params)?;
        let e = self.get(machine, key).await?.ok_or_else(|| not_found(machine, key))?;
        // Decided by the entity's own version, as its processing would be.
        let (_, m) = self.version_of(&e)?;
        let permission = can_fire(&m, &e, event, params)?;
        Ok((e, permission))
    }

    /// How far each subscription valid in `entity`'s state is from firing over its
    /// `successors` (as the engine would evaluate them now; nothing is raised).
    pub fn subscription_progress(
        &self,
        entity: &EntityRow,
        successors: &[EntityRow],
    ) -> Result<Vec<SubscriptionProgress>> {
        let registry = self.inner.registry();
        let (_, m) = registry.version_of(entity)?;
        Ok(crate::decide::subscription_progress(&m, &registry, entity, successors))
    }

    /// The agent queues the registered machines' actions are bound to.
    pub fn agent_queues(&self) -> Vec<String> {
        let mut queues: Vec<String> = self
            .inner
            .registry()
            .machines
            .values()
            .flat_map(|m| m.agent_queues().into_iter().map(str::to_string))
            .collect();
        queues.sort_unstable();
        queues.dedup();
        queues
    }

    async fn agent_op(&self, op: Op) -> Result<Applied> {
        let (reply, rx) = oneshot::channel();
        self.send(Msg::Agent { op, reply })?;
        rx.await.map_err(|_| Error::Stopped)?
    }

    /// Leases up to `max` tasks of agent queue `queue` for `agent` (DESIGN §5): tasks
    /// offered and not leased, or whose lease expired (offered again, attempt + 1). Waits up
    /// to `wait` for one to become available (a long poll); an empty answer means none did.
    /// Each task carries its lease `token`, needed to heartbeat and report.
    pub async fn agent_lease(&self, queue: &str, agent: &str, max: usize, wait: Duration) -> Result<Vec<AgentTask>> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            // Registered before leasing: an offer committed meanwhile still wakes us.
            let offered = self.inner.offered.notified();
            tokio::pin!(offered);
            offered.as_mut().enable();
            if self.inner.closing.load(std::sync::atomic::Ordering::Acquire) {
                return Ok(Vec::new());
            }
            let op = Op::TaskLease {
                queue: queue.to_string(),
                agent: agent.to_string(),
                limit: max.max(1),
                token_prefix: format!("{}.", uuid::Uuid::new_v4().simple()),
            };
            let tasks = match self.agent_op(op).await? {
                Applied::Leased(tasks) => tasks,
                other => unreachable!("lease answered with {other:?}"),
            };
            let now = tokio::time::Instant::now();
            if !tasks.is_empty() || now >= deadline {
                return Ok(tasks);
            }
            // Tasks also become available by time (a delay, an expired lease) or through
            // another instance: look again at least every 250 ms.
            let nap = (deadline - now).min(Duration::from_millis(250));
            tokio::select! {
                _ = offered => {}
                _ = tokio::time::sleep(nap) => {}
            }
        }
    }

    /// Ends every waiting [`Engine::agent_lease`] long poll now (they answer no task) and
    /// makes later ones answer at once, and ends the change feed's streams: for a server
    /// about to stop, so that agents and followers are not held until their poll times out.
    pub fn close_long_polls(&self) {
        self.inner.closing.store(true, std::sync::atomic::Ordering::Release);
        self.inner.offered.notify_waiters();
        // Followers of the change feed look too, and end.
        self.inner.committed.send_modify(|_| {});
    }

    /// Whether [`close_long_polls`](Self::close_long_polls) was called: the server stops,
    /// and long-lived answers (long polls, the change feed) end.
    pub fn is_closing(&self) -> bool {
        self.inner.closing.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Extends the lease on `task` by its lock time, if `token` still holds it; answers the
    /// new end of the lease (ms since the epoch).
    pub async fn agent_heartbeat(&self, task: i64, token: &str) -> Result<i64> {
        self.agent_heartbeat_as(task, token, None).await
    }

    /// [`agent_heartbeat`](Self::agent_heartbeat) for a caller that serves only `queues`
    /// (`None`: any): a task of another queue is refused ([`TaskRefusal::QueueForbidden`](settle_store::TaskRefusal)).
    pub async fn agent_heartbeat_as(&self, task: i64, token: &str, queues: Option<Vec<String>>) -> Result<i64> {
        let check = TaskCheck { queues, ..TaskCheck::default() };
        match self.agent_op(Op::TaskHeartbeat { task, token: token.to_string(), check }).await? {
            Applied::Extended { locked_until } => Ok(locked_until),
            other => unreachable!("heartbeat answered with {other:?}"),
        }
    }

    /// Reports the result of `task`. Refused ([`Error::Task`]), changing nothing, when
    /// `token` no longer holds the lease (it expired or the task was leased again) or the
    /// task was canceled or reported by another lease, when the target is not one the
    /// action declares, or when there is no such task. Applied, the report is queued durably to the entity in the same transaction,
    /// and its engine commits it as the action's outcome; the same token reporting again is
    /// answered [`Report::Replayed`](crate::Report::Replayed) and changes nothing. The task
    /// is read once, by the store, under lock.
    pub async fn agent_report(&self, task: i64, token: &str, result: TaskResult) -> Result<crate::Report> {
        self.agent_report_as(task, token, result, None).await
    }

    /// [`agent_report`](Self::agent_report) for a caller that serves only `queues` (`None`:
    /// any): a task of another queue is refused ([`TaskRefusal::QueueForbidden`](settle_store::TaskRefusal)).
    pub async fn agent_report_as(
        &self,
        task: i64,
        token: &str,
        result: TaskResult,
        queues: Option<Vec<String>>,
    ) -> Result<crate::Report> {
        let checked = match &result {
            TaskResult::Complete(outcome) => {
                step::check_size(outcome).and_then(|()| crate::decide::check_effects(outcome, &self.inner.registry()))
            }
            TaskResult::Fail { error, .. } => step::check_error_size(error, "error"),
        };
        if let Err((field, reason)) = checked {
            return Err(Error::Task(settle_store::TaskRefusal::BadReport { task, field, reason }));
        }
        let check = TaskCheck { queues, ..self.inner.registry().agent_check() };
        match self.agent_op(Op::TaskReport { task, token: token.to_string(), result, check }).await? {
            Applied::Pushed { .. } => Ok(crate::Report::Applied),
            Applied::ReportReplayed { .. } => Ok(crate::Report::Replayed),
            other => unreachable!("report answered with {other:?}"),
        }
    }

    /// Waits until the entity is in one of `states` (at once if it is already), at most
    /// `timeout`, and returns it.
    pub async fn wait_for_state(
        &self,
        machine: &str,
        key: &str,
        states: &[&str],
        timeout: Duration,
    ) -> Result<EntityRow> {
        let states: Vec<StateName> = states.iter().map(|s| StateName::new(*s)).collect();
        let mark = self.inner.hub.as_ref().map(Hub::mark);
        let e = self.get(machine, key).await?.ok_or_else(|| not_found(machine, key))?;
        if states.contains(&e.state) {
            return Ok(e);
        }
        let (tx, rx) = oneshot::channel();
        let (registered, registered_rx) = oneshot::channel();
        self.send(Msg::Watch { entity_id: e.id, states: states.clone(), reply: tx, registered })?;
        registered_rx.await.map_err(|_| Error::Stopped)?;
        // Another instance may be the one that moves the entity: the hub hears of its
        // commits (from the mark on, so nothing since the read above is missed).
        let remote = match (&self.inner.hub, mark) {
            (Some(hub), Some(mark)) => {
                let m = self.inner.registry().machine(machine)?.clone();
                let rest_only = states.iter().all(|s| m.state(s).is_some_and(|s| s.kind != StateKind::Unstable));
                let (reply, remote) = oneshot::channel();
                hub.watch(e.id, mark, Want::State { states: states.clone(), rest_only, reply });
                Some(remote)
            }
            _ => None,
        };
        // From here on the local watch sees every commit of this engine; one that landed
        // before is in this read.
        let e = self.get(machine, key).await?.ok_or_else(|| not_found(machine, key))?;
        if states.contains(&e.state) {
            return Ok(e);
        }
        match tokio::time::timeout(timeout, first_of(rx, remote)).await {
            Ok(Some(e)) => Ok(e),
            Ok(None) => Err(Error::Stopped),
            Err(_) => Err(Error::Timeout { request_id: format!("wait for {machine} {key}"), waited: timeout }),
        }
    }

    /// Resolves once this engine has caught up with its clock: nothing held, nothing queued
    /// to write, nothing due before the clock's now, and the supervisor's round done.
    /// Answers the next due time of the engine's work (`None`: nothing scheduled).
    ///
    /// With a [`ManualClock`], a test advances the clock and then waits for this: every
    /// timer, backoff, delayed auto action, sleep and lease expiry that came due has been
    /// processed. [`Engine::drive`] does both in a loop.
    pub async fn wait_caught_up(&self) -> Result<Option<Millis>> {
        let (tx, rx) = oneshot::channel();
        self.send(Msg::WhenCaughtUp(tx))?;
        rx.await.map_err(|_| Error::Stopped)
    }

    /// Drives this engine on `clock`, the [`ManualClock`] it runs on, until `until`
    /// resolves: whenever the engine has caught up and `until` is still pending, the clock
    /// moves on to the next due time. Time never moves while anything is in flight, so a
    /// test sees the same sequence of events on every run, however long the delays it
    /// declares.
    ///
    /// ```no_run
    /// # async fn demo(engine: settle_engine::Engine<settle_store::SqliteStore>, clock: settle_store::ManualClock) -> settle_engine::Result<()> {
    /// use settle_engine::{RaiseOptions, Wait};
    /// // A retry after an hour takes no time at all:
    /// let raised = engine.drive(&clock, engine.raise("job", "j1", "go", RaiseOptions::wait(Wait::Stable))).await?;
    /// # Ok(()) }
    /// ```
    pub async fn drive<F: Future>(&self, clock: &ManualClock, until: F) -> F::Output {
        tokio::pin!(until);
        loop {
            tokio::select! {
                biased;
                out = &mut until => return out,
                next = self.wait_caught_up() => match next {
                    Ok(Some(due)) => clock.advance_to(due),
                    // Nothing scheduled (or stopped): `until` waits on something else.
                    Ok(None) | Err(_) => tokio::task::yield_now().await,
                },
            }
        }
    }

    /// Drives this engine on `clock` (see [`Engine::drive`]) until nothing is scheduled, or
    /// until the next due time lies beyond `horizon` from now (a periodic timer is always
    /// scheduled). Answers the next due time left, if any.
    pub async fn drive_idle(&self, clock: &ManualClock, horizon: Duration) -> Result<Option<Millis>> {
        let end = settle_store::Clock::now_ms(clock) + horizon.as_millis() as Millis;
        loop {
            match self.wait_caught_up().await? {
                Some(due) if due <= end => clock.advance_to(due),
                next => return Ok(next),
            }
        }
    }

    /// Resolves once nothing is in flight, queued or scheduled anywhere in the store:
    /// no queued event, no pending auto action or retry, no timer, no agent task offered
    /// or leased. (An entity with a periodic timer always has one scheduled; wait for a
    /// state instead.)
    pub async fn wait_idle(&self) -> Result<()> {
        loop {
            let (tx, rx) = oneshot::channel();
            self.send(Msg::WhenIdle(tx))?;
            rx.await.map_err(|_| Error::Stopped)?;
            // Entities waiting for an agent have no due time: their open tasks are the work.
            let open = TaskFilter { open_only: true, limit: Some(1), ..TaskFilter::default() };
            if self.inner.store.task_list(open).await?.is_empty() {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Stops claiming work, lets running actions finish and commit, releases leases, and
    /// stops the scheduler.
    pub async fn shutdown(&self) {
        let (tx, rx) = oneshot::channel();
        if self.send(Msg::Shutdown(tx)).is_ok() {
            let _ = rx.await;
        }
        let task = self.inner.task.lock().expect("task lock").take();
        if let Some(task) = task {
            let _ = task.await;
        }
        self.inner.ops.stop().await;
    }
}

/// What `event`, raised now with `params`, would do to `entity` of `machine` (as
/// [`Engine::can_fire`] answers it, for a caller that read the entity and its definition
/// itself, e.g. from the store without an engine). Unknown events and bad parameters are
/// errors; a killed entity refuses everything.
pub fn can_fire(
    machine: &Machine,
    entity: &EntityRow,
    event: &str,
    params: &serde_json::Value,
) -> Result<step::Permission> {
    step::check_raise(machine, event, params)?;
    Ok(if entity.run_status == RunStatus::Killed {
        let reason = format!("entity `{}` of machine `{}` was killed", entity.key, machine.name());
        step::Permission::Refused { reason }
    } else {
        step::can_fire(machine, &entity.state, event, &entity.properties, params)
    })
}

fn not_found(machine: &str, key: &str) -> Error {
    Error::NotFound { machine: machine.to_string(), key: key.to_string() }
}
