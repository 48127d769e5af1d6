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
    go.operation = Some(crate::OpenOperation {
        request_id: "req-go".into(),
        name: "m.go".into(),
        dimensions: json!({}),
        priority: 0,
    });
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
        .write(Batch { now: T0 + 60_001, ops: vec![], claim: Some(Claim::new("engine-b", 30_000, 10)) })
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

/// A claim that takes what its batch creates leases each new entity due at once (an auto
/// action, nothing queued) as it is inserted, within its limit, and claims older due work
/// with the rest; a taken entity's lease is real (its holder's commit is accepted). Without
/// `take_created`, or for a machine the claim does not serve, a new entity is inserted free.
pub async fn a_claim_takes_the_entities_its_batch_creates<S: Store>(store: S) {
    create_one(&store, "p").await;
    let (p, go) = claim_with_event(&store, T0, "p").await;
    write(&store, T0, vec![Op::Create(new_entity("old", "waiting", Some(T0 + 5)))], false).await;
    let claim = |limit, take_created, machines: Vec<String>| {
        Some(Claim { owner: OWNER.into(), lease_ms: 30_000, limit, machines, take_created, take_raised: false })
    };
    let mut spawn = commit(&p, Some("busy"), Some(go.id), AfterCommit::Release);
    spawn.creates = vec![
        new_entity("k1", "working", Some(T0 + 10)),
        new_entity("k2", "working", Some(T0 + 10)),
        new_entity("k3", "idle", None),
    ];
    let ops = vec![Op::Commit(Box::new(spawn)), Op::Create(new_entity("c4", "working", Some(T0 + 10)))];
    let r = store.write(Batch { now: T0 + 10, ops, claim: claim(4, true, Vec::new()) }).await.unwrap();
    assert!(r.results.iter().all(|r| r.is_ok()), "{:?}", r.results);
    let keys: Vec<&str> = r.claimed.iter().map(|c| c.entity.key.as_str()).collect();
    assert_eq!(keys, ["old", "k1", "k2", "c4"], "the older due entity with the limit's rest, then those created");
    let until = T0 + 10 + 30_000;
    for c in &r.claimed {
        assert_eq!(
            (c.entity.lease_owner.as_deref(), c.entity.lease_until, c.entity.due_at),
            (Some(OWNER), Some(until), Some(until))
        );
        let stored = get(&store, c.entity.key.as_str()).await;
        assert_eq!(stored, c.entity, "the claimed row is the row stored");
    }
    let Ok(Applied::Created(c4)) = &r.results[1] else { panic!("{:?}", r.results[1]) };
    assert_eq!(c4.lease_owner.as_deref(), Some(OWNER), "a create answers the row as written");
    let k3 = get(&store, "k3").await;
    assert_eq!((k3.lease_owner, k3.due_at), (None, None), "an entity at rest is not taken");
    assert_eq!(r.next_due, Some(until));
    let k1 = r.claimed[1].entity.clone();
    let done = commit(&k1, Some("done"), None, AfterCommit::Release);
    let r = write(&store, T0 + 11, vec![Op::Commit(Box::new(done))], false).await;
    assert!(r.results[0].is_ok(), "the holder of a taken entity commits: {:?}", r.results[0]);
    // Room for one: the first new entity due is taken, the next inserted free and claimed
    // by a later batch.
    let ops = vec![
        Op::Create(new_entity("c5", "working", Some(T0 + 12))),
        Op::Create(new_entity("c6", "working", Some(T0 + 12))),
    ];
    let r = store.write(Batch { now: T0 + 12, ops, claim: claim(1, true, Vec::new()) }).await.unwrap();
    assert_eq!(r.claimed.iter().map(|c| c.entity.key.as_str()).collect::<Vec<_>>(), ["c5"]);
    let c6 = get(&store, "c6").await;
    assert_eq!((c6.lease_owner, c6.due_at), (None, Some(T0 + 12)));
    for (take_created, machines) in [(false, Vec::new()), (true, vec!["other".to_string()])] {
        let key = format!("c7-{take_created}");
        let ops = vec![Op::Create(new_entity(&key, "working", Some(T0 + 13)))];
        let r =
            store.write(Batch { now: T0 + 13, ops, claim: claim(10, take_created, machines.clone()) }).await.unwrap();
        let Ok(Applied::Created(e)) = &r.results[0] else { panic!("{:?}", r.results[0]) };
        assert_eq!(
            (e.lease_owner.as_deref(), e.due_at),
            (None, Some(T0 + 13)),
            "inserted free: {take_created} {machines:?}"
        );
        let claimed: Vec<&str> = r.claimed.iter().map(|c| c.entity.key.as_str()).collect();
        let expected: &[&str] = if machines.is_empty() { &["c6", "c7-false"] } else { &[] };
        assert_eq!(claimed, expected, "claimed as any due entity would be");
    }
}

