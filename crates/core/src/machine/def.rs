//! The raw definition: a machine as written ([`MachineDef`] and its items), possibly
//! invalid, with the line each item came from. Produced by [`crate::toml::parse`] and by
//! [`crate::MachineBuilder`]; [`crate::validate::check`] reports its problems.
//!
//! Also the leaf enums that both the definition and the validated model use
//! ([`StateKind`], [`Health`]). This module names no other part of the machine model, so
//! patterns and validation can build on it.

use std::time::Duration;

use crate::fault::FaultPolicy;
use crate::retention::Keep;

/// How a state behaves. See the README glossary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StateKind {
    /// Left only through an event's action.
    Stable,
    /// Has exactly one auto action, run on entry (after an optional wait).
    Unstable,
    /// No transitions out: the entity is archived and read-only.
    Terminal,
    /// The entity is gone for users; nothing leaves this state. At most one per machine.
    Deleted,
}

impl StateKind {
    /// The keyword used in TOML (`kind = "..."`) and in diagnostics.
    pub fn as_str(self) -> &'static str {
        match self {
            StateKind::Stable => "stable",
            StateKind::Unstable => "unstable",
            StateKind::Terminal => "terminal",
            StateKind::Deleted => "deleted",
        }
    }
}

/// The health a state reports (telemetry, operation outcomes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Health {
    /// The normal case.
    #[default]
    Ok,
    /// Declared with `health = "error"`.
    Error,
}

impl Health {
    /// The name stored in telemetry and shown to users: `ok` or `error`.
    pub fn as_str(self) -> &'static str {
        match self {
            Health::Ok => "ok",
            Health::Error => "error",
        }
    }
}

/// A parent's history (`history = "shallow"` or `"deep"`): entering the parent resumes
/// the substate the entity was last in there instead of its initial child (UML and SCXML
/// history, kept as a property of the parent rather than a pseudo-state).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum History {
    /// Resume the direct child last active (which then enters its own initial child, or
    /// resumes by its own history).
    Shallow,
    /// Resume the leaf last active anywhere below the parent.
    Deep,
}

impl History {
    /// `shallow` or `deep`.
    pub fn as_str(self) -> &'static str {
        match self {
            History::Shallow => "shallow",
            History::Deep => "deep",
        }
    }
    /// The history [`History::as_str`] names.
    pub fn parse(s: &str) -> Option<History> {
        [History::Shallow, History::Deep].into_iter().find(|h| h.as_str() == s)
    }
}

/// Where a definition item was declared, for diagnostics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Origin {
    /// 1-based line in the TOML source, when loaded from TOML.
    pub line: Option<u32>,
}

/// A state as declared, before validation.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct StateDef {
    /// The state's name.
    pub name: String,
    /// Explicit kind; when `None` the state is unstable if it has an auto action, else stable.
    pub kind: Option<StateKind>,
    /// Auto actions declared (a valid unstable state has exactly one).
    pub auto: Vec<String>,
    /// Delay before the auto action runs on entry.
    pub wait: Option<Duration>,
    /// Declared health.
    pub health: Health,
    /// Properties that must be set (non-null) while the entity is in this state.
    pub requires: Vec<String>,
    /// Marked initial on the state itself (`initial = true`).
    pub initial: bool,
    /// Former names of this state (`renamed_from = [...]`): stored entities in one of
    /// them move here when the definition is upgraded (see [`crate::upgrade`]).
    pub renamed_from: Vec<String>,
    /// The state this one is a substate of (`parent = "..."`).
    pub parent: Option<String>,
    /// For a parent: the child entered when the parent is (`initial = "child"`).
    pub initial_child: Option<String>,
    /// For a parent: whether entering it resumes where the entity last was in it.
    pub history: Option<History>,
    /// Actions run whenever a transition enters this state (`on_entry`).
    pub on_entry: Vec<String>,
    /// Actions run whenever a transition leaves this state (`on_exit`).
    pub on_exit: Vec<String>,
    /// Actions run when this state is entered by a given event (`[states.X.on_entry_from]
    /// EVENT = action`), after its `on_entry` actions.
    pub on_entry_from: Vec<(String, Vec<String>)>,
    /// For an end state (terminal or deleted): how long an entity stays after entering it
    /// (`retain = "90d"`), before the machine's `[retention]` and the deployment's default.
    pub retain: Option<Keep>,
    /// Where it was declared.
    pub origin: Origin,
}

