//! What an action's outcome commits: the states it leaves and enters (as
//! `settle_core::step` decides), the effects of the entry and exit actions on the way
//! (declarative ones applied here, handlers run by the scheduler first: [`Hooks`]), its
//! effects checked against their machines (entities created, events raised), the timers
//! and agent task that come with the entry, and the telemetry rows. An internal
//! transition commits its effects without leaving or entering anything.

use settle_core::step;
use settle_core::{Action, ActionOutcome, EntityKey, EventName, Machine, Properties, StateName};
use settle_store::{
    AfterCommit, Commit, EventRecord, HistoryKind, InboxItem, InboxKind, Millis, NewEntity, Push, PushRelated, Reply,
    Telemetry, TransitionRecord,
};

use super::parts::{entry_offer, ms, timer_plan};
use super::{Decided, Env, FaultError, Held, Next, commit, fault};
use crate::api::EventOutcome;
use crate::handler::Outcome;

/// An entry or exit action to run before a transition commits.
#[derive(Debug, Clone)]
pub(crate) struct Hook {
    /// The action.
    pub(crate) action: Action,
    /// The state being entered or left.
    pub(crate) state: StateName,
    /// Whether the state is being left (an exit action).
    pub(crate) exit: bool,
}

/// What an action did, to be committed: the action, the event it ran for (`None`: an
/// auto action), its outcome, the entities it read with lock (the commit's
/// preconditions), and when its handler started (`None`: the engine performed it).
#[derive(Debug)]
pub(crate) struct Ran<'a> {
    pub(crate) action: &'a Action,
    pub(crate) item: Option<InboxItem>,
    pub(crate) outcome: Outcome,
    pub(crate) locks: Vec<(i64, i64)>,
    pub(crate) started: Option<Millis>,
}

/// A transition waiting for its entry and exit actions: what they run in (exits innermost
/// first, then entries outermost first), and the main action's result: its effects go
/// between the exits' and the entries' (SCXML's order).
#[derive(Debug)]
pub(crate) struct Hooks {
    pub(crate) run: Vec<Hook>,
    /// The main action's outcome; the scheduler adds each hook's effects to it in order.
    pub(crate) outcome: Outcome,
    pub(crate) action: Action,
    pub(crate) item: Option<InboxItem>,
    pub(crate) locks: Vec<(i64, i64)>,
    pub(crate) started: Option<Millis>,
}

/// Decides what an action's outcome comes to: an internal transition's commit; a fault
/// when the target is not one the action declares; the entry and exit actions to run
/// first when any of them has a handler; else the transition's commit, with the effects
/// of declarative entry and exit actions. `started` is when the action's handler started
/// (`None`: the engine performed it).
pub(crate) fn transition(held: &mut Held, mut ran: Ran<'_>, env: &Env<'_>) -> Next {
    // What a handler or an agent creates and raises is held to its declaration; the
    // engine's properties are its own.
    let beyond = step::beyond_declaration(ran.action, &ran.outcome.decided);
    if let Some((field, why)) = beyond.or_else(|| step::engine_property(&ran.outcome.decided)) {
        return commit(refused(held, ran, format!("{field}: {why}"), env));
    }
    let machine = held.machine.clone();
    if ran.item.as_ref().and_then(|i| machine.event(&i.event)).is_some_and(|e| e.internal) {
        let own = ran.outcome.take_effects();
        if let Err((field, why)) = own_effects(
            &mut ran.outcome,
            own,
            ran.action,
            ran.started,
            &held.entity,
            held.runs_for(ran.item.as_ref()).1,
        ) {
            return commit(refused(held, ran, format!("{field}: {why}"), env));
        }
        return commit(internal(held, ran, env));
    }
    let from = machine.state(&held.entity.state).expect("entity state exists in its machine");
    let path = match step::transition_of(&machine, from, ran.action, ran.outcome.target(), &held.entity.properties) {
        Ok(path) => path,
        Err(refusal) => return commit(refused(held, ran, refusal.to_string(), env)),
    };
    let event = ran.item.as_ref().map(|i| i.event.as_str());
    let exits = path.left.iter().flat_map(|s| s.on_exit.iter().map(move |a| (*s, a, true)));
    let entries = path.entered.iter().flat_map(|s| s.entry_actions(event).map(move |a| (*s, a, false)));
    let run: Vec<Hook> = exits
        .chain(entries)
        .filter_map(|(s, a, exit)| machine.action(a).map(|a| Hook { action: a.clone(), state: s.name.clone(), exit }))
        .collect();
    if run.iter().any(|h| !h.action.is_declarative()) {
        let Ran { action, item, outcome, locks, started } = ran;
        return Next::Hooks(Box::new(Hooks { run, outcome, action: action.clone(), item, locks, started }));
    }
    let mut own = ran.outcome.take_effects();
    for step in in_order(&run) {
        let Some(hook) = step else {
            let own = std::mem::take(&mut own);
            let params = held.runs_for(ran.item.as_ref()).1;
            if let Err((field, why)) = own_effects(&mut ran.outcome, own, ran.action, ran.started, &held.entity, params)
            {
                return commit(refused(held, ran, format!("{field}: {why}"), env));
            }
            continue;
        };
        if let Err((field, why)) =
            declare(&hook.action, &mut ran.outcome, &held.entity, held.runs_for(ran.item.as_ref()).1)
        {
            let what = if hook.exit { "exit" } else { "entry" };
            let why = format!("{what} action `{}` of state `{}`: {field}: {why}", hook.action.name, hook.state);
            return commit(refused(held, ran, why, env));
        }
    }
    commit(finish(held, ran, env))
}

