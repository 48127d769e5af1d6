//! Bulk operations (DESIGN §9): one operator command or one event applied to every entity
//! matching a [`Selection`], as one durable operation ([`settle_store::BulkRow`]).
//!
//! [`Engine::bulk_dry_run`] counts (up to a bound) and samples what a selection matches;
//! [`Engine::bulk_start`] stores the operation with its reason and rate and wakes the
//! runner. The runner (one task per engine that processes work) leases one running bulk
//! operation at a time, reads the next page of matching entities in id order after its
//! cursor, commands each with the request id `{bulk request id}/{entity id}`, then writes
//! the page's progress and cursor; a page cut short by a crash runs again and its commands
//! replay, so each entity is commanded once. It keeps to the rate on the engine's clock,
//! and stops a page when the operation is canceled or the engine stops.

use std::sync::Weak;
use std::time::Duration;

use serde_json::{Value, json};
use settle_core::{EventName, Health, Machine};
use settle_store::{BulkAdvance, BulkRow, Command, EntityFilter, EntityRow, Millis, Store};

use crate::engine::{Engine, Inner};
use crate::error::{Error, Result};
use crate::narrow::{Narrow, Narrowed};
use crate::{RaiseOptions, Wait};

/// Most entities a page holds (fewer when the rate is lower: a page is a second's worth).
const PAGE: u64 = 500;
/// Commands of a page in flight at once (they share the writer's batches).
const AT_ONCE: usize = 500;
/// The most entities a second a bulk operation may ask for, and the default.
pub const MAX_RATE: u32 = 100_000;
/// The rate when none is given.
pub const DEFAULT_RATE: u32 = 1_000;
/// How many a dry run counts exactly before it says "more than".
pub const COUNT_BOUND: u64 = 1_000_000;

/// Which entities a bulk operation reaches: every criterion given must hold, and at least
/// one must be given (a bulk operation never defaults to everything).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Selection {
    /// Only this machine.
    pub machine: Option<String>,
    /// Only this state (a parent state: its substates).
    pub state: Option<String>,
    /// Only this run status (`failed`, `paused`, ...).
    pub status: Option<String>,
    /// Only keys starting with this.
    pub prefix: Option<String>,
    /// Only states of this health (`error` or `ok`).
    pub health: Option<String>,
    /// What no index holds: a property expression, error text, time ranges.
    pub narrow: Narrow,
    /// Only the successors of this entity (by id): a kill's cascade.
    pub successors_of: Option<i64>,
    /// Only the entities the operation of this request id reached: a cancel's.
    pub reached_by: Option<String>,
}

impl Selection {
    /// Whether no criterion is given.
    pub fn is_empty(&self) -> bool {
        self.machine.is_none()
            && self.state.is_none()
            && self.status.is_none()
            && self.prefix.is_none()
            && self.health.is_none()
            && self.narrow.is_empty()
            && self.successors_of.is_none()
            && self.reached_by.is_none()
    }

    /// As stored: a JSON object of the criteria given.
    pub fn to_json(&self) -> Value {
        let mut o = serde_json::Map::new();
        for (k, v) in self.fields() {
            if let Some(v) = v {
                o.insert(k.into(), json!(v));
            }
        }
        self.narrow.to_json(&mut o);
        if let Some(id) = self.successors_of {
            o.insert("successors_of".into(), json!(id));
        }
        if let Some(r) = &self.reached_by {
            o.insert("reached_by".into(), json!(r));
        }
        Value::Object(o)
    }

    /// Reads [`Selection::to_json`] back (unknown members are ignored); `Err` if its
    /// property expression no longer parses.
    pub fn from_json(v: &Value) -> std::result::Result<Selection, String> {
        let get = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
        Ok(Selection {
            machine: get("machine"),
            state: get("state"),
            status: get("status"),
            prefix: get("prefix"),
            health: get("health"),
            narrow: Narrow::from_json(v)?,
            successors_of: v.get("successors_of").and_then(Value::as_i64),
            reached_by: get("reached_by"),
        })
    }

