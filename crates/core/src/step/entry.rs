//! Entering states: may an action's outcome be committed, which states does the
//! transition leave and enter, which leaf does the entity end in, and when does its next
//! auto action run ([`enter`], [`initial_entry`]); property changes ([`apply_changes`]).

use std::time::Duration;

use serde_json::Value;

use super::Properties;
use crate::machine::{Action, HISTORY_PROPERTY, Machine, Memory, State, StateKind};
use crate::names::{ActionName, MachineName, StateName};

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
        /// The state whose invariant fails (the leaf entered, or an ancestor of it).
        state: StateName,
        /// The properties missing or null.
        missing: Vec<String>,
    },
}

/// An entry into a state, decided and ready to commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The leaf state the entity is in afterwards.
    pub state: StateName,
    /// Retry count of this state entry (0 unless an unstable state re-enters itself).
    pub retry: u32,
    /// For unstable states: the delay before the auto action runs. `None` when at rest.
    pub auto_delay: Option<Duration>,
    /// The states the transition leaves, innermost first (their exit actions run in this
    /// order).
    pub left: Vec<StateName>,
    /// The states it enters, outermost first, ending with the leaf (their entry actions
    /// run in this order).
    pub entered: Vec<StateName>,
    /// The entity's [`HISTORY_PROPERTY`] afterwards, when the transition changes it (it
    /// leaves a parent with `history`): the runtime stores it with the properties.
    pub history: Option<Memory>,
}

impl Entry {
    /// Whether the entity is at rest after this entry (stable, terminal or deleted).
    pub fn at_rest(&self) -> bool {
        self.auto_delay.is_none()
    }
    /// Whether the transition leaves or enters any state (a retry, or an outcome that names
    /// no target, does not; a declared re-entry does).
    pub fn moves(&self) -> bool {
        !self.left.is_empty() || !self.entered.is_empty()
    }
}

/// Properties that `state` requires but `props` lacks (absent or null).
pub fn missing_required(state: &State, props: &Properties) -> Vec<String> {
    state.requires.iter().filter(|p| props.get(*p).is_none_or(Value::is_null)).cloned().collect()
}

/// The properties an entity must have to enter `state`: what every state on the path of
/// the leaf it leads to requires (a parent enters its initial child), outermost first, each
/// once. An agent's task shows it for each target (DESIGN §5).
pub fn required_to_enter(machine: &Machine, state: &str) -> Vec<String> {
    let leaf = machine.descend(state);
    let mut path: Vec<&State> = machine.path(&leaf.name).collect();
    path.reverse();
    let mut required: Vec<String> = Vec::new();
    for s in path {
        for p in &s.requires {
            if !required.contains(p) {
                required.push(p.clone());
            }
        }
    }
    required
}

/// The entry into the initial state of a new entity with `props`: the declared initial
/// state, or the leaf its initial children lead to, with every state of its path entered.
pub fn initial_entry(machine: &Machine, props: &Properties) -> Result<Entry, Refusal> {
    let leaf = machine.initial();
    check_invariants(machine, leaf, props)?;
    let mut entered: Vec<StateName> = machine.path(&leaf.name).map(|s| s.name.clone()).collect();
    entered.reverse();
    Ok(Entry {
        state: leaf.name.clone(),
        retry: 0,
        auto_delay: auto_delay(leaf, Duration::ZERO, None),
        left: Vec::new(),
        entered,
        history: None,
    })
}

/// Decides the entry that `action`, run in the leaf `from` (entered `retry` times so far),
/// makes when it asks for `target` (`None`: re-enter `from`) after `delay`, given the
/// properties the entity would have after the commit.
///
/// Staying in the current state (no target) is always allowed (it is how actions retry,
/// and a retry leaves and enters nothing); any target must be declared. A declared target
/// that is the current state or one of its ancestors is a re-entry ([`transition_of`]).
/// A target that is a parent enters its initial leaf. The invariants of the leaf entered and of each of its
/// ancestors must hold. The delay before an unstable leaf's auto action is the delay the
/// action asked for, if any; otherwise the leaf's `wait` plus the wait declared on this
/// transition.
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
    let path = transition_of(machine, from, action, target, props_after)?;
    let declared = action.target(target_name);
    let leaf = path.leaf;
    check_invariants(machine, leaf, props_after)?;
    let is_retry = leaf.name == from.name && retries(from, action);
    let transition_wait = declared.map(|t| t.wait).unwrap_or_default();
    Ok(Entry {
        state: leaf.name.clone(),
        retry: if is_retry { retry + 1 } else { 0 },
        auto_delay: auto_delay(leaf, transition_wait, delay),
        left: path.left.iter().map(|s| s.name.clone()).collect(),
        entered: path.entered.iter().map(|s| s.name.clone()).collect(),
        history: path.history,
    })
}

