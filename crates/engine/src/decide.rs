//! The engine's decisions, pure: an entity it holds × an input × now → a commit and the
//! effects to carry out.
//!
//! The scheduler (the IO loop) asks here what to do with an entity whose lease it holds,
//! and carries the answer out; nothing here reads the clock, touches the store, spawns,
//! records metrics or logs. The questions and where they are answered:
//! - what is the held entity's next step ([`next`]): its first inbox item (an event, a
//!   fired timer, a successor's change notice, an agent's report), else its auto action
//!   when due, else release the lease;
//! - what does an action's result become ([`action_done`] → [`finish`] or [`fault`]): a
//!   transition commit with its effects (created entities, raised events, SQL, timers,
//!   agent task, telemetry), or, if the core refuses the outcome, a fault;
//! - what do the subscriptions' evaluation ([`evaluated`]) and a failed commit
//!   ([`commit_failed`]) come to;
//! - what does a commit that landed change in the held snapshot ([`Expect::apply`]).
//!
//! Rules about one machine (may this event run here, what does the entity enter, which
//! timers start, which subscription fires) are `settle_core::step`'s; this module turns
//! them into the store's [`Commit`]s.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use settle_core::fault::FaultDecision;
use settle_core::pattern::SuccessorView;
use settle_core::step::{self, EventStep};
use settle_core::{Action, ActionName, EntityKey, EventName, Health, Machine, Properties, StateKind, StateName};
use settle_store::{
    AfterCommit, AgentReport, Commit, EntityRow, ErrorRecord, EventRecord, Fence, HistoryKind, InboxItem, InboxKind,
    Millis, NewEntity, Push, RunStatus, TaskOffer, TaskResult, Telemetry, TimerPlan, TransitionRecord,
};

use crate::api::EventOutcome;
use crate::handler::{HandlerError, Outcome};
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
}

impl Held {
    /// A freshly claimed entity, with the first item of its inbox.
    pub(crate) fn new(machine: Arc<Machine>, entity: EntityRow, inbox_head: Option<InboxItem>) -> Self {
        Held { machine, entity, inbox_head, firing: None, agent_report: None }
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

/// A failed action, as the fault policy and the `errors` table see it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct FaultError {
    pub(crate) kind: &'static str,
    pub(crate) details: String,
    pub(crate) exception: Option<String>,
    /// Trying again cannot help (an agent's non-retryable failure): park at once.
    pub(crate) fatal: bool,
}

impl FaultError {
    pub(crate) fn new(kind: &'static str, details: impl Into<String>) -> Self {
        FaultError { kind, details: details.into(), exception: None, fatal: false }
    }

