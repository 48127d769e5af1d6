//! The checks of [`check`](super::check) about statecharts (DESIGN §1, "Composite
//! states"): substates and their parents, entry and exit actions, events declared at
//! several levels, `ignore`, internal transitions, guarded alternatives and their guards,
//! and declarative actions. Also the state tree of the raw definition that the other
//! checks and the warnings walk (`path`, `descend`).

use std::collections::HashSet;

use super::{Checker, quoted};
use crate::guard::{Guard, Names};
use crate::machine::def::{ActionDef, EventDef, StateDef, StateKind, effective_kind};

impl<'a> Checker<'a> {
    /// `name` and its ancestors, innermost first, stopping at an unknown parent or a cycle.
    pub(super) fn path(&self, name: &'a str) -> Vec<&'a str> {
        let mut out = vec![name];
        let mut at = name;
        while let Some(parent) = self.states.get(at).and_then(|s| s.parent.as_deref()) {
            if out.contains(&parent) || !self.states.contains_key(parent) {
                break;
            }
            out.push(parent);
            at = parent;
        }
        out
    }

    /// Whether some state names `name` as its parent.
    pub(super) fn is_parent(&self, name: &str) -> bool {
        self.def.states.iter().any(|s| s.parent.as_deref() == Some(name))
    }

    /// The leaf entered when `name` is: following initial children while they are known
    /// and lead somewhere new.
    pub(super) fn descend(&self, name: &'a str) -> &'a str {
        let mut at = name;
        let mut seen = HashSet::new();
        while let Some(child) = self.states.get(at).and_then(|s| s.initial_child.as_deref()) {
            if !self.states.contains_key(child) || !seen.insert(at) {
                break;
            }
            at = child;
        }
        at
    }

    /// A substate's parent, a parent's initial child and what a parent may not declare;
    /// entry and exit actions.
    pub(super) fn nesting(&mut self, s: &'a StateDef, item: &str) {
        let line = s.origin.line;
        if let Some(parent) = &s.parent {
            if !self.has_state(parent) {
                self.error(item, line, format!("`parent` names unknown state `{parent}`"));
            } else if self.cycle_through(&s.name) {
                let mut cycle = vec![s.name.as_str()];
                let mut at = s.name.as_str();
                while let Some(p) = self.states.get(at).and_then(|x| x.parent.as_deref()) {
                    cycle.push(p);
                    if p == s.name {
                        break;
                    }
                    at = p;
                }
                self.error(item, line, format!("parent cycle: {}", cycle.join(" → ")));
            }
            let kind = effective_kind(s);
            if matches!(kind, StateKind::Terminal | StateKind::Deleted) {
                self.error(
                    item,
                    line,
                    format!(
                        "a {} state may not be a substate (nothing may leave it, not even its parent's events)",
                        kind.as_str()
                    ),
                );
            }
        }
        let children: Vec<&str> =
            self.def.states.iter().filter(|c| c.parent.as_deref() == Some(&s.name)).map(|c| c.name.as_str()).collect();
        match (&s.initial_child, children.is_empty()) {
            (None, false) => self.error(
                item,
                line,
                format!(
                    "a parent state needs `initial = \"CHILD\"`, the substate entered with it (substates: {})",
                    quoted(children.iter().copied())
                ),
            ),
            (Some(child), true) => self.error(
                item,
                line,
                format!("`initial = \"{child}\"` names a child, but no state declares `parent = \"{}\"`", s.name),
            ),
            (Some(child), false) if !children.contains(&child.as_str()) => self.error(
                item,
                line,
                format!(
                    "`initial` names `{child}`, which is not a substate of `{}` (substates: {})",
                    s.name,
                    quoted(children.iter().copied())
                ),
            ),
            _ => {}
        }
        if let Some(h) = s.history.filter(|_| children.is_empty()) {
            let why = format!("`history = \"{}\"` on a state without substates: it has nothing to resume", h.as_str());
            self.error(item, line, why);
        }
        if !children.is_empty() {
            let what = if !s.auto.is_empty() {
                Some("an auto action")
            } else if s.wait.is_some() {
                Some("a `wait`")
            } else if s.kind.is_some() {
                Some("a `kind`")
            } else {
                None
            };
            if let Some(what) = what {
                self.error(item, line, format!("a parent state is never occupied by itself: it may not have {what}"));
            }
        }
        let hooks = s
            .on_entry
            .iter()
            .map(|a| ("on_entry", a))
            .chain(s.on_exit.iter().map(|a| ("on_exit", a)))
            .chain(s.on_entry_from.iter().flat_map(|(_, actions)| actions.iter().map(|a| ("on_entry_from", a))));
        let hooks: Vec<(&str, &String)> = hooks.collect();
        for (key, a) in hooks {
            match self.actions.get(a.as_str()) {
                None => self.error(item, line, format!("`{key}` names unknown action `{a}`")),
                Some(action) if !action.targets.is_empty() => self.error(
                    item,
                    line,
                    format!(
                        "`{key}` action `{a}` declares targets (`to`): entry and exit actions never choose a state"
                    ),
                ),
                Some(action) if action.agent.is_some() => self.error(
                    item,
                    line,
                    format!(
                        "`{key}` action `{a}` is executed by an agent: an entry or exit action's effects join the \
                         transition's commit, so it cannot wait for one (bind the state's `auto` action instead)"
                    ),
                ),
                Some(_) => {}
            }
        }
        for (event, _) in &s.on_entry_from {
            if !self.events.contains_key(event.as_str()) {
                self.error(item, line, format!("`on_entry_from` names unknown event `{event}`"));
            }
        }
        self.duplicate_entries(item, line, "on_entry_from", s.on_entry_from.iter().map(|(e, _)| e.as_str()));
    }

    /// Whether following `name`'s parents comes back to it.
    fn cycle_through(&self, name: &str) -> bool {
        let mut at = name;
        let mut seen = HashSet::new();
        while let Some(p) = self.states.get(at).and_then(|s| s.parent.as_deref()) {
            if p == name {
                return true;
            }
            if !seen.insert(p) {
                return false;
            }
            at = p;
        }
        false
    }

    /// An event's action or alternatives, their guards, `ignore`, `internal`, and the
    /// levels it is declared at.
    pub(super) fn alternatives(&mut self, e: &'a EventDef, item: &str) {
        let line = e.origin.line;
        match (e.action.is_empty(), e.when.is_empty()) {
            (true, true) => self.error(
                item,
                line,
                format!("no action: declare `action`, or alternatives in `[[events.{}.when]]`", e.name),
            ),
            (false, false) => self.error(item, line, "declare either `action` or `when` alternatives, not both".into()),
            (false, true) => self.event_action(e, &e.action, item, line),
            (true, false) => {}
        }
        let properties = self.mentioned_properties();
        let states: Vec<String> = self.def.states.iter().map(|s| s.name.clone()).collect();
        for w in &e.when {
            let wline = w.origin.line.or(line);
            match (&w.action, &w.reject, w.ignore) {
                (Some(a), None, false) => self.event_action(e, a, item, wline),
                (None, Some(_), false) | (None, None, true) => {}
                (None, None, false) => {
                    self.error(item, wline, "a `when` alternative needs `action`, `reject` or `ignore = true`".into())
                }
                _ => self.error(
                    item,
                    wline,
                    "a `when` alternative has one of `action`, `reject` and `ignore = true`".into(),
                ),
            }
            for st in &w.valid_in {
                if !e.valid_in.contains(st) {
                    self.error(
                        item,
                        wline,
                        format!("`when` lists `{st}`, a state the event is not valid in (add it to `in`)"),
                    );
                }
            }
            if let Some(text) = &w.guard {
                match Guard::parse(text) {
                    Ok(guard) => {
                        let names = Names { params: &e.params, properties: &properties, states: &states };
                        for problem in guard.check(names) {
                            self.error(item, wline, format!("guard `{text}`: {problem}"));
                        }
                    }
                    Err(message) => self.error(item, wline, format!("guard `{text}`: {message}")),
                }
            }
        }
        for st in &e.ignore {
            if !self.has_state(st) {
                self.error(item, line, format!("`ignore` names unknown state `{st}`"));
            } else if e.valid_in.contains(st) {
                self.error(item, line, format!("`{st}` is both in `in` and in `ignore`"));
            }
        }
        self.duplicate_entries(item, line, "ignore", e.ignore.iter().map(String::as_str));
        self.levels(e, item);
    }

    /// An action an event runs: it must exist; an internal event's action declares no
    /// target, any other event's at least one.
    fn event_action(&mut self, e: &EventDef, a: &str, item: &str, line: Option<u32>) {
        match self.actions.get(a) {
            None => self.error(item, line, format!("`action` names unknown action `{a}`")),
            Some(action) if e.internal && !action.targets.is_empty() => self.error(
                item,
                line,
                format!("an internal transition stays in its state, but its action `{a}` declares targets (`to`)"),
            ),
            Some(action) if !e.internal && action.targets.is_empty() => self.error(
                item,
                line,
                format!("action `{a}` has no target (`to`): declare one, or make the event `internal = true`"),
            ),
            Some(_) => {}
        }
    }

    /// An event listed both for a state and for one of its ancestors, with nothing that
    /// tells the two levels apart: the innermost wins, so the outer listing is all that
    /// is needed.
    fn levels(&mut self, e: &'a EventDef, item: &str) {
        for st in &e.valid_in {
            let ancestors = self.path(st);
            let Some(outer) = ancestors[1..].iter().find(|a| e.valid_in.iter().any(|v| v == *a)) else { continue };
            let specific = e.when.iter().any(|w| w.valid_in.iter().any(|v| v == st || v == outer));
            if !specific {
                self.error(
                    item,
                    e.origin.line,
                    format!(
                        "declared at several levels: `{st}` and `{outer}`, which contains it, do the same \
                         (an event applies to every substate of a state it lists; list `{outer}` only, or give \
                         `{st}` alternatives of its own with `[[events.{}.when]] in = [\"{st}\"]`)",
                        e.name
                    ),
                );
            }
        }
    }

    /// A declarative action's `set` and `raise`; no agent beside them.
    pub(super) fn declarative(&mut self, a: &'a ActionDef, item: &str) {
        let line = a.origin.line;
        if (!a.set.is_empty() || !a.raise.is_empty() || !a.create.is_empty()) && a.agent.is_some() {
            self.error(
                item,
                line,
                "an action is declarative (`set`, `raise`, `create`) or executed by an agent, not both".into(),
            );
        }
        for (i, r) in a.raise.iter().enumerate() {
            if let Some(reply) = &r.reply {
                if r.machine.is_none() {
                    let why = format!("`raise[{i}]`: a `reply` comes from one entity, named by `machine` and `key`");
                    self.error(item, line, why);
                }
                self.reply(item, line, &format!("raise[{i}].reply"), reply);
            }
            match (&r.machine, &r.key, r.on.as_str()) {
                (Some(_), Some(key), "") => {
                    let key = serde_json::Value::from(key.as_str());
                    self.expressions(item, line, vec![(format!("raise[{i}].key"), &key)]);
                }
                (None, None, "predecessors" | "successors") => {}
                (None, None, "self") => self.raise_self(item, line, i, r),
                (None, None, "") => self.error(
                    item,
                    line,
                    format!(
                        "`raise` of `{}`: name the entity by `machine` and `key`, or the related ones by `on`",
                        r.event
                    ),
                ),
                (None, None, on) => self.error(
                    item,
                    line,
                    format!("`raise` `on` must be `predecessors`, `successors` or `self`, not `{on}`"),
                ),
                _ => self.error(
                    item,
                    line,
                    format!("`raise` of `{}`: `machine` and `key` go together, and without `on`", r.event),
                ),
            }
            if !(r.params.is_null() || r.params.is_object()) {
                self.error(item, line, format!("`raise` of `{}`: `params` must be a table", r.event));
            }
            if let Some(may) = &a.may_raise
                && !may.contains(&r.event)
            {
                let declared = listed(may);
                let why = format!("`raise` of `{}`: not among the events it `may_raise` ({declared})", r.event);
                self.error(item, line, why);
            }
        }
        self.duplicate_entries(item, line, "set", a.set.iter().map(|(k, _)| k.as_str()));
        self.engine_properties(item, line, "set", a.set.iter().map(|(k, _)| k.as_str()));
        for (i, c) in a.create.iter().enumerate() {
            let field = format!("create[{i}].properties");
            self.engine_properties(item, line, &field, c.properties.iter().map(|(k, _)| k.as_str()));
        }
        // A string in `set`, a created entity's key and the strings of its properties are
        // expressions over `props`, `params` (of any event the machine declares: which one
        // runs the action is known only when it runs) and `key`.
        let values = a.set.iter().map(|(name, v)| (format!("set.{name}"), v));
        self.expressions(item, line, values.collect());
        for (i, c) in a.create.iter().enumerate() {
            let at = format!("create[{i}]");
            let key = serde_json::Value::from(c.key.as_str());
            let mut values = vec![(format!("{at}.key"), &key)];
            values.extend(c.properties.iter().map(|(name, v)| (format!("{at}.properties.{name}"), v)));
            self.expressions(item, line, values);
            if c.event.is_none() && !c.params.is_null() {
                self.error(item, line, format!("`{at}`: `params` without an `event` to carry them"));
            }
            if let Some(reply) = &c.reply {
                if c.event.is_none() {
                    self.error(item, line, format!("`{at}`: a `reply` without an `event` to answer"));
                }
                self.reply(item, line, &format!("{at}.reply"), reply);
            }
            if !(c.params.is_null() || c.params.is_object()) {
                self.error(item, line, format!("`{at}`: `params` must be a table"));
            }
            if let Some(may) = &a.may_create
                && !may.contains(&c.machine)
            {
                let declared = listed(may);
                let why = format!("`{at}` of a `{}`: not among the machines it `may_create` ({declared})", c.machine);
                self.error(item, line, why);
            }
            if let (Some(event), Some(may)) = (&c.event, &a.may_raise)
                && !may.contains(event)
            {
                let declared = listed(may);
                let why =
                    format!("`{at}`: its first event `{event}` is not among the events it `may_raise` ({declared})");
                self.error(item, line, why);
            }
        }
        if let Some(m) = &a.may_create {
            self.duplicate_entries(item, line, "may_create", m.iter().map(String::as_str));
        }
        if let Some(e) = &a.may_raise {
            self.duplicate_entries(item, line, "may_raise", e.iter().map(String::as_str));
        }
    }

    /// A raise on the entity itself (`on = "self"`, `raise[i]`): an event of this machine,
    /// given the parameters it requires, asking no reply.
    fn raise_self(&mut self, item: &str, line: Option<u32>, i: usize, r: &crate::machine::RaiseDef) {
        let Some(event) = self.def.events.iter().find(|e| e.name == r.event) else {
            let why = format!("`raise[{i}]` on `self`: `{}` is not an event of this machine", r.event);
            return self.error(item, line, why);
        };
        let given = r.params.as_object();
        for p in event.params.iter().filter(|p| !given.is_some_and(|g| g.contains_key(*p))) {
            let why = format!("`raise[{i}]` on `self`: event `{}` requires parameter `{p}`", r.event);
            self.error(item, line, why);
        }
        if r.reply.is_some() {
            let why = format!("`raise[{i}]` on `self`: an internal event asks no reply");
            self.error(item, line, why);
        }
    }

    /// A sync nested event's reply (`at`): an event of this machine, whose parameters are
    /// among those a reply carries.
    fn reply(&mut self, item: &str, line: Option<u32>, at: &str, reply: &str) {
        let Some(event) = self.def.events.iter().find(|e| e.name == reply) else {
            self.error(item, line, format!("`{at}`: `{reply}` is not an event of this machine"));
            return;
        };
        for p in event.params.iter().filter(|p| !REPLY_PARAMS.contains(&p.as_str())) {
            let carried = REPLY_PARAMS.join(", ");
            let why = format!("`{at}`: event `{reply}` declares parameter `{p}`, which no reply carries ({carried})");
            self.error(item, line, why);
        }
    }

    /// Checks declared values: a string is an expression (`field` names where it is).
    fn expressions(&mut self, item: &str, line: Option<u32>, values: Vec<(String, &serde_json::Value)>) {
        if !values.iter().any(|(_, v)| v.is_string()) {
            return;
        }
        let properties = self.mentioned_properties();
        let mut params: Vec<String> = self.def.events.iter().flat_map(|e| e.params.iter().cloned()).collect();
        params.sort();
        params.dedup();
        for (field, value) in values {
            let Some(src) = value.as_str() else { continue };
            let at = format!("`{field}` = `{src}`");
            let hint = format!(" (a literal string is quoted, `'{src}'`)");
            match crate::expr::Expression::parse(src) {
                Ok(expr) => {
                    for problem in expr.check(Names { params: &params, properties: &properties, states: &[] }) {
                        let hint = if problem.starts_with("unknown name") { hint.as_str() } else { "" };
                        self.error(item, line, format!("{at}: {problem}{hint}"));
                    }
                }
                Err(message) => self.error(item, line, format!("{at}: {message}{hint}")),
            }
        }
    }

    /// Every property name the machine mentions: declared `properties`, states' `requires`
    /// and declarative actions' `set`. Guards may read these.
    pub(super) fn mentioned_properties(&self) -> Vec<String> {
        let mut names: Vec<String> = self.def.properties.clone();
        names.extend(self.def.states.iter().flat_map(|s| s.requires.iter().cloned()));
        names.extend(self.def.actions.iter().flat_map(|a| a.set.iter().map(|(k, _)| k.clone())));
        names.sort();
        names.dedup();
        names
    }
}

/// The parameters a sync nested event's reply carries (`reason` null unless it was
/// rejected, ignored or failed).
pub const REPLY_PARAMS: [&str; 6] = ["machine", "key", "event", "outcome", "state", "reason"];

/// Names a declaration lists, for a message: `a, b`, or `none`.
fn listed(names: &[String]) -> String {
    if names.is_empty() { "none".to_string() } else { names.join(", ") }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    /// Every file of `testdata/invalid` is one class of statechart mistake; its `# expect:`
    /// lines are every diagnostic loading it must give (line, severity, item, message).
    /// The binary's `settle validate` test reads the same files.
    #[test]
    fn every_class_of_statechart_mistake_is_reported_with_its_line() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/testdata/invalid");
        let mut files: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
        files.sort();
        assert!(files.len() >= 17, "one fixture per class");
        for path in files {
            let text = std::fs::read_to_string(&path).unwrap();
            let stem = path.file_stem().unwrap().to_str().unwrap();
            let name = path.file_name().unwrap().to_str().unwrap();
            let expected: Vec<String> =
                text.lines().filter_map(|l| l.strip_prefix("# expect: ")).map(|l| format!("{name}:{l}")).collect();
            let report = match crate::toml::load(name, stem, &text) {
                Ok((_, warnings)) => warnings,
                Err(errors) => errors,
            };
            let got: Vec<String> = report.diagnostics.iter().map(ToString::to_string).collect();
            assert_eq!(got, expected, "{name}");
        }
    }
}
