//! Workflows across entities: successors, subscriptions, timers, nested events and reads
//! with lock, on a real SQLite file. Timers, timeouts and backoffs run on a manual clock.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use serde_json::json;
use settle_core::machine::Schedule;
use settle_core::{Machine, MachineBuilder};
use settle_engine::{Engine, EventOutcome, ManualClock, Outcome, RaiseOptions, Wait};
use settle_store::{HistoryKind, SqliteStore, Store};

/// `parent`: new -go→ spawning → (creates two children) → waiting ─all ready→ done
///                                                        └─any failed→ broken
/// Parents whose key starts with `h` go to `hold` instead (stable, not listening), which
/// `listen` leaves for `waiting`.
fn parent(timeout: Option<Duration>) -> Machine {
    let mut b = MachineBuilder::new("parent")
        .state("new")
        .initial()
        .state("spawning")
        .auto("spawn")
        .state("hold")
        .state("waiting")
        .state("done")
        .state("broken")
        .error_health()
        .state("timed_out")
        .event("go", ["new"], "start")
        .event("listen", ["hold"], "to_waiting")
        .event("all_ready", ["waiting"], "finish")
        .subscribe("all(child) in [ready]");
    if let Some(t) = timeout {
        b = b.timeout(t, "too_slow");
    }
    b.event("any_failed", ["waiting"], "break")
        .subscribe("any(*) health error")
        .event("too_slow", ["waiting"], "give_up")
        .action("start", ["spawning"])
        .action("to_waiting", ["waiting"])
        .action("spawn", ["waiting", "hold"])
        .action("finish", ["done"])
        .action("break", ["broken"])
        .action("give_up", ["timed_out"])
        .build()
        .unwrap()
}

/// How far ahead `drive_idle` may move the clock: beyond every delay declared here.
const HORIZON: Duration = Duration::from_secs(3600);

async fn engine(timeout: Option<Duration>) -> (tempfile::TempDir, Engine<SqliteStore>, ManualClock) {
    let (dir, store) = common::sqlite();
    let clock = common::clock();
    let engine = Engine::builder(store)
        .machine(common::child())
        .machine(parent(timeout))
        .clock(clock.clone())
        .on("parent", "spawn", |ctx| async move {
            Ok(Outcome::to(if ctx.key.starts_with('h') { "hold" } else { "waiting" })
                .create("child", format!("{}-a", ctx.key), Default::default())
                .create("child", format!("{}-b", ctx.key), Default::default()))
        })
        .on("parent", "finish", |ctx| async move {
            let matched = ctx.params["matched"].as_array().cloned().unwrap_or_default();
            Ok(Outcome::to("done").set("matched", json!(matched.len())))
        })
        .start()
        .await
        .unwrap();
    (dir, engine, clock)
}

fn stable() -> RaiseOptions {
    RaiseOptions::wait(Wait::Stable).timeout(Duration::from_secs(20))
}

async fn state(engine: &Engine<SqliteStore>, machine: &str, key: &str) -> String {
    engine.get(machine, key).await.unwrap().unwrap().state.to_string()
}

#[tokio::test]
async fn all_successors_ready_fires_the_subscription_once_with_the_matches() {
    let (_d, engine, _clock) = engine(None).await;
    engine.create("parent", "p", Default::default()).await.unwrap();
    engine.raise("parent", "p", "go", stable()).await.unwrap();
    assert_eq!(state(&engine, "parent", "p").await, "waiting");
    let p = engine.get("parent", "p").await.unwrap().unwrap();
    let succ = engine.store().successor_snapshot(p.id).await.unwrap().successors;
    assert_eq!(succ.iter().map(|e| e.key.as_str()).collect::<Vec<_>>(), ["p-a", "p-b"]);
    engine.raise("child", "p-a", "finish", stable()).await.unwrap();
    engine.wait_idle().await.unwrap();
    assert_eq!(state(&engine, "parent", "p").await, "waiting", "one child is not enough for `all`");
    engine.raise("child", "p-b", "finish", stable()).await.unwrap();
    engine.wait_idle().await.unwrap();
    let p = engine.get("parent", "p").await.unwrap().unwrap();
    assert_eq!((p.state.as_str(), &p.properties["matched"]), ("done", &json!(2)));
    let h = engine.history("parent", "p").await.unwrap();
    let fired: Vec<_> = h.iter().filter(|r| r.event.as_deref() == Some("all_ready")).collect();
    assert_eq!(fired.len(), 1, "fires once: {h:?}");
    assert_eq!(fired[0].kind, HistoryKind::Event);
    assert!(h.iter().all(|r| r.event.as_deref() != Some("$successors")), "notices leave no history");
    engine.shutdown().await;
}

