//! The command line's finish: a closed pipe ends a command quietly, shell completion
//! scripts, an example in every command's help, `--json` on every command that prints
//! data, and the drill-down commands `op`, `related` and `why`, on the database and over
//! `--server`.

mod common;
use common::{Served, settle, stderr, stdout};

use std::collections::BTreeSet;
use std::io::{BufRead, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// Standard output of a run that must succeed.
fn ok(out: Output, what: &str) -> String {
    assert!(out.status.success(), "{what} failed ({:?}): {}{}", out.status, stderr(&out), stdout(&out));
    stdout(&out)
}

/// `settle --db DB ARGS...`, which must succeed: its standard output.
fn local(db: &Path, args: &[&str]) -> String {
    ok(settle(db, args), &format!("settle {args:?}"))
}

fn json(text: &str) -> Value {
    serde_json::from_str(text.trim_end()).unwrap_or_else(|e| panic!("not one JSON object ({e}): {text}"))
}

fn json_lines(text: &str) -> Vec<Value> {
    text.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}"))).collect()
}

/// The keys of a JSON array of entities.
fn keys(v: &Value) -> BTreeSet<String> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|e| e["key"].as_str().unwrap().into())
        .collect()
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

fn example(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/machines").join(name).display().to_string()
}

/// Spawns `settle ARGS...`, reads the first line of its output, then closes the pipe and
/// waits: the line, how the process ended, and its standard error.
fn first_line_then_close(args: &[&str]) -> (String, std::process::ExitStatus, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_settle"))
        .args(args)
        .env("SETTLE_LOG", "error")
        .env_remove("SETTLE_SERVER")
        .env_remove("SETTLE_DB")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start settle");
    let mut line = String::new();
    {
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        out.read_line(&mut line).unwrap();
        // Dropped here: the read end of the pipe closes with most of the output unread.
    }
    let mut err = String::new();
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    let status = child.wait().unwrap();
    (line, status, err)
}

/// Killed by SIGPIPE, as `cat` is (a shell reports 141), with nothing on stderr.
fn assert_quiet_sigpipe(what: &str, status: std::process::ExitStatus, err: &str) {
    use std::os::unix::process::ExitStatusExt;
    assert!(!err.contains("panicked") && !err.contains("Broken pipe"), "{what}: {err}");
    assert_eq!(err, "", "{what}: nothing on stderr");
    assert_eq!(status.signal(), Some(libc::SIGPIPE), "{what}: killed by SIGPIPE, not {status:?}");
}

#[test]
fn a_closed_pipe_ends_a_command_quietly_locally_and_over_http() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("fleet.db");
    // 2,000 entities: `list` prints ~450 kB, far more than a pipe holds.
    let seeded = json(&local(&db, &["bench", "fleet", "--entities", "2000", "--repeat", "1", "--json"]));
    assert_eq!(seeded["entities"], 2000, "{seeded}");
    let d = db.display().to_string();

    let (line, status, err) = first_line_then_close(&["--db", &d, "list", "--json"]);
    assert_eq!(json(&line)["machine"], "fleet", "{line}");
    assert_quiet_sigpipe("list --json", status, &err);
    let (line, status, err) = first_line_then_close(&["--db", &d, "list"]);
    assert!(line.starts_with("MACHINE "), "{line}");
    assert_quiet_sigpipe("list", status, &err);
    let (line, status, err) = first_line_then_close(&["completions", "bash"]);
    assert!(!line.is_empty());
    // The bash script (~70 kB) may just fit in the pipe with what was read: either way, quiet.
    assert!(status.success() || status.code().is_none(), "{status:?}");
    assert!(!err.contains("panicked"), "completions: {err}");

    // Over HTTP: the same.
    let s = Served::start(&db, None, &[]);
    let (line, status, err) = first_line_then_close(&["--server", &s.url, "list", "--json"]);
    assert_eq!(json(&line)["machine"], "fleet", "{line}");
    assert_quiet_sigpipe("--server list --json", status, &err);
}

