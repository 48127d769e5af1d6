//! Operating the engine: run status and commands, the fault policy, operations and their
//! outcomes, idempotency keys, and definition upgrades checked against live data. Timers,
//! backoffs, waits and the supervisor run on a manual clock.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use serde_json::json;
use settle_core::fault::FaultPolicy;
use settle_core::machine::Schedule;
use settle_core::{Machine, MachineBuilder};
use settle_engine::{Command, Config, Engine, ManualClock, Outcome, RaiseOptions, RunStatus, Wait};
use settle_store::{HistoryKind, SqliteStore, Store};

/// How far ahead `drive_idle` may move the clock: far beyond any delay declared here.
const HORIZON: Duration = Duration::from_secs(3600);

fn job(policy: FaultPolicy) -> Machine {
    MachineBuilder::new("job")
        .state("idle")
        .initial()
        .state("working")
        .auto("work")
        .state("done")
        .event("go", ["idle"], "start")
        .action("start", ["working"])
        .action("work", ["done"])
        .fault_policy(policy)
        .build()
        .unwrap()
}

fn quick_policy() -> FaultPolicy {
    FaultPolicy {
        max_errors: 3,
        window: Duration::from_secs(3600),
        backoff_min: Duration::from_millis(10),
        backoff_max: Duration::from_millis(40),
    }
}

/// Polls until `check` holds (progress-based, bounded: for work that runs outside the
/// engine's clock, such as a handler waiting on the test); panics with `what` otherwise.
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..500 {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for: {what}");
}

#[tokio::test]
async fn a_poison_entity_is_parked_then_completes_after_the_fix_and_a_resume() {
    let dir = tempfile::tempdir().unwrap();
    let fixed = Arc::new(AtomicBool::new(false));
    let calls = Arc::new(AtomicU32::new(0));
    let (f, c) = (fixed.clone(), calls.clone());
    let clock = common::clock();
    let engine = Engine::builder(SqliteStore::open(dir.path().join("p.db")).unwrap())
        .machine(job(quick_policy()))
        .clock(clock.clone())
        .on("job", "work", move |_| {
            c.fetch_add(1, Ordering::SeqCst);
            let ok = f.load(Ordering::SeqCst);
            async move { if ok { Ok(Outcome::to("done")) } else { Err("provider is down".into()) } }
        })
        .start()
        .await
        .unwrap();
    engine.create("job", "j", Default::default()).await.unwrap();
    let raised = engine.raise("job", "j", "go", RaiseOptions::default()).await.unwrap();
    assert_eq!(engine.drive_idle(&clock, HORIZON).await.unwrap(), None, "a parked entity is due for nothing");
    let e = engine.get("job", "j").await.unwrap().unwrap();
    assert_eq!((e.state.as_str(), e.run_status), ("working", RunStatus::Failed), "parked after 3 errors");
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    assert_eq!(e.recent_errors.len(), 3);
    let faults: Vec<_> =
        engine.history("job", "j").await.unwrap().into_iter().filter(|h| h.kind == HistoryKind::Fault).collect();
    assert_eq!(faults.len(), 3, "every error is recorded");
    assert!(faults.iter().all(|h| h.detail.as_deref() == Some("action error: provider is down")));
    let op = engine.operation(&raised.request_id).await.unwrap().unwrap();
    assert_eq!(op.outcome.as_deref(), Some("failed"));
    assert_eq!(op.error.as_deref(), Some("action error: provider is down"));
    assert!(op.ended_at.is_some());

    // The operator fixes the cause and resumes: the state is preserved and it completes.
    fixed.store(true, Ordering::SeqCst);
    let resumed = engine.command("job", "j", Command::Resume, None).await.unwrap();
    assert_eq!(resumed.entity.run_status, RunStatus::Active);
    engine.drive_idle(&clock, HORIZON).await.unwrap();
    let e = engine.get("job", "j").await.unwrap().unwrap();
    assert_eq!((e.state.as_str(), e.run_status), ("done", RunStatus::Active));
    engine.shutdown().await;
}

