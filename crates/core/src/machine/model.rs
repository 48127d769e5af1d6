//! The validated model: [`Machine`] and its parts ([`State`], [`Event`], [`Action`],
//! [`Timer`], [`Subscription`], …), what the runtime executes.
//!
//! A definition becomes a machine only through [`Machine::from_def`], which runs every
//! check of [`crate::validate::check`] and refuses the definition if any error is found.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::time::Duration;

use super::def::{FaultDef, Health, History, MachineDef, StateKind, effective_kind};
use crate::calendar::Calendar;
use crate::duration;
use crate::fault::FaultPolicy;
use crate::guard::Guard;
use crate::names::{ActionName, EventName, MachineName, StateName};
use crate::pattern::Pattern;
use crate::retention::{Defaults, Keep, Retention};
use crate::validate::{self, Report};

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
    /// The state this one is a substate of.
    pub parent: Option<StateName>,
    /// For a parent: the child entered when the parent is (a parent is never occupied by
    /// itself).
    pub initial_child: Option<StateName>,
    /// For a parent: entering it resumes where the entity last was in it (see
    /// [`Machine::descend_resuming`]).
    pub history: Option<History>,
    /// Actions run by every transition that enters this state.
    pub on_entry: Vec<ActionName>,
    /// Actions run by every transition that leaves this state.
    pub on_exit: Vec<ActionName>,
    /// Actions run when a given event's transition enters this state (after `on_entry`).
    pub on_entry_from: BTreeMap<EventName, Vec<ActionName>>,
    /// For an end state: how long an entity stays after entering it, as the state
    /// declares (`retain`); see [`Machine::end_states_kept`].
    pub retain: Option<Keep>,
}

impl State {
    /// Stable, terminal and deleted states are "at rest": nothing runs on its own.
    pub fn at_rest(&self) -> bool {
        self.kind != StateKind::Unstable
    }
    /// Terminal and deleted states: an entity there is done, and may be removed once its
    /// retention passes.
    pub fn is_end(&self) -> bool {
        matches!(self.kind, StateKind::Terminal | StateKind::Deleted)
    }
    /// Whether this state has substates (then an entity is never in it alone).
    pub fn is_parent(&self) -> bool {
        self.initial_child.is_some()
    }
    /// The actions entering this state runs when the transition was made by `event`:
    /// `on_entry`, then `on_entry_from` for that event.
    pub fn entry_actions<'s>(&'s self, event: Option<&str>) -> impl Iterator<Item = &'s ActionName> {
        let from = event.and_then(|e| self.on_entry_from.get(e)).into_iter().flatten();
        self.on_entry.iter().chain(from)
    }
}

/// A validated event.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// The event's name.
    pub name: EventName,
    /// States in which the event is valid, in declaration order: it applies to each of
    /// them and to their substates (see [`Machine::event_level`]).
    pub valid_in: Vec<StateName>,
    /// What the event does where it is valid, tried in order: a plain event has one
    /// unguarded alternative running its action.
    pub alternatives: Vec<Alternative>,
    /// States where the event is accepted and dropped, recorded as ignored.
    pub ignore: Vec<StateName>,
    /// An internal transition: its action's effects commit without leaving or entering
    /// any state.
    pub internal: bool,
    /// The priority of the work it starts when its request gives none (declared; 0).
    pub priority: i64,
    /// Required parameter names.
    pub params: Vec<String>,
    /// Declared rejection reasons by state.
    pub reject: BTreeMap<StateName, String>,
    /// Set for a subscription event: raised when its pattern over successors holds.
    pub subscribe: Option<Subscription>,
}

/// One of an event's alternatives: where it applies, its guard, and what it does.
#[derive(Debug, Clone, PartialEq)]
pub struct Alternative {
    /// The states (levels) where it applies; empty: all of the event's.
    pub valid_in: Vec<StateName>,
    /// Its guard; `None` always holds.
    pub guard: Option<Guard>,
    /// What it does when it is chosen.
    pub then: Then,
}

/// What a chosen alternative does.
#[derive(Debug, Clone, PartialEq)]
pub enum Then {
    /// Run this action.
    Action(ActionName),
    /// Reject the event with this reason.
    Reject(String),
    /// Accept the event and drop it (recorded as ignored): a guarded `ignore`, Stateless's
    /// `IgnoreIf`.
    Ignore,
}

