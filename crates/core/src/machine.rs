//! The machine model: the raw definition ([`MachineDef`], what TOML and the builder
//! produce, possibly invalid) and the validated [`Machine`] the runtime executes.
//!
//! A definition becomes a machine only through [`Machine::from_def`], which runs every
//! check of [`crate::validate`] and refuses the definition if any error is found.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::time::Duration;

use crate::duration;
use crate::fault::FaultPolicy;
use crate::names::{ActionName, EventName, MachineName, StateName};
use crate::pattern::Pattern;
use crate::validate::{self, Report};

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
    /// The action the event triggers.
    pub action: String,
    /// Required parameter names.
    pub params: Vec<String>,
    /// Rejection reasons for specific states where the event is not valid.
    pub reject: Vec<(String, String)>,
    /// The subscription pattern over successors (see [`crate::pattern`]), as written.
    pub subscribe: Option<String>,
    /// The subscription's timeout: after this long in a state where the subscription is
    /// valid without it firing, this event is raised.
    pub timeout: Option<(Duration, String)>,
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
    /// Where it was declared.
    pub origin: Origin,
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
/// and by [`MachineBuilder`]; turned into a [`Machine`] by [`Machine::from_def`].
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
    /// The declared fault policy (`[fault]`), if any; [`FaultPolicy::DEFAULT`] otherwise.
    pub fault: Option<FaultDef>,
    /// The migration table (`[migrate]`), in declaration order.
    pub migrate: Vec<MigrateDef>,
    /// Where the machine was declared (file start).
    pub origin: Origin,
}

/// A validated state.
#[derive(Debug, Clone, PartialEq)]
pub struct State {
    /// The state's name.
    pub name: StateName,
    /// Its kind.
    pub kind: StateKind,
    /// The auto action, for unstable states.
    pub auto: Option<ActionName>,
    /// Delay before the auto action runs on entry.
    pub wait: Duration,
    /// Declared health.
    pub health: Health,
    /// Properties that must be set in this state.
    pub requires: Vec<String>,
    /// Former names of this state: stored entities in one of them move here on upgrade.
    pub renamed_from: Vec<StateName>,
}

impl State {
    /// Stable, terminal and deleted states are "at rest": nothing runs on its own.
    pub fn at_rest(&self) -> bool {
        self.kind != StateKind::Unstable
    }
}

/// A validated event.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// The event's name.
    pub name: EventName,
    /// States in which the event is valid, in declaration order.
    pub valid_in: Vec<StateName>,
    /// The action it triggers.
    pub action: ActionName,
    /// Required parameter names.
    pub params: Vec<String>,
    /// Declared rejection reasons by state.
    pub reject: BTreeMap<StateName, String>,
    /// Set for a subscription event: raised when its pattern over successors holds.
    pub subscribe: Option<Subscription>,
}

impl Event {
    /// Whether the event may be processed in `state`.
    pub fn valid_in(&self, state: &str) -> bool {
        self.valid_in.iter().any(|s| s == state)
    }
}

/// What makes an event a subscription event (DESIGN §1): it is raised, at most once per
/// entry into a state where it is valid, when `pattern` holds over the entity's successors.
#[derive(Debug, Clone, PartialEq)]
pub struct Subscription {
    /// The pattern over successors.
    pub pattern: Pattern,
    /// Raised instead when the pattern has not held within a delay.
    pub timeout: Option<SubscriptionTimeout>,
}

/// The timeout of a [`Subscription`].
#[derive(Debug, Clone, PartialEq)]
pub struct SubscriptionTimeout {
    /// Counted from entry into a state where the subscription is valid.
    pub after: Duration,
    /// The event raised when the delay passes without the subscription firing.
    pub event: EventName,
}

/// When a [`Timer`] fires, counted from entry into one of its states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Schedule {
    /// Periodically (`every = "5m"`): first one period after entry, then each period,
    /// for as long as the entity stays in the timer's states.
    Every(Duration),
    /// Once (`after = "10m"`), if the entity is still in the timer's states.
    After(Duration),
}

impl Schedule {
    /// The duration of the period or of the delay.
    pub fn duration(self) -> Duration {
        match self {
            Schedule::Every(d) | Schedule::After(d) => d,
        }
    }
}

