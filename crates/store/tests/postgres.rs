//! The store conformance suite on PostgreSQL (each check in a schema of its own), plus
//! PostgreSQL-only checks: concurrent claims from several handles, wake-ups, URLs.
//! Needs `SETTLE_TEST_PG`; without it every test says it skipped and passes.

use std::collections::HashSet;
use std::time::Duration;

use settle_store::conformance::Dialect;
use settle_store::{Batch, Claim, NewEntity, Op, PgStore, Store};

const POSTGRES: Dialect = Dialect {
    create_widgets: "CREATE TABLE widgets (name TEXT PRIMARY KEY)",
    insert_widget: "INSERT INTO widgets (name) VALUES ($1)",
};

async fn fresh() -> Option<PgStore> {
    let url = settle_store::postgres::test_url("conf")?;
    Some(tokio::task::spawn_blocking(move || PgStore::open(&url)).await.unwrap().expect("open PostgreSQL store"))
}

settle_store::store_conformance_suite!(optional fresh(), POSTGRES);

fn entity(key: &str, auto_at: Option<i64>) -> NewEntity {
    NewEntity {
        machine: "m".into(),
        key: key.into(),
        state: "idle".into(),
        properties: Default::default(),
        auto_at,
        request_id: None,
        timers: Vec::new(),
        notify_self: false,
        operation: None,
        machine_hash: None,
        health: "ok",
        offer: None,
    }
}

async fn open(url: &str) -> PgStore {
    let url = url.to_string();
    tokio::task::spawn_blocking(move || PgStore::open(&url)).await.unwrap().unwrap()
}

/// Two handles (as two instances would) claim the same due entities concurrently: every
/// entity is claimed exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_claims_never_overlap() {
    let Some(url) = settle_store::postgres::test_url("claims") else { return };
    let a = open(&url).await;
    let b = open(&url).await;
    let ops = (0..400).map(|i| Op::Create(entity(&format!("e{i}"), Some(1)))).collect();
    a.write(Batch { now: 10, ops, claim: None }).await.unwrap();
    let claim = |store: PgStore, owner: &'static str| async move {
        let mut got = Vec::new();
        loop {
            let r = store
                .write(Batch {
                    now: 20,
                    ops: vec![],
                    claim: Some(Claim { owner: owner.into(), lease_ms: 60_000, limit: 16, machines: Vec::new() }),
                })
                .await
                .unwrap();
            if r.claimed.is_empty() {
                return got;
            }
            for c in r.claimed {
                assert_eq!(c.entity.lease_owner.as_deref(), Some(owner));
                got.push(c.entity.id);
            }
        }
    };
    let (x, y) = tokio::join!(tokio::spawn(claim(a.clone(), "engine-a")), tokio::spawn(claim(b, "engine-b")));
    let (x, y) = (x.unwrap(), y.unwrap());
    let xs: HashSet<i64> = x.iter().copied().collect();
    let ys: HashSet<i64> = y.iter().copied().collect();
    assert_eq!(xs.len() + ys.len(), 400, "a: {}, b: {}", xs.len(), ys.len());
    assert!(xs.is_disjoint(&ys), "an entity was claimed twice");
    assert_eq!(x.len(), xs.len());
}

/// A batch that makes work due wakes the other handles' engines, not its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_wake_other_handles() {
    let Some(url) = settle_store::postgres::test_url("wake") else { return };
    let a = open(&url).await;
    let b = open(&url).await;
    let wake_b = b.wakeup().expect("PostgreSQL handles have wake-ups");
    // The listener wakes once when it (re)connects; consume that.
    tokio::time::timeout(Duration::from_secs(10), wake_b.notified()).await.expect("listener starts");
    a.write(Batch { now: 10, ops: vec![Op::Create(entity("x", Some(10)))], claim: None }).await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), wake_b.notified()).await.expect("b is woken by a's create");
}

/// A read-only handle refuses a database without Settle's tables; bad URLs say why.
#[tokio::test]
async fn read_only_and_bad_urls() {
    let Some(url) = settle_store::postgres::test_url("ro") else { return };
    let u = url.clone();
    let e = tokio::task::spawn_blocking(move || PgStore::open_read_only(&u)).await.unwrap().unwrap_err();
    assert!(e.to_string().contains("not a settle database"), "{e}");
    let store = open(&url).await;
    store.meta_put("k", "v").await.unwrap();
    let ro = tokio::task::spawn_blocking(move || PgStore::open_read_only(&url)).await.unwrap().unwrap();
    assert_eq!(ro.meta_get("k").await.unwrap().as_deref(), Some("v"));
    assert!(ro.meta_put("k", "w").await.is_err(), "read-only handles do not write");
    let e = PgStore::open("postgres://postgres@127.0.0.1:1/none").unwrap_err();
    assert!(e.to_string().contains("cannot open database `postgres://postgres@127.0.0.1:1/none`"), "{e}");
}

/// Application SQL whose parameter does not convert to the column's type fails that
/// commit alone with `OpError::Sql` (not a retry of the whole batch, as for a lost
/// connection), and changes nothing.
#[tokio::test]
async fn unconvertible_sql_parameter_fails_the_commit_alone() {
    use settle_store::{AfterCommit, Applied, Commit, Fence, HistoryKind, InboxKind, OpError, Push, SqlStatement};
    let Some(url) = settle_store::postgres::test_url("sqlparam") else { return };
    let store = open(&url).await;
    store.sql_execute("CREATE TABLE counters (n BIGINT NOT NULL)").await.unwrap();
    let push = Push {
        machine: "m".into(),
        key: "a".into(),
        event: "go".into(),
        params: serde_json::json!({}),
        request_id: None,
        kind: InboxKind::Raised,
        join_from: None,
        operation: None,
    };
    let r = store
        .write(Batch {
            now: 10,
            ops: vec![Op::Create(entity("a", None)), Op::Push(push)],
            claim: Some(Claim { owner: "engine-a".into(), lease_ms: 60_000, limit: 10, machines: Vec::new() }),
        })
        .await
        .unwrap();
    let e = r.claimed[0].entity.clone();
    let fence = Fence { entity_id: e.id, version: e.version, owner: "engine-a".into() };
    let commit = Commit {
        to: Some("busy".into()),
        sql: vec![SqlStatement {
            sql: "INSERT INTO counters (n) VALUES ($1)".into(),
            params: vec![serde_json::json!("not a number")],
        }],
        ..Commit::new(fence, e.state.clone(), HistoryKind::Event, AfterCommit::Release)
    };
    let started = std::time::Instant::now();
    let r = store.write(Batch { now: 20, ops: vec![Op::Commit(Box::new(commit))], claim: None }).await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(5), "the batch was retried: {:?}", started.elapsed());
    match &r.results[0] {
        Err(OpError::Sql { index: 0, message }) => assert!(message.contains("not a number"), "{message}"),
        other => panic!("expected OpError::Sql, got {other:?}"),
    }
    assert!(!matches!(r.results[0], Ok(Applied::Committed { .. })));
    let after = store.entity_get("m", "a").await.unwrap().unwrap();
    assert_eq!((after.state.as_str(), after.version), ("idle", e.version));
}
