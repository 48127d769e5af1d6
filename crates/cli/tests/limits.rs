//! Flow control as a user drives it: `settle limits` and `settle get` show what a limit
//! holds back, on the database and over `--server`.
//!
//! A concurrency limit (of actions, and of workflows) holds through `kill -9`: engine
//! processes are killed and restarted
//! while agents work through a backlog, and some agents die mid-call (their tasks are
//! offered again when their lock runs out). A fake provider counts the calls running per
//! region: it never sees more than the limit, and the limit binds. On SQLite one
//! `settle serve` is killed and restarted; on PostgreSQL (`SETTLE_TEST_PG`) three
//! `settle run` workers beside the server are, each restarted.

mod common;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Proc, kill_9, spawn_server, spawn_settle, write_machines};

const REGIONS: [&str; 3] = ["eu", "us", "ap"];
const MAX: u32 = 2;
const ENTITIES: usize = 150;
const AGENTS: usize = 8;

const VM: &str = r#"initial = "new"
properties = ["region"]
[states.new]
[states.provisioning]
auto = "provision"
[states.ready]
[events.create]
in = ["new"]
action = "begin"
[actions.begin]
to = ["provisioning"]
[actions.provision]
agent = "cloud"
lock = "1s"
to = ["ready"]
[limits.provider_calls]
states = ["provisioning"]
max = 2
key = "props.region"
"#;

/// `vm` with a limit of workflows instead: at most 2 of its `create` workflows open per
/// region (from the event until the vm is `ready`), so at most 2 calls per region too.
fn vm_of_workflows() -> String {
    VM.replace("states = [\"provisioning\"]\nmax = 2", "events = [\"create\"]\nmax = 2")
}

/// The calls running per region now, and the most ever seen at once.
#[derive(Default)]
struct Provider {
    now: HashMap<String, u32>,
    most: HashMap<String, u32>,
}

impl Provider {
    fn start(&mut self, region: &str) {
        let n = self.now.entry(region.to_string()).or_default();
        *n += 1;
        let n = *n;
        let most = self.most.entry(region.to_string()).or_default();
        *most = (*most).max(n);
    }

    fn end(&mut self, region: &str) {
        *self.now.get_mut(region).expect("a call ends after it starts") -= 1;
    }
}

/// One request to `addr`; `None` when the server is not there (killed, restarting).
fn http(addr: &str, method: &str, path: &str, body: &str) -> Option<(u16, serde_json::Value)> {
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).ok()?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).ok()?;
    let text = String::from_utf8_lossy(&raw);
    let status = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or_default();
    Some((status, serde_json::from_str(body).unwrap_or(serde_json::Value::Null)))
}

