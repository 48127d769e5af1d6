//! Starting an engine: [`EngineBuilder`] binds machines and handlers to a store, checks
//! the bindings and the definitions (and upgrades against the entities stored), reclaims
//! stale leases, and starts the scheduler.

use std::future::Future;
use std::sync::Arc;

use settle_core::{ActionName, Machine, MachineName};
use settle_store::{Clock, Store};
use tokio::sync::mpsc;

use crate::config::Config;
use crate::engine::{Engine, Inner};
use crate::error::{Error, Result};
use crate::handler::{ActionContext, Handler, HandlerError, Outcome, handler};
use crate::opwatch::OpWatch;
use crate::registry::Registry;
use crate::scheduler::Scheduler;
use crate::watch::Hub;

/// Binds machines and handlers to a store, then [`start`](EngineBuilder::start)s.
pub struct EngineBuilder<S: Store> {
    store: S,
    registry: Registry,
    config: Config,
    errors: Vec<Error>,
    /// Run the definitions stored instead of those registered ([`EngineBuilder::stored_definitions`]).
    stored: bool,
    /// Who the versions this builder stores are deployed by ([`EngineBuilder::origin`]).
    origin: String,
}

impl<S: Store + Clone> EngineBuilder<S> {
    /// Starts with a store and no machines.
    pub fn new(store: S) -> Self {
        EngineBuilder {
            store,
            registry: Registry::new(),
            config: Config::default(),
            errors: Vec::new(),
            stored: false,
            origin: String::new(),
        }
    }
    /// Registers a validated machine.
    pub fn machine(mut self, machine: Machine) -> Self {
        self.registry.machines.insert(machine.name().clone(), Arc::new(machine));
        self
    }
    /// The machines registered so far, in no order.
    pub fn registered(&self) -> impl Iterator<Item = &Machine> {
        self.registry.machines.values().map(|m| m.as_ref())
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

    /// Runs the definitions stored in the database (each machine's current version, and the
    /// older versions entities still run under) instead of deploying the registered ones:
    /// a registered machine only lends its handlers, and only to a stored machine whose
    /// current version is identical to it (same content hash). Nothing is deployed; the
    /// stored machines whose actions have no handler then need agents, or the engine must
    /// process nothing. An empty database gives an engine of no machines.
    pub fn stored_definitions(mut self) -> Self {
        self.stored = true;
        self
    }

    /// Records `origin` as who deployed the versions this engine stores as it starts
    /// (`MachineRecord::origin`; default `""`): the `settle` binary marks its built-in
    /// machines so.
    pub fn origin(mut self, origin: &str) -> Self {
        self.origin = origin.to_string();
        self
    }

    /// Replaces the configuration.
    pub fn config(mut self, config: Config) -> Self {
        self.config = config;
        self
    }

    /// Sets the clock the engine counts time on (default: the system clock). Tests pass a
    /// [`ManualClock`](settle_store::ManualClock) and advance it.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.config.clock = Arc::new(clock);
        self
    }

