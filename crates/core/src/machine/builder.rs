//! [`MachineBuilder`]: a machine definition written in Rust, validated into a
//! [`Machine`] like one loaded from TOML.

use std::time::Duration;

use super::def::{ActionDef, EventDef, Health, MachineDef, MigrateDef, Origin, StateDef, StateKind, TimerDef};
use super::model::{Machine, Schedule};
use crate::fault::FaultPolicy;
use crate::validate::Report;

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