/// One guarded alternative of an event (`[[events.E.when]]`), before validation: where it
/// applies, its guard, and what it does when the guard holds.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct WhenDef {
    /// The states (levels) where it applies; empty: every state of the event.
    pub valid_in: Vec<String>,
    /// The guard, an expression over `props` and `params` (see [`crate::guard`]); `None`
    /// always holds.
    pub guard: Option<String>,
    /// The action run when the guard holds.
    pub action: Option<String>,
    /// Or the reason the event is rejected when the guard holds.
    pub reject: Option<String>,
    /// Or the event is ignored when the guard holds (`ignore = true`).
    pub ignore: bool,
    /// Where it was declared.
    pub origin: Origin,
}

/// An event as declared, before validation.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct EventDef {
    /// The event's name.
    pub name: String,
    /// States in which the event is valid.
    pub valid_in: Vec<String>,
    /// The action the event triggers (empty when it has `when` alternatives instead).
    pub action: String,
    /// Guarded alternatives, tried in order (`[[events.E.when]]`).
    pub when: Vec<WhenDef>,
    /// States where the event is accepted and dropped (`ignore = [...]`).
    pub ignore: Vec<String>,
    /// An internal transition: the action's effects commit without leaving or entering
    /// any state (`internal = true`).
    pub internal: bool,
    /// Required parameter names.
    pub params: Vec<String>,
    /// Rejection reasons for specific states where the event is not valid.
    pub reject: Vec<(String, String)>,
    /// The subscription pattern over successors (see [`crate::pattern`]), as written.
    pub subscribe: Option<String>,
    /// The subscription's timeout: after this long in a state where the subscription is
    /// valid without it firing, this event is raised.
    pub timeout: Option<(Duration, String)>,
    /// The priority of the work it starts when a request does not give one (`priority =
    /// N`; none: 0). Bulk operations and schedules raise it
    /// [`BACKGROUND`](crate::limits::BACKGROUND) lower.
    pub priority: Option<i64>,
    /// Where it was declared.
    pub origin: Origin,
}

/// A timer as declared, before validation. A valid timer has exactly one of `every` and
/// `after`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TimerDef {
    /// The timer's name.
    pub name: String,
    /// The event it raises.
    pub event: String,
    /// Period of a periodic timer, counted from entry into one of its states.
    pub every: Option<Duration>,
    /// Delay of a one-shot timer, counted from entry into one of its states.
    pub after: Option<Duration>,
    /// States in which the timer runs.
    pub valid_in: Vec<String>,
    /// Where it was declared.
    pub origin: Origin,
}

/// A schedule as declared (`[schedules.NAME]`), before validation. Its canonical form is
/// its serde form (the origin aside).
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct CalendarDef {
    /// The schedule's name.
    pub name: String,
    /// The cron expression: five fields (minute to weekday) or six (seconds first);
    /// `L`, `W`, `#` (`MON#1`: the first Monday) and names (`MON`, `JAN`) as croner reads them.
    pub cron: String,
    /// The IANA time zone the expression is read in (default `UTC`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    /// The event raised on each entity in `in`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raise: Option<String>,
    /// The states whose entities a raising schedule reaches.
    #[serde(rename = "in", default, skip_serializing_if = "Vec::is_empty")]
    pub valid_in: Vec<String>,
    /// Create one entity of the machine at each fire.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub create: Option<CalendarCreate>,
    /// `skip` (default), `buffer_one` or `allow_all`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overlap: Option<String>,
    /// `once` (default), `all` or `skip`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub catch_up: Option<String>,
    /// With `catch_up = "all"`: at most this many missed fires.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub catch_up_limit: Option<u32>,
    /// At most this long after its instant a fire runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jitter_ms: Option<u64>,
    /// A raising schedule's fire reaches at most this many entities a second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<u32>,
    /// Where it was declared.
    #[serde(skip)]
    pub origin: Origin,
}

/// A limit as declared (`[limits.NAME]`), before validation; see [`crate::limits`]. Its
/// canonical form is its serde form (the origin aside).
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct LimitDef {
    /// The limit's name (shared by the machines that declare it).
    pub name: String,
    /// The states whose auto actions take its slots (a limit of actions).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub states: Vec<String>,
    /// The events whose workflows take its slots (a limit of workflows).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<String>,
    /// At most this many at once per key value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<u32>,
    /// At most this many starts per `per_ms` per key value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<u32>,
    /// The period of `rate`, in milliseconds (default: a second).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_ms: Option<u64>,
    /// The key expression (none: one limit for all of the machine's entities).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// For a limit without a key: what its waiting work is admitted round-robin by.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fair_by: Option<String>,
    /// Where it was declared.
    #[serde(skip)]
    pub origin: Origin,
}

