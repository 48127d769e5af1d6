//! The scheduler: the engine's single writer and dispatcher.
//!
//! One loop: wait for a message (or the next due time), take every message waiting,
//! turn them into store operations, write them all as one batch with a claim of due
//! entities, then act on the results — answer callers, start the next step of each
//! entity it holds, release the ones at rest. While a batch is being written, new work
//! queues up for the next one: that is the group commit, with no artificial delay.
//!
//! A held entity's next step is chosen by [`Scheduler::advance`]: the first inbox item
//! (an event, a fired timer, or a notice that a successor changed, which re-evaluates the
//! entity's subscriptions), else its auto action when due, else the lease is released.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use settle_core::fault::FaultDecision;
use settle_core::machine::Schedule;
use settle_core::pattern::SuccessorView;
use settle_core::step::{self, EventStep};
use settle_core::{Action, ActionName, EntityKey, EventName, Machine, MachineName, StateKind, StateName};
use settle_store::{
    AfterCommit, Applied, Batch, BatchResult, Claim, Command, Commit, EntityRow, ErrorRecord, EventRecord, Fence,
    HistoryKind, InboxItem, InboxKind, NewEntity, Op, OpError, Push, RunStatus, Store, TaskOffer, TaskResult,
    Telemetry, TimerPlan, TransitionRecord,
};
use tokio::sync::{mpsc, oneshot};

use crate::engine::{Config, EventOutcome, Registry, Wait};
use crate::error::{Error, Result};
use crate::handler::{ActionContext, CatchUnwind, EngineFuture, Nested, Outcome};
use crate::now_ms;
use crate::watch::{Hub, Want, first_of};

type DoneTx = oneshot::Sender<(EventOutcome, EntityRow)>;

/// Callers waiting for an entity to enter one of some states.
type Watchers = Vec<(Vec<StateName>, oneshot::Sender<EntityRow>)>;

/// A subscription event to fire, with its parameters (`matched`).
type Fire = Option<(EventName, Value)>;

pub(crate) enum Msg {
    /// Answered with the entity, or `None` when the request id was replayed.
    Create {
        new: NewEntity,
        reply: oneshot::Sender<Result<Option<EntityRow>>>,
    },
    /// `ack` gets the inbox id and the entity's id, or `None` when the request id was
    /// replayed.
    Raise {
        push: Push,
        wait: Wait,
        ack: oneshot::Sender<Result<Option<(i64, i64)>>>,
        done: Option<DoneTx>,
    },
    /// An operator command (`Op::Command`); answered like `Create`.
    Command {
        op: Op,
        reply: oneshot::Sender<Result<Option<EntityRow>>>,
    },
    ActionDone {
        entity_id: i64,
        version: i64,
        result: std::result::Result<Outcome, FaultError>,
    },
    Evaluated {
        entity_id: i64,
        version: i64,
        result: std::result::Result<(Fire, Option<i64>), String>,
    },
    /// An agent's lease, heartbeat or report (`Op::TaskLease`, `TaskHeartbeat`, `TaskReport`).
    Agent {
        op: Op,
        reply: oneshot::Sender<Result<Applied>>,
    },
    WhenIdle(oneshot::Sender<()>),
    /// Tell `reply` when the entity commits into one of `states`.
    Watch {
        entity_id: i64,
        states: Vec<StateName>,
        reply: oneshot::Sender<EntityRow>,
        /// Answered once the watch is in place.
        registered: oneshot::Sender<()>,
    },
    Shutdown(oneshot::Sender<()>),
}

/// What to do with the result of an operation once its batch is written.
enum Pending {
    Create(oneshot::Sender<Result<Option<EntityRow>>>),
    Raise { ack: oneshot::Sender<Result<Option<(i64, i64)>>>, wait: Wait, done: Option<DoneTx> },
    Command { reply: oneshot::Sender<Result<Option<EntityRow>>>, command: Command },
    Commit(Box<CommitCtx>),
    Agent(oneshot::Sender<Result<Applied>>),
    Release,
    Renew,
    Supervise,
}

/// A failed action, as the fault policy and the `errors` table see it.
pub(crate) struct FaultError {
    kind: &'static str,
    details: String,
    exception: Option<String>,
    /// Trying again cannot help (an agent's non-retryable failure): park at once.
    fatal: bool,
}

impl FaultError {
    fn new(kind: &'static str, details: impl Into<String>) -> Self {
        FaultError { kind, details: details.into(), exception: None, fatal: false }
    }
}

/// A commit in flight: what its success changes in the in-memory snapshot, and what to
/// tell callers. The commit itself goes to the store; only these few fields are kept.
struct CommitCtx {
    entity_id: i64,
    /// The state entered, its retry count and auto action time (`None`: no state change).
    entry: Option<(StateName, u32, Option<i64>)>,
    properties: Option<settle_core::Properties>,
    fired: Option<Vec<EventName>>,
    /// The entity's event after the commit.
    event_id: Option<i64>,
    request_id: Option<String>,
    after: AfterCommit,
    /// The event processed, if any.
    item: Option<InboxItem>,
    /// The action that ran (for turning a failed commit into a fault).
    action: Option<ActionName>,
    outcome: Option<EventOutcome>,
}

/// What a held entity is busy with.
enum Running {
    /// An action, with the event that triggered it, the entities it read with lock, and
    /// when it started.
    Action { action: Arc<Action>, item: Option<InboxItem>, locks: Arc<Mutex<Vec<(i64, i64)>>>, started: i64 },
    /// Its subscriptions are being evaluated for this notice.
    Evaluating { notice: InboxItem },
}

/// A subscription event being processed: the notices its evaluation covered.
struct Firing {
    event: EventName,
    notices_upto: i64,
}

/// An entity this engine holds the lease of.
struct Held {
    machine: Arc<Machine>,
    entity: EntityRow,
    /// The next inbox item, when known.
    inbox_head: Option<InboxItem>,
    running: Option<Running>,
    firing: Option<Firing>,
    /// The agent report (inbox id) the current step concludes: consumed by its commit.
    agent_report: Option<i64>,
}

pub(crate) struct Scheduler<S> {
    store: S,
    registry: Arc<Registry>,
    config: Config,
    tx: mpsc::UnboundedSender<Msg>,
    nested: Arc<dyn Nested>,
    /// Woken when a batch offered agent tasks (agents long-polling a queue lease again).
    offered: Arc<tokio::sync::Notify>,
    held: HashMap<i64, Held>,
    ops: Vec<Op>,
    pending: Vec<Pending>,
    /// Callers waiting for the outcome of an inbox event, by inbox id.
    outcome_waiters: HashMap<i64, (Wait, DoneTx)>,
    /// Callers waiting for an entity to come to rest, by entity id.
    rest_waiters: HashMap<i64, Vec<(EventOutcome, DoneTx)>>,
    idle_waiters: Vec<oneshot::Sender<()>>,
    /// Callers waiting for an entity to enter one of some states, by entity id.
    state_watchers: HashMap<i64, Watchers>,
    shutdown: Option<oneshot::Sender<()>>,
    next_due: Option<i64>,
    last_renew: i64,
    last_supervise: i64,
    claim_now: bool,
    /// The machines this engine serves: it claims only their entities.
    served: Vec<String>,
    /// Events raised through this scheduler (for pruning waiters now and then).
    raised: u64,
    /// Woken when another process may have made work due.
    wakeup: Arc<tokio::sync::Notify>,
    stats: Stats,
}

