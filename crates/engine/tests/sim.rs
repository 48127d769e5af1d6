//! [`SimNode`]: the scheduler stepped by its caller — requests wait for a write, handlers'
//! results wait for `settle`, a stale node's commits are fenced off, an injected store
//! failure answers callers with an error and drops the held entities.

mod common;

use std::time::Duration;

use common::{child, clock, sqlite};
use serde_json::json;
use settle_engine::sim::{SimNode, WriteFault};
use settle_engine::{Config, Engine, Outcome};
use settle_store::{SqliteStore, Store};

async fn node(store: &SqliteStore, clock: &settle_store::ManualClock, owner: &str) -> SimNode<SqliteStore> {
    let config = Config {
        owner: owner.into(),
        lease: Duration::from_secs(5),
        clock: std::sync::Arc::new(clock.clone()),
        ..Config::default()
    };
    Engine::builder(store.clone())
        .config(config)
        .machine(child())
        .on("child", "do_finish", |_| async { Ok(Outcome::to("ready")) })
        .on("child", "do_fail", |_| async { Ok(Outcome::to("failed")) })
        .start_sim(false)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_node_does_nothing_until_stepped_and_a_stale_node_is_fenced_off() {
    let (_dir, store) = sqlite();
    let clock = clock();
    let mut a = node(&store, &clock, "a").await;
    let mut b = node(&store, &clock, "b").await;

    // A create waits for the batch that carries it.
    let mut created = a.create("child", "c1", Default::default(), "req-create").unwrap();
    assert!(created.try_recv().is_err(), "nothing is written before `write`");
    assert!(store.entity_get("child", "c1").await.unwrap().is_none());
    assert!(a.write(WriteFault::None).await);
    assert!(created.try_recv().unwrap().unwrap().is_some());

    // `a` takes the event and claims the entity; its handler answers at once, so the
    // commit is queued; `a` stalls before writing it and its lease runs out.
    let _raised = a.raise("child", "c1", "finish", json!(null), "req-finish").unwrap();
    assert!(a.write(WriteFault::None).await);
    a.settle(Duration::from_secs(5)).await.unwrap();
    assert_eq!(a.held().len(), 1);
    assert_eq!(a.queued(), 1, "the transition's commit waits for the next batch");
    clock.advance(Duration::from_secs(6));

    // `b` claims the expired lease and commits first; `a`'s late commit is refused.
    assert!(b.write(WriteFault::None).await);
    b.settle(Duration::from_secs(5)).await.unwrap();
    assert!(b.write(WriteFault::None).await);
    let b_landed = b.landed();
    assert!(a.write(WriteFault::None).await);
    assert!(a.landed().is_empty(), "the stale node's commit did not land");
    let e = store.entity_get("child", "c1").await.unwrap().unwrap();
    assert_eq!(e.state.as_str(), "ready");
    assert_eq!(b_landed, [(e.id, e.version)], "one new version, by `b`");
    assert!(a.held().is_empty(), "`a` let go of the entity it lost");
    let h = store.history_list(e.id).await.unwrap();
    assert_eq!(h.iter().filter(|r| r.event.as_deref() == Some("finish")).count(), 1, "processed once: {h:?}");
}

#[tokio::test]
async fn an_injected_store_failure_answers_with_an_error_and_loses_nothing_acknowledged() {
    let (_dir, store) = sqlite();
    let clock = clock();
    let mut a = node(&store, &clock, "a").await;
    let mut before = a.create("child", "c1", Default::default(), "req-1").unwrap();
    assert!(a.write(WriteFault::Before).await);
    assert!(before.try_recv().unwrap().is_err(), "the caller hears the failure");
    assert!(store.entity_get("child", "c1").await.unwrap().is_none(), "nothing was written");
    // After the write: written, but the caller hears an error; the request id replays.
    let mut after = a.create("child", "c2", Default::default(), "req-2").unwrap();
    assert!(a.write(WriteFault::After).await);
    assert!(after.try_recv().unwrap().is_err());
    assert!(store.entity_get("child", "c2").await.unwrap().is_some(), "the batch committed");
    let mut again = a.create("child", "c2", Default::default(), "req-2").unwrap();
    assert!(a.write(WriteFault::None).await);
    assert!(again.try_recv().unwrap().unwrap().is_none(), "a retry with its request id replays");
}

/// A node running `job` (one step) and `relay`, whose action raises a sync nested event on
/// the job of its key and waits for it.
async fn relay_node(store: &SqliteStore, clock: &settle_store::ManualClock) -> SimNode<SqliteStore> {
    let config = Config {
        owner: "n".into(),
        lease: Duration::from_secs(5),
        supervise_every: Duration::from_secs(1),
        clock: std::sync::Arc::new(clock.clone()),
        ..Config::default()
    };
    let job = settle_core::MachineBuilder::new("job")
        .state("idle")
        .initial()
        .state("working")
        .auto("work")
        .state("done")
        .event("start", ["idle"], "begin")
        .action("begin", ["working"])
        .action("work", ["done"])
        .build()
        .unwrap();
    let relay = settle_core::MachineBuilder::new("relay")
        .state("idle")
        .initial()
        .state("relaying")
        .auto("relay")
        .state("relayed")
        .state("broken")
        .event("go", ["idle"], "begin")
        .action("begin", ["relaying"])
        .action("relay", ["relayed"])
        .build()
        .unwrap();
    Engine::builder(store.clone())
        .config(config)
        .machine(job)
        .machine(relay)
        .on("job", "work", |_| async { Ok(Outcome::to("done")) })
        .on("relay", "relay", |ctx| async move {
            let (_, job) = ctx.raise_and_wait("job", ctx.key.as_str(), "start", json!(null)).await?;
            Ok(Outcome::to("relayed").set("job_state", json!(job.state.as_str())))
        })
        .start_sim(false)
        .await
        .unwrap()
}

/// Steps `n` `rounds` times: settle, write.
async fn step(n: &mut SimNode<SqliteStore>, rounds: usize) {
    for _ in 0..rounds {
        n.settle(Duration::from_secs(5)).await.unwrap();
        n.write(WriteFault::None).await;
    }
}

#[tokio::test]
async fn an_action_waiting_for_a_sync_nested_event_lets_the_node_write_until_it_is_answered() {
    let (_dir, store) = sqlite();
    let clock = clock();
    let mut n = relay_node(&store, &clock).await;
    for (machine, key) in [("job", "r1"), ("relay", "r1")] {
        drop(n.create(machine, key, Default::default(), &format!("create-{machine}")).unwrap());
    }
    drop(n.raise("relay", "r1", "go", json!(null), "go-r1").unwrap());
    // `settle` does not wait for the relay's action while it waits for the job: the node
    // writes the batches that take the job to rest, then the action answers.
    step(&mut n, 12).await;
    let relay = store.entity_get("relay", "r1").await.unwrap().unwrap();
    assert_eq!((relay.state.as_str(), &relay.properties["job_state"]), ("relayed", &json!("done")));
}

#[tokio::test]
async fn a_sync_nested_wait_times_out_at_its_lease_on_the_engines_clock() {
    let (_dir, store) = sqlite();
    let clock = clock();
    let mut n = relay_node(&store, &clock).await;
    for (machine, key) in [("job", "r1"), ("relay", "r1")] {
        drop(n.create(machine, key, Default::default(), &format!("create-{machine}")).unwrap());
    }
    step(&mut n, 1).await;
    // The job is paused: the nested event queues there and the job never comes to rest.
    drop(n.command("job", "r1", settle_store::Command::Pause, "pause-r1").unwrap());
    drop(n.raise("relay", "r1", "go", json!(null), "go-r1").unwrap());
    step(&mut n, 6).await;
    let relay = store.entity_get("relay", "r1").await.unwrap().unwrap();
    assert_eq!(relay.state.as_str(), "relaying", "the action waits");
    // Past the lease, on the engine's clock (no real time passes): the wait times out, a
    // fault of the relay's action.
    clock.advance(Duration::from_secs(7));
    step(&mut n, 4).await;
    let h = store.history_list(relay.id).await.unwrap();
    let fault = h.iter().find(|r| r.kind == settle_store::HistoryKind::Fault).unwrap_or_else(|| panic!("{h:?}"));
    assert!(fault.detail.as_deref().unwrap_or("").contains("nested event"), "{fault:?}");
}
