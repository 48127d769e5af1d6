//! Calendar schedules at run time (DESIGN §9, "Schedules"): every engine that processes
//! work runs one task that fires the schedules of the machines it serves.
//!
//! Before the engine's start returns, it stores each schedule's row (`Store::schedule_sync`: a new schedule, or one
//! whose declaration changed, starts from its first fire after now). Then, in a loop: each
//! schedule with something to do (a fire due, or one held by `buffer_one`) is leased to
//! this engine alone (`schedule_claim`), asked whether its last fire still runs, given to
//! the pure [`settle_core::calendar::step`], its fires fired, and its progress written
//! (`schedule_advance`). A fire is a request with an id made of its instant
//! ([`settle_core::calendar::fire_id`]): creating the entity, or one bulk operation per
//! state raising the event on each entity there (`{fire id}/{state}`, each entity's event
//! `{fire id}/{state}/{entity id}`). A crash between firing and writing the progress
//! fires the same ids again: a replay, so each fire happens once across crashes and
//! instances. The task sleeps until the earliest schedule's time, or a second while a fire
//! is held, on the engine's clock, and wakes when a schedule is paused or resumed.

use std::sync::Weak;
use std::time::Duration;

use serde_json::json;
use settle_core::Machine;
use settle_core::calendar::{self, Calendar, Fire, Overlap, Progress};
use settle_core::time::format_time;
use settle_store::{Millis, ScheduleAdvance, ScheduleRow, Store};

use crate::bulk::{BulkAction, BulkRequest, Selection};
use crate::engine::{Engine, Inner};
use crate::error::{Error, Result};

/// How often a held fire looks whether the fire before it ended.
const HELD_POLL: Millis = 1_000;
/// How long a schedule is leased for one decision (much less than [`calendar::LATE`], so
/// the fires of an instance that died holding it are still on time when another decides).
const LEASE: Duration = Duration::from_secs(10);
/// The longest the task sleeps without looking (a schedule paused or changed elsewhere).
const IDLE_POLL: Millis = 60_000;

/// A schedule as the API shows it: its declaration and its progress.
#[derive(Debug, Clone, PartialEq)]
pub struct ScheduleView {
    /// Its machine.
    pub machine: String,
    /// Its name.
    pub name: String,
    /// The cron expression and zone, e.g. `0 3 * * * (Europe/Paris)`.
    pub cron: String,
    /// `raise EVENT in [STATES]` or `create`.
    pub does: String,
    /// Its progress as stored (`None`: no engine has stored it yet).
    pub row: Option<ScheduleRow>,
}

/// The declaration a stored row follows: its canonical JSON.
fn spec(cal: &Calendar) -> String {
    serde_json::to_string(&cal.def).unwrap_or_default()
}

/// What a schedule does, in a few words.
pub fn describe_fire(cal: &Calendar) -> String {
    match &cal.fire {
        Fire::Raise { event, states, .. } => format!("raise {event} in [{}]", states.join(", ")),
        Fire::Create { .. } => "create".into(),
    }
}

/// The schedules `machines` declare, by machine and name, each with its row of `rows`.
pub fn views(machines: &[&Machine], rows: &[ScheduleRow]) -> Vec<ScheduleView> {
    let mut machines = machines.to_vec();
    machines.sort_by(|a, b| a.name().cmp(b.name()));
    let mut views = Vec::new();
    for m in machines {
        for cal in m.schedules() {
            let row = rows.iter().find(|r| r.machine == m.name().as_str() && r.name == cal.name()).cloned();
            views.push(ScheduleView {
                machine: m.name().to_string(),
                name: cal.name().to_string(),
                cron: cal.describe(),
                does: describe_fire(cal),
                row,
            });
        }
    }
    views
}

impl<S: Store + Clone> Engine<S> {
    /// The schedules of the machines this engine knows, with their stored progress.
    pub async fn schedules(&self) -> Result<Vec<ScheduleView>> {
        let rows = self.inner.store.schedule_list().await?;
        let registry = self.inner.registry();
        let machines: Vec<&Machine> = registry.machines.values().map(|m| m.as_ref()).collect();
        Ok(views(&machines, &rows))
    }

