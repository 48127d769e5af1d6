//! Flow control in the definition (DESIGN §10): limits on how much work runs at once, and
//! how fast it starts, per value of a key.
//!
//! ```toml
//! [limits.provider_calls]
//! states = ["provisioning", "deleting"]  # concurrency of these states' auto actions
//! max = 20                               # at most 20 at once per key value
//! key = "props.region"                   # per region (none: one limit for all)
//!
//! [limits.creates]
//! events = ["create"]                    # concurrency of the workflows these events start
//! max = 5
//! key = "props.tenant"
//! rate = 100                             # and at most 100 starts
//! per = "1m"                             # a minute, per key value
//! ```
//!
//! A limit names either states (its slots are taken by their auto actions) or events
//! (taken by the workflows they start), and a `max`, a `rate` (with `per`), or both. Its
//! `key` is an expression over `props` and `key` (the entity's key); `fair_by`, for a limit
//! without a key, an expression its waiting work is admitted round-robin by. A limit of one
//! name may be declared by several machines: they share its slots, so they must agree on
//! its kind, `max` and rate ([`crate::validate::check_set`]).
//!
//! This module holds what a limit is ([`LimitKind`], [`Limit`]) and the checks of one
//! limit against its machine ([`check`]); the definition as written, [`LimitDef`] (whose
//! serde form is its canonical form), is the definition's (`machine::def`).

use std::time::Duration;

use crate::expr::{Expression, Names};
pub use crate::machine::def::LimitDef;
use crate::machine::def::{MachineDef, StateKind, effective_kind};

/// How much lower than a request's the default priority of a bulk operation's or a
/// schedule's events is (their event's declared priority, less this): live work of an event
/// goes before the same event in bulk.
pub const BACKGROUND: i64 = 10;

/// The range a priority must lie in (declared, or given with a request).
pub const PRIORITIES: std::ops::RangeInclusive<i64> = -1_000..=1_000;

/// What a limit's slots are taken by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitKind {
    /// The auto actions of its states.
    Actions,
    /// The workflows its events start.
    Workflows,
}

impl LimitKind {
    /// `actions` or `workflows`.
    pub fn as_str(self) -> &'static str {
        match self {
            LimitKind::Actions => "actions",
            LimitKind::Workflows => "workflows",
        }
    }
}

impl LimitDef {
    /// What its slots are taken by (`None`: it names neither states nor events, or both).
    pub fn kind(&self) -> Option<LimitKind> {
        match (self.states.is_empty(), self.events.is_empty()) {
            (false, true) => Some(LimitKind::Actions),
            (true, false) => Some(LimitKind::Workflows),
            _ => None,
        }
    }

    /// The period of its rate.
    pub fn per(&self) -> Duration {
        Duration::from_millis(self.per_ms.unwrap_or(1_000))
    }

    /// What machines sharing it must agree on: kind, `max`, rate and period.
    pub fn shared_terms(&self) -> (Option<LimitKind>, Option<u32>, Option<u32>, Option<u64>) {
        (self.kind(), self.max, self.rate, self.rate.map(|_| self.per_ms.unwrap_or(1_000)))
    }
}

/// A validated limit of a machine: its definition and parsed expressions. Compares equal
/// by its definition (wherever it was declared).
#[derive(Debug, Clone)]
pub struct Limit {
    /// As declared.
    pub def: LimitDef,
    /// The key expression, parsed.
    pub key: Option<Expression>,
    /// The fairness expression, parsed.
    pub fair_by: Option<Expression>,
}

impl PartialEq for Limit {
    fn eq(&self, other: &Self) -> bool {
        let declared = |l: &Limit| LimitDef { origin: Default::default(), ..l.def.clone() };
        declared(self) == declared(other)
    }
}

impl Limit {
    /// The limit `def` describes (already checked by [`check`]).
    pub fn from_def(def: &LimitDef) -> Limit {
        let parse = |e: &Option<String>| e.as_deref().and_then(|s| Expression::parse(s).ok());
        Limit { key: parse(&def.key), fair_by: parse(&def.fair_by), def: def.clone() }
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.def.name
    }

    /// The value of its key for an entity with `props` and `key`, as the text its slots are
    /// counted by: a string as it is, any other value as JSON; `""` for a limit without a
    /// key. `Err` says why the expression could not be evaluated (a missing property).
    pub fn key_of(&self, props: &crate::Properties, key: &str) -> Result<String, String> {
        self.value_of("key", self.key.as_ref(), props, key)
    }

