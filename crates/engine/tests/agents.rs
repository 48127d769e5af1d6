//! External agents (DESIGN §5): entering a state whose auto action is bound to an agent
//! queue offers a task in the same commit; agents lease it, heartbeat, and report; the
//! report is the action's outcome. Late or superseded reports are refused and change
//! nothing; failures feed the fault policy. Locks and backoffs run on a manual clock.

mod common;

use std::time::Duration;

use serde_json::json;
use settle_core::fault::FaultPolicy;
use settle_core::{Machine, MachineBuilder, Properties};
use settle_engine::{Command, Engine, Error, ManualClock, RaiseOptions, RunStatus, Wait};
use settle_store::{AgentTask, HistoryKind, SqliteStore, Store, TaskFilter, TaskRefusal, TaskResult};

const LOCK: Duration = Duration::from_millis(300);

fn provisioned() -> Machine {
    MachineBuilder::new("vm")
        .state("new")
        .initial()
        .state("provisioning")
        .auto("provision")
        .state("ready")
        .requires(["ip"])
        .state("broken")
        .event("create", ["new"], "begin")
        .action("begin", ["provisioning"])
        .action("provision", ["ready", "broken", "provisioning"])
        .agent("cloud", LOCK)
        .fault_policy(FaultPolicy {
            max_errors: 3,
            window: Duration::from_secs(3600),
            backoff_min: Duration::from_millis(10),
            backoff_max: Duration::from_millis(20),
        })
        .build()
        .unwrap()
}

async fn engine(dir: &tempfile::TempDir, clock: &ManualClock) -> Engine<SqliteStore> {
    let store = SqliteStore::open(dir.path().join("agents.db")).unwrap();
    Engine::builder(store).machine(provisioned()).clock(clock.clone()).start().await.unwrap()
}

async fn lease_one(engine: &Engine<SqliteStore>) -> AgentTask {
    let mut tasks = engine.agent_lease("cloud", "test-agent", 1, Duration::from_secs(10)).await.unwrap();
    assert_eq!(tasks.len(), 1, "a task is offered");
    tasks.remove(0)
}

fn complete(target: &str, properties: serde_json::Value) -> TaskResult {
    let properties: Properties = properties.as_object().unwrap().clone().into_iter().collect();
    TaskResult::complete(target, properties)
}

async fn create_and_start(engine: &Engine<SqliteStore>, key: &str) {
    engine.create("vm", key, Properties::new()).await.unwrap();
    let raised = engine.raise("vm", key, "create", RaiseOptions::wait(Wait::Outcome)).await.unwrap();
    assert_eq!(raised.entity.unwrap().state, "provisioning");
}

#[tokio::test]
async fn an_agent_completes_the_action_and_the_operation_succeeds() {
    let dir = tempfile::tempdir().unwrap();
    let clock = common::clock();
    let engine = engine(&dir, &clock).await;
    assert_eq!(engine.agent_queues(), ["cloud"]);
    engine.create("vm", "a", Properties::from_iter([("size".to_string(), json!("small"))])).await.unwrap();
    let raised = engine.raise("vm", "a", "create", RaiseOptions::wait(Wait::Outcome)).await.unwrap();
    let e = raised.entity.unwrap();
    // The commit that entered `provisioning` offered the task: it is there, ready.
    let open = engine.store().task_list(TaskFilter { entity_id: Some(e.id), ..TaskFilter::default() }).await.unwrap();
    assert_eq!(open.len(), 1);
    assert_eq!((open[0].status.as_str(), open[0].entity_version), ("ready", e.version));

    let task = lease_one(&engine).await;
    assert_eq!((task.key.as_str(), task.action.as_str(), task.attempt, task.retry), ("a", "provision", 1, 0));
    assert_eq!(task.properties.get("size"), Some(&json!("small")));
    assert_eq!(task.request_id.as_deref(), Some(raised.request_id.as_str()));
    let token = task.token.clone().unwrap();
    engine.wait_caught_up().await.unwrap();
    let open = TaskFilter { open_only: true, ..TaskFilter::default() };
    assert_eq!(engine.store().task_list(open).await.unwrap().len(), 1, "the leased task is open work: not idle");
    let until = engine.agent_heartbeat(task.id, &token).await.unwrap();
    assert!(until >= task.locked_until.unwrap());
    engine.agent_report(task.id, &token, complete("ready", json!({"ip": "10.0.0.7"}))).await.unwrap();

    let e = engine.wait_for_state("vm", "a", &["ready"], Duration::from_secs(10)).await.unwrap();
    assert_eq!(e.properties.get("ip"), Some(&json!("10.0.0.7")));
    let h = engine.history("vm", "a").await.unwrap();
    let last = h.last().unwrap();
    assert_eq!(
        (last.kind, last.action.as_deref(), last.to.as_deref()),
        (HistoryKind::Auto, Some("provision"), Some("ready"))
    );
    engine.wait_idle().await.unwrap();
    let op = engine.operation(&raised.request_id).await.unwrap().unwrap();
    assert_eq!(op.outcome.as_deref(), Some("success"), "{op:?}");
    // A server about to stop ends the agents' long polls at once.
    let (poller, closer) = (engine.clone(), engine.clone());
    let poll = tokio::spawn(async move { poller.agent_lease("cloud", "late", 1, Duration::from_secs(60)).await });
    // Whether the poll is waiting already or not: closed, it answers at once.
    closer.close_long_polls();
    let closed = tokio::time::timeout(Duration::from_secs(10), poll).await.expect("the poll ended").unwrap();
    assert!(closed.unwrap().is_empty());
    // The same report again (its answer was lost, say): a replay, which changes nothing.
    let again = engine.agent_report(task.id, &token, complete("ready", json!({}))).await;
    assert!(matches!(again, Ok(settle_engine::Report::Replayed)), "{again:?}");
    engine.shutdown().await;
}

