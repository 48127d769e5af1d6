//! Helpers shared by the end-to-end tests: run the `settle` binary on a database file.
#![allow(dead_code)] // each test file uses its own subset

use std::path::Path;
use std::process::{Command, Output};

/// The server's test kit, shared with its handler tests: the test machines (`DOOR`, `VM`),
/// the dump of everything a request could change, the check of a problem document.
#[path = "../../../server/src/testkit.rs"]
pub mod testkit;

pub mod browser;

/// The repository's root (examples, scripts, the Python package).
pub fn repo() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Whether `python3` runs; without it a test that needs it is skipped (saying so), except
/// on CI, where it fails.
pub fn python3() -> bool {
    let found = Command::new("python3").arg("--version").output().is_ok_and(|o| o.status.success());
    if !found {
        assert!(std::env::var_os("CI").is_none(), "python3 not found, and CI is set");
        println!("skipped: python3 not found");
    }
    found
}

/// Runs `settle --db DB ARGS...` to completion, with logging quiet.
pub fn settle(db: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_settle"))
        .arg("--db")
        .arg(db)
        .args(args)
        .env("SETTLE_LOG", "error")
        .output()
        .expect("run settle")
}

/// Writes `files` (name, TOML text) into `DIR/machines` and returns that directory, for
/// `--machines`.
pub fn write_machines(dir: &Path, files: &[(&str, &str)]) -> std::path::PathBuf {
    let machines = dir.join("machines");
    std::fs::create_dir_all(&machines).unwrap();
    for (name, text) in files {
        std::fs::write(machines.join(name), text).unwrap();
    }
    machines
}

/// Standard output as text.
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Standard error as text.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A `settle demo --instances K` run on PostgreSQL, its stderr read on a thread that
/// records the worker processes' pids as they (re)start.
pub struct DemoRun {
    pub child: std::process::Child,
    pub workers: std::sync::Arc<std::sync::Mutex<std::collections::BTreeMap<u32, u32>>>,
    pub log: std::sync::Arc<std::sync::Mutex<String>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl DemoRun {
    /// Starts the demo on `url` with `args` (leases of 3 s, so a dead worker's entities
    /// move to the others quickly).
    pub fn start(url: &str, args: &[&str]) -> DemoRun {
        use std::io::BufRead;
        let mut child = Command::new(env!("CARGO_BIN_EXE_settle"))
            .args(["demo", "--db", url])
            .args(args)
            .env("SETTLE_LOG", "warn")
            .env("SETTLE_LEASE", "3s")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("start settle demo");
        let workers = std::sync::Arc::new(std::sync::Mutex::new(std::collections::BTreeMap::new()));
        let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let stderr = child.stderr.take().unwrap();
        let (w, l) = (workers.clone(), log.clone());
        let reader = std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
                // "worker 2 started (pid 1234)"
                if let Some(rest) = line.strip_prefix("worker ")
                    && let Some((index, pid)) = rest.split_once(" started (pid ")
                    && let (Ok(index), Ok(pid)) = (index.parse(), pid.trim_end_matches(')').parse())
                {
                    w.lock().unwrap().insert(index, pid);
                }
                let mut log = l.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        });
        DemoRun { child, workers, log, reader: Some(reader) }
    }

    /// The current pid of worker `index`, waiting up to 30 s for it to start.
    pub fn worker_pid(&self, index: u32) -> u32 {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            if let Some(&pid) = self.workers.lock().unwrap().get(&index) {
                return pid;
            }
            assert!(std::time::Instant::now() < deadline, "worker {index} never started:\n{}", self.log());
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// Everything the demo printed on stderr so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Waits for the demo to exit (at most `limit`); its status and full stderr.
    pub fn finish(mut self, limit: std::time::Duration) -> (std::process::ExitStatus, String) {
        let deadline = std::time::Instant::now() + limit;
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            if std::time::Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("demo did not finish within {limit:?}:\n{}", self.log());
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        };
        if let Some(r) = self.reader.take() {
            r.join().unwrap();
        }
        (status, self.log())
    }
}

/// Sends SIGKILL to `pid`.
pub fn kill_9(pid: u32) {
    let ok = Command::new("kill").args(["-9", &pid.to_string()]).status().expect("run kill").success();
    assert!(ok, "kill -9 {pid} failed");
}

/// Checks the outcome of a demo run on PostgreSQL at `url`: `servers` servers, every one
/// `ready` with its resources, and in every entity's history each state entry exactly
/// once (an unbroken chain from creation, no entry repeated).
pub fn assert_demo_converged(url: &str, servers: usize) {
    use settle_store::{EntityFilter, HistoryKind, PgStore, Store};
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let store = PgStore::open_read_only(url).unwrap();
        let all = store.entity_list(EntityFilter::default()).await.unwrap();
        let of = |m: &str| all.iter().filter(|e| e.machine == m).collect::<Vec<_>>();
        assert_eq!(of("server").len(), servers, "servers");
        for e in of("server") {
            assert_eq!(e.state, "ready", "server {} did not converge", e.key);
        }
        for e in &all {
            assert_eq!(e.due_at, None, "{} {} still has pending work", e.machine, e.key);
            let history = store.history_list(e.id).await.unwrap();
            let entries: Vec<_> = history.iter().filter(|h| h.to.is_some()).collect();
            assert_eq!(entries[0].kind, HistoryKind::Create, "{} {}: first entry", e.machine, e.key);
            for pair in entries.windows(2) {
                let (prev, next) = (pair[0], pair[1]);
                assert_eq!(next.from, prev.to, "{} {}: history chain broken at {next:?}", e.machine, e.key);
                let repeated = (next.from == prev.from
                    && next.to == prev.to
                    && next.kind == prev.kind
                    && next.retry == prev.retry)
                    && next.event == prev.event
                    && next.action == prev.action;
                assert!(!repeated, "{} {}: state entry recorded twice: {prev:?} / {next:?}", e.machine, e.key);
            }
            assert_eq!(entries.last().unwrap().to.as_ref(), Some(&e.state), "{} {}", e.machine, e.key);
        }
    });
}