    /// A handler's result as the decisions take it: its error or panic becomes a fault.
    pub(crate) fn of_handler(
        r: std::result::Result<std::result::Result<Outcome, HandlerError>, String>,
    ) -> std::result::Result<Outcome, FaultError> {
        match r {
            Ok(Ok(outcome)) => Ok(outcome),
            Ok(Err(e)) => Err(FaultError::new("action_error", format!("action error: {e}"))),
            Err(panic) => Err(FaultError {
                kind: "panic",
                details: format!("action panicked: {panic}"),
                exception: Some(panic),
                fatal: false,
            }),
        }
    }
}

/// The next step of a held entity.
#[derive(Debug)]
pub(crate) enum Next {
    /// Write this commit.
    Commit(Box<Decided>),
    /// Run the action's handler, for the event that triggered it (`None`: the auto action).
    Run { action: Action, item: Option<InboxItem> },
    /// Read the successors and evaluate the subscriptions for this change notice.
    Evaluate { notice: InboxItem },
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
        // the entity on; otherwise unchanged.
        let event_id = if t.at_rest {
            None
        } else if c.to.is_some() && t.event.is_some() {
            c.consume
        } else {
            t.current_event
        };
        Expect {
            entity_id: c.fence.entity_id,
            entry: c.to.clone().map(|to| (to, c.retry, c.auto_at)),
            properties: c.properties.clone(),
            fired: c.fired.clone(),
            event_id,
            request_id: c.request_id.clone(),
            after: c.after,
            item: self.item.clone(),
            action: self.action.clone(),
            outcome: self.outcome.clone(),
        }
    }
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
    pub(crate) request_id: Option<String>,
    pub(crate) after: AfterCommit,
    /// The event processed, if any.
    pub(crate) item: Option<InboxItem>,
    /// The action that ran (for turning a failed commit into a fault).
    pub(crate) action: Option<ActionName>,
    pub(crate) outcome: Option<EventOutcome>,
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
            InboxKind::Raised | InboxKind::Nested => event(held, item, env),
            InboxKind::Agent => agent_reported(held, item, env),
        };
    }
    if !step::auto_due(&held.machine, &held.entity.state, held.entity.auto_at, env.now) {
        // Nothing to do now: the store keeps the due time of the auto action.
        return Next::Release;
    }
    let machine = held.machine.clone();
    let state = machine.state(&held.entity.state).expect("entity state exists in its machine");
    let auto = state.auto.as_ref().expect("unstable state has auto");
    let has_handler = env.registry.handler(machine.name(), auto).is_some();
    match step::on_auto(&machine, &state.name, has_handler) {
        Some(EventStep::Plain { action, target }) => {
            commit(finish(held, action, None, Outcome::to(target), Vec::new(), None, env))
        }
        Some(EventStep::Run { action }) => Next::Run { action: action.clone(), item: None },
        // Due without a task (first entry after a resume, or a retry-now): offer it.
        Some(EventStep::Agent { .. }) if held.entity.auto_at.is_some() => commit(offer_now(held, env)),
        // The task is offered; the agent's report will make the entity due.
        Some(EventStep::Agent { .. }) => Next::Release,
        _ => unreachable!("an unstable state's auto step is plain, run or agent"),
    }
}

fn commit(d: Decided) -> Next {
    Next::Commit(Box::new(d))
}