/// `every 5m` or `after 10m`.
impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Schedule::Every(d) => write!(f, "every {}", duration::format(*d)),
            Schedule::After(d) => write!(f, "after {}", duration::format(*d)),
        }
    }
}

/// A validated timer: raises `event` on its schedule while the entity is in `valid_in`.
#[derive(Debug, Clone, PartialEq)]
pub struct Timer {
    /// The timer's name.
    pub name: String,
    /// The event it raises.
    pub event: EventName,
    /// When it fires.
    pub schedule: Schedule,
    /// States in which it runs, in declaration order.
    pub valid_in: Vec<StateName>,
}

impl Timer {
    /// Whether the timer runs in `state`.
    pub fn valid_in(&self, state: &str) -> bool {
        self.valid_in.iter().any(|s| s == state)
    }
}

/// A validated action target.
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    /// The target state.
    pub state: StateName,
    /// Extra delay declared on this transition, added to the target state's own `wait`.
    pub wait: Duration,
}

/// A validated action.
#[derive(Debug, Clone, PartialEq)]
pub struct Action {
    /// The action's name.
    pub name: ActionName,
    /// Its declared targets.
    pub targets: Vec<Target>,
    /// The agent queue that executes it (`None`: a Rust handler, or a plain transition).
    pub agent: Option<AgentBinding>,
}

/// An action executed by external agents (DESIGN §5): entering its state offers a task on
/// `queue`; an agent leases it for `lock` at a time and reports the outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentBinding {
    /// The queue agents lease from.
    pub queue: String,
    /// How long a lease lasts before the task is offered again (heartbeats extend it).
    pub lock: Duration,
}

impl AgentBinding {
    /// The lock when the definition declares none.
    pub const DEFAULT_LOCK: Duration = Duration::from_secs(60);
}

impl Action {
    /// The declared target named `state`, if any.
    pub fn target(&self, state: &str) -> Option<&Target> {
        self.targets.iter().find(|t| t.state == state)
    }
}

/// A validated machine definition: what the runtime executes.
///
/// ```
/// use settle_core::{Machine, MachineBuilder};
/// let m: Machine = MachineBuilder::new("door")
///     .state("closed").initial()
///     .state("open")
///     .event("open", ["closed"], "do_open")
///     .event("close", ["open"], "do_close")
///     .action("do_open", ["open"])
///     .action("do_close", ["closed"])
///     .build()
///     .unwrap();
/// assert_eq!(m.initial().name, "closed");
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Machine {
    name: MachineName,
    initial: usize,
    states: Vec<State>,
    events: Vec<Event>,
    actions: Vec<Action>,
    timers: Vec<Timer>,
    /// `None` when not declared: [`FaultPolicy::DEFAULT`] applies.
    fault: Option<FaultPolicy>,
    /// The migration table: old state name to declared state.
    migrate: BTreeMap<StateName, StateName>,
    state_index: HashMap<StateName, usize>,
    event_index: HashMap<EventName, usize>,
    action_index: HashMap<ActionName, usize>,
}

impl Machine {
    /// Validates `def` and builds the machine. Warnings do not prevent building; they are
    /// returned in the report, which callers may print.
    pub fn from_def(def: &MachineDef) -> Result<(Machine, Report), Report> {
        let report = validate::check(def);
        if report.has_errors() {
            return Err(report);
        }
        Ok((Self::assemble(def), report))
    }

