//! The engine's decisions, pure: an entity it holds × an input × now → a commit and the
//! effects to carry out.
//!
//! The scheduler (the IO loop) asks here what to do with an entity whose lease it holds,
//! and carries the answer out; nothing here reads the clock, touches the store, spawns,
//! records metrics or logs. The questions and where they are answered:
//! - what is the held entity's next step ([`next`]): its first inbox item (an event, a
//!   fired timer, a successor's change notice, an agent's report), else its auto action
//!   when due, else release the lease;
//! - what does an action's result become ([`action_done`]): a transition commit with its
//!   effects (`transition`: created entities, raised events, SQL, timers, agent task,
//!   telemetry), or, if it failed or the core refuses the outcome, a fault (`fault`);
//! - what do the subscriptions' evaluation ([`evaluated`]) and a failed commit
//!   ([`commit_failed`]) come to;
//! - what does a commit that landed change in the held snapshot ([`Expect::apply`]).
//!
//! Rules about one machine (may this event run here, what does the entity enter, which
//! timers start, which subscription fires) are `settle_core::step`'s; this module turns
//! them into the store's [`Commit`]s.

mod failure;
mod fault;
mod parts;
mod reply;
#[cfg(test)]
mod tests;
mod transition;

use std::sync::Arc;

use serde_json::{Value, json};
use settle_core::pattern::SuccessorView;
use settle_core::step::{self, EventStep};
use settle_core::{Action, ActionName, EntityKey, EventName, Machine, Properties, StateKind, StateName};
use settle_store::{
    AfterCommit, AgentReport, Commit, EntityRow, EventRecord, Fence, HistoryKind, InboxItem, InboxKind, Millis,
    TaskResult, Telemetry, Trigger,
};

pub(crate) use fault::{FaultError, fault};
use parts::task_offer;
pub(crate) use reply::replies;
pub(crate) use transition::{
    Hooks, Ran, check_effects, declare, hooks_done, in_order, new_entity, own_effects, transition,
};

use crate::api::EventOutcome;
use crate::handler::Outcome;
use crate::registry::Registry;

/// What the decisions need beside the entity: the machines and handlers, this engine's
/// lease owner name, and the time.
pub(crate) struct Env<'a> {
    pub(crate) registry: &'a Registry,
    pub(crate) owner: &'a str,
    pub(crate) now: Millis,
}

/// An entity this engine holds the lease of, as the decisions see it.
#[derive(Debug, Clone)]
pub(crate) struct Held {
    pub(crate) machine: Arc<Machine>,
    pub(crate) entity: EntityRow,
    /// The next inbox item, when known.
    pub(crate) inbox_head: Option<InboxItem>,
    /// The subscription event being processed.
    pub(crate) firing: Option<Firing>,
    /// The agent report (inbox id) the current step concludes: consumed by its commit.
    pub(crate) agent_report: Option<i64>,
    /// The event whose workflow the entity is in (`entity.event_id`), with its parameters:
    /// what an auto action runs for.
    pub(crate) trigger: Option<Trigger>,
    /// The content hash of `machine`, the version the entity runs under (`None`: its
    /// machine's current one).
    pub(crate) hash: Option<String>,
    /// It holds the slot of its state's concurrency limit for the auto action about to run
    /// ([`Next::Acquire`]); given back by the commit that ends the action.
    pub(crate) slots: bool,
    /// It holds the slots of the limits of workflows of the event it is about to process
    /// (taken by [`Next::Acquire`] with `workflow`); given back by the commit that brings
    /// it to rest.
    pub(crate) workflow_slots: bool,
    /// A commit of this hold brought it to rest (and gave back any workflow slots): nothing
    /// is left to give back when it is let go.
    pub(crate) rested: bool,
}

impl Held {
    /// A freshly claimed entity, with the first item of its inbox and the event its
    /// workflow runs for.
    pub(crate) fn new(
        machine: Arc<Machine>,
        entity: EntityRow,
        inbox_head: Option<InboxItem>,
        trigger: Option<Trigger>,
    ) -> Self {
        Held {
            machine,
            entity,
            inbox_head,
            firing: None,
            agent_report: None,
            trigger,
            hash: None,
            slots: false,
            workflow_slots: false,
            rested: false,
        }
    }

