//! Operations end: once nothing they reached is busy and nothing queued carries their
//! request id — also when the last thing they waited on was another operation's work on
//! the same entity. Each case here is one the simulation (`settle simulate`) found left
//! open forever.

use serde_json::json;
use settle_core::{EntityKey, MachineName};

use super::{T0, claim_with_event, command, commit, create_one, get, new_entity, push, write};
use crate::{AfterCommit, Command, Millis, Op, OpError, OpenOperation, Push, Store};

fn open(request_id: &str) -> Option<OpenOperation> {
    Some(OpenOperation { request_id: request_id.into(), name: "m.go".into(), dimensions: json!({}), priority: 0 })
}

async fn ended<S: Store>(store: &S, request_id: &str) -> bool {
    let op = store.operation_get(request_id).await.expect("read").expect("operation exists");
    op.ended_at.is_some()
}

/// Claims `key` with an event at `now` and commits it at `now + 1` into `to`, at rest,
/// under `request_id`'s workflow (which asks whether its operation may end).
async fn come_to_rest<S: Store>(store: &S, now: Millis, key: &str, to: &str, request_id: &str) {
    let (e, ev) = claim_with_event(store, now, key).await;
    let mut c = commit(&e, Some(to), Some(ev.id), AfterCommit::Release);
    c.request_id = Some(request_id.into());
    c.telemetry.at_rest = true;
    c.telemetry.complete = true;
    let r = write(store, now + 1, vec![Op::Commit(Box::new(c))], false).await;
    assert!(r.results[0].is_ok(), "{key} into {to}: {:?}", r.results[0]);
}

/// Operations end when (1) the entity they worked for is taken over by another
/// operation's workflow, (2) the last change notice they left a predecessor is consumed,
/// whoever consumes it; and (3) a killed entity takes no more events: a raise is refused
/// (`Killed`, no operation opened), an event a commit sends it is dropped; and (4) one that
/// two entities work for ends only when the second comes to rest.
pub async fn operations_end_when_nothing_waits_on_them<S: Store>(store: S) {
    // (1) `a` works for r1 (busy: its auto action is due); r2's event moves it on and it
    // comes to rest under r2: r1 no longer waits on it.
    let r = write(
        &store,
        T0,
        vec![Op::Create(crate::NewEntity {
            request_id: Some("r1".into()),
            operation: open("r1"),
            ..new_entity("a", "working", Some(T0 + 60_000))
        })],
        false,
    )
    .await;
    assert!(r.results[0].is_ok(), "{:?}", r.results[0]);
    assert!(!ended(&store, "r1").await, "r1 is open while `a` is busy");
    come_to_rest(&store, T0 + 1, "a", "done", "r2").await;
    assert!(ended(&store, "r1").await, "r1 ended once another operation took `a` over and it came to rest");

    // (2) Child `c1` of `p` moves under r3 and leaves `p` a notice carrying r3; `p`
    // consumes it quietly under its own request id: r3 has nothing left.
    create_one(&store, "p").await;
    let (p, ev) = claim_with_event(&store, T0 + 10, "p").await;
    let mut c = commit(&p, Some("waiting"), Some(ev.id), AfterCommit::Release);
    c.creates = vec![new_entity("c1", "idle", None)];
    write(&store, T0 + 11, vec![Op::Commit(Box::new(c))], false).await;
    let raise = Push { request_id: Some("r3".into()), operation: open("r3"), ..push("c1", "go") };
    let r = write(&store, T0 + 12, vec![Op::Push(raise)], true).await;
    let claimed = r.claimed.into_iter().find(|c| c.entity.key == "c1").expect("c1 claimed");
    let mut cm = commit(&claimed.entity, Some("ready"), claimed.inbox_head.map(|i| i.id), AfterCommit::Release);
    cm.request_id = Some("r3".into());
    cm.notify_predecessors = true;
    cm.telemetry.at_rest = true;
    cm.telemetry.complete = true;
    write(&store, T0 + 13, vec![Op::Commit(Box::new(cm))], false).await;
    assert!(!ended(&store, "r3").await, "r3 waits for the notice it left `p`");
    let r = write(&store, T0 + 14, vec![], true).await;
    let p = r.claimed.into_iter().find(|c| c.entity.key == "p").expect("p claimed with the notice").entity;
    let snap = store.successor_snapshot(p.id).await.unwrap();
    let mut quiet = commit(&p, None, None, AfterCommit::Release);
    quiet.quiet = true;
    quiet.consume_notices_upto = snap.newest_notice;
    let r = write(&store, T0 + 15, vec![Op::Commit(Box::new(quiet))], false).await;
    assert!(r.results[0].is_ok(), "{:?}", r.results[0]);
    assert!(ended(&store, "r3").await, "r3 ended when its notice was consumed");

    // (3) `k` is killed: a raise is refused without opening its operation, and an event a
    // commit sends it is dropped (the commit applies).
    create_one(&store, "k").await;
    write(&store, T0 + 20, vec![command("k", Command::Kill)], false).await;
    let raise = Push { request_id: Some("r4".into()), operation: open("r4"), ..push("k", "go") };
    let r = write(&store, T0 + 21, vec![Op::Push(raise)], false).await;
    assert!(matches!(&r.results[0], Err(OpError::Killed { .. })), "{:?}", r.results[0]);
    assert!(store.operation_get("r4").await.unwrap().is_none(), "no operation opened for the refused raise");
    create_one(&store, "sender").await;
    let (s, ev) = claim_with_event(&store, T0 + 22, "sender").await;
    let mut c = commit(&s, Some("sent"), Some(ev.id), AfterCommit::Release);
    c.pushes = vec![Push {
        machine: MachineName::new("m"),
        key: EntityKey::new("k"),
        kind: crate::InboxKind::Nested,
        ..push("k", "hello")
    }];
    let r = write(&store, T0 + 23, vec![Op::Commit(Box::new(c))], false).await;
    assert!(r.results[0].is_ok(), "{:?}", r.results[0]);
    let k = get(&store, "k").await;
    assert!(store.inbox_list(k.id).await.unwrap().is_empty(), "a killed entity's inbox stays empty");
    assert_eq!(k.due_at, None);

    // (4) Two entities work for r5: the first to come to rest leaves it open (the other is
    // busy), asking again changes nothing, and the second ends it.
    let busy = |key: &str| {
        Op::Create(crate::NewEntity {
            request_id: Some("r5".into()),
            operation: if key == "w1" { open("r5") } else { None },
            ..new_entity(key, "working", Some(T0 + 60_000))
        })
    };
    let r = write(&store, T0 + 30, vec![busy("w1"), busy("w2")], false).await;
    assert!(r.results.iter().all(Result::is_ok), "{:?}", r.results);
    for (i, key) in ["w1", "w1", "w2"].into_iter().enumerate() {
        come_to_rest(&store, T0 + 31 + 2 * i as i64, key, "idle", "r5").await;
        assert_eq!(ended(&store, "r5").await, key == "w2", "r5 after {key} came to rest");
    }
    let op = store.operation_get("r5").await.unwrap().unwrap();
    assert_eq!((op.ended_at, op.outcome.as_deref()), (Some(T0 + 36), Some("success")));
    // Every operation opened, ended and refused on the way is counted under its outcome.
    super::fleet::counts_agree(&store, T0 + 36).await;
}