    /// Builds from a definition that [`validate::check`] found free of errors.
    fn assemble(def: &MachineDef) -> Machine {
        let states: Vec<State> = def
            .states
            .iter()
            .map(|s| State {
                name: StateName::new(&s.name),
                kind: effective_kind(s),
                auto: s.auto.first().map(ActionName::new),
                wait: s.wait.unwrap_or_default(),
                health: s.health,
                requires: s.requires.clone(),
                renamed_from: s.renamed_from.iter().map(StateName::new).collect(),
            })
            .collect();
        let initial_name = def
            .initial
            .clone()
            .or_else(|| def.states.iter().find(|s| s.initial).map(|s| s.name.clone()))
            .expect("validated machine has an initial state");
        let state_index: HashMap<StateName, usize> =
            states.iter().enumerate().map(|(i, s)| (s.name.clone(), i)).collect();
        let events: Vec<Event> = def
            .events
            .iter()
            .map(|e| Event {
                name: EventName::new(&e.name),
                valid_in: e.valid_in.iter().map(StateName::new).collect(),
                action: ActionName::new(&e.action),
                params: e.params.clone(),
                reject: e.reject.iter().map(|(s, r)| (StateName::new(s), r.clone())).collect(),
                subscribe: e.subscribe.as_ref().map(|text| Subscription {
                    pattern: Pattern::parse(text).expect("validated pattern parses"),
                    timeout: e
                        .timeout
                        .as_ref()
                        .map(|(after, event)| SubscriptionTimeout { after: *after, event: EventName::new(event) }),
                }),
            })
            .collect();
        let timers: Vec<Timer> = def
            .timers
            .iter()
            .map(|t| Timer {
                name: t.name.clone(),
                event: EventName::new(&t.event),
                schedule: match (t.every, t.after) {
                    (Some(every), None) => Schedule::Every(every),
                    (None, Some(after)) => Schedule::After(after),
                    _ => unreachable!("validated timer has exactly one of `every` and `after`"),
                },
                valid_in: t.valid_in.iter().map(StateName::new).collect(),
            })
            .collect();
        let actions: Vec<Action> = def
            .actions
            .iter()
            .map(|a| Action {
                name: ActionName::new(&a.name),
                targets: a
                    .targets
                    .iter()
                    .map(|t| Target {
                        state: StateName::new(t),
                        wait: a.target_waits.iter().find(|(s, _)| s == t).map(|(_, d)| *d).unwrap_or_default(),
                    })
                    .collect(),
                agent: a.agent.as_ref().map(|queue| AgentBinding {
                    queue: queue.clone(),
                    lock: a.lock.unwrap_or(AgentBinding::DEFAULT_LOCK),
                }),
            })
            .collect();
        Machine {
            name: MachineName::new(&def.name),
            initial: state_index[initial_name.as_str()],
            event_index: events.iter().enumerate().map(|(i, e)| (e.name.clone(), i)).collect(),
            action_index: actions.iter().enumerate().map(|(i, a)| (a.name.clone(), i)).collect(),
            state_index,
            states,
            events,
            actions,
            timers,
            fault: def.fault.as_ref().map(FaultDef::policy),
            migrate: def.migrate.iter().map(|m| (StateName::new(&m.from), StateName::new(&m.to))).collect(),
        }
    }

    /// The machine's name.
    pub fn name(&self) -> &MachineName {
        &self.name
    }
    /// The initial state.
    pub fn initial(&self) -> &State {
        &self.states[self.initial]
    }
    /// All states in declaration order.
    pub fn states(&self) -> &[State] {
        &self.states
    }
    /// All events in declaration order.
    pub fn events(&self) -> &[Event] {
        &self.events
    }
    /// All actions in declaration order.
    pub fn actions(&self) -> &[Action] {
        &self.actions
    }
    /// All timers in declaration order.
    pub fn timers(&self) -> &[Timer] {
        &self.timers
    }
    /// The fault policy: the declared one, or [`FaultPolicy::DEFAULT`].
    pub fn fault_policy(&self) -> &FaultPolicy {
        self.fault.as_ref().unwrap_or(&FaultPolicy::DEFAULT)
    }
    /// Where stored entities in a state this definition no longer declares go on upgrade:
    /// each old name (from a state's `renamed_from` or the `[migrate]` table) mapped to the
    /// declared state that takes its entities. See [`crate::upgrade::check`].
    pub fn state_mapping(&self) -> BTreeMap<StateName, StateName> {
        let renamed =
            self.states.iter().flat_map(|s| s.renamed_from.iter().map(move |old| (old.clone(), s.name.clone())));
        renamed.chain(self.migrate.iter().map(|(old, new)| (old.clone(), new.clone()))).collect()
    }
    /// The state named `name`.
    pub fn state(&self, name: &str) -> Option<&State> {
        self.state_index.get(name).map(|&i| &self.states[i])
    }
    /// The event named `name`.
    pub fn event(&self, name: &str) -> Option<&Event> {
        self.event_index.get(name).map(|&i| &self.events[i])
    }
    /// The action named `name`.
    pub fn action(&self, name: &str) -> Option<&Action> {
        self.action_index.get(name).map(|&i| &self.actions[i])
    }
    /// Events valid in `state`, in declaration order.
    pub fn permitted_events(&self, state: &str) -> impl Iterator<Item = &Event> {
        self.events.iter().filter(move |e| e.valid_in(state))
    }
    /// Subscription events valid in `state`, in declaration order: those the runtime
    /// evaluates while an entity is in `state`.
    pub fn subscriptions_in(&self, state: &str) -> impl Iterator<Item = &Event> {
        self.permitted_events(state).filter(|e| e.subscribe.is_some())
    }
    /// Timers that run in `state`, in declaration order.
    pub fn timers_in(&self, state: &str) -> impl Iterator<Item = &Timer> {
        self.timers.iter().filter(move |t| t.valid_in(state))
    }
    /// The health of the state named `state`; [`Health::Ok`] for a state the machine does
    /// not declare.
    pub fn health_of(&self, state: &str) -> Health {
        self.state(state).map_or(Health::Ok, |s| s.health)
    }
    /// Actions that need a bound Rust handler: every action except those with exactly
    /// one target, which the engine may perform itself as a plain transition, and those
    /// bound to an agent queue.
    pub fn actions_needing_handlers(&self) -> impl Iterator<Item = &Action> {
        self.actions.iter().filter(|a| a.targets.len() != 1 && a.agent.is_none())
    }
    /// The agent queues this machine's actions are bound to, without repeats.
    pub fn agent_queues(&self) -> Vec<&str> {
        let mut queues: Vec<&str> =
            self.actions.iter().filter_map(|a| a.agent.as_ref().map(|b| b.queue.as_str())).collect();
        queues.sort_unstable();
        queues.dedup();
        queues
    }

