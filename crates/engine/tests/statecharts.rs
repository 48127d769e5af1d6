//! Statecharts run durably (DESIGN §1, "Composite states"): substates, guards, entry and
//! exit actions (declarative and handlers), internal transitions and ignored events, on
//! SQLite and, when `SETTLE_TEST_PG` is set, on PostgreSQL (a schema per test).

mod common;

use serde_json::{Value, json};
use settle_core::Machine;
use settle_engine::{Engine, EngineBuilder, EventOutcome, ManualClock, Outcome, RaiseOptions, Wait};
use settle_store::{AnyStore, HistoryKind, Store};

/// The cloud instance of settle-core's fixtures: substates of `active`, declarative entry
/// and exit actions, a guarded `resize`, an internal `touch`, ignored `start` and `stop`.
fn instance() -> Machine {
    let text = include_str!("../../core/src/testdata/instance.toml");
    settle_core::toml::load("instance.toml", "instance", text).unwrap().0
}

/// The stores to run on: SQLite, and PostgreSQL (a schema of its own) when available.
use common::stores;

fn stable(params: Value) -> RaiseOptions {
    RaiseOptions::wait(Wait::Stable).params(params)
}

async fn start(builder: EngineBuilder<AnyStore>) -> (Engine<AnyStore>, ManualClock) {
    let clock = common::clock();
    (builder.clock(clock.clone()).start().await.unwrap(), clock)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statechart_runs_its_substates_guards_hooks_internal_and_ignored_events() {
    for (_dir, store) in stores("statechart_instance").await {
        let (engine, _clock) = start(Engine::builder(store).machine(instance())).await;
        let props = json!({"max_size": 4}).as_object().cloned().unwrap();
        engine.create("instance", "i1", props).await.unwrap();
        engine.wait_idle().await.unwrap();
        let e = engine.get("instance", "i1").await.unwrap().unwrap();
        assert_eq!(e.state, "running", "provisioned, entered `active` and its initial `starting`, booted");
        assert_eq!((&e.properties["ip"], &e.properties["announced"]), (&json!("10.0.0.9"), &json!(true)));

        let grow = engine.raise("instance", "i1", "resize", stable(json!({"size": 2}))).await.unwrap();
        assert_eq!(grow.outcome, Some(EventOutcome::Accepted { state: "resizing".into() }));
        assert_eq!(grow.entity.as_ref().unwrap().state, "running");
        assert_eq!(grow.entity.unwrap().properties["resized"], json!(true), "on_entry_from resize");
        let too_big = engine.raise("instance", "i1", "resize", stable(json!({"size": 9}))).await.unwrap();
        let reason = "size above this instance's maximum".to_string();
        assert_eq!(too_big.outcome, Some(EventOutcome::Rejected { state: "running".into(), reason }));

        let before = engine.get("instance", "i1").await.unwrap().unwrap();
        let touched = engine.raise("instance", "i1", "touch", stable(Value::Null)).await.unwrap();
        let after = touched.entity.unwrap();
        assert_eq!(touched.outcome, Some(EventOutcome::Accepted { state: "running".into() }));
        assert_eq!(after.properties["touched"], json!(true));
        assert_eq!((after.state.as_str(), after.entered_at), ("running", before.entered_at), "no state entry");
        assert!(after.version > before.version, "an internal transition moves the version");

        let start = engine.raise("instance", "i1", "start", stable(Value::Null)).await.unwrap();
        assert_eq!(start.outcome, Some(EventOutcome::Ignored { state: "running".into() }));
        let stopped = engine.raise("instance", "i1", "stop", stable(Value::Null)).await.unwrap().entity.unwrap();
        assert_eq!(stopped.state, "stopped");
        assert!(stopped.properties.get("ip").is_none(), "released on leaving `active`");
        let again = engine.raise("instance", "i1", "stop", stable(Value::Null)).await.unwrap();
        assert_eq!(again.outcome, Some(EventOutcome::Ignored { state: "stopped".into() }));
        let back = engine.raise("instance", "i1", "start", stable(Value::Null)).await.unwrap().entity.unwrap();
        assert_eq!((back.state.as_str(), &back.properties["ip"]), ("running", &json!("10.0.0.9")));

        let history = engine.history("instance", "i1").await.unwrap();
        type Row<'a> = (HistoryKind, Option<&'a str>, Option<&'a str>, Option<&'a str>);
        let rows: Vec<Row<'_>> =
            history.iter().map(|h| (h.kind, h.event.as_deref(), h.from.as_deref(), h.to.as_deref())).collect();
        use HistoryKind::*;
        assert_eq!(
            rows,
            [
                (Create, None, None, Some("provisioning")),
                (Auto, None, Some("provisioning"), Some("starting")),
                (Auto, None, Some("starting"), Some("running")),
                (Event, Some("resize"), Some("running"), Some("resizing")),
                (Auto, None, Some("resizing"), Some("running")),
                (Rejected, Some("resize"), Some("running"), None),
                (Internal, Some("touch"), Some("running"), Some("running")),
                (Ignored, Some("start"), Some("running"), None),
                (Event, Some("stop"), Some("running"), Some("stopped")),
                (Ignored, Some("stop"), Some("stopped"), None),
                (Event, Some("start"), Some("stopped"), Some("starting")),
                (Auto, None, Some("starting"), Some("running")),
            ]
        );
        let ignored = history.iter().find(|h| h.kind == Ignored).unwrap();
        assert_eq!(ignored.detail.as_deref(), Some("ignored in `active`, which contains `running`"));
        engine.shutdown().await;
    }
}

