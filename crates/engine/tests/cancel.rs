//! Canceling an operation, on SQLite and, when `SETTLE_TEST_PG` is set, on PostgreSQL: a
//! server's `create` reaches five entities (the server and the four resources it creates);
//! canceled while three resources run their action and one is done, none of them works in
//! it any more — queued work dropped, running results discarded — and each runs its
//! machine's `cancel` event to its end. A machine that declares no cancel event leaves its
//! entity paused, and a resume runs its work again.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use settle_core::Machine;
use settle_engine::{Command, Engine, Error, Outcome, RaiseOptions};
use settle_store::{AnyStore, HistoryKind, Store};
use tokio::sync::Semaphore;

use common::stores;

/// `server`: create → creating, whose declarative action creates three `res` and one
/// `quick`, each started with `go` → awaiting. Its cancel event `abort` deletes it.
fn server() -> Machine {
    let text = r#"initial = "new"
cancel = "abort"
[states.new]
[states.creating]
auto = "make"
[states.awaiting]
[states.gone]
kind = "deleted"
[events.create]
in = ["new"]
action = "begin"
[events.abort]
in = ["creating", "awaiting"]
action = "undo"
[actions.begin]
to = ["creating"]
[actions.make]
to = ["awaiting"]
create = [
  { machine = "res", key = "key + '-app'", event = "go" },
  { machine = "res", key = "key + '-db'", event = "go" },
  { machine = "res", key = "key + '-alias'", event = "go" },
  { machine = "quick", key = "key + '-dns'", event = "go" },
]
may_create = ["res", "quick"]
[actions.undo]
to = ["gone"]
"#;
    settle_core::toml::load("server.toml", "server", text).unwrap().0
}

/// A resource: go → working, whose action `finish` moves it to done (with a handler when
/// `finish` has two targets); its cancel event (when declared) unwinds it through an
/// unstable state to `removed`.
fn resource(name: &str, handled: bool, cancel: bool) -> Machine {
    let finish = if handled { r#"["done", "removed"]"# } else { r#"["done"]"# };
    let text = format!(
        r#"initial = "pending"
{}
[states.pending]
[states.working]
auto = "finish"
[states.done]
[states.unwinding]
auto = "clean"
[states.removed]
kind = "terminal"
[events.go]
in = ["pending"]
action = "start"
[events.abort]
in = ["working", "done"]
action = "unwind"
[actions.start]
to = ["working"]
[actions.finish]
to = {finish}
[actions.unwind]
to = ["unwinding"]
[actions.clean]
to = ["removed"]
"#,
        if cancel { "cancel = \"abort\"" } else { "" }
    );
    settle_core::toml::load(&format!("{name}.toml"), name, &text).unwrap().0
}

/// An engine whose `res` and `plain` actions `finish` wait for a permit of `gate`
/// (counting in `runs` when they start).
async fn engine(store: AnyStore, gate: &Arc<Semaphore>, runs: &Arc<AtomicUsize>) -> Engine<AnyStore> {
    let mut b = Engine::builder(store)
        .machine(server())
        .machine(resource("res", true, true))
        .machine(resource("quick", false, true))
        .machine(resource("plain", true, false));
    for m in ["res", "plain"] {
        let (gate, runs) = (gate.clone(), runs.clone());
        b = b.on(m, "finish", move |_ctx| {
            let (gate, runs) = (gate.clone(), runs.clone());
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                gate.acquire().await.expect("gate open").forget();
                Ok(Outcome::to("done"))
            }
        });
    }
    b.start().await.unwrap()
}

async fn state(e: &Engine<AnyStore>, machine: &str, key: &str) -> (String, String) {
    let r = e.get(machine, key).await.unwrap().unwrap();
    (r.state.to_string(), r.run_status.as_str().to_string())
}

