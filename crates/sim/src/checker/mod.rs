//! The invariants ([`Checker`]), checked over what the store recorded as it grows and
//! over what the nodes and the agents were answered. Each invariant is its own model, fed
//! observations (plain data: [`Seen`] after every batch write, the leases before it, the
//! commits a node landed, the answers to agents, [`End`] at rest), so that a test can plant
//! the bug an invariant exists for in a small sequence of observations and see it fail
//! (`tests.rs`).
//!
//! After every batch write:
//! - **single writer**: no (entity, version) is committed twice ([`Checker::landed`]);
//! - **the lease holder commits**: a node's commit lands only on an entity whose lease it
//!   held when the batch began (the store's `lease_owner`, which claims, releases,
//!   expiries taken over and reclaims move);
//! - **history chains unbroken**, **creations once**, **no event processed twice**
//!   ([`history`]);
//! - **timers fire once per due time, never early, never after their state was left**:
//!   every firing, accepted or rejected ([`timers`]);
//! - **subscriptions fire only when their pattern held**, once per state entry
//!   ([`subscriptions`]);
//! - **every agent report answered as the protocol says**: applied once, replayed, or
//!   refused for the right reason ([`agents`]);
//! - **effects land once, with their transition** (a chart's entry and exit rows);
//! - **the fleet counts are the rows'**: every count of entities by machine, state and run
//!   status, and of operations by outcome, equals a `GROUP BY` of the rows it counts;
//! - **never over a concurrency limit, no slot idle while work waits, a limited action
//!   runs under a slot, slots come back** ([`limits`]);
//! - **pruning removes only what retention lets go, whole**: an entity gone from the store
//!   had been in an end state of its machine for at least that state's retention, and no
//!   table keeps a row of it ([`history::Entities::pruned`]; the world reads the orphans).
//!   Its events go with it, by design: the invariants over events and subscriptions leave
//!   it out from then on.
//!
//! At rest ([`Checker::end`]): every acknowledged event processed, every operation ended,
//! no event queued, no timer past due, no slot of a limit held or waited for, every chart that reached `done` ran each entry and
//! exit action once, and every subscription whose pattern holds fired.

mod agents;
mod history;
mod limits;
mod subscriptions;
mod timers;

#[cfg(test)]
mod tests;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use settle_core::Machine;
use settle_core::retention::Keep;

pub(crate) use agents::{Agents, Answer, Stored};
use history::Entities;
use limits::Limits;
pub(crate) use limits::{HoldSeen, SlotSeen};
use subscriptions::Subscriptions;
use timers::Timers;

/// A broken invariant: what, where (entities by `machine/key`), at which step.
#[derive(Debug, Clone)]
pub struct Violation {
    pub(crate) step: usize,
    pub(crate) what: String,
    pub(crate) entities: Vec<String>,
}

/// A history row with its entity's names.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct HistoryRow {
    pub(crate) id: i64,
    pub(crate) entity_id: i64,
    pub(crate) machine: String,
    pub(crate) key: String,
    pub(crate) from: Option<String>,
    pub(crate) to: Option<String>,
    pub(crate) kind: String,
    pub(crate) event: Option<String>,
    pub(crate) at: i64,
}

/// A processed event raised by a timer or a subscription (`events` of kind `timer` or
/// `subscription`), accepted or not.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Fired {
    /// Its inbox id.
    pub(crate) id: i64,
    pub(crate) entity_id: i64,
    pub(crate) event: String,
    /// `timer` or `subscription`.
    pub(crate) kind: String,
    /// When it was raised.
    pub(crate) raised_at: i64,
    pub(crate) rejected: bool,
}

/// What the store holds after a batch write, as the checker reads it.
#[derive(Debug, Default, Clone)]
pub(crate) struct Seen {
    /// History rows written since the last observation, in order.
    pub(crate) history: Vec<HistoryRow>,
    /// Every processed timer and subscription event.
    pub(crate) fired: Vec<Fired>,
    /// Processed events not marked failed, by entity.
    pub(crate) events: HashMap<i64, i64>,
    /// Successor edges (predecessor, successor).
    pub(crate) edges: Vec<(i64, i64)>,
    /// A chart's entry or exit action whose row is in `chart_hooks` twice (key, hook, state).
    pub(crate) hook_twice: Option<(String, String, String)>,
    /// The ids of every entity in the store: one the checker knows that is missing was
    /// pruned (`None`: not read).
    pub(crate) present: Option<HashSet<i64>>,
    /// Every concurrency limit's key values as stored.
    pub(crate) slots: Vec<SlotSeen>,
    /// Every slot held, with its holder's state.
    pub(crate) holds: Vec<HoldSeen>,
    /// The first fleet count that differs from the rows it counts: what it counts (`entities
    /// m/state/status`, `operations outcome`), its count, and the rows' (`None`: all equal;
    /// not read: equal).
    pub(crate) count_drift: Option<(String, i64, i64)>,
    /// When the batch was written.
    pub(crate) now: i64,
}

