//! An agent's report is the action's whole outcome (DESIGN §1, §5), as a Rust handler's
//! would be: a target or a retry with a delay, property changes, entities created as
//! successors (with a first event), events raised on entities named by key or by relation
//! — all in the transition's one commit, joined to the request's operation. A report that
//! does not fit the machines is refused when it arrives, naming the field, and changes
//! nothing.

mod common;

use std::time::Duration;

use serde_json::json;
use settle_core::step::{Create, PropChange, Raise};
use settle_core::{ActionOutcome, Broadcast, Machine, MachineBuilder, Properties, Related, StateName};
use settle_engine::{Engine, Error, ManualClock, RaiseOptions, Wait};
use settle_store::{AgentTask, SqliteStore, Store, TaskFilter, TaskRefusal, TaskResult};

const LOCK: Duration = Duration::from_secs(30);

/// `server`: new -create→ provisioning, whose auto action `provision` an agent runs →
/// awaiting (its children all ready → ready) or back to provisioning (a retry).
fn server() -> Machine {
    MachineBuilder::new("server")
        .state("new")
        .initial()
        .state("provisioning")
        .auto("provision")
        .state("awaiting")
        .state("ready")
        .requires(["ip"])
        .event("create", ["new"], "begin")
        .event("all_ready", ["awaiting"], "finish")
        .subscribe("all(child) in [ready]")
        .action("begin", ["provisioning"])
        .action("provision", ["awaiting", "provisioning"])
        .agent("cloud", LOCK)
        .may_create(["child"])
        .may_raise(["finish"])
        .action("finish", ["ready"])
        .build()
        .unwrap()
}

/// `child`: waiting -finish {by}→ ready.
fn child() -> Machine {
    MachineBuilder::new("child")
        .state("waiting")
        .initial()
        .state("ready")
        .event("finish", ["waiting"], "do_finish")
        .params(["by"])
        .action("do_finish", ["ready"])
        .build()
        .unwrap()
}

async fn engine(dir: &tempfile::TempDir, clock: &ManualClock) -> Engine<SqliteStore> {
    let store = SqliteStore::open(dir.path().join("outcomes.db")).unwrap();
    Engine::builder(store).machine(server()).machine(child()).clock(clock.clone()).start().await.unwrap()
}

async fn start(engine: &Engine<SqliteStore>, key: &str) -> (String, AgentTask) {
    engine.create("server", key, Properties::new()).await.unwrap();
    let raised = engine.raise("server", key, "create", RaiseOptions::wait(Wait::Outcome)).await.unwrap();
    let mut tasks = engine.agent_lease("cloud", "agent-1", 1, Duration::from_secs(10)).await.unwrap();
    assert_eq!(tasks.len(), 1, "a task is offered");
    (raised.request_id, tasks.remove(0))
}

fn props(v: serde_json::Value) -> Properties {
    v.as_object().unwrap().clone()
}

#[tokio::test]
async fn a_report_creates_successors_and_raises_events_in_its_commit() {
    let dir = tempfile::tempdir().unwrap();
    let clock = common::clock();
    let engine = engine(&dir, &clock).await;
    let (request_id, task) = start(&engine, "s1").await;
    let outcome = ActionOutcome {
        target: Some(StateName::new("awaiting")),
        changes: vec![PropChange::Set("ip".into(), json!("10.0.0.7"))],
        creates: vec![
            Create { machine: "child".into(), key: "s1-app".into(), properties: props(json!({"size": 2})) },
            Create { machine: "child".into(), key: "s1-db".into(), properties: Properties::new() },
        ],
        raises: vec![Raise {
            machine: "child".into(),
            key: "s1-app".into(),
            event: "finish".into(),
            params: json!({"by": "agent"}),
            join: false,
            reply: None,
        }],
        ..ActionOutcome::default()
    };
    engine.agent_report(task.id, task.token.as_deref().unwrap(), TaskResult::Complete(outcome)).await.unwrap();
    engine.wait_idle().await.unwrap();

    let s = engine.get("server", "s1").await.unwrap().unwrap();
    assert_eq!((s.state.as_str(), &s.properties["ip"]), ("awaiting", &json!("10.0.0.7")));
    let succ = engine.store().successor_snapshot(s.id).await.unwrap().successors;
    let mut keys: Vec<_> = succ.iter().map(|e| (e.key.to_string(), e.state.to_string())).collect();
    keys.sort();
    assert_eq!(keys, [("s1-app".into(), "ready".into()), ("s1-db".into(), "waiting".into())]);
    let app = engine.get("child", "s1-app").await.unwrap().unwrap();
    assert_eq!(app.properties["size"], json!(2));
    // What the report created and raised joined the request's operation.
    assert_eq!(app.request_id.as_deref(), Some(request_id.as_str()));

    // The other child finishes: the subscription over both fires and the server is ready.
    let by_test = RaiseOptions::wait(Wait::Stable).params(json!({"by": "test"}));
    engine.raise("child", "s1-db", "finish", by_test).await.unwrap();
    engine.wait_idle().await.unwrap();
    assert_eq!(engine.get("server", "s1").await.unwrap().unwrap().state, "ready");
    let op = engine.operation(&request_id).await.unwrap().unwrap();
    assert_eq!(op.outcome.as_deref(), Some("success"), "{op:?}");
    engine.shutdown().await;
}

