//! Callers of this engine waiting on what its scheduler commits: a raised event's outcome,
//! an entity coming to rest, an entity entering some states, the engine going idle or
//! catching up with its clock. The scheduler registers them and tells this module what
//! landed; the answers go out from here.

use std::collections::HashMap;

use settle_core::StateName;
use settle_store::{EntityRow, Millis};
use tokio::sync::oneshot;

use crate::api::{EventOutcome, Wait};
use crate::decide::Expect;
use crate::msg::DoneTx;

/// An answer to a caller, sent once the batch it tells of is durable.
pub(crate) type Answer = Box<dyn FnOnce() + Send>;

/// Callers waiting for an entity to enter one of some states.
type Watchers = Vec<(Vec<StateName>, oneshot::Sender<EntityRow>)>;

#[derive(Default)]
pub(crate) struct Waiters {
    /// Callers waiting for the outcome of an inbox event, by inbox id, each until its
    /// deadline if it has one.
    outcome: HashMap<i64, (Wait, DoneTx, Option<Millis>)>,
    /// Callers waiting for an entity to come to rest, by entity id.
    rest: HashMap<i64, Vec<(EventOutcome, DoneTx, Option<Millis>)>>,
    /// Callers waiting for an entity to enter one of some states, by entity id.
    states: HashMap<i64, Watchers>,
    idle: Vec<oneshot::Sender<()>>,
    caught_up: Vec<oneshot::Sender<Option<Millis>>>,
    /// Events raised through this scheduler (for pruning waiters now and then).
    raised: u64,
}

impl Waiters {
    /// A caller waits on the outcome of the event queued as `inbox_id`, until `deadline`
    /// (on the engine's clock) if given: then [`Waiters::expire`] lets it go.
    pub(crate) fn on_outcome(&mut self, inbox_id: i64, wait: Wait, done: DoneTx, deadline: Option<Millis>) {
        self.outcome.insert(inbox_id, (wait, done, deadline));
    }

    /// Lets go of the callers whose deadline is `now` or earlier (their answer channel
    /// closes: a sync nested event's action sees its wait time out).
    pub(crate) fn expire(&mut self, now: Millis) {
        let live = |deadline: &Option<Millis>| deadline.is_none_or(|d| d > now);
        self.outcome.retain(|_, (_, _, deadline)| live(deadline));
        self.rest.retain(|_, w| {
            w.retain(|(_, _, deadline)| live(deadline));
            !w.is_empty()
        });
    }

    /// A caller waits for the entity to enter one of `states`.
    pub(crate) fn on_state(&mut self, entity_id: i64, states: Vec<StateName>, reply: oneshot::Sender<EntityRow>) {
        self.states.retain(|_, w| {
            w.retain(|(_, tx)| !tx.is_closed());
            !w.is_empty()
        });
        self.states.entry(entity_id).or_default().push((states, reply));
    }

    pub(crate) fn on_idle(&mut self, tx: oneshot::Sender<()>) {
        self.idle.push(tx);
    }

    pub(crate) fn on_caught_up(&mut self, tx: oneshot::Sender<Option<Millis>>) {
        self.caught_up.push(tx);
    }

    /// Answers the idle waiters (`idle`: nothing in flight, queued or scheduled) and, with
    /// the next due time, the caught-up ones (`caught_up` is `Some(next due)` when nothing
    /// is in flight or queued and nothing is due yet).
    pub(crate) fn answer_quiet(&mut self, idle: bool, caught_up: Option<Option<Millis>>) {
        if idle {
            for tx in self.idle.drain(..) {
                let _ = tx.send(());
            }
        }
        if let Some(next_due) = caught_up {
            for tx in self.caught_up.drain(..) {
                let _ = tx.send(next_due);
            }
        }
    }

    /// Whether anyone waits for the engine to go idle or catch up.
    pub(crate) fn want_quiet(&self) -> bool {
        !self.idle.is_empty() || !self.caught_up.is_empty()
    }

    /// Now and then, forgets callers that stopped waiting: on a shared store another
    /// instance may answer a caller (through the hub), and this scheduler never sees its
    /// event.
    pub(crate) fn prune(&mut self) {
        self.raised += 1;
        if !self.raised.is_multiple_of(256) {
            return;
        }
        self.outcome.retain(|_, (_, tx, _)| !tx.is_closed());
        self.rest.retain(|_, w| {
            w.retain(|(_, tx, _)| !tx.is_closed());
            !w.is_empty()
        });
    }

    /// A commit of entity `id` landed: `entity` is the entity now, `at_rest` whether it
    /// rests. Answers (what to send, for the scheduler to send once the commit is
    /// durable) the caller of the event it processed (or keeps it until the entity rests,
    /// for [`Wait::Stable`]), the state watchers it satisfies, and the callers waiting for
    /// rest.
    pub(crate) fn committed(&mut self, id: i64, expect: &Expect, entity: &EntityRow, at_rest: bool) -> Vec<Answer> {
        let mut told: Vec<Answer> = Vec::new();
        if let (Some(item), Some(outcome)) = (&expect.item, &expect.outcome)
            && let Some((wait, done, deadline)) = self.outcome.remove(&item.id)
        {
            let accepted = matches!(outcome, EventOutcome::Accepted { .. });
            if wait == Wait::Stable && accepted && !at_rest {
                self.rest.entry(id).or_default().push((outcome.clone(), done, deadline));
            } else {
                let answer = (outcome.clone(), entity.clone());
                told.push(Box::new(move || {
                    let _ = done.send(answer);
                }));
            }
        }
        if expect.entry.is_some()
            && let Some(watchers) = self.states.get_mut(&id)
        {
            let (hit, keep): (Vec<_>, Vec<_>) =
                std::mem::take(watchers).into_iter().partition(|(states, _)| states.contains(&entity.state));
            *watchers = keep;
            for (_, tx) in hit {
                let entity = entity.clone();
                told.push(Box::new(move || {
                    let _ = tx.send(entity);
                }));
            }
        }
        if at_rest && let Some(waiters) = self.rest.remove(&id) {
            for (outcome, done, _) in waiters {
                let answer = (outcome, entity.clone());
                told.push(Box::new(move || {
                    let _ = done.send(answer);
                }));
            }
        }
        told
    }
}