/// Outcomes as a user reads them: work that recovered from a transient fault succeeded
/// (its error stays in the entity's errors); a rejected event's operation failed, saying why.
#[tokio::test]
async fn a_recovered_fault_succeeds_and_a_rejected_event_fails_its_operation() {
    let dir = tempfile::tempdir().unwrap();
    let calls = Arc::new(AtomicU32::new(0));
    let c = calls.clone();
    let clock = common::clock();
    let engine = Engine::builder(SqliteStore::open(dir.path().join("o.db")).unwrap())
        .machine(job(quick_policy()))
        .clock(clock.clone())
        .on("job", "work", move |_| {
            let first = c.fetch_add(1, Ordering::SeqCst) == 0;
            async move { if first { Err("provider timed out".into()) } else { Ok(Outcome::to("done")) } }
        })
        .start()
        .await
        .unwrap();
    engine.create("job", "j", Default::default()).await.unwrap();
    let raised = engine.raise("job", "j", "go", RaiseOptions::default()).await.unwrap();
    engine.drive_idle(&clock, HORIZON).await.unwrap();
    let e = engine.get("job", "j").await.unwrap().unwrap();
    assert_eq!((e.state.as_str(), e.run_status, calls.load(Ordering::SeqCst)), ("done", RunStatus::Active, 2));
    let op = engine.operation(&raised.request_id).await.unwrap().unwrap();
    assert_eq!((op.outcome.as_deref(), op.error.as_deref()), (Some("success"), None), "{op:?}");
    assert_eq!(engine.store().error_list(e.id, 10).await.unwrap().len(), 1, "the retried error is kept");

    // `go` is not valid in `done`: the request's operation fails with the reason.
    let rejected = engine.raise("job", "j", "go", RaiseOptions::default()).await.unwrap();
    engine.drive_idle(&clock, HORIZON).await.unwrap();
    let op = engine.operation(&rejected.request_id).await.unwrap().unwrap();
    assert_eq!(op.outcome.as_deref(), Some("failed"), "{op:?}");
    let error = op.error.unwrap_or_default();
    assert!(error.starts_with("event `go` rejected in state `done`"), "{error}");
    engine.shutdown().await;
}

fn ticker() -> Machine {
    MachineBuilder::new("ticker")
        .state("on")
        .initial()
        .state("cooling")
        .auto("cool")
        .wait(Duration::from_millis(150))
        .state("cold")
        .event("tick", ["on"], "count")
        .event("note", ["on"], "write")
        .params(["n"])
        .event("chill", ["on"], "start_cooling")
        .action("count", ["on"])
        .action("write", ["on"])
        .action("start_cooling", ["cooling"])
        .action("cool", ["cold"])
        .timer("beat", "tick", Schedule::Every(Duration::from_millis(25)), ["on"])
        .build()
        .unwrap()
}

async fn ticker_engine(path: &std::path::Path, clock: &ManualClock) -> Engine<SqliteStore> {
    Engine::builder(SqliteStore::open(path).unwrap())
        .machine(ticker())
        .clock(clock.clone())
        .on("ticker", "count", |ctx| async move {
            let n = ctx.properties.get("ticks").and_then(|v| v.as_u64()).unwrap_or(0);
            Ok(Outcome::to("on").set("ticks", json!(n + 1)))
        })
        .on("ticker", "write", |ctx| async move {
            let mut notes = ctx.properties.get("notes").and_then(|v| v.as_array().cloned()).unwrap_or_default();
            notes.push(ctx.params["n"].clone());
            Ok(Outcome::to("on").set("notes", json!(notes)))
        })
        .start()
        .await
        .unwrap()
}

