//! The engine's public face: [`EngineBuilder`] binds machines and handlers to a store and
//! starts the scheduler; [`Engine`] creates entities, raises events and waits for them.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use settle_core::step::{self, Properties};
use settle_core::{ActionName, EntityKey, EventName, Machine, MachineName, StateKind, StateName};
use settle_store::{
    AgentTask, Applied, Command, EntityRow, HistoryRow, InboxKind, Op, OpenOperation, OperationRow, Push, Store,
    TaskFilter, TaskResult,
};
use tokio::sync::{mpsc, oneshot};

use crate::error::{Error, Result};
use crate::handler::{ActionContext, Handler, HandlerError, Outcome, handler};
use crate::scheduler::{Msg, Scheduler};
use crate::watch::{Hub, Want, first_of};

/// Engine tuning. The defaults suit one process on SQLite.
#[derive(Debug, Clone)]
pub struct Config {
    /// This instance's lease owner name (unique per process).
    pub owner: String,
    /// Lease length; leases of running actions are renewed every third of it.
    pub lease: Duration,
    /// Most entities processed at once (bounds memory and concurrent actions).
    pub max_inflight: usize,
    /// Most entities claimed per batch.
    pub claim_batch: usize,
    /// Fallback poll for due work when nothing wakes the engine.
    pub poll: Duration,
    /// An operation with no progress for this long is marked `hung` by the supervisor.
    pub hung_after: Duration,
    /// How often the supervisor looks for hung operations.
    pub supervise_every: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            owner: format!("engine-{}", uuid::Uuid::now_v7()),
            lease: Duration::from_secs(60),
            max_inflight: 1024,
            claim_batch: 256,
            poll: Duration::from_secs(1),
            hung_after: Duration::from_secs(600),
            supervise_every: Duration::from_secs(10),
        }
    }
}

/// Machines and their bound handlers, shared by the engine and its scheduler.
pub(crate) struct Registry {
    pub(crate) machines: HashMap<MachineName, Arc<Machine>>,
    pub(crate) handlers: HashMap<(MachineName, ActionName), Handler>,
    /// Content hash (definition version) of each machine.
    pub(crate) hashes: HashMap<MachineName, String>,
    /// The machines whose entities this engine processes (`None`: all registered).
    pub(crate) served: Option<Vec<MachineName>>,
}

impl Registry {
    /// Whether this engine processes entities of `machine` (else other instances do, and
    /// this one only creates them and raises events on them).
    pub(crate) fn serves(&self, machine: &str) -> bool {
        self.served.as_ref().is_none_or(|s| s.iter().any(|m| m == machine))
    }
    pub(crate) fn machine(&self, name: &str) -> Result<&Arc<Machine>> {
        self.machines.get(name).ok_or_else(|| Error::UnknownMachine(name.to_string()))
    }
    pub(crate) fn handler(&self, machine: &MachineName, action: &ActionName) -> Option<&Handler> {
        self.handlers.get(&(machine.clone(), action.clone()))
    }
    pub(crate) fn hash(&self, machine: &str) -> Option<String> {
        self.hashes.get(machine).cloned()
    }
}

/// Binds machines and handlers to a store, then [`start`](EngineBuilder::start)s.
pub struct EngineBuilder<S: Store> {
    store: S,
    registry: Registry,
    config: Config,
    errors: Vec<Error>,
}

