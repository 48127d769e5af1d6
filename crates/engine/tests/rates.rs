//! Rates, fairness and priorities of limits, end to end on both stores: a rate spaces the
//! starts of its actions on the engine's clock (a manual one here: none starts early, none
//! late); a global limit with `fair_by` admits a tenant arriving behind another's backlog
//! after one of that backlog, not after all of it; waiting work goes by the priority of the
//! request that started it (given, declared by its event, a bulk operation's lower one).

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use settle_core::limits::LimitDef;
use settle_core::{Machine, MachineBuilder};
use settle_engine::{BulkAction, BulkRequest, Engine, Outcome, RaiseOptions, Selection, Wait};
use settle_store::{AnyStore, Clock, Store};

/// `job`: idle -go→ working (auto `work`, under `limit`) → done; `urgent` (declared
/// priority 5) does as `go` does.
fn job(limit: LimitDef) -> Machine {
    MachineBuilder::new("job")
        .properties(["tenant"])
        .state("idle")
        .initial()
        .state("working")
        .auto("work")
        .state("done")
        .event("go", ["idle"], "begin")
        .event("urgent", ["idle"], "begin")
        .priority(5)
        .action("begin", ["working"])
        .action("work", ["done"])
        .limit(limit)
        .build()
        .unwrap()
}

async fn go(engine: &Engine<AnyStore>, key: &str, tenant: &str) {
    let props = serde_json::from_value(serde_json::json!({ "tenant": tenant })).unwrap();
    engine.create("job", key, props).await.unwrap();
    engine.raise("job", key, "go", RaiseOptions::wait(Wait::Queued)).await.unwrap();
}

