//! How an application that embeds Settle tests its own machines: on a manual clock, a
//! provider that asks to be retried in an hour, and a timer that fires a day later, take
//! no time at all — and their times are exact.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use settle::core::machine::Schedule;
use settle::{Engine, HistoryKind, MachineBuilder, ManualClock, Outcome, RaiseOptions, SqliteStore, Wait};

const T0: i64 = 1_767_225_600_000; // 2026-01-01T00:00:00Z

#[tokio::test]
async fn an_hour_of_retries_and_a_day_long_timer_run_at_once_on_a_manual_clock() {
    let certificate = MachineBuilder::new("certificate")
        .state("requested")
        .initial()
        .state("issuing")
        .auto("issue")
        .state("valid")
        .requires(["serial"])
        .state("expired")
        .event("issue", ["requested"], "begin")
        .event("expire", ["valid"], "lapse")
        .action("begin", ["issuing"])
        .action("issue", ["valid", "issuing"])
        .action("lapse", ["expired"])
        .timer("lifetime", "expire", Schedule::After(Duration::from_secs(86_400)), ["valid"])
        .build()
        .unwrap();
    let calls = Arc::new(AtomicU32::new(0));
    let c = calls.clone();
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let engine = Engine::builder(SqliteStore::open(dir.path().join("certs.db")).unwrap())
        .machine(certificate)
        .clock(clock.clone())
        .on("certificate", "issue", move |_ctx| {
            // The authority is busy twice: come back in an hour.
            let attempt = c.fetch_add(1, Ordering::SeqCst);
            async move {
                if attempt < 2 {
                    return Ok(Outcome::retry_after(Duration::from_secs(3_600)));
                }
                Ok(Outcome::to("valid").set("serial", "c0ffee".into()))
            }
        })
        .start()
        .await
        .unwrap();
    engine.create("certificate", "www", Default::default()).await.unwrap();

    // Waiting for the entity to rest drives the clock through both retries.
    let raised = engine.drive(&clock, engine.raise("certificate", "www", "issue", RaiseOptions::wait(Wait::Stable)));
    let cert = raised.await.unwrap().entity.unwrap();
    assert_eq!((cert.state.as_str(), calls.load(Ordering::SeqCst)), ("valid", 3));
    assert_eq!(cert.entered_at, T0 + 2 * 3_600_000, "issued after two hours of retries");

    // A day later the certificate expires; nothing is left to do after that.
    assert_eq!(engine.drive_idle(&clock, Duration::from_secs(2 * 86_400)).await.unwrap(), None);
    let history = engine.history("certificate", "www").await.unwrap();
    let last = history.last().unwrap();
    assert_eq!((last.kind, last.to.as_deref()), (HistoryKind::Event, Some("expired")));
    assert_eq!(last.at, T0 + 2 * 3_600_000 + 86_400_000, "exactly one day after it became valid");
    engine.shutdown().await;
}