impl Alternative {
    /// Whether it applies at `level`, a state the event lists.
    pub fn applies_at(&self, level: &str) -> bool {
        self.valid_in.is_empty() || self.valid_in.iter().any(|s| s == level)
    }
    /// Its action, if it runs one.
    pub fn action(&self) -> Option<&ActionName> {
        match &self.then {
            Then::Action(a) => Some(a),
            Then::Reject(_) | Then::Ignore => None,
        }
    }
}

impl Event {
    /// Whether the event lists `state` (`in`). An event applies to the substates of the
    /// states it lists too: see [`Machine::event_level`].
    pub fn valid_in(&self, state: &str) -> bool {
        self.valid_in.iter().any(|s| s == state)
    }
    /// Whether `state` is one of its `ignore` states.
    pub fn ignored_in(&self, state: &str) -> bool {
        self.ignore.iter().any(|s| s == state)
    }
    /// The action of a plain event (one unguarded alternative that runs an action).
    pub fn action(&self) -> Option<&ActionName> {
        match self.alternatives.as_slice() {
            [only] if only.guard.is_none() && only.valid_in.is_empty() => only.action(),
            _ => None,
        }
    }
    /// Every action its alternatives may run, in order, without repeats.
    pub fn actions(&self) -> Vec<&ActionName> {
        let mut out: Vec<&ActionName> = Vec::new();
        for a in self.alternatives.iter().filter_map(Alternative::action) {
            if !out.contains(&a) {
                out.push(a);
            }
        }
        out
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
    /// Its declared targets (none for an entry, exit or internal action).
    pub targets: Vec<Target>,
    /// The agent queue that executes it (`None`: a Rust handler, or a plain transition).
    pub agent: Option<AgentBinding>,
    /// A declarative action's property changes as declared: a string is an expression
    /// ([`Expression`](crate::expr::Expression), over `props`, `params` and `key`), any
    /// other value is set as written (a JSON `null` removes the property).
    pub set: Vec<(String, serde_json::Value)>,
    /// The expressions of `set`, entry for entry (`None` for a value set as written).
    pub set_exprs: Vec<Option<crate::expr::Expression>>,
    /// A declarative action's events raised on related entities.
    pub raise: Vec<Broadcast>,
    /// A declarative action's events raised on entities named by machine and key.
    pub raise_keyed: Vec<KeyedRaise>,
    /// A declarative action's events raised on its own entity (`on = "self"`), with their
    /// parameters: internal events, processed after the transition commits, before
    /// anything else queued.
    pub raise_self: Vec<(EventName, serde_json::Value)>,
    /// A declarative action's entities to create, recorded as successors.
    pub create: Vec<Creation>,
    /// The machines whose entities it may create (`None`: not declared).
    pub may_create: Option<Vec<MachineName>>,
    /// The events it may raise on other entities (`None`: not declared).
    pub may_raise: Option<Vec<EventName>>,
}

/// An entity a declarative action creates: its key and the string values of its
/// properties are expressions (over `props`, `params` and `key`), like `set`'s.
#[derive(Debug, Clone, PartialEq)]
pub struct Creation {
    /// Its machine.
    pub machine: MachineName,
    /// Its key.
    pub key: crate::expr::Expression,
    /// Its constructor properties as declared (a string is an expression).
    pub properties: Vec<(String, serde_json::Value)>,
    /// The expressions of `properties`, entry for entry (`None`: set as written).
    pub property_exprs: Vec<Option<crate::expr::Expression>>,
    /// A first event raised on it in the same commit, with its parameters.
    pub event: Option<(EventName, serde_json::Value)>,
    /// The reply that event asks for (a sync nested event): an event of this machine.
    pub reply: Option<EventName>,
}

/// An event a declarative action raises on one entity named by machine and key (the key an
/// expression over `props`, `params` and `key`).
#[derive(Debug, Clone, PartialEq)]
pub struct KeyedRaise {
    /// The event.
    pub event: EventName,
    /// The entity's machine.
    pub machine: MachineName,
    /// The entity's key.
    pub key: crate::expr::Expression,
    /// Its parameters (a JSON object, or null).
    pub params: serde_json::Value,
    /// The reply it asks for (a sync nested event): an event of this machine.
    pub reply: Option<EventName>,
}

/// An event a declarative action raises on every entity related one way.
#[derive(Debug, Clone, PartialEq)]
pub struct Broadcast {
    /// The event.
    pub event: EventName,
    /// On whom.
    pub on: Related,
    /// Its parameters (a JSON object, or null).
    pub params: serde_json::Value,
}

/// Entities related to one entity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Related {
    /// Those it joined the workflow of (the entities it is a successor of).
    Predecessors,
    /// Those it created or joined into its workflow.
    Successors,
}

