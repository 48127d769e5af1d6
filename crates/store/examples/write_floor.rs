//! The least SQLite work a `bench chain` workflow needs under DESIGN.md, with no engine
//! around it: what Settle's writer could reach if it wrote only that.
//!
//! Each workflow is `idle -go→ u1 → … → u{steps} → done` on one entity, as `settle bench
//! chain` drives it. The rows are the ones the design asks for and no more:
//! - the raise writes the event's inbox row, its operation (§6 `operations`), its event
//!   (§6 `events`), and the entity's lease and due time (it is claimed in the same round);
//! - each transition writes the entity's state and version, fenced by its lease, and a
//!   history row with §6's transition columns;
//! - the first consumes the inbox row, the last releases the lease and ends the event and
//!   the operation.
//!
//! The indexes are the design's too: the entity by machine and key, by due time (partial)
//! and by machine and state, the inbox and history by entity, the operation by request id
//! and while open, the event by operation.
//!
//! `concurrency` workflows are in flight; each round takes each of them one step in one
//! transaction with `synchronous = FULL` (the group commit), so a workflow takes
//! `steps + 2` rounds, as its batches do in the engine. Nothing is read back, nothing is
//! decided, no handler runs: it is a floor, not a competitor.
//!
//! ```text
//! cargo run --release -p settle-store --example write_floor -- [workflows] [concurrency] [steps] [file]
//! ```
//! Defaults: 20000 workflows, 64 in flight, 3 steps, a file in the temporary directory.

use std::time::Instant;

use rusqlite::{Connection, params};

const SCHEMA: &str = "
PRAGMA journal_mode = WAL;
PRAGMA synchronous = FULL;
CREATE TABLE entities (
    id INTEGER PRIMARY KEY, machine TEXT NOT NULL, key TEXT NOT NULL, state TEXT NOT NULL,
    properties TEXT NOT NULL, version INTEGER NOT NULL, entered_at INTEGER NOT NULL,
    due_at INTEGER, lease_owner TEXT, lease_until INTEGER, request_id TEXT,
    UNIQUE (machine, key));
CREATE INDEX entities_due ON entities (due_at) WHERE due_at IS NOT NULL;
CREATE INDEX entities_machine_state ON entities (machine, state);
CREATE TABLE inbox (
    id INTEGER PRIMARY KEY, entity_id INTEGER NOT NULL, event TEXT NOT NULL,
    params TEXT NOT NULL, request_id TEXT, created_at INTEGER NOT NULL);
CREATE INDEX inbox_entity ON inbox (entity_id, id);
CREATE TABLE operations (
    id INTEGER PRIMARY KEY, request_id TEXT NOT NULL UNIQUE, name TEXT NOT NULL,
    started_at INTEGER NOT NULL, ended_at INTEGER, first_response_at INTEGER, outcome TEXT,
    error TEXT, restart_count INTEGER NOT NULL, dimensions TEXT NOT NULL);
CREATE INDEX operations_open ON operations (started_at) WHERE ended_at IS NULL;
CREATE TABLE events (
    id INTEGER PRIMARY KEY, operation_id INTEGER, request_id TEXT, seq INTEGER NOT NULL,
    entity_id INTEGER NOT NULL, machine TEXT NOT NULL, entity_key TEXT NOT NULL,
    event TEXT NOT NULL, kind TEXT NOT NULL, start_state TEXT, end_state TEXT,
    start_time INTEGER NOT NULL, end_time INTEGER, error INTEGER NOT NULL);
CREATE INDEX events_operation ON events (operation_id);
CREATE TABLE history (
    id INTEGER PRIMARY KEY, entity_id INTEGER NOT NULL, from_state TEXT, to_state TEXT,
    kind TEXT NOT NULL, action TEXT, event TEXT, retry INTEGER NOT NULL, request_id TEXT,
    at INTEGER NOT NULL, event_id INTEGER, ordinal INTEGER, transition_kind TEXT,
    start_health TEXT, end_health TEXT, entry_time INTEGER, start_time INTEGER,
    action_start_time INTEGER, outcome TEXT);
CREATE INDEX history_entity ON history (entity_id, id);
";

const LEASE_MS: i64 = 30_000;

/// The command line: positional, each with its default.
struct Args {
    workflows: i64,
    concurrency: usize,
    steps: usize,
    file: std::path::PathBuf,
}

