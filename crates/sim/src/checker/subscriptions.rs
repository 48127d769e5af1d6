//! Subscriptions fire only when their pattern held over the subscriber's successors, once
//! per state entry, and fire when it holds ([`Subscriptions`]).
//!
//! The pattern is evaluated here on its own terms, not with the engine's evaluator (which
//! is what a bug could break): `all(F) in [..]` (at least one successor of filter `F` and
//! every one in those states), `any(F) in [..]`, `none(F) in [..]`, `F` a machine or `*`.
//! Other patterns, and successors of machines with substates, are not checked.
//!
//! After every batch the pattern of each subscription valid in its subscriber's state is
//! evaluated over the successors' states: the subscriber's entry remembers that it held. A
//! subscription event processed in an entry whose pattern never held at the end of an
//! earlier batch (the engine evaluates a snapshot read between batches) fired when it
//! should not have; one processed twice in an entry fired twice. At rest, a subscription
//! whose pattern holds in its subscriber's state, unfired in that entry, should have fired.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use settle_core::Machine;

use super::Fired;
use super::HistoryRow;
use super::history::{Entities, Failure};

/// A pattern the checker evaluates itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Mini {
    quantifier: Quantifier,
    /// The successors' machine; `None`: any (`*`).
    filter: Option<String>,
    states: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Quantifier {
    All,
    Any,
    None,
}

impl Mini {
    /// `all(F) in [a, b]`, `any(F) in [..]`, `none(F) in [..]`; `None` for anything else.
    pub(crate) fn parse(text: &str) -> Option<Mini> {
        let text: String = text.chars().filter(|c| !c.is_whitespace()).collect();
        let (quantifier, rest) = if let Some(r) = text.strip_prefix("all(") {
            (Quantifier::All, r)
        } else if let Some(r) = text.strip_prefix("any(") {
            (Quantifier::Any, r)
        } else if let Some(r) = text.strip_prefix("none(") {
            (Quantifier::None, r)
        } else {
            return None;
        };
        let (filter, rest) = rest.split_once(')')?;
        let filter = filter.strip_prefix("type=").unwrap_or(filter);
        let states = rest.strip_prefix("in[")?.strip_suffix(']')?;
        let states: Vec<String> = states.split(',').map(str::to_string).collect();
        if filter.is_empty() || states.iter().any(String::is_empty) {
            return None;
        }
        Some(Mini { quantifier, filter: (filter != "*").then(|| filter.to_string()), states })
    }

    /// Whether it holds over `successors` (machine, state).
    pub(crate) fn holds(&self, successors: &[(&str, &str)]) -> bool {
        let mut picked = successors.iter().filter(|(m, _)| self.filter.as_deref().is_none_or(|f| f == *m)).peekable();
        let is_in = |(_, s): &&(&str, &str)| self.states.iter().any(|x| x == s);
        match self.quantifier {
            Quantifier::All => picked.peek().is_some() && picked.all(|s| is_in(&s)),
            Quantifier::Any => picked.any(|s| is_in(&s)),
            Quantifier::None => !picked.any(|s| is_in(&s)),
        }
    }
}

/// A subscription: its event, its pattern (if the checker evaluates it), where it is valid.
#[derive(Debug, Clone)]
struct Sub {
    event: String,
    text: String,
    pattern: Option<Mini>,
    valid_in: Vec<String>,
}

/// A subscriber's current entry: what held, what fired.
#[derive(Debug, Default, Clone)]
struct Entry {
    state: String,
    held: HashSet<String>,
    fired: HashSet<String>,
}

/// The subscriptions' model.
pub(crate) struct Subscriptions {
    /// By machine.
    subs: HashMap<String, Vec<Sub>>,
    machines: HashMap<String, Arc<Machine>>,
    /// Successors by predecessor.
    successors: HashMap<i64, Vec<i64>>,
    /// By subscriber.
    entries: HashMap<i64, Entry>,
}

impl Subscriptions {
    pub(crate) fn new(machines: &[Arc<Machine>]) -> Subscriptions {
        let mut subs: HashMap<String, Vec<Sub>> = HashMap::new();
        for m in machines {
            for e in m.events() {
                let Some(s) = &e.subscribe else { continue };
                let text = s.pattern.to_string();
                subs.entry(m.name().to_string()).or_default().push(Sub {
                    event: e.name.to_string(),
                    pattern: Mini::parse(&text),
                    text,
                    valid_in: e.valid_in.iter().map(ToString::to_string).collect(),
                });
            }
        }
        let machines = machines.iter().map(|m| (m.name().to_string(), m.clone())).collect();
        Subscriptions { subs, machines, successors: HashMap::new(), entries: HashMap::new() }
    }

