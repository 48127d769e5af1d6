//! The scheduler: the engine's single writer, and the thin IO loop around [`crate::decide`].
//!
//! One loop: wait for a message (or the next due time on the clock), take every message
//! waiting, turn them into store operations, write them all as one batch with a claim of
//! due entities, then act on the results — start the next step of each entity it holds,
//! release the ones at rest, answer callers (once the batch is durable: on SQLite its sync
//! runs beside the next batch, [`settle_store::Store::write_committed`]). While a batch is
//! being written, new work queues up for the next one: that is the group commit, with no
//! artificial delay.
//!
//! What a held entity does next, and what an action's result or a fault becomes, is
//! decided in [`crate::decide`]; this loop carries the decisions out (writes commits,
//! runs handlers, reads successors, releases leases) and logs and counts what they note.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

use serde_json::Value;
use settle_core::Action;
use settle_store::{AfterCommit, Applied, BatchResult, Command, InboxItem, Millis, Op, OpError, SharedClock, Store};
use tokio::sync::{mpsc, oneshot};

use crate::api::Wait;
use crate::config::Config;
use crate::decide::{self, Decided, Env, Expect, FaultError, Held, Hooks, Next, Note};
use crate::error::{Error, Result};
use crate::handler::{ActionContext, CatchUnwind, Nested};
use crate::msg::{DoneTx, Fire, Msg};
use crate::nested::NestedHandle;
use crate::opwatch::OpWatch;
use crate::registry::{Registries, Registry};
use crate::waiters::{Answer, Waiters};
use crate::watch::Hub;

/// The decisions' environment, borrowed field by field so that `self.held` stays free to
/// borrow mutably beside it.
macro_rules! decide_env {
    ($s:expr) => {
        Env { registry: &$s.registry, owner: &$s.config.owner, now: $s.clock.now_ms() }
    };
}

// After the macro: they use it.
mod batch;
mod limits;
mod prune;
mod tasks;
mod upkeep;

/// What to do with the result of an operation once its batch is written.
pub(crate) enum Pending {
    Create(oneshot::Sender<Result<Option<settle_store::EntityRow>>>),
    Raise {
        ack: oneshot::Sender<Result<Option<(i64, i64)>>>,
        wait: Wait,
        done: Option<DoneTx>,
        /// A sync nested event's wait ends then (its action's lease, on the engine's clock).
        deadline: Option<Millis>,
    },
    Command {
        reply: oneshot::Sender<Result<Option<settle_store::EntityRow>>>,
        command: Command,
    },
    Commit(Box<Expect>),
    /// An entity's ask for the slot of its state's concurrency limit.
    Acquire(i64),
    Agent(oneshot::Sender<Result<Applied>>),
    Cancel(oneshot::Sender<Result<Applied>>),
    Release,
    Renew,
    Supervise,
    /// A round of pruning asked for by the API.
    Prune(oneshot::Sender<Result<settle_store::Pruned>>),
    /// A round of the periodic pruning job.
    PruneJob(Box<settle_store::Prune>),
}

/// What a held entity is busy with.
enum Running {
    /// An action, with the event that triggered it, the entities it read with lock, and
    /// when it started.
    Action { action: Arc<Action>, item: Option<InboxItem>, locks: Arc<Mutex<Vec<(i64, i64)>>>, started: Millis },
    /// Its subscriptions are being evaluated for this notice.
    Evaluating { notice: InboxItem },
    /// The entry and exit actions of a transition are running.
    Hooks,
    /// It asks for the slots of its state's limits (or, `workflow`, those of the workflow
    /// of the event at the head of its inbox).
    Acquiring { workflow: bool },
}

/// An entity this engine holds the lease of: what the decisions see, and what runs for it.
struct Slot {
    held: Held,
    running: Option<Running>,
}

