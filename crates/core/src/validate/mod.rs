//! Validation of machine definitions: every problem at once, each with the machine, the
//! item and (for TOML) the line, as errors (the definition is refused) or warnings.
//!
//! [`check`] needs only the raw definition ([`crate::machine::MachineDef`]), never the
//! validated model, which is built from a definition it passes; [`check_set`], across
//! validated machines, lives in `set`, the one part of validation above the model.
//! [`Report`] and its [`Diagnostic`]s are in `report`; the warnings, found on the
//! definition's transition graph, in `warnings`.

mod nesting;
mod report;
mod set;
mod warnings;

use std::collections::{HashMap, HashSet};

pub use nesting::REPLY_PARAMS;
pub use report::{Diagnostic, Report, Severity};
pub use set::check_set;

use crate::calendar::Calendar;
use crate::duration;
use crate::machine::def::{
    ActionDef, CalendarDef, EventDef, FaultDef, MachineDef, MigrateDef, Origin, StateDef, StateKind, TimerDef,
    effective_kind,
};
use crate::pattern::Pattern;

/// Checks a definition and returns every error and warning found, never stopping at the
/// first: errors item by item in declaration order (machine, states, events, actions,
/// timers, migrations, fault policy), then warnings.
///
/// Errors: unknown state, action or event references; no initial state or several; an
/// unstable state without exactly one auto action, an auto action on any other kind, a
/// `wait` without an auto action; an action without targets, a transition wait outside
/// the declared targets; an event valid in a terminal or deleted state; a rejection reason
/// for a state where the event is valid; duplicate names and list entries; more than one
/// deleted state; names outside `[A-Za-z0-9_-]`; a `subscribe` pattern that does not
/// parse, lists a state twice or counts trivially ([`Pattern::problems`]); a `timeout`
/// without `subscribe`, or whose event is valid in none of the subscription's states; a
/// timer without exactly one of `every` and `after`, or with `every` zero; an old state
/// name (in a state's `renamed_from` or a `[migrate]` entry) that is still a declared
/// state or is mapped twice, a `[migrate]` entry to an unknown state; a fault policy with
/// `max_errors`, `window` or `backoff.min` zero, or `backoff.min` above `backoff.max`.
///
/// Warnings: states unreachable from the initial state, stable states no event leaves
/// (an event raised by a subscription or a timer leaves a state like any other), busy
/// loops (cycles of unstable states with no wait anywhere on them), and timers that run
/// in no state or raise an event valid in none of their states.
///
/// Patterns name other machines, so they are checked against them separately, by
/// [`check_set`].
///
/// ```
/// use settle_core::MachineBuilder;
/// let builder = MachineBuilder::new("door")
///     .state("closed").initial()
///     .event("open", ["closed"], "do_open")
///     .action("do_open", ["open"]);
/// let report = settle_core::validate::check(builder.def());
/// assert_eq!(
///     report.to_string(),
///     "error: machine `door`, action `do_open`: `to` names unknown state `open`\n"
/// );
/// ```
pub fn check(def: &MachineDef) -> Report {
    let mut c = Checker::new(def);
    c.machine();
    for s in &def.states {
        c.state(s);
    }
    for e in &def.events {
        c.event(e);
    }
    for a in &def.actions {
        c.action(a);
    }
    for t in &def.timers {
        c.timer(t);
    }
    for s in &def.schedules {
        c.schedule(s);
    }
    for l in &def.limits {
        c.limit(l);
    }
    for m in &def.migrate {
        c.migration(m);
    }
    if let Some(f) = &def.fault {
        c.fault(f);
    }
    c.unreachable();
    c.dead_ends();
    c.busy_loops();
    c.idle_timers();
    Report { diagnostics: c.diagnostics }
}
/// A name may appear in diagrams and URLs: letters, digits, `_` and `-` only.
fn name_problem(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        Some("empty name")
    } else if !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') {
        Some("name may only contain letters, digits, `_` and `-`")
    } else {
        None
    }
}

fn quoted<'a>(names: impl IntoIterator<Item = &'a str>) -> String {
    names.into_iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ")
}

/// Entries of `list` that appear more than once, each reported once, in order.
fn duplicates<'a>(list: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
    let mut seen = HashSet::new();
    let mut dups = Vec::new();
    for x in list {
        if !seen.insert(x) && !dups.contains(&x) {
            dups.push(x);
        }
    }
    dups
}

struct Checker<'a> {
    def: &'a MachineDef,
    /// First declaration of each state / action name.
    states: HashMap<&'a str, &'a StateDef>,
    actions: HashMap<&'a str, &'a ActionDef>,
    events: HashMap<&'a str, &'a EventDef>,
    /// Declared initial states that exist, in declaration order (top-level first).
    initials: Vec<&'a str>,
    /// Old state names mapped so far (by `renamed_from` or `[migrate]`), to their new state.
    mapped: HashMap<&'a str, &'a str>,
    diagnostics: Vec<Diagnostic>,
}

impl<'a> Checker<'a> {
    fn new(def: &'a MachineDef) -> Self {
        let mut states = HashMap::new();
        for s in &def.states {
            states.entry(s.name.as_str()).or_insert(s);
        }
        let mut actions = HashMap::new();
        for a in &def.actions {
            actions.entry(a.name.as_str()).or_insert(a);
        }
        let mut events = HashMap::new();
        for e in &def.events {
            events.entry(e.name.as_str()).or_insert(e);
        }
        let mut initials: Vec<&str> = Vec::new();
        let declared = def
            .initial
            .iter()
            .map(String::as_str)
            .chain(def.states.iter().filter(|s| s.initial).map(|s| s.name.as_str()));
        for name in declared {
            if states.contains_key(name) && !initials.contains(&name) {
                initials.push(name);
            }
        }
        Checker { def, states, actions, events, initials, mapped: HashMap::new(), diagnostics: Vec::new() }
    }

