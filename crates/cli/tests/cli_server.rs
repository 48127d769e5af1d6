//! `settle --server URL ...` end to end: the real `settle serve` on a free port, driven by the
//! real `settle` binary as a user would, printing what the same commands print on the
//! database (checked by running them locally once the server has stopped).

mod common;
use common::testkit::DOOR;
use common::{Served, settle, stderr, stdout, write_machines};

use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::Value;

/// A temporary directory with `machines/door.toml` and the database path `settle.db`.
fn setup() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let machines = write_machines(dir.path(), &[("door.toml", DOOR)]);
    let db = dir.path().join("settle.db");
    (dir, machines, db)
}

/// Standard output of a run that must succeed.
fn ok(out: Output, what: &str) -> String {
    assert!(out.status.success(), "{what} failed ({:?}): {}{}", out.status, stderr(&out), stdout(&out));
    stdout(&out)
}

/// The request id of a `request id X` line.
fn request_id(text: &str) -> String {
    text.lines().find_map(|l| l.strip_prefix("request id ")).unwrap_or_else(|| panic!("no request id: {text}")).into()
}

fn json_lines(text: &str) -> Vec<Value> {
    text.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"))).collect()
}

fn local(db: &Path, args: &[&str]) -> String {
    ok(settle(db, args), &format!("settle {args:?}"))
}