impl Related {
    /// `predecessors` or `successors`.
    pub fn as_str(self) -> &'static str {
        match self {
            Related::Predecessors => "predecessors",
            Related::Successors => "successors",
        }
    }
    /// The relation [`Related::as_str`] names.
    pub fn parse(s: &str) -> Option<Related> {
        [Related::Predecessors, Related::Successors].into_iter().find(|r| r.as_str() == s)
    }
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
    /// Whether the engine performs it from its declaration alone (`set`, `raise`), with no
    /// handler and no agent.
    pub fn is_declarative(&self) -> bool {
        !self.set.is_empty()
            || !self.raise.is_empty()
            || !self.raise_keyed.is_empty()
            || !self.raise_self.is_empty()
            || !self.create.is_empty()
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
    schedules: Vec<Calendar>,
    limits: Vec<crate::limits::Limit>,
    /// `None` when not declared: [`FaultPolicy::DEFAULT`] applies. Read by the canonical
    /// rendering, which tells a declared default policy from none.
    pub(super) fault: Option<FaultPolicy>,
    /// The migration table: old state name to declared state.
    pub(super) migrate: BTreeMap<StateName, StateName>,
    /// `None` when not declared (`[retention]`).
    pub(super) retention: Option<Retention>,
    /// Declared property names (`properties`).
    pub(super) properties: Vec<String>,
    /// Commands that reach successors too (`cascade`).
    pub(super) cascade: Vec<String>,
    /// How live entities move to a new version (`upgrade`).
    pub(super) upgrade: crate::upgrade::Policy,
    /// The event undoing an entity's part in a canceled operation (`cancel`).
    pub(super) cancel: Option<EventName>,
    /// The event taking an entity to its deleted state (`delete`).
    pub(super) delete: Option<EventName>,
    /// Each state's parent, by index (the tree `tree.rs` walks).
    pub(super) parents: Vec<Option<usize>>,
    /// Whether any state has a parent (a flat machine skips the tree walks).
    pub(super) nested: bool,
    pub(super) state_index: HashMap<StateName, usize>,
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
                parent: s.parent.as_ref().map(StateName::new),
                initial_child: s.initial_child.as_ref().map(StateName::new),
                history: s.history,
                on_entry: s.on_entry.iter().map(ActionName::new).collect(),
                on_exit: s.on_exit.iter().map(ActionName::new).collect(),
                on_entry_from: s
                    .on_entry_from
                    .iter()
                    .map(|(e, a)| (EventName::new(e), a.iter().map(ActionName::new).collect()))
                    .collect(),
                retain: s.retain,
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
                alternatives: alternatives(e),
                ignore: e.ignore.iter().map(StateName::new).collect(),
                internal: e.internal,
                priority: e.priority.unwrap_or(0),
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
                set: a.set.clone(),
                set_exprs: expressions(&a.set),
                create: a
                    .create
                    .iter()
                    .map(|c| Creation {
                        machine: MachineName::new(&c.machine),
                        key: crate::expr::Expression::parse(&c.key).expect("validated key expression parses"),
                        properties: c.properties.clone(),
                        property_exprs: expressions(&c.properties),
                        event: c.event.as_ref().map(|e| (EventName::new(e), c.params.clone())),
                        reply: c.reply.as_ref().map(EventName::new),
                    })
                    .collect(),
                raise: a
                    .raise
                    .iter()
                    .filter(|r| r.machine.is_none() && r.on != SELF)
                    .map(|r| Broadcast {
                        event: EventName::new(&r.event),
                        // Validated: `on` names one of the two.
                        on: Related::parse(&r.on).unwrap_or(Related::Predecessors),
                        params: r.params.clone(),
                    })
                    .collect(),
                raise_keyed: a
                    .raise
                    .iter()
                    .filter_map(|r| {
                        Some(KeyedRaise {
                            event: EventName::new(&r.event),
                            machine: MachineName::new(r.machine.as_deref()?),
                            key: crate::expr::Expression::parse(r.key.as_deref()?)
                                .expect("validated key expression parses"),
                            params: r.params.clone(),
                            reply: r.reply.as_ref().map(EventName::new),
                        })
                    })
                    .collect(),
                raise_self: a
                    .raise
                    .iter()
                    .filter(|r| r.on == SELF)
                    .map(|r| (EventName::new(&r.event), r.params.clone()))
                    .collect(),
                may_create: a.may_create.as_ref().map(|m| m.iter().map(MachineName::new).collect()),
                may_raise: a.may_raise.as_ref().map(|e| e.iter().map(EventName::new).collect()),
            })
            .collect();
        let parents: Vec<Option<usize>> =
            states.iter().map(|s| s.parent.as_ref().map(|p| state_index[p.as_str()])).collect();
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
            schedules: def.schedules.iter().map(|c| Calendar::from_def(c).expect("validated schedule")).collect(),
            limits: def.limits.iter().map(crate::limits::Limit::from_def).collect(),
            fault: def.fault.as_ref().map(FaultDef::policy),
            retention: def.retention.as_ref().map(|r| Retention {
                ended: r.ended,
                archive: r.archive,
                history: r.history,
                history_rows: r.history_rows,
            }),
            migrate: def.migrate.iter().map(|m| (StateName::new(&m.from), StateName::new(&m.to))).collect(),
            properties: def.properties.clone(),
            cascade: def.cascade.clone(),
            upgrade: def.upgrade.as_deref().and_then(crate::upgrade::Policy::parse).unwrap_or_default(),
            cancel: def.cancel.as_deref().map(EventName::new),
            delete: def.delete.as_deref().map(EventName::new),
            nested: parents.iter().any(Option::is_some),
            parents,
        }
    }

    /// The machine's name.
    pub fn name(&self) -> &MachineName {
        &self.name
    }
    /// The state a new entity starts in: the declared initial state, or, when that is a
    /// parent, the leaf its initial children lead to.
    pub fn initial(&self) -> &State {
        self.descend(&self.states[self.initial].name)
    }
    /// The initial state as declared (possibly a parent).
    pub fn initial_declared(&self) -> &State {
        &self.states[self.initial]
    }
    /// The property names the machine declares (`properties`).
    pub fn properties(&self) -> &[String] {
        &self.properties
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
    /// Whether the operator command `command` (`kill`) on an entity of this machine reaches
    /// its successors too (`cascade`).
    pub fn cascades(&self, command: &str) -> bool {
        self.cascade.iter().any(|c| c == command)
    }
    /// How this version takes the live entities of the versions before it (`upgrade`).
    pub fn upgrade(&self) -> crate::upgrade::Policy {
        self.upgrade
    }
    /// The event that undoes an entity's part in a canceled operation (`cancel`), if the
    /// machine declares one.
    pub fn cancel_event(&self) -> Option<&EventName> {
        self.cancel.as_ref()
    }
    /// The event that takes an entity to its deleted state (`delete`): what a cascading
    /// delete of a predecessor raises on it.
    pub fn delete_event(&self) -> Option<&EventName> {
        self.delete.as_ref()
    }
    /// The leaf states in which `event` is valid (its innermost level; guards aside), in
    /// declaration order.
    pub fn states_where(&self, event: &str) -> Vec<StateName> {
        let Some(ev) = self.event(event) else { return Vec::new() };
        self.states
            .iter()
            .filter(|s| !s.is_parent() && self.event_applies(ev, &s.name))
            .map(|s| s.name.clone())
            .collect()
    }
    /// The flow-control limits it declares (`[limits.NAME]`), in declaration order.
    pub fn limits(&self) -> &[crate::limits::Limit] {
        &self.limits
    }
    /// The limits the auto action of `state` counts against, in name order (the order their
    /// slots are taken in).
    pub fn limits_of<'a>(&'a self, state: &'a str) -> impl Iterator<Item = &'a crate::limits::Limit> + 'a {
        let mut of: Vec<&crate::limits::Limit> =
            self.limits.iter().filter(|l| l.def.states.iter().any(|s| s == state)).collect();
        of.sort_by(|a, b| a.name().cmp(b.name()));
        of.into_iter()
    }
    /// The limits of workflows `event` starts, in name order (the order their slots are
    /// taken in): its workflow holds a slot of each until the entity comes to rest.
    pub fn workflow_limits_of<'a>(&'a self, event: &'a str) -> impl Iterator<Item = &'a crate::limits::Limit> + 'a {
        let mut of: Vec<&crate::limits::Limit> =
            self.limits.iter().filter(|l| l.def.events.iter().any(|e| e == event)).collect();
        of.sort_by(|a, b| a.name().cmp(b.name()));
        of.into_iter()
    }
    /// Whether it declares a limit of workflows (its commits that come to rest give their
    /// slots back).
    pub fn has_workflow_limits(&self) -> bool {
        self.limits.iter().any(|l| !l.def.events.is_empty())
    }
    /// Whether the auto action of `state` counts against a limit.
    pub fn is_limited(&self, state: &str) -> bool {
        self.limits.iter().any(|l| l.def.states.iter().any(|s| s == state))
    }
    /// All calendar schedules in declaration order.
    pub fn schedules(&self) -> &[Calendar] {
        &self.schedules
    }
    /// The calendar schedule `name`.
    pub fn schedule(&self, name: &str) -> Option<&Calendar> {
        self.schedules.iter().find(|c| c.name() == name)
    }
    /// The fault policy: the declared one, or [`FaultPolicy::DEFAULT`].
    pub fn fault_policy(&self) -> &FaultPolicy {
        self.fault.as_ref().unwrap_or(&FaultPolicy::DEFAULT)
    }
    /// The retention the machine declares (`[retention]`), if any.
    pub fn retention(&self) -> Option<&Retention> {
        self.retention.as_ref()
    }
    /// Each end state (terminal or deleted) with how long an entity stays after entering
    /// it: the state's `retain`, else the machine's `[retention] ended`, else the
    /// deployment's default.
    pub fn end_states_kept(&self, defaults: &Defaults) -> Vec<(&StateName, Keep)> {
        let ended = self.retention.and_then(|r| r.ended).unwrap_or(defaults.ended);
        self.states.iter().filter(|s| s.is_end()).map(|s| (&s.name, s.retain.unwrap_or(ended))).collect()
    }
    /// What a live entity keeps of its history, events and errors: the machine's
    /// `[retention] history` (else the deployment's) and `history_rows`.
    pub fn history_kept(&self, defaults: &Defaults) -> crate::retention::History {
        let r = self.retention.unwrap_or_default();
        crate::retention::History { age: r.history.unwrap_or(defaults.history), rows: r.history_rows }
    }
    /// Whether an entity removed by retention is archived first: the machine's
    /// `[retention] archive`, else `deployment` (whether the deployment has an archive).
    pub fn archives(&self, deployment: bool) -> bool {
        self.retention.and_then(|r| r.archive).unwrap_or(deployment)
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
    /// Actions that need a bound Rust handler: every action except those with exactly
    /// one target, which the engine may perform itself as a plain transition, those bound
    /// to an agent queue, and declarative ones (`set`, `raise`). An entry, exit or internal
    /// action with no target and nothing declared needs one: it would do nothing.
    pub fn actions_needing_handlers(&self) -> impl Iterator<Item = &Action> {
        self.actions.iter().filter(|a| a.targets.len() != 1 && a.agent.is_none() && !a.is_declarative())
    }
    /// The agent queues this machine's actions are bound to, without repeats.
    pub fn agent_queues(&self) -> Vec<&str> {
        let mut queues: Vec<&str> =
            self.actions.iter().filter_map(|a| a.agent.as_ref().map(|b| b.queue.as_str())).collect();
        queues.sort_unstable();
        queues.dedup();
        queues
    }
}

