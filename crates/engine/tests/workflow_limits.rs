//! Limits of workflows, end to end on both stores: at most N workflows started by the
//! limited event are open at once per key value; a queued event waits with its entity at
//! rest (not due, no lease) and starts as a workflow comes to rest; a rejected event takes
//! no slot; every slot comes back; instances on one PostgreSQL schema share the limit.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use settle_core::limits::LimitDef;
use settle_core::{Machine, MachineBuilder};
use settle_engine::{Engine, EventOutcome, Outcome, RaiseOptions, Wait};
use settle_store::{AnyStore, Store};

/// `order`: new -place→ placing (auto `reserve`) → confirming (auto `confirm`, gated) →
/// done; at most `max` orders open at once per `props.tenant`.
fn order(max: u32) -> Machine {
    MachineBuilder::new("order")
        .properties(["tenant"])
        .state("new")
        .initial()
        .state("placing")
        .auto("reserve")
        .state("confirming")
        .auto("confirm")
        .state("done")
        .event("place", ["new"], "begin")
        .action("begin", ["placing"])
        .action("reserve", ["confirming"])
        .action("confirm", ["done"])
        .limit(LimitDef {
            name: "open_orders".into(),
            events: vec!["place".into()],
            max: Some(max),
            key: Some("props.tenant".into()),
            ..LimitDef::default()
        })
        .build()
        .unwrap()
}

/// Open workflows per tenant as the handlers see them (a workflow opens when `reserve`
/// starts and closes when `confirm` returns, inside the span its slot is held), the most
/// seen at once, and the order workflows opened in.
#[derive(Default)]
struct Seen {
    open: HashMap<String, u32>,
    most: HashMap<String, u32>,
    opened: Vec<String>,
    closed: usize,
}

type Shared = Arc<Mutex<Seen>>;

async fn start(store: AnyStore, seen: Shared, gate: Arc<tokio::sync::Semaphore>, max: u32) -> Engine<AnyStore> {
    let tenant = |ctx: &settle_engine::ActionContext| ctx.properties["tenant"].as_str().unwrap_or_default().to_string();
    let opened = seen.clone();
    Engine::builder(store)
        .machine(order(max))
        .on("order", "reserve", move |ctx| {
            let seen = opened.clone();
            async move {
                let mut s = seen.lock().unwrap();
                let t = tenant(&ctx);
                let n = s.open.entry(t.clone()).or_default();
                *n += 1;
                let n = *n;
                let most = s.most.entry(t).or_default();
                *most = (*most).max(n);
                s.opened.push(ctx.key.to_string());
                Ok(Outcome::to("confirming"))
            }
        })
        .on("order", "confirm", move |ctx| {
            let (seen, gate) = (seen.clone(), gate.clone());
            async move {
                gate.acquire().await.unwrap().forget();
                let mut s = seen.lock().unwrap();
                *s.open.get_mut(&tenant(&ctx)).unwrap() -= 1;
                s.closed += 1;
                Ok(Outcome::to("done"))
            }
        })
        .start()
        .await
        .unwrap()
}

async fn place(engine: &Engine<AnyStore>, key: &str, tenant: &str) {
    let props = serde_json::from_value(serde_json::json!({ "tenant": tenant })).unwrap();
    engine.create("order", key, props).await.unwrap();
    engine.raise("order", key, "place", RaiseOptions::wait(Wait::Queued)).await.unwrap();
}

