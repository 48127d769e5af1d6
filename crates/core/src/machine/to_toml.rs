//! [`Machine::to_toml`]: a validated machine written back as a TOML definition, in the
//! format [`crate::toml`] reads — for showing a machine's definition when it was built in
//! Rust or read back from its canonical JSON, where no file exists.
//!
//! The text is written by hand, in the order a person would write it: the header (`name`,
//! `initial`, `properties`), then every state, event, action and timer in declaration
//! order, then `[fault]` and `[migrate]`. Only keys that differ from what the loader
//! assumes are written, so a simple machine gives a short file.

use std::fmt::Write as _;
use std::time::Duration;

use super::def::{CalendarDef, Health, StateKind};
use super::model::{AgentBinding, Event, Machine, Schedule, Then};
use crate::duration;
use crate::fault::FaultPolicy;

impl Machine {
    /// The definition as TOML that [`crate::toml::load`] reads back into the same machine:
    /// equal [`canonical_json`](Machine::canonical_json), so equal
    /// [`content_hash`](Machine::content_hash).
    ///
    /// Items come in declaration order (states, events, actions, timers), then the fault
    /// policy and the migration table; a key is written only when it differs from what
    /// the loader assumes without it (a state's `kind` when its `auto` does not imply it, a
    /// `wait` that is not zero, an agent's `lock` other than 1m, fault-policy keys other
    /// than the default, …). `name` is always written, since a file without it takes its
    /// file's name, and `initial` always at the top (not as `initial = true` on a state).
    /// Durations are written in the form [`crate::duration::format`] gives (`90s` is
    /// `1m30s`). Rejection reasons come sorted by state and `set` by property, as the
    /// canonical JSON keeps them: machines with the same content hash give the same text.
    ///
    /// What TOML cannot say: a `null` nested inside a declarative action's `set` value or
    /// `raise` parameters (a `null` value of `set` itself is written as `unset`) is left
    /// out, and an integer above `i64::MAX` there is written as a float. Durations are
    /// whole milliseconds, as in the canonical JSON: a lock, period or fault-policy duration
    /// shorter than 1ms (possible only from Rust) is written as `0s`, which the loader
    /// refuses, as [`from_canonical_json`](Machine::from_canonical_json) does. Definitions
    /// loaded from TOML contain none of these.
    ///
    /// ```
    /// use settle_core::MachineBuilder;
    /// let m = MachineBuilder::new("door")
    ///     .state("closed").initial()
    ///     .state("open")
    ///     .event("open", ["closed"], "do_open")
    ///     .event("close", ["open"], "do_close")
    ///     .action("do_open", ["open"])
    ///     .action("do_close", ["closed"])
    ///     .build()
    ///     .unwrap();
    /// let text = m.to_toml();
    /// assert!(text.starts_with("name = \"door\"\ninitial = \"closed\"\n\n[states.closed]\n"));
    /// let (back, _) = settle_core::toml::load("door.toml", "door", &text).unwrap();
    /// assert_eq!(back.content_hash(), m.content_hash());
    /// ```
    pub fn to_toml(&self) -> String {
        let mut w = Writer::default();
        w.entry("name", string(self.name()));
        w.entry("initial", string(&self.initial_declared().name));
        if self.upgrade == crate::upgrade::Policy::Pin {
            w.entry("upgrade", string(self.upgrade.as_str()));
        }
        if !self.cascade.is_empty() {
            w.entry("cascade", strings(&self.cascade));
        }
        if let Some(e) = &self.cancel {
            w.entry("cancel", string(e.as_str()));
        }
        if let Some(e) = &self.delete {
            w.entry("delete", string(e.as_str()));
        }
        if !self.properties.is_empty() {
            w.entry("properties", strings(&self.properties));
        }
        self.write_states(&mut w);
        for e in self.events() {
            write_event(&mut w, e);
        }
        self.write_actions(&mut w);
        for t in self.timers() {
            w.table(&["timers", &t.name]);
            w.entry("event", string(&t.event));
            match t.schedule {
                Schedule::Every(d) => w.entry("every", duration_text(d)),
                Schedule::After(d) => w.entry("after", duration_text(d)),
            }
            w.entry("in", strings(&t.valid_in));
        }
        for c in self.schedules() {
            write_schedule(&mut w, &c.def);
        }
        for l in self.limits() {
            write_limit(&mut w, &l.def);
        }
        if let Some(policy) = &self.fault {
            write_fault(&mut w, policy);
        }
        if let Some(r) = &self.retention {
            w.table(&["retention"]);
            if let Some(k) = r.ended {
                w.entry("ended", string(&k.as_text()));
            }
            if let Some(a) = r.archive {
                w.entry("archive", a.to_string());
            }
            if let Some(k) = r.history {
                w.entry("history", string(&k.as_text()));
            }
            if let Some(n) = r.history_rows {
                w.entry("history_rows", n.to_string());
            }
        }
        if !self.migrate.is_empty() {
            w.table(&["migrate"]);
            for (old, new) in &self.migrate {
                w.entry(old, string(new));
            }
        }
        w.out
    }

