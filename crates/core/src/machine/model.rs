//! The validated model: [`Machine`] and its parts ([`State`], [`Event`], [`Action`],
//! [`Timer`], [`Subscription`], …), what the runtime executes.
//!
//! A definition becomes a machine only through [`Machine::from_def`], which runs every
//! check of [`crate::validate::check`] and refuses the definition if any error is found.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::time::Duration;

use super::def::{FaultDef, Health, MachineDef, StateKind, effective_kind};
use crate::duration;
use crate::fault::FaultPolicy;
use crate::names::{ActionName, EventName, MachineName, StateName};
use crate::pattern::Pattern;
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
    /// `None` when not declared: [`FaultPolicy::DEFAULT`] applies. Read by the canonical
    /// rendering, which tells a declared default policy from none.
    pub(super) fault: Option<FaultPolicy>,
    /// The migration table: old state name to declared state.
    pub(super) migrate: BTreeMap<StateName, StateName>,
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
}