/// A declarative `raise`'s `on` that raises on the entity itself.
pub const SELF: &str = "self";

/// An event's alternatives: its `when` entries, or the one its `action` makes.
fn alternatives(e: &super::def::EventDef) -> Vec<Alternative> {
    if e.when.is_empty() {
        return vec![Alternative { valid_in: Vec::new(), guard: None, then: Then::Action(ActionName::new(&e.action)) }];
    }
    e.when
        .iter()
        .map(|w| Alternative {
            valid_in: w.valid_in.iter().map(StateName::new).collect(),
            guard: w.guard.as_deref().map(|g| Guard::parse(g).expect("validated guard parses")),
            then: match (&w.action, &w.reject) {
                (Some(a), _) => Then::Action(ActionName::new(a)),
                (None, Some(r)) => Then::Reject(r.clone()),
                (None, None) if w.ignore => Then::Ignore,
                (None, None) => unreachable!("validated alternative has an action, a reason or ignore"),
            },
        })
        .collect()
}

/// The expressions among declared values: a string is one (validated: it parses).
fn expressions(values: &[(String, serde_json::Value)]) -> Vec<Option<crate::expr::Expression>> {
    values
        .iter()
        .map(|(_, v)| v.as_str().map(|src| crate::expr::Expression::parse(src).expect("validated expression parses")))
        .collect()
}
