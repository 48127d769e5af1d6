//! A steppable engine for deterministic simulation ([`SimNode`]).
//!
//! An [`Engine`](crate::Engine) runs its scheduler as a task: when it writes a batch, in
//! which order its handlers' results arrive, and when its clock wakes it depend on the
//! runtime's timing. A [`SimNode`] is the same scheduler — the same decisions, the same
//! batches, claims, leases, renewals and supervisor — with the loop taken out: the caller
//! says when it takes requests ([`create`](SimNode::create), [`raise`](SimNode::raise),
//! [`command`](SimNode::command), [`agent`](SimNode::agent)), when the results of the
//! handlers and evaluations that ran are delivered ([`settle`](SimNode::settle): all of
//! them, in the order they started), and when a batch is written ([`write`](SimNode::write)), with a
//! fault injected if it likes ([`WriteFault`]). With a [`ManualClock`](crate::ManualClock)
//! and handlers that draw from a seed, a run is a function of the seed: a simulation
//! (`settle simulate`) drives several nodes over one store through random schedules and
//! faults and checks the store's invariants after every step.
//!
//! Crashing a node is dropping it: whatever it held and had not written is lost, as in a
//! `kill -9`, and its leases expire on the store's clock.

use std::time::Duration;

use serde_json::Value;
use settle_core::Properties;
use settle_store::{Applied, BatchResult, Command, EntityRow, Op, Store};
use tokio::sync::{mpsc, oneshot};

use crate::api::Wait;
use crate::builder::{EngineBuilder, Prepared};
use crate::error::Result;
use crate::msg::Msg;
use crate::ops::{command_op, create_op, push_op};
use crate::opwatch::OpWatch;
use crate::scheduler::Scheduler;

/// A reply to a request, read once the batch that carries the request is written.
pub type Reply<T> = oneshot::Receiver<Result<T>>;

/// A fault injected into one batch write ([`SimNode::write`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteFault {
    /// Write the batch.
    None,
    /// The store fails before the batch reaches it: nothing is written.
    Before,
    /// The batch is written, but its result is lost (a connection cut after the commit):
    /// the node sees a store error.
    After,
}

/// What a node's [`settle`](SimNode::settle) could not wait for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hang {
    /// The entities (id, version) whose handler or evaluation never answered.
    pub waiting: Vec<(i64, i64)>,
}

/// One engine, stepped by its caller. Built by
/// [`EngineBuilder::start_sim`](crate::EngineBuilder::start_sim).
pub struct SimNode<S: Store + Clone> {
    scheduler: Scheduler<S>,
    rx: mpsc::UnboundedReceiver<Msg>,
    registry: std::sync::Arc<crate::registry::Registry>,
    clock: settle_store::SharedClock,
    owner: String,
    /// Answers received from the scheduler's tasks.
    answered: u64,
}

impl<S: Store + Clone> EngineBuilder<S> {
    /// Starts a steppable engine for a deterministic simulation ([`SimNode`]): the same
    /// checks and definition storage as [`start`](Self::start), no task of its own.
    /// `reclaim` releases every lease in the store first, as an engine starting on an
    /// exclusive store does (a simulation sharing one store between several nodes says
    /// when that happens).
    pub async fn start_sim(self, reclaim: bool) -> Result<SimNode<S>> {
        let prepared = self.prepare(reclaim).await?;
        Ok(SimNode::new(prepared))
    }
}

impl<S: Store + Clone> SimNode<S> {
    fn new(prepared: Prepared<S>) -> Self {
        let Prepared { store, registry, config } = prepared;
        let (tx, rx) = mpsc::unbounded_channel();
        let offered = std::sync::Arc::new(tokio::sync::Notify::new());
        let ops = OpWatch::start(store.clone());
        let (clock, owner) = (config.clock.clone(), config.owner.clone());
        let registries = std::sync::Arc::new(crate::registry::Registries::new(registry.clone()));
        let mut scheduler = Scheduler::new(store, registries, config, tx, offered, None, ops);
        scheduler.record_landed();
        SimNode { scheduler, rx, registry, clock, owner, answered: 0 }
    }

    /// This node's lease owner name.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// Queues the creation of entity `key` of `machine` as the operation `request_id`.
    /// The reply is `None` when the request id was used before.
    pub fn create(
        &mut self,
        machine: &str,
        key: &str,
        properties: Properties,
        request_id: &str,
    ) -> Result<Reply<Option<EntityRow>>> {
        let new = create_op(&self.registry, machine, key, properties, request_id, 0, self.clock.now_ms())?;
        let (reply, rx) = oneshot::channel();
        self.scheduler.on_msg(Msg::Create { new, reply });
        Ok(rx)
    }

