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
    };
    let claim = Claim { owner: "w".into(), lease_ms: 30_000, limit: 10, machines: Vec::new() };
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
