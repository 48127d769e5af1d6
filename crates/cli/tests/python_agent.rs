//! Agents in any language (DESIGN §5): the standard-library Python agent
//! `examples/agents/python/settle_agent.py` serves queue `provider` of a `settle serve`
//! running the shipped example machines (`examples/machines`, as they are), and the test
//! drives an entity of each machine through its lifecycle over HTTP to its final state.
//!
//! Skipped (with a note) when `python3` is not on PATH, unless `CI` is set.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{python3, repo};
use serde_json::{Value, json};
use settle_store::{SqliteStore, Store, TaskFilter};

/// The name the agent leases under (recorded with every task it leases).
const AGENT: &str = "python-test-agent";

/// The Python agent as a child process; its standard error is collected on a thread.
/// Killed (and reaped) when dropped, so a failing test leaves no process behind.
struct PyAgent {
    child: Child,
    log: Arc<Mutex<String>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl PyAgent {
    fn start(args: &[&str]) -> PyAgent {
        let mut child = Command::new("python3")
            .arg(repo().join("examples/agents/python/settle_agent.py"))
            .args(args)
            .env_remove("SETTLE_SERVER")
            .env_remove("SETTLE_TOKEN")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the python agent");
        let log = Arc::new(Mutex::new(String::new()));
        let (stderr, sink) = (child.stderr.take().unwrap(), log.clone());
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let mut log = sink.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        });
        PyAgent { child, log, reader: Some(reader) }
    }

    fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Waits up to `limit` for the agent to exit by itself: its status and whole log.
    fn wait_exit(&mut self, limit: Duration) -> (std::process::ExitStatus, String) {
        let deadline = Instant::now() + limit;
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            assert!(Instant::now() < deadline, "the agent did not exit within {limit:?}:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(20));
        };
        if let Some(r) = self.reader.take() {
            r.join().unwrap();
        }
        (status, self.log())
    }
}

impl Drop for PyAgent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The API of one `settle serve`, at `addr` (`127.0.0.1:PORT`).
struct Api<'a> {
    addr: &'a str,
    agent: &'a PyAgent,
}