#[tokio::test]
async fn pause_stops_timers_and_auto_actions_and_queued_events_run_in_order_on_resume() {
    let dir = tempfile::tempdir().unwrap();
    let clock = common::clock();
    let engine = ticker_engine(&dir.path().join("t.db"), &clock).await;
    engine.create("ticker", "t", Default::default()).await.unwrap();
    let ticks = |e: &settle_store::EntityRow| e.properties.get("ticks").and_then(|v| v.as_u64()).unwrap_or(0);
    let beat = Duration::from_millis(25);
    for n in 1..=2 {
        clock.advance(beat);
        engine.wait_caught_up().await.unwrap();
        assert_eq!(ticks(&engine.get("ticker", "t").await.unwrap().unwrap()), n, "one tick per period");
    }
    let paused = engine.command("ticker", "t", Command::Pause, None).await.unwrap();
    assert_eq!(paused.entity.run_status, RunStatus::Paused);
    engine.wait_caught_up().await.unwrap();
    let before = engine.get("ticker", "t").await.unwrap().unwrap();
    for n in 1..=3 {
        engine.raise("ticker", "t", "note", RaiseOptions::default().params(json!({ "n": n }))).await.unwrap();
    }
    // Ten timer periods pass: nothing runs while paused.
    clock.advance(beat * 10);
    engine.wait_caught_up().await.unwrap();
    let during = engine.get("ticker", "t").await.unwrap().unwrap();
    assert_eq!((ticks(&during), during.version), (ticks(&before), before.version), "no timer ran while paused");
    assert_eq!(engine.store().inbox_list(during.id).await.unwrap().len(), 3, "events queue while paused");
    engine.command("ticker", "t", Command::Resume, None).await.unwrap();
    engine.wait_caught_up().await.unwrap();
    let resumed = engine.get("ticker", "t").await.unwrap().unwrap();
    assert_eq!(resumed.properties.get("notes"), Some(&json!([1, 2, 3])), "the queued notes, in order");
    clock.advance(beat);
    engine.wait_caught_up().await.unwrap();
    assert!(ticks(&engine.get("ticker", "t").await.unwrap().unwrap()) > ticks(&before), "the timer ticks again");
    // A paused entity's auto action waits too.
    engine.raise("ticker", "t", "chill", RaiseOptions::wait(Wait::Outcome)).await.unwrap();
    engine.command("ticker", "t", Command::Pause, None).await.unwrap();
    clock.advance(Duration::from_millis(300));
    engine.wait_caught_up().await.unwrap();
    assert_eq!(engine.get("ticker", "t").await.unwrap().unwrap().state, "cooling", "auto action held by the pause");
    engine.command("ticker", "t", Command::Resume, None).await.unwrap();
    engine.wait_caught_up().await.unwrap();
    assert_eq!(engine.get("ticker", "t").await.unwrap().unwrap().state, "cold", "resumed past its wait: runs at once");
    engine.shutdown().await;
}

#[tokio::test]
async fn a_killed_entity_stays_untouched_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("k.db");
    let clock = common::clock();
    let engine = ticker_engine(&path, &clock).await;
    engine.create("ticker", "k", Default::default()).await.unwrap();
    engine.raise("ticker", "k", "chill", RaiseOptions::wait(Wait::Outcome)).await.unwrap();
    // Paused, the entity keeps the next event queued: the kill must cancel it.
    engine.command("ticker", "k", Command::Pause, None).await.unwrap();
    let raised = engine.raise("ticker", "k", "note", RaiseOptions::default().params(json!({"n": 1}))).await.unwrap();
    let killed = engine.command("ticker", "k", Command::Kill, None).await.unwrap();
    assert_eq!(killed.entity.run_status, RunStatus::Killed);
    let err = engine.command("ticker", "k", Command::Resume, None).await.unwrap_err();
    assert_eq!(err.to_string(), "entity `k` of machine `ticker` was killed");
    engine.shutdown().await;
    drop(engine);
    let engine = ticker_engine(&path, &clock).await;
    clock.advance(Duration::from_millis(300)); // past the auto action's wait
    assert_eq!(engine.wait_caught_up().await.unwrap(), None, "nothing left to do for a killed entity");
    let e = engine.get("ticker", "k").await.unwrap().unwrap();
    assert_eq!((e.state.as_str(), e.version, e.run_status), ("cooling", killed.entity.version, RunStatus::Killed));
    assert!(engine.store().inbox_list(e.id).await.unwrap().is_empty(), "pending work was canceled");
    assert!(engine.store().timer_list(e.id).await.unwrap().is_empty());
    let op = engine.operation(&raised.request_id).await.unwrap().unwrap();
    assert_eq!(op.outcome.as_deref(), Some("canceled"));
    engine.shutdown().await;
}

