//! Operator commands (DESIGN §4): what each one sets, that it is recorded and ends its
//! operation when applied, that a replayed request id changes nothing, that a killed entity
//! takes only `kill`, and that a kill drops the entity's queued work and cancels the
//! operations of that work.

use serde_json::json;
use settle_core::{ActionName, EntityKey, EventName, MachineName};

use super::{OWNER, T0, claim_with_event, commit, create_one, get, new_entity, push, write};
use crate::{
    AfterCommit, Applied, Command, HistoryKind, Millis, NewEntity, Op, OpError, OpenOperation, Push, RunStatus, Store,
    TaskFilter, TaskOffer, TimerPlan,
};

fn command_as(key: &str, command: Command, request_id: Option<&str>) -> Op {
    Op::Command {
        machine: MachineName::new("m"),
        key: EntityKey::new(key),
        command,
        operation: request_id.map(|r| OpenOperation {
            request_id: r.into(),
            name: format!("m.{}", command.as_str()),
            dimensions: json!({}),
            priority: 0,
        }),
    }
}

async fn run<S: Store>(store: &S, now: Millis, key: &str, command: Command) -> Result<Applied, OpError> {
    write(store, now, vec![command_as(key, command, None)], false).await.results.remove(0)
}

/// Each command's columns: pause (never due), sleep (due when it wakes), resume, release
/// (free, due now for its queued event), retry (a backing-off entity's auto action now);
/// each is a history row with the command's name and answers the entity as it is after.
/// A command with a request id ends its operation when applied; the same request id again
/// is a replay and changes nothing; an unknown entity is refused and leaves no operation;
/// a killed entity takes no command but `kill`.
pub async fn commands_set_run_status_and_end_their_operation<S: Store>(store: S) {
    let e = create_one(&store, "a").await;
    let r = write(&store, T0 + 1, vec![command_as("a", Command::Pause, Some("op-pause"))], false).await;
    let Ok(Applied::Commanded(paused)) = &r.results[0] else { panic!("{:?}", r.results[0]) };
    assert_eq!((paused.run_status, paused.due_at), (RunStatus::Paused, None));
    assert_eq!(paused, &get(&store, "a").await, "answers the entity as stored");
    let op = store.operation_get("op-pause").await.unwrap().expect("opened");
    assert_eq!(
        (op.first_response_at, op.ended_at, op.outcome.as_deref()),
        (Some(T0 + 1), Some(T0 + 1), Some("success"))
    );
    // Events queue while paused.
    let r = write(&store, T0 + 2, vec![Op::Push(push("a", "go"))], true).await;
    assert!(r.claimed.is_empty(), "a paused entity is not claimed");
    let r = write(&store, T0 + 3, vec![command_as("a", Command::Pause, Some("op-pause"))], false).await;
    assert_eq!(r.results[0], Ok(Applied::Replayed { operation_id: op.id }));

    let Ok(Applied::Commanded(asleep)) = run(&store, T0 + 4, "a", Command::Sleep { until: T0 + 5_000 }).await else {
        panic!("sleep applies")
    };
    assert_eq!(
        (asleep.run_status, asleep.sleep_until, asleep.due_at),
        (RunStatus::Sleeping, Some(T0 + 5_000), Some(T0 + 5_000))
    );
    let Ok(Applied::Commanded(awake)) = run(&store, T0 + 5, "a", Command::Resume).await else {
        panic!("resume applies")
    };
    assert_eq!(
        (awake.run_status, awake.sleep_until, awake.due_at),
        (RunStatus::Active, None, Some(T0 + 5)),
        "its event waits"
    );
    let history = store.history_list(e.id).await.unwrap();
    let commands: Vec<(&str, Option<&str>)> = history
        .iter()
        .filter(|h| h.kind == HistoryKind::Command)
        .map(|h| (h.detail.as_deref().unwrap_or(""), h.request_id.as_deref()))
        .collect();
    assert_eq!(commands, [("pause", Some("op-pause")), ("sleep", None), ("resume", None)], "replays are not recorded");
    assert!(
        history
            .iter()
            .filter(|h| h.kind == HistoryKind::Command)
            .all(|h| h.to.is_none() && h.from.as_deref() == Some("idle"))
    );

    // Release: the lease goes; with its event still queued the entity is due at once.
    let r = write(&store, T0 + 6, vec![], true).await;
    assert_eq!(r.claimed[0].entity.lease_owner.as_deref(), Some(OWNER));
    let Ok(Applied::Commanded(free)) = run(&store, T0 + 7, "a", Command::Release).await else {
        panic!("release applies")
    };
    assert_eq!((free.lease_owner, free.lease_until, free.due_at), (None, None, Some(T0 + 7)));

    // Retry: a backing-off entity's auto action runs now.
    write(&store, T0, vec![Op::Create(new_entity("b", "working", Some(T0 + 100)))], false).await;
    let r = write(&store, T0 + 100, vec![], true).await;
    let b = r.claimed.into_iter().find(|c| c.entity.key == "b").expect("b is due").entity;
    let mut fault = commit(&b, None, None, AfterCommit::Release);
    fault.run_status = Some((RunStatus::Fault, Some(T0 + 60_000)));
    fault.auto_at = Some(T0 + 60_000);
    assert!(write(&store, T0 + 101, vec![Op::Commit(Box::new(fault))], false).await.results[0].is_ok());
    assert_eq!(get(&store, "b").await.due_at, Some(T0 + 60_000), "backing off");
    let Ok(Applied::Commanded(retried)) = run(&store, T0 + 200, "b", Command::Retry).await else {
        panic!("retry applies")
    };
    assert_eq!(
        (retried.run_status, retried.sleep_until, retried.auto_at, retried.due_at),
        (RunStatus::Active, None, Some(T0 + 200), Some(T0 + 200))
    );

    // Refusals change nothing and leave no operation.
    let r = write(&store, T0 + 300, vec![command_as("nope", Command::Pause, Some("op-nope"))], false).await;
    assert_eq!(r.results[0], Err(OpError::NotFound { machine: "m".into(), key: "nope".into() }));
    assert!(store.operation_get("op-nope").await.unwrap().is_none());
    assert!(run(&store, T0 + 301, "b", Command::Kill).await.is_ok());
    for c in [Command::Pause, Command::Resume, Command::Sleep { until: T0 + 1 }, Command::Release, Command::Retry] {
        let r = write(&store, T0 + 302, vec![command_as("b", c, Some("op-late"))], false).await;
        assert_eq!(r.results[0], Err(OpError::Killed { machine: "m".into(), key: "b".into() }), "{}", c.as_str());
    }
    assert!(store.operation_get("op-late").await.unwrap().is_none());
    assert!(run(&store, T0 + 303, "b", Command::Kill).await.is_ok(), "kill again is allowed");
}

