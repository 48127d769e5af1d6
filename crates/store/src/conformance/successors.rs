//! Successors and change notices: the edges a commit records, the notices a successor's
//! state change leaves its predecessors, and events a commit pushes to related entities.

use serde_json::json;
use settle_core::machine::Related;
use settle_core::{EventName, MachineName};

use super::{T0, claim_with_event, commit, create_one, get, new_entity, push, write};
use crate::{AfterCommit, Applied, EntityRow, InboxKind, NewEntity, Op, PushRelated, Store};

/// Created entities become successors; a successor's commit writes a change notice to
/// each predecessor in the same transaction; the snapshot shows successors and the newest
/// notice; consuming notices up to an id leaves later ones.
pub async fn successors_and_change_notices<S: Store>(store: S) {
    create_one(&store, "parent").await;
    let (p, ev) = claim_with_event(&store, T0, "parent").await;
    let mut c = commit(&p, Some("waiting"), Some(ev.id), AfterCommit::Release);
    c.creates = vec![new_entity("c1", "idle", None), new_entity("c2", "idle", None)];
    let r = write(&store, T0 + 1, vec![Op::Commit(Box::new(c))], false).await;
    let Ok(Applied::Committed { created, .. }) = &r.results[0] else { panic!("{:?}", r.results[0]) };
    assert_eq!(created.len(), 2);
    let snap = store.successor_snapshot(p.id).await.unwrap();
    assert_eq!(snap.successors.iter().map(|e| e.key.as_str()).collect::<Vec<_>>(), ["c1", "c2"]);
    assert_eq!(snap.newest_notice, None);
    // A nested event that joins an entity records it as a successor too.
    create_one(&store, "joined").await;
    let mut join = push("joined", "hello");
    join.join_from = Some(p.id);
    join.kind = InboxKind::Nested;
    write(&store, T0 + 2, vec![Op::Push(join)], false).await;
    assert_eq!(store.successor_snapshot(p.id).await.unwrap().successors.len(), 3);
    // Each successor lists the parent as its predecessor; the parent has none.
    let joined = get(&store, "joined").await;
    let preds = store.predecessor_list(joined.id).await.unwrap();
    assert_eq!(preds.iter().map(|e| e.key.as_str()).collect::<Vec<_>>(), ["parent"]);
    assert!(store.predecessor_list(p.id).await.unwrap().is_empty());
    // c1 moves: the parent gets a notice and becomes due, atomically.
    let (c1, ev) = claim_with_event(&store, T0 + 3, "c1").await;
    let mut cm = commit(&c1, Some("ready"), Some(ev.id), AfterCommit::Release);
    cm.notify_predecessors = true;
    let r = write(&store, T0 + 4, vec![Op::Commit(Box::new(cm))], false).await;
    assert!(r.results[0].is_ok(), "{:?}", r.results[0]);
    let inbox = store.inbox_list(p.id).await.unwrap();
    assert_eq!(inbox.len(), 1);
    assert_eq!((inbox[0].kind, inbox[0].event.as_str()), (InboxKind::Notice, InboxKind::NOTICE_EVENT));
    assert_eq!(get(&store, "parent").await.due_at, Some(T0 + 4));
    let snap = store.successor_snapshot(p.id).await.unwrap();
    assert_eq!(snap.newest_notice, Some(inbox[0].id));
    assert_eq!(snap.successors.iter().find(|e| e.key == "c1").unwrap().state.as_str(), "ready");
    // The parent evaluates (quietly) and consumes every notice up to the snapshot.
    let r = write(&store, T0 + 5, vec![], true).await;
    let claimed = r.claimed.iter().find(|c| c.entity.id == p.id).unwrap().clone();
    let (c2, ev2) = claim_with_event(&store, T0 + 6, "c2").await;
    let mut cm = commit(&c2, Some("ready"), Some(ev2.id), AfterCommit::Release);
    cm.notify_predecessors = true;
    write(&store, T0 + 7, vec![Op::Commit(Box::new(cm))], false).await;
    let mut quiet = commit(&claimed.entity, None, None, AfterCommit::Release);
    quiet.quiet = true;
    quiet.consume_notices_upto = snap.newest_notice;
    write(&store, T0 + 8, vec![Op::Commit(Box::new(quiet))], false).await;
    let inbox = store.inbox_list(p.id).await.unwrap();
    assert_eq!(inbox.len(), 1, "the notice written after the snapshot stays");
    assert_eq!(get(&store, "parent").await.due_at, Some(T0 + 8), "and keeps the parent due");
    let h = store.history_list(p.id).await.unwrap();
    assert_eq!(h.len(), 2, "a quiet commit writes no history: {h:?}");
    // Successors changing in one batch for the same operation leave their predecessor one
    // notice (it evaluates them at once); another operation's change leaves its own.
    // (`joined` is still held since the claim above: its event is the one it was sent.)
    let r = write(&store, T0 + 9, vec![Op::Push(push("c1", "again")), Op::Push(push("c2", "again"))], true).await;
    let mut held: Vec<(EntityRow, i64)> = ["c1", "c2"]
        .iter()
        .map(|k| r.claimed.iter().find(|c| c.entity.key == *k).expect("claimed"))
        .map(|c| (c.entity.clone(), c.inbox_head.as_ref().unwrap().id))
        .collect();
    let joined = get(&store, "joined").await;
    let hello = store.inbox_list(joined.id).await.unwrap()[0].id;
    held.push((joined, hello));
    let mut ops = Vec::new();
    for ((entity, item), request) in held.iter().zip(["req-go", "req-go", "req-other"]) {
        let mut cm = commit(entity, Some("done"), Some(*item), AfterCommit::Release);
        cm.notify_predecessors = true;
        cm.request_id = Some(request.into());
        ops.push(Op::Commit(Box::new(cm)));
    }
    let r = write(&store, T0 + 10, ops, false).await;
    assert!(r.results.iter().all(|r| r.is_ok()), "{:?}", r.results);
    let inbox = store.inbox_list(p.id).await.unwrap();
    let notices: Vec<Option<&str>> = inbox.iter().skip(1).map(|i| i.request_id.as_deref()).collect();
    assert_eq!(notices, [Some("req-go"), Some("req-other")], "one notice per operation: {inbox:?}");
}

