//! Canceling an operation (DESIGN §1, §9): on each entity it reached, its queued events
//! are dropped, the work it does is stopped (fenced off, lease and agent task gone), the
//! machine's cancel event is queued where valid and the state is the operation's doing,
//! work stopped with no undo is paused; the operation ends as canceled, each entity's part
//! of the cancel is an operation of its own, and a replay changes nothing.

use serde_json::json;
use settle_core::{ActionName, EntityKey, EventName, MachineName, StateName};

use super::{OWNER, T0, commit, entity, get, write};
use crate::{
    AfterCommit, Applied, Cancel, CancelOutcome, HistoryKind, NewEntity, Op, OpError, OpenOperation, Push, RunStatus,
    Store, TaskFilter, TaskOffer, Undo,
};

fn cancel(key: &str) -> Op {
    Op::Cancel(Box::new(Cancel {
        machine: MachineName::new("m"),
        key: EntityKey::new(key),
        canceled: "op".into(),
        undo: Some(Undo {
            event: EventName::new("abort"),
            states: vec![StateName::new("working"), StateName::new("ready")],
        }),
        operation: Some(OpenOperation {
            request_id: format!("op/cancel/{key}"),
            name: "m.cancel".into(),
            dimensions: json!({}),
            priority: 0,
        }),
    }))
}

fn of_op(key: &str, state: &str, auto_at: Option<i64>) -> NewEntity {
    NewEntity { auto_at, request_id: Some("op".into()), ..entity(key, state) }
}