#[test]
fn the_cli_over_http_prints_what_it_prints_on_the_database() {
    let (_dir, machines, db) = setup();
    let s = Served::start(&db, Some(&machines), &[]);
    let run = |args: &[&str]| ok(s.settle(None, args), &format!("settle --server {args:?}"));

    // create: the entity afterwards and the request id; an idempotency key makes it a replay.
    let out = run(&["create", "door", "front", "--props", r#"{"color":"red"}"#]);
    assert!(out.starts_with("door front: create; state closed, run status active\nrequest id "), "{out}");
    assert_eq!(request_id(&out).len(), 36, "a generated UUID: {out}");
    let out = run(&["create", "door", "back", "--idempotency-key", "make-back"]);
    assert_eq!(out, "door back: create; state closed, run status active\nrequest id make-back\n");
    let out = run(&["create", "door", "back", "--idempotency-key", "make-back"]);
    assert_eq!(
        out,
        "door back: create; state closed, run status active\n\
         replayed: request id make-back was seen before; nothing was done again\n"
    );
    let dup = s.settle(None, &["create", "door", "front"]);
    assert_eq!(dup.status.code(), Some(1), "{}", stdout(&dup));
    assert!(stderr(&dup).starts_with("error: 409: "), "the problem's detail: {}", stderr(&dup));

    // raise, queued: the request id and where to follow it.
    let out = run(&["raise", "door", "front", "open"]);
    let id = request_id(&out);
    assert_eq!(out, format!("door front: event open queued\nrequest id {id}\noperation /v1/operations/{id}\n"));
    // raise --wait: processed after the queued `open`; the outcome, the operation ended and
    // the entity as it left it.
    let out = run(&["raise", "door", "front", "close", "--wait", "--timeout", "20s"]);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "door front: event close accepted; entered closed", "{out}");
    assert!(lines[1].starts_with("request id "), "{out}");
    assert!(lines[2].starts_with("operation ended success after "), "{out}");
    assert_eq!(lines[3..5], ["machine:    door", "key:        front"], "{out}");
    assert!(lines[5].starts_with("state:      closed (entered "), "{out}");
    assert!(out.contains("\nrun status: active\n") && out.contains("\nproperties: {\"color\":\"red\"}\n"), "{out}");

    // A rejected event: the reason, exit 1 (refused at once: the door is at rest).
    let rejected = s.settle(None, &["raise", "door", "front", "close", "--wait"]);
    assert_eq!(rejected.status.code(), Some(1));
    assert_eq!(
        stdout(&rejected),
        "door front: event close rejected in state closed: event `close` is not valid in state `closed`\n"
    );
    run(&["raise", "door", "back", "open", "--wait"]);
    let rejected = s.settle(None, &["raise", "door", "back", "open"]);
    assert_eq!(rejected.status.code(), Some(1));
    assert_eq!(stdout(&rejected), "door back: event open rejected in state open: already open\n");
    let json = s.settle(None, &["raise", "door", "back", "open", "--json"]);
    let v: Value = serde_json::from_str(stdout(&json).trim()).unwrap();
    assert_eq!(v["outcome"], serde_json::json!({"result": "rejected", "state": "open", "reason": "already open"}));

    // get, text and JSON.
    let text = run(&["get", "door", "back"]);
    assert!(text.starts_with("machine:    door\nkey:        back\nstate:      open (entered "), "{text}");
    let v: Value = serde_json::from_str(run(&["get", "door", "back", "--json"]).trim()).unwrap();
    assert_eq!(
        (v["state"].as_str(), v["run_status"].as_str(), v["version"].as_i64()),
        (Some("open"), Some("active"), Some(2))
    );

    // list, with filters, all pages.
    let list = run(&["list"]);
    assert_eq!(list.lines().count(), 3, "a header and two doors: {list}");
    assert!(list.starts_with("MACHINE      KEY"), "{list}");
    assert_eq!(json_lines(&run(&["list", "--state", "open", "--json"])).len(), 1);
    assert_eq!(json_lines(&run(&["list", "--machine", "door", "--json"])).len(), 2);

    // Operator commands.
    let out = run(&["pause", "door", "front"]);
    assert!(out.starts_with("door front: pause; state closed, run status paused\nrequest id "), "{out}");
    let out = run(&["resume", "door", "front", "--request-id", "wake-front"]);
    assert_eq!(out, "door front: resume; state closed, run status active\nrequest id wake-front\n");
    let out = run(&["resume", "door", "front", "--request-id", "wake-front"]);
    assert!(out.contains("replayed: request id wake-front was seen before"), "{out}");
    let out = run(&["sleep", "door", "front", "--until", "+1h", "--json"]);
    let v: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!((v["command"].as_str(), v["run_status"].as_str()), (Some("sleep"), Some("sleeping")), "{out}");
    run(&["resume", "door", "front"]);
    let out = run(&["kill", "door", "front"]);
    assert!(out.starts_with("door front: kill; state closed, run status killed\n"), "{out}");
    let killed = s.settle(None, &["raise", "door", "front", "open"]);
    assert_eq!(killed.status.code(), Some(1));
    assert!(stderr(&killed).contains("was killed"), "{}", stderr(&killed));

    // history and ops.
    let history = run(&["history", "door", "front"]);
    assert!(history.lines().count() >= 8, "create, open, close, commands: {history}");
    assert!(history.contains("event open → swing_open"), "{history}");
    let ops = run(&["ops"]);
    assert!(ops.starts_with("REQUEST ID"), "{ops}");
    assert!(ops.contains("make-back") && ops.contains("wake-front") && ops.contains(&id), "{ops}");
    assert_eq!(json_lines(&run(&["ops", "--limit", "2", "--json"])).len(), 2);
    assert!(json_lines(&run(&["ops", "--outcome", "success", "--json"])).iter().all(|o| o["outcome"] == "success"));

    // What needs the database says so.
    let events = s.settle(None, &["history", "door", "front", "--events"]);
    assert_eq!(events.status.code(), Some(1));
    assert!(stderr(&events).contains("the HTTP API does not offer"), "{}", stderr(&events));
    let stats = s.settle(None, &["stats"]);
    assert_eq!(stats.status.code(), Some(1));
    assert_eq!(stderr(&stats), "error: `settle stats` reads the database directly; it does not take --server\n");

    // The same views over HTTP, then on the database once the server stopped.
    let views: [&[&str]; 8] = [
        &["get", "door", "back"],
        &["get", "door", "back", "--json"],
        &["list"],
        &["list", "--json"],
        &["history", "door", "front"],
        &["history", "door", "front", "--json"],
        &["ops"],
        &["ops", "--json"],
    ];
    let remote: Vec<String> = views.iter().map(|args| run(args)).collect();
    assert!(s.stop().success());
    for (args, over_http) in views.iter().zip(&remote) {
        let on_db = local(&db, args);
        assert_eq!(&on_db, over_http, "settle {args:?}: database vs --server");
    }
    let text = local(&db, &["get", "door", "back"]);
    assert!(
        text.contains("\nerrors:     0 recent (counted by the fault policy)\n")
            && text.ends_with("inbox:      0 event(s)\n"),
        "{text}"
    );
}

#[test]
fn create_and_raise_work_on_the_database_too() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("local.db");
    let out = local(&db, &["--builtin", "create", "job", "j1", "--idempotency-key", "new-j1"]);
    assert_eq!(out, "job j1: create; state idle, run status active\nrequest id new-j1\n");
    let out = local(&db, &["raise", "job", "j1", "start", "--idempotency-key", "start-j1"]);
    assert_eq!(out, "job j1: event start queued\nrequest id start-j1\noperation /v1/operations/start-j1\n");
    let out = local(&db, &["raise", "job", "j1", "start", "--idempotency-key", "start-j1"]);
    assert_eq!(
        out,
        "replayed: request id start-j1 was seen before; nothing was raised again\noperation /v1/operations/start-j1\n"
    );
    let out = local(&db, &["get", "job", "j1"]);
    assert!(out.contains("inbox:      1 event(s): start"), "queued, for an engine to process: {out}");
    // --wait runs an engine on the database until the entity is at rest: the job runs its
    // steps to `done`, where another start is refused with the declared reason.
    local(&db, &["create", "job", "j2"]);
    let out = local(&db, &["raise", "job", "j2", "start", "--wait"]);
    assert!(out.starts_with("job j2: event start accepted; entered step1\nrequest id "), "{out}");
    assert!(out.contains("\nstate:      done (entered "), "{out}");
    let again = settle(&db, &["raise", "job", "j2", "start", "--wait"]);
    assert_eq!(again.status.code(), Some(1), "{}", stderr(&again));
    assert_eq!(stdout(&again), "job j2: event start rejected in state done: already done\n");
    let bad = settle(&db, &["create", "job", "j3", "--props", "[1]"]);
    assert_eq!((bad.status.code(), stderr(&bad).as_str()), (Some(1), "error: --props must be a JSON object\n"));
}

