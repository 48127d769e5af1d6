//! Loading machine definitions from TOML (see the DESIGN appendix for the format).
//!
//! [`parse`] turns one file into a [`MachineDef`] with the line of every item filled in;
//! [`load`] also validates it into a [`Machine`]. Problems come back as a [`Report`]:
//! a syntax or type error is one diagnostic on the item "file"; otherwise every problem
//! is reported at once.
//!
//! Keys supported so far:
//! - top level: `name` (defaults to the file stem), `initial`, `properties` (the property
//!   names guards may read), `[states.*]`, `[events.*]`, `[actions.*]`, `[timers.*]`,
//!   `[fault]`, `[retention]`, `[migrate]`;
//! - a state: `kind` (`stable`, `unstable`, `terminal`, `deleted`), `auto` (an action or
//!   an array of actions), `wait` (a duration), `health` (`ok`, `error`), `requires`,
//!   `initial` (`true` on the machine's initial state; on a parent, the name of the child
//!   entered with it), `parent` (the state this one is a substate of), `on_entry` and
//!   `on_exit` (an action or an array), `on_entry_from` (a table event → action(s)),
//!   `renamed_from` (former names of the state, see [`crate::upgrade`]), `retain` (on a
//!   terminal or deleted state: how long an entity stays after entering it, a duration or
//!   `forever`);
//! - an event: `in`, `action`, `params`, `reject` (a table state → reason), `ignore`
//!   (states where it is accepted and dropped), `internal` (a boolean), `when` (an array
//!   of tables `{ in, guard, action | reject }`: guarded alternatives, see
//!   [`crate::guard`]), `subscribe` (a pattern over successors, see [`crate::pattern`]),
//!   `timeout` (`{ after = duration, event = name }`, with `subscribe`);
//! - an action: `to`, `wait` (a table target state → duration: a wait on that transition),
//!   `set` (a table property → value: a declarative action), `unset` (properties it
//!   removes), `raise` (an array of `{ event, on = "predecessors" | "successors", params }`);
//! - a timer: `event` (the event it raises), `every` or `after` (a duration: periodic, or
//!   one-shot from state entry), `in` (the states where it runs);
//! - `[fault]`, the fault policy (see [`crate::fault`]), every key optional:
//!   `max_errors` (an integer), `window` (a duration), `backoff = { min = duration,
//!   max = duration }`;
//! - `[retention]`: `ended` (a duration or `forever`: how long an entity stays after
//!   entering an end state that declares no `retain`; see [`crate::retention`]);
//! - `[migrate]`: a table old state name → declared state, where stored entities in a
//!   state the definition no longer declares move on upgrade (see [`crate::upgrade`]).
//!
//! An action may also name `agent` (the queue of external agents that execute it; it must
//! then be a state's auto action) and `lock` (a duration: how long an agent holds a task
//! before it is offered again, default 1m). Any unknown key is an error.
//!
//! ```
//! let text = r#"
//! initial = "closed"
//! [states.closed]
//! [states.open]
//! [events.open]
//! in = ["closed"]
//! action = "do_open"
//! [events.close]
//! in = ["open"]
//! action = "do_close"
//! [events.auto_close]
//! in = ["open"]
//! action = "do_close"
//! [timers.close_again]
//! event = "auto_close"
//! after = "5m"
//! in = ["open"]
//! [actions.do_open]
//! to = ["open"]
//! [actions.do_close]
//! to = ["closed"]
//! "#;
//! let def = settle_core::toml::parse("door", text).unwrap();
//! assert_eq!(def.name, "door");
//! assert_eq!(def.states[1].origin.line, Some(4));
//! let (machine, warnings) = settle_core::toml::load("door.toml", "door", text).unwrap();
//! assert_eq!(machine.initial().name, "closed");
//! assert!(warnings.diagnostics.is_empty());
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use ::toml::Spanned;
use serde::Deserialize;
use serde::de::{self, SeqAccess, Visitor};

use crate::duration;
use crate::machine::{
    ActionDef, CalendarCreate, CalendarDef, CreateDef, EventDef, FaultDef, Health, History, LimitDef, Machine,
    MachineDef, MigrateDef, Origin, RaiseDef, RetentionDef, StateDef, StateKind, TimerDef, WhenDef,
};
use crate::retention::Keep;
use crate::validate::{Diagnostic, Report, Severity};

/// Parses one machine definition. `file_stem` is the machine's name unless the file sets
/// `name`. The definition is not validated: see [`load`] or [`Machine::from_def`].
///
/// Errors: a syntax or type error (one diagnostic on the item "file"), or every bad
/// duration and unsupported key found.
pub fn parse(file_stem: &str, text: &str) -> Result<MachineDef, Report> {
    let (def, diagnostics) = parse_lenient(file_stem, text)?;
    if diagnostics.is_empty() { Ok(def) } else { Err(Report { diagnostics }) }
}

/// Parses and validates one machine definition, read from `path_display` (used as the
/// `file` of every diagnostic). Returns the machine with its warnings, or every problem
/// found: those of parsing and, unless the file could not be read as TOML at all, those
/// of validation.
///
/// Diagnostics come errors first, then warnings, each in line order.
pub fn load(path_display: &str, file_stem: &str, text: &str) -> Result<(Machine, Report), Report> {
    let (def, mut diagnostics) = parse_lenient(file_stem, text).map_err(|r| r.with_file(path_display))?;
    let finish = |mut diagnostics: Vec<Diagnostic>| {
        diagnostics.sort_by_key(|d| (d.severity, d.line));
        Report { diagnostics }.with_file(path_display)
    };
    match Machine::from_def(&def) {
        Ok((machine, warnings)) if diagnostics.is_empty() => Ok((machine, finish(warnings.diagnostics))),
        Ok((_, report)) | Err(report) => {
            diagnostics.extend(report.diagnostics);
            Err(finish(diagnostics))
        }
    }
}

/// Parses what can be parsed. `Err` only when the text is not a machine file at all
/// (syntax or type error); otherwise the definition comes back with the problems found
/// in it (bad durations, unsupported keys), which leave the affected value out (a timer
/// whose `every` or `after` is not a duration is left out whole; a fault policy key that
/// is not a duration is left undeclared).
fn parse_lenient(file_stem: &str, text: &str) -> Result<(MachineDef, Vec<Diagnostic>), Report> {
    let file: FileToml = ::toml::from_str(text).map_err(|e| {
        let line = e.span().map(|s| line_of(text, s.start));
        Report {
            diagnostics: vec![Diagnostic {
                severity: Severity::Error,
                file: None,
                line,
                machine: file_stem.to_string(),
                item: "file".to_string(),
                message: tidy_message(e.message()),
            }],
        }
    })?;
    let name = file.name.as_ref().map_or_else(|| file_stem.to_string(), |n| n.get_ref().clone());
    let mut p = Parser { text, machine: name.clone(), diagnostics: Vec::new() };
    let mut def = MachineDef {
        name,
        initial: file.initial.as_ref().map(|i| i.get_ref().clone()),
        initial_origin: Origin { line: file.initial.as_ref().map(|i| line_of(text, i.span().start)) },
        properties: file.properties,
        cascade: file.cascade,
        upgrade: file.upgrade,
        cancel: file.cancel,
        delete: file.delete,
        origin: Origin { line: Some(1) },
        ..MachineDef::default()
    };
    for (key, state) in in_order(file.states) {
        def.states.push(p.state(key, state));
    }
    for (key, event) in in_order(file.events) {
        def.events.push(p.event(key, event));
    }
    for (key, action) in in_order(file.actions) {
        def.actions.push(p.action(key, action));
    }
    for (key, timer) in in_order(file.timers) {
        def.timers.extend(p.timer(key, timer));
    }
    for (key, schedule) in in_order(file.schedules) {
        def.schedules.extend(p.schedule(key, schedule));
    }
    for (key, limit) in in_order(file.limits) {
        def.limits.extend(p.limit(key, limit));
    }
    def.fault = file.fault.map(|f| p.fault(f));
    def.retention = file.retention.map(|r| p.retention(r));
    def.migrate = in_order(file.migrate)
        .into_iter()
        .map(|(from, to)| MigrateDef { origin: Origin { line: p.line(&from) }, from: from.into_inner(), to })
        .collect();
    let mut diagnostics = p.diagnostics;
    diagnostics.sort_by_key(|d| d.line);
    Ok((def, diagnostics))
}