    /// The version its commits record: the one it runs under.
    pub(crate) fn version(&self, env: &Env<'_>) -> Option<String> {
        self.hash.clone().or_else(|| env.registry.hash(self.machine.name()))
    }

    /// The event an action runs for, and its parameters: `item` when it runs for an
    /// event, else (an auto action, or the entry and exit actions of its transition) the
    /// event whose workflow the entity is in; no event: `None` and `Null`.
    pub(crate) fn runs_for<'a>(&'a self, item: Option<&'a InboxItem>) -> (Option<&'a EventName>, &'a Value) {
        match (item, &self.trigger) {
            (Some(i), _) => (Some(&i.event), &i.params),
            (None, Some(t)) => (Some(&t.event), &t.params),
            (None, None) => (None, &Value::Null),
        }
    }

    fn unstable(&self) -> bool {
        self.machine.state(&self.entity.state).is_some_and(|s| s.kind == StateKind::Unstable)
    }

    fn fence(&self, owner: &str) -> Fence {
        Fence { entity_id: self.entity.id, version: self.entity.version, owner: owner.to_string() }
    }

    /// After a commit that changes no state: keep the lease if the auto action is due now.
    fn after_unchanged(&self, now: Millis) -> AfterCommit {
        if step::auto_due(&self.machine, &self.entity.state, self.entity.auto_at, now) {
            AfterCommit::Hold
        } else {
            AfterCommit::Release
        }
    }
}

/// A subscription event being processed: the notices its evaluation covered.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Firing {
    pub(crate) event: EventName,
    pub(crate) notices_upto: i64,
}

/// The next step of a held entity.
#[derive(Debug)]
pub(crate) enum Next {
    /// Write this commit.
    Commit(Box<Decided>),
    /// Run the action's handler, for the event that triggered it (`None`: the auto action).
    Run { action: Box<Action>, item: Option<InboxItem> },
    /// Run the entry and exit actions of a transition (some have handlers), then decide
    /// its commit with their effects ([`hooks_done`]).
    Hooks(Box<Hooks>),
    /// Read the successors and evaluate the subscriptions for this change notice.
    Evaluate { notice: InboxItem },
    /// Take the slot of the state's concurrency limit before its auto action starts; once
    /// held ([`Held::slots`]), decide again. Waiting in line, the entity is let go.
    Acquire(Box<settle_store::Acquire>),
    /// Nothing to do now: release the lease (the store keeps the due time).
    Release,
}

/// Something the loop should log or count about a decision (the decisions do neither).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Note {
    /// An event was rejected.
    Rejected { event: EventName, reason: String, request_id: Option<String> },
    /// An action failed: parked, or backing off.
    Fault { kind: &'static str, details: String, parked: bool },
    /// An agent report that concludes nothing (another state entry, or no agent action).
    ReportDropped { task: Option<i64>, stale: bool },
}

/// A decided commit, with what to do once it lands.
#[derive(Debug)]
pub(crate) struct Decided {
    pub(crate) commit: Commit,
    /// The event processed, if any: whoever waits on it hears `outcome`.
    pub(crate) item: Option<InboxItem>,
    /// The action that ran (a failed commit becomes its fault).
    pub(crate) action: Option<ActionName>,
    pub(crate) outcome: Option<EventOutcome>,
    pub(crate) note: Option<Note>,
}

impl Decided {
    fn new(commit: Commit) -> Self {
        Decided { commit, item: None, action: None, outcome: None, note: None }
    }

