//! Checks across a set of validated machines: what no single definition can tell
//! ([`check_set`]), and checking a subscription [`Pattern`] against the machines it names
//! ([`Pattern::check`], [`Pattern::check_against`]).
//!
//! This is the one part of validation that knows the validated [`Machine`]; checking a
//! single definition ([`super::check`]) needs only the raw definition.

use std::collections::HashSet;

use super::report::{Diagnostic, Report, Severity};
use crate::machine::{Broadcast, KeyedRaise, Machine};
use crate::names::StateName;
use crate::pattern::{Condition, Filter, Pattern};

/// Checks what a single definition cannot: each subscription pattern of each machine
/// against the whole set ([`Pattern::check_against`]: unknown machines, states they do not
/// declare), each declarative `raise` against the machines that declare its event (there
/// is one; each takes its parameters), and machine names used twice in the set. Errors only, without lines (the
/// machines are already validated); the item is the subscription's event.
///
/// ```
/// use settle_core::MachineBuilder;
/// let server = MachineBuilder::new("server")
///     .state("waiting").initial()
///     .state("ready").kind(settle_core::StateKind::Terminal)
///     .event("children_ready", ["waiting"], "finish")
///     .subscribe("all(app) in [ready]")
///     .action("finish", ["ready"])
///     .build()
///     .unwrap();
/// let report = settle_core::validate::check_set(&[&server]);
/// assert_eq!(
///     report.to_string(),
///     "error: machine `server`, event `children_ready`: `subscribe`: unknown machine `app`\n"
/// );
/// ```
pub fn check_set(machines: &[&Machine]) -> Report {
    let mut diagnostics = Vec::new();
    let error = |machine: &str, item: String, message: String| Diagnostic {
        severity: Severity::Error,
        file: None,
        line: None,
        machine: machine.to_string(),
        item,
        message,
    };
    let mut seen = HashSet::new();
    for m in machines {
        if !seen.insert(m.name().as_str()) {
            diagnostics.push(error(
                m.name(),
                "machine".into(),
                "more than one machine with this name in the set".into(),
            ));
        }
    }
    for m in machines {
        for a in m.actions() {
            for r in &a.raise {
                for message in raise_problems(machines, r) {
                    diagnostics.push(error(m.name(), format!("action `{}`", a.name), message));
                }
            }
            for message in a.raise_keyed.iter().filter_map(|r| keyed_raise_problem(machines, r)) {
                diagnostics.push(error(m.name(), format!("action `{}`", a.name), message));
            }
            for (i, c) in a.create.iter().enumerate() {
                let problem = match machines.iter().find(|m| m.name() == &c.machine) {
                    None => Some(format!("`create[{i}]`: no machine `{}` in the set", c.machine)),
                    Some(target) => c.event.as_ref().and_then(|(event, params)| {
                        crate::step::check_raise(target, event, params)
                            .err()
                            .map(|e| format!("`create[{i}]`: its first event: {e}"))
                    }),
                };
                if let Some(message) = problem {
                    diagnostics.push(error(m.name(), format!("action `{}`", a.name), message));
                }
            }
            for created in a.may_create.iter().flatten() {
                if !machines.iter().any(|m| m.name() == created) {
                    let message = format!("`may_create`: no machine `{created}` in the set");
                    diagnostics.push(error(m.name(), format!("action `{}`", a.name), message));
                }
            }
            for event in a.may_raise.iter().flatten() {
                if !machines.iter().any(|m| m.event(event).is_some()) {
                    let message = format!("`may_raise`: no machine in the set declares event `{event}`");
                    diagnostics.push(error(m.name(), format!("action `{}`", a.name), message));
                }
            }
        }
        for e in m.events() {
            let Some(sub) = &e.subscribe else { continue };
            let problems = sub.pattern.check_against(machines);
            for message in &problems {
                diagnostics.push(error(m.name(), format!("event `{}`", e.name), format!("`subscribe`: {message}")));
            }
            if problems.is_empty()
                && let Some(message) = no_successor_source(machines, sub.pattern.filter())
            {
                diagnostics.push(Diagnostic {
                    severity: Severity::Warning,
                    message: format!("`subscribe`: {message}"),
                    ..error(m.name(), format!("event `{}`", e.name), String::new())
                });
            }
        }
    }
    // A limit shared by several machines: one set of slots, so one set of terms.
    let mut terms: std::collections::BTreeMap<&str, (&str, _)> = std::collections::BTreeMap::new();
    for m in machines {
        for l in m.limits() {
            match terms.get(l.name()) {
                None => {
                    terms.insert(l.name(), (m.name().as_str(), l.def.shared_terms()));
                }
                Some((first, t)) if *t != l.def.shared_terms() => diagnostics.push(error(
                    m.name(),
                    format!("limit `{}`", l.name()),
                    format!(
                        "machine `{first}` declares it too, with another kind, `max`, `rate` or `per`: machines that \
                         share a limit share its slots and must declare the same terms"
                    ),
                )),
                Some(_) => {}
            }
        }
    }
    for (machine, limit, message) in crate::limits::deadlocks(machines) {
        diagnostics
            .push(Diagnostic { severity: Severity::Warning, ..error(&machine, format!("limit `{limit}`"), message) });
    }
    Report { diagnostics }
}