#[tokio::test]
async fn entering_the_valid_state_when_the_pattern_already_holds_fires_at_once() {
    let (_d, engine, _clock) = engine(None).await;
    engine.create("parent", "h1", Default::default()).await.unwrap();
    engine.raise("parent", "h1", "go", stable()).await.unwrap();
    assert_eq!(state(&engine, "parent", "h1").await, "hold");
    // The children get ready while the parent is in a state where it does not listen.
    engine.raise("child", "h1-a", "finish", stable()).await.unwrap();
    engine.raise("child", "h1-b", "finish", stable()).await.unwrap();
    engine.wait_idle().await.unwrap();
    assert_eq!(state(&engine, "parent", "h1").await, "hold", "no subscription is valid in `hold`");
    assert!(engine.history("parent", "h1").await.unwrap().iter().all(|r| r.event.as_deref() != Some("all_ready")));
    // Entering `waiting` finds the pattern already true and fires.
    engine.raise("parent", "h1", "listen", stable()).await.unwrap();
    engine.wait_idle().await.unwrap();
    assert_eq!(state(&engine, "parent", "h1").await, "done");
    engine.shutdown().await;
}

#[tokio::test]
async fn a_failed_successor_fires_the_error_subscription() {
    let (_d, engine, _clock) = engine(None).await;
    engine.create("parent", "p", Default::default()).await.unwrap();
    engine.raise("parent", "p", "go", stable()).await.unwrap();
    engine.raise("child", "p-a", "fail", stable()).await.unwrap();
    engine.wait_idle().await.unwrap();
    assert_eq!(state(&engine, "parent", "p").await, "broken");
    let h = engine.history("parent", "p").await.unwrap();
    let last = h.last().unwrap();
    assert_eq!(last.event.as_deref(), Some("any_failed"));
    engine.shutdown().await;
}

#[tokio::test]
async fn a_subscription_timeout_fires_its_own_event() {
    let (_d, engine, clock) = engine(Some(Duration::from_millis(200))).await;
    engine.create("parent", "p", Default::default()).await.unwrap();
    engine.raise("parent", "p", "go", stable()).await.unwrap();
    assert_eq!(engine.drive_idle(&clock, HORIZON).await.unwrap(), None);
    assert_eq!(state(&engine, "parent", "p").await, "timed_out");
    let h = engine.history("parent", "p").await.unwrap();
    let fired = h.iter().find(|r| r.event.as_deref() == Some("too_slow")).unwrap();
    assert_eq!(fired.at - common::T0, 200, "the timeout fired 200 ms after the parent entered `waiting`");
    let p = engine.get("parent", "p").await.unwrap().unwrap();
    assert!(engine.store().timer_list(p.id).await.unwrap().is_empty(), "leaving the state drops its timers");
    engine.shutdown().await;
}

#[tokio::test]
async fn a_met_subscription_cancels_its_timeout() {
    let (_d, engine, clock) = engine(Some(Duration::from_millis(300))).await;
    engine.create("parent", "p", Default::default()).await.unwrap();
    engine.raise("parent", "p", "go", stable()).await.unwrap();
    engine.raise("child", "p-a", "finish", stable()).await.unwrap();
    engine.raise("child", "p-b", "finish", stable()).await.unwrap();
    assert_eq!(engine.drive_idle(&clock, HORIZON).await.unwrap(), None, "the timeout is gone with the state");
    assert_eq!(state(&engine, "parent", "p").await, "done");
    let h = engine.history("parent", "p").await.unwrap();
    assert!(h.iter().all(|r| r.event.as_deref() != Some("too_slow")), "{h:?}");
    engine.shutdown().await;
}

