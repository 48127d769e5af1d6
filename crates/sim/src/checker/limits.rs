//! Concurrency limits (`[limits.NAME]`), after every batch write:
//! - **never over the limit**: the entities holding a slot of a key value are at most its
//!   `max`, and the count the store keeps (`in_use`) is the number holding one;
//! - **no slot free while work waits**: a key value with entities in line has every slot
//!   taken — a slot given back is handed to the first in line in the same transaction, so
//!   none is ever seen idle beside waiting work;
//! - **a limited action runs under a slot**: an auto action's end in a limited state (its
//!   transition, retry or fault) is committed only by an entity seen holding a slot before
//!   that batch;
//! - **slots come back**: an entity holds a slot for its own action only in a state its
//!   limit names (a slot its canceled task keeps, while the agent's call is in flight, is
//!   the task's).
//!
//! At rest, nobody holds a slot or waits for one.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use settle_core::Machine;

use super::HistoryRow;
use super::history::Entities;

/// A limit's key value as the store holds it after a batch.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SlotSeen {
    pub(crate) limit: String,
    pub(crate) key: String,
    /// The store's count of slots in use.
    pub(crate) in_use: i64,
    pub(crate) max: i64,
    /// Rows of `limit_holds` for it.
    pub(crate) holds: i64,
    /// Rows of `limit_waiters` for it.
    pub(crate) waiting: i64,
}

/// An entity holding a slot of `limit`, in `state`: for its own action (`task` 0), or
/// kept by its agent's task canceled while the agent held it (the call is in flight).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct HoldSeen {
    pub(crate) limit: String,
    pub(crate) entity_id: i64,
    pub(crate) state: String,
    pub(crate) task: i64,
}

/// The limits' model: which (machine, state) each limit names, and who held a slot at the
/// last observation.
pub(crate) struct Limits {
    limited: HashMap<(String, String), String>,
    held: HashSet<i64>,
}

type Failure = (String, Vec<String>);

impl Limits {
    pub(crate) fn new(machines: &[Arc<Machine>]) -> Limits {
        let mut limited = HashMap::new();
        for m in machines {
            for l in m.limits() {
                for s in &l.def.states {
                    limited.insert((m.name().to_string(), s.clone()), l.name().to_string());
                }
            }
        }
        Limits { limited, held: HashSet::new() }
    }

    /// The invariants over one batch's observation: its new history rows, and the slots and
    /// holds after it.
    pub(crate) fn check(
        &mut self,
        history: &[HistoryRow],
        slots: &[SlotSeen],
        holds: &[HoldSeen],
        entities: &Entities,
    ) -> Result<(), Failure> {
        for s in slots {
            let at = format!("limit `{}` (key `{}`)", s.limit, s.key);
            if s.in_use != s.holds {
                return Err((format!("{at}: counts {} in use, but {} hold a slot", s.in_use, s.holds), Vec::new()));
            }
            if s.holds > s.max {
                return Err((format!("{at}: over its limit, {} hold a slot of {}", s.holds, s.max), Vec::new()));
            }
            if s.waiting > 0 && s.in_use < s.max {
                return Err((
                    format!("{at}: a slot is free ({} of {} in use) while {} wait in line", s.in_use, s.max, s.waiting),
                    Vec::new(),
                ));
            }
        }
        let machine_of = |id: i64| entities.name(id).split_once('/').map(|(m, _)| m.to_string()).unwrap_or_default();
        for h in holds.iter().filter(|h| h.task == 0) {
            let names = self.limited.get(&(machine_of(h.entity_id), h.state.clone()));
            if names != Some(&h.limit) {
                let name = entities.name(h.entity_id);
                return Err((
                    format!("{name}: holds a slot of `{}` in state `{}`, which it does not limit", h.limit, h.state),
                    vec![name],
                ));
            }
        }
        for row in history {
            let Some(from) = &row.from else { continue };
            let Some(limit) = self.limited.get(&(row.machine.clone(), from.clone())) else { continue };
            let ends_action = row.to.is_some() && matches!(row.kind.as_str(), "auto" | "fault");
            if ends_action && !self.held.contains(&row.entity_id) {
                let name = format!("{}/{}", row.machine, row.key);
                return Err((
                    format!(
                        "{name}: its action in `{from}` ended (history {}, {}) without a slot of `{limit}` held before",
                        row.id, row.kind
                    ),
                    vec![name],
                ));
            }
        }
        self.held = holds.iter().filter(|h| h.task == 0).map(|h| h.entity_id).collect();
        Ok(())
    }

    /// At rest: no slot held, nobody in line (`left`: `machine/key` of each that does).
    pub(crate) fn at_rest(left: &[(String, String)]) -> Result<(), Failure> {
        match left.first() {
            None => Ok(()),
            Some((name, what)) => Err((format!("{name}: at rest, still {what}"), vec![name.clone()])),
        }
    }
}
