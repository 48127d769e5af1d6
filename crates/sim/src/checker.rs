//! The invariants, checked over what the store recorded as it grows ([`Checker`]).

use std::collections::{HashMap, HashSet};

use crate::chart::CHART_HOOKS;

/// A broken invariant: what, where (entities by `machine/key`), at which step.
#[derive(Debug, Clone)]
pub struct Violation {
    pub(crate) step: usize,
    pub(crate) what: String,
    pub(crate) entities: Vec<String>,
}

/// An event the store acknowledged (its inbox id).
#[derive(Debug, Clone)]
pub(crate) struct Acked {
    pub(crate) machine: String,
    pub(crate) key: String,
    pub(crate) event: String,
    pub(crate) request_id: String,
    pub(crate) inbox_id: i64,
}

/// The invariants, checked over the store's history as it grows.
///
/// After every step:
/// - single writer: no (entity, version) is committed by two nodes (each node reports the
///   commits that landed);
/// - history chains unbroken: an entity's first row is its creation, and each row that
///   names the state it started from names the state the previous entry entered;
/// - no event processed twice: each entity has as many history rows that processed an
///   event (`event`, `rejected`, `internal`, `ignored`) as `events` rows, which are keyed
///   by the event's inbox id;
/// - timers fire once per due time and never early: a sleeper's `wake` comes at most once,
///   not before its creation plus its delay.
///
/// At the end, with every node at rest:
/// - every acknowledged event was processed (its `events` row exists; killed entities
///   excepted), and no inbox holds an event of a live entity;
/// - every operation ended;
/// - every sleeper not killed woke;
/// - every chart that reached `done` ran each of its entry and exit actions once (its rows
///   in `chart_hooks`, written in the transitions' commits).
#[derive(Default)]
pub(crate) struct Checker {
    pub(crate) last_history: i64,
    /// The state each entity entered last, by id.
    pub(crate) entities: HashMap<i64, Option<String>>,
    pub(crate) names: HashMap<i64, String>,
    /// History rows that processed an event, by entity id.
    pub(crate) processed: HashMap<i64, u32>,
    /// Sleepers' `wake` rows, by entity id.
    pub(crate) woke: HashMap<i64, u32>,
    /// When each sleeper's timer is due (`sleeper/KEY`): its create request's time plus
    /// the delay.
    pub(crate) sleeper_due: HashMap<String, i64>,
    pub(crate) landed: HashMap<(i64, i64), String>,
    pub(crate) acked: Vec<Acked>,
    pub(crate) fatal: Option<Violation>,
}

impl Checker {
    pub(crate) fn name(&self, id: i64) -> String {
        self.names.get(&id).cloned().unwrap_or_else(|| format!("entity#{id}"))
    }

