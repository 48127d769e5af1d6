//! End-to-end tests of the `settle` binary as a user drives it.

mod common;
use common::{settle, stderr, stdout, write_machines};

use std::path::PathBuf;

fn example(name: &str) -> String {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/machines").join(name);
    root.display().to_string()
}

/// A machine of `tests/testdata`.
fn testdata(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/testdata").join(name).display().to_string()
}

#[test]
fn validate_accepts_good_files_and_reports_every_problem_of_bad_ones() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("unused.db");
    let ok = settle(&db, &["validate", &example("server.toml")]);
    assert!(ok.status.success(), "{}", stderr(&ok));
    assert!(stdout(&ok).contains("ok: machine `server`"), "{}", stdout(&ok));
    let broken = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/invalid/broken.toml");
    let bad = settle(&db, &["validate", &example("server.toml"), &broken.display().to_string()]);
    assert_eq!(bad.status.code(), Some(1));
    let out = stdout(&bad);
    assert!(out.contains("ok: machine `server`"), "valid files are still reported: {out}");
    let errors = out.lines().filter(|l| l.contains(": error: machine `broken`")).count();
    assert!(errors >= 5, "all errors at once, each with file and line: {out}");
    assert!(out.lines().all(|l| !l.contains("error") || l.contains("broken.toml:")), "{out}");
    assert!(!db.exists(), "validate touches no database");
}

/// Every class of statechart mistake (one fixture each, shared with settle-core's own
/// test, which holds the expected lines in `# expect:` comments) is reported by `settle
/// validate` with its file and line; a file with errors fails the command.
#[test]
fn validate_reports_every_class_of_statechart_mistake_with_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("unused.db");
    let fixtures = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../core/src/testdata/invalid");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&fixtures).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    for path in files {
        let text = std::fs::read_to_string(&path).unwrap();
        let name = path.file_name().unwrap().to_str().unwrap();
        let expected: Vec<String> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# expect: "))
            .map(|l| format!("{}:{l}", path.display()))
            .collect();
        let out = settle(&db, &["validate", &path.display().to_string()]);
        let printed = stdout(&out);
        let diagnostics: Vec<&str> = printed.lines().filter(|l| !l.contains(": ok: machine")).collect();
        assert_eq!(diagnostics, expected, "{name}");
        let has_errors = expected.iter().any(|l| l.contains(": error: "));
        assert_eq!(out.status.code(), Some(if has_errors { 1 } else { 0 }), "{name}: {printed}");
    }
}

#[test]
fn graph_prints_mermaid_and_dot() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("unused.db");
    let mermaid = settle(&db, &["graph", &example("server.toml")]);
    assert!(mermaid.status.success());
    assert!(stdout(&mermaid).starts_with("stateDiagram-v2"), "{}", stdout(&mermaid));
    let dot = settle(&db, &["graph", &example("server.toml"), "--format", "dot"]);
    assert!(stdout(&dot).starts_with("digraph \"server\""), "{}", stdout(&dot));
    let bad = settle(&db, &["graph", &example("server.toml"), "--format", "png"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(stderr(&bad).contains("unknown diagram format `png`"), "{}", stderr(&bad));
}

#[test]
fn demo_then_inspect_with_json() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("demo.db");
    let demo = settle(&db, &["demo", "--servers", "25", "--fail-rate", "0.3", "--seed", "5"]);
    assert!(demo.status.success(), "{}", stderr(&demo));
    let out = stdout(&demo);
    assert!(out.contains("servers by state: ready 25"), "{out}");
    assert!(out.contains("time to ready: p50"), "{out}");

    let list = settle(&db, &["list", "--machine", "server", "--json"]);
    assert!(list.status.success());
    let rows: Vec<serde_json::Value> = stdout(&list).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(rows.len(), 25);
    for r in &rows {
        for field in ["machine", "key", "state", "version", "properties"] {
            assert!(r.get(field).is_some(), "entity JSON lacks `{field}`: {r}");
        }
        assert_eq!(r["state"], "ready");
        assert!(r["properties"]["endpoint"].is_string());
    }
    let none = settle(&db, &["list", "--state", "creating", "--json"]);
    assert_eq!(stdout(&none), "");

    let get = settle(&db, &["get", "server", "r1-srv-00003", "--json"]);
    let e: serde_json::Value = serde_json::from_str(stdout(&get).trim()).unwrap();
    assert_eq!((e["machine"].as_str(), e["state"].as_str()), (Some("server"), Some("ready")));

    let hist = settle(&db, &["history", "server", "r1-srv-00003", "--json"]);
    let rows: Vec<serde_json::Value> = stdout(&hist).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    for r in &rows {
        for field in ["from", "to", "kind", "action", "event", "at"] {
            assert!(r.get(field).is_some(), "history JSON lacks `{field}`: {r}");
        }
    }
    assert_eq!(rows[0]["kind"], "create");
    assert_eq!(rows[0]["from"], serde_json::Value::Null);
    assert_eq!(rows[1]["event"], "create");
    assert_eq!(rows.last().unwrap()["to"], "ready");

    let missing = settle(&db, &["get", "server", "nope"]);
    assert_eq!(missing.status.code(), Some(1));
    assert_eq!(stderr(&missing).trim(), "error: no entity `nope` of machine `server`");

    // A second demo on the same file is a new run; the first run's servers stay.
    let again = settle(&db, &["demo", "--servers", "5", "--seed", "6", "--fail-rate", "0"]);
    assert!(again.status.success(), "{}", stderr(&again));
    assert!(stdout(&again).contains("demo run 2 finished"), "{}", stdout(&again));
    let all = settle(&db, &["list", "--machine", "server", "--json"]);
    assert_eq!(stdout(&all).lines().count(), 30);
}