    fn fields(&self) -> [(&'static str, &Option<String>); 5] {
        [
            ("machine", &self.machine),
            ("state", &self.state),
            ("status", &self.status),
            ("prefix", &self.prefix),
            ("health", &self.health),
        ]
    }

    /// The machines of `machines` the selection may reach: its machine, or all of them.
    fn scope<'m>(&self, machines: &[&'m Machine]) -> impl Iterator<Item = &'m Machine> {
        let only = self.machine.clone();
        machines.iter().copied().filter(move |m| only.as_deref().is_none_or(|n| m.name().as_str() == n))
    }

    /// Checks the criteria against `machines` (those of the engine): `Err` names the one
    /// at fault.
    pub fn check(&self, machines: &[&Machine]) -> std::result::Result<(), String> {
        if self.is_empty() {
            return Err("a bulk operation needs at least one criterion (machine, state, status, prefix, health, \
                        where, error or a time range); it never reaches every entity by default"
                .into());
        }
        // An empty criterion would hold for everything: `prefix: ""` is no criterion.
        if let Some((field, _)) = self.fields().into_iter().find(|(_, v)| v.as_deref().is_some_and(str::is_empty)) {
            return Err(format!("{field}: empty; leave it out, or give what to match"));
        }
        self.narrow.check()?;
        if let Some(m) = &self.machine
            && !machines.iter().any(|x| x.name().as_str() == m)
        {
            return Err(format!("machine: unknown machine `{m}`"));
        }
        if let Some(s) = &self.state
            && !self.scope(machines).any(|m| m.state(s).is_some())
        {
            return Err(format!("state: no machine in the selection has a state `{s}`"));
        }
        if let Some(s) = &self.status
            && settle_store::RunStatus::parse(s).is_none()
        {
            return Err(format!("status: unknown run status `{s}`"));
        }
        if let Some(h) = &self.health
            && h != "ok"
            && h != "error"
        {
            return Err(format!("health: `{h}` is neither `ok` nor `error`"));
        }
        Ok(())
    }

    /// The store's filter for a page of it after entity `after` (id order), at most `limit`.
    pub(crate) fn filter(&self, machines: &[&Machine], after: Option<i64>, limit: Option<u64>) -> EntityFilter {
        let substates =
            self.state.as_deref().map(|s| Machine::substates_across(self.scope(machines), s)).unwrap_or_default();
        let pairs = self.health.as_deref().map(|h| health_pairs(self.scope(machines), h));
        EntityFilter {
            machine: self.machine.clone(),
            state: self.state.clone(),
            substates,
            after_id: after,
            limit,
            run_status: self.status.clone(),
            // A key prefix is kept per entity: pages go in id order, never by key.
            key_prefix: None,
            after_key: None,
            pairs,
            ..EntityFilter::default()
        }
    }
}

/// The (machine, leaf state) pairs of `machines` whose health is `health` (`error` or
/// `ok`): what a filter by health reads.
pub fn health_pairs<'m>(machines: impl Iterator<Item = &'m Machine>, health: &str) -> Vec<(String, String)> {
    let want = if health == "error" { Health::Error } else { Health::Ok };
    machines
        .flat_map(|m| m.states().iter().filter(|s| !s.is_parent()).map(move |s| (m, s)))
        .filter(|(m, s)| m.health_of(&s.name) == want)
        .map(|(m, s)| (m.name().to_string(), s.name.to_string()))
        .collect()
}

/// What a bulk operation does to each entity.
#[derive(Debug, Clone, PartialEq)]
pub enum BulkAction {
    /// An operator command (`sleep` aside).
    Command(Command),
    /// Cancel the operation of the selection's `reached_by` on each (an operation's
    /// cancel, [`Engine::cancel_operation`]).
    Cancel,
    /// An event, with its parameters.
    Raise {
        /// The event.
        event: EventName,
        /// Its parameters (a JSON object, or null).
        params: Value,
    },
}

impl BulkAction {
    /// The stored name of the action.
    pub fn name(&self) -> &'static str {
        match self {
            BulkAction::Command(c) => c.as_str(),
            BulkAction::Cancel => "cancel",
            BulkAction::Raise { .. } => "raise",
        }
    }

    /// Parses a stored or requested action: a command name, or `raise` with its event.
    pub fn parse(action: &str, event: Option<&str>, params: Value) -> std::result::Result<BulkAction, String> {
        let command = match action {
            "pause" => Command::Pause,
            "resume" => Command::Resume,
            "retry" => Command::Retry,
            "release" => Command::Release,
            "kill" => Command::Kill,
            "cancel" if event.is_none() => return Ok(BulkAction::Cancel),
            "raise" => {
                let event = event.ok_or("raise: the event to raise is missing")?;
                return Ok(BulkAction::Raise { event: EventName::new(event), params });
            }
            other => {
                return Err(format!(
                    "action: `{other}` is none of pause, resume, retry, release, kill, raise (sleep is per entity)"
                ));
            }
        };
        if event.is_some() {
            return Err(format!("event: only `raise` takes an event, not `{action}`"));
        }
        Ok(BulkAction::Command(command))
    }
}