    fn push(&mut self, severity: Severity, item: String, line: Option<u32>, message: String) {
        self.diagnostics.push(Diagnostic { severity, file: None, line, machine: self.def.name.clone(), item, message });
    }
    fn error(&mut self, item: &str, line: Option<u32>, message: String) {
        self.push(Severity::Error, item.to_string(), line, message);
    }
    fn warning(&mut self, item: &str, line: Option<u32>, message: String) {
        self.push(Severity::Warning, item.to_string(), line, message);
    }

    /// Starts the checks of one item: its name in diagnostics (e.g. "state `creating`")
    /// and its line, after reporting a problem with the name itself.
    fn item(&mut self, what: &str, name: &str, origin: Origin) -> (String, Option<u32>) {
        let item = format!("{what} `{name}`");
        if let Some(problem) = name_problem(name) {
            self.error(&item, origin.line, problem.into());
        }
        (item, origin.line)
    }

    fn has_state(&self, name: &str) -> bool {
        self.states.contains_key(name)
    }
    fn kind_of(&self, name: &str) -> Option<StateKind> {
        self.states.get(name).map(|s| effective_kind(s))
    }

    fn machine(&mut self) {
        let def = self.def;
        if let Some(problem) = name_problem(&def.name) {
            let message = if def.name.is_empty() { problem.to_string() } else { format!("`{}`: {problem}", def.name) };
            self.error("machine", def.origin.line, message);
        }
        match &def.initial {
            Some(i) if !self.has_state(i) => {
                self.error("machine", def.initial_origin.line, format!("`initial` names unknown state `{i}`"))
            }
            None if self.initials.is_empty() => self.error("machine", def.origin.line, "no initial state".into()),
            _ => {}
        }
        if self.initials.len() > 1 {
            // Point at the first declaration that conflicts with the one before it.
            let second = self.initials[1];
            let line = def.states.iter().find(|s| s.initial && s.name == second).and_then(|s| s.origin.line);
            let list = quoted(self.initials.iter().copied());
            self.error("machine", line, format!("several initial states: {list}"));
        }
        self.duplicate_items("state", def.states.iter().map(|s| (s.name.as_str(), s.origin)));
        self.duplicate_items("event", def.events.iter().map(|e| (e.name.as_str(), e.origin)));
        self.duplicate_items("action", def.actions.iter().map(|a| (a.name.as_str(), a.origin)));
        self.duplicate_items("timer", def.timers.iter().map(|t| (t.name.as_str(), t.origin)));
        self.duplicate_items("schedule", def.schedules.iter().map(|t| (t.name.as_str(), t.origin)));
        self.duplicate_items("limit", def.limits.iter().map(|l| (l.name.as_str(), l.origin)));
        for c in &def.cascade {
            if c != "kill" && c != "delete" {
                self.error(
                    "machine",
                    def.origin.line,
                    format!("`cascade` names `{c}`: only `kill` and `delete` reach successors"),
                );
            }
        }
        for (key, event) in [("cancel", &def.cancel), ("delete", &def.delete)] {
            let Some(event) = event else { continue };
            match def.events.iter().find(|e| e.name == *event) {
                None => self.error("machine", def.origin.line, format!("`{key}` names `{event}`: no such event")),
                Some(e) if !e.params.is_empty() => self.error(
                    "machine",
                    def.origin.line,
                    format!(
                        "`{key}` names `{event}`, which takes parameters ({}): the engine raises it with none",
                        e.params.join(", ")
                    ),
                ),
                Some(_) => {}
            }
        }
        if def.delete.is_some() && !def.states.iter().any(|s| s.kind == Some(StateKind::Deleted)) {
            self.error("machine", def.origin.line, "`delete` is declared but no state is `kind = \"deleted\"`".into());
        }
        if let Some(u) = def.upgrade.as_deref().filter(|u| crate::upgrade::Policy::parse(u).is_none()) {
            self.error("machine", def.origin.line, format!("`upgrade` is `{u}`: `pin` or `migrate`"));
        }
        self.duplicate_entries("machine", def.origin.line, "properties", def.properties.iter().map(String::as_str));
        self.engine_properties("machine", def.origin.line, "properties", def.properties.iter().map(String::as_str));
        let deleted: Vec<&StateDef> = def.states.iter().filter(|s| s.kind == Some(StateKind::Deleted)).collect();
        if deleted.len() > 1 {
            let list = quoted(deleted.iter().map(|s| s.name.as_str()));
            self.error("machine", deleted[1].origin.line, format!("more than one deleted state: {list}"));
        }
    }

    fn duplicate_items(&mut self, what: &str, items: impl Iterator<Item = (&'a str, Origin)>) {
        let mut seen = HashSet::new();
        for (name, origin) in items {
            if !seen.insert(name) {
                self.error(&format!("{what} `{name}`"), origin.line, "declared more than once".into());
            }
        }
    }

    fn duplicate_entries<'b>(
        &mut self,
        item: &str,
        line: Option<u32>,
        key: &str,
        list: impl IntoIterator<Item = &'b str>,
    ) {
        for d in duplicates(list) {
            self.error(item, line, format!("duplicate `{d}` in `{key}`"));
        }
    }