/// Counters of the scheduler's work, logged at shutdown (`SETTLE_LOG=settle_engine=debug`).
#[derive(Debug, Default)]
struct Stats {
    batches: u64,
    ops: u64,
    claimed: u64,
    write_micros: u64,
}

/// What actions may do with other entities while they run: raise a sync nested event,
/// read. Goes through the scheduler's channel and the store like any caller.
struct NestedHandle<S> {
    tx: mpsc::UnboundedSender<Msg>,
    store: S,
    registry: Arc<Registry>,
    lease: Duration,
    /// Answers the wait when another instance processes the event (shared stores).
    hub: Option<Hub>,
}

impl<S: Store + Clone> Nested for NestedHandle<S> {
    fn raise_and_wait(
        &self,
        from: i64,
        machine: MachineName,
        key: EntityKey,
        event: EventName,
        params: Value,
        request_id: Option<String>,
    ) -> EngineFuture<(EventOutcome, EntityRow)> {
        let checked = self.registry.machine(&machine).and_then(|m| {
            step::check_raise(m, &event, &params)?;
            Ok(m.clone())
        });
        let tx = self.tx.clone();
        let lease = self.lease;
        let hub = self.hub.clone();
        Box::pin(async move {
            let m = checked?;
            let push = Push {
                machine,
                key,
                event,
                params,
                request_id,
                kind: InboxKind::Nested,
                join_from: Some(from),
                operation: None,
            };
            let (ack, ack_rx) = oneshot::channel();
            let (done, done_rx) = oneshot::channel();
            let mark = hub.as_ref().map(Hub::mark);
            tx.send(Msg::Raise { push, wait: Wait::Stable, ack, done: Some(done) }).map_err(|_| Error::Stopped)?;
            let pushed = ack_rx.await.map_err(|_| Error::Stopped)??;
            let remote = match (&hub, pushed, mark) {
                (Some(hub), Some((inbox_id, entity_id)), Some(mark)) => {
                    let (reply, rx) = oneshot::channel();
                    let want = Want::Event { inbox_id, stable: true, machine: m, accepted: None, reply };
                    hub.watch(entity_id, mark, want);
                    Some(rx)
                }
                _ => None,
            };
            match tokio::time::timeout(lease, first_of(done_rx, remote)).await {
                Ok(Some(answer)) => Ok(answer),
                Ok(None) => Err(Error::Stopped),
                Err(_) => Err(Error::Timeout { request_id: "nested event".into(), waited: lease }),
            }
        })
    }

    fn read(&self, machine: MachineName, key: EntityKey) -> EngineFuture<Option<EntityRow>> {
        let store = self.store.clone();
        Box::pin(async move { Ok(store.entity_get(&machine, &key).await?) })
    }
}

impl<S: Store + Clone> Scheduler<S> {
    pub(crate) fn new(
        store: S,
        registry: Arc<Registry>,
        config: Config,
        tx: mpsc::UnboundedSender<Msg>,
        offered: Arc<tokio::sync::Notify>,
        hub: Option<Hub>,
    ) -> Self {
        let nested = Arc::new(NestedHandle {
            tx: tx.clone(),
            store: store.clone(),
            registry: registry.clone(),
            lease: config.lease,
            hub,
        });
        let mut served: Vec<String> =
            registry.machines.keys().filter(|m| registry.serves(m)).map(|m| m.to_string()).collect();
        served.sort();
        Scheduler {
            store,
            registry,
            config,
            tx,
            nested,
            offered,
            held: HashMap::new(),
            ops: Vec::new(),
            pending: Vec::new(),
            outcome_waiters: HashMap::new(),
            rest_waiters: HashMap::new(),
            idle_waiters: Vec::new(),
            state_watchers: HashMap::new(),
            shutdown: None,
            next_due: None,
            last_renew: now_ms(),
            last_supervise: now_ms(),
            claim_now: true,
            served,
            raised: 0,
            wakeup: Arc::new(tokio::sync::Notify::new()),
            stats: Stats::default(),
        }
    }

    fn lease_ms(&self) -> i64 {
        self.config.lease.as_millis() as i64
    }

