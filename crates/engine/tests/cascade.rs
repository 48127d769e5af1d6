//! A kill that cascades, on SQLite and, when `SETTLE_TEST_PG` is set, on PostgreSQL: a
//! server whose machine says `cascade = ["kill"]` takes its resources with it (each killed
//! as part of one bulk operation, `{kill}/successors`, each resource `…/successors/{id}`,
//! its queued and running work dropped), a resource's own successors follow as its machine
//! says, and a machine that does not cascade leaves its successors running. A delete that
//! cascades (`cascade = ["delete"]`): entering its deleted state raises each successor's
//! own delete event (`delete = "…"`) in the same commit and operation.

mod common;

use std::time::Duration;

use settle_core::Machine;
use settle_engine::{Command, Engine, RaiseOptions, Wait};
use settle_store::{AnyStore, HistoryKind};

use common::stores;

/// `cascade`: create → creating, whose declarative action creates `KEY-a` and `KEY-b`
/// (resources, each started) → up.
fn server(name: &str, cascade: bool) -> Machine {
    let text = format!(
        "initial = \"new\"\n{}\n[states.new]\n[states.creating]\nauto = \"make\"\n[states.up]\n\
         [events.create]\nin = [\"new\"]\naction = \"begin\"\n[actions.begin]\nto = [\"creating\"]\n\
         [actions.make]\nto = [\"up\"]\n\
         create = [{{ machine = \"res\", key = \"key + '-a'\", event = \"go\" }}, {{ machine = \"res\", key = \"key + '-b'\", event = \"go\" }}]\n\
         may_create = [\"res\"]\n",
        if cascade { "cascade = [\"kill\"]" } else { "" }
    );
    settle_core::toml::load("server.toml", name, &text).unwrap().0
}

/// `res`: go → working, which waits an hour before its auto action (it is busy), and
/// creates a `part` once there; cascades its kill too.
fn res() -> Machine {
    let text = "initial = \"pending\"\ncascade = [\"kill\"]\n[states.pending]\n[states.working]\nauto = \"finish\"\nwait = \"1h\"\n\
                [states.done]\n[events.go]\nin = [\"pending\"]\naction = \"start\"\n\
                [actions.start]\nto = [\"working\"]\ncreate = [{ machine = \"part\", key = \"key + '-p'\" }]\nmay_create = [\"part\"]\n\
                [actions.finish]\nto = [\"done\"]\n";
    settle_core::toml::load("res.toml", "res", text).unwrap().0
}

fn part() -> Machine {
    settle_core::toml::load("part.toml", "part", "initial = \"idle\"\n[states.idle]\n").unwrap().0
}