/// What a bulk operation is asked to do.
#[derive(Debug, Clone)]
pub struct BulkRequest {
    /// Its request id (generated when `None`); the same id again is a replay.
    pub request_id: Option<String>,
    /// What to do to each entity.
    pub action: BulkAction,
    /// To which entities.
    pub selection: Selection,
    /// Why (required: it is shown with the operation).
    pub reason: String,
    /// At most this many entities a second (1 to [`MAX_RATE`]).
    pub rate: u32,
    /// For `raise`: the priority of the work its events start (`None`: each event's
    /// declared priority less [`settle_core::limits::BACKGROUND`], below live requests').
    pub priority: Option<i64>,
}

/// What a selection matches now.
#[derive(Debug, Clone, PartialEq)]
pub struct DryRun {
    /// How many (exactly, up to [`COUNT_BOUND`]).
    pub count: u64,
    /// More than [`COUNT_BOUND`] match.
    pub more: bool,
    /// The first few, in id order.
    pub sample: Vec<EntityRow>,
}

/// Whether a key passes the selection's prefix.
fn keyed(s: &Selection, e: &EntityRow) -> bool {
    s.prefix.as_deref().is_none_or(|p| e.key.as_str().starts_with(p))
}

/// Rows a dry run reads at once when it must look at each (a selection with criteria no
/// index holds).
const SCAN: u64 = 2_000;

/// How long a page of `n` entities must take at `rate` a second.
pub(crate) fn pace(n: u64, rate: u32) -> Duration {
    Duration::from_millis(n.saturating_mul(1000) / u64::from(rate.max(1)))
}

/// The request id of entity `id`'s command within bulk operation `request_id`.
pub fn entity_request_id(request_id: &str, id: i64) -> String {
    format!("{request_id}/{id}")
}

impl<S: Store> Engine<S> {
    /// What `selection` matches now: a count (exact up to [`COUNT_BOUND`]) and up to
    /// `sample` of them. Writes nothing.
    pub async fn bulk_dry_run(&self, selection: &Selection, sample: usize) -> Result<DryRun> {
        let machines = self.machines();
        let machines: Vec<&Machine> = machines.iter().map(|m| m.as_ref()).collect();
        selection.check(&machines).map_err(Error::Bulk)?;
        let store = &self.inner.store;
        if let Some(r) = &selection.reached_by {
            let rows = store.operation_reached(r, None, COUNT_BOUND).await?;
            let count = rows.len() as u64;
            return Ok(DryRun { count, more: false, sample: rows.into_iter().take(sample).collect() });
        }
        if let Some(id) = selection.successors_of {
            let rows = successors_after(store, id, None, u64::MAX).await?;
            let rows: Vec<EntityRow> = rows.into_iter().filter(|e| keyed(selection, e)).collect();
            return Ok(DryRun {
                count: rows.len() as u64,
                more: false,
                sample: rows.into_iter().take(sample).collect(),
            });
        }
        if !selection.narrow.is_empty() {
            return self.bulk_count_each(selection, &machines, sample).await;
        }
        let (count, rows) = if selection.prefix.is_none() {
            let count = store.entity_count(selection.filter(&machines, None, None), COUNT_BOUND).await?;
            (count, store.entity_list(selection.filter(&machines, None, Some(sample as u64))).await?)
        } else {
            // A key prefix within other criteria: counted page by page (by index range).
            let f = EntityFilter { key_prefix: selection.prefix.clone(), ..selection.filter(&machines, None, None) };
            let count = store.entity_count(f.clone(), COUNT_BOUND).await?;
            let rows = store.entity_list(EntityFilter { limit: Some(sample as u64), ..f }).await?;
            (count, rows)
        };
        let more = count > COUNT_BOUND;
        Ok(DryRun {
            count: count.min(COUNT_BOUND),
            more,
            sample: rows.into_iter().filter(|e| keyed(selection, e)).collect(),
        })
    }