/// An operation open since before a deadline with no progress since is marked hung; one
/// whose entity entered a state since, or whose event was queued since, is not; an ended
/// one never is.
pub async fn hung_operations_are_marked<S: Store>(store: S) {
    let create = |key: &str, request_id: &str| {
        Op::Create(crate::NewEntity {
            request_id: Some(request_id.into()),
            operation: open(request_id),
            ..new_entity(key, "working", Some(T0 + 60_000))
        })
    };
    write(
        &store,
        T0,
        vec![create("stuck", "r-stuck"), create("moving", "r-moving"), create("queued", "r-queued")],
        false,
    )
    .await;
    write(
        &store,
        T0,
        vec![Op::Create(crate::NewEntity {
            request_id: Some("r-done".into()),
            operation: open("r-done"),
            ..new_entity("done", "idle", None)
        })],
        false,
    )
    .await;
    // Progress after the deadline: `moving` enters a state under its operation, `queued`
    // gets an event of its operation.
    let (m, ev) = claim_with_event(&store, T0 + 100, "moving").await;
    let mut c = commit(&m, Some("working"), Some(ev.id), AfterCommit::Release);
    c.request_id = Some("r-moving".into());
    c.auto_at = Some(T0 + 60_000);
    assert!(write(&store, T0 + 101, vec![Op::Commit(Box::new(c))], false).await.results[0].is_ok());
    let nudge = Push { request_id: Some("r-queued".into()), ..push("queued", "nudge") };
    write(&store, T0 + 102, vec![Op::Push(nudge)], false).await;
    let r = write(&store, T0 + 200, vec![Op::MarkHung { before: T0 + 50 }], false).await;
    assert_eq!(r.results[0], Ok(crate::Applied::MarkedHung(1)));
    let outcome = |r: &'static str| {
        let store = &store;
        async move { store.operation_get(r).await.unwrap().unwrap().outcome }
    };
    assert_eq!(outcome("r-stuck").await.as_deref(), Some("hung"));
    assert_eq!(outcome("r-moving").await, None);
    assert_eq!(outcome("r-queued").await, None);
    assert_eq!(outcome("r-done").await.as_deref(), Some("success"));
    let r = write(&store, T0 + 300, vec![Op::MarkHung { before: T0 + 50 }], false).await;
    assert_eq!(r.results[0], Ok(crate::Applied::MarkedHung(0)), "marked once");
    super::fleet::counts_agree(&store, T0 + 300).await;
    // A hung operation that ends after all: counted under its outcome, no longer as hung.
    let claimed = write(&store, T0 + 60_000, vec![], true).await.claimed;
    let stuck = claimed.into_iter().find(|c| c.entity.key == "stuck").expect("`stuck` comes due").entity;
    let mut c = commit(&stuck, Some("idle"), None, AfterCommit::Release);
    c.request_id = Some("r-stuck".into());
    c.telemetry.complete = true;
    assert!(write(&store, T0 + 60_001, vec![Op::Commit(Box::new(c))], false).await.results[0].is_ok());
    assert_eq!(outcome("r-stuck").await.as_deref(), Some("success"));
    super::fleet::counts_agree(&store, T0 + 60_001).await;
}