impl<S: Store + Clone> EngineBuilder<S> {
    /// Starts with a store and no machines.
    pub fn new(store: S) -> Self {
        EngineBuilder {
            store,
            registry: Registry {
                machines: HashMap::new(),
                handlers: HashMap::new(),
                hashes: HashMap::new(),
                served: None,
            },
            config: Config::default(),
            errors: Vec::new(),
        }
    }
    /// Registers a validated machine.
    pub fn machine(mut self, machine: Machine) -> Self {
        self.registry.machines.insert(machine.name().clone(), Arc::new(machine));
        self
    }
    /// Binds a handler to `machine`'s `action`.
    pub fn handler(mut self, machine: &str, action: &str, h: Handler) -> Self {
        self.registry.handlers.insert((MachineName::new(machine), ActionName::new(action)), h);
        self
    }
    /// Binds an async function to `machine`'s `action`.
    pub fn on<F, Fut>(self, machine: &str, action: &str, f: F) -> Self
    where
        F: Fn(ActionContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<Outcome, HandlerError>> + Send + 'static,
    {
        self.handler(machine, action, handler(f))
    }
    /// Processes only entities of these machines; the other registered machines are
    /// *known*: this engine creates their entities and raises events on them (checked
    /// against their definitions), while other instances, which serve them, process them
    /// and own their definitions' upgrades. By default an engine serves every machine it
    /// registers.
    pub fn serve_only<I, N>(mut self, machines: I) -> Self
    where
        I: IntoIterator<Item = N>,
        N: Into<MachineName>,
    {
        self.registry.served = Some(machines.into_iter().map(Into::into).collect());
        self
    }

    /// Replaces the configuration.
    pub fn config(mut self, config: Config) -> Self {
        self.config = config;
        self
    }

    /// Checks bindings, stores the definitions, reclaims stale leases (when the store is
    /// exclusive) and starts the scheduler, which resumes all due work.
    pub async fn start(mut self) -> Result<Engine<S>> {
        if let Some(e) = self.errors.pop() {
            return Err(e);
        }
        for (machine, action) in self.registry.handlers.keys() {
            let m = self.registry.machine(machine)?;
            if m.action(action).is_none() {
                return Err(Error::UnknownAction { machine: machine.to_string(), action: action.to_string() });
            }
        }
        if let Some(served) = &self.registry.served
            && let Some(unknown) = served.iter().find(|m| !self.registry.machines.contains_key(*m))
        {
            return Err(Error::UnknownMachine(unknown.to_string()));
        }
        let machines: Vec<&Machine> = self.registry.machines.values().map(|m| m.as_ref()).collect();
        let report = settle_core::validate::check_set(&machines);
        if report.has_errors() {
            return Err(Error::Invalid(report));
        }
        let mut missing = Vec::new();
        for m in self.registry.machines.values().filter(|m| self.registry.serves(m.name())) {
            for a in m.actions_needing_handlers() {
                if self.registry.handler(m.name(), &a.name).is_none() {
                    missing.push(format!("action `{}` of machine `{}`", a.name, m.name()));
                }
            }
        }
        if !missing.is_empty() {
            missing.sort();
            return Err(Error::MissingHandlers(missing));
        }
        let now = crate::now_ms();
        let stored = self.store.machine_list().await?;
        let mut names: Vec<MachineName> = self.registry.machines.keys().cloned().collect();
        names.sort();
        for name in names {
            let m = self.registry.machines[&name].clone();
            let hash = m.content_hash();
            if !self.registry.serves(&name) {
                // The instances serving it own its definition (and its upgrades).
                self.registry.hashes.insert(name, hash);
                continue;
            }
            // A new definition version is checked against the entities living under the old one.
            let previous = stored.iter().filter(|r| r.name == name).max_by_key(|r| r.created_at);
            if previous.is_some_and(|p| p.hash != hash) {
                let occupied = self.store.entity_count_by_state(&name).await?;
                let moves =
                    settle_core::upgrade::check(&m, &occupied).map_err(|e| Error::UpgradeRefused(e.to_string()))?;
                let moves: Vec<(String, String)> = moves.into_iter().map(|(old, new, _)| (old, new)).collect();
                if !moves.is_empty() {
                    let n = self.store.machine_migrate(&name, moves, &hash, now).await?;
                    tracing::info!(machine = %name, entities = n, "moved entities to renamed states");
                }
            }
            if previous.is_none_or(|p| p.hash != hash) {
                self.store.machine_put(&name, &hash, &m.canonical_json(), now).await?;
            }
            self.registry.hashes.insert(name, hash);
        }
        if self.store.exclusive() {
            let n = self.store.lease_release_all(now).await?;
            if n > 0 {
                tracing::info!(leases = n, "reclaimed leases left by a previous engine");
            }
        }
        let registry = Arc::new(self.registry);
        let (tx, rx) = mpsc::unbounded_channel();
        let offered = Arc::new(tokio::sync::Notify::new());
        // Another instance may move the entities callers of this one wait on.
        let hub = (!self.store.exclusive()).then(|| Hub::start(self.store.clone()));
        let scheduler =
            Scheduler::new(self.store.clone(), registry.clone(), self.config, tx.clone(), offered.clone(), hub.clone());
        let task = tokio::spawn(scheduler.run(rx));
        Ok(Engine {
            inner: Arc::new(Inner {
                store: self.store,
                registry,
                tx,
                offered,
                hub,
                closing: std::sync::atomic::AtomicBool::new(false),
                task: std::sync::Mutex::new(Some(task)),
            }),
        })
    }
}

struct Inner<S> {
    store: S,
    registry: Arc<Registry>,
    tx: mpsc::UnboundedSender<Msg>,
    /// Notified when this engine offered agent tasks.
    offered: Arc<tokio::sync::Notify>,
    /// Callers waiting on entities another instance moves (shared stores only).
    hub: Option<Hub>,
    /// Set (and `offered` pulsed) when waiting agent long polls should end.
    closing: std::sync::atomic::AtomicBool,
    task: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
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
    inner: Arc<Inner<S>>,
}

impl<S: Store> Clone for Engine<S> {
    fn clone(&self) -> Self {
        Engine { inner: self.inner.clone() }
    }
}

/// How long [`Engine::raise`] waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// Until the event is durably queued in the entity's inbox.
    Queued,
    /// Until the event is accepted (its action committed), rejected or failed.
    Outcome,
    /// Until the entity is at rest again after the event was accepted (or the event was
    /// rejected or failed).
    Stable,
}

