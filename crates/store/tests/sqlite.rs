//! The store conformance suite on SQLite, plus SQLite-only checks (durability across
//! reopen, the exclusive engine lock, read-only access).

use settle_store::conformance::Dialect;
use settle_store::{Batch, Op, SqliteStore, Store};

const SQLITE: Dialect = Dialect {
    create_widgets: "CREATE TABLE widgets (name TEXT PRIMARY KEY)",
    insert_widget: "INSERT INTO widgets (name) VALUES (?1)",
};

async fn fresh() -> SqliteStore {
    let dir = tempfile::tempdir().unwrap().keep();
    SqliteStore::open(dir.join("test.db")).unwrap()
}

settle_store::store_conformance_suite!(fresh(), SQLITE);

fn entity(key: &str) -> settle_store::NewEntity {
    settle_store::conformance::entity(key, "idle")
}

#[tokio::test]
async fn data_survives_reopen_and_lock_is_exclusive() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.db");
    let store = SqliteStore::open(&path).unwrap();
    store.write(Batch { now: 1, ops: vec![Op::Create(entity("a"))], claim: None }).await.unwrap();
    let err = SqliteStore::open(&path).unwrap_err().to_string();
    assert!(err.starts_with("another settle engine is running on"), "{err}");
    let reader = SqliteStore::open_read_only(&path).unwrap();
    assert!(reader.entity_get("m", "a").await.unwrap().is_some());
    let write_err = reader.write(Batch::default()).await.unwrap_err().to_string();
    assert_eq!(write_err, "database error: store opened read-only");
    drop(store);
    let reopened = SqliteStore::open(&path).unwrap();
    assert_eq!(reopened.entity_get("m", "a").await.unwrap().unwrap().version, 1);
}

/// Dropping the handle closes the file before it returns: the writer's connection too,
/// so the last connection's close has removed the log (as SQLite does) and nothing of the
/// old handle can touch a file made at the same path afterwards (a bench's next scratch
/// file once had its log removed by the last one's writer closing late).
#[tokio::test]
async fn a_dropped_store_has_closed_its_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.db");
    let wal = dir.path().join("x.db-wal");
    for round in 0..30 {
        let store = SqliteStore::open(&path).unwrap();
        store.write(Batch { now: 1, ops: vec![Op::Create(entity(&format!("e{round}")))], claim: None }).await.unwrap();
        assert!(wal.exists(), "round {round}: no log while open");
        drop(store);
        assert!(!wal.exists(), "round {round}: the log is still there once the handle is dropped");
        for suffix in ["", "-shm", ".lock"] {
            let _ = std::fs::remove_file(dir.path().join(format!("x.db{suffix}")));
        }
    }
}

#[tokio::test]
async fn read_only_open_refuses_missing_or_foreign_files() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("none.db");
    assert!(SqliteStore::open_read_only(&missing).unwrap_err().to_string().contains("no such file"));
    let foreign = dir.path().join("foreign.db");
    rusqlite::Connection::open(&foreign).unwrap().execute_batch("CREATE TABLE t (x)").unwrap();
    assert!(SqliteStore::open_read_only(&foreign).unwrap_err().to_string().contains("not a settle database"));
}

