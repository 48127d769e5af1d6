//! Waiting on entities that another instance may move (DESIGN §2: any instance may do
//! the work; PostgreSQL only).
//!
//! The store tells which entities other processes committed, batch by batch
//! ([`Store::changes`]). The [`Hub`] keeps the callers of this process that wait on
//! entities — a raised event's outcome or rest, a sync nested event, a state — and when a
//! notification names their entities it reads them again, one read per notification for
//! all its waiters, and answers those whose wait is over. Nobody polls.
//!
//! Callers waiting on an entity this engine moves are answered by the scheduler as the
//! commit lands (its own notifications do not come back); the hub answers the others. A
//! caller registers with both, and the first answer wins.
//!
//! A caller takes a [`Hub::mark`] before its write, and registers with it afterwards: the
//! hub remembers the entities of recent notifications (a ring), so a change that landed
//! between the write and the registration is not missed.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use settle_core::{Machine, StateKind, StateName};
use settle_store::{Changed, Changes, EntityRow, EventRow, Store};
use tokio::sync::{broadcast, mpsc, oneshot};

use crate::api::EventOutcome;

/// How many recent changes the hub remembers for late registrations.
const RING: usize = 16_384;

/// What a caller waits for.
pub(crate) enum Want {
    /// The entity in one of `states`; `rest_only` when they are all stable (only changes
    /// that leave it at rest can satisfy it).
    State { states: Vec<StateName>, rest_only: bool, reply: oneshot::Sender<EntityRow> },
    /// The outcome of the event with inbox id `inbox_id`; with `stable`, the entity at rest
    /// after it was accepted.
    Event {
        inbox_id: i64,
        stable: bool,
        machine: Arc<Machine>,
        /// Once seen accepted: the outcome, kept while the entity is still busy.
        accepted: Option<EventOutcome>,
        reply: oneshot::Sender<(EventOutcome, EntityRow)>,
    },
}

impl Want {
    fn closed(&self) -> bool {
        match self {
            Want::State { reply, .. } => reply.is_closed(),
            Want::Event { reply, .. } => reply.is_closed(),
        }
    }

    /// Whether a change of its entity may end this wait. A wait for the entity at rest
    /// after its event (`stable`) needs only changes that leave it at rest: then the event
    /// was processed, and its outcome is read with the entity. (An event that fails while
    /// its entity is busy is answered once the entity rests.)
    fn woken_by(&self, c: &Changed) -> bool {
        match self {
            Want::State { rest_only, .. } => c.at_rest || !rest_only,
            Want::Event { stable, accepted, .. } => c.at_rest || (!stable && accepted.is_none()),
        }
    }
}

struct Register {
    entity_id: i64,
    since: u64,
    want: Want,
}

/// The waiters of this process on entities other instances may move. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Hub {
    tx: mpsc::UnboundedSender<Register>,
    seq: Arc<AtomicU64>,
}

impl Hub {
    /// Starts the hub's task on `store`. It subscribes to the store's change notifications
    /// ([`Store::changes`]) when the first caller waits: a process that never waits on
    /// entities (a worker) is never told of others' changes.
    pub(crate) fn start<S: Store + Clone>(store: S) -> Hub {
        let (tx, rx) = mpsc::unbounded_channel();
        let seq = Arc::new(AtomicU64::new(0));
        tokio::spawn(run(store, rx, seq.clone()));
        Hub { tx, seq }
    }

    /// A mark to take before the write a caller then waits on (see the module docs).
    pub(crate) fn mark(&self) -> u64 {
        self.seq.load(Ordering::Acquire)
    }

    /// Waits (through `want`'s reply) on entity `entity_id`, counting changes since `since`.
    pub(crate) fn watch(&self, entity_id: i64, since: u64, want: Want) {
        let _ = self.tx.send(Register { entity_id, since, want });
    }
}

/// The hub's state, owned by its task.
struct State {
    watches: HashMap<i64, Vec<Want>>,
    /// Recent changes, with their sequence numbers (oldest first).
    ring: VecDeque<(u64, Changed)>,
    seq: u64,
    /// Changes up to this sequence number may have been missed.
    lost_upto: u64,
    /// Entities to read again now.
    due: HashSet<i64>,
    registered: u64,
}