/// Waits (up to 30 s of real time) until `check` holds.
async fn until(what: &str, check: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !check() {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// An engine running `job` under `limit`, its action recording its key (in the order the
/// calls start) and then waiting for a permit of the gate before it ends.
async fn gated(
    store: &AnyStore,
    limit: LimitDef,
) -> (Engine<AnyStore>, Arc<Mutex<Vec<String>>>, Arc<tokio::sync::Semaphore>) {
    let started: Arc<Mutex<Vec<String>>> = Arc::default();
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let (s, g) = (started.clone(), gate.clone());
    let engine = Engine::builder(store.clone())
        .machine(job(limit))
        .on("job", "work", move |ctx| {
            let (s, g) = (s.clone(), g.clone());
            async move {
                s.lock().unwrap().push(ctx.key.to_string());
                g.acquire().await.unwrap().forget();
                Ok(Outcome::to("done"))
            }
        })
        .start()
        .await
        .unwrap();
    (engine, started, gate)
}

/// Waits (up to 30 s) until one call holds the limit's slot and `n` wait for it.
async fn waiting(store: &AnyStore, n: u64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let u = store.limit_list().await.unwrap();
        if u.iter().any(|u| u.in_use == 1 && u.waiting == n) {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "never {n} waiting: {u:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_spaces_starts_on_the_clock_none_early_none_late() {
    for (_dir, store) in common::stores("limits_rate").await {
        let clock = common::clock();
        let starts: Arc<Mutex<Vec<i64>>> = Arc::default();
        let paced = LimitDef {
            name: "paced".into(),
            states: vec!["working".into()],
            rate: Some(2),
            per_ms: Some(1_000),
            ..LimitDef::default()
        };
        let (s, c) = (starts.clone(), clock.clone());
        let engine = Engine::builder(store.clone())
            .clock(clock.clone())
            .machine(job(paced))
            .on("job", "work", move |_ctx| {
                s.lock().unwrap().push(c.now_ms());
                async { Ok(Outcome::to("done")) }
            })
            .start()
            .await
            .unwrap();
        for i in 0..5 {
            go(&engine, &format!("j{i}"), "t").await;
        }
        // Two a second: one now, then one every 500 ms of the clock, stepped 100 ms at a
        // time; at each step exactly as many have started as the rate allows by then.
        for step in 0..=22 {
            let allowed = (step / 5 + 1).min(5) as usize;
            until(&format!("{allowed} started by +{} ms", step * 100), || starts.lock().unwrap().len() >= allowed)
                .await;
            tokio::time::sleep(Duration::from_millis(20)).await;
            assert_eq!(starts.lock().unwrap().len(), allowed, "at +{} ms: none early", step * 100);
            clock.advance(Duration::from_millis(100));
        }
        let at: Vec<i64> = starts.lock().unwrap().iter().map(|t| t - common::T0).collect();
        assert_eq!(at, [0, 500, 1_000, 1_500, 2_000], "each as soon as the rate allows");
        for i in 0..5 {
            engine.wait_for_state("job", &format!("j{i}"), &["done"], Duration::from_secs(30)).await.unwrap();
        }
        engine.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_behind_anothers_backlog_waits_one_round() {
    for (_dir, store) in common::stores("limits_fair").await {
        let calls = LimitDef {
            name: "calls".into(),
            states: vec!["working".into()],
            max: Some(1),
            fair_by: Some("props.tenant".into()),
            ..LimitDef::default()
        };
        let (engine, started, gate) = gated(&store, calls).await;
        for i in 0..6 {
            go(&engine, &format!("a{i}"), "a").await;
        }
        let waiting = |n: u64| waiting(&store, n);
        waiting(5).await;
        go(&engine, "b0", "b").await;
        waiting(6).await;
        let b = store.entity_get("job", "b0").await.unwrap().unwrap();
        let place = store.limit_of(b.id).await.unwrap()[0].place;
        assert_eq!(place, Some(2), "b's first goes after one of a's backlog");
        for n in 1..=7 {
            gate.add_permits(1);
            until(&format!("{n} calls ended"), || started.lock().unwrap().len() > n.min(6)).await;
        }
        let order = started.lock().unwrap().clone();
        assert_eq!(order.iter().position(|k| k == "b0"), Some(2), "{order:?}");
        for k in order {
            engine.wait_for_state("job", &k, &["done"], Duration::from_secs(30)).await.unwrap();
        }
        engine.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_work_goes_by_the_priority_of_its_request() {
    for (_dir, store) in common::stores("limits_priority").await {
        let calls =
            LimitDef { name: "calls".into(), states: vec!["working".into()], max: Some(1), ..LimitDef::default() };
        let (engine, started, gate) = gated(&store, calls).await;
        let waiting = |n: u64| waiting(&store, n);
        go(&engine, "holder", "t").await;
        // A bulk operation's `go` (its default: 10 below a request's), requests' `go` (0),
        // `urgent` (declared 5), and a `go` given priority 9.
        let props = |t: &str| serde_json::from_value(serde_json::json!({ "tenant": t })).unwrap();
        engine.create("job", "bulk-1", props("t")).await.unwrap();
        let raise = BulkAction::Raise { event: "go".into(), params: serde_json::Value::Null };
        let selection = Selection { machine: Some("job".into()), prefix: Some("bulk-".into()), ..Selection::default() };
        let bulk = BulkRequest {
            request_id: Some("bulk-go".into()),
            action: raise,
            selection,
            reason: "a test of priorities".into(),
            rate: settle_engine::MAX_RATE,
            priority: None,
        };
        engine.bulk_start(bulk).await.unwrap();
        waiting(1).await;
        go(&engine, "plain-1", "t").await;
        waiting(2).await;
        go(&engine, "plain-2", "t").await;
        waiting(3).await;
        engine.create("job", "urgent", props("t")).await.unwrap();
        engine.raise("job", "urgent", "urgent", RaiseOptions::wait(Wait::Queued)).await.unwrap();
        engine.create("job", "asked", props("t")).await.unwrap();
        engine.raise("job", "asked", "go", RaiseOptions::wait(Wait::Queued).priority(9)).await.unwrap();
        waiting(5).await;
        // Out of range: refused, naming it.
        engine.create("job", "wild", props("t")).await.unwrap();
        let err = engine.raise("job", "wild", "go", RaiseOptions::default().priority(5_000)).await.unwrap_err();
        assert!(err.to_string().contains("priority 5000 of event `go`"), "{err}");
        for n in 1..=6 {
            gate.add_permits(1);
            until(&format!("{n} calls ended"), || started.lock().unwrap().len() > n.min(5)).await;
        }
        let order = started.lock().unwrap().clone();
        assert_eq!(order, ["holder", "asked", "urgent", "plain-1", "plain-2", "bulk-1"]);
        engine.shutdown().await;
    }
}
