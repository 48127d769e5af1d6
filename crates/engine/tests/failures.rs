//! Failures with their cause, on SQLite and, when `SETTLE_TEST_PG` is set, on PostgreSQL:
//! an action that moves its entity to an error-health state says why, and the entry
//! records it as an error of kind `failure`; a parent whose subscription fires on a failed
//! child records that child as its failure's cause; `settle_store::why` reads the chain
//! from the parent down to the child's own message; the operation's error says which state
//! failed and why.

mod common;

use serde_json::json;
use settle_core::MachineBuilder;
use settle_engine::{Engine, Outcome, RaiseOptions, Wait};
use settle_store::{AnyStore, Store};

use common::stores;

/// `site`: new -create→ creating, whose auto action creates parts `-a` and `-b` and starts
/// them → waiting; all parts `up` → up; any part `broken` → undoing (error) → failed.
fn site() -> settle_core::Machine {
    MachineBuilder::new("site")
        .state("new")
        .initial()
        .state("creating")
        .auto("spawn")
        .state("waiting")
        .state("up")
        .state("undoing")
        .error_health()
        .auto("undo")
        .state("failed")
        .error_health()
        .event("create", ["new"], "begin")
        .event("parts_up", ["waiting"], "to_up")
        .subscribe("all(*) in [up]")
        .event("parts_failed", ["waiting"], "to_undoing")
        .subscribe("any(*) in [broken]")
        .action("begin", ["creating"])
        .action("spawn", ["waiting"])
        .action("to_up", ["up"])
        .action("to_undoing", ["undoing"])
        .action("undo", ["failed"])
        .build()
        .unwrap()
}

/// `part`: idle -start→ working, whose auto action `work` → up, or broken (error) with the
/// provider's message when its key says so.
fn part() -> settle_core::Machine {
    MachineBuilder::new("part")
        .state("idle")
        .initial()
        .state("working")
        .auto("work")
        .state("up")
        .state("broken")
        .error_health()
        .event("start", ["idle"], "go")
        .action("go", ["working"])
        .action("work", ["up", "broken"])
        .build()
        .unwrap()
}

async fn start(store: AnyStore) -> Engine<AnyStore> {
    Engine::builder(store)
        .clock(common::clock())
        .machine(site())
        .machine(part())
        .on("site", "spawn", |ctx| async move {
            let mut out = Outcome::to("waiting");
            for p in ["a", "b"] {
                let key = format!("{}-{p}", ctx.key);
                out = out.create("part", &key, Default::default()).raise("part", key, "start", json!(null));
            }
            Ok(out)
        })
        .on("part", "work", |ctx| async move {
            Ok(if ctx.key.ends_with("bad-b") {
                Outcome::to("broken").error("quota exceeded in eu-west")
            } else {
                Outcome::to("up")
            })
        })
        .start()
        .await
        .unwrap()
}

async fn create_site(engine: &Engine<AnyStore>, key: &str) -> String {
    engine.create("site", key, Default::default()).await.unwrap();
    let r = engine.raise("site", key, "create", RaiseOptions::wait(Wait::Operation)).await.unwrap();
    r.request_id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_parent_leads_to_the_child_that_failed_and_its_message() {
    for (_dir, store) in stores("failures_chain").await {
        let engine = start(store).await;
        let request_id = create_site(&engine, "bad").await;
        let store = engine.store();
        assert_eq!(store.entity_get("site", "bad").await.unwrap().unwrap().state.as_str(), "failed");

        // The child's message is among its errors, as a failure.
        let child = store.entity_get("part", "bad-b").await.unwrap().unwrap();
        let errors = store.error_list(child.id, 10).await.unwrap();
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!((errors[0].kind.as_str(), errors[0].details.as_str()), ("failure", "quota exceeded in eu-west"));
        assert_eq!(errors[0].request_id.as_deref(), Some(request_id.as_str()));

        // The parent's failure names the child, once (undoing → failed adds none).
        let parent = store.entity_get("site", "bad").await.unwrap().unwrap();
        let errors = store.error_list(parent.id, 10).await.unwrap();
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].details, "`parts_failed` fired: part/bad-b in `broken`");
        assert_eq!(
            errors[0].cause,
            vec![settle_store::CauseRef { machine: "part".into(), key: "bad-b".into(), state: "broken".into() }]
        );

        // Why: the site, then the part with its own message.
        let why = settle_store::why(store, "site", "bad").await.unwrap().unwrap();
        assert!(why.failing);
        assert_eq!(why.state.as_deref(), Some("failed"));
        let f = why.failure.as_ref().expect("the site's failure");
        assert_eq!(f.details, "`parts_failed` fired: part/bad-b in `broken`");
        assert_eq!(why.causes.len(), 1);
        let cause = &why.causes[0];
        assert_eq!((cause.machine.as_str(), cause.key.as_str()), ("part", "bad-b"));
        assert!(cause.failing, "the part is still broken");
        let cf = cause.failure.as_ref().expect("the part's failure");
        assert_eq!((cf.kind.as_str(), cf.details.as_str()), ("failure", "quota exceeded in eu-west"));
        assert!(cf.at <= f.at);
        assert!(cause.causes.is_empty());

        // The operation failed, saying where and why (the first failure it met).
        let op = store.operation_get(&request_id).await.unwrap().unwrap();
        assert_eq!(op.outcome.as_deref(), Some("failed"));
        assert_eq!(op.error.as_deref(), Some("entered error state `broken`: quota exceeded in eu-west"));
        engine.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_entity_has_nothing_to_explain_and_a_missing_one_is_none() {
    for (_dir, store) in stores("failures_none").await {
        let engine = start(store).await;
        create_site(&engine, "good").await;
        let store = engine.store();
        assert_eq!(store.entity_get("site", "good").await.unwrap().unwrap().state.as_str(), "up");
        let why = settle_store::why(store, "site", "good").await.unwrap().unwrap();
        assert!(!why.failing);
        assert_eq!(why.failure, None);
        assert!(why.causes.is_empty());
        let parent = store.entity_get("site", "good").await.unwrap().unwrap();
        assert!(store.error_list(parent.id, 10).await.unwrap().is_empty(), "no failure, no error row");
        assert!(settle_store::why(store, "site", "nobody").await.unwrap().is_none());
        engine.shutdown().await;
    }
}
