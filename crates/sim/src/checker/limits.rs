//! Limits (`[limits.NAME]`), after every batch write:
//! - **never over the limit**: the entities holding a slot of a key value are at most its
//!   `max`, and the count the store keeps (`in_use`) is the number holding one;
//! - **never faster than the rate**: two starts of a key value of a limit with a rate (the
//!   `since` of its holds) are at least `per / rate` apart;
//! - **no slot free while work waits**: a key value with entities in line has every slot
//!   taken — a slot given back is handed to the first in line in the same transaction, so
//!   none is ever seen idle beside waiting work; where the rate is what holds the line,
//!   one of it is leased or due by the time the rate allows the next start;
//! - **no one waits beyond one round**: every fairness value with work in line has its turn
//!   at the line's round or the one after (a value is admitted when its turn is lowest);
//! - **a limited action runs under its slots**: an auto action's end in a limited state (its
//!   transition, retry or fault) is committed only by an entity seen holding a slot of each
//!   of the state's limits before that batch;
//! - **a limited workflow runs under its slots**: an event a limit of workflows names is
//!   accepted (its action committed) only by an entity seen holding a slot of each of its
//!   limits before that batch, or after it (its commit took them first);
//! - **slots come back**: an entity holds a slot for its own action only in a state its
//!   limit names (a slot its canceled task keeps, while the agent's call is in flight, is
//!   the task's), and one for its workflow only mid-workflow (in an unstable state) or, at
//!   rest, leased or due (admitted: it runs the event next, or gives the slot back), or
//!   paused or asleep (resumed, it does; at the end of the run nobody holds one).
//!
//! At rest, nobody holds a slot or waits for one.

use std::collections::{BTreeMap, HashMap, HashSet};
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
    /// `None`: a limit of rate only.
    pub(crate) max: Option<i64>,
    /// Rows of `limit_holds` for it.
    pub(crate) holds: i64,
    /// Rows of `limit_waiters` for it.
    pub(crate) waiting: i64,
    /// Its rate's least time between starts (`None`: no rate), and the earliest next start.
    pub(crate) spacing_us: Option<i64>,
    pub(crate) next_us: i64,
    /// Whether one of its line is leased, or due by the time the rate allows a start.
    pub(crate) woken: bool,
    /// The line's round, and the turns of its fairness values with work waiting.
    pub(crate) round: i64,
    pub(crate) turns: Vec<i64>,
    /// What the slot row counts of its line and of the slots canceled tasks keep, and the
    /// rows of the latter.
    pub(crate) counted: (i64, i64),
    pub(crate) task_holds: i64,
}

/// An entity holding a slot of `limit`, in `state`: for its own action (`task` 0), or
/// kept by its agent's task canceled while the agent held it (the call is in flight).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct HoldSeen {
    pub(crate) limit: String,
    pub(crate) entity_id: i64,
    pub(crate) state: String,
    pub(crate) task: i64,
    /// The key value it holds, and when it took the slot.
    pub(crate) key: String,
    pub(crate) since: i64,
    /// A slot of a limit of workflows (held until the entity comes to rest).
    pub(crate) workflow: bool,
    /// Its entity is leased or due, or paused or asleep (it goes on when resumed).
    pub(crate) moving: bool,
}

/// The limits' model: which limits each (machine, state) counts against, who held which
/// slot at the last observation, and every start of a rate seen (per limit and key value:
/// when, by whom).
pub(crate) struct Limits {
    limited: HashMap<(String, String), Vec<String>>,
    /// The limits of workflows each (machine, event) counts against.
    workflows: HashMap<(String, String), Vec<String>>,
    /// The unstable states of each machine (mid-workflow).
    unstable: HashSet<(String, String)>,
    held: HashSet<(i64, String)>,
    starts: HashMap<(String, String), BTreeMap<i64, i64>>,
}

type Failure = (String, Vec<String>);

