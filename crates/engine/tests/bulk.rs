//! Bulk operations on SQLite and, when `SETTLE_TEST_PG` is set, on PostgreSQL: a dry run
//! counts and samples what a selection matches; a bulk command reaches exactly those
//! entities, each once, with the request id `{bulk}/{entity id}`; refusals are counted
//! with the latest one kept; an event can be raised in bulk; a page commanded before a
//! crash (its progress never written) replays instead of commanding again; a bulk
//! operation can be canceled; mistakes are refused naming the field, and nothing runs.

mod common;

use std::time::Duration;

use settle_core::MachineBuilder;
use settle_engine::{BulkAction, BulkRequest, Command, Engine, Error, Selection, entity_request_id};
use settle_store::{AnyStore, HistoryKind, Store};

use common::stores;

/// `job`: idle -start→ running -finish→ done.
fn job() -> settle_core::Machine {
    MachineBuilder::new("job")
        .state("idle")
        .initial()
        .state("running")
        .state("done")
        .event("start", ["idle"], "go")
        .event("finish", ["running"], "end")
        .action("go", ["running"])
        .action("end", ["done"])
        .build()
        .unwrap()
}

async fn start(store: AnyStore) -> Engine<AnyStore> {
    Engine::builder(store).machine(job()).start().await.unwrap()
}

async fn fleet(engine: &Engine<AnyStore>, prefix: &str, n: usize) {
    for i in 0..n {
        engine.create("job", &format!("{prefix}{i:03}"), Default::default()).await.unwrap();
    }
}

fn selection(prefix: &str) -> Selection {
    Selection { machine: Some("job".into()), prefix: Some(prefix.into()), ..Selection::default() }
}

fn request(id: &str, action: BulkAction, selection: Selection) -> BulkRequest {
    BulkRequest {
        request_id: Some(id.into()),
        action,
        selection,
        reason: "maintenance window 42".into(),
        rate: settle_engine::MAX_RATE,
        priority: None,
    }
}