/// A commit pushes an event to every predecessor or successor of the listed machines, in
/// the same transaction: successors it creates in that commit included, successors of
/// other machines left out; each target gets a nested event of the commit's request and
/// becomes due.
pub async fn events_reach_related_entities<S: Store>(store: S) {
    let related = |on, machines: &[&str], event: &str| PushRelated {
        on,
        machines: machines.iter().map(|m| MachineName::new(*m)).collect(),
        event: EventName::new(event),
        params: json!({"from": "mid"}),
    };
    let inbox = |id| {
        let store = &store;
        async move {
            let items = store.inbox_list(id).await.unwrap();
            items.into_iter().map(|i| (i.event.to_string(), i.kind, i.request_id, i.params)).collect::<Vec<_>>()
        }
    };
    let root = create_one(&store, "root").await;
    let (r, ev) = claim_with_event(&store, T0, "root").await;
    let mut c = commit(&r, Some("waiting"), Some(ev.id), AfterCommit::Release);
    c.creates = vec![new_entity("mid", "idle", None)];
    let done = write(&store, T0 + 1, vec![Op::Commit(Box::new(c))], false).await;
    assert!(done.results[0].is_ok(), "{:?}", done.results[0]);

    // mid creates c1 (machine m) and c2 (machine n), and raises on both sides.
    let (mid, ev) = claim_with_event(&store, T0 + 2, "mid").await;
    let mut c = commit(&mid, Some("working"), Some(ev.id), AfterCommit::Release);
    c.creates = vec![
        new_entity("c1", "idle", None),
        NewEntity { machine: MachineName::new("n"), ..new_entity("c2", "idle", None) },
    ];
    c.push_related = vec![
        related(Related::Successors, &["m"], "hello"),
        related(Related::Predecessors, &["m"], "up"),
        related(Related::Predecessors, &["n"], "not_for_root"),
    ];
    let done = write(&store, T0 + 3, vec![Op::Commit(Box::new(c))], false).await;
    assert!(done.results[0].is_ok(), "{:?}", done.results[0]);
    let nested =
        |event: &str| (event.to_string(), InboxKind::Nested, Some("req-go".to_string()), json!({"from": "mid"}));
    assert_eq!(inbox(root.id).await, [nested("up")]);
    assert_eq!(get(&store, "root").await.due_at, Some(T0 + 3), "the predecessor is due");
    let c1 = get(&store, "c1").await;
    let c2 = store.entity_get("n", "c2").await.unwrap().expect("c2 exists");
    assert_eq!(inbox(c1.id).await, [nested("hello")], "a successor created in the same commit receives it");
    assert_eq!(c1.due_at, Some(T0 + 3));
    assert_eq!(inbox(c2.id).await, [], "a successor of a machine not listed does not");

    // Later, from the stored edges: both machines listed, both successors receive it.
    let (mid, ev) = claim_with_event(&store, T0 + 4, "mid").await;
    let mut c = commit(&mid, Some("done"), Some(ev.id), AfterCommit::Release);
    c.push_related = vec![related(Related::Successors, &["m", "n"], "again")];
    let done = write(&store, T0 + 5, vec![Op::Commit(Box::new(c))], false).await;
    assert!(done.results[0].is_ok(), "{:?}", done.results[0]);
    assert_eq!(inbox(c1.id).await, [nested("hello"), nested("again")]);
    assert_eq!(inbox(c2.id).await, [nested("again")]);
    assert_eq!(store.entity_get("n", "c2").await.unwrap().unwrap().due_at, Some(T0 + 5));

    // A commit that fails pushes nothing.
    let mut stale = commit(&mid, Some("done"), None, AfterCommit::Release);
    stale.push_related = vec![related(Related::Successors, &["m", "n"], "lost")];
    let done = write(&store, T0 + 6, vec![Op::Commit(Box::new(stale))], false).await;
    assert!(done.results[0].is_err(), "a stale fence fails");
    assert_eq!(inbox(c2.id).await, [nested("again")]);
}