#[tokio::test]
async fn a_report_raises_on_its_relations_and_retries_with_a_delay() {
    let dir = tempfile::tempdir().unwrap();
    let clock = common::clock();
    let engine = engine(&dir, &clock).await;
    let (_, task) = start(&engine, "s2").await;
    // No target: the same state again, its action offered again after the delay.
    let retry = ActionOutcome { delay: Some(Duration::from_secs(5)), ..ActionOutcome::default() };
    engine.agent_report(task.id, task.token.as_deref().unwrap(), TaskResult::Complete(retry)).await.unwrap();
    engine.wait_caught_up().await.unwrap();
    let s = engine.get("server", "s2").await.unwrap().unwrap();
    assert_eq!((s.state.as_str(), s.retry), ("provisioning", 1));
    let none = engine.agent_lease("cloud", "agent-1", 1, Duration::ZERO).await.unwrap();
    assert!(none.is_empty(), "not before the delay: {none:?}");
    clock.advance(Duration::from_secs(5));
    let mut again = engine.agent_lease("cloud", "agent-1", 1, Duration::from_secs(10)).await.unwrap();
    assert_eq!(again.len(), 1, "offered again after the delay");
    let task = again.remove(0);

    // A child created with a first event, then an event on every successor.
    let outcome = ActionOutcome {
        target: Some(StateName::new("awaiting")),
        changes: vec![PropChange::Set("ip".into(), json!("10.0.0.8"))],
        creates: vec![Create { machine: "child".into(), key: "s2-dns".into(), properties: Properties::new() }],
        related: vec![Broadcast { event: "finish".into(), on: Related::Successors, params: json!({"by": "server"}) }],
        ..ActionOutcome::default()
    };
    engine.agent_report(task.id, task.token.as_deref().unwrap(), TaskResult::Complete(outcome)).await.unwrap();
    engine.wait_idle().await.unwrap();
    let dns = engine.get("child", "s2-dns").await.unwrap().unwrap();
    assert_eq!(dns.state, "ready", "the event raised on the successors reached the child created in the same commit");
    assert_eq!(engine.get("server", "s2").await.unwrap().unwrap().state, "ready");
    engine.shutdown().await;
}