    fn write_states(&self, w: &mut Writer) {
        for s in self.states() {
            w.table(&["states", &s.name]);
            let implied = if s.auto.is_some() { StateKind::Unstable } else { StateKind::Stable };
            if s.kind != implied {
                w.entry("kind", string(s.kind.as_str()));
            }
            if let Some(parent) = &s.parent {
                w.entry("parent", string(parent));
            }
            if let Some(child) = &s.initial_child {
                w.entry("initial", string(child));
            }
            if let Some(h) = s.history {
                w.entry("history", string(h.as_str()));
            }
            if s.health != Health::Ok {
                w.entry("health", string(s.health.as_str()));
            }
            if let Some(auto) = &s.auto {
                w.entry("auto", string(auto));
            }
            if s.wait.as_millis() > 0 {
                w.entry("wait", duration_text(s.wait));
            }
            if !s.requires.is_empty() {
                w.entry("requires", strings(&s.requires));
            }
            if !s.on_entry.is_empty() {
                w.entry("on_entry", names(&s.on_entry));
            }
            if !s.on_exit.is_empty() {
                w.entry("on_exit", names(&s.on_exit));
            }
            if !s.renamed_from.is_empty() {
                w.entry("renamed_from", strings(&s.renamed_from));
            }
            if let Some(k) = s.retain {
                w.entry("retain", string(&k.as_text()));
            }
            if !s.on_entry_from.is_empty() {
                w.table(&["states", &s.name, "on_entry_from"]);
                for (event, actions) in &s.on_entry_from {
                    w.entry(event, names(actions));
                }
            }
        }
    }