impl State {
    fn on_changes(&mut self, changes: Changes) {
        match changes {
            Changes::Entities(list) => {
                for c in list.iter() {
                    self.seq += 1;
                    if self.ring.len() == RING {
                        self.ring.pop_front();
                    }
                    self.ring.push_back((self.seq, *c));
                    if self.watches.get(&c.entity_id).is_some_and(|ws| ws.iter().any(|w| w.woken_by(c))) {
                        self.due.insert(c.entity_id);
                    }
                }
            }
            Changes::Lost => {
                self.seq += 1;
                self.lost_upto = self.seq;
                self.due.extend(self.watches.keys().copied());
            }
        }
    }

    fn on_register(&mut self, r: Register) {
        // A change since the caller's mark may already have ended the wait.
        let missed = r.since < self.lost_upto
            || self.ring.front().is_some_and(|(oldest, _)| *oldest > r.since + 1)
            || self
                .ring
                .iter()
                .rev()
                .take_while(|(seq, _)| *seq > r.since)
                .any(|(_, c)| c.entity_id == r.entity_id && r.want.woken_by(c));
        if missed {
            self.due.insert(r.entity_id);
        }
        self.watches.entry(r.entity_id).or_default().push(r.want);
        self.registered += 1;
        if self.registered.is_multiple_of(1024) {
            self.watches.retain(|_, ws| {
                ws.retain(|w| !w.closed());
                !ws.is_empty()
            });
        }
    }
}

async fn run<S: Store>(store: S, mut rx: mpsc::UnboundedReceiver<Register>, seq: Arc<AtomicU64>) {
    let mut st = State {
        watches: HashMap::new(),
        ring: VecDeque::with_capacity(RING),
        seq: 0,
        lost_upto: 0,
        due: HashSet::new(),
        registered: 0,
    };
    let mut changes: Option<broadcast::Receiver<Changes>> = None;
    let mut retry = false;
    loop {
        tokio::select! {
            c = async { changes.as_mut().expect("guarded").recv().await }, if changes.is_some() => match c {
                Ok(c) => st.on_changes(c),
                Err(broadcast::error::RecvError::Lagged(_)) => st.on_changes(Changes::Lost),
                // The store is gone: nothing will be told any more.
                Err(broadcast::error::RecvError::Closed) => return,
            },
            r = rx.recv() => match r {
                Some(r) => {
                    if changes.is_none() {
                        // The first waiter: listen from now on (the store then tells that
                        // earlier changes were not heard, and every waiter looks).
                        match store.changes() {
                            Some(c) => changes = Some(c),
                            // Nothing tells: only this engine answers.
                            None => return,
                        }
                    }
                    st.on_register(r);
                }
                None => return,
            },
            _ = tokio::time::sleep(Duration::from_millis(200)), if retry => {}
        }
        if let Some(c) = changes.as_mut() {
            loop {
                match c.try_recv() {
                    Ok(c) => st.on_changes(c),
                    Err(broadcast::error::TryRecvError::Lagged(_)) => st.on_changes(Changes::Lost),
                    Err(_) => break,
                }
            }
        }
        while let Ok(r) = rx.try_recv() {
            st.on_register(r);
        }
        seq.store(st.seq, Ordering::Release);
        retry = false;
        if !st.due.is_empty() {
            let ids: Vec<i64> = st.due.drain().collect();
            if let Err(e) = check(&store, &mut st.watches, &ids).await {
                tracing::warn!(error = %e, "cannot read entities that other instances changed; trying again");
                st.due.extend(ids);
                retry = true;
            }
        }
    }
}