#[tokio::test]
async fn a_report_that_does_not_fit_is_refused_naming_the_field_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let clock = common::clock();
    let engine = engine(&dir, &clock).await;
    let (_, task) = start(&engine, "s3").await;
    let token = task.token.clone().unwrap();
    let to_awaiting = |o: ActionOutcome| ActionOutcome { target: Some(StateName::new("awaiting")), ..o };
    let child = |key: &str| Create { machine: "child".into(), key: key.into(), properties: Properties::new() };
    let raise = |machine: &str, event: &str, params: serde_json::Value| Raise {
        machine: machine.into(),
        key: "s3-x".into(),
        event: event.into(),
        params,
        join: false,
        reply: None,
    };
    let cases = [
        (
            ActionOutcome { target: Some(StateName::new("ready")), ..ActionOutcome::default() },
            "target",
            "may not move to `ready`",
        ),
        (
            to_awaiting(ActionOutcome {
                creates: vec![
                    child("ok"),
                    Create { machine: "nope".into(), key: "k".into(), properties: Properties::new() },
                ],
                ..ActionOutcome::default()
            }),
            "create[1]",
            "nope",
        ),
        (
            to_awaiting(ActionOutcome {
                creates: vec![child("s3-x")],
                raises: vec![raise("child", "finish", json!({}))],
                ..ActionOutcome::default()
            }),
            "raise[0]",
            "requires parameter `by`",
        ),
        (
            to_awaiting(ActionOutcome {
                raises: vec![raise("child", "explode", json!(null))],
                ..ActionOutcome::default()
            }),
            "raise[0]",
            "has no event `explode`",
        ),
        (
            to_awaiting(ActionOutcome {
                related: vec![Broadcast { event: "unheard".into(), on: Related::Predecessors, params: json!(null) }],
                ..ActionOutcome::default()
            }),
            "raise_on[0]",
            "no machine declares that event",
        ),
        // Machines and events that exist, but beyond what the action declares.
        (
            to_awaiting(ActionOutcome {
                creates: vec![Create { machine: "server".into(), key: "s9".into(), properties: Properties::new() }],
                ..ActionOutcome::default()
            }),
            "create[0]",
            "may not create a `server` entity (`may_create`: child)",
        ),
        (
            to_awaiting(ActionOutcome {
                related: vec![Broadcast { event: "all_ready".into(), on: Related::Predecessors, params: json!(null) }],
                ..ActionOutcome::default()
            }),
            "raise_on[0]",
            "may not raise `all_ready` (`may_raise`: finish)",
        ),
    ];
    for (outcome, want_field, want_reason) in cases {
        let r = engine.agent_report(task.id, &token, TaskResult::Complete(outcome)).await;
        match r {
            Err(Error::Task(TaskRefusal::BadReport { field, reason, .. })) => {
                assert_eq!(field, want_field, "{reason}");
                assert!(reason.contains(want_reason), "{field}: {reason}");
            }
            other => panic!("{want_field}: {other:?}"),
        }
    }
    // Nothing changed: the entity waits in its state, the task is still leased to the
    // agent, and no child exists.
    let s = engine.get("server", "s3").await.unwrap().unwrap();
    assert_eq!((s.state.as_str(), s.version), ("provisioning", task.entity_version));
    let t = engine.store().task_list(TaskFilter { id: Some(task.id), ..TaskFilter::default() }).await.unwrap();
    assert_eq!(t[0].status, "leased");
    assert!(engine.get("child", "ok").await.unwrap().is_none());
    // The right report still applies.
    let fits = to_awaiting(ActionOutcome { creates: vec![child("s3-x")], ..ActionOutcome::default() });
    engine.agent_report(task.id, &token, TaskResult::Complete(fits)).await.unwrap();
    engine.wait_idle().await.unwrap();
    assert_eq!(engine.get("child", "s3-x").await.unwrap().unwrap().state, "waiting");
    engine.shutdown().await;
}

#[tokio::test]
async fn a_handlers_outcome_is_held_to_its_actions_declaration_too() {
    let dir = tempfile::tempdir().unwrap();
    let clock = common::clock();
    let builder = MachineBuilder::new("builder")
        .state("building")
        .initial()
        .auto("build")
        .state("built")
        .action("build", ["built"])
        .may_create(["child"])
        .build()
        .unwrap();
    let store = SqliteStore::open(dir.path().join("declared.db")).unwrap();
    let engine = Engine::builder(store)
        .machine(builder)
        .machine(child())
        .machine(server())
        .clock(clock.clone())
        .on("builder", "build", |ctx| async move {
            // A `child` it may create; a `server` it may not.
            let kind = if ctx.key.as_str() == "ok" { "child" } else { "server" };
            Ok(settle_engine::Outcome::to("built").create(kind, format!("{}-made", ctx.key), Properties::new()))
        })
        .start()
        .await
        .unwrap();
    engine.create("builder", "ok", Properties::new()).await.unwrap();
    engine.create("builder", "bad", Properties::new()).await.unwrap();
    engine.wait_caught_up().await.unwrap();
    assert_eq!(engine.get("builder", "ok").await.unwrap().unwrap().state, "built");
    assert!(engine.get("child", "ok-made").await.unwrap().is_some());
    // Beyond the declaration: a fault of the action, nothing of its outcome committed.
    let bad = engine.get("builder", "bad").await.unwrap().unwrap();
    assert_eq!(bad.state, "building");
    assert!(engine.get("server", "bad-made").await.unwrap().is_none());
    let history = engine.history("builder", "bad").await.unwrap();
    let detail = history.iter().filter_map(|h| h.detail.as_deref()).collect::<Vec<_>>().join("\n");
    assert!(
        detail.contains("create[0]: action `build` may not create a `server` entity (`may_create`: child)"),
        "{detail}"
    );
    engine.shutdown().await;
}
