//! What a batch leaves in the columns an entity's next step reads: the event whose
//! workflow it is in (and when that workflow ends), the inbox items a commit keeps and the
//! head it reports, the JSON columns a commit changes alone, the keys a commit's creates
//! may not take, the predecessors a batch joins, and an operator command's history row.
//! Each check reads its columns back through the store, so a plan that computes one wrong
//! fails here on both backends.

use serde_json::json;
use settle_core::{EntityKey, EventName, MachineName, Properties};

use super::{T0, claim_with_event, commit, create_one, get, new_entity, push, write};
use crate::{
    AfterCommit, Applied, Command, EventRecord, Fence, HistoryKind, InboxItem, InboxKind, Op, OpError, Push, Store,
    Telemetry,
};

/// A change notice for `key`, as a successor's commit queues it.
fn notice(key: &str) -> Push {
    Push {
        event: EventName::new(InboxKind::NOTICE_EVENT),
        params: json!({}),
        kind: InboxKind::Notice,
        ..push(key, "notice")
    }
}

/// The telemetry of a commit that processes `item`.
fn processing(item: &InboxItem, rejected: bool, current_event: Option<i64>, at_rest: bool) -> Telemetry {
    Telemetry {
        event: Some(EventRecord::of(item, rejected, false)),
        at_rest,
        complete: at_rest,
        current_event,
        ..Telemetry::default()
    }
}

/// An entity is in the workflow of the event it last accepted until it comes to rest: a
/// step without an event and a rejected event leave it there; an event accepted while that
/// workflow runs ends it in the state it had reached; coming to rest ends the last one.
pub async fn commits_follow_the_workflow_of_their_event<S: Store>(store: S) {
    create_one(&store, "a").await;
    let r = write(&store, T0, vec![Op::Push(push("a", "one")), Op::Push(push("a", "two"))], true).await;
    let c = r.claimed[0].clone();
    let one = c.inbox_head.clone().expect("the first event");
    let two = store.inbox_list(c.entity.id).await.unwrap()[1].clone();

    // `one` is accepted: the entity is in its workflow.
    let mut cm = commit(&c.entity, Some("busy"), Some(one.id), AfterCommit::Hold);
    cm.telemetry = processing(&one, false, None, false);
    let r = write(&store, T0 + 1, vec![Op::Commit(Box::new(cm))], false).await;
    assert!(r.results[0].is_ok(), "{:?}", r.results[0]);
    let e = get(&store, "a").await;
    assert_eq!(e.event_id, Some(one.id));

    // An auto action's step stays in it.
    let mut auto = commit(&e, Some("busier"), None, AfterCommit::Hold);
    (auto.kind, auto.event) = (HistoryKind::Auto, None);
    auto.telemetry = Telemetry { current_event: Some(one.id), ..Telemetry::default() };
    write(&store, T0 + 2, vec![Op::Commit(Box::new(auto))], false).await;
    let e = get(&store, "a").await;
    assert_eq!(e.event_id, Some(one.id), "a step without an event stays in the event's workflow");

    // `two` is rejected: it ends at once, `one`'s workflow goes on.
    let mut rejected = commit(&e, None, Some(two.id), AfterCommit::Hold);
    rejected.telemetry = processing(&two, true, Some(one.id), false);
    write(&store, T0 + 3, vec![Op::Commit(Box::new(rejected))], false).await;
    let e = get(&store, "a").await;
    assert_eq!(e.event_id, Some(one.id), "a rejected event does not take the entity over");
    let id = e.id;
    let events = || async {
        let mut rows = store.events_list(id).await.unwrap();
        rows.sort_by_key(|r| r.id);
        rows.into_iter().map(|r| (r.id, r.end_state.map(|s| s.to_string()), r.end_time)).collect::<Vec<_>>()
    };
    assert_eq!(events().await, [(one.id, None, None), (two.id, Some("busier".into()), Some(T0 + 3))]);

    // `three` is accepted while `one`'s workflow runs: `one` ends where it was, and
    // `three`'s own workflow ends where the entity comes to rest.
    write(&store, T0 + 4, vec![Op::Push(push("a", "three"))], false).await;
    let three = store.inbox_list(e.id).await.unwrap()[0].clone();
    let mut accepted = commit(&e, Some("done"), Some(three.id), AfterCommit::Release);
    accepted.telemetry = processing(&three, false, Some(one.id), true);
    write(&store, T0 + 5, vec![Op::Commit(Box::new(accepted))], false).await;
    let e = get(&store, "a").await;
    assert_eq!(e.event_id, None, "at rest, the entity is in no event's workflow");
    assert_eq!(
        events().await,
        [
            (one.id, Some("busier".into()), Some(T0 + 5)),
            (two.id, Some("busier".into()), Some(T0 + 3)),
            (three.id, Some("done".into()), Some(T0 + 5)),
        ]
    );
}