    /// What the commit changes in the held snapshot once it lands, and whom it answers.
    pub(crate) fn expect(&self) -> Expect {
        let c = &self.commit;
        let t = &c.telemetry;
        // The entity's current event: none at rest; the one just processed when it moved
        // the entity on (into a state, or internally), as the store records it; otherwise
        // unchanged.
        let began = t.event.as_ref().filter(|_| c.to.is_some() || c.internal);
        let (event_id, trigger) = if t.at_rest {
            (None, Some(None))
        } else if let Some(ev) = began {
            // Its `events` row (only a named event has one) is what a claim reads back; the
            // reply an event that moved it on owes goes when its workflow ends (an internal
            // one's, at once).
            let trigger = c.event.as_ref().map(|name| Trigger {
                event: name.clone(),
                params: ev.params.clone(),
                reply: c.to.as_ref().and(ev.reply.clone()),
            });
            (Some(ev.seq), Some(trigger))
        } else {
            (t.current_event, None)
        };
        Expect {
            entity_id: c.fence.entity_id,
            entry: c.to.clone().map(|to| (to, c.retry, c.auto_at)),
            properties: c.properties.clone(),
            fired: c.fired.clone(),
            event_id,
            trigger,
            request_id: c.request_id.clone(),
            after: c.after,
            item: self.item.clone(),
            action: self.action.clone(),
            outcome: self.outcome.clone(),
            version: None,
            notices: c.consume_notices_upto.is_some(),
        }
    }
}

/// Moves a held entity running under an older version of its machine to the current one
/// with `commit`, when it may: at once if the current version migrates (`upgrade`, the
/// default), else (`pin`) once the commit leaves it at rest in its own version. The commit's
/// state is mapped into the current version (`renamed_from`, `[migrate]`, a parent's
/// initial leaf); a commit that changes no state moves it only where its state keeps its
/// name. Returns the version the entity moves to, for the held snapshot; `None`: it stays.
/// A move is not a transition: no entry or exit action runs.
pub(crate) fn upgrade(held: &Held, commit: &mut Commit, registry: &Registry) -> Option<(String, Arc<Machine>)> {
    let name = held.machine.name();
    let current_hash = registry.hashes.get(name)?;
    // Only from a version known to be older: one this engine does not know is newer.
    if held.hash.as_ref().is_none_or(|h| h == current_hash || !registry.versions.contains_key(h)) {
        return None;
    }
    let current = registry.machines.get(name)?;
    let after = commit.to.as_ref().unwrap_or(&commit.from);
    if current.upgrade() == settle_core::upgrade::Policy::Pin && !held.machine.state(after).is_some_and(|s| s.at_rest())
    {
        return None;
    }
    let home = settle_core::upgrade::home(current, after)?;
    match &mut commit.to {
        Some(to) => *to = home,
        None if home == commit.from => {}
        None => return None,
    }
    commit.machine_hash = Some(current_hash.clone());
    Some((current_hash.clone(), current.clone()))
}

/// A commit in flight: what its success changes in the held snapshot, and whom to tell.
/// The commit itself goes to the store; only these few fields are kept.
#[derive(Debug, Clone)]
pub(crate) struct Expect {
    pub(crate) entity_id: i64,
    /// The state entered, its retry count and auto action time (`None`: no state change).
    pub(crate) entry: Option<(StateName, u32, Option<Millis>)>,
    pub(crate) properties: Option<Properties>,
    pub(crate) fired: Option<Vec<EventName>>,
    /// The entity's current event after the commit.
    pub(crate) event_id: Option<i64>,
    /// The event its workflow runs for after the commit (`None`: unchanged).
    pub(crate) trigger: Option<Option<Trigger>>,
    pub(crate) request_id: Option<String>,
    pub(crate) after: AfterCommit,
    /// The event processed, if any.
    pub(crate) item: Option<InboxItem>,
    /// The action that ran (for turning a failed commit into a fault).
    pub(crate) action: Option<ActionName>,
    pub(crate) outcome: Option<EventOutcome>,
    /// The version the commit moves the entity to ([`upgrade`]), with its hash.
    pub(crate) version: Option<(String, Arc<Machine>)>,
    /// The commit consumes change notices: the operations of the successors that sent
    /// them (whichever they are) may end with it.
    pub(crate) notices: bool,
}