/// Kill: the entity never runs again — its version moves (a commit in flight is refused),
/// its queued events, timers and open agent task are dropped, and the operations of the
/// work dropped end as canceled (the one it worked for, those of its queued events);
/// resume after a fault clears its errors; retry offers a waiting agent task now.
pub async fn kill_drops_queued_work_and_cancels_its_operations<S: Store>(store: S) {
    let k = NewEntity {
        request_id: Some("r-create".into()),
        operation: Some(OpenOperation {
            request_id: "r-create".into(),
            name: "m.create".into(),
            dimensions: json!({}),
            priority: 0,
        }),
        timers: vec![TimerPlan {
            name: "tick".into(),
            event: EventName::new("tick"),
            due_at: T0 + 50_000,
            every_ms: None,
            restart: true,
        }],
        offer: Some(TaskOffer { queue: "q".into(), action: ActionName::new("work"), lock_ms: 1_000, available_at: T0 }),
        ..new_entity("k", "working", None)
    };
    assert!(write(&store, T0, vec![Op::Create(k)], false).await.results[0].is_ok());
    let raise = Push {
        request_id: Some("r-raise".into()),
        operation: Some(OpenOperation {
            request_id: "r-raise".into(),
            name: "m.go".into(),
            dimensions: json!({}),
            priority: 0,
        }),
        ..push("k", "go")
    };
    let (held, _) = {
        let r = write(&store, T0 + 1, vec![Op::Push(raise)], true).await;
        let c = r.claimed.into_iter().find(|c| c.entity.key == "k").expect("k claimed");
        (c.entity, c.inbox_head)
    };
    assert!(store.operation_get("r-raise").await.unwrap().unwrap().ended_at.is_none());
    let before = get(&store, "k").await;
    let Ok(Applied::Commanded(killed)) = run(&store, T0 + 2, "k", Command::Kill).await else { panic!("kill applies") };
    assert_eq!(killed.run_status, RunStatus::Killed);
    assert_eq!(killed.version, before.version + 1);
    assert_eq!((killed.lease_owner, killed.due_at, killed.auto_at, killed.timer_at), (None, None, None, None));
    assert!(store.inbox_list(killed.id).await.unwrap().is_empty(), "queued events dropped");
    assert!(store.timer_list(killed.id).await.unwrap().is_empty(), "timers dropped");
    let open = store.task_list(TaskFilter { open_only: true, ..TaskFilter::default() }).await.unwrap();
    assert!(open.is_empty(), "its task canceled: {open:?}");
    for r in ["r-create", "r-raise"] {
        let op = store.operation_get(r).await.unwrap().unwrap();
        assert_eq!((op.ended_at, op.outcome.as_deref()), (Some(T0 + 2), Some("canceled")), "{r}");
    }
    let late = commit(&held, Some("done"), None, AfterCommit::Release);
    let r = write(&store, T0 + 3, vec![Op::Commit(Box::new(late))], false).await;
    assert_eq!(r.results[0], Err(OpError::LeaseLost { entity_id: held.id }), "the holder's commit is fenced off");

    // Resume after a fault clears the errors the fault policy counts.
    create_one(&store, "f").await;
    let (f, ev) = claim_with_event(&store, T0 + 10, "f").await;
    let mut fault = commit(&f, None, Some(ev.id), AfterCommit::Release);
    fault.run_status = Some((RunStatus::Failed, None));
    fault.recent_errors = Some(vec![T0 + 9, T0 + 10]);
    assert!(write(&store, T0 + 11, vec![Op::Commit(Box::new(fault))], false).await.results[0].is_ok());
    assert_eq!(get(&store, "f").await.recent_errors.len(), 2);
    let Ok(Applied::Commanded(f)) = run(&store, T0 + 12, "f", Command::Resume).await else { panic!("resume applies") };
    assert_eq!((f.run_status, f.recent_errors.len()), (RunStatus::Active, 0));
    assert_eq!(get(&store, "f").await.recent_errors, Vec::<Millis>::new());

    // Retry offers a task waiting for its delay now.
    let w = NewEntity {
        offer: Some(TaskOffer {
            queue: "q".into(),
            action: ActionName::new("work"),
            lock_ms: 1_000,
            available_at: T0 + 90_000,
        }),
        ..new_entity("w", "working", None)
    };
    write(&store, T0 + 20, vec![Op::Create(w)], false).await;
    let lease = || Op::TaskLease { queue: "q".into(), agent: "a".into(), limit: 5, token_prefix: "t-".into() };
    let r = write(&store, T0 + 21, vec![lease()], false).await;
    assert_eq!(r.results[0], Ok(Applied::Leased(Vec::new())), "not yet available");
    assert!(run(&store, T0 + 22, "w", Command::Retry).await.is_ok());
    let r = write(&store, T0 + 22, vec![lease()], false).await;
    let Ok(Applied::Leased(tasks)) = &r.results[0] else { panic!("{:?}", r.results[0]) };
    assert_eq!((tasks.len(), tasks[0].key.as_str()), (1, "w"), "offered now");
}

