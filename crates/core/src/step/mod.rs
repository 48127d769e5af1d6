//! The pure step function: what the runtime does next, decided from data only.
//!
//! The engine asks these questions here and never answers them itself:
//! - may this event be raised at all ([`check_raise`]: known event, right parameters)?
//!   May it be refused at once because the entity is at rest ([`refuse_at_rest`])?
//! - what does this event do in the entity's current state ([`on_event`]: the innermost
//!   level of its state that lists or ignores the event, and the first alternative there
//!   whose guard holds), what does its auto action do ([`on_auto`]), and is that auto
//!   action due ([`auto_due`])?
//! - may this action outcome be committed, which states does the transition leave and
//!   enter, and which leaf does the entity end in ([`enter`], in `entry`)?
//! - what comes with entering a state: its timers ([`timers_on_entry`]), the agent task it
//!   offers ([`agent_action`]); does a fired timer still apply ([`timer_applies`])? (in
//!   `timers`)
//! - which subscription fires over a snapshot of the successors ([`fire`])?
//!
//! What an action decided, whoever wrote it, is one value: [`ActionOutcome`] (in
//! `outcome`, with the durable encoding an agent's report travels in).
//!
//! No IO, no clock: time arrives as arguments or as durations relative to "now", chosen
//! by the caller.

mod entry;
mod outcome;
#[cfg(test)]
mod statecharts;
mod timers;

use serde_json::{Map, Value};

pub use entry::{
    Entry, PropChange, Refusal, apply_changes, enter, initial_entry, missing_required, required_to_enter, stay,
    transition_of,
};
pub use outcome::{
    ActionOutcome, Create, ERROR_MAX_BYTES, InternalEvent, PROPERTIES_MAX_BYTES, Raise, beyond_declaration,
    check_error_size, check_properties_size, check_size, declared_changes, declared_creates, engine_property,
    foreign_reply,
};
pub use timers::{TimerStart, agent_action, fire, has_timers, timer_applies, timers_on_entry};

use crate::machine::{Action, Event, Machine, StateKind, Then};
use crate::names::{EventName, MachineName, StateName};

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
    /// The priority asked for lies outside [`crate::limits::PRIORITIES`].
    #[error("priority {priority} of event `{event}` on machine `{machine}`: a priority lies from -1000 to 1000")]
    Priority {
        /// The machine.
        machine: MachineName,
        /// The event.
        event: EventName,
        /// The priority asked for.
        priority: i64,
    },
}