    /// A canonical, stable JSON rendering of the definition (stored with the machine):
    /// compact, object keys sorted — whatever order serde_json's maps keep in this build
    /// (its `preserve_order` feature, enabled by any crate in a build, would otherwise
    /// change the text and so every definition's hash).
    pub fn canonical_json(&self) -> String {
        use serde_json::{Map, Value, json};
        let ms = |d: Duration| Value::from(d.as_millis() as u64);
        let states: Vec<Value> = self
            .states
            .iter()
            .map(|s| {
                let mut state = json!({
                    "name": s.name.as_str(),
                    "kind": s.kind.as_str(),
                    "auto": s.auto.as_deref(),
                    "wait_ms": ms(s.wait),
                    "health": if s.health == Health::Error { "error" } else { "ok" },
                    "requires": s.requires,
                });
                if !s.renamed_from.is_empty() {
                    state["renamed_from"] = s.renamed_from.iter().map(|n| n.as_str()).collect();
                }
                state
            })
            .collect();
        let events: Vec<Value> = self
            .events
            .iter()
            .map(|e| {
                let reject: Map<String, Value> =
                    e.reject.iter().map(|(k, v)| (k.to_string(), Value::from(v.as_str()))).collect();
                let mut event = json!({
                    "name": e.name.as_str(),
                    "in": e.valid_in.iter().map(|s| s.as_str()).collect::<Vec<_>>(),
                    "action": e.action.as_str(),
                    "params": e.params,
                    "reject": reject,
                });
                // Keys of later features only when used: older definitions keep their hash.
                if let Some(sub) = &e.subscribe {
                    event["subscribe"] = Value::from(sub.pattern.to_string());
                    if let Some(t) = &sub.timeout {
                        event["timeout"] = json!({"after_ms": ms(t.after), "event": t.event.as_str()});
                    }
                }
                event
            })
            .collect();
        let actions: Vec<Value> = self
            .actions
            .iter()
            .map(|a| {
                let mut action = json!({
                    "name": a.name.as_str(),
                    "to": a.targets.iter().map(|t| json!({"state": t.state.as_str(), "wait_ms": ms(t.wait)})).collect::<Vec<_>>(),
                });
                if let Some(b) = &a.agent {
                    action["agent"] = json!({"queue": b.queue, "lock_ms": ms(b.lock)});
                }
                action
            })
            .collect();
        let mut machine = json!({
            "name": self.name.as_str(),
            "initial": self.initial().name.as_str(),
            "states": states,
            "events": events,
            "actions": actions,
        });
        if !self.timers.is_empty() {
            let timers: Vec<Value> = self
                .timers
                .iter()
                .map(|t| {
                    let (key, d) = match t.schedule {
                        Schedule::Every(d) => ("every_ms", d),
                        Schedule::After(d) => ("after_ms", d),
                    };
                    json!({
                        "name": t.name,
                        "event": t.event.as_str(),
                        key: ms(d),
                        "in": t.valid_in.iter().map(|s| s.as_str()).collect::<Vec<_>>(),
                    })
                })
                .collect();
            machine["timers"] = Value::from(timers);
        }
        if let Some(f) = &self.fault {
            machine["fault"] = json!({
                "max_errors": f.max_errors,
                "window_ms": ms(f.window),
                "backoff": {"min_ms": ms(f.backoff_min), "max_ms": ms(f.backoff_max)},
            });
        }
        if !self.migrate.is_empty() {
            let migrate: Map<String, Value> =
                self.migrate.iter().map(|(old, new)| (old.to_string(), Value::from(new.as_str()))).collect();
            machine["migrate"] = Value::from(migrate);
        }
        let mut out = String::new();
        write_sorted(&machine, &mut out);
        out
    }