impl Api<'_> {
    fn entity_path(machine: &str, key: &str) -> String {
        format!("/v1/machines/{machine}/entities/{key}")
    }

    fn create(&self, machine: &str, key: &str, properties: Value) {
        let body = json!({"key": key, "properties": properties}).to_string();
        let (status, v) = common::http(self.addr, "POST", &format!("/v1/machines/{machine}/entities"), Some(&body));
        assert_eq!(status, 201, "create {machine} {key}: {v}");
    }

    /// Raises `event`, queued (202): the entity gets to it in its own time.
    fn raise(&self, machine: &str, key: &str, event: &str, params: Value) {
        let path = format!("{}/events/{event}", Self::entity_path(machine, key));
        let (status, v) = common::http(self.addr, "POST", &path, Some(&params.to_string()));
        assert_eq!(status, 202, "raise {event} on {machine} {key}: {v}");
    }

    /// Raises `event` and waits until the entity is at rest (for the machines whose actions
    /// all run in the engine): the status and the answer.
    fn raise_wait(&self, machine: &str, key: &str, event: &str, params: Value) -> (u16, Value) {
        let path = format!("{}/events/{event}?wait=stable&timeout=20s", Self::entity_path(machine, key));
        common::http(self.addr, "POST", &path, Some(&params.to_string()))
    }

    /// [`Api::raise_wait`] that must land in `state`: the entity afterwards.
    fn step(&self, machine: &str, key: &str, event: &str, params: Value, state: &str) -> Value {
        let (status, v) = self.raise_wait(machine, key, event, params);
        assert_eq!(status, 200, "{event} on {machine} {key}: {v}");
        assert_eq!(v["entity"]["state"], state, "{event} on {machine} {key}: {v}");
        v["entity"].clone()
    }

    /// The entity (200), or the problem (410 once deleted).
    fn get(&self, machine: &str, key: &str) -> (u16, Value) {
        common::http(self.addr, "GET", &Self::entity_path(machine, key), None)
    }

    fn version(&self, machine: &str, key: &str) -> i64 {
        let (status, v) = self.get(machine, key);
        assert_eq!(status, 200, "{machine} {key}: {v}");
        v["version"].as_i64().unwrap()
    }

    /// Polls until the entity is in `state` at a version above `after` (`gone`: deleted,
    /// 410), at rest, within `deadline`; answers the entity (or the 410 problem).
    fn wait_for(&self, machine: &str, key: &str, state: &str, after: i64, deadline: Instant) -> Value {
        loop {
            let (status, v) = self.get(machine, key);
            if state == "gone" && status == 410 {
                assert_eq!(v["state"], "gone", "{machine} {key}: {v}");
                return v;
            }
            assert_eq!(status, 200, "{machine} {key}: {v}");
            assert!(
                !matches!(v["run_status"].as_str(), Some("failed" | "killed")),
                "{machine} {key} was parked on the way to {state}: {v}\nagent:\n{}",
                self.agent.log()
            );
            let at_rest = v["inbox"].as_array().is_none_or(Vec::is_empty);
            if v["state"] == state && v["version"].as_i64().unwrap() > after && at_rest {
                return v;
            }
            assert!(
                Instant::now() < deadline,
                "{machine} {key} did not reach {state}: {v}\nagent:\n{}",
                self.agent.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The entity's history (also readable once it is deleted), oldest first.
    fn history(&self, machine: &str, key: &str) -> Vec<Value> {
        let (status, v) = common::http(self.addr, "GET", &format!("{}/history", Self::entity_path(machine, key)), None);
        assert_eq!(status, 200, "history of {machine} {key}: {v}");
        let items = if v.is_array() { v } else { v["items"].clone() };
        items.as_array().cloned().unwrap_or_default()
    }

    /// The auto actions that moved the entity, in order: `action -> to`, without faults.
    fn auto_steps(&self, machine: &str, key: &str) -> Vec<String> {
        let history = self.history(machine, key);
        let entries: Vec<_> = history.iter().filter(|h| !h["to"].is_null()).collect();
        for pair in entries.windows(2) {
            assert_eq!(pair[1]["from"], pair[0]["to"], "{machine} {key}: history chain broken: {history:?}");
        }
        entries
            .into_iter()
            .filter(|h| h["kind"] == "auto")
            .map(|h| format!("{} -> {}", h["action"].as_str().unwrap(), h["to"].as_str().unwrap()))
            .collect()
    }
}

#[test]
fn the_python_agent_drives_the_example_machines_to_their_final_states() {
    if !python3() {
        return;
    }
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("python-agent.db");
    let machines = repo().join("examples/machines");
    let (_server, addr) =
        common::spawn_server(db.to_str().unwrap(), &["--machines", machines.to_str().unwrap(), "--max-wait", "30s"]);
    let url = format!("http://{addr}");
    // Short provider calls, some transient failures (retried by the machines' fault
    // policies; the seed makes which ones fail the same on every run), short polls so
    // that SIGTERM is quick.
    let mut agent = PyAgent::start(&[
        "--server",
        &url,
        "--queue",
        "provider",
        "--name",
        AGENT,
        "--concurrency",
        "4",
        "--fail-rate",
        "0.15",
        "--seed",
        "2",
        "--min-latency-ms",
        "10",
        "--max-latency-ms",
        "60",
        "--poll-wait",
        "1",
    ]);
    let api = Api { addr: &addr, agent: &agent };
    let deadline = Instant::now() + Duration::from_secs(60);

    // server (agent actions create_server, provision, configure, delete_server):
    // srv-1 new → … → ready → deleting → gone; srv-2 new → … → ready, resized → ready.
    // logical_server (agent: create_resources, undo): new → creating → awaiting_resources.
    // Served from TOML nothing creates its resources, so it can only give up: its timeout
    // event, raised here, → failed → undo → gone.
    // cluster and replica: declarative actions only, no agent.
    for key in ["srv-1", "srv-2"] {
        api.create("server", key, json!({}));
        api.raise("server", key, "create", json!({"region": "eu-west", "size": "small"}));
    }
    api.create("logical_server", "ls-1", json!({}));
    api.raise("logical_server", "ls-1", "create", json!({}));
    api.create("cluster", "db-1", json!({"max_replicas": 3}));
    api.create("replica", "db-1-r1", json!({}));

    // The declarative machines meanwhile, each step waited for by the server.
    let c = api.step("cluster", "db-1", "create", json!({}), "serving");
    assert_eq!(c["properties"]["endpoint"], "db.internal:5432", "on_entry of `online`: {c}");
    let c = api.step("cluster", "db-1", "resize", json!({"replicas": 2}), "serving");
    assert_eq!(c["properties"]["resized"], true, "on_entry_from.resize of `scaling`: {c}");
    let (status, refused) = api.raise_wait("cluster", "db-1", "resize", json!({"replicas": 9}));
    assert_eq!(status, 409, "a resize beyond max_replicas is rejected by its guard: {refused}");
    api.step("cluster", "db-1", "maintain", json!({}), "patching");
    let c = api.step("cluster", "db-1", "heartbeat", json!({}), "patching");
    assert_eq!(c["properties"]["last_seen"], "heartbeat", "an internal transition: {c}");
    api.step("cluster", "db-1", "patched", json!({}), "serving");
    let c = api.step("cluster", "db-1", "stop", json!({}), "stopped");
    assert!(c["properties"].get("endpoint").is_none(), "on_exit of `online` unsets it: {c}");
    api.step("cluster", "db-1", "stop", json!({}), "stopped"); // ignored there, not rejected
    let (status, gone) = api.raise_wait("cluster", "db-1", "delete", json!({}));
    assert_eq!((status, &gone["entity"]["state"]), (200, &json!("gone")), "{gone}");
    assert_eq!(api.get("cluster", "db-1").0, 410);

    api.step("replica", "db-1-r1", "ready", json!({}), "syncing");
    api.step("replica", "db-1-r1", "synced", json!({}), "current");
    api.step("replica", "db-1-r1", "pause", json!({}), "paused");
    api.step("replica", "db-1-r1", "resume", json!({}), "syncing");
    let r = api.step("replica", "db-1-r1", "synced", json!({}), "current");
    assert_eq!(r["run_status"], "active", "{r}");

    // The agent's machines: provisioned by the Python agent.
    for key in ["srv-1", "srv-2"] {
        let s = api.wait_for("server", key, "ready", 0, deadline);
        let endpoint = s["properties"]["endpoint"].as_str().unwrap_or_default();
        assert!(endpoint.ends_with(".example.internal:443"), "`ready` requires an endpoint, the agent sets it: {s}");
    }
    api.wait_for("logical_server", "ls-1", "awaiting_resources", 0, deadline);

    let v = api.version("server", "srv-2");
    api.raise("server", "srv-2", "resize", json!({"size": "large"}));
    api.raise("server", "srv-1", "delete", json!({}));
    api.raise("logical_server", "ls-1", "resources_timeout", json!({}));
    let srv2 = api.wait_for("server", "srv-2", "ready", v, deadline);
    api.wait_for("server", "srv-1", "gone", 0, deadline);
    api.wait_for("logical_server", "ls-1", "gone", 0, deadline);

    // Every provider call was the agent's, each state in order.
    let provisioned = ["create_server -> provisioning", "provision -> configuring", "configure -> ready"];
    let mut srv1 = provisioned.to_vec();
    srv1.push("delete_server -> gone");
    assert_eq!(api.auto_steps("server", "srv-1"), srv1);
    let mut srv2_steps = provisioned.to_vec();
    srv2_steps.extend(["provision -> configuring", "configure -> ready"]);
    assert_eq!(api.auto_steps("server", "srv-2"), srv2_steps, "{srv2}");
    assert_eq!(api.auto_steps("logical_server", "ls-1"), ["create_resources -> awaiting_resources", "undo -> gone"]);

    // The tasks: all leased by the Python agent and finished; one completion per step.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let tasks = rt
        .block_on(async { SqliteStore::open_read_only(&db).unwrap().task_list(TaskFilter::default()).await.unwrap() });
    let log = agent.log();
    for t in &tasks {
        assert_eq!(t.agent.as_deref(), Some(AGENT), "{t:?}\n{log}");
        assert_eq!(t.status, "done", "{t:?}\n{log}");
    }
    let completed: Vec<_> = tasks.iter().filter(|t| t.outcome.as_deref() == Some("complete")).collect();
    assert_eq!(completed.len(), srv1.len() + srv2_steps.len() + 2, "{tasks:?}\n{log}");
    let failed = tasks.iter().filter(|t| t.outcome.as_deref() == Some("fail")).count();
    // Its log has one line per task, naming it; failures show in the histories as faults
    // naming the agent.
    for t in &tasks {
        let line = format!("task {} {}/{} {} (attempt {}): ", t.id, t.machine, t.key, t.action, t.attempt);
        assert!(log.contains(&line), "no line `{line}` in the agent's log:\n{log}");
    }
    assert_eq!(log.matches(": complete -> ").count(), completed.len(), "{log}");
    assert_eq!(log.matches(": fail, retryable").count(), failed, "{log}");
    let faults: usize = [("server", "srv-1"), ("server", "srv-2"), ("logical_server", "ls-1")]
        .iter()
        .map(|(m, k)| {
            let h = api.history(m, k);
            h.iter()
                .filter(|h| h["kind"] == "fault")
                .inspect(|h| assert!(h["detail"].as_str().unwrap_or_default().contains(AGENT), "{h}"))
                .count()
        })
        .sum();
    assert_eq!(faults, failed, "every failure reported is a fault of its entity");
    assert!(failed > 0, "seed 2 injects transient failures; the retry path went untested:\n{log}");

    // SIGTERM: it stops leasing, finishes, and exits 0.
    let ok = Command::new("kill").args(["-TERM", &agent.child.id().to_string()]).status().unwrap().success();
    assert!(ok, "kill -TERM failed");
    let (status, log) = agent.wait_exit(Duration::from_secs(10));
    assert!(status.success(), "the agent exited with {status}:\n{log}");
    assert!(log.contains("SIGTERM: stopping") && log.contains(&format!("agent {AGENT} stopped")), "{log}");
    println!("python agent: {} tasks ({failed} transient failures) in {:?}", tasks.len(), started.elapsed());
}

#[test]
fn the_python_agent_heartbeats_through_a_short_lock_and_reports_what_the_target_requires() {
    if !python3() {
        return;
    }
    // examples/agents/vm.toml (queue `cloud`; `ready` requires `ip`) with a 1 s lock, and
    // provider calls of 1.5 s: only heartbeats keep the leases alive until the reports.
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(repo().join("examples/agents/vm.toml")).expect("examples/agents/vm.toml");
    assert!(text.contains("lock = \"30s\""), "the example's lock changed; adjust this test");
    let machines = common::write_machines(dir.path(), &[("vm.toml", &text.replace("lock = \"30s\"", "lock = \"1s\""))]);
    let db = dir.path().join("vm.db");
    let (_server, addr) = common::spawn_server(db.to_str().unwrap(), &["--machines", machines.to_str().unwrap()]);
    let url = format!("http://{addr}");
    let mut agent = PyAgent::start(&[
        "--server",
        &url,
        "--queue",
        "cloud",
        "--name",
        AGENT,
        "--min-latency-ms",
        "1500",
        "--max-latency-ms",
        "1500",
        "--poll-wait",
        "1",
    ]);
    let api = Api { addr: &addr, agent: &agent };
    let deadline = Instant::now() + Duration::from_secs(30);
    api.create("vm", "web-1", json!({}));
    api.raise("vm", "web-1", "create", json!({}));
    let vm = api.wait_for("vm", "web-1", "ready", 0, deadline);
    let ip = vm["properties"]["ip"].as_str().unwrap_or_default();
    assert!(ip.starts_with("10.") && ip.split('.').count() == 4, "`ready` requires an ip: {vm}");
    api.raise("vm", "web-1", "delete", json!({}));
    api.wait_for("vm", "web-1", "gone", 0, deadline);
    assert_eq!(api.auto_steps("vm", "web-1"), ["provision -> ready", "deprovision -> gone"]);

    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let tasks = rt
        .block_on(async { SqliteStore::open_read_only(&db).unwrap().task_list(TaskFilter::default()).await.unwrap() });
    assert_eq!(tasks.len(), 2, "{tasks:?}");
    for t in &tasks {
        // Leased once and completed 1.5 s later: the lease outlived its 1 s lock.
        assert_eq!((t.attempt, t.outcome.as_deref(), t.agent.as_deref()), (1, Some("complete"), Some(AGENT)), "{t:?}");
    }
    let ok = Command::new("kill").args(["-INT", &agent.child.id().to_string()]).status().unwrap().success();
    assert!(ok, "kill -INT failed");
    let (status, log) = agent.wait_exit(Duration::from_secs(10));
    assert!(status.success(), "the agent exited with {status}:\n{log}");
    assert!(!log.contains("lease lost") && log.contains("SIGINT: stopping"), "{log}");
}

#[test]
fn the_python_agent_waits_for_an_unreachable_server_and_exits_once_idle() {
    if !python3() {
        return;
    }
    // A port nobody listens on: bound, then released.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let url = format!("http://127.0.0.1:{port}");
    let mut agent = PyAgent::start(&["--server", &url, "--once-idle-for", "1.5", "--poll-wait", "1"]);
    let (status, log) = agent.wait_exit(Duration::from_secs(20));
    assert!(status.success(), "exit {status}:\n{log}");
    assert!(log.contains("server unreachable") && log.contains("retrying in"), "{log}");
    assert!(log.contains("no task for 1.5s: stopping"), "{log}");
}