/// What the store holds at rest, as the checker reads it.
#[derive(Debug, Default, Clone)]
pub(crate) struct End {
    /// Inbox ids of every processed event.
    pub(crate) processed: HashSet<i64>,
    /// Killed entities (`machine/key`).
    pub(crate) killed: HashSet<String>,
    /// Operations not ended: (request id, name, `machine/key`).
    pub(crate) open_operations: Vec<(String, String, String)>,
    /// Events still queued for live entities: (`machine/key`, event).
    pub(crate) queued: Vec<(String, String)>,
    /// Timers of live entities past due: (`machine/key`, event, due).
    pub(crate) due_timers: Vec<(String, String, i64)>,
    /// Charts in `done` with the (hook, state) rows their entry and exit actions wrote.
    pub(crate) done_charts: Vec<(String, Vec<(String, String)>)>,
    /// Entities holding a slot of a limit, or waiting for one: (`machine/key`, which).
    pub(crate) limited: Vec<(String, String)>,
}

/// An event the store acknowledged (its inbox id).
#[derive(Debug, Clone)]
pub(crate) struct Acked {
    pub(crate) machine: String,
    pub(crate) key: String,
    pub(crate) event: String,
    pub(crate) request_id: String,
    pub(crate) inbox_id: i64,
}

/// The entry and exit actions a chart that went from `idle` to `done` ran, each once:
/// (hook, state), sorted.
pub(crate) const CHART_HOOKS: [(&str, &str); 8] = [
    ("enter_step", "step1"),
    ("enter_step", "step2"),
    ("enter_step", "step3"),
    ("enter_working", "working"),
    ("leave_step", "step1"),
    ("leave_step", "step2"),
    ("leave_step", "step3"),
    ("leave_working", "working"),
];

/// Every invariant's model (see the [module](self)).
pub(crate) struct Checker {
    pub(crate) entities: Entities,
    timers: Timers,
    subscriptions: Subscriptions,
    limits: Limits,
    pub(crate) agents: Agents,
    /// Who committed each (entity, version).
    pub(crate) landed: HashMap<(i64, i64), String>,
    /// Each entity's lease owner when the batch being written began.
    leases: HashMap<i64, Option<String>>,
    pub(crate) acked: Vec<Acked>,
    /// A violation found outside a check (reported at the next one).
    pub(crate) fatal: Option<Violation>,
    /// How long each end state (machine, state) keeps its entities.
    kept: HashMap<(String, String), Keep>,
}

impl Checker {
    /// A checker for worlds running `machines`.
    pub(crate) fn new(machines: &[Arc<Machine>]) -> Checker {
        let defaults = crate::world::retention();
        let kept = machines
            .iter()
            .flat_map(|m| {
                m.end_states_kept(&defaults).into_iter().map(|(s, k)| ((m.name().to_string(), s.to_string()), k))
            })
            .collect();
        Checker {
            kept,
            entities: Entities::default(),
            timers: Timers::new(machines),
            subscriptions: Subscriptions::new(machines),
            limits: Limits::new(machines),
            agents: Agents::default(),
            landed: HashMap::new(),
            leases: HashMap::new(),
            acked: Vec::new(),
            fatal: None,
        }
    }

    /// The entity `id` as `machine/key`.
    pub(crate) fn name(&self, id: i64) -> String {
        self.entities.name(id)
    }

    /// A create request for `machine/key` was made at `at`: a lower bound of when its
    /// initial state's timers were planned.
    pub(crate) fn requested(&mut self, name: String, at: i64) {
        self.entities.requested(name, at);
    }

    /// The lease owner of each leased entity when a batch write begins.
    pub(crate) fn before_write(&mut self, leases: HashMap<i64, Option<String>>) {
        self.leases = leases;
    }

