//! What a running action may do with other entities ([`Nested`], implemented here by
//! [`NestedHandle`]): raise a sync nested event and wait for its outcome, read an entity.
//! Both go through the scheduler's channel and the store like any caller.

use std::sync::Arc;
use std::time::Duration;

use settle_core::step;
use settle_core::{EntityKey, MachineName};
use settle_store::{EntityRow, InboxKind, Push, Store};
use tokio::sync::{mpsc, oneshot};

use crate::api::{EventOutcome, Wait};
use crate::error::Error;
use crate::handler::{EngineFuture, Nested, NestedEvent};
use crate::msg::Msg;
use crate::registry::Registries;
use crate::watch::{Hub, Want, first_of};

/// What actions may do with other entities while they run: raise a sync nested event,
/// read. Goes through the scheduler's channel and the store like any caller.
pub(crate) struct NestedHandle<S> {
    pub(crate) tx: mpsc::UnboundedSender<Msg>,
    pub(crate) store: S,
    pub(crate) registries: Arc<Registries>,
    pub(crate) lease: Duration,
    /// Answers the wait when another instance processes the event (shared stores).
    pub(crate) hub: Option<Hub>,
    /// How many actions wait for a sync nested event's outcome now: a simulation's node
    /// does not wait for their answers before it writes the batches that let them go on.
    pub(crate) waiting: Arc<std::sync::atomic::AtomicU64>,
}

/// Counts a wait in [`NestedHandle::waiting`] while it lives.
struct Waiting(Arc<std::sync::atomic::AtomicU64>);

impl Waiting {
    fn new(n: &Arc<std::sync::atomic::AtomicU64>) -> Waiting {
        n.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Waiting(n.clone())
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

impl<S: Store + Clone> Nested for NestedHandle<S> {
    fn raise_and_wait(&self, nested: NestedEvent) -> EngineFuture<(EventOutcome, EntityRow)> {
        let NestedEvent { from, machine, key, event, params, request_id } = nested;
        let checked = self.registries.load().machine(&machine).and_then(|m| {
            step::check_raise(m, &event, &params)?;
            Ok(m.clone())
        });
        let tx = self.tx.clone();
        let lease = self.lease;
        let hub = self.hub.clone();
        let waiting = self.waiting.clone();
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
                reply: None,
            };
            let (ack, ack_rx) = oneshot::channel();
            let (done, done_rx) = oneshot::channel();
            let mark = hub.as_ref().map(Hub::mark);
            // Counted before the message goes: whoever reads the message sees the wait.
            let _waiting = Waiting::new(&waiting);
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
            // The scheduler lets the wait go at the action's lease on the engine's clock
            // (its answer channel closes while the scheduler runs); real time bounds it too.
            let timeout = || Error::Timeout { request_id: "nested event".into(), waited: lease };
            match tokio::time::timeout(lease, first_of(done_rx, remote)).await {
                Ok(Some(answer)) => Ok(answer),
                Ok(None) if tx.is_closed() => Err(Error::Stopped),
                Ok(None) => Err(timeout()),
                Err(_) => Err(timeout()),
            }
        })
    }

    fn read(&self, machine: MachineName, key: EntityKey) -> EngineFuture<Option<EntityRow>> {
        let store = self.store.clone();
        Box::pin(async move { Ok(store.entity_get(&machine, &key).await?) })
    }
}