#[test]
fn reading_a_missing_database_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("absent.db");
    let out = settle(&db, &["list"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("cannot open database") && stderr(&out).contains("no such file"), "{}", stderr(&out));
    assert!(!db.exists(), "reading does not create the file");
}

#[test]
fn demo_refuses_bad_options() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("d.db");
    let out = settle(&db, &["demo", "--fail-rate", "1.5"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(stderr(&out).trim(), "error: --fail-rate must be in [0, 1), got 1.5");
}

#[test]
fn bench_chain_prints_one_json_line() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("bench.db");
    let out = settle(&db, &["bench", "chain", "--entities", "300", "--steps", "2", "--concurrency", "16", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    for field in ["workflows", "transitions", "seconds", "workflows_per_s", "transitions_per_s", "p50_ms", "p99_ms"] {
        assert!(v.get(field).is_some(), "bench JSON lacks `{field}`: {v}");
    }
    assert_eq!(v["workflows"], 300);
    assert_eq!(v["transitions"], 900);
}

#[test]
fn bench_chain_nested_runs_each_workflow_through_its_parent_once() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("bench.db");
    let args = ["bench", "chain", "--entities", "200", "--steps", "3", "--nested", "--concurrency", "16", "--json"];
    let out = settle(&db, &args);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!((v["workflows"].as_u64(), v["transitions"].as_u64()), (Some(200), Some(800)), "{v}");
    // One entry into `running` and one exit from it per workflow: moving between its
    // substates runs neither.
    assert_eq!((v["entry_runs"].as_u64(), v["exit_runs"].as_u64()), (Some(200), Some(200)), "{v}");
    // Every workflow went idle → u1 (entering `running`) … u3 → done (leaving it).
    let out = settle(&db, &["list", "--json"]);
    let rows: Vec<serde_json::Value> = stdout(&out).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(rows.len(), 200);
    assert!(rows.iter().all(|r| r["machine"] == "chain3_nested" && r["state"] == "done"), "{rows:?}");
    let key = rows[0]["key"].as_str().unwrap();
    let out = settle(&db, &["history", "chain3_nested", key, "--json"]);
    let moves: Vec<(String, String)> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|h| h["from"].is_string())
        .map(|h| (h["from"].as_str().unwrap().to_string(), h["to"].as_str().unwrap().to_string()))
        .collect();
    let expect = [("idle", "u1"), ("u1", "u2"), ("u2", "u3"), ("u3", "done")];
    assert_eq!(moves, expect.map(|(a, b)| (a.to_string(), b.to_string())));
}