/// The states `action`, run in the leaf `from`, leaves and enters when it asks for
/// `target` (`None`: stay in `from`): only the target is checked (declared, or the current
/// state), not the invariants. For a runtime that runs entry and exit actions, whose
/// property changes count, before [`enter`] decides the entry.
///
/// Staying leaves and enters nothing: no target, or the unstable `from`'s own auto action
/// asking for `from` (a retry). A declared target that `from` is in — `from` itself or an
/// ancestor — is a **re-entry**: that state is left and entered again, with its exit and
/// entry actions ([`Machine::reentry_path`], Stateless's `PermitReentry`). Any other target
/// leaves and enters the states below the common ancestor ([`Machine::transition_path`]).
/// A parent with `history` that is entered resumes where the entity last was in it, as
/// `props`' [`HISTORY_PROPERTY`] (updated by what the transition leaves) says
/// ([`Machine::transition_resuming`]).
pub fn transition_of<'m>(
    machine: &'m Machine,
    from: &State,
    action: &Action,
    target: Option<&str>,
    props: &Properties,
) -> Result<crate::machine::Transition<'m>, Refusal> {
    let target_name = target.unwrap_or(&from.name);
    if action.target(target_name).is_none() && target_name != from.name.as_str() {
        return Err(Refusal::UndeclaredTarget {
            machine: machine.name().clone(),
            action: action.name.clone(),
            target: target_name.to_string(),
            declared: action.targets.iter().map(|t| t.state.as_str()).collect::<Vec<_>>().join(", "),
        });
    }
    let declared_here = target.is_some_and(|t| action.target(t).is_some() && machine.is_in(&from.name, t));
    let reentry = declared_here && !(target_name == from.name.as_str() && retries(from, action));
    let memory = props.get(HISTORY_PROPERTY).and_then(Value::as_object);
    Ok(machine.transition_resuming(&from.name, target_name, reentry, memory))
}

/// Whether `action` is the auto action of the unstable state `from`: its asking for `from`
/// again is a retry.
fn retries(from: &State, action: &Action) -> bool {
    from.kind == StateKind::Unstable && from.auto.as_ref() == Some(&action.name)
}

/// Whether an entity may stay in the leaf `state` with `props` (an internal transition's
/// properties): the invariants of the state and its ancestors hold.
pub fn stay(machine: &Machine, state: &State, props: &Properties) -> Result<(), Refusal> {
    check_invariants(machine, state, props)
}

fn auto_delay(state: &State, transition_wait: Duration, requested: Option<Duration>) -> Option<Duration> {
    (state.kind == StateKind::Unstable).then(|| requested.unwrap_or(state.wait + transition_wait))
}

/// The invariants of `leaf` and of every state it is a substate of, innermost first.
fn check_invariants(machine: &Machine, leaf: &State, props: &Properties) -> Result<(), Refusal> {
    for state in machine.path(&leaf.name) {
        let missing = missing_required(state, props);
        if !missing.is_empty() {
            return Err(Refusal::InvariantViolated {
                machine: machine.name().clone(),
                state: state.name.clone(),
                missing,
            });
        }
    }
    Ok(())
}

/// A change to one property, buffered by an action and applied at commit.
#[derive(Debug, Clone, PartialEq)]
pub enum PropChange {
    /// Set `key` to a value.
    Set(String, Value),
    /// Remove `key`.
    Remove(String),
}

impl PropChange {
    /// The change a JSON property map asks for (an agent's report, a declarative `set`):
    /// `null` removes the property, any other value sets it.
    pub fn from_json(key: String, value: Value) -> Self {
        if value.is_null() { PropChange::Remove(key) } else { PropChange::Set(key, value) }
    }
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;

    use super::*;
    use crate::MachineBuilder;

    /// `a` (initial) --go--> `working` (unstable, auto `work` to `working`, `next` or
    /// `done`) --> `next` (unstable, auto `more`) and `done`, which requires `result`.
    fn machine() -> Machine {
        MachineBuilder::new("m")
            .state("a")
            .initial()
            .state("working")
            .auto("work")
            .state("next")
            .auto("more")
            .state("done")
            .requires(["result"])
            .event("go", ["a"], "start")
            .action("start", ["working"])
            .action("work", ["working", "next", "done"])
            .action("more", ["done"])
            .build()
            .unwrap()
    }

    fn props(v: serde_json::Value) -> Properties {
        v.as_object().unwrap().clone().into_iter().collect()
    }

    fn entry(auto_delay: Option<Duration>, left: &[&str], entered: &[&str]) -> Entry {
        Entry {
            state: StateName::new("x"),
            retry: 0,
            auto_delay,
            left: left.iter().map(|s| StateName::new(*s)).collect(),
            entered: entered.iter().map(|s| StateName::new(*s)).collect(),
            history: None,
        }
    }

