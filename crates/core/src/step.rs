//! The pure step function: what the runtime does next, decided from data only.
//!
//! The engine asks these questions here and never answers them itself:
//! - may this event be raised at all ([`check_raise`]: known event, right parameters)?
//!   May it be refused at once because the entity is at rest ([`refuse_at_rest`])?
//! - what does this event do in the entity's current state ([`on_event`]), what does its
//!   auto action do ([`on_auto`]), and is that auto action due ([`auto_due`])?
//! - may this action outcome be committed, and what does the entity enter ([`enter`])?
//! - what comes with entering a state: its timers ([`timers_on_entry`]), the agent task it
//!   offers ([`agent_action`]); does a fired timer still apply ([`timer_applies`])?
//! - which subscription fires over a snapshot of the successors ([`fire`])?
//!
//! No IO, no clock: time arrives as arguments or as durations relative to "now", chosen
//! by the caller.

use std::time::Duration;

use serde_json::{Map, Value};

use crate::machine::{Action, Event, Machine, Schedule, State, StateKind};
use crate::names::{ActionName, EventName, MachineName, StateName};
use crate::pattern::SuccessorView;

/// Entity properties: a JSON object.
pub type Properties = Map<String, Value>;

/// An event that could not be raised at all (bad input; nothing is written).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RaiseError {
    /// The machine declares no such event.
    #[error("machine `{machine}` has no event `{event}`")]
    UnknownEvent {
        /// The machine.
        machine: MachineName,
        /// The event asked for.
        event: String,
    },
    /// The event's parameters are not a JSON object.
    #[error("parameters of event `{event}` on machine `{machine}` must be a JSON object")]
    ParamsNotObject {
        /// The machine.
        machine: MachineName,
        /// The event.
        event: EventName,
    },
    /// A declared parameter is missing.
    #[error("event `{event}` on machine `{machine}` requires parameter `{param}`")]
    MissingParam {
        /// The machine.
        machine: MachineName,
        /// The event.
        event: EventName,
        /// The missing parameter.
        param: String,
    },
    /// A parameter was given that the event does not declare.
    #[error("event `{event}` on machine `{machine}` has no parameter `{param}` (declared: {declared})")]
    UnknownParam {
        /// The machine.
        machine: MachineName,
        /// The event.
        event: EventName,
        /// The unexpected parameter.
        param: String,
        /// The declared parameters, comma-separated, or "none".
        declared: String,
    },
}

/// Checks that `event` exists on `machine` and `params` match its declaration.
pub fn check_raise<'m>(
    machine: &'m Machine,
    event: &str,
    params: &Value,
) -> Result<&'m crate::machine::Event, RaiseError> {
    let ev = machine
        .event(event)
        .ok_or_else(|| RaiseError::UnknownEvent { machine: machine.name().clone(), event: event.to_string() })?;
    let empty = Map::new();
    let obj = match params {
        Value::Null => &empty,
        Value::Object(o) => o,
        _ => {
            return Err(RaiseError::ParamsNotObject { machine: machine.name().clone(), event: ev.name.clone() });
        }
    };
    for p in &ev.params {
        if !obj.contains_key(p) {
            return Err(RaiseError::MissingParam {
                machine: machine.name().clone(),
                event: ev.name.clone(),
                param: p.clone(),
            });
        }
    }
    if let Some(extra) = obj.keys().find(|k| !ev.params.iter().any(|p| p == *k)) {
        return Err(RaiseError::UnknownParam {
            machine: machine.name().clone(),
            event: ev.name.clone(),
            param: extra.clone(),
            declared: if ev.params.is_empty() { "none".to_string() } else { ev.params.join(", ") },
        });
    }
    Ok(ev)
}

/// An event refused in the entity's current state: an outcome, not an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    /// The state the entity was in.
    pub state: StateName,
    /// The event refused.
    pub event: EventName,
    /// The declared reason, or the default `event `e` is not valid in state `s``.
    pub reason: String,
}

/// What processing an event in a state comes to.
#[derive(Debug, Clone, PartialEq)]
pub enum EventStep<'m> {
    /// The event is not valid here; nothing changes.
    Reject(Rejection),
    /// The action has one target and no handler: the engine moves the entity itself.
    Plain {
        /// The action.
        action: &'m Action,
        /// Its one target.
        target: StateName,
    },
    /// The action's handler must run and report an outcome.
    Run {
        /// The action.
        action: &'m Action,
    },
    /// The action is executed by an external agent (only ever a state's auto action): its
    /// task is offered on the queue, and the agent's report is its outcome.
    Agent {
        /// The action.
        action: &'m Action,
        /// The queue it is offered on.
        queue: &'m str,
    },
}