/// A transition's effects in SCXML's order: its exit actions', then its action's own
/// (`None`: [`own_effects`]), then its entry actions'. `run` lists exits before entries.
pub(crate) fn in_order(run: &[Hook]) -> impl Iterator<Item = Option<&Hook>> {
    let exits = run.iter().take_while(|h| h.exit).count();
    run[..exits].iter().map(Some).chain([None]).chain(run[exits..].iter().map(Some))
}

/// Adds an action's own effects to `outcome` at their place in its transition: after the
/// exit actions' effects, before the entry actions' (SCXML's order). A handler's or an
/// agent's (`started`: it ran, before the exit actions, as it chose the target) are `own`;
/// a declarative action's (the engine performs it, `started` is `None`) are evaluated
/// here, over the properties the exit actions left, for the event it runs for.
pub(crate) fn own_effects(
    outcome: &mut Outcome,
    own: Outcome,
    action: &Action,
    started: Option<Millis>,
    entity: &settle_store::EntityRow,
    params: &serde_json::Value,
) -> Result<(), (String, String)> {
    outcome.add_effects(own);
    if started.is_some() {
        return Ok(());
    }
    declare(action, outcome, entity, params)
}

/// The fault of an action whose outcome the core refuses (`why`).
fn refused(held: &mut Held, ran: Ran<'_>, why: String, env: &Env<'_>) -> Decided {
    fault(held, ran.item, Some(&ran.action.name), FaultError::new("refused", why), env)
}

/// The entry and exit actions of a transition ran; `outcome` carries their effects (or
/// one of them failed: `Err`). Decides the transition's commit, or its fault.
pub(crate) fn hooks_done(
    held: &mut Held,
    hooks: Hooks,
    outcome: std::result::Result<Outcome, FaultError>,
    env: &Env<'_>,
) -> Decided {
    let Hooks { action, item, locks, started, .. } = hooks;
    match outcome {
        Ok(outcome) => finish(held, Ran { action: &action, item, outcome, locks, started }, env),
        Err(error) => fault(held, item, Some(&action.name), error, env),
    }
}

/// Adds a declarative action's effects to `outcome`: its `set` (expressions evaluated over
/// the entity's properties with the outcome's changes so far, `params`, those of the event
/// it runs for ([`Held::runs_for`]), and its key; a `null` removes the property), its
/// `create` (keys and properties evaluated alike, first events raised on them) and its
/// `raise` on related entities. `Err`: the entry that could not be evaluated, and why.
pub(crate) fn declare(
    action: &Action,
    outcome: &mut Outcome,
    entity: &settle_store::EntityRow,
    params: &serde_json::Value,
) -> Result<(), (String, String)> {
    let computed =
        !action.create.is_empty() || !action.raise_keyed.is_empty() || action.set_exprs.iter().any(Option::is_some);
    let (changes, (creates, raises)) = if computed {
        let mut props = entity.properties.clone();
        step::apply_changes(&mut props, &outcome.decided.changes);
        (
            step::declared_changes(action, &props, params, &entity.key)?,
            step::declared_creates(action, &props, params, &entity.key)?,
        )
    } else {
        let none = serde_json::Value::Null;
        (step::declared_changes(action, &Properties::new(), &none, &entity.key)?, (Vec::new(), Vec::new()))
    };
    outcome.decided.changes.extend(changes);
    outcome.decided.creates.extend(creates);
    outcome.decided.raises.extend(raises);
    outcome.decided.related.extend(action.raise.iter().cloned());
    let own = action
        .raise_self
        .iter()
        .map(|(event, params)| step::InternalEvent { event: event.clone(), params: params.clone() });
    outcome.decided.internal.extend(own);
    Ok(())
}

