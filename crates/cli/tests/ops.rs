//! Operating the engine end to end: the telemetry a demo leaves is consistent (checked with
//! plain SQL), `settle stats` agrees with it, and the operator commands (`pause`, `resume`,
//! `sleep`, `kill`) and read-only views (`list --status`, `ops`, `machines`, `history
//! --events`) work on a demo database.

mod common;
use common::{settle, stderr, stdout};

use std::collections::BTreeMap;
use std::path::Path;

use rusqlite::Connection;
use serde_json::Value;

/// Runs `settle` and returns its standard output; fails the test if it failed.
fn ok(db: &Path, args: &[&str]) -> String {
    let out = settle(db, args);
    assert!(out.status.success(), "settle {args:?} failed: {}", stderr(&out));
    stdout(&out)
}

fn json_lines(text: &str) -> Vec<Value> {
    text.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"))).collect()
}

fn demo(dir: &Path) -> std::path::PathBuf {
    let db = dir.join("demo.db");
    let out = ok(&db, &["demo", "--servers", "20", "--fail-rate", "0.3", "--seed", "3"]);
    assert!(out.contains("servers by state: ready 20"), "{out}");
    db
}

fn read(db: &Path) -> Connection {
    Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap()
}

fn rows<T>(c: &Connection, sql: &str, f: impl FnMut(&rusqlite::Row<'_>) -> rusqlite::Result<T>) -> Vec<T> {
    c.prepare(sql).unwrap().query_map([], f).unwrap().collect::<rusqlite::Result<_>>().unwrap()
}

/// A count column as `u64`.
fn n(r: &rusqlite::Row<'_>, i: usize) -> rusqlite::Result<u64> {
    r.get::<_, i64>(i).map(|v| v as u64)
}

/// Checks the telemetry tables of a database whose engine is at rest: every state entry of
/// history is one `transitions` row; every event starts where its first transition starts,
/// ends where its last one ends (ordinals 1, 2, ...), or, with no transition, was rejected or
/// failed and changed nothing; every operation ended with an outcome.
fn assert_telemetry_consistent(db: &Path) {
    let c = read(db);
    // Every state entry in history is exactly one row of the `transitions` view.
    let entries: Vec<(i64, i64)> = rows(
        &c,
        "SELECT h.id, (SELECT COUNT(*) FROM transitions t WHERE t.history_id = h.id) FROM history h
         WHERE h.to_state IS NOT NULL",
        |r| Ok((r.get(0)?, r.get(1)?)),
    );
    assert!(!entries.is_empty());
    let wrong: Vec<_> = entries.iter().filter(|(_, n)| *n != 1).collect();
    assert!(wrong.is_empty(), "history rows (id, times in transitions) not exactly once: {wrong:?}");
    let total: i64 = c.query_row("SELECT COUNT(*) FROM transitions", [], |r| r.get(0)).unwrap();
    assert_eq!(total as usize, entries.len(), "transitions holds nothing but history's state entries");

    // Every event spans its transitions: it starts where the first one starts and ends where
    // the last one ends; ordinals count 1, 2, ... within it. An event with no transition was
    // rejected or failed and ended where it started.
    type EventRow = (i64, String, String, Option<String>, Option<i64>, bool, bool);
    let events: Vec<EventRow> =
        rows(&c, "SELECT id, event, start_state, end_state, end_time, rejected, failed FROM events ORDER BY id", |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?, r.get(6)?))
        });
    assert!(events.len() >= 20 * 6, "raised, nested and subscription events: {}", events.len());
    let mut under: BTreeMap<i64, Vec<(i64, Option<String>, String)>> = BTreeMap::new();
    for (event_id, ordinal, start, end) in rows(
        &c,
        "SELECT event_id, ordinal, start_state, end_state FROM transitions WHERE event_id IS NOT NULL
         ORDER BY event_id, ordinal",
        |r| Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?, r.get::<_, Option<String>>(2)?, r.get::<_, String>(3)?)),
    ) {
        under.entry(event_id).or_default().push((ordinal, start, end));
    }
    for (id, name, start, end, end_time, rejected, failed) in &events {
        assert!(end_time.is_some(), "event {id} ({name}) never ended though everything is at rest");
        match under.get(id) {
            Some(ts) => {
                let ordinals: Vec<i64> = ts.iter().map(|t| t.0).collect();
                assert_eq!(ordinals, (1..=ts.len() as i64).collect::<Vec<_>>(), "ordinals of event {id} ({name})");
                assert_eq!(ts[0].1.as_deref(), Some(start.as_str()), "event {id} ({name}) start state");
                assert_eq!(Some(&ts[ts.len() - 1].2), end.as_ref(), "event {id} ({name}) end state");
            }
            None => {
                assert!(rejected | failed, "event {id} ({name}) has no transition but was accepted");
                assert_eq!(end.as_deref(), Some(start.as_str()), "event {id} ({name}) changed nothing");
            }
        }
    }
    let orphans: Vec<&i64> = under.keys().filter(|id| !events.iter().any(|e| e.0 == **id)).collect();
    assert!(orphans.is_empty(), "transitions under events that are not in `events`: {orphans:?}");

    // Every operation ended, with an outcome.
    let open: Vec<(String, Option<String>)> =
        rows(&c, "SELECT request_id, outcome FROM operations WHERE outcome IS NULL OR ended_at IS NULL", |r| {
            Ok((r.get(0)?, r.get(1)?))
        });
    assert!(open.is_empty(), "operations without an end or outcome: {open:?}");
}

