//! Several engine instances on one PostgreSQL schema, each with a store handle of its own
//! as separate processes have: a caller of one instance is answered whichever instance
//! does the work (raise waits, operation waits, sync nested events, state waits), and each instance claims
//! only the machines it serves. Needs `SETTLE_TEST_PG`; without it every test says it
//! skipped and passes.

mod common;

use std::time::Duration;

use serde_json::json;
use settle_core::{Machine, MachineBuilder};
use settle_engine::{Config, Engine, EventOutcome, Outcome, RaiseOptions, Wait};
use settle_store::PgStore;

async fn open(url: &str) -> PgStore {
    let url = url.to_string();
    tokio::task::spawn_blocking(move || PgStore::open(&url)).await.unwrap().expect("open PostgreSQL store")
}

/// `door`: closed -open→ opening (auto: one target, a plain transition) → open -close→ closed.
fn door() -> Machine {
    MachineBuilder::new("door")
        .state("closed")
        .initial()
        .state("opening")
        .auto("swing")
        .state("open")
        .event("open", ["closed"], "start")
        .event("close", ["open"], "shut")
        .action("start", ["opening"])
        .action("swing", ["open"])
        .action("shut", ["closed"])
        .build()
        .unwrap()
}

/// An engine that only writes (it claims nothing): every event it raises is processed by
/// another instance.
fn caller_config() -> Config {
    Config { max_inflight: 0, ..Config::default() }
}

fn wait(w: Wait) -> RaiseOptions {
    RaiseOptions::wait(w).timeout(Duration::from_secs(20))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_are_answered_by_whichever_instance_does_the_work() {
    let Some(url) = settle_store::postgres::test_url("answers") else { return };
    let worker = Engine::builder(open(&url).await).machine(door()).start().await.unwrap();
    let caller = Engine::builder(open(&url).await).machine(door()).config(caller_config()).start().await.unwrap();
    caller.create("door", "d", Default::default()).await.unwrap();
    let r = caller.raise("door", "d", "open", wait(Wait::Stable)).await.unwrap();
    assert_eq!(r.outcome, Some(EventOutcome::Accepted { state: "opening".into() }));
    assert_eq!(r.entity.unwrap().state, "open", "answered once at rest");
    // A rejection recorded by the worker comes back with its reason.
    let r = caller.raise("door", "d", "open", wait(Wait::Outcome)).await.unwrap();
    match r.outcome {
        Some(EventOutcome::Rejected { state, reason }) => {
            assert_eq!(state, "open");
            assert!(reason.contains("not valid in state `open`"), "{reason}");
        }
        other => panic!("expected a rejection, got {other:?}"),
    }
    // A wait for the operation is answered when the worker's commit ends it.
    caller.create("door", "whole", Default::default()).await.unwrap();
    let r = caller.raise("door", "whole", "open", wait(Wait::Operation)).await.unwrap();
    let op = r.operation.expect("the operation");
    assert_eq!((op.outcome.as_deref(), op.ended_at.is_some()), (Some("success"), true));
    assert_eq!(r.entity.unwrap().state, "open");
    // A wait for a state sees the worker's commits.
    caller.raise("door", "d", "close", wait(Wait::Queued)).await.unwrap();
    let e = caller.wait_for_state("door", "d", &["closed"], Duration::from_secs(20)).await.unwrap();
    assert_eq!(e.state, "closed");
    // Many at once.
    let mut raises = tokio::task::JoinSet::new();
    for i in 0..40 {
        let c = caller.clone();
        raises.spawn(async move {
            let key = format!("d{i}");
            c.create("door", &key, Default::default()).await.unwrap();
            c.raise("door", &key, "open", wait(Wait::Stable)).await.unwrap()
        });
    }
    while let Some(r) = raises.join_next().await {
        let r = r.unwrap();
        assert_eq!(r.entity.map(|e| e.state.to_string()).as_deref(), Some("open"), "{:?}", r.outcome);
    }
    let history = caller.history("door", "d0").await.unwrap();
    assert_eq!(history.last().and_then(|h| h.to.as_deref()), Some("open"));
    caller.shutdown().await;
    worker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sync_nested_event_returns_when_another_instance_processes_it() {
    let Some(url) = settle_store::postgres::test_url("nested") else { return };
    // Instance A serves `caller` and only knows `child`; instance B serves `child`.
    let a = Engine::builder(open(&url).await)
        .machine(common::caller())
        .machine(common::child())
        .serve_only(["caller"])
        .on("caller", "ask", |ctx| async move {
            let (outcome, entity) = ctx.raise_and_wait("child", "c", "finish", json!(null)).await?;
            Ok(Outcome::to("told")
                .set("outcome", json!(format!("{outcome:?}")))
                .set("child_state", json!(entity.state.as_str())))
        })
        .start()
        .await
        .unwrap();
    let b = Engine::builder(open(&url).await).machine(common::child()).start().await.unwrap();
    b.create("child", "c", Default::default()).await.unwrap();
    a.create("caller", "k", Default::default()).await.unwrap();
    let r = a.raise("caller", "k", "go", wait(Wait::Stable)).await.unwrap();
    let e = r.entity.unwrap();
    assert_eq!(e.state, "told");
    assert_eq!(e.properties["outcome"], r#"Accepted { state: "ready" }"#);
    assert_eq!(e.properties["child_state"], "ready");
    let child_history = b.history("child", "c").await.unwrap();
    assert_eq!(child_history.last().and_then(|h| h.to.as_deref()), Some("ready"));
    a.shutdown().await;
    b.shutdown().await;
}

/// `job`: new -go→ working (auto) → done; the auto action records which instance ran it.
fn job(name: &str) -> Machine {
    MachineBuilder::new(name)
        .state("new")
        .initial()
        .state("working")
        .auto("work")
        .state("done")
        .event("go", ["new"], "start")
        .action("start", ["working"])
        .action("work", ["done"])
        .build()
        .unwrap()
}

fn bind(
    b: settle_engine::EngineBuilder<PgStore>,
    machine: &'static str,
    who: &'static str,
) -> settle_engine::EngineBuilder<PgStore> {
    b.on(machine, "work", move |_| async move { Ok(Outcome::to("done").set("by", json!(who))) })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_claim_only_the_machines_they_serve() {
    let Some(url) = settle_store::postgres::test_url("served") else { return };
    let a = bind(Engine::builder(open(&url).await).machine(job("alpha")), "alpha", "a").start().await.unwrap();
    let b = bind(Engine::builder(open(&url).await).machine(job("beta")), "beta", "b").start().await.unwrap();
    let driver = Engine::builder(open(&url).await)
        .machine(job("alpha"))
        .machine(job("beta"))
        .config(caller_config())
        .start()
        .await
        .unwrap();
    let mut raises = tokio::task::JoinSet::new();
    for i in 0..20 {
        for machine in ["alpha", "beta"] {
            let d = driver.clone();
            raises.spawn(async move {
                let key = format!("{machine}{i}");
                d.create(machine, &key, Default::default()).await.unwrap();
                let r = d.raise(machine, &key, "go", wait(Wait::Stable)).await.unwrap();
                (machine, r.entity.expect("answered at rest"))
            });
        }
    }
    while let Some(r) = raises.join_next().await {
        let (machine, e) = r.unwrap();
        assert_eq!(e.state, "done");
        let by = if machine == "alpha" { "a" } else { "b" };
        assert_eq!(e.properties["by"], by, "{machine} {} was run by the wrong instance", e.key);
    }
    driver.shutdown().await;
    a.shutdown().await;
    b.shutdown().await;
}
