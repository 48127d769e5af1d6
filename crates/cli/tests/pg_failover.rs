//! A PostgreSQL failover in the middle of a multi-instance run: a primary with a
//! synchronous standby, built for the test with Debian's PostgreSQL 15 tools in a temporary
//! directory, on free ports; `settle demo --instances 3` on a multi-host URL naming both
//! (`target_session_attrs=read-write`); the primary's postmaster is killed with `kill -9`
//! while servers are being provisioned, and the standby is promoted. Every process must
//! reconnect to the new primary, the run must complete, and nothing acknowledged before the
//! failover may be missing after it.
//!
//! Runs whenever the tools are installed (the newest `/usr/lib/postgresql/N/bin`, or
//! `SETTLE_PG_BIN`); without them it
//! says it skipped, except under `CI`, where it fails. As root, the tools run as the
//! `postgres` user (`runuser`), as PostgreSQL refuses to run as root. A test binary of its
//! own: `cargo test -p settle-cli --test pg_failover`.

mod common;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::{DemoRun, assert_demo_converged, kill_9};

/// Where Debian puts PostgreSQL's server tools: the newest `/usr/lib/postgresql/N/bin`
/// with `initdb` (`SETTLE_PG_BIN` overrides).
fn pg_bin() -> PathBuf {
    if let Some(dir) = std::env::var_os("SETTLE_PG_BIN") {
        return PathBuf::from(dir);
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, e.path().join("bin"))))
        .filter(|(_, bin)| bin.join("initdb").is_file())
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin).unwrap_or_else(|| PathBuf::from("/usr/lib/postgresql/15/bin"))
}

/// Servers the demo provisions: enough that the run is well under way, not over, when the
/// primary dies.
const SERVERS: usize = 600;

/// How the PostgreSQL tools are run: directly, or as `postgres` through `runuser` (as root).
struct Tools {
    as_postgres: bool,
}

impl Tools {
    /// The tools, or why they cannot be used.
    fn find() -> Result<Tools, String> {
        for tool in ["initdb", "pg_ctl", "pg_basebackup", "postgres"] {
            let path = pg_bin().join(tool);
            if !path.is_file() {
                return Err(format!("{} is missing", path.display()));
            }
        }
        let root = {
            use std::os::unix::fs::MetadataExt;
            std::fs::metadata("/proc/self").map(|m| m.uid() == 0).unwrap_or(false)
        };
        if root {
            let works = Command::new("runuser")
                .args(["-u", "postgres", "--", "true"])
                .output()
                .is_ok_and(|o| o.status.success());
            if !works {
                return Err("running as root, and `runuser -u postgres` does not work (no `postgres` user?)".into());
            }
        }
        Ok(Tools { as_postgres: root })
    }

    /// `TOOL ARGS...` run in `dir` (as `postgres` when root); its output.
    fn run(&self, dir: &Path, tool: &str, args: &[&str]) -> Output {
        let path = pg_bin().join(tool);
        let mut c = if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&path);
            c
        } else {
            Command::new(&path)
        };
        c.args(args).current_dir(dir).env("LC_ALL", "C").stdin(std::process::Stdio::null());
        c.output().unwrap_or_else(|e| panic!("run {tool}: {e}"))
    }

    /// Hands `path` to the `postgres` user (when the tools run as it).
    fn chown(&self, path: &Path) {
        if self.as_postgres {
            let ok = Command::new("chown").arg("postgres:").arg(path).status().is_ok_and(|s| s.success());
            assert!(ok, "chown postgres {}", path.display());
        }
    }
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// A free TCP port on 127.0.0.1 (bound, then released).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A primary and its synchronous standby in a temporary directory: stopped
/// (`pg_ctl stop -m immediate`) and removed when dropped, whatever happened.
struct Pair {
    tools: Tools,
    root: PathBuf,
    primary: PathBuf,
    standby: PathBuf,
    primary_port: u16,
    standby_port: u16,
    /// The primary's postmaster was killed: its stale `postmaster.pid` names a pid that may
    /// be reused, which `pg_ctl stop` must not signal.
    primary_killed: std::cell::Cell<bool>,
}