    pub(crate) async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Msg>) {
        // Another process may make work due (PostgreSQL's NOTIFY): claim at once then.
        let wakeup = self.store.wakeup().unwrap_or_else(|| Arc::new(tokio::sync::Notify::new()));
        self.wakeup = wakeup.clone();
        loop {
            if self.ops.is_empty() && !self.claim_now {
                self.check_idle();
                if self.shutdown.is_some() && self.held.is_empty() {
                    break;
                }
                let wait = self.sleep_for();
                tokio::select! {
                    msg = rx.recv() => match msg {
                        Some(msg) => self.on_msg(msg),
                        None => break,
                    },
                    _ = tokio::time::sleep(wait) => self.claim_now = true,
                    _ = wakeup.notified() => self.claim_now = true,
                }
            }
            while let Ok(msg) = rx.try_recv() {
                self.on_msg(msg);
            }
            self.maybe_renew();
            self.maybe_supervise();
            self.write_batch().await;
        }
        let st = &self.stats;
        tracing::debug!(
            batches = st.batches,
            ops = st.ops,
            claimed = st.claimed,
            ops_per_batch = st.ops as f64 / st.batches.max(1) as f64,
            write_ms_per_batch = st.write_micros as f64 / 1000.0 / st.batches.max(1) as f64,
            "scheduler stopped"
        );
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }

    fn sleep_for(&self) -> Duration {
        let poll = self.config.poll;
        match self.next_due {
            Some(due) => Duration::from_millis((due - now_ms()).max(0) as u64).min(poll),
            None => poll,
        }
    }

    fn check_idle(&mut self) {
        if self.idle_waiters.is_empty() || !self.held.is_empty() || !self.ops.is_empty() || self.next_due.is_some() {
            return;
        }
        for tx in self.idle_waiters.drain(..) {
            let _ = tx.send(());
        }
    }

    fn on_msg(&mut self, msg: Msg) {
        match msg {
            Msg::Create { new, reply } => {
                if self.shutdown.is_some() {
                    let _ = reply.send(Err(Error::Stopped));
                    return;
                }
                self.ops.push(Op::Create(new));
                self.pending.push(Pending::Create(reply));
            }
            Msg::Raise { push, wait, ack, done } => {
                if self.shutdown.is_some() {
                    let _ = ack.send(Err(Error::Stopped));
                    return;
                }
                self.prune_waiters();
                self.ops.push(Op::Push(push));
                self.pending.push(Pending::Raise { ack, wait, done });
            }
            Msg::Command { op, reply } => {
                let Op::Command { command, .. } = &op else { unreachable!("Msg::Command carries Op::Command") };
                let command = *command;
                self.ops.push(op);
                self.pending.push(Pending::Command { reply, command });
            }
            Msg::Agent { op, reply } => {
                self.ops.push(op);
                self.pending.push(Pending::Agent(reply));
            }
            Msg::ActionDone { entity_id, version, result } => self.on_action_done(entity_id, version, result),
            Msg::Evaluated { entity_id, version, result } => self.on_evaluated(entity_id, version, result),
            Msg::WhenIdle(tx) => {
                self.idle_waiters.push(tx);
                // Recompute the due time: the caller may have written work we have not seen.
                self.claim_now = true;
            }
            Msg::Watch { entity_id, states, reply, registered } => {
                self.state_watchers.retain(|_, w| {
                    w.retain(|(_, tx)| !tx.is_closed());
                    !w.is_empty()
                });
                self.state_watchers.entry(entity_id).or_default().push((states, reply));
                let _ = registered.send(());
            }
            Msg::Shutdown(tx) => self.shutdown = Some(tx),
        }
    }

    /// Now and then, forgets callers that stopped waiting: on a shared store another
    /// instance may answer a caller (through the hub), and this scheduler never sees its
    /// event.
    fn prune_waiters(&mut self) {
        self.raised += 1;
        if !self.raised.is_multiple_of(256) {
            return;
        }
        self.outcome_waiters.retain(|_, (_, tx)| !tx.is_closed());
        self.rest_waiters.retain(|_, w| {
            w.retain(|(_, tx)| !tx.is_closed());
            !w.is_empty()
        });
    }

    /// Every `supervise_every`: mark operations without progress for `hung_after` as hung.
    fn maybe_supervise(&mut self) {
        let now = now_ms();
        if now - self.last_supervise < self.config.supervise_every.as_millis() as i64 {
            return;
        }
        self.last_supervise = now;
        let store = self.store.clone();
        tokio::spawn(async move {
            if let Ok(n) = store.entity_count_pending().await {
                crate::metrics::due_backlog(n);
            }
        });
        self.ops.push(Op::MarkHung { before: now - self.config.hung_after.as_millis() as i64 });
        self.pending.push(Pending::Supervise);
    }

    fn maybe_renew(&mut self) {
        let now = now_ms();
        if self.held.is_empty() || now - self.last_renew < self.lease_ms() / 3 {
            return;
        }
        self.last_renew = now;
        let ids: Vec<i64> = self.held.keys().copied().collect();
        self.ops.push(Op::Renew { ids, owner: self.config.owner.clone(), until: now + self.lease_ms() });
        self.pending.push(Pending::Renew);
    }

    async fn write_batch(&mut self) {
        let capacity = self.config.max_inflight.saturating_sub(self.held.len()).min(self.config.claim_batch);
        let claim = (self.shutdown.is_none() && capacity > 0).then(|| Claim {
            owner: self.config.owner.clone(),
            lease_ms: self.lease_ms(),
            limit: capacity,
            machines: self.served.clone(),
        });
        if self.ops.is_empty() && claim.is_none() {
            self.claim_now = false;
            return;
        }
        self.claim_now = false;
        if claim.is_some() {
            // A wake-up already received announced work committed before this claim: the
            // claim sees it. Dropping it spares a claim of nothing after this batch (with
            // several instances, every batch of one wakes all the others).
            let woken = self.wakeup.notified();
            tokio::pin!(woken);
            let _ = woken.as_mut().poll(&mut std::task::Context::from_waker(std::task::Waker::noop()));
        }
        let ops = std::mem::take(&mut self.ops);
        let pending = std::mem::take(&mut self.pending);
        crate::metrics::batch(ops.len(), self.held.len());
        let offers = ops.iter().any(|op| match op {
            Op::Commit(c) => c.offer.is_some(),
            Op::Create(n) => n.offer.is_some(),
            Op::Command { command, .. } => matches!(command, Command::Resume | Command::Retry),
            _ => false,
        });
        let batch = Batch { now: now_ms(), ops, claim };
        self.stats.batches += 1;
        self.stats.ops += batch.ops.len() as u64;
        let started = std::time::Instant::now();
        let written = self.store.write(batch).await;
        self.stats.write_micros += started.elapsed().as_micros() as u64;
        if let Ok(r) = &written {
            self.stats.claimed += r.claimed.len() as u64;
        }
        if offers && written.is_ok() {
            self.offered.notify_waiters();
        }
        match written {
            Ok(result) => self.on_result(pending, result),
            Err(e) => self.on_store_error(pending, e),
        }
    }

    /// The batch as a whole failed: nothing of it is visible. Callers get the error;
    /// entities whose commit was lost are dropped and come back when their lease expires.
    fn on_store_error(&mut self, pending: Vec<Pending>, e: settle_store::Error) {
        tracing::error!(error = %e, "store write failed");
        let msg = e.to_string();
        for p in pending {
            match p {
                Pending::Create(reply) => {
                    let _ = reply.send(Err(Error::Store(settle_store::Error::Db(msg.clone()))));
                }
                Pending::Raise { ack, .. } => {
                    let _ = ack.send(Err(Error::Store(settle_store::Error::Db(msg.clone()))));
                }
                Pending::Command { reply, .. } => {
                    let _ = reply.send(Err(Error::Store(settle_store::Error::Db(msg.clone()))));
                }
                Pending::Agent(reply) => {
                    let _ = reply.send(Err(Error::Store(settle_store::Error::Db(msg.clone()))));
                }
                Pending::Commit(ctx) => {
                    self.held.remove(&ctx.entity_id);
                }
                Pending::Release | Pending::Renew | Pending::Supervise => {}
            }
        }
        self.claim_now = false;
        self.next_due = Some(now_ms() + 1_000);
    }

    fn on_result(&mut self, pending: Vec<Pending>, result: BatchResult) {
        self.next_due = result.next_due;
        for (p, r) in pending.into_iter().zip(result.results) {
            match p {
                Pending::Create(reply) => {
                    let _ = reply.send(r.map_err(op_error).map(|a| match a {
                        Applied::Created(e) => Some(e),
                        Applied::Replayed { .. } => None,
                        other => unreachable!("create answered with {other:?}"),
                    }));
                }
                Pending::Command { reply, command } => {
                    let answer = r.map_err(op_error).map(|a| match a {
                        Applied::Commanded(e) => Some(e),
                        Applied::Replayed { .. } => None,
                        other => unreachable!("command answered with {other:?}"),
                    });
                    if let Ok(Some(e)) = &answer
                        && matches!(command, Command::Kill | Command::Release)
                    {
                        // Our lease is gone: whatever runs for it now can never commit.
                        self.held.remove(&e.id);
                    }
                    let _ = reply.send(answer);
                }
                Pending::Raise { ack, wait, done } => match r {
                    Ok(Applied::Pushed { inbox_id, entity_id }) => {
                        if let Some(done) = done {
                            self.outcome_waiters.insert(inbox_id, (wait, done));
                        }
                        let _ = ack.send(Ok(Some((inbox_id, entity_id))));
                    }
                    Ok(Applied::Replayed { .. }) => {
                        let _ = ack.send(Ok(None));
                    }
                    Ok(other) => unreachable!("push answered with {other:?}"),
                    Err(e) => {
                        let _ = ack.send(Err(op_error(e)));
                    }
                },
                Pending::Commit(ctx) => self.on_committed(*ctx, r),
                Pending::Agent(reply) => {
                    let _ = reply.send(r.map_err(op_error));
                }
                Pending::Release | Pending::Renew => {
                    if let Err(e) = r {
                        tracing::warn!(error = %e, "lease operation failed");
                    }
                }
                Pending::Supervise => {
                    if let Ok(Applied::MarkedHung(n)) = r
                        && n > 0
                    {
                        tracing::warn!(operations = n, "operations marked hung");
                    }
                }
            }
        }
        for c in result.claimed {
            let id = c.entity.id;
            if self.held.contains_key(&id) {
                continue;
            }
            let machine = match self.registry.machine(&c.entity.machine) {
                Ok(m) => m.clone(),
                Err(_) => {
                    tracing::warn!(machine = %c.entity.machine, key = %c.entity.key, "claimed an entity of a machine this engine does not know; leaving it to its lease expiry");
                    continue;
                }
            };
            self.held.insert(
                id,
                Held {
                    machine,
                    entity: c.entity,
                    inbox_head: c.inbox_head,
                    running: None,
                    firing: None,
                    agent_report: None,
                },
            );
            self.advance(id);
        }
    }

    fn on_committed(&mut self, mut ctx: CommitCtx, r: std::result::Result<Applied, OpError>) {
        let id = ctx.entity_id;
        match r {
            Ok(Applied::Committed { held: still_held, version, inbox_head, .. }) => {
                let Some(held) = self.held.get_mut(&id) else { return };
                let e = &mut held.entity;
                e.version = version;
                if let Some((state, _, _)) = &ctx.entry {
                    crate::metrics::transition(&e.machine, &e.state, state);
                }
                if let Some((state, retry, auto_at)) = ctx.entry.clone() {
                    e.state = state;
                    e.retry = retry;
                    e.auto_at = auto_at;
                    e.entered_at = now_ms();
                    if ctx.request_id.is_some() {
                        e.request_id = ctx.request_id.clone();
                    }
                }
                if let Some(p) = ctx.properties.take() {
                    e.properties = p;
                }
                if let Some(f) = ctx.fired.take() {
                    e.fired = f;
                }
                e.event_id = ctx.event_id;
                let at_rest = held.machine.state(&e.state).is_none_or(|s| s.kind != StateKind::Unstable);
                let snapshot = e.clone();
                if let (Some(item), Some(outcome)) = (&ctx.item, ctx.outcome)
                    && let Some((wait, done)) = self.outcome_waiters.remove(&item.id)
                {
                    let accepted = matches!(outcome, EventOutcome::Accepted { .. });
                    if wait == Wait::Stable && accepted && !at_rest {
                        self.rest_waiters.entry(id).or_default().push((outcome, done));
                    } else {
                        let _ = done.send((outcome, snapshot.clone()));
                    }
                }
                if ctx.entry.is_some()
                    && let Some(watchers) = self.state_watchers.get_mut(&id)
                {
                    let (hit, keep): (Vec<_>, Vec<_>) =
                        std::mem::take(watchers).into_iter().partition(|(states, _)| states.contains(&snapshot.state));
                    *watchers = keep;
                    for (_, tx) in hit {
                        let _ = tx.send(snapshot.clone());
                    }
                }
                if at_rest && let Some(waiters) = self.rest_waiters.remove(&id) {
                    for (outcome, done) in waiters {
                        let _ = done.send((outcome, snapshot.clone()));
                    }
                }
                match ctx.after {
                    AfterCommit::Release => {
                        self.held.remove(&id);
                    }
                    AfterCommit::Hold if !still_held => {
                        // Paused, put to sleep or parked meanwhile: the store released it.
                        self.held.remove(&id);
                    }
                    AfterCommit::Hold => {
                        if let Some(held) = self.held.get_mut(&id) {
                            held.inbox_head = inbox_head;
                        }
                        self.advance(id);
                    }
                }
            }
            Ok(other) => unreachable!("commit answered with {other:?}"),
            Err(OpError::LeaseLost { .. }) => {
                crate::metrics::lease_lost();
                tracing::warn!(entity = id, "lease lost; another engine owns the entity now");
                self.held.remove(&id);
            }
            Err(e) => {
                // An effect or precondition failed: nothing is visible; record a fault.
                let action = ctx.action.clone();
                let error = FaultError::new("commit_failed", format!("commit failed: {e}"));
                self.fault(id, ctx.item, action.as_deref(), error);
            }
        }
    }

    /// Decides and starts the next step of a held entity.
    fn advance(&mut self, id: i64) {
        let Some(held) = self.held.get_mut(&id) else { return };
        if held.running.is_some() {
            return;
        }
        let now = now_ms();
        if let Some(item) = held.inbox_head.take() {
            match item.kind {
                InboxKind::Notice => self.evaluate(id, item),
                InboxKind::Timer => {
                    let machine = held.machine.clone();
                    let state = held.entity.state.clone();
                    let name = item.params.get("timer").and_then(Value::as_str).unwrap_or_default().to_string();
                    if timer_applies(&machine, &state, &name, &item.event) {
                        self.process_event(id, InboxItem { params: Value::Null, ..item });
                    } else {
                        let reason = format!("timer `{name}` does not apply in state `{state}`");
                        self.reject(id, item, reason);
                    }
                }
                InboxKind::Raised | InboxKind::Nested => self.process_event(id, item),
                InboxKind::Agent => self.agent_reported(id, item),
            }
            return;
        }
        let machine = held.machine.clone();
        let state_unstable = machine.state(&held.entity.state).is_some_and(|s| s.kind == StateKind::Unstable);
        if state_unstable && held.entity.auto_at.is_none_or(|at| at <= now) {
            let auto = machine.state(&held.entity.state).and_then(|s| s.auto.clone()).expect("unstable state has auto");
            let has_handler = self.registry.handler(machine.name(), &auto).is_some();
            match step::on_auto(&machine, &held.entity.state, has_handler) {
                Some(EventStep::Plain { action, target }) => {
                    let action = Arc::new(action.clone());
                    self.finish_action(id, &action, None, Outcome::to(target), Vec::new(), None);
                }
                Some(EventStep::Run { action }) => {
                    let action = Arc::new(action.clone());
                    self.spawn_action(id, action, None);
                }
                Some(EventStep::Agent { action, .. }) => {
                    if held.entity.auto_at.is_some() {
                        // Due (first entry after a resume, or after a retry-now): offer the task.
                        self.offer_now(id, action.clone());
                    } else {
                        // The task is offered; the agent's report will make the entity due.
                        let fence = fence(&held.entity, &self.config.owner);
                        self.held.remove(&id);
                        self.ops.push(Op::Release(fence));
                        self.pending.push(Pending::Release);
                    }
                }
                _ => unreachable!("an unstable state's auto step is plain, run or agent"),
            }
            return;
        }
        // Nothing to do now: release; the store keeps the due time of the auto action.
        let fence = fence(&held.entity, &self.config.owner);
        self.held.remove(&id);
        self.ops.push(Op::Release(fence));
        self.pending.push(Pending::Release);
    }

    /// Processes an event (raised, nested, timer, or a subscription that fired).
    fn process_event(&mut self, id: i64, item: InboxItem) {
        let held = &self.held[&id];
        let machine = held.machine.clone();
        let has_handler =
            machine.event(&item.event).is_some_and(|e| self.registry.handler(machine.name(), &e.action).is_some());
        match step::on_event(&machine, &held.entity.state, &item.event, has_handler) {
            EventStep::Reject(rejection) => self.reject(id, item, rejection.reason),
            EventStep::Plain { action, target } => {
                let action = Arc::new(action.clone());
                self.finish_action(id, &action, Some(item), Outcome::to(target), Vec::new(), None);
            }
            EventStep::Run { action } => {
                let action = Arc::new(action.clone());
                self.spawn_action(id, action, Some(item));
            }
            EventStep::Agent { .. } => unreachable!("validation keeps agent actions off events"),
        }
    }

    /// Records a rejected event: consumed, nothing else changes.
    fn reject(&mut self, id: i64, item: InboxItem, reason: String) {
        let now = now_ms();
        if let Some(h) = self.held.get(&id) {
            crate::metrics::rejected(&h.entity.machine, &item.event);
            tracing::debug!(request_id = ?item.request_id, machine = %h.entity.machine, key = %h.entity.key,
                event = %item.event, reason = %reason, "event rejected");
        }
        let after = self.after_unchanged(id, now);
        let owner = self.config.owner.clone();
        let held = self.held.get_mut(&id).expect("held entity");
        let outcome = EventOutcome::Rejected { state: held.entity.state.clone(), reason: reason.clone() };
        let mut commit = Commit {
            retry: held.entity.retry,
            event: Some(item.event.clone()),
            consume: Some(item.id),
            request_id: item.request_id.clone(),
            detail: Some(reason),
            machine_hash: self.registry.hash(held.machine.name()),
            telemetry: Telemetry {
                event: Some(event_record(&item, true, false)),
                at_rest: !held.machine.state(&held.entity.state).is_some_and(|s| s.kind == StateKind::Unstable),
                // The rejected event's operation may have nothing left to wait for.
                complete: true,
                current_event: held.entity.event_id,
                ..Telemetry::default()
            },
            ..Commit::new(fence(&held.entity, &owner), held.entity.state.clone(), HistoryKind::Rejected, after)
        };
        if let Some(f) = held.firing.take() {
            commit.consume_notices_upto = Some(f.notices_upto);
        }
        self.push_commit(commit, Some(item), None, Some(outcome));
    }

    /// Consumes change notices without a history row (nothing fired). The operation the
    /// notice belongs to may be complete now.
    fn quiet_notice_commit(&mut self, id: i64, notice: &InboxItem, notices_upto: i64) {
        let now = now_ms();
        let after = self.after_unchanged(id, now);
        let held = &self.held[&id];
        let e = &held.entity;
        let unstable = held.machine.state(&e.state).is_some_and(|s| s.kind == StateKind::Unstable);
        let commit = Commit {
            retry: e.retry,
            consume: Some(notice.id),
            consume_notices_upto: Some(notices_upto),
            quiet: true,
            request_id: notice.request_id.clone(),
            telemetry: Telemetry {
                at_rest: !unstable,
                complete: true,
                current_event: e.event_id,
                ..Telemetry::default()
            },
            ..Commit::new(fence(e, &self.config.owner), e.state.clone(), HistoryKind::Event, after)
        };
        self.push_commit(commit, None, None, None);
    }

    /// Starts evaluating the entity's subscriptions for a change notice. The successors
    /// are read outside the scheduler; every notice up to the read is covered by it.
    fn evaluate(&mut self, id: i64, notice: InboxItem) {
        let held = self.held.get_mut(&id).expect("held entity");
        let machine = held.machine.clone();
        let pending_subs = machine.subscriptions_in(&held.entity.state).any(|ev| !held.entity.fired.contains(&ev.name));
        if !pending_subs {
            // Nothing here listens: the notices are moot for this state entry (entering a
            // state with subscriptions evaluates them afresh).
            self.quiet_notice_commit(id, &notice, i64::MAX);
            return;
        }
        let (state, fired, version) = (held.entity.state.clone(), held.entity.fired.clone(), held.entity.version);
        held.running = Some(Running::Evaluating { notice });
        let (store, registry, tx) = (self.store.clone(), self.registry.clone(), self.tx.clone());
        tokio::spawn(async move {
            let result = match store.successor_snapshot(id).await {
                Ok(snap) => Ok((
                    evaluate_subscriptions(&machine, &registry, &state, &fired, &snap.successors),
                    snap.newest_notice,
                )),
                Err(e) => Err(e.to_string()),
            };
            let _ = tx.send(Msg::Evaluated { entity_id: id, version, result });
        });
    }

    fn on_evaluated(&mut self, id: i64, version: i64, result: std::result::Result<(Fire, Option<i64>), String>) {
        let Some(held) = self.held.get_mut(&id) else { return };
        if held.entity.version != version {
            return;
        }
        let Some(Running::Evaluating { notice }) = held.running.take() else { return };
        let (fire, newest) = match result {
            Ok(r) => r,
            Err(e) => {
                // The read failed; the notice stays queued and is evaluated again.
                tracing::warn!(entity = id, error = %e, "cannot read successors");
                let fence = fence(&held.entity, &self.config.owner);
                self.held.remove(&id);
                self.ops.push(Op::Release(fence));
                self.pending.push(Pending::Release);
                return;
            }
        };
        let notices_upto = newest.unwrap_or(notice.id).max(notice.id);
        match fire {
            Some((event, params)) => {
                held.firing = Some(Firing { event: event.clone(), notices_upto });
                let item = InboxItem { event, params, ..notice };
                self.process_event(id, item);
            }
            None => self.quiet_notice_commit(id, &notice, notices_upto),
        }
    }

    /// After a commit that changes no state: keep going if the auto action is due now.
    fn after_unchanged(&self, id: i64, now: i64) -> AfterCommit {
        let held = &self.held[&id];
        let unstable = held.machine.state(&held.entity.state).is_some_and(|s| s.kind == StateKind::Unstable);
        if unstable && held.entity.auto_at.is_none_or(|at| at <= now) {
            AfterCommit::Hold
        } else {
            AfterCommit::Release
        }
    }

    /// Offers the entity's agent task now (its auto action came due without one: a resume
    /// after parking, a retry-now).
    fn offer_now(&mut self, id: i64, action: Action) {
        let now = now_ms();
        let held = &self.held[&id];
        let e = &held.entity;
        let commit = Commit {
            retry: e.retry,
            quiet: true,
            request_id: e.request_id.clone(),
            offer: task_offer(&held.machine, &e.state, now),
            machine_hash: self.registry.hash(held.machine.name()),
            telemetry: Telemetry { current_event: e.event_id, ..Telemetry::default() },
            ..Commit::new(fence(e, &self.config.owner), e.state.clone(), HistoryKind::Auto, AfterCommit::Release)
        };
        debug_assert!(commit.offer.as_ref().is_some_and(|o| o.action == action.name));
        self.push_commit(commit, None, None, None);
    }

    /// An agent reported on a task of this entity: its outcome is the auto action's, and
    /// is committed like a handler's. A report for an earlier state entry is consumed and
    /// changes nothing.
    fn agent_reported(&mut self, id: i64, item: InboxItem) {
        let held = self.held.get_mut(&id).expect("held entity");
        let report = settle_store::AgentReport::from_json(&item.params);
        let action = held
            .machine
            .state(&held.entity.state)
            .and_then(|s| s.auto.as_ref())
            .and_then(|a| held.machine.action(a))
            .filter(|a| a.agent.is_some())
            .cloned();
        let (Some(report), Some(action)) = (report, action) else {
            tracing::warn!(entity = id, "agent report for a state without an agent action; dropped");
            return self.quiet_notice_commit(id, &item, 0);
        };
        if report.entity_version != held.entity.version {
            tracing::debug!(entity = id, task = report.task, "agent report for an earlier state entry; dropped");
            return self.quiet_notice_commit(id, &item, 0);
        }
        held.agent_report = Some(item.id);
        match report.result {
            TaskResult::Complete { target, properties } => {
                let mut outcome = Outcome::to(target);
                for (k, v) in properties {
                    outcome = if v.is_null() { outcome.remove(k) } else { outcome.set(k, v) };
                }
                self.finish_action(id, &action, None, outcome, Vec::new(), Some(report.leased_at));
            }
            TaskResult::Fail { error, retryable } => {
                let agent = report.agent.as_deref().unwrap_or("an agent");
                let details = format!("{agent} failed task {} (attempt {}): {error}", report.task, report.attempt);
                let error = FaultError { fatal: !retryable, ..FaultError::new("agent_error", details) };
                self.fault(id, None, Some(&action.name), error);
            }
        }
    }

    fn spawn_action(&mut self, id: i64, action: Arc<Action>, item: Option<InboxItem>) {
        let held = self.held.get_mut(&id).expect("held entity");
        let handler = self.registry.handler(held.machine.name(), &action.name).expect("run step has a handler").clone();
        let e = &held.entity;
        let locks = Arc::new(Mutex::new(Vec::new()));
        let ctx = ActionContext {
            machine: e.machine.clone(),
            key: e.key.clone(),
            entity_id: e.id,
            state: e.state.clone(),
            action: action.name.clone(),
            properties: e.properties.clone(),
            version: e.version,
            retry: e.retry,
            event: item.as_ref().map(|i| i.event.clone()),
            params: item.as_ref().map(|i| i.params.clone()).unwrap_or(Value::Null),
            request_id: item.as_ref().and_then(|i| i.request_id.clone()).or_else(|| e.request_id.clone()),
            nested: self.nested.clone(),
            locks: locks.clone(),
        };
        let version = e.version;
        // operation → event → action: the request id ties the spans together.
        let span = tracing::info_span!(
            "action",
            request_id = ctx.request_id.as_deref().unwrap_or(""),
            machine = %ctx.machine,
            key = %ctx.key,
            state = %ctx.state,
            action = %ctx.action,
            event = ctx.event.as_deref().unwrap_or(""),
        );
        held.running = Some(Running::Action { action, item, locks, started: now_ms() });
        // Poll once in place: an action that completes at once (a no-op, a cache hit)
        // commits in this round instead of a task and a message later.
        let mut fut = CatchUnwind(tracing::Instrument::instrument(handler(ctx), span));
        let waker = std::task::Waker::noop();
        if let std::task::Poll::Ready(result) =
            std::pin::Pin::new(&mut fut).poll(&mut std::task::Context::from_waker(waker))
        {
            self.on_action_done(id, version, action_result(result));
            return;
        }
        let tx = self.tx.clone();
        tokio::spawn(async move {
            let result = action_result(fut.await);
            let _ = tx.send(Msg::ActionDone { entity_id: id, version, result });
        });
    }

    fn on_action_done(&mut self, id: i64, version: i64, result: std::result::Result<Outcome, FaultError>) {
        let Some(held) = self.held.get_mut(&id) else { return };
        if held.entity.version != version {
            return;
        }
        let Some(Running::Action { action, item, locks, started }) = held.running.take() else { return };
        crate::metrics::action_seconds(&held.entity.machine, &action.name, (now_ms() - started) as f64 / 1000.0);
        let locks = std::mem::take(&mut *locks.lock().expect("locks"));
        match result {
            Ok(outcome) => self.finish_action(id, &action, item, outcome, locks, Some(started)),
            Err(error) => self.fault(id, item, Some(&action.name), error),
        }
    }

    /// Turns an action's outcome into a commit, or a fault if the core refuses it.
    /// `started` is when its handler started (`None`: a plain transition).
    fn finish_action(
        &mut self,
        id: i64,
        action: &Action,
        item: Option<InboxItem>,
        outcome: Outcome,
        preconditions: Vec<(i64, i64)>,
        started: Option<i64>,
    ) {
        let now = now_ms();
        let held = &self.held[&id];
        let machine = held.machine.clone();
        let e = &held.entity;
        let from = machine.state(&e.state).expect("entity state exists in its machine");
        let mut props = e.properties.clone();
        step::apply_changes(&mut props, &outcome.changes);
        let entry = match step::enter(&machine, from, action, outcome.target(), outcome.delay, e.retry, &props) {
            Ok(entry) => entry,
            Err(refusal) => {
                return self.fault(id, item, Some(&action.name), FaultError::new("refused", refusal.to_string()));
            }
        };
        let request_id = item.as_ref().and_then(|i| i.request_id.clone()).or_else(|| e.request_id.clone());
        let mut creates = Vec::with_capacity(outcome.creates.len());
        for c in &outcome.creates {
            let new = self.registry.machine(&c.machine).map_err(|e| e.to_string()).and_then(|m| {
                new_entity(m, c.key.clone(), c.properties.clone(), request_id.clone(), now).map_err(|r| r.to_string())
            });
            match new {
                Ok(mut new) => {
                    new.machine_hash = self.registry.hash(&c.machine);
                    creates.push(new);
                }
                Err(err) => return self.fault(id, item, Some(&action.name), FaultError::new("refused", err)),
            }
        }
        let mut pushes = Vec::with_capacity(outcome.raises.len());
        for r in &outcome.raises {
            let checked = self
                .registry
                .machine(&r.machine)
                .map_err(|e| e.to_string())
                .and_then(|m| step::check_raise(m, &r.event, &r.params).map_err(|e| e.to_string()));
            if let Err(err) = checked {
                return self.fault(id, item, Some(&action.name), FaultError::new("refused", err));
            }
            pushes.push(Push {
                machine: r.machine.clone(),
                key: r.key.clone(),
                event: r.event.clone(),
                params: r.params.clone(),
                request_id: request_id.clone(),
                kind: InboxKind::Nested,
                join_from: r.join.then_some(id),
                operation: None,
            });
        }
        let auto_at = entry.auto_delay.map(|d| now + d.as_millis() as i64);
        // An agent-bound auto action: the commit offers its task instead.
        let offer = auto_at.and_then(|at| task_offer(&machine, &entry.state, at));
        let after = match entry.auto_delay {
            Some(d) if d.is_zero() && offer.is_none() => AfterCommit::Hold,
            _ => AfterCommit::Release,
        };
        let outcome_for_caller = item.as_ref().map(|_| EventOutcome::Accepted { state: entry.state.clone() });
        let held = self.held.get_mut(&id).expect("held entity");
        let changed_state = entry.state != held.entity.state;
        let firing = held.firing.take();
        let fired = if changed_state {
            Some(Vec::new())
        } else {
            firing.as_ref().map(|f| {
                let mut fired = held.entity.fired.clone();
                fired.push(f.event.clone());
                fired
            })
        };
        let kind = match (&item, started) {
            (Some(_), None) => "event",
            (Some(_), Some(_)) => "event_action",
            (None, _) => "auto_action",
        };
        let transition = TransitionRecord {
            kind,
            start_health: Some(health_str(machine.health_of(&held.entity.state))),
            end_health: health_str(machine.health_of(&entry.state)),
            entry_time: held.entity.entered_at,
            start_time: item.as_ref().map(|i| i.created_at).or(started).unwrap_or(now),
            action_start_time: started,
            outcome: if entry.retry > 0 { "retry" } else { "ok" },
        };
        let commit = Commit {
            to: Some(entry.state.clone()),
            retry: entry.retry,
            auto_at: if offer.is_some() { None } else { auto_at },
            offer,
            consume: item.as_ref().map(|i| i.id).or(held.agent_report.take()),
            properties: (props != held.entity.properties).then_some(props),
            action: Some(action.name.clone()),
            event: item.as_ref().map(|i| i.event.clone()),
            consume_notices_upto: firing.map(|f| f.notices_upto),
            request_id,
            sql: outcome.sql,
            creates,
            pushes,
            preconditions,
            timers: (changed_state && has_timers(&machine))
                .then(|| timer_plan(&machine, &held.entity.state, &entry.state, now)),
            fired,
            notify_predecessors: changed_state,
            notify_self: changed_state && machine.subscriptions_in(&entry.state).next().is_some(),
            machine_hash: self.registry.hash(machine.name()),
            telemetry: Telemetry {
                event: item.as_ref().map(|i| event_record(i, false, false)),
                transition: Some(transition),
                error: None,
                at_rest: entry.at_rest(),
                complete: entry.at_rest(),
                current_event: held.entity.event_id,
            },
            ..Commit::new(
                fence(&held.entity, &self.config.owner),
                held.entity.state.clone(),
                if item.is_some() { HistoryKind::Event } else { HistoryKind::Auto },
                after,
            )
        };
        self.push_commit(commit, item, Some(action.name.clone()), outcome_for_caller);
    }

    /// An action failed (error, panic, refused outcome, failed commit). The machine's fault
    /// policy decides: park the entity (`failed`, for an operator), or back off. An event's
    /// action consumes the event and changes no state; an auto action re-enters its state
    /// after the backoff (run status `fault` meanwhile), counting the retry.
    fn fault(&mut self, id: i64, item: Option<InboxItem>, action: Option<&str>, error: FaultError) {
        let now = now_ms();
        let after_unchanged = self.after_unchanged(id, now);
        let hash = self.registry.hash(self.held.get(&id).map(|h| h.machine.name().as_str()).unwrap_or_default());
        let Some(held) = self.held.get_mut(&id) else { return };
        let e = &held.entity;
        let (mut decision, recent) = held.machine.fault_policy().decide(&e.recent_errors, now);
        if error.fatal {
            decision = FaultDecision::Park;
        }
        crate::metrics::fault(&e.machine, error.kind, matches!(decision, FaultDecision::Park));
        tracing::warn!(
            machine = %e.machine, key = %e.key, state = %e.state, error = %error.details,
            parked = matches!(decision, FaultDecision::Park), "action fault"
        );
        let unstable = held.machine.state(&e.state).is_some_and(|s| s.kind == StateKind::Unstable);
        let health = health_str(held.machine.health_of(&e.state));
        let mut base = Commit {
            retry: e.retry,
            action: action.map(Into::into),
            event: item.as_ref().map(|i| i.event.clone()),
            consume: item.as_ref().map(|i| i.id).or(held.agent_report.take()),
            request_id: item.as_ref().and_then(|i| i.request_id.clone()).or_else(|| e.request_id.clone()),
            detail: Some(error.details.clone()),
            recent_errors: Some(recent),
            machine_hash: hash,
            telemetry: Telemetry {
                event: item.as_ref().map(|i| event_record(i, false, true)),
                error: Some(ErrorRecord {
                    kind: error.kind,
                    details: error.details.clone(),
                    exception: error.exception,
                }),
                current_event: e.event_id,
                ..Telemetry::default()
            },
            ..Commit::new(fence(e, &self.config.owner), e.state.clone(), HistoryKind::Fault, AfterCommit::Release)
        };
        if let Some(f) = held.firing.take() {
            // The subscription fired (once per entry) even though its action failed.
            let mut fired = e.fired.clone();
            fired.push(f.event);
            base.fired = Some(fired);
            base.consume_notices_upto = Some(f.notices_upto);
        }
        let parked = matches!(decision, FaultDecision::Park);
        if parked {
            base.run_status = Some((RunStatus::Failed, None));
        }
        let error_details = error.details;
        let (commit, outcome) = if item.is_some() {
            let after = if parked { AfterCommit::Release } else { after_unchanged };
            let at_rest = parked || !unstable;
            (
                Commit { after, telemetry: Telemetry { at_rest, complete: true, ..base.telemetry.clone() }, ..base },
                Some(EventOutcome::Failed { error: error_details }),
            )
        } else {
            let retry = e.retry + 1;
            let (auto_at, status) = match decision {
                // Parked: the auto action runs again at once when an operator resumes it.
                FaultDecision::Park => (now, base.run_status),
                FaultDecision::Backoff(d) => {
                    let until = now + d.as_millis() as i64;
                    (until, Some((RunStatus::Fault, Some(until))))
                }
            };
            let transition = TransitionRecord {
                kind: "auto_action",
                start_health: Some(health),
                end_health: health,
                entry_time: e.entered_at,
                start_time: now,
                action_start_time: None,
                outcome: "error",
            };
            // An agent-bound auto action offers its next task for the end of the backoff (a
            // parked entity offers it when resumed).
            let offer = if parked { None } else { task_offer(&held.machine, &e.state, auto_at) };
            (
                Commit {
                    to: Some(e.state.clone()),
                    retry,
                    auto_at: if offer.is_some() { None } else { Some(auto_at) },
                    offer,
                    run_status: status,
                    telemetry: Telemetry {
                        transition: Some(transition),
                        at_rest: parked,
                        complete: parked,
                        ..base.telemetry.clone()
                    },
                    ..base
                },
                None,
            )
        };
        // A fault commit has no effects, so it can only fail by losing the lease.
        self.push_commit(commit, item, None, outcome);
    }

    fn push_commit(
        &mut self,
        commit: Commit,
        item: Option<InboxItem>,
        action: Option<ActionName>,
        outcome: Option<EventOutcome>,
    ) {
        let t = &commit.telemetry;
        let event_id = if t.at_rest {
            None
        } else if commit.to.is_some() && t.event.is_some() {
            commit.consume
        } else {
            t.current_event
        };
        let ctx = CommitCtx {
            event_id,
            entity_id: commit.fence.entity_id,
            entry: commit.to.clone().map(|to| (to, commit.retry, commit.auto_at)),
            properties: commit.properties.clone(),
            fired: commit.fired.clone(),
            request_id: commit.request_id.clone(),
            after: commit.after,
            item,
            action,
            outcome,
        };
        self.ops.push(Op::Commit(Box::new(commit)));
        self.pending.push(Pending::Commit(Box::new(ctx)));
    }
}

