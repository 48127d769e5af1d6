//! Statecharts through the step functions alone: a nested machine and a sequence of
//! events → the exact states left and entered, the entry and exit actions in order
//! (innermost exit first, outermost entry first, the common ancestor untouched), guard
//! choices, ignored and rejected events with their reasons, internal transitions. A small
//! simulator plays the runtime's part (declarative actions only: no handlers), so the
//! properties below can run it over random event sequences too.

use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;
use crate::fixtures;
use crate::machine::{Action, Machine};

/// One entity, played by the rules of `step`.
#[derive(Debug, Clone)]
struct Sim<'m> {
    machine: &'m Machine,
    state: String,
    props: Properties,
    /// What happened, one line per event or auto action.
    trace: Vec<String>,
    /// (from, to) of every history row a runtime would write, to replay.
    history: Vec<(String, Option<String>, &'static str)>,
}

impl<'m> Sim<'m> {
    fn create(machine: &'m Machine, props: Value) -> Sim<'m> {
        let props: Properties = props.as_object().cloned().unwrap_or_default();
        let entry = initial_entry(machine, &props).expect("valid constructor properties");
        let mut sim = Sim { machine, state: entry.state.to_string(), props, trace: Vec::new(), history: Vec::new() };
        sim.trace.push(format!("create: entered {}", names(&entry.entered)));
        sim.history.push((String::new(), Some(sim.state.clone()), "create"));
        sim.run_auto();
        sim
    }

    fn raise(&mut self, event: &str, params: Value) {
        let step = on_event(self.machine, &self.state, event, &|_| false, &self.props, &params);
        match step {
            EventStep::Reject(r) => {
                self.trace.push(format!("{event}: rejected: {}", r.reason));
                self.history.push((self.state.clone(), None, "rejected"));
            }
            EventStep::Ignore { level } => {
                self.trace.push(format!("{event}: ignored in {level}"));
                self.history.push((self.state.clone(), None, "ignored"));
            }
            EventStep::Plain { action, target } => {
                let internal = self.machine.event(event).is_some_and(|e| e.internal);
                if internal {
                    let mut props = self.props.clone();
                    declare(action, &mut props);
                    stay(self.machine, self.machine.state(&self.state).unwrap(), &props).expect("invariants hold");
                    self.props = props;
                    self.trace.push(format!("{event}: {} (internal)", action.name));
                    self.history.push((self.state.clone(), Some(self.state.clone()), "internal"));
                } else {
                    self.transition(event, action, target.as_deref());
                }
            }
            other => panic!("{event}: no handler is bound here: {other:?}"),
        }
        self.run_auto();
    }

    /// `action` moves the entity to `target`: the exit actions' declarative effects, the
    /// action's own, the entry actions' (SCXML's order), then the entry itself
    /// (invariants checked with every effect applied).
    fn transition(&mut self, trigger: &str, action: &Action, target: Option<&str>) {
        let from = self.machine.state(&self.state).unwrap();
        let mut props = self.props.clone();
        let path = transition_of(self.machine, from, action, target, &self.props).expect("a declared target");
        let mut hooks = Vec::new();
        for s in &path.left {
            hooks.extend(s.on_exit.iter().map(|a| format!("exit {a}")));
        }
        let event = (trigger != "auto").then_some(trigger);
        for s in &path.entered {
            hooks.extend(s.entry_actions(event).map(|a| format!("entry {a}")));
        }
        for a in path.left.iter().flat_map(|s| &s.on_exit) {
            declare(self.machine.action(a).unwrap(), &mut props);
        }
        declare(action, &mut props);
        for a in path.entered.iter().flat_map(|s| s.entry_actions(event)) {
            declare(self.machine.action(a).unwrap(), &mut props);
        }
        let entry = enter(self.machine, from, action, target, None, 0, &props).expect("the transition is allowed");
        let hooks = if hooks.is_empty() { String::new() } else { format!("; {}", hooks.join(", ")) };
        self.trace.push(format!(
            "{trigger}: {}; left {}; entered {}{hooks}",
            action.name,
            names(&entry.left),
            names(&entry.entered)
        ));
        self.history.push((self.state.clone(), Some(entry.state.to_string()), "moved"));
        self.state = entry.state.to_string();
        if let Some(history) = entry.history {
            props.insert(crate::machine::HISTORY_PROPERTY.to_string(), history.into());
        }
        self.props = props;
    }

    /// Runs auto actions (all plain here) until the entity rests.
    fn run_auto(&mut self) {
        for _ in 0..16 {
            match on_auto(self.machine, &self.state, false) {
                Some(EventStep::Plain { action, target }) => self.transition("auto", action, target.as_deref()),
                None => return,
                other => panic!("unexpected auto step {other:?}"),
            }
        }
        panic!("auto actions do not come to rest");
    }
}

fn declare(action: &Action, props: &mut Properties) {
    for (k, v) in &action.set {
        if v.is_null() {
            props.remove(k);
        } else {
            props.insert(k.clone(), v.clone());
        }
    }
}

fn names(states: &[crate::names::StateName]) -> String {
    format!("[{}]", states.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", "))
}

