//! Agent tasks (DESIGN §5): offers, leases, heartbeats, reports and their refusals,
//! cancellation on state entry and kill, and renamed states.

use settle_core::{ActionName, ActionOutcome, Properties};

use super::{T0, command, commit, get, new_entity, push, write};
use crate::{
    AfterCommit, AgentReport, AgentTask, Applied, Command, EventRecord, InboxKind, Millis, Op, OpError, Push,
    RunStatus, Store, TaskCheck, TaskFilter, TaskOffer, TaskRefusal, TaskResult,
};

/// An outcome with every part an agent may report.
fn whole_outcome() -> ActionOutcome {
    use settle_core::step::{Create, InternalEvent, PropChange, Raise};
    use settle_core::{Broadcast, Related, StateName};
    ActionOutcome {
        target: Some(StateName::new("done")),
        delay: Some(std::time::Duration::from_millis(1_234)),
        changes: vec![
            PropChange::Set("ip".into(), serde_json::json!("10.0.0.7")),
            PropChange::Remove("old".into()),
            PropChange::Set("cleared".into(), serde_json::Value::Null),
        ],
        creates: vec![Create {
            machine: "app".into(),
            key: "a-app".into(),
            properties: serde_json::json!({"size": 2, "tags": ["x"]}).as_object().cloned().unwrap(),
        }],
        raises: vec![Raise {
            machine: "app".into(),
            key: "a-app".into(),
            event: "start".into(),
            params: serde_json::json!({"n": 1.5, "s": "é"}),
            join: true,
            reply: None,
        }],
        related: vec![Broadcast {
            event: "child_ready".into(),
            on: Related::Predecessors,
            params: serde_json::Value::Null,
        }],
        internal: vec![InternalEvent { event: "recheck".into(), params: serde_json::json!({"depth": 2}) }],
        error: Some("quota exceeded".into()),
    }
}

fn offer(available_at: Millis) -> TaskOffer {
    TaskOffer { queue: "q".into(), action: ActionName::new("work"), lock_ms: 1_000, available_at }
}

async fn lease<S: Store>(store: &S, now: Millis, prefix: &str) -> Vec<AgentTask> {
    let op = Op::TaskLease { queue: "q".into(), agent: "agent-1".into(), limit: 10, token_prefix: prefix.into() };
    match write(store, now, vec![op], false).await.results.remove(0) {
        Ok(Applied::Leased(tasks)) => tasks,
        other => panic!("lease failed: {other:?}"),
    }
}

async fn task_op<S: Store>(store: &S, now: Millis, op: Op) -> Result<Applied, OpError> {
    write(store, now, vec![op], false).await.results.remove(0)
}

fn refused(r: Result<Applied, OpError>, task: i64, starts: &str) {
    match r {
        Err(OpError::Task(TaskRefusal::Refused { task: t, reason })) if t == task && reason.starts_with(starts) => {}
        other => panic!("expected task {task} refused with `{starts}…`, got {other:?}"),
    }
}