fn ticking() -> Machine {
    MachineBuilder::new("ticker")
        .state("on")
        .initial()
        .state("off")
        .state("armed")
        .event("tick", ["on"], "count")
        .event("stop", ["on", "armed"], "halt")
        .event("arm", ["off"], "do_arm")
        .event("boom", ["armed"], "explode")
        .action("count", ["on"])
        .action("halt", ["off"])
        .action("do_arm", ["armed"])
        .action("explode", ["off"])
        .timer("heartbeat", "tick", Schedule::Every(Duration::from_millis(40)), ["on"])
        .timer("fuse", "boom", Schedule::After(Duration::from_millis(150)), ["armed"])
        .build()
        .unwrap()
}

#[tokio::test]
async fn periodic_timers_fire_while_in_their_states_and_stop_when_left() {
    let (_dir, store) = common::sqlite();
    let clock = common::clock();
    let ticks = Arc::new(AtomicU32::new(0));
    let t = ticks.clone();
    let engine = Engine::builder(store)
        .machine(ticking())
        .clock(clock.clone())
        .on("ticker", "count", move |_| {
            t.fetch_add(1, Ordering::SeqCst);
            async { Ok(Outcome::to("on")) }
        })
        .start()
        .await
        .unwrap();
    let e = engine.create("ticker", "t", Default::default()).await.unwrap();
    assert_eq!(engine.store().timer_list(e.id).await.unwrap().len(), 1, "initial state's timer is set at creation");
    for n in 1..=3 {
        assert_eq!(engine.wait_caught_up().await.unwrap(), Some(common::T0 + 40 * n), "the next beat");
        clock.advance(Duration::from_millis(40));
        engine.wait_caught_up().await.unwrap();
        assert_eq!(ticks.load(Ordering::SeqCst), n as u32, "one tick per period");
    }
    engine.raise("ticker", "t", "stop", stable()).await.unwrap();
    assert!(engine.store().timer_list(e.id).await.unwrap().is_empty());
    assert_eq!(engine.drive_idle(&clock, HORIZON).await.unwrap(), None, "nothing scheduled once the state is left");
    assert_eq!(ticks.load(Ordering::SeqCst), 3);
    let h = engine.history("ticker", "t").await.unwrap();
    let after_stop = h.iter().skip_while(|r| r.event.as_deref() != Some("stop")).skip(1);
    for r in after_stop {
        assert_ne!(r.kind, HistoryKind::Event, "no tick is processed once the state is left: {r:?}");
    }
    engine.shutdown().await;
}

#[tokio::test]
async fn a_one_shot_timer_whose_state_was_left_never_fires() {
    let (_dir, store) = common::sqlite();
    let clock = common::clock();
    let engine = Engine::builder(store)
        .machine(ticking())
        .clock(clock.clone())
        .on("ticker", "count", |_| async { Ok(Outcome::to("on")) })
        .start()
        .await
        .unwrap();
    engine.create("ticker", "a", Default::default()).await.unwrap();
    engine.create("ticker", "b", Default::default()).await.unwrap();
    for k in ["a", "b"] {
        engine.raise("ticker", k, "stop", stable()).await.unwrap();
        engine.raise("ticker", k, "arm", stable()).await.unwrap();
    }
    // `a` leaves `armed` before the fuse burns; `b` stays.
    clock.advance(Duration::from_millis(100));
    engine.raise("ticker", "a", "stop", stable()).await.unwrap();
    assert_eq!(engine.drive_idle(&clock, HORIZON).await.unwrap(), None);
    assert_eq!(state(&engine, "ticker", "b").await, "off", "b's fuse fired");
    let hb = engine.history("ticker", "b").await.unwrap();
    assert_eq!(hb.last().unwrap().event.as_deref(), Some("boom"));
    assert_eq!(hb.last().unwrap().at - common::T0, 150, "150 ms after b was armed");
    let ha = engine.history("ticker", "a").await.unwrap();
    assert!(ha.iter().all(|r| r.event.as_deref() != Some("boom")), "a's fuse never fired: {ha:?}");
    engine.shutdown().await;
}

