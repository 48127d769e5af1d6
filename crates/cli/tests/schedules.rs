//! `settle schedules` as a user drives it, on the database and over `--server`, with the
//! shipped examples (`backup.toml`: a nightly backup at 03:00 Paris time; `report.toml`: a
//! report created on the first Monday of each month): listed with their next fires,
//! paused and resumed, shown on the entity they reach; a schedule that does not exist is a
//! clear error.

mod common;
use common::{Served, settle, stderr, stdout};

use std::path::{Path, PathBuf};

use serde_json::Value;

fn examples() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/machines")
}

fn with_examples(db: &Path, args: &[&str]) -> std::process::Output {
    let dir = examples();
    let mut all = vec!["--machines", dir.to_str().unwrap()];
    all.extend_from_slice(args);
    settle(db, &all)
}

fn ok(out: std::process::Output, what: &str) -> String {
    assert!(out.status.success(), "{what} failed ({:?}): {}{}", out.status, stderr(&out), stdout(&out));
    stdout(&out)
}

fn lines(text: &str) -> Vec<Value> {
    text.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"))).collect()
}

#[test]
fn schedules_are_listed_paused_and_resumed_on_the_database_and_over_http() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("settle.db");
    // An engine on the database stores the schedules with their first fires.
    ok(with_examples(&db, &["create", "backup", "db1"]), "create");
    let listed = lines(&ok(with_examples(&db, &["schedules", "list", "--json"]), "schedules list"));
    let names: Vec<String> =
        listed.iter().map(|s| format!("{}/{}", s["machine"].as_str().unwrap(), s["name"].as_str().unwrap())).collect();
    assert_eq!(names, ["backup/nightly", "report/monthly"]);
    assert_eq!(listed[0]["cron"], "0 3 * * * (Europe/Paris)");
    assert_eq!(listed[0]["does"], "raise backup in [ready]");
    assert!(listed[0]["next_fire"].as_i64().unwrap() > 0 && listed[0]["paused"] == false, "{}", listed[0]);
    let table = ok(with_examples(&db, &["schedules"]), "schedules");
    assert!(table.starts_with("MACHINE"), "{table}");
    assert!(table.contains("backup       nightly"), "{table}");

    let paused = ok(with_examples(&db, &["schedules", "pause", "backup", "nightly"]), "pause");
    assert_eq!(paused, "backup/nightly: paused\n");
    let listed = lines(&ok(with_examples(&db, &["schedules", "list", "--json"]), "list"));
    assert_eq!(listed[0]["paused"], true);
    let unknown = with_examples(&db, &["schedules", "pause", "backup", "hourly"]);
    assert_eq!(unknown.status.code(), Some(1));
    assert!(stderr(&unknown).contains("machine `backup` has no schedule `hourly`"), "{}", stderr(&unknown));

    // Over HTTP: the server's view, the same commands.
    let s = Served::start(&db, Some(&examples()), &[]);
    let run = |args: &[&str]| ok(s.settle(None, args), &format!("settle --server {args:?}"));
    let resumed = run(&["schedules", "resume", "backup", "nightly"]);
    assert!(resumed.starts_with("backup/nightly: next fire "), "{resumed}");
    let listed = lines(&run(&["schedules", "list", "--json"]));
    assert_eq!((listed.len(), listed[0]["paused"].clone()), (2, Value::Bool(false)));
    run(&["raise", "backup", "db1", "create", "--wait"]);
    let got = run(&["get", "backup", "db1"]);
    assert!(got.contains("schedule:   nightly next "), "{got}");
    assert!(got.contains("(raise backup in [ready])"), "{got}");
    let unknown = s.settle(None, &["schedules", "resume", "backup", "hourly"]);
    assert_eq!(unknown.status.code(), Some(1));
    assert!(stderr(&unknown).contains("no schedule `hourly`"), "{}", stderr(&unknown));
}