/// A commit deletes only what it consumes: consuming notices keeps the events queued
/// (the first inbox item of the store among them), and the head it reports and the due
/// time after a release count what it kept.
pub async fn consuming_notices_keeps_the_events<S: Store>(store: S) {
    create_one(&store, "a").await;
    let r = write(&store, T0, vec![Op::Push(push("a", "go")), Op::Push(notice("a"))], true).await;
    let c = r.claimed[0].clone();
    let go = c.inbox_head.clone().expect("the event");
    let queued = store.inbox_list(c.entity.id).await.unwrap();
    assert_eq!((queued.len(), queued[1].kind), (2, InboxKind::Notice));

    let mut quiet = commit(&c.entity, None, None, AfterCommit::Hold);
    (quiet.quiet, quiet.event, quiet.consume_notices_upto) = (true, None, Some(queued[1].id));
    let r = write(&store, T0 + 1, vec![Op::Commit(Box::new(quiet))], false).await;
    let Ok(Applied::Committed { inbox_head, .. }) = &r.results[0] else { panic!("{:?}", r.results[0]) };
    assert_eq!(inbox_head.as_ref().map(|i| i.id), Some(go.id), "the event is still the head");
    let left: Vec<i64> = store.inbox_list(c.entity.id).await.unwrap().iter().map(|i| i.id).collect();
    assert_eq!(left, [go.id], "the notice went, the event stays");

    // Released with the event queued, the entity is due at once.
    let e = get(&store, "a").await;
    let fence = Fence { entity_id: e.id, version: e.version, owner: super::OWNER.into() };
    write(&store, T0 + 2, vec![Op::Release(fence)], false).await;
    assert_eq!(get(&store, "a").await.due_at, Some(T0 + 2), "its event keeps it due");
    let r = write(&store, T0 + 3, Vec::new(), true).await;
    assert_eq!(r.claimed.len(), 1, "and claimable again");
    assert_eq!(r.claimed[0].inbox_head.as_ref().map(|i| i.id), Some(go.id));
}

/// Consuming an event keeps the notices queued before it (the first inbox item of the
/// store among them), reports the oldest as the head, and a release counts it.
pub async fn consuming_an_event_keeps_the_notices<S: Store>(store: S) {
    create_one(&store, "a").await;
    let r = write(&store, T0, vec![Op::Push(notice("a")), Op::Push(push("a", "go"))], true).await;
    let c = r.claimed[0].clone();
    let first = c.inbox_head.clone().expect("the notice");
    assert_eq!(first.kind, InboxKind::Notice);
    let go = store.inbox_list(c.entity.id).await.unwrap()[1].clone();

    let cm = commit(&c.entity, Some("busy"), Some(go.id), AfterCommit::Hold);
    let r = write(&store, T0 + 1, vec![Op::Commit(Box::new(cm))], false).await;
    let Ok(Applied::Committed { inbox_head, .. }) = &r.results[0] else { panic!("{:?}", r.results[0]) };
    assert_eq!(inbox_head.as_ref().map(|i| i.id), Some(first.id), "the notice is the head");
    let left: Vec<i64> = store.inbox_list(c.entity.id).await.unwrap().iter().map(|i| i.id).collect();
    assert_eq!(left, [first.id], "the event went, the notice stays");

    // Released with the notice queued, the entity is due at once.
    let e = get(&store, "a").await;
    let fence = Fence { entity_id: e.id, version: e.version, owner: super::OWNER.into() };
    write(&store, T0 + 2, vec![Op::Release(fence)], false).await;
    assert_eq!(get(&store, "a").await.due_at, Some(T0 + 2), "its notice keeps it due");
}