    fn write_actions(&self, w: &mut Writer) {
        for a in self.actions() {
            w.table(&["actions", &a.name]);
            if !a.targets.is_empty() {
                w.entry("to", strings(a.targets.iter().map(|t| &t.state)));
            }
            if let Some(AgentBinding { queue, lock }) = &a.agent {
                w.entry("agent", string(queue));
                if lock.as_millis() != AgentBinding::DEFAULT_LOCK.as_millis() {
                    w.entry("lock", duration_text(*lock));
                }
            }
            if let Some(m) = &a.may_create {
                w.entry("may_create", strings(m.iter()));
            }
            if let Some(e) = &a.may_raise {
                w.entry("may_raise", strings(e.iter()));
            }
            let mut waits: Vec<(&str, String)> = Vec::new();
            for t in a.targets.iter().filter(|t| t.wait.as_millis() > 0) {
                if !waits.iter().any(|(s, _)| *s == t.state.as_str()) {
                    waits.push((&t.state, duration_text(t.wait)));
                }
            }
            if !waits.is_empty() {
                w.entry("wait", inline_table(waits));
            }
            // Sorted by property, as the canonical JSON keeps them.
            let mut set: Vec<&(String, serde_json::Value)> = a.set.iter().collect();
            set.sort_by(|(a, _), (b, _)| a.cmp(b));
            let values: Vec<(&str, String)> =
                set.iter().filter_map(|(k, v)| Some((k.as_str(), json_value(v)?))).collect();
            if !values.is_empty() {
                w.entry("set", inline_table(values));
            }
            let unset: Vec<&String> = set.iter().filter(|(_, v)| v.is_null()).map(|(k, _)| k).collect();
            if !unset.is_empty() {
                w.entry("unset", strings(unset));
            }
            if !a.raise.is_empty() || !a.raise_keyed.is_empty() || !a.raise_self.is_empty() {
                let related = a.raise.iter().map(|r| {
                    let mut fields = vec![("event", string(&r.event)), ("on", string(r.on.as_str()))];
                    fields.extend(json_value(&r.params).map(|p| ("params", p)));
                    inline_table(fields)
                });
                let keyed = a.raise_keyed.iter().map(|r| {
                    let mut fields = vec![
                        ("event", string(&r.event)),
                        ("machine", string(r.machine.as_str())),
                        ("key", string(r.key.source())),
                    ];
                    fields.extend(json_value(&r.params).map(|p| ("params", p)));
                    fields.extend(r.reply.as_ref().map(|e| ("reply", string(e))));
                    inline_table(fields)
                });
                let own = a.raise_self.iter().map(|(event, params)| {
                    let mut fields = vec![("event", string(event)), ("on", string(super::model::SELF))];
                    fields.extend(json_value(params).map(|p| ("params", p)));
                    inline_table(fields)
                });
                let raises = related.chain(keyed).chain(own);
                w.entry("raise", format!("[{}]", raises.collect::<Vec<_>>().join(", ")));
            }
            if !a.create.is_empty() {
                let creates = a.create.iter().map(|c| {
                    let mut fields = vec![("machine", string(c.machine.as_str())), ("key", string(c.key.source()))];
                    // Sorted by property, as the canonical JSON keeps them.
                    let mut props: Vec<&(String, serde_json::Value)> = c.properties.iter().collect();
                    props.sort_by(|(a, _), (b, _)| a.cmp(b));
                    let props: Vec<(&str, String)> =
                        props.iter().filter_map(|(k, v)| Some((k.as_str(), json_value(v)?))).collect();
                    if !props.is_empty() {
                        fields.push(("properties", inline_table(props)));
                    }
                    if let Some((event, params)) = &c.event {
                        fields.push(("event", string(event.as_str())));
                        fields.extend(json_value(params).map(|p| ("params", p)));
                    }
                    fields.extend(c.reply.as_ref().map(|e| ("reply", string(e))));
                    inline_table(fields)
                });
                w.entry("create", format!("[{}]", creates.collect::<Vec<_>>().join(", ")));
            }
        }
    }
}

fn write_event(w: &mut Writer, e: &Event) {
    w.table(&["events", &e.name]);
    w.entry("in", strings(&e.valid_in));
    let action = e.action();
    if let Some(action) = action {
        w.entry("action", string(action));
    }
    if !e.params.is_empty() {
        w.entry("params", strings(&e.params));
    }
    if e.internal {
        w.entry("internal", "true".to_string());
    }
    if e.priority != 0 {
        w.entry("priority", e.priority.to_string());
    }
    if !e.ignore.is_empty() {
        w.entry("ignore", strings(&e.ignore));
    }
    if let Some(sub) = &e.subscribe {
        w.entry("subscribe", string(&sub.pattern.to_string()));
        if let Some(t) = &sub.timeout {
            w.entry("timeout", inline_table([("after", duration_text(t.after)), ("event", string(&t.event))]));
        }
    }
    if !e.reject.is_empty() {
        w.table(&["events", &e.name, "reject"]);
        for (state, reason) in &e.reject {
            w.entry(state, string(reason));
        }
    }
    if action.is_none() {
        for alt in &e.alternatives {
            w.array_table(&["events", &e.name, "when"]);
            if !alt.valid_in.is_empty() {
                w.entry("in", strings(&alt.valid_in));
            }
            if let Some(guard) = &alt.guard {
                w.entry("guard", string(guard.source()));
            }
            match &alt.then {
                Then::Action(a) => w.entry("action", string(a)),
                Then::Reject(reason) => w.entry("reject", string(reason)),
                Then::Ignore => w.entry("ignore", "true".to_string()),
            }
        }
    }
}

