//! Crash tests: the real binary runs a workload on a SQLite file and is killed with
//! SIGKILL at pseudo-random moments, again and again, then restarted until done.
//! Afterwards every entity is in its final state, every event acknowledged before a crash
//! was processed exactly once, and the history records each state entry exactly once; for
//! the statechart workload, every entry and exit action's effect is in the store exactly
//! once, although crashes between such an action and its commit made transitions run again.

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use settle_store::{AnyStore, EntityFilter, HistoryKind, SqliteStore, Store};

const JOBS: usize = 1500;
const KILLS: usize = 6;

fn settle(db: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_settle"));
    // A short lease: on PostgreSQL, what a killed process held is taken over soon.
    c.arg("--db").arg(db).env("SETTLE_LOG", "error").env("SETTLE_LEASE", "2s");
    c
}

/// How long a workload may take to print `ready` (its store opened and migrated, its engine
/// started) before the test gives up on it.
const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// Starts `settle workload ARGS`, kills it `after` it printed `ready` (or exited), and
/// returns what it printed and how long it took to be ready. The delay counts from `ready`,
/// not from the start: on a busy host, opening a fresh PostgreSQL schema alone took longer
/// than the whole delay, and every kill fell before any work.
fn run_and_kill(db: &Path, args: &[&str], after: Duration) -> (Vec<String>, Duration) {
    let started = Instant::now();
    let mut child = settle(db)
        .arg("workload")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn settle");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut lines = Vec::new();
    loop {
        match rx.recv_timeout(READY_TIMEOUT.saturating_sub(started.elapsed())) {
            Ok(line) => {
                let ready = line == "ready";
                lines.push(line);
                if ready {
                    break;
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break, // it exited: nothing left to interrupt
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let _ = child.kill();
                panic!("settle workload printed no `ready` within {READY_TIMEOUT:?}: {lines:?}");
            }
        }
    }
    let ready = started.elapsed();
    std::thread::sleep(after);
    child.kill().expect("SIGKILL"); // std's kill is SIGKILL on Unix
    child.wait().unwrap();
    reader.join().unwrap();
    lines.extend(rx.try_iter());
    (lines, ready)
}

/// The keys of `ack KEY` lines.
fn acks(lines: &[String]) -> impl Iterator<Item = String> + '_ {
    lines.iter().filter_map(|l| l.strip_prefix("ack ").map(str::to_string))
}

/// A pseudo-random delay of 50–350 ms after `ready` (xorshift on `x`).
fn next_delay(x: &mut u64) -> Duration {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    Duration::from_millis(50 + *x % 300)
}

fn seed() -> u64 {
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
    eprintln!("crash test seed {seed}");
    seed | 1
}

/// Drains what is pending with `settle run --until-idle` (the definitions the workload
/// stored, run with the same handlers), then lets `settle workload ARGS` finish (it creates
/// and starts whatever a crash kept it from reaching); returns what both printed.
fn finish(db: &Path, args: &[&str]) -> Vec<String> {
    let run = settle(db).args(["run", "--until-idle"]).output().unwrap();
    assert!(run.status.success(), "settle run failed: {}", String::from_utf8_lossy(&run.stderr));
    let out = settle(db).arg("workload").args(args).output().unwrap();
    assert!(out.status.success(), "final workload failed: {}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(stdout.ends_with("all done\n"), "{stdout}");
    let ran = String::from_utf8_lossy(&run.stdout).to_string();
    ran.lines().chain(stdout.lines()).map(str::to_string).collect()
}

/// Asserts that `entity`'s history is one unbroken chain of state entries from creation
/// to `last`, each entry once (retries count up one by one); answers how many times
/// `event` was processed.
fn assert_one_chain(history: &[settle_store::HistoryRow], key: &str, last: &str, event: &str) -> usize {
    let entries: Vec<_> = history.iter().filter(|h| h.to.is_some()).collect();
    assert_eq!((entries[0].kind, entries[0].to.as_deref()), (HistoryKind::Create, Some("idle")));
    for pair in entries.windows(2) {
        let (prev, next) = (pair[0], pair[1]);
        assert_eq!(next.from, prev.to, "{key}: history chain broken at {next:?}");
        let expected_retry = if next.to == next.from && next.kind == HistoryKind::Auto { prev.retry + 1 } else { 0 };
        assert_eq!(next.retry, expected_retry, "{key}: duplicated or missing entry at {next:?}");
    }
    assert_eq!(entries.last().unwrap().to.as_deref(), Some(last));
    history.iter().filter(|h| h.event.as_deref() == Some(event) && h.kind == HistoryKind::Event).count()
}

/// Jobs not yet created or not yet `done`, read from the file as left by the crash.
fn unfinished_jobs(db: &Path) -> usize {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let Ok(store) = SqliteStore::open_read_only(db) else { return JOBS };
        let jobs = store.entity_list(EntityFilter { machine: Some("job".into()), ..Default::default() }).await.unwrap();
        JOBS - jobs.iter().filter(|j| j.state == "done").count()
    })
}