    /// Checks bindings, stores the definitions, reclaims stale leases (when the store is
    /// exclusive) and starts the scheduler, which resumes all due work.
    pub async fn start(self) -> Result<Engine<S>> {
        let Prepared { store, registry, config } = self.prepare(true).await?;
        // Versions deployed from now on (by any instance) are taken up without a restart.
        let deployed = store.meta_get(crate::deploy::MARKER).await?;
        let (tx, rx) = mpsc::unbounded_channel();
        let offered = Arc::new(tokio::sync::Notify::new());
        // Another instance may move the entities callers of this one wait on.
        let hub = (!store.exclusive()).then(|| Hub::start(store.clone()));
        let ops = OpWatch::start(store.clone());
        let clock = config.clock.clone();
        let (retention, prune_limit) = (config.retention, config.prune_limit);
        let (runs_bulk, bulk_owner, bulk_lease, bulk_poll) =
            (config.max_inflight > 0, config.owner.clone(), config.lease, config.poll);
        let deploy_poll = config.poll;
        let (read_only, processes, narrow_budget) = (config.read_only, config.max_inflight > 0, config.narrow_budget);
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        let archive = config.archive.clone().map(crate::archive::Archive::new);
        let registries = Arc::new(crate::registry::Registries::new(registry.clone()));
        let mut scheduler = Scheduler::new(
            store.clone(),
            registries.clone(),
            config,
            tx.clone(),
            offered.clone(),
            hub.clone(),
            ops.clone(),
        );
        scheduler.archive = archive.clone();
        let committed = scheduler.committed.clone();
        let task = tokio::spawn(scheduler.run(rx));
        let engine = Engine {
            inner: Arc::new(Inner {
                store,
                registries,
                clock,
                retention,
                prune_limit,
                archive,
                tx,
                offered,
                committed,
                hub,
                ops,
                closing: std::sync::atomic::AtomicBool::new(false),
                task: std::sync::Mutex::new(Some(task)),
                bulk: Arc::new(tokio::sync::Notify::new()),
                bulk_progress: tokio::sync::Notify::new(),
                schedules: Arc::new(tokio::sync::Notify::new()),
                deploying: tokio::sync::Mutex::new(()),
                poll: deploy_poll,
                deployed: std::sync::Mutex::new(deployed),
                read_only,
                processes,
                narrowing: tokio::sync::Semaphore::new(cores),
                narrow_budget,
            }),
        };
        // An engine that processes work also runs bulk operations.
        // Schedules are stored before `start` returns (a new one counts its fires from
        // then), by any engine; one that processes work also fires them.
        let scheduled = engine.inner.registry().machines.values().any(|m| !m.schedules().is_empty());
        if scheduled {
            crate::schedules::sync(&engine).await?;
        }
        if runs_bulk {
            let inner = Arc::downgrade(&engine.inner);
            tokio::spawn(crate::bulk::run(inner, bulk_owner.clone(), bulk_lease, bulk_poll));
            // Also when none is declared yet: a deploy may declare one.
            let inner = Arc::downgrade(&engine.inner);
            tokio::spawn(crate::schedules::run(inner, bulk_owner));
        }
        let inner = Arc::downgrade(&engine.inner);
        tokio::spawn(crate::deploy::watch(inner, deploy_poll));
        Ok(engine)
    }

    /// Everything [`start`](Self::start) does before the scheduler runs: checks the
    /// bindings and definitions, deploys new definition versions (all of them, with their
    /// entities' moves, in one transaction, or none), and, if `reclaim` and the store is
    /// exclusive, releases the leases a previous engine left. A read-only engine writes
    /// none of it.
    pub(crate) async fn prepare(mut self, reclaim: bool) -> Result<Prepared<S>> {
        if let Some(e) = self.errors.pop() {
            return Err(e);
        }
        if self.config.read_only {
            self.config.max_inflight = 0;
        }
        for (machine, action) in self.registry.handlers.keys() {
            let m = self.registry.machine(machine)?;
            match m.action(action) {
                None => return Err(Error::UnknownAction { machine: machine.to_string(), action: action.to_string() }),
                Some(a) if a.is_declarative() => {
                    let what = format!("action `{action}` is declarative (`set`, `raise`): it takes no handler");
                    return Err(Error::Unsupported { machine: machine.to_string(), what });
                }
                Some(_) => {}
            }
        }
        let stored = self.store.machine_list().await?;
        if self.stored {
            take_stored(&stored, &mut self.registry)?;
        }
        if let Some(served) = &self.registry.served
            && let Some(unknown) = served.iter().find(|m| !self.registry.machines.contains_key(*m))
        {
            return Err(Error::UnknownMachine(unknown.to_string()));
        }
        let machines: Vec<&Machine> = self.registry.machines.values().map(|m| m.as_ref()).collect();
        if self.config.archive.is_none()
            && let Some(m) = machines.iter().find(|m| m.retention().and_then(|r| r.archive) == Some(true))
        {
            return Err(Error::NoArchive(m.name().to_string()));
        }
        let report = settle_core::validate::check_set(&machines);
        if report.has_errors() {
            return Err(Error::Invalid(report));
        }
        let processes = self.config.max_inflight > 0;
        if processes {
            crate::deploy::check_handlers(&self.registry)?;
        }
        // A batch the store re-runs later (after a lost connection) takes its time from
        // this engine's clock.
        self.store.use_clock(self.config.clock.clone());
        let now = self.config.clock.now_ms();
        // Leases a previous engine left go first: a version's move skips held entities.
        if reclaim && self.store.exclusive() && !self.config.read_only {
            let n = self.store.lease_release_all(now).await?;
            if n > 0 {
                tracing::info!(leases = n, "reclaimed leases left by a previous engine");
            }
        }
        // The versions stored: the older ones for the entities still under them.
        let given = self.registry.clone();
        crate::deploy::take_up(&stored, &mut self.registry);
        if !self.stored {
            let deploy = self.plan_given(&given, &stored, now).await?;
            if !deploy.versions.is_empty() && !self.config.read_only {
                let versions = deploy.versions.len();
                self.store.machine_deploy(deploy).await?;
                tracing::info!(versions, "deployed the definitions given");
            }
        }
        // The version deployed since may need other handlers.
        if processes {
            crate::deploy::check_handlers(&self.registry)?;
        }
        Ok(Prepared { store: self.store, registry: Arc::new(self.registry), config: self.config })
    }