    /// Pauses schedule `name` of `machine` (nothing fires until it is resumed), or resumes
    /// it from its next fire after now (what it would have fired meanwhile is not fired).
    /// The row after.
    pub async fn schedule_pause(&self, machine: &str, name: &str, paused: bool) -> Result<ScheduleRow> {
        self.inner.writable("schedule pause")?;
        let m = self.inner.registry().machine(machine)?.clone();
        let cal = m
            .schedule(name)
            .ok_or_else(|| Error::UnknownSchedule { machine: machine.to_string(), name: name.to_string() })?;
        let now = self.inner.clock.now_ms();
        let next = cal.after(now).unwrap_or(Millis::MAX);
        let stored =
            match self.inner.store.schedule_pause(machine, name, paused, (next, cal.due(machine, next)), now).await? {
                Some(row) => row,
                None => {
                    // Not stored yet (no engine ran it): store it, then pause it.
                    self.inner
                        .store
                        .schedule_sync(ScheduleRow::new(machine, name, spec(cal), next, cal.due(machine, next), now))
                        .await?;
                    self.inner
                        .store
                        .schedule_pause(machine, name, paused, (next, cal.due(machine, next)), now)
                        .await?
                        .ok_or_else(|| Error::UnknownSchedule { machine: machine.to_string(), name: name.to_string() })?
                }
            };
        self.inner.schedules.notify_one();
        Ok(stored)
    }
}

/// Stores a row for each schedule of the machines `engine` serves.
pub(crate) async fn sync<S: Store + Clone>(engine: &Engine<S>) -> Result<()> {
    if engine.inner.read_only {
        return Ok(());
    }
    let now = engine.inner.clock.now_ms();
    let registry = engine.inner.registry();
    for m in registry.machines.values().filter(|m| registry.serves(m.name())) {
        for cal in m.schedules() {
            let first = cal.after(now).unwrap_or(Millis::MAX);
            let row = ScheduleRow::new(
                m.name().as_str(),
                cal.name(),
                spec(cal),
                first,
                cal.due(m.name().as_str(), first),
                now,
            );
            engine.inner.store.schedule_sync(row).await?;
        }
    }
    Ok(())
}

/// Fires the schedules of the machines this engine serves until the engine goes away.
pub(crate) async fn run<S: Store + Clone>(inner: Weak<Inner<S>>, owner: String) {
    loop {
        let Some(strong) = inner.upgrade() else { return };
        if strong.tx.is_closed() {
            return;
        }
        let engine = Engine { inner: strong };
        let wake = match pass(&engine, &owner, LEASE).await {
            Ok(wake) => wake,
            Err(Error::Stopped) => return,
            Err(e) => {
                tracing::warn!(error = %e, "a pass over the schedules failed; it runs again");
                engine.inner.clock.now_ms() + HELD_POLL
            }
        };
        let notify = engine.inner.schedules.clone();
        let clock = engine.inner.clock.clone();
        drop(engine);
        let at = wake.min(clock.now_ms() + IDLE_POLL);
        tokio::select! {
            _ = notify.notified() => {}
            _ = clock.sleep_until(at) => {}
        }
    }
}

/// One pass: every schedule with something to do now, decided and fired. When to look
/// again.
async fn pass<S: Store + Clone>(engine: &Engine<S>, owner: &str, lease: Duration) -> Result<Millis> {
    let store = &engine.inner.store;
    let now = engine.inner.clock.now_ms();
    let mut wake = Millis::MAX;
    let registry = engine.inner.registry();
    for row in store.schedule_list().await? {
        let Some(m) = registry.machines.get(row.machine.as_str()) else { continue };
        let Some(cal) = m.schedule(&row.name).filter(|_| registry.serves(&row.machine)) else {
            continue;
        };
        if row.paused {
            continue;
        }
        if row.next_at > now && row.buffered.is_none() {
            wake = wake.min(row.next_at);
            continue;
        }
        let until = now + lease.as_millis() as Millis;
        let Some(row) = store.schedule_claim(&row.machine, &row.name, owner, now, until).await? else {
            // Another instance holds it: look again when its lease may have ended.
            wake = wake.min(now + HELD_POLL);
            continue;
        };
        let next = decide(engine, owner, cal, row, now).await?;
        wake = wake.min(next);
    }
    Ok(wake)
}

