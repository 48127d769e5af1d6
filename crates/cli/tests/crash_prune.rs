//! A crash test of pruning: `settle prune` runs on a SQLite file holding thousands of ended
//! entities (servers and their resources, created and deleted by `settle bench soak`) and
//! a live server with its live resources, and is killed with SIGKILL at pseudo-random
//! moments, again and again, then run to its end. After every kill: no row of any table
//! belongs to an entity that is gone (no orphans), no entity is left without its history
//! (nothing half-removed), the fleet counts equal their rows, and every live entity is
//! there with all its history. At the end every ended entity is gone. The same with an
//! archive: after every kill each entity gone is in the archive, whole (written twice at
//! most where a kill fell between the archive and the delete).

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{settle, stderr};
use rusqlite::{Connection, OpenFlags};

const WORKFLOWS: &str = "1500";
const KILLS: usize = 8;

/// The soak's machines, for `--machines`.
fn machines(dir: &Path) -> std::path::PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/bench");
    let out = dir.join("machines");
    std::fs::create_dir_all(&out).unwrap();
    for f in ["soak_server.toml", "soak_resource.toml"] {
        std::fs::copy(src.join(f), out.join(f)).unwrap();
    }
    out
}

fn count(c: &Connection, sql: &str) -> i64 {
    c.query_row(sql, [], |r| r.get(0)).unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// Every invariant a kill may not break.
fn check(db: &Path, live: &[(String, i64)]) {
    let c = Connection::open_with_flags(db, OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
    for (table, column) in [
        ("history", "entity_id"),
        ("events", "entity_id"),
        ("errors", "entity_id"),
        ("inbox", "entity_id"),
        ("timers", "entity_id"),
        ("agent_tasks", "entity_id"),
        ("successors", "predecessor_id"),
        ("successors", "successor_id"),
    ] {
        let orphans =
            count(&c, &format!("SELECT count(*) FROM {table} WHERE {column} NOT IN (SELECT id FROM entities)"));
        assert_eq!(orphans, 0, "{table}.{column}: rows of entities that are gone");
    }
    assert_eq!(count(&c, "SELECT count(*) FROM exceptions WHERE error_id NOT IN (SELECT id FROM errors)"), 0);
    let headless =
        "SELECT count(*) FROM entities e WHERE NOT EXISTS (SELECT 1 FROM history h WHERE h.entity_id = e.id)";
    assert_eq!(count(&c, headless), 0, "an entity without its history: half removed");
    let drift = "SELECT count(*) FROM (
        SELECT machine, state, run_status, n FROM entity_counts WHERE n <> 0
        EXCEPT SELECT machine, state, run_status, count(*) FROM entities GROUP BY machine, state, run_status)";
    assert_eq!(count(&c, drift), 0, "fleet counts differ from their rows");
    for (key, history) in live {
        let n: i64 = c
            .query_row(
                "SELECT count(*) FROM history h JOIN entities e ON e.id = h.entity_id WHERE e.key = ?1",
                [key],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(n, *history, "live {key} keeps all its history");
    }
}

/// A database of thousands of ended entities (`settle bench soak`, kept while written) and
/// a live server with its four live resources: the live ones' keys with their history
/// counts, and every ended entity's id with its key and history count.
struct Soaked {
    db: std::path::PathBuf,
    machines: String,
    live: Vec<(String, i64)>,
    ended: BTreeMap<i64, (String, i64)>,
}

fn soaked(dir: &Path) -> Soaked {
    let db = dir.join("prune.db");
    let m = machines(dir).to_str().unwrap().to_string();
    let soak = settle(&db, &["bench", "soak", "--workflows", WORKFLOWS, "--retention", "forever", "--json"]);
    assert!(soak.status.success(), "{}", stderr(&soak));
    for args in [&["create", "soak_server", "live-1"][..], &["raise", "soak_server", "live-1", "go", "--wait"][..]] {
        let out = settle(&db, &[&["--machines", m.as_str()][..], args].concat());
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    }
    let c = Connection::open_with_flags(&db, OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
    let live: Vec<(String, i64)> = c
        .prepare(
            "SELECT e.key, count(h.id) FROM entities e JOIN history h ON h.entity_id = e.id
             WHERE e.key LIKE 'live-1%' GROUP BY e.key",
        )
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(live.len(), 5, "{live:?}");
    let ended: BTreeMap<i64, (String, i64)> = c
        .prepare(
            "SELECT e.id, e.key, count(h.id) FROM entities e JOIN history h ON h.entity_id = e.id
             WHERE e.ended_at IS NOT NULL GROUP BY e.id",
        )
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, (r.get(1)?, r.get(2)?))))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert!(ended.len() >= 5 * 1500, "{}", ended.len());
    drop(c);
    check(&db, &live);
    Soaked { db, machines: m, live, ended }
}