/// Why no entity passing `filter` can ever be a successor in this set, if none can: no
/// action declares it may create one (`may_create`) or raise an event it declares (which
/// may join it), and no action needs a Rust handler, which may do either undeclared.
fn no_successor_source(machines: &[&Machine], filter: &Filter) -> Option<String> {
    let matching: Vec<&&Machine> = machines.iter().filter(|m| filter.matches(m.name())).collect();
    let declares = |event: &str| matching.iter().any(|m| m.event(event).is_some());
    let mut actions = machines.iter().flat_map(|m| m.actions());
    let possible = actions.any(|a| {
        let undeclared = a.may_create.is_none() && a.may_raise.is_none();
        let handler = a.targets.len() != 1 && a.agent.is_none() && !a.is_declarative();
        (undeclared && handler)
            || a.create.iter().any(|c| filter.matches(&c.machine))
            || a.may_create.iter().flatten().any(|c| filter.matches(c))
            || a.may_raise.iter().flatten().any(|e| declares(e))
    });
    if possible {
        return None;
    }
    let what = match filter {
        Filter::AnyMachine => "any entity".to_string(),
        Filter::Machine(name) => format!("a `{name}` entity"),
    };
    Some(format!(
        "no action in the set may create or join {what}, so the pattern has no successors to select \
         (declare `may_create` on the action that creates them)"
    ))
}

/// What is wrong with a declarative `raise` in this set: no machine declares its event, or
/// one that does refuses its parameters.
fn raise_problems(machines: &[&Machine], r: &Broadcast) -> Vec<String> {
    let declaring: Vec<&&Machine> = machines.iter().filter(|m| m.event(&r.event).is_some()).collect();
    if declaring.is_empty() {
        return vec![format!(
            "`raise` of `{}` on {}: no machine in the set declares that event",
            r.event,
            r.on.as_str()
        )];
    }
    declaring
        .into_iter()
        .filter_map(|m| crate::step::check_raise(m, &r.event, &r.params).err())
        .map(|e| format!("`raise` of `{}` on {}: {e}", r.event, r.on.as_str()))
        .collect()
}

/// What is wrong with a declarative `raise` on an entity named by key: its machine is not
/// in the set, or does not take the event with its parameters.
fn keyed_raise_problem(machines: &[&Machine], r: &KeyedRaise) -> Option<String> {
    let Some(target) = machines.iter().find(|m| m.name() == &r.machine) else {
        return Some(format!("`raise` of `{}` on a `{}`: no machine `{}` in the set", r.event, r.machine, r.machine));
    };
    let e = crate::step::check_raise(target, &r.event, &r.params).err()?;
    Some(format!("`raise` of `{}` on a `{}`: {e}", r.event, r.machine))
}