/// Commands of one batch (a bulk operation's page): on distinct entities they share a
/// segment; one entity twice, the second after the first; each with its own operation,
/// reason and result, a refused one (unknown, killed) failing alone.
pub async fn commands_of_one_batch_apply_each_in_order<S: Store>(store: S) {
    for key in ["a", "b", "c"] {
        create_one(&store, key).await;
    }
    run(&store, T0, "c", Command::Kill).await.unwrap();
    let mut reasoned = command_as("a", Command::Pause, Some("bulk-1/a"));
    if let Op::Command { operation: Some(o), .. } = &mut reasoned {
        o.dimensions = json!({"reason": "window 42"});
    }
    let ops = vec![
        reasoned,
        command_as("b", Command::Pause, Some("bulk-1/b")),
        command_as("nobody", Command::Pause, Some("bulk-1/x")),
        command_as("c", Command::Pause, Some("bulk-1/c")),
        command_as("a", Command::Resume, Some("bulk-2/a")),
    ];
    let r = write(&store, T0 + 1, ops, false).await;
    assert!(r.results[0].is_ok() && r.results[1].is_ok() && r.results[4].is_ok(), "{:?}", r.results);
    assert!(matches!(r.results[2], Err(OpError::NotFound { .. })), "{:?}", r.results[2]);
    assert!(matches!(r.results[3], Err(OpError::Killed { .. })), "{:?}", r.results[3]);
    assert_eq!(get(&store, "a").await.run_status, RunStatus::Active, "paused, then resumed");
    assert_eq!(get(&store, "b").await.run_status, RunStatus::Paused);
    let a = get(&store, "a").await;
    let details: Vec<Option<String>> = store
        .history_list(a.id)
        .await
        .unwrap()
        .into_iter()
        .filter(|h| h.kind == HistoryKind::Command)
        .map(|h| h.detail)
        .collect();
    assert_eq!(details, [Some("pause: window 42".to_string()), Some("resume".to_string())]);
    for (id, ended) in
        [("bulk-1/a", true), ("bulk-1/b", true), ("bulk-2/a", true), ("bulk-1/x", false), ("bulk-1/c", false)]
    {
        assert_eq!(
            store.operation_get(id).await.unwrap().is_some(),
            ended,
            "{id}: only applied commands leave an operation"
        );
    }
}