/// Options of [`Engine::raise`].
#[derive(Debug, Clone)]
pub struct RaiseOptions {
    /// The event's parameters (a JSON object, or null).
    pub params: Value,
    /// What to wait for.
    pub wait: Wait,
    /// How long to wait beyond queuing.
    pub timeout: Duration,
    /// The request id to record (generated when `None`).
    pub request_id: Option<String>,
}

impl Default for RaiseOptions {
    fn default() -> Self {
        RaiseOptions { params: Value::Null, wait: Wait::Queued, timeout: Duration::from_secs(30), request_id: None }
    }
}

impl RaiseOptions {
    /// Default options waiting for `wait`.
    pub fn wait(wait: Wait) -> Self {
        RaiseOptions { wait, ..RaiseOptions::default() }
    }
    /// Sets the parameters.
    pub fn params(mut self, params: Value) -> Self {
        self.params = params;
        self
    }
    /// Sets the timeout.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }
    /// Sets the request id: the operation's idempotency key.
    pub fn request_id(mut self, request_id: impl Into<String>) -> Self {
        self.request_id = Some(request_id.into());
        self
    }
}

/// What became of a raised event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventOutcome {
    /// The event's action committed; the entity entered `state`.
    Accepted {
        /// The state entered.
        state: StateName,
    },
    /// The event was not valid in `state`; nothing changed.
    Rejected {
        /// The state the entity was in.
        state: StateName,
        /// The declared reason, or the default one.
        reason: String,
    },
    /// The event's action failed (error, panic, refused or failed commit); nothing changed.
    Failed {
        /// What went wrong.
        error: String,
    },
}