    /// SHA-256 of [`Machine::canonical_json`], hex-encoded: the definition's version hash.
    pub fn content_hash(&self) -> String {
        use sha2::{Digest, Sha256};
        let digest = Sha256::digest(self.canonical_json().as_bytes());
        digest.iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// The kind a declared state has: explicit, or unstable iff it declares an auto action.
pub fn effective_kind(s: &StateDef) -> StateKind {
    s.kind.unwrap_or(if s.auto.is_empty() { StateKind::Stable } else { StateKind::Unstable })
}

/// Builds a [`MachineDef`] in Rust; [`MachineBuilder::build`] validates it into a
/// [`Machine`]. Methods after [`MachineBuilder::state`] apply to the last state added,
/// those after [`MachineBuilder::event`] to the last event, and so on.
#[derive(Debug, Clone)]
pub struct MachineBuilder {
    def: MachineDef,
    last: Last,
}

#[derive(Debug, Clone, Copy)]
enum Last {
    None,
    State,
    Event,
    Action,
    Timer,
}

impl MachineBuilder {
    /// Starts a machine called `name`.
    pub fn new(name: impl Into<String>) -> Self {
        MachineBuilder { def: MachineDef { name: name.into(), ..MachineDef::default() }, last: Last::None }
    }

    /// Adds a state (stable unless [`auto`](Self::auto) or [`kind`](Self::kind) says otherwise).
    pub fn state(mut self, name: impl Into<String>) -> Self {
        self.def.states.push(StateDef { name: name.into(), ..StateDef::default() });
        self.last = Last::State;
        self
    }
    fn last_state(&mut self) -> &mut StateDef {
        assert!(matches!(self.last, Last::State), "call .state(...) first");
        self.def.states.last_mut().expect("a state was added")
    }
    /// Marks the last state initial.
    pub fn initial(mut self) -> Self {
        self.last_state().initial = true;
        self
    }
    /// Declares the last state's auto action (making it unstable).
    pub fn auto(mut self, action: impl Into<String>) -> Self {
        self.last_state().auto.push(action.into());
        self
    }
    /// Declares a delay before the last state's auto action runs.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.last_state().wait = Some(wait);
        self
    }
    /// Sets the last state's kind explicitly.
    pub fn kind(mut self, kind: StateKind) -> Self {
        self.last_state().kind = Some(kind);
        self
    }
    /// Marks the last state `health = "error"`.
    pub fn error_health(mut self) -> Self {
        self.last_state().health = Health::Error;
        self
    }
    /// Declares former names of the last state: stored entities in one of them move to it
    /// when the definition is upgraded (see [`crate::upgrade`]).
    pub fn renamed_from<I, S>(mut self, old_names: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.last_state().renamed_from.extend(old_names.into_iter().map(Into::into));
        self
    }
    /// Declares properties required in the last state.
    pub fn requires<I, S>(mut self, props: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.last_state().requires.extend(props.into_iter().map(Into::into));
        self
    }

    /// Adds an event valid in `valid_in` that triggers `action`.
    pub fn event<I, S>(mut self, name: impl Into<String>, valid_in: I, action: impl Into<String>) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.def.events.push(EventDef {
            name: name.into(),
            valid_in: valid_in.into_iter().map(Into::into).collect(),
            action: action.into(),
            ..EventDef::default()
        });
        self.last = Last::Event;
        self
    }
    fn last_event(&mut self) -> &mut EventDef {
        assert!(matches!(self.last, Last::Event), "call .event(...) first");
        self.def.events.last_mut().expect("an event was added")
    }
    /// Declares required parameters of the last event.
    pub fn params<I, S>(mut self, params: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.last_event().params.extend(params.into_iter().map(Into::into));
        self
    }
    /// Declares the rejection reason of the last event in `state`.
    pub fn reject(mut self, state: impl Into<String>, reason: impl Into<String>) -> Self {
        self.last_event().reject.push((state.into(), reason.into()));
        self
    }
    /// Makes the last event a subscription event with this pattern over successors (see
    /// [`crate::pattern`]). A pattern that does not parse is reported by
    /// [`build`](Self::build), like every other problem.
    pub fn subscribe(mut self, pattern: impl Into<String>) -> Self {
        self.last_event().subscribe = Some(pattern.into());
        self
    }
    /// Declares the last event's subscription timeout: `event` is raised when the
    /// subscription has not fired `after` entry into a state where it is valid.
    pub fn timeout(mut self, after: Duration, event: impl Into<String>) -> Self {
        self.last_event().timeout = Some((after, event.into()));
        self
    }