impl Expect {
    /// Brings the held snapshot up to the commit that landed (new `version`, at `now`);
    /// answers whether the entity is at rest now.
    pub(crate) fn apply(&mut self, held: &mut Held, version: i64, now: Millis) -> bool {
        let e = &mut held.entity;
        e.version = version;
        if let Some((state, retry, auto_at)) = self.entry.clone() {
            e.state = state;
            e.retry = retry;
            e.auto_at = auto_at;
            e.entered_at = now;
            if self.request_id.is_some() {
                e.request_id = self.request_id.clone();
            }
        }
        if let Some(p) = self.properties.take() {
            e.properties = p;
        }
        if let Some(f) = self.fired.take() {
            e.fired = f;
        }
        e.event_id = self.event_id;
        if let Some(trigger) = self.trigger.take() {
            held.trigger = trigger;
        }
        if let Some((hash, machine)) = self.version.take() {
            held.hash = Some(hash);
            held.machine = machine;
        }
        !held.unstable()
    }
}

/// Decides the next step of a held entity that runs nothing: its first inbox item, else
/// its auto action when due, else release.
pub(crate) fn next(held: &mut Held, env: &Env<'_>) -> Next {
    if let Some(item) = held.inbox_head.take() {
        return match item.kind {
            InboxKind::Notice => notice(held, item, env),
            InboxKind::Timer => {
                let name = item.params.get("timer").and_then(Value::as_str).unwrap_or_default().to_string();
                if step::timer_applies(&held.machine, &held.entity.state, &name, &item.event) {
                    event(held, InboxItem { params: Value::Null, ..item }, env)
                } else {
                    let reason = format!("timer `{name}` does not apply in state `{}`", held.entity.state);
                    commit(reject(held, item, reason, env))
                }
            }
            InboxKind::Raised | InboxKind::Nested | InboxKind::Reply | InboxKind::Internal => event(held, item, env),
            InboxKind::Agent => agent_reported(held, item, env),
        };
    }
    if !step::auto_due(&held.machine, &held.entity.state, held.entity.auto_at, env.now) {
        if !held.unstable() && held.machine.has_workflow_limits() && !held.rested {
            // Claimed at rest with nothing to do (admitted to a workflow's slot whose event
            // was canceled meanwhile): a quiet commit at rest gives any slot back.
            return commit(rest(held, env));
        }
        // Nothing to do now: the store keeps the due time of the auto action.
        return Next::Release;
    }
    let machine = held.machine.clone();
    let state = machine.state(&held.entity.state).expect("entity state exists in its machine");
    let auto = state.auto.as_ref().expect("unstable state has auto");
    let has_handler = env.registry.handler(machine.name(), auto).is_some();
    let step = step::on_auto(&machine, &state.name, has_handler);
    // An agent's task already offered runs under the slot taken before it was offered.
    let offered = matches!(step, Some(EventStep::Agent { .. })) && held.entity.auto_at.is_none();
    if machine.is_limited(&state.name) && !held.slots && !offered {
        return match slot_asks(&machine, &state.name, &held.entity.properties, &held.entity.key) {
            Ok(slots) => Next::Acquire(Box::new(settle_store::Acquire {
                fence: held.fence(env.owner),
                slots,
                priority: None,
                workflow: false,
                request_id: None,
            })),
            Err(e) => commit(fault(held, None, Some(auto.as_str()), FaultError::new("limit_key", e), env)),
        };
    }
    match step {
        Some(EventStep::Plain { action, target }) => {
            let outcome = target.map_or_else(Outcome::stay, Outcome::to);
            transition(held, Ran { action, item: None, outcome, locks: Vec::new(), started: None }, env)
        }
        Some(EventStep::Run { action }) => Next::Run { action: Box::new(action.clone()), item: None },
        // Due without a task (first entry after a resume, or a retry-now): offer it.
        Some(EventStep::Agent { .. }) if held.entity.auto_at.is_some() => commit(offer_now(held, env)),
        // The task is offered; the agent's report will make the entity due.
        Some(EventStep::Agent { .. }) => Next::Release,
        _ => unreachable!("an unstable state's auto step is plain, run or agent"),
    }
}

/// Whether the auto action of `state` is an agent's (its slots may stay with a call in
/// flight when the entity leaves).
pub(crate) fn runs_at_an_agent(machine: &Machine, state: &str) -> bool {
    matches!(step::on_auto(machine, state, false), Some(EventStep::Agent { .. }))
}