/// Decides what `event` does in `state`. `has_handler` tells whether the action has an
/// implementation bound (otherwise a one-target action is a plain transition).
pub fn on_event<'m>(machine: &'m Machine, state: &str, event: &str, has_handler: bool) -> EventStep<'m> {
    let Some(ev) = machine.event(event) else {
        return EventStep::Reject(Rejection {
            state: StateName::new(state),
            event: EventName::new(event),
            reason: format!("machine `{}` has no event `{event}`", machine.name()),
        });
    };
    if !ev.valid_in(state) {
        return EventStep::Reject(rejection(ev, state));
    }
    let action = machine.action(&ev.action).expect("validated machine: event action exists");
    plain_or_run(action, has_handler)
}

/// The rejection of `ev` in `state`, where it is not valid: its declared reason, or the
/// default one.
fn rejection(ev: &Event, state: &str) -> Rejection {
    let reason =
        ev.reject.get(state).cloned().unwrap_or_else(|| format!("event `{}` is not valid in state `{state}`", ev.name));
    Rejection { state: StateName::new(state), event: ev.name.clone(), reason }
}

/// The rule for an event raised on an entity *at rest*: if `event` is not valid in its
/// state, it is refused at once and nothing is recorded, since nothing could make it valid
/// before its turn. `moving` says whether anything may still change the entity's state
/// first (its auto action is pending, an engine holds its lease, or events are queued):
/// then the event is queued and decided in order like any other. `None`: not refused now
/// (valid here, unknown to the machine — [`check_raise`] answers that —, or the entity
/// may move).
pub fn refuse_at_rest(machine: &Machine, state: &str, event: &str, moving: bool) -> Option<Rejection> {
    let ev = machine.event(event)?;
    let at_rest = machine.state(state).is_some_and(State::at_rest);
    (at_rest && !moving && !ev.valid_in(state)).then(|| rejection(ev, state))
}

/// Whether the auto action of an entity in `state` may run at `now`: the state is
/// unstable and the action's time (`auto_at`, `None`: at once) has come.
pub fn auto_due(machine: &Machine, state: &str, auto_at: Option<i64>, now: i64) -> bool {
    machine.state(state).is_some_and(|s| s.kind == StateKind::Unstable) && auto_at.is_none_or(|at| at <= now)
}

/// What running the auto action of `state` comes to (`None` if the state has none).
pub fn on_auto<'m>(machine: &'m Machine, state: &str, has_handler: bool) -> Option<EventStep<'m>> {
    let auto = machine.state(state)?.auto.as_ref()?;
    let action = machine.action(auto).expect("validated machine: auto action exists");
    if let Some(binding) = &action.agent {
        return Some(EventStep::Agent { action, queue: &binding.queue });
    }
    Some(plain_or_run(action, has_handler))
}

fn plain_or_run(action: &Action, has_handler: bool) -> EventStep<'_> {
    match (&action.targets[..], has_handler) {
        ([only], false) => EventStep::Plain { action, target: only.state.clone() },
        _ => EventStep::Run { action },
    }
}

/// Why an action's outcome cannot be committed. The entity stays where it is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The outcome names a state the action does not declare.
    #[error("action `{action}` of machine `{machine}` may not move to `{target}` (declared: {declared})")]
    UndeclaredTarget {
        /// The machine.
        machine: MachineName,
        /// The action.
        action: ActionName,
        /// The target asked for.
        target: String,
        /// Declared targets, comma-separated.
        declared: String,
    },
    /// The target state's required properties would not be set.
    #[error("state `{state}` of machine `{machine}` requires {}", missing.iter().map(|p| format!("`{p}`")).collect::<Vec<_>>().join(", "))]
    InvariantViolated {
        /// The machine.
        machine: MachineName,
        /// The state whose invariant fails.
        state: StateName,
        /// The properties missing or null.
        missing: Vec<String>,
    },
}

/// An entry into a state, decided and ready to commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The state entered.
    pub state: StateName,
    /// Retry count of this state entry (0 unless an unstable state re-enters itself).
    pub retry: u32,
    /// For unstable states: the delay before the auto action runs. `None` when at rest.
    pub auto_delay: Option<Duration>,
}

impl Entry {
    /// Whether the entity is at rest after this entry (stable, terminal or deleted).
    pub fn at_rest(&self) -> bool {
        self.auto_delay.is_none()
    }
}