/// An event (raised, nested, a timer's, or a subscription that fired) in the held state.
fn event(held: &mut Held, item: InboxItem, env: &Env<'_>) -> Next {
    let machine = held.machine.clone();
    let has_handler =
        machine.event(&item.event).is_some_and(|e| env.registry.handler(machine.name(), &e.action).is_some());
    match step::on_event(&machine, &held.entity.state, &item.event, has_handler) {
        EventStep::Reject(rejection) => commit(reject(held, item, rejection.reason, env)),
        EventStep::Plain { action, target } => {
            commit(finish(held, action, Some(item), Outcome::to(target), Vec::new(), None, env))
        }
        EventStep::Run { action } => Next::Run { action: action.clone(), item: Some(item) },
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

/// The subscription that fires for the held state over `successors` (first valid, unfired,
/// matching), with the matched successors as the event's parameters.
pub(crate) fn subscription_fires(
    machine: &Machine,
    registry: &Registry,
    state: &str,
    fired: &[EventName],
    successors: &[EntityRow],
) -> Option<(EventName, Value)> {
    let views: Vec<SuccessorView<'_>> = successors
        .iter()
        .map(|e| SuccessorView {
            machine: &e.machine,
            key: &e.key,
            state: &e.state,
            health: registry.machines.get(&e.machine).map(|m| m.health_of(&e.state)).unwrap_or_default(),
        })
        .collect();
    let (ev, indices) = step::fire(machine, state, fired, &views)?;
    let matched: Vec<Value> = indices
        .iter()
        .map(|&i| json!({"machine": views[i].machine, "key": views[i].key, "state": views[i].state}))
        .collect();
    Some((ev.name.clone(), json!({ "matched": matched })))
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
        TaskResult::Complete { target, properties } => {
            let mut outcome = Outcome::to(target);
            for (k, v) in properties {
                outcome = if v.is_null() { outcome.remove(k) } else { outcome.set(k, v) };
            }
            commit(finish(held, &action, None, outcome, Vec::new(), Some(report.leased_at), env))
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
) -> Decided {
    match result {
        Ok(outcome) => finish(held, action, item, outcome, locks, Some(started), env),
        Err(error) => fault(held, item, Some(&action.name), error, env),
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
        machine_hash: env.registry.hash(held.machine.name()),
        telemetry: Telemetry {
            event: Some(event_record(&item, true, false)),
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

/// Offers the entity's agent task now: its auto action came due without one (a resume
/// after parking, a retry-now).
fn offer_now(held: &Held, env: &Env<'_>) -> Decided {
    let e = &held.entity;
    Decided::new(Commit {
        retry: e.retry,
        quiet: true,
        request_id: e.request_id.clone(),
        offer: task_offer(&held.machine, &e.state, env.now),
        machine_hash: env.registry.hash(held.machine.name()),
        telemetry: Telemetry { current_event: e.event_id, ..Telemetry::default() },
        ..Commit::new(held.fence(env.owner), e.state.clone(), HistoryKind::Auto, AfterCommit::Release)
    })
}

/// Turns an action's outcome into a transition commit, or a fault if the core refuses it
/// (undeclared target, broken invariant, unknown machine or event in its effects).
/// `started` is when its handler started (`None`: a plain transition).
pub(crate) fn finish(
    held: &mut Held,
    action: &Action,
    item: Option<InboxItem>,
    outcome: Outcome,
    preconditions: Vec<(i64, i64)>,
    started: Option<Millis>,
    env: &Env<'_>,
) -> Decided {
    let now = env.now;
    let machine = held.machine.clone();
    let e = &held.entity;
    let from = machine.state(&e.state).expect("entity state exists in its machine");
    let mut props = e.properties.clone();
    step::apply_changes(&mut props, &outcome.changes);
    let entry = match step::enter(&machine, from, action, outcome.target(), outcome.delay, e.retry, &props) {
        Ok(entry) => entry,
        Err(refusal) => {
            return fault(held, item, Some(&action.name), FaultError::new("refused", refusal.to_string()), env);
        }
    };
    let request_id = item.as_ref().and_then(|i| i.request_id.clone()).or_else(|| e.request_id.clone());
    let effects = effects(&outcome, held.entity.id, request_id.as_ref(), env);
    let (creates, pushes) = match effects {
        Ok(effects) => effects,
        Err(err) => return fault(held, item, Some(&action.name), FaultError::new("refused", err), env),
    };
    let auto_at = entry.auto_delay.map(|d| now + ms(d));
    // An agent-bound auto action: the commit offers its task instead.
    let offer = auto_at.and_then(|at| task_offer(&machine, &entry.state, at));
    let after = match entry.auto_delay {
        Some(d) if d.is_zero() && offer.is_none() => AfterCommit::Hold,
        _ => AfterCommit::Release,
    };
    let outcome_for_caller = item.as_ref().map(|_| EventOutcome::Accepted { state: entry.state.clone() });
    let changed_state = entry.state != held.entity.state;
    let firing = held.firing.take();
    let fired = if changed_state {
        Some(Vec::new())
    } else {
        firing.as_ref().map(|f| {
            let mut fired = held.entity.fired.clone();
            fired.push(f.event.clone());
            fired
        })
    };
    let kind = match (&item, started) {
        (Some(_), None) => "event",
        (Some(_), Some(_)) => "event_action",
        (None, _) => "auto_action",
    };
    let e = &held.entity;
    let transition = TransitionRecord {
        kind,
        start_health: Some(health_str(machine.health_of(&e.state))),
        end_health: health_str(machine.health_of(&entry.state)),
        entry_time: e.entered_at,
        start_time: item.as_ref().map(|i| i.created_at).or(started).unwrap_or(now),
        action_start_time: started,
        outcome: if entry.retry > 0 { "retry" } else { "ok" },
    };
    let commit = Commit {
        to: Some(entry.state.clone()),
        retry: entry.retry,
        auto_at: if offer.is_some() { None } else { auto_at },
        offer,
        consume: item.as_ref().map(|i| i.id).or(held.agent_report.take()),
        properties: (props != e.properties).then_some(props),
        action: Some(action.name.clone()),
        event: item.as_ref().map(|i| i.event.clone()),
        consume_notices_upto: firing.map(|f| f.notices_upto),
        request_id,
        sql: outcome.sql,
        creates,
        pushes,
        preconditions,
        timers: (changed_state && step::has_timers(&machine))
            .then(|| timer_plan(&machine, Some(&e.state), &entry.state, now)),
        fired,
        notify_predecessors: changed_state,
        notify_self: changed_state && machine.subscriptions_in(&entry.state).next().is_some(),
        machine_hash: env.registry.hash(machine.name()),
        telemetry: Telemetry {
            event: item.as_ref().map(|i| event_record(i, false, false)),
            transition: Some(transition),
            error: None,
            at_rest: entry.at_rest(),
            complete: entry.at_rest(),
            current_event: e.event_id,
        },
        ..Commit::new(
            held.fence(env.owner),
            e.state.clone(),
            if item.is_some() { HistoryKind::Event } else { HistoryKind::Auto },
            after,
        )
    };
    Decided { item, action: Some(action.name.clone()), outcome: outcome_for_caller, ..Decided::new(commit) }
}

/// The entities an outcome creates and the events it raises, checked against their
/// machines; the error says which one is refused and why.
fn effects(
    outcome: &Outcome,
    entity_id: i64,
    request_id: Option<&String>,
    env: &Env<'_>,
) -> std::result::Result<(Vec<NewEntity>, Vec<Push>), String> {
    let mut creates = Vec::with_capacity(outcome.creates.len());
    for c in &outcome.creates {
        let m = env.registry.machine(&c.machine).map_err(|e| e.to_string())?;
        let mut new = new_entity(m, c.key.clone(), c.properties.clone(), request_id.cloned(), env.now)
            .map_err(|r| r.to_string())?;
        new.machine_hash = env.registry.hash(&c.machine);
        creates.push(new);
    }
    let mut pushes = Vec::with_capacity(outcome.raises.len());
    for r in &outcome.raises {
        let m = env.registry.machine(&r.machine).map_err(|e| e.to_string())?;
        step::check_raise(m, &r.event, &r.params).map_err(|e| e.to_string())?;
        pushes.push(Push {
            machine: r.machine.clone(),
            key: r.key.clone(),
            event: r.event.clone(),
            params: r.params.clone(),
            request_id: request_id.cloned(),
            kind: InboxKind::Nested,
            join_from: r.join.then_some(entity_id),
            operation: None,
        });
    }
    Ok((creates, pushes))
}

/// An action failed (error, panic, refused outcome, failed commit). The machine's fault
/// policy decides: park the entity (`failed`, for an operator), or back off. An event's
/// action consumes the event and changes no state; an auto action re-enters its state
/// after the backoff (run status `fault` meanwhile), counting the retry.
pub(crate) fn fault(
    held: &mut Held,
    item: Option<InboxItem>,
    action: Option<&str>,
    error: FaultError,
    env: &Env<'_>,
) -> Decided {
    let now = env.now;
    let after_unchanged = held.after_unchanged(now);
    let unstable = held.unstable();
    let fence = held.fence(env.owner);
    let e = &held.entity;
    let (mut decision, recent) = held.machine.fault_policy().decide(&e.recent_errors, now);
    if error.fatal {
        decision = FaultDecision::Park;
    }
    let parked = matches!(decision, FaultDecision::Park);
    let note = Note::Fault { kind: error.kind, details: error.details.clone(), parked };
    let health = health_str(held.machine.health_of(&e.state));
    let mut base = Commit {
        retry: e.retry,
        action: action.map(Into::into),
        event: item.as_ref().map(|i| i.event.clone()),
        consume: item.as_ref().map(|i| i.id).or(held.agent_report.take()),
        request_id: item.as_ref().and_then(|i| i.request_id.clone()).or_else(|| e.request_id.clone()),
        detail: Some(error.details.clone()),
        recent_errors: Some(recent),
        machine_hash: env.registry.hash(held.machine.name()),
        telemetry: Telemetry {
            event: item.as_ref().map(|i| event_record(i, false, true)),
            error: Some(ErrorRecord { kind: error.kind, details: error.details.clone(), exception: error.exception }),
            current_event: e.event_id,
            ..Telemetry::default()
        },
        ..Commit::new(fence, e.state.clone(), HistoryKind::Fault, AfterCommit::Release)
    };
    if let Some(f) = held.firing.take() {
        // The subscription fired (once per entry) even though its action failed.
        let mut fired = e.fired.clone();
        fired.push(f.event);
        base.fired = Some(fired);
        base.consume_notices_upto = Some(f.notices_upto);
    }
    if parked {
        base.run_status = Some((RunStatus::Failed, None));
    }
    let (commit, outcome) = if item.is_some() {
        let after = if parked { AfterCommit::Release } else { after_unchanged };
        let at_rest = parked || !unstable;
        (
            Commit { after, telemetry: Telemetry { at_rest, complete: true, ..base.telemetry.clone() }, ..base },
            Some(EventOutcome::Failed { error: error.details }),
        )
    } else {
        let retry = e.retry + 1;
        let (auto_at, status) = match decision {
            // Parked: the auto action runs again at once when an operator resumes it.
            FaultDecision::Park => (now, base.run_status),
            FaultDecision::Backoff(d) => {
                let until = now + ms(d);
                (until, Some((RunStatus::Fault, Some(until))))
            }
        };
        let transition = TransitionRecord {
            kind: "auto_action",
            start_health: Some(health),
            end_health: health,
            entry_time: e.entered_at,
            start_time: now,
            action_start_time: None,
            outcome: "error",
        };
        // An agent-bound auto action offers its next task for the end of the backoff (a
        // parked entity offers it when resumed).
        let offer = if parked { None } else { task_offer(&held.machine, &e.state, auto_at) };
        (
            Commit {
                to: Some(e.state.clone()),
                retry,
                auto_at: if offer.is_some() { None } else { Some(auto_at) },
                offer,
                run_status: status,
                telemetry: Telemetry {
                    transition: Some(transition),
                    at_rest: parked,
                    complete: parked,
                    ..base.telemetry.clone()
                },
                ..base
            },
            None,
        )
    };
    // A fault commit has no effects, so it can only fail by losing the lease.
    Decided { item, outcome, note: Some(note), ..Decided::new(commit) }
}

/// A new entity in its machine's initial state, with that state's timers and, when an
/// agent executes its auto action, its task.
pub(crate) fn new_entity(
    machine: &Machine,
    key: EntityKey,
    properties: Properties,
    request_id: Option<String>,
    now: Millis,
) -> std::result::Result<NewEntity, settle_core::Refusal> {
    let entry = step::initial_entry(machine, &properties)?;
    let initial = machine.initial().name.clone();
    let auto_at = entry.auto_delay.map(|d| now + ms(d));
    let offer = auto_at.and_then(|at| task_offer(machine, &entry.state, at));
    Ok(NewEntity {
        machine: machine.name().clone(),
        key,
        timers: timer_plan(machine, None, &initial, now),
        notify_self: machine.subscriptions_in(&initial).next().is_some(),
        operation: None,
        machine_hash: None,
        health: health_str(machine.health_of(&initial)),
        auto_at: if offer.is_some() { None } else { auto_at },
        offer,
        state: entry.state,
        properties,
        request_id,
    })
}

/// The agent task entering `state` offers, available at `at`: when its auto action is
/// bound to an agent queue.
fn task_offer(machine: &Machine, state: &str, at: Millis) -> Option<TaskOffer> {
    let action = step::agent_action(machine, state)?;
    let binding = action.agent.as_ref()?;
    Some(TaskOffer {
        queue: binding.queue.clone(),
        action: action.name.clone(),
        lock_ms: ms(binding.lock),
        available_at: at,
    })
}

/// The stored timers an entity has after entering `to` from `from` at `now`.
fn timer_plan(machine: &Machine, from: Option<&str>, to: &str, now: Millis) -> Vec<TimerPlan> {
    step::timers_on_entry(machine, from, to)
        .into_iter()
        .map(|t| TimerPlan {
            name: t.name,
            event: t.event,
            due_at: now + ms(t.after),
            every_ms: t.every.map(ms),
            restart: t.restart,
        })
        .collect()
}

fn ms(d: Duration) -> Millis {
    d.as_millis() as Millis
}

fn health_str(h: Health) -> &'static str {
    match h {
        Health::Ok => "ok",
        Health::Error => "error",
    }
}

/// The `events` row of a processed inbox item.
fn event_record(item: &InboxItem, rejected: bool, failed: bool) -> EventRecord {
    EventRecord {
        kind: match item.kind {
            InboxKind::Raised => "raised",
            InboxKind::Nested => "nested",
            InboxKind::Timer => "timer",
            InboxKind::Notice => "subscription",
            InboxKind::Agent => "agent",
        },
        seq: item.id,
        raised_at: item.created_at,
        rejected,
        failed,
    }
}