/// The entity a creating schedule creates.
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct CalendarCreate {
    /// Its key: an expression over `params.schedule` (the schedule's name) and
    /// `params.fire` (the fire's instant, RFC 3339 in UTC); default: the schedule's name,
    /// `-`, and the instant (`nightly-2026-11-27T03:00:00.000Z`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Its constructor properties, as given.
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub properties: serde_json::Map<String, serde_json::Value>,
}

/// An action as declared, before validation.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ActionDef {
    /// The action's name.
    pub name: String,
    /// The states the action may move the entity to.
    pub targets: Vec<String>,
    /// Delays declared on transitions to specific targets (a wait on that transition).
    pub target_waits: Vec<(String, Duration)>,
    /// `agent`: the queue of the external agents that execute it.
    pub agent: Option<String>,
    /// `lock`: how long an agent holds a task it leased before it is offered again.
    pub lock: Option<Duration>,
    /// `set`: properties a declarative action sets (a JSON `null` removes one).
    pub set: Vec<(String, serde_json::Value)>,
    /// `raise`: events a declarative action raises on the entity's predecessors or
    /// successors.
    pub raise: Vec<RaiseDef>,
    /// `create`: entities a declarative action creates, recorded as its successors.
    pub create: Vec<CreateDef>,
    /// `may_create`: the machines whose entities the action may create (`None`: not
    /// declared).
    pub may_create: Option<Vec<String>>,
    /// `may_raise`: the events the action may raise on other entities, by key or by
    /// relation (`None`: not declared).
    pub may_raise: Option<Vec<String>>,
    /// Where it was declared.
    pub origin: Origin,
}

/// An event a declarative action raises on related entities (`raise = [{ event = "...",
/// on = "predecessors" }]`) or on one entity named by machine and key (`raise = [{ event =
/// "start", machine = "db", key = "key + '-db'" }]`, the key an expression).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RaiseDef {
    /// The event raised on each of them.
    pub event: String,
    /// `predecessors` or `successors`, or `self` (an internal event on the entity itself);
    /// empty: the entity named by `machine` and `key`.
    pub on: String,
    /// The machine of the entity raised on (with `key`).
    pub machine: Option<String>,
    /// Its key: an expression over `props`, `params` and `key` (with `machine`).
    pub key: Option<String>,
    /// Its parameters (a JSON object, or null).
    pub params: serde_json::Value,
    /// A sync nested event (with `machine` and `key`): the event of this machine raised on
    /// the entity when the raised event's workflow ends there.
    pub reply: Option<String>,
}

/// An entity a declarative action creates (`create = [{ machine = "db", key = "key + '-db'",
/// properties = { size = "params.size" }, event = "start" }]`): its key and the string
/// values of its properties are expressions, like `set`'s values.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CreateDef {
    /// Its machine.
    pub machine: String,
    /// Its key: an expression over `props`, `params` and `key`.
    pub key: String,
    /// Its constructor properties (a string is an expression).
    pub properties: Vec<(String, serde_json::Value)>,
    /// A first event raised on it in the same commit.
    pub event: Option<String>,
    /// That event's parameters (a JSON object, or null).
    pub params: serde_json::Value,
    /// A sync nested event (with `event`): the event of this machine raised on the entity
    /// when the first event's workflow ends on the created one.
    pub reply: Option<String>,
}

/// A fault policy as declared (`[fault]`), before validation: keys not declared take the
/// value of [`FaultPolicy::DEFAULT`].
#[derive(Debug, Clone, PartialEq, Default)]
pub struct FaultDef {
    /// `max_errors`: the entity is parked when this many errors fall within the window.
    pub max_errors: Option<u32>,
    /// `window`: how far back errors count.
    pub window: Option<Duration>,
    /// `backoff.min`: the backoff after the first error.
    pub backoff_min: Option<Duration>,
    /// `backoff.max`: the longest backoff.
    pub backoff_max: Option<Duration>,
    /// Where it was declared.
    pub origin: Origin,
}

