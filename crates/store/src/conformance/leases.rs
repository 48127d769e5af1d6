//! Leases and due times: claims take due entities with their first inbox event, releases
//! never strand an event, expired leases move to another owner, renewals extend them, and an
//! auto action keeps its due time.

use serde_json::json;

use super::{OWNER, T0, claim_with_event, command, commit, create_one, get, new_entity, push, write};
use crate::{AfterCommit, Applied, Batch, Claim, Command, Fence, Op, OpError, Store};

/// Pushing to an unknown entity fails; pushing makes a dormant entity due, and a claim in
/// the same batch leases it and returns the first inbox event (FIFO).
pub async fn push_claim_fifo<S: Store>(store: S) {
    let e = create_one(&store, "a").await;
    let r = write(&store, T0, vec![Op::Push(push("nope", "go"))], false).await;
    assert_eq!(r.results[0], Err(OpError::NotFound { machine: "m".into(), key: "nope".into() }));
    let r = write(&store, T0 + 1, vec![Op::Push(push("a", "first")), Op::Push(push("a", "second"))], true).await;
    let Ok(Applied::Pushed { inbox_id, entity_id }) = r.results[0] else { panic!("{:?}", r.results[0]) };
    assert_eq!(entity_id, e.id);
    assert_eq!(r.claimed.len(), 1);
    let c = &r.claimed[0];
    assert_eq!(c.entity.lease_owner.as_deref(), Some(OWNER));
    assert_eq!(c.entity.lease_until, Some(T0 + 1 + 30_000));
    assert_eq!(c.entity.due_at, c.entity.lease_until, "a leased entity is due when its lease expires");
    let head = c.inbox_head.as_ref().expect("inbox head");
    assert_eq!((head.id, head.event.as_str(), &head.params), (inbox_id, "first", &json!({"n": 1})));
    assert_eq!(r.next_due, Some(T0 + 1 + 30_000));
    let again = write(&store, T0 + 2, vec![], true).await;
    assert!(again.claimed.is_empty(), "a leased entity is not claimed twice");
    assert_eq!(store.inbox_list(e.id).await.unwrap().len(), 2);
}

/// Releasing an entity whose inbox still holds events makes it due at once, so the claim
/// of the same batch takes it again; releasing with an empty inbox leaves it dormant or
/// due at the requested time.
pub async fn release_never_strands_events<S: Store>(store: S) {
    create_one(&store, "a").await;
    let r = write(&store, T0, vec![Op::Push(push("a", "one")), Op::Push(push("a", "two"))], true).await;
    let c = r.claimed[0].clone();
    let head = c.inbox_head.as_ref().unwrap().id;
    let cm = commit(&c.entity, Some("busy"), Some(head), AfterCommit::Release);
    let r = write(&store, T0 + 1, vec![Op::Commit(Box::new(cm))], true).await;
    assert_eq!(r.claimed.len(), 1, "still has an event: claimed again");
    let c = r.claimed[0].clone();
    assert_eq!(c.inbox_head.as_ref().unwrap().event.as_str(), "two");
    let mut cm = commit(&c.entity, Some("busy"), Some(c.inbox_head.unwrap().id), AfterCommit::Release);
    cm.auto_at = Some(T0 + 500);
    let r = write(&store, T0 + 2, vec![Op::Commit(Box::new(cm))], true).await;
    assert!(r.claimed.is_empty(), "not due before its time");
    assert_eq!(r.next_due, Some(T0 + 500));
    let e = get(&store, "a").await;
    assert_eq!((e.lease_owner.as_deref(), e.due_at), (None, Some(T0 + 500)));
    let r = write(&store, T0 + 500, vec![], true).await;
    assert_eq!(r.claimed.len(), 1, "due now");
    let c = r.claimed[0].clone();
    assert!(c.inbox_head.is_none());
    assert_eq!(c.entity.auto_at, Some(T0 + 500));
    let r = write(
        &store,
        T0 + 501,
        vec![Op::Commit(Box::new(commit(&c.entity, Some("idle"), None, AfterCommit::Release)))],
        true,
    )
    .await;
    assert!(r.claimed.is_empty());
    assert_eq!(r.next_due, None, "dormant entities have no due time");
    assert_eq!(get(&store, "a").await.due_at, None);
}

