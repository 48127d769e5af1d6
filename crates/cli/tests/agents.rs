//! End to end, external agents over real HTTP (DESIGN §5): the reference scenario through
//! `settle serve` and `settle agent` processes; a late report refused; the task of an agent
//! killed with `kill -9` mid-task offered again once its lock runs out.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;
use settle_client::Client;
use settle_store::{EntityFilter, HistoryKind, SqliteStore, Store, TaskFilter};

/// The example agent-provisioned machine, with a 1 s lock so that expiry is quick.
fn vm_toml() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/agents/vm.toml");
    let text = std::fs::read_to_string(path).expect("examples/agents/vm.toml");
    assert!(text.contains("lock = \"30s\""), "the example's lock changed; adjust this test");
    text.replace("lock = \"30s\"", "lock = \"1s\"")
}

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `settle serve` on `db` with the TOML machines in `machines`; answers its base URL.
fn serve(db: &Path, machines: &Path) -> (Proc, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_settle"))
        .arg("--db")
        .arg(db)
        .args(["serve", "--listen", "127.0.0.1:0", "--machines"])
        .arg(machines)
        .env("SETTLE_LOG", "error")
        .env_remove("SETTLE_TOKENS")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start settle serve");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let addr = line.trim().strip_prefix("listening on ").unwrap_or_else(|| panic!("not listening: {line:?}"));
    let url = addr.to_string();
    (Proc(child), url)
}