/// The entries of a TOML table in the order they appear in the file.
fn in_order<T>(table: BTreeMap<Spanned<String>, T>) -> Vec<(Spanned<String>, T)> {
    let mut entries: Vec<_> = table.into_iter().collect();
    entries.sort_by_key(|(k, _)| k.span().start);
    entries
}

/// The 1-based line of byte `offset` in `text`.
fn line_of(text: &str, offset: usize) -> u32 {
    let end = offset.min(text.len());
    let newlines = text.as_bytes()[..end].iter().filter(|&&b| b == b'\n').count();
    u32::try_from(newlines + 1).unwrap_or(u32::MAX)
}

/// The first line of a TOML error message, starting lowercase, without a trailing period.
fn tidy_message(message: &str) -> String {
    let first = message.lines().find(|l| !l.trim().is_empty()).unwrap_or("invalid toml").trim();
    let first = first.trim_end_matches('.');
    let mut chars = first.chars();
    match (chars.next(), chars.next()) {
        // Lowercase "Invalid" but keep acronyms such as "TOML".
        (Some(c), Some(d)) if c.is_uppercase() && !d.is_uppercase() => {
            c.to_lowercase().chain(first[c.len_utf8()..].chars()).collect()
        }
        _ => first.to_string(),
    }
}

struct Parser<'t> {
    text: &'t str,
    machine: String,
    diagnostics: Vec<Diagnostic>,
}

impl Parser<'_> {
    fn line<T>(&self, spanned: &Spanned<T>) -> Option<u32> {
        Some(line_of(self.text, spanned.span().start))
    }

    fn error(&mut self, item: &str, line: Option<u32>, message: String) {
        self.diagnostics.push(Diagnostic {
            severity: Severity::Error,
            file: None,
            line,
            machine: self.machine.clone(),
            item: item.to_string(),
            message,
        });
    }

    fn duration(&mut self, item: &str, value: &Spanned<String>) -> Option<Duration> {
        match duration::parse(value.get_ref()) {
            Ok(d) => Some(d),
            Err(message) => {
                let line = self.line(value);
                self.error(item, line, message);
                None
            }
        }
    }

    fn keep(&mut self, item: &str, value: &Spanned<String>) -> Option<Keep> {
        match Keep::parse(value.get_ref()) {
            Ok(k) => Some(k),
            Err(message) => {
                let line = self.line(value);
                self.error(item, line, message);
                None
            }
        }
    }

    fn retention(&mut self, retention: Spanned<RetentionToml>) -> RetentionDef {
        let origin = Origin { line: self.line(&retention) };
        let retention = retention.into_inner();
        let ended = retention.ended.as_ref().and_then(|k| self.keep("retention", k));
        let history = retention.history.as_ref().and_then(|k| self.keep("retention", k));
        let history_rows = match retention.history_rows {
            Some(n) if *n.get_ref() >= 1 && *n.get_ref() <= i64::from(u32::MAX) => Some(*n.get_ref() as u32),
            Some(n) => {
                let line = self.line(&n);
                self.error(
                    "retention",
                    line,
                    format!("`history_rows` must be at least 1 (the latest row is always kept), not {}", n.get_ref()),
                );
                None
            }
            None => None,
        };
        RetentionDef { ended, archive: retention.archive, history, history_rows, origin }
    }

    fn state(&mut self, key: Spanned<String>, state: StateToml) -> StateDef {
        let item = format!("state `{}`", key.get_ref());
        StateDef {
            retain: state.retain.as_ref().and_then(|k| self.keep(&item, k)),
            kind: state.kind.map(|k| match k {
                KindToml::Stable => StateKind::Stable,
                KindToml::Unstable => StateKind::Unstable,
                KindToml::Terminal => StateKind::Terminal,
                KindToml::Deleted => StateKind::Deleted,
            }),
            auto: state.auto.map(|a| a.0).unwrap_or_default(),
            wait: state.wait.as_ref().and_then(|w| self.duration(&item, w)),
            health: match state.health {
                Some(HealthToml::Error) => Health::Error,
                Some(HealthToml::Ok) | None => Health::Ok,
            },
            requires: state.requires,
            initial: matches!(state.initial, Some(InitialToml::Flag(true))),
            initial_child: match state.initial {
                Some(InitialToml::Child(child)) => Some(child),
                _ => None,
            },
            parent: state.parent,
            history: state.history.map(|h| match h {
                HistoryToml::Shallow => History::Shallow,
                HistoryToml::Deep => History::Deep,
            }),
            on_entry: state.on_entry.map(|a| a.0).unwrap_or_default(),
            on_exit: state.on_exit.map(|a| a.0).unwrap_or_default(),
            on_entry_from: in_order(state.on_entry_from).into_iter().map(|(e, a)| (e.into_inner(), a.0)).collect(),
            renamed_from: state.renamed_from,
            origin: Origin { line: self.line(&key) },
            name: key.into_inner(),
        }
    }

    fn event(&mut self, key: Spanned<String>, event: EventToml) -> EventDef {
        let item = format!("event `{}`", key.get_ref());
        let timeout = event.timeout.and_then(|t| {
            let after = self.duration(&item, &t.after)?;
            Some((after, t.event))
        });
        let when = event
            .when
            .into_iter()
            .map(|w| {
                let origin = Origin { line: self.line(&w) };
                let w = w.into_inner();
                WhenDef {
                    valid_in: w.valid_in,
                    guard: w.guard,
                    action: w.action,
                    reject: w.reject,
                    ignore: w.ignore,
                    origin,
                }
            })
            .collect();
        EventDef {
            valid_in: event.valid_in,
            action: event.action.unwrap_or_default(),
            when,
            ignore: event.ignore,
            internal: event.internal,
            priority: event.priority,
            params: event.params,
            reject: in_order(event.reject).into_iter().map(|(s, r)| (s.into_inner(), r)).collect(),
            subscribe: event.subscribe,
            timeout,
            origin: Origin { line: self.line(&key) },
            name: key.into_inner(),
        }
    }

    /// `None` when `every` or `after` is not a duration (reported here).
    fn timer(&mut self, key: Spanned<String>, timer: TimerToml) -> Option<TimerDef> {
        let item = format!("timer `{}`", key.get_ref());
        let every = timer.every.as_ref().map(|d| self.duration(&item, d));
        let after = timer.after.as_ref().map(|d| self.duration(&item, d));
        if every == Some(None) || after == Some(None) {
            return None;
        }
        Some(TimerDef {
            event: timer.event,
            every: every.flatten(),
            after: after.flatten(),
            valid_in: timer.valid_in,
            origin: Origin { line: self.line(&key) },
            name: key.into_inner(),
        })
    }

    /// `None` when `jitter` is not a duration (reported here).
    fn schedule(&mut self, key: Spanned<String>, s: ScheduleToml) -> Option<CalendarDef> {
        let item = format!("schedule `{}`", key.get_ref());
        let jitter = match &s.jitter {
            Some(d) => Some(self.duration(&item, d)?),
            None => None,
        };
        Some(CalendarDef {
            cron: s.cron,
            zone: s.zone,
            raise: s.raise,
            valid_in: s.valid_in,
            create: s.create.map(|c| CalendarCreate {
                key: c.key,
                properties: c.properties.into_iter().map(|(k, v)| (k, toml_to_json(v))).collect(),
            }),
            overlap: s.overlap,
            catch_up: s.catch_up,
            catch_up_limit: s.catch_up_limit,
            jitter_ms: jitter.map(|d| d.as_millis() as u64),
            rate: s.rate,
            origin: Origin { line: self.line(&key) },
            name: key.into_inner(),
        })
    }

    /// `None` when `per` is not a duration (reported here).
    fn limit(&mut self, key: Spanned<String>, l: LimitToml) -> Option<LimitDef> {
        let item = format!("limit `{}`", key.get_ref());
        let per_ms = match &l.per {
            Some(d) => Some(self.duration(&item, d)?.as_millis() as u64),
            None => None,
        };
        Some(LimitDef {
            states: l.states,
            events: l.events,
            max: l.max,
            rate: l.rate,
            per_ms,
            key: l.key,
            fair_by: l.fair_by,
            origin: Origin { line: self.line(&key) },
            name: key.into_inner(),
        })
    }

    fn fault(&mut self, fault: Spanned<FaultToml>) -> FaultDef {
        let origin = Origin { line: self.line(&fault) };
        let fault = fault.into_inner();
        let item = "fault policy";
        let backoff = fault.backoff.unwrap_or_default();
        FaultDef {
            max_errors: fault.max_errors,
            window: fault.window.as_ref().and_then(|w| self.duration(item, w)),
            backoff_min: backoff.min.as_ref().and_then(|d| self.duration(item, d)),
            backoff_max: backoff.max.as_ref().and_then(|d| self.duration(item, d)),
            origin,
        }
    }

    fn action(&mut self, key: Spanned<String>, action: ActionToml) -> ActionDef {
        let item = format!("action `{}`", key.get_ref());
        let lock = action.lock.as_ref().and_then(|l| self.duration(&item, l));
        let target_waits = in_order(action.wait)
            .into_iter()
            .filter_map(|(target, wait)| self.duration(&item, &wait).map(|d| (target.into_inner(), d)))
            .collect();
        let raise = action
            .raise
            .into_iter()
            .map(|r| RaiseDef {
                event: r.event,
                on: r.on,
                machine: r.machine,
                key: r.key,
                params: r.params.map_or(serde_json::Value::Null, toml_to_json),
                reply: r.reply,
            })
            .collect();
        let create = action
            .create
            .into_iter()
            .map(|c| CreateDef {
                machine: c.machine,
                key: c.key,
                properties: in_order(c.properties)
                    .into_iter()
                    .map(|(k, v)| (k.into_inner(), toml_to_json(v)))
                    .collect(),
                event: c.event,
                params: c.params.map_or(serde_json::Value::Null, toml_to_json),
                reply: c.reply,
            })
            .collect();
        ActionDef {
            targets: action.to,
            target_waits,
            agent: action.agent.map(Spanned::into_inner),
            lock,
            set: in_order(action.set)
                .into_iter()
                .map(|(k, v)| (k.into_inner(), toml_to_json(v)))
                .chain(action.unset.into_iter().map(|k| (k, serde_json::Value::Null)))
                .collect(),
            raise,
            create,
            may_create: action.may_create,
            may_raise: action.may_raise,
            origin: Origin { line: self.line(&key) },
            name: key.into_inner(),
        }
    }
}