    /// Adds an action with its declared targets.
    pub fn action<I, S>(mut self, name: impl Into<String>, targets: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.def.actions.push(ActionDef {
            name: name.into(),
            targets: targets.into_iter().map(Into::into).collect(),
            ..ActionDef::default()
        });
        self.last = Last::Action;
        self
    }
    /// Binds the last action to agent queue `queue` with lock `lock` (DESIGN §5).
    pub fn agent(mut self, queue: impl Into<String>, lock: Duration) -> Self {
        assert!(matches!(self.last, Last::Action), "call .action(...) first");
        let a = self.def.actions.last_mut().expect("an action was added");
        a.agent = Some(queue.into());
        a.lock = Some(lock);
        self
    }
    /// Declares a wait on the last action's transition to `target`.
    pub fn target_wait(mut self, target: impl Into<String>, wait: Duration) -> Self {
        assert!(matches!(self.last, Last::Action), "call .action(...) first");
        self.def.actions.last_mut().expect("an action was added").target_waits.push((target.into(), wait));
        self
    }

    /// Adds a timer raising `event` on `schedule` while the entity is in `valid_in`.
    pub fn timer<I, S>(
        mut self,
        name: impl Into<String>,
        event: impl Into<String>,
        schedule: Schedule,
        valid_in: I,
    ) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let (every, after) = match schedule {
            Schedule::Every(d) => (Some(d), None),
            Schedule::After(d) => (None, Some(d)),
        };
        self.def.timers.push(TimerDef {
            name: name.into(),
            event: event.into(),
            every,
            after,
            valid_in: valid_in.into_iter().map(Into::into).collect(),
            ..TimerDef::default()
        });
        self.last = Last::Timer;
        self
    }

    /// Declares the machine's fault policy (replacing any declared before). A machine-wide
    /// setting: it may come anywhere and does not end the item being built.
    pub fn fault_policy(mut self, policy: FaultPolicy) -> Self {
        self.def.fault = Some(policy.into());
        self
    }
    /// Adds an entry to the migration table: stored entities in state `old`, which the
    /// definition no longer declares, move to the declared state `new` when the definition
    /// is upgraded (see [`crate::upgrade`]). A machine-wide setting: it may come anywhere
    /// and does not end the item being built.
    pub fn migrate(mut self, old: impl Into<String>, new: impl Into<String>) -> Self {
        self.def.migrate.push(MigrateDef { from: old.into(), to: new.into(), origin: Origin::default() });
        self
    }

    /// The definition built so far (unvalidated).
    pub fn def(&self) -> &MachineDef {
        &self.def
    }
    /// Validates and builds the machine; errors come back as a full [`Report`].
    pub fn build(self) -> Result<Machine, Report> {
        Machine::from_def(&self.def).map(|(m, _)| m)
    }
}

/// Writes `v` as compact JSON with every object's keys in sorted order.
fn write_sorted(v: &serde_json::Value, out: &mut String) {
    use serde_json::Value;
    match v {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::from(k.as_str()).to_string());
                out.push(':');
                write_sorted(&map[k], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_sorted(item, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}