    /// The value of its `fair_by` for an entity, as [`Limit::key_of`]: its waiting work is
    /// admitted round-robin across these values (`""`: no `fair_by`).
    pub fn fair_of(&self, props: &crate::Properties, key: &str) -> Result<String, String> {
        self.value_of("fair_by", self.fair_by.as_ref(), props, key)
    }

    fn value_of(
        &self,
        field: &str,
        expr: Option<&Expression>,
        props: &crate::Properties,
        key: &str,
    ) -> Result<String, String> {
        let Some(expr) = expr else { return Ok(String::new()) };
        match expr.eval(props, &serde_json::Value::Null, key) {
            Ok(serde_json::Value::String(s)) => Ok(s),
            Ok(other) => Ok(other.to_string()),
            Err(e) => {
                Err(format!("limit `{}`: its {field} `{}` could not be evaluated: {e}", self.name(), expr.source()))
            }
        }
    }
}

/// Every problem of `limit` in `machine`, as messages: what it names, its terms and its
/// expressions.
pub fn check(limit: &LimitDef, machine: &MachineDef, properties: &[String]) -> Vec<String> {
    let mut problems = Vec::new();
    match limit.kind() {
        None if limit.states.is_empty() => {
            problems.push("name `states` (whose auto actions it limits) or `events` (whose workflows)".to_string())
        }
        None => problems.push("name `states` or `events`, not both: a limit counts one kind of work".to_string()),
        Some(_) => {}
    }
    for st in &limit.states {
        match machine.states.iter().find(|s| &s.name == st) {
            None => problems.push(format!("`states` names unknown state `{st}`")),
            Some(s) if effective_kind(s) != StateKind::Unstable => {
                problems.push(format!("`states` names `{st}`, which has no auto action to limit"))
            }
            Some(_) => {}
        }
    }
    for ev in &limit.events {
        match machine.events.iter().find(|e| &e.name == ev) {
            None => problems.push(format!("`events` names unknown event `{ev}`")),
            Some(e) if e.subscribe.is_some() => problems.push(format!(
                "`events` names `{ev}`, a subscription event: it fires when its pattern holds and cannot wait in \
                 line (limit the events that start the children's work instead)"
            )),
            Some(_) => {}
        }
    }
    match (limit.max, limit.rate) {
        (None, None) => problems.push("give `max` (at once), `rate` (starts per `per`), or both".to_string()),
        (Some(0), _) => problems.push("`max` must be at least 1".to_string()),
        (_, Some(0)) => problems.push("`rate` must be at least 1".to_string()),
        _ => {}
    }
    if limit.per_ms.is_some() && limit.rate.is_none() {
        problems.push("`per` is the period of `rate`: give `rate` too".to_string());
    }
    if limit.per_ms == Some(0) {
        problems.push("`per` must be longer than 0".to_string());
    }
    if limit.fair_by.is_some() && limit.key.is_some() {
        problems.push(
            "`fair_by` is for a limit without a `key` (work of different keys never waits for each other)".to_string(),
        );
    }
    let names = Names { params: &[], properties, states: &[] };
    for (field, source) in [("key", &limit.key), ("fair_by", &limit.fair_by)] {
        let Some(source) = source else { continue };
        match Expression::parse(source) {
            Ok(e) => {
                for problem in e.check(names) {
                    let problem = problem
                        .replace("an expression reads `props`, `params` and `key`", "it reads `props` and `key`");
                    problems.push(format!("`{field}` = `{source}`: {problem}"));
                }
                if source.contains("params") {
                    problems
                        .push(format!("`{field}` = `{source}`: a limit's key reads `props` and `key`, not `params`"));
                }
            }
            Err(message) => problems.push(format!("`{field}` = `{source}`: {message}")),
        }
    }
    problems
}