async fn tasks(db: &Path) -> Vec<settle_store::AgentTask> {
    SqliteStore::open_read_only(db).unwrap().task_list(TaskFilter::default()).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_agents_task_is_offered_again_and_a_late_report_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let machines = dir.path().join("machines");
    std::fs::create_dir(&machines).unwrap();
    std::fs::write(machines.join("vm.toml"), vm_toml()).unwrap();
    let db = dir.path().join("agents.db");
    let (_server, url) = serve(&db, &machines);
    let client = Client::new(&url).unwrap();
    client.create("vm", "a", json!({}), None).await.unwrap();
    client.raise("vm", "a", "create", json!({}), None, None).await.unwrap();

    // An agent whose provider call takes "forever" leases the task, heartbeats, and dies.
    let doomed = Proc(
        Command::new(env!("CARGO_BIN_EXE_settle"))
            .args(["agent", "--server", &url, "--queue", "cloud", "--name", "doomed", "--concurrency", "1"])
            .args(["--min-latency-ms", "600000", "--max-latency-ms", "600000", "--fail-rate", "0"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start settle agent"),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    let first = loop {
        let leased: Vec<_> = tasks(&db).await.into_iter().filter(|t| t.status == "leased").collect();
        if let Some(t) = leased.into_iter().next() {
            break t;
        }
        assert!(Instant::now() < deadline, "the agent never leased the task");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!((first.agent.as_deref(), first.attempt), (Some("doomed"), 1));
    // It heartbeats while alive: the lease outlives its 1 s lock.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert!(client.lease("cloud", "me", 1, Duration::ZERO).await.unwrap().is_empty(), "still held by a live agent");
    common::kill_9(doomed.0.id());

    // Once its lock runs out the task is offered again: same task, next attempt.
    let mut again = client.lease("cloud", "me", 1, Duration::from_secs(10)).await.unwrap();
    assert_eq!(again.len(), 1, "the dead agent's task is offered again");
    let second = again.remove(0);
    assert_eq!((second.id, second.attempt), (first.id, 2));
    assert_eq!(second.targets, ["ready", "broken"]);

    // A report after the lock ran out is refused and changes nothing.
    tokio::time::sleep(Duration::from_millis(1_300)).await;
    let late = client.complete(&second, "ready", json!({"ip": "10.0.0.1"})).await.unwrap_err();
    assert_eq!((late.status(), late.problem_kind()), (Some(409), Some("task-refused")), "{late}");
    let e = client.entity("vm", "a").await.unwrap();
    assert_eq!((e.state.as_str(), e.properties.get("ip")), ("provisioning", None));

    // A target the action does not declare is refused too.
    let third = client.lease("cloud", "me", 1, Duration::from_secs(10)).await.unwrap().remove(0);
    assert_eq!(third.attempt, 3);
    let bad = client.complete(&third, "new", json!({})).await.unwrap_err();
    assert_eq!((bad.status(), bad.problem_kind()), (Some(422), Some("invalid-report")), "{bad}");
    // The live lease reports: the entity moves.
    client.heartbeat(&third).await.unwrap();
    client.complete(&third, "ready", json!({"ip": "10.0.0.2"})).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let e = client.entity("vm", "a").await.unwrap();
        if e.state == "ready" {
            assert_eq!(e.properties.get("ip"), Some(&json!("10.0.0.2")));
            break;
        }
        assert!(Instant::now() < deadline, "the report was not committed: {e:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Reported again with its token (an answer lost on the way, say): a replay, accepted,
    // and nothing changes; with the token of an earlier lease: refused.
    client.complete(&third, "ready", json!({"ip": "x"})).await.unwrap();
    let stale = client.complete(&second, "ready", json!({"ip": "y"})).await.unwrap_err();
    assert_eq!(stale.problem_kind(), Some("task-refused"), "{stale}");
    assert_eq!(client.entity("vm", "a").await.unwrap().properties.get("ip"), Some(&json!("10.0.0.2")));
    let history = client.history("vm", "a").await.unwrap();
    let last = history.last().unwrap();
    assert_eq!(
        (last.kind.as_str(), last.action.as_deref(), last.to.as_deref()),
        ("auto", Some("provision"), Some("ready"))
    );
}

#[test]
fn the_scenario_runs_through_the_server_and_agent_processes() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("demo.db");
    let out = common::settle(&db, &["demo", "--agents", "2", "--servers", "30", "--fail-rate", "0.2", "--seed", "7"]);
    let (stdout, stderr) = (common::stdout(&out), common::stderr(&out));
    assert!(out.status.success(), "demo failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("servers by state: ready 30"), "{stdout}");
    assert!(stderr.contains("agent 1 started") && stderr.contains("agent 2 started"), "{stderr}");

    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let store = SqliteStore::open_read_only(&db).unwrap();
        let all = store.entity_list(EntityFilter::default()).await.unwrap();
        let servers: Vec<_> = all.iter().filter(|e| e.machine == "server").collect();
        assert_eq!(servers.len(), 30);
        assert!(servers.iter().all(|e| e.state == "ready" && e.properties.contains_key("endpoint")));
        let resources: Vec<_> = all.iter().filter(|e| e.machine != "server").collect();
        assert_eq!(resources.len(), 120);
        for e in &resources {
            assert_eq!(e.state, "ready", "{} {}", e.machine, e.key);
            let history = store.history_list(e.id).await.unwrap();
            let entries: Vec<_> = history.iter().filter(|h| h.to.is_some()).collect();
            for pair in entries.windows(2) {
                assert_eq!(pair[1].from, pair[0].to, "{} {}: history chain broken", e.machine, e.key);
            }
            // Provisioned by an agent: the auto action `provision` moved it to `provisioned`.
            assert!(
                entries.iter().any(|h| h.kind == HistoryKind::Auto
                    && h.action.as_deref() == Some("provision")
                    && h.to.as_deref() == Some("provisioned")),
                "{} {}: {entries:?}",
                e.machine,
                e.key
            );
        }
        let open = store.task_list(TaskFilter { open_only: true, ..TaskFilter::default() }).await.unwrap();
        assert!(open.is_empty(), "tasks left open: {open:?}");
        let done = store.task_list(TaskFilter::default()).await.unwrap();
        assert!(done.iter().filter(|t| t.outcome.as_deref() == Some("complete")).count() >= 120);
        assert!(done.iter().any(|t| t.outcome.as_deref() == Some("fail")), "transient failures were injected");
    });
}