    /// A dry run of a selection with criteria no index holds: reads what its index criteria
    /// match, a page at a time (by key with a prefix, else by id), and counts what passes
    /// the rest (up to [`COUNT_BOUND`]).
    async fn bulk_count_each(&self, selection: &Selection, machines: &[&Machine], sample: usize) -> Result<DryRun> {
        let store = &self.inner.store;
        let base = EntityFilter { key_prefix: selection.prefix.clone(), ..selection.filter(machines, None, None) };
        let (mut count, mut rows_kept) = (0u64, Vec::new());
        let mut page = EntityFilter { limit: Some(SCAN), ..base };
        // The whole count may take ten pages' budget.
        let deadline = std::time::Instant::now() + self.inner.narrow_budget * 10;
        loop {
            let rows = store.entity_list(page.clone()).await?;
            let Narrowed { rows, keeps, .. } = self.narrowed_until(&selection.narrow, rows, Some(deadline)).await?;
            for (e, keep) in rows.iter().zip(keeps) {
                if keep && keyed(selection, e) {
                    count += 1;
                    if rows_kept.len() < sample {
                        rows_kept.push(e.clone());
                    }
                }
            }
            let Some(last) = rows.last().filter(|_| rows.len() as u64 == SCAN && count <= COUNT_BOUND) else {
                break;
            };
            page.after_id = Some(last.id);
            page.after_key = Some((last.machine.to_string(), last.key.to_string()));
        }
        Ok(DryRun { count: count.min(COUNT_BOUND), more: count > COUNT_BOUND, sample: rows_kept })
    }

    /// Starts a bulk operation: checks it, counts what it matches now, stores it, and wakes
    /// the runner. The stored row, and whether it is new (a request id used before for a
    /// bulk operation returns that one).
    pub async fn bulk_start(&self, req: BulkRequest) -> Result<(BulkRow, bool)> {
        self.inner.writable("bulk operation")?;
        let machines = self.machines();
        let refs: Vec<&Machine> = machines.iter().map(|m| m.as_ref()).collect();
        req.selection.check(&refs).map_err(Error::Bulk)?;
        if req.reason.trim().is_empty() {
            return Err(Error::Bulk("reason: say why (it is recorded with the operation)".into()));
        }
        if !(1..=MAX_RATE).contains(&req.rate) {
            return Err(Error::Bulk(format!("rate: from 1 to {MAX_RATE} entities a second, not {}", req.rate)));
        }
        if let BulkAction::Raise { event, params } = &req.action {
            if !req.selection.scope(&refs).any(|m| m.event(event).is_some()) {
                return Err(Error::Bulk(format!("event: no machine in the selection declares `{event}`")));
            }
            if !params.is_null() && !params.is_object() {
                return Err(Error::Bulk("params: must be a JSON object".into()));
            }
        }
        match req.priority {
            Some(_) if !matches!(req.action, BulkAction::Raise { .. }) => {
                return Err(Error::Bulk("priority: only `raise` starts work to give a priority to".into()));
            }
            Some(p) if !settle_core::limits::PRIORITIES.contains(&p) => {
                return Err(Error::Bulk(format!("priority: from -1000 to 1000, not {p}")));
            }
            _ => {}
        }
        if (req.action == BulkAction::Cancel) != req.selection.reached_by.is_some() {
            return Err(Error::Bulk(
                "action: `cancel` goes through the entities an operation reached, and only it does (cancel the \
                 operation itself)"
                    .into(),
            ));
        }
        let request_id = req.request_id.clone().unwrap_or_else(|| uuid::Uuid::now_v7().to_string());
        let dry = self.bulk_dry_run(&req.selection, 0).await?;
        let now = self.inner.clock.now_ms();
        let mut row = BulkRow::new(
            request_id,
            req.action.name().to_string(),
            req.selection.to_json(),
            req.reason.clone(),
            req.rate,
            now,
        );
        row.total = dry.count + u64::from(dry.more);
        if let BulkAction::Raise { event, params } = &req.action {
            row.event = Some(event.to_string());
            row.params = params.clone();
            row.priority = req.priority;
        }
        let (stored, new) = self.inner.store.bulk_start(row).await?;
        if new {
            self.inner.bulk.notify_one();
        }
        Ok((stored, new))
    }

