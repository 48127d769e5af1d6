//! The scheduler: the engine's single writer and dispatcher.
//!
//! One loop: wait for a message (or the next due time), take every message waiting,
//! turn them into store operations, write them all as one batch with a claim of due
//! entities, then act on the results — answer callers, start the next action of each
//! entity it holds, release the ones at rest. While a batch is being written, new work
//! queues up for the next one: that is the group commit, with no artificial delay.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use settle_core::step::{self, EventStep};
use settle_core::{Action, Machine, StateKind};
use settle_store::{
    AfterCommit, Applied, Batch, BatchResult, Claim, Commit, EntityRow, Fence, HistoryKind, InboxItem, NewEntity, Op,
    OpError, Push, Store,
};
use tokio::sync::{mpsc, oneshot};

use crate::engine::{Config, EventOutcome, Registry, Wait};
use crate::error::{Error, Result};
use crate::handler::{ActionContext, CatchUnwind, Outcome};
use crate::now_ms;

type DoneTx = oneshot::Sender<(EventOutcome, EntityRow)>;

pub(crate) enum Msg {
    Create { new: NewEntity, reply: oneshot::Sender<Result<EntityRow>> },
    Raise { push: Push, wait: Wait, ack: oneshot::Sender<Result<i64>>, done: Option<DoneTx> },
    ActionDone { entity_id: i64, version: i64, result: std::result::Result<Outcome, String> },
    WhenIdle(oneshot::Sender<()>),
    Shutdown(oneshot::Sender<()>),
}

/// What to do with the result of an operation once its batch is written.
enum Pending {
    Create(oneshot::Sender<Result<EntityRow>>),
    Raise { ack: oneshot::Sender<Result<i64>>, wait: Wait, done: Option<DoneTx> },
    Commit(Box<CommitCtx>),
    Release,
    Renew,
}

/// A commit in flight: what its success changes in the in-memory snapshot, and what to
/// tell callers. The commit itself goes to the store; only these few fields are kept.
struct CommitCtx {
    entity_id: i64,
    /// The state entered, its retry count and auto action time (`None`: no state change).
    entry: Option<(settle_core::StateName, u32, Option<i64>)>,
    properties: Option<settle_core::Properties>,
    request_id: Option<String>,
    after: AfterCommit,
    /// The event processed, if any.
    item: Option<InboxItem>,
    /// The action that ran (for turning a failed commit into a fault).
    action: Option<settle_core::ActionName>,
    outcome: Option<EventOutcome>,
}

/// An entity this engine holds the lease of.
struct Held {
    machine: Arc<Machine>,
    entity: EntityRow,
    /// The next inbox event, when known.
    inbox_head: Option<InboxItem>,
    /// The action running, with the event that triggered it.
    running: Option<(Arc<Action>, Option<InboxItem>)>,
}

pub(crate) struct Scheduler<S> {
    store: S,
    registry: Arc<Registry>,
    config: Config,
    tx: mpsc::UnboundedSender<Msg>,
    held: HashMap<i64, Held>,
    ops: Vec<Op>,
    pending: Vec<Pending>,
    /// Callers waiting for the outcome of an inbox event, by inbox id.
    outcome_waiters: HashMap<i64, (Wait, DoneTx)>,
    /// Callers waiting for an entity to come to rest, by entity id.
    rest_waiters: HashMap<i64, Vec<(EventOutcome, DoneTx)>>,
    idle_waiters: Vec<oneshot::Sender<()>>,
    shutdown: Option<oneshot::Sender<()>>,
    next_due: Option<i64>,
    last_renew: i64,
    claim_now: bool,
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

impl<S: Store> Scheduler<S> {
    pub(crate) fn new(store: S, registry: Arc<Registry>, config: Config, tx: mpsc::UnboundedSender<Msg>) -> Self {
        Scheduler {
            store,
            registry,
            config,
            tx,
            held: HashMap::new(),
            ops: Vec::new(),
            pending: Vec::new(),
            outcome_waiters: HashMap::new(),
            rest_waiters: HashMap::new(),
            idle_waiters: Vec::new(),
            shutdown: None,
            next_due: None,
            last_renew: now_ms(),
            claim_now: true,
            stats: Stats::default(),
        }
    }

    fn lease_ms(&self) -> i64 {
        self.config.lease.as_millis() as i64
    }