#[tokio::test]
async fn replaying_an_idempotency_key_returns_the_first_operation_and_raises_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let engine = ticker_engine(&dir.path().join("i.db"), &common::clock()).await;
    let first = engine.create_with("ticker", "i", Default::default(), Some("create-i".into())).await.unwrap();
    let again = engine.create_with("ticker", "i", Default::default(), Some("create-i".into())).await.unwrap();
    assert!(!first.replayed && again.replayed);
    assert_eq!(again.entity.id, first.entity.id);
    let opts = || RaiseOptions::wait(Wait::Stable).params(json!({"n": 7})).request_id("note-7");
    let a = engine.raise("ticker", "i", "note", opts()).await.unwrap();
    let b = engine.raise("ticker", "i", "note", opts()).await.unwrap();
    assert!(!a.replayed && b.replayed && b.inbox_id.is_none());
    let notes =
        engine.history("ticker", "i").await.unwrap().iter().filter(|h| h.event.as_deref() == Some("note")).count();
    assert_eq!(notes, 1, "the event was raised once");
    let op = engine.operation("note-7").await.unwrap().unwrap();
    assert_eq!((op.name.as_str(), op.outcome.as_deref()), ("ticker.note", Some("success")));
    let cmd1 = engine.command("ticker", "i", Command::Pause, Some("pause-1".into())).await.unwrap();
    engine.command("ticker", "i", Command::Resume, None).await.unwrap();
    let cmd2 = engine.command("ticker", "i", Command::Pause, Some("pause-1".into())).await.unwrap();
    assert!(!cmd1.replayed && cmd2.replayed);
    assert_eq!(cmd2.entity.run_status, RunStatus::Active, "the replayed pause did nothing");
    // A key of another request (another command, a create) is refused, and nothing is done.
    for (command, key) in [(Command::Resume, "pause-1"), (Command::Pause, "create-i")] {
        let err = engine.command("ticker", "i", command, Some(key.into())).await.unwrap_err();
        assert!(matches!(err, settle_engine::Error::KeyReused { .. }), "{err}");
    }
    assert_eq!(engine.get("ticker", "i").await.unwrap().unwrap().run_status, RunStatus::Active);
    engine.shutdown().await;
}

fn versioned(renamed: bool) -> Machine {
    let mut b = MachineBuilder::new("doc").state("draft").initial().state("published");
    if renamed {
        b = b.renamed_from(["live"]);
    }
    b.state("archived")
        .kind(settle_core::StateKind::Terminal)
        .event("publish", ["draft"], "do_publish")
        .event("archive", ["published"], "do_archive")
        .action("do_publish", ["published"])
        .action("do_archive", ["archived"])
        .build()
        .unwrap()
}