/// An internal transition: the action's effects commit; the entity stays in its state
/// entry (no exit or entry action, no retry count reset, timers and subscriptions as they
/// were), with a history row of kind `internal`.
fn internal(held: &mut Held, ran: Ran<'_>, env: &Env<'_>) -> Decided {
    let machine = held.machine.clone();
    let state = machine.state(&held.entity.state).expect("entity state exists in its machine");
    if let Some(target) = ran.outcome.target().filter(|t| *t != state.name.as_str()) {
        let why = format!(
            "an internal transition stays in its state, but action `{}` asked to move to `{target}`",
            ran.action.name
        );
        return refused(held, ran, why, env);
    }
    let checked = checked(held, &ran, |props| step::stay(&machine, state, props), env);
    let Checked { props, verdict: (), request_id, effects } = match checked {
        Ok(checked) => checked,
        Err(why) => return refused(held, ran, why, env),
    };
    let Ran { action, item, outcome, locks: preconditions, started } = ran;
    let now = env.now;
    let after = held.after_unchanged(now);
    let at_rest = !held.unstable();
    let e = &held.entity;
    let health = machine.health_of(&e.state).as_str();
    let transition = TransitionRecord {
        kind: "internal",
        start_health: Some(health),
        end_health: health,
        entry_time: e.entered_at,
        start_time: item.as_ref().map(|i| i.created_at).or(started).unwrap_or(now),
        action_start_time: started,
        outcome: "ok",
    };
    let commit = Commit {
        retry: e.retry,
        internal: true,
        consume: item.as_ref().map(|i| i.id),
        properties: (props != e.properties).then_some(props),
        action: Some(action.name.clone()),
        event: item.as_ref().map(|i| i.event.clone()),
        request_id,
        sql: outcome.sql,
        creates: effects.creates,
        pushes: effects.pushes,
        push_related: effects.related,
        preconditions,
        machine_hash: held.version(env),
        telemetry: Telemetry {
            event: item.as_ref().map(|i| EventRecord::of(i, false, false)),
            transition: Some(transition),
            error: None,
            at_rest,
            complete: at_rest,
            current_event: e.event_id,
        },
        ..Commit::new(held.fence(env.owner), e.state.clone(), HistoryKind::Internal, after)
    };
    let outcome = item.as_ref().map(|_| EventOutcome::Accepted { state: e.state.clone() });
    Decided { item, action: Some(action.name.clone()), outcome, ..Decided::new(commit) }
}

