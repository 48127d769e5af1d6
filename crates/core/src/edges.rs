//! The graph every diagram of a machine draws ([`crate::graph`]'s Mermaid and DOT,
//! [`crate::svg`]'s image): its edges in declaration order, each labelled with its auto
//! action or its event and what raises that event on its own in the source state, and each
//! state's notes (entry and exit actions, internal transitions).

use crate::duration;
use crate::machine::{Event, Machine, State, Then};

/// An edge of the diagram: `from -> to`, from an auto action or an event.
pub(crate) struct Edge<'m> {
    pub(crate) from: &'m str,
    pub(crate) to: &'m str,
    pub(crate) label: Label<'m>,
}

/// What an [`Edge`] is labelled with.
pub(crate) enum Label<'m> {
    /// The auto action.
    Auto(&'m str),
    /// The event, and what raises it on its own in the source state.
    Event(&'m str, Vec<String>),
}

impl Label<'_> {
    /// The label text; `sep` follows `auto` (Mermaid labels cannot hold a colon).
    pub(crate) fn text(&self, sep: &str) -> String {
        match self {
            Label::Auto(a) => format!("auto{sep} {a}"),
            Label::Event(e, notes) if notes.is_empty() => e.to_string(),
            Label::Event(e, notes) => format!("{e} ({})", notes.join(", ")),
        }
    }
}

/// What raises `event` on its own while the entity is in `state`: its subscription, the
/// timers running there, the timeouts of subscriptions valid there.
fn raised_by(machine: &Machine, state: &str, event: &Event) -> Vec<String> {
    let mut notes = Vec::new();
    if event.subscribe.is_some() {
        notes.push("subscription".to_string());
    }
    for t in machine.timers_in(state).filter(|t| t.event == event.name) {
        notes.push(format!("timer {}", t.schedule));
    }
    for sub in machine.subscriptions_in(state).filter_map(|e| e.subscribe.as_ref()) {
        if let Some(t) = sub.timeout.as_ref().filter(|t| t.event == event.name) {
            notes.push(format!("timeout after {}", duration::format(t.after)));
        }
    }
    notes
}

/// Every edge, grouped by source state in declaration order: the auto action's targets
/// first, then those of each event valid in the state. An event's target that an entity
/// receiving it is in (the state it is declared for, or a substate of it) is also a
/// re-entry: drawn as a loop on the target, noted `re-entry`. An action that raises events
/// on the entity itself notes them (`then E`).
pub(crate) fn edges(machine: &Machine) -> Vec<Edge<'_>> {
    let mut out = Vec::new();
    for s in machine.states() {
        if let Some(action) = s.auto.as_ref().and_then(|a| machine.action(a)) {
            for t in &action.targets {
                out.push(Edge { from: &s.name, to: &t.state, label: Label::Auto(&action.name) });
            }
        }
        for e in machine.events().iter().filter(|e| e.valid_in(&s.name)) {
            let notes = raised_by(machine, &s.name, e);
            let actions = e.alternatives.iter().filter(|a| a.applies_at(&s.name)).filter_map(|a| a.action());
            for action in actions.filter_map(|a| machine.action(a)) {
                let mut notes = notes.clone();
                notes.extend(action.raise_self.iter().map(|(event, _)| format!("then {event}")));
                for t in &action.targets {
                    let reentry = |notes: &Vec<String>| {
                        let mut notes = notes.clone();
                        notes.push("re-entry".to_string());
                        Label::Event(&e.name, notes)
                    };
                    if t.state == s.name {
                        out.push(Edge { from: &s.name, to: &t.state, label: reentry(&notes) });
                        continue;
                    }
                    out.push(Edge { from: &s.name, to: &t.state, label: Label::Event(&e.name, notes.clone()) });
                    if machine.is_in(&t.state, &s.name) {
                        out.push(Edge { from: &t.state, to: &t.state, label: reentry(&notes) });
                    }
                }
            }
        }
    }
    out
}

/// A parent's history, a state's entry and exit actions, the internal transitions declared
/// for it and the events it ignores (always, or while a guard holds), as diagram notes
/// (`history / deep`, `entry / announce`, `touch / record_touch (internal)`, `start
/// ignored`, `ping ignored if params.quiet`; `sep` follows the keyword).
pub(crate) fn notes(machine: &Machine, s: &State, sep: &str) -> Vec<String> {
    let mut notes = Vec::new();
    if let Some(h) = s.history {
        notes.push(format!("history{sep} {}", h.as_str()));
    }
    for a in &s.on_entry {
        notes.push(format!("entry{sep} {a}"));
    }
    for (event, actions) in &s.on_entry_from {
        for a in actions {
            notes.push(format!("entry from {event}{sep} {a}"));
        }
    }
    for a in &s.on_exit {
        notes.push(format!("exit{sep} {a}"));
    }
    for e in machine.events().iter().filter(|e| e.internal && e.valid_in(&s.name)) {
        for a in e.actions() {
            notes.push(format!("{}{sep} {a} (internal)", e.name));
        }
    }
    // Events accepted and dropped here: always (`ignore`), or while a guard holds.
    for e in machine.events() {
        if e.ignored_in(&s.name) {
            notes.push(format!("{} ignored", e.name));
        } else if e.valid_in(&s.name) {
            let guarded = e.alternatives.iter().filter(|a| a.applies_at(&s.name) && a.then == Then::Ignore);
            for g in guarded.filter_map(|a| a.guard.as_ref()) {
                notes.push(format!("{} ignored if {g}", e.name));
            }
        }
    }
    notes
}