/// The slots a commit of `held` asks for in its own transaction ([`Commit::acquire`]): those
/// of the limited state it enters, when the holder runs its auto action next (it keeps the
/// lease, the entity stays active, and the action is due now, not a task offered already).
/// `None`: nothing to ask, or a key that cannot be evaluated (the holder's own ask faults
/// it, naming the limit).
///
/// [`Commit::acquire`]: settle_store::Commit::acquire
pub(crate) fn entry_slots(held: &Held, c: &Commit, now: Millis) -> Option<Vec<settle_store::SlotAsk>> {
    let to = c.to.as_ref()?;
    let runs_now = c.after == AfterCommit::Hold
        && c.offer.is_none()
        && c.auto_at.is_some_and(|at| at <= now)
        && c.run_status.is_none_or(|(s, _)| s == settle_store::RunStatus::Active);
    if !runs_now || !held.machine.is_limited(to) {
        return None;
    }
    let props = c.properties.as_ref().unwrap_or(&held.entity.properties);
    slot_asks(&held.machine, to, props, &held.entity.key).ok()
}

/// A slot of each limit the auto action of `state` counts against, for an entity of these
/// properties and key: its key and fairness values evaluated (`Err`: the first that could
/// not be, named).
fn slot_asks(
    machine: &Machine,
    state: &str,
    props: &Properties,
    key: &EntityKey,
) -> Result<Vec<settle_store::SlotAsk>, String> {
    asks_of(machine.limits_of(state), props, key)
}

/// A slot of each of `limits` for an entity of these properties and key.
fn asks_of<'m>(
    limits: impl Iterator<Item = &'m settle_core::limits::Limit>,
    props: &Properties,
    key: &EntityKey,
) -> Result<Vec<settle_store::SlotAsk>, String> {
    limits
        .map(|limit| {
            Ok(settle_store::SlotAsk {
                limit: limit.name().to_string(),
                key: limit.key_of(props, key)?,
                max: limit.def.max,
                rate: limit
                    .def
                    .rate
                    .map(|starts| settle_store::Rate { starts, per_ms: limit.def.per().as_millis() as u64 }),
                fair: limit.fair_of(props, key)?,
            })
        })
        .collect()
}

fn commit(d: Decided) -> Next {
    Next::Commit(Box::new(d))
}

/// An event (raised, nested, a timer's, or a subscription that fired) in the held state:
/// its level, its alternative (guards read the entity's properties and the event's
/// parameters), then what that alternative does.
fn event(held: &mut Held, item: InboxItem, env: &Env<'_>) -> Next {
    let machine = held.machine.clone();
    let has_handler = |a: &Action| env.registry.handler(machine.name(), &a.name).is_some();
    let e = &held.entity;
    match step::on_event(&machine, &e.state, &item.event, &has_handler, &e.properties, &item.params) {
        EventStep::Reject(rejection) => commit(reject(held, item, rejection.reason, env)),
        EventStep::Ignore { level } => commit(ignored(held, item, &level, env)),
        // It starts a workflow a limit counts: its slots first (the event waits at the head
        // of the inbox meanwhile, or in the limit's line with the entity at rest).
        step if !held.workflow_slots && machine.workflow_limits_of(&item.event).next().is_some() => {
            let slots = match asks_of(machine.workflow_limits_of(&item.event), &e.properties, &e.key) {
                Ok(slots) => slots,
                Err(e) => return commit(reject(held, item, e, env)),
            };
            if let EventStep::Plain { action, target } = step {
                // Nothing runs before its commit: the commit takes them first, or is not
                // applied and the entity waits in line.
                let outcome = target.map_or_else(Outcome::stay, Outcome::to);
                let ran = Ran { action, item: Some(item.clone()), outcome, locks: Vec::new(), started: None };
                if let Next::Commit(mut d) = transition(held, ran, env)
                    && d.commit.sql.is_empty()
                {
                    d.commit.take_first = Some(slots);
                    return Next::Commit(d);
                }
            }
            let ask = settle_store::Acquire {
                fence: held.fence(env.owner),
                slots,
                priority: None,
                workflow: true,
                request_id: item.request_id.clone(),
            };
            held.inbox_head = Some(item);
            Next::Acquire(Box::new(ask))
        }
        EventStep::Plain { action, target } => {
            let outcome = target.map_or_else(Outcome::stay, Outcome::to);
            transition(held, Ran { action, item: Some(item), outcome, locks: Vec::new(), started: None }, env)
        }
        EventStep::Run { action } => Next::Run { action: Box::new(action.clone()), item: Some(item) },
        EventStep::Agent { .. } => unreachable!("validation keeps agent actions off events"),
    }
}

