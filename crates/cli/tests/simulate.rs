//! `settle simulate`: the CI seeds hold every invariant, and a seed replays exactly.
//!
//! The seeds run in two processes at once (one per core): `SETTLE_SIM_SEEDS` sets how many
//! each runs (default 1000, so 2000 in all).

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
    let per: u64 = std::env::var("SETTLE_SIM_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(1000);
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
