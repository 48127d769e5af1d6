//! A crash test of pruning: `settle prune` runs on a SQLite file holding thousands of ended
//! entities (servers and their resources, created and deleted by `settle bench soak`) and
//! a live server with its live resources, and is killed with SIGKILL at pseudo-random
//! moments, again and again, then run to its end. After every kill: no row of any table
//! belongs to an entity that is gone (no orphans), no entity is left without its history
//! (nothing half-removed), the fleet counts equal their rows, and every live entity is
//! there with all its history. At the end every ended entity is gone.

mod common;

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

#[test]
fn kill_9_during_pruning_leaves_no_orphan_and_loses_nothing_live() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("prune.db");
    let m = machines(dir.path());
    let m = m.to_str().unwrap();
    // Thousands of ended entities, kept (retention forever while they are written).
    let soak = settle(&db, &["bench", "soak", "--workflows", WORKFLOWS, "--retention", "forever", "--json"]);
    assert!(soak.status.success(), "{}", stderr(&soak));
    // A live server with its four live resources.
    for args in [&["create", "soak_server", "live-1"][..], &["raise", "soak_server", "live-1", "go", "--wait"][..]] {
        let out = settle(&db, &[&["--machines", m][..], args].concat());
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
    let ended = count(&c, "SELECT count(*) FROM entities WHERE ended_at IS NOT NULL");
    assert!(ended >= 5 * 1500, "{ended}");
    drop(c);
    check(&db, &live);

    let prune = || {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_settle"));
        cmd.arg("--db").arg(&db).args(["--machines", m, "--retention-defaults", "ended=0s,operations=0s", "prune"]);
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
        check(&db, &live);
        if finished {
            break;
        }
        kills += 1;
    }
    eprintln!("killed {kills} times");
    assert!(kills >= 1, "no kill landed while pruning: the test tested nothing");
    let last = prune().status().unwrap();
    assert!(last.success());
    check(&db, &live);
    let c = Connection::open_with_flags(&db, OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
    assert_eq!(count(&c, "SELECT count(*) FROM entities WHERE ended_at IS NOT NULL"), 0, "every ended entity went");
    assert_eq!(count(&c, "SELECT count(*) FROM entities"), 5, "the live server and its resources");
}