/// A new entity in its machine's initial state, with that state's timers.
pub(crate) fn new_entity(
    machine: &Machine,
    key: EntityKey,
    properties: settle_core::Properties,
    request_id: Option<String>,
    now: i64,
) -> std::result::Result<NewEntity, settle_core::Refusal> {
    let entry = step::initial_entry(machine, &properties)?;
    let initial = machine.initial().name.clone();
    Ok(NewEntity {
        machine: machine.name().clone(),
        key,
        timers: timer_plan(machine, "", &initial, now),
        notify_self: machine.subscriptions_in(&initial).next().is_some(),
        operation: None,
        machine_hash: None,
        health: health_str(machine.health_of(&initial)),
        offer: entry.auto_delay.and_then(|d| task_offer(machine, &entry.state, now + d.as_millis() as i64)),
        auto_at: entry.auto_delay.map(|d| now + d.as_millis() as i64),
        state: entry.state,
        properties,
        request_id,
    })
    .map(|mut new: NewEntity| {
        if new.offer.is_some() {
            new.auto_at = None;
        }
        new
    })
}

/// The agent task entering `state` offers, available at `at`: when its auto action is
/// bound to an agent queue.
fn task_offer(machine: &Machine, state: &str, at: i64) -> Option<TaskOffer> {
    let action = machine.action(machine.state(state)?.auto.as_ref()?)?;
    let binding = action.agent.as_ref()?;
    Some(TaskOffer {
        queue: binding.queue.clone(),
        action: action.name.clone(),
        lock_ms: binding.lock.as_millis() as i64,
        available_at: at,
    })
}

