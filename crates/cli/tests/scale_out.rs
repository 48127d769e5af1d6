//! Many instances on one PostgreSQL database, as a user runs them: `settle demo
//! --instances 3` with worker processes killed with `kill -9` while they work. Needs
//! `SETTLE_TEST_PG`; without it the test says it skipped.

mod common;

use std::time::Duration;

use common::{DemoRun, assert_demo_converged, kill_9};

/// Three workers run the reference scenario with 500 servers; worker 1 is killed with
/// `kill -9` three times (the demo restarts it each time). Every server converges and no
/// state entry is recorded twice.
#[test]
fn three_instances_survive_kill_9() {
    let Some(url) = settle_store::postgres::test_url("scaleout") else { return };
    let demo = DemoRun::start(&url, &["--instances", "3", "--servers", "500", "--fail-rate", "0.2", "--seed", "7"]);
    let mut killed = Vec::new();
    for round in 0..3 {
        let pid = demo.worker_pid(1);
        std::thread::sleep(Duration::from_millis(if round == 0 { 1_500 } else { 1_200 }));
        // Wait until the demo has restarted worker 1 since the last kill.
        let pid = if killed.contains(&pid) { wait_for_new_pid(&demo, &killed) } else { pid };
        kill_9(pid);
        killed.push(pid);
        eprintln!("killed worker 1 (pid {pid})");
    }
    let (status, log) = demo.finish(Duration::from_secs(300));
    assert!(status.success(), "demo failed:\n{log}");
    let restarts = log
        .lines()
        .find_map(|l| l.split_once("worker processes stopped; ").and_then(|(_, r)| r.split(' ').next()?.parse().ok()))
        .unwrap_or(0u32);
    assert!(restarts >= 2, "worker 1 was restarted {restarts} times:\n{log}");
    assert_demo_converged(&url, 500);
}

fn wait_for_new_pid(demo: &DemoRun, old: &[u32]) -> u32 {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let pid = demo.worker_pid(1);
        if !old.contains(&pid) {
            return pid;
        }
        assert!(std::time::Instant::now() < deadline, "worker 1 was not restarted:\n{}", demo.log());
        std::thread::sleep(Duration::from_millis(20));
    }
}