/// A change notice: evaluate the subscriptions, unless none is waiting in this state entry.
fn notice(held: &mut Held, notice: InboxItem, env: &Env<'_>) -> Next {
    let e = &held.entity;
    if held.machine.subscriptions_in(&e.state).any(|ev| !e.fired.contains(&ev.name)) {
        Next::Evaluate { notice }
    } else {
        // Nothing here listens: the notices are moot for this state entry (entering a state
        // with subscriptions evaluates them afresh).
        commit(quiet(held, &notice, i64::MAX, env))
    }
}

/// The subscriptions were evaluated for `notice` over a snapshot whose newest notice is
/// `newest`: process the event that fired, or consume the notices it covered quietly.
pub(crate) fn evaluated(
    held: &mut Held,
    notice: InboxItem,
    fire: Option<(EventName, Value)>,
    newest: Option<i64>,
    env: &Env<'_>,
) -> Next {
    let notices_upto = newest.unwrap_or(notice.id).max(notice.id);
    match fire {
        Some((event_name, params)) => {
            held.firing = Some(Firing { event: event_name.clone(), notices_upto });
            event(held, InboxItem { event: event_name, params, ..notice }, env)
        }
        None => commit(quiet(held, &notice, notices_upto, env)),
    }
}

/// Runs `f` over `successors` as subscription patterns see them: each with its state's
/// ancestors (so `in [parent]` matches its substates) and health, from the registered
/// machines.
fn with_views<'m, R>(
    machine_of: impl Fn(&str) -> Option<&'m Machine>,
    successors: &[EntityRow],
    f: impl FnOnce(&[SuccessorView<'_>]) -> R,
) -> R {
    let ancestors: Vec<Vec<&str>> = successors
        .iter()
        .map(|e| match machine_of(e.machine.as_str()) {
            Some(m) if m.is_nested() => m.path(&e.state).skip(1).map(|s| s.name.as_str()).collect(),
            _ => Vec::new(),
        })
        .collect();
    let views: Vec<SuccessorView<'_>> = successors
        .iter()
        .zip(&ancestors)
        .map(|(e, ancestors)| SuccessorView {
            machine: &e.machine,
            key: &e.key,
            state: &e.state,
            ancestors,
            health: machine_of(e.machine.as_str()).map(|m| m.health_of(&e.state)).unwrap_or_default(),
        })
        .collect();
    f(&views)
}

/// The subscription that fires for the held state over `successors` (first valid, unfired,
/// matching), with the matched successors as the event's parameters.
pub(crate) fn subscription_fires(
    machine: &Machine,
    registry: &Registry,
    state: &str,
    fired: &[EventName],
    successors: &[EntityRow],
) -> Option<(EventName, Value)> {
    with_views(
        |name| registry.machine(name).ok().map(|m| &**m),
        successors,
        |views| {
            let (ev, indices) = step::fire(machine, state, fired, views)?;
            let matched: Vec<Value> = indices
                .iter()
                .map(|&i| json!({"machine": views[i].machine, "key": views[i].key, "state": views[i].state}))
                .collect();
            Some((ev.name.clone(), json!({ "matched": matched })))
        },
    )
}

/// How far each subscription valid in `entity`'s state is from firing over `successors`.
pub(crate) fn subscription_progress(
    machine: &Machine,
    registry: &Registry,
    entity: &EntityRow,
    successors: &[EntityRow],
) -> Vec<crate::SubscriptionProgress> {
    subscription_progress_with(machine, |name| registry.machine(name).ok().map(|m| &**m), entity, successors)
}

/// How far each subscription valid in `entity`'s state (of `machine`) is from firing over
/// its `successors`, each seen with its state's ancestors and health in its own machine,
/// looked up by `machine_of`: what [`Engine::subscription_progress`](crate::Engine::subscription_progress)
/// answers, for a caller holding the definitions without an engine (e.g. read from the
/// store). Nothing is raised.
pub fn subscription_progress_with<'m>(
    machine: &Machine,
    machine_of: impl Fn(&str) -> Option<&'m Machine>,
    entity: &EntityRow,
    successors: &[EntityRow],
) -> Vec<crate::SubscriptionProgress> {
    with_views(machine_of, successors, |views| {
        machine
            .subscriptions_in(&entity.state)
            .filter_map(|ev| ev.subscribe.as_ref().map(|sub| (ev, sub)))
            .map(|(ev, sub)| crate::SubscriptionProgress {
                event: ev.name.clone(),
                pattern: sub.pattern.to_string(),
                progress: sub.pattern.progress(views),
                fired: entity.fired.contains(&ev.name),
            })
            .collect()
    })
}