pub(crate) struct Scheduler<S> {
    store: S,
    /// The registry as of `generation` of `registries`, refreshed before each batch.
    registry: Arc<Registry>,
    registries: Arc<Registries>,
    generation: u64,
    config: Config,
    clock: SharedClock,
    tx: mpsc::UnboundedSender<Msg>,
    nested: Arc<dyn Nested>,
    /// Woken when a batch offered agent tasks (agents long-polling a queue lease again).
    offered: Arc<tokio::sync::Notify>,
    /// Bumped after each committed batch that wrote anything (followers of the feed).
    pub(crate) committed: Arc<tokio::sync::watch::Sender<u64>>,
    held: HashMap<i64, Slot>,
    ops: Vec<Op>,
    pending: Vec<Pending>,
    waiters: Waiters,
    /// Callers waiting for operations to end, told what may have ended them.
    ops_watch: OpWatch,
    shutdown: Option<oneshot::Sender<()>>,
    next_due: Option<Millis>,
    last_renew: Millis,
    last_supervise: Millis,
    /// The periodic pruning job.
    prune: prune::PruneJob,
    /// Where it archives entities before removing them, if anywhere.
    pub(crate) archive: crate::archive::Shared,
    claim_now: bool,
    /// The last claim took all it could: older due work may be waiting, so the next batch's
    /// creates, and the entities at rest it raises on, are not leased ahead of it
    /// ([`Claim::take_created`], [`Claim::take_raised`]).
    claim_full: bool,
    /// The limit of the claim of the batch last taken.
    claim_limit: usize,
    /// The machines this engine serves: it claims only their entities.
    served: Vec<String>,
    /// Woken when another process may have made work due.
    wakeup: Arc<tokio::sync::Notify>,
    stats: Stats,
    /// The commits that landed, when a simulation records them.
    landed: Option<Vec<(i64, i64)>>,
    /// Tasks started that answer with a message ([`Scheduler::next_task`]).
    tasks: u64,
    /// Actions waiting for a sync nested event's outcome ([`NestedHandle`]).
    nested_waiting: Arc<std::sync::atomic::AtomicU64>,
    /// Told once the next batch is written (`Msg::Barrier`).
    barriers: Vec<oneshot::Sender<()>>,
    /// Whether the batch being acted on is not durable yet: what it tells callers waits
    /// in `answers` until it is ([`Store::write_committed`]).
    deferring: bool,
    /// The answers to callers of the batch being acted on: sent once it is acted on, or,
    /// while `deferring`, once it is durable.
    answers: Vec<Answer>,
}

/// Counters of the scheduler's work, logged at shutdown (`SETTLE_LOG=settle_engine=debug`).
#[derive(Debug, Default)]
struct Stats {
    batches: u64,
    ops: u64,
    claimed: u64,
    write_micros: u64,
}

impl<S: Store + Clone> Scheduler<S> {
    pub(crate) fn new(
        store: S,
        registries: Arc<Registries>,
        config: Config,
        tx: mpsc::UnboundedSender<Msg>,
        offered: Arc<tokio::sync::Notify>,
        hub: Option<Hub>,
        ops_watch: OpWatch,
    ) -> Self {
        let nested_waiting = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let (generation, registry) = (registries.generation(), registries.load());
        let nested = Arc::new(NestedHandle {
            tx: tx.clone(),
            store: store.clone(),
            registries: registries.clone(),
            lease: config.lease,
            hub,
            waiting: nested_waiting.clone(),
        });
        let clock = config.clock.clone();
        let now = clock.now_ms();
        Scheduler {
            store,
            served: registry.served_names(),
            registry,
            registries,
            generation,
            config,
            clock,
            tx,
            nested,
            offered,
            committed: Arc::new(tokio::sync::watch::Sender::new(0)),
            held: HashMap::new(),
            ops: Vec::new(),
            pending: Vec::new(),
            waiters: Waiters::default(),
            ops_watch,
            shutdown: None,
            next_due: None,
            last_renew: now,
            last_supervise: now,
            prune: prune::PruneJob::new(now),
            archive: None,
            claim_now: true,
            claim_full: true,
            claim_limit: 0,
            wakeup: Arc::new(tokio::sync::Notify::new()),
            stats: Stats::default(),
            landed: None,
            tasks: 0,
            nested_waiting,
            barriers: Vec::new(),
            deferring: false,
            answers: Vec::new(),
        }
    }