#[test]
fn survives_repeated_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("crash.db");
    let jobs = JOBS.to_string();
    let args = ["--jobs", jobs.as_str()];
    let mut x = seed();
    let mut acked: HashSet<String> = HashSet::new();
    let mut interrupted = 0;
    for round in 0..KILLS {
        let after = next_delay(&mut x);
        let (lines, ready) = run_and_kill(&db, &args, after);
        let keys: Vec<String> = acks(&lines).collect();
        let unfinished = unfinished_jobs(&db);
        eprintln!(
            "round {round}: ready after {ready:?}, killed {after:?} later, {} acks, {unfinished} jobs unfinished",
            keys.len()
        );
        if unfinished > 0 {
            interrupted += 1;
        }
        acked.extend(keys);
    }
    assert!(interrupted >= 5, "only {interrupted} kills interrupted unfinished work; the workload is too short");
    acked.extend(acks(&finish(&db, &args)));

    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let store = SqliteStore::open_read_only(&db).unwrap();
        let jobs = store.entity_list(EntityFilter { machine: Some("job".into()), ..Default::default() }).await.unwrap();
        assert_eq!(jobs.len(), JOBS);
        let mut starts: HashMap<String, usize> = HashMap::new();
        for job in &jobs {
            assert_eq!(job.state, "done", "job {} not finished", job.key);
            assert_eq!(job.due_at, None, "job {} still has pending work", job.key);
            assert!(store.inbox_list(job.id).await.unwrap().is_empty());
            let history = store.history_list(job.id).await.unwrap();
            starts.insert(job.key.to_string(), assert_one_chain(&history, &job.key, "done", "start"));
        }
        for key in &acked {
            assert_eq!(starts.get(key), Some(&1), "acknowledged event on {key} must be processed exactly once");
        }
        assert!(starts.values().all(|&n| n == 1), "every job was started exactly once");
    });
}

const CHARTS: usize = 300;

/// The rows each finished chart leaves in `chart_hooks`, each once: its transitions
/// idle → step1 → step2 → step3 → done leave and enter exactly these states.
const CHART_HOOKS: [(&str, &str); 8] = [
    ("enter_step", "step1"),
    ("enter_step", "step2"),
    ("enter_step", "step3"),
    ("enter_working", "working"),
    ("leave_step", "step1"),
    ("leave_step", "step2"),
    ("leave_step", "step3"),
    ("leave_working", "working"),
];

/// A statechart whose entry and exit actions write rows in their transitions' commits: a
/// `kill -9` between an action and its commit re-runs the whole transition (its entry and
/// exit actions again), and the store ends with each effect exactly once. On SQLite.
#[test]
fn statechart_transitions_survive_kill_9_with_each_entry_effect_once() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("chart.db");
    chart_crash(&db.display().to_string());
}