/// A commit that changes nothing but one JSON column (fired subscriptions, recent errors,
/// properties) still writes it.
pub async fn a_commit_may_change_one_column_alone<S: Store>(store: S) {
    create_one(&store, "a").await;
    let (e, _) = claim_with_event(&store, T0, "a").await;
    let alone = |e: &crate::EntityRow| {
        let mut c = commit(e, None, None, AfterCommit::Hold);
        (c.quiet, c.event) = (true, None);
        c
    };
    let mut fired = alone(&e);
    fired.fired = Some(vec![EventName::new("all_ready")]);
    write(&store, T0 + 1, vec![Op::Commit(Box::new(fired))], false).await;
    let e = get(&store, "a").await;
    assert_eq!(e.fired, [EventName::new("all_ready")]);

    let mut errors = alone(&e);
    errors.recent_errors = Some(vec![T0 - 5, T0 + 1]);
    write(&store, T0 + 2, vec![Op::Commit(Box::new(errors))], false).await;
    let e = get(&store, "a").await;
    assert_eq!(e.recent_errors, [T0 - 5, T0 + 1]);

    let mut props = alone(&e);
    let mut p = Properties::new();
    p.insert("size".into(), json!(3));
    props.properties = Some(p.clone());
    write(&store, T0 + 3, vec![Op::Commit(Box::new(props))], false).await;
    let e = get(&store, "a").await;
    assert_eq!((e.properties, e.version, e.fired.len(), e.recent_errors.len()), (p, 1, 1, 2));
}

/// A commit may not create an entity whose key is taken, nor the same key twice; it
/// fails whole.
pub async fn a_commit_creates_only_free_keys<S: Store>(store: S) {
    create_one(&store, "taken").await;
    create_one(&store, "a").await;
    let (e, ev) = claim_with_event(&store, T0, "a").await;
    let mut c = commit(&e, Some("busy"), Some(ev.id), AfterCommit::Hold);
    c.creates = vec![new_entity("fresh", "idle", None), new_entity("taken", "idle", None)];
    let r = write(&store, T0 + 1, vec![Op::Commit(Box::new(c))], false).await;
    assert_eq!(r.results[0], Err(OpError::AlreadyExists { machine: "m".into(), key: "taken".into() }));
    let mut twice = commit(&e, Some("busy"), Some(ev.id), AfterCommit::Hold);
    twice.creates = vec![new_entity("twin", "idle", None), new_entity("twin", "idle", None)];
    let r = write(&store, T0 + 2, vec![Op::Commit(Box::new(twice))], false).await;
    assert_eq!(r.results[0], Err(OpError::AlreadyExists { machine: "m".into(), key: "twin".into() }));
    for key in ["fresh", "twin"] {
        assert!(store.entity_get("m", key).await.unwrap().is_none(), "`{key}` was not created");
    }
    let e = get(&store, "a").await;
    assert_eq!((e.state.as_str(), e.version), ("idle", 1), "the commit changed nothing");
}

/// An entity joined as a successor in a batch notifies its new predecessor from a commit
/// later in the same batch.
pub async fn a_successor_joined_in_a_batch_notifies_its_predecessor<S: Store>(store: S) {
    let p = create_one(&store, "p").await;
    create_one(&store, "s").await;
    let (s, ev) = claim_with_event(&store, T0, "s").await;
    let join = Push { join_from: Some(p.id), ..push("s", "hello") };
    let mut done = commit(&s, Some("done"), Some(ev.id), AfterCommit::Release);
    done.notify_predecessors = true;
    let r = write(&store, T0 + 1, vec![Op::Push(join), Op::Commit(Box::new(done))], false).await;
    assert!(r.results.iter().all(Result::is_ok), "{:?}", r.results);
    let preds = store.predecessor_list(s.id).await.unwrap();
    assert_eq!(preds.iter().map(|e| e.key.as_str()).collect::<Vec<_>>(), ["p"]);
    let inbox = store.inbox_list(p.id).await.unwrap();
    assert_eq!(inbox.iter().map(|i| i.kind).collect::<Vec<_>>(), [InboxKind::Notice], "the predecessor heard");
    assert_eq!(get(&store, "p").await.due_at, Some(T0 + 1));
}