    pub(crate) fn check(&mut self, db: &rusqlite::Connection, step: usize, end: bool) -> Result<(), Violation> {
        if let Some(v) = self.fatal.take() {
            return Err(v);
        }
        let fail = |what: String, entities: Vec<String>| Violation { step, what, entities };
        let rows =
            read_history(db, self.last_history).map_err(|e| fail(format!("cannot read history: {e}"), vec![]))?;
        for h in rows {
            self.last_history = h.id;
            let name = format!("{}/{}", h.machine, h.key);
            self.names.entry(h.entity_id).or_insert_with(|| name.clone());
            let seen = self.entities.get(&h.entity_id).cloned();
            if h.kind == "create" {
                if seen.is_some() {
                    return Err(fail(format!("{name}: created twice (history row {})", h.id), vec![name]));
                }
            } else {
                let Some(current) = seen else {
                    return Err(fail(
                        format!("{name}: history row {} ({}) before its creation", h.id, h.kind),
                        vec![name],
                    ));
                };
                if let (Some(from), Some(current)) = (&h.from, &current)
                    && from != current
                {
                    return Err(fail(
                        format!(
                            "{name}: history chain broken at row {}: a {} from `{from}` while the entity was in `{current}`",
                            h.id, h.kind
                        ),
                        vec![name],
                    ));
                }
            }
            let entered = h.to.clone().or(self.entities.get(&h.entity_id).cloned().flatten());
            self.entities.insert(h.entity_id, entered);
            if matches!(h.kind.as_str(), "event" | "rejected" | "internal" | "ignored") && h.event.is_some() {
                *self.processed.entry(h.entity_id).or_default() += 1;
            }
            if h.machine == "sleeper" && h.event.as_deref() == Some("wake") && h.kind == "event" {
                let n = self.woke.entry(h.entity_id).or_default();
                *n += 1;
                if *n > 1 {
                    return Err(fail(format!("{name}: its timer fired {n} times for one due time"), vec![name]));
                }
                let due = self.sleeper_due.get(&name).copied().unwrap_or(i64::MAX);
                if h.at < due {
                    return Err(fail(
                        format!("{name}: its timer fired at {} before it was due ({due})", h.at),
                        vec![name],
                    ));
                }
            }
        }
        // Each event processed is one `events` row (keyed by its inbox id) and one history
        // row: more history rows than events means an event was processed twice. (An event
        // whose action failed is consumed by a `fault` row and marked `failed`.)
        let events: Vec<(i64, i64)> = db
            .prepare_cached("SELECT entity_id, COUNT(*) FROM events WHERE NOT failed GROUP BY entity_id")
            .and_then(|mut s| s.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?.collect())
            .map_err(|e| fail(e.to_string(), vec![]))?;
        let events: HashMap<i64, i64> = events.into_iter().collect();
        for (id, rows) in &self.processed {
            let n = events.get(id).copied().unwrap_or(0);
            if i64::from(*rows) != n {
                let name = self.name(*id);
                return Err(fail(
                    format!("{name}: {rows} history rows processed an event, but {n} events were processed"),
                    vec![name],
                ));
            }
        }
        // A chart's entry and exit actions insert their rows in their transition's commit:
        // one committed twice, or apart from it, shows as a row twice.
        let twice: Option<(String, String, String)> = db
            .prepare_cached("SELECT key, hook, state FROM chart_hooks GROUP BY key, hook, state HAVING COUNT(*) > 1")
            .and_then(|mut s| s.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?.next().transpose())
            .map_err(|e| fail(e.to_string(), vec![]))?;
        if let Some((key, hook, state)) = twice {
            let name = format!("chart/{key}");
            return Err(fail(format!("{name}: `{hook}` of `{state}` ran into the store twice"), vec![name]));
        }
        if !end {
            return Ok(());
        }
        let done: Vec<String> = db
            .prepare("SELECT key FROM entities WHERE machine = 'chart' AND state = 'done' ORDER BY id")
            .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())
            .map_err(|e| fail(e.to_string(), vec![]))?;
        let expected: Vec<(String, String)> =
            CHART_HOOKS.iter().map(|(h, st)| (h.to_string(), st.to_string())).collect();
        for key in done {
            let ran: Vec<(String, String)> = db
                .prepare_cached("SELECT hook, state FROM chart_hooks WHERE key = ?1 ORDER BY hook, state")
                .and_then(|mut s| s.query_map([&key], |r| Ok((r.get(0)?, r.get(1)?)))?.collect())
                .map_err(|e| fail(e.to_string(), vec![]))?;
            if ran != expected {
                let name = format!("chart/{key}");
                return Err(fail(format!("{name}: done, but its entry and exit actions wrote {ran:?}"), vec![name]));
            }
        }
        let killed = killed(db).map_err(|e| fail(e.to_string(), vec![]))?;
        for a in &self.acked {
            let name = format!("{}/{}", a.machine, a.key);
            let processed: bool = db
                .query_row("SELECT COUNT(*) > 0 FROM events WHERE id = ?1", [a.inbox_id], |r| r.get(0))
                .map_err(|e| fail(e.to_string(), vec![]))?;
            if !processed && !killed.contains(&name) {
                return Err(fail(
                    format!(
                        "{name}: acknowledged event `{}` (request {}, inbox {}) was never processed",
                        a.event, a.request_id, a.inbox_id
                    ),
                    vec![name],
                ));
            }
        }
        let open: Vec<(String, String, Option<String>, Option<String>)> = db
            .prepare("SELECT request_id, name, machine, entity_key FROM operations WHERE ended_at IS NULL ORDER BY id")
            .and_then(|mut s| s.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?.collect())
            .map_err(|e| fail(e.to_string(), vec![]))?;
        if let Some((request_id, op, machine, key)) = open.first() {
            let name = format!("{}/{}", machine.as_deref().unwrap_or("?"), key.as_deref().unwrap_or("?"));
            return Err(fail(
                format!("operation {op} ({request_id}) never ended ({} operations open at rest)", open.len()),
                vec![name],
            ));
        }
        let queued: Vec<(String, String, String)> = db
            .prepare(
                "SELECT e.machine, e.key, i.event FROM inbox i JOIN entities e ON e.id = i.entity_id \
                 WHERE e.run_status <> 'killed' ORDER BY i.id",
            )
            .and_then(|mut s| s.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?.collect())
            .map_err(|e| fail(e.to_string(), vec![]))?;
        if let Some((m, k, e)) = queued.first() {
            let name = format!("{m}/{k}");
            return Err(fail(format!("{name}: event `{e}` still queued at rest"), vec![name]));
        }
        let asleep: Vec<String> = db
            .prepare(
                "SELECT key FROM entities WHERE machine = 'sleeper' AND state = 'asleep' AND run_status <> 'killed'",
            )
            .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())
            .map_err(|e| fail(e.to_string(), vec![]))?;
        if let Some(k) = asleep.first() {
            let name = format!("sleeper/{k}");
            return Err(fail(format!("{name}: its timer never fired"), vec![name]));
        }
        Ok(())
    }
}

/// A history row with its entity's names and creation time.
struct Row {
    id: i64,
    entity_id: i64,
    machine: String,
    key: String,
    from: Option<String>,
    to: Option<String>,
    kind: String,
    event: Option<String>,
    at: i64,
}

fn read_history(db: &rusqlite::Connection, after: i64) -> rusqlite::Result<Vec<Row>> {
    let mut stmt = db.prepare_cached(
        "SELECT h.id, h.entity_id, e.machine, e.key, h.from_state, h.to_state, h.kind, h.event, \
         h.at FROM history h JOIN entities e ON e.id = h.entity_id WHERE h.id > ?1 ORDER BY h.id",
    )?;
    stmt.query_map([after], |r| {
        Ok(Row {
            id: r.get(0)?,
            entity_id: r.get(1)?,
            machine: r.get(2)?,
            key: r.get(3)?,
            from: r.get(4)?,
            to: r.get(5)?,
            kind: r.get(6)?,
            event: r.get(7)?,
            at: r.get(8)?,
        })
    })?
    .collect()
}

fn killed(db: &rusqlite::Connection) -> rusqlite::Result<HashSet<String>> {
    let mut stmt = db.prepare("SELECT machine, key FROM entities WHERE run_status = 'killed'")?;
    stmt.query_map([], |r| Ok(format!("{}/{}", r.get::<_, String>(0)?, r.get::<_, String>(1)?)))?.collect()
}