async fn status(e: &Engine<AnyStore>, machine: &str, key: &str) -> String {
    e.get(machine, key).await.unwrap().unwrap().run_status.as_str().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cascading_kill_takes_the_successors_and_theirs_and_a_plain_one_does_not() {
    for (_dir, store) in stores("cascade_kill").await {
        let e = Engine::builder(store)
            .machine(server("server", true))
            .machine(server("plain", false))
            .machine(res())
            .machine(part())
            .start()
            .await
            .unwrap();
        for (m, k) in [("server", "s1"), ("plain", "p1")] {
            e.create(m, k, Default::default()).await.unwrap();
            e.raise(m, k, "create", Default::default()).await.unwrap();
        }
        // The resources work for an hour (their auto action waits): look until they are there.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        for k in ["s1-a", "s1-b", "p1-a", "s1-a-p", "s1-b-p"] {
            let m = if k.ends_with("-p") { "part" } else { "res" };
            while e.get(m, k).await.unwrap().is_none_or(|r| m == "res" && r.state != "working") {
                assert!(tokio::time::Instant::now() < deadline, "{k} never came");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        for k in ["s1-a", "s1-b", "p1-a"] {
            let r = e.get("res", k).await.unwrap().unwrap();
            assert_eq!((r.state.as_str(), r.run_status.as_str()), ("working", "active"), "{k}");
        }

        let killed = e
            .command_with_reason("server", "s1", Command::Kill, Some("kill-s1".into()), Some("decommission"))
            .await
            .unwrap();
        assert_eq!(killed.entity.run_status.as_str(), "killed");
        let bulk = e.bulk_wait("kill-s1/successors", Duration::from_secs(60)).await.unwrap();
        assert_eq!((bulk.status.as_str(), bulk.done, bulk.failed), ("done", 2, 0), "{bulk:?}");
        assert_eq!(bulk.reason, "cascade: server/s1 killed (decommission)");
        for k in ["s1-a", "s1-b"] {
            assert_eq!(status(&e, "res", k).await, "killed", "{k}");
            let r = e.get("res", k).await.unwrap().unwrap();
            // Its kill is an operation under the server's, with its trace.
            let history = e.history("res", k).await.unwrap();
            let kill = history.iter().rev().find(|h| h.kind == HistoryKind::Command).unwrap();
            assert_eq!(kill.request_id.as_deref(), Some(format!("kill-s1/successors/{}", r.id).as_str()));
            assert!(e.operation(&format!("kill-s1/successors/{}", r.id)).await.unwrap().is_some());
            // Its own successor follows, as its machine cascades too.
            let part_bulk = format!("kill-s1/successors/{}/successors", r.id);
            e.bulk_wait(&part_bulk, Duration::from_secs(60)).await.unwrap();
            assert_eq!(status(&e, "part", &format!("{k}-p")).await, "killed");
        }
        // A machine without `cascade` leaves its successors as they were.
        e.command("plain", "p1", Command::Kill, Some("kill-p1".into())).await.unwrap();
        assert_eq!(status(&e, "res", "p1-a").await, "active");
        assert!(e.bulk_get("kill-p1/successors").await.unwrap().is_none());
        // The same kill again replays, and the cascade with it.
        let again = e.command("server", "s1", Command::Kill, Some("kill-s1".into())).await.unwrap();
        assert!(again.replayed);
        assert_eq!(e.bulk_get("kill-s1/successors").await.unwrap().unwrap().done, 2);
        e.shutdown().await;
    }
}

/// `site` (`cascade = ["delete"]` when `cascade`): create → up, creating two `vol`s (each
/// started); `destroy` in up → gone (deleted).
fn site(name: &str, cascade: bool) -> Machine {
    let text = format!(
        "initial = \"new\"\n{}\n[states.new]\n[states.creating]\nauto = \"make\"\n[states.up]\n[states.gone]\nkind = \"deleted\"\n\
         [events.create]\nin = [\"new\"]\naction = \"begin\"\n[events.destroy]\nin = [\"up\"]\naction = \"drop\"\n\
         [actions.begin]\nto = [\"creating\"]\n[actions.drop]\nto = [\"gone\"]\n\
         [actions.make]\nto = [\"up\"]\n\
         create = [{{ machine = \"vol\", key = \"key + '-a'\", event = \"go\" }}, {{ machine = \"vol\", key = \"key + '-b'\", event = \"go\" }}]\n\
         may_create = [\"vol\"]\n",
        if cascade { "cascade = [\"delete\"]" } else { "" }
    );
    settle_core::toml::load("site.toml", name, &text).unwrap().0
}

/// `vol`: go → ready; its delete event `remove` (in ready) runs `wipe` → removed (deleted).
fn vol() -> Machine {
    let text = "initial = \"pending\"\ndelete = \"remove\"\n[states.pending]\n[states.ready]\n[states.wiping]\nauto = \"wipe\"\n\
                [states.removed]\nkind = \"deleted\"\n[events.go]\nin = [\"pending\"]\naction = \"start\"\n\
                [events.remove]\nin = [\"ready\"]\naction = \"begin_wipe\"\n[actions.start]\nto = [\"ready\"]\n\
                [actions.begin_wipe]\nto = [\"wiping\"]\n[actions.wipe]\nto = [\"removed\"]\n";
    settle_core::toml::load("vol.toml", "vol", text).unwrap().0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cascading_delete_raises_each_successors_delete_event_in_the_same_operation() {
    for (_dir, store) in stores("cascade_delete").await {
        let e = Engine::builder(store)
            .machine(site("site", true))
            .machine(site("plainsite", false))
            .machine(vol())
            .start()
            .await
            .unwrap();
        for (m, k) in [("site", "s1"), ("plainsite", "p1")] {
            e.create(m, k, Default::default()).await.unwrap();
            let wait = RaiseOptions { wait: Wait::Operation, ..RaiseOptions::default() };
            e.raise(m, k, "create", wait).await.unwrap();
        }
        for k in ["s1-a", "s1-b", "p1-a"] {
            assert_eq!(e.get("vol", k).await.unwrap().unwrap().state, "ready", "{k}");
        }
        // Deleting the site deletes its volumes, as one operation that ends when they are.
        let destroy =
            RaiseOptions { wait: Wait::Operation, request_id: Some("destroy-s1".into()), ..RaiseOptions::default() };
        let done = e.raise("site", "s1", "destroy", destroy).await.unwrap();
        assert_eq!(done.operation.as_ref().and_then(|o| o.outcome.as_deref()), Some("success"));
        for k in ["s1-a", "s1-b"] {
            let history = e.history("vol", k).await.unwrap();
            let went: Vec<(&str, Option<&str>)> =
                history.iter().filter_map(|h| h.to.as_ref().map(|s| (s.as_str(), h.request_id.as_deref()))).collect();
            assert!(
                went.ends_with(&[("wiping", Some("destroy-s1")), ("removed", Some("destroy-s1"))]),
                "{k}: {went:?}"
            );
        }
        // A machine that does not cascade its delete leaves its successors as they were.
        let plain = RaiseOptions { wait: Wait::Operation, ..RaiseOptions::default() };
        e.raise("plainsite", "p1", "destroy", plain).await.unwrap();
        assert_eq!(e.get("vol", "p1-a").await.unwrap().unwrap().state, "ready");
        e.shutdown().await;
    }
}
