//! The scheduler's inbox: what the engine's API, running actions and subscription
//! evaluations send to the one writer ([`Msg`]), and the reply channels they wait on.

use serde_json::Value;
use settle_core::{EventName, StateName};
use settle_store::{Applied, EntityRow, Millis, NewEntity, Op, Push};
use tokio::sync::oneshot;

use crate::api::{EventOutcome, Wait};
use crate::decide::{FaultError, Hooks};
use crate::error::Result;
use crate::handler::Outcome;

/// Answers a caller waiting on a raised event: its outcome and the entity then.
pub(crate) type DoneTx = oneshot::Sender<(EventOutcome, EntityRow)>;

/// A subscription event to fire, with its parameters (`matched`).
pub(crate) type Fire = Option<(EventName, Value)>;

/// A message to the scheduler.
pub(crate) enum Msg {
    /// Answered with the entity, or `None` when the request id was replayed.
    Create { new: NewEntity, reply: oneshot::Sender<Result<Option<EntityRow>>> },
    /// `ack` gets the inbox id and the entity's id, or `None` when the request id was
    /// replayed.
    Raise { push: Push, wait: Wait, ack: oneshot::Sender<Result<Option<(i64, i64)>>>, done: Option<DoneTx> },
    /// An operator command (`Op::Command`); answered like `Create`.
    Command { op: Op, reply: oneshot::Sender<Result<Option<EntityRow>>> },
    /// A round of pruning asked for by the API (`Op::Prune`).
    Prune { op: Op, reply: oneshot::Sender<Result<settle_store::Pruned>> },
    /// The periodic job archived what its round chose: the round that removes them
    /// (`None`: archiving failed, nothing is removed until the next period).
    PruneArchived(Option<Box<settle_store::Prune>>),
    /// A handler finished.
    /// (`task`: the scheduler's number of the task that ran it, in spawn order, for a
    /// simulation's deterministic delivery; also in `HooksDone` and `Evaluated`.)
    ActionDone { entity_id: i64, version: i64, task: u64, result: std::result::Result<Outcome, FaultError> },
    /// A transition's entry and exit actions ran: the outcome with their effects, or the
    /// fault of the one that failed.
    HooksDone {
        entity_id: i64,
        version: i64,
        task: u64,
        hooks: Box<Hooks>,
        result: std::result::Result<Outcome, FaultError>,
    },
    /// Subscriptions were evaluated over a snapshot of the successors (and its newest
    /// notice id), or the read failed.
    Evaluated { entity_id: i64, version: i64, task: u64, result: std::result::Result<(Fire, Option<i64>), String> },
    /// An agent's lease, heartbeat or report (`Op::TaskLease`, `TaskHeartbeat`, `TaskReport`).
    Agent { op: Op, reply: oneshot::Sender<Result<Applied>> },
    /// An operation canceled on one entity (`Op::Cancel`).
    Cancel { op: Op, reply: oneshot::Sender<Result<Applied>> },
    /// Tell once every commit queued now is written (after the next batch).
    Barrier(oneshot::Sender<()>),
    /// Tell when nothing is in flight, queued or scheduled at all.
    WhenIdle(oneshot::Sender<()>),
    /// Tell when nothing is in flight or queued and nothing is due before the clock's now,
    /// with the next due time.
    WhenCaughtUp(oneshot::Sender<Option<Millis>>),
    /// Tell `reply` when the entity commits into one of `states`.
    Watch {
        entity_id: i64,
        states: Vec<StateName>,
        reply: oneshot::Sender<EntityRow>,
        /// Answered once the watch is in place.
        registered: oneshot::Sender<()>,
    },
    /// Stop claiming, finish what runs, then stop.
    Shutdown(oneshot::Sender<()>),
}
