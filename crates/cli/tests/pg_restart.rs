//! A PostgreSQL restart in the middle of a multi-instance run: the workers and the driver
//! keep retrying with backoff and the run completes with nothing lost. Restarts the local
//! cluster with `pg_ctlcluster`, so it is a test binary of its own (cargo runs test
//! binaries one at a time; no other test's connections are cut). Needs `SETTLE_TEST_PG`
//! and `pg_ctlcluster`; without them it says it skipped.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{DemoRun, assert_demo_converged};

/// The local cluster's version, if `pg_ctlcluster` can restart it.
fn local_cluster() -> Option<String> {
    let version = std::fs::read_dir("/etc/postgresql").ok()?.filter_map(|e| e.ok()).next()?;
    let version = version.file_name().to_string_lossy().into_owned();
    Command::new("pg_ctlcluster").arg("--help").output().ok()?;
    Some(version)
}

fn pg_ctl(version: &str, action: &str) {
    let out = Command::new("pg_ctlcluster")
        .args(["--skip-systemctl-redirect", version, "main", action])
        .output()
        .expect("run pg_ctlcluster");
    assert!(out.status.success(), "pg_ctlcluster {action}: {}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn run_survives_postgres_restart() {
    let Some(url) = settle_store::postgres::test_url("restart") else { return };
    let Some(version) = local_cluster() else {
        // CI runs beside its own PostgreSQL cluster: there this test must run.
        assert!(std::env::var_os("CI").is_none(), "CI: no local PostgreSQL cluster to restart with pg_ctlcluster");
        eprintln!("skipped: PostgreSQL restart test: no local cluster to restart with pg_ctlcluster");
        return;
    };
    let demo = DemoRun::start(&url, &["--instances", "2", "--servers", "300", "--fail-rate", "0.2", "--seed", "11"]);
    demo.worker_pid(2);
    // Let the servers be created and work get going, then cut every connection.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !demo.log().contains("progress:") {
        assert!(std::time::Instant::now() < deadline, "the demo did not start processing:\n{}", demo.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    pg_ctl(&version, "stop");
    std::thread::sleep(Duration::from_secs(2));
    pg_ctl(&version, "start");
    let (status, log) = demo.finish(Duration::from_secs(300));
    assert!(status.success(), "demo failed across the restart:\n{log}");
    assert!(log.contains("database unavailable, retrying"), "the restart went unnoticed:\n{log}");
    assert_demo_converged(&url, 300);
}