/// A claim that takes what its batch raises on leases each entity at rest that the batch
/// gives an event (SQLite, as it writes the event; PostgreSQL's claim takes it in the same
/// batch): the batch answers it leased, its row as stored, with the first event it was
/// given at its inbox's head, and a later claim finds nothing left. An entity that had an
/// event queued before is claimed with that older event first. Within the claim's limit:
/// what does not fit stays due and free for the next claim. A taken entity's lease is real.
pub async fn a_claim_takes_the_entities_its_batch_raises_on<S: Store>(store: S) {
    let claim = |limit| Some(Claim { take_raised: true, ..Claim::new(OWNER, 30_000, limit) });
    for key in ["r1", "r2", "q1", "r3", "r4"] {
        create_one(&store, key).await;
    }
    // q1's first event waits (a batch without a claim).
    write(&store, T0 + 1, vec![Op::Push(push("q1", "first"))], false).await;
    let ops = vec![
        Op::Push(push("r1", "go")),
        Op::Push(push("r2", "go")),
        Op::Push(push("q1", "second")),
        Op::Push(push("r1", "again")),
    ];
    let r = store.write(Batch { now: T0 + 2, ops, claim: claim(10) }).await.unwrap();
    let pushed: Vec<i64> = r
        .results
        .iter()
        .map(|a| match a {
            Ok(Applied::Pushed { inbox_id, .. }) => *inbox_id,
            other => panic!("{other:?}"),
        })
        .collect();
    let mut heads: Vec<(&str, &str)> = r
        .claimed
        .iter()
        .map(|c| (c.entity.key.as_str(), c.inbox_head.as_ref().expect("a head").event.as_str()))
        .collect();
    heads.sort_unstable();
    assert_eq!(heads, [("q1", "first"), ("r1", "go"), ("r2", "go")], "each with its oldest event");
    let until = T0 + 2 + 30_000;
    for c in &r.claimed {
        assert_eq!(
            (c.entity.lease_owner.as_deref(), c.entity.lease_until, c.entity.due_at),
            (Some(OWNER), Some(until), Some(until)),
            "{}",
            c.entity.key
        );
        assert_eq!(get(&store, c.entity.key.as_str()).await, c.entity, "the claimed row is the row stored");
        assert!(c.trigger.is_none(), "at rest before: no workflow");
    }
    let r1 = r.claimed.iter().find(|c| c.entity.key == "r1").expect("r1");
    assert_eq!(r1.inbox_head.as_ref().map(|h| h.id), Some(pushed[0]), "the head is the event as stored");
    assert!(write(&store, T0 + 3, vec![], true).await.claimed.is_empty(), "nothing left to claim");
    let done = commit(&r1.entity, Some("busy"), Some(pushed[0]), AfterCommit::Release);
    let after = write(&store, T0 + 4, vec![Op::Commit(Box::new(done))], false).await;
    assert!(after.results[0].is_ok(), "the holder of a taken entity commits: {:?}", after.results[0]);
    assert_eq!(get(&store, "r1").await.due_at, Some(T0 + 4), "its other event keeps it due");

    // Room for two, three due (r1 since its commit, r3 and r4 raised on now): two are
    // leased (SQLite takes those raised on before older due work, as a batch's creates;
    // PostgreSQL's claim the oldest due first), the third stays due and free for the next.
    let ops = vec![Op::Push(push("r3", "go")), Op::Push(push("r4", "go"))];
    let r = store.write(Batch { now: T0 + 5, ops, claim: claim(2) }).await.unwrap();
    let taken: Vec<&str> = r.claimed.iter().map(|c| c.entity.key.as_str()).collect();
    assert_eq!(taken.len(), 2, "{taken:?}");
    let left = ["r1", "r3", "r4"].into_iter().find(|k| !taken.contains(k)).expect("one left");
    let e = get(&store, left).await;
    assert_eq!(e.lease_owner, None, "{left} not taken");
    assert!(e.due_at.is_some_and(|at| at <= T0 + 5), "{left} still due: {:?}", e.due_at);
    let later = write(&store, T0 + 6, vec![], true).await;
    assert_eq!(later.claimed.iter().map(|c| c.entity.key.as_str()).collect::<Vec<_>>(), [left]);
}