/// Decides and fires one leased schedule, then writes its progress. When it next has
/// something to do.
async fn decide<S: Store + Clone>(
    engine: &Engine<S>,
    owner: &str,
    cal: &Calendar,
    row: ScheduleRow,
    now: Millis,
) -> Result<Millis> {
    let machine = row.machine.as_str();
    let running = match row.last_fire {
        Some(last) if cal.overlap != Overlap::AllowAll || row.buffered.is_some() => {
            engine.inner.store.schedule_running(&calendar::fire_id(machine, cal.name(), last)).await?
        }
        _ => false,
    };
    let step =
        calendar::step(cal, machine, Progress { next_fire: row.next_fire, buffered: row.buffered }, running, now);
    for &instant in &step.fires {
        fire(engine, machine, cal, instant).await?;
    }
    if step.missed > 0 || step.skipped > 0 {
        tracing::info!(
            machine,
            schedule = cal.name(),
            missed = step.missed,
            skipped = step.skipped,
            "schedule fires not fired"
        );
    }
    let next_at = cal.due(machine, step.next.next_fire);
    let advance = ScheduleAdvance {
        machine: machine.to_string(),
        name: cal.name().to_string(),
        owner: owner.to_string(),
        next_fire: step.next.next_fire,
        next_at,
        buffered: step.next.buffered,
        last_fire: step.fires.last().copied(),
        fired: step.fires.len() as u64,
        missed: step.missed,
        skipped: step.skipped,
        now: engine.inner.clock.now_ms(),
    };
    if !engine.inner.store.schedule_advance(advance).await? {
        tracing::info!(machine, schedule = cal.name(), "schedule taken over by another instance");
    }
    Ok(if step.next.buffered.is_some() { (now + HELD_POLL).min(next_at) } else { next_at })
}

/// One fire of `cal`: its request, with the fire's id. A request refused for good (a key
/// taken, an invariant) is logged and counted, not retried; the store failing is an error
/// (the schedule is decided again, and the fire replays).
async fn fire<S: Store + Clone>(engine: &Engine<S>, machine: &str, cal: &Calendar, instant: Millis) -> Result<()> {
    let id = calendar::fire_id(machine, cal.name(), instant);
    let result = match &cal.fire {
        Fire::Create { key, properties } => {
            let params = json!({"schedule": cal.name(), "fire": format_time(instant)});
            let key = match key {
                Some(expr) => match expr.eval(&Default::default(), &params, "") {
                    Ok(serde_json::Value::String(k)) if !k.is_empty() => k,
                    Ok(other) => return refused(machine, cal, &id, &format!("the key's expression gave {other}")),
                    Err(e) => return refused(machine, cal, &id, &format!("the key's expression: {e}")),
                },
                None => format!("{}-{}", cal.name(), format_time(instant)),
            };
            let props = properties.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
            let background = -settle_core::limits::BACKGROUND;
            engine.create_at(machine, &key, props, Some(id.clone()), background).await.map(|_| ())
        }
        Fire::Raise { event, states, rate } => {
            let mut result = Ok(());
            for state in states {
                let req = BulkRequest {
                    request_id: Some(format!("{id}/{state}")),
                    action: BulkAction::Raise { event: event.as_str().into(), params: serde_json::Value::Null },
                    selection: Selection {
                        machine: Some(machine.to_string()),
                        state: Some(state.clone()),
                        ..Selection::default()
                    },
                    reason: format!("schedule `{}` of `{machine}`, the fire of {}", cal.name(), format_time(instant)),
                    rate: *rate,
                    priority: None,
                };
                if let Err(e) = engine.bulk_start(req).await {
                    result = Err(e);
                    break;
                }
            }
            result
        }
    };
    match result {
        Ok(()) => Ok(()),
        Err(e @ (Error::Store(_) | Error::Stopped)) => Err(e),
        Err(e) => refused(machine, cal, &id, &e.to_string()),
    }
}

fn refused(machine: &str, cal: &Calendar, id: &str, why: &str) -> Result<()> {
    tracing::warn!(machine, schedule = cal.name(), fire = id, error = why, "a schedule's fire was refused");
    metrics::counter!("settle_engine_schedule_refused_total", "machine" => machine.to_string(), "schedule" => cal.name().to_string())
        .increment(1);
    Ok(())
}