#[test]
fn tokens_decide_what_the_cli_may_do_over_http() {
    let (_dir, machines, db) = setup();
    let s =
        Served::start(&db, Some(&machines), &[("SETTLE_TOKENS", "reader=reader-token-0001;admin=admin-token-00001")]);
    ok(s.settle(Some("admin-token-00001"), &["create", "door", "x"]), "create as admin");
    let denied = s.settle(Some("reader-token-0001"), &["kill", "door", "x"]);
    assert_eq!(denied.status.code(), Some(1));
    assert_eq!(stderr(&denied), "error: 403: role reader may not use this route (forbidden)\n");
    assert_eq!(stdout(&denied), "");
    let anonymous = s.settle(None, &["get", "door", "x"]);
    assert_eq!(anonymous.status.code(), Some(1));
    assert!(stderr(&anonymous).starts_with("error: 401: "), "{}", stderr(&anonymous));
    let read = ok(s.settle(Some("reader-token-0001"), &["get", "door", "x"]), "get as reader");
    assert!(read.contains("run status: active"), "{read}");
    let out = ok(s.settle(Some("admin-token-00001"), &["kill", "door", "x"]), "kill as admin");
    assert!(out.starts_with("door x: kill; state closed, run status killed\n"), "{out}");
}

/// The README's statechart walkthrough, as written: `settle serve --machines
/// examples/machines` starts on the shipped examples, and the cluster goes where the
/// README says.
#[test]
fn the_statechart_walkthrough_of_the_readme_runs_on_the_served_examples() {
    let dir = tempfile::tempdir().unwrap();
    let examples = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/machines");
    let db = dir.path().join("settle.db");
    let s = Served::start(&db, Some(&examples), &[]);
    let run = |args: &[&str]| ok(s.settle(None, args), &format!("settle --server {args:?}"));
    let entity = || -> Value {
        let out = run(&["get", "cluster", "db1", "--json"]);
        serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"))
    };

    run(&["create", "cluster", "db1", "--props", r#"{"max_replicas": 5}"#]);
    run(&["raise", "cluster", "db1", "create", "--wait"]);
    let e = entity();
    assert_eq!((&e["state"], &e["properties"]["endpoint"]), (&"serving".into(), &"db.internal:5432".into()));

    let refused = s.settle(None, &["check", "cluster", "db1", "resize", "--params", r#"{"replicas": 9}"#]);
    assert_eq!(refused.status.code(), Some(1));
    assert_eq!(
        stdout(&refused),
        "cluster db1: event resize would be rejected in state serving: more replicas than this cluster allows\n"
    );
    run(&["raise", "cluster", "db1", "resize", "--params", r#"{"replicas": 3}"#, "--wait"]);
    assert_eq!((&entity()["state"], &entity()["properties"]["resized"]), (&"serving".into(), &true.into()));
    run(&["raise", "cluster", "db1", "heartbeat", "--wait"]);
    assert_eq!(entity()["properties"]["last_seen"], "heartbeat");
    run(&["raise", "cluster", "db1", "maintain", "--wait"]);
    assert_eq!(entity()["state"], "patching");
    let listed = run(&["list", "--state", "online", "--json"]);
    let keys: Vec<String> = json_lines(&listed).iter().map(|l| l["key"].as_str().unwrap().to_string()).collect();
    assert_eq!(keys, ["db1"], "patching is in online");
    run(&["raise", "cluster", "db1", "patched", "--wait"]);
    assert_eq!(entity()["state"], "serving");
    run(&["raise", "cluster", "db1", "stop", "--wait"]);
    let e = entity();
    assert_eq!(e["state"], "stopped");
    assert!(e["properties"].get("endpoint").is_none(), "online's exit action unset it: {e}");
    let again = run(&["raise", "cluster", "db1", "stop", "--wait"]);
    assert!(again.starts_with("cluster db1: event stop ignored in state stopped\n"), "{again}");

    let history = json_lines(&run(&["history", "cluster", "db1", "--json"]));
    let kinds: Vec<&str> = history.iter().map(|h| h["kind"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        ["create", "event", "auto", "event", "auto", "internal", "event", "auto", "event", "event", "ignored"],
        "{history:?}"
    );
}

/// `settle feed`: a follower of a server, started before the changes, prints each as it
/// commits (one JSON `Change` a line); one started with `--since` its last id prints only
/// what came after; on the database, `--since 0 --once` prints everything and where to go
/// on from, and `--since` that position prints nothing more.
#[test]
fn the_feed_follows_a_server_and_reads_the_database() {
    use std::io::{BufRead, BufReader};
    let (_dir, machines, db) = setup();
    let s = Served::start(&db, Some(&machines), &[]);
    let run = |args: &[&str]| ok(s.settle(None, args), &format!("settle --server {args:?}"));
    let follow = |extra: &[&str]| {
        let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_settle"));
        c.args(["--server", &s.url, "feed", "--json"]).args(extra).env("SETTLE_LOG", "error");
        c.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::null());
        common::Proc(c.spawn().unwrap())
    };
    let mut first = follow(&["--machine", "door", "--since", "0"]);
    let mut lines = BufReader::new(first.0.stdout.take().unwrap()).lines();
    let next = |lines: &mut std::io::Lines<BufReader<std::process::ChildStdout>>| -> Value {
        serde_json::from_str(&lines.next().expect("a line").unwrap()).unwrap()
    };
    run(&["create", "door", "front"]);
    let mut got: Vec<Value> = vec![next(&mut lines)];
    assert_eq!((got[0]["key"].as_str(), got[0]["transition"]["kind"].as_str()), (Some("front"), Some("create")));
    run(&["raise", "door", "front", "open", "--wait"]);
    while !got.iter().any(|c| c["type"] == "operation" && c["operation"]["name"] == "door.open") {
        got.push(next(&mut lines));
    }
    let opened = got.iter().find(|c| c["type"] == "transition" && c["transition"]["event"] == "open").unwrap();
    assert_eq!((opened["machine"].as_str(), opened["transition"]["to"].as_str()), (Some("door"), Some("open")));
    let last = got.last().unwrap()["id"].as_str().unwrap().to_string();
    drop(first);

    // Resumed after the last id it printed: only what came after.
    run(&["raise", "door", "front", "close", "--wait"]);
    let mut second = follow(&["--since", &last]);
    let mut lines = BufReader::new(second.0.stdout.take().unwrap()).lines();
    let after: Vec<Value> = (0..2).map(|_| next(&mut lines)).collect();
    assert_eq!(after[0]["transition"]["event"], "close", "{after:?}");
    assert_eq!(after[1]["operation"]["name"], "door.close", "{after:?}");
    drop(second);
    s.stop();

    // On the database: everything, then the position to go on from.
    let out = settle(&db, &["feed", "--since", "0", "--once"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("door/front  create → closed"), "{text}");
    assert!(text.contains("door/front  event closed → open (event open)"), "{text}");
    assert!(text.contains("door/front  operation door.close success"), "{text}");
    let go_on = stderr(&out);
    let since = go_on.trim().strip_prefix("next: settle feed --since ").unwrap_or_else(|| panic!("{go_on}"));
    assert_eq!(stdout(&settle(&db, &["feed", "--since", since, "--once"])), "", "nothing after it");
    let bad = settle(&db, &["feed", "--since", "yesterday", "--once"]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(stderr(&bad).contains("not a feed position"), "{}", stderr(&bad));
}
