//! Scale-out as a user drives it: `settle run --machines DIR` with the user's own TOML
//! machines (and `--serve` for a subset), a `settle serve` and a `settle run` on one
//! PostgreSQL schema answering every `wait=stable` and sync nested event, and instances
//! started together on a new schema. The PostgreSQL tests need `SETTLE_TEST_PG`; without it
//! they say they skipped.

mod common;

use std::path::Path;

use common::{Proc, http, settle, spawn_server, spawn_settle, stderr, stdout, write_machines};
use serde_json::Value;

/// A ticket: `open` → `opened`, triaged by an auto action → `triaged`, `close` → `closed`.
const TICKET: &str = include_str!("testdata/ticket.toml");

/// A note: `send` → `sent`, delivered by an auto action → `delivered`.
const NOTE: &str = include_str!("testdata/note.toml");

fn machines_dir(dir: &Path, files: &[(&str, &str)]) -> String {
    write_machines(dir, files).display().to_string()
}

fn state(db: &Path, machine: &str, key: &str) -> String {
    let o = settle(db, &["get", machine, key, "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    v["state"].as_str().unwrap().to_string()
}

#[test]
fn run_drives_the_machines_of_a_directory() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("settle.db");
    let m = machines_dir(dir.path(), &[("ticket.toml", TICKET), ("note.toml", NOTE)]);
    for (machine, key, event) in [("ticket", "t1", "open"), ("note", "n1", "send")] {
        let o = settle(&db, &["--machines", &m, "create", machine, key]);
        assert!(o.status.success(), "{}", stderr(&o));
        let o = settle(&db, &["--machines", &m, "raise", machine, key, event]);
        assert!(o.status.success(), "{}", stderr(&o));
    }
    // An instance serving only `note` leaves the ticket to others.
    let o = settle(&db, &["--machines", &m, "run", "--until-idle", "--serve", "note"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("serving note"), "{}", stderr(&o));
    assert_eq!(state(&db, "note", "n1"), "delivered");
    assert_eq!(state(&db, "ticket", "t1"), "new", "an instance claims only the machines it serves");
    let o = settle(&db, &["--machines", &m, "run", "--until-idle"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(state(&db, "ticket", "t1"), "triaged");
    // raise --wait runs them too.
    let o = settle(&db, &["--machines", &m, "raise", "ticket", "t1", "close", "--wait", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(state(&db, "ticket", "t1"), "closed");
}

#[test]
fn bad_machine_directories_are_refused_with_their_errors() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("settle.db");
    let bad = machines_dir(dir.path(), &[("ticket.toml", &TICKET.replace("to = [\"triaged\"]", "to = [\"nowhere\"]"))]);
    let o = settle(&db, &["--machines", &bad, "run", "--until-idle"]);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(err.contains("ticket.toml") && err.contains("nowhere"), "{err}");
    // An action with several targets needs a handler (or an agent).
    let handed = dir.path().join("handed");
    std::fs::create_dir_all(&handed).unwrap();
    std::fs::write(handed.join("ticket.toml"), TICKET.replace("to = [\"triaged\"]", "to = [\"triaged\", \"closed\"]"))
        .unwrap();
    let o = settle(&db, &["--machines", handed.to_str().unwrap(), "run", "--until-idle"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("no handler for action `triage` of machine `ticket`"), "{}", stderr(&o));
    // Commands that start no engine say so.
    let good = machines_dir(&dir.path().join("good"), &[("ticket.toml", TICKET)]);
    let o = settle(&db, &["--machines", &good, "list"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("`settle list` does not take --machines"), "{}", stderr(&o));
    let o = settle(&db, &["--machines", &good, "run", "--until-idle", "--serve", "nosuch"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("nosuch"), "{}", stderr(&o));
}

/// `settle serve --builtin` (the built-in machines, stored) and a `settle run` (of the
/// definitions stored) on one PostgreSQL schema:
/// whichever of them processes an event, the caller waiting with `wait=stable` gets 200
/// with the entity at rest, and a `relay`'s sync nested event on a `job` returns.
#[test]
fn serve_and_run_on_one_schema_answer_every_wait() {
    let Some(url) = settle_store::postgres::test_url("pair") else { return };
    let (_server, addr) = spawn_server(&url, &["--builtin"]);
    let _worker: Proc = spawn_settle(&url, &["run"]);
    for i in 0..12 {
        let key = format!("j{i}");
        let (status, body) = http(&addr, "POST", "/v1/machines/job/entities", Some(&format!(r#"{{"key": "{key}"}}"#)));
        assert_eq!(status, 201, "{body}");
        let path = format!("/v1/machines/job/entities/{key}/events/start?wait=stable&timeout=20s");
        let (status, body) = http(&addr, "POST", &path, Some("{}"));
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["entity"]["state"], "done", "{body}");
    }
    for i in 0..8 {
        let key = format!("r{i}");
        for machine in ["job", "relay"] {
            let (status, body) = http(
                &addr,
                "POST",
                &format!("/v1/machines/{machine}/entities"),
                Some(&format!(r#"{{"key": "{key}"}}"#)),
            );
            assert_eq!(status, 201, "{body}");
        }
        let path = format!("/v1/machines/relay/entities/{key}/events/go?wait=stable&timeout=20s");
        let (status, body) = http(&addr, "POST", &path, Some("{}"));
        assert_eq!(status, 200, "{body}");
        let relay = &body["entity"];
        assert_eq!(relay["state"], "relayed", "{body}");
        assert_eq!(relay["properties"]["job_state"], "done", "{body}");
    }
}

/// Instances started at the same moment on a new schema, each seeding it with the built-in
/// machines, all start and share the work.
#[test]
fn instances_start_together_on_a_new_schema() {
    let Some(url) = settle_store::postgres::test_url("start") else { return };
    let runs: Vec<_> = (0..3)
        .map(|_| {
            std::process::Command::new(env!("CARGO_BIN_EXE_settle"))
                .args(["--db", &url, "--builtin", "run", "--until-idle"])
                .env("SETTLE_LOG", "error")
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for r in runs {
        let o = r.wait_with_output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
}