/// Agent tasks (DESIGN §5): an entity created waiting for an agent offers one task, leased
/// only once available and only by one agent at a time; heartbeats extend the lease; a
/// report with an expired or superseded token, or a second report, is refused and changes
/// nothing; an expired lease is offered again (attempt + 1); an accepted report lands in
/// the entity's inbox; entering a state cancels open tasks; paused entities' tasks are not
/// leased; kill cancels them. A task, and a claim of its entity mid-workflow, name the
/// event whose workflow entered the state, with its parameters and the reply it owes; a
/// reply to an entity that is not there is dropped.
pub async fn agent_tasks_lease_and_report<S: Store>(store: S) {
    let mut new = new_entity("a", "working", None);
    new.offer = Some(offer(T0 + 100));
    let r = write(&store, T0, vec![Op::Create(new)], false).await;
    let Ok(Applied::Created(e)) = &r.results[0] else { panic!("{:?}", r.results[0]) };
    assert_eq!((e.auto_at, e.due_at), (None, None), "the task, not the entity, carries the time");
    let open = store.task_list(TaskFilter { open_only: true, ..TaskFilter::default() }).await.unwrap();
    assert_eq!(open.len(), 1);
    assert_eq!((open[0].status.as_str(), open[0].entity_version, open[0].attempt), ("ready", 1, 0));
    assert!(lease(&store, T0 + 99, "x").await.is_empty(), "not before it is available");

    let leased = lease(&store, T0 + 100, "tok-").await;
    assert_eq!(leased.len(), 1);
    let t = &leased[0];
    assert_eq!((t.key.as_str(), t.state.as_str(), t.action.as_str(), t.attempt), ("a", "working", "work", 1));
    assert_eq!(t.token, Some(format!("tok-{}", t.id)));
    assert_eq!(t.locked_until, Some(T0 + 1_100));
    assert!(lease(&store, T0 + 200, "y").await.is_empty(), "a leased task is not leased twice");
    let token = t.token.clone().unwrap();

    let hb = |token: &str| Op::TaskHeartbeat { task: t.id, token: token.into(), check: TaskCheck::default() };
    refused(task_op(&store, T0 + 300, hb("forged")).await, t.id, "lease token superseded");
    assert_eq!(task_op(&store, T0 + 500, hb(&token)).await, Ok(Applied::Extended { locked_until: T0 + 1_500 }));

    // The lease runs out: the report is refused, the task is offered again. (The report is
    // a whole outcome: it reaches the inbox exactly as sent, every part in order.)
    let done = TaskResult::Complete(whole_outcome());
    let report = |token: &str| Op::TaskReport {
        task: t.id,
        token: token.into(),
        result: done.clone(),
        check: TaskCheck::default(),
    };
    refused(task_op(&store, T0 + 1_500, report(&token)).await, t.id, "lease expired");
    assert!(store.inbox_list(e.id).await.unwrap().is_empty(), "a refused report changes nothing");
    let again = lease(&store, T0 + 1_600, "second-").await;
    assert_eq!((again.len(), again[0].attempt), (1, 2));
    refused(task_op(&store, T0 + 1_700, report(&token)).await, t.id, "lease token superseded");
    let token2 = again[0].token.clone().unwrap();
    let Ok(Applied::Pushed { entity_id, .. }) = task_op(&store, T0 + 1_800, report(&token2)).await else {
        panic!("the report with the live token is accepted")
    };
    assert_eq!(entity_id, e.id);
    // The same token again: a replay, answered as such; another token: refused. Neither
    // changes anything (one report in the inbox).
    assert_eq!(
        task_op(&store, T0 + 1_900, report(&token2)).await,
        Ok(Applied::ReportReplayed { task: t.id }),
        "a report again with its token is a replay"
    );
    refused(task_op(&store, T0 + 1_900, report(&token)).await, t.id, "already reported");
    refused(task_op(&store, T0 + 1_900, hb(&token2)).await, t.id, "already reported");
    let inbox = store.inbox_list(e.id).await.unwrap();
    assert_eq!(inbox.len(), 1);
    assert_eq!((inbox[0].kind, inbox[0].event.as_str()), (InboxKind::Agent, InboxKind::AGENT_EVENT));
    let got = AgentReport::from_json(&inbox[0].params).expect("a report");
    assert_eq!((got.task, got.entity_version, got.attempt, got.result), (t.id, 1, 2, done.clone()));
    assert_eq!(get(&store, "a").await.due_at, Some(T0 + 1_800), "the report makes the entity due");

    // A commit re-entering the state offers a new task for the new entry; entering another
    // state cancels it.
    let claimed = write(&store, T0 + 2_000, vec![], true).await.claimed.remove(0);
    let mut cm = commit(&claimed.entity, Some("working"), Some(inbox[0].id), AfterCommit::Release);
    cm.offer = Some(offer(T0 + 2_000));
    cm.retry = 1;
    assert!(task_op(&store, T0 + 2_000, Op::Commit(Box::new(cm))).await.is_ok());
    let next = lease(&store, T0 + 2_001, "third-").await;
    assert_eq!((next.len(), next[0].entity_version, next[0].retry, next[0].attempt), (1, 2, 1, 1));
    let by_id = store.task_list(TaskFilter { id: Some(next[0].id), ..TaskFilter::default() }).await.unwrap();
    assert_eq!(by_id, next);
    let e2 = get(&store, "a").await;
    assert_eq!(e2.auto_at, None);
    let r = write(&store, T0 + 2_002, vec![Op::Push(push("a", "stop"))], true).await;
    let c = r.claimed[0].clone();
    let cm = commit(&c.entity, Some("idle"), Some(c.inbox_head.unwrap().id), AfterCommit::Release);
    assert!(task_op(&store, T0 + 2_003, Op::Commit(Box::new(cm))).await.is_ok());
    let (task3, token3) = (next[0].id, next[0].token.clone().unwrap());
    let report3 = Op::TaskReport { task: task3, token: token3, result: done.clone(), check: TaskCheck::default() };
    refused(task_op(&store, T0 + 2_004, report3).await, task3, "canceled");
    assert!(store.task_list(TaskFilter { open_only: true, ..TaskFilter::default() }).await.unwrap().is_empty());

    // A definition upgrade that renames the state keeps the open task, for the new version.
    let mut c = new_entity("c", "working", None);
    c.offer = Some(offer(T0));
    write(&store, T0, vec![Op::Create(c)], false).await;
    assert_eq!(
        super::move_to(
            &store,
            "m",
            vec![crate::StateMove { version: String::new(), from: "working".into(), to: "toiling".into() }],
            "h2",
            T0 + 2_005
        )
        .await,
        1
    );
    let moved = lease(&store, T0 + 2_006, "mig-").await;
    assert_eq!((moved.len(), moved[0].state.as_str(), moved[0].entity_version), (1, "toiling", 2));
    let report = Op::TaskReport {
        task: moved[0].id,
        token: moved[0].token.clone().unwrap(),
        result: done.clone(),
        check: TaskCheck::default(),
    };
    assert!(task_op(&store, T0 + 2_007, report).await.is_ok());

    // Paused entities' tasks wait; kill cancels them.
    let mut b = new_entity("b", "working", None);
    b.offer = Some(offer(T0));
    write(&store, T0, vec![Op::Create(b)], false).await;
    let cmd = |c| command("b", c);
    write(&store, T0 + 3_000, vec![cmd(Command::Pause)], false).await;
    assert!(lease(&store, T0 + 3_001, "p-").await.is_empty(), "a paused entity's task is not leased");
    let m = store.metrics_snapshot(T0 + 3_001).await.unwrap();
    assert_eq!(m.tasks, vec![("q".to_string(), "ready".to_string(), 1)], "open tasks per queue and status");
    write(&store, T0 + 3_002, vec![cmd(Command::Resume)], false).await;
    assert!(get(&store, "b").await.run_status == RunStatus::Active);
    write(&store, T0 + 3_003, vec![cmd(Command::Kill)], false).await;
    assert!(lease(&store, T0 + 3_004, "k-").await.is_empty(), "kill cancels the task");
    let all = store.task_list(TaskFilter { queue: Some("q".into()), ..TaskFilter::default() }).await.unwrap();
    assert_eq!(all.len(), 4);
    assert!(all.iter().all(|t| t.status != "ready" && t.status != "leased"), "{all:?}");
    assert_eq!((&all[0].event, &all[0].params), (&None, &serde_json::Value::Null), "created waiting: no event");

    // A task names the event whose workflow entered its state, with its parameters (stored
    // with the event): the event processed by the commit that offers it.
    write(&store, T0, vec![Op::Create(new_entity("d", "idle", None))], false).await;
    let mut go = push("d", "go");
    go.params = serde_json::json!({"size": 3});
    let reply = crate::Reply { machine: "m".into(), key: "asker".into(), event: "answer".into() };
    go.reply = Some(reply.clone());
    let claimed = write(&store, T0 + 4_000, vec![Op::Push(go)], true).await.claimed;
    let claimed = claimed.into_iter().find(|c| c.entity.key == "d").expect("claimed");
    let item = claimed.inbox_head.expect("the event");
    assert_eq!(item.reply.as_ref(), Some(&reply), "the inbox keeps the reply asked for");
    let mut cm = commit(&claimed.entity, Some("working"), Some(item.id), AfterCommit::Release);
    cm.offer = Some(offer(T0 + 4_000));
    cm.telemetry.event = Some(EventRecord::of(&item, false, false));
    assert!(task_op(&store, T0 + 4_000, Op::Commit(Box::new(cm))).await.is_ok());
    let t = lease(&store, T0 + 4_001, "d-").await;
    assert_eq!((t.len(), t[0].key.as_str()), (1, "d"));
    assert_eq!((t[0].event.as_deref(), &t[0].params), (Some("go"), &serde_json::json!({"size": 3})));
    // A claim of the entity mid-workflow names the same event, for its auto actions; at
    // rest, none.
    let claimed = write(&store, T0 + 4_002, vec![Op::Push(push("d", "poke"))], true).await.claimed;
    let claimed = claimed.into_iter().find(|c| c.entity.key == "d").expect("claimed");
    let trigger = claimed.trigger.expect("the workflow's event");
    assert_eq!((trigger.event.as_str(), &trigger.params), ("go", &serde_json::json!({"size": 3})));
    assert_eq!(trigger.reply.as_ref(), Some(&reply), "the reply its workflow's end owes");
    let mut rest = commit(&claimed.entity, Some("idle"), claimed.inbox_head.map(|i| i.id), AfterCommit::Release);
    rest.telemetry.at_rest = true;
    // The reply to an entity that is not there is dropped; the commit lands.
    rest.pushes.push(Push { kind: InboxKind::Reply, ..push("asker", "answer") });
    assert!(task_op(&store, T0 + 4_003, Op::Commit(Box::new(rest))).await.is_ok());
    let claimed = write(&store, T0 + 4_004, vec![Op::Push(push("d", "poke"))], true).await.claimed;
    let claimed = claimed.into_iter().find(|c| c.entity.key == "d").expect("claimed");
    assert_eq!(claimed.trigger, None, "at rest, no workflow");
}