/// The timers an entity has after entering `to` from `from`: the timers declared for
/// `to`, and the timeouts of the subscriptions valid in `to`. One-shot timers start at the
/// entry; a periodic timer, or a timeout, that was already running in `from` keeps its
/// schedule.
fn timer_plan(machine: &Machine, from: &str, to: &str, now: i64) -> Vec<TimerPlan> {
    let ms = |d: Duration| d.as_millis() as i64;
    let mut plans: Vec<TimerPlan> = machine
        .timers_in(to)
        .map(|t| match t.schedule {
            Schedule::After(d) => TimerPlan {
                name: t.name.clone(),
                event: t.event.clone(),
                due_at: now + ms(d),
                every_ms: None,
                restart: true,
            },
            Schedule::Every(d) => TimerPlan {
                name: t.name.clone(),
                event: t.event.clone(),
                due_at: now + ms(d),
                every_ms: Some(ms(d)),
                restart: !t.valid_in(from),
            },
        })
        .collect();
    for ev in machine.subscriptions_in(to) {
        if let Some(timeout) = ev.subscribe.as_ref().and_then(|s| s.timeout.as_ref()) {
            plans.push(TimerPlan {
                name: format!("timeout:{}", ev.name),
                event: timeout.event.clone(),
                due_at: now + ms(timeout.after),
                every_ms: None,
                restart: !ev.valid_in(from),
            });
        }
    }
    plans
}

