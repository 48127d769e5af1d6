//! Sync nested events that hold no action open (DESIGN §1): an action raises an event with a
//! reply and moves its entity into a waiting state; when that event's workflow ends on the
//! other entity — at rest after it, rejected, or its action failed — the engine raises the
//! reply on the raiser in the commit that ends it, with what came of it. The other entity's
//! work here is an agent's, so its workflow spans a release and a claim (the reply it owes
//! is read back with the claim). On SQLite and on PostgreSQL (`SETTLE_TEST_PG`).

mod common;

use std::time::Duration;

use serde_json::{Value, json};
use settle_core::{ActionOutcome, Machine, Properties, StateName};
use settle_engine::{Engine, Outcome, RaiseOptions, Wait};
use settle_store::{HistoryKind, PgStore, Store, TaskResult};

fn load(name: &str, text: &str) -> Machine {
    settle_core::toml::load(&format!("{name}.toml"), name, text).expect("loads").0
}

/// `parent`: idle -go {child, size}→ asking, whose auto action `ask` (a Rust handler)
/// raises `start {size}` on the child with the reply `child_done` and waits; the reply
/// records what came of it and moves on to `told`.
fn parent() -> Machine {
    load(
        "parent",
        r#"
name = "parent"
initial = "idle"
[states.idle]
[states.asking]
auto = "ask"
[states.waiting]
[states.told]
[events.go]
in = ["idle"]
action = "begin"
params = ["child", "size"]
[events.child_done]
in = ["waiting"]
action = "record"
params = ["key", "outcome", "state", "reason"]
[actions.begin]
to = ["asking"]
[actions.ask]
to = ["waiting"]
may_raise = ["start"]
[actions.record]
to = ["told"]
set = { child = "params.key", outcome = "params.outcome", child_state = "params.state", reason = "params.reason" }
[fault]
max_errors = 1
"#,
    )
}

/// `child`: new -start {size}→ working, whose auto action `work` is an agent's (→ `done`);
/// one error parks it.
fn child() -> Machine {
    load(
        "child",
        r#"
name = "child"
initial = "new"
[states.new]
[states.working]
auto = "work"
[states.done]
[events.start]
in = ["new"]
action = "begin"
params = ["size"]
[actions.begin]
to = ["working"]
[actions.work]
to = ["done"]
agent = "q"
lock = "30s"
[fault]
max_errors = 1
"#,
    )
}

async fn engine<S: Store + Clone>(store: S) -> Engine<S> {
    Engine::builder(store)
        .machine(parent())
        .machine(child())
        .clock(common::clock())
        .on("parent", "ask", |ctx| async move {
            let child = ctx.params["child"].as_str().unwrap_or_default().to_string();
            let size = ctx.params["size"].clone();
            Ok(Outcome::to("waiting").raise_with_reply("child", child, "start", json!({"size": size}), "child_done"))
        })
        .start()
        .await
        .unwrap()
}

/// Creates `child` (unless there) and parent `p`, raises go on the parent, and answers the
/// child's task with `report` (when it offers one).
async fn ask<S: Store + Clone>(engine: &Engine<S>, p: &str, child: &str, report: Option<TaskResult>) {
    if engine.get("child", child).await.unwrap().is_none() {
        engine.create("child", child, Properties::new()).await.unwrap();
    }
    engine.create("parent", p, Properties::new()).await.unwrap();
    let go = RaiseOptions::wait(Wait::Outcome).params(json!({"child": child, "size": 3}));
    engine.raise("parent", p, "go", go).await.unwrap();
    // The parent waits for the reply in `waiting` (unless it came at once).
    let parent = engine.wait_for_state("parent", p, &["waiting", "told"], Duration::from_secs(10)).await.unwrap();
    if report.is_some() {
        assert_eq!(parent.state, "waiting", "until the child's work ends");
    }
    if let Some(report) = report {
        let tasks = engine.agent_lease("q", "agent", 1, Duration::from_secs(10)).await.unwrap();
        let task = &tasks[0];
        assert_eq!((task.event.as_deref(), &task.params), (Some("start"), &json!({"size": 3})));
        engine.agent_report(task.id, task.token.as_deref().unwrap(), report).await.unwrap();
    }
    engine.wait_idle().await.unwrap();
}

/// The parent's state and what its reply recorded.
async fn told<S: Store + Clone>(engine: &Engine<S>, p: &str) -> (String, Value) {
    let p = engine.get("parent", p).await.unwrap().unwrap();
    let mut props = p.properties.clone();
    props.retain(|k, _| ["child", "outcome", "child_state", "reason"].contains(&k.as_str()));
    (p.state.to_string(), Value::Object(props))
}