/// Lets `n` more workflows close, and waits until they have.
async fn close(seen: &Shared, gate: &tokio::sync::Semaphore, n: usize) {
    let target = seen.lock().unwrap().closed + n;
    gate.add_permits(n);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while seen.lock().unwrap().closed < target {
        assert!(tokio::time::Instant::now() < deadline, "workflows never closed");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_of_workflows_holds_queued_events_at_rest_until_a_workflow_ends() {
    for (_dir, store) in common::stores("workflow_limits").await {
        let seen = Shared::default();
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let engine = start(store.clone(), seen.clone(), gate.clone(), 2).await;
        for i in 0..6 {
            place(&engine, &format!("acme-{i}"), "acme").await;
        }
        place(&engine, "zeta-0", "zeta").await;
        common::limits_until(&store, "2 open and 4 waiting for acme, 1 open for zeta", |u| {
            common::limit_usage(u, "acme") == (2, 4) && common::limit_usage(u, "zeta") == (1, 0)
        })
        .await;
        // The waiting ones are at rest in `new`, their event queued: no lease, not due.
        let mut line = Vec::new();
        for i in 0..6 {
            let e = store.entity_get("order", &format!("acme-{i}")).await.unwrap().unwrap();
            let at = store.limit_of(e.id).await.unwrap();
            assert_eq!(at.len(), 1, "{}: {at:?}", e.key);
            assert_eq!((at[0].limit.as_str(), at[0].in_use, at[0].max), ("open_orders", 2, Some(2)));
            if let Some(place) = at[0].place {
                assert_eq!((e.state.as_str(), e.lease_owner, e.due_at), ("new", None, None), "{}", e.key);
                line.push((place, e.key.to_string()));
            }
        }
        line.sort();
        assert_eq!(line.iter().map(|(p, _)| *p).collect::<Vec<_>>(), [1, 2, 3, 4]);
        assert_eq!(seen.lock().unwrap().opened.len(), 3, "no more workflows than slots");
        // Whole workflows hold the slot: their first step is done, yet nobody else starts.
        let first = seen.lock().unwrap().opened[0].clone();
        let e = engine.wait_for_state("order", &first, &["confirming"], Duration::from_secs(30)).await.unwrap();
        assert_eq!(e.state, "confirming");
        assert_eq!(seen.lock().unwrap().opened.len(), 3);
        // Workflows end one at a time; each slot goes to the next in line.
        close(&seen, &gate, 1).await;
        engine.wait_for_state("order", &first, &["done"], Duration::from_secs(30)).await.unwrap();
        common::limits_until(&store, "2 open and 3 waiting for acme", |u| common::limit_usage(u, "acme").1 == 3).await;
        // A rejected event takes no slot and does not wait in line: `place` is not valid in `done`.
        let r = engine.raise("order", &first, "place", RaiseOptions::wait(Wait::Outcome)).await.unwrap();
        assert!(matches!(r.outcome, Some(EventOutcome::Rejected { .. })), "{:?}", r.outcome);
        for _ in 0..6 {
            close(&seen, &gate, 1).await;
        }
        for i in 0..6 {
            let key = format!("acme-{i}");
            let e = engine.wait_for_state("order", &key, &["done"], Duration::from_secs(30)).await.unwrap();
            assert_eq!(e.state, "done");
        }
        common::limits_until(&store, "every slot is back", |u| u.is_empty()).await;
        {
            let s = seen.lock().unwrap();
            assert_eq!((s.most["acme"], s.most["zeta"]), (2, 1), "the limit bound, and was never exceeded");
            // Those that waited opened in the order of their line.
            let opened: Vec<&String> = s.opened.iter().filter(|k| k.starts_with("acme")).skip(2).collect();
            assert_eq!(opened, line.iter().map(|(_, k)| k).collect::<Vec<_>>());
        }
        engine.shutdown().await;
    }
}

/// Three instances on one schema share a limit of workflows of 2: never more open at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_on_postgres_share_a_limit_of_workflows_exactly() {
    let Some(url) = settle_store::postgres::test_url("workflow_limits_instances") else { return };
    let seen = Shared::default();
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let mut engines = Vec::new();
    for _ in 0..3 {
        let u = url.clone();
        let pg = tokio::task::spawn_blocking(move || settle_store::PgStore::open(&u)).await.unwrap().unwrap();
        engines.push(start(AnyStore::Postgres(pg), seen.clone(), gate.clone(), 2).await);
    }
    let store = engines[0].store().clone();
    for i in 0..18 {
        place(&engines[i % 3], &format!("o-{i}"), "acme").await;
    }
    common::limits_until(&store, "2 open and 16 waiting", |u| common::limit_usage(u, "acme") == (2, 16)).await;
    for burst in [3, 5, 7, 3] {
        gate.add_permits(burst);
        tokio::task::yield_now().await;
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while seen.lock().unwrap().closed < 18 {
        assert!(tokio::time::Instant::now() < deadline, "not every workflow closed: {}", seen.lock().unwrap().closed);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    common::limits_until(&store, "every slot is back", |u| u.is_empty()).await;
    assert_eq!(seen.lock().unwrap().most["acme"], 2, "the limit bound, and was never exceeded");
    for e in engines {
        e.shutdown().await;
    }
}