    /// The commits `owner` landed in the batch just written: each a new (entity, version),
    /// made by the entity's lease holder. Entities the batch created have no lease yet.
    pub(crate) fn landed(&mut self, step: usize, owner: &str, landed: &[(i64, i64)]) -> Result<(), Violation> {
        for &(id, version) in landed {
            let name = self.name(id);
            if let Some(other) = self.landed.insert((id, version), owner.to_string()) {
                return Err(Violation {
                    step,
                    what: format!("two writers: {name}: version {version} committed by {other} and by {owner}"),
                    entities: vec![name],
                });
            }
            match self.leases.get(&id) {
                Some(Some(holder)) if holder == owner => {}
                // Not there when the batch began: created by it.
                None if version == 1 => {}
                held => {
                    let holder = match held {
                        Some(Some(h)) => format!("held by {h}"),
                        Some(None) => "held by nobody".to_string(),
                        None => "not in the store".to_string(),
                    };
                    return Err(Violation {
                        step,
                        what: format!(
                            "{name}: version {version} committed by {owner}, whose lease it was not: when the batch \
                             began the entity was {holder}"
                        ),
                        entities: vec![name],
                    });
                }
            }
        }
        Ok(())
    }

    /// What the store holds after a batch write: every invariant over it.
    pub(crate) fn seen(&mut self, step: usize, seen: &Seen) -> Result<(), Violation> {
        if let Some(v) = self.fatal.take() {
            return Err(v);
        }
        let fail = |(what, entities): (String, Vec<String>)| Violation { step, what, entities };
        for row in &seen.history {
            self.entities.apply(row).map_err(fail)?;
            self.subscriptions.apply(row, &self.entities).map_err(fail)?;
        }
        if let Some(present) = &seen.present {
            let edges = self.subscriptions.edges();
            self.entities.pruned(present, seen.now, &self.kept, &edges).map_err(fail)?;
        }
        self.entities.processed_once(&seen.events).map_err(fail)?;
        self.timers.check(&seen.fired, &self.entities).map_err(fail)?;
        self.subscriptions.settle(&seen.edges, &seen.fired, &self.entities).map_err(fail)?;
        self.limits.check(&seen.history, &seen.slots, &seen.holds, &self.entities).map_err(fail)?;
        if let Some((key, hook, state)) = &seen.hook_twice {
            let name = format!("chart/{key}");
            return Err(fail((format!("{name}: `{hook}` of `{state}` ran into the store twice"), vec![name])));
        }
        if let Some((what, counted, rows)) = &seen.count_drift {
            return Err(fail((
                format!(
                    "the fleet counts say {counted} {what}, but {rows} rows are (kept apart from the rows they count)"
                ),
                Vec::new(),
            )));
        }
        Ok(())
    }

    /// The end of the run, everything at rest.
    pub(crate) fn end(&mut self, step: usize, end: &End) -> Result<(), Violation> {
        let fail = |what: String, name: String| Violation { step, what, entities: vec![name] };
        let expected: Vec<(String, String)> =
            CHART_HOOKS.iter().map(|(h, st)| (h.to_string(), st.to_string())).collect();
        for (key, ran) in &end.done_charts {
            if *ran != expected {
                let name = format!("chart/{key}");
                return Err(fail(format!("{name}: done, but its entry and exit actions wrote {ran:?}"), name));
            }
        }
        for a in &self.acked {
            let name = format!("{}/{}", a.machine, a.key);
            let gone = self.entities.was_pruned(&name);
            if !end.processed.contains(&a.inbox_id) && !end.killed.contains(&name) && !gone {
                return Err(fail(
                    format!(
                        "{name}: acknowledged event `{}` (request {}, inbox {}) was never processed",
                        a.event, a.request_id, a.inbox_id
                    ),
                    name,
                ));
            }
        }
        if let Some((request_id, op, name)) = end.open_operations.first() {
            return Err(fail(
                format!(
                    "operation {op} ({request_id}) never ended ({} operations open at rest)",
                    end.open_operations.len()
                ),
                name.clone(),
            ));
        }
        if let Some((name, event)) = end.queued.first() {
            return Err(fail(format!("{name}: event `{event}` still queued at rest"), name.clone()));
        }
        if let Some((name, event, due)) = end.due_timers.first() {
            return Err(fail(format!("{name}: its timer of `{event}` (due {due}) never fired"), name.clone()));
        }
        Limits::at_rest(&end.limited).map_err(|(what, entities)| Violation { step, what, entities })?;
        self.subscriptions.at_rest(&self.entities, &end.killed).map_err(|(what, entities)| Violation {
            step,
            what,
            entities,
        })
    }
}