/// Waits (real time, at most 30 s) until `ok` holds.
async fn until<F, Fut>(what: &str, mut ok: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !ok().await {
        assert!(tokio::time::Instant::now() < deadline, "{what} never came");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn canceling_an_operation_that_reached_five_entities_stops_their_work_and_undoes_them() {
    for (_dir, store) in stores("cancel_five").await {
        let (gate, runs) = (Arc::new(Semaphore::new(0)), Arc::new(AtomicUsize::new(0)));
        let e = engine(store, &gate, &runs).await;
        e.create("server", "s1", Default::default()).await.unwrap();
        let create = RaiseOptions { request_id: Some("create-s1".into()), ..RaiseOptions::default() };
        e.raise("server", "s1", "create", create).await.unwrap();
        // Three resources run their action (held at the gate), the fourth is done.
        until("three running actions", || async { runs.load(Ordering::SeqCst) == 3 }).await;
        until("dns done", || async { e.get("quick", "s1-dns").await.unwrap().is_some_and(|r| r.state == "done") })
            .await;
        assert_eq!(state(&e, "server", "s1").await.0, "awaiting");
        assert!(e.operation("create-s1").await.unwrap().unwrap().ended_at.is_none(), "still working");

        let started = e.cancel_operation("create-s1", Some("customer withdrew")).await.unwrap();
        assert!(!started.replayed);
        assert_eq!((started.bulk.request_id.as_str(), started.bulk.total), ("create-s1/cancel", 5));
        let op = e.cancel_wait("create-s1", true, Duration::from_secs(30)).await.unwrap();
        assert_eq!(op.outcome.as_deref(), Some("canceled"), "the operation ends as canceled");

        // The held actions finish now: their results are refused (the entities moved on).
        gate.add_permits(3);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(state(&e, "server", "s1").await, ("gone".into(), "active".into()));
        for (m, k) in [("res", "s1-app"), ("res", "s1-db"), ("res", "s1-alias"), ("quick", "s1-dns")] {
            assert_eq!(state(&e, m, k).await, ("removed".into(), "active".into()), "{m}/{k} undone");
            let r = e.get(m, k).await.unwrap().unwrap();
            let history = e.store().history_list(r.id).await.unwrap();
            let went: Vec<&str> = history.iter().filter_map(|h| h.to.as_ref().map(|s| s.as_str())).collect();
            if m == "res" {
                assert!(!went.contains(&"done"), "{k}: the running action's result was discarded: {went:?}");
            }
            assert!(went.ends_with(&["unwinding", "removed"]), "{k}: its undo ran: {went:?}");
            let cancel = history.iter().find(|h| h.kind == HistoryKind::Command).expect("the cancel is recorded");
            assert_eq!(cancel.request_id.as_deref(), Some(format!("create-s1/cancel/{}", r.id).as_str()));
        }
        // Each entity's part ended once its undo was at rest; the answer says what it did.
        let parts = e.cancel_parts("create-s1", 100).await.unwrap();
        assert_eq!(parts.len(), 5);
        for p in &parts {
            let part = p.part.as_ref().expect("every entity has its part");
            assert_eq!(part.outcome.as_deref(), Some("success"), "{}", p.entity.key);
            let did = p.did.as_deref().unwrap_or_default();
            assert!(did.starts_with("cancel of operation create-s1: ") && did.ends_with("`abort` raised"), "{did}");
        }
        let app = parts.iter().find(|p| p.entity.key == "s1-app").unwrap();
        assert_eq!(app.did.as_deref(), Some("cancel of operation create-s1: its work stopped, `abort` raised"));
        let dns = parts.iter().find(|p| p.entity.key == "s1-dns").unwrap();
        assert_eq!(
            dns.did.as_deref(),
            Some("cancel of operation create-s1: `abort` raised"),
            "at rest: nothing to stop"
        );

        // Again: the same cancel, nothing started anew; an unknown operation is refused.
        assert!(e.cancel_operation("create-s1", None).await.unwrap().replayed);
        match e.cancel_operation("nobody", None).await {
            Err(Error::UnknownOperation(id)) => assert_eq!(id, "nobody"),
            other => panic!("{other:?}"),
        }
        e.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_cancel_event_the_work_stops_paused_and_a_resume_runs_it_again() {
    for (_dir, store) in stores("cancel_paused").await {
        let (gate, runs) = (Arc::new(Semaphore::new(0)), Arc::new(AtomicUsize::new(0)));
        let e = engine(store, &gate, &runs).await;
        e.create("plain", "p1", Default::default()).await.unwrap();
        let go = RaiseOptions { request_id: Some("go-p1".into()), ..RaiseOptions::default() };
        e.raise("plain", "p1", "go", go).await.unwrap();
        until("its action running", || async { runs.load(Ordering::SeqCst) == 1 }).await;

        e.cancel_operation("go-p1", None).await.unwrap();
        let op = e.cancel_wait("go-p1", true, Duration::from_secs(30)).await.unwrap();
        assert_eq!(op.outcome.as_deref(), Some("canceled"));
        gate.add_permits(1);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(state(&e, "plain", "p1").await, ("working".into(), "paused".into()), "its result discarded");
        let parts = e.cancel_parts("go-p1", 10).await.unwrap();
        assert_eq!(
            parts[0].did.as_deref(),
            Some("cancel of operation go-p1: its work stopped, no cancel event valid here: paused")
        );
        let paused = e.command("plain", "p1", Command::Resume, Some("resume-p1".into())).await.unwrap();
        assert_eq!(paused.entity.run_status.as_str(), "active");
        gate.add_permits(1);
        until("done after the resume", || async { state(&e, "plain", "p1").await.0 == "done" }).await;
        assert_eq!(runs.load(Ordering::SeqCst), 2, "the resume ran its action again");
        // An operation that has ended has nothing left to cancel.
        match e.cancel_operation("resume-p1", None).await {
            Err(Error::OperationEnded { outcome, .. }) => assert_eq!(outcome, "success"),
            other => panic!("{other:?}"),
        }
        e.shutdown().await;
    }
}