/// The writer skips canceling agent tasks while none can be open; a task already open in
/// the file when the store opens is still canceled when its entity enters another state.
#[tokio::test]
async fn a_task_open_at_reopen_is_canceled_on_state_entry() {
    use settle_store::{AfterCommit, Applied, Claim, Commit, Fence, HistoryKind, TaskFilter, TaskOffer};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tasks.db");
    let store = SqliteStore::open(&path).unwrap();
    let mut new = entity("a");
    new.offer = Some(TaskOffer { queue: "q".into(), action: "work".into(), lock_ms: 1_000, available_at: 10 });
    let r = store.write(Batch { now: 1, ops: vec![Op::Create(new)], claim: None }).await.unwrap();
    assert!(matches!(r.results[0], Ok(Applied::Created(_))), "{:?}", r.results[0]);
    drop(store);

    let store = SqliteStore::open(&path).unwrap();
    let open = || store.task_list(TaskFilter { open_only: true, ..TaskFilter::default() });
    assert_eq!(open().await.unwrap().len(), 1);
    let push = settle_store::Push {
        machine: "m".into(),
        key: "a".into(),
        event: "go".into(),
        params: serde_json::json!({}),
        request_id: Some("req-go".into()),
        kind: settle_store::InboxKind::Raised,
        join_from: None,
        operation: None,
        reply: None,
    };
    let claim = Claim::new("w", 30_000, 10);
    let mut r = store.write(Batch { now: 20, ops: vec![Op::Push(push)], claim: Some(claim) }).await.unwrap();
    let c = r.claimed.remove(0);
    let fence = Fence { entity_id: c.entity.id, version: c.entity.version, owner: "w".into() };
    let commit = Commit {
        to: Some("done".into()),
        action: Some("go".into()),
        event: Some("go".into()),
        consume: Some(c.inbox_head.expect("the event").id),
        request_id: Some("req-go".into()),
        ..Commit::new(fence, c.entity.state.clone(), HistoryKind::Event, AfterCommit::Release)
    };
    let r = store.write(Batch { now: 30, ops: vec![Op::Commit(Box::new(commit))], claim: None }).await.unwrap();
    assert!(r.results[0].is_ok(), "{:?}", r.results[0]);
    assert!(open().await.unwrap().is_empty(), "entering `done` canceled the task");
}