/// The command rows of an entity's history, by request id.
async fn commands(engine: &Engine<AnyStore>, key: &str) -> Vec<String> {
    let history = engine.history("job", key).await.unwrap();
    history.iter().filter(|h| h.kind == HistoryKind::Command).filter_map(|h| h.request_id.clone()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_command_reaches_each_matching_entity_once() {
    for (_dir, store) in stores("bulk_once").await {
        let engine = start(store).await;
        fleet(&engine, "a-", 230).await;
        fleet(&engine, "b-", 20).await;
        // One of them was killed: a resume of it is refused, and counted.
        engine.command("job", "a-007", Command::Kill, None).await.unwrap();

        let dry = engine.bulk_dry_run(&selection("a-"), 5).await.unwrap();
        assert_eq!((dry.count, dry.more, dry.sample.len()), (230, false, 5));
        assert!(dry.sample.iter().all(|e| e.key.as_str().starts_with("a-")));
        assert_eq!(engine.store().storage().await.unwrap(), engine.store().storage().await.unwrap());

        let (row, new) =
            engine.bulk_start(request("pause-a", BulkAction::Command(Command::Pause), selection("a-"))).await.unwrap();
        assert!(new);
        assert_eq!((row.total, row.status.as_str(), row.reason.as_str()), (230, "running", "maintenance window 42"));
        let row = engine.bulk_wait("pause-a", Duration::from_secs(60)).await.unwrap();
        assert_eq!((row.status.as_str(), row.done, row.failed), ("done", 229, 1), "{row:?}");
        assert!(row.last_error.as_deref().unwrap().starts_with("job/a-007: "), "{row:?}");
        // Every a- job paused (the killed one aside), once, under its own request id; no b- job.
        for i in 0..230 {
            let key = format!("a-{i:03}");
            let e = engine.get("job", &key).await.unwrap().unwrap();
            if i == 7 {
                assert_eq!(e.run_status.as_str(), "killed");
                continue;
            }
            assert_eq!(e.run_status.as_str(), "paused", "{key}");
            assert_eq!(commands(&engine, &key).await, [entity_request_id("pause-a", e.id)], "{key}");
            if i == 0 {
                let history = engine.history("job", &key).await.unwrap();
                let detail = history.iter().rev().find(|h| h.kind == HistoryKind::Command).unwrap().detail.clone();
                assert_eq!(detail.as_deref(), Some("pause: maintenance window 42"), "the bulk's reason travels");
            }
        }
        for i in 0..20 {
            assert_eq!(engine.get("job", &format!("b-{i:03}")).await.unwrap().unwrap().run_status.as_str(), "active");
        }
        // The same request id again: that bulk operation, nothing new.
        let (again, new) =
            engine.bulk_start(request("pause-a", BulkAction::Command(Command::Resume), selection("a-"))).await.unwrap();
        assert!(!new);
        assert_eq!((again.action.as_str(), again.done), ("pause", 229));

        // An event in bulk: the b- jobs start.
        let raise = BulkAction::Raise { event: "start".into(), params: serde_json::Value::Null };
        engine.bulk_start(request("start-b", raise, selection("b-"))).await.unwrap();
        let row = engine.bulk_wait("start-b", Duration::from_secs(60)).await.unwrap();
        assert_eq!((row.done, row.failed), (20, 0));
        engine.wait_idle().await.unwrap();
        for i in 0..20 {
            assert_eq!(engine.get("job", &format!("b-{i:03}")).await.unwrap().unwrap().state.as_str(), "running");
        }
        let listed: Vec<String> = engine.bulk_list(10).await.unwrap().into_iter().map(|b| b.request_id).collect();
        assert_eq!(listed, ["start-b", "pause-a"]);
        engine.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_commanded_before_a_crash_replays_instead_of_commanding_again() {
    for (_dir, store) in stores("bulk_replay").await {
        let engine = start(store).await;
        fleet(&engine, "c-", 50).await;
        // A crashed run had commanded the first 30 under the bulk's request ids, and never
        // written its progress.
        for i in 0..30 {
            let e = engine.get("job", &format!("c-{i:03}")).await.unwrap().unwrap();
            engine.command("job", &e.key, Command::Pause, Some(entity_request_id("pause-c", e.id))).await.unwrap();
        }
        engine.bulk_start(request("pause-c", BulkAction::Command(Command::Pause), selection("c-"))).await.unwrap();
        let row = engine.bulk_wait("pause-c", Duration::from_secs(60)).await.unwrap();
        assert_eq!((row.done, row.failed), (50, 0), "replays count as done: {row:?}");
        for i in 0..50 {
            let key = format!("c-{i:03}");
            assert_eq!(commands(&engine, &key).await.len(), 1, "{key} commanded once");
        }
        engine.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_operation_can_be_canceled_and_mistakes_are_refused() {
    for (_dir, store) in stores("bulk_cancel").await {
        let engine = start(store).await;
        fleet(&engine, "d-", 40).await;
        // One entity a second: the first page is one entity; canceled before the rest.
        let slow = BulkRequest { rate: 1, ..request("pause-d", BulkAction::Command(Command::Pause), selection("d-")) };
        engine.bulk_start(slow).await.unwrap();
        let canceled = engine.bulk_cancel("pause-d").await.unwrap().unwrap();
        assert_eq!(canceled.status, "canceled");
        let row = engine.bulk_wait("pause-d", Duration::from_secs(60)).await.unwrap();
        assert_eq!(row.status, "canceled");
        let paused =
            engine.bulk_dry_run(&Selection { status: Some("paused".into()), ..selection("d-") }, 0).await.unwrap();
        assert!(paused.count <= 2, "at most the page in flight: {}", paused.count);
        assert_eq!(engine.bulk_cancel("nobody").await.unwrap(), None);

        let refused = |r: BulkRequest| async { engine.bulk_start(r).await.unwrap_err() };
        let pause = || BulkAction::Command(Command::Pause);
        let e = refused(request("x1", pause(), Selection::default())).await;
        assert!(matches!(&e, Error::Bulk(m) if m.contains("at least one criterion")), "{e}");
        let e = refused(request("x2", pause(), Selection { machine: Some("vm".into()), ..Selection::default() })).await;
        assert!(matches!(&e, Error::Bulk(m) if m.starts_with("machine:")), "{e}");
        let e = refused(BulkRequest { reason: " ".into(), ..request("x3", pause(), selection("d-")) }).await;
        assert!(matches!(&e, Error::Bulk(m) if m.starts_with("reason:")), "{e}");
        let e = refused(BulkRequest { rate: 0, ..request("x4", pause(), selection("d-")) }).await;
        assert!(matches!(&e, Error::Bulk(m) if m.starts_with("rate:")), "{e}");
        let raise = BulkAction::Raise { event: "explode".into(), params: serde_json::Value::Null };
        let e = refused(request("x5", raise, selection("d-"))).await;
        assert!(matches!(&e, Error::Bulk(m) if m.starts_with("event:")), "{e}");
        assert_eq!(engine.bulk_list(10).await.unwrap().len(), 1, "nothing refused was stored");
        engine.shutdown().await;
    }
}
