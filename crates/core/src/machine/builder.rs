//! [`MachineBuilder`]: a machine definition written in Rust, validated into a
//! [`Machine`] like one loaded from TOML.

use std::time::Duration;

use super::def::{
    ActionDef, EventDef, Health, MachineDef, MigrateDef, Origin, RaiseDef, StateDef, StateKind, TimerDef, WhenDef,
};
use super::model::{Machine, Related, Schedule};
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
    /// How long an entity stays after entering the last state, an end state (`retain`).
    pub fn retain(mut self, keep: crate::retention::Keep) -> Self {
        self.last_state().retain = Some(keep);
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

    /// Makes the last state a substate of `parent` (DESIGN §1, "Composite states").
    pub fn parent(mut self, parent: impl Into<String>) -> Self {
        self.last_state().parent = Some(parent.into());
        self
    }
    /// Makes the last state a parent whose initial child is `child` (entered whenever the
    /// parent is).
    pub fn initial_child(mut self, child: impl Into<String>) -> Self {
        self.last_state().initial_child = Some(child.into());
        self
    }
    /// Gives the last state (a parent) a history: entering it resumes where the entity last
    /// was in it.
    pub fn history(mut self, history: super::def::History) -> Self {
        self.last_state().history = Some(history);
        self
    }
    /// Adds an action the last state runs whenever a transition enters it.
    pub fn on_entry(mut self, action: impl Into<String>) -> Self {
        self.last_state().on_entry.push(action.into());
        self
    }
    /// Adds an action the last state runs whenever a transition leaves it.
    pub fn on_exit(mut self, action: impl Into<String>) -> Self {
        self.last_state().on_exit.push(action.into());
        self
    }
    /// Adds an action the last state runs when `event`'s transition enters it.
    pub fn on_entry_from(mut self, event: impl Into<String>, action: impl Into<String>) -> Self {
        let (event, action) = (event.into(), action.into());
        let from = &mut self.last_state().on_entry_from;
        match from.iter_mut().find(|(e, _)| *e == event) {
            Some((_, actions)) => actions.push(action),
            None => from.push((event, vec![action])),
        }
        self
    }

    /// Adds an event valid in `valid_in` that triggers `action`.
    pub fn event<I, S>(self, name: impl Into<String>, valid_in: I, action: impl Into<String>) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut b = self.guarded_event(name, valid_in);
        b.last_event().action = action.into();
        b
    }
    fn last_event(&mut self) -> &mut EventDef {
        assert!(matches!(self.last, Last::Event), "call .event(...) first");
        self.def.events.last_mut().expect("an event was added")
    }
    /// Adds an event valid in `valid_in` whose alternatives ([`when`](Self::when),
    /// [`when_rejecting`](Self::when_rejecting)) decide what it does.
    pub fn guarded_event<I, S>(mut self, name: impl Into<String>, valid_in: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.def.events.push(EventDef {
            name: name.into(),
            valid_in: valid_in.into_iter().map(Into::into).collect(),
            ..EventDef::default()
        });
        self.last = Last::Event;
        self
    }
    /// Adds an alternative to the last event: when `guard` holds (`None`: always), run
    /// `action`.
    pub fn when(mut self, guard: Option<&str>, action: impl Into<String>) -> Self {
        let when = WhenDef { guard: guard.map(str::to_string), action: Some(action.into()), ..WhenDef::default() };
        self.last_event().when.push(when);
        self
    }
    /// Adds an alternative to the last event: when `guard` holds, reject it with `reason`.
    pub fn when_rejecting(mut self, guard: Option<&str>, reason: impl Into<String>) -> Self {
        let when = WhenDef { guard: guard.map(str::to_string), reject: Some(reason.into()), ..WhenDef::default() };
        self.last_event().when.push(when);
        self
    }
    /// Adds an alternative to the last event: when `guard` holds, accept it and drop it
    /// (recorded as ignored; Stateless's `IgnoreIf`).
    pub fn when_ignoring(mut self, guard: Option<&str>) -> Self {
        let when = WhenDef { guard: guard.map(str::to_string), ignore: true, ..WhenDef::default() };
        self.last_event().when.push(when);
        self
    }
    /// Restricts the last event's last alternative to these of its states.
    pub fn when_in<I, S>(mut self, states: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let w = self.last_event().when.last_mut().expect("call .when(...) first");
        w.valid_in = states.into_iter().map(Into::into).collect();
        self
    }
    /// Declares states where the last event is accepted and dropped.
    pub fn ignore<I, S>(mut self, states: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.last_event().ignore.extend(states.into_iter().map(Into::into));
        self
    }
    /// Makes the last event an internal transition: its action's effects commit without
    /// leaving or entering any state.
    pub fn internal(mut self) -> Self {
        self.last_event().internal = true;
        self
    }
    /// Gives the last event a default priority (`priority = N`): the work it starts waits in
    /// a limit's line by it, higher first, when its request gives none.
    pub fn priority(mut self, priority: i64) -> Self {
        self.last_event().priority = Some(priority);
        self
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
    /// Adds an action with no target: an entry, exit or internal action.
    pub fn effect(self, name: impl Into<String>) -> Self {
        self.action(name, Vec::<String>::new())
    }
    fn last_action(&mut self) -> &mut ActionDef {
        assert!(matches!(self.last, Last::Action), "call .action(...) first");
        self.def.actions.last_mut().expect("an action was added")
    }
    /// Makes the last action declarative: it sets `property` to `value` (`null` removes it).
    pub fn sets(mut self, property: impl Into<String>, value: serde_json::Value) -> Self {
        self.last_action().set.push((property.into(), value));
        self
    }
    /// Makes the last action declarative: it creates an entity of `machine` whose key is the
    /// expression `key` (e.g. `"key + '-db'"`), with `properties` (a string is an
    /// expression) and a first `event` (with `params`), recorded as a successor.
    pub fn creates(
        mut self,
        machine: impl Into<String>,
        key: impl Into<String>,
        properties: serde_json::Value,
        event: Option<(&str, serde_json::Value)>,
    ) -> Self {
        let properties = properties.as_object().map(|o| o.clone().into_iter().collect()).unwrap_or_default();
        let (event, params) = match event {
            Some((e, p)) => (Some(e.to_string()), p),
            None => (None, serde_json::Value::Null),
        };
        self.last_action().create.push(super::CreateDef {
            machine: machine.into(),
            key: key.into(),
            properties,
            event,
            params,
            reply: None,
        });
        self
    }
    /// Makes the last action declarative: it raises `event` with `params` on every
    /// entity related to the entity as `on` says.
    pub fn raises(mut self, event: impl Into<String>, on: Related, params: serde_json::Value) -> Self {
        let raise = RaiseDef { event: event.into(), on: on.as_str().to_string(), params, ..RaiseDef::default() };
        self.last_action().raise.push(raise);
        self
    }
    /// Declares the property names the machine's entities carry (guards may read them).
    pub fn properties<I, S>(mut self, names: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.def.properties.extend(names.into_iter().map(Into::into));
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
    /// Declares the machines whose entities the last action may create (its outcome, whoever
    /// writes it, is refused beyond them; an agent's action declares none by default).
    pub fn may_create<I, S>(mut self, machines: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        assert!(matches!(self.last, Last::Action), "call .action(...) first");
        let a = self.def.actions.last_mut().expect("an action was added");
        a.may_create = Some(machines.into_iter().map(Into::into).collect());
        self
    }
    /// Declares the events the last action may raise on other entities, by key or by
    /// relation (beyond them its outcome is refused; an agent's action declares none by
    /// default).
    pub fn may_raise<I, S>(mut self, events: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        assert!(matches!(self.last, Last::Action), "call .action(...) first");
        let a = self.def.actions.last_mut().expect("an action was added");
        a.may_raise = Some(events.into_iter().map(Into::into).collect());
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

    /// How live entities move to this version (`upgrade = "pin"`; the default migrates
    /// them at once).
    pub fn upgrade(mut self, policy: crate::upgrade::Policy) -> Self {
        self.def.upgrade = Some(policy.as_str().to_string());
        self
    }

    /// The event that undoes an entity's part in a canceled operation (`cancel = "abort"`).
    pub fn cancel_event(mut self, event: impl Into<String>) -> Self {
        self.def.cancel = Some(event.into());
        self
    }

    /// The event that takes an entity to its deleted state (`delete = "destroy"`), raised
    /// by a predecessor's cascading delete.
    pub fn delete_event(mut self, event: impl Into<String>) -> Self {
        self.def.delete = Some(event.into());
        self
    }

    /// Operator commands that reach an entity's successors too (`cascade = ["kill"]`).
    pub fn cascade<I, S>(mut self, commands: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.def.cascade = commands.into_iter().map(Into::into).collect();
        self
    }

    /// Adds a flow-control limit (`[limits.NAME]`), as declared; see [`crate::limits`].
    pub fn limit(mut self, limit: super::def::LimitDef) -> Self {
        self.def.limits.push(limit);
        self.last = Last::None;
        self
    }

    /// Adds a calendar schedule (`[schedules.NAME]`), as declared; see [`crate::calendar`].
    pub fn schedule(mut self, schedule: super::def::CalendarDef) -> Self {
        self.def.schedules.push(schedule);
        self.last = Last::None;
        self
    }

    /// How long an entity stays after entering an end state without a `retain` of its own
    /// (`[retention] ended`). A machine-wide setting, like the fault policy.
    pub fn retention_ended(mut self, keep: crate::retention::Keep) -> Self {
        self.def.retention.get_or_insert_with(Default::default).ended = Some(keep);
        self
    }

    /// Whether entities removed by retention are archived first (`[retention] archive`),
    /// whatever the deployment says.
    pub fn retention_archive(mut self, archive: bool) -> Self {
        self.def.retention.get_or_insert_with(Default::default).archive = Some(archive);
        self
    }

    /// What a live entity keeps of its history, events and errors: rows younger than
    /// `age` (`[retention] history`) and, with `rows`, only its latest `rows` of each
    /// (`history_rows`). The latest is always kept.
    pub fn retention_history(mut self, age: crate::retention::Keep, rows: Option<u32>) -> Self {
        let r = self.def.retention.get_or_insert_with(Default::default);
        (r.history, r.history_rows) = (Some(age), rows);
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