/// A running `settle --db DB serve --machines DIR --listen 127.0.0.1:0`, on a free port;
/// killed when dropped unless stopped with [`Served::stop`].
pub struct Served {
    pub child: std::process::Child,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
}

impl Served {
    /// Starts `settle serve` on `db` with the machines of `machines` (`None`: the built-in
    /// ones) and `env` set (`SETTLE_TOKENS` is cleared unless given); waits until it
    /// listens.
    pub fn start(db: &Path, machines: Option<&Path>, env: &[(&str, &str)]) -> Served {
        use std::io::{BufRead, Read};
        let mut c = Command::new(env!("CARGO_BIN_EXE_settle"));
        c.arg("--db").arg(db).arg("serve").args(["--listen", "127.0.0.1:0"]);
        if let Some(dir) = machines {
            c.arg("--machines").arg(dir);
        }
        c.env("SETTLE_LOG", "error").env_remove("SETTLE_TOKENS").envs(env.iter().copied());
        c.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
        let mut child = c.spawn().expect("start settle serve");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let Some(addr) = line.trim().strip_prefix("listening on ") else {
            let _ = child.kill();
            let mut err = String::new();
            child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
            panic!("settle serve did not start: {line:?}\n{err}");
        };
        Served { url: addr.to_string(), child }
    }

    /// Runs `settle --server URL [--token TOKEN] ARGS...` to completion (no database, no
    /// `SETTLE_SERVER`/`SETTLE_TOKEN`/`SETTLE_DB` from the environment).
    pub fn settle(&self, token: Option<&str>, args: &[&str]) -> Output {
        let mut c = Command::new(env!("CARGO_BIN_EXE_settle"));
        c.args(["--server", &self.url]);
        if let Some(t) = token {
            c.args(["--token", t]);
        }
        c.args(args)
            .env("SETTLE_LOG", "error")
            .env_remove("SETTLE_SERVER")
            .env_remove("SETTLE_TOKEN")
            .env_remove("SETTLE_DB")
            .output()
            .expect("run settle --server")
    }

    /// Stops the server with SIGTERM and waits for it to exit.
    pub fn stop(mut self) -> std::process::ExitStatus {
        let ok = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status().unwrap().success();
        assert!(ok, "kill -TERM failed");
        self.child.wait().unwrap()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A process a test started: killed (and reaped) when dropped.
pub struct Proc(pub std::process::Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `settle --db DB ARGS...` started in the background, logging errors only.
pub fn spawn_settle(db: &str, args: &[&str]) -> Proc {
    let child = Command::new(env!("CARGO_BIN_EXE_settle"))
        .args(["--db", db])
        .args(args)
        .env("SETTLE_LOG", "error")
        .env_remove("SETTLE_TOKENS")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .expect("start settle");
    Proc(child)
}

/// `settle serve` on `db` with `args`, on a free loopback port: the process and its address.
pub fn spawn_server(db: &str, args: &[&str]) -> (Proc, String) {
    use std::io::BufRead;
    let mut all = vec!["serve", "--listen", "127.0.0.1:0"];
    all.extend_from_slice(args);
    let mut p = spawn_settle(db, &all);
    let mut line = String::new();
    std::io::BufReader::new(p.0.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let addr = line.trim().strip_prefix("listening on http://").unwrap_or_else(|| panic!("no address: {line:?}"));
    (p, addr.to_string())
}

/// One HTTP/1.1 request to `addr`: the status and the body as JSON (null when empty or
/// not JSON).
pub fn http(addr: &str, method: &str, path: &str, body: Option<&str>) -> (u16, serde_json::Value) {
    http_with(addr, method, path, &[], body)
}

/// [`http`] with extra request headers (`Authorization`, say).
pub fn http_with(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> (u16, serde_json::Value) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    let body = body.unwrap_or_default();
    let extra: String = headers.iter().map(|(k, v)| format!("{k}: {v}\r\n")).collect();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\n\
         {extra}Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8_lossy(&raw);
    let status = text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or_default();
    (status, serde_json::from_str(body).unwrap_or(serde_json::Value::Null))
}

/// One HTTP/1.1 request without a body (`Connection: close`): the status and the body as
/// text (`/metrics`, say).
pub fn http_text(addr: &str, method: &str, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    let req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8_lossy(&raw);
    let status = text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (status, text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default())
}

/// Spawns `cmd` (a `settle serve` on `--listen 127.0.0.1:0`, stdout and stderr piped) and
/// returns it with the address it printed; a server that did not start fails the test
/// with its standard error.
pub fn spawn_serve_command(cmd: &mut std::process::Command) -> (std::process::Child, String) {
    use std::io::{BufRead, Read};
    let mut child = cmd.spawn().expect("start settle serve");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let Some(addr) = line.trim().strip_prefix("listening on http://") else {
        let _ = child.kill();
        let mut err = String::new();
        child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
        panic!("settle serve did not start: {line:?}\n{err}");
    };
    let addr = addr.to_string();
    (child, addr)
}