#[test]
fn completion_scripts_for_bash_zsh_and_fish() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("unused.db");
    for shell in ["bash", "zsh", "fish"] {
        let script = local(&db, &["completions", shell]);
        assert!(script.len() > 1000, "{shell}: {script}");
        assert!(script.contains("settle"), "{shell}");
        for sub in ["related", "completions", "list"] {
            assert!(script.contains(sub), "{shell} completes `{sub}`");
        }
        // Where the shell is installed, it reads the script without a syntax error.
        let path = dir.path().join(format!("settle.{shell}"));
        std::fs::write(&path, &script).unwrap();
        if let Ok(checked) = Command::new(shell).arg("-n").arg(&path).output() {
            assert!(checked.status.success(), "{shell} -n: {}", stderr(&checked));
        } else {
            assert_ne!(shell, "bash", "bash is expected wherever the tests run");
        }
    }
    let bad = settle(&db, &["completions", "tcsh"]);
    assert_eq!(bad.status.code(), Some(2), "{}", stderr(&bad));
    assert!(!db.exists(), "completions touch no database");
}

/// The subcommands a `--help` lists under "Commands:" (without `help`).
fn commands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(str::to_string)
        .collect()
}

#[test]
fn every_command_s_help_ends_with_an_example() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("unused.db");
    let top = local(&db, &["--help"]);
    assert!(top.contains("Examples:"), "{top}");
    let listed = commands(&top);
    for expected in ["validate", "list", "op", "related", "completions", "bench", "deploy", "cancel"] {
        assert!(listed.iter().any(|c| c == expected), "`{expected}` in {listed:?}");
    }
    let bench = commands(&local(&db, &["bench", "--help"]));
    assert_eq!(
        bench,
        ["chain", "fanout", "timers", "agents", "fleet", "dormant", "soak", "bulk", "schedule", "limits"]
    );
    let bulk = commands(&local(&db, &["bulk", "--help"]));
    assert_eq!(bulk, ["run", "show", "list", "cancel"]);
    let schedules = commands(&local(&db, &["schedules", "--help"]));
    assert_eq!(schedules, ["list", "pause", "resume"]);
    let mut all: Vec<Vec<String>> = listed.iter().map(|c| vec![c.clone()]).collect();
    all.extend(bench.iter().map(|b| vec!["bench".to_string(), b.clone()]));
    all.extend(bulk.iter().map(|b| vec!["bulk".to_string(), b.clone()]));
    all.extend(schedules.iter().map(|b| vec!["schedules".to_string(), b.clone()]));
    all.push(vec!["workload".into()]); // hidden, but it has one too
    for path in all {
        let mut args: Vec<&str> = path.iter().map(String::as_str).collect();
        for flag in ["--help", "-h"] {
            args.push(flag);
            let help = local(&db, &args);
            let example = help.rfind("\nExample").unwrap_or_else(|| panic!("settle {args:?} has no example:\n{help}"));
            let shown = &help[example..];
            // The example invokes the command itself.
            let name = path.last().unwrap();
            assert!(shown.contains("  settle ") && shown.contains(&format!(" {name} ")), "settle {args:?}: {shown}");
            args.pop();
        }
    }
}

/// A database holding a `server` whose creation finished: the server and its four
/// resources, all `ready`; the request id of the `create` event.
fn provisioned(dir: &Path) -> (PathBuf, String) {
    let db = dir.join("settle.db");
    local(&db, &["--builtin", "create", "server", "s1"]);
    let raised = json(&local(&db, &["raise", "server", "s1", "create", "--json"]));
    let id = raised["request_id"].as_str().unwrap().to_string();
    local(&db, &["run", "--until-idle"]);
    assert_eq!(json(&local(&db, &["get", "server", "s1", "--json"]))["state"], "ready");
    (db, id)
}

const RESOURCES: [&str; 4] = ["s1-app", "s1-database", "s1-alias", "s1-dns"];