/// Whether entities of `machine` can have timers at all (declared timers or timeouts).
fn has_timers(machine: &Machine) -> bool {
    !machine.timers().is_empty()
        || machine.events().iter().any(|e| e.subscribe.as_ref().is_some_and(|s| s.timeout.is_some()))
}

/// Whether the timer `name` that raised `event` still applies in `state`.
fn timer_applies(machine: &Machine, state: &str, name: &str, event: &str) -> bool {
    if let Some(sub_event) = name.strip_prefix("timeout:") {
        return machine.event(sub_event).is_some_and(|e| {
            e.valid_in(state) && e.subscribe.as_ref().and_then(|s| s.timeout.as_ref()).is_some_and(|t| t.event == event)
        });
    }
    machine.timers().iter().any(|t| t.name == name && t.event == event && t.valid_in(state))
}

/// The first subscription valid in `state`, not yet fired in this entry, whose pattern
/// matches the successors; with the `matched` successors as the event's parameters.
fn evaluate_subscriptions(
    machine: &Machine,
    registry: &Registry,
    state: &str,
    fired: &[EventName],
    successors: &[EntityRow],
) -> Fire {
    let views: Vec<SuccessorView<'_>> = successors
        .iter()
        .map(|e| SuccessorView {
            machine: &e.machine,
            key: &e.key,
            state: &e.state,
            health: registry.machines.get(&e.machine).map(|m| m.health_of(&e.state)).unwrap_or_default(),
        })
        .collect();
    for ev in machine.subscriptions_in(state) {
        if fired.contains(&ev.name) {
            continue;
        }
        let Some(sub) = &ev.subscribe else { continue };
        if let Some(indices) = sub.pattern.eval(&views) {
            let matched: Vec<Value> = indices
                .iter()
                .map(|&i| json!({"machine": views[i].machine, "key": views[i].key, "state": views[i].state}))
                .collect();
            return Some((ev.name.clone(), json!({ "matched": matched })));
        }
    }
    None
}

