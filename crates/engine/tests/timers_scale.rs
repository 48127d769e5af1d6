//! 100,000 pending timers are rows, not tasks: written by one engine, they all fire after
//! a restart in another, once the (manual) clock reaches their due time.

mod common;

use std::time::Duration;

use settle_core::MachineBuilder;
use settle_core::machine::Schedule;
use settle_engine::{Config, Engine};
use settle_store::{SqliteStore, Store};

const N: usize = 100_000;

fn sleeper() -> settle_core::Machine {
    MachineBuilder::new("sleeper")
        .state("asleep")
        .initial()
        .state("awake")
        .event("wake", ["asleep"], "rise")
        .action("rise", ["awake"])
        .timer("alarm", "wake", Schedule::After(Duration::from_secs(1)), ["asleep"])
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_thousand_timers_fire_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("timers.db");
    // An engine that writes but processes nothing (no capacity to claim): the timers are
    // all still pending when it stops.
    let clock = common::clock();
    let writer = Engine::builder(SqliteStore::open(&path).unwrap())
        .machine(sleeper())
        .config(Config { max_inflight: 0, ..Config::default() })
        .clock(clock.clone())
        .start()
        .await
        .unwrap();
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..256 {
        let e = writer.clone();
        tasks.spawn(async move {
            for i in (t..N).step_by(256) {
                e.create("sleeper", &format!("s{i:06}"), Default::default()).await.unwrap();
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.unwrap();
    }
    let counts = writer.store().entity_count_by_state("sleeper").await.unwrap();
    assert_eq!(counts, vec![("asleep".to_string(), N as u64)]);
    writer.shutdown().await;
    drop(writer);

    let engine = Engine::builder(SqliteStore::open(&path).unwrap())
        .machine(sleeper())
        .clock(clock.clone())
        .start()
        .await
        .unwrap();
    assert_eq!(engine.wait_caught_up().await.unwrap(), Some(common::T0 + 1_000), "all due in a second, none yet");
    assert_eq!(engine.store().entity_count_by_state("sleeper").await.unwrap()[0].0, "asleep");
    clock.advance(Duration::from_secs(1));
    assert_eq!(engine.wait_caught_up().await.unwrap(), None, "nothing left");
    let counts = engine.store().entity_count_by_state("sleeper").await.unwrap();
    assert_eq!(counts, vec![("awake".to_string(), N as u64)], "every timer fired exactly into its event");
    let some = engine.get("sleeper", "s054321").await.unwrap().unwrap();
    let h = engine.store().history_list(some.id).await.unwrap();
    assert_eq!(h.len(), 2, "created, then woken once: {h:?}");
    assert_eq!((h[1].event.as_deref(), h[1].at), (Some("wake"), common::T0 + 1_000), "on time");
    assert!(engine.store().timer_list(some.id).await.unwrap().is_empty());
    engine.shutdown().await;
}
