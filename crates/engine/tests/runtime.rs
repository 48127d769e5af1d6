//! Runtime behaviour on a real SQLite file: events, rejections, auto actions, retries,
//! waits, faults, effects and atomic commits. Retries, backoffs and waits run on a manual
//! clock that `Engine::drive` moves.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use serde_json::json;
use settle_core::{Machine, MachineBuilder};
use settle_engine::{
    ActionContext, Engine, EventOutcome, HandlerError, ManualClock, Outcome, RaiseOptions, Raised, Wait,
};
use settle_store::{HistoryKind, HistoryRow, SqliteStore, Store};

fn server() -> settle_core::Machine {
    MachineBuilder::new("server")
        .state("new")
        .initial()
        .state("creating")
        .auto("provision")
        .state("ready")
        .requires(["endpoint"])
        .state("failed")
        .error_health()
        .state("gone")
        .kind(settle_core::StateKind::Deleted)
        .event("create", ["new"], "begin")
        .reject("creating", "already in progress")
        .reject("ready", "already exists")
        .params(["region"])
        .event("delete", ["ready", "failed"], "remove")
        .action("begin", ["creating"])
        .action("provision", ["ready", "failed"])
        .action("remove", ["gone"])
        .build()
        .unwrap()
}

fn stable(params: serde_json::Value) -> RaiseOptions {
    RaiseOptions::wait(Wait::Stable).params(params).timeout(Duration::from_secs(20))
}

/// An engine on `store` and a manual clock, running `server` (and `more` machines), whose
/// `provision` handler answers `provision(attempt, ctx)`, attempts counted from 0.
async fn server_engine<F>(store: SqliteStore, more: Vec<Machine>, provision: F) -> (Engine<SqliteStore>, ManualClock)
where
    F: Fn(u32, ActionContext) -> Result<Outcome, HandlerError> + Send + Sync + 'static,
{
    let attempts = AtomicU32::new(0);
    let clock = common::clock();
    let provision = Arc::new(provision);
    let mut builder = Engine::builder(store).machine(server()).clock(clock.clone());
    for m in more {
        builder = builder.machine(m);
    }
    let engine = builder
        .on("server", "provision", move |ctx| {
            let (n, provision) = (attempts.fetch_add(1, Ordering::SeqCst), provision.clone());
            async move { provision(n, ctx) }
        })
        .start()
        .await
        .unwrap();
    (engine, clock)
}

/// Creates `s1` and raises `create` on it, driving the clock until it is at rest.
async fn create_s1(engine: &Engine<SqliteStore>, clock: &ManualClock) -> Raised {
    engine.create("server", "s1", Default::default()).await.unwrap();
    engine.drive(clock, engine.raise("server", "s1", "create", stable(json!({"region": "eu"})))).await.unwrap()
}

/// The details of the faults in a history, oldest first.
fn faults(h: &[HistoryRow]) -> Vec<String> {
    h.iter().filter(|r| r.kind == HistoryKind::Fault).map(|r| r.detail.clone().unwrap()).collect()
}