fn action_result(
    r: std::result::Result<std::result::Result<Outcome, crate::handler::HandlerError>, String>,
) -> std::result::Result<Outcome, FaultError> {
    match r {
        Ok(Ok(outcome)) => Ok(outcome),
        Ok(Err(e)) => Err(FaultError::new("action_error", format!("action error: {e}"))),
        Err(panic) => Err(FaultError {
            kind: "panic",
            details: format!("action panicked: {panic}"),
            exception: Some(panic),
            fatal: false,
        }),
    }
}

fn health_str(h: settle_core::Health) -> &'static str {
    match h {
        settle_core::Health::Ok => "ok",
        settle_core::Health::Error => "error",
    }
}

/// The `events` row of a processed inbox item.
fn event_record(item: &InboxItem, rejected: bool, failed: bool) -> EventRecord {
    EventRecord {
        kind: match item.kind {
            InboxKind::Raised => "raised",
            InboxKind::Nested => "nested",
            InboxKind::Timer => "timer",
            InboxKind::Notice => "subscription",
            InboxKind::Agent => "agent",
        },
        seq: item.id,
        raised_at: item.created_at,
        rejected,
        failed,
    }
}

fn fence(e: &EntityRow, owner: &str) -> Fence {
    Fence { entity_id: e.id, version: e.version, owner: owner.to_string() }
}

fn op_error(e: OpError) -> Error {
    match e {
        OpError::NotFound { machine, key } => Error::NotFound { machine, key },
        OpError::AlreadyExists { machine, key } => Error::AlreadyExists { machine, key },
        OpError::Killed { machine, key } => Error::Killed { machine, key },
        OpError::TaskRefused { task, reason } => Error::TaskRefused { task, reason },
        other => Error::Store(settle_store::Error::Db(other.to_string())),
    }
}