    /// Queues `event` for entity `key` of `machine` as the operation `request_id`. The
    /// reply is the inbox id and the entity's id, or `None` when the request id was used
    /// before.
    pub fn raise(
        &mut self,
        machine: &str,
        key: &str,
        event: &str,
        params: Value,
        request_id: &str,
    ) -> Result<Reply<Option<(i64, i64)>>> {
        let m = self.registry.machine(machine)?;
        let declared = settle_core::step::check_raise(m, event, &params)?;
        let priority = settle_core::step::priority_of(m, declared, None, false)?;
        let push = push_op(m, key, event, params, request_id, priority);
        let (ack, rx) = oneshot::channel();
        self.scheduler.on_msg(Msg::Raise { push, wait: Wait::Queued, ack, done: None });
        Ok(rx)
    }

    /// Queues an operator command on entity `key` of `machine` as the operation
    /// `request_id`.
    pub fn command(
        &mut self,
        machine: &str,
        key: &str,
        command: Command,
        request_id: &str,
    ) -> Result<Reply<Option<EntityRow>>> {
        let op = command_op(&self.registry, machine, key, command, request_id, None)?;
        let (reply, rx) = oneshot::channel();
        self.scheduler.on_msg(Msg::Command { op, reply });
        Ok(rx)
    }

    /// Queues an agent's operation: [`Op::TaskLease`], [`Op::TaskHeartbeat`] or
    /// [`Op::TaskReport`] (see [`report`](Self::report)).
    pub fn agent(&mut self, op: Op) -> Reply<Applied> {
        let (reply, rx) = oneshot::channel();
        self.scheduler.on_msg(Msg::Agent { op, reply });
        rx
    }

    /// Queues an agent's report on `task`, checked against the targets its action declares
    /// as [`Engine::agent_report`](crate::Engine::agent_report) checks it.
    pub fn report(&mut self, task: i64, token: &str, result: settle_store::TaskResult) -> Reply<Applied> {
        let check = self.registry.agent_check();
        self.agent(Op::TaskReport { task, token: token.to_string(), result, check })
    }

    /// Waits (at most `limit`, in real time) until every handler, hook and evaluation this
    /// node started has answered — those of entities it no longer holds included, whose late
    /// answers the scheduler ignores — or waits for a sync nested event's outcome, then
    /// delivers all their results (and the nested events raised) in the order the tasks were
    /// started, each deciding its entity's next step (which may start more; they are waited
    /// for too). Answers how many results it delivered; a [`Hang`] names the entities whose
    /// work never answered.
    pub async fn settle(&mut self, limit: Duration) -> std::result::Result<usize, Hang> {
        let deadline = std::time::Instant::now() + limit;
        let mut delivered = 0;
        loop {
            let mut got: Vec<Msg> = Vec::new();
            // An action waiting for a sync nested event answers once this node (or another)
            // has written the batches that bring the nested event's entity to rest.
            while self.answered
                + (got.iter().filter(|m| answers(m).is_some()).count() as u64)
                + self.scheduler.nested_waiting()
                < self.scheduler.tasks()
            {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                match tokio::time::timeout(left, self.rx.recv()).await {
                    Ok(Some(msg)) => got.push(msg),
                    Ok(None) | Err(_) => return Err(Hang { waiting: self.scheduler.running() }),
                }
            }
            // Anything else already sent (a nested event), too.
            while let Ok(msg) = self.rx.try_recv() {
                got.push(msg);
            }
            if got.is_empty() {
                return Ok(delivered);
            }
            self.answered += got.iter().filter(|m| answers(m).is_some()).count() as u64;
            // Arrival order is the runtime's; delivery order is the tasks' start order.
            got.sort_by_key(|m| answers(m).unwrap_or(u64::MAX));
            for msg in got {
                delivered += 1;
                self.scheduler.on_msg(msg);
            }
        }
    }

    /// Renews leases and runs the supervisor when due, then writes one batch — every
    /// queued operation and a claim of due entities — with `fault` injected, and acts on
    /// the result as the engine does (answers replies, decides the next step of each held
    /// entity, takes the claimed ones). Answers whether there was anything to write.
    pub async fn write(&mut self, fault: WriteFault) -> bool {
        self.scheduler.maybe_renew();
        self.scheduler.maybe_supervise();
        self.scheduler.maybe_prune();
        let Some((batch, pending, offers)) = self.scheduler.take_batch() else { return false };
        let written: settle_store::Result<BatchResult> = match fault {
            WriteFault::None => self.scheduler.store().write(batch).await,
            WriteFault::Before => Err(injected("before the write")),
            WriteFault::After => {
                let _ = self.scheduler.store().write(batch).await;
                Err(injected("after the write; its result was lost"))
            }
        };
        self.scheduler.finish_batch(pending, offers, written);
        true
    }

    /// The entities this node holds the lease of, by id.
    pub fn held(&self) -> Vec<i64> {
        self.scheduler.held_ids()
    }

    /// Operations queued for the next batch.
    pub fn queued(&self) -> usize {
        self.scheduler.queued()
    }

    /// The commits of this node that landed since the last call and made a new version of
    /// their entity (a state entry or an internal transition): (entity id, that version).
    pub fn landed(&mut self) -> Vec<(i64, i64)> {
        self.scheduler.take_landed()
    }

