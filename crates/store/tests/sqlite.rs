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
    settle_store::NewEntity {
        machine: "m".into(),
        key: key.into(),
        state: "idle".into(),
        properties: Default::default(),
        auto_at: None,
        request_id: None,
        timers: Vec::new(),
        notify_self: false,
        operation: None,
        machine_hash: None,
        health: "ok",
        offer: None,
    }
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