/// An expired lease can be claimed by another owner, after which the first owner's commit
/// is refused; renewal extends a lease and its due time.
pub async fn expired_leases_move_and_renewal_extends<S: Store>(store: S) {
    create_one(&store, "a").await;
    // The event's operation stays open while the entity works on it.
    let mut go = push("a", "go");
    go.operation =
        Some(crate::OpenOperation { request_id: "req-go".into(), name: "m.go".into(), dimensions: json!({}) });
    let r = write(&store, T0, vec![Op::Push(go)], true).await;
    let c = r.claimed[0].clone();
    let r = write(
        &store,
        T0 + 1,
        vec![Op::Renew { ids: vec![c.entity.id], owner: OWNER.into(), until: T0 + 60_000 }],
        false,
    )
    .await;
    assert_eq!(r.results[0], Ok(Applied::Renewed(1)));
    assert_eq!(get(&store, "a").await.due_at, Some(T0 + 60_000));
    let r = write(
        &store,
        T0 + 2,
        vec![Op::Renew { ids: vec![c.entity.id], owner: "engine-b".into(), until: T0 + 90_000 }],
        false,
    )
    .await;
    assert_eq!(r.results[0], Ok(Applied::Renewed(0)), "only the holder renews");
    let r = store
        .write(Batch {
            now: T0 + 60_001,
            ops: vec![],
            claim: Some(Claim { owner: "engine-b".into(), lease_ms: 30_000, limit: 10, machines: Vec::new() }),
        })
        .await
        .unwrap();
    assert_eq!(r.claimed.len(), 1, "expired lease is claimable");
    assert_eq!(r.claimed[0].entity.lease_owner.as_deref(), Some("engine-b"));
    let late = commit(&c.entity, Some("busy"), None, AfterCommit::Release);
    let r = write(&store, T0 + 60_002, vec![Op::Commit(Box::new(late))], false).await;
    assert_eq!(r.results[0], Err(OpError::LeaseLost { entity_id: c.entity.id }));
    // A leased entity paused meanwhile has no due time (it is in no due index): it is
    // released too.
    create_one(&store, "p").await;
    claim_with_event(&store, T0 + 60_002, "p").await;
    write(&store, T0 + 60_002, vec![command("p", Command::Pause)], false).await;
    let p = get(&store, "p").await;
    assert_eq!((p.lease_owner.is_some(), p.due_at), (true, None));
    let restarts = || async { store.operation_get("req-go").await.unwrap().expect("opened").restart_count };
    assert_eq!(restarts().await, 0);
    assert_eq!(store.lease_release_all(T0 + 60_003).await.unwrap(), 2);
    let e = get(&store, "a").await;
    assert_eq!((e.lease_owner, e.due_at), (None, Some(T0 + 60_003)));
    let p = get(&store, "p").await;
    assert_eq!((p.lease_owner, p.due_at), (None, None), "released, and still paused");
    // Leases dropped at a start: the engine that held them died with work in flight, and
    // the open operations count a restart; with none held, nothing restarted.
    assert_eq!(restarts().await, 1);
    assert_eq!(store.lease_release_all(T0 + 60_004).await.unwrap(), 0);
    assert_eq!(restarts().await, 1);
}

/// An entity waiting for its auto action keeps that due time through a rejection and a
/// plain release; a release by a stale holder is refused.
pub async fn auto_time_survives_events_and_release<S: Store>(store: S) {
    let r = write(&store, T0, vec![Op::Create(new_entity("a", "waiting", Some(T0 + 1_000)))], false).await;
    let Ok(Applied::Created(e)) = &r.results[0] else { panic!("{:?}", r.results[0]) };
    assert_eq!((e.auto_at, e.due_at), (Some(T0 + 1_000), Some(T0 + 1_000)));
    let r = write(&store, T0 + 1, vec![Op::Push(push("a", "poke"))], true).await;
    let c = r.claimed[0].clone();
    assert_eq!(c.entity.auto_at, Some(T0 + 1_000));
    let reject = commit(&c.entity, None, Some(c.inbox_head.unwrap().id), AfterCommit::Release);
    let r = write(&store, T0 + 2, vec![Op::Commit(Box::new(reject))], true).await;
    assert!(r.claimed.is_empty());
    assert_eq!(get(&store, "a").await.due_at, Some(T0 + 1_000), "the auto action is still due");
    let r = write(&store, T0 + 1_000, vec![], true).await;
    let c = r.claimed[0].clone();
    let mut stale = Fence { entity_id: c.entity.id, version: c.entity.version, owner: "engine-b".into() };
    let r = write(&store, T0 + 1_001, vec![Op::Release(stale.clone())], false).await;
    assert_eq!(r.results[0], Err(OpError::LeaseLost { entity_id: c.entity.id }));
    stale.owner = OWNER.into();
    let r = write(&store, T0 + 1_002, vec![Op::Release(stale)], false).await;
    assert_eq!(r.results[0], Ok(Applied::Released));
    let e = get(&store, "a").await;
    assert_eq!((e.lease_owner, e.due_at), (None, Some(T0 + 1_000)));
}