#[test]
fn a_nested_machine_leaves_and_enters_exactly_the_states_between_leaf_and_target() {
    let m = fixtures::instance();
    let mut sim = Sim::create(&m, json!({"max_size": 4}));
    // (event, parameters) → the lines it adds to the trace
    let script: [(&str, Value, &[&str]); 11] = [
        (
            "resize",
            json!({"size": 2}),
            &[
                "resize: begin_resize; left [running]; entered [resizing]; entry note_resize",
                "auto: resize; left [resizing]; entered [running]; entry announce",
            ],
        ),
        ("resize", json!({"size": 9}), &["resize: rejected: size above this instance's maximum"]),
        ("touch", Value::Null, &["touch: record_touch (internal)"]),
        ("start", Value::Null, &["start: ignored in active"]),
        (
            "restart",
            Value::Null,
            &[
                "restart: reboot; left [running]; entered [starting]",
                "auto: boot; left [starting]; entered [running]; entry announce",
            ],
        ),
        ("stop", Value::Null, &["stop: halt; left [running, active]; entered [stopped]; exit release_ip"]),
        ("stop", Value::Null, &["stop: ignored in stopped"]),
        ("resize", json!({"size": 1}), &["resize: rejected: event `resize` is not valid in state `stopped`"]),
        (
            "start",
            Value::Null,
            &[
                "start: boot_again; left [stopped]; entered [active, starting]; entry allocate_ip",
                "auto: boot; left [starting]; entered [running]; entry announce",
            ],
        ),
        ("nope", Value::Null, &["nope: rejected: machine `instance` has no event `nope`"]),
        ("delete", Value::Null, &["delete: rejected: event `delete` is not valid in state `running`"]),
    ];
    assert_eq!(
        sim.trace,
        [
            "create: entered [provisioning]",
            "auto: provision; left [provisioning]; entered [active, starting]; entry allocate_ip",
            "auto: boot; left [starting]; entered [running]; entry announce",
        ]
    );
    for (event, params, lines) in script {
        let before = sim.trace.len();
        sim.raise(event, params.clone());
        assert_eq!(&sim.trace[before..], lines, "{event} {params}");
    }
    assert_eq!(sim.state, "running");
    let mut props: Vec<&str> = sim.props.keys().map(String::as_str).collect();
    props.sort_unstable(); // serde_json keeps insertion order in some builds
    assert_eq!(props, ["announced", "ip", "max_size", "resized", "touched"], "released on exit, allocated on entry");
}