/// `text`, what `what` printed with `--json`, parses: one object, or one per line.
fn check_json(what: &str, text: &str, lines: bool) -> Vec<Value> {
    assert!(!text.trim().is_empty(), "{what}: printed nothing");
    if lines { json_lines(text) } else { vec![json(text)] }
}

#[test]
fn json_of_every_command_that_prints_data_parses() {
    let dir = tempfile::tempdir().unwrap();
    let (db, id) = provisioned(dir.path());
    // Reads: one object, or one per line for lists.
    let reads: [(&[&str], bool); 11] = [
        (&["list", "--json"], true),
        (&["get", "server", "s1", "--json"], false),
        (&["history", "server", "s1", "--json"], true),
        (&["history", "server", "s1", "--events", "--json"], true),
        (&["ops", "--json"], true),
        (&["op", &id, "--json"], false),
        (&["related", "server", "s1", "--json"], false),
        (&["why", "server", "s1", "--json"], false),
        (&["stats", "--json"], false),
        (&["machines", "--json"], true),
        (&["check", "server", "s1", "create", "--json"], false),
    ];
    for (args, lines) in reads {
        let out = settle(&db, args);
        // `check` of a refused event exits 1, and still prints its verdict.
        assert!(out.status.success() || args[0] == "check", "{args:?}: {}", stderr(&out));
        check_json(&format!("{args:?}"), &stdout(&out), lines);
    }
    // Writes: one object each.
    let created = json(&local(&db, &["create", "fanparent", "p9", "--json"]));
    assert_eq!((created["command"].as_str(), created["state"].as_str()), (Some("create"), Some("idle")));
    for command in [&["pause"][..], &["resume"], &["sleep", "--until", "+1h"], &["release"], &["retry"], &["kill"]] {
        let mut args = vec![command[0], "fanparent", "p9", "--json"];
        args.extend_from_slice(&command[1..]);
        let v = json(&local(&db, &args));
        assert_eq!(v["command"], command[0], "{v}");
        assert_eq!((v["machine"].as_str(), v["key"].as_str()), (Some("fanparent"), Some("p9")), "{v}");
    }
    local(&db, &["create", "fanparent", "p8"]);
    let raised = json(&local(&db, &["raise", "fanparent", "p8", "go", "--json"]));
    assert_eq!((raised["event"].as_str(), raised["replayed"].as_bool()), (Some("go"), Some(false)), "{raised}");
    assert!(raised["request_id"].is_string() && raised["operation"].is_string(), "{raised}");
    // validate: one object for all the files given; errors exit 1 and still print it.
    let good = json(&local(&db, &["validate", &example("cluster.toml"), &example("replica.toml"), "--json"]));
    assert_eq!(good["ok"], true, "{good}");
    assert_eq!(good["files"].as_array().unwrap().len(), 2, "{good}");
    assert_eq!(good["files"][0]["machine"], "cluster", "{good}");
    assert!(good["files"][0]["states"].as_u64().unwrap() > 5, "{good}");
    assert!(good["across_machines"].is_array(), "{good}");
    let broken = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/invalid/broken.toml");
    let missing = dir.path().join("missing.toml");
    let out = settle(&db, &["validate", &broken.display().to_string(), &missing.display().to_string(), "--json"]);
    assert_eq!(out.status.code(), Some(1));
    let bad = json(&stdout(&out));
    assert_eq!(bad["ok"], false, "{bad}");
    let diagnostics = bad["files"][0]["diagnostics"].as_array().unwrap();
    assert!(diagnostics.len() >= 5, "{bad}");
    assert!(diagnostics.iter().all(|d| d["severity"] == "error" || d["severity"] == "warning"), "{bad}");
    assert!(diagnostics.iter().any(|d| d["line"].is_u64() && d["file"].as_str().unwrap().ends_with("broken.toml")));
    assert_eq!(bad["files"][1]["ok"], false, "{bad}");
    assert_eq!(bad["files"][1]["diagnostics"][0]["item"], "file", "{bad}");
    // A benchmark: one line.
    let chain = json(&local(&db, &["bench", "chain", "--entities", "20", "--steps", "1", "--json"]));
    assert!(chain.is_object(), "{chain}");
}