/// Properties that `state` requires but `props` lacks (absent or null).
pub fn missing_required(state: &State, props: &Properties) -> Vec<String> {
    state.requires.iter().filter(|p| props.get(*p).is_none_or(Value::is_null)).cloned().collect()
}

/// The entry into the initial state of a new entity with `props`.
pub fn initial_entry(machine: &Machine, props: &Properties) -> Result<Entry, Refusal> {
    let state = machine.initial();
    check_invariant(machine, state, props)?;
    Ok(Entry { state: state.name.clone(), retry: 0, auto_delay: auto_delay(state, Duration::ZERO, None) })
}

/// Decides the entry that `action`, run in state `from` (entered `retry` times so far),
/// makes when it asks for `target` (`None`: re-enter `from`) after `delay`, given the
/// properties the entity would have after the commit.
///
/// Re-entering the current state is always allowed (it is how actions retry); any other
/// target must be declared. The delay before an unstable target's auto action is the
/// delay the action asked for, if any; otherwise the target state's `wait` plus the
/// wait declared on this transition.
pub fn enter(
    machine: &Machine,
    from: &State,
    action: &Action,
    target: Option<&str>,
    delay: Option<Duration>,
    retry: u32,
    props_after: &Properties,
) -> Result<Entry, Refusal> {
    let target_name = target.unwrap_or(&from.name);
    let declared = action.target(target_name);
    if declared.is_none() && target_name != from.name.as_str() {
        return Err(Refusal::UndeclaredTarget {
            machine: machine.name().clone(),
            action: action.name.clone(),
            target: target_name.to_string(),
            declared: action.targets.iter().map(|t| t.state.as_str()).collect::<Vec<_>>().join(", "),
        });
    }
    let state = machine.state(target_name).expect("declared targets and the current state exist");
    check_invariant(machine, state, props_after)?;
    let is_retry =
        state.name == from.name && state.kind == StateKind::Unstable && from.auto.as_ref() == Some(&action.name);
    let transition_wait = declared.map(|t| t.wait).unwrap_or_default();
    Ok(Entry {
        state: state.name.clone(),
        retry: if is_retry { retry + 1 } else { 0 },
        auto_delay: auto_delay(state, transition_wait, delay),
    })
}

fn auto_delay(state: &State, transition_wait: Duration, requested: Option<Duration>) -> Option<Duration> {
    (state.kind == StateKind::Unstable).then(|| requested.unwrap_or(state.wait + transition_wait))
}

fn check_invariant(machine: &Machine, state: &State, props: &Properties) -> Result<(), Refusal> {
    let missing = missing_required(state, props);
    if missing.is_empty() {
        Ok(())
    } else {
        Err(Refusal::InvariantViolated { machine: machine.name().clone(), state: state.name.clone(), missing })
    }
}

/// A change to one property, buffered by an action and applied at commit.
#[derive(Debug, Clone, PartialEq)]
pub enum PropChange {
    /// Set `key` to a value.
    Set(String, Value),
    /// Remove `key`.
    Remove(String),
}

/// Applies buffered property changes in order.
pub fn apply_changes(props: &mut Properties, changes: &[PropChange]) {
    for c in changes {
        match c {
            PropChange::Set(k, v) => {
                props.insert(k.clone(), v.clone());
            }
            PropChange::Remove(k) => {
                props.remove(k);
            }
        }
    }
}

/// A timer to start on entering a state: one declared for the state, or the timeout of a
/// subscription valid there. The runtime turns it into a stored due time.
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
    /// Whether its schedule starts afresh at this entry; `false` for a periodic timer or
    /// a timeout that was already running in the state left (it keeps its schedule).
    pub restart: bool,
}