/// An agent: leases one task at a time, calls the provider for 10–40 ms, and reports; one
/// call in eight it dies mid-call instead (the call ends with it; the task is not reported).
fn agent(
    n: usize,
    addr: Arc<Mutex<String>>,
    provider: Arc<Mutex<Provider>>,
    stop: Arc<AtomicBool>,
    died: Arc<AtomicU64>,
) {
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64 ^ (n as u64 + 1);
    let mut rand = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    while !stop.load(Ordering::Relaxed) {
        let at = addr.lock().unwrap().clone();
        let body = format!(r#"{{"agent": "agent-{n}", "max": 1, "wait_ms": 200}}"#);
        let Some((200, leased)) = http(&at, "POST", "/v1/queues/cloud/lease", &body) else {
            std::thread::sleep(Duration::from_millis(20));
            continue;
        };
        for t in leased["tasks"].as_array().into_iter().flatten() {
            let region = t["properties"]["region"].as_str().unwrap().to_string();
            provider.lock().unwrap().start(&region);
            std::thread::sleep(Duration::from_millis(10 + rand() % 30));
            provider.lock().unwrap().end(&region);
            if rand() % 8 == 0 {
                died.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let body = format!(r#"{{"token": {}, "target": "ready"}}"#, t["token"]);
            // A report the server did not take (killed meanwhile) is offered again.
            let _ = http(&at, "POST", &format!("/v1/tasks/{}/complete", t["id"]), &body);
        }
    }
}

/// Runs the backlog on `db` while `kill` kills and restarts processes; checks the
/// provider's counts.
fn run(db: &str, workers: usize, vm: &str) {
    let dir = tempfile::tempdir().unwrap();
    let machines = write_machines(dir.path(), &[("vm.toml", vm)]);
    let machines = machines.to_str().unwrap().to_string();
    let (server, at) = spawn_server(db, &["--machines", &machines]);
    let mut server = Some(server);
    let addr = Arc::new(Mutex::new(at.clone()));
    let worker = || spawn_settle(db, &["--machines", &machines, "run"]);
    let mut pool: Vec<Proc> = (0..workers).map(|_| worker()).collect();
    for i in 0..ENTITIES {
        let region = REGIONS[i % REGIONS.len()];
        let body = format!(r#"{{"key": "vm-{i}", "properties": {{"region": "{region}"}}}}"#);
        assert_eq!(http(&at, "POST", "/v1/machines/vm/entities", &body).unwrap().0, 201);
        assert_eq!(http(&at, "POST", &format!("/v1/machines/vm/entities/vm-{i}/events/create"), "{}").unwrap().0, 202);
    }
    let (provider, stop, died): (Arc<Mutex<Provider>>, _, _) =
        (Arc::default(), Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
    let agents: Vec<_> = (0..AGENTS)
        .map(|n| {
            let (addr, provider, stop, died) = (addr.clone(), provider.clone(), stop.clone(), died.clone());
            std::thread::spawn(move || agent(n, addr, provider, stop, died))
        })
        .collect();
    // Kill engine processes while the agents work: on PostgreSQL each worker in turn, on
    // SQLite the server itself (its agents wait for the new one).
    let mut kills = 0;
    for round in 0..3 {
        std::thread::sleep(Duration::from_millis(400 + 200 * round));
        if workers > 0 {
            let i = round as usize % workers;
            kill_9(pool[i].0.id());
            pool[i] = worker();
        } else {
            let old = server.take().unwrap();
            kill_9(old.0.id());
            drop(old);
            let (s, at) = spawn_server(db, &["--machines", &machines]);
            *addr.lock().unwrap() = at;
            server = Some(s);
        }
        kills += 1;
    }
    // Every vm gets ready; then every slot is back.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let at = addr.lock().unwrap().clone();
        let ready = http(&at, "GET", "/v1/entities?machine=vm&state=ready&limit=1000", "")
            .map_or(0, |(_, v)| v["items"].as_array().map_or(0, Vec::len));
        let limits = http(&at, "GET", "/v1/limits", "").map(|(_, v)| v);
        if ready == ENTITIES && limits == Some(serde_json::json!({"items": []})) {
            break;
        }
        assert!(Instant::now() < deadline, "{ready} of {ENTITIES} ready; limits {limits:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, Ordering::Relaxed);
    for a in agents {
        a.join().unwrap();
    }
    let p = provider.lock().unwrap();
    eprintln!("{kills} kills, {} agent deaths; most calls at once: {:?}", died.load(Ordering::Relaxed), p.most);
    for r in REGIONS {
        assert_eq!(p.most.get(r), Some(&MAX), "region {r}: the limit of {MAX} bound, and was never exceeded");
    }
    assert!(died.load(Ordering::Relaxed) > 0, "some agents died mid-call");
    drop(pool);
    drop(server);
}

#[test]
fn a_limit_holds_through_kill_9_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    run(dir.path().join("limits.db").to_str().unwrap(), 0, VM);
}

#[test]
fn a_limit_of_workflows_holds_through_kill_9_on_sqlite() {
    let vm = vm_of_workflows();
    assert!(vm.contains("events = [\"create\"]"));
    let dir = tempfile::tempdir().unwrap();
    run(dir.path().join("limits.db").to_str().unwrap(), 0, &vm);
}

#[test]
fn a_limit_holds_across_instances_killed_on_postgres() {
    let Some(url) = settle_store::postgres::test_url("crash_limits") else { return };
    run(&url, 3, VM);
}

#[test]
fn a_limit_of_workflows_holds_across_instances_killed_on_postgres() {
    let Some(url) = settle_store::postgres::test_url("crash_workflow_limits") else { return };
    run(&url, 3, &vm_of_workflows());
}

/// Three vms of one region behind a limit of 2: two hold a slot (their tasks offered, nobody
/// leases them), one waits; `settle limits` and `settle get` say so, read from the file
/// beside the running server and over `--server`.
#[test]
fn limits_and_get_show_who_holds_and_who_waits() {
    let dir = tempfile::tempdir().unwrap();
    let machines = write_machines(dir.path(), &[("vm.toml", VM)]);
    let db = dir.path().join("limits.db");
    let served = common::Served::start(&db, Some(&machines), &[]);
    let at = served.url.trim_start_matches("http://").to_string();
    for k in ["a", "b", "c"] {
        let body = format!(r#"{{"key": "{k}", "properties": {{"region": "eu"}}}}"#);
        assert_eq!(http(&at, "POST", "/v1/machines/vm/entities", &body).unwrap().0, 201);
        assert_eq!(http(&at, "POST", &format!("/v1/machines/vm/entities/{k}/events/create"), "{}").unwrap().0, 202);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    let table = loop {
        let out = common::settle(&db, &["limits"]);
        assert!(out.status.success(), "{}", common::stderr(&out));
        let text = common::stdout(&out);
        let waiting = text.lines().nth(1).and_then(|l| l.split_whitespace().nth(4));
        if text.contains("provider_calls") && waiting == Some("1") {
            break text;
        }
        assert!(Instant::now() < deadline, "no one waits yet:\n{text}");
        std::thread::sleep(Duration::from_millis(20));
    };
    let row: Vec<&str> = table.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(row, ["provider_calls", "eu", "2", "2", "1", "-"], "{table}");
    let remote = served.settle(None, &["limits", "--json"]);
    let line: serde_json::Value = serde_json::from_str(common::stdout(&remote).trim()).unwrap();
    assert_eq!(line, serde_json::json!({"limit": "provider_calls", "key": "eu", "in_use": 2, "max": 2, "waiting": 1}));
    // The one waiting says so, on the file and over the server.
    let mut waiting = 0;
    for k in ["a", "b", "c"] {
        let local = common::stdout(&common::settle(&db, &["get", "vm", k]));
        let remote = common::stdout(&served.settle(None, &["get", "vm", k]));
        let says = |text: &str| text.lines().find(|l| l.starts_with("limit:")).map(str::to_string);
        assert_eq!(says(&local), says(&remote), "{local}\n{remote}");
        match says(&local).as_deref() {
            Some("limit:      waiting for `provider_calls` (key eu: 2 of 2 in use, 1st in line)") => {
                waiting += 1;
                // `why` says what holds it back, on the file and over the server.
                for why in [common::settle(&db, &["why", "vm", k]), served.settle(None, &["why", "vm", k])] {
                    let text = common::stdout(&why);
                    assert!(
                        text.contains("  limit: waiting for `provider_calls` (key eu: 2 of 2 in use, 1st in line)"),
                        "{text}"
                    );
                }
            }
            Some("limit:      holds a slot of `provider_calls` (key eu: 2 of 2 in use)") => {}
            other => panic!("{k}: {other:?}\n{local}"),
        }
    }
    assert_eq!(waiting, 1);
    let json = common::stdout(&common::settle(&db, &["get", "vm", "a", "--json"]));
    let v: serde_json::Value = serde_json::from_str(json.trim()).unwrap();
    assert_eq!(v["limits"][0]["limit"], "provider_calls", "{v}");
    // An event raised with a priority goes ahead of those waiting at the default; one out
    // of range is refused, naming it.
    let body = r#"{"key": "d", "properties": {"region": "eu"}}"#;
    assert_eq!(http(&at, "POST", "/v1/machines/vm/entities", body).unwrap().0, 201);
    let out = served.settle(None, &["raise", "vm", "d", "create", "--priority", "5000"]);
    assert!(!out.status.success() && common::stderr(&out).contains("priority"), "{}", common::stderr(&out));
    let out = served.settle(None, &["raise", "vm", "d", "create", "--priority", "3"]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = common::stdout(&served.settle(None, &["get", "vm", "d"]));
        if text.contains("limit:      waiting for `provider_calls` (key eu: 2 of 2 in use, 1st in line)") {
            break;
        }
        assert!(Instant::now() < deadline, "d never went first in line:\n{text}");
        std::thread::sleep(Duration::from_millis(20));
    }
    served.stop();
}