/// An agent reported on a task of this entity: its outcome is the auto action's, and is
/// committed like a handler's. A report for an earlier state entry, or for a state whose
/// auto action no agent executes, is consumed and changes nothing.
fn agent_reported(held: &mut Held, item: InboxItem, env: &Env<'_>) -> Next {
    let report = AgentReport::from_json(&item.params);
    let action = step::agent_action(&held.machine, &held.entity.state).cloned();
    let (Some(report), Some(action)) = (report, action) else {
        let mut d = quiet(held, &item, 0, env);
        d.note = Some(Note::ReportDropped { task: None, stale: false });
        return commit(d);
    };
    if report.entity_version != held.entity.version {
        let mut d = quiet(held, &item, 0, env);
        d.note = Some(Note::ReportDropped { task: Some(report.task), stale: true });
        return commit(d);
    }
    held.agent_report = Some(item.id);
    match report.result {
        TaskResult::Complete(decided) => {
            // The agent's outcome is the action's, as a handler's would be.
            let outcome = Outcome::from(decided);
            transition(
                held,
                Ran { action: &action, item: None, outcome, locks: Vec::new(), started: Some(report.leased_at) },
                env,
            )
        }
        TaskResult::Fail { error, retryable } => {
            let agent = report.agent.as_deref().unwrap_or("an agent");
            let details = format!("{agent} failed task {} (attempt {}): {error}", report.task, report.attempt);
            let error = FaultError { fatal: !retryable, ..FaultError::new("agent_error", details) };
            commit(fault(held, None, Some(&action.name), error, env))
        }
    }
}

/// An action's handler finished (started at `started`, having read `locks` with lock).
pub(crate) fn action_done(
    held: &mut Held,
    action: &Action,
    item: Option<InboxItem>,
    result: std::result::Result<Outcome, FaultError>,
    locks: Vec<(i64, i64)>,
    started: Millis,
    env: &Env<'_>,
) -> Next {
    match result {
        Ok(outcome) => transition(held, Ran { action, item, outcome, locks, started: Some(started) }, env),
        Err(error) => commit(fault(held, item, Some(&action.name), error, env)),
    }
}

/// The commit of an action that failed to commit (an effect or precondition failed;
/// nothing of it is visible): a fault of that action.
pub(crate) fn commit_failed(held: &mut Held, expect: Expect, error: String, env: &Env<'_>) -> Decided {
    let error = FaultError::new("commit_failed", format!("commit failed: {error}"));
    fault(held, expect.item, expect.action.as_deref(), error, env)
}