#[tokio::test]
async fn timers_survive_a_restart() {
    let (dir, store) = common::sqlite();
    let path = dir.path().join("engine.db");
    let clock = common::clock();
    let build = |store| {
        Engine::builder(store)
            .machine(ticking())
            .clock(clock.clone())
            .on("ticker", "count", |_| async { Ok(Outcome::to("on")) })
    };
    let engine = build(store).start().await.unwrap();
    engine.create("ticker", "t", Default::default()).await.unwrap();
    engine.raise("ticker", "t", "stop", stable()).await.unwrap();
    engine.raise("ticker", "t", "arm", stable()).await.unwrap();
    engine.shutdown().await;
    drop(engine);
    clock.advance(Duration::from_secs(60));
    let engine = build(SqliteStore::open(&path).unwrap()).start().await.unwrap();
    assert_eq!(engine.wait_caught_up().await.unwrap(), None);
    assert_eq!(state(&engine, "ticker", "t").await, "off", "the fuse set before the restart fired after it");
    engine.shutdown().await;
}

#[tokio::test]
async fn sync_nested_events_return_the_outcome_and_join_the_target() {
    let (_dir, store) = common::sqlite();
    let engine = Engine::builder(store)
        .machine(common::child())
        .machine(common::caller())
        .on("caller", "ask", |ctx| async move {
            let (first, entity) = ctx.raise_and_wait("child", "c", "finish", json!(null)).await?;
            let (second, _) = ctx.raise_and_wait("child", "c", "finish", json!(null)).await?;
            let second = match second {
                EventOutcome::Rejected { reason, .. } => reason,
                other => format!("{other:?}"),
            };
            Ok(Outcome::to("told")
                .set("first", json!(format!("{first:?}")))
                .set("child_state", json!(entity.state.as_str()))
                .set("second", json!(second)))
        })
        .start()
        .await
        .unwrap();
    engine.create("child", "c", Default::default()).await.unwrap();
    engine.create("caller", "k", Default::default()).await.unwrap();
    let r = engine.raise("caller", "k", "go", stable()).await.unwrap();
    let e = r.entity.unwrap();
    assert_eq!(e.state, "told");
    assert_eq!(e.properties["child_state"], "ready");
    assert_eq!(e.properties["first"], r#"Accepted { state: "ready" }"#);
    assert_eq!(e.properties["second"], "event `finish` is not valid in state `ready`");
    let succ = engine.store().successor_snapshot(e.id).await.unwrap().successors;
    assert_eq!(succ.len(), 1, "the nested event joined the child into the caller's workflow");
    engine.shutdown().await;
}

#[tokio::test]
async fn a_read_with_lock_fails_the_commit_when_the_entity_changed() {
    let (_dir, store) = common::sqlite();
    let reader = MachineBuilder::new("reader")
        .state("idle")
        .initial()
        .state("reading")
        .auto("read")
        .state("done")
        .event("go", ["idle"], "start")
        .action("start", ["reading"])
        .action("read", ["done"])
        .build()
        .unwrap();
    let attempts = Arc::new(AtomicU32::new(0));
    let a = attempts.clone();
    let clock = common::clock();
    let engine = Engine::builder(store)
        .machine(common::child())
        .machine(reader)
        .clock(clock.clone())
        .on("reader", "read", move |ctx| {
            let a = a.clone();
            async move {
                let seen = ctx.read_locked("child", "c").await?.expect("child exists");
                if a.fetch_add(1, Ordering::SeqCst) == 0 {
                    // The child changes after it was read: this attempt's commit must fail.
                    ctx.raise_and_wait("child", "c", "finish", json!(null)).await?;
                }
                Ok(Outcome::to("done").set("seen", json!(seen.state.as_str())))
            }
        })
        .start()
        .await
        .unwrap();
    engine.create("child", "c", Default::default()).await.unwrap();
    engine.create("reader", "r", Default::default()).await.unwrap();
    let r = engine.drive(&clock, engine.raise("reader", "r", "go", stable())).await.unwrap();
    let e = r.entity.unwrap();
    assert_eq!((e.state.as_str(), &e.properties["seen"]), ("done", &json!("ready")));
    let h = engine.history("reader", "r").await.unwrap();
    let fault = h.iter().find(|r| r.kind == HistoryKind::Fault).expect("first attempt failed");
    assert!(fault.detail.as_deref().unwrap().contains("changed since it was read"), "{fault:?}");
    assert_eq!(attempts.load(Ordering::SeqCst), 2);
    engine.shutdown().await;
}