    /// A kill that cascades (`cascade = ["kill"]`): one bulk operation kills the entity's
    /// successors (`{request id}/successors`, each `…/successors/{id}`; each of them
    /// cascades in turn as its machine says). Started before the caller is answered, and
    /// again (a replay) when the kill is: a crash before it started is mended by the
    /// caller's retry with the same request id.
    pub(crate) async fn cascade_kill(&self, killed: &crate::Commanded, reason: Option<&str>) -> Result<()> {
        let e = &killed.entity;
        let snapshot = self.inner.store.successor_snapshot(e.id).await?;
        if snapshot.successors.is_empty() {
            return Ok(());
        }
        let req = BulkRequest {
            request_id: Some(format!("{}/successors", killed.request_id)),
            action: BulkAction::Command(Command::Kill),
            selection: Selection { successors_of: Some(e.id), ..Selection::default() },
            reason: format!(
                "cascade: {}/{} killed{}",
                e.machine,
                e.key,
                reason.map(|r| format!(" ({r})")).unwrap_or_default()
            ),
            rate: MAX_RATE,
            priority: None,
        };
        self.bulk_start(req).await?;
        Ok(())
    }

    /// The bulk operation `request_id`.
    pub async fn bulk_get(&self, request_id: &str) -> Result<Option<BulkRow>> {
        Ok(self.inner.store.bulk_get(request_id).await?)
    }

    /// The newest bulk operations, newest first.
    pub async fn bulk_list(&self, limit: u64) -> Result<Vec<BulkRow>> {
        Ok(self.inner.store.bulk_list(limit).await?)
    }

    /// Cancels the bulk operation `request_id` if it runs (the page in flight finishes;
    /// nothing after it starts). The row after; `None` if there is none such.
    pub async fn bulk_cancel(&self, request_id: &str) -> Result<Option<BulkRow>> {
        self.inner.writable("bulk cancel")?;
        Ok(self.inner.store.bulk_cancel(request_id, self.inner.clock.now_ms()).await?)
    }

    /// Waits until the bulk operation `request_id` is no longer running (done or
    /// canceled), at most `timeout`: the row then.
    pub async fn bulk_wait(&self, request_id: &str, timeout: Duration) -> Result<BulkRow> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let progressed = self.inner.bulk_progress.notified();
            let row = self
                .bulk_get(request_id)
                .await?
                .ok_or_else(|| Error::Bulk(format!("no bulk operation `{request_id}`")))?;
            if row.status != "running" {
                return Ok(row);
            }
            // Another instance may run it: look again now and then.
            if tokio::time::timeout_at(
                deadline.min(tokio::time::Instant::now() + Duration::from_millis(200)),
                progressed,
            )
            .await
            .is_err()
                && tokio::time::Instant::now() >= deadline
            {
                return Err(Error::Timeout { request_id: request_id.to_string(), waited: timeout });
            }
        }
    }
}

/// Runs the bulk operations this engine can lease, one page at a time, until the engine
/// goes away.
pub(crate) async fn run<S: Store + Clone>(inner: Weak<Inner<S>>, owner: String, lease: Duration, poll: Duration) {
    loop {
        let Some(strong) = inner.upgrade() else { return };
        if strong.tx.is_closed() {
            return;
        }
        let engine = Engine { inner: strong };
        let now = engine.inner.clock.now_ms();
        let lease_until = now + lease.as_millis() as Millis;
        // On a store only this engine uses (SQLite), a lease left by a process that died
        // is this deployment's own: take it over at once.
        let expired_before = if engine.inner.store.exclusive() { Millis::MAX } else { now };
        let claimed = engine.inner.store.bulk_claim(&owner, expired_before, lease_until).await;
        match claimed {
            Ok(Some(row)) => match page(&engine, &owner, lease, row).await {
                Ok(()) => continue,
                Err(Error::Stopped) => return,
                Err(e) => tracing::warn!(error = %e, "a page of a bulk operation failed; it runs again"),
            },
            Ok(None) => {}
            Err(e) => tracing::warn!(error = %e, "could not look for bulk operations"),
        }
        // Nothing to do (or a failure): wait to be told, or look again after `poll`.
        let wake = engine.inner.bulk.clone();
        let clock = engine.inner.clock.clone();
        drop(engine);
        let at = clock.now_ms() + poll.as_millis() as Millis;
        tokio::select! {
            _ = wake.notified() => {}
            _ = clock.sleep_until(at) => {}
        }
    }
}