/// Where limits of `machines` can deadlock, as (machine, limit, message): an action that
/// runs holding a slot of a limit (the auto action of a state it names, or any action of a
/// workflow it counts, from its event's action through the auto actions after it) and runs
/// in a Rust handler, which may wait in its action for a sync nested event, declares it may
/// raise (`may_raise`) an event that needs a slot of the same limit on the entity it is
/// raised on (an event it counts the workflows of, or one that leads into a state whose
/// auto action it counts). When every slot is held by such actions, each waits for an event
/// that waits for a slot: nothing moves. A workflow gives its slot back at rest, so waiting
/// for children at rest (a subscription, an async reply) cannot deadlock; only waiting
/// inside the action can.
pub fn deadlocks(machines: &[&crate::Machine]) -> Vec<(String, String, String)> {
    let mut found = Vec::new();
    for m in machines {
        for limit in m.limits() {
            for action in holding(m, limit) {
                let Some(a) = m.action(&action) else { continue };
                let handler = a.targets.len() != 1 && a.agent.is_none() && !a.is_declarative();
                if !handler {
                    continue;
                }
                for event in a.may_raise.iter().flatten() {
                    for target in machines.iter().filter(|t| t.event(event).is_some()) {
                        let same = target.limits().iter().find(|l| l.name() == limit.name());
                        let Some(same) = same else { continue };
                        let needs = same.def.events.iter().any(|e| e == event.as_str())
                            || reached(target, event).iter().any(|st| same.def.states.contains(st));
                        if needs {
                            found.push((
                                m.name().to_string(),
                                limit.name().to_string(),
                                format!(
                                    "can deadlock: action `{action}` runs holding a slot of it and may raise `{event}` \
                                     on `{}`, which needs a slot of it too; if every slot is held by actions waiting \
                                     for such an event (a sync nested event awaited in the handler), none is ever \
                                     given back (give the raised work a limit of its own, or wait for it at rest)",
                                    target.name()
                                ),
                            ));
                        }
                    }
                }
            }
        }
    }
    found
}

/// The actions of `m` that run holding a slot of `limit`: the auto actions of the states it
/// names, or the actions of the events it names and the auto actions of the states their
/// workflows pass through before coming to rest.
fn holding(m: &crate::Machine, limit: &Limit) -> Vec<String> {
    let mut actions: Vec<String> = Vec::new();
    let mut states: Vec<String> = limit.def.states.clone();
    for event in &limit.def.events {
        for alt in m.event(event).map(|e| e.alternatives.as_slice()).unwrap_or_default() {
            if let Some(a) = alt.action() {
                actions.push(a.to_string());
            }
        }
        states.extend(reached(m, event));
    }
    for st in states {
        if let Some(auto) = m.state(&st).and_then(|s| s.auto.as_ref()) {
            actions.push(auto.to_string());
        }
    }
    actions.sort();
    actions.dedup();
    actions
}

/// The states a workflow of `event` passes through in `m` before it comes to rest: its
/// actions' targets (a parent entered at its initial leaf), then the targets of the auto
/// actions of the unstable ones, and so on.
fn reached(m: &crate::Machine, event: &str) -> Vec<String> {
    let leaf = |mut name: String| {
        while let Some(child) = m.state(&name).and_then(|s| s.initial_child.clone()) {
            name = child.to_string();
        }
        name
    };
    let targets = |action: &str| -> Vec<String> {
        m.action(action).map(|a| a.targets.iter().map(|t| leaf(t.state.to_string())).collect()).unwrap_or_default()
    };
    let mut next: Vec<String> = Vec::new();
    for alt in m.event(event).map(|e| e.alternatives.as_slice()).unwrap_or_default() {
        if let Some(a) = alt.action() {
            next.extend(targets(a));
        }
    }
    let mut seen: Vec<String> = Vec::new();
    while let Some(st) = next.pop() {
        if seen.contains(&st) {
            continue;
        }
        let state = m.state(&st);
        if let Some(auto) = state.filter(|s| s.kind == crate::StateKind::Unstable).and_then(|s| s.auto.as_ref()) {
            next.extend(targets(auto));
        }
        seen.push(st);
    }
    seen
}

#[cfg(test)]
mod tests {
    use super::*;

    const VM: &str = r#"initial = "new"
properties = ["region", "tenant"]
[states.new]
[states.provisioning]
auto = "provision"
[states.deleting]
auto = "deprovision"
[states.ready]
[events.create]
in = ["new"]
action = "begin"
[events.delete]
in = ["ready"]
action = "remove"
[actions.begin]
to = ["provisioning"]
[actions.provision]
to = ["ready", "provisioning"]
agent = "cloud"
[actions.remove]
to = ["deleting"]
[actions.deprovision]
to = ["ready"]
agent = "cloud"
"#;

    fn with(limits: &str) -> String {
        format!("{VM}{limits}")
    }