impl FaultDef {
    /// The declared policy, with defaults for the keys not declared.
    pub fn policy(&self) -> FaultPolicy {
        let d = FaultPolicy::DEFAULT;
        FaultPolicy {
            max_errors: self.max_errors.unwrap_or(d.max_errors),
            window: self.window.unwrap_or(d.window),
            backoff_min: self.backoff_min.unwrap_or(d.backoff_min),
            backoff_max: self.backoff_max.unwrap_or(d.backoff_max),
        }
    }
}

impl From<FaultPolicy> for FaultDef {
    /// Every key declared, with no origin.
    fn from(p: FaultPolicy) -> Self {
        FaultDef {
            max_errors: Some(p.max_errors),
            window: Some(p.window),
            backoff_min: Some(p.backoff_min),
            backoff_max: Some(p.backoff_max),
            origin: Origin::default(),
        }
    }
}

/// A machine's retention as declared (`[retention]`): see [`crate::retention`].
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RetentionDef {
    /// `ended`: how long an entity stays after entering an end state without a `retain`
    /// of its own.
    pub ended: Option<Keep>,
    /// `archive`: whether entities removed by retention are archived first (`None`: as the
    /// deployment says).
    pub archive: Option<bool>,
    /// `history`: how long a live entity keeps a row of its history, events and errors.
    pub history: Option<Keep>,
    /// `history_rows`: at most this many of each, the latest (at least 1).
    pub history_rows: Option<u32>,
    /// Where it was declared.
    pub origin: Origin,
}

/// One entry of the migration table (`[migrate] old = "new"`), before validation: stored
/// entities in state `from`, which the definition no longer declares, move to `to` when
/// the definition is upgraded (see [`crate::upgrade`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MigrateDef {
    /// The old state name.
    pub from: String,
    /// The declared state its entities move to.
    pub to: String,
    /// Where it was declared.
    pub origin: Origin,
}

/// A machine definition as written, possibly invalid. Produced by [`crate::toml::parse`]
/// and by [`MachineBuilder`](crate::MachineBuilder); turned into a
/// [`Machine`](crate::Machine) by [`Machine::from_def`](crate::Machine::from_def).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct MachineDef {
    /// The machine's name.
    pub name: String,
    /// The top-level `initial = "..."` declaration, if any.
    pub initial: Option<String>,
    /// Where `initial` was declared.
    pub initial_origin: Origin,
    /// States in declaration order.
    pub states: Vec<StateDef>,
    /// Events in declaration order.
    pub events: Vec<EventDef>,
    /// Actions in declaration order.
    pub actions: Vec<ActionDef>,
    /// Timers in declaration order.
    pub timers: Vec<TimerDef>,
    /// Calendar schedules (`[schedules.*]`) in declaration order.
    pub schedules: Vec<CalendarDef>,
    /// Flow-control limits (`[limits.*]`) in declaration order.
    pub limits: Vec<LimitDef>,
    /// The declared fault policy (`[fault]`), if any; [`FaultPolicy::DEFAULT`] otherwise.
    pub fault: Option<FaultDef>,
    /// The migration table (`[migrate]`), in declaration order.
    pub migrate: Vec<MigrateDef>,
    /// The declared retention (`[retention]`), if any.
    pub retention: Option<RetentionDef>,
    /// Properties the machine's entities carry (`properties = [...]`): the names guards
    /// may read besides those of `requires` and declarative `set`.
    pub properties: Vec<String>,
    /// Operator commands that reach an entity's successors too (`cascade = ["kill"]`).
    pub cascade: Vec<String>,
    /// How live entities move to a new version (`upgrade = "pin"` or `"migrate"`, the
    /// default); see [`crate::upgrade::Policy`].
    pub upgrade: Option<String>,
    /// The event that undoes an entity's part in a canceled operation (`cancel = "abort"`):
    /// raised on each entity the operation reached, where it is valid.
    pub cancel: Option<String>,
    /// The event that takes an entity to its deleted state (`delete = "destroy"`): what a
    /// predecessor's cascading delete raises on it.
    pub delete: Option<String>,
    /// Where the machine was declared (file start).
    pub origin: Origin,
}

/// The kind a declared state has: explicit, or unstable iff it declares an auto action.
pub fn effective_kind(s: &StateDef) -> StateKind {
    s.kind.unwrap_or(if s.auto.is_empty() { StateKind::Stable } else { StateKind::Unstable })
}