fn args() -> Result<Args, String> {
    let given: Vec<String> = std::env::args().skip(1).collect();
    let number = |i: usize, default: i64, what: &str| -> Result<i64, String> {
        match given.get(i) {
            None => Ok(default),
            Some(s) => match s.parse::<i64>() {
                Ok(n) if n > 0 => Ok(n),
                _ => Err(format!("{what} must be a positive number, got {s:?}")),
            },
        }
    };
    let steps = number(2, 3, "steps")? as usize;
    if steps > 8 {
        return Err(format!("steps must be 1 to 8, as `bench chain --steps`, got {steps}"));
    }
    Ok(Args {
        workflows: number(0, 20_000, "workflows")?,
        concurrency: number(1, 64, "concurrency")? as usize,
        steps,
        file: given.get(3).map_or_else(
            || std::env::temp_dir().join(format!("settle-write-floor-{}.db", std::process::id())),
            std::path::PathBuf::from,
        ),
    })
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a = args()?;
    remove(&a.file);
    let conn = Connection::open(&a.file)?;
    conn.execute_batch(SCHEMA)?;
    let tx = conn.unchecked_transaction()?;
    for id in 1..=a.workflows {
        conn.prepare_cached(
            "INSERT INTO entities (id, machine, key, state, properties, version, entered_at)
             VALUES (?1, 'chain', ?2, 'idle', '{}', 1, 0)",
        )?
        .execute(params![id, format!("e{id}")])?;
    }
    tx.commit()?;

    let states: Vec<String> = std::iter::once("idle".to_string())
        .chain((1..=a.steps).map(|i| format!("u{i}")))
        .chain(["done".into()])
        .collect();
    // (entity id, rounds it has taken) of the workflows in flight.
    let mut flight: Vec<(i64, usize)> = Vec::with_capacity(a.concurrency);
    let (mut next, mut done, mut rounds) = (1i64, 0i64, 0u64);
    let started = Instant::now();
    while done < a.workflows {
        while flight.len() < a.concurrency && next <= a.workflows {
            flight.push((next, 0));
            next += 1;
        }
        let now = rounds as i64 + 1;
        let tx = conn.unchecked_transaction()?;
        for (id, taken) in &mut flight {
            let id = *id;
            let request_id = format!("{id:08x}-0000-7000-8000-000000000000");
            if *taken == 0 {
                raise(&conn, id, &request_id, now)?;
            } else {
                transition(&conn, id, &request_id, *taken, &states, now)?;
            }
            *taken += 1;
        }
        tx.commit()?;
        rounds += 1;
        let before = flight.len();
        flight.retain(|(_, taken)| *taken < a.steps + 2);
        done += (before - flight.len()) as i64;
    }
    let seconds = started.elapsed().as_secs_f64();
    println!(
        "{} workflows of {} steps, {} in flight: {:.0} workflows/s ({:.3} ms a round, {rounds} rounds)",
        a.workflows,
        a.steps,
        a.concurrency,
        a.workflows as f64 / seconds,
        seconds * 1000.0 / rounds as f64
    );
    drop(conn);
    remove(&a.file);
    Ok(())
}

/// Removes the database `file` and its log files, if there are any.
fn remove(file: &std::path::Path) {
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", file.display()));
    }
}

/// The event goes into the entity's inbox with its operation and event rows, and the
/// entity, due now, is claimed in the same round.
fn raise(conn: &Connection, id: i64, request_id: &str, now: i64) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "INSERT INTO operations (id, request_id, name, started_at, restart_count, dimensions)
         VALUES (?1, ?2, 'raise', ?3, 0, '{}')",
    )?
    .execute(params![id, request_id, now])?;
    conn.prepare_cached(
        "INSERT INTO events (id, operation_id, request_id, seq, entity_id, machine, entity_key, event, kind,
            start_state, start_time, error)
         VALUES (?1, ?1, ?2, 1, ?1, 'chain', 'e' || ?1, 'go', 'raised', 'idle', ?3, 0)",
    )?
    .execute(params![id, request_id, now])?;
    conn.prepare_cached(
        "INSERT INTO inbox (entity_id, event, params, request_id, created_at) VALUES (?1, 'go', '{}', ?2, ?3)",
    )?
    .execute(params![id, request_id, now])?;
    conn.prepare_cached("UPDATE entities SET lease_owner = 'floor', lease_until = ?2, due_at = ?2 WHERE id = ?1")?
        .execute(params![id, now + LEASE_MS])?;
    Ok(())
}

/// Transition number `n` (1 for the event's) of the entity, fenced by its lease.
fn transition(
    conn: &Connection,
    id: i64,
    request_id: &str,
    n: usize,
    states: &[String],
    now: i64,
) -> rusqlite::Result<()> {
    let (from, to) = (&states[n - 1], &states[n]);
    let last = n == states.len() - 1;
    if n == 1 {
        conn.prepare_cached(
            "DELETE FROM inbox WHERE id = (SELECT id FROM inbox WHERE entity_id = ?1 ORDER BY id LIMIT 1)",
        )?
        .execute([id])?;
    }
    let fenced = if last {
        conn.prepare_cached(
            "UPDATE entities SET state = ?2, version = version + 1, entered_at = ?3, lease_owner = NULL,
                lease_until = NULL, due_at = NULL, request_id = NULL
             WHERE id = ?1 AND lease_owner = 'floor'",
        )?
        .execute(params![id, to, now])?
    } else {
        conn.prepare_cached(
            "UPDATE entities SET state = ?2, version = version + 1, entered_at = ?3, request_id = ?4
             WHERE id = ?1 AND lease_owner = 'floor'",
        )?
        .execute(params![id, to, now, request_id])?
    };
    assert_eq!(fenced, 1, "entity {id} holds its lease");
    conn.prepare_cached(
        "INSERT INTO history (entity_id, from_state, to_state, kind, action, event, retry, request_id, at,
            event_id, ordinal, transition_kind, start_health, end_health, entry_time, start_time,
            action_start_time, outcome)
         VALUES (?1, ?2, ?3, 'transition', ?4, ?5, 0, ?6, ?7, ?1, ?8, ?9, 'ok', 'ok', ?7, ?7, ?7, 'ok')",
    )?
    .execute(params![
        id,
        from,
        to,
        (n > 1).then_some("step"),
        (n == 1).then_some("go"),
        request_id,
        now,
        n as i64,
        if n == 1 { "event" } else { "auto_action" }
    ])?;
    if last {
        conn.prepare_cached("UPDATE events SET end_state = ?2, end_time = ?3 WHERE id = ?1")?
            .execute(params![id, to, now])?;
        conn.prepare_cached("UPDATE operations SET ended_at = ?2, outcome = 'success' WHERE id = ?1")?
            .execute(params![id, now])?;
    }
    Ok(())
}