async fn every_end_of_the_childs_workflow_replies<S: Store + Clone>(store: S) {
    let engine = engine(store).await;
    let done = ActionOutcome { target: Some(StateName::new("done")), ..ActionOutcome::default() };

    // At rest after the event: accepted, in the state it came to.
    ask(&engine, "p1", "c1", Some(TaskResult::Complete(done.clone()))).await;
    let want = json!({"child": "c1", "outcome": "accepted", "child_state": "done"});
    assert_eq!(told(&engine, "p1").await, ("told".into(), want));

    // Rejected at once (c1 is done): the reason comes back.
    ask(&engine, "p2", "c1", None).await;
    let (state, props) = told(&engine, "p2").await;
    assert_eq!(
        (state.as_str(), &props["outcome"], &props["child_state"]),
        ("told", &json!("rejected"), &json!("done"))
    );
    assert!(props["reason"].as_str().is_some_and(|r| r.contains("start")), "{props}");

    // The child's work failed and parked it: failed, with the error.
    let fail = TaskResult::Fail { error: "quota exceeded".into(), retryable: false };
    ask(&engine, "p3", "c2", Some(fail)).await;
    let (state, props) = told(&engine, "p3").await;
    assert_eq!(
        (state.as_str(), &props["outcome"], &props["child_state"]),
        ("told", &json!("failed"), &json!("working"))
    );
    assert!(props["reason"].as_str().is_some_and(|r| r.contains("quota exceeded")), "{props}");

    // The reply is an event of its own in the parent's history, of the same request.
    let h = engine.history("parent", "p3").await.unwrap();
    let reply = h.iter().find(|r| r.event.as_deref() == Some("child_done")).expect("the reply in the history");
    let go = h.iter().find(|r| r.event.as_deref() == Some("go")).expect("go");
    assert_eq!((reply.kind, &reply.request_id), (HistoryKind::Event, &go.request_id));
    engine.shutdown().await;
}

#[tokio::test]
async fn every_end_of_the_childs_workflow_replies_on_sqlite() {
    let (_dir, store) = common::sqlite();
    every_end_of_the_childs_workflow_replies(store).await;
}

#[tokio::test]
async fn every_end_of_the_childs_workflow_replies_on_postgres() {
    let Some(url) = settle_store::postgres::test_url("replies") else { return };
    let store = tokio::task::spawn_blocking(move || PgStore::open(&url)).await.unwrap().expect("open PostgreSQL");
    every_end_of_the_childs_workflow_replies(store).await;
}

/// A reply names an event of the raiser's own machine: a handler asking for another is
/// refused (a fault), nothing raised.
#[tokio::test]
async fn a_reply_the_raisers_machine_does_not_declare_is_refused() {
    let (_dir, store) = common::sqlite();
    let engine = Engine::builder(store)
        .machine(parent())
        .machine(child())
        .clock(common::clock())
        .on("parent", "ask", |_| async move {
            Ok(Outcome::to("waiting").raise_with_reply("child", "c9", "start", json!({"size": 1}), "nonsense"))
        })
        .start()
        .await
        .unwrap();
    engine.create("child", "c9", Properties::new()).await.unwrap();
    engine.create("parent", "p", Properties::new()).await.unwrap();
    let go = RaiseOptions::wait(Wait::Outcome).params(json!({"child": "c9", "size": 1}));
    engine.raise("parent", "p", "go", go).await.unwrap();
    engine.wait_idle().await.unwrap();
    let h = engine.history("parent", "p").await.unwrap();
    let fault = h.iter().find(|r| r.kind == HistoryKind::Fault).expect("a fault");
    let detail = fault.detail.as_deref().unwrap_or_default();
    assert!(detail.contains("raise[0].reply") && detail.contains("nonsense"), "{detail}");
    assert_eq!(engine.get("child", "c9").await.unwrap().unwrap().state, "new", "nothing raised");
    engine.shutdown().await;
}

/// An agent's report asks for a reply as a handler does; one that names no event of the
/// reporter's machine is refused, naming the field, and changes nothing.
#[tokio::test]
async fn an_agents_report_asks_for_a_reply_and_a_bad_one_is_refused() {
    let (_dir, store) = common::sqlite();
    let caller = load(
        "caller",
        r#"
name = "caller"
initial = "asking"
[states.asking]
auto = "ask"
[states.waiting]
[states.told]
[events.child_done]
in = ["waiting"]
action = "record"
params = ["outcome"]
[actions.ask]
to = ["waiting"]
agent = "callers"
may_raise = ["start"]
[actions.record]
to = ["told"]
set = { outcome = "params.outcome" }
"#,
    );
    let engine = Engine::builder(store).machine(caller).machine(child()).clock(common::clock()).start().await.unwrap();
    engine.create("child", "c", Properties::new()).await.unwrap();
    engine.create("caller", "k", Properties::new()).await.unwrap();
    let tasks = engine.agent_lease("callers", "agent", 1, Duration::from_secs(10)).await.unwrap();
    let task = &tasks[0];
    let ask = |reply: &str| {
        TaskResult::Complete(ActionOutcome {
            target: Some(StateName::new("waiting")),
            raises: vec![settle_core::step::Raise {
                machine: "child".into(),
                key: "c".into(),
                event: "start".into(),
                params: json!({"size": 2}),
                join: false,
                reply: Some(reply.into()),
            }],
            ..ActionOutcome::default()
        })
    };
    let token = task.token.as_deref().unwrap();
    match engine.agent_report(task.id, token, ask("nonsense")).await {
        Err(settle_engine::Error::Task(settle_store::TaskRefusal::BadReport { field, reason, .. })) => {
            assert_eq!(field, "raise[0].reply");
            assert!(reason.contains("nonsense") && reason.contains("caller"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(engine.get("child", "c").await.unwrap().unwrap().state, "new", "nothing raised");
    engine.agent_report(task.id, token, ask("child_done")).await.unwrap();
    let child_task = engine.agent_lease("q", "agent", 1, Duration::from_secs(10)).await.unwrap();
    let done = ActionOutcome { target: Some(StateName::new("done")), ..ActionOutcome::default() };
    let t = &child_task[0];
    engine.agent_report(t.id, t.token.as_deref().unwrap(), TaskResult::Complete(done)).await.unwrap();
    engine.wait_idle().await.unwrap();
    let k = engine.get("caller", "k").await.unwrap().unwrap();
    assert_eq!((k.state.as_str(), &k.properties["outcome"]), ("told", &json!("accepted")));
    engine.shutdown().await;
}
