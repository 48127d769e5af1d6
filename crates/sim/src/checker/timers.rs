//! Timers fire once per due time, never early, never after their state was left
//! ([`Timers`]). Every firing counts, accepted or rejected: a timer that fires again and
//! again shows as rejected events, not as transitions.
//!
//! From the machines' definitions: each timer (`after`, `every`) and each subscription's
//! timeout, with the states it runs in. From the history: each entity's stays in those
//! states (consecutive entries of states the timer runs in; a retry re-enters the same
//! state). A firing raised at `t` must fall in a stay (entered at or before `t`, left at or
//! after it), come no earlier than the stay's decision time plus the delay (for `every`,
//! the k-th firing k periods), and an `after` timer fires at most once per entry of its
//! stay.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use settle_core::Machine;
use settle_core::machine::Schedule;

use super::Fired;
use super::history::{Entities, Failure};

/// A timer's definition, by the event it raises.
#[derive(Debug, Clone)]
struct Def {
    name: String,
    delay_ms: i64,
    periodic: bool,
    valid_in: Vec<String>,
}

/// The timers' model.
pub(crate) struct Timers {
    /// By (machine, event).
    defs: HashMap<(String, String), Def>,
    machines: HashMap<String, Arc<Machine>>,
    /// Firings already checked, by inbox id.
    seen: HashSet<i64>,
    /// Firings counted against each stay: (entity, the stay's first row, event).
    used: HashMap<(i64, i64, String), i64>,
}

impl Timers {
    pub(crate) fn new(machines: &[Arc<Machine>]) -> Timers {
        let mut defs = HashMap::new();
        for m in machines {
            for t in m.timers() {
                let (delay, periodic) = match t.schedule {
                    Schedule::After(d) => (d, false),
                    Schedule::Every(d) => (d, true),
                };
                let valid_in = t.valid_in.iter().map(ToString::to_string).collect();
                let def = Def { name: t.name.clone(), delay_ms: delay.as_millis() as i64, periodic, valid_in };
                defs.insert((m.name().to_string(), t.event.to_string()), def);
            }
            for e in m.events() {
                if let Some(timeout) = e.subscribe.as_ref().and_then(|s| s.timeout.as_ref()) {
                    let def = Def {
                        name: format!("timeout of `{}`", e.name),
                        delay_ms: timeout.after.as_millis() as i64,
                        periodic: false,
                        valid_in: e.valid_in.iter().map(ToString::to_string).collect(),
                    };
                    defs.insert((m.name().to_string(), timeout.event.to_string()), def);
                }
            }
        }
        let machines = machines.iter().map(|m| (m.name().to_string(), m.clone())).collect();
        Timers { defs, machines, seen: HashSet::new(), used: HashMap::new() }
    }

    /// Whether `state` of `machine` (or one of its ancestors) is one the timer runs in.
    fn runs_in(&self, machine: &str, def: &Def, state: &str) -> bool {
        match self.machines.get(machine) {
            Some(m) => m.path(state).any(|s| def.valid_in.iter().any(|v| *v == s.name.as_str())),
            None => def.valid_in.iter().any(|v| v == state),
        }
    }

    /// Checks the timer firings of `fired` not seen before.
    pub(crate) fn check(&mut self, fired: &[Fired], entities: &Entities) -> Result<(), Failure> {
        for f in fired.iter().filter(|f| f.kind == "timer") {
            if !self.seen.insert(f.id) {
                continue;
            }
            let Some(e) = entities.get(f.entity_id) else { continue };
            let Some(def) = self.defs.get(&(e.machine.clone(), f.event.clone())).cloned() else {
                let name = e.name.clone();
                return Err((format!("{name}: a timer raised `{}`, which no timer of it raises", f.event), vec![name]));
            };
            // The stays: runs of consecutive entries into states the timer runs in, each with
            // when it began, was decided, ended, and how many entries it has.
            let mut stays: Vec<(i64, i64, Option<i64>, i64, usize)> = Vec::new();
            let mut open: Option<(i64, i64, Option<i64>, usize)> = None;
            for entry in &e.entries {
                let runs = self.runs_in(&e.machine, &def, &entry.state);
                match (&mut open, runs) {
                    (Some((_, _, _, n)), true) => *n += 1,
                    (None, true) => open = Some((entry.row, entry.at, entry.decided_after, 1)),
                    (Some((row, at, decided, n)), false) => {
                        stays.push((*row, *at, *decided, entry.at, *n));
                        open = None;
                    }
                    (None, false) => {}
                }
            }
            if let Some((row, at, decided, n)) = open {
                stays.push((row, at, decided, i64::MAX, n));
            }
            let t = f.raised_at;
            let outcome = if f.rejected { "rejected" } else { "accepted" };
            let name = e.name.clone();
            let Some(&(row, _, decided, _, entries)) =
                stays.iter().rev().find(|(_, began, _, ended, _)| *began <= t && t <= *ended)
            else {
                return Err((
                    format!(
                        "{name}: its timer `{}` fired at {t} ({outcome}) while the entity was in none of its states \
                         {:?} (its entries: {})",
                        def.name,
                        def.valid_in,
                        entries_text(e)
                    ),
                    vec![name],
                ));
            };
            let used = self.used.entry((f.entity_id, row, f.event.clone())).or_default();
            *used += 1;
            let k = *used;
            if !def.periodic && k > entries as i64 {
                return Err((
                    format!(
                        "{name}: its timer `{}` fired {k} times in one stay of {entries} entr{} (at {t}, {outcome}): \
                         once per due time",
                        def.name,
                        if entries == 1 { "y" } else { "ies" }
                    ),
                    vec![name],
                ));
            }
            let periods = if def.periodic { k } else { 1 };
            if let Some(decided) = decided
                && t < decided + periods * def.delay_ms
            {
                return Err((
                    format!(
                        "{name}: its timer `{}` fired at {t} ({outcome}), before it was due: its state was entered \
                         no earlier than {decided}, and it fires {} ms after",
                        def.name,
                        periods * def.delay_ms
                    ),
                    vec![name],
                ));
            }
        }
        Ok(())
    }
}

fn entries_text(e: &super::history::Entity) -> String {
    e.entries.iter().map(|x| format!("{}@{}", x.state, x.at)).collect::<Vec<_>>().join(", ")
}