/// `[limits.NAME]` as declared.
fn write_limit(w: &mut Writer, l: &crate::limits::LimitDef) {
    w.table(&["limits", &l.name]);
    for (k, names) in [("states", &l.states), ("events", &l.events)] {
        if !names.is_empty() {
            w.entry(k, strings(names));
        }
    }
    for (k, n) in [("max", l.max), ("rate", l.rate)] {
        if let Some(n) = n {
            w.entry(k, n.to_string());
        }
    }
    if let Some(per) = l.per_ms {
        w.entry("per", duration_text(Duration::from_millis(per)));
    }
    for (k, e) in [("key", &l.key), ("fair_by", &l.fair_by)] {
        if let Some(e) = e {
            w.entry(k, string(e));
        }
    }
}

/// `[schedules.NAME]` as declared.
fn write_schedule(w: &mut Writer, c: &CalendarDef) {
    w.table(&["schedules", &c.name]);
    w.entry("cron", string(&c.cron));
    let texts = [("zone", &c.zone), ("raise", &c.raise)];
    for (k, v) in texts {
        if let Some(v) = v {
            w.entry(k, string(v));
        }
    }
    if !c.valid_in.is_empty() {
        w.entry("in", strings(&c.valid_in));
    }
    if let Some(create) = &c.create {
        let mut fields = Vec::new();
        if let Some(k) = &create.key {
            fields.push(("key".to_string(), string(k)));
        }
        let props: Vec<(String, String)> =
            create.properties.iter().filter_map(|(k, v)| json_value(v).map(|v| (k.clone(), v))).collect();
        if !props.is_empty() {
            fields.push(("properties".to_string(), inline_table(props)));
        }
        w.entry("create", inline_table(fields));
    }
    for (k, v) in [("overlap", &c.overlap), ("catch_up", &c.catch_up)] {
        if let Some(v) = v {
            w.entry(k, string(v));
        }
    }
    if let Some(n) = c.catch_up_limit {
        w.entry("catch_up_limit", n.to_string());
    }
    if let Some(ms) = c.jitter_ms {
        w.entry("jitter", duration_text(Duration::from_millis(ms)));
    }
    if let Some(r) = c.rate {
        w.entry("rate", r.to_string());
    }
}

/// `[fault]` with the keys that differ from [`FaultPolicy::DEFAULT`] (declared at all, it
/// is part of the definition's hash even when every key is the default).
fn write_fault(w: &mut Writer, p: &FaultPolicy) {
    let d = FaultPolicy::DEFAULT;
    let differs = |a: Duration, b: Duration| a.as_millis() != b.as_millis();
    w.table(&["fault"]);
    if p.max_errors != d.max_errors {
        w.entry("max_errors", p.max_errors.to_string());
    }
    if differs(p.window, d.window) {
        w.entry("window", duration_text(p.window));
    }
    let mut backoff = Vec::new();
    if differs(p.backoff_min, d.backoff_min) {
        backoff.push(("min", duration_text(p.backoff_min)));
    }
    if differs(p.backoff_max, d.backoff_max) {
        backoff.push(("max", duration_text(p.backoff_max)));
    }
    if !backoff.is_empty() {
        w.entry("backoff", inline_table(backoff));
    }
}

/// The text being written: `key = value` lines under table headers, a blank line before
/// each header.
#[derive(Default)]
struct Writer {
    out: String,
}

impl Writer {
    fn entry(&mut self, k: &str, value: String) {
        let _ = writeln!(self.out, "{} = {value}", key(k));
    }
    fn table(&mut self, path: &[&str]) {
        self.header("[", path, "]");
    }
    fn array_table(&mut self, path: &[&str]) {
        self.header("[[", path, "]]");
    }
    fn header(&mut self, open: &str, path: &[&str], close: &str) {
        if !self.out.is_empty() {
            self.out.push('\n');
        }
        let path: Vec<String> = path.iter().map(|k| key(k)).collect();
        let _ = writeln!(self.out, "{open}{}{close}", path.join("."));
    }
}

/// A key: bare when TOML allows it (letters, digits, `_`, `-`), else a quoted string.
fn key(k: &str) -> String {
    if !k.is_empty() && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') {
        k.to_string()
    } else {
        string(k)
    }
}

