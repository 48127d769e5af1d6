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

/// A schedule creating one entity every two seconds, run by three worker processes on one
/// database, one of them killed with `kill -9` while they run and another started in its
/// place: every instant from the first fire to the last made exactly one entity (keys are
/// the instants, so a second one could not exist; a gap would be a lost fire), and the
/// schedule counted each fire once (but those the final kill may have cut between their
/// entities and the progress, which are from the schedule's next fire on and replay).
#[test]
fn a_schedule_fires_each_instant_once_across_three_instances_with_one_killed() {
    let Some(url) = settle_store::postgres::test_url("schedules3") else { return };
    let dir = tempfile::tempdir().unwrap();
    let machines = common::write_machines(
        dir.path(),
        &[(
            "tick.toml",
            "initial = \"made\"\n[states.made]\n[schedules.every2s]\ncron = \"*/2 * * * * *\"\ncreate = {}\n\
             overlap = \"allow_all\"\n",
        )],
    );
    let machines = machines.to_str().unwrap();
    let worker = || common::spawn_settle(&url, &["--machines", machines, "run"]);
    let mut workers = vec![worker(), worker(), worker()];
    std::thread::sleep(Duration::from_secs(7));
    kill_9(workers[0].0.id());
    eprintln!("killed the first worker");
    std::thread::sleep(Duration::from_secs(5));
    workers.push(worker());
    std::thread::sleep(Duration::from_secs(8));
    drop(workers);

    let db = std::path::Path::new(&url);
    let list = common::settle(db, &["list", "--machine", "tick", "--json"]);
    assert!(list.status.success(), "{}", common::stderr(&list));
    let mut instants: Vec<i64> = common::stdout(&list)
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            let key = v["key"].as_str().unwrap().to_string();
            let at = key.strip_prefix("every2s-").unwrap_or_else(|| panic!("key {key}"));
            settle_core::time::parse_time(at, 0).unwrap()
        })
        .collect();
    instants.sort();
    assert!(instants.len() >= 8, "{} fires in 20 seconds: {instants:?}", instants.len());
    for pair in instants.windows(2) {
        assert_eq!(pair[1] - pair[0], 2_000, "a fire lost or repeated between {pair:?}: {instants:?}");
    }
    let listed = common::settle(db, &["--machines", machines, "schedules", "list", "--json"]);
    let row: serde_json::Value = serde_json::from_str(common::stdout(&listed).trim()).unwrap();
    // The workers are killed at the end as well: one may have created the entities of its
    // fires and died before writing the schedule's progress. Those fires are at or after
    // the schedule's next one, which the next pass replays (their keys exist, so they
    // create nothing new) and counts then; any other difference is a fire counted twice
    // or lost.
    let fired = row["fired"].as_u64().unwrap() as usize;
    let next_fire = row["next_fire"].as_i64().unwrap();
    let in_flight = instants.iter().filter(|&&at| at >= next_fire).count();
    assert_eq!(fired + in_flight, instants.len(), "{row}: {instants:?}");
    assert_eq!((row["missed"].as_u64(), row["skipped"].as_u64()), (Some(0), Some(0)), "{row}");
}