/// Records a rejected event: consumed, nothing else changes.
pub(crate) fn reject(held: &mut Held, item: InboxItem, reason: String, env: &Env<'_>) -> Decided {
    let after = held.after_unchanged(env.now);
    let outcome = EventOutcome::Rejected { state: held.entity.state.clone(), reason: reason.clone() };
    let mut commit = Commit {
        retry: held.entity.retry,
        event: Some(item.event.clone()),
        consume: Some(item.id),
        request_id: item.request_id.clone(),
        detail: Some(reason.clone()),
        machine_hash: held.version(env),
        telemetry: Telemetry {
            event: Some(EventRecord::of(&item, true, false)),
            at_rest: !held.unstable(),
            // The rejected event's operation may have nothing left to wait for.
            complete: true,
            current_event: held.entity.event_id,
            ..Telemetry::default()
        },
        ..Commit::new(held.fence(env.owner), held.entity.state.clone(), HistoryKind::Rejected, after)
    };
    if let Some(f) = held.firing.take() {
        commit.consume_notices_upto = Some(f.notices_upto);
    }
    let note = Note::Rejected { event: item.event.clone(), reason, request_id: item.request_id.clone() };
    Decided { outcome: Some(outcome), item: Some(item), note: Some(note), ..Decided::new(commit) }
}

/// Records an event accepted and dropped: `level` (the state or an ancestor) ignores it.
/// Consumed; nothing else changes.
fn ignored(held: &mut Held, item: InboxItem, level: &str, env: &Env<'_>) -> Decided {
    let after = held.after_unchanged(env.now);
    let outcome = EventOutcome::Ignored { state: held.entity.state.clone() };
    let detail = if level == held.entity.state.as_str() {
        format!("ignored in `{level}`")
    } else {
        format!("ignored in `{level}`, which contains `{}`", held.entity.state)
    };
    let mut commit = Commit {
        retry: held.entity.retry,
        event: Some(item.event.clone()),
        consume: Some(item.id),
        request_id: item.request_id.clone(),
        detail: Some(detail),
        machine_hash: held.version(env),
        telemetry: Telemetry {
            event: Some(EventRecord::of(&item, false, false)),
            at_rest: !held.unstable(),
            complete: true,
            current_event: held.entity.event_id,
            ..Telemetry::default()
        },
        ..Commit::new(held.fence(env.owner), held.entity.state.clone(), HistoryKind::Ignored, after)
    };
    if let Some(f) = held.firing.take() {
        commit.consume_notices_upto = Some(f.notices_upto);
    }
    Decided { outcome: Some(outcome), item: Some(item), ..Decided::new(commit) }
}

/// Consumes change notices (up to `notices_upto`) without a history row: nothing fired.
/// The operation the notice belongs to may be complete now.
fn quiet(held: &Held, notice: &InboxItem, notices_upto: i64, env: &Env<'_>) -> Decided {
    let e = &held.entity;
    Decided::new(Commit {
        retry: e.retry,
        consume: Some(notice.id),
        consume_notices_upto: Some(notices_upto),
        quiet: true,
        request_id: notice.request_id.clone(),
        telemetry: Telemetry {
            at_rest: !held.unstable(),
            complete: true,
            current_event: e.event_id,
            ..Telemetry::default()
        },
        ..Commit::new(held.fence(env.owner), e.state.clone(), HistoryKind::Event, held.after_unchanged(env.now))
    })
}

/// Lets an entity at rest go with a commit that changes nothing visible (no history row):
/// a holder sets [`Commit::leave_workflows`] on it, as on every commit at rest of a machine
/// with limits of workflows.
fn rest(held: &Held, env: &Env<'_>) -> Decided {
    let e = &held.entity;
    Decided::new(Commit {
        retry: e.retry,
        quiet: true,
        request_id: e.request_id.clone(),
        telemetry: Telemetry { at_rest: true, current_event: e.event_id, ..Telemetry::default() },
        ..Commit::new(held.fence(env.owner), e.state.clone(), HistoryKind::Event, AfterCommit::Release)
    })
}

/// Offers the entity's agent task now: its auto action came due without one (a resume
/// after parking, a retry-now).
fn offer_now(held: &Held, env: &Env<'_>) -> Decided {
    let e = &held.entity;
    Decided::new(Commit {
        retry: e.retry,
        quiet: true,
        request_id: e.request_id.clone(),
        offer: task_offer(&held.machine, &e.state, env.now),
        machine_hash: held.version(env),
        telemetry: Telemetry { current_event: e.event_id, ..Telemetry::default() },
        ..Commit::new(held.fence(env.owner), e.state.clone(), HistoryKind::Auto, AfterCommit::Release)
    })
}