    fn lease_ms(&self) -> i64 {
        self.config.lease.as_millis() as i64
    }

    /// Takes up the registry a deploy replaced (entities claimed from now on run under
    /// it; those held keep the version they hold).
    fn refresh_registry(&mut self) {
        let generation = self.registries.generation();
        if generation != self.generation {
            self.registry = self.registries.load();
            self.generation = generation;
            self.served = self.registry.served_names();
        }
    }

    pub(crate) async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Msg>) {
        // Another process may make work due (PostgreSQL's NOTIFY): claim at once then.
        let wakeup = self.store.wakeup().unwrap_or_else(|| Arc::new(tokio::sync::Notify::new()));
        self.wakeup = wakeup.clone();
        // The last batch written, not yet acted on: the next one goes to the store first,
        // so that the writer writes it while this loop acts on the last.
        let mut written: Option<batch::Written> = None;
        loop {
            // A barrier is answered by the next batch started (or at once, with nothing to
            // write): it never waits for a wake-up.
            if written.is_none() && self.ops.is_empty() && !self.claim_now && self.barriers.is_empty() {
                self.answer_quiet();
                if self.shutdown.is_some() && self.held.is_empty() {
                    break;
                }
                let wake_at = self.wake_at();
                tokio::select! {
                    msg = rx.recv() => match msg {
                        Some(msg) => self.on_msg(msg),
                        None => break,
                    },
                    _ = self.clock.sleep_until(wake_at) => self.claim_now = true,
                    _ = wakeup.notified() => self.claim_now = true,
                }
            }
            while let Ok(msg) = rx.try_recv() {
                self.on_msg(msg);
            }
            self.refresh_registry();
            self.maybe_renew();
            self.maybe_supervise();
            self.maybe_prune();
            let next = if written.is_none() || !self.ops.is_empty() || self.claim_now || !self.barriers.is_empty() {
                self.start_batch(written.as_ref())
            } else {
                None
            };
            if let Some(last) = written.take() {
                self.act_on(last);
            }
            if let Some(next) = next {
                written = Some(next.written().await);
            }
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

    /// When to look for work without being told: the next due time, the supervisor's next
    /// round, the next lease renewal while entities are held, or the fallback poll,
    /// whichever comes first.
    fn wake_at(&self) -> Millis {
        let poll = self.clock.now_ms() + self.config.poll.as_millis() as Millis;
        let mut at = self.next_due.map_or(poll, |due| due.min(poll)).min(self.next_supervise()).min(self.next_prune());
        if !self.held.is_empty() {
            at = at.min(self.last_renew + self.lease_ms() / 3);
        }
        at
    }

    /// Answers callers waiting for the engine to go idle (nothing held, queued or
    /// scheduled) or to catch up with its clock (nothing held or queued, nothing due yet,
    /// the supervisor's round done).
    fn answer_quiet(&mut self) {
        if !self.waiters.want_quiet() || !self.held.is_empty() || !self.ops.is_empty() {
            return;
        }
        let now = self.clock.now_ms();
        let caught_up = self.next_due.is_none_or(|due| due > now)
            && self.next_supervise() > now
            && self.next_prune() > now
            && !self.prune.archiving;
        self.waiters.answer_quiet(self.next_due.is_none(), caught_up.then_some(self.next_due));
    }

    pub(crate) fn on_msg(&mut self, msg: Msg) {
        let msg = if self.config.read_only {
            match refuse_when_read_only(msg) {
                Some(msg) => msg,
                None => return,
            }
        } else {
            msg
        };
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
                self.waiters.prune();
                let nested = push.kind == settle_store::InboxKind::Nested && done.is_some();
                let deadline = nested.then(|| self.clock.now_ms() + self.lease_ms());
                self.ops.push(Op::Push(push));
                self.pending.push(Pending::Raise { ack, wait, done, deadline });
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
            Msg::Cancel { op, reply } => {
                self.ops.push(op);
                self.pending.push(Pending::Cancel(reply));
            }
            Msg::Prune { op, reply } => {
                self.ops.push(op);
                self.pending.push(Pending::Prune(reply));
            }
            Msg::PruneArchived(next) => self.archived(next),
            Msg::ActionDone { entity_id, version, result, .. } => self.on_action_done(entity_id, version, result),
            Msg::HooksDone { entity_id, version, hooks, result, .. } => {
                self.on_hooks_done(entity_id, version, *hooks, result)
            }
            Msg::Evaluated { entity_id, version, result, .. } => self.on_evaluated(entity_id, version, result),
            Msg::Barrier(tx) => self.barriers.push(tx),
            Msg::WhenIdle(tx) => {
                self.waiters.on_idle(tx);
                // Recompute the due time: the caller may have written work we have not seen.
                self.claim_now = true;
            }
            Msg::WhenCaughtUp(tx) => {
                self.waiters.on_caught_up(tx);
                // Only this engine writes an exclusive store: the due time of its last batch
                // is exact. Otherwise another process may have made work due: claim.
                self.claim_now |= !self.store.exclusive();
            }
            Msg::Watch { entity_id, states, reply, registered } => {
                self.waiters.on_state(entity_id, states, reply);
                let _ = registered.send(());
            }
            Msg::Shutdown(tx) => self.shutdown = Some(tx),
        }
    }

    /// The entities held with a handler, their hooks or an evaluation running, by id and
    /// version: each answers with one message.
    pub(crate) fn running(&self) -> Vec<(i64, i64)> {
        let mut ids: Vec<(i64, i64)> =
            self.held.iter().filter(|(_, s)| s.running.is_some()).map(|(id, s)| (*id, s.held.entity.version)).collect();
        ids.sort_unstable();
        ids
    }

    /// Numbers a task that will answer with one message (handler, hooks, evaluation).
    fn next_task(&mut self) -> u64 {
        self.tasks += 1;
        self.tasks
    }

    /// How many tasks this scheduler has started that answer with a message.
    pub(crate) fn tasks(&self) -> u64 {
        self.tasks
    }

    /// How many of its actions wait for a sync nested event's outcome now.
    pub(crate) fn nested_waiting(&self) -> u64 {
        self.nested_waiting.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The store this scheduler writes.
    pub(crate) fn store(&self) -> &S {
        &self.store
    }

    /// The ids of the entities held, in order.
    pub(crate) fn held_ids(&self) -> Vec<i64> {
        let mut ids: Vec<i64> = self.held.keys().copied().collect();
        ids.sort_unstable();
        ids
    }

    /// Operations queued for the next batch.
    pub(crate) fn queued(&self) -> usize {
        self.ops.len()
    }

    /// Starts recording the commits that land and make a new version of their entity (a
    /// state entry or an internal transition): a simulation checks that no version of an
    /// entity is made twice.
    pub(crate) fn record_landed(&mut self) {
        self.landed = Some(Vec::new());
    }

    /// The commits recorded since the last call.
    pub(crate) fn take_landed(&mut self) -> Vec<(i64, i64)> {
        self.landed.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// The batch as a whole failed: nothing of it is visible. Callers get the error;
    /// entities whose commit was lost are dropped and come back when their lease expires.
    pub(crate) fn on_store_error(&mut self, pending: Vec<Pending>, e: settle_store::Error) {
        tracing::error!(error = %e, "store write failed");
        let msg = e.to_string();
        let err = || Error::Store(settle_store::Error::Db(msg.clone()));
        for p in pending {
            match p {
                Pending::Create(reply) => {
                    let _ = reply.send(Err(err()));
                }
                Pending::Raise { ack, .. } => {
                    let _ = ack.send(Err(err()));
                }
                Pending::Command { reply, .. } => {
                    let _ = reply.send(Err(err()));
                }
                Pending::Agent(reply) | Pending::Cancel(reply) => {
                    let _ = reply.send(Err(err()));
                }
                Pending::Commit(expect) => {
                    self.held.remove(&expect.entity_id);
                }
                Pending::Acquire(id) => {
                    self.held.remove(&id);
                }
                Pending::Release | Pending::Renew | Pending::Supervise => {}
                Pending::Prune(reply) => {
                    let _ = reply.send(Err(err()));
                }
                Pending::PruneJob(_) => self.prune.running = false,
            }
        }
        self.claim_now = false;
        self.next_due = Some(self.clock.now_ms() + 1_000);
    }

    fn on_result(&mut self, pending: Vec<Pending>, result: BatchResult) {
        self.next_due = result.next_due;
        // Operator commands, agents' reports and the supervisor may end operations that no
        // commit of this batch names: operation waiters look at theirs.
        if self.ops_watch.anyone()
            && pending.iter().zip(&result.results).any(|(p, r)| {
                r.is_ok()
                    && matches!(
                        p,
                        Pending::Command { .. } | Pending::Agent(_) | Pending::Cancel(_) | Pending::Supervise
                    )
            })
        {
            self.ops_watch.anything();
        }
        for (p, r) in pending.into_iter().zip(result.results) {
            match p {
                Pending::Create(reply) => {
                    self.answer_send(
                        reply,
                        r.map_err(op_error).map(|a| match a {
                            Applied::Created(e) => Some(e),
                            Applied::Replayed { .. } => None,
                            other => unreachable!("create answered with {other:?}"),
                        }),
                    );
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
                    self.answer_send(reply, answer);
                }
                Pending::Raise { ack, wait, done, deadline } => match r {
                    Ok(Applied::Pushed { inbox_id, entity_id }) => {
                        if let Some(done) = done {
                            self.waiters.on_outcome(inbox_id, wait, done, deadline);
                        }
                        self.answer_send(ack, Ok(Some((inbox_id, entity_id))));
                    }
                    Ok(Applied::Replayed { .. }) => {
                        self.answer_send(ack, Ok(None));
                    }
                    Ok(other) => unreachable!("push answered with {other:?}"),
                    Err(e) => {
                        self.answer_send(ack, Err(op_error(e)));
                    }
                },
                Pending::Commit(expect) => self.on_committed(*expect, r),
                Pending::Acquire(id) => self.on_acquired(id, r),
                Pending::Agent(reply) => {
                    self.answer_send(reply, r.map_err(op_error));
                }
                Pending::Cancel(reply) => {
                    if let Ok(Applied::Canceled { entity, .. }) = &r
                        && self.held.get(&entity.id).is_some_and(|s| s.held.entity.version != entity.version)
                    {
                        // Its work was stopped: whatever runs for it now can never commit.
                        self.held.remove(&entity.id);
                    }
                    self.answer_send(reply, r.map_err(op_error));
                }
                Pending::Release | Pending::Renew => {
                    if let Err(e) = r {
                        tracing::warn!(error = %e, "lease operation failed");
                    }
                }
                Pending::Prune(reply) => {
                    self.answer_send(
                        reply,
                        r.map_err(op_error).map(|a| match a {
                            Applied::Pruned(p) => *p,
                            other => unreachable!("a round of pruning answers Pruned, not {other:?}"),
                        }),
                    );
                }
                Pending::PruneJob(p) => self.pruned(&p, r),
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
            let (hash, machine) = match self.registry.version_of(&c.entity) {
                Ok(v) => v,
                Err(_) => {
                    tracing::warn!(machine = %c.entity.machine, key = %c.entity.key, "claimed an entity of a machine this engine does not know; leaving it to its lease expiry");
                    continue;
                }
            };
            let mut held = Held::new(machine, c.entity, c.inbox_head, c.trigger);
            held.hash = Some(hash);
            self.held.insert(id, Slot { held, running: None });
            self.advance(id);
        }
    }

    fn on_committed(&mut self, mut expect: Expect, r: std::result::Result<Applied, OpError>) {
        let id = expect.entity_id;
        match r {
            Ok(Applied::Committed { held: still_held, version, inbox_head, acquired, .. }) => {
                let now = self.clock.now_ms();
                let Some(slot) = self.held.get_mut(&id) else { return };
                match acquired.as_deref() {
                    Some(Applied::Acquired) => slot.held.slots = true,
                    Some(Applied::Waiting { limit, .. }) => crate::metrics::limit_waited(limit),
                    _ => {}
                }
                if let Some(landed) = &mut self.landed
                    && version != slot.held.entity.version
                {
                    landed.push((id, version));
                }
                if let Some((state, _, _)) = &expect.entry {
                    let e = &slot.held.entity;
                    crate::metrics::transition(&e.machine, &e.state, state);
                }
                let at_rest = expect.apply(&mut slot.held, version, now);
                let told = self.waiters.committed(id, &expect, &slot.held.entity, at_rest);
                self.answers.extend(told);
                if self.ops_watch.anyone() {
                    // The commit may have ended its own operation, the one its entity
                    // works for, or that of the event it processed.
                    if expect.notices {
                        // Its notices carry the request ids of the successors' operations.
                        self.ops_watch.anything();
                    }
                    let item = expect.item.as_ref().and_then(|i| i.request_id.as_ref());
                    let mut told: Vec<&String> = Vec::with_capacity(3);
                    for r in
                        [expect.request_id.as_ref(), slot.held.entity.request_id.as_ref(), item].into_iter().flatten()
                    {
                        if !told.contains(&r) {
                            self.ops_watch.maybe_ended(r);
                            told.push(r);
                        }
                    }
                }
                match expect.after {
                    AfterCommit::Release => {
                        self.held.remove(&id);
                    }
                    AfterCommit::Hold if !still_held => {
                        // Paused, put to sleep or parked meanwhile: the store released it.
                        self.held.remove(&id);
                    }
                    AfterCommit::Hold => {
                        slot.held.inbox_head = inbox_head;
                        self.advance(id);
                    }
                }
            }
            // Its workflow's slots were not free (or it was stopped meanwhile): not applied;
            // it waits in line at rest, its lease dropped with the ask.
            Ok(Applied::Waiting { limit, .. }) => {
                crate::metrics::limit_waited(&limit);
                self.held.remove(&id);
            }
            Ok(Applied::Released) => {
                self.held.remove(&id);
            }
            Ok(other) => unreachable!("commit answered with {other:?}"),
            Err(OpError::LeaseLost { .. }) => {
                crate::metrics::lease_lost();
                tracing::warn!(entity = id, "lease lost; another engine owns the entity now");
                self.held.remove(&id);
            }
            Err(e) => {
                // An effect or precondition failed: nothing is visible; record a fault.
                let env = decide_env!(self);
                let Some(slot) = self.held.get_mut(&id) else { return };
                let d = decide::commit_failed(&mut slot.held, expect, e.to_string(), &env);
                self.push(d);
            }
        }
    }

    /// Decides and starts the next step of a held entity.
    fn advance(&mut self, id: i64) {
        let env = decide_env!(self);
        let Some(slot) = self.held.get_mut(&id) else { return };
        if slot.running.is_some() {
            return;
        }
        let next = decide::next(&mut slot.held, &env);
        self.carry_out(id, next);
    }

    /// Carries out a decided next step.
    fn carry_out(&mut self, id: i64, next: Next) {
        match next {
            Next::Commit(d) => self.push(*d),
            Next::Run { action, item } => self.spawn_action(id, Arc::from(action), item),
            Next::Hooks(hooks) => self.spawn_hooks(id, *hooks),
            Next::Evaluate { notice } => self.evaluate(id, notice),
            Next::Acquire(a) => self.acquire(id, a),
            Next::Release => self.release(id),
        }
    }

    /// Drops the lease of a held entity.
    fn release(&mut self, id: i64) {
        let Some(slot) = self.held.remove(&id) else { return };
        let e = &slot.held.entity;
        let fence = settle_store::Fence { entity_id: e.id, version: e.version, owner: self.config.owner.clone() };
        self.ops.push(Op::Release(fence));
        self.pending.push(Pending::Release);
    }

    /// Queues a decided commit for the next batch, with the replies it owes to sync nested
    /// events whose workflows it ends, and logs and counts what it notes.
    fn push(&mut self, mut d: Decided) {
        // Decided under the newest registry: a deploy's version moves this commit's entity.
        self.refresh_registry();
        if let Some(slot) = self.held.get_mut(&d.commit.fence.entity_id) {
            limits::leaving(&mut slot.held, &mut d.commit);
        }
        let held = self.held.get(&d.commit.fence.entity_id).map(|s| &s.held);
        let mut moved = None;
        if let Some(held) = held {
            let replies = decide::replies(held, &d.commit, &self.registry);
            d.commit.pushes.extend(replies);
            d.commit.trim = self.trim_for(&held.entity, &d.commit);
            // An entity under an older version moves to the current one when it may.
            moved = decide::upgrade(held, &mut d.commit, &self.registry);
            if moved.is_none() {
                // Entering a limited state to run its action next: the slots go with it.
                d.commit.acquire = decide::entry_slots(held, &d.commit, self.clock.now_ms());
            }
        }
        if let Some(note) = &d.note {
            record(note, held.map(|h| &h.entity));
        }
        d.commit.consumes_internal = d
            .item
            .as_ref()
            .is_some_and(|i| i.kind == settle_store::InboxKind::Internal && d.commit.consume == Some(i.id));
        let mut expect = d.expect();
        expect.version = moved;
        self.ops.push(Op::Commit(Box::new(d.commit)));
        self.pending.push(Pending::Commit(Box::new(expect)));
    }
}

/// Logs and counts what a decision notes, about the entity `e` (when still held).
fn record(note: &Note, e: Option<&settle_store::EntityRow>) {
    let (machine, key, state) = match e {
        Some(e) => (e.machine.as_str(), e.key.as_str(), e.state.as_str()),
        None => ("", "", ""),
    };
    match note {
        Note::Rejected { event, reason, request_id } => {
            crate::metrics::rejected(machine, event);
            tracing::debug!(request_id = ?request_id, machine, key, event = %event, reason = %reason, "event rejected");
        }
        Note::Fault { kind, details, parked } => {
            crate::metrics::fault(machine, kind, *parked);
            tracing::warn!(machine, key, state, error = %details, parked, "action fault");
        }
        Note::ReportDropped { task, stale: true } => {
            tracing::debug!(machine, key, task = ?task, "agent report for an earlier state entry; dropped");
        }
        Note::ReportDropped { stale: false, .. } => {
            tracing::warn!(machine, key, "agent report for a state without an agent action; dropped");
        }
    }
}

fn op_error(e: OpError) -> Error {
    match e {
        OpError::NotFound { machine, key } => Error::NotFound { machine, key },
        OpError::AlreadyExists { machine, key } => Error::AlreadyExists { machine, key },
        OpError::Killed { machine, key } => Error::Killed { machine, key },
        OpError::Task(refusal) => Error::Task(refusal),
        other => Error::Store(settle_store::Error::Db(other.to_string())),
    }
}

/// A read-only engine's answer to `msg`: a write is refused (`None`: answered), anything
/// else (a dry run of pruning, waits, barriers, what its own tasks report) goes on.
fn refuse_when_read_only(msg: Msg) -> Option<Msg> {
    match msg {
        Msg::Create { reply, .. } => drop(reply.send(Err(Error::ReadOnly("create")))),
        Msg::Raise { ack, .. } => drop(ack.send(Err(Error::ReadOnly("raise")))),
        Msg::Command { reply, .. } => drop(reply.send(Err(Error::ReadOnly("command")))),
        Msg::Agent { reply, .. } => drop(reply.send(Err(Error::ReadOnly("agent task")))),
        Msg::Cancel { reply, .. } => drop(reply.send(Err(Error::ReadOnly("cancel")))),
        Msg::Prune { op: Op::Prune(p), reply } if !p.dry_run => drop(reply.send(Err(Error::ReadOnly("prune")))),
        msg => return Some(msg),
    }
    None
}
