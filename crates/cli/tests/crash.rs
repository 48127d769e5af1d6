//! Crash test: the real binary runs a workload on a SQLite file and is killed with
//! SIGKILL at pseudo-random moments, again and again, then restarted until done.
//! Afterwards every job is in its final state, every event acknowledged before a crash
//! was processed exactly once, and the history records each state entry exactly once.

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use settle_store::{EntityFilter, HistoryKind, SqliteStore, Store};

const JOBS: usize = 1500;
const KILLS: usize = 6;

fn settle(db: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_settle"));
    c.arg("--db").arg(db).env("SETTLE_LOG", "error");
    c
}

/// Starts the workload, kills it after `after`, and returns the keys it acknowledged.
fn run_and_kill(db: &Path, after: Duration) -> Vec<String> {
    let mut child = settle(db)
        .args(["workload", "--jobs", &JOBS.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn settle");
    let stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .filter_map(|l| l.strip_prefix("ack ").map(str::to_string))
            .collect::<Vec<_>>()
    });
    std::thread::sleep(after);
    child.kill().expect("SIGKILL"); // std's kill is SIGKILL on Unix
    child.wait().unwrap();
    reader.join().unwrap()
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
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
    eprintln!("crash test seed {seed}");
    let mut x = seed | 1;
    let mut acked: HashSet<String> = HashSet::new();
    let mut interrupted = 0;
    for round in 0..KILLS {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let after = Duration::from_millis(100 + x % 300);
        let keys = run_and_kill(&db, after);
        let unfinished = unfinished_jobs(&db);
        eprintln!("round {round}: killed after {after:?}, {} acks, {unfinished} jobs unfinished", keys.len());
        if unfinished > 0 {
            interrupted += 1;
        }
        acked.extend(keys);
    }
    assert!(interrupted >= 5, "only {interrupted} kills interrupted unfinished work; the workload is too short");
    // Drain whatever is pending with `settle run --until-idle`, then let the workload
    // finish (it creates and starts any job a crash prevented it from reaching).
    let out = settle(&db).args(["run", "--until-idle"]).output().unwrap();
    assert!(out.status.success(), "settle run failed: {}", String::from_utf8_lossy(&out.stderr));
    let out = settle(&db).args(["workload", "--jobs", &JOBS.to_string()]).output().unwrap();
    assert!(out.status.success(), "final workload failed: {}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.ends_with("all done\n"), "{stdout}");
    acked.extend(stdout.lines().filter_map(|l| l.strip_prefix("ack ").map(str::to_string)));

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
            // Each state entry exactly once: the entries form one unbroken chain from
            // creation, retries count up one by one, and nothing repeats.
            let entries: Vec<_> = history.iter().filter(|h| h.to.is_some()).collect();
            assert_eq!((entries[0].kind, entries[0].to.as_deref()), (HistoryKind::Create, Some("idle")));
            for pair in entries.windows(2) {
                let (prev, next) = (pair[0], pair[1]);
                assert_eq!(next.from, prev.to, "job {}: history chain broken at {next:?}", job.key);
                let expected_retry =
                    if next.to == next.from && next.kind == HistoryKind::Auto { prev.retry + 1 } else { 0 };
                assert_eq!(next.retry, expected_retry, "job {}: duplicated or missing entry at {next:?}", job.key);
            }
            assert_eq!(entries.last().unwrap().to.as_deref(), Some("done"));
            let n =
                history.iter().filter(|h| h.event.as_deref() == Some("start") && h.kind == HistoryKind::Event).count();
            starts.insert(job.key.to_string(), n);
        }
        for key in &acked {
            assert_eq!(starts.get(key), Some(&1), "acknowledged event on {key} must be processed exactly once");
        }
        assert!(starts.values().all(|&n| n == 1), "every job was started exactly once");
    });
}