/// The timers an entity has after entering `to` from `from` (`None`: a new entity): the
/// timers declared for `to`, and the timeouts of the subscriptions valid in `to`. One-shot
/// timers start at the entry; a periodic timer, or a timeout, that was already running in
/// `from` keeps its schedule.
pub fn timers_on_entry(machine: &Machine, from: Option<&str>, to: &str) -> Vec<TimerStart> {
    let from = from.unwrap_or_default();
    let mut starts: Vec<TimerStart> = machine
        .timers_in(to)
        .map(|t| match t.schedule {
            Schedule::After(d) => {
                TimerStart { name: t.name.clone(), event: t.event.clone(), after: d, every: None, restart: true }
            }
            Schedule::Every(d) => TimerStart {
                name: t.name.clone(),
                event: t.event.clone(),
                after: d,
                every: Some(d),
                restart: !t.valid_in(from),
            },
        })
        .collect();
    for ev in machine.subscriptions_in(to) {
        if let Some(timeout) = ev.subscribe.as_ref().and_then(|s| s.timeout.as_ref()) {
            starts.push(TimerStart {
                name: format!("timeout:{}", ev.name),
                event: timeout.event.clone(),
                after: timeout.after,
                every: None,
                restart: !ev.valid_in(from),
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
            e.valid_in(state) && e.subscribe.as_ref().and_then(|s| s.timeout.as_ref()).is_some_and(|t| t.event == event)
        });
    }
    machine.timers().iter().any(|t| t.name == name && t.event == event && t.valid_in(state))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MachineBuilder;
    use serde_json::json;

    fn server() -> Machine {
        MachineBuilder::new("server")
            .state("new")
            .initial()
            .state("creating")
            .auto("provision")
            .wait(Duration::from_secs(1))
            .state("ready")
            .requires(["endpoint"])
            .state("failed")
            .error_health()
            .event("create", ["new"], "begin")
            .reject("creating", "already in progress")
            .params(["region"])
            .action("begin", ["creating"])
            .target_wait("creating", Duration::from_secs(2))
            .action("provision", ["ready", "failed"])
            .build()
            .unwrap()
    }

    #[test]
    fn raise_checks_event_and_params() {
        let m = server();
        assert!(check_raise(&m, "create", &json!({"region": "eu"})).is_ok());
        assert_eq!(
            check_raise(&m, "nope", &json!({})).unwrap_err().to_string(),
            "machine `server` has no event `nope`"
        );
        assert_eq!(
            check_raise(&m, "create", &json!({})).unwrap_err().to_string(),
            "event `create` on machine `server` requires parameter `region`"
        );
        assert_eq!(
            check_raise(&m, "create", &json!({"region": "eu", "size": 1})).unwrap_err().to_string(),
            "event `create` on machine `server` has no parameter `size` (declared: region)"
        );
        assert!(matches!(check_raise(&m, "create", &json!([1])), Err(RaiseError::ParamsNotObject { .. })));
    }

    #[test]
    fn events_reject_with_declared_or_default_reason() {
        let m = server();
        match on_event(&m, "creating", "create", false) {
            EventStep::Reject(r) => assert_eq!(r.reason, "already in progress"),
            other => panic!("{other:?}"),
        }
        match on_event(&m, "ready", "create", false) {
            EventStep::Reject(r) => {
                assert_eq!(r.reason, "event `create` is not valid in state `ready`")
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(on_event(&m, "new", "create", false), EventStep::Plain { .. }));
        assert!(matches!(on_event(&m, "new", "create", true), EventStep::Run { .. }));
        assert!(matches!(on_auto(&m, "creating", false), Some(EventStep::Run { .. })));
        assert!(on_auto(&m, "ready", false).is_none());
    }

    #[test]
    fn entry_applies_waits_retries_and_invariants() {
        let m = server();
        let new = m.state("new").unwrap();
        let creating = m.state("creating").unwrap();
        let begin = m.action("begin").unwrap();
        let provision = m.action("provision").unwrap();
        let e = enter(&m, new, begin, Some("creating"), None, 0, &Properties::new()).unwrap();
        assert_eq!(e.auto_delay, Some(Duration::from_secs(3)), "state wait plus transition wait");
        let e = enter(&m, creating, provision, None, Some(Duration::from_millis(50)), 2, &Properties::new()).unwrap();
        assert_eq!((e.state.as_str(), e.retry, e.auto_delay), ("creating", 3, Some(Duration::from_millis(50))));
        let err = enter(&m, creating, provision, Some("ready"), None, 0, &Properties::new()).unwrap_err();
        assert_eq!(err.to_string(), "state `ready` of machine `server` requires `endpoint`");
        let mut props = Properties::new();
        props.insert("endpoint".into(), json!("10.0.0.1"));
        let e = enter(&m, creating, provision, Some("ready"), None, 3, &props).unwrap();
        assert!(e.at_rest());
        assert_eq!(e.retry, 0);
        let err = enter(&m, creating, provision, Some("new"), None, 0, &props).unwrap_err();
        assert_eq!(
            err.to_string(),
            "action `provision` of machine `server` may not move to `new` (declared: ready, failed)"
        );
    }

    #[test]
    fn an_event_invalid_in_the_state_of_an_entity_at_rest_is_refused_at_once() {
        let m = server();
        // (state, event, may the entity still move) → the reason it is refused now
        let cases = [
            ("ready", "create", false, Some("event `create` is not valid in state `ready`")),
            ("ready", "create", true, None),
            ("creating", "create", false, None),
            ("new", "create", false, None),
            ("new", "nope", false, None),
        ];
        for (state, event, moving, refused) in cases {
            let got = refuse_at_rest(&m, state, event, moving);
            assert_eq!(got.as_ref().map(|r| r.reason.as_str()), refused, "{event} in {state}, moving: {moving}");
        }
        let declared = MachineBuilder::new("m")
            .state("a")
            .initial()
            .state("b")
            .event("go", ["a"], "move")
            .reject("b", "gone already")
            .action("move", ["b"])
            .build()
            .unwrap();
        assert_eq!(refuse_at_rest(&declared, "b", "go", false).unwrap().reason, "gone already");
    }

    #[test]
    fn an_auto_action_is_due_in_an_unstable_state_once_its_time_has_come() {
        let m = server();
        let cases = [
            ("creating", None, true),
            ("creating", Some(99), true),
            ("creating", Some(100), true),
            ("creating", Some(101), false),
            ("new", None, false),
            ("nowhere", None, false),
        ];
        for (state, auto_at, due) in cases {
            assert_eq!(auto_due(&m, state, auto_at, 100), due, "{state} at {auto_at:?}");
        }
    }

    #[test]
    fn entering_a_state_starts_its_timers_and_subscription_timeouts() {
        let m = crate::fixtures::subscriber().build().unwrap();
        let mins = |n: u64| Duration::from_secs(60 * n);
        type Started<'a> = Vec<(&'a str, Duration, Option<Duration>, bool)>;
        // (from, to) → (name, after, every, restart) of each timer started
        let cases: [(Option<&str>, &str, Started<'_>); 5] = [
            (None, "waiting", vec![("timeout:resources_ready", mins(10), None, true)]),
            (Some("waiting"), "ready", vec![("health", mins(5), Some(mins(5)), true)]),
            (Some("ready"), "ready", vec![("health", mins(5), Some(mins(5)), false)]),
            (Some("waiting"), "waiting", vec![("timeout:resources_ready", mins(10), None, false)]),
            (Some("ready"), "failed", vec![("retry", mins(90), None, true)]),
        ];
        for (from, to, expected) in cases {
            let got: Vec<_> =
                timers_on_entry(&m, from, to).into_iter().map(|t| (t.name, t.after, t.every, t.restart)).collect();
            let expected: Vec<_> = expected.into_iter().map(|(n, a, e, r)| (n.to_string(), a, e, r)).collect();
            assert_eq!(got, expected, "{from:?} -> {to}");
        }
        assert!(has_timers(&m));
        assert!(!has_timers(&server()));
    }

    #[test]
    fn a_fired_timer_applies_only_where_it_runs() {
        let m = crate::fixtures::subscriber().build().unwrap();
        let cases = [
            ("ready", "health", "check", true),
            ("failed", "health", "check", false),
            ("failed", "retry", "check", true),
            ("waiting", "timeout:resources_ready", "resources_timeout", true),
            ("ready", "timeout:resources_ready", "resources_timeout", false),
            ("waiting", "timeout:resources_ready", "check", false),
            ("ready", "gone", "check", false),
        ];
        for (state, name, event, applies) in cases {
            assert_eq!(timer_applies(&m, state, name, event), applies, "{name} ({event}) in {state}");
        }
    }

    #[test]
    fn the_first_unfired_subscription_whose_pattern_holds_fires() {
        use crate::Health;
        let m = crate::fixtures::subscriber().build().unwrap();
        let view = |state, health| SuccessorView { machine: "app", key: "a", state, health };
        let ready = view("ready", Health::Ok);
        let broken = view("broken", Health::Error);
        let busy = view("creating", Health::Ok);
        type Fired<'a> = Option<(&'a str, Vec<usize>)>;
        // (state, fired, successors) → the event fired and the successors that matched
        let cases: Vec<(&str, Vec<&str>, Vec<SuccessorView<'_>>, Fired<'_>)> = vec![
            ("waiting", vec![], vec![ready, ready], Some(("resources_ready", vec![0, 1]))),
            ("waiting", vec![], vec![ready, busy], None),
            ("waiting", vec![], vec![busy, broken], Some(("resources_failed", vec![1]))),
            ("waiting", vec!["resources_ready"], vec![ready], None),
            ("waiting", vec![], vec![], None),
            ("ready", vec![], vec![ready], None),
        ];
        for (state, fired, successors, expected) in cases {
            let fired: Vec<EventName> = fired.into_iter().map(EventName::new).collect();
            let got = fire(&m, state, &fired, &successors).map(|(ev, i)| (ev.name.as_str(), i));
            assert_eq!(got, expected, "{state}, fired {fired:?}");
        }
    }
}