/// The priority of the work `event` starts on `machine` when raised with `asked` (none:
/// the event's declared priority, [`crate::limits::BACKGROUND`] lower for a bulk
/// operation's or a schedule's, `background`). Checked: in [`crate::limits::PRIORITIES`].
pub fn priority_of(
    machine: &Machine,
    event: &crate::machine::Event,
    asked: Option<i64>,
    background: bool,
) -> Result<i64, RaiseError> {
    let priority = asked.unwrap_or_else(|| {
        let declared = event.priority;
        if background { declared - crate::limits::BACKGROUND } else { declared }
    });
    if asked.is_some() && !crate::limits::PRIORITIES.contains(&priority) {
        return Err(RaiseError::Priority { machine: machine.name().clone(), event: event.name.clone(), priority });
    }
    Ok(priority)
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
    /// The event is not valid here, or an alternative rejects it; nothing changes.
    Reject(Rejection),
    /// The event is accepted and dropped: `level` (the state, or an ancestor) ignores it.
    Ignore {
        /// The state that declares `ignore`.
        level: StateName,
    },
    /// The engine performs the action itself (no handler): a transition to its one
    /// target, or, with `target` `None`, effects only (a declarative action with no
    /// target, as an internal transition's).
    Plain {
        /// The action.
        action: &'m Action,
        /// Its one target.
        target: Option<StateName>,
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

/// Decides what `event` does for an entity in `state` with properties `props`, raised
/// with `params`: the innermost state of its path that lists or ignores the event decides
/// (an `ignore` there drops it); among the alternatives that apply at that level, the
/// first whose guard holds is chosen (it runs its action, rejects with its reason, or
/// ignores the event). When none holds there, the next state outward that lists or
/// ignores the event decides in turn (Stateless's fallback to the superstate's handler).
/// No level: rejected with the reason declared for the state (or its nearest ancestor), or
/// the default one. No guard holding at any level: rejected, naming the guards; a guard
/// that cannot be evaluated rejects with the reason.
///
/// `has_handler` tells whether an action has an implementation bound (otherwise a
/// one-target action is a plain transition).
pub fn on_event<'m>(
    machine: &'m Machine,
    state: &str,
    event: &str,
    has_handler: &dyn Fn(&Action) -> bool,
    props: &Properties,
    params: &Value,
) -> EventStep<'m> {
    let Some(ev) = machine.event(event) else {
        return EventStep::Reject(Rejection {
            state: StateName::new(state),
            event: EventName::new(event),
            reason: format!("machine `{}` has no event `{event}`", machine.name()),
        });
    };
    let reject =
        |reason: String| EventStep::Reject(Rejection { state: StateName::new(state), event: ev.name.clone(), reason });
    if machine.event_level(ev, state).is_none() {
        return EventStep::Reject(rejection(machine, ev, state));
    }
    let mut not_holding: Vec<String> = Vec::new();
    for level in machine.path(state) {
        if !ev.valid_in(&level.name) {
            if ev.ignored_in(&level.name) {
                return EventStep::Ignore { level: level.name.clone() };
            }
            continue;
        }
        for alt in ev.alternatives.iter().filter(|a| a.applies_at(&level.name)) {
            if let Some(guard) = &alt.guard {
                match guard.eval(props, params, machine.path(state).map(|s| s.name.as_str())) {
                    Ok(true) => {}
                    Ok(false) => {
                        let named = format!("`{guard}`");
                        if !not_holding.contains(&named) {
                            not_holding.push(named);
                        }
                        continue;
                    }
                    Err(e) => {
                        return reject(format!("guard `{guard}` of event `{}` cannot be evaluated: {e}", ev.name));
                    }
                }
            }
            return match &alt.then {
                Then::Reject(reason) => reject(reason.clone()),
                Then::Ignore => EventStep::Ignore { level: level.name.clone() },
                Then::Action(a) => {
                    let action = machine.action(a).expect("validated machine: alternative action exists");
                    plain_or_run(action, has_handler(action))
                }
            };
        }
    }
    reject(format!("no guard of event `{}` holds in state `{state}` ({} false)", ev.name, not_holding.join(", ")))
}

/// Whether an event would be processed, and how: the answer to "can it fire?" for an
/// entity as it is now (see [`can_fire`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Permission {
    /// It would run this action (a guard, if any, holds).
    Fires {
        /// The action chosen.
        action: crate::names::ActionName,
        /// Whether it is an internal transition.
        internal: bool,
    },
    /// It would be accepted and dropped: this state ignores it.
    Ignored {
        /// The state (the entity's or an ancestor) that ignores it.
        level: StateName,
    },
    /// It would be rejected, for this reason (not valid here, an alternative rejects it,
    /// no guard holds, or a guard cannot be evaluated).
    Refused {
        /// Why.
        reason: String,
    },
}

/// Whether `event` would fire for an entity in `state` with properties `props` if raised
/// now with `params`: levels, `ignore` and guards decided as [`on_event`] decides them.
/// Parameters are not checked here ([`check_raise`] does that).
pub fn can_fire(machine: &Machine, state: &str, event: &str, props: &Properties, params: &Value) -> Permission {
    let internal = machine.event(event).is_some_and(|e| e.internal);
    match on_event(machine, state, event, &|_| true, props, params) {
        EventStep::Reject(r) => Permission::Refused { reason: r.reason },
        EventStep::Ignore { level } => Permission::Ignored { level },
        EventStep::Run { action } | EventStep::Plain { action, .. } | EventStep::Agent { action, .. } => {
            Permission::Fires { action: action.name.clone(), internal }
        }
    }
}