#[tokio::test]
async fn a_late_report_is_refused_and_the_task_is_offered_again() {
    let dir = tempfile::tempdir().unwrap();
    let clock = common::clock();
    let engine = engine(&dir, &clock).await;
    create_and_start(&engine, "late").await;
    let first = lease_one(&engine).await;
    // The agent "dies": its lock runs out.
    clock.advance(LOCK + Duration::from_millis(1));
    let late =
        engine.agent_report(first.id, first.token.as_deref().unwrap(), complete("ready", json!({"ip": "x"}))).await;
    assert!(
        matches!(late, Err(Error::Task(TaskRefusal::Refused { ref reason, .. })) if reason.starts_with("lease expired")),
        "{late:?}"
    );
    let e = engine.get("vm", "late").await.unwrap().unwrap();
    assert_eq!((e.state.as_str(), e.properties.get("ip")), ("provisioning", None), "the late report changed nothing");

    let second = lease_one(&engine).await;
    assert_eq!((second.id, second.attempt), (first.id, 2), "the same task, offered again");
    let superseded = engine.agent_heartbeat(first.id, first.token.as_deref().unwrap()).await;
    assert!(
        matches!(superseded, Err(Error::Task(TaskRefusal::Refused { ref reason, .. })) if reason.starts_with("lease token superseded"))
    );
    engine
        .agent_report(second.id, second.token.as_deref().unwrap(), complete("ready", json!({"ip": "10.0.0.8"})))
        .await
        .unwrap();
    let e = engine.wait_for_state("vm", "late", &["ready"], Duration::from_secs(10)).await.unwrap();
    assert_eq!(e.properties.get("ip"), Some(&json!("10.0.0.8")));
    engine.shutdown().await;
}

