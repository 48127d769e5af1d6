//! The bug tracker of seed 004 (`examples/bugtracker`), driven with the CLI as its README
//! says, on SQLite and (with `SETTLE_TEST_PG`) PostgreSQL: every transition of the seed's
//! description, the stored assignee after each, the order of the exit and entry actions on
//! a re-assign (Stateless's `PermitReentry`), the events the seed does not permit refused,
//! and the history of every transition.

mod common;

use std::path::Path;

use common::{repo, settle, stderr, stdout};
use serde_json::{Value, json};

fn machines() -> String {
    repo().join("examples/bugtracker").display().to_string()
}

/// `settle raise bug KEY EVENT [--params P] --wait`: the entity afterwards, or the refusal.
fn raise(db: &Path, key: &str, event: &str, params: Option<Value>) -> Result<Value, String> {
    let params = params.map(|p| p.to_string());
    let mut args = vec!["raise", "bug", key, event, "--wait", "--json", "--machines"];
    let m = machines();
    args.push(&m);
    if let Some(p) = &params {
        args.extend(["--params", p]);
    }
    let out = settle(db, &args);
    if !out.status.success() {
        return Err(format!("{}{}", stdout(&out), stderr(&out)));
    }
    let line: Value = serde_json::from_str(stdout(&out).trim()).expect("one JSON object");
    Ok(line["entity"].clone())
}

fn drive(db: &Path) {
    let m = machines();
    let out = settle(db, &["create", "bug", "b1", "--props", r#"{"title": "crash on save"}"#, "--machines", &m]);
    assert!(out.status.success(), "{}", stderr(&out));
    let off = |who: &str| format!("{who}: you are off the hook");
    let owns = |who: &str| format!("{who}: you own it");
    let remind = |who: &str| format!("{who}: do not forget to help the new employee");
    // (event, assignee param) → (state, stored assignee, mail sent by this step)
    type Step<'a> = (&'a str, Option<&'a str>, &'a str, Option<&'a str>, Vec<String>);
    let steps: [Step<'_>; 5] = [
        ("assign", Some("Joe"), "assigned", Some("Joe"), vec![owns("Joe")]),
        // The re-entry: the exit action runs with the old assignee and drops it, then the
        // entry action (on_entry_from assign) stores the new one and reminds the old.
        ("assign", Some("Sue"), "assigned", Some("Sue"), vec![off("Joe"), remind("Joe"), owns("Sue")]),
        // Deferred: leaving `assigned` runs its exit action, entering `deferred` forgets.
        ("defer", None, "deferred", None, vec![off("Sue")]),
        ("assign", Some("Ann"), "assigned", Some("Ann"), vec![owns("Ann")]),
        ("close", None, "closed", None, vec![off("Ann")]),
    ];
    let mut mail: Vec<String> = Vec::new();
    for (event, assignee, state, stored, sent) in steps {
        let what = format!("{event} {assignee:?}");
        let entity = raise(db, "b1", event, assignee.map(|a| json!({"assignee": a}))).expect(&what);
        assert_eq!(entity["state"], state, "{what}: {entity}");
        let props = &entity["properties"];
        assert_eq!(props["assignee"].as_str(), stored, "{what}: {entity}");
        mail.extend(sent);
        assert_eq!(props["mail"], json!(mail), "{what}: exit before entry, each once: {entity}");
        assert_eq!(props["title"], "crash on save", "{what}");
    }

    // What the seed does not permit is refused and changes nothing.
    let out = settle(db, &["create", "bug", "b2", "--machines", &m]);
    assert!(out.status.success(), "{}", stderr(&out));
    for (event, state) in [("close", "unassigned"), ("defer", "unassigned")] {
        let refused = raise(db, "b2", event, None).expect_err(event);
        assert!(refused.contains(&format!("event `{event}` is not valid in state `{state}`")), "{refused}");
    }
    let refused = raise(db, "b1", "assign", Some(json!({"assignee": "Max"}))).expect_err("closed is terminal");
    assert!(refused.contains("not valid in state `closed`"), "{refused}");
    let missing = raise(db, "b2", "assign", None).expect_err("assign needs its assignee");
    assert!(missing.contains("assignee"), "{missing}");

    // The history of every transition, re-entry included.
    let out = settle(db, &["history", "bug", "b1", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let rows: Vec<(Value, Value, Value, Value)> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .map(|r| (r["from"].clone(), r["to"].clone(), r["kind"].clone(), r["event"].clone()))
        .collect();
    let row = |from: Value, to: &str, kind: &str, event: Value| (from, json!(to), json!(kind), event);
    assert_eq!(
        rows,
        [
            row(Value::Null, "unassigned", "create", Value::Null),
            row(json!("unassigned"), "assigned", "event", json!("assign")),
            row(json!("assigned"), "assigned", "event", json!("assign")),
            row(json!("assigned"), "deferred", "event", json!("defer")),
            row(json!("deferred"), "assigned", "event", json!("assign")),
            row(json!("assigned"), "closed", "event", json!("close")),
        ]
    );
}

#[test]
fn the_bug_tracker_runs_as_the_seed_describes_it_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    drive(&dir.path().join("bugs.db"));
}

#[test]
fn the_bug_tracker_runs_as_the_seed_describes_it_on_postgres() {
    let Some(url) = settle_store::postgres::test_url("bugtracker") else { return };
    drive(Path::new(&url));
}