    #[test]
    fn an_events_priority_loads_comes_back_and_is_checked() {
        let text =
            VM.replace("[events.delete]\nin = [\"ready\"]\n", "[events.delete]\nin = [\"ready\"]\npriority = 10\n");
        let (m, _) = crate::toml::load("vm.toml", "vm", &text).unwrap();
        assert_eq!((m.event("delete").unwrap().priority, m.event("create").unwrap().priority), (10, 0));
        let back = crate::Machine::from_canonical_json(&m.canonical_json()).unwrap();
        assert_eq!((back.content_hash(), back.event("delete").unwrap().priority), (m.content_hash(), 10));
        let (again, _) = crate::toml::load("vm.toml", "vm", &m.to_toml()).unwrap();
        assert_eq!(again.content_hash(), m.content_hash(), "{}", m.to_toml());
        let (plain, _) = crate::toml::load("vm.toml", "vm", VM).unwrap();
        assert_ne!(plain.content_hash(), m.content_hash(), "a priority is part of the definition");
        assert!(!plain.canonical_json().contains("priority"), "none declared: nothing added to the form");
        let wild =
            VM.replace("[events.delete]\nin = [\"ready\"]\n", "[events.delete]\nin = [\"ready\"]\npriority = 5000\n");
        let report = crate::toml::load("vm.toml", "vm", &wild).err().unwrap().to_string();
        assert!(
            report.contains(
                "vm.toml:12: error: machine `vm`, event `delete`: `priority` = 5000: a priority lies from -1000 to 1000"
            ),
            "{report}"
        );
    }

    #[test]
    fn limits_load_and_come_back_the_same_through_their_canonical_form_and_toml() {
        let text = with(
            "[limits.provider_calls]\nstates = [\"provisioning\", \"deleting\"]\nmax = 20\nkey = \"props.region\"\n\
             [limits.creates]\nevents = [\"create\"]\nmax = 5\nrate = 100\nper = \"1m\"\nfair_by = \"props.tenant\"\n",
        );
        let (m, warnings) = crate::toml::load("vm.toml", "vm", &text).unwrap();
        let names: Vec<&str> = m.limits().iter().map(Limit::name).collect();
        assert_eq!(names, ["provider_calls", "creates"]);
        let calls = &m.limits()[0];
        assert_eq!(
            (calls.def.kind(), calls.def.max, calls.key.as_ref().map(|k| k.source())),
            (Some(LimitKind::Actions), Some(20), Some("props.region"))
        );
        assert_eq!(m.limits()[1].def.per(), Duration::from_secs(60));
        assert_eq!(warnings.warnings().count(), 0, "{warnings}");
        let back = crate::Machine::from_canonical_json(&m.canonical_json()).unwrap();
        assert_eq!(back.content_hash(), m.content_hash());
        assert_eq!(back.limits(), m.limits());
        let (again, _) = crate::toml::load("vm.toml", "vm", &m.to_toml()).unwrap();
        assert_eq!(again.content_hash(), m.content_hash(), "{}", m.to_toml());
        // A machine without limits keeps the hash it had: nothing is added to its form.
        let (plain, _) = crate::toml::load("vm.toml", "vm", VM).unwrap();
        assert!(!plain.canonical_json().contains("limits"));
        assert!(m.has_workflow_limits() && !plain.has_workflow_limits());
        let creates: Vec<&str> = m.workflow_limits_of("create").map(Limit::name).collect();
        assert_eq!(creates, ["creates"]);
        assert!(m.workflow_limits_of("delete").next().is_none());
    }