#[tokio::test]
async fn an_upgrade_that_drops_an_occupied_state_is_refused_unless_mapped() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("u.db");
    let v1 = MachineBuilder::new("doc")
        .state("draft")
        .initial()
        .state("live")
        .event("publish", ["draft"], "do_publish")
        .event("unpublish", ["live"], "do_unpublish")
        .action("do_publish", ["live"])
        .action("do_unpublish", ["draft"])
        .build()
        .unwrap();
    let engine = Engine::builder(SqliteStore::open(&path).unwrap()).machine(v1).start().await.unwrap();
    for k in ["a", "b"] {
        engine.create("doc", k, Default::default()).await.unwrap();
        engine.raise("doc", k, "publish", RaiseOptions::wait(Wait::Stable)).await.unwrap();
    }
    engine.create("doc", "c", Default::default()).await.unwrap();
    engine.shutdown().await;
    drop(engine);

    let err = Engine::builder(SqliteStore::open(&path).unwrap()).machine(versioned(false)).start().await.err().unwrap();
    assert_eq!(
        err.to_string(),
        "definition upgrade refused: machine `doc`: the new definition has no state for 2 entities in `live` \
         (declare `renamed_from` on a state or a `[migrate]` entry); in `live`: a, b"
    );
    let store = SqliteStore::open(&path).unwrap();
    assert_eq!(store.entity_get("doc", "a").await.unwrap().unwrap().state, "live", "a refused upgrade changes nothing");
    let engine = Engine::builder(store).machine(versioned(true)).start().await.unwrap();
    assert_eq!(engine.get("doc", "a").await.unwrap().unwrap().state, "published");
    let r = engine.raise("doc", "a", "archive", RaiseOptions::wait(Wait::Stable)).await.unwrap();
    assert_eq!(r.entity.unwrap().state, "archived", "migrated entities continue under the new definition");
    let versions = engine.store().machine_versions().await.unwrap();
    assert_eq!(versions.len(), 2);
    let h = engine.history("doc", "a").await.unwrap();
    assert!(h.iter().any(|r| r.detail.as_deref() == Some("upgrade: state renamed")), "{h:?}");
    engine.shutdown().await;
}

#[tokio::test]
async fn an_operation_without_progress_is_marked_hung_and_ends_when_the_work_does() {
    let dir = tempfile::tempdir().unwrap();
    let release = Arc::new(tokio::sync::Notify::new());
    let r = release.clone();
    let config =
        Config { hung_after: Duration::from_secs(600), supervise_every: Duration::from_secs(10), ..Config::default() };
    let clock = common::clock();
    let engine = Engine::builder(SqliteStore::open(dir.path().join("h.db")).unwrap())
        .machine(job(FaultPolicy::default()))
        .config(config)
        .clock(clock.clone())
        .on("job", "work", move |_| {
            let r = r.clone();
            async move {
                r.notified().await;
                Ok(Outcome::to("done"))
            }
        })
        .start()
        .await
        .unwrap();
    engine.create("job", "slow", Default::default()).await.unwrap();
    let raised = engine.raise("job", "slow", "go", RaiseOptions::default()).await.unwrap();
    let outcome = || async { engine.operation(&raised.request_id).await.unwrap().unwrap().outcome };
    assert_eq!(outcome().await, None);
    // Eleven minutes without progress: the supervisor's next round marks it hung.
    clock.advance(Duration::from_secs(660));
    eventually("the supervisor marks the operation hung", || async { outcome().await.as_deref() == Some("hung") })
        .await;
    release.notify_one();
    engine.wait_idle().await.unwrap();
    let op = engine.operation(&raised.request_id).await.unwrap().unwrap();
    assert_eq!(op.outcome.as_deref(), Some("success"), "finishing later still ends it");
    assert!(op.first_response_at.is_some() && op.ended_at.is_some());
    engine.shutdown().await;
}

/// `parent`: `go` spawns two children that build slowly, then rests in `waiting` until
/// they are all `built`, and ends `done`.
fn family() -> (Machine, Machine) {
    let parent = MachineBuilder::new("parent")
        .state("idle")
        .initial()
        .state("spawning")
        .auto("spawn")
        .state("waiting")
        .state("done")
        .event("go", ["idle"], "start")
        .event("children_built", ["waiting"], "finish")
        .subscribe("all(*) in [built]")
        .action("start", ["spawning"])
        .action("spawn", ["waiting"])
        .action("finish", ["done"])
        .build()
        .unwrap();
    let child = MachineBuilder::new("child")
        .state("new")
        .initial()
        .state("building")
        .auto("work")
        .state("built")
        .event("build", ["new"], "begin")
        .action("begin", ["building"])
        .action("work", ["built"])
        .build()
        .unwrap();
    (parent, child)
}