/// Five entities the operation `op` reached and one it did not: `w` working in it and
/// held by an engine, `r` at rest where it brought it, `t` waiting for an agent in a state
/// with no cancel event, `q` at rest for another operation with an event of `op` queued,
/// `d` where `op` brought it but the cancel event is not valid; `x` another operation's.
pub async fn canceling_an_operation_stops_its_work_and_queues_the_undo<S: Store>(store: S) {
    let opened = NewEntity {
        operation: Some(OpenOperation {
            request_id: "op".into(),
            name: "m.create".into(),
            dimensions: json!({}),
            priority: 0,
        }),
        ..of_op("w", "working", Some(T0))
    };
    let t = NewEntity {
        offer: Some(TaskOffer { queue: "q".into(), action: ActionName::new("work"), lock_ms: 1_000, available_at: T0 }),
        ..of_op("t", "configuring", None)
    };
    let other = |key: &str| NewEntity { request_id: Some("other".into()), ..entity(key, "ready") };
    let creates = vec![
        Op::Create(opened),
        Op::Create(of_op("r", "ready", None)),
        Op::Create(t),
        Op::Create(other("q")),
        Op::Create(of_op("d", "retired", None)),
        Op::Create(other("x")),
    ];
    let r = write(&store, T0, creates, false).await;
    assert!(r.results.iter().all(Result::is_ok), "{r:?}");
    let queued = Push {
        machine: MachineName::new("m"),
        key: EntityKey::new("q"),
        event: EventName::new("go"),
        params: json!(null),
        request_id: Some("op".into()),
        kind: crate::InboxKind::Raised,
        join_from: None,
        operation: None,
        reply: None,
    };
    let other_event = Push { request_id: Some("other".into()), event: EventName::new("poke"), ..queued.clone() };
    let r = write(&store, T0 + 1, vec![Op::Push(queued), Op::Push(other_event)], true).await;
    let held = r.claimed.iter().find(|c| c.entity.key == "w").expect("w claimed").entity.clone();
    // `q` was claimed with its events: let it go, as an engine that has not begun would.
    let q = r.claimed.iter().find(|c| c.entity.key == "q").expect("q claimed").entity.clone();
    let release = Op::Release(crate::Fence { entity_id: q.id, version: q.version, owner: OWNER.into() });
    assert!(write(&store, T0 + 1, vec![release], false).await.results[0].is_ok());
    assert!(store.operation_get("op").await.unwrap().unwrap().ended_at.is_none());

    let keys = ["w", "r", "t", "q", "d", "x"];
    let r = write(&store, T0 + 2, keys.iter().map(|k| cancel(k)).collect(), false).await;
    let outcome = |i: usize| match &r.results[i] {
        Ok(Applied::Canceled { entity, outcome }) => (entity.as_ref().clone(), *outcome),
        other => panic!("{}: {other:?}", keys[i]),
    };
    let (w, o) = outcome(0);
    assert_eq!(o, CancelOutcome::Undone { stopped: true });
    assert_eq!((w.version, w.lease_owner.as_deref()), (held.version + 1, None), "its work fenced off, lease gone");
    assert_eq!(w, get(&store, "w").await, "answers the entity as stored");
    let inbox = store.inbox_list(w.id).await.unwrap();
    assert_eq!(inbox.len(), 1);
    assert_eq!((inbox[0].event.as_str(), inbox[0].request_id.as_deref()), ("abort", Some("op/cancel/w")));
    let late = commit(&held, Some("ready"), None, AfterCommit::Release);
    let written = write(&store, T0 + 3, vec![Op::Commit(Box::new(late))], false).await;
    assert_eq!(written.results[0], Err(OpError::LeaseLost { entity_id: held.id }), "the holder's result is refused");

    let (r_row, o) = outcome(1);
    assert_eq!(o, CancelOutcome::Undone { stopped: false });
    assert_eq!(store.inbox_list(r_row.id).await.unwrap()[0].event.as_str(), "abort");
    assert_eq!(r_row.due_at, Some(T0 + 2), "due now: its undo runs");

    let (t_row, o) = outcome(2);
    assert_eq!(o, CancelOutcome::Paused);
    assert_eq!((t_row.run_status, t_row.auto_at), (RunStatus::Paused, Some(T0 + 2)), "a resume offers it again");
    let open = store.task_list(TaskFilter { open_only: true, ..TaskFilter::default() }).await.unwrap();
    assert!(open.is_empty(), "its agent task canceled: {open:?}");

    let (q_row, o) = outcome(3);
    assert_eq!(o, CancelOutcome::Dropped);
    let left: Vec<String> =
        store.inbox_list(q_row.id).await.unwrap().into_iter().map(|i| i.event.to_string()).collect();
    assert_eq!(left, vec!["poke".to_string()], "only the canceled operation's events go");

    assert_eq!(outcome(4).1, CancelOutcome::Untouched, "no cancel event valid in `retired`");
    let (x, o) = outcome(5);
    assert_eq!(o, CancelOutcome::Untouched);
    let history = store.history_list(x.id).await.unwrap();
    assert!(history.iter().all(|h| h.kind != HistoryKind::Command), "nothing recorded where nothing happened");
    let w_history = store.history_list(w.id).await.unwrap();
    let recorded = w_history.iter().find(|h| h.kind == HistoryKind::Command).expect("the cancel is recorded");
    assert_eq!(recorded.request_id.as_deref(), Some("op/cancel/w"));
    assert_eq!(recorded.detail.as_deref(), Some("cancel of operation op: its work stopped, `abort` raised"));

    // The operation ends as canceled: nothing of it is busy or queued any more.
    let op = store.operation_get("op").await.unwrap().unwrap();
    assert_eq!((op.ended_at, op.outcome.as_deref()), (Some(T0 + 2), Some("canceled")));
    // Each entity's part: open while its undo is queued, else done when applied.
    for (key, open) in [("w", true), ("r", true), ("t", false), ("q", false), ("x", false)] {
        let part = store.operation_get(&format!("op/cancel/{key}")).await.unwrap().expect("opened");
        assert_eq!(part.ended_at.is_none(), open, "{key}");
    }
    // The same cancel again is a replay.
    let again = write(&store, T0 + 4, vec![cancel("r")], false).await;
    assert!(matches!(again.results[0], Ok(Applied::Replayed { .. })), "{:?}", again.results[0]);
    assert_eq!(store.inbox_list(r_row.id).await.unwrap().len(), 1, "no second undo");

    // What canceling goes through: the entities the operation reached, in id order.
    let reached: Vec<String> =
        store.operation_reached("op", None, 10).await.unwrap().into_iter().map(|e| e.key.to_string()).collect();
    assert!(reached.contains(&"w".to_string()), "{reached:?}");
    let first = store.operation_reached("op", None, 1).await.unwrap();
    assert_eq!(first.len(), 1);
    let rest = store.operation_reached("op", Some(first[0].id), 10).await.unwrap();
    assert!(rest.iter().all(|e| e.id > first[0].id));
    assert!(store.operation_reached("nobody", None, 10).await.unwrap().is_empty());
}