    /// Property names starting with `$` are the engine's (`$history`): no definition names
    /// one.
    fn engine_properties<'b>(
        &mut self,
        item: &str,
        line: Option<u32>,
        key: &str,
        list: impl IntoIterator<Item = &'b str>,
    ) {
        for p in list.into_iter().filter(|p| crate::machine::is_engine_property(p)) {
            self.error(item, line, format!("`{key}` names `{p}`: a property starting with `$` is the engine's"));
        }
    }

    fn state(&mut self, s: &'a StateDef) {
        let (item, line) = self.item("state", &s.name, s.origin);
        for a in &s.auto {
            if !self.actions.contains_key(a.as_str()) {
                self.error(&item, line, format!("`auto` names unknown action `{a}`"));
            }
        }
        let kind = effective_kind(s);
        if kind == StateKind::Unstable && s.auto.len() != 1 {
            self.error(
                &item,
                line,
                format!("unstable state must have exactly one auto action, found {}", s.auto.len()),
            );
        }
        if kind != StateKind::Unstable && !s.auto.is_empty() {
            self.error(&item, line, format!("{} state may not have an auto action", kind.as_str()));
        }
        if s.wait.is_some() && s.auto.is_empty() {
            self.error(&item, line, "`wait` declared without an auto action".into());
        }
        if s.retain.is_some() && !matches!(kind, StateKind::Terminal | StateKind::Deleted) {
            self.error(
                &item,
                line,
                format!(
                    "`retain` applies to terminal and deleted states only (this one is {}: its entities are live)",
                    kind.as_str()
                ),
            );
        }
        for a in &s.auto {
            if self.actions.get(a.as_str()).is_some_and(|action| action.targets.is_empty()) {
                self.error(&item, line, format!("auto action `{a}` has no target (`to`)"));
            }
        }
        self.nesting(s, &item);
        self.duplicate_entries(&item, line, "requires", s.requires.iter().map(String::as_str));
        self.engine_properties(&item, line, "requires", s.requires.iter().map(String::as_str));
        self.duplicate_entries(&item, line, "renamed_from", s.renamed_from.iter().map(String::as_str));
        let mut seen = HashSet::new();
        for old in &s.renamed_from {
            if !seen.insert(old.as_str()) {
                // Reported once, as a duplicate entry.
            } else if self.has_state(old) {
                self.error(&item, line, format!("`renamed_from` names `{old}`, which is still a declared state"));
            } else if let Some(new) = self.map_old_name(old, &s.name) {
                self.error(&item, line, format!("`renamed_from`: old state `{old}` is already mapped to `{new}`"));
            }
        }
    }

    /// Records that stored entities in `old` move to `new`; if `old` was already mapped,
    /// returns the state it was mapped to instead.
    fn map_old_name(&mut self, old: &'a str, new: &'a str) -> Option<&'a str> {
        match self.mapped.get(old) {
            Some(&before) => Some(before),
            None => {
                self.mapped.insert(old, new);
                None
            }
        }
    }

    fn migration(&mut self, m: &'a MigrateDef) {
        let item = format!("migration `{}`", m.from);
        let line = m.origin.line;
        if !self.has_state(&m.to) {
            self.error(&item, line, format!("migrates to unknown state `{}`", m.to));
        }
        if self.has_state(&m.from) {
            self.error(
                &item,
                line,
                format!("`{}` is still a declared state (only states no longer declared can be migrated)", m.from),
            );
        } else if let Some(new) = self.map_old_name(&m.from, &m.to) {
            self.error(&item, line, format!("old state `{}` is already mapped to `{new}`", m.from));
        }
    }

    fn fault(&mut self, f: &FaultDef) {
        let item = "fault policy";
        let line = f.origin.line;
        if f.max_errors == Some(0) {
            self.error(item, line, "`max_errors` is zero (declare at least 1)".into());
        }
        if f.window.is_some_and(|w| w.is_zero()) {
            self.error(item, line, "`window` is zero (errors would never add up to park the entity)".into());
        }
        if f.backoff_min.is_some_and(|m| m.is_zero()) {
            self.error(item, line, "`backoff.min` is zero (a failing action would be retried in a busy loop)".into());
        }
        let p = f.policy();
        if p.backoff_min > p.backoff_max {
            let show = |d, declared: bool| {
                let d = duration::format(d);
                if declared { d } else { format!("{d} by default") }
            };
            let min = show(p.backoff_min, f.backoff_min.is_some());
            let max = show(p.backoff_max, f.backoff_max.is_some());
            self.error(item, line, format!("`backoff.min` ({min}) is greater than `backoff.max` ({max})"));
        }
    }

    fn event(&mut self, e: &'a EventDef) {
        let (item, line) = self.item("event", &e.name, e.origin);
        for st in &e.valid_in {
            match self.kind_of(st) {
                None => self.error(&item, line, format!("`in` names unknown state `{st}`")),
                Some(kind @ (StateKind::Terminal | StateKind::Deleted)) => {
                    self.error(&item, line, format!("valid in {} state `{st}`, which nothing may leave", kind.as_str()))
                }
                Some(_) => {}
            }
        }
        self.duplicate_entries(&item, line, "in", e.valid_in.iter().map(String::as_str));
        if let Some(p) = e.priority.filter(|p| !crate::limits::PRIORITIES.contains(p)) {
            let (lo, hi) = (crate::limits::PRIORITIES.start(), crate::limits::PRIORITIES.end());
            self.error(&item, line, format!("`priority` = {p}: a priority lies from {lo} to {hi}"));
        }
        self.alternatives(e, &item);
        self.duplicate_entries(&item, line, "params", e.params.iter().map(String::as_str));
        for (st, _) in &e.reject {
            if !self.has_state(st) {
                self.error(&item, line, format!("`reject` names unknown state `{st}`"));
            } else if let Some(level) = self.path(st).into_iter().find(|s| e.valid_in.iter().any(|v| v == s)) {
                let where_ = if level == st.as_str() { String::new() } else { format!(" (in `{level}`)") };
                self.error(&item, line, format!("rejection reason for `{st}`, where the event is valid{where_}"));
            }
        }
        self.duplicate_entries(&item, line, "reject", e.reject.iter().map(|(s, _)| s.as_str()));
        match &e.subscribe {
            Some(text) => match Pattern::parse(text) {
                Ok(pattern) => {
                    for problem in pattern.problems() {
                        self.error(&item, line, format!("`subscribe`: {problem}"));
                    }
                }
                Err(message) => self.error(&item, line, format!("`subscribe`: {message}")),
            },
            None if e.timeout.is_some() => self.error(&item, line, "`timeout` declared without `subscribe`".into()),
            None => {}
        }
        if let Some((_, name)) = &e.timeout {
            match self.events.get(name.as_str()) {
                None => self.error(&item, line, format!("`timeout` names unknown event `{name}`")),
                Some(t)
                    if e.subscribe.is_some()
                        && !e.valid_in.is_empty()
                        && !e.valid_in.iter().any(|s| t.valid_in.contains(s)) =>
                {
                    let states = quoted(e.valid_in.iter().map(String::as_str));
                    self.error(
                        &item,
                        line,
                        format!("timeout event `{name}` is not valid in any state of the subscription ({states})"),
                    );
                }
                Some(_) => {}
            }
        }
    }

    fn action(&mut self, a: &'a ActionDef) {
        let (item, line) = self.item("action", &a.name, a.origin);
        if a.targets.is_empty() && !self.runs_somewhere(&a.name) {
            // Used as an event's or auto action, it is reported there.
            self.error(&item, line, "no target states (`to` is empty)".into());
        }
        for t in &a.targets {
            if !self.has_state(t) {
                self.error(&item, line, format!("`to` names unknown state `{t}`"));
            }
        }
        self.duplicate_entries(&item, line, "to", a.targets.iter().map(String::as_str));
        for (t, _) in &a.target_waits {
            if a.targets.contains(t) {
                // An unknown target is reported once, by `to`.
            } else if !self.has_state(t) {
                self.error(&item, line, format!("`wait` names unknown state `{t}`"));
            } else {
                self.error(&item, line, format!("wait declared for `{t}`, a target outside the declared set"));
            }
        }
        self.duplicate_entries(&item, line, "wait", a.target_waits.iter().map(|(s, _)| s.as_str()));
        self.agent_binding(a, &item);
        self.declarative(a, &item);
    }

    /// Whether any state or event runs the action (as auto, entry or exit action, or as
    /// an event's action).
    fn runs_somewhere(&self, action: &str) -> bool {
        let by_state = self.def.states.iter().any(|s| {
            s.auto
                .iter()
                .chain(&s.on_entry)
                .chain(&s.on_exit)
                .chain(s.on_entry_from.iter().flat_map(|(_, a)| a))
                .any(|a| a == action)
        });
        by_state
            || self
                .def
                .events
                .iter()
                .any(|e| e.action == action || e.when.iter().any(|w| w.action.as_deref() == Some(action)))
    }

    /// An agent-bound action runs as a state's auto action (the task is offered when the
    /// state is entered), never as an event's action; `lock` needs `agent` and must be > 0.
    fn agent_binding(&mut self, a: &'a ActionDef, item: &str) {
        let line = a.origin.line;
        match &a.agent {
            None => {
                if a.lock.is_some() {
                    self.error(item, line, "`lock` without `agent` (it is the agent's lease on a task)".into());
                }
            }
            Some(queue) => {
                if let Some(problem) = name_problem(queue) {
                    self.error(item, line, format!("agent queue `{queue}`: {problem}"));
                }
                if a.lock.is_some_and(|l| l.is_zero()) {
                    self.error(item, line, "`lock` must be longer than zero".into());
                }
                let runs =
                    |e: &EventDef| e.action == a.name || e.when.iter().any(|w| w.action.as_ref() == Some(&a.name));
                let events: Vec<&str> = self.def.events.iter().filter(|e| runs(e)).map(|e| e.name.as_str()).collect();
                if !events.is_empty() {
                    let events = events.iter().map(|e| format!("`{e}`")).collect::<Vec<_>>().join(", ");
                    self.error(
                        item,
                        line,
                        format!(
                            "an agent action runs as a state's auto action, but event {events} triggers it \
                             (make the event move to a state whose `auto` is this action)"
                        ),
                    );
                }
                if !self.def.states.iter().any(|s| s.auto.contains(&a.name)) {
                    self.warning(item, line, format!("bound to agent queue `{queue}` but no state runs it as `auto`"));
                }
            }
        }
    }

    fn timer(&mut self, t: &'a TimerDef) {
        let (item, line) = self.item("timer", &t.name, t.origin);
        if !self.events.contains_key(t.event.as_str()) {
            self.error(&item, line, format!("`event` names unknown event `{}`", t.event));
        }
        match (t.every, t.after) {
            (None, None) => self.error(&item, line, "no schedule: declare `every` or `after`".into()),
            (Some(_), Some(_)) => self.error(
                &item,
                line,
                "both `every` and `after` declared (a timer is either periodic or one-shot)".into(),
            ),
            (Some(every), None) if every.is_zero() => {
                self.error(&item, line, "`every` is zero (a timer firing continuously is a busy loop)".into())
            }
            _ => {}
        }
        for st in &t.valid_in {
            if !self.has_state(st) {
                self.error(&item, line, format!("`in` names unknown state `{st}`"));
            }
        }
        self.duplicate_entries(&item, line, "in", t.valid_in.iter().map(String::as_str));
    }

    /// A flow-control limit ([`crate::limits::check`]). A state may be named by several
    /// limits (a concurrency per region and a rate per account): its auto action takes a
    /// slot of each.
    fn limit(&mut self, l: &'a crate::limits::LimitDef) {
        let (item, line) = self.item("limit", &l.name, l.origin);
        let properties = self.mentioned_properties();
        for problem in crate::limits::check(l, self.def, &properties) {
            self.error(&item, line, problem);
        }
        self.duplicate_entries(&item, line, "states", l.states.iter().map(String::as_str));
        self.duplicate_entries(&item, line, "events", l.events.iter().map(String::as_str));
    }

    /// A calendar schedule: its own keys (`Calendar::from_def`), then the machine's names
    /// it uses. A raised event gets no parameters, so it may declare none.
    fn schedule(&mut self, c: &'a CalendarDef) {
        let (item, line) = self.item("schedule", &c.name, c.origin);
        if let Err(problems) = Calendar::from_def(c) {
            for p in problems {
                self.error(&item, line, p);
            }
        }
        if let Some(event) = &c.raise {
            match self.events.get(event.as_str()) {
                None => self.error(&item, line, format!("`raise` names unknown event `{event}`")),
                Some(e) if !e.params.is_empty() => self.error(
                    &item,
                    line,
                    format!(
                        "`raise` names event `{event}`, which requires parameters (a schedule raises it with none)"
                    ),
                ),
                Some(_) => {}
            }
        }
        for st in &c.valid_in {
            if !self.has_state(st) {
                self.error(&item, line, format!("`in` names unknown state `{st}`"));
            }
        }
        self.duplicate_entries(&item, line, "in", c.valid_in.iter().map(String::as_str));
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::fault::FaultPolicy;
    use crate::fixtures::{base, messages};
    use crate::machine::{MachineBuilder, Schedule};

    #[test]
    fn base_is_clean() {
        assert_eq!(messages(base().def()), Vec::<String>::new());
    }

    #[test]
    fn unknown_state_references() {
        let mut def = base()
            .event("stop", ["busy", "nowhere"], "start")
            .reject("limbo", "no")
            .action("jump", ["idle", "void"])
            .target_wait("abyss", Duration::from_secs(1))
            .target_wait("void", Duration::from_secs(1))
            .def()
            .clone();
        def.initial = Some("start".into());
        def.initial_origin.line = Some(2);
        def.states[0].initial = false;
        assert_eq!(
            messages(&def),
            [
                "line 2: error: machine `m`, machine: `initial` names unknown state `start`",
                "error: machine `m`, event `stop`: `in` names unknown state `nowhere`",
                "error: machine `m`, event `stop`: `reject` names unknown state `limbo`",
                "error: machine `m`, action `jump`: `to` names unknown state `void`",
                "error: machine `m`, action `jump`: `wait` names unknown state `abyss`",
            ]
        );
    }

    #[test]
    fn unknown_action_references() {
        let def = base().state("spin").auto("twirl").event("poke", ["idle"], "prod").def().clone();
        assert_eq!(
            messages(&def),
            [
                "error: machine `m`, state `spin`: `auto` names unknown action `twirl`",
                "error: machine `m`, event `poke`: `action` names unknown action `prod`",
                "warning: machine `m`, state `spin`: unreachable from the initial state `idle`",
            ]
        );
    }

    #[test]
    fn no_initial_state() {
        let mut def = base().def().clone();
        def.states[0].initial = false;
        def.origin.line = Some(1);
        assert_eq!(messages(&def), ["line 1: error: machine `m`, machine: no initial state"]);
    }

    #[test]
    fn several_initial_states() {
        let mut def = base().state("other").initial().event("go2", ["other"], "start").def().clone();
        def.initial = Some("busy".into());
        def.states[0].origin.line = Some(9);
        assert_eq!(
            messages(&def),
            ["line 9: error: machine `m`, machine: several initial states: `busy`, `idle`, `other`"]
        );
        // The same state declared initial twice is one initial state.
        let mut def = base().def().clone();
        def.initial = Some("idle".into());
        assert_eq!(messages(&def), Vec::<String>::new());
    }

    #[test]
    fn unstable_state_needs_exactly_one_auto_action() {
        let def = base()
            .state("lazy")
            .kind(StateKind::Unstable)
            .state("eager")
            .auto("work")
            .auto("start")
            .event("wake", ["idle"], "rouse")
            .action("rouse", ["lazy", "eager"])
            .def()
            .clone();
        assert_eq!(
            messages(&def),
            [
                "error: machine `m`, state `lazy`: unstable state must have exactly one auto action, found 0",
                "error: machine `m`, state `eager`: unstable state must have exactly one auto action, found 2",
            ]
        );
    }

    #[test]
    fn auto_action_only_on_unstable_states() {
        let def = base()
            .state("parked")
            .kind(StateKind::Stable)
            .auto("work")
            .state("archived")
            .kind(StateKind::Terminal)
            .auto("work")
            .state("gone")
            .kind(StateKind::Deleted)
            .auto("work")
            .event("park", ["idle", "parked"], "put")
            .action("put", ["parked", "archived", "gone"])
            .def()
            .clone();
        assert_eq!(
            messages(&def),
            [
                "error: machine `m`, state `parked`: stable state may not have an auto action",
                "error: machine `m`, state `archived`: terminal state may not have an auto action",
                "error: machine `m`, state `gone`: deleted state may not have an auto action",
            ]
        );
    }

    #[test]
    fn wait_needs_an_auto_action() {
        let mut def = base().state("calm").wait(Duration::from_secs(1)).def().clone();
        def.events[0].valid_in.push("calm".into());
        def.actions[1].targets.push("calm".into());
        assert_eq!(messages(&def), ["error: machine `m`, state `calm`: `wait` declared without an auto action"]);
    }

    #[test]
    fn action_needs_targets() {
        let def = base().action("nothing", Vec::<String>::new()).def().clone();
        assert_eq!(messages(&def), ["error: machine `m`, action `nothing`: no target states (`to` is empty)"]);
    }

    #[test]
    fn agent_actions_run_as_auto_actions_only() {
        let ok = base().agent("workers", Duration::from_secs(30)).def().clone();
        assert!(messages(&ok).is_empty(), "{:?}", messages(&ok));
        let on_event = base().agent("workers", Duration::from_secs(30)).event("again", ["idle"], "work").def().clone();
        assert_eq!(
            messages(&on_event),
            [
                "error: machine `m`, action `work`: an agent action runs as a state's auto action, but event `again` triggers it (make the event move to a state whose `auto` is this action)"
            ]
        );
        let mut bad = base().agent("no queue", Duration::ZERO).def().clone();
        bad.actions[0].lock = Some(Duration::from_secs(1));
        assert_eq!(
            messages(&bad),
            [
                "error: machine `m`, action `start`: `lock` without `agent` (it is the agent's lease on a task)",
                "error: machine `m`, action `work`: agent queue `no queue`: name may only contain letters, digits, `_` and `-`",
                "error: machine `m`, action `work`: `lock` must be longer than zero",
            ]
        );
    }

    #[test]
    fn transition_wait_only_on_declared_targets() {
        let def = base().action("hop", ["busy"]).target_wait("idle", Duration::from_secs(1)).def().clone();
        assert_eq!(
            messages(&def),
            ["error: machine `m`, action `hop`: wait declared for `idle`, a target outside the declared set"]
        );
    }

    #[test]
    fn nothing_leaves_terminal_or_deleted_states() {
        let def = base()
            .state("archived")
            .kind(StateKind::Terminal)
            .state("gone")
            .kind(StateKind::Deleted)
            .event("bury", ["idle"], "inter")
            .event("revive", ["archived", "gone"], "start")
            .action("inter", ["archived", "gone"])
            .def()
            .clone();
        assert_eq!(
            messages(&def),
            [
                "error: machine `m`, event `revive`: valid in terminal state `archived`, which nothing may leave",
                "error: machine `m`, event `revive`: valid in deleted state `gone`, which nothing may leave",
            ]
        );
    }

    #[test]
    fn rejection_reason_only_where_the_event_is_invalid() {
        let def = base().event("go2", ["idle"], "start").reject("idle", "not now").reject("busy", "busy").def().clone();
        assert_eq!(
            messages(&def),
            ["error: machine `m`, event `go2`: rejection reason for `idle`, where the event is valid"]
        );
    }

    #[test]
    fn duplicate_names() {
        let def =
            base().state("busy").auto("work").event("go", ["idle"], "start").action("work", ["idle"]).def().clone();
        assert_eq!(
            messages(&def),
            [
                "error: machine `m`, state `busy`: declared more than once",
                "error: machine `m`, event `go`: declared more than once",
                "error: machine `m`, action `work`: declared more than once",
            ]
        );
    }

    #[test]
    fn duplicate_list_entries() {
        let def = MachineBuilder::new("m")
            .state("idle")
            .initial()
            .requires(["a", "b", "a", "a"])
            .state("busy")
            .auto("work")
            .event("go", ["idle", "idle"], "start")
            .params(["p", "p"])
            .reject("busy", "x")
            .reject("busy", "y")
            .action("start", ["busy", "busy"])
            .target_wait("busy", Duration::from_secs(1))
            .target_wait("busy", Duration::from_secs(2))
            .action("work", ["idle"])
            .def()
            .clone();
        assert_eq!(
            messages(&def),
            [
                "error: machine `m`, state `idle`: duplicate `a` in `requires`",
                "error: machine `m`, event `go`: duplicate `idle` in `in`",
                "error: machine `m`, event `go`: duplicate `p` in `params`",
                "error: machine `m`, event `go`: duplicate `busy` in `reject`",
                "error: machine `m`, action `start`: duplicate `busy` in `to`",
                "error: machine `m`, action `start`: duplicate `busy` in `wait`",
            ]
        );
    }

    #[test]
    fn at_most_one_deleted_state() {
        let mut def = base()
            .state("gone")
            .kind(StateKind::Deleted)
            .state("vanished")
            .kind(StateKind::Deleted)
            .event("drop", ["idle"], "erase")
            .action("erase", ["gone", "vanished"])
            .def()
            .clone();
        def.states[3].origin.line = Some(12);
        assert_eq!(
            messages(&def),
            ["line 12: error: machine `m`, machine: more than one deleted state: `gone`, `vanished`"]
        );
    }

    #[test]
    fn names_fit_diagrams_and_urls() {
        let mut def = base()
            .state("")
            .state("a b")
            .event("dr/op", ["idle"], "é")
            .action("é", ["", "a b"])
            .event("go-on", ["a b", ""], "start")
            .def()
            .clone();
        def.name = "my machine".into();
        assert_eq!(
            messages(&def),
            [
                "error: machine `my machine`, machine: `my machine`: name may only contain letters, digits, `_` and `-`",
                "error: machine `my machine`, state ``: empty name",
                "error: machine `my machine`, state `a b`: name may only contain letters, digits, `_` and `-`",
                "error: machine `my machine`, event `dr/op`: name may only contain letters, digits, `_` and `-`",
                "error: machine `my machine`, action `é`: name may only contain letters, digits, `_` and `-`",
            ]
        );
        def.name = String::new();
        assert_eq!(messages(&def)[0], "error: machine ``, machine: empty name");
    }

    #[test]
    fn reports_every_problem_at_once() {
        let mut def = base()
            .state("gone")
            .kind(StateKind::Deleted)
            .state("limbo")
            .kind(StateKind::Unstable)
            .state("stuck")
            .event("go", ["nowhere"], "missing")
            .action("empty", Vec::<String>::new())
            .def()
            .clone();
        def.states[0].initial = false;
        assert_eq!(
            messages(&def),
            [
                "error: machine `m`, machine: no initial state",
                "error: machine `m`, event `go`: declared more than once",
                "error: machine `m`, state `limbo`: unstable state must have exactly one auto action, found 0",
                "error: machine `m`, event `go`: `in` names unknown state `nowhere`",
                "error: machine `m`, event `go`: `action` names unknown action `missing`",
                "error: machine `m`, action `empty`: no target states (`to` is empty)",
                "warning: machine `m`, state `stuck`: no event leaves this stable state (declare `kind = \"terminal\"` if that is intended)",
            ]
        );
    }

    #[test]
    fn subscription_patterns_are_checked_on_the_events_line() {
        let mut def = base()
            .event("all_ready", ["idle"], "start")
            .subscribe("all(*) in ready")
            .event("twice", ["idle"], "start")
            .subscribe("any(app) in [ready, failed, ready]")
            .event("never", ["idle"], "start")
            .subscribe("count(* health error) < 0")
            .event("always", ["idle"], "start")
            .subscribe("count(db in [ready]) >= 0")
            .event("fine", ["idle"], "start")
            .subscribe("count(db in [ready]) >= 2")
            .def()
            .clone();
        def.events[1].origin.line = Some(20);
        assert_eq!(
            messages(&def),
            [
                "line 20: error: machine `m`, event `all_ready`: `subscribe`: expected `[` after `in` at column 11",
                "error: machine `m`, event `twice`: `subscribe`: duplicate state `ready` in `in [...]`",
                "error: machine `m`, event `never`: `subscribe`: `count(...) < 0` can never hold",
                "error: machine `m`, event `always`: `subscribe`: `count(...) >= 0` always holds",
            ]
        );
        // Machines and their states are checked against the set, not here.
        let def = base().event("ok", ["idle"], "start").subscribe("all(nobody) in [nothing]").def().clone();
        assert_eq!(messages(&def), Vec::<String>::new());
    }

    #[test]
    fn subscription_timeouts_are_checked() {
        let def = base()
            .state("waiting")
            .event("wait", ["idle"], "park")
            .event("done", ["waiting"], "start")
            .subscribe("all(*) in [ready]")
            .timeout(Duration::from_secs(600), "late")
            .event("lost", ["waiting"], "start")
            .timeout(Duration::from_secs(600), "done")
            .event("elsewhere", ["waiting"], "start")
            .subscribe("any(*) health error")
            .timeout(Duration::from_secs(60), "go")
            .event("fine", ["waiting"], "start")
            .subscribe("none(*) health error")
            .timeout(Duration::from_secs(60), "lost")
            .action("park", ["waiting"])
            .def()
            .clone();
        assert_eq!(
            messages(&def),
            [
                "error: machine `m`, event `done`: `timeout` names unknown event `late`",
                "error: machine `m`, event `lost`: `timeout` declared without `subscribe`",
                "error: machine `m`, event `elsewhere`: timeout event `go` is not valid in any state of the subscription (`waiting`)",
            ]
        );
    }

    #[test]
    fn timers_are_checked() {
        let mut def = base()
            .event("tick", ["busy"], "start")
            .timer("poll", "tock", Schedule::Every(Duration::from_secs(60)), ["busy", "nowhere", "busy"])
            .timer("spin", "tick", Schedule::Every(Duration::ZERO), ["busy"])
            .timer("once", "tick", Schedule::After(Duration::ZERO), ["busy"])
            .timer("bad name", "tick", Schedule::After(Duration::from_secs(1)), ["busy"])
            .timer("once", "tick", Schedule::After(Duration::from_secs(1)), ["busy"])
            .def()
            .clone();
        def.timers.push(TimerDef {
            name: "vague".into(),
            event: "tick".into(),
            valid_in: vec!["busy".into()],
            origin: Origin { line: Some(30) },
            ..TimerDef::default()
        });
        def.timers.push(TimerDef {
            name: "torn".into(),
            event: "tick".into(),
            every: Some(Duration::from_secs(1)),
            after: Some(Duration::from_secs(1)),
            valid_in: vec!["busy".into()],
            origin: Origin { line: Some(35) },
        });
        assert_eq!(
            messages(&def),
            [
                "error: machine `m`, timer `once`: declared more than once",
                "error: machine `m`, timer `poll`: `event` names unknown event `tock`",
                "error: machine `m`, timer `poll`: `in` names unknown state `nowhere`",
                "error: machine `m`, timer `poll`: duplicate `busy` in `in`",
                "error: machine `m`, timer `spin`: `every` is zero (a timer firing continuously is a busy loop)",
                "error: machine `m`, timer `bad name`: name may only contain letters, digits, `_` and `-`",
                "line 30: error: machine `m`, timer `vague`: no schedule: declare `every` or `after`",
                "line 35: error: machine `m`, timer `torn`: both `every` and `after` declared (a timer is either periodic or one-shot)",
            ]
        );
    }

    #[test]
    fn fault_policies_are_checked() {
        let policy = |p: FaultPolicy| messages(base().fault_policy(p).def());
        assert_eq!(policy(FaultPolicy::DEFAULT), Vec::<String>::new());
        assert_eq!(
            policy(FaultPolicy { max_errors: 1, backoff_min: Duration::from_secs(600), ..FaultPolicy::DEFAULT }),
            Vec::<String>::new()
        );
        assert_eq!(
            policy(FaultPolicy {
                max_errors: 0,
                window: Duration::ZERO,
                backoff_min: Duration::ZERO,
                backoff_max: Duration::ZERO,
            }),
            [
                "error: machine `m`, fault policy: `max_errors` is zero (declare at least 1)",
                "error: machine `m`, fault policy: `window` is zero (errors would never add up to park the entity)",
                "error: machine `m`, fault policy: `backoff.min` is zero (a failing action would be retried in a busy loop)",
            ]
        );
        assert_eq!(
            policy(FaultPolicy {
                backoff_min: Duration::from_secs(90),
                backoff_max: Duration::from_secs(60),
                ..FaultPolicy::DEFAULT
            }),
            ["error: machine `m`, fault policy: `backoff.min` (1m30s) is greater than `backoff.max` (1m)"]
        );
        let mut def = base().def().clone();
        def.fault = Some(FaultDef {
            backoff_max: Some(Duration::from_millis(10)),
            origin: Origin { line: Some(9) },
            ..FaultDef::default()
        });
        assert_eq!(
            messages(&def),
            [
                "line 9: error: machine `m`, fault policy: `backoff.min` (1s by default) is greater than `backoff.max` (10ms)"
            ]
        );
    }

    #[test]
    fn renames_and_migrations_are_checked() {
        let def = base()
            .state("done")
            .kind(StateKind::Terminal)
            .renamed_from(["finished", "idle", "finished", "over"])
            .state("stopped")
            .kind(StateKind::Terminal)
            .renamed_from(["over", "halted"])
            .action("finish", ["done", "stopped"])
            .migrate("busy", "done")
            .migrate("halted", "done")
            .migrate("paused", "limbo")
            .migrate("paused", "idle")
            .migrate("crashed", "idle")
            .def()
            .clone();
        assert_eq!(
            messages(&def),
            [
                "error: machine `m`, state `done`: duplicate `finished` in `renamed_from`",
                "error: machine `m`, state `done`: `renamed_from` names `idle`, which is still a declared state",
                "error: machine `m`, state `stopped`: `renamed_from`: old state `over` is already mapped to `done`",
                "error: machine `m`, migration `busy`: `busy` is still a declared state (only states no longer declared can be migrated)",
                "error: machine `m`, migration `halted`: old state `halted` is already mapped to `stopped`",
                "error: machine `m`, migration `paused`: migrates to unknown state `limbo`",
                "error: machine `m`, migration `paused`: old state `paused` is already mapped to `limbo`",
                "warning: machine `m`, state `done`: unreachable from the initial state `idle`",
                "warning: machine `m`, state `stopped`: unreachable from the initial state `idle`",
            ]
        );
        // Mapping to a state of any kind is fine, and an old name may be mapped once either way.
        let ok = MachineBuilder::new("m")
            .state("idle")
            .initial()
            .migrate("waiting", "idle")
            .state("busy")
            .auto("work")
            .renamed_from(["working"])
            .event("go", ["idle"], "start")
            .action("start", ["busy"])
            .action("work", ["idle", "busy"])
            .migrate("gone", "busy")
            .build()
            .unwrap();
        let mapping: Vec<String> = ok.state_mapping().iter().map(|(old, new)| format!("{old} -> {new}")).collect();
        assert_eq!(mapping, ["gone -> busy", "waiting -> idle", "working -> busy"]);
    }

    #[test]
    fn only_kill_and_delete_cascade_and_it_is_part_of_the_version() {
        let base = || MachineBuilder::new("m").state("idle").initial().kind(StateKind::Terminal);
        let report = base().cascade(["kill", "pause"]).build().unwrap_err();
        assert!(report.to_string().contains(
            "error: machine `m`, machine: `cascade` names `pause`: only `kill` and `delete` reach successors\n"
        ));
        let m = base().cascade(["kill"]).build().unwrap();
        assert!(m.cascades("kill") && !m.cascades("pause"));
        assert_ne!(m.content_hash(), base().build().unwrap().content_hash());
        let back = crate::toml::load("m.toml", "m", &m.to_toml()).unwrap().0;
        assert_eq!(back, m);
        assert_eq!(crate::Machine::from_canonical_json(&m.canonical_json()).unwrap(), m);
    }

    #[test]
    fn the_cancel_and_delete_events_are_declared_events_without_parameters() {
        let base = || {
            MachineBuilder::new("m")
                .state("idle")
                .initial()
                .state("gone")
                .kind(StateKind::Deleted)
                .event("abort", ["idle"], "drop")
                .event("resize", ["idle"], "drop")
                .params(["size"])
                .action("drop", ["gone"])
        };
        let report = base().cancel_event("undo").delete_event("resize").build().unwrap_err().to_string();
        assert!(report.contains("machine: `cancel` names `undo`: no such event\n"), "{report}");
        assert!(
            report.contains(
                "machine: `delete` names `resize`, which takes parameters (size): the engine raises it with none"
            ),
            "{report}"
        );
        let report = MachineBuilder::new("m")
            .state("idle")
            .initial()
            .event("abort", ["idle"], "stay")
            .action("stay", ["idle"])
            .delete_event("abort")
            .build()
            .unwrap_err()
            .to_string();
        assert!(report.contains("`delete` is declared but no state is `kind = \"deleted\"`"), "{report}");
        let m = base().cancel_event("abort").delete_event("abort").cascade(["kill", "delete"]).build().unwrap();
        assert_eq!(m.cancel_event().map(|e| e.as_str()), Some("abort"));
        assert_eq!(m.delete_event().map(|e| e.as_str()), Some("abort"));
        assert!(m.cascades("delete"));
        assert_eq!(m.states_where("abort"), vec![crate::StateName::new("idle")]);
        assert_ne!(m.content_hash(), base().build().unwrap().content_hash());
        let back = crate::toml::load("m.toml", "m", &m.to_toml()).unwrap().0;
        assert_eq!(back, m);
        assert_eq!(crate::Machine::from_canonical_json(&m.canonical_json()).unwrap(), m);
    }
}
