//! What comes with being in a state besides its events: the timers that run there and
//! when they (re)start ([`timers_on_entry`], [`timer_applies`]), the agent task an
//! agent-executed auto action offers ([`agent_action`]), and which subscription fires
//! over the successors ([`fire`]). Timers and subscriptions declared on a parent run while
//! the entity is in any of its substates, and keep their schedule while it moves between
//! them.

use std::time::Duration;

use crate::machine::{Action, Event, Level, Machine, Schedule};
use crate::names::{EventName, StateName};
use crate::pattern::SuccessorView;

/// A timer to start on entering a state: one declared for the state (or an ancestor), or
/// the timeout of a subscription valid there. The runtime turns it into a stored due time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimerStart {
    /// The timer's name (`timeout:EVENT` for a subscription's timeout).
    pub name: String,
    /// The event it raises.
    pub event: EventName,
    /// When it first fires, counted from the entry.
    pub after: Duration,
    /// For a periodic timer: its period.
    pub every: Option<Duration>,
    /// Whether its schedule starts afresh at this entry; `false` for a timer or timeout
    /// that was already running before and whose state was not entered anew (it keeps its
    /// schedule): a periodic timer or a timeout that ran in the state left, a one-shot
    /// timer declared on a parent the entity stayed in. A re-entry of the state it runs in
    /// restarts it.
    pub restart: bool,
}

/// The timers an entity has after a transition from `from` (`None`: a new entity) into
/// the leaf `to`, entering `entered` (outermost first): the timers that run in `to` (its
/// own or an ancestor's), and the timeouts of the subscriptions valid there.
pub fn timers_on_entry(machine: &Machine, from: Option<&str>, to: &str, entered: &[StateName]) -> Vec<TimerStart> {
    let ran_before = |levels: &[StateName]| from.is_some_and(|f| machine.path(f).any(|s| levels.contains(&s.name)));
    // A state the entity was in and enters again: a re-entry restarts what runs there.
    let reentered = |state: &str| entered.iter().any(|s| s == state) && from.is_some_and(|f| machine.is_in(f, state));
    let mut starts: Vec<TimerStart> = machine
        .timers_in(to)
        .map(|t| {
            let before = ran_before(&t.valid_in);
            match t.schedule {
                Schedule::After(d) => TimerStart {
                    name: t.name.clone(),
                    event: t.event.clone(),
                    after: d,
                    every: None,
                    restart: !before || t.valid_in.iter().any(|s| entered.contains(s)),
                },
                Schedule::Every(d) => TimerStart {
                    name: t.name.clone(),
                    event: t.event.clone(),
                    after: d,
                    every: Some(d),
                    restart: !before || t.valid_in.iter().any(|s| reentered(s)),
                },
            }
        })
        .collect();
    for ev in machine.subscriptions_in(to) {
        if let Some(timeout) = ev.subscribe.as_ref().and_then(|s| s.timeout.as_ref()) {
            starts.push(TimerStart {
                name: format!("timeout:{}", ev.name),
                event: timeout.event.clone(),
                after: timeout.after,
                every: None,
                restart: !from.is_some_and(|f| machine.event_applies(ev, f))
                    || matches!(machine.event_level(ev, to), Some(Level::Valid(level)) if reentered(&level.name)),
            });
        }
    }
    starts
}

/// Whether entities of `machine` can have timers at all (declared timers or subscription
/// timeouts): if not, a state change never needs to touch them.
pub fn has_timers(machine: &Machine) -> bool {
    !machine.timers().is_empty()
        || machine.events().iter().any(|e| e.subscribe.as_ref().is_some_and(|s| s.timeout.is_some()))
}

/// Whether the timer `name`, which raised `event`, still applies in `state` (a timer that
/// fired just as its entity left its states does not).
pub fn timer_applies(machine: &Machine, state: &str, name: &str, event: &str) -> bool {
    if let Some(sub_event) = name.strip_prefix("timeout:") {
        return machine.event(sub_event).is_some_and(|e| {
            machine.event_applies(e, state)
                && e.subscribe.as_ref().and_then(|s| s.timeout.as_ref()).is_some_and(|t| t.event == event)
        });
    }
    machine.timers_in(state).any(|t| t.name == name && t.event == event)
}

/// The auto action of `state` when an external agent executes it: entering the state
/// offers its task on the action's queue instead of running anything.
pub fn agent_action<'m>(machine: &'m Machine, state: &str) -> Option<&'m Action> {
    machine.action(machine.state(state)?.auto.as_ref()?).filter(|a| a.agent.is_some())
}

/// The subscription that fires for an entity in `state` over a snapshot of its
/// successors: the first valid in `state` (declaration order), not yet `fired` in this
/// state entry, whose pattern holds; with the indices of the successors that made it hold.
pub fn fire<'m>(
    machine: &'m Machine,
    state: &str,
    fired: &[EventName],
    successors: &[SuccessorView<'_>],
) -> Option<(&'m Event, Vec<usize>)> {
    machine.subscriptions_in(state).filter(|ev| !fired.contains(&ev.name)).find_map(|ev| {
        let sub = ev.subscribe.as_ref()?;
        sub.pattern.eval(successors).map(|matched| (ev, matched))
    })
}
