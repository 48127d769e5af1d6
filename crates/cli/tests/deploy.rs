//! `settle deploy` as a user drives it: over `--server` to a running `settle serve` (a
//! dry run, then the deploy; the pinned entity still works under its version, the resting
//! one moved; `settle machines` counts the entities per version) and on the database (a
//! version that would strand a working entity is refused, naming it, and nothing changes).

mod common;
use common::{Served, settle, stderr, stdout};

use std::path::Path;

use serde_json::Value;

/// `job` version `v`: new -start→ working (its auto action waits an hour) → done (from
/// version 2 on, `finished`, `renamed_from` done; version 3 has no end state at all).
fn job(v: u32) -> String {
    let (end, extra) = match v {
        1 => ("done", ""),
        2 => ("finished", "renamed_from = [\"done\"]\n"),
        _ => ("new", ""),
    };
    let end_state = if v >= 3 { String::new() } else { format!("[states.{end}]\n{extra}") };
    format!(
        "initial = \"new\"\nupgrade = \"pin\"\n[states.new]\n[states.working]\nauto = \"finish\"\nwait = \"1h\"\n{end_state}\
         [events.start]\nin = [\"new\"]\naction = \"begin\"\n[actions.begin]\nto = [\"working\"]\n\
         [actions.finish]\nto = [\"{end}\"]\n"
    )
}

fn write(dir: &Path, v: u32) -> std::path::PathBuf {
    let d = dir.join(format!("v{v}"));
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join("job.toml"), job(v)).unwrap();
    d
}

fn ok(out: std::process::Output, what: &str) -> String {
    assert!(out.status.success(), "{what} failed ({:?}): {}{}", out.status, stderr(&out), stdout(&out));
    stdout(&out)
}

#[test]
fn a_pinned_version_is_deployed_over_http_and_a_stranding_one_refused_on_the_database() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("settle.db");
    let (v1, v2, v3) = (write(dir.path(), 1), write(dir.path(), 2), write(dir.path(), 3));
    let s = Served::start(&db, Some(&v1), &[]);
    let run = |args: &[&str]| ok(s.settle(None, args), &format!("settle --server {args:?}"));
    run(&["create", "job", "w1"]);
    run(&["raise", "job", "w1", "start"]);
    // It works an hour in `working`: look until it is there.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !run(&["get", "job", "w1"]).contains("working") {
        assert!(std::time::Instant::now() < deadline, "w1 never started");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    run(&["create", "job", "r1"]);
    let new_file = v2.join("job.toml");
    let file = new_file.to_str().unwrap();

    let dry = run(&["deploy", file, "--dry-run"]);
    assert!(dry.starts_with("would deploy job version "), "{dry}");
    assert!(dry.contains("pin: 1 moved now, 1 pinned until at rest\ndry run: nothing changed\n"), "{dry}");
    let done: Value = serde_json::from_str(&run(&["deploy", file, "--json"])).unwrap();
    let d = &done["machines"][0];
    assert_eq!((d["moved"].as_u64(), d["pinned"].as_u64(), d["upgrade"].as_str()), (Some(1), Some(1), Some("pin")));
    let (old, new) = (d["previous"].as_str().unwrap().to_string(), d["version"].as_str().unwrap().to_string());
    let again = run(&["deploy", file]);
    assert!(again.starts_with("job: unchanged (version "), "{again}");

    let version = |key: &str| {
        let e: Value = serde_json::from_str(&run(&["get", "job", key, "--json"])).unwrap();
        e["machine_version"].as_str().unwrap().to_string()
    };
    assert_eq!((version("w1"), version("r1")), (old.clone(), new.clone()), "w1 works under v1, r1 moved");
    let machines = ok(settle(&db, &["machines", "--json"]), "machines");
    let counts: Vec<(String, u64)> = machines
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|v| v["machine"] == "job")
        .map(|v| (v["hash"].as_str().unwrap().to_string(), v["entities"].as_u64().unwrap()))
        .collect();
    assert_eq!(counts, [(old, 1), (new, 1)]);
    drop(s);

    // On the database: v3 has no state w1 could come to rest in.
    let bad = v3.join("job.toml");
    let refused = settle(&db, &["--machines", v1.to_str().unwrap(), "deploy", bad.to_str().unwrap()]);
    assert_eq!(refused.status.code(), Some(1), "{}", stdout(&refused));
    let err = stderr(&refused);
    assert!(err.contains("pinned entity working in `working` may come to rest"), "{err}");
    assert!(err.contains("in `working`: w1"), "{err}");
    let unknown = settle(&db, &["deploy", dir.path().join("nope.toml").to_str().unwrap()]);
    assert_eq!(unknown.status.code(), Some(1));
    assert!(stderr(&unknown).contains("nope.toml: cannot read"), "{}", stderr(&unknown));
}
