//! What the engine's integration tests share: a SQLite store in a temporary directory and
//! a manual clock. Time in these tests moves only when a test moves it (directly, or
//! through `Engine::drive`), never by sleeping.

#![allow(dead_code)]

use std::time::Duration;

use settle_store::{Clock as _, ManualClock, SqliteStore};

/// Where every manual clock starts: 2026-01-01T00:00:00Z.
pub const T0: i64 = 1_767_225_600_000;

/// A SQLite store in a fresh temporary directory (kept alive by the returned guard).
pub fn sqlite() -> (tempfile::TempDir, SqliteStore) {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("engine.db")).unwrap();
    (dir, store)
}

/// The stores a test runs on: SQLite, and PostgreSQL (a schema of its own, `name`) when
/// `SETTLE_TEST_PG` is set. Each with the temporary directory it may use.
pub async fn stores(name: &str) -> Vec<(tempfile::TempDir, settle_store::AnyStore)> {
    let (dir, sqlite) = sqlite();
    let mut out = vec![(dir, settle_store::AnyStore::Sqlite(sqlite))];
    if let Some(url) = settle_store::postgres::test_url(name) {
        let pg = tokio::task::spawn_blocking(move || settle_store::PgStore::open(&url))
            .await
            .unwrap()
            .expect("PostgreSQL store");
        out.push((tempfile::tempdir().unwrap(), settle_store::AnyStore::Postgres(pg)));
    }
    out
}

/// A clock standing at [`T0`].
pub fn clock() -> ManualClock {
    ManualClock::new(T0)
}

/// `child`: waiting -finish→ ready, or -fail→ failed (error health).
pub fn child() -> settle_core::Machine {
    settle_core::MachineBuilder::new("child")
        .state("waiting")
        .initial()
        .state("ready")
        .state("failed")
        .error_health()
        .event("finish", ["waiting"], "do_finish")
        .event("fail", ["waiting"], "do_fail")
        .action("do_finish", ["ready"])
        .action("do_fail", ["failed"])
        .build()
        .unwrap()
}

/// `caller`: idle -go→ asking, whose auto action `ask` (bound by each test, typically to a
/// sync nested event on a `child`) → told.
pub fn caller() -> settle_core::Machine {
    settle_core::MachineBuilder::new("caller")
        .state("idle")
        .initial()
        .state("asking")
        .auto("ask")
        .state("told")
        .event("go", ["idle"], "start")
        .action("start", ["asking"])
        .action("ask", ["told"])
        .build()
        .unwrap()
}

/// Moves the clock to `at`, then on a little at a time (the bulk runner paces its pages on
/// it) until `done` holds; fails after 20 seconds of real time.
pub async fn settle_at<F, Fut>(clock: &ManualClock, at: i64, done: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let now = clock.now_ms();
        if now < at {
            clock.advance(Duration::from_millis((at - now) as u64));
        } else if done().await {
            return;
        } else {
            // Pages of bulk operations pace on this clock: let a little time pass.
            clock.advance(Duration::from_millis(10));
        }
        assert!(tokio::time::Instant::now() < deadline, "nothing settled by {}", settle_core::time::format_time(at));
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Waits (up to 30 s, polling the store) until `check` holds on what the limits hold now;
/// says what it waited for if not. (Flow control's state lives in the store, changed by the
/// engine's own batches: polling it is how a test sees it.)
pub async fn limits_until<S: settle_store::Store, F: Fn(&[settle_store::LimitUsage]) -> bool>(
    store: &S,
    what: &str,
    check: F,
) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let usage = store.limit_list().await.unwrap();
        if check(&usage) {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting until {what}: {usage:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// (in use, waiting) of a limit's key value `key`; zeros when it holds and waits nothing.
pub fn limit_usage(usage: &[settle_store::LimitUsage], key: &str) -> (u64, u64) {
    usage.iter().find(|u| u.key == key).map_or((0, 0), |u| (u.in_use, u.waiting))
}