/// The rejection of `ev` for an entity in `state`, where it is not valid: the reason
/// declared for the state or its nearest ancestor, or the default one.
fn rejection(machine: &Machine, ev: &Event, state: &str) -> Rejection {
    let reason = machine
        .rejection_reason(ev, state)
        .map(str::to_string)
        .unwrap_or_else(|| format!("event `{}` is not valid in state `{state}`", ev.name));
    Rejection { state: StateName::new(state), event: ev.name.clone(), reason }
}

/// The rule for an event raised on an entity *at rest*: if `event` is not valid in its
/// state (nor ignored there), it is refused at once and nothing is recorded, since
/// nothing could make it valid before its turn. `moving` says whether anything may still
/// change the entity's state first (its auto action is pending, an engine holds its
/// lease, or events are queued): then the event is queued and decided in order like any
/// other. `None`: not refused now (valid or ignored here, unknown to the machine —
/// [`check_raise`] answers that —, or the entity may move). Guards are not evaluated
/// here: an event a guard rejects is recorded as rejected in its turn.
pub fn refuse_at_rest(machine: &Machine, state: &str, event: &str, moving: bool) -> Option<Rejection> {
    let ev = machine.event(event)?;
    let at_rest = machine.state(state).is_some_and(crate::machine::State::at_rest);
    (at_rest && !moving && machine.event_level(ev, state).is_none()).then(|| rejection(machine, ev, state))
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
        (_, true) => EventStep::Run { action },
        ([only], false) => EventStep::Plain { action, target: Some(only.state.clone()) },
        ([], false) => EventStep::Plain { action, target: None },
        (_, false) => EventStep::Run { action },
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;

    use super::*;
    use crate::MachineBuilder;
    use crate::names::StateName;
    use crate::pattern::SuccessorView;

    /// `on_event` with no handlers bound (`true`: all bound), no properties, no parameters.
    fn on<'m>(m: &'m Machine, state: &str, event: &str, handlers: bool) -> EventStep<'m> {
        on_event(m, state, event, &|_| handlers, &Properties::new(), &Value::Null)
    }

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
        match on(&m, "creating", "create", false) {
            EventStep::Reject(r) => assert_eq!(r.reason, "already in progress"),
            other => panic!("{other:?}"),
        }
        match on(&m, "ready", "create", false) {
            EventStep::Reject(r) => {
                assert_eq!(r.reason, "event `create` is not valid in state `ready`")
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(on(&m, "new", "create", false), EventStep::Plain { .. }));
        assert!(matches!(on(&m, "new", "create", true), EventStep::Run { .. }));
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
    fn when_no_guard_of_a_substate_holds_its_superstates_handler_decides() {
        let text = r#"
initial = "up"
[states.up]
initial = "child"
[states.child]
parent = "up"
[states.done]
[states.other]
[states.quiet]
initial = "low"
[states.low]
parent = "quiet"
[events.go]
in = ["up", "child", "low"]
ignore = ["quiet"]
params = ["n"]
[[events.go.when]]
in = ["child", "low"]
guard = "params.n > 1"
action = "inner"
[[events.go.when]]
in = ["up"]
guard = "params.n > 0"
action = "outer"
[actions.inner]
to = ["done"]
[actions.outer]
to = ["other"]
"#;
        let m = crate::toml::load("fallback.toml", "fallback", text).unwrap_or_else(|e| panic!("{e:?}")).0;
        let props = Properties::new();
        let chosen = |state: &str, n: i64| match on_event(&m, state, "go", &|_| false, &props, &json!({"n": n})) {
            EventStep::Plain { action, .. } => format!("runs {}", action.name),
            EventStep::Ignore { level } => format!("ignored in {level}"),
            EventStep::Reject(r) => format!("rejected: {}", r.reason),
            other => format!("{other:?}"),
        };
        // (state, n) → what the event does: the substate's handler first, then its parent's.
        let cases = [
            ("child", 2, "runs inner"),
            ("child", 1, "runs outer"),
            (
                "child",
                0,
                "rejected: no guard of event `go` holds in state `child` (`params.n > 1`, `params.n > 0` false)",
            ),
            ("low", 2, "runs inner"),
            ("low", 0, "ignored in quiet"),
        ];
        for (state, n, want) in cases {
            assert_eq!(chosen(state, n), want, "{state}, n = {n}");
        }
    }

    #[test]
    fn a_guarded_ignore_drops_the_event_only_while_its_guard_holds() {
        let m = MachineBuilder::new("m")
            .state("a")
            .initial()
            .state("b")
            .guarded_event("go", ["a"])
            .params(["quiet"])
            .when_ignoring(Some("params.quiet == true"))
            .when(None, "move")
            .action("move", ["b"])
            .build()
            .unwrap();
        let props = Properties::new();
        let step = |params: Value| on_event(&m, "a", "go", &|_| false, &props, &params);
        assert!(matches!(step(json!({"quiet": true})), EventStep::Ignore { level } if level == "a"));
        assert!(matches!(step(json!({"quiet": false})), EventStep::Plain { action, .. } if action.name == "move"));
        let fires = can_fire(&m, "a", "go", &props, &json!({"quiet": true}));
        assert_eq!(fires, Permission::Ignored { level: "a".into() });
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
        // A flat machine: a transition to another state enters it; to the same, nothing.
        let entered = |from: Option<&str>, to: &str| -> Vec<StateName> {
            if from == Some(to) { Vec::new() } else { vec![StateName::new(to)] }
        };
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
            let got: Vec<_> = timers_on_entry(&m, from, to, &entered(from, to))
                .into_iter()
                .map(|t| (t.name, t.after, t.every, t.restart))
                .collect();
            let expected: Vec<_> = expected.into_iter().map(|(n, a, e, r)| (n.to_string(), a, e, r)).collect();
            assert_eq!(got, expected, "{from:?} -> {to}");
        }
        // A re-entry (the state left and entered again) restarts the periodic timer and the
        // subscription's timeout that staying keeps.
        for (state, timer) in [("ready", "health"), ("waiting", "timeout:resources_ready")] {
            let t = timers_on_entry(&m, Some(state), state, &[StateName::new(state)]);
            assert!(t.iter().find(|t| t.name == timer).unwrap().restart, "{state} re-entered");
        }
        assert!(has_timers(&m));
        assert!(!has_timers(&server()));
    }

    #[test]
    fn a_one_shot_timer_restarts_when_a_state_it_runs_in_is_entered_anew() {
        use crate::machine::Schedule;
        let m = MachineBuilder::new("m")
            .state("a")
            .initial()
            .state("b")
            .state("c")
            .event("next", ["a", "b"], "step")
            .event("expire", ["a", "b"], "step")
            .action("step", ["b", "c"])
            .timer("deadline", "expire", Schedule::After(Duration::from_secs(600)), ["a", "b"])
            .build()
            .unwrap();
        let restart = |from: Option<&str>, to: &str, entered: &[&str]| {
            let entered: Vec<StateName> = entered.iter().map(|s| StateName::new(*s)).collect();
            let t = timers_on_entry(&m, from, to, &entered);
            assert_eq!(t.len(), 1, "{from:?} -> {to}");
            t[0].restart
        };
        assert!(restart(None, "a", &["a"]), "a new entity starts it");
        assert!(restart(Some("c"), "a", &["a"]), "entering one of its states from outside starts it");
        assert!(restart(Some("a"), "b", &["b"]), "entering another of its states starts it afresh");
        assert!(!restart(Some("a"), "a", &[]), "staying keeps its schedule");
        assert!(restart(Some("a"), "a", &["a"]), "a re-entry starts it afresh");
        assert!(has_timers(&m), "declared timers alone (no subscription timeout) are timers");
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
        let view = |state, health| SuccessorView { machine: "app", key: "a", state, ancestors: &[], health };
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