    #[test]
    fn every_mistake_in_a_limit_is_named_with_its_line() {
        // (the limit's body) → the errors, each `line N: error: machine `vm`, limit `l`: …`
        let cases: [(&str, &[&str]); 12] = [
            ("states = [\"nowhere\"]\nmax = 1", &["`states` names unknown state `nowhere`"]),
            ("states = [\"ready\"]\nmax = 1", &["`states` names `ready`, which has no auto action to limit"]),
            ("events = [\"explode\"]\nmax = 1", &["`events` names unknown event `explode`"]),
            ("max = 1", &["name `states` (whose auto actions it limits) or `events` (whose workflows)"]),
            (
                "states = [\"provisioning\"]\nevents = [\"create\"]\nmax = 1",
                &["name `states` or `events`, not both: a limit counts one kind of work"],
            ),
            ("states = [\"provisioning\"]", &["give `max` (at once), `rate` (starts per `per`), or both"]),
            ("states = [\"provisioning\"]\nmax = 0", &["`max` must be at least 1"]),
            ("states = [\"provisioning\"]\nmax = 1\nper = \"1s\"", &["`per` is the period of `rate`: give `rate` too"]),
            (
                "states = [\"provisioning\"]\nmax = 1\nkey = \"props.region\"\nfair_by = \"props.tenant\"",
                &["`fair_by` is for a limit without a `key` (work of different keys never waits for each other)"],
            ),
            (
                "states = [\"provisioning\"]\nmax = 1\nkey = \"props.zone\"",
                &[
                    "`key` = `props.zone`: `props.zone`: the machine never mentions property `zone` (declare it in `properties`)",
                ],
            ),
            (
                "states = [\"provisioning\"]\nmax = 1\nkey = \"props.region +\"",
                &[
                    "`key` = `props.region +`: syntax error at column 15: mismatched input '<EOF>' expecting {'[', '{', '(', '.', '-', '!', 'true', 'false', 'null', NUM_FLOAT, NUM_INT, NUM_UINT, STRING, BYTES, IDENTIFIER}",
                ],
            ),
            ("states = [\"provisioning\", \"provisioning\"]\nmax = 1", &["duplicate `provisioning` in `states`"]),
        ];
        for (body, want) in cases {
            let text = with(&format!("[limits.l]\n{body}\n"));
            let report = crate::toml::load("vm.toml", "vm", &text).err().unwrap_or_else(|| panic!("{body}: loaded"));
            let errors: Vec<String> = report
                .diagnostics
                .iter()
                .filter(|d| d.severity == crate::validate::Severity::Error)
                .map(|d| {
                    assert_eq!((d.line, d.item.as_str()), (Some(25), "limit `l`"), "{d}");
                    d.message.clone()
                })
                .collect();
            assert_eq!(errors, want, "{body}");
        }
        // A state may count against several limits: a slot of each, taken in name order.
        let twice = with(
            "[limits.rate]\nstates = [\"provisioning\"]\nrate = 100\nper = \"1m\"\nkey = \"props.tenant\"\n\
             [limits.calls]\nstates = [\"provisioning\"]\nmax = 2\nkey = \"props.region\"\n",
        );
        let (m, _) = crate::toml::load("vm.toml", "vm", &twice).unwrap();
        let names: Vec<&str> = m.limits_of("provisioning").map(Limit::name).collect();
        assert_eq!(names, ["calls", "rate"]);
    }

    #[test]
    fn machines_sharing_a_limit_must_agree_on_its_terms() {
        let load = |name: &str, max: u32| {
            let text = with(&format!("[limits.shared]\nstates = [\"provisioning\"]\nmax = {max}\n"));
            crate::toml::load("m.toml", name, &text).unwrap().0
        };
        let (a, b, c) = (load("a", 3), load("b", 3), load("c", 4));
        assert!(!crate::validate::check_set(&[&a, &b]).has_errors());
        let report = crate::validate::check_set(&[&a, &c]).to_string();
        assert!(
            report.contains("machine `c`, limit `shared`: machine `a` declares it too, with another kind"),
            "{report}"
        );
    }

    #[test]
    fn a_key_value_is_a_string_as_it_is_and_anything_else_as_json() {
        let text = with("[limits.calls]\nstates = [\"provisioning\"]\nmax = 2\nkey = \"props.region\"\n");
        let (m, _) = crate::toml::load("vm.toml", "vm", &text).unwrap();
        let limit = m.limits_of("provisioning").next().expect("provisioning is limited");
        assert!(m.limits_of("deleting").next().is_none() && !m.is_limited("deleting"));
        let props = |v: serde_json::Value| serde_json::from_value(serde_json::json!({ "region": v })).unwrap();
        assert_eq!(limit.key_of(&props("eu".into()), "k").unwrap(), "eu");
        assert_eq!(limit.key_of(&props(7.into()), "k").unwrap(), "7");
        let missing = limit.key_of(&crate::Properties::default(), "k").unwrap_err();
        assert!(missing.starts_with("limit `calls`: its key `props.region` could not be evaluated: "), "{missing}");
        let global = Limit::from_def(&LimitDef { key: None, ..limit.def.clone() });
        assert_eq!(global.key_of(&props("eu".into()), "k").unwrap(), "");
    }

