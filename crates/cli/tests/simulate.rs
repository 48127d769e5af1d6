//! `settle simulate`: the CI seeds hold every invariant, on SQLite and on PostgreSQL, a
//! seed replays exactly, and nothing is left behind, interrupted or not.
//!
//! The SQLite seeds run in two processes at once (one per core): `SETTLE_SIM_SEEDS` sets how
//! many each runs (default 600, so 1200 in all, about a minute and a half of CI; a longer
//! hunt is `settle simulate --seeds N`). The PostgreSQL run (`SETTLE_TEST_PG`; skipped,
//! saying so, without it) runs `SETTLE_SIM_PG_SEEDS` seeds (default 30).

use std::process::{Command, Output};

fn simulate(args: &[&str]) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_settle"))
        .arg("simulate")
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run settle simulate")
}

fn text(o: &Output) -> (String, String) {
    (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
}

#[test]
fn the_ci_seeds_hold_every_invariant() {
    let per: u64 = std::env::var("SETTLE_SIM_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(600);
    let runs: Vec<_> = (0..2u64)
        .map(|i| {
            let (from, seeds) = ((i * per).to_string(), per.to_string());
            simulate(&["--from", &from, "--seeds", &seeds])
        })
        .collect();
    for run in runs {
        let out = run.wait_with_output().expect("wait");
        let (stdout, stderr) = text(&out);
        assert!(out.status.success(), "a seed broke an invariant:\n{stdout}\n{stderr}");
        assert!(stdout.contains("every invariant held"), "{stdout}");
        assert!(stdout.contains(&format!("({per} seeds,")), "{stdout}");
    }
}

#[test]
fn a_seed_replays_exactly() {
    let run = |seed: &str| {
        let out = simulate(&["--seed", seed]).wait_with_output().expect("wait");
        assert!(out.status.success(), "{:?}", text(&out));
        text(&out).0
    };
    let first = run("42");
    assert_eq!(first, run("42"), "the same seed, the same trace");
    assert!(first.starts_with("seed 42: "), "{first}");
    assert!(first.contains("FAULT"), "a seed's schedule injects faults:\n{first}");
    assert!(first.lines().last().is_some_and(|l| l.contains("every invariant held")), "{first}");
    assert_ne!(first, run("43"), "another seed, another schedule");
}

#[test]
fn a_kept_seed_database_opens_with_the_other_commands() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("seed.db");
    let out = simulate(&["--seed", "5", "--keep", db.to_str().unwrap()]).wait_with_output().unwrap();
    assert!(out.status.success(), "{:?}", text(&out));
    let list =
        Command::new(env!("CARGO_BIN_EXE_settle")).arg("--db").arg(&db).args(["ops", "--json"]).output().unwrap();
    assert!(list.status.success(), "{:?}", text(&list));
    // One JSON object a line, every operation of the seed: each ended.
    let ops: Vec<serde_json::Value> =
        String::from_utf8_lossy(&list.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert!(!ops.is_empty());
    assert!(ops.iter().all(|o| !o["ended_at"].is_null()), "{ops:?}");
}

#[test]
fn the_ci_seeds_hold_on_postgresql_and_leave_no_schema() {
    let Ok(url) = std::env::var("SETTLE_TEST_PG") else {
        eprintln!("skipped: the PostgreSQL simulation needs SETTLE_TEST_PG");
        return;
    };
    let seeds: u64 = std::env::var("SETTLE_SIM_PG_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(30);
    let child = Command::new(env!("CARGO_BIN_EXE_settle"))
        .args(["--db", &url, "simulate", "--from", "5000", "--seeds", &seeds.to_string()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run settle simulate");
    let pid = child.id();
    let out = child.wait_with_output().expect("wait");
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "a seed broke an invariant on PostgreSQL:\n{stdout}\n{stderr}");
    assert!(stdout.contains("every invariant held on PostgreSQL"), "{stdout}");
    assert!(stdout.contains(&format!("({seeds} seeds,")), "{stdout}");
    // Each seed's schema is `sim_SEED_PID_N`: none of this run's is left.
    let mut client = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    let pattern = format!("sim\\_%\\_{pid}\\_%");
    let left: i64 =
        client.query_one("SELECT COUNT(*) FROM pg_namespace WHERE nspname LIKE $1", &[&pattern]).unwrap().get(0);
    assert_eq!(left, 0, "a seed's schema was left behind");
}

#[test]
fn nothing_is_left_behind_even_when_interrupted() {
    let dir = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_settle"))
            .arg("simulate")
            .args(args)
            .env("SETTLE_SIM_TMP", dir.path())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run settle simulate")
    };
    let out = run(&["--seeds", "3"]).wait_with_output().unwrap();
    assert!(out.status.success(), "{:?}", text(&out));
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "a run left files behind");
    // Interrupted (SIGTERM) in the middle of its seeds: the seed running ends, with its
    // database, and the run says so.
    let child = run(&["--seeds", "100000"]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while std::fs::read_dir(dir.path()).unwrap().count() < 2 {
        assert!(std::time::Instant::now() < deadline, "the run never started a seed");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // SAFETY: `kill` sends a signal to the child this test started.
    #[allow(unsafe_code)]
    let sent = unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert_eq!(sent, 0);
    let out = child.wait_with_output().unwrap();
    let (_, stderr) = text(&out);
    assert!(!out.status.success() && stderr.contains("simulate: interrupted in seed"), "{stderr}");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "an interrupted run left files behind");
}