/// One page of `row`: its entities commanded, then its progress written.
async fn page<S: Store + Clone>(engine: &Engine<S>, owner: &str, lease: Duration, row: BulkRow) -> Result<()> {
    let clock = engine.inner.clock.clone();
    let started = clock.now_ms();
    let machines = engine.machines();
    let refs: Vec<&Machine> = machines.iter().map(|m| m.as_ref()).collect();
    let selection = Selection::from_json(&row.filter).map_err(Error::Bulk)?;
    let action = BulkAction::parse(&row.action, row.event.as_deref(), row.params.clone()).map_err(Error::Bulk)?;
    let after = row.cursor.as_deref().and_then(|c| c.parse::<i64>().ok());
    let limit = PAGE.min(u64::from(row.rate.max(1)));
    let entities = match (selection.successors_of, &selection.reached_by) {
        (_, Some(r)) => engine.inner.store.operation_reached(r, after, limit).await?,
        (Some(id), None) => successors_after(&engine.inner.store, id, after, limit).await?,
        (None, None) => engine.inner.store.entity_list(selection.filter(&refs, after, Some(limit))).await?,
    };
    // A cancel ends on an empty page only: a commit that landed before its entity's
    // cancel may have created entities since the page was read (their ids come after it).
    let finished = match action {
        BulkAction::Cancel => entities.is_empty(),
        _ => (entities.len() as u64) < limit,
    };
    let cursor = entities.last().map(|e| e.id.to_string()).or(row.cursor.clone());
    let Narrowed { rows: entities, keeps, .. } = engine.narrowed_until(&selection.narrow, entities, None).await?;
    let chosen: Vec<&EntityRow> =
        entities.iter().zip(keeps).filter(|(e, keep)| *keep && keyed(&selection, e)).map(|(e, _)| e).collect();
    let (mut done, mut failed, mut last_error) = (0u64, 0u64, None);
    for chunk in chosen.chunks(AT_ONCE) {
        let mut set = tokio::task::JoinSet::new();
        for (i, e) in chunk.iter().enumerate() {
            let (engine, request_id, action, e) =
                (engine.clone(), row.request_id.clone(), action.clone(), (*e).clone());
            let (reason, reached_by, priority) = (row.reason.clone(), selection.reached_by.clone(), row.priority);
            set.spawn(async move {
                (i, one(&engine, &request_id, &reason, (&action, priority), &e, reached_by.as_deref()).await)
            });
        }
        let mut results: Vec<(usize, Result<()>)> = set.join_all().await;
        results.sort_by_key(|(i, _)| *i);
        for (e, (_, r)) in chunk.iter().zip(results) {
            match r {
                Ok(()) => done += 1,
                Err(Error::Stopped) => return Err(Error::Stopped),
                Err(err) => {
                    failed += 1;
                    last_error = Some(format!("{}/{}: {err}", e.machine, e.key));
                }
            }
        }
    }
    // Keep to the rate: a page of n entities takes at least n / rate seconds.
    let until = started + pace(entities.len() as u64, row.rate).as_millis() as Millis;
    if until > clock.now_ms() {
        clock.sleep_until(until).await;
    }
    let now = clock.now_ms();
    let advance = BulkAdvance {
        request_id: row.request_id.clone(),
        owner: owner.to_string(),
        now,
        lease_until: now + lease.as_millis() as Millis,
        cursor,
        done,
        failed,
        last_error,
        finished,
    };
    let held = engine.inner.store.bulk_advance(advance).await?;
    if !held {
        tracing::info!(bulk = %row.request_id, "bulk operation canceled or taken over; its page stops here");
    }
    crate::metrics::bulk_commanded(done, failed);
    engine.inner.bulk_progress.notify_waiters();
    Ok(())
}

/// The successors of entity `id` after id `after`, in id order, at most `limit` (an
/// entity's successors are the few it created or joined: read at once).
async fn successors_after<S: Store>(store: &S, id: i64, after: Option<i64>, limit: u64) -> Result<Vec<EntityRow>> {
    let mut rows: Vec<EntityRow> =
        store.successor_snapshot(id).await?.successors.into_iter().filter(|e| after.is_none_or(|a| e.id > a)).collect();
    rows.sort_by_key(|e| e.id);
    rows.truncate(limit.min(usize::MAX as u64) as usize);
    Ok(rows)
}