/// Polls `get MACHINE KEY --json` over `s` until the entity is in `state` (60 s at most).
fn wait_for(s: &Served, machine: &str, key: &str, state: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let out = s.settle(None, &["get", machine, key, "--json"]);
        if out.status.success() && json(&stdout(&out))["state"] == state {
            return;
        }
        assert!(Instant::now() < deadline, "{machine} {key} never reached {state}: {}{}", stdout(&out), stderr(&out));
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// What `op` shows of the server's creation: the server and its four resources, each
/// resource's creation and its way to `ready`, in the order committed.
fn assert_server_creation(text: &str, v: &Value, id: &str) {
    assert!(
        text.starts_with(&format!("operation {id}: server.create on server s1\noutcome:   success after ")),
        "{text}"
    );
    assert!(text.contains("\nentities (5):\nMACHINE "), "{text}");
    for key in RESOURCES {
        let kind = key.trim_start_matches("s1-");
        assert!(text.contains(&format!("{kind} {key}  ")), "{key} in {text}");
        assert!(
            text.lines()
                .any(|l| l.contains(&format!("{kind} {key}")) && l.contains("create") && l.ends_with("→ waiting"))
        );
        assert!(text.lines().any(|l| l.contains(&format!("{kind} {key}")) && l.contains("provisioning → ready")));
    }
    let transitions: Vec<&str> = text.lines().skip_while(|l| !l.starts_with("transitions (")).skip(1).collect();
    let mut times: Vec<&str> = transitions.iter().map(|l| &l[..23]).collect();
    let committed = times.clone();
    times.sort();
    assert_eq!(times, committed, "in the order committed: {text}");
    assert!(
        transitions.first().unwrap().contains("server s1") && transitions.first().unwrap().contains("event create")
    );
    assert!(transitions.last().unwrap().contains("creating_resources → ready"), "{text}");

    assert_eq!(v["operation"]["request_id"], id);
    assert_eq!(v["operation"]["outcome"], "success");
    assert_eq!(v["truncated"], false);
    let mut all = set(&RESOURCES);
    all.insert("s1".into());
    assert_eq!(keys(&v["entities"]), all, "{v}");
    let transitions = v["transitions"].as_array().unwrap();
    assert_eq!(transitions.len(), text.lines().skip_while(|l| !l.starts_with("transitions (")).count() - 1);
    for t in transitions {
        assert_eq!(t["request_id"], id, "{t}");
        assert!(t["machine"].is_string() && t["key"].is_string() && t["kind"].is_string(), "{t}");
    }
    let created: BTreeSet<String> =
        transitions.iter().filter(|t| t["kind"] == "create").map(|t| t["key"].as_str().unwrap().into()).collect();
    assert_eq!(created, set(&RESOURCES), "the resources the server created: {v}");
}

#[test]
fn op_and_related_on_the_database_and_over_http() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("settle.db");

    // A parent whose children nobody processes yet (`run --serve fanparent`): its
    // subscription waits, and `related` says how far it is.
    local(&db, &["--builtin", "create", "fanparent", "p", "--props", r#"{"children": 3}"#]);
    let go =
        json(&local(&db, &["raise", "fanparent", "p", "go", "--json"]))["request_id"].as_str().unwrap().to_string();
    local(&db, &["run", "--serve", "fanparent", "--until-idle"]);
    // The operation lists the children it created, though none processed an event yet.
    let op = json(&local(&db, &["op", &go, "--json"]));
    assert_eq!(keys(&op["entities"]), set(&["p", "p-0", "p-1", "p-2"]), "{op}");
    let text = local(&db, &["related", "fanparent", "p"]);
    assert!(text.starts_with("fanparent p: state waiting, run status active\n\npredecessors: none\n"), "{text}");
    assert!(text.contains("\nsuccessors (3):\nMACHINE "), "{text}");
    assert!(text.contains("\nfanchild     p-0 "), "{text}");
    assert!(
        text.ends_with(
            "\nsubscriptions in state waiting:\n  children_done  all(fanchild) in [done]: 0 of 3 selected satisfy; waiting\n"
        ),
        "{text}"
    );
    let v = json(&local(&db, &["related", "fanparent", "p", "--json"]));
    assert_eq!(v["entity"]["state"], "waiting");
    assert_eq!(keys(&v["successors"]), set(&["p-0", "p-1", "p-2"]));
    assert_eq!(v["predecessors"], serde_json::json!([]));
    assert_eq!(
        v["subscriptions"],
        serde_json::json!([{"event": "children_done", "pattern": "all(fanchild) in [done]", "selected": 3,
                            "satisfying": 0, "holds": false, "fired": false}])
    );
    let child = json(&local(&db, &["related", "fanchild", "p-1", "--json"]));
    assert_eq!(keys(&child["predecessors"]), set(&["p"]));
    assert_eq!(child["successors"], serde_json::json!([]));

    // Over HTTP, against the built-in machines: the server finishes the children, and a
    // `server`'s creation touches the server and the four resources it creates.
    let s = Served::start(&db, None, &[]);
    let run = |args: &[&str]| ok(s.settle(None, args), &format!("settle --server {args:?}"));
    wait_for(&s, "fanparent", "p", "done");
    let v = json(&run(&["related", "fanchild", "p-1", "--json"]));
    assert_eq!((v["entity"]["state"].as_str(), keys(&v["predecessors"])), (Some("done"), set(&["p"])));
    run(&["create", "server", "s1"]);
    let id = json(&run(&["raise", "server", "s1", "create", "--json"]))["request_id"].as_str().unwrap().to_string();
    wait_for(&s, "server", "s1", "ready");
    // The operation ends once every entity it reached is at rest.
    let deadline = Instant::now() + Duration::from_secs(30);
    while json(&run(&["op", &id, "--json"]))["operation"]["outcome"] != "success" {
        assert!(Instant::now() < deadline, "operation {id} never ended");
        std::thread::sleep(Duration::from_millis(100));
    }
    // Every read over HTTP prints JSON with `--json`, one object or one per line.
    let reads: [(&[&str], bool); 7] = [
        (&["list", "--json"], true),
        (&["get", "server", "s1", "--json"], false),
        (&["history", "server", "s1", "--json"], true),
        (&["ops", "--json"], true),
        (&["op", &id, "--json"], false),
        (&["related", "server", "s1", "--json"], false),
        (&["check", "server", "s1", "create", "--json"], false),
    ];
    for (args, lines) in reads {
        let out = s.settle(None, args);
        assert!(out.status.success() || args[0] == "check", "--server {args:?}: {}", stderr(&out));
        check_json(&format!("--server {args:?}"), &stdout(&out), lines);
    }
    let remote_op = (run(&["op", &id]), run(&["op", &id, "--json"]));
    assert_server_creation(&remote_op.0, &json(&remote_op.1), &id);
    let remote_related = [
        run(&["related", "server", "s1"]),
        run(&["related", "server", "s1", "--json"]),
        run(&["related", "database", "s1-database", "--json"]),
        run(&["related", "fanparent", "p"]),
    ];
    let v = json(&remote_related[1]);
    assert_eq!(keys(&v["successors"]), set(&RESOURCES), "{v}");
    assert!(
        remote_related[0]
            .starts_with("server s1: state ready, run status active\n\npredecessors: none\n\nsuccessors (4):\n")
    );
    assert!(remote_related[0].ends_with("\nsubscriptions in state ready: none\n"), "{}", remote_related[0]);
    assert_eq!(keys(&json(&remote_related[2])["predecessors"]), set(&["s1"]));
    // Unknown things: the server's problem, exit 1.
    let missing = s.settle(None, &["op", "no-such-request"]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(
        stderr(&missing).starts_with("error: 404: ") && stderr(&missing).contains("unknown-operation"),
        "{}",
        stderr(&missing)
    );
    let missing = s.settle(None, &["related", "server", "nope"]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(stderr(&missing).starts_with("error: 404: "), "{}", stderr(&missing));
    assert!(s.stop().success());

    // On the database: the same bytes.
    assert_eq!((local(&db, &["op", &id]), local(&db, &["op", &id, "--json"])), remote_op);
    let local_related = [
        local(&db, &["related", "server", "s1"]),
        local(&db, &["related", "server", "s1", "--json"]),
        local(&db, &["related", "database", "s1-database", "--json"]),
        local(&db, &["related", "fanparent", "p"]),
    ];
    assert_eq!(local_related, remote_related);
    let missing = settle(&db, &["op", "no-such-request"]);
    assert_eq!(
        (missing.status.code(), stderr(&missing).as_str()),
        (Some(1), "error: no operation with request id `no-such-request`\n")
    );
    let missing = settle(&db, &["related", "server", "nope"]);
    assert_eq!(missing.status.code(), Some(1), "{}", stderr(&missing));
}

#[test]
fn op_on_a_local_creation_lists_what_it_created() {
    let dir = tempfile::tempdir().unwrap();
    let (db, id) = provisioned(dir.path());
    let text = local(&db, &["op", &id]);
    assert_server_creation(&text, &json(&local(&db, &["op", &id, "--json"])), &id);
    // `related` from either side of the edge.
    let v = json(&local(&db, &["related", "server", "s1", "--json"]));
    assert_eq!(keys(&v["successors"]), set(&RESOURCES));
    for key in RESOURCES {
        let machine = key.trim_start_matches("s1-");
        let v = json(&local(&db, &["related", machine, key, "--json"]));
        assert_eq!((keys(&v["predecessors"]), v["entity"]["state"].as_str()), (set(&["s1"]), Some("ready")), "{v}");
    }
}

#[test]
fn the_demo_ends_quietly_when_nobody_reads_its_summary() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("demo.db");
    // Its standard output closed before it prints anything: `settle demo | head -0`.
    let mut child = Command::new(env!("CARGO_BIN_EXE_settle"))
        .args(["--db", db.to_str().unwrap(), "demo", "--servers", "3"])
        .env("SETTLE_LOG", "error")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start settle demo");
    drop(child.stdout.take());
    let mut err = String::new();
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    let status = child.wait().unwrap();
    assert!(!err.contains("panicked") && !err.contains("Broken pipe"), "{err}");
    assert!(status.success(), "{status:?}: {err}");
    // It ran to its end all the same.
    let listed = local(&db, &["list", "--machine", "server", "--json"]);
    assert_eq!(listed.lines().count(), 3, "{listed}");
}

#[test]
fn why_follows_a_failed_server_to_its_resource_on_the_database_and_over_http() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("settle.db");
    let demo = ["demo", "--servers", "12", "--fatal-rate", "0.5", "--seed", "3", "--fail-rate", "0"];
    local(&db, &demo);
    let failed = json_lines(&local(&db, &["list", "--machine", "server", "--state", "failed", "--json"]));
    assert!(!failed.is_empty(), "the seed fails some servers");
    let key = failed[0]["key"].as_str().unwrap().to_string();
    let text = local(&db, &["why", "server", &key]);
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with(&format!("server/{key}  (now failed, active, failing)")), "{text}");
    assert!(lines[1].starts_with("  failure: `resources_failed` fired: "), "{text}");
    assert!(lines[2].starts_with("  caused by ") && lines[2].contains(&format!("/{key}-")), "{text}");
    assert!(lines[3].starts_with("    failure: provider refused the request  ("), "{text}");
    let v = json(&local(&db, &["why", "server", &key, "--json"]));
    assert_eq!(v["failing"], true, "{v}");
    let chain = v["chain"].as_array().unwrap();
    assert_eq!((chain.len(), chain[1]["depth"].as_u64()), (2, Some(1)), "{v}");
    assert_eq!(chain[1]["details"], "provider refused the request");
    // A ready server has nothing to explain; an unknown one is an error.
    let ready = json_lines(&local(&db, &["list", "--machine", "server", "--state", "ready", "--json"]));
    let fine = ready[0]["key"].as_str().unwrap();
    assert!(local(&db, &["why", "server", fine]).contains("not failing: nothing to explain"));
    let missing = settle(&db, &["why", "server", "nobody"]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(stderr(&missing).contains("no entity `nobody` of machine `server`"), "{}", stderr(&missing));
    // Over HTTP, the same text.
    let s = Served::start(&db, None, &[]);
    assert_eq!(ok(s.settle(None, &["why", "server", &key]), "settle --server why"), text);
    let missing = s.settle(None, &["why", "server", "nobody"]);
    assert_eq!(missing.status.code(), Some(1));
    s.stop();
}

#[test]
fn bulk_dry_runs_then_runs_on_the_database_and_over_http() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("settle.db");
    local(&db, &["demo", "--servers", "12", "--fatal-rate", "0.5", "--seed", "3", "--fail-rate", "0"]);
    let failed = json_lines(&local(&db, &["list", "--machine", "server", "--state", "failed", "--json"])).len() as u64;
    let ready = json_lines(&local(&db, &["list", "--machine", "server", "--state", "ready", "--json"])).len() as u64;
    assert!(failed > 0 && ready > 0, "{failed} failed, {ready} ready");
    // On the database: a dry run counts and changes nothing; a run without a reason is
    // refused; with one, it runs to its end here.
    let kill = ["bulk", "run", "kill", "--machine", "server", "--health", "error"];
    let dry = json(&local(&db, &[&kill[..], &["--dry-run", "--json"]].concat()));
    assert_eq!((dry["count"].as_u64(), dry["filter"]["health"].as_str()), (Some(failed), Some("error")), "{dry}");
    let text = local(&db, &[&kill[..], &["--dry-run"]].concat());
    assert!(
        text.starts_with(&format!("dry run: {failed} entities match machine=server health=error; nothing done\n")),
        "{text}"
    );
    let refused = settle(&db, &kill);
    assert_eq!(refused.status.code(), Some(1));
    assert!(stderr(&refused).contains("reason: say why"), "{}", stderr(&refused));
    let out = local(&db, &[&kill[..], &["--reason", "clear the failed", "--request-id", "clear-1"]].concat());
    assert!(
        out.starts_with(&format!(
            "bulk clear-1: kill on machine=server health=error — done: {failed} of {failed} done, 0 failed"
        )),
        "{out}"
    );
    let killed = json_lines(&local(&db, &["list", "--machine", "server", "--status", "killed", "--json"]));
    assert_eq!(killed.len() as u64, failed);
    // The reason travels with each command: in every killed server's history.
    let last_command = |history: &str| -> String {
        let rows = json_lines(history);
        rows.iter().rev().find(|h| h["kind"] == "command").unwrap()["detail"].as_str().unwrap().to_string()
    };
    let key = killed[0]["key"].as_str().unwrap().to_string();
    assert_eq!(last_command(&local(&db, &["history", "server", &key, "--json"])), "kill: clear the failed");
    // One entity's command with a reason, here and over HTTP below.
    let ready_key = json_lines(&local(&db, &["list", "--machine", "server", "--state", "ready", "--json"]))[0]["key"]
        .as_str()
        .unwrap()
        .to_string();
    local(&db, &["pause", "server", &ready_key, "--reason", "looking into it"]);
    assert_eq!(last_command(&local(&db, &["history", "server", &ready_key, "--json"])), "pause: looking into it");
    // Over HTTP: the server runs it, this process follows it.
    let s = Served::start(&db, None, &[]);
    let run = |args: &[&str]| ok(s.settle(None, args), &format!("settle --server {args:?}"));
    run(&["resume", "server", &ready_key, "--reason", "all clear"]);
    assert_eq!(last_command(&run(&["history", "server", &ready_key, "--json"])), "resume: all clear");
    let pause = [
        "bulk",
        "run",
        "pause",
        "--machine",
        "server",
        "--state",
        "ready",
        "--reason",
        "freeze",
        "--request-id",
        "freeze-1",
        "--json",
    ];
    let b = json(&run(&pause));
    assert_eq!(
        (b["status"].as_str(), b["done"].as_u64(), b["reason"].as_str()),
        (Some("done"), Some(ready), Some("freeze")),
        "{b}"
    );
    let listed = json_lines(&run(&["bulk", "list", "--json"]));
    let ids: Vec<&str> = listed.iter().map(|b| b["request_id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["freeze-1", "clear-1"]);
    assert!(run(&["bulk", "show", "clear-1"]).contains("reason: clear the failed"));
    assert_eq!(json(&run(&["bulk", "cancel", "freeze-1", "--json"]))["status"], "done", "an ended one stays");
    let missing = s.settle(None, &["bulk", "show", "nobody"]);
    assert_eq!(missing.status.code(), Some(1));
    s.stop();
}

#[test]
fn lists_and_bulk_operations_narrow_by_expression_error_text_and_time() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("settle.db");
    local(&db, &["demo", "--servers", "12", "--fatal-rate", "0.5", "--seed", "3", "--fail-rate", "0"]);
    let servers = json_lines(&local(&db, &["list", "--machine", "server", "--json"]));
    let keys = |rows: &[serde_json::Value]| -> Vec<String> {
        rows.iter().map(|e| e["key"].as_str().unwrap().to_string()).collect()
    };
    let gave_up: Vec<String> =
        keys(&servers.iter().filter(|e| e["properties"]["reason"] == "resources failed").cloned().collect::<Vec<_>>());
    assert!(!gave_up.is_empty() && gave_up.len() < servers.len(), "{gave_up:?}");
    let expr = r#"has(props.reason) && props.reason == "resources failed""#;
    let listed =
        |args: &[&str]| keys(&json_lines(&local(&db, &[&["list", "--machine", "server", "--json"], args].concat())));
    assert_eq!(listed(&["--where", expr]), gave_up);
    // The parent's failure names the child's: its newest error says so.
    assert_eq!(listed(&["--error", "RESOURCES_FAILED"]), gave_up);
    assert_eq!(listed(&["--created-after", "-1h"]).len(), servers.len());
    assert!(listed(&["--entered-before", "2000-01-01T00:00:00Z"]).is_empty());
    let bad = settle(&db, &["list", "--where", "props.x =="]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(stderr(&bad).contains("--where: syntax error"), "{}", stderr(&bad));
    let bad = settle(&db, &["list", "--entered-before", "soon"]);
    assert!(stderr(&bad).contains("--entered-before: invalid time `soon`"), "{}", stderr(&bad));
    // A bulk dry run by the same expression counts the same entities and echoes it.
    let dry =
        json(&local(&db, &["bulk", "run", "pause", "--machine", "server", "--where", expr, "--dry-run", "--json"]));
    assert_eq!((dry["count"].as_u64(), dry["filter"]["where"].as_str()), (Some(gave_up.len() as u64), Some(expr)));
    // Over HTTP: the same lists.
    let s = Served::start(&db, None, &[]);
    let remote = |args: &[&str]| {
        let out =
            ok(s.settle(None, &[&["list", "--machine", "server", "--json"], args].concat()), "settle --server list");
        keys(&json_lines(&out))
    };
    assert_eq!(remote(&["--where", expr]), gave_up);
    assert_eq!(remote(&["--error", "resources_failed", "--created-after", "-1h"]), gave_up);
    let bad = s.settle(None, &["list", "--where", "props.x =="]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(stderr(&bad).contains("where: syntax error"), "{}", stderr(&bad));
    s.stop();
}