/// The same on PostgreSQL (a schema of its own), with a short lease so that the entities a
/// killed process held are taken over soon.
#[test]
fn statechart_transitions_survive_kill_9_on_postgres() {
    let Some(url) = settle_store::postgres::test_url("chartcrash") else { return };
    chart_crash(&url);
}

fn chart_crash(db: &str) {
    let db = Path::new(db);
    let charts = CHARTS.to_string();
    let args = ["--jobs", "0", "--charts", charts.as_str()];
    let mut x = seed();
    let mut printed: Vec<String> = Vec::new();
    for round in 0..KILLS {
        let after = next_delay(&mut x);
        let (lines, ready) = run_and_kill(db, &args, after);
        eprintln!("round {round}: ready after {ready:?}, killed {after:?} later, {} lines", lines.len());
        printed.extend(lines);
    }
    printed.extend(finish(db, &args));

    // How often each entry or exit action ran, as printed before its commit.
    let mut ran: HashMap<(String, String, String), usize> = HashMap::new();
    for line in printed.iter().filter_map(|l| l.strip_prefix("hook ")) {
        let mut parts = line.split(' ').map(str::to_string);
        let (key, hook, state) = (parts.next().unwrap(), parts.next().unwrap(), parts.next().unwrap());
        *ran.entry((key, hook, state)).or_default() += 1;
    }
    let rerun = ran.values().filter(|&&n| n > 1).count();
    eprintln!("{rerun} entry or exit actions ran again after a crash before their commit");
    assert!(rerun > 0, "no kill fell between an entry or exit action and its commit; the workload is too short");

    let mut rows: HashMap<String, Vec<(String, String)>> = HashMap::new();
    for (key, hook, state) in chart_hook_rows(db.to_str().unwrap()) {
        rows.entry(key).or_default().push((hook, state));
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let store = AnyStore::open_read_only(db.to_str().unwrap()).unwrap();
        let charts =
            store.entity_list(EntityFilter { machine: Some("chart".into()), ..Default::default() }).await.unwrap();
        assert_eq!(charts.len(), CHARTS);
        for chart in &charts {
            assert_eq!((chart.state.as_str(), chart.due_at), ("done", None), "chart {} not finished", chart.key);
            let history = store.history_list(chart.id).await.unwrap();
            assert_eq!(assert_one_chain(&history, &chart.key, "done", "start"), 1, "{}: started once", chart.key);
            let mut effects = rows.remove(chart.key.as_str()).unwrap_or_default();
            effects.sort();
            let expected: Vec<(String, String)> =
                CHART_HOOKS.iter().map(|(h, s)| (h.to_string(), s.to_string())).collect();
            assert_eq!(effects, expected, "{}: each entry and exit action's effect exactly once", chart.key);
        }
        assert!(rows.is_empty(), "rows of no chart: {rows:?}");
    });
}

/// Every row of the application table `chart_hooks`: (key, hook, state).
fn chart_hook_rows(db: &str) -> Vec<(String, String, String)> {
    const QUERY: &str = "SELECT key, hook, state FROM chart_hooks";
    if settle_store::is_postgres_url(db) {
        // The store's URL names its schema with `schema=NAME`, which the driver does not know.
        let (base, schema) = db.split_once("schema=").expect("a test URL names its schema");
        let base = base.trim_end_matches(['?', '&']);
        let mut client = postgres::Client::connect(base, postgres::NoTls).unwrap();
        client.execute("SELECT set_config('search_path', $1, false)", &[&schema]).unwrap();
        client.query(QUERY, &[]).unwrap().iter().map(|r| (r.get(0), r.get(1), r.get(2))).collect()
    } else {
        let conn = rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
        let mut stmt = conn.prepare(QUERY).unwrap();
        stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?))).unwrap().map(Result::unwrap).collect()
    }
}
