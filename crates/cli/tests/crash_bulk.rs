//! A crash test of bulk operations: `settle bench bulk` pauses 20,000 idle jobs with one
//! bulk operation (at 4,000 a second, so that it runs for seconds) on a SQLite file and is
//! killed with SIGKILL in the middle, twice; run again with the same request id, it
//! follows the same operation to its end. Then every job is paused, each was commanded
//! exactly once under the operation (one command in its history, with the request id
//! `crash-1/{id}`), and the operation counted each once.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{settle, stderr, stdout};
use rusqlite::{Connection, OpenFlags};

const JOBS: i64 = 20_000;

/// A count read while the database may still be missing or its tables not yet made (0).
fn count(db: &Path, sql: &str) -> i64 {
    let Ok(c) = Connection::open_with_flags(db, OpenFlags::SQLITE_OPEN_READ_ONLY) else { return 0 };
    c.query_row(sql, [], |r| r.get(0)).unwrap_or(0)
}

/// A count that must be read.
fn strict(db: &Path, sql: &str) -> i64 {
    let c = Connection::open_with_flags(db, OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
    c.query_row(sql, [], |r| r.get(0)).unwrap_or_else(|e| panic!("{sql}: {e}"))
}

fn done(db: &Path) -> i64 {
    count(db, "SELECT coalesce(max(done), 0) FROM bulk_operations WHERE request_id = 'crash-1'")
}

const ARGS: [&str; 8] = ["bench", "bulk", "--entities", "20000", "--rate", "4000", "--request-id", "crash-1"];

#[test]
fn a_bulk_operation_killed_in_the_middle_finishes_each_entity_once() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("bulk.db");
    let mut reached = 0;
    for kill in 1..=2 {
        let mut child = Command::new(env!("CARGO_BIN_EXE_settle"))
            .arg("--db")
            .arg(&db)
            .args(ARGS)
            .env("SETTLE_LOG", "error")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // Killed once it has gone some way past where the last run stopped.
        let started = Instant::now();
        let target = reached + 3_000;
        while done(&db) < target {
            assert!(started.elapsed() < Duration::from_secs(120), "no progress past {target}");
            assert!(child.try_wait().unwrap().is_none(), "finished before kill {kill}");
            std::thread::sleep(Duration::from_millis(20));
        }
        common::kill_9(child.id());
        child.wait().unwrap();
        reached = done(&db);
        assert!(reached < JOBS, "kill {kill} fell in the middle: {reached} done");
    }
    // Run again: the same operation, to its end.
    let out = settle(&db, &[&ARGS[..], &["--json"]].concat());
    assert!(out.status.success(), "{}{}", stderr(&out), stdout(&out));
    let report: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(
        (report["resumed"].as_bool(), report["done"].as_i64(), report["failed"].as_i64()),
        (Some(true), Some(JOBS), Some(0)),
        "{report}"
    );
    // Each job commanded exactly once, under the operation; every one paused.
    let commands = "SELECT count(*) FROM history WHERE kind = 'command' AND request_id LIKE 'crash-1/%'";
    assert_eq!(strict(&db, commands), JOBS, "one command per job");
    let twice = "SELECT count(*) FROM (SELECT entity_id FROM history WHERE kind = 'command'
                 AND request_id LIKE 'crash-1/%' GROUP BY entity_id HAVING count(*) > 1)";
    assert_eq!(strict(&db, twice), 0, "no job commanded twice");
    let own = "SELECT count(*) FROM history h JOIN entities e ON e.id = h.entity_id
               WHERE h.kind = 'command' AND h.request_id = 'crash-1/' || e.id";
    assert_eq!(strict(&db, own), JOBS, "each under its own request id");
    assert_eq!(strict(&db, "SELECT count(*) FROM entities WHERE machine = 'job' AND run_status = 'paused'"), JOBS);
    let row = "SELECT count(*) FROM bulk_operations WHERE request_id = 'crash-1' AND status = 'done'
               AND done = 20000 AND failed = 0 AND total = 20000";
    assert_eq!(strict(&db, row), 1);
}