#[tokio::test]
async fn event_runs_workflow_to_stable_state_with_retries() {
    let (_dir, store) = common::sqlite();
    let (engine, clock) = server_engine(store, Vec::new(), |n, ctx| {
        // An auto action runs in the workflow of the event that entered its state, with its
        // parameters, on every retry.
        assert_eq!((ctx.event.as_deref(), ctx.trigger.as_deref()), (None, Some("create")));
        assert_eq!(ctx.params, json!({"region": "eu"}), "the create event's parameters");
        if n < 2 {
            return Ok(Outcome::retry_after(Duration::from_millis(20)));
        }
        Ok(Outcome::to("ready").set("endpoint", json!("10.0.0.1")))
    })
    .await;
    let r = create_s1(&engine, &clock).await;
    assert_eq!(r.outcome, Some(EventOutcome::Accepted { state: "creating".into() }));
    let e = r.entity.unwrap();
    assert_eq!(e.state, "ready");
    assert_eq!(e.properties["endpoint"], json!("10.0.0.1"));
    let h = engine.history("server", "s1").await.unwrap();
    let trail: Vec<_> = h.iter().map(|r| (r.from.as_deref(), r.to.as_deref(), r.kind, r.retry)).collect();
    assert_eq!(
        trail,
        [
            (None, Some("new"), HistoryKind::Create, 0),
            (Some("new"), Some("creating"), HistoryKind::Event, 0),
            (Some("creating"), Some("creating"), HistoryKind::Auto, 1),
            (Some("creating"), Some("creating"), HistoryKind::Auto, 2),
            (Some("creating"), Some("ready"), HistoryKind::Auto, 0),
        ]
    );
    let at: Vec<i64> = h.iter().map(|r| r.at - common::T0).collect();
    assert_eq!(at, [0, 0, 0, 20, 40], "each retry 20 ms after the one before, on the clock");
    assert!(h[1..].iter().all(|r| r.request_id.as_deref() == Some(r.request_id.as_deref().unwrap())));
    assert_eq!(h[4].request_id.as_deref(), Some(r.request_id.as_str()), "auto actions carry the request id");
    assert_eq!(engine.permitted_events("server", "s1").await.unwrap(), ["delete"]);
    engine.shutdown().await;
}

#[tokio::test]
async fn rejected_events_change_nothing_and_report_the_declared_reason() {
    let (_dir, store) = common::sqlite();
    let (engine, clock) =
        server_engine(store, Vec::new(), |_, _| Ok(Outcome::to("ready").set("endpoint", json!("x")))).await;
    create_s1(&engine, &clock).await;
    let before = engine.get("server", "s1").await.unwrap().unwrap();
    let r = engine.raise("server", "s1", "create", stable(json!({"region": "eu"}))).await.unwrap();
    assert_eq!(r.outcome, Some(EventOutcome::Rejected { state: "ready".into(), reason: "already exists".into() }));
    let after = engine.get("server", "s1").await.unwrap().unwrap();
    assert_eq!((after.state.as_str(), after.version), (before.state.as_str(), before.version));
    assert_eq!(after.properties, before.properties);
    let last = engine.history("server", "s1").await.unwrap().pop().unwrap();
    assert_eq!((last.kind, last.detail.as_deref(), last.to), (HistoryKind::Rejected, Some("already exists"), None));
    // Bad input is refused before anything is written.
    let err = engine.raise("server", "s1", "create", stable(json!({}))).await.unwrap_err();
    assert_eq!(err.to_string(), "event `create` on machine `server` requires parameter `region`");
    let err = engine.raise("server", "nope", "delete", stable(json!(null))).await.unwrap_err();
    assert_eq!(err.to_string(), "no entity `nope` of machine `server`");
    assert_eq!(engine.get("server", "s1").await.unwrap().unwrap().version, before.version);
    engine.shutdown().await;
}

#[tokio::test]
async fn missing_handlers_are_refused_at_start() {
    let (_dir, store) = common::sqlite();
    let err = Engine::builder(store).machine(server()).start().await.err().unwrap();
    assert_eq!(err.to_string(), "no handler bound for action `provision` of machine `server`");
}

#[tokio::test]
async fn undeclared_targets_and_broken_invariants_are_faults_that_retry() {
    let (_dir, store) = common::sqlite();
    let (engine, clock) = server_engine(store, Vec::new(), |n, _| {
        Ok(match n {
            0 => Outcome::to("new"),   // not a declared target
            1 => Outcome::to("ready"), // breaks the `endpoint` invariant
            _ => Outcome::to("ready").set("endpoint", json!("e")),
        })
    })
    .await;
    let r = create_s1(&engine, &clock).await;
    assert_eq!(r.entity.unwrap().state, "ready");
    let h = engine.history("server", "s1").await.unwrap();
    assert_eq!(
        faults(&h),
        [
            "action `provision` of machine `server` may not move to `new` (declared: ready, failed)",
            "state `ready` of machine `server` requires `endpoint`",
        ]
    );
    let at: Vec<i64> = h.iter().map(|r| r.at - common::T0).collect();
    assert_eq!(at, [0, 0, 0, 1_000, 3_000], "the default backoff: 1 s, then 2 s");
    engine.shutdown().await;
}