/// The answer to [`Engine::raise`].
#[derive(Debug, Clone)]
pub struct Raised {
    /// The request id recorded with the event.
    pub request_id: String,
    /// The event's inbox id (`None` for a replayed request id).
    pub inbox_id: Option<i64>,
    /// The request id had been used before: nothing was raised again.
    pub replayed: bool,
    /// The outcome (unless only [`Wait::Queued`] was asked).
    pub outcome: Option<EventOutcome>,
    /// The entity when the wait ended (unless only [`Wait::Queued`] was asked).
    pub entity: Option<EntityRow>,
}

/// The answer to [`Engine::create_with`].
#[derive(Debug, Clone)]
pub struct Created {
    /// The entity (as it is now, for a replay).
    pub entity: EntityRow,
    /// The operation's request id.
    pub request_id: String,
    /// The request id had been used before: nothing was created.
    pub replayed: bool,
}

/// The answer to [`Engine::command`].
#[derive(Debug, Clone)]
pub struct Commanded {
    /// The entity after the command (as it is now, for a replay).
    pub entity: EntityRow,
    /// The operation's request id.
    pub request_id: String,
    /// The request id had been used before: nothing was done again.
    pub replayed: bool,
}

impl<S: Store + Clone> Engine<S> {
    /// Starts building an engine on `store`.
    pub fn builder(store: S) -> EngineBuilder<S> {
        EngineBuilder::new(store)
    }
}

impl<S: Store> Engine<S> {
    /// The store.
    pub fn store(&self) -> &S {
        &self.inner.store
    }

    /// The registered machine `name`.
    pub fn machine(&self, name: &str) -> Result<&Arc<Machine>> {
        self.inner.registry.machine(name)
    }

