//! End-to-end tests of the reference scenario (`settle demo`): the happy path with
//! transient faults, fatal resource failures (undo), the timeout path, and crash recovery.

mod common;
use common::{settle, stdout};

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

const RESOURCES: [&str; 4] = ["app", "database", "alias", "dns"];

/// `key → state` of every entity of `machine`, read through `settle list --json`.
fn states(db: &Path, machine: &str) -> BTreeMap<String, String> {
    let out = settle(db, &["list", "--machine", machine, "--json"]);
    assert!(out.status.success());
    stdout(&out)
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (v["key"].as_str().unwrap().to_string(), v["state"].as_str().unwrap().to_string())
        })
        .collect()
}

/// Every server is `ready` with all resources `ready`, or `failed` with all resources
/// `gone`: nothing is left half-done.
fn assert_converged(db: &Path) -> (usize, usize) {
    let servers = states(db, "server");
    let resources: Vec<BTreeMap<String, String>> = RESOURCES.iter().map(|r| states(db, r)).collect();
    let (mut ready, mut failed) = (0, 0);
    for (server, state) in &servers {
        let expected = match state.as_str() {
            "ready" => {
                ready += 1;
                "ready"
            }
            "failed" => {
                failed += 1;
                "gone"
            }
            other => panic!("server {server} ended in `{other}`"),
        };
        for (kind, by_key) in RESOURCES.iter().zip(&resources) {
            let key = format!("{server}-{kind}");
            assert_eq!(by_key.get(&key).map(String::as_str), Some(expected), "{key} of {state} server {server}");
        }
    }
    (ready, failed)
}

#[test]
fn happy_path_with_transient_faults() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("happy.db");
    let out = settle(&db, &["demo", "--servers", "20", "--fail-rate", "0.4", "--seed", "11"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = stdout(&out);
    assert!(text.contains("servers by state: ready 20"), "{text}");
    assert!(text.contains("resources by state: ready 80"), "{text}");
    let retries: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("provider retries: "))
        .and_then(|n| n.trim().parse().ok())
        .expect("retries line");
    assert!(retries > 0, "a 40% failure rate retries: {text}");
    assert_eq!(assert_converged(&db), (20, 0));
    // The server's history shows the subscription that moved it.
    let h = stdout(&settle(&db, &["history", "server", "r1-srv-00000", "--json"]));
    let events: Vec<String> = h
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["event"].as_str().map(String::from))
        .collect();
    assert_eq!(events, ["create", "resources_ready"]);
}

#[test]
fn a_fatal_resource_failure_undoes_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("fatal.db");
    let out = settle(&db, &["demo", "--servers", "12", "--fail-rate", "0.1", "--fatal-rate", "0.3", "--seed", "5"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let (ready, failed) = assert_converged(&db);
    assert_eq!(ready + failed, 12);
    assert!(failed > 0, "a 30% fatal rate fails some server: {}", stdout(&out));
    let failed_server = states(&db, "server").into_iter().find(|(_, s)| s == "failed").unwrap().0;
    let h = stdout(&settle(&db, &["history", "server", &failed_server, "--json"]));
    let trail: Vec<(String, String)> = h
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (v["to"].as_str().unwrap_or("-").to_string(), v["event"].as_str().unwrap_or("-").to_string())
        })
        .collect();
    assert!(trail.contains(&("undoing".into(), "resources_failed".into())), "{trail:?}");
    assert_eq!(trail.last().unwrap().0, "failed");
}

#[test]
fn the_timeout_path_undoes_slow_servers() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("timeout.db");
    // Provisioning takes at least 100 ms a step; a 50 ms timeout always passes first.
    let out = settle(&db, &["demo", "--servers", "6", "--fail-rate", "0", "--timeout", "50ms", "--seed", "2"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(assert_converged(&db), (0, 6));
    let h = stdout(&settle(&db, &["history", "server", "r1-srv-00003", "--json"]));
    assert!(h.contains("\"event\":\"resources_timeout\""), "{h}");
}

#[test]
fn the_demo_survives_repeated_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("crash.db");
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
    eprintln!("demo crash test seed {seed}");
    let mut x = seed | 1;
    let mut interrupted = 0;
    for round in 0..6 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let after = Duration::from_millis(200 + x % 600);
        let mut child = Command::new(env!("CARGO_BIN_EXE_settle"))
            .arg("--db")
            .arg(&db)
            .args(["demo", "--servers", "300", "--fail-rate", "0.2", "--seed", "9"])
            .env("SETTLE_LOG", "error")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(after);
        let finished = child.try_wait().unwrap().is_some();
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        let servers = states(&db, "server");
        let ready = servers.values().filter(|s| *s == "ready").count();
        eprintln!("round {round}: killed after {after:?}; {} servers, {ready} ready", servers.len());
        if !finished && ready < 300 {
            interrupted += 1;
        }
    }
    assert!(interrupted >= 5, "only {interrupted} kills interrupted the demo");
    // The last kill may land after the run stored itself done (all servers ready, the
    // summary being printed): the next `settle demo` then starts run 2 instead of resuming.
    let done_before = states(&db, "server").values().filter(|s| *s == "ready").count() == 300;
    let out = settle(&db, &["demo", "--servers", "300"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = stdout(&out);
    if done_before && text.contains("demo run 2 finished") {
        assert_eq!(assert_converged(&db), (600, 0), "run 1 finished under the kills, then run 2: {text}");
    } else {
        assert!(text.contains("demo run 1 finished"), "the unfinished run was resumed: {text}");
        assert!(text.contains("servers by state: ready 300"), "{text}");
        assert_eq!(assert_converged(&db), (300, 0));
    }
    assert_each_request_once(&db);
}

/// Every server of every run processed exactly one `create` event, the one its request id
/// names, and nothing was rejected: a resumed run's repeated requests were replays.
fn assert_each_request_once(db: &Path) {
    let c = rusqlite::Connection::open(db).unwrap();
    let rejected: Vec<(String, String, String)> = c
        .prepare("SELECT entity_key, event, COALESCE(reason, '') FROM events WHERE rejected = 1")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert!(rejected.is_empty(), "rejected events after the kills: {rejected:?}");
    let creates: Vec<(String, i64, String)> = c
        .prepare(
            "SELECT entity_key, COUNT(*), MIN(COALESCE(request_id, '')) FROM events
             WHERE machine = 'server' AND event = 'create' GROUP BY entity_key",
        )
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let servers = states(db, "server");
    assert_eq!(creates.len(), servers.len(), "one `create` per server");
    for (key, n, request_id) in creates {
        assert_eq!((n, request_id), (1, format!("demo-raise-{key}")), "server {key}");
    }
}