#[tokio::test]
async fn failed_sql_effect_leaves_nothing_and_panics_are_faults() {
    let (_dir, store) = common::sqlite();
    store.sql_execute("CREATE TABLE servers (name TEXT PRIMARY KEY)").await.unwrap();
    store.sql_execute("INSERT INTO servers VALUES ('taken')").await.unwrap();
    let (engine, clock) = server_engine(store, Vec::new(), |n, ctx| {
        let name = if n == 1 { "taken".to_string() } else { ctx.key.to_string() };
        match n {
            0 => panic!("provider exploded"),
            _ => Ok(Outcome::to("ready")
                .set("endpoint", json!("e"))
                .sql("INSERT INTO servers (name) VALUES (?1)", [json!(name)])),
        }
    })
    .await;
    let r = create_s1(&engine, &clock).await;
    assert_eq!(r.entity.unwrap().state, "ready");
    let faults = faults(&engine.history("server", "s1").await.unwrap());
    assert_eq!(faults.len(), 2, "{faults:?}");
    assert_eq!(faults[0], "action panicked: provider exploded");
    assert!(faults[1].starts_with("commit failed: sql statement 0 failed: UNIQUE constraint failed"), "{}", faults[1]);
    engine.shutdown().await;
}

#[tokio::test]
async fn effects_create_entities_and_raise_events_atomically() {
    let (_dir, store) = common::sqlite();
    let child = MachineBuilder::new("child")
        .state("idle")
        .initial()
        .state("poked")
        .event("poke", ["idle"], "take")
        .params(["n"])
        .action("take", ["poked"])
        .build()
        .unwrap();
    let (engine, clock) = server_engine(store, vec![child], |_, ctx| {
        Ok(Outcome::to("ready")
            .set("endpoint", json!("e"))
            .create("child", format!("{}-a", ctx.key), Default::default())
            .create("child", format!("{}-b", ctx.key), Default::default())
            .raise("child", "existing", "poke", json!({"n": 1})))
    })
    .await;
    engine.create("child", "existing", Default::default()).await.unwrap();
    let r = create_s1(&engine, &clock).await;
    assert_eq!(r.entity.unwrap().state, "ready");
    engine.wait_idle().await.unwrap();
    assert_eq!(engine.get("child", "s1-a").await.unwrap().unwrap().state, "idle");
    assert_eq!(engine.get("child", "s1-b").await.unwrap().unwrap().state, "idle");
    let poked = engine.get("child", "existing").await.unwrap().unwrap();
    assert_eq!(poked.state, "poked");
    assert_eq!(poked.request_id.as_deref(), Some(r.request_id.as_str()), "the request id travels with nested events");
    engine.shutdown().await;
}

#[tokio::test]
async fn waits_on_states_and_transitions_delay_the_auto_action() {
    let (_dir, store) = common::sqlite();
    let m = MachineBuilder::new("slow")
        .state("idle")
        .initial()
        .state("cooling")
        .auto("cool")
        .wait(Duration::from_millis(150))
        .state("done")
        .event("go", ["idle"], "start")
        .action("start", ["cooling"])
        .target_wait("cooling", Duration::from_millis(100))
        .action("cool", ["done"])
        .build()
        .unwrap();
    let clock = common::clock();
    let engine = Engine::builder(store).machine(m).clock(clock.clone()).start().await.unwrap();
    engine.create("slow", "x", Default::default()).await.unwrap();
    let r = engine.drive(&clock, engine.raise("slow", "x", "go", stable(json!(null)))).await.unwrap();
    assert_eq!(r.entity.unwrap().state, "done");
    let h = engine.history("slow", "x").await.unwrap();
    let waited = h[2].at - h[1].at;
    assert_eq!(waited, 250, "the auto action ran after the state's wait (150 ms) and the transition's (100 ms)");
    engine.shutdown().await;
}