    fn send(&self, msg: Msg) -> Result<()> {
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
        let m = self.inner.registry.machine(machine)?;
        let request_id = request_id.unwrap_or_else(|| uuid::Uuid::now_v7().to_string());
        let mut new = crate::scheduler::new_entity(
            m,
            EntityKey::new(key),
            properties,
            Some(request_id.clone()),
            crate::now_ms(),
        )?;
        new.machine_hash = self.inner.registry.hash(machine);
        new.operation = Some(OpenOperation {
            request_id: request_id.clone(),
            name: format!("{machine}:new"),
            dimensions: serde_json::json!({"machine": machine}),
        });
        let (reply, rx) = oneshot::channel();
        self.send(Msg::Create { new, reply })?;
        match rx.await.map_err(|_| Error::Stopped)?? {
            Some(entity) => Ok(Created { entity, request_id, replayed: false }),
            None => {
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
        let m = self.inner.registry.machine(machine)?;
        let request_id = request_id.unwrap_or_else(|| uuid::Uuid::now_v7().to_string());
        let op = Op::Command {
            machine: m.name().clone(),
            key: EntityKey::new(key),
            command,
            operation: Some(OpenOperation {
                request_id: request_id.clone(),
                name: format!("{machine}.{}", command.as_str()),
                dimensions: serde_json::json!({"machine": machine, "command": command.as_str()}),
            }),
        };
        let (reply, rx) = oneshot::channel();
        self.send(Msg::Command { op, reply })?;
        match rx.await.map_err(|_| Error::Stopped)?? {
            Some(entity) => Ok(Commanded { entity, request_id, replayed: false }),
            None => {
                let entity = self.get(machine, key).await?.ok_or_else(|| not_found(machine, key))?;
                Ok(Commanded { entity, request_id, replayed: true })
            }
        }
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
        let m = self.inner.registry.machine(machine)?;
        step::check_raise(m, event, &options.params)?;
        let push = Push {
            machine: m.name().clone(),
            key: EntityKey::new(key),
            event: EventName::new(event),
            params: options.params,
            request_id: Some(request_id.clone()),
            kind: InboxKind::Raised,
            join_from: None,
            operation: Some(OpenOperation {
                request_id: request_id.clone(),
                name: format!("{machine}.{event}"),
                dimensions: serde_json::json!({"machine": machine, "event": event}),
            }),
        };
        let (ack, ack_rx) = oneshot::channel();
        let (done, done_rx) = match options.wait {
            Wait::Queued => (None, None),
            Wait::Outcome | Wait::Stable => {
                let (tx, rx) = oneshot::channel();
                (Some(tx), Some(rx))
            }
        };
        let mark = self.inner.hub.as_ref().map(Hub::mark);
        let wait = options.wait;
        self.send(Msg::Raise { push, wait, ack, done })?;
        let Some((inbox_id, entity_id)) = ack_rx.await.map_err(|_| Error::Stopped)?? else {
            // The key was used before: that operation stands, nothing is raised again.
            let entity = self.get(machine, key).await?;
            return Ok(Raised { request_id, inbox_id: None, replayed: true, outcome: None, entity });
        };
        let mut raised = Raised { request_id, inbox_id: Some(inbox_id), replayed: false, outcome: None, entity: None };
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
        Ok(raised)
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

    /// The events valid in the entity's current state.
    pub async fn permitted_events(&self, machine: &str, key: &str) -> Result<Vec<EventName>> {
        let m = self.inner.registry.machine(machine)?.clone();
        let e = self.get(machine, key).await?.ok_or_else(|| not_found(machine, key))?;
        Ok(m.permitted_events(&e.state).map(|ev| ev.name.clone()).collect())
    }

    /// The agent queues the registered machines' actions are bound to.
    pub fn agent_queues(&self) -> Vec<String> {
        let mut queues: Vec<String> = self
            .inner
            .registry
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
    /// makes later ones answer at once: for a server about to stop, so that agents are not
    /// held until their poll times out.
    pub fn close_long_polls(&self) {
        self.inner.closing.store(true, std::sync::atomic::Ordering::Release);
        self.inner.offered.notify_waiters();
    }

    /// Extends the lease on `task` by its lock time, if `token` still holds it; answers the
    /// new end of the lease (ms since the epoch).
    pub async fn agent_heartbeat(&self, task: i64, token: &str) -> Result<i64> {
        match self.agent_op(Op::TaskHeartbeat { task, token: token.to_string() }).await? {
            Applied::Extended { locked_until } => Ok(locked_until),
            other => unreachable!("heartbeat answered with {other:?}"),
        }
    }

    /// Reports the result of `task`. Refused ([`Error::TaskRefused`]), changing nothing,
    /// when `token` no longer holds the lease (it expired or the task was leased again) or
    /// the task was already reported or canceled; [`Error::BadReport`] when the target is
    /// not one the action declares. Accepted, the report is queued durably to the entity,
    /// whose engine commits it as the action's outcome.
    pub async fn agent_report(&self, task: i64, token: &str, result: TaskResult) -> Result<()> {
        if let TaskResult::Complete { target, .. } = &result {
            let filter = TaskFilter { id: Some(task), ..TaskFilter::default() };
            let Some(t) = self.inner.store.task_list(filter).await?.pop() else {
                return Err(Error::TaskRefused { task, reason: "no such task".into() });
            };
            let machine = self.inner.registry.machine(&t.machine)?;
            if let Some(action) = machine.action(&t.action)
                && action.target(target).is_none()
            {
                let declared: Vec<&str> = action.targets.iter().map(|t| t.state.as_str()).collect();
                return Err(Error::BadReport {
                    task,
                    reason: format!(
                        "action `{}` of machine `{}` may not move to `{target}` (declared: {})",
                        action.name,
                        machine.name(),
                        declared.join(", ")
                    ),
                });
            }
        }
        match self.agent_op(Op::TaskReport { task, token: token.to_string(), result }).await? {
            Applied::Pushed { .. } => Ok(()),
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
                let m = self.inner.registry.machine(machine)?;
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
    }
}

fn not_found(machine: &str, key: &str) -> Error {
    Error::NotFound { machine: machine.to_string(), key: key.to_string() }
}