    fn valid(&self, machine: &str, sub: &Sub, state: &str) -> bool {
        match self.machines.get(machine) {
            Some(m) => m.path(state).any(|s| sub.valid_in.iter().any(|v| *v == s.name.as_str())),
            None => sub.valid_in.iter().any(|v| v == state),
        }
    }

    /// Takes the next history row (the entities have taken it already): a subscription
    /// event it processes must have held in the entry it ends, and fire once there.
    pub(crate) fn apply(&mut self, h: &HistoryRow, entities: &Entities) -> Result<(), Failure> {
        let Some(subs) = self.subs.get(&h.machine) else { return Ok(()) };
        let name = format!("{}/{}", h.machine, h.key);
        if let Some(event) = &h.event
            && let Some(sub) = subs.iter().find(|s| s.event == *event)
            && sub.pattern.is_some()
            && h.kind != "create"
        {
            let entry = self.entries.entry(h.entity_id).or_default();
            if !entry.held.contains(event) {
                return Err((
                    format!(
                        "{name}: subscription `{event}` fired in `{}` (history row {}), but its pattern `{}` never held \
                         over its successors since it entered `{}`",
                        entry.state, h.id, sub.text, entry.state
                    ),
                    vec![name],
                ));
            }
            if !entry.fired.insert(event.clone()) {
                return Err((
                    format!("{name}: subscription `{event}` fired twice in one entry of `{}`", entry.state),
                    vec![name],
                ));
            }
        }
        if h.to.is_some() {
            let state = entities.get(h.entity_id).map(|e| e.state().to_string()).unwrap_or_default();
            self.entries.insert(h.entity_id, Entry { state, ..Entry::default() });
        }
        Ok(())
    }

    /// The successors' states of `id`, or `None` when one has substates (not checked).
    fn successor_states<'e>(&self, id: i64, entities: &'e Entities) -> Option<Vec<(&'e str, &'e str)>> {
        let mut out = Vec::new();
        for s in self.successors.get(&id).into_iter().flatten() {
            let e = entities.get(*s)?;
            if self.machines.get(&e.machine).is_some_and(|m| m.is_nested()) {
                return None;
            }
            out.push((e.machine.as_str(), e.state()));
        }
        Some(out)
    }

    /// The end of a batch: the successor edges as they are, the firings processed (unused:
    /// their history rows carry them); remembers, for each subscriber, which patterns hold.
    /// The successor edges (predecessor, successor) as last seen.
    pub(crate) fn edges(&self) -> Vec<(i64, i64)> {
        self.successors.iter().flat_map(|(p, ss)| ss.iter().map(move |s| (*p, *s))).collect()
    }

    pub(crate) fn settle(
        &mut self,
        edges: &[(i64, i64)],
        _fired: &[Fired],
        entities: &Entities,
    ) -> Result<(), Failure> {
        self.successors.clear();
        for &(p, s) in edges {
            self.successors.entry(p).or_default().push(s);
        }
        let ids: Vec<i64> = self.entries.keys().copied().collect();
        for id in ids {
            let Some(e) = entities.get(id) else { continue };
            let Some(states) = self.successor_states(id, entities) else { continue };
            let state = e.state().to_string();
            let holding: Vec<String> = self.subs[&e.machine]
                .iter()
                .filter(|s| self.valid(&e.machine, s, &state))
                .filter(|s| s.pattern.as_ref().is_some_and(|p| p.holds(&states)))
                .map(|s| s.event.clone())
                .collect();
            if let Some(entry) = self.entries.get_mut(&id) {
                entry.held.extend(holding);
            }
        }
        Ok(())
    }

    /// At rest: a subscription valid in its live subscriber's state whose pattern holds has
    /// fired in that entry.
    pub(crate) fn at_rest(&self, entities: &Entities, killed: &HashSet<String>) -> Result<(), Failure> {
        let mut ids: Vec<&i64> = self.entries.keys().collect();
        ids.sort();
        for id in ids {
            let Some(e) = entities.get(*id) else { continue };
            if killed.contains(&e.name) {
                continue;
            }
            let Some(states) = self.successor_states(*id, entities) else { continue };
            let entry = &self.entries[id];
            for s in &self.subs[&e.machine] {
                let holds = s.pattern.as_ref().is_some_and(|p| p.holds(&states));
                if holds && self.valid(&e.machine, s, e.state()) && !entry.fired.contains(&s.event) {
                    return Err((
                        format!(
                            "{}: at rest in `{}`, its subscription `{}` never fired though its pattern `{}` holds over \
                             its successors {states:?}",
                            e.name,
                            e.state(),
                            s.event,
                            s.text
                        ),
                        vec![e.name.clone()],
                    ));
                }
            }
        }
        Ok(())
    }
}