impl Limits {
    pub(crate) fn new(machines: &[Arc<Machine>]) -> Limits {
        let (mut limited, mut workflows) = (HashMap::new(), HashMap::new());
        let mut unstable = HashSet::new();
        for m in machines {
            for l in m.limits() {
                for s in &l.def.states {
                    limited
                        .entry((m.name().to_string(), s.clone()))
                        .or_insert_with(Vec::new)
                        .push(l.name().to_string());
                }
                for e in &l.def.events {
                    workflows
                        .entry((m.name().to_string(), e.clone()))
                        .or_insert_with(Vec::new)
                        .push(l.name().to_string());
                }
            }
            for s in m.states().iter().filter(|s| s.kind == settle_core::StateKind::Unstable) {
                unstable.insert((m.name().to_string(), s.name.to_string()));
            }
        }
        Limits { limited, workflows, unstable, held: HashSet::new(), starts: HashMap::new() }
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
            if s.counted != (s.waiting, s.task_holds) {
                return Err((
                    format!(
                        "{at}: counts {} in line and {} kept by tasks, but {} wait and tasks keep {}",
                        s.counted.0, s.counted.1, s.waiting, s.task_holds
                    ),
                    Vec::new(),
                ));
            }
            if let Some(max) = s.max.filter(|max| s.holds > *max) {
                return Err((format!("{at}: over its limit, {} hold a slot of {max}", s.holds), Vec::new()));
            }
            let free = s.max.is_none_or(|max| s.in_use < max);
            if s.waiting > 0 && free && s.spacing_us.is_none() {
                let max = s.max.unwrap_or_default();
                return Err((
                    format!("{at}: a slot is free ({} of {max} in use) while {} wait in line", s.in_use, s.waiting),
                    Vec::new(),
                ));
            }
            if s.waiting > 0 && free && !s.woken {
                return Err((
                    format!(
                        "{at}: {} wait for the rate, and none is due by the next start it allows ({} µs)",
                        s.waiting, s.next_us
                    ),
                    Vec::new(),
                ));
            }
            if let Some(t) = s.turns.iter().find(|t| **t < s.round || **t > s.round + 1) {
                return Err((
                    format!("{at}: a fairness value waits with turn {t} while the line is at round {}", s.round),
                    Vec::new(),
                ));
            }
        }
        for h in holds.iter().filter(|h| h.task == 0) {
            let Some(spacing) = slots.iter().find(|s| s.limit == h.limit && s.key == h.key).and_then(|s| s.spacing_us)
            else {
                continue;
            };
            let starts = self.starts.entry((h.limit.clone(), h.key.clone())).or_default();
            if starts.get(&h.since) == Some(&h.entity_id) {
                continue;
            }
            let before = starts.range(..=h.since).next_back().map(|(at, e)| (*at, *e));
            let after = starts.range(h.since..).next().map(|(at, e)| (*at, *e));
            for (at, other) in before.into_iter().chain(after) {
                // Starts are counted in milliseconds, each at its time under the rate within
                // its millisecond: two of them are at least the spacing less a millisecond
                // apart.
                if (h.since - at).abs() * 1_000 <= spacing - 1_000 {
                    let name = entities.name(h.entity_id);
                    return Err((
                        format!(
                            "{name}: started under `{}` (key `{}`) at {}, {} ms from {}'s start: faster than its rate \
                             ({spacing} µs apart)",
                            h.limit,
                            h.key,
                            h.since,
                            (h.since - at).abs(),
                            entities.name(other)
                        ),
                        vec![name],
                    ));
                }
            }
            starts.insert(h.since, h.entity_id);
        }
        let machine_of = |id: i64| entities.name(id).split_once('/').map(|(m, _)| m.to_string()).unwrap_or_default();
        for h in holds.iter().filter(|h| h.workflow) {
            if !h.moving && !self.unstable.contains(&(machine_of(h.entity_id), h.state.clone())) {
                let name = entities.name(h.entity_id);
                return Err((
                    format!(
                        "{name}: holds a slot of `{}` for a workflow at rest in `{}`, neither leased, due nor \
                         paused: it is never given back",
                        h.limit, h.state
                    ),
                    vec![name],
                ));
            }
        }
        for h in holds.iter().filter(|h| h.task == 0 && !h.workflow) {
            let names = self.limited.get(&(machine_of(h.entity_id), h.state.clone()));
            if !names.is_some_and(|n| n.contains(&h.limit)) {
                let name = entities.name(h.entity_id);
                return Err((
                    format!("{name}: holds a slot of `{}` in state `{}`, which it does not limit", h.limit, h.state),
                    vec![name],
                ));
            }
        }
        let held_after: HashSet<(i64, &str)> =
            holds.iter().filter(|h| h.task == 0).map(|h| (h.entity_id, h.limit.as_str())).collect();
        for row in history.iter().filter(|r| r.kind == "event") {
            let (Some(event), Some(to)) = (&row.event, &row.to) else { continue };
            let Some(limits) = self.workflows.get(&(row.machine.clone(), event.clone())) else { continue };
            // Taken before the batch, or by the commit itself (`take_first`): held after it,
            // unless that commit came to rest too, or a command of the same batch (a kill)
            // ended the workflow, and gave it back.
            let commanded =
                history.iter().any(|r| r.entity_id == row.entity_id && r.id > row.id && r.kind == "command");
            let at_rest = commanded || !self.unstable.contains(&(row.machine.clone(), to.clone()));
            let had = |l: &String| {
                self.held.contains(&(row.entity_id, l.to_string())) || held_after.contains(&(row.entity_id, l.as_str()))
            };
            if let Some(limit) = limits.iter().find(|l| !at_rest && !had(l)) {
                let name = format!("{}/{}", row.machine, row.key);
                return Err((
                    format!(
                        "{name}: its event `{event}` was accepted (history {}) without a slot of `{limit}` held before",
                        row.id
                    ),
                    vec![name],
                ));
            }
        }
        for row in history {
            let Some(from) = &row.from else { continue };
            let Some(limits) = self.limited.get(&(row.machine.clone(), from.clone())) else { continue };
            let ends_action = row.to.is_some() && matches!(row.kind.as_str(), "auto" | "fault");
            let missing = limits.iter().find(|l| !self.held.contains(&(row.entity_id, l.to_string())));
            if let Some(limit) = missing.filter(|_| ends_action) {
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
        self.held = holds.iter().filter(|h| h.task == 0).map(|h| (h.entity_id, h.limit.clone())).collect();
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