#[test]
fn guards_choose_the_first_alternative_that_holds_and_say_why_none_does() {
    let m = crate::toml::load(
        "g.toml",
        "g",
        r#"
initial = "idle"
properties = ["limit"]
[states.idle]
[states.small]
[states.big]
[events.grow]
in = ["idle"]
params = ["n"]
[[events.grow.when]]
guard = "params.n < 10"
action = "to_small"
[[events.grow.when]]
guard = "params.n < props.limit"
action = "to_big"
[actions.to_small]
to = ["small"]
[actions.to_big]
to = ["big"]
"#,
    )
    .unwrap()
    .0;
    let limit = |n: i64| -> Properties { [("limit".to_string(), json!(n))].into_iter().collect() };
    let step = |props: &Properties, n: Value| match on_event(&m, "idle", "grow", &|_| false, props, &json!({ "n": n }))
    {
        EventStep::Plain { target, .. } => format!("to {}", target.unwrap()),
        EventStep::Reject(r) => format!("rejected: {}", r.reason),
        other => format!("{other:?}"),
    };
    // (limit, n) → what the event does
    let cases = [
        (limit(100), json!(3), "to small"),
        (limit(100), json!(50), "to big"),
        (
            limit(20),
            json!(50),
            "rejected: no guard of event `grow` holds in state `idle` (`params.n < 10`, `params.n < props.limit` false)",
        ),
        (
            Properties::new(),
            json!(50),
            "rejected: guard `params.n < props.limit` of event `grow` cannot be evaluated: no such key: limit",
        ),
        (
            limit(20),
            json!("x"),
            "rejected: guard `params.n < 10` of event `grow` cannot be evaluated: `<` cannot take (string, int)",
        ),
    ];
    for (props, n, expected) in cases {
        assert_eq!(step(&props, n.clone()), expected, "n = {n}");
    }
}

#[test]
fn can_fire_says_what_an_event_would_do_and_why_not() {
    let m = fixtures::instance();
    let props: Properties = [("max_size".to_string(), json!(4))].into_iter().collect();
    let ask = |state: &str, event: &str, params: Value| can_fire(&m, state, event, &props, &params);
    let fires = |action: &str, internal| Permission::Fires { action: action.into(), internal };
    assert_eq!(ask("running", "resize", json!({"size": 2})), fires("begin_resize", false));
    assert_eq!(
        ask("running", "resize", json!({"size": 8})),
        Permission::Refused { reason: "size above this instance's maximum".into() }
    );
    assert_eq!(ask("running", "touch", Value::Null), fires("record_touch", true));
    assert_eq!(ask("starting", "stop", Value::Null), fires("halt", false), "valid in a substate of `active`");
    assert_eq!(ask("running", "start", Value::Null), Permission::Ignored { level: "active".into() });
    assert_eq!(
        ask("stopped", "touch", Value::Null),
        Permission::Refused { reason: "event `touch` is not valid in state `stopped`".into() }
    );
}

proptest! {
    /// No sequence of events, with any parameters, makes the step functions panic; and
    /// replaying the history (each row's `to`, when it has one) rebuilds the state,
    /// internal transitions included (they stay where they are).
    #[test]
    fn no_event_sequence_panics_and_history_replays_to_the_state(
        script in proptest::collection::vec((0usize..8, -20i64..20), 0..40),
        max in 0i64..10,
    ) {
        let m = fixtures::instance();
        let events = ["stop", "start", "restart", "resize", "touch", "delete", "nope", "stop"];
        let mut sim = Sim::create(&m, json!({"max_size": max}));
        for (e, n) in script {
            if sim.state == "gone" {
                break;
            }
            let params = if events[e] == "resize" { json!({"size": n}) } else { Value::Null };
            sim.raise(events[e], params);
        }
        let mut replayed = String::new();
        for (_, to, _) in &sim.history {
            if let Some(to) = to {
                replayed = to.clone();
            }
        }
        prop_assert_eq!(replayed, sim.state.clone());
        prop_assert!(sim.history.iter().all(|(from, to, kind)| *kind != "internal" || to.as_deref() == Some(from.as_str())));
    }
}