/// Reads `ids` (and the events their callers wait on) and answers every wait that is over.
async fn check<S: Store>(store: &S, watches: &mut HashMap<i64, Vec<Want>>, ids: &[i64]) -> settle_store::Result<()> {
    let ids: Vec<i64> = ids.iter().copied().filter(|id| watches.contains_key(id)).collect();
    if ids.is_empty() {
        return Ok(());
    }
    let inbox_ids: Vec<i64> = ids
        .iter()
        .flat_map(|id| &watches[id])
        .filter_map(|w| match w {
            Want::Event { inbox_id, .. } => Some(*inbox_id),
            Want::State { .. } => None,
        })
        .collect();
    // Events first: an entity read after its event shows at least that event's commit.
    let events: HashMap<i64, EventRow> = if inbox_ids.is_empty() {
        HashMap::new()
    } else {
        store.events_by_id(inbox_ids).await?.into_iter().map(|e| (e.id, e)).collect()
    };
    let entities: HashMap<i64, EntityRow> =
        store.entities_by_id(ids.clone()).await?.into_iter().map(|e| (e.id, e)).collect();
    for id in ids {
        let Some(entity) = entities.get(&id) else { continue };
        let Some(waiting) = watches.get_mut(&id) else { continue };
        let mut kept = Vec::with_capacity(waiting.len());
        for want in waiting.drain(..) {
            if want.closed() {
                continue;
            }
            if let Some(want) = answer(want, entity, &events) {
                kept.push(want);
            }
        }
        if kept.is_empty() {
            watches.remove(&id);
        } else {
            *waiting = kept;
        }
    }
    Ok(())
}

/// Answers `want` if `entity` (and its event) end it; else gives it back.
fn answer(want: Want, entity: &EntityRow, events: &HashMap<i64, EventRow>) -> Option<Want> {
    match want {
        Want::State { states, rest_only, reply } => {
            if states.contains(&entity.state) {
                let _ = reply.send(entity.clone());
                return None;
            }
            Some(Want::State { states, rest_only, reply })
        }
        Want::Event { inbox_id, stable, machine, accepted, reply } => {
            let outcome = match accepted {
                Some(outcome) => outcome,
                None => match events.get(&inbox_id) {
                    Some(ev) => outcome_of(ev),
                    // Not processed yet.
                    None => return Some(Want::Event { inbox_id, stable, machine, accepted: None, reply }),
                },
            };
            let busy = machine.state(&entity.state).is_some_and(|s| s.kind == StateKind::Unstable);
            if stable && matches!(outcome, EventOutcome::Accepted { .. }) && busy {
                return Some(Want::Event { inbox_id, stable, machine, accepted: Some(outcome), reply });
            }
            let _ = reply.send((outcome, entity.clone()));
            None
        }
    }
}

/// A processed event's outcome, as its `events` row records it.
pub(crate) fn outcome_of(ev: &EventRow) -> EventOutcome {
    if ev.rejected {
        EventOutcome::Rejected { state: ev.start_state.clone(), reason: ev.reason.clone().unwrap_or_default() }
    } else if ev.failed {
        EventOutcome::Failed { error: ev.error.clone().or_else(|| ev.reason.clone()).unwrap_or_default() }
    } else {
        EventOutcome::Accepted { state: ev.entered.clone().unwrap_or_else(|| ev.start_state.clone()) }
    }
}