/// `lab`: idle -go→ work (a parent: initial `prep`) ; prep -next→ run ; both substates of
/// `work`. Each of `work`, `prep` and `run` has entry and exit actions bound to a handler
/// that appends `entry X` / `exit X` to the property `log`.
fn lab() -> Machine {
    settle_core::MachineBuilder::new("lab")
        .state("idle")
        .initial()
        .on_exit("leave_idle")
        .state("work")
        .initial_child("prep")
        .on_entry("enter_work")
        .on_exit("leave_work")
        .state("prep")
        .parent("work")
        .on_entry("enter_prep")
        .on_exit("leave_prep")
        .state("run")
        .parent("work")
        .on_entry("enter_run")
        .on_exit("leave_run")
        .event("go", ["idle"], "start")
        .event("next", ["prep"], "advance")
        .event("done", ["work"], "finish")
        .action("start", ["work"])
        .action("advance", ["run"])
        .action("finish", ["idle"])
        .effect("leave_idle")
        .effect("enter_work")
        .effect("leave_work")
        .effect("enter_prep")
        .effect("leave_prep")
        .effect("enter_run")
        .effect("leave_run")
        .build()
        .unwrap()
}

/// Binds every hook of `lab` to a handler that logs it.
fn logging(mut b: EngineBuilder<AnyStore>) -> EngineBuilder<AnyStore> {
    for hook in ["leave_idle", "enter_work", "leave_work", "enter_prep", "leave_prep", "enter_run", "leave_run"] {
        b = b.on("lab", hook, move |ctx| async move {
            let mut log = ctx.properties.get("log").and_then(Value::as_array).cloned().unwrap_or_default();
            let (what, state) =
                if ctx.action.starts_with("enter") { ("entry", &ctx.state) } else { ("exit", &ctx.state) };
            log.push(json!(format!("{what} {state}")));
            Ok(Outcome::stay().set("log", json!(log)))
        });
    }
    b
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entry_and_exit_actions_run_innermost_exit_first_outermost_entry_first() {
    for (_dir, store) in stores("statechart_hooks").await {
        let (engine, _clock) = start(logging(Engine::builder(store).machine(lab()))).await;
        engine.create("lab", "l", Default::default()).await.unwrap();
        let log = |e: &settle_store::EntityRow| -> Vec<String> {
            e.properties["log"].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_string()).collect()
        };
        let e = engine.raise("lab", "l", "go", stable(Value::Null)).await.unwrap().entity.unwrap();
        assert_eq!(e.state, "prep");
        assert_eq!(log(&e), ["exit idle", "entry work", "entry prep"]);
        let e = engine.raise("lab", "l", "next", stable(Value::Null)).await.unwrap().entity.unwrap();
        assert_eq!(log(&e)[3..], ["exit prep", "entry run"], "`work`, the common ancestor, is untouched");
        let e = engine.raise("lab", "l", "done", stable(Value::Null)).await.unwrap().entity.unwrap();
        assert_eq!(log(&e)[5..], ["exit run", "exit work"], "innermost first; `idle` has no entry action");
        assert_eq!(e.state, "idle");
        engine.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_action_whose_commit_fails_leaves_nothing_of_the_transition() {
    for (_dir, store) in stores("statechart_commit_fails").await {
        store.sql_execute("CREATE TABLE IF NOT EXISTS seats (name TEXT PRIMARY KEY)").await.unwrap();
        store.sql_execute("INSERT INTO seats VALUES ('taken')").await.unwrap();
        let insert = match &store {
            AnyStore::Sqlite(_) => "INSERT INTO seats (name) VALUES (?1)",
            AnyStore::Postgres(_) => "INSERT INTO seats (name) VALUES ($1)",
        };
        let builder = Engine::builder(store.clone()).machine(lab());
        let builder = logging(builder).on("lab", "enter_run", move |_| async move {
            // Its SQL breaks a constraint: the commit of the whole transition fails.
            Ok(Outcome::stay().set("seat", json!("taken")).sql(insert, [json!("taken")]))
        });
        let (engine, _clock) = start(builder).await;
        engine.create("lab", "l", Default::default()).await.unwrap();
        engine.raise("lab", "l", "go", stable(Value::Null)).await.unwrap();
        let before = engine.get("lab", "l").await.unwrap().unwrap();
        let r = engine.raise("lab", "l", "next", stable(Value::Null)).await.unwrap();
        match r.outcome {
            Some(EventOutcome::Failed { error }) => {
                assert!(error.starts_with("commit failed: sql statement 0 failed"), "{error}")
            }
            other => panic!("expected the event to fail, got {other:?}"),
        }
        let after = engine.get("lab", "l").await.unwrap().unwrap();
        assert_eq!((after.state.as_str(), &after.properties), ("prep", &before.properties), "nothing of it");
        assert!(after.properties.get("seat").is_none());
        let last = engine.history("lab", "l").await.unwrap().pop().unwrap();
        assert_eq!((last.kind, last.to), (HistoryKind::Fault, None));
        engine.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_or_target_choosing_entry_action_is_a_fault_of_the_transition() {
    for (_dir, store) in stores("statechart_hook_faults").await {
        let builder = Engine::builder(store).machine(lab());
        let builder = logging(builder).on("lab", "enter_run", |_| async { Err("the lab is on fire".into()) }).on(
            "lab",
            "leave_prep",
            |_| async { Ok(Outcome::stay()) },
        );
        let (engine, _clock) = start(builder).await;
        engine.create("lab", "l", Default::default()).await.unwrap();
        engine.raise("lab", "l", "go", stable(Value::Null)).await.unwrap();
        let r = engine.raise("lab", "l", "next", stable(Value::Null)).await.unwrap();
        let Some(EventOutcome::Failed { error }) = r.outcome else { panic!("{:?}", r.outcome) };
        assert_eq!(error, "entry action `enter_run` of state `run`: action error: the lab is on fire");
        assert_eq!(engine.get("lab", "l").await.unwrap().unwrap().state, "prep");
        engine.shutdown().await;

        let store = engine.store().clone();
        let builder = logging(Engine::builder(store).machine(lab()))
            .on("lab", "enter_run", |_| async { Ok(Outcome::to("idle")) });
        let (engine, _clock) = start(builder).await;
        let r = engine.raise("lab", "l", "next", stable(Value::Null)).await.unwrap();
        let Some(EventOutcome::Failed { error }) = r.outcome else { panic!("{:?}", r.outcome) };
        assert_eq!(
            error,
            "entry action `enter_run` of state `run` asked to move to `idle`, but entry and exit actions never choose a state"
        );
        engine.shutdown().await;
    }
}

#[tokio::test]
async fn a_handler_bound_to_a_declarative_action_is_refused_at_start() {
    let (_dir, store) = common::sqlite();
    let err = Engine::builder(store)
        .machine(instance())
        .on("instance", "announce", |_| async { Ok(Outcome::stay()) })
        .start()
        .await
        .err()
        .unwrap();
    assert_eq!(
        err.to_string(),
        "machine `instance`: action `announce` is declarative (`set`, `raise`): it takes no handler"
    );
}

/// `cluster` and `node`, in TOML: the cluster's `spawn` handler creates two nodes; a node
/// that comes `up` tells its predecessors (`announce`, declarative); a cluster that starts
/// `dissolving` tells its successors to stop (`tell_nodes`, declarative).
fn cluster_and_node() -> (Machine, Machine) {
    let cluster = r#"
initial = "forming"
properties = ["heard"]
[states.forming]
[states.growing]
auto = "spawn"
[states.waiting]
[states.dissolving]
on_entry = "tell_nodes"
[events.grow]
in = ["forming"]
action = "begin"
[events.node_ready]
in = ["waiting"]
params = ["node"]
action = "note"
internal = true
[events.dissolve]
in = ["waiting"]
action = "end"
[actions.begin]
to = ["growing"]
[actions.spawn]
to = ["waiting"]
[actions.note]
set = { heard = true }
[actions.end]
to = ["dissolving"]
[actions.tell_nodes]
raise = [{ event = "stop", on = "successors" }]
"#;
    let node = r#"
initial = "booting"
[states.booting]
[states.up]
on_entry = "announce"
[states.stopped]
kind = "terminal"
[events.boot]
in = ["booting"]
action = "come_up"
[events.ping]
in = ["up"]
action = "come_up"
ignore = ["booting"]
[events.stop]
in = ["booting", "up"]
action = "halt"
[actions.come_up]
to = ["up"]
[actions.announce]
raise = [{ event = "node_ready", on = "predecessors", params = { node = "a node" } }]
[actions.halt]
to = ["stopped"]
"#;
    let load = |name, text| settle_core::toml::load(&format!("{name}.toml"), name, text).unwrap().0;
    (load("cluster", cluster), load("node", node))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declarative_actions_raise_events_on_predecessors_and_successors() {
    for (_dir, store) in stores("statechart_related").await {
        let (cluster, node) = cluster_and_node();
        let builder = Engine::builder(store).machine(cluster).machine(node).on("cluster", "spawn", |_| async {
            // A handler raises on related entities too: the nodes it creates in this commit.
            Ok(Outcome::to("waiting")
                .create("node", "n1", Default::default())
                .create("node", "n2", Default::default())
                .raise_on(settle_core::Related::Successors, "ping", Value::Null))
        });
        let (engine, _clock) = start(builder).await;
        engine.create("cluster", "c", Default::default()).await.unwrap();
        engine.raise("cluster", "c", "grow", stable(Value::Null)).await.unwrap();
        engine.wait_idle().await.unwrap();
        for n in ["n1", "n2"] {
            let history = engine.history("node", n).await.unwrap();
            let last = history.last().unwrap();
            assert_eq!((last.kind, last.event.as_deref()), (HistoryKind::Ignored, Some("ping")), "{n}: {history:?}");
        }

        let up = engine.raise("node", "n1", "boot", stable(Value::Null)).await.unwrap();
        let request_id = up.request_id.clone();
        engine.wait_idle().await.unwrap();
        let c = engine.get("cluster", "c").await.unwrap().unwrap();
        assert_eq!((c.state.as_str(), &c.properties["heard"]), ("waiting", &json!(true)), "told by n1's entry");
        let last = engine.history("cluster", "c").await.unwrap().pop().unwrap();
        assert_eq!((last.kind, last.event.as_deref()), (HistoryKind::Internal, Some("node_ready")));
        assert_eq!(last.request_id, Some(request_id), "the event belongs to the request that moved n1");

        engine.raise("cluster", "c", "dissolve", stable(Value::Null)).await.unwrap();
        engine.wait_idle().await.unwrap();
        for n in ["n1", "n2"] {
            assert_eq!(engine.get("node", n).await.unwrap().unwrap().state, "stopped", "{n}");
        }
        engine.shutdown().await;
    }
}

#[tokio::test]
async fn a_declarative_raise_of_an_event_no_machine_declares_is_refused_at_start() {
    let (_dir, store) = common::sqlite();
    let (_, node) = cluster_and_node();
    let err = Engine::builder(store).machine(node).start().await.err().unwrap();
    assert_eq!(
        err.to_string(),
        "invalid machine definition:\nerror: machine `node`, action `announce`: `raise` of `node_ready` on \
         predecessors: no machine in the set declares that event\n"
    );
}

/// A guarded ignore (Stateless's `IgnoreIf`): `ping` is accepted and dropped while its
/// guard holds (history kind `ignored`, nothing else changes), and runs its action when it
/// does not; on both stores.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guarded_ignore_drops_the_event_only_while_its_guard_holds() {
    let text = r#"
name = "pinger"
initial = "idle"
[states.idle]
[states.pinged]
[events.ping]
in = ["idle"]
params = ["quiet"]
[[events.ping.when]]
guard = "params.quiet == true"
ignore = true
[[events.ping.when]]
action = "answer"
[actions.answer]
to = ["pinged"]
"#;
    let pinger = settle_core::toml::load("pinger.toml", "pinger", text).expect("loads").0;
    for (_dir, store) in stores("statechart_guarded_ignore").await {
        let (engine, _clock) = start(Engine::builder(store).machine(pinger.clone())).await;
        engine.create("pinger", "p", Default::default()).await.unwrap();
        let quiet = engine.raise("pinger", "p", "ping", stable(json!({"quiet": true}))).await.unwrap();
        assert_eq!(quiet.outcome, Some(EventOutcome::Ignored { state: "idle".into() }));
        let loud = engine.raise("pinger", "p", "ping", stable(json!({"quiet": false}))).await.unwrap();
        assert_eq!(loud.outcome, Some(EventOutcome::Accepted { state: "pinged".into() }));
        let kinds: Vec<_> = engine.history("pinger", "p").await.unwrap().iter().map(|h| h.kind).collect();
        assert_eq!(kinds, [HistoryKind::Create, HistoryKind::Ignored, HistoryKind::Event], "{kinds:?}");
        engine.shutdown().await;
    }
}

/// Stateless's fallback: when no guard of the substate's handler holds, the superstate's
/// handler decides; on both stores.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_no_guard_of_a_substate_holds_its_superstates_handler_decides() {
    let text = r#"
name = "nest"
initial = "up"
[states.up]
initial = "child"
[states.child]
parent = "up"
[states.done]
kind = "terminal"
[states.other]
kind = "terminal"
[events.go]
in = ["up", "child"]
params = ["n"]
[[events.go.when]]
in = ["child"]
guard = "params.n > 1"
action = "inner"
[[events.go.when]]
in = ["up"]
action = "outer"
[actions.inner]
to = ["done"]
[actions.outer]
to = ["other"]
"#;
    let nest = settle_core::toml::load("nest.toml", "nest", text).expect("loads").0;
    for (_dir, store) in stores("statechart_fallback").await {
        let (engine, _clock) = start(Engine::builder(store).machine(nest.clone())).await;
        for (key, n, want) in [("a", 2, "done"), ("b", 0, "other")] {
            engine.create("nest", key, Default::default()).await.unwrap();
            let r = engine.raise("nest", key, "go", stable(json!({"n": n}))).await.unwrap();
            assert_eq!(r.outcome, Some(EventOutcome::Accepted { state: want.into() }), "n = {n}");
        }
        engine.shutdown().await;
    }
}
