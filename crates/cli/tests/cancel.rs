//! `settle cancel` as a user drives it: over `--server`, a server's `create` that reached
//! the server and its two resources (working for an hour) is canceled with `--undone`:
//! each runs its machine's `cancel` event to its end, the operation ends `canceled`, and
//! asking again is the same cancel. On the database: an event still queued is dropped; an
//! unknown and an ended operation are refused, saying why.

mod common;
use common::{Served, settle, stderr, stdout, write_machines};

use serde_json::Value;

const SERVER: &str = r#"initial = "new"
cancel = "abort"
[states.new]
[states.creating]
auto = "make"
[states.awaiting]
[states.gone]
kind = "deleted"
[events.create]
in = ["new"]
action = "begin"
[events.abort]
in = ["creating", "awaiting"]
action = "undo"
[actions.begin]
to = ["creating"]
[actions.make]
to = ["awaiting"]
create = [{ machine = "res", key = "key + '-a'", event = "go" }, { machine = "res", key = "key + '-b'", event = "go" }]
may_create = ["res"]
[actions.undo]
to = ["gone"]
"#;

const RES: &str = r#"initial = "pending"
cancel = "abort"
[states.pending]
[states.working]
auto = "finish"
wait = "1h"
[states.done]
[states.unwinding]
auto = "clean"
[states.removed]
kind = "terminal"
[events.go]
in = ["pending"]
action = "start"
[events.abort]
in = ["working", "done"]
action = "unwind"
[actions.start]
to = ["working"]
[actions.finish]
to = ["done"]
[actions.unwind]
to = ["unwinding"]
[actions.clean]
to = ["removed"]
"#;

fn ok(out: std::process::Output, what: &str) -> String {
    assert!(out.status.success(), "{what} failed ({:?}): {}{}", out.status, stderr(&out), stdout(&out));
    stdout(&out)
}

#[test]
fn an_operation_is_canceled_over_http_and_on_the_database() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("settle.db");
    let machines = write_machines(dir.path(), &[("server.toml", SERVER), ("res.toml", RES)]);
    let s = Served::start(&db, Some(&machines), &[]);
    let run = |args: &[&str]| ok(s.settle(None, args), &format!("settle --server {args:?}"));
    run(&["create", "server", "s1"]);
    run(&["raise", "server", "s1", "create", "--request-id", "create-s1"]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    for k in ["s1-a", "s1-b"] {
        while !s.settle(None, &["get", "res", k]).status.success() || !run(&["get", "res", k]).contains("working") {
            assert!(std::time::Instant::now() < deadline, "{k} never started");
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    let out = run(&["cancel", "create-s1", "--reason", "customer withdrew", "--undone"]);
    assert!(out.starts_with("operation create-s1: canceled\nreason: customer withdrew\n"), "{out}");
    assert!(out.contains("  server/s1  gone (active)  `abort` raised\n"), "{out}");
    assert!(out.contains("  res/s1-a  removed (active)  its work stopped, `abort` raised\n"), "{out}");
    assert!(out.contains("  res/s1-b  removed (active)  its work stopped, `abort` raised\n"), "{out}");
    assert!(out.contains("cancel create-s1/cancel: done, 3 of 3 entities, 0 refused\n"), "{out}");
    let again: Value = serde_json::from_str(&run(&["cancel", "create-s1", "--json"])).unwrap();
    assert_eq!(again["replayed"], true);
    assert_eq!(again["operation"]["outcome"], "canceled");
    assert_eq!(again["entities"].as_array().unwrap().len(), 3);
    for e in again["entities"].as_array().unwrap() {
        assert_eq!(e["part"]["outcome"], "success", "{e}");
    }
    // The trace of an entity's part shows its undo.
    let part = again["entities"][1]["part"]["request_id"].as_str().unwrap().to_string();
    let trace = run(&["op", &part]);
    assert!(trace.contains("unwinding") && trace.contains("removed"), "{trace}");
    // An operation that has ended has nothing left to cancel; over HTTP, 409.
    let ended = s.settle(None, &["cancel", &part]);
    assert_eq!(ended.status.code(), Some(1));
    assert!(stderr(&ended).contains("has ended (success): nothing of it is left to cancel"), "{}", stderr(&ended));
    assert_eq!(s.stop().code(), Some(0));

    // On the database: the event waits in the inbox of a paused entity, and is dropped.
    let m = machines.to_str().unwrap();
    ok(settle(&db, &["--machines", m, "create", "server", "s2"]), "create s2");
    ok(settle(&db, &["--machines", m, "pause", "server", "s2"]), "pause s2");
    ok(settle(&db, &["--machines", m, "raise", "server", "s2", "create", "--request-id", "create-s2"]), "raise");
    let out = ok(settle(&db, &["--machines", m, "cancel", "create-s2"]), "cancel on the database");
    assert!(out.starts_with("operation create-s2: canceled\nreason: cancel of operation create-s2\n"), "{out}");
    assert!(out.contains("  server/s2  new (paused)  its queued events of it dropped\n"), "{out}");
    let history = ok(settle(&db, &["history", "server", "s2"]), "history");
    assert!(!history.contains("creating"), "the queued create never ran: {history}");
    let unknown = settle(&db, &["--machines", m, "cancel", "nope"]);
    assert_eq!(unknown.status.code(), Some(1));
    assert!(stderr(&unknown).contains("no operation with request id `nope`"), "{}", stderr(&unknown));
}