/// Turns an action's outcome (with its entry and exit actions' effects) into a transition
/// commit, or a fault if the core refuses it (undeclared target, broken invariant,
/// unknown machine or event in its effects). `started` is when its handler started
/// (`None`: a plain transition).
pub(crate) fn finish(held: &mut Held, ran: Ran<'_>, env: &Env<'_>) -> Decided {
    let machine = held.machine.clone();
    let e = &held.entity;
    let from = machine.state(&e.state).expect("entity state exists in its machine");
    let (target, delay, retry) = (ran.outcome.target(), ran.outcome.decided.delay, e.retry);
    let enter = |props: &Properties| step::enter(&machine, from, ran.action, target, delay, retry, props);
    let Checked { mut props, verdict: entry, request_id, mut effects } = match checked(held, &ran, enter, env) {
        Ok(checked) => checked,
        Err(why) => return refused(held, ran, why, env),
    };
    // Where the entity was in the parents with history it leaves, kept with its properties.
    if let Some(history) = entry.history.clone() {
        props.insert(settle_core::machine::HISTORY_PROPERTY.to_string(), history.into());
    }
    let Ran { action, item, outcome, locks: preconditions, started } = ran;
    let now = env.now;
    let auto_at = entry.auto_delay.map(|d| now + ms(d));
    // An agent-bound auto action: the commit offers its task instead.
    let offer = auto_at.and_then(|at| entry_offer(&machine, &entry.state, at));
    let after = match entry.auto_delay {
        Some(d) if d.is_zero() && offer.is_none() => AfterCommit::Hold,
        _ => AfterCommit::Release,
    };
    let outcome_for_caller = item.as_ref().map(|_| EventOutcome::Accepted { state: entry.state.clone() });
    let changed_state = entry.state != held.entity.state;
    // A re-entry enters its states anew (timers restart, subscriptions may fire again)
    // though the leaf is the same.
    let entered_anew = entry.moves();
    let firing = held.firing.take();
    let fired = fired_after(&machine, &held.entity.fired, firing.as_ref().map(|f| &f.event), &entry, entered_anew);
    let kind = match (&item, started) {
        (Some(_), None) => "event",
        (Some(_), Some(_)) => "event_action",
        (None, _) => "auto_action",
    };
    let e = &held.entity;
    let failure = super::failure::failure(
        &machine,
        &e.state,
        &entry.state,
        outcome.decided.error.as_deref(),
        item.as_ref(),
        &action.name,
    );
    let transition = TransitionRecord {
        kind,
        start_health: Some(machine.health_of(&e.state).as_str()),
        end_health: machine.health_of(&entry.state).as_str(),
        entry_time: e.entered_at,
        start_time: item.as_ref().map(|i| i.created_at).or(started).unwrap_or(now),
        action_start_time: started,
        outcome: if entry.retry > 0 { "retry" } else { "ok" },
    };
    let deleted = machine.state(&entry.state).is_some_and(|s| s.kind == settle_core::StateKind::Deleted);
    if changed_state && deleted && machine.cascades("delete") {
        // A cascading delete: each successor's own delete event, in this commit.
        effects.related.extend(env.registry.delete_cascade());
    }
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
        creates: effects.creates,
        pushes: effects.pushes,
        push_related: effects.related,
        preconditions,
        timers: (entered_anew && step::has_timers(&machine))
            .then(|| timer_plan(&machine, Some(&e.state), &entry.state, &entry.entered, now)),
        fired,
        notify_predecessors: changed_state,
        notify_self: entered_anew && machine.subscriptions_in(&entry.state).next().is_some(),
        ended: machine.state(&entry.state).is_some_and(|s| s.is_end()),
        machine_hash: held.version(env),
        telemetry: Telemetry {
            event: item.as_ref().map(|i| EventRecord::of(i, false, false)),
            transition: Some(transition),
            error: failure,
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

/// An outcome checked: the properties after its changes, `decide`'s verdict on them (an
/// entry, or staying), the request id, and its effects checked against their machines.
struct Checked<T> {
    props: Properties,
    verdict: T,
    request_id: Option<String>,
    effects: Effects,
}

/// An outcome's effects on other entities, as the store writes them.
struct Effects {
    creates: Vec<NewEntity>,
    pushes: Vec<Push>,
    related: Vec<PushRelated>,
}

/// What every commit of an outcome needs checked first ([`Checked`]). `Err` says why the
/// core refuses it.
fn checked<T>(
    held: &Held,
    ran: &Ran<'_>,
    decide: impl FnOnce(&Properties) -> Result<T, step::Refusal>,
    env: &Env<'_>,
) -> std::result::Result<Checked<T>, String> {
    let e = &held.entity;
    let mut props = e.properties.clone();
    step::apply_changes(&mut props, &ran.outcome.decided.changes);
    let verdict = decide(&props).map_err(|r| r.to_string())?;
    let request_id = ran.item.as_ref().and_then(|i| i.request_id.clone()).or_else(|| e.request_id.clone());
    let effects = effects(&ran.outcome.decided, Some(e), request_id.as_ref(), env)
        .map_err(|(field, why)| format!("{field}: {why}"))?;
    Ok(Checked { props, verdict, request_id, effects })
}

/// The subscription events fired in the current state entry after a transition (`None`:
/// unchanged). Staying in the same leaf keeps them (plus the one `firing`, if any); moving
/// (`entered_anew`: leaving or entering any state, a re-entry too) keeps only those still
/// valid at a level the transition did not enter anew (a subscription on a parent fires
/// once per entry into the parent).
pub(super) fn fired_after(
    machine: &Machine,
    fired: &[EventName],
    firing: Option<&EventName>,
    entry: &step::Entry,
    entered_anew: bool,
) -> Option<Vec<EventName>> {
    if !entered_anew {
        return firing.map(|f| fired.iter().cloned().chain(std::iter::once(f.clone())).collect());
    }
    let kept: Vec<EventName> = fired
        .iter()
        .chain(firing)
        .filter(|name| {
            machine.event(name).is_some_and(|ev| match machine.event_level(ev, &entry.state) {
                Some(settle_core::machine::Level::Valid(level)) => !entry.entered.contains(&level.name),
                _ => false,
            })
        })
        .cloned()
        .collect();
    Some(kept)
}

/// The entities an outcome creates and the events it raises, checked against their
/// machines (an event raised on related entities against every machine that declares
/// it); the error names the effect refused (`create[0]`, `raise[1]`, `raise_on[0]`) and why.
/// `raiser` is the entity whose outcome it is (`None`: only checking, before it is known).
fn effects(
    outcome: &ActionOutcome,
    raiser: Option<&settle_store::EntityRow>,
    request_id: Option<&String>,
    env: &Env<'_>,
) -> std::result::Result<Effects, (String, String)> {
    let refused = |field: String, why: String| (field, why);
    let entity_id = raiser.map_or(0, |e| e.id);
    if let Some(e) = raiser {
        let own = env.registry.machine(&e.machine).ok();
        if let Some(refusal) = step::foreign_reply(outcome, &e.machine, |ev| own.is_some_and(|m| m.event(ev).is_some()))
        {
            return Err(refusal);
        }
    }
    let mut creates = Vec::with_capacity(outcome.creates.len());
    for (i, c) in outcome.creates.iter().enumerate() {
        let m = env.registry.machine(&c.machine).map_err(|e| refused(format!("create[{i}]"), e.to_string()))?;
        let mut new = new_entity(m, c.key.clone(), c.properties.clone(), request_id.cloned(), env.now)
            .map_err(|r| refused(format!("create[{i}]"), r.to_string()))?;
        new.machine_hash = env.registry.hash(&c.machine);
        creates.push(new);
    }
    let mut pushes = Vec::with_capacity(outcome.raises.len());
    for (i, r) in outcome.raises.iter().enumerate() {
        let m = env.registry.machine(&r.machine).map_err(|e| refused(format!("raise[{i}]"), e.to_string()))?;
        step::check_raise(m, &r.event, &r.params).map_err(|e| refused(format!("raise[{i}]"), e.to_string()))?;
        pushes.push(Push {
            machine: r.machine.clone(),
            key: r.key.clone(),
            event: r.event.clone(),
            params: r.params.clone(),
            request_id: request_id.cloned(),
            kind: InboxKind::Nested,
            join_from: r.join.then_some(entity_id),
            operation: None,
            reply: r.reply.as_ref().zip(raiser).map(|(event, e)| Reply {
                machine: e.machine.clone(),
                key: e.key.clone(),
                event: event.clone(),
            }),
        });
    }
    if let Some(e) = raiser {
        // Internal events: to the raiser's own inbox, where they go first.
        let own = env.registry.machine(&e.machine).map_err(|err| refused("raise_self".into(), err.to_string()))?;
        for (i, r) in outcome.internal.iter().enumerate() {
            step::check_raise(own, &r.event, &r.params)
                .map_err(|err| refused(format!("raise_self[{i}]"), err.to_string()))?;
            pushes.push(Push {
                machine: e.machine.clone(),
                key: e.key.clone(),
                event: r.event.clone(),
                params: r.params.clone(),
                request_id: request_id.cloned(),
                kind: InboxKind::Internal,
                join_from: None,
                operation: None,
                reply: None,
            });
        }
    }
    let mut related = Vec::with_capacity(outcome.related.len());
    for (i, b) in outcome.related.iter().enumerate() {
        let field = || format!("raise_on[{i}]");
        let mut machines = Vec::new();
        for m in env.registry.machines.values().filter(|m| m.event(&b.event).is_some()) {
            step::check_raise(m, &b.event, &b.params)
                .map_err(|e| refused(field(), format!("raises `{}` on its {}: {e}", b.event, b.on.as_str())))?;
            machines.push(m.name().clone());
        }
        if machines.is_empty() {
            let why = format!("raises `{}` on its {}, but no machine declares that event", b.event, b.on.as_str());
            return Err(refused(field(), why));
        }
        machines.sort();
        related.push(PushRelated { on: b.on, machines, event: b.event.clone(), params: b.params.clone() });
    }
    Ok(Effects { creates, pushes, related })
}

/// Whether an outcome's creates and raises would pass [`effects`] with the machines of
/// `registry`: the check an agent's report meets when it arrives, so that a report that
/// names an unknown machine or event, or leaves out a required parameter or property, is
/// refused then (and changes nothing) instead of failing its commit later.
pub(crate) fn check_effects(
    outcome: &ActionOutcome,
    registry: &crate::registry::Registry,
) -> Result<(), (String, String)> {
    effects(outcome, None, None, &Env { registry, owner: "", now: 0 }).map(|_| ())
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
    let offer = auto_at.and_then(|at| entry_offer(machine, &entry.state, at));
    Ok(NewEntity {
        machine: machine.name().clone(),
        key,
        timers: timer_plan(machine, None, &initial, &entry.entered, now),
        notify_self: machine.subscriptions_in(&initial).next().is_some(),
        operation: None,
        machine_hash: None,
        health: machine.health_of(&initial).as_str(),
        auto_at: if offer.is_some() { None } else { auto_at },
        offer,
        state: entry.state,
        properties,
        request_id,
    })
}