impl Pair {
    /// Builds and starts both servers and waits until the standby streams synchronously.
    fn start(tools: Tools) -> Pair {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
        // The `postgres` user must reach it: under /tmp, not a private TMPDIR, when root.
        let base = if tools.as_postgres { PathBuf::from("/tmp") } else { std::env::temp_dir() };
        let root = base.join(format!("settle-pg-failover-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&root).unwrap();
        tools.chown(&root);
        let mut pair = Pair {
            tools,
            primary: root.join("primary"),
            standby: root.join("standby"),
            root,
            primary_port: 0,
            standby_port: 0,
            primary_killed: std::cell::Cell::new(false),
        };
        let p = pair.primary.to_str().unwrap().to_string();
        let out = pair.tools.run(
            &pair.root,
            "initdb",
            &["-D", &p, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-locale"],
        );
        assert!(out.status.success(), "initdb: {}", text(&out));
        append(
            &pair.primary.join("postgresql.conf"),
            &format!(
                "\n# settle pg_failover test\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{}'\n\
                 wal_level = replica\nmax_wal_senders = 5\nmax_connections = 100\nshared_buffers = 32MB\n\
                 synchronous_standby_names = '*'\nsynchronous_commit = on\nfsync = on\n",
                pair.root.display()
            ),
        );
        pair.primary_port = pair.start_server(&pair.primary.clone(), "primary");
        let out = pair.tools.run(
            &pair.root,
            "pg_basebackup",
            &[
                "-D",
                pair.standby.to_str().unwrap(),
                "-h",
                "127.0.0.1",
                "-p",
                &pair.primary_port.to_string(),
                "-U",
                "postgres",
                "-R",
                "-X",
                "stream",
                "-c",
                "fast",
            ],
        );
        assert!(out.status.success(), "pg_basebackup: {}\n{}", text(&out), pair.logs());
        // After a promotion the standby is the primary, with no standby of its own: it
        // must not wait for one.
        append(&pair.standby.join("postgresql.conf"), "synchronous_standby_names = ''\nhot_standby = on\n");
        pair.standby_port = pair.start_server(&pair.standby.clone(), "standby");
        pair.wait_for_sync();
        pair
    }

    /// Starts the server in `data` on a free port (another one if that was taken meanwhile);
    /// the port.
    fn start_server(&self, data: &Path, name: &str) -> u16 {
        let log = self.root.join(format!("{name}.log"));
        let mut failures = String::new();
        for _ in 0..5 {
            let port = free_port();
            append(&data.join("postgresql.conf"), &format!("port = {port}\n"));
            let out = self.tools.run(
                &self.root,
                "pg_ctl",
                &["start", "-w", "-t", "120", "-D", data.to_str().unwrap(), "-l", log.to_str().unwrap()],
            );
            if out.status.success() {
                return port;
            }
            failures.push_str(&format!("port {port}: {}\n", text(&out)));
            // A server that did come up (a slow start) must not be left behind.
            self.tools.run(&self.root, "pg_ctl", &["stop", "-m", "immediate", "-D", data.to_str().unwrap()]);
        }
        panic!("cannot start the {name}:\n{failures}\n{}", self.logs());
    }

    /// Waits until the primary reports the standby as its synchronous one.
    fn wait_for_sync(&self) {
        let mut primary = self.client(self.primary_port);
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let states: Vec<String> = primary
                .query("SELECT sync_state FROM pg_stat_replication", &[])
                .unwrap()
                .iter()
                .map(|r| r.get(0))
                .collect();
            if states.iter().any(|s| s == "sync") {
                return;
            }
            assert!(Instant::now() < deadline, "the standby never became synchronous ({states:?}):\n{}", self.logs());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Settle's URL: both servers, only ever a writable one.
    fn url(&self) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/postgres?target_session_attrs=read-write",
            self.primary_port, self.standby_port
        )
    }

    /// A connection to the server on `port`.
    fn client(&self, port: u16) -> postgres::Client {
        postgres::Config::new()
            .host("127.0.0.1")
            .port(port)
            .user("postgres")
            .dbname("postgres")
            .application_name("pg_failover test")
            .connect_timeout(Duration::from_secs(10))
            .connect(postgres::NoTls)
            .unwrap_or_else(|e| panic!("connect to port {port}: {e}\n{}", self.logs()))
    }

    /// `kill -9` of the primary's postmaster (the first line of its `postmaster.pid`).
    fn kill_primary(&self) {
        let pidfile = std::fs::read_to_string(self.primary.join("postmaster.pid")).expect("primary's postmaster.pid");
        let pid: u32 = pidfile.lines().next().and_then(|l| l.trim().parse().ok()).expect("a pid in postmaster.pid");
        kill_9(pid);
        self.primary_killed.set(true);
    }

    /// Promotes the standby and waits until it accepts writes.
    fn promote(&self) {
        let out =
            self.tools.run(&self.root, "pg_ctl", &["promote", "-w", "-t", "120", "-D", self.standby.to_str().unwrap()]);
        assert!(out.status.success(), "pg_ctl promote: {}\n{}", text(&out), self.logs());
    }

    /// Both servers' logs, for failure messages.
    fn logs(&self) -> String {
        ["primary", "standby"]
            .iter()
            .map(|name| {
                let log = std::fs::read_to_string(self.root.join(format!("{name}.log"))).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(40).collect();
                format!("--- {name}.log (end) ---\n{}\n", tail.into_iter().rev().collect::<Vec<_>>().join("\n"))
            })
            .collect()
    }
}

impl Drop for Pair {
    fn drop(&mut self) {
        for (data, killed) in [(&self.primary, self.primary_killed.get()), (&self.standby, false)] {
            if !killed && data.join("postmaster.pid").exists() {
                self.tools.run(&self.root, "pg_ctl", &["stop", "-m", "immediate", "-w", "-D", data.to_str().unwrap()]);
            }
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

fn append(path: &Path, lines: &str) {
    use std::io::Write;
    let mut f =
        std::fs::OpenOptions::new().append(true).open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    f.write_all(lines.as_bytes()).unwrap();
}

/// The demo run, killed with its worker processes if the test fails before it finished.
/// (A worker stops when its stdin closes, but not while its commits wait for a database
/// that is gone, as they do when the test fails around the failover.)
struct Running(Option<DemoRun>);

impl Running {
    fn demo(&self) -> &DemoRun {
        self.0.as_ref().expect("running")
    }

    fn finish(mut self, limit: Duration) -> (std::process::ExitStatus, String) {
        self.0.take().expect("running").finish(limit)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(demo) = self.0.as_mut() {
            // The workers first: while the demo runs, a worker that exited is its zombie
            // until it restarts it, so these pids are not reused.
            for pid in demo.workers.lock().map(|w| w.values().copied().collect()).unwrap_or_else(|_| Vec::new()) {
                let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            }
            let _ = demo.child.kill();
            let _ = demo.child.wait();
        }
    }
}

/// What the primary had committed at one moment: with `synchronous_commit = on` and a
/// synchronous standby, a commit becomes visible only once the standby has it, so all of
/// it must survive the failover.
struct Acked {
    /// Every history entry, as text.
    history: Vec<String>,
    /// Every entity: id → (machine, key, state, version).
    entities: HashMap<i64, (String, String, String, i64)>,
    /// Servers `ready`.
    ready: usize,
}

impl Acked {
    fn read(c: &mut postgres::Client) -> Acked {
        let mut tx = c.build_transaction().isolation_level(postgres::IsolationLevel::RepeatableRead).start().unwrap();
        let history = tx
            .query(
                "SELECT id, entity_id, from_state, to_state, kind, event, action, retry FROM history ORDER BY id",
                &[],
            )
            .unwrap()
            .iter()
            .map(|r| {
                let text = |i: usize| format!("{:?}", r.get::<_, Option<String>>(i));
                let (id, entity, retry): (i64, i64, i64) = (r.get(0), r.get(1), r.get(7));
                let kind: String = r.get(4);
                format!(
                    "#{id} entity {entity}: {} -> {} {kind} event {} action {} retry {retry}",
                    text(2),
                    text(3),
                    text(5),
                    text(6)
                )
            })
            .collect();
        let entities: HashMap<_, _> = tx
            .query("SELECT id, machine, key, state, version FROM entities", &[])
            .unwrap()
            .iter()
            .map(|r| (r.get(0), (r.get(1), r.get(2), r.get(3), r.get(4))))
            .collect();
        tx.commit().unwrap();
        let ready = entities.values().filter(|(m, _, s, _)| m == "server" && s == "ready").count();
        Acked { history, entities, ready }
    }

    /// Checks that everything of `self` is in `after`: every history entry unchanged, every
    /// entity at its version or later (and in the same state if at the same version).
    fn assert_kept_in(&self, after: &Acked) {
        let have: HashSet<&String> = after.history.iter().collect();
        let lost: Vec<&String> = self.history.iter().filter(|h| !have.contains(h)).collect();
        assert!(
            lost.is_empty(),
            "{} acknowledged history entries lost in the failover, e.g. {:?}",
            lost.len(),
            &lost[..lost.len().min(5)]
        );
        for (id, (machine, key, state, version)) in &self.entities {
            let Some((m, k, s, v)) = after.entities.get(id) else {
                panic!("entity {machine} {key} (id {id}) lost in the failover");
            };
            assert_eq!((m, k), (machine, key), "entity {id} changed identity");
            assert!(v >= version, "{machine} {key}: version {v} after the failover, {version} acknowledged before");
            if v == version {
                assert_eq!(s, state, "{machine} {key}: same version {v}, other state");
            }
        }
        assert!(after.ready >= self.ready, "fewer servers ready after the failover than before");
    }
}

/// Those of the processes `pids` with a connection that listens for notifications
/// (`LISTEN`) on the server `db` is connected to: the backends' client ports, matched to
/// the processes' sockets through `/proc`.
fn listening_processes(db: &mut postgres::Client, pids: &[u32]) -> Vec<u32> {
    let ports: HashSet<u16> = db
        .query(
            "SELECT client_port FROM pg_stat_activity WHERE application_name = 'settle' AND query LIKE 'LISTEN %'",
            &[],
        )
        .unwrap()
        .iter()
        .filter_map(|r| u16::try_from(r.get::<_, i32>(0)).ok())
        .collect();
    // The inodes of the local sockets on those ports. A line of /proc/net/tcp: `sl
    // local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode ...`, addresses
    // as `ADDR:PORT` in hexadecimal.
    let mut inodes = HashSet::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        for line in std::fs::read_to_string(table).unwrap_or_default().lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let port =
                fields.get(1).and_then(|a| a.rsplit_once(':')).and_then(|(_, p)| u16::from_str_radix(p, 16).ok());
            if let (Some(port), Some(inode)) = (port, fields.get(9))
                && ports.contains(&port)
            {
                inodes.insert(format!("socket:[{inode}]"));
            }
        }
    }
    let owns = |pid: u32| {
        let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).into_iter().flatten().flatten();
        fds.filter_map(|fd| std::fs::read_link(fd.path()).ok())
            .any(|link| link.to_str().is_some_and(|l| inodes.contains(l)))
    };
    pids.iter().copied().filter(|&pid| owns(pid)).collect()
}

/// Polls `cond` every 100 ms until it holds; fails with `what` (and `context()`) after `limit`.
fn wait_until(limit: Duration, what: &str, context: impl Fn() -> String, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out after {limit:?} waiting for {what}:\n{}", context());
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Three instances on a primary with a synchronous standby: the primary is killed with
/// `kill -9` mid-run and the standby promoted. Every instance reconnects to the new primary,
/// every server converges, and everything committed before the failover is still there.
#[test]
fn instances_follow_a_failover_to_the_synchronous_standby() {
    let tools = match Tools::find() {
        Ok(t) => t,
        Err(why) => {
            // CI installs PostgreSQL 15: there this test must run.
            assert!(std::env::var_os("CI").is_none(), "CI: cannot run the PostgreSQL failover test: {why}");
            eprintln!("skipped: PostgreSQL failover test: {why}");
            return;
        }
    };
    let started = Instant::now();
    let pair = Pair::start(tools);
    let url = pair.url();
    eprintln!("primary on port {}, synchronous standby on port {}", pair.primary_port, pair.standby_port);

    let servers = SERVERS.to_string();
    let demo = Running(Some(DemoRun::start(
        &url,
        &["--instances", "3", "--servers", &servers, "--fail-rate", "0.2", "--seed", "5"],
    )));
    let log = || format!("{}\n{}", demo.demo().log(), pair.logs());
    for i in 1..=3 {
        demo.demo().worker_pid(i);
    }
    // Every server created and asked to `create` (the demo prints progress only then), and
    // some, not all, provisioned.
    wait_until(Duration::from_secs(120), "the demo to start processing", log, || {
        demo.demo().log().contains("progress:")
    });
    let mut primary = pair.client(pair.primary_port);
    wait_until(Duration::from_secs(180), "a tenth of the servers to be ready", log, || {
        let row = primary
            .query_one("SELECT count(*) FROM entities WHERE machine = 'server' AND state = 'ready'", &[])
            .unwrap();
        row.get::<_, i64>(0) as usize >= SERVERS / 10
    });
    // What is acknowledged now is on the standby: it is still the synchronous one.
    let sync: Vec<String> =
        primary.query("SELECT sync_state FROM pg_stat_replication", &[]).unwrap().iter().map(|r| r.get(0)).collect();
    assert_eq!(sync, ["sync"], "the standby is no longer synchronous:\n{}", pair.logs());
    let acked = Acked::read(&mut primary);
    assert!(acked.ready < SERVERS, "every server was ready before the failover: make the run longer");
    drop(primary);

    pair.kill_primary();
    eprintln!("killed the primary with {} of {SERVERS} servers ready", acked.ready);
    wait_until(Duration::from_secs(60), "the instances to notice the primary is gone", log, || {
        demo.demo().log().contains("database unavailable, retrying")
    });
    // A failover manager takes a while to decide: meanwhile the instances retry, and find
    // only the standby, which is read-only, so `target_session_attrs` skips it.
    std::thread::sleep(Duration::from_secs(2));
    pair.promote();
    let promoted = Instant::now();
    eprintln!("promoted the standby");

    // Every process (the demo's driver and its three workers) listens on the new primary:
    // seen while they still run (the demo stops its workers once the work is done).
    let mut new_primary = pair.client(pair.standby_port);
    let mut processes: Vec<u32> = demo.demo().workers.lock().unwrap().values().copied().collect();
    processes.push(demo.demo().child.id());
    wait_until(Duration::from_secs(120), "every instance to listen on the new primary", log, || {
        let listening = listening_processes(&mut new_primary, &processes);
        if listening.len() == processes.len() {
            return true;
        }
        assert!(
            !demo.demo().log().contains("worker processes stopped"),
            "the run ended before every instance was seen on the new primary (only {listening:?} of {processes:?}):\n{}",
            log()
        );
        false
    });
    eprintln!(
        "processes {processes:?} listen on the new primary {:.1} s after the promotion",
        promoted.elapsed().as_secs_f64()
    );

    let (status, log) = demo.finish(Duration::from_secs(300));
    assert!(status.success(), "demo failed across the failover:\n{log}\n{}", pair.logs());
    // The instances rode the failover out: none died and had to be restarted.
    assert!(
        log.contains("3 worker processes stopped; 0 restarted after dying"),
        "a worker died at the failover:\n{log}"
    );
    assert_demo_converged(&url, SERVERS);
    acked.assert_kept_in(&Acked::read(&mut new_primary));
    eprintln!("failover test done in {:.1} s", started.elapsed().as_secs_f64());
}