/// The telemetry a plan writes with each state entry, read back from the file (the
/// `transitions` view reads these columns): a created entity's row, then an event's
/// transition and the auto action after it, numbered in the event's workflow.
#[tokio::test]
async fn state_entries_carry_their_transition_telemetry() {
    use settle_store::{
        AfterCommit, Claim, Commit, EventRecord, Fence, HistoryKind, InboxKind, OpenOperation, Push, Telemetry,
        TransitionRecord,
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("telemetry.db");
    let store = SqliteStore::open(&path).unwrap();
    let new = settle_store::NewEntity { machine_hash: Some("h1".into()), ..entity("a") };
    store.write(Batch { now: 10, ops: vec![Op::Create(new)], claim: None }).await.unwrap();
    let push = Push {
        machine: "m".into(),
        key: "a".into(),
        event: "go".into(),
        params: serde_json::json!({"n": 2}),
        request_id: Some("r1".into()),
        kind: InboxKind::Raised,
        join_from: None,
        operation: Some(OpenOperation {
            request_id: "r1".into(),
            name: "m.go".into(),
            dimensions: serde_json::json!({}),
            priority: 0,
        }),
        reply: None,
    };
    let claim = || Some(Claim::new("engine-a", 60_000, 10));
    let r = store.write(Batch { now: 20, ops: vec![Op::Push(push)], claim: claim() }).await.unwrap();
    let c = r.claimed[0].clone();
    let item = c.inbox_head.clone().expect("the event");
    // Each step as the engine commits it: the event's action, then the auto action.
    let step = |version: i64, from: &str, to: &str, kind: &'static str, event: bool, entered: i64, at_rest: bool| {
        let fence = Fence { entity_id: c.entity.id, version, owner: "engine-a".into() };
        let after = if at_rest { AfterCommit::Release } else { AfterCommit::Hold };
        let history = if event { HistoryKind::Event } else { HistoryKind::Auto };
        Op::Commit(Box::new(Commit {
            to: Some(to.into()),
            consume: event.then_some(item.id),
            event: event.then(|| item.event.clone()),
            action: Some("go".into()),
            request_id: Some("r1".into()),
            machine_hash: Some("h2".into()),
            telemetry: Telemetry {
                event: event.then(|| EventRecord::of(&item, false, false)),
                transition: Some(TransitionRecord {
                    kind,
                    start_health: Some("ok"),
                    end_health: if at_rest { "error" } else { "ok" },
                    entry_time: entered,
                    start_time: entered + 1,
                    action_start_time: None,
                    outcome: "ok",
                }),
                error: None,
                at_rest,
                complete: at_rest,
                current_event: if event { None } else { Some(item.id) },
            },
            ..Commit::new(fence, from.into(), history, after)
        }))
    };
    let first = step(1, "idle", "busy", "event", true, 10, false);
    store.write(Batch { now: 30, ops: vec![first], claim: None }).await.unwrap();
    let second = step(2, "busy", "done", "auto_action", false, 30, true);
    store.write(Batch { now: 40, ops: vec![second], claim: None }).await.unwrap();
    drop(store);
    let conn = rusqlite::Connection::open(&path).unwrap();
    let mut stmt = conn
        .prepare(
            "SELECT to_state, transition_kind, ordinal, event_id, end_health, entry_time, start_time, outcome, machine_hash
             FROM history WHERE to_state IS NOT NULL ORDER BY id",
        )
        .unwrap();
    type Row = (String, String, i64, Option<i64>, String, i64, i64, String, String);
    let rows: Vec<Row> = stmt
        .query_map([], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?, r.get(6)?, r.get(7)?, r.get(8)?))
        })
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let s = |v: &str| v.to_string();
    assert_eq!(
        rows,
        [
            (s("idle"), s("create"), 1, None, s("ok"), 10, 10, s("ok"), s("h1")),
            (s("busy"), s("event"), 1, Some(item.id), s("ok"), 10, 11, s("ok"), s("h2")),
            (s("done"), s("auto_action"), 2, Some(item.id), s("error"), 30, 31, s("ok"), s("h2")),
        ]
    );
    // The event's row: its parameters, and its end where the workflow came to rest.
    let (params, end_state, end_time): (Option<String>, Option<String>, Option<i64>) = conn
        .query_row("SELECT params, end_state, end_time FROM events WHERE id = ?1", [item.id], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })
        .unwrap();
    assert_eq!((params.as_deref(), end_state.as_deref(), end_time), (Some(r#"{"n":2}"#), Some("done"), Some(40)));
}

/// The `busy` column (an operation ends only when no entity of its request is busy) is set
/// by what keeps an entity working: an auto action or an agent task at creation, an agent
/// task offered by a commit; a commit that moves nowhere keeps it as it was. And an event
/// raised with no parameters (`{}` or null) stores none.
#[tokio::test]
async fn busy_follows_what_keeps_an_entity_working() {
    use settle_core::{ActionName, StateName};
    use settle_store::{AfterCommit, Claim, Commit, EventRecord, Fence, HistoryKind, Push, TaskOffer, Telemetry};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("busy.db");
    let store = SqliteStore::open(&path).unwrap();
    let offer = || TaskOffer { queue: "q".into(), action: ActionName::new("work"), lock_ms: 1_000, available_at: 0 };
    let created = vec![
        Op::Create(settle_store::NewEntity { auto_at: Some(5), ..entity("auto") }),
        Op::Create(settle_store::NewEntity { offer: Some(offer()), ..entity("offered") }),
        Op::Create(entity("idle")),
        Op::Create(entity("parent")),
    ];
    store.write(Batch { now: 1, ops: created, claim: None }).await.unwrap();
    let push = |key: &str, params: serde_json::Value| {
        Op::Push(Push {
            machine: "m".into(),
            key: key.into(),
            event: "go".into(),
            params,
            request_id: None,
            kind: settle_store::InboxKind::Raised,
            join_from: None,
            operation: None,
            reply: None,
        })
    };
    let pushes = vec![
        push("auto", serde_json::json!({})),
        push("idle", serde_json::Value::Null),
        push("parent", serde_json::json!({"n": 1})),
    ];
    let claim = Some(Claim::new("engine-a", 60_000, 10));
    let r = store.write(Batch { now: 10, ops: pushes, claim }).await.unwrap();
    let mut ops = Vec::new();
    for c in &r.claimed {
        let item = c.inbox_head.clone().expect("its event");
        let fence = Fence { entity_id: c.entity.id, version: c.entity.version, owner: "engine-a".into() };
        let mut commit = Commit::new(fence, c.entity.state.clone(), HistoryKind::Rejected, AfterCommit::Release);
        commit.consume = Some(item.id);
        commit.event = Some(item.event.clone());
        commit.telemetry = Telemetry {
            event: Some(EventRecord::of(&item, c.entity.key.as_str() != "parent", false)),
            ..Telemetry::default()
        };
        if c.entity.key.as_str() == "parent" {
            // It moves on and offers its action to an agent, and creates two children.
            (commit.to, commit.kind, commit.offer) =
                (Some(StateName::new("working")), HistoryKind::Event, Some(offer()));
            commit.creates =
                vec![entity("child"), settle_store::NewEntity { offer: Some(offer()), ..entity("agent_child") }];
        }
        ops.push(Op::Commit(Box::new(commit)));
    }
    assert_eq!(ops.len(), 3, "auto, idle and parent were claimed");
    let r = store.write(Batch { now: 20, ops, claim: None }).await.unwrap();
    assert!(r.results.iter().all(Result::is_ok), "{:?}", r.results);
    drop(store);
    let conn = rusqlite::Connection::open(&path).unwrap();
    let mut stmt = conn.prepare("SELECT key, busy FROM entities ORDER BY key").unwrap();
    let busy: Vec<(String, bool)> =
        stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?))).unwrap().map(Result::unwrap).collect();
    let s = |k: &str, b| (k.to_string(), b);
    assert_eq!(
        busy,
        [
            s("agent_child", true),
            s("auto", true),
            s("child", false),
            s("idle", false),
            s("offered", true),
            s("parent", true)
        ]
    );
    let mut stmt = conn.prepare("SELECT entity_key, params FROM events ORDER BY entity_key").unwrap();
    let params: Vec<(String, Option<String>)> =
        stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?))).unwrap().map(Result::unwrap).collect();
    let p = |k: &str, p: Option<&str>| (k.to_string(), p.map(str::to_string));
    assert_eq!(params, [p("auto", None), p("idle", None), p("parent", Some(r#"{"n":1}"#))]);
}

/// Space that deletes free goes back to the file system: a database Settle creates is in
/// incremental auto-vacuum mode, and `reclaim_space` returns at most the pages asked for,
/// then the rest, then nothing; the file shrinks.
#[tokio::test]
async fn freed_pages_go_back_to_the_file_system() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("space.db");
    let store = SqliteStore::open(&path).unwrap();
    let probe = rusqlite::Connection::open_with_flags(&path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
    let pragma = |name: &str| probe.query_row(&format!("PRAGMA {name}"), [], |r| r.get::<_, i64>(0)).unwrap();
    assert_eq!(pragma("auto_vacuum"), 2, "incremental");
    // About 4 MiB of rows in an application table, then dropped: their pages are free.
    store
        .sql_execute(
            "CREATE TABLE scratch (v TEXT);
             WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 4000)
             INSERT INTO scratch SELECT printf('%01000d', i) FROM n;
             DROP TABLE scratch;",
        )
        .await
        .unwrap();
    let free = pragma("freelist_count");
    assert!(free > 900, "pages freed: {free}");
    assert_eq!(store.reclaim_space(100).await.unwrap(), 100, "at most what was asked");
    assert_eq!(pragma("freelist_count"), free - 100);
    assert_eq!(store.reclaim_space(u64::MAX).await.unwrap(), (free - 100) as u64);
    assert_eq!((pragma("freelist_count"), store.reclaim_space(u64::MAX).await.unwrap()), (0, 0));
    drop(probe);
    drop(store);
    // Once checkpointed, the file holds only the pages in use.
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.busy_timeout(std::time::Duration::from_secs(5)).unwrap();
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(())).unwrap();
    let size = std::fs::metadata(&path).unwrap().len();
    assert!(size < 1024 * 1024, "the file shrank to {size} bytes");
}

/// The workspace builds the bundled SQLite with the options `.cargo/config.toml` sets
/// (README "Performance"): each connection its own page cache, no allocation statistics,
/// no shared-cache mode. A build without them would run, only slower: this says so.
#[test]
fn the_bundled_sqlite_has_the_workspace_build_options() {
    let conn = rusqlite::Connection::open_in_memory().unwrap();
    let mut stmt = conn.prepare("PRAGMA compile_options").unwrap();
    let options: Vec<String> = stmt.query_map([], |r| r.get(0)).unwrap().collect::<Result<_, _>>().unwrap();
    let missing: Vec<&str> = ["DEFAULT_MEMSTATUS=0", "OMIT_SHARED_CACHE"]
        .into_iter()
        .filter(|o| !options.iter().any(|have| have == o))
        .collect();
    assert!(
        missing.is_empty(),
        "built without {missing:?} (is LIBSQLITE3_FLAGS from .cargo/config.toml set?): {options:?}"
    );
    assert!(
        !options.iter().any(|o| o == "ENABLE_MEMORY_MANAGEMENT"),
        "built with ENABLE_MEMORY_MANAGEMENT (one page cache behind a process-wide mutex): {options:?}"
    );
}