/// A whole file.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileToml {
    name: Option<Spanned<String>>,
    initial: Option<Spanned<String>>,
    #[serde(default)]
    states: BTreeMap<Spanned<String>, StateToml>,
    #[serde(default)]
    events: BTreeMap<Spanned<String>, EventToml>,
    #[serde(default)]
    actions: BTreeMap<Spanned<String>, ActionToml>,
    #[serde(default)]
    timers: BTreeMap<Spanned<String>, TimerToml>,
    #[serde(default)]
    schedules: BTreeMap<Spanned<String>, ScheduleToml>,
    #[serde(default)]
    limits: BTreeMap<Spanned<String>, LimitToml>,
    fault: Option<Spanned<FaultToml>>,
    retention: Option<Spanned<RetentionToml>>,
    #[serde(default)]
    migrate: BTreeMap<Spanned<String>, String>,
    #[serde(default)]
    properties: Vec<String>,
    #[serde(default)]
    cascade: Vec<String>,
    upgrade: Option<String>,
    cancel: Option<String>,
    delete: Option<String>,
}

/// A TOML value as JSON (a declarative action's `set` and `raise` parameters).
fn toml_to_json(v: ::toml::Value) -> serde_json::Value {
    use ::toml::Value as T;
    match v {
        T::String(s) => s.into(),
        T::Integer(i) => i.into(),
        T::Float(f) => serde_json::Number::from_f64(f).map_or(serde_json::Value::Null, serde_json::Value::Number),
        T::Boolean(b) => b.into(),
        T::Datetime(d) => d.to_string().into(),
        T::Array(items) => items.into_iter().map(toml_to_json).collect(),
        T::Table(t) => t.into_iter().map(|(k, v)| (k, toml_to_json(v))).collect::<serde_json::Map<_, _>>().into(),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitToml {
    #[serde(default)]
    states: Vec<String>,
    #[serde(default)]
    events: Vec<String>,
    max: Option<u32>,
    rate: Option<u32>,
    per: Option<Spanned<String>>,
    key: Option<String>,
    fair_by: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FaultToml {
    max_errors: Option<u32>,
    window: Option<Spanned<String>>,
    backoff: Option<BackoffToml>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RetentionToml {
    ended: Option<Spanned<String>>,
    archive: Option<bool>,
    history: Option<Spanned<String>>,
    history_rows: Option<Spanned<i64>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct BackoffToml {
    min: Option<Spanned<String>>,
    max: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StateToml {
    kind: Option<KindToml>,
    auto: Option<Names>,
    wait: Option<Spanned<String>>,
    health: Option<HealthToml>,
    #[serde(default)]
    requires: Vec<String>,
    initial: Option<InitialToml>,
    parent: Option<String>,
    history: Option<HistoryToml>,
    on_entry: Option<Names>,
    on_exit: Option<Names>,
    #[serde(default)]
    on_entry_from: BTreeMap<Spanned<String>, Names>,
    #[serde(default)]
    renamed_from: Vec<String>,
    retain: Option<Spanned<String>>,
}

/// A state's `initial`: `true` on the machine's initial state, or on a parent the name of
/// its initial child.
#[derive(Deserialize)]
#[serde(untagged)]
enum InitialToml {
    Flag(bool),
    Child(String),
}

#[derive(Deserialize)]
#[serde(rename_all = "lowercase")]
enum KindToml {
    Stable,
    Unstable,
    Terminal,
    Deleted,
}

#[derive(Deserialize)]
#[serde(rename_all = "lowercase")]
enum HistoryToml {
    Shallow,
    Deep,
}

#[derive(Deserialize)]
#[serde(rename_all = "lowercase")]
enum HealthToml {
    Ok,
    Error,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EventToml {
    #[serde(rename = "in")]
    valid_in: Vec<String>,
    action: Option<String>,
    #[serde(default)]
    when: Vec<Spanned<WhenToml>>,
    #[serde(default)]
    ignore: Vec<String>,
    #[serde(default)]
    internal: bool,
    priority: Option<i64>,
    #[serde(default)]
    params: Vec<String>,
    #[serde(default)]
    reject: BTreeMap<Spanned<String>, String>,
    subscribe: Option<String>,
    timeout: Option<TimeoutToml>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WhenToml {
    #[serde(rename = "in", default)]
    valid_in: Vec<String>,
    guard: Option<String>,
    action: Option<String>,
    reject: Option<String>,
    #[serde(default)]
    ignore: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TimeoutToml {
    after: Spanned<String>,
    event: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TimerToml {
    event: String,
    every: Option<Spanned<String>>,
    after: Option<Spanned<String>>,
    #[serde(rename = "in")]
    valid_in: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ScheduleToml {
    cron: String,
    zone: Option<String>,
    raise: Option<String>,
    #[serde(rename = "in", default)]
    valid_in: Vec<String>,
    create: Option<ScheduleCreateToml>,
    overlap: Option<String>,
    catch_up: Option<String>,
    catch_up_limit: Option<u32>,
    jitter: Option<Spanned<String>>,
    rate: Option<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ScheduleCreateToml {
    key: Option<String>,
    #[serde(default)]
    properties: BTreeMap<String, ::toml::Value>,
}

/// An action. Keys of features still to come are accepted here only to be refused with a
/// clear message.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ActionToml {
    #[serde(default)]
    to: Vec<String>,
    #[serde(default)]
    wait: BTreeMap<Spanned<String>, Spanned<String>>,
    agent: Option<Spanned<String>>,
    lock: Option<Spanned<String>>,
    #[serde(default)]
    set: BTreeMap<Spanned<String>, ::toml::Value>,
    #[serde(default)]
    unset: Vec<String>,
    #[serde(default)]
    raise: Vec<RaiseToml>,
    #[serde(default)]
    create: Vec<CreateToml>,
    may_create: Option<Vec<String>>,
    may_raise: Option<Vec<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateToml {
    machine: String,
    key: String,
    #[serde(default)]
    properties: BTreeMap<Spanned<String>, ::toml::Value>,
    event: Option<String>,
    params: Option<::toml::Value>,
    reply: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RaiseToml {
    event: String,
    #[serde(default)]
    on: String,
    machine: Option<String>,
    key: Option<String>,
    params: Option<::toml::Value>,
    reply: Option<String>,
}

/// One name or an array of names (`auto = "x"` or `auto = ["x", "y"]`).
struct Names(Vec<String>);

impl<'de> Deserialize<'de> for Names {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct NamesVisitor;
        impl<'de> Visitor<'de> for NamesVisitor {
            type Value = Names;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an action name or an array of action names")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Names, E> {
                Ok(Names(vec![v.to_string()]))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Names, A::Error> {
                let mut names = Vec::new();
                while let Some(n) = seq.next_element::<String>()? {
                    names.push(n);
                }
                Ok(Names(names))
            }
        }
        deserializer.deserialize_any(NamesVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fault::FaultPolicy;
    use crate::fixtures;
    use crate::machine::{MachineBuilder, Schedule};

    fn errors(file_stem: &str, text: &str) -> Vec<String> {
        match parse(file_stem, text) {
            Ok(def) => panic!("expected errors, parsed {def:?}"),
            Err(report) => report.diagnostics.iter().map(ToString::to_string).collect(),
        }
    }

    #[test]
    fn parses_items_in_declaration_order_with_lines() {
        let def = parse("ignored", fixtures::SERVER).unwrap();
        assert_eq!(def.name, "server");
        assert_eq!(def.initial.as_deref(), Some("new"));
        assert_eq!(def.initial_origin.line, Some(2));
        let states: Vec<(&str, Option<u32>)> = def.states.iter().map(|s| (s.name.as_str(), s.origin.line)).collect();
        assert_eq!(
            states,
            [("new", Some(4)), ("creating", Some(5)), ("ready", Some(8)), ("failed", Some(10)), ("gone", Some(13))]
        );
        assert_eq!(def.states[1].auto, ["create_resources"]);
        assert_eq!(def.states[1].wait, Some(Duration::ZERO));
        assert_eq!(def.states[2].requires, ["endpoint"]);
        assert_eq!((def.states[3].health, def.states[3].auto.as_slice()), (Health::Error, &["undo".to_string()][..]));
        assert_eq!(def.states[4].kind, Some(StateKind::Deleted));
        let create = &def.events[0];
        assert_eq!((create.name.as_str(), create.origin.line), ("create", Some(16)));
        assert_eq!(create.valid_in, ["new"]);
        assert_eq!(create.params, ["region"]);
        let reject =
            [("ready".to_string(), "already exists".to_string()), ("creating".into(), "already in progress".into())];
        assert_eq!(create.reject, reject);
        assert_eq!((def.events[1].name.as_str(), def.events[1].origin.line), ("delete", Some(24)));
        let actions: Vec<(&str, Option<u32>)> = def.actions.iter().map(|a| (a.name.as_str(), a.origin.line)).collect();
        assert_eq!(actions, [("begin_create", Some(28)), ("create_resources", Some(30)), ("undo", Some(33))]);
        assert_eq!(
            def.actions[1].target_waits,
            [("failed".to_string(), Duration::from_secs(1)), ("creating".to_string(), Duration::from_secs(5))]
        );
    }

    #[test]
    fn toml_and_builder_produce_equal_machines() {
        let (from_toml, warnings) = load("server.toml", "server", fixtures::SERVER).unwrap();
        assert_eq!(warnings, Report::default());
        let from_builder = fixtures::server().build().unwrap();
        assert_eq!(from_toml, from_builder);
        assert_eq!(from_toml.content_hash(), from_builder.content_hash());
    }

    #[test]
    fn name_defaults_to_the_file_stem_and_initial_may_be_a_state_flag() {
        let def = parse("door", "[states.closed]\ninitial = true\n[states.open]\nkind = \"terminal\"\n").unwrap();
        assert_eq!(def.name, "door");
        assert_eq!(def.initial, None);
        assert!(def.states[0].initial);
        assert_eq!(def.states[1].kind, Some(StateKind::Terminal));
        assert_eq!(def.origin.line, Some(1));
    }

    #[test]
    fn syntax_errors_are_one_diagnostic_with_a_line() {
        assert_eq!(
            errors("door", "initial = \"closed\"\n[states.closed\n"),
            ["line 2: error: machine `door`, file: unclosed table, expected `]`"]
        );
        assert_eq!(errors("door", "[states.a]\n[states.a]\n"), ["line 2: error: machine `door`, file: duplicate key"]);
    }

    #[test]
    fn unknown_keys_and_wrong_types_are_errors_with_a_line() {
        assert_eq!(
            errors("door", "[states.closed]\nkind = \"stable\"\ncolour = \"red\"\n"),
            [
                "line 3: error: machine `door`, file: unknown field `colour`, expected one of `kind`, `auto`, `wait`, `health`, `requires`, `initial`, `parent`, `history`, `on_entry`, `on_exit`, `on_entry_from`, `renamed_from`, `retain`"
            ]
        );
        assert_eq!(
            errors("door", "[states.closed]\nkind = \"solid\"\n"),
            [
                "line 2: error: machine `door`, file: unknown variant `solid`, expected one of `stable`, `unstable`, `terminal`, `deleted`"
            ]
        );
        assert_eq!(
            errors("door", "[states.closed]\nauto = 3\n"),
            [
                "line 2: error: machine `door`, file: invalid type: integer `3`, expected an action name or an array of action names"
            ]
        );
        let no_action =
            load("door.toml", "door", "initial = \"closed\"\n[states.closed]\n[events.open]\nin = [\"closed\"]\n");
        assert_eq!(
            no_action.unwrap_err().diagnostics[0].to_string(),
            "door.toml:3: error: machine `door`, event `open`: no action: declare `action`, or alternatives in `[[events.open.when]]`"
        );
        assert_eq!(
            errors("door", "naem = \"door\"\n"),
            [
                "line 1: error: machine `door`, file: unknown field `naem`, expected one of `name`, `initial`, `states`, `events`, `actions`, `timers`, `schedules`, `limits`, `fault`, `retention`, `migrate`, `properties`, `cascade`, `upgrade`, `cancel`, `delete`"
            ]
        );
    }

    #[test]
    fn what_an_action_may_create_and_raise_loads_is_stored_and_is_checked() {
        let text = r#"name = "server"
initial = "creating"
[states.creating]
auto = "create"
[states.ready]
kind = "terminal"
[actions.create]
to = ["ready", "creating"]
agent = "provisioner"
may_create = ["app", "dns"]
may_raise = ["start"]
[actions.tell]
to = ["ready"]
raise = [{ event = "start", on = "successors" }]
may_raise = ["start"]
"#;
        let (m, report) = load("server.toml", "server", text).expect("loads");
        assert!(!report.has_errors(), "{report}");
        let create = m.action("create").unwrap();
        assert_eq!(create.may_create.as_deref(), Some(&["app".into(), "dns".into()][..]));
        assert_eq!(create.may_raise.as_deref(), Some(&["start".into()][..]));
        assert_eq!(m.action("tell").unwrap().may_create, None, "not declared");
        let stored = Machine::from_canonical_json(&m.canonical_json()).expect("reads back");
        assert_eq!(stored, m);
        let (written, _) = load("w.toml", "server", &m.to_toml()).expect("its rendering loads");
        assert_eq!(written, m);
        // A declarative `raise` beyond its own `may_raise`, and a name listed twice.
        let beyond = text.replace("may_raise = [\"start\"]\n\"#", "").replace(
            "raise = [{ event = \"start\", on = \"successors\" }]\nmay_raise = [\"start\"]",
            "raise = [{ event = \"start\", on = \"successors\" }]\nmay_raise = []",
        );
        let refused = |text: &str| -> Vec<String> {
            let report = load("x.toml", "server", text).expect_err("refused");
            report
                .diagnostics
                .iter()
                .filter(|d| d.severity == crate::Severity::Error)
                .map(ToString::to_string)
                .collect()
        };
        let errs = refused(&beyond);
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(
            errs[0].contains("12")
                && errs[0].ends_with("action `tell`: `raise` of `start`: not among the events it `may_raise` (none)"),
            "{errs:?}"
        );
        let twice = text.replace(r#"may_create = ["app", "dns"]"#, r#"may_create = ["app", "app"]"#);
        let errs = refused(&twice);
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(errs[0].contains("`may_create`") && errs[0].contains("`app`"), "{errs:?}");
    }

    #[test]
    fn agent_bindings_load_with_their_lock() {
        let text = r#"name = "server"
initial = "creating"
[states.creating]
auto = "create"
[states.ready]
[actions.create]
to = ["ready", "creating"]
agent = "provisioner"
lock = "2m"
"#;
        let (m, report) = load("server.toml", "server", text).expect("loads");
        assert!(!report.has_errors());
        let binding = m.action("create").and_then(|a| a.agent.clone()).expect("bound");
        assert_eq!((binding.queue.as_str(), binding.lock), ("provisioner", Duration::from_secs(120)));
        assert_eq!(m.actions_needing_handlers().count(), 0, "an agent executes it");
        assert_eq!(
            errors("x", &text.replace("\"2m\"", "\"two minutes\"")),
            [
                "line 9: error: machine `server`, action `create`: invalid duration `two minutes` (expected e.g. `500ms`, `5s`, `10m`, `1h30m`)"
            ]
        );
    }

    #[test]
    fn parses_subscriptions_and_timers_with_lines() {
        let def = parse("x", fixtures::SUBSCRIBER).unwrap();
        let ready = &def.events[0];
        assert_eq!(ready.subscribe.as_deref(), Some("all(*) in [ready]"));
        assert_eq!(ready.timeout, Some((Duration::from_secs(600), "resources_timeout".to_string())));
        assert_eq!(def.events[1].subscribe.as_deref(), Some("any(*)  health error"));
        assert_eq!((def.events[1].timeout.as_ref(), def.events[2].subscribe.as_ref()), (None, None));
        let timers: Vec<(&str, Option<u32>)> = def.timers.iter().map(|t| (t.name.as_str(), t.origin.line)).collect();
        assert_eq!(timers, [("health", Some(28)), ("retry", Some(33))]);
        let health = &def.timers[0];
        assert_eq!(
            (health.event.as_str(), health.every, health.after, health.valid_in.as_slice()),
            ("check", Some(Duration::from_secs(300)), None, &["ready".to_string()][..])
        );
        assert_eq!((def.timers[1].every, def.timers[1].after), (None, Some(Duration::from_secs(5400))));

        let (m, warnings) = load("server.toml", "server", fixtures::SUBSCRIBER).unwrap();
        assert_eq!(warnings, Report::default());
        let sub = m.event("resources_ready").unwrap().subscribe.as_ref().unwrap();
        assert_eq!(sub.pattern.to_string(), "all(*) in [ready]");
        let timeout = sub.timeout.as_ref().unwrap();
        assert_eq!((timeout.after, timeout.event.as_str()), (Duration::from_secs(600), "resources_timeout"));
        // The pattern is kept parsed: spacing does not matter.
        let failed = m.event("resources_failed").unwrap().subscribe.as_ref().unwrap();
        assert_eq!(failed.pattern.to_string(), "any(*) health error");
        let subs: Vec<&str> = m.subscriptions_in("waiting").map(|e| e.name.as_str()).collect();
        assert_eq!(subs, ["resources_ready", "resources_failed"]);
        assert_eq!(m.subscriptions_in("ready").count(), 0);
        assert_eq!(
            m.timers_in("ready").map(|t| (t.name.as_str(), t.schedule)).collect::<Vec<_>>(),
            [("health", Schedule::Every(Duration::from_secs(300)))]
        );
        assert_eq!(
            m.timers_in("failed").map(|t| t.schedule).collect::<Vec<_>>(),
            [Schedule::After(Duration::from_secs(5400))]
        );
        assert_eq!(m.timers_in("waiting").count(), 0);
        assert_eq!(
            (m.health_of("failed"), m.health_of("ready"), m.health_of("nowhere")),
            (Health::Error, Health::Ok, Health::Ok)
        );
    }

    #[test]
    fn toml_and_builder_produce_equal_machines_with_subscriptions_and_timers() {
        let (from_toml, _) = load("server.toml", "server", fixtures::SUBSCRIBER).unwrap();
        let builder = fixtures::subscriber();
        let from_builder = builder.clone().build().unwrap();
        assert_eq!(from_toml, from_builder);
        assert_eq!(from_toml.canonical_json(), from_builder.canonical_json());
        assert_eq!(from_toml.content_hash(), from_builder.content_hash());
        // Subscriptions and timers are part of the definition's version.
        let json = from_toml.canonical_json();
        assert!(json.contains(r#""subscribe":"all(*) in [ready]""#), "{json}");
        assert!(json.contains(r#""timeout":{"after_ms":600000,"event":"resources_timeout"}"#), "{json}");
        assert!(
            json.contains(r#""timers":[{"event":"check","every_ms":300000,"in":["ready"],"name":"health"}"#),
            "{json}"
        );
        let other = |b: MachineBuilder| b.build().unwrap().content_hash();
        let base = other(builder.clone());
        assert_ne!(base, other(builder.clone().timer("t", "check", Schedule::After(Duration::ZERO), ["ready"])));
        let mut def = builder.def().clone();
        def.events[0].timeout = None;
        assert_ne!(base, Machine::from_def(&def).unwrap().0.content_hash());
        def.events[0].subscribe = Some("all(*) in [failed]".into());
        assert_ne!(base, Machine::from_def(&def).unwrap().0.content_hash());
    }

    #[test]
    fn subscription_and_timer_keys_are_checked() {
        assert_eq!(
            errors("m", "[events.e]\nin = []\naction = \"a\"\ntimeout = { after = \"10m\" }\n"),
            ["line 4: error: machine `m`, file: missing field `event`"]
        );
        assert_eq!(
            errors(
                "m",
                "[events.e]\nin = []\naction = \"a\"\ntimeout = { after = \"1m\", event = \"t\", every = \"1m\" }\n"
            ),
            ["line 4: error: machine `m`, file: unknown field `every`, expected `after` or `event`"]
        );
        assert_eq!(
            errors("m", "[events.e]\nin = []\naction = \"a\"\nsubscribe = [\"all(*) in [a]\"]\n"),
            ["line 4: error: machine `m`, file: invalid type: sequence, expected a string"]
        );
        assert_eq!(
            errors("m", "[timers.t]\nevent = \"e\"\nevery = \"1m\"\n"),
            ["line 1: error: machine `m`, file: missing field `in`"]
        );
        assert_eq!(
            errors("m", "[timers.t]\nevent = \"e\"\nin = []\ncron = \"* * * * *\"\n"),
            ["line 4: error: machine `m`, file: unknown field `cron`, expected one of `event`, `every`, `after`, `in`"]
        );
    }

    #[test]
    fn bad_durations_of_timeouts_and_timers_are_reported_on_their_line() {
        let text = r#"[events.e]
in = ["a"]
action = "go"
subscribe = "all(*) in [a]"
timeout = { after = "soon", event = "e" }
[timers.t]
event = "e"
in = ["a"]
every = "5 m"
[timers.u]
event = "e"
in = ["a"]
after = "later"
every = "1m"
"#;
        assert_eq!(
            errors("m", text),
            [
                "line 5: error: machine `m`, event `e`: invalid duration `soon` (expected e.g. `500ms`, `5s`, `10m`, `1h30m`)",
                "line 9: error: machine `m`, timer `t`: invalid duration `5 m` (expected e.g. `500ms`, `5s`, `10m`, `1h30m`)",
                "line 13: error: machine `m`, timer `u`: invalid duration `later` (expected e.g. `500ms`, `5s`, `10m`, `1h30m`)",
            ]
        );
        // The timer with a bad duration is left out, and the timeout with a bad delay.
        let (def, _) = parse_lenient("m", text).unwrap();
        assert_eq!(def.timers, []);
        assert_eq!(def.events[0].timeout, None);
    }

    #[test]
    fn bad_durations_are_reported_on_their_item() {
        let text = "[states.a]\nauto = \"go\"\nwait = \"soon\"\n[actions.go]\nto = [\"a\"]\nwait = { a = \"5 s\" }\n";
        assert_eq!(
            errors("m", text),
            [
                "line 3: error: machine `m`, state `a`: invalid duration `soon` (expected e.g. `500ms`, `5s`, `10m`, `1h30m`)",
                "line 6: error: machine `m`, action `go`: invalid duration `5 s` (expected e.g. `500ms`, `5s`, `10m`, `1h30m`)",
            ]
        );
    }

    #[test]
    fn load_reports_parse_and_validation_problems_together_with_the_file() {
        let text = "initial = \"a\"\n[states.a]\nwait = \"x\"\n[events.e]\nin = [\"a\"]\naction = \"nope\"\nsubscribe = \"all(*) in a\"\n[timers.t]\nevent = \"f\"\nevery = \"0s\"\nin = [\"a\"]\n";
        let report = load("machines/m.toml", "m", text).unwrap_err();
        assert_eq!(
            report.to_string(),
            "machines/m.toml:3: error: machine `m`, state `a`: invalid duration `x` (expected e.g. `500ms`, `5s`, `10m`, `1h30m`)\n\
             machines/m.toml:4: error: machine `m`, event `e`: `action` names unknown action `nope`\n\
             machines/m.toml:4: error: machine `m`, event `e`: `subscribe`: expected `[` after `in` at column 11\n\
             machines/m.toml:8: error: machine `m`, timer `t`: `event` names unknown event `f`\n\
             machines/m.toml:8: error: machine `m`, timer `t`: `every` is zero (a timer firing continuously is a busy loop)\n"
        );
        let report = load("m.toml", "m", "initial = \n").unwrap_err();
        assert_eq!(
            report.to_string(),
            "m.toml:1: error: machine `m`, file: string values must be quoted, expected literal string\n"
        );
        let (_, warnings) = load("m.toml", "m", "initial = \"a\"\n[states.a]\n").unwrap();
        assert_eq!(
            warnings.to_string(),
            "m.toml:2: warning: machine `m`, state `a`: no event leaves this stable state (declare `kind = \"terminal\"` if that is intended)\n"
        );
    }

    /// The door's events and actions, shared by the door definitions below (a macro, so
    /// that `concat!` can splice it into their text).
    macro_rules! door_moves {
        () => {
            r#"[events.open]
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
        };
    }

    /// A door with every fault-policy and upgrade key.
    const UPGRADED: &str = concat!(
        r#"initial = "closed"
[states.closed]
renamed_from = ["shut", "locked"]
[states.open]
renamed_from = ["ajar"]

"#,
        door_moves!(),
        r#"
[fault]
max_errors = 5
window = "1h"
backoff = { min = "500ms", max = "2m" }

[migrate]
jammed = "closed"
swinging = "open"
"#
    );

    fn upgraded_builder() -> MachineBuilder {
        MachineBuilder::new("door")
            .state("closed")
            .initial()
            .renamed_from(["shut", "locked"])
            .state("open")
            .renamed_from(["ajar"])
            .event("open", ["closed"], "do_open")
            .event("close", ["open"], "do_close")
            .action("do_open", ["open"])
            .action("do_close", ["closed"])
            .fault_policy(FaultPolicy {
                max_errors: 5,
                window: Duration::from_secs(3600),
                backoff_min: Duration::from_millis(500),
                backoff_max: Duration::from_secs(120),
            })
            .migrate("jammed", "closed")
            .migrate("swinging", "open")
    }

    #[test]
    fn parses_fault_policy_renames_and_migrations_with_lines() {
        let def = parse("door", UPGRADED).unwrap();
        assert_eq!(def.states[0].renamed_from, ["shut", "locked"]);
        assert_eq!(def.states[1].renamed_from, ["ajar"]);
        assert_eq!(
            def.fault,
            Some(FaultDef {
                max_errors: Some(5),
                window: Some(Duration::from_secs(3600)),
                backoff_min: Some(Duration::from_millis(500)),
                backoff_max: Some(Duration::from_secs(120)),
                origin: Origin { line: Some(18) },
            })
        );
        assert_eq!(
            def.migrate,
            [
                MigrateDef { from: "jammed".into(), to: "closed".into(), origin: Origin { line: Some(24) } },
                MigrateDef { from: "swinging".into(), to: "open".into(), origin: Origin { line: Some(25) } },
            ]
        );
        let (m, warnings) = load("door.toml", "door", UPGRADED).unwrap();
        assert_eq!(warnings, Report::default());
        assert_eq!(m.fault_policy().backoff(3), Duration::from_secs(2));
        let mapping = m.state_mapping();
        let mapping: Vec<(&str, &str)> = mapping.iter().map(|(old, new)| (old.as_str(), new.as_str())).collect();
        assert_eq!(
            mapping,
            [("ajar", "open"), ("jammed", "closed"), ("locked", "closed"), ("shut", "closed"), ("swinging", "open")]
        );
    }

    /// A bug whose end states are kept for different times.
    const RETAINED: &str = r#"initial = "open"
[states.open]
[states.fixed]
kind = "terminal"
[states.wontfix]
kind = "terminal"
retain = "90d"
[states.deleted]
kind = "deleted"
retain = "forever"
[events.fix]
in = ["open"]
action = "to_fixed"
[events.drop]
in = ["open"]
action = "to_wontfix"
[events.delete]
in = ["open"]
action = "to_deleted"
[actions.to_fixed]
to = ["fixed"]
[actions.to_wontfix]
to = ["wontfix"]
[actions.to_deleted]
to = ["deleted"]

[retention]
ended = "7d"
archive = true
history = "90d"
history_rows = 500
"#;

    #[test]
    fn end_states_are_kept_by_their_own_retain_the_machines_then_the_deployments() {
        use crate::retention::{Defaults, Keep};
        let day = |n: u64| Keep::For(Duration::from_secs(n * 86_400));
        let def = parse("bug", RETAINED).unwrap();
        assert_eq!(
            def.retention,
            Some(RetentionDef {
                ended: Some(day(7)),
                archive: Some(true),
                history: Some(day(90)),
                history_rows: Some(500),
                origin: Origin { line: Some(27) }
            })
        );
        assert_eq!(def.states[2].retain, Some(day(90)));
        let (m, warnings) = load("bug.toml", "bug", RETAINED).unwrap();
        assert_eq!(warnings, Report::default());
        let kept = |m: &Machine, d: &Defaults| -> Vec<(String, Keep)> {
            m.end_states_kept(d).into_iter().map(|(s, k)| (s.to_string(), k)).collect()
        };
        let expect = vec![("fixed".into(), day(7)), ("wontfix".into(), day(90)), ("deleted".into(), Keep::Forever)];
        assert_eq!(kept(&m, &Defaults::BUILT_IN), expect);
        // Without `[retention]`, the deployment's default fills in.
        let plain = load("bug.toml", "bug", RETAINED.split("\n[retention]").next().unwrap()).unwrap().0;
        assert_eq!(kept(&plain, &Defaults::BUILT_IN.with("ended=1d").unwrap())[0], ("fixed".into(), day(1)));
        // Part of the definition: its hash, the stored JSON and the TOML written back.
        assert_ne!(m.content_hash(), plain.content_hash());
        let json = m.canonical_json();
        assert!(
            json.contains(r#""retention":{"archive":true,"ended":604800000,"history":7776000000,"history_rows":500}"#),
            "{json}"
        );
        assert!(m.archives(false) && plain.archives(true) && !plain.archives(false));
        use crate::retention::History;
        assert_eq!(m.history_kept(&Defaults::BUILT_IN), History { age: day(90), rows: Some(500) });
        let plain_kept = plain.history_kept(&Defaults::BUILT_IN.with("history=30d").unwrap());
        assert_eq!(plain_kept, History { age: day(30), rows: None });
        assert!(plain.history_kept(&Defaults::BUILT_IN).keeps_all());
        assert!(json.contains(r#""retain":"forever""#), "{json}");
        assert_eq!(Machine::from_canonical_json(&json).unwrap(), m);
        assert_eq!(load("bug.toml", "bug", &m.to_toml()).unwrap().0, m);
        let built = MachineBuilder::new("bug")
            .state("open")
            .initial()
            .state("fixed")
            .kind(StateKind::Terminal)
            .state("wontfix")
            .kind(StateKind::Terminal)
            .retain(day(90))
            .state("deleted")
            .kind(StateKind::Deleted)
            .retain(Keep::Forever)
            .event("fix", ["open"], "to_fixed")
            .event("drop", ["open"], "to_wontfix")
            .event("delete", ["open"], "to_deleted")
            .action("to_fixed", ["fixed"])
            .action("to_wontfix", ["wontfix"])
            .action("to_deleted", ["deleted"])
            .retention_ended(day(7))
            .retention_archive(true)
            .retention_history(day(90), Some(500))
            .build()
            .unwrap();
        assert_eq!(built.content_hash(), m.content_hash());
    }

    #[test]
    fn retention_mistakes_are_reported_with_their_lines() {
        let text =
            RETAINED.replace("[states.open]\n", "[states.open]\nretain = \"1d\"\n").replace("\"7d\"", "\"a week\"");
        let text = text.replace("history_rows = 500", "history_rows = 0");
        let report = load("bug.toml", "bug", &text).unwrap_err();
        assert_eq!(
            report.to_string(),
            "bug.toml:2: error: machine `bug`, state `open`: `retain` applies to terminal and deleted states only (this one is \
             stable: its entities are live)\n\
             bug.toml:29: error: machine `bug`, retention: invalid duration `a week` (expected e.g. `500ms`, `5s`, `10m`, \
             `1h30m`), or `forever`\n\
             bug.toml:32: error: machine `bug`, retention: `history_rows` must be at least 1 (the latest row is always \
             kept), not 0\n"
        );
    }

    #[test]
    fn toml_and_builder_produce_equal_machines_with_fault_policy_and_upgrades() {
        let (from_toml, _) = load("door.toml", "door", UPGRADED).unwrap();
        let from_builder = upgraded_builder().build().unwrap();
        assert_eq!(from_toml, from_builder);
        assert_eq!(from_toml.content_hash(), from_builder.content_hash());
        let json = from_toml.canonical_json();
        assert!(
            json.contains(r#""fault":{"backoff":{"max_ms":120000,"min_ms":500},"max_errors":5,"window_ms":3600000}"#),
            "{json}"
        );
        assert!(json.contains(r#""migrate":{"jammed":"closed","swinging":"open"}"#), "{json}");
        assert!(json.contains(r#""renamed_from":["shut","locked"]"#), "{json}");
        // Each of them is part of the definition's version.
        let hash = |b: MachineBuilder| b.build().unwrap().content_hash();
        let base = hash(upgraded_builder());
        assert_ne!(base, hash(upgraded_builder().migrate("stuck", "open")));
        assert_ne!(base, hash(upgraded_builder().fault_policy(FaultPolicy::DEFAULT)));
        let mut def = upgraded_builder().def().clone();
        def.states[1].renamed_from.clear();
        assert_ne!(base, Machine::from_def(&def).unwrap().0.content_hash());
    }

    #[test]
    fn every_fault_key_is_optional() {
        let door = "initial = \"closed\"\n[states.closed]\nkind = \"terminal\"\n";
        let policy = |fault: &str| *load("door.toml", "door", &format!("{door}{fault}")).unwrap().0.fault_policy();
        assert_eq!(policy(""), FaultPolicy::DEFAULT);
        assert_eq!(policy("[fault]\n"), FaultPolicy::DEFAULT);
        assert_eq!(policy("[fault]\nmax_errors = 3\n"), FaultPolicy { max_errors: 3, ..FaultPolicy::DEFAULT });
        assert_eq!(
            policy("[fault]\nwindow = \"1d\"\n"),
            FaultPolicy { window: Duration::from_secs(86_400), ..FaultPolicy::DEFAULT }
        );
        assert_eq!(
            policy("[fault.backoff]\nmax = \"1h\"\n"),
            FaultPolicy { backoff_max: Duration::from_secs(3600), ..FaultPolicy::DEFAULT }
        );
        assert_eq!(
            policy("[fault]\nbackoff = { min = \"2s\" }\n"),
            FaultPolicy { backoff_min: Duration::from_secs(2), ..FaultPolicy::DEFAULT }
        );
        // Declared, even with default values: part of the hash. Not declared: not.
        let hash = |fault: &str| load("door.toml", "door", &format!("{door}{fault}")).unwrap().0.content_hash();
        assert_ne!(hash(""), hash("[fault]\n"));
    }

    #[test]
    fn fault_policy_problems_are_reported_on_its_line() {
        let door = "initial = \"closed\"\n[states.closed]\nkind = \"terminal\"\n";
        let problems = |fault: &str| -> Vec<String> {
            match load("door.toml", "door", &format!("{door}{fault}")) {
                Ok((m, _)) => panic!("expected errors, loaded {m:?}"),
                Err(report) => report.diagnostics.iter().map(ToString::to_string).collect(),
            }
        };
        assert_eq!(
            problems("[fault]\nmax_errors = 0\nwindow = \"0s\"\nbackoff = { min = \"0ms\" }\n"),
            [
                "door.toml:4: error: machine `door`, fault policy: `max_errors` is zero (declare at least 1)",
                "door.toml:4: error: machine `door`, fault policy: `window` is zero (errors would never add up to park the entity)",
                "door.toml:4: error: machine `door`, fault policy: `backoff.min` is zero (a failing action would be retried in a busy loop)",
            ]
        );
        assert_eq!(
            problems("\n[fault]\nbackoff = { min = \"5m\", max = \"1m\" }\n"),
            ["door.toml:5: error: machine `door`, fault policy: `backoff.min` (5m) is greater than `backoff.max` (1m)"]
        );
        assert_eq!(
            problems("[fault]\nbackoff = { min = \"1h\" }\n"),
            [
                "door.toml:4: error: machine `door`, fault policy: `backoff.min` (1h) is greater than `backoff.max` (10m by default)"
            ]
        );
        assert_eq!(
            problems("[fault]\nbackoff.max = \"500ms\"\n"),
            [
                "door.toml:4: error: machine `door`, fault policy: `backoff.min` (1s by default) is greater than `backoff.max` (500ms)"
            ]
        );
        assert_eq!(
            problems("[fault]\nwindow = \"soon\"\nbackoff = { max = \"1 m\" }\n"),
            [
                "door.toml:5: error: machine `door`, fault policy: invalid duration `soon` (expected e.g. `500ms`, `5s`, `10m`, `1h30m`)",
                "door.toml:6: error: machine `door`, fault policy: invalid duration `1 m` (expected e.g. `500ms`, `5s`, `10m`, `1h30m`)",
            ]
        );
    }

    #[test]
    fn fault_keys_are_checked() {
        assert_eq!(
            errors("m", "[fault]\nmax_errors = 8\nretries = 3\n"),
            [
                "line 3: error: machine `m`, file: unknown field `retries`, expected one of `max_errors`, `window`, `backoff`"
            ]
        );
        assert_eq!(
            errors("m", "[fault]\nbackoff = { min = \"1s\", factor = 3 }\n"),
            ["line 2: error: machine `m`, file: unknown field `factor`, expected `min` or `max`"]
        );
        assert_eq!(
            errors("m", "[fault]\nmax_errors = -1\n"),
            ["line 2: error: machine `m`, file: invalid value: integer `-1`, expected u32"]
        );
        assert_eq!(
            errors("m", "[fault]\nwindow = 60\n"),
            ["line 2: error: machine `m`, file: invalid type: integer `60`, expected a string"]
        );
        assert_eq!(
            errors("m", "[migrate]\nold = [\"new\"]\n"),
            ["line 2: error: machine `m`, file: invalid type: sequence, expected a string"]
        );
    }

    #[test]
    fn renames_and_migrations_are_checked_on_their_lines() {
        let text = concat!(
            r#"initial = "closed"
[states.closed]
renamed_from = ["open", "shut", "shut"]
[states.open]
renamed_from = ["ajar", "shut"]
"#,
            door_moves!(),
            r#"[migrate]
closed = "open"
ajar = "closed"
jammed = "stuck"
"#
        );
        let report = load("door.toml", "door", text).unwrap_err();
        assert_eq!(
            report.to_string(),
            "door.toml:2: error: machine `door`, state `closed`: duplicate `shut` in `renamed_from`\n\
             door.toml:2: error: machine `door`, state `closed`: `renamed_from` names `open`, which is still a declared state\n\
             door.toml:4: error: machine `door`, state `open`: `renamed_from`: old state `shut` is already mapped to `closed`\n\
             door.toml:17: error: machine `door`, migration `closed`: `closed` is still a declared state (only states no longer declared can be migrated)\n\
             door.toml:18: error: machine `door`, migration `ajar`: old state `ajar` is already mapped to `open`\n\
             door.toml:19: error: machine `door`, migration `jammed`: migrates to unknown state `stuck`\n"
        );
    }

    #[test]
    fn messages_are_tidied() {
        assert_eq!(tidy_message("Invalid table header.\nmore detail"), "invalid table header");
        assert_eq!(tidy_message("TOML is hard"), "TOML is hard");
        assert_eq!(tidy_message(""), "invalid toml");
    }
}