#[test]
fn demo_telemetry_is_consistent_and_stats_agree_with_sql() {
    let dir = tempfile::tempdir().unwrap();
    let db = demo(dir.path());
    assert_telemetry_consistent(&db);
    let c = read(&db);

    // `settle stats --json` counts equal the tables' counts.
    let stats: Value = serde_json::from_str(ok(&db, &["stats", "--json"]).trim()).unwrap();
    let ops_sql: BTreeMap<String, (u64, u64, u64)> = rows(
        &c,
        "SELECT name, COUNT(*), COUNT(ended_at), SUM(outcome = 'success') FROM operations GROUP BY name",
        |r| Ok((r.get(0)?, (n(r, 1)?, n(r, 2)?, n(r, 3)?))),
    )
    .into_iter()
    .collect();
    let ops_cli: BTreeMap<String, (u64, u64, u64)> = stats["operations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| {
            let n = |f: &str| o[f].as_u64().unwrap();
            (o["name"].as_str().unwrap().to_string(), (n("count"), n("ended"), n("success")))
        })
        .collect();
    assert!(!ops_sql.is_empty());
    assert_eq!(ops_cli, ops_sql);
    type Key = (String, Option<String>, String);
    let tr_sql: BTreeMap<Key, u64> = rows(
        &c,
        "SELECT machine, start_state, end_state, COUNT(*) FROM transitions GROUP BY machine, start_state, end_state",
        |r| Ok(((r.get(0)?, r.get(1)?, r.get(2)?), n(r, 3)?)),
    )
    .into_iter()
    .collect();
    let tr_cli: BTreeMap<Key, u64> = stats["transitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            let s = |f: &str| t[f].as_str().map(String::from);
            ((s("machine").unwrap(), s("from"), s("to").unwrap()), t["count"].as_u64().unwrap())
        })
        .collect();
    assert_eq!(tr_cli, tr_sql);
    let server_create =
        &tr_cli[&("server".to_string(), Some("creating".to_string()), "creating_resources".to_string())];
    assert_eq!(*server_create, 20);

    // The human tables and the Prometheus exposition read the same data.
    let table = ok(&db, &["stats", "--since", "1h"]);
    assert!(table.contains("operations since") && table.contains("server.create"), "{table}");
    let prom = ok(&db, &["stats", "--prometheus"]);
    assert!(
        prom.contains("settle_transitions_total{machine=\"server\",from=\"creating\",to=\"creating_resources\"} 20\n"),
        "{prom}"
    );
    for declared in [
        "# TYPE settle_transitions_total counter",
        "# TYPE settle_events_rejected_total counter",
        "# TYPE settle_faults_total counter",
        "# TYPE settle_entities gauge",
        "# TYPE settle_parked_entities gauge",
        "# TYPE settle_due_backlog gauge",
        "# TYPE settle_operations_total counter",
    ] {
        assert!(prom.lines().any(|l| l == declared), "missing `{declared}`: {prom}");
    }
    assert!(
        prom.contains(
            "settle_entities{machine=\"server\",state=\"ready\",path=\"ready\",run_status=\"active\",health=\"ok\"} 20\n"
        ),
        "{prom}"
    );
    assert!(prom.lines().any(|l| l == "settle_parked_entities 0"), "{prom}");
    let succeeded: u64 = ops_sql.values().map(|v| v.2).sum();
    assert!(prom.lines().any(|l| l == format!("settle_operations_total{{outcome=\"success\"}} {succeeded}")), "{prom}");
}