/// An operator command's history row says which command, on which entity, when.
pub async fn a_command_is_recorded_when_it_applies<S: Store>(store: S) {
    let a = create_one(&store, "a").await;
    let op = Op::Command {
        machine: MachineName::new("m"),
        key: EntityKey::new("a"),
        command: Command::Pause,
        operation: None,
    };
    let r = write(&store, T0 + 7, vec![op], false).await;
    assert!(r.results[0].is_ok(), "{:?}", r.results[0]);
    let h = store.history_list(a.id).await.unwrap();
    let last = h.last().expect("history");
    assert_eq!(
        (last.entity_id, last.kind, last.detail.as_deref(), last.at, last.from.as_deref()),
        (a.id, HistoryKind::Command, Some("pause"), T0 + 7, Some("idle"))
    );
}

/// An internal event (one the entity raised on itself) heads its inbox before everything
/// queued earlier: reported as the head by the commit that queued it while the entity is
/// held, claimed first after a release, and a newer one queued by a batch still goes
/// before older external events.
pub async fn an_internal_event_heads_the_inbox<S: Store>(store: S) {
    create_one(&store, "a").await;
    let r = write(&store, T0, vec![Op::Push(push("a", "one")), Op::Push(push("a", "two"))], true).await;
    let c = r.claimed[0].clone();
    let one = c.inbox_head.clone().expect("the first event");
    let internal = |event: &str| Push { kind: InboxKind::Internal, ..push("a", event) };
    let head = |r: &crate::BatchResult| match &r.results[0] {
        Ok(Applied::Committed { inbox_head, .. }) => inbox_head.clone().expect("a head"),
        other => panic!("{other:?}"),
    };

    // `one` raises `inner` on the entity: it goes before `two`, queued earlier.
    let mut cm = commit(&c.entity, Some("busy"), Some(one.id), AfterCommit::Hold);
    cm.pushes.push(internal("inner"));
    let inner = head(&write(&store, T0 + 1, vec![Op::Commit(Box::new(cm))], false).await);
    assert_eq!((inner.event.as_str(), inner.kind), ("inner", InboxKind::Internal));

    // Released before it ran, the entity is claimed with it at the head again.
    let e = get(&store, "a").await;
    let fence = Fence { entity_id: e.id, version: e.version, owner: super::OWNER.into() };
    write(&store, T0 + 2, vec![Op::Release(fence)], false).await;
    let r = write(&store, T0 + 3, Vec::new(), true).await;
    assert_eq!(r.claimed[0].inbox_head.as_ref().map(|i| i.id), Some(inner.id), "claimed first");

    // Processing it raises two more: they go in order, then `two`. A commit that consumes
    // an internal event says so (`consumes_internal`): the next head may be another.
    let mut cm = commit(&r.claimed[0].entity, Some("busier"), Some(inner.id), AfterCommit::Hold);
    cm.consumes_internal = true;
    cm.pushes.extend([internal("again"), internal("more")]);
    let again = head(&write(&store, T0 + 4, vec![Op::Commit(Box::new(cm))], false).await);
    assert_eq!(again.event.as_str(), "again");
    let e = get(&store, "a").await;
    let mut cm = commit(&e, Some("done"), Some(again.id), AfterCommit::Hold);
    cm.consumes_internal = true;
    let more = head(&write(&store, T0 + 5, vec![Op::Commit(Box::new(cm))], false).await);
    assert_eq!((more.event.as_str(), more.kind), ("more", InboxKind::Internal), "a stored one before `two`");
    let e = get(&store, "a").await;
    let mut cm = commit(&e, Some("done"), Some(more.id), AfterCommit::Hold);
    cm.consumes_internal = true;
    let next = head(&write(&store, T0 + 6, vec![Op::Commit(Box::new(cm))], false).await);
    assert_eq!((next.event.as_str(), next.kind), ("two", InboxKind::Raised), "then the queue in order");
}