    pub(crate) async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Msg>) {
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
                }
            }
            while let Ok(msg) = rx.try_recv() {
                self.on_msg(msg);
            }
            self.maybe_renew();
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
                self.ops.push(Op::Push(push));
                self.pending.push(Pending::Raise { ack, wait, done });
            }
            Msg::ActionDone { entity_id, version, result } => self.on_action_done(entity_id, version, result),
            Msg::WhenIdle(tx) => {
                self.idle_waiters.push(tx);
                // Recompute the due time: the caller may have written work we have not seen.
                self.claim_now = true;
            }
            Msg::Shutdown(tx) => self.shutdown = Some(tx),
        }
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
        });
        if self.ops.is_empty() && claim.is_none() {
            self.claim_now = false;
            return;
        }
        self.claim_now = false;
        let ops = std::mem::take(&mut self.ops);
        let pending = std::mem::take(&mut self.pending);
        let batch = Batch { now: now_ms(), ops, claim };
        self.stats.batches += 1;
        self.stats.ops += batch.ops.len() as u64;
        let started = std::time::Instant::now();
        let written = self.store.write(batch).await;
        self.stats.write_micros += started.elapsed().as_micros() as u64;
        if let Ok(r) = &written {
            self.stats.claimed += r.claimed.len() as u64;
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
                Pending::Commit(ctx) => {
                    self.held.remove(&ctx.entity_id);
                }
                Pending::Release | Pending::Renew => {}
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
                        Applied::Created(e) => e,
                        other => unreachable!("create answered with {other:?}"),
                    }));
                }
                Pending::Raise { ack, wait, done } => match r {
                    Ok(Applied::Pushed { inbox_id, .. }) => {
                        if let Some(done) = done {
                            self.outcome_waiters.insert(inbox_id, (wait, done));
                        }
                        let _ = ack.send(Ok(inbox_id));
                    }
                    Ok(other) => unreachable!("push answered with {other:?}"),
                    Err(e) => {
                        let _ = ack.send(Err(op_error(e)));
                    }
                },
                Pending::Commit(ctx) => self.on_committed(*ctx, r),
                Pending::Release | Pending::Renew => {
                    if let Err(e) = r {
                        tracing::warn!(error = %e, "lease operation failed");
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
            self.held.insert(id, Held { machine, entity: c.entity, inbox_head: c.inbox_head, running: None });
            self.advance(id);
        }
    }

    fn on_committed(&mut self, mut ctx: CommitCtx, r: std::result::Result<Applied, OpError>) {
        let id = ctx.entity_id;
        match r {
            Ok(Applied::Committed { version, inbox_head, .. }) => {
                let Some(held) = self.held.get_mut(&id) else { return };
                let e = &mut held.entity;
                e.version = version;
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
                if at_rest && let Some(waiters) = self.rest_waiters.remove(&id) {
                    for (outcome, done) in waiters {
                        let _ = done.send((outcome, snapshot.clone()));
                    }
                }
                match ctx.after {
                    AfterCommit::Release => {
                        self.held.remove(&id);
                    }
                    AfterCommit::Hold { .. } => {
                        if let Some(held) = self.held.get_mut(&id) {
                            held.inbox_head = inbox_head;
                        }
                        self.advance(id);
                    }
                }
            }
            Ok(other) => unreachable!("commit answered with {other:?}"),
            Err(OpError::LeaseLost { .. }) => {
                tracing::warn!(entity = id, "lease lost; another engine owns the entity now");
                self.held.remove(&id);
            }
            Err(e) => {
                // An effect failed: nothing is visible; record a fault and re-enter.
                let action = ctx.action.clone();
                self.fault(id, ctx.item, action.as_deref(), format!("commit failed: {e}"));
            }
        }
    }

    /// Decides and starts the next step of a held entity.
    fn advance(&mut self, id: i64) {
        let Some(held) = self.held.get_mut(&id) else { return };
        if held.running.is_some() {
            return;
        }
        let machine = held.machine.clone();
        let now = now_ms();
        if let Some(item) = held.inbox_head.take() {
            let has_handler = |action: &str| self.registry.handler(machine.name(), &action.into()).is_some();
            let action_name = machine.event(&item.event).map(|e| e.action.clone());
            let step = step::on_event(
                &machine,
                &held.entity.state,
                &item.event,
                action_name.as_deref().is_some_and(has_handler),
            );
            match step {
                EventStep::Reject(rejection) => {
                    let outcome =
                        EventOutcome::Rejected { state: rejection.state.clone(), reason: rejection.reason.clone() };
                    let after = self.after_unchanged(id, now);
                    let held = &self.held[&id];
                    let commit = Commit {
                        fence: fence(&held.entity, &self.config.owner),
                        from: held.entity.state.clone(),
                        to: None,
                        retry: held.entity.retry,
                        auto_at: None,
                        properties: None,
                        kind: HistoryKind::Rejected,
                        action: None,
                        event: Some(item.event.clone()),
                        consume: Some(item.id),
                        request_id: item.request_id.clone(),
                        detail: Some(rejection.reason),
                        after,
                        sql: vec![],
                        creates: vec![],
                        pushes: vec![],
                    };
                    self.push_commit(commit, Some(item), None, Some(outcome));
                }
                EventStep::Plain { action, target } => {
                    let action = Arc::new(action.clone());
                    self.finish_action(id, &action, Some(item), Outcome::to(target));
                }
                EventStep::Run { action } => {
                    let action = Arc::new(action.clone());
                    self.spawn_action(id, action, Some(item));
                }
            }
            return;
        }
        let state_unstable = machine.state(&held.entity.state).is_some_and(|s| s.kind == StateKind::Unstable);
        if state_unstable && held.entity.auto_at.is_none_or(|at| at <= now) {
            let auto = machine.state(&held.entity.state).and_then(|s| s.auto.clone()).expect("unstable state has auto");
            let has_handler = self.registry.handler(machine.name(), &auto).is_some();
            match step::on_auto(&machine, &held.entity.state, has_handler) {
                Some(EventStep::Plain { action, target }) => {
                    let action = Arc::new(action.clone());
                    self.finish_action(id, &action, None, Outcome::to(target));
                }
                Some(EventStep::Run { action }) => {
                    let action = Arc::new(action.clone());
                    self.spawn_action(id, action, None);
                }
                _ => unreachable!("an unstable state's auto step is plain or run"),
            }
            return;
        }
        // Nothing to do now: release; the store keeps the due time of the auto action.
        let fence = fence(&held.entity, &self.config.owner);
        self.held.remove(&id);
        self.ops.push(Op::Release(fence));
        self.pending.push(Pending::Release);
    }

    /// After a commit that changes no state: keep going if the auto action is due now.
    fn after_unchanged(&self, id: i64, now: i64) -> AfterCommit {
        let held = &self.held[&id];
        let unstable = held.machine.state(&held.entity.state).is_some_and(|s| s.kind == StateKind::Unstable);
        if unstable && held.entity.auto_at.is_none_or(|at| at <= now) {
            AfterCommit::Hold { lease_ms: self.lease_ms() }
        } else {
            AfterCommit::Release
        }
    }

    fn spawn_action(&mut self, id: i64, action: Arc<Action>, item: Option<InboxItem>) {
        let held = self.held.get_mut(&id).expect("held entity");
        let handler = self.registry.handler(held.machine.name(), &action.name).expect("run step has a handler").clone();
        let e = &held.entity;
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
        };
        let version = e.version;
        held.running = Some((action, item));
        // Poll once in place: an action that completes at once (a no-op, a cache hit)
        // commits in this round instead of a task and a message later.
        let mut fut = CatchUnwind(handler(ctx));
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

    fn on_action_done(&mut self, id: i64, version: i64, result: std::result::Result<Outcome, String>) {
        let Some(held) = self.held.get_mut(&id) else { return };
        if held.entity.version != version {
            return;
        }
        let Some((action, item)) = held.running.take() else { return };
        match result {
            Ok(outcome) => self.finish_action(id, &action, item, outcome),
            Err(error) => self.fault(id, item, Some(&action.name), error),
        }
    }

    /// Turns an action's outcome into a commit, or a fault if the core refuses it.
    fn finish_action(&mut self, id: i64, action: &Action, item: Option<InboxItem>, outcome: Outcome) {
        let now = now_ms();
        let held = &self.held[&id];
        let machine = held.machine.clone();
        let e = &held.entity;
        let from = machine.state(&e.state).expect("entity state exists in its machine");
        let mut props = e.properties.clone();
        step::apply_changes(&mut props, &outcome.changes);
        let entry = match step::enter(&machine, from, action, outcome.target(), outcome.delay, e.retry, &props) {
            Ok(entry) => entry,
            Err(refusal) => return self.fault(id, item, Some(&action.name), refusal.to_string()),
        };
        let request_id = item.as_ref().and_then(|i| i.request_id.clone()).or_else(|| e.request_id.clone());
        let mut creates = Vec::with_capacity(outcome.creates.len());
        for c in &outcome.creates {
            match self.registry.machine(&c.machine).map_err(|e| e.to_string()).and_then(|m| {
                step::initial_entry(m, &c.properties).map_err(|r| r.to_string()).map(|entry| NewEntity {
                    machine: c.machine.clone(),
                    key: c.key.clone(),
                    state: entry.state,
                    properties: c.properties.clone(),
                    auto_at: entry.auto_delay.map(|d| now + d.as_millis() as i64),
                    request_id: request_id.clone(),
                })
            }) {
                Ok(new) => creates.push(new),
                Err(err) => return self.fault(id, item, Some(&action.name), err),
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
                return self.fault(id, item, Some(&action.name), err);
            }
            pushes.push(Push {
                machine: r.machine.clone(),
                key: r.key.clone(),
                event: r.event.clone(),
                params: r.params.clone(),
                request_id: request_id.clone(),
            });
        }
        let after = match entry.auto_delay {
            Some(d) if d.is_zero() => AfterCommit::Hold { lease_ms: self.lease_ms() },
            _ => AfterCommit::Release,
        };
        let outcome_for_caller = item.as_ref().map(|_| EventOutcome::Accepted { state: entry.state.clone() });
        let held = &self.held[&id];
        let commit = Commit {
            fence: fence(&held.entity, &self.config.owner),
            from: held.entity.state.clone(),
            to: Some(entry.state.clone()),
            retry: entry.retry,
            auto_at: entry.auto_delay.map(|d| now + d.as_millis() as i64),
            properties: (props != held.entity.properties).then_some(props),
            kind: if item.is_some() { HistoryKind::Event } else { HistoryKind::Auto },
            action: Some(action.name.clone()),
            event: item.as_ref().map(|i| i.event.clone()),
            consume: item.as_ref().map(|i| i.id),
            request_id,
            detail: None,
            after,
            sql: outcome.sql,
            creates,
            pushes,
        };
        self.push_commit(commit, item, Some(action.name.clone()), outcome_for_caller);
    }

    /// An action failed (error, panic, refused outcome, failed commit). An event's action
    /// consumes the event and changes nothing; an auto action re-enters its state after a
    /// backoff, counting the retry.
    fn fault(&mut self, id: i64, item: Option<InboxItem>, action: Option<&str>, error: String) {
        let now = now_ms();
        let Some(held) = self.held.get(&id) else { return };
        tracing::warn!(machine = %held.entity.machine, key = %held.entity.key, state = %held.entity.state, error = %error, "action fault");
        let e = &held.entity;
        let base = Commit {
            fence: fence(e, &self.config.owner),
            from: e.state.clone(),
            to: None,
            retry: e.retry,
            auto_at: None,
            properties: None,
            kind: HistoryKind::Fault,
            action: action.map(Into::into),
            event: item.as_ref().map(|i| i.event.clone()),
            consume: item.as_ref().map(|i| i.id),
            request_id: item.as_ref().and_then(|i| i.request_id.clone()).or_else(|| e.request_id.clone()),
            detail: Some(error.clone()),
            after: AfterCommit::Release,
            sql: vec![],
            creates: vec![],
            pushes: vec![],
        };
        let (commit, outcome) = if item.is_some() {
            let after = self.after_unchanged(id, now);
            (Commit { after, ..base }, Some(EventOutcome::Failed { error }))
        } else {
            let retry = e.retry + 1;
            let backoff = step::fault_backoff(retry);
            (Commit { to: Some(e.state.clone()), retry, auto_at: Some(now + backoff.as_millis() as i64), ..base }, None)
        };
        // A fault commit has no effects, so it can only fail by losing the lease.
        self.push_commit(commit, item, None, outcome);
    }

    fn push_commit(
        &mut self,
        commit: Commit,
        item: Option<InboxItem>,
        action: Option<settle_core::ActionName>,
        outcome: Option<EventOutcome>,
    ) {
        let ctx = CommitCtx {
            entity_id: commit.fence.entity_id,
            entry: commit.to.clone().map(|to| (to, commit.retry, commit.auto_at)),
            properties: commit.properties.clone(),
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

fn action_result(
    r: std::result::Result<std::result::Result<Outcome, crate::handler::HandlerError>, String>,
) -> std::result::Result<Outcome, String> {
    match r {
        Ok(Ok(outcome)) => Ok(outcome),
        Ok(Err(e)) => Err(format!("action error: {e}")),
        Err(panic) => Err(format!("action panicked: {panic}")),
    }
}

fn fence(e: &EntityRow, owner: &str) -> Fence {
    Fence { entity_id: e.id, version: e.version, owner: owner.to_string() }
}

fn op_error(e: OpError) -> Error {
    match e {
        OpError::NotFound { machine, key } => Error::NotFound { machine, key },
        OpError::AlreadyExists { machine, key } => Error::AlreadyExists { machine, key },
        other => Error::Store(settle_store::Error::Db(other.to_string())),
    }
}