#[test]
fn bench_agents_runs_workflows_through_a_server_and_agents() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("bench.db");
    let out = settle(&db, &["bench", "agents", "--entities", "200", "--agents", "2", "--batch", "8", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(
        (v["workflows"].as_u64(), v["transitions"].as_u64(), v["agents"].as_u64()),
        (Some(200), Some(400), Some(2))
    );
    assert!(v["server_peak_rss_mb"].as_f64().is_some_and(|mb| mb > 0.0), "{v}");
}

#[test]
fn validate_checks_subscriptions_across_the_files_given() {
    let dir = tempfile::tempdir().unwrap();
    // `parent` subscribes to a state `worker` does not have.
    let (parent, worker) = (testdata("parent.toml"), testdata("worker.toml"));
    let db = dir.path().join("unused.db");
    let out = settle(&db, &["validate", &parent, &worker]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(
        stdout(&out).contains(
            "error: machine `parent`, event `all_done`: `subscribe`: machine `worker` has no state `finished`"
        ),
        "{}",
        stdout(&out)
    );
    let alone = settle(&db, &["validate", &parent]);
    assert!(alone.status.success(), "one file alone cannot know the other machine: {}", stdout(&alone));
}

/// A statechart from TOML, driven from the command line: `settle check` tells what an
/// event would do (guards against `--params`) without doing it; `raise --wait` shows an
/// ignored event as such.
#[test]
fn check_tells_what_an_event_would_do_and_raise_shows_ignored_events() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("sc.db");
    let instance = include_str!("../../core/src/testdata/instance.toml");
    let m = write_machines(dir.path(), &[("instance.toml", instance)]).display().to_string();
    let with = |args: &[&str]| {
        let mut all = vec!["--machines", m.as_str()];
        all.extend_from_slice(args);
        settle(&db, &all)
    };
    let created = with(&["create", "instance", "i", "--props", r#"{"max_size": 4}"#]);
    assert!(created.status.success(), "{}", stderr(&created));
    let ran = with(&["run", "--until-idle"]);
    assert!(ran.status.success(), "{}", stderr(&ran));
    let fires = with(&["check", "instance", "i", "resize", "--params", r#"{"size": 2}"#]);
    assert_eq!(stdout(&fires), "instance i: event resize would run begin_resize (in state running)\n");
    assert!(fires.status.success());
    let refused = with(&["check", "instance", "i", "resize", "--params", r#"{"size": 8}"#]);
    assert_eq!(
        stdout(&refused),
        "instance i: event resize would be rejected in state running: size above this instance's maximum\n"
    );
    assert_eq!(refused.status.code(), Some(1));
    let json = with(&["check", "instance", "i", "start", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&json)).unwrap();
    assert_eq!(v["verdict"], serde_json::json!({"result": "ignored", "state": "active"}));
    // A parent lists its substates' entities (from the stored definition: no --machines).
    let listed = settle(&db, &["list", "--state", "active", "--json"]);
    let rows: Vec<serde_json::Value> = stdout(&listed).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(
        rows.iter().map(|r| (r["key"].as_str(), r["state"].as_str())).collect::<Vec<_>>(),
        [(Some("i"), Some("running"))]
    );
    assert!(stdout(&settle(&db, &["list", "--state", "stopped", "--json"])).is_empty());
    let raised = with(&["raise", "instance", "i", "start", "--wait"]);
    assert!(raised.status.success(), "{}", stderr(&raised));
    assert!(stdout(&raised).starts_with("instance i: event start ignored in state running\n"), "{}", stdout(&raised));
}

/// `raise --wait` waits for the operation: the reference `server` is `ready`, its four
/// resources with it; `--wait=stable` answers at the server's next stable state,
/// `creating_resources`, while its resources are still being provisioned.
#[test]
fn raise_waits_for_the_operation_or_for_the_entity_at_rest() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("wait.db");
    for key in ["s1", "s2"] {
        assert!(settle(&db, &["--builtin", "create", "server", key]).status.success());
    }
    let whole = settle(&db, &["raise", "server", "s1", "create", "--wait", "--json"]);
    assert!(whole.status.success(), "{}", stderr(&whole));
    let v: serde_json::Value = serde_json::from_str(&stdout(&whole)).unwrap();
    assert_eq!(v["entity"]["state"], "ready", "{v}");
    let op = &v["operation_ended"];
    assert_eq!((op["request_id"].as_str(), op["outcome"].as_str()), (v["request_id"].as_str(), Some("success")));
    for kind in ["app", "database", "alias", "dns"] {
        let e = settle(&db, &["get", kind, &format!("s1-{kind}"), "--json"]);
        let e: serde_json::Value = serde_json::from_str(&stdout(&e)).unwrap();
        assert_eq!(e["state"], "ready", "the operation ended with every resource ready: {e}");
    }
    let text = settle(&db, &["raise", "server", "s1", "create", "--wait", "--idempotency-key", "again"]);
    assert_eq!(text.status.code(), Some(1), "rejected: already exists");
    let stable = settle(&db, &["raise", "server", "s2", "create", "--wait=stable"]);
    assert!(stable.status.success(), "{}", stderr(&stable));
    let out = stdout(&stable);
    assert!(out.contains("state:      creating_resources"), "{out}");
    assert!(!out.contains("operation ended"), "{out}");
    let bad = settle(&db, &["raise", "server", "s2", "create", "--wait=soon"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(stderr(&bad).contains("possible values: operation, stable"), "{}", stderr(&bad));
}

/// Stateless's fallback and SCXML's `In()` as `settle check` shows them: when no guard of
/// the substate's handler holds, its parent's handler decides; a guard may ask `in_state`.
#[test]
fn check_shows_the_superstates_handler_deciding_and_in_state() {
    let text = r#"
initial = "up"
[states.up]
initial = "child"
[states.child]
parent = "up"
[states.done]
kind = "terminal"
[states.other]
kind = "terminal"
[events.go]
in = ["up", "child"]
params = ["n"]
[[events.go.when]]
in = ["child"]
guard = "params.n > 1 && in_state('up')"
action = "inner"
[[events.go.when]]
in = ["up"]
action = "outer"
[actions.inner]
to = ["done"]
[actions.outer]
to = ["other"]
"#;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("nest.db");
    let m = write_machines(dir.path(), &[("nest.toml", text)]).display().to_string();
    let created = settle(&db, &["--machines", &m, "create", "nest", "a"]);
    assert!(created.status.success(), "{}", stderr(&created));
    for (n, action) in [("2", "inner"), ("1", "outer")] {
        let params = format!(r#"{{"n": {n}}}"#);
        let out = settle(&db, &["--machines", &m, "check", "nest", "a", "go", "--params", &params]);
        assert_eq!(stdout(&out), format!("nest a: event go would run {action} (in state child)\n"), "n = {n}");
    }
}
