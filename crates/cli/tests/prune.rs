//! `settle prune` as an operator drives it (SQLite file, `--machines`): a dry run says what
//! would go and changes nothing; the run removes exactly that; a state kept `forever`
//! stays; a removed key can be created again; bad input is refused with what is wrong.

mod common;

use common::{settle, stderr, stdout, write_machines};

const JOB: &str = r#"
initial = "queued"
[states.queued]
[states.running]
[states.done]
kind = "terminal"
[states.failed]
kind = "terminal"
health = "error"
retain = "forever"
[events.start]
in = ["queued"]
action = "to_running"
[events.finish]
in = ["running"]
action = "to_done"
[events.fail]
in = ["running"]
action = "to_failed"
[actions.to_running]
to = ["running"]
[actions.to_done]
to = ["done"]
[actions.to_failed]
to = ["failed"]
"#;

#[test]
fn prune_dry_runs_then_removes_what_retention_lets_go() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("jobs.db");
    let machines = write_machines(dir.path(), &[("job.toml", JOB)]);
    let m = machines.to_str().unwrap();
    let ok = |args: &[&str]| {
        let out = settle(&db, args);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        stdout(&out)
    };
    for (key, end) in [("j1", "finish"), ("j2", "finish"), ("j3", "fail")] {
        ok(&["--machines", m, "create", "job", key]);
        ok(&["--machines", m, "raise", "job", key, "start", "--wait"]);
        // Entering `failed` (error health) fails the operation: its exit status says so.
        let ended = settle(&db, &["--machines", m, "raise", "job", key, end, "--wait"]);
        assert_eq!(ended.status.success(), end == "finish", "{}", stderr(&ended));
    }
    // Ended entities are kept 30 days by default: nothing goes.
    let none = ok(&["--machines", m, "prune", "--dry-run"]);
    assert!(none.starts_with("would remove 0 entities"), "{none}");

    let keep0 = ["--machines", m, "--retention-defaults", "ended=0s"];
    let dry = ok(&[&keep0[..], &["prune", "--dry-run"]].concat());
    assert!(dry.starts_with("would remove 2 entities"), "{dry}");
    assert!(dry.contains("  job/done: 2 (j1, j2)"), "{dry}");
    assert!(dry.contains("(dry run: nothing changed)"), "{dry}");
    assert_eq!(ok(&["list", "--machine", "job", "--json"]).lines().count(), 3, "a dry run changes nothing");

    let run: serde_json::Value = serde_json::from_str(&ok(&[&keep0[..], &["prune", "--json"]].concat())).unwrap();
    assert_eq!((run["dry_run"].as_bool(), run["entities"].as_u64()), (Some(false), Some(2)), "{run}");
    assert_eq!(run["rows"]["entities"], 2, "{run}");
    assert!(run["rows"]["history"].as_u64().unwrap() >= 6, "create, start, finish for each: {run}");
    assert_eq!(run["states"][0]["sample"], serde_json::json!(["j1", "j2"]), "{run}");
    let left = ok(&["list", "--machine", "job", "--json"]);
    assert_eq!(left.lines().count(), 1, "{left}");
    assert!(left.contains("\"j3\""), "failed is kept forever: {left}");
    // The keys are free again.
    ok(&["--machines", m, "create", "job", "j1"]);

    // Bad input changes nothing and says what is wrong.
    let unknown = settle(&db, &["--machines", m, "prune", "--machine", "nope"]);
    assert!(!unknown.status.success());
    assert!(stderr(&unknown).contains("unknown machine `nope`"), "{}", stderr(&unknown));
    let bad = settle(&db, &["--machines", m, "--retention-defaults", "ended=soon", "prune"]);
    assert!(!bad.status.success());
    assert!(
        stderr(&bad).contains("--retention-defaults: retention `ended`: invalid duration `soon`"),
        "{}",
        stderr(&bad)
    );
    let unknown_kind = settle(&db, &["--retention-defaults", "logs=1d", "prune", "--dry-run"]);
    assert!(stderr(&unknown_kind).contains("unknown retention `logs`"), "{}", stderr(&unknown_kind));
    let dir = db.parent().unwrap().join("archive");
    let bad_size = settle(&db, &["--archive", dir.to_str().unwrap(), "--archive-rotate", "12 parsecs", "prune"]);
    assert!(!bad_size.status.success());
    assert!(stderr(&bad_size).contains("--archive-rotate: invalid size `12 parsecs`"), "{}", stderr(&bad_size));
    // A machine that insists on an archive is refused without one, naming it.
    let insists = dir.parent().unwrap().join("insists");
    std::fs::create_dir_all(&insists).unwrap();
    std::fs::write(insists.join("job.toml"), format!("{JOB}\n[retention]\narchive = true\n")).unwrap();
    let refused = settle(&db, &["--machines", insists.to_str().unwrap(), "prune", "--dry-run"]);
    assert!(!refused.status.success());
    assert!(stderr(&refused).contains("machine `job` archives"), "{}", stderr(&refused));
}