/// Checking a pattern against machines lives here, where machines are known; the rest of
/// [`Pattern`] (parsing, evaluating, [`Pattern::problems`]) needs none.
impl Pattern {
    /// Checks the pattern against the machines that `lookup` knows by name, and returns
    /// every problem found: a filter naming an unknown machine (`unknown machine `x``),
    /// states in `in [...]` the filtered machine does not declare (`machine `app` has no
    /// state `x``), then those of [`Pattern::problems`].
    ///
    /// With the filter `*` a lookup cannot list the machines to search, so the states are
    /// not checked: use [`Pattern::check_against`] with the whole set for that.
    pub fn check<'m>(&self, lookup: &dyn Fn(&str) -> Option<&'m Machine>) -> Vec<String> {
        self.check_with(lookup, &[])
    }

    /// Like [`Pattern::check`], with the set of known machines given as a slice; with the
    /// filter `*`, each state in `in [...]` must then be declared by at least one of them
    /// (unless the set is empty).
    pub fn check_against(&self, machines: &[&Machine]) -> Vec<String> {
        self.check_with(&|name| machines.iter().copied().find(|m| m.name() == name), machines)
    }

    fn check_with<'m>(&self, lookup: &dyn Fn(&str) -> Option<&'m Machine>, all: &[&Machine]) -> Vec<String> {
        let mut out = Vec::new();
        let states = match self.condition() {
            Condition::InStates(states) => states.as_slice(),
            Condition::Health(_) => &[],
        };
        // Each unknown state once, even when listed twice (the duplicate is reported apart).
        let unknown = |known: &dyn Fn(&str) -> bool| -> Vec<&StateName> {
            let mut out: Vec<&StateName> = Vec::new();
            for s in states {
                if !known(s) && !out.contains(&s) {
                    out.push(s);
                }
            }
            out
        };
        match self.filter() {
            Filter::Machine(name) => match lookup(name) {
                None => out.push(format!("unknown machine `{name}`")),
                Some(m) => {
                    for s in unknown(&|s| m.state(s).is_some()) {
                        out.push(format!("machine `{name}` has no state `{s}`"));
                    }
                }
            },
            Filter::AnyMachine if !all.is_empty() => {
                for s in unknown(&|s| all.iter().any(|m| m.state(s).is_some())) {
                    out.push(format!("no known machine has state `{s}`"));
                }
            }
            Filter::AnyMachine => {}
        }
        out.extend(self.problems());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::base;
    use crate::machine::{MachineBuilder, StateKind};

    fn p(text: &str) -> Pattern {
        Pattern::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    /// A machine whose entities go from `states[0]` (initial) to the terminal `states[1]`.
    fn finishing(name: &str, states: [&str; 2]) -> Machine {
        MachineBuilder::new(name)
            .state(states[0])
            .initial()
            .state(states[1])
            .kind(StateKind::Terminal)
            .event("finish", [states[0]], "done")
            .action("done", [states[1]])
            .build()
            .unwrap()
    }

    fn machines() -> (Machine, Machine) {
        (finishing("app", ["creating", "ready"]), finishing("db", ["provisioning", "ready"]))
    }

    #[test]
    fn check_against_known_machines() {
        let (app, db) = machines();
        let set = [&app, &db];
        let lookup = |name: &str| set.iter().copied().find(|m| m.name() == name);
        let check = |text: &str| p(text).check(&lookup);
        assert_eq!(check("all(app) in [ready]"), Vec::<String>::new());
        assert_eq!(check("any(dns) in [ready]"), ["unknown machine `dns`"]);
        assert_eq!(
            check("all(app) in [ready, gone, provisioning, gone]"),
            [
                "machine `app` has no state `gone`",
                "machine `app` has no state `provisioning`",
                "duplicate state `gone` in `in [...]`",
            ]
        );
        assert_eq!(check("count(db in [x]) < 0"), ["machine `db` has no state `x`", "`count(...) < 0` can never hold"]);
        assert_eq!(check("count(db health ok) >= 0"), ["`count(...) >= 0` always holds"]);
        assert_eq!(check("count(db health ok) <= 0"), Vec::<String>::new());
        // A lookup cannot list machines: states under `*` are checked only by check_against.
        assert_eq!(check("all(*) in [nowhere, nowhere]"), ["duplicate state `nowhere` in `in [...]`"]);
        let against = |text: &str| p(text).check_against(&set);
        assert_eq!(against("all(*) in [provisioning, creating]"), Vec::<String>::new());
        assert_eq!(against("all(*) in [ready, nowhere]"), ["no known machine has state `nowhere`"]);
        assert_eq!(against("none(web) health error"), ["unknown machine `web`"]);
        // With no machine known at all, states under `*` are not checked.
        assert_eq!(p("all(*) in [nowhere]").check_against(&[]), Vec::<String>::new());
        assert_eq!(
            p("count(* in [a, a]) < 0").problems(),
            ["duplicate state `a` in `in [...]`", "`count(...) < 0` can never hold"]
        );
    }

    #[test]
    fn subscriptions_are_checked_against_the_set() {
        let child = |name: &str| finishing(name, ["creating", "ready"]);
        let (app, db) = (child("app"), child("db"));
        let parent = base()
            .event("all_ready", ["idle"], "start")
            .subscribe("all(*) in [ready]")
            .event("apps_ready", ["idle"], "start")
            .subscribe("all(app) in [ready]")
            .event("dns_ready", ["idle"], "start")
            .subscribe("any(dns) in [ready]")
            .event("db_gone", ["idle"], "start")
            .subscribe("any(type=db) in [gone, ready, failed]")
            .event("anything_gone", ["idle"], "start")
            .subscribe("count(* in [gone, creating]) > 1")
            .build()
            .unwrap();
        let messages =
            |set: &[&Machine]| -> Vec<String> { check_set(set).diagnostics.iter().map(ToString::to_string).collect() };
        assert_eq!(
            messages(&[&parent, &app, &db]),
            [
                "error: machine `m`, event `dns_ready`: `subscribe`: unknown machine `dns`",
                "error: machine `m`, event `db_gone`: `subscribe`: machine `db` has no state `gone`",
                "error: machine `m`, event `db_gone`: `subscribe`: machine `db` has no state `failed`",
                "error: machine `m`, event `anything_gone`: `subscribe`: no known machine has state `gone`",
            ]
        );
        // The subscriber is a machine of the set too: `idle` is one of its states.
        let ok = base().event("e", ["idle"], "start").subscribe("any(*) in [idle]").build().unwrap();
        assert_eq!(messages(&[&ok]), Vec::<String>::new());
        assert_eq!(
            messages(&[&app, &db, &app]),
            ["error: machine `app`, machine: more than one machine with this name in the set"]
        );
    }

    #[test]
    fn declarative_raises_are_checked_against_the_set() {
        use crate::machine::Related;
        use serde_json::json;
        let child = MachineBuilder::new("child")
            .state("idle")
            .initial()
            .state("ready")
            .on_entry("tell")
            .event("finish", ["idle"], "done")
            .action("done", ["ready"])
            .effect("tell")
            .raises("child_ready", Related::Predecessors, json!({"size": 1}))
            .raises("stop", Related::Successors, json!(null))
            .build()
            .unwrap();
        let parent = |params: &[&str]| {
            MachineBuilder::new("parent")
                .state("waiting")
                .initial()
                .state("done")
                .event("child_ready", ["waiting"], "finish")
                .params(params.iter().copied())
                .action("finish", ["done"])
                .build()
                .unwrap()
        };
        let messages =
            |set: &[&Machine]| -> Vec<String> { check_set(set).diagnostics.iter().map(ToString::to_string).collect() };
        assert_eq!(
            messages(&[&child]),
            [
                "error: machine `child`, action `tell`: `raise` of `child_ready` on predecessors: no machine in the \
                 set declares that event",
                "error: machine `child`, action `tell`: `raise` of `stop` on successors: no machine in the set \
                 declares that event",
            ]
        );
        let (takes_size, takes_name) = (parent(&["size"]), parent(&["name"]));
        assert_eq!(
            messages(&[&child, &takes_name]),
            [
                "error: machine `child`, action `tell`: `raise` of `child_ready` on predecessors: event \
                 `child_ready` on machine `parent` requires parameter `name`",
                "error: machine `child`, action `tell`: `raise` of `stop` on successors: no machine in the set \
                 declares that event",
            ]
        );
        let app = MachineBuilder::new("app")
            .state("running")
            .initial()
            .state("stopped")
            .kind(StateKind::Terminal)
            .event("stop", ["running"], "halt")
            .action("halt", ["stopped"])
            .build()
            .unwrap();
        assert_eq!(messages(&[&child, &takes_size, &app]), Vec::<String>::new());
    }

    #[test]
    fn a_subscription_no_action_can_give_successors_is_a_warning() {
        use std::time::Duration;
        // TOML and agents only: a subscriber whose successors nothing may create.
        let subscriber = |create: Option<&[&str]>, raise: Option<&[&str]>| {
            let mut b = MachineBuilder::new("server")
                .state("new")
                .initial()
                .state("creating")
                .auto("create_resources")
                .state("waiting")
                .state("ready")
                .event("create", ["new"], "begin")
                .event("apps_ready", ["waiting"], "finish")
                .subscribe("all(app) in [ready]")
                .event("all_ready", ["waiting"], "finish")
                .subscribe("all(*) in [ready]")
                .action("begin", ["creating"])
                .action("finish", ["ready"])
                .action("create_resources", ["waiting"])
                .agent("control", Duration::from_secs(60));
            if let Some(c) = create {
                b = b.may_create(c.iter().copied());
            }
            if let Some(r) = raise {
                b = b.may_raise(r.iter().copied());
            }
            b.build().unwrap()
        };
        let (app, db) = machines();
        let warnings = |set: &[&Machine]| -> Vec<String> {
            check_set(set)
                .diagnostics
                .iter()
                .filter(|d| d.severity == Severity::Warning)
                .map(ToString::to_string)
                .collect()
        };
        let none = subscriber(None, None);
        let why = "no action in the set may create or join";
        assert_eq!(
            warnings(&[&none, &app, &db]),
            [
                format!(
                    "warning: machine `server`, event `apps_ready`: `subscribe`: {why} a `app` entity, so the pattern has no successors to select (declare `may_create` on the action that creates them)"
                ),
                format!(
                    "warning: machine `server`, event `all_ready`: `subscribe`: {why} any entity, so the pattern has no successors to select (declare `may_create` on the action that creates them)"
                ),
            ]
        );
        // An action that may create a `db` gives `*` successors, not `app` ones.
        let dbs = subscriber(Some(&["db"]), None);
        assert_eq!(warnings(&[&dbs, &app, &db]).len(), 1);
        assert!(warnings(&[&dbs, &app, &db])[0].contains("event `apps_ready`"));
        // Creating an `app`, or raising an event an `app` declares (it may join), or an
        // action only a Rust handler can run (undeclared): no warning.
        assert_eq!(warnings(&[&subscriber(Some(&["app"]), None), &app, &db]), Vec::<String>::new());
        assert_eq!(warnings(&[&subscriber(None, Some(&["finish"])), &app, &db]), Vec::<String>::new());
        let handler = MachineBuilder::new("maker")
            .state("a")
            .initial()
            .state("b")
            .state("c")
            .event("go", ["a"], "make")
            .action("make", ["b", "c"])
            .build()
            .unwrap();
        assert_eq!(warnings(&[&none, &app, &db, &handler]), Vec::<String>::new());
    }

    #[test]
    fn what_an_action_may_create_and_raise_is_checked_against_the_set() {
        let server = MachineBuilder::new("server")
            .state("creating")
            .initial()
            .auto("create")
            .state("ready")
            .action("create", ["ready"])
            .agent("cloud", std::time::Duration::from_secs(60))
            .may_create(["app", "dns"])
            .may_raise(["stop", "renew"])
            .build()
            .unwrap();
        let (app, _) = machines();
        let messages =
            |set: &[&Machine]| -> Vec<String> { check_set(set).diagnostics.iter().map(ToString::to_string).collect() };
        assert_eq!(
            messages(&[&server, &app]),
            [
                "error: machine `server`, action `create`: `may_create`: no machine `dns` in the set",
                "error: machine `server`, action `create`: `may_raise`: no machine in the set declares event `stop`",
                "error: machine `server`, action `create`: `may_raise`: no machine in the set declares event `renew`",
            ]
        );
    }
}