    #[test]
    fn an_entry_is_at_rest_without_an_auto_action_and_moves_when_it_leaves_or_enters() {
        assert!(entry(None, &[], &[]).at_rest());
        assert!(!entry(Some(Duration::ZERO), &[], &[]).at_rest());
        let cases = [
            (&[][..], &[][..], false),
            (&["a"][..], &[][..], true),
            (&[][..], &["b"][..], true),
            (&["a"][..], &["b"][..], true),
        ];
        for (left, entered, moves) in cases {
            assert_eq!(entry(None, left, entered).moves(), moves, "left {left:?}, entered {entered:?}");
        }
    }

    #[test]
    fn only_an_unstable_state_re_entered_by_its_own_auto_action_counts_a_retry() {
        let m = machine();
        let working = m.state("working").unwrap();
        let work = m.action("work").unwrap();
        let again = enter(&m, working, work, None, None, 2, &Properties::new()).unwrap();
        assert_eq!((again.state.as_str(), again.retry, again.moves()), ("working", 3, false));
        let on = enter(&m, working, work, Some("next"), None, 2, &Properties::new()).unwrap();
        assert_eq!((on.state.as_str(), on.retry), ("next", 0), "another unstable state starts at 0");
        // The same leaf re-entered by an action that is not its auto action: not a retry.
        let start = m.action("start").unwrap();
        let by_other = enter(&m, working, start, Some("working"), None, 2, &Properties::new()).unwrap();
        assert_eq!(by_other.retry, 0);
    }