/// A TOML basic string: quotes, backslashes and control characters escaped.
fn string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if c < ' ' || c == '\u{7f}' => {
                let _ = write!(out, "\\u{:04X}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// An array of strings: `["a", "b"]`.
fn strings<S: AsRef<str>>(items: impl IntoIterator<Item = S>) -> String {
    let items: Vec<String> = items.into_iter().map(|s| string(s.as_ref())).collect();
    format!("[{}]", items.join(", "))
}

/// One name as a string, several as an array (`on_entry = "a"`, `on_exit = ["a", "b"]`).
fn names<S: AsRef<str>>(items: &[S]) -> String {
    match items {
        [one] => string(one.as_ref()),
        _ => strings(items),
    }
}

/// A duration as the loader reads it: `"1h30m"`.
fn duration_text(d: Duration) -> String {
    string(&duration::format(d))
}

/// An inline table: `{ a = 1, b = "x" }`, or `{}`.
fn inline_table<K: AsRef<str>>(fields: impl IntoIterator<Item = (K, String)>) -> String {
    let fields: Vec<String> = fields.into_iter().map(|(k, v)| format!("{} = {v}", key(k.as_ref()))).collect();
    if fields.is_empty() { "{}".to_string() } else { format!("{{ {} }}", fields.join(", ")) }
}

/// A JSON value as a TOML value; `None` for `null`, which TOML cannot say (left out of
/// arrays and tables too).
fn json_value(v: &serde_json::Value) -> Option<String> {
    use serde_json::Value;
    Some(match v {
        Value::Null => return None,
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => match (n.as_i64(), n.as_f64()) {
            (Some(i), _) => i.to_string(),
            // `{:?}` always has a `.` or an exponent, so TOML reads a float.
            (None, Some(f)) => format!("{f:?}"),
            (None, None) => n.to_string(),
        },
        Value::String(s) => string(s),
        Value::Array(items) => format!("[{}]", items.iter().filter_map(json_value).collect::<Vec<_>>().join(", ")),
        Value::Object(map) => {
            // Sorted, whatever order the map keeps (serde_json's `preserve_order`).
            let mut fields: Vec<(&String, String)> =
                map.iter().filter_map(|(k, v)| Some((k, json_value(v)?))).collect();
            fields.sort_by_key(|(k, _)| *k);
            inline_table(fields)
        }
    })
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};
    use std::time::Duration;

    use proptest::prelude::*;
    use serde_json::{Value, json};

    use crate::fault::FaultPolicy;
    use crate::fixtures;
    use crate::machine::{AgentBinding, Machine, MachineBuilder, Related, Schedule, StateKind};

    /// `m.to_toml()` loads back as the same definition (same canonical JSON, so same hash),
    /// and writing that again gives the same text. Also through the canonical JSON, as a
    /// store keeps it. Returns the text.
    fn round_trip(m: &Machine) -> String {
        let text = m.to_toml();
        let (back, _) = crate::toml::load("rendered.toml", "not-the-name", &text)
            .unwrap_or_else(|r| panic!("{}: the rendering does not load:\n{r}\n{text}", m.name()));
        assert_eq!(back.canonical_json(), m.canonical_json(), "{}:\n{text}", m.name());
        assert_eq!(back.content_hash(), m.content_hash(), "{}", m.name());
        assert_eq!(back.to_toml(), text, "{}: rendering is not a fixed point", m.name());
        let stored = Machine::from_canonical_json(&m.canonical_json()).expect("canonical json reads back");
        assert_eq!(stored.to_toml(), text, "{}: read back from its canonical json", m.name());
        text
    }

    /// The `.toml` files under `dir`, recursively, sorted, except those under `skip`.
    fn toml_files(dir: &Path, skip: &str, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.expect("readable directory entry").path();
            if path.is_dir() {
                if path.file_name().is_some_and(|n| n != skip) {
                    toml_files(&path, skip, out);
                }
            } else if path.extension().is_some_and(|e| e == "toml") {
                out.push(path);
            }
        }
        out.sort();
    }

    /// Round-trips every file that loads; returns how many did. A file that does not load
    /// is left to the tests of the loader (the examples' own test requires them to load).
    fn round_trip_files(files: &[PathBuf]) -> usize {
        let mut checked = 0;
        for path in files {
            let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let stem = path.file_stem().and_then(|s| s.to_str()).expect("a utf-8 file name");
            if let Ok((m, _)) = crate::toml::load(&path.display().to_string(), stem, &text) {
                round_trip(&m);
                checked += 1;
            }
        }
        checked
    }

    #[test]
    fn every_example_machine_round_trips() {
        let mut files = Vec::new();
        toml_files(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/machines"), "", &mut files);
        assert!(files.len() >= 4, "{files:?}");
        assert_eq!(round_trip_files(&files), files.len(), "every example in examples/machines loads");
    }

    #[test]
    fn every_valid_testdata_definition_round_trips() {
        let mut files = Vec::new();
        toml_files(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src/testdata"), "invalid", &mut files);
        assert!(files.iter().any(|f| f.ends_with("instance.toml")), "{files:?}");
        assert_eq!(round_trip_files(&files), files.len(), "every file outside `invalid/` loads: {files:?}");
    }

    #[test]
    fn fixture_builders_round_trip() {
        for m in [
            fixtures::base().build().unwrap(),
            fixtures::server().build().unwrap(),
            fixtures::subscriber().build().unwrap(),
            fixtures::instance(),
            fixtures::server().fault_policy(FaultPolicy::DEFAULT).build().unwrap(),
        ] {
            round_trip(&m);
        }
    }

    /// A machine using every key the format has, with names and values that need quoting.
    fn everything() -> MachineBuilder {
        MachineBuilder::new("everything")
            .properties(["max_size", "weird key", "ünïcode"])
            .state("new")
            .initial()
            .state("creating")
            .auto("create")
            .wait(Duration::from_millis(1500))
            .state("waiting")
            .state("up")
            .initial_child("serving")
            .requires(["endpoint", "dotted.name"])
            .on_entry("open_endpoint")
            .on_exit("close_endpoint")
            .on_exit("log_exit")
            .state("serving")
            .parent("up")
            .on_entry_from("resize", "note_resize")
            .on_entry_from("restart", "note_resize")
            .on_entry_from("restart", "log_exit")
            .state("scaling")
            .parent("up")
            .auto("scale")
            .state("failed")
            .error_health()
            .auto("undo")
            .state("archived")
            .kind(StateKind::Terminal)
            .renamed_from(["retired", "old archived"])
            .state("gone")
            .kind(StateKind::Deleted)
            .event("create", ["new"], "begin")
            .params(["region", "size"])
            .reject("creating", "already in progress: \"quoted\"\\ back\nnew line\ttab \u{1} \u{7f} é")
            .reject("failed", "")
            .event("resources_ready", ["waiting"], "finish")
            .subscribe("all(*)   in [ready]")
            .timeout(Duration::from_secs(600), "resources_timeout")
            .event("resources_failed", ["waiting"], "give_up")
            .subscribe("any(*) health error")
            .event("resources_timeout", ["waiting"], "give_up")
            .guarded_event("resize", ["serving"])
            .params(["size", "mode"])
            .when(Some("params.size <= props.max_size && params.mode != \"fast\\\"er\""), "begin_scale")
            .when_in(["serving"])
            .when_rejecting(Some("params.size > props.max_size"), "too big")
            .when_rejecting(None, "no")
            .event("restart", ["up"], "reboot")
            .guarded_event("only", ["up"])
            .params(["quiet"])
            .when_ignoring(Some("params.quiet == true"))
            .when(None, "reboot")
            .when_in(["up"])
            .event("heartbeat", ["up"], "record")
            .internal()
            .ignore(["new", "archived"])
            .event("archive", ["up"], "retire")
            .event("check", ["up"], "probe")
            .internal()
            .action("begin", ["creating"])
            .action("create", ["waiting", "creating", "failed"])
            .agent("provider", Duration::from_secs(90))
            .target_wait("creating", Duration::from_secs(5))
            .target_wait("failed", Duration::from_millis(86_400_000 + 1))
            .action("finish", ["up"])
            .action("give_up", ["failed"])
            .action("begin_scale", ["scaling"])
            .action("scale", ["serving"])
            .action("reboot", ["serving"])
            .action("retire", ["archived"])
            .action("undo", ["gone", "failed"])
            .agent("provider", AgentBinding::DEFAULT_LOCK)
            .effect("open_endpoint")
            .sets("endpoint", json!("'db.internal:5432'"))
            .sets("weird key", json!({"a b": [1, 2.5, true, "x\"y"], "": {}, "n": -7, "big": 1e300}))
            .effect("close_endpoint")
            .sets("endpoint", Value::Null)
            .raises("pause", Related::Successors, json!({"reason": "closing", "n": 3}))
            .raises("closed", Related::Predecessors, Value::Null)
            .raises("noted", Related::Predecessors, json!({}))
            .effect("log_exit")
            .effect("note_resize")
            .sets("resized", json!(true))
            .sets("dotted.name", json!("key + '-x'"))
            .effect("record")
            .sets("last_seen", json!([]))
            .effect("probe")
            .timer("health", "check", Schedule::Every(Duration::from_secs(300)), ["up"])
            .timer("give_up", "resources_timeout", Schedule::After(Duration::from_secs(5400)), ["waiting"])
            .fault_policy(FaultPolicy { max_errors: 5, backoff_max: Duration::from_secs(300), ..FaultPolicy::DEFAULT })
            .migrate("jammed", "failed")
            .migrate("older state", "new")
    }

    #[test]
    fn every_feature_round_trips() {
        let m = everything().build().unwrap_or_else(|r| panic!("{r}"));
        let text = round_trip(&m);
        for line in [
            "[states.creating]\nauto = \"create\"\nwait = \"1s500ms\"\n",
            "[states.up]\ninitial = \"serving\"\nrequires = [\"endpoint\", \"dotted.name\"]\n\
             on_entry = \"open_endpoint\"\non_exit = [\"close_endpoint\", \"log_exit\"]\n",
            "[states.serving.on_entry_from]\nresize = \"note_resize\"\nrestart = [\"note_resize\", \"log_exit\"]\n",
            "[states.archived]\nkind = \"terminal\"\nrenamed_from = [\"retired\", \"old archived\"]\n",
            "creating = \"already in progress: \\\"quoted\\\"\\\\ back\\nnew line\\ttab \\u0001 \\u007F é\"\n",
            "subscribe = \"all(*) in [ready]\"\ntimeout = { after = \"10m\", event = \"resources_timeout\" }\n",
            "[[events.resize.when]]\nin = [\"serving\"]\nguard = \"params.size <= props.max_size && params.mode != \\\"fast\\\\\\\"er\\\"\"\naction = \"begin_scale\"\n",
            "[[events.resize.when]]\nreject = \"no\"\n",
            "[[events.only.when]]\nguard = \"params.quiet == true\"\nignore = true\n",
            "[[events.only.when]]\nin = [\"up\"]\naction = \"reboot\"\n",
            "internal = true\nignore = [\"new\", \"archived\"]\n",
            "agent = \"provider\"\nlock = \"1m30s\"\nwait = { creating = \"5s\", failed = \"1d1ms\" }\n",
            "[actions.undo]\nto = [\"gone\", \"failed\"]\nagent = \"provider\"\n\n",
            "set = { endpoint = \"'db.internal:5432'\", \"weird key\" = { \"\" = {}, \"a b\" = [1, 2.5, true, \"x\\\"y\"], big = 1e300, n = -7 } }\n",
            "unset = [\"endpoint\"]\nraise = [{ event = \"pause\", on = \"successors\", params = { n = 3, reason = \"closing\" } }, \
             { event = \"closed\", on = \"predecessors\" }, { event = \"noted\", on = \"predecessors\", params = {} }]\n",
            "[actions.log_exit]\n\n",
            "[actions.note_resize]\nset = { \"dotted.name\" = \"key + '-x'\", resized = true }\n",
            "[timers.give_up]\nevent = \"resources_timeout\"\nafter = \"1h30m\"\nin = [\"waiting\"]\n",
            "[fault]\nmax_errors = 5\nbackoff = { max = \"5m\" }\n\n[migrate]\njammed = \"failed\"\n\"older state\" = \"new\"\n",
        ] {
            assert!(text.contains(line), "missing:\n{line}\nin:\n{text}");
        }
    }

    #[test]
    fn a_simple_machine_reads_as_if_written_by_hand() {
        let door = MachineBuilder::new("door")
            .state("closed")
            .initial()
            .state("open")
            .event("open", ["closed"], "do_open")
            .event("close", ["open"], "do_close")
            .action("do_open", ["open"])
            .action("do_close", ["closed"])
            .build()
            .unwrap();
        assert_eq!(
            round_trip(&door),
            r#"name = "door"
initial = "closed"

[states.closed]

[states.open]

[events.open]
in = ["closed"]
action = "do_open"

[events.close]
in = ["open"]
action = "do_close"

[actions.do_open]
to = ["open"]

[actions.do_close]
to = ["closed"]
"#
        );
    }

    #[test]
    fn a_declared_default_fault_policy_is_kept() {
        let m = fixtures::base().fault_policy(FaultPolicy::DEFAULT).build().unwrap();
        assert!(round_trip(&m).ends_with("\n\n[fault]\n"));
    }

    /// The values the rustdoc of `to_toml` says TOML cannot hold: nulls inside a value
    /// are left out, integers beyond `i64` become floats.
    #[test]
    fn what_toml_cannot_say_is_left_out() {
        let value = json!({"a": null, "b": [1, null], "c": u64::MAX});
        assert_eq!(super::json_value(&value).as_deref(), Some("{ b = [1], c = 1.8446744073709552e19 }"));
        assert_eq!(super::json_value(&Value::Null), None);
    }

    /// JSON values for `set` and `raise` parameters that TOML can say: no `null` inside,
    /// integers within `i64`.
    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            // Floats that serde_json reads back exactly: without its `float_roundtrip`
            // feature some do not, which [`Machine::from_canonical_json`] inherits.
            any::<f64>()
                .prop_filter("read back exactly", |f| {
                    f.is_finite() && serde_json::from_str::<f64>(&Value::from(*f).to_string()).ok() == Some(*f)
                })
                .prop_map(Value::from),
            any::<String>().prop_map(Value::from),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
                proptest::collection::btree_map(any::<String>(), inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// A duration of at least a millisecond, in whole milliseconds (what the format stores).
    fn millis() -> impl Strategy<Value = Duration> {
        prop_oneof![1u64..10_000, 1u64..u64::from(u32::MAX), 1u64..=u64::MAX].prop_map(Duration::from_millis)
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 128, failure_persistence: None, ..ProptestConfig::default() })]

        /// Any strings (reasons, property names, old state names), JSON values and durations
        /// survive the round trip.
        #[test]
        fn arbitrary_values_round_trip(
            reason in any::<String>(),
            guard_text in any::<String>(),
            // Property names starting with `$` are the engine's: no definition names one.
            props in proptest::collection::btree_set("([^$].*)?", 0..4),
            set in proptest::collection::btree_map("([^$].*)?", json_value(), 0..4),
            params in proptest::collection::btree_map(any::<String>(), json_value(), 0..3),
            old in proptest::collection::btree_set("[^a-z].*", 0..3),
            (wait, lock, every, window, backoff) in (millis(), millis(), millis(), millis(), millis()),
            max_errors in 1u32..,
        ) {
            let guard = format!("params.text != {}", Value::from(guard_text));
            let m = MachineBuilder::new("m")
                .properties(props)
                .state("idle").initial().renamed_from(old.iter().take(1))
                .state("busy").auto("work").wait(wait)
                .guarded_event("go", ["idle"]).params(["text"])
                .when(Some(&guard), "start")
                .when_rejecting(None, reason.clone())
                .event("tick", ["idle"], "touch").internal().reject("busy", reason)
                .action("start", ["busy"])
                .action("work", ["idle", "busy"]).agent("q", lock).target_wait("busy", wait)
                .effect("touch")
                .raises("e", Related::Successors, Value::Object(params.into_iter().collect()));
            // A string in `set` is an expression: an arbitrary one becomes a string literal.
            let literal = |v: Value| match v {
                Value::String(s) => Value::String(Value::from(s).to_string()),
                other => other,
            };
            let m = set.into_iter().fold(m, |m, (k, v)| m.sets(k, literal(v)))
                .timer("t", "tick", Schedule::Every(every), ["idle"])
                .fault_policy(FaultPolicy { max_errors, window, backoff_min: backoff, backoff_max: backoff });
            let m = old.iter().skip(1).fold(m, |m, o| m.migrate(o, "idle"));
            let m = m.build().unwrap_or_else(|r| panic!("{r}"));
            round_trip(&m);
        }
    }
}