    #[test]
    fn a_limit_is_of_actions_or_of_workflows() {
        let actions = LimitDef { states: vec!["a".into()], max: Some(1), ..LimitDef::default() };
        assert_eq!(actions.kind(), Some(LimitKind::Actions));
        let workflows = LimitDef { events: vec!["e".into()], rate: Some(5), ..LimitDef::default() };
        assert_eq!(workflows.kind(), Some(LimitKind::Workflows));
        assert_eq!(workflows.per(), Duration::from_secs(1));
        assert_eq!(workflows.shared_terms(), (Some(LimitKind::Workflows), None, Some(5), Some(1_000)));
        let both = LimitDef { states: vec!["a".into()], events: vec!["e".into()], ..LimitDef::default() };
        assert_eq!(both.kind(), None);
    }

    #[test]
    fn its_canonical_form_leaves_out_what_is_not_given() {
        let l = LimitDef { name: "calls".into(), states: vec!["a".into()], max: Some(2), ..LimitDef::default() };
        let json = serde_json::to_value(&l).unwrap();
        assert_eq!(json, serde_json::json!({"name": "calls", "states": ["a"], "max": 2}));
        assert_eq!(serde_json::from_value::<LimitDef>(json).unwrap(), l);
    }

    #[test]
    fn a_subscription_event_cannot_be_limited() {
        let text = "initial = \"idle\"\n[states.idle]\n[states.waiting]\n[states.done]\n\
                    [events.wait]\nin = [\"idle\"]\naction = \"hold\"\n\
                    [events.children_done]\nin = [\"waiting\"]\naction = \"finish\"\nsubscribe = \"all(*) in [done]\"\n\
                    [actions.hold]\nto = [\"waiting\"]\n[actions.finish]\nto = [\"done\"]\n\
                    [limits.fired]\nevents = [\"children_done\"]\nmax = 1\n";
        let report = crate::toml::load("p.toml", "p", text).err().unwrap().to_string();
        assert!(
            report.contains("limit `fired`: `events` names `children_done`, a subscription event: it fires when its pattern holds and cannot wait in line"),
            "{report}"
        );
    }

    #[test]
    fn a_limit_held_while_a_handler_may_wait_for_work_that_needs_it_is_a_deadlock_warning() {
        // `parent`'s `provision` (a handler, in a workflow `open` counts) may raise `build`
        // on `child`, whose workflows `open` counts too; `child`'s own `assemble` is fine.
        let parent = "initial = \"new\"\n[states.new]\n[states.provisioning]\nauto = \"provision\"\n\
                      [states.ready]\n[states.failed]\n[events.create]\nin = [\"new\"]\naction = \"begin\"\n\
                      [actions.begin]\nto = [\"provisioning\"]\n[actions.provision]\nto = [\"ready\", \"failed\"]\n\
                      may_raise = [\"build\"]\n[limits.open]\nevents = [\"create\"]\nmax = 4\n";
        let child = "initial = \"idle\"\n[states.idle]\n[states.building]\nauto = \"assemble\"\n[states.built]\n\
                     [events.build]\nin = [\"idle\"]\naction = \"start\"\n[actions.start]\nto = [\"building\"]\n\
                     [actions.assemble]\nto = [\"built\", \"idle\"]\n[limits.open]\nevents = [\"build\"]\nmax = 4\n";
        let (p, _) = crate::toml::load("parent.toml", "parent", parent).unwrap();
        let (c, _) = crate::toml::load("child.toml", "child", child).unwrap();
        let found = deadlocks(&[&p, &c]);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!((found[0].0.as_str(), found[0].1.as_str()), ("parent", "open"));
        assert!(
            found[0].2.starts_with(
                "can deadlock: action `provision` runs holding a slot of it and may raise `build` on `child`"
            ),
            "{}",
            found[0].2
        );
        let report = crate::validate::check_set(&[&p, &c]).to_string();
        assert!(report.contains("warning: machine `parent`, limit `open`: can deadlock"), "{report}");
        // A limit of its own for the children: nothing to warn about.
        let (own, _) =
            crate::toml::load("child.toml", "child", &child.replace("limits.open", "limits.builds")).unwrap();
        assert!(deadlocks(&[&p, &own]).is_empty());
        // An action limit on the child's state reached by `build` counts as needing it too.
        let by_state = child.replace("events = [\"build\"]", "states = [\"building\"]");
        let (st, _) = crate::toml::load("child.toml", "child", &by_state).unwrap();
        let p2 = parent.replace("events = [\"create\"]", "states = [\"provisioning\"]");
        let (p2, _) = crate::toml::load("parent.toml", "parent", &p2).unwrap();
        assert_eq!(deadlocks(&[&p2, &st]).len(), 1);
    }
}