/// A report is applied with the operations around it, in batch order, in one transaction:
/// the task row records the outcome and the agent's error; the report lands in the
/// entity's inbox beside an event pushed in the same batch; a second report with the same
/// token in that batch is a replay; a commit before it in the batch that leaves the state
/// cancels the task (the report is refused), one after it does not undo it. A report on a
/// task of a queue the caller does not serve, to a target its action does not declare, or
/// on no task at all, is refused and changes nothing.
pub async fn agent_reports_join_the_batch_around_them<S: Store>(store: S) {
    for key in ["x", "y", "z"] {
        let mut n = new_entity(key, "working", None);
        n.offer = Some(offer(T0));
        write(&store, T0, vec![Op::Create(n)], false).await;
    }
    let tasks = lease(&store, T0 + 1, "t-").await;
    assert_eq!(tasks.len(), 3);
    let task = |key: &str| tasks.iter().find(|t| t.key.as_str() == key).expect("leased").clone();
    let (x, y, z) = (task("x"), task("y"), task("z"));
    let fail = TaskResult::Fail { error: "quota".into(), retryable: false };
    let report = |t: &AgentTask, result: &TaskResult, check: TaskCheck| Op::TaskReport {
        task: t.id,
        token: t.token.clone().unwrap(),
        result: result.clone(),
        check,
    };
    let any = TaskCheck::default;

    // Refusals first: nothing changes.
    let work = settle_core::MachineBuilder::new("m")
        .state("working")
        .initial()
        .auto("work")
        .state("done")
        .action("work", ["done"])
        .agent("q", std::time::Duration::from_secs(1))
        .build()
        .unwrap();
    let mut actions = std::collections::BTreeMap::new();
    actions.insert(("m".to_string(), "work".to_string()), work.action("work").unwrap().clone());
    let declared = TaskCheck { queues: None, actions: std::sync::Arc::new(actions), ..TaskCheck::default() };
    let wrong = TaskResult::complete("elsewhere", Properties::new());
    let r = write(
        &store,
        T0 + 2,
        vec![
            report(&x, &wrong, declared.clone()),
            report(&x, &fail, TaskCheck { queues: Some(vec!["other".into()]), ..any() }),
            Op::TaskReport { task: 999_999, token: "t".into(), result: fail.clone(), check: any() },
            Op::TaskHeartbeat {
                task: x.id,
                token: x.token.clone().unwrap(),
                check: TaskCheck { queues: Some(vec![]), ..any() },
            },
        ],
        false,
    )
    .await;
    assert!(
        matches!(&r.results[0], Err(OpError::Task(TaskRefusal::BadReport { reason, .. })) if reason.contains("may not move to `elsewhere`")),
        "{:?}",
        r.results[0]
    );
    assert_eq!(r.results[1], Err(OpError::Task(TaskRefusal::QueueForbidden { task: x.id, queue: "q".into() })));
    assert_eq!(r.results[2], Err(OpError::Task(TaskRefusal::Unknown { task: 999_999 })));
    assert_eq!(r.results[3], Err(OpError::Task(TaskRefusal::QueueForbidden { task: x.id, queue: "q".into() })));
    let open = store.task_list(TaskFilter { open_only: true, ..TaskFilter::default() }).await.unwrap();
    assert_eq!(open.len(), 3, "refusals change nothing");

    // One batch: a push and a report to x, the same report again, a heartbeat on y.
    let done = TaskResult::complete("done", Properties::new());
    let r = write(
        &store,
        T0 + 3,
        vec![
            Op::Push(push("x", "poke")),
            report(&x, &fail, declared.clone()),
            report(&x, &fail, declared.clone()),
            Op::TaskHeartbeat { task: y.id, token: y.token.clone().unwrap(), check: any() },
            report(&z, &done, declared.clone()),
        ],
        false,
    )
    .await;
    assert!(matches!(r.results[1], Ok(Applied::Pushed { .. })), "{:?}", r.results[1]);
    assert_eq!(r.results[2], Ok(Applied::ReportReplayed { task: x.id }));
    assert_eq!(r.results[3], Ok(Applied::Extended { locked_until: T0 + 3 + 1_000 }));
    assert!(matches!(r.results[4], Ok(Applied::Pushed { .. })), "{:?}", r.results[4]);
    let xe = get(&store, "x").await;
    let inbox = store.inbox_list(xe.id).await.unwrap();
    let kinds: Vec<InboxKind> = inbox.iter().map(|i| i.kind).collect();
    assert_eq!(kinds, [InboxKind::Raised, InboxKind::Agent], "the push, then the report, in batch order");
    assert_eq!(xe.due_at, Some(T0 + 3));
    let row = |id: i64| {
        let store = &store;
        async move { store.task_list(TaskFilter { id: Some(id), ..TaskFilter::default() }).await.unwrap().remove(0) }
    };
    let xt = row(x.id).await;
    assert_eq!(
        (xt.status.as_str(), xt.outcome.as_deref(), xt.error.as_deref()),
        ("done", Some("fail"), Some("quota")),
        "the task records the agent's error"
    );
    let zt = row(z.id).await;
    assert_eq!((zt.status.as_str(), zt.outcome.as_deref(), zt.error.as_deref()), ("done", Some("complete"), None));
    let yt = row(y.id).await;
    assert_eq!((yt.status.as_str(), yt.locked_until, yt.available_at), ("leased", Some(T0 + 1_003), T0 + 1_003));

    // y: a commit leaving its state, then its report, in one batch: the task was canceled.
    let r = write(&store, T0 + 4, vec![Op::Push(push("y", "go"))], true).await;
    let yc = r.claimed.into_iter().find(|c| c.entity.key == "y").expect("y claimed");
    let leave = commit(&yc.entity, Some("idle"), yc.inbox_head.map(|i| i.id), AfterCommit::Release);
    let r = write(&store, T0 + 5, vec![Op::Commit(Box::new(leave)), report(&y, &done, any())], false).await;
    assert!(r.results[0].is_ok(), "{:?}", r.results[0]);
    refused(r.results[1].clone(), y.id, "canceled");
    assert_eq!(row(y.id).await.status, "canceled");
    assert!(store.inbox_list(yc.entity.id).await.unwrap().is_empty());

    // A report, then a commit re-entering the state with a new offer, in one batch: the
    // report stands and the new entry gets a task of its own.
    let again = {
        let mut n = new_entity("v", "working", None);
        n.offer = Some(offer(T0));
        write(&store, T0 + 6, vec![Op::Create(n)], false).await;
        lease(&store, T0 + 7, "v-").await.remove(0)
    };
    let r = write(&store, T0 + 8, vec![Op::Push(push("v", "go"))], true).await;
    let vc = r.claimed.into_iter().find(|c| c.entity.key == "v").expect("v claimed");
    let mut reenter = commit(&vc.entity, Some("working"), vc.inbox_head.map(|i| i.id), AfterCommit::Release);
    reenter.offer = Some(offer(T0 + 9));
    let r = write(&store, T0 + 9, vec![report(&again, &done, any()), Op::Commit(Box::new(reenter))], false).await;
    assert!(r.results.iter().all(|r| r.is_ok()), "{:?}", r.results);
    assert_eq!(row(again.id).await.status, "done", "the report stands");
    let open = store.task_list(TaskFilter { open_only: true, entity_id: Some(vc.entity.id), ..TaskFilter::default() });
    assert_eq!(open.await.unwrap().len(), 1, "the new entry's task");
}