    /// Makes each `given` machine current (unless a newer version was deployed since, which
    /// then runs) and plans the deploy of those not stored yet: each checked against the
    /// live entities first, so that one refused stores none.
    async fn plan_given(
        &mut self,
        given: &Registry,
        stored: &[settle_store::MachineRecord],
        now: settle_store::Millis,
    ) -> Result<settle_store::Deploy> {
        let mut names: Vec<MachineName> = given.machines.keys().cloned().collect();
        names.sort();
        let mut deploy = settle_store::Deploy { now, ..Default::default() };
        for name in names {
            let m = given.machines[&name].clone();
            let hash = m.content_hash();
            let mine: Vec<_> = stored.iter().filter(|r| r.name == name).collect();
            let latest = mine.iter().max_by_key(|r| r.created_at);
            if latest.is_some_and(|l| l.hash != hash) && mine.iter().any(|r| r.hash == hash) {
                // An older version than the one deployed since: the deployed one runs.
                tracing::warn!(machine = %name, given = %hash, running = %self.registry.hashes[&name], "the definition given is older than the version deployed since; running the deployed one");
                continue;
            }
            self.registry.set_current(m.clone(), hash.clone());
            if latest.is_some_and(|l| l.hash == hash) || !self.registry.serves(&name) {
                // Stored already, or owned by the instances serving it (and its upgrades).
                continue;
            }
            // A new version is checked against the live entities, as a deploy is; those
            // of no known version ran under the latest stored.
            let mut previous = self.registry.clone();
            if let Some(l) = latest
                && let Some(v) = self.registry.versions.get(&l.hash).cloned()
            {
                previous.machines.insert(name.clone(), v);
            }
            let plan = crate::deploy::plan(&self.store, &previous, &m, &hash).await?;
            deploy.versions.push(crate::deploy::new_version(&m, &hash, &self.origin));
            deploy.moves.push(crate::deploy::moves_of(&name, &hash, &plan));
            deploy.meta = Some(crate::deploy::marker(now, &name, &hash));
        }
        Ok(deploy)
    }
}

/// Replaces the machines of `registry` by the current versions `stored`; a handler stays
/// bound only where the machine registered for it is identical to the stored one.
fn take_stored(stored: &[settle_store::MachineRecord], registry: &mut Registry) -> Result<()> {
    let newest = settle_store::current_versions(stored);
    let lenders = std::mem::take(&mut registry.machines);
    let identical: std::collections::HashSet<&str> = newest
        .iter()
        .filter(|(name, r)| lenders.get(**name).is_some_and(|m| m.content_hash() == r.hash))
        .map(|(name, _)| *name)
        .collect();
    registry.handlers.retain(|(machine, _), _| identical.contains(machine.as_str()));
    for (name, r) in newest {
        let m = Machine::from_canonical_json(&r.definition).map_err(|e| Error::Unsupported {
            machine: name.to_string(),
            what: format!("its current version {} stored in the database does not read back: {e}", r.hash),
        })?;
        registry.machines.insert(m.name().clone(), Arc::new(m));
    }
    Ok(())
}

/// A checked engine, not yet running: what a scheduler is built from.
pub(crate) struct Prepared<S> {
    pub(crate) store: S,
    pub(crate) registry: Arc<Registry>,
    pub(crate) config: Config,
}

impl<S: Store + Clone> Engine<S> {
    /// Starts building an engine on `store`.
    pub fn builder(store: S) -> EngineBuilder<S> {
        EngineBuilder::new(store)
    }
}