/// Runs `settle prune` (with `extra` options) and kills it with SIGKILL at pseudo-random
/// moments, up to [`KILLS`] times, calling `after` after each; then runs it to its end.
fn kill_again_and_again(s: &Soaked, extra: &[&str], mut after: impl FnMut()) {
    let prune = || {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_settle"));
        cmd.arg("--db").arg(&s.db).args(["--machines", &s.machines, "--retention-defaults", "ended=0s,operations=0s"]);
        cmd.args(extra).arg("prune");
        cmd.env("SETTLE_LOG", "error").stdout(Stdio::null()).stderr(Stdio::null());
        cmd
    };
    let mut x = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 | 1;
    eprintln!("crash test seed {x}");
    let mut kills = 0;
    for _ in 0..KILLS {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let mut child = prune().spawn().expect("spawn settle prune");
        std::thread::sleep(Duration::from_millis(30 + x % 250));
        let finished = child.try_wait().unwrap().is_some();
        child.kill().ok(); // SIGKILL
        child.wait().unwrap();
        after();
        if finished {
            break;
        }
        kills += 1;
    }
    eprintln!("killed {kills} times");
    assert!(kills >= 1, "no kill landed while pruning: the test tested nothing");
    let last = prune().status().unwrap();
    assert!(last.success());
    after();
}

#[test]
fn kill_9_during_pruning_leaves_no_orphan_and_loses_nothing_live() {
    let dir = tempfile::tempdir().unwrap();
    let s = soaked(dir.path());
    kill_again_and_again(&s, &[], || check(&s.db, &s.live));
    let c = Connection::open_with_flags(&s.db, OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
    assert_eq!(count(&c, "SELECT count(*) FROM entities WHERE ended_at IS NOT NULL"), 0, "every ended entity went");
    assert_eq!(count(&c, "SELECT count(*) FROM entities"), 5, "the live server and its resources");
}

/// Every whole line of the archive files in `dir`, as (id, key, history rows); a line cut
/// short may only be the last of its file (the crash that cut it started no more there).
fn archived(dir: &Path) -> Vec<(i64, String, i64)> {
    let Ok(files) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut out = Vec::new();
    for f in files {
        let f = f.unwrap().path();
        let text = std::fs::read_to_string(&f).unwrap();
        let lines: Vec<&str> = text.split_inclusive('\n').collect();
        for (i, line) in lines.iter().enumerate() {
            match serde_json::from_str::<serde_json::Value>(line) {
                Ok(v) if line.ends_with('\n') => out.push((
                    v["id"].as_i64().unwrap(),
                    v["key"].as_str().unwrap().to_string(),
                    v["history"].as_array().unwrap().len() as i64,
                )),
                _ => assert_eq!(i + 1, lines.len(), "{}: a broken line before the last: {line}", f.display()),
            }
        }
    }
    out
}

#[test]
fn kill_9_between_archiving_and_deleting_duplicates_at_most_never_loses() {
    let dir = tempfile::tempdir().unwrap();
    let s = soaked(dir.path());
    let archive = dir.path().join("archive");
    let ended = &s.ended;
    let lossless = || {
        check(&s.db, &s.live);
        let c = Connection::open_with_flags(&s.db, OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
        let left: std::collections::HashSet<i64> = c
            .prepare("SELECT id FROM entities")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        let lines = archived(&archive);
        let mut seen = BTreeMap::new();
        for (id, key, history) in &lines {
            let (k, h) = ended.get(id).unwrap_or_else(|| panic!("archived {id} ({key}), which had not ended"));
            assert_eq!((k, h), (key, history), "archived {id} whole");
            *seen.entry(*id).or_insert(0) += 1;
        }
        for (id, (key, _)) in ended {
            assert!(left.contains(id) || seen.contains_key(id), "{key} ({id}) removed without being archived");
        }
        (seen.len(), lines.len())
    };
    kill_again_and_again(&s, &["--archive", archive.to_str().unwrap(), "--archive-rotate", "256KiB"], || {
        lossless();
    });
    let (entities, lines) = lossless();
    assert_eq!(entities, ended.len(), "every ended entity archived");
    eprintln!("{entities} entities in {lines} lines: {} written twice", lines - entities);
    let files = std::fs::read_dir(&archive).unwrap().count();
    assert!(files > 1, "rotated by size: {files} file(s)");
}