/// The first answer of two receivers (`None` when both senders are gone).
pub(crate) async fn first_of<T>(a: oneshot::Receiver<T>, b: Option<oneshot::Receiver<T>>) -> Option<T> {
    let Some(b) = b else { return a.await.ok() };
    tokio::pin!(a, b);
    let (mut a_gone, mut b_gone) = (false, false);
    loop {
        tokio::select! {
            r = &mut a, if !a_gone => match r {
                Ok(v) => return Some(v),
                Err(_) => a_gone = true,
            },
            r = &mut b, if !b_gone => match r {
                Ok(v) => return Some(v),
                Err(_) => b_gone = true,
            },
        }
        if a_gone && b_gone {
            return None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state_want(rest_only: bool) -> (Want, oneshot::Receiver<EntityRow>) {
        let (reply, rx) = oneshot::channel();
        (Want::State { states: vec![StateName::new("done")], rest_only, reply }, rx)
    }

    fn state() -> State {
        State {
            watches: HashMap::new(),
            ring: VecDeque::new(),
            seq: 0,
            lost_upto: 0,
            due: HashSet::new(),
            registered: 0,
        }
    }

    fn changed(id: i64, at_rest: bool) -> Changes {
        Changes::Entities(vec![Changed { entity_id: id, at_rest }].into())
    }

    #[test]
    fn a_change_wakes_only_waiters_it_concerns() {
        let mut st = state();
        let (w, _rx) = state_want(true);
        st.on_register(Register { entity_id: 7, since: 0, want: w });
        assert!(st.due.is_empty(), "nothing changed since the mark");
        st.on_changes(changed(8, true));
        st.on_changes(changed(7, false));
        assert!(st.due.is_empty(), "a busy change cannot put the entity in a stable state");
        st.on_changes(changed(7, true));
        assert_eq!(st.due, HashSet::from([7]));
    }

    #[test]
    fn a_change_between_mark_and_registration_is_not_missed() {
        let mut st = state();
        let mark = st.seq;
        st.on_changes(changed(3, true));
        let (w, _rx) = state_want(true);
        st.on_register(Register { entity_id: 3, since: mark, want: w });
        assert_eq!(st.due, HashSet::from([3]));
        let mut st = state();
        st.on_changes(changed(3, true));
        let mark = st.seq;
        let (w, _rx) = state_want(true);
        st.on_register(Register { entity_id: 3, since: mark, want: w });
        assert!(st.due.is_empty(), "the change came before the mark");
    }

    #[test]
    fn lost_notifications_and_an_overflowing_ring_make_waiters_look() {
        let mut st = state();
        let (w, _rx) = state_want(false);
        st.on_register(Register { entity_id: 1, since: 0, want: w });
        st.on_changes(Changes::Lost);
        assert_eq!(st.due, HashSet::from([1]));
        let mut st = state();
        for i in 0..(RING as i64 + 10) {
            st.on_changes(changed(1_000 + i, true));
        }
        let (w, _rx) = state_want(false);
        st.on_register(Register { entity_id: 5, since: 2, want: w });
        assert_eq!(st.due, HashSet::from([5]), "the ring no longer reaches back to the mark");
    }

    fn entity(state: &str) -> EntityRow {
        crate::fixtures::entity("m", "k", state)
    }

    fn event(rejected: bool, entered: Option<&str>) -> EventRow {
        EventRow {
            id: 9,
            request_id: None,
            event: "go".into(),
            kind: "raised".into(),
            start_state: "idle".into(),
            end_state: None,
            start_time: 0,
            end_time: None,
            rejected,
            failed: false,
            error: None,
            exception: None,
            reason: rejected.then(|| "not now".into()),
            entered: entered.map(StateName::new),
        }
    }

    fn machine() -> Arc<Machine> {
        Arc::new(
            settle_core::MachineBuilder::new("m")
                .state("idle")
                .initial()
                .state("busy")
                .auto("work")
                .state("done")
                .event("go", ["idle"], "start")
                .action("start", ["busy"])
                .action("work", ["done"])
                .build()
                .expect("valid"),
        )
    }

    #[test]
    fn a_stable_wait_ends_when_the_accepted_event_left_the_entity_at_rest() {
        let (reply, mut rx) = oneshot::channel();
        let want = Want::Event { inbox_id: 9, stable: true, machine: machine(), accepted: None, reply };
        let none = HashMap::new();
        let want = answer(want, &entity("idle"), &none).expect("not processed yet: still waiting");
        let events = HashMap::from([(9, event(false, Some("busy")))]);
        let want = answer(want, &entity("busy"), &events).expect("accepted but busy: still waiting");
        assert!(matches!(&want, Want::Event { accepted: Some(EventOutcome::Accepted { .. }), .. }));
        assert!(answer(want, &entity("done"), &none).is_none(), "at rest: answered");
        let (outcome, e) = rx.try_recv().expect("answered");
        assert_eq!(outcome, EventOutcome::Accepted { state: "busy".into() });
        assert_eq!(e.state, "done");
    }

    #[test]
    fn a_rejection_is_answered_at_once() {
        let (reply, mut rx) = oneshot::channel();
        let want = Want::Event { inbox_id: 9, stable: true, machine: machine(), accepted: None, reply };
        let events = HashMap::from([(9, event(true, None))]);
        assert!(answer(want, &entity("busy"), &events).is_none());
        let (outcome, _) = rx.try_recv().expect("answered");
        assert_eq!(outcome, EventOutcome::Rejected { state: "idle".into(), reason: "not now".into() });
    }
}