/// One entity's command (or event) within bulk operation `request_id`.
async fn one<S: Store + Clone>(
    engine: &Engine<S>,
    request_id: &str,
    reason: &str,
    (action, priority): (&BulkAction, Option<i64>),
    e: &EntityRow,
    reached_by: Option<&str>,
) -> Result<()> {
    let id = entity_request_id(request_id, e.id);
    match action {
        BulkAction::Cancel => {
            let canceled = reached_by.ok_or_else(|| Error::Bulk("a cancel names the operation it cancels".into()))?;
            engine.cancel_entity(e, canceled, id, reason).await.map(|_| ())
        }
        BulkAction::Command(c) => {
            engine.command_with_reason(&e.machine, &e.key, *c, Some(id), Some(reason)).await.map(|_| ())
        }
        BulkAction::Raise { event, params } => {
            let options = RaiseOptions {
                params: params.clone(),
                wait: Wait::Queued,
                request_id: Some(id),
                priority,
                background: true,
                ..RaiseOptions::default()
            };
            engine.raise(&e.machine, &e.key, event, options).await.map(|_| ())
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use settle_core::MachineBuilder;
    use settle_store::Command;

    use super::{BulkAction, Selection, pace};

    fn machine() -> settle_core::Machine {
        MachineBuilder::new("vm")
            .state("new")
            .initial()
            .state("up")
            .state("broken")
            .error_health()
            .event("go", ["new"], "a")
            .action("a", ["up", "broken"])
            .build()
            .unwrap()
    }

    #[test]
    fn a_selection_needs_a_criterion_and_names_the_one_at_fault() {
        let m = machine();
        let ms = [&m];
        assert!(Selection::default().check(&ms).unwrap_err().contains("at least one criterion"));
        let everything = Selection { prefix: Some(String::new()), ..Selection::default() };
        assert_eq!(everything.check(&ms).unwrap_err(), "prefix: empty; leave it out, or give what to match");
        let s = |f: fn(&mut Selection)| {
            let mut s = Selection::default();
            f(&mut s);
            s.check(&ms)
        };
        assert_eq!(s(|s| s.machine = Some("vm".into())), Ok(()));
        assert!(s(|s| s.machine = Some("db".into())).unwrap_err().starts_with("machine:"));
        assert!(s(|s| s.state = Some("gone".into())).unwrap_err().starts_with("state:"));
        assert!(s(|s| s.status = Some("asleep".into())).unwrap_err().starts_with("status:"));
        assert!(s(|s| s.health = Some("sick".into())).unwrap_err().starts_with("health:"));
        assert_eq!(s(|s| s.prefix = Some("r1-".into())), Ok(()));
    }

    #[test]
    fn a_selection_survives_its_encoding_and_becomes_the_stores_filter() {
        let m = machine();
        let s = Selection {
            machine: Some("vm".into()),
            health: Some("error".into()),
            status: Some("active".into()),
            ..Selection::default()
        };
        assert_eq!(s.to_json(), json!({"machine": "vm", "health": "error", "status": "active"}));
        assert_eq!(Selection::from_json(&s.to_json()), Ok(s.clone()));
        let f = s.filter(&[&m], Some(42), Some(10));
        assert_eq!(f.pairs, Some(vec![("vm".to_string(), "broken".to_string())]));
        assert_eq!((f.after_id, f.limit, f.run_status.as_deref()), (Some(42), Some(10), Some("active")));
        assert_eq!(f.key_prefix, None, "a prefix is kept per entity: pages stay in id order");
    }

    #[test]
    fn actions_parse_and_sleep_is_not_one_of_them() {
        assert_eq!(BulkAction::parse("resume", None, json!(null)), Ok(BulkAction::Command(Command::Resume)));
        assert_eq!(
            BulkAction::parse("raise", Some("go"), json!({"n": 1})),
            Ok(BulkAction::Raise { event: "go".into(), params: json!({"n": 1}) })
        );
        assert!(BulkAction::parse("raise", None, json!(null)).unwrap_err().contains("event"));
        assert!(BulkAction::parse("sleep", None, json!(null)).unwrap_err().contains("per entity"));
        assert!(BulkAction::parse("kill", Some("go"), json!(null)).unwrap_err().starts_with("event:"));
    }

    #[test]
    fn a_page_takes_as_long_as_its_rate_says() {
        assert_eq!(pace(200, 1000).as_millis(), 200);
        assert_eq!(pace(5, 10).as_millis(), 500);
        assert_eq!(pace(0, 10).as_millis(), 0);
    }
}