    /// The machines this node runs.
    pub fn machines(&self) -> Vec<std::sync::Arc<settle_core::Machine>> {
        let mut all: Vec<_> = self.registry.machines.values().cloned().collect();
        all.sort_by(|a, b| a.name().cmp(b.name()));
        all
    }
}

/// The task a message of a handler, hooks or an evaluation answers for.
fn answers(msg: &Msg) -> Option<u64> {
    match msg {
        Msg::ActionDone { task, .. } | Msg::HooksDone { task, .. } | Msg::Evaluated { task, .. } => Some(*task),
        _ => None,
    }
}

fn injected(when: &str) -> settle_store::Error {
    settle_store::Error::Db(format!("simulated store failure {when}"))
}

#[cfg(test)]
mod tests {
    use settle_core::machine::MachineBuilder;
    use settle_store::{ManualClock, SqliteStore};

    use super::*;
    use crate::{Config, Engine};

    /// The next batch (it carries a claim), what to do with its results, and whether it
    /// offers agent tasks.
    fn next_claim(node: &mut SimNode<SqliteStore>) -> (settle_store::Batch, Vec<crate::scheduler::Pending>, bool) {
        node.scheduler.take_batch().expect("a batch with a claim")
    }

    /// Machine `m`: `idle`, and `go` runs `start` into `done`.
    fn go_machine() -> settle_core::Machine {
        MachineBuilder::new("m")
            .state("idle")
            .initial()
            .state("done")
            .event("go", ["idle"], "start")
            .action("start", ["done"])
            .build()
            .unwrap()
    }

    /// A batch taken while the last one's result is not yet acted on counts the entities
    /// that one claimed against the engine's room: with room for two, two claimed by the
    /// last batch leave none for the next, though a third entity is due.
    #[tokio::test]
    async fn the_next_batch_counts_what_the_last_one_claimed() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path().join("engine.db")).unwrap();
        let clock = ManualClock::new(1_000_000);
        let config =
            Config { max_inflight: 2, claim_batch: 2, clock: std::sync::Arc::new(clock.clone()), ..Config::default() };
        let m = go_machine();
        let mut node = Engine::builder(store.clone()).config(config).machine(m).start_sim(false).await.unwrap();
        let mut answers = Vec::new();
        for key in ["a", "b", "c"] {
            answers.push(node.create("m", key, Properties::new(), &format!("req-{key}")).unwrap());
        }
        let first = node.scheduler.start_batch(None).expect("the creates");
        let created = first.written().await;
        node.scheduler.act_on(created);
        for key in ["a", "b", "c"] {
            let _raised = node.raise("m", key, "go", Value::Null, &format!("go-{key}")).unwrap();
        }
        // The raises' batch claims two of the three (its limit); the next one, taken before
        // that result is acted on, has no room left: nothing to claim, nothing to write.
        let raised = node.scheduler.start_batch(None).expect("the raises").written().await;
        assert_eq!(raised.claimed(), 2);
        assert!(node.scheduler.start_batch(Some(&raised)).is_none(), "no room for a claim");
        node.scheduler.act_on(raised);
        assert_eq!(node.held().len(), 2);
    }

    /// An engine lets its batches lease the entities they create only after a claim that
    /// took less than its limit: its first batch does not (it knows nothing of the due work
    /// waiting), nor does the batch after a claim that filled its limit.
    #[tokio::test]
    async fn creates_are_taken_only_after_a_claim_with_room() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path().join("engine.db")).unwrap();
        let clock = ManualClock::new(1_000_000);
        let config = Config { claim_batch: 1, clock: std::sync::Arc::new(clock.clone()), ..Config::default() };
        let m = go_machine();
        let mut node = Engine::builder(store.clone()).config(config).machine(m).start_sim(false).await.unwrap();
        let _created = node.create("m", "a", Properties::new(), "req-a").unwrap();
        let (batch, pending, offers) = next_claim(&mut node);
        assert!(!batch.claim.as_ref().unwrap().take_created, "the first batch takes nothing");
        let written = store.write(batch).await;
        assert!(written.as_ref().unwrap().claimed.is_empty());
        node.scheduler.finish_batch(pending, offers, written);
        // The claim found nothing due (room to spare): the next batch may take.
        let _raised = node.raise("m", "a", "go", Value::Null, "req-go").unwrap();
        let (batch, pending, offers) = next_claim(&mut node);
        assert!(batch.claim.as_ref().unwrap().take_created, "after a claim with room");
        let written = store.write(batch).await;
        assert_eq!(written.as_ref().unwrap().claimed.len(), 1, "the raised entity, claimed: the claim is full");
        node.scheduler.finish_batch(pending, offers, written);
        let (batch, _, _) = next_claim(&mut node);
        assert!(!batch.claim.as_ref().unwrap().take_created, "after a full claim, older due work may wait");
    }
}