#[tokio::test]
async fn wait_operation_answers_when_every_entity_the_operation_reached_is_at_rest() {
    let dir = tempfile::tempdir().unwrap();
    let clock = common::clock();
    let (parent, child) = family();
    let attempts = Arc::new(AtomicU32::new(0));
    let a = attempts.clone();
    let engine =
        Engine::builder(SqliteStore::open(dir.path().join("w.db")).unwrap())
            .machine(parent)
            .machine(child)
            .clock(clock.clone())
            .on("parent", "spawn", |ctx| async move {
                let mut out = Outcome::to("waiting");
                for i in 0..2 {
                    let key = format!("{}-{i}", ctx.key);
                    out =
                        out.create("child", key.clone(), Default::default()).raise("child", key, "build", json!(null));
                }
                Ok(out)
            })
            // Each child's first attempt asks for another 50 ms: the children are still
            // building when the parent rests in `waiting`.
            .on("child", "work", move |_| {
                let first = a.fetch_add(1, Ordering::SeqCst) < 2;
                async move {
                    if first { Ok(Outcome::retry_after(Duration::from_millis(50))) } else { Ok(Outcome::to("built")) }
                }
            })
            .start()
            .await
            .unwrap();
    engine.create("parent", "p1", Default::default()).await.unwrap();
    engine.create("parent", "p2", Default::default()).await.unwrap();
    let timeout = Duration::from_secs(20);

    // `stable` answers at the parent's next stable state, before its children are done.
    let stable = RaiseOptions::wait(Wait::Stable).timeout(timeout).request_id("op-stable");
    let r = engine.drive(&clock, engine.raise("parent", "p1", "go", stable)).await.unwrap();
    assert_eq!(r.entity.as_ref().map(|e| e.state.as_str()), Some("waiting"));
    assert!(r.operation.is_none());
    let open = engine.operation("op-stable").await.unwrap().unwrap();
    assert_eq!((open.ended_at, open.outcome), (None, None), "the children are still building");
    // The operation ends once the children are built and the parent is done.
    let op = engine.drive(&clock, engine.wait_operation("op-stable", timeout)).await.unwrap();
    assert_eq!(op.outcome.as_deref(), Some("success"));
    assert_eq!(engine.get("parent", "p1").await.unwrap().unwrap().state, "done");

    // `operation` answers when the whole operation ended: the parent done, every child built.
    let whole = RaiseOptions::wait(Wait::Operation).timeout(timeout).request_id("op-whole");
    let r = engine.drive(&clock, engine.raise("parent", "p2", "go", whole.clone())).await.unwrap();
    let op = r.operation.expect("the operation");
    assert_eq!((op.request_id.as_str(), op.outcome.as_deref()), ("op-whole", Some("success")));
    assert!(op.ended_at.is_some());
    assert_eq!(r.entity.as_ref().map(|e| e.state.as_str()), Some("done"), "the entity as the operation left it");
    for i in 0..2 {
        let c = engine.get("child", &format!("p2-{i}")).await.unwrap().unwrap();
        assert_eq!(c.state, "built");
    }
    assert!(matches!(r.outcome, Some(settle_engine::EventOutcome::Accepted { .. })), "{:?}", r.outcome);

    // The same request again is a replay that answers with the operation as it ended.
    let again = engine.raise("parent", "p2", "go", whole).await.unwrap();
    assert!(again.replayed);
    assert_eq!(again.operation.map(|o| o.outcome), Some(Some("success".to_string())));

    // A request id nobody used: the wait runs out.
    let err = engine.wait_operation("no-such-request", Duration::from_millis(50)).await.unwrap_err();
    assert!(matches!(err, settle_engine::Error::Timeout { .. }), "{err}");
    engine.shutdown().await;
}