    #[test]
    fn a_declared_re_entry_leaves_and_enters_again_and_a_retry_does_not() {
        // open > {unassigned, assigned}; `assign` (declared to `assigned`) from
        // `assigned` re-enters it; `reopen` (declared to `open`) re-enters the parent too.
        let m = MachineBuilder::new("bug")
            .state("open")
            .initial()
            .initial_child("unassigned")
            .state("unassigned")
            .parent("open")
            .state("assigned")
            .parent("open")
            .state("working")
            .auto("work")
            .event("assign", ["open"], "do_assign")
            .event("reopen", ["open"], "do_reopen")
            .event("start", ["assigned"], "do_start")
            .action("do_assign", ["assigned"])
            .action("do_reopen", ["open"])
            .action("do_start", ["working"])
            .action("work", ["working", "assigned"])
            .build()
            .unwrap();
        let names = |states: &[StateName]| states.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let assigned = m.state("assigned").unwrap();
        let none = Properties::new();
        // (from, action, target) → (leaf, left, entered, retry)
        type Expected<'a> = (&'a str, &'a [&'a str], &'a [&'a str], u32);
        let cases: [(&State, &str, Option<&str>, Expected<'_>); 6] = [
            (assigned, "do_assign", Some("assigned"), ("assigned", &["assigned"], &["assigned"], 0)),
            (assigned, "do_reopen", Some("open"), ("unassigned", &["assigned", "open"], &["open", "unassigned"], 0)),
            (
                m.state("unassigned").unwrap(),
                "do_assign",
                Some("assigned"),
                ("assigned", &["unassigned"], &["assigned"], 0),
            ),
            // No target: stays, leaving and entering nothing.
            (assigned, "do_assign", None, ("assigned", &[], &[], 0)),
            // The unstable state's own auto action asking for it again: a retry.
            (m.state("working").unwrap(), "work", Some("working"), ("working", &[], &[], 3)),
            (m.state("working").unwrap(), "work", None, ("working", &[], &[], 3)),
        ];
        for (from, action, target, (leaf, left, entered, retry)) in cases {
            let e = enter(&m, from, m.action(action).unwrap(), target, None, 2, &none).unwrap();
            let what = format!("{action} from {} to {target:?}", from.name);
            assert_eq!(e.state.as_str(), leaf, "{what}");
            assert_eq!((names(&e.left), names(&e.entered), e.retry), (to_vec(left), to_vec(entered), retry), "{what}");
            assert_eq!(e.moves(), !left.is_empty(), "{what}");
        }
    }

    #[test]
    fn a_parent_with_history_resumes_where_the_entity_last_was_in_it() {
        use crate::machine::{HISTORY_PROPERTY, History};
        // work (shallow): prep, run > {a, b}; deep_work (deep): x, y > {y1, y2}.
        let m = MachineBuilder::new("h")
            .state("idle")
            .initial()
            .state("work")
            .initial_child("prep")
            .history(History::Shallow)
            .state("prep")
            .parent("work")
            .state("run")
            .parent("work")
            .initial_child("a")
            .state("a")
            .parent("run")
            .state("b")
            .parent("run")
            .state("deep_work")
            .initial_child("x")
            .history(History::Deep)
            .state("x")
            .parent("deep_work")
            .state("y")
            .parent("deep_work")
            .initial_child("y1")
            .state("y1")
            .parent("y")
            .state("y2")
            .parent("y")
            .event("go", ["idle"], "to_work")
            .event("pause", ["work", "deep_work"], "to_idle")
            .event("next", ["prep"], "to_run")
            .event("step", ["a"], "to_b")
            .event("dgo", ["idle"], "to_deep")
            .event("dnext", ["x"], "to_y")
            .event("dstep", ["y1"], "to_y2")
            .action("to_work", ["work"])
            .action("to_idle", ["idle"])
            .action("to_run", ["run"])
            .action("to_b", ["b"])
            .action("to_deep", ["deep_work"])
            .action("to_y", ["y"])
            .action("to_y2", ["y2"])
            .build()
            .unwrap();
        let mut state = "idle".to_string();
        let mut props = Properties::new();
        let mut fire = |action: &str, target: &str| -> Vec<String> {
            let from = m.state(&state).unwrap();
            let e = enter(&m, from, m.action(action).unwrap(), Some(target), None, 0, &props).unwrap();
            if let Some(h) = e.history.clone() {
                props.insert(HISTORY_PROPERTY.into(), h.into());
            }
            state = e.state.to_string();
            e.entered.iter().map(|s| s.to_string()).collect()
        };
        // (action, target) → the states entered, the leaf last
        let script: [(&str, &str, &[&str]); 10] = [
            ("to_work", "work", &["work", "prep"]),
            ("to_run", "run", &["run", "a"]),
            ("to_b", "b", &["b"]),
            ("to_idle", "idle", &["idle"]),
            // Shallow: `run` again, which enters its own initial child.
            ("to_work", "work", &["work", "run", "a"]),
            ("to_idle", "idle", &["idle"]),
            ("to_deep", "deep_work", &["deep_work", "x"]),
            ("to_y", "y", &["y", "y1"]),
            ("to_y2", "y2", &["y2"]),
            ("to_idle", "idle", &["idle"]),
        ];
        for (action, target, entered) in script {
            assert_eq!(fire(action, target), to_vec(entered), "{action} to {target}");
        }
        // Deep: the leaf itself.
        assert_eq!(fire("to_deep", "deep_work"), to_vec(&["deep_work", "y", "y2"]));
        assert_eq!(props[HISTORY_PROPERTY], serde_json::json!({"work": "run", "deep_work": "y2"}));
        // A remembered state that is no longer below the parent: its initial child.
        let stale: Properties =
            [(HISTORY_PROPERTY.to_string(), serde_json::json!({"work": "x"}))].into_iter().collect();
        let e = enter(&m, m.state("idle").unwrap(), m.action("to_work").unwrap(), Some("work"), None, 0, &stale);
        assert_eq!(e.unwrap().state.as_str(), "prep");
    }

    fn to_vec(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn staying_keeps_the_states_invariants() {
        let m = machine();
        let done = m.state("done").unwrap();
        let err = stay(&m, done, &Properties::new()).unwrap_err();
        assert!(matches!(err, Refusal::InvariantViolated { ref missing, .. } if missing == &["result".to_string()]));
        assert!(stay(&m, done, &props(json!({"result": 1}))).is_ok());
        assert!(stay(&m, done, &props(json!({"result": null}))).is_err(), "null is missing");
    }

    #[test]
    fn entering_a_state_requires_what_its_leaf_and_every_ancestor_require() {
        let m = MachineBuilder::new("nest")
            .state("idle")
            .initial()
            .state("up")
            .requires(["a", "b"])
            .initial_child("running")
            .state("running")
            .parent("up")
            .requires(["b", "c"])
            .event("go", ["idle"], "start")
            .action("start", ["up"])
            .build()
            .unwrap();
        assert_eq!(required_to_enter(&m, "up"), ["a", "b", "c"], "the parent enters its initial child");
        assert_eq!(required_to_enter(&m, "running"), ["a", "b", "c"]);
        assert!(required_to_enter(&m, "idle").is_empty());
        assert_eq!(required_to_enter(&machine(), "done"), ["result"]);
    }

    #[test]
    fn changes_apply_in_order() {
        let mut p = props(json!({"a": 1, "b": 2}));
        apply_changes(
            &mut p,
            &[
                PropChange::Set("c".into(), json!(3)),
                PropChange::Remove("a".into()),
                PropChange::Set("b".into(), json!("x")),
                PropChange::Remove("c".into()),
                PropChange::Set("c".into(), json!(4)),
            ],
        );
        assert_eq!(p, props(json!({"b": "x", "c": 4})));
    }
}