#[test]
fn operator_commands_and_views_on_a_demo_database() {
    let dir = tempfile::tempdir().unwrap();
    let db = demo(dir.path());
    let (a, b) = ("r1-srv-00001", "r1-srv-00002");

    // Pause a ready server: its run status shows everywhere; replaying the request id does nothing again.
    let paused = ok(&db, &["pause", "server", a, "--request-id", "op-pause-1"]);
    assert!(paused.contains("state ready, run status paused"), "{paused}");
    let again: Value =
        serde_json::from_str(ok(&db, &["pause", "server", a, "--request-id", "op-pause-1", "--json"]).trim()).unwrap();
    assert_eq!((again["replayed"].as_bool(), again["run_status"].as_str()), (Some(true), Some("paused")));
    let got: Value = serde_json::from_str(ok(&db, &["get", "server", a, "--json"]).trim()).unwrap();
    assert_eq!((got["run_status"].as_str(), got["recent_errors"].as_u64()), (Some("paused"), Some(0)));
    assert!(ok(&db, &["get", "server", a]).contains("run status: paused"));
    let listed = json_lines(&ok(&db, &["list", "--status", "paused", "--json"]));
    assert_eq!(listed.iter().map(|e| e["key"].as_str().unwrap()).collect::<Vec<_>>(), [a]);
    let ready = json_lines(&ok(&db, &["list", "--machine", "server", "--json"]));
    assert_eq!(ready.iter().filter(|e| e["run_status"] == "active").count(), 19);

    // Sleep until a time (absolute, then relative), resume, kill.
    let slept: Value =
        serde_json::from_str(ok(&db, &["sleep", "server", b, "--until", "2099-01-01T00:00:00Z", "--json"]).trim())
            .unwrap();
    assert_eq!(
        (slept["run_status"].as_str(), slept["sleep_until"].as_i64()),
        (Some("sleeping"), Some(4_070_908_800_000))
    );
    let later = ok(&db, &["sleep", "server", b, "--until", "+10m"]);
    assert!(later.contains("run status sleeping until"), "{later}");
    let bad = settle(&db, &["sleep", "server", b, "--until", "next week"]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(stderr(&bad).contains("--until: invalid time `next week`"), "{}", stderr(&bad));
    assert!(ok(&db, &["resume", "server", a]).contains("run status active"));
    assert!(ok(&db, &["kill", "server", a]).contains("run status killed"));
    let killed = ok(&db, &["list", "--status", "killed"]);
    assert!(killed.lines().any(|l| l.contains(a) && l.contains("killed")), "{killed}");
    assert_eq!(killed.lines().count(), 2, "header and one row: {killed}");
    let refused = settle(&db, &["pause", "server", a]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(stderr(&refused).contains("was killed"), "{}", stderr(&refused));
    let missing = settle(&db, &["pause", "server", "nope"]);
    assert_eq!(stderr(&missing).trim(), "error: no entity `nope` of machine `server`");

    // Commands are operations; `ops` lists them and the demo's, newest first.
    let ops = json_lines(&ok(&db, &["ops", "--outcome", "success", "--json", "--limit", "1000"]));
    let names: Vec<&str> = ops.iter().map(|o| o["name"].as_str().unwrap()).collect();
    assert_eq!(&names[..5], ["server.kill", "server.resume", "server.sleep", "server.sleep", "server.pause"]);
    assert_eq!(ops[4]["request_id"], "op-pause-1");
    assert_eq!(names.iter().filter(|n| **n == "server:new").count(), 20, "20 creates");
    assert_eq!(names.iter().filter(|n| **n == "server.create").count(), 20, "20 `create` events");
    assert!(ops.iter().all(|o| o["outcome"] == "success"));
    let table = ok(&db, &["ops", "--outcome", "success", "--limit", "3"]);
    assert_eq!(table.lines().count(), 4, "{table}");
    assert!(table.contains("server.kill") && table.contains(a), "{table}");
    assert_eq!(ok(&db, &["ops", "--outcome", "open", "--json"]), "");

    // History shows request ids; --events lists the events under the same ids.
    let history = json_lines(&ok(&db, &["history", "server", b, "--json"]));
    let create_event = history.iter().find(|h| h["event"] == "create").unwrap();
    let request = create_event["request_id"].as_str().unwrap();
    let events = json_lines(&ok(&db, &["history", "server", b, "--events", "--json"]));
    assert_eq!(events.iter().map(|e| e["event"].as_str().unwrap()).collect::<Vec<_>>(), ["create", "resources_ready"]);
    assert!(events.iter().all(|e| e["request_id"] == request), "one operation: {events:?}");
    assert_eq!(
        (events[0]["start_state"].as_str(), events[0]["end_state"].as_str()),
        (Some("new"), Some("creating_resources"))
    );
    let short = &request[request.len() - 8..];
    assert!(ok(&db, &["history", "server", b]).contains(short));
    assert!(ok(&db, &["history", "server", b, "--events"]).contains(short));

    // Machines: every stored definition with its entity count, the newest current.
    let machines = json_lines(&ok(&db, &["machines", "--json"]));
    let count = |name: &str| machines.iter().find(|m| m["machine"] == name).map(|m| m["entities"].as_u64().unwrap());
    for name in ["server", "app", "database", "alias", "dns"] {
        assert_eq!(count(name), Some(20), "{name}: {machines:?}");
    }
    assert_eq!(count("job"), Some(0));
    assert!(machines.iter().all(|m| m["current"] == true), "one version each: {machines:?}");
    let table = ok(&db, &["machines"]);
    assert!(table.lines().any(|l| l.starts_with("server ") && l.contains(" 20 ")), "{table}");
}

#[test]
fn read_only_views_and_commands_never_create_a_database() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("absent.db");
    for args in [
        &["stats"][..],
        &["stats", "--prometheus"],
        &["ops"],
        &["machines"],
        &["list", "--status", "paused"],
        &["pause", "server", "x"],
        &["sleep", "server", "x", "--until", "+1m"],
    ] {
        let out = settle(&db, args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        assert!(stderr(&out).contains("no such file"), "{args:?}: {}", stderr(&out));
        assert!(!db.exists(), "{args:?} created the database");
    }
    let bad = settle(&db, &["list", "--status", "sleepy"]);
    assert_eq!(bad.status.code(), Some(2), "clap refuses unknown run statuses");
}

/// When an event is accepted while the entity is still in the workflow of an earlier one
/// (a resource's `delete` from its server's undo, between retries of its provisioning),
/// the earlier event's `events` row ends there; the telemetry stays consistent, and the
/// servers that failed have `failed` operations.
#[test]
fn events_interrupted_by_an_undo_are_closed() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("fatal.db");
    ok(&db, &["demo", "--servers", "30", "--fail-rate", "0.2", "--fatal-rate", "0.1", "--seed", "7"]);
    assert_telemetry_consistent(&db);
    let conn = Connection::open(&db).unwrap();
    let count = |sql: &str| conn.query_row(sql, [], |r| r.get::<_, i64>(0)).unwrap();
    let failed_servers = count("SELECT COUNT(*) FROM entities WHERE machine = 'server' AND state = 'failed'");
    assert!(failed_servers > 0, "a 10% fatal rate fails some servers");
    let outcomes_of_failed = count(
        "SELECT COUNT(*) FROM operations o JOIN entities e ON e.machine = o.machine AND e.key = o.entity_key
         WHERE e.machine = 'server' AND e.state = 'failed' AND o.name = 'server.create' AND o.outcome = 'failed'",
    );
    assert_eq!(outcomes_of_failed, failed_servers, "reaching an error-health state fails the operation");
}
