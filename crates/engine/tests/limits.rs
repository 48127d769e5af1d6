//! Concurrency limits of auto actions, end to end on both stores: a limit of N per key value
//! is never exceeded, waiting work starts in line as slots come back, every slot comes back,
//! and several engine instances on one PostgreSQL schema share the limit exactly.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use settle_core::limits::LimitDef;
use settle_core::{Machine, MachineBuilder};
use settle_engine::{Engine, Outcome, RaiseOptions, Wait};
use settle_store::{AnyStore, Store};

/// `vm`: new -create→ provisioning (auto `provision`, limited to `max` at once per
/// `props.region`) → ready.
fn vm(max: u32) -> Machine {
    MachineBuilder::new("vm")
        .properties(["region"])
        .state("new")
        .initial()
        .state("provisioning")
        .auto("provision")
        .state("ready")
        .event("create", ["new"], "begin")
        .action("begin", ["provisioning"])
        .action("provision", ["ready"])
        .limit(LimitDef {
            name: "provider_calls".into(),
            states: vec!["provisioning".into()],
            max: Some(max),
            key: Some("props.region".into()),
            ..LimitDef::default()
        })
        .build()
        .unwrap()
}

/// The fake provider: how many calls run per region now, the most seen at once, and the
/// order calls started in. Each call waits for a permit of `gate` before it returns.
#[derive(Default)]
struct Provider {
    now: HashMap<String, u32>,
    most: HashMap<String, u32>,
    started: Vec<String>,
    done: usize,
}

type Shared = Arc<Mutex<Provider>>;

async fn start(store: AnyStore, provider: Shared, gate: Arc<tokio::sync::Semaphore>, max: u32) -> Engine<AnyStore> {
    Engine::builder(store)
        .machine(vm(max))
        .on("vm", "provision", move |ctx| {
            let (provider, gate) = (provider.clone(), gate.clone());
            async move {
                let region = ctx.properties["region"].as_str().unwrap_or_default().to_string();
                {
                    let mut p = provider.lock().unwrap();
                    let n = p.now.entry(region.clone()).or_default();
                    *n += 1;
                    let n = *n;
                    let most = p.most.entry(region.clone()).or_default();
                    *most = (*most).max(n);
                    p.started.push(ctx.key.to_string());
                }
                gate.acquire().await.unwrap().forget();
                let mut p = provider.lock().unwrap();
                *p.now.get_mut(&region).unwrap() -= 1;
                p.done += 1;
                Ok(Outcome::to("ready"))
            }
        })
        .start()
        .await
        .unwrap()
}

async fn create(engine: &Engine<AnyStore>, key: &str, region: &str) {
    let props = serde_json::from_value(serde_json::json!({ "region": region })).unwrap();
    engine.create("vm", key, props).await.unwrap();
    engine.raise("vm", key, "create", RaiseOptions::wait(Wait::Queued)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_per_key_is_never_exceeded_and_its_line_moves_in_order() {
    for (_dir, store) in common::stores("limits_in_line").await {
        let provider = Shared::default();
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let engine = start(store.clone(), provider.clone(), gate.clone(), 3).await;
        for i in 0..10 {
            create(&engine, &format!("eu-{i}"), "eu").await;
        }
        for i in 0..4 {
            create(&engine, &format!("us-{i}"), "us").await;
        }
        common::limits_until(&store, "3 run and 7 wait in eu, 3 run and 1 waits in us", |u| {
            common::limit_usage(u, "eu") == (3, 7) && common::limit_usage(u, "us") == (3, 1)
        })
        .await;
        // Where each waiting entity stands, as `get` and `why` will show it.
        let mut line = Vec::new();
        for i in 0..10 {
            let e = store.entity_get("vm", &format!("eu-{i}")).await.unwrap().unwrap();
            let at = store.limit_of(e.id).await.unwrap();
            assert_eq!(at.len(), 1, "{}: {at:?}", e.key);
            assert_eq!(
                (at[0].limit.as_str(), at[0].key.as_str(), at[0].in_use, at[0].max),
                ("provider_calls", "eu", 3, Some(3))
            );
            if let Some(place) = at[0].place {
                line.push((place, e.key.to_string()));
                assert_eq!((e.lease_owner, e.due_at), (None, None), "waiting: no lease, not due");
            }
        }
        line.sort();
        assert_eq!(line.iter().map(|(p, _)| *p).collect::<Vec<_>>(), (1..=7).collect::<Vec<u64>>());
        assert_eq!(provider.lock().unwrap().started.len(), 6, "no more calls than slots");
        // Calls end one at a time; each hands its slot on.
        for n in 1..=14 {
            gate.add_permits(1);
            let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
            while provider.lock().unwrap().done < n {
                assert!(tokio::time::Instant::now() < deadline, "call {n} never ended");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        for i in 0..10 {
            let e = engine.wait_for_state("vm", &format!("eu-{i}"), &["ready"], Duration::from_secs(30)).await.unwrap();
            assert_eq!(e.state, "ready");
        }
        common::limits_until(&store, "every slot is back", |u| u.is_empty()).await;
        {
            let p = provider.lock().unwrap();
            assert_eq!((p.most["eu"], p.most["us"]), (3, 3), "the limit bound, and was never exceeded");
            // Those that waited started in the order of their line.
            let started_eu: Vec<&String> = p.started.iter().filter(|k| k.starts_with("eu")).skip(3).collect();
            let in_line: Vec<&String> = line.iter().map(|(_, k)| k).collect();
            assert_eq!(started_eu, in_line);
        }
        engine.shutdown().await;
    }
}

/// Three instances on one schema, each with its own store handle (as separate processes
/// have), share a limit of 2: the provider never sees more than 2 at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_on_postgres_share_a_limit_exactly() {
    let Some(url) = settle_store::postgres::test_url("limits_instances") else { return };
    let provider = Shared::default();
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let mut engines = Vec::new();
    for _ in 0..3 {
        let u = url.clone();
        let pg = tokio::task::spawn_blocking(move || settle_store::PgStore::open(&u)).await.unwrap().unwrap();
        engines.push(start(AnyStore::Postgres(pg), provider.clone(), gate.clone(), 2).await);
    }
    let store = engines[0].store().clone();
    for i in 0..24 {
        create(&engines[i % 3], &format!("vm-{i}"), "eu").await;
    }
    common::limits_until(&store, "2 run and 22 wait", |u| common::limit_usage(u, "eu") == (2, 22)).await;
    // Let calls end in bursts, so the instances race for the slots that come back.
    for burst in [3, 5, 7, 9] {
        gate.add_permits(burst);
        tokio::task::yield_now().await;
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while provider.lock().unwrap().done < 24 {
        assert!(tokio::time::Instant::now() < deadline, "not every call ended: {}", provider.lock().unwrap().done);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    common::limits_until(&store, "every slot is back", |u| u.is_empty()).await;
    assert_eq!(provider.lock().unwrap().most["eu"], 2, "the limit bound, and was never exceeded");
    for e in engines {
        e.shutdown().await;
    }
}