#[tokio::test]
async fn failures_feed_the_fault_policy_and_a_parked_entity_offers_again_on_resume() {
    let dir = tempfile::tempdir().unwrap();
    let clock = common::clock();
    let engine = engine(&dir, &clock).await;
    create_and_start(&engine, "f").await;
    let t1 = lease_one(&engine).await;
    let fail = |retryable| TaskResult::Fail { error: "quota exceeded".into(), retryable };
    engine.agent_report(t1.id, t1.token.as_deref().unwrap(), fail(true)).await.unwrap();
    // Backoff, then the next attempt: a new task for the re-entered state, with the count.
    engine.wait_caught_up().await.unwrap();
    assert!(engine.agent_lease("cloud", "a", 1, Duration::ZERO).await.unwrap().is_empty(), "backing off");
    clock.advance(Duration::from_millis(10));
    let t2 = lease_one(&engine).await;
    assert_ne!(t2.id, t1.id);
    assert_eq!((t2.retry, t2.errors, t2.attempt), (1, 1, 1));
    // A failure that retrying cannot fix parks the entity at once.
    engine.agent_report(t2.id, t2.token.as_deref().unwrap(), fail(false)).await.unwrap();
    engine.wait_caught_up().await.unwrap();
    let parked = engine.get("vm", "f").await.unwrap().unwrap();
    assert_eq!((parked.state.as_str(), parked.run_status), ("provisioning", RunStatus::Failed), "parked");
    let errors = engine.store().history_list(parked.id).await.unwrap();
    let faults: Vec<_> = errors.iter().filter(|h| h.kind == HistoryKind::Fault).collect();
    assert_eq!(faults.len(), 2);
    assert!(faults[1].detail.as_deref().unwrap().contains("quota exceeded"), "{faults:?}");
    assert!(engine.agent_lease("cloud", "a", 1, Duration::ZERO).await.unwrap().is_empty(), "parked: nothing offered");

    engine.command("vm", "f", Command::Resume, None).await.unwrap();
    let t3 = lease_one(&engine).await;
    assert_eq!(t3.errors, 0, "resume clears the error count");
    engine
        .agent_report(t3.id, t3.token.as_deref().unwrap(), complete("ready", json!({"ip": "10.0.0.9"})))
        .await
        .unwrap();
    engine.wait_for_state("vm", "f", &["ready"], Duration::from_secs(10)).await.unwrap();
    engine.shutdown().await;
}

#[tokio::test]
async fn bad_reports_and_killed_entities_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let clock = common::clock();
    let engine = engine(&dir, &clock).await;
    create_and_start(&engine, "k").await;
    let t = lease_one(&engine).await;
    let token = t.token.clone().unwrap();
    let undeclared = engine.agent_report(t.id, &token, complete("new", json!({}))).await;
    assert!(
        matches!(undeclared, Err(Error::Task(TaskRefusal::BadReport { ref reason, .. })) if reason.contains("may not move to `new`")),
        "{undeclared:?}"
    );
    let unknown = engine.agent_report(9_999, "nope", complete("ready", json!({}))).await;
    assert!(matches!(unknown, Err(Error::Task(TaskRefusal::Unknown { task: 9_999 }))), "{unknown:?}");
    let other_queue = engine.agent_report_as(t.id, &token, complete("ready", json!({})), Some(vec!["db".into()])).await;
    assert!(
        matches!(other_queue, Err(Error::Task(TaskRefusal::QueueForbidden { ref queue, .. })) if queue == "cloud"),
        "{other_queue:?}"
    );
    let beat = engine.agent_heartbeat_as(t.id, &token, Some(vec!["db".into()])).await;
    assert!(matches!(beat, Err(Error::Task(TaskRefusal::QueueForbidden { .. }))), "{beat:?}");
    engine.command("vm", "k", Command::Kill, None).await.unwrap();
    let after_kill = engine.agent_report(t.id, &token, complete("ready", json!({"ip": "1"}))).await;
    assert!(
        matches!(after_kill, Err(Error::Task(TaskRefusal::Refused { ref reason, .. })) if reason.starts_with("canceled")),
        "{after_kill:?}"
    );
    let e = engine.get("vm", "k").await.unwrap().unwrap();
    assert_eq!((e.state.as_str(), e.run_status), ("provisioning", RunStatus::Killed));
    engine.shutdown().await;
}

#[tokio::test]
async fn a_report_that_breaks_an_invariant_is_a_fault_and_the_task_is_offered_again() {
    let dir = tempfile::tempdir().unwrap();
    let clock = common::clock();
    let engine = engine(&dir, &clock).await;
    create_and_start(&engine, "inv").await;
    let t = lease_one(&engine).await;
    // `ready` requires `ip`: the outcome is refused at commit, counted as an error.
    engine.agent_report(t.id, t.token.as_deref().unwrap(), complete("ready", json!({}))).await.unwrap();
    engine.wait_caught_up().await.unwrap();
    clock.advance(Duration::from_millis(10)); // the backoff
    let again = lease_one(&engine).await;
    assert_eq!((again.retry, again.errors), (1, 1));
    let e = engine.get("vm", "inv").await.unwrap().unwrap();
    assert_eq!(e.state, "provisioning");
    engine.shutdown().await;
}
