//! The conformance suite every [`Store`] implementation must pass.
//!
//! Each check is a public async function over a fresh, empty store. A backend's test file
//! instantiates them all with [`store_conformance_suite!`](crate::store_conformance_suite),
//! the way Quickwit's metastore suite does, so a second backend runs exactly the same
//! assertions.

use serde_json::{Value, json};
use settle_core::{ActionName, EntityKey, EventName, MachineName, Properties, StateName};

use crate::{
    AfterCommit, AgentReport, AgentTask, Applied, Batch, BatchResult, Claim, Command, Commit, EntityFilter, EntityRow,
    ErrorRecord, EventRecord, Fence, HistoryKind, InboxItem, InboxKind, Millis, NewEntity, Op, OpError, OpenOperation,
    Push, RunStatus, SqlStatement, Stats, Store, TaskFilter, TaskOffer, TaskResult, Telemetry, TimerPlan,
    TransitionRecord,
};

/// The SQL dialect details the suite needs from a backend.
#[derive(Debug, Clone, Copy)]
pub struct Dialect {
    /// Creates the application table `widgets (name TEXT PRIMARY KEY)`.
    pub create_widgets: &'static str,
    /// Inserts one widget; its one parameter is the name.
    pub insert_widget: &'static str,
}

const OWNER: &str = "engine-a";
const T0: Millis = 1_000_000;

fn new_entity(key: &str, state: &str, auto_at: Option<Millis>) -> NewEntity {
    NewEntity {
        machine: MachineName::new("m"),
        key: EntityKey::new(key),
        state: StateName::new(state),
        properties: Properties::new(),
        auto_at,
        request_id: Some("req-1".into()),
        timers: Vec::new(),
        notify_self: false,
        operation: None,
        machine_hash: None,
        health: "ok",
        offer: None,
    }
}

fn push(key: &str, event: &str) -> Push {
    Push {
        machine: MachineName::new("m"),
        key: EntityKey::new(key),
        event: EventName::new(event),
        params: json!({"n": 1}),
        request_id: Some(format!("req-{event}")),
        kind: InboxKind::Raised,
        join_from: None,
        operation: None,
    }
}

fn commit(entity: &EntityRow, to: Option<&str>, consume: Option<i64>, after: AfterCommit) -> Commit {
    let fence = Fence { entity_id: entity.id, version: entity.version, owner: OWNER.into() };
    let kind = if to.is_some() { HistoryKind::Event } else { HistoryKind::Rejected };
    Commit {
        to: to.map(StateName::new),
        action: to.map(|_| ActionName::new("go")),
        event: Some(EventName::new("go")),
        consume,
        request_id: Some("req-go".into()),
        ..Commit::new(fence, entity.state.clone(), kind, after)
    }
}

async fn write<S: Store>(store: &S, now: Millis, ops: Vec<Op>, claim: bool) -> BatchResult {
    let claim = claim.then(|| Claim { owner: OWNER.into(), lease_ms: 30_000, limit: 100, machines: Vec::new() });
    store.write(Batch { now, ops, claim }).await.expect("batch commits")
}

async fn get<S: Store>(store: &S, key: &str) -> EntityRow {
    store.entity_get("m", key).await.expect("read").expect("entity exists")
}

async fn create_one<S: Store>(store: &S, key: &str) -> EntityRow {
    let r = write(store, T0, vec![Op::Create(new_entity(key, "idle", None))], false).await;
    match &r.results[0] {
        Ok(Applied::Created(e)) => e.clone(),
        other => panic!("create failed: {other:?}"),
    }
}

/// Creating an entity stores it at version 1 with a `create` history row; a duplicate
/// key fails alone without disturbing the other operations of its batch.
pub async fn create_get_and_duplicate<S: Store>(store: S) {
    let e = create_one(&store, "a").await;
    assert_eq!((e.version, e.state.as_str(), e.due_at), (1, "idle", None));
    let got = get(&store, "a").await;
    assert_eq!(got, e);
    let r = write(
        &store,
        T0,
        vec![Op::Create(new_entity("a", "idle", None)), Op::Create(new_entity("b", "idle", None))],
        false,
    )
    .await;
    assert_eq!(r.results[0], Err(OpError::AlreadyExists { machine: "m".into(), key: "a".into() }));
    assert!(r.results[1].is_ok());
    let h = store.history_list(e.id).await.unwrap();
    assert_eq!(h.len(), 1);
    assert_eq!((h[0].kind, h[0].from.clone(), h[0].to.as_deref()), (HistoryKind::Create, None, Some("idle")));
    assert_eq!(h[0].request_id.as_deref(), Some("req-1"));
    assert!(store.entity_get("m", "zzz").await.unwrap().is_none());
}

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

/// A commit moves state, bumps the version, consumes the inbox item, appends history, and
/// (when holding the lease) reports the next inbox event.
pub async fn commit_applies_and_reports_head<S: Store>(store: S) {
    create_one(&store, "a").await;
    let r = write(&store, T0, vec![Op::Push(push("a", "one")), Op::Push(push("a", "two"))], true).await;
    let c = r.claimed[0].clone();
    let mut cm = commit(&c.entity, Some("busy"), Some(c.inbox_head.as_ref().unwrap().id), AfterCommit::Hold);
    let mut props = Properties::new();
    props.insert("endpoint".into(), json!("10.0.0.1"));
    cm.properties = Some(props.clone());
    let r = write(&store, T0 + 10, vec![Op::Commit(Box::new(cm))], false).await;
    let Ok(Applied::Committed { version, inbox_head: Some(next), .. }) = &r.results[0] else {
        panic!("{:?}", r.results[0])
    };
    assert_eq!(*version, 2);
    assert_eq!(next.event.as_str(), "two");
    let e = get(&store, "a").await;
    assert_eq!((e.state.as_str(), e.version, e.entered_at), ("busy", 2, T0 + 10));
    assert_eq!(e.properties, props);
    assert_eq!(
        (e.lease_until, e.due_at),
        (Some(T0 + 30_000), Some(T0 + 30_000)),
        "holding keeps the claimed lease time (renewals extend it)"
    );
    let h = store.history_list(e.id).await.unwrap();
    let last = h.last().unwrap();
    assert_eq!((last.from.as_deref(), last.to.as_deref(), last.kind), (Some("idle"), Some("busy"), HistoryKind::Event));
    assert_eq!((last.event.as_deref(), last.action.as_deref(), last.at), (Some("go"), Some("go"), T0 + 10));
    assert_eq!(store.inbox_list(e.id).await.unwrap().len(), 1);
}

/// A commit with a stale version or by another owner fails and changes nothing.
pub async fn commit_is_fenced<S: Store>(store: S) {
    create_one(&store, "a").await;
    let r = write(&store, T0, vec![Op::Push(push("a", "one"))], true).await;
    let c = r.claimed[0].clone();
    let mut stale = commit(&c.entity, Some("busy"), None, AfterCommit::Release);
    stale.fence.version -= 1;
    let mut stranger = commit(&c.entity, Some("busy"), None, AfterCommit::Release);
    stranger.fence.owner = "engine-b".into();
    let r = write(&store, T0 + 1, vec![Op::Commit(Box::new(stale)), Op::Commit(Box::new(stranger))], false).await;
    for res in &r.results {
        assert_eq!(res, &Err(OpError::LeaseLost { entity_id: c.entity.id }));
    }
    let e = get(&store, "a").await;
    assert_eq!((e.state.as_str(), e.version), ("idle", 1));
    assert_eq!(store.history_list(e.id).await.unwrap().len(), 1);
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

/// A commit with no state change (a rejection) consumes the event, records it, and keeps
/// state and version.
pub async fn rejection_keeps_version<S: Store>(store: S) {
    create_one(&store, "a").await;
    let r = write(&store, T0, vec![Op::Push(push("a", "bad"))], true).await;
    let c = r.claimed[0].clone();
    let mut cm = commit(&c.entity, None, Some(c.inbox_head.unwrap().id), AfterCommit::Release);
    cm.detail = Some("already in progress".into());
    let r = write(&store, T0 + 1, vec![Op::Commit(Box::new(cm))], false).await;
    assert!(matches!(r.results[0], Ok(Applied::Committed { version: 1, .. })));
    let e = get(&store, "a").await;
    assert_eq!((e.state.as_str(), e.version, e.lease_owner.as_deref(), e.due_at), ("idle", 1, None, None));
    let h = store.history_list(e.id).await.unwrap();
    let last = h.last().unwrap();
    assert_eq!(
        (last.kind, last.to.as_ref(), last.detail.as_deref()),
        (HistoryKind::Rejected, None, Some("already in progress"))
    );
    assert!(store.inbox_list(e.id).await.unwrap().is_empty());
}

/// Effects commit atomically with the transition: SQL, created entities and pushed events.
/// If any effect fails, nothing of the commit is visible and the rest of the batch lands.
pub async fn effects_are_atomic<S: Store>(store: S, dialect: Dialect) {
    store.sql_execute(dialect.create_widgets).await.unwrap();
    create_one(&store, "a").await;
    create_one(&store, "target").await;
    let r = write(&store, T0, vec![Op::Push(push("a", "go"))], true).await;
    let c = r.claimed[0].clone();
    let base = commit(&c.entity, Some("busy"), Some(c.inbox_head.as_ref().unwrap().id), AfterCommit::Release);
    let sql = |name: &str| SqlStatement { sql: dialect.insert_widget.into(), params: vec![Value::from(name)] };
    // Fails: the second insert violates the primary key.
    let mut bad = base.clone();
    bad.sql = vec![sql("w1"), sql("w1")];
    bad.creates = vec![new_entity("child", "idle", Some(T0))];
    bad.pushes = vec![push("target", "hello")];
    // Fails: pushes to an entity that does not exist.
    let mut bad_push = base.clone();
    bad_push.sql = vec![sql("w2")];
    bad_push.pushes = vec![push("missing", "hello")];
    let r = write(
        &store,
        T0 + 1,
        vec![Op::Commit(Box::new(bad)), Op::Commit(Box::new(bad_push)), Op::Create(new_entity("other", "idle", None))],
        false,
    )
    .await;
    assert!(matches!(&r.results[0], Err(OpError::Sql { index: 1, .. })), "{:?}", r.results[0]);
    assert!(matches!(&r.results[1], Err(OpError::NotFound { .. })), "{:?}", r.results[1]);
    assert!(r.results[2].is_ok(), "other operations of the batch still apply");
    let e = get(&store, "a").await;
    assert_eq!((e.state.as_str(), e.version), ("idle", 1));
    assert!(store.entity_get("m", "child").await.unwrap().is_none());
    let target = get(&store, "target").await;
    assert!(store.inbox_list(target.id).await.unwrap().is_empty());
    assert_eq!(store.inbox_list(e.id).await.unwrap().len(), 1, "the event was not consumed");
    assert_eq!(store.history_list(e.id).await.unwrap().len(), 1);
    // Succeeds: everything lands together.
    let mut good = base.clone();
    good.sql = vec![sql("w1"), sql("w2")];
    good.creates = vec![new_entity("child", "idle", Some(T0))];
    good.pushes = vec![push("target", "hello")];
    let r = write(&store, T0 + 2, vec![Op::Commit(Box::new(good))], false).await;
    let Ok(Applied::Committed { created, .. }) = &r.results[0] else { panic!("{:?}", r.results[0]) };
    assert_eq!(created.len(), 1);
    assert_eq!(get(&store, "a").await.state.as_str(), "busy");
    assert_eq!(get(&store, "child").await.due_at, Some(T0));
    assert_eq!(store.inbox_list(target.id).await.unwrap()[0].event.as_str(), "hello");
    assert_eq!(get(&store, "target").await.due_at, Some(T0 + 2));
}

/// An expired lease can be claimed by another owner, after which the first owner's commit
/// is refused; renewal extends a lease and its due time.
pub async fn expired_leases_move_and_renewal_extends<S: Store>(store: S) {
    create_one(&store, "a").await;
    let r = write(&store, T0, vec![Op::Push(push("a", "go"))], true).await;
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
    assert_eq!(store.lease_release_all(T0 + 60_003).await.unwrap(), 1);
    let e = get(&store, "a").await;
    assert_eq!((e.lease_owner, e.due_at), (None, Some(T0 + 60_003)));
}

/// Listing filters by machine and state with a cursor; counts group by state; machine
/// definitions and metadata round-trip.
pub async fn listing_counts_and_metadata<S: Store>(store: S) {
    let ops =
        (0..5).map(|i| Op::Create(new_entity(&format!("k{i}"), if i < 3 { "idle" } else { "done" }, None))).collect();
    write(&store, T0, ops, false).await;
    let mut other = new_entity("x", "idle", Some(T0));
    other.machine = MachineName::new("n");
    write(&store, T0, vec![Op::Create(other)], false).await;
    let all = store.entity_list(EntityFilter::default()).await.unwrap();
    assert_eq!(all.len(), 6);
    let idle = store
        .entity_list(EntityFilter { machine: Some("m".into()), state: Some("idle".into()), ..Default::default() })
        .await
        .unwrap();
    assert_eq!(idle.iter().map(|e| e.key.as_str()).collect::<Vec<_>>(), ["k0", "k1", "k2"]);
    let page = store
        .entity_list(EntityFilter {
            machine: Some("m".into()),
            after_id: Some(idle[0].id),
            limit: Some(2),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(page.iter().map(|e| e.key.as_str()).collect::<Vec<_>>(), ["k1", "k2"]);
    assert_eq!(store.entity_count_by_state("m").await.unwrap(), vec![("done".to_string(), 2), ("idle".to_string(), 3)]);
    assert_eq!(store.entity_count_pending().await.unwrap(), 1);
    store.machine_put("m", "abc", "{}", T0).await.unwrap();
    store.machine_put("m", "abc", "{}", T0 + 1).await.unwrap();
    store.machine_put("m", "def", "{\"v\":2}", T0 + 2).await.unwrap();
    let machines = store.machine_list().await.unwrap();
    assert_eq!(
        machines.iter().map(|m| (m.hash.as_str(), m.created_at)).collect::<Vec<_>>(),
        [("abc", T0), ("def", T0 + 2)]
    );
    assert_eq!(store.meta_get("demo").await.unwrap(), None);
    store.meta_put("demo", "1").await.unwrap();
    store.meta_put("demo", "2").await.unwrap();
    assert_eq!(store.meta_get("demo").await.unwrap().as_deref(), Some("2"));
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

/// Claims `key` by pushing an event to it; returns the claimed entity and that event.
async fn claim_with_event<S: Store>(store: &S, now: Millis, key: &str) -> (EntityRow, InboxItem) {
    let r = write(store, now, vec![Op::Push(push(key, "go"))], true).await;
    let c = r.claimed.into_iter().find(|c| c.entity.key == key).expect("claimed");
    (c.entity, c.inbox_head.expect("head"))
}

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
}

/// Timers are rows: set with a state entry, fired into the inbox by a claim when due
/// (one-shot deleted, periodic rescheduled), kept or restarted as planned, and deleted
/// when a commit's plan no longer lists them.
pub async fn timers_fire_through_the_inbox<S: Store>(store: S) {
    create_one(&store, "a").await;
    let (e, ev) = claim_with_event(&store, T0, "a").await;
    let plan = |name: &str, due: Millis, every: Option<i64>, restart: bool| TimerPlan {
        name: name.into(),
        event: EventName::new(name),
        due_at: due,
        every_ms: every,
        restart,
    };
    let mut c = commit(&e, Some("ready"), Some(ev.id), AfterCommit::Release);
    c.timers = Some(vec![plan("deadline", T0 + 100, None, true), plan("check", T0 + 50, Some(50), true)]);
    write(&store, T0 + 1, vec![Op::Commit(Box::new(c))], false).await;
    let e = get(&store, "a").await;
    assert_eq!((e.timer_at, e.due_at), (Some(T0 + 50), Some(T0 + 50)));
    let r = write(&store, T0 + 49, vec![], true).await;
    assert!(r.claimed.is_empty());
    let r = write(&store, T0 + 100, vec![], true).await;
    assert_eq!(r.claimed.len(), 1);
    let mut events: Vec<_> =
        store.inbox_list(e.id).await.unwrap().iter().map(|i| (i.kind, i.event.to_string())).collect();
    events.sort_by(|a, b| a.1.cmp(&b.1));
    assert_eq!(events, [(InboxKind::Timer, "check".to_string()), (InboxKind::Timer, "deadline".to_string())]);
    let timers = store.timer_list(e.id).await.unwrap();
    assert_eq!(timers.len(), 1, "the one-shot timer is gone");
    assert_eq!((timers[0].name.as_str(), timers[0].due_at), ("check", T0 + 101));
    // A plan that keeps `check` (no restart) and drops everything else.
    let c = r.claimed[0].entity.clone();
    let mut cm = commit(&c, Some("ready"), None, AfterCommit::Release);
    cm.timers = Some(vec![plan("check", T0 + 9_999, Some(50), false)]);
    write(&store, T0 + 101, vec![Op::Commit(Box::new(cm))], false).await;
    assert_eq!(store.timer_list(e.id).await.unwrap()[0].due_at, T0 + 101, "kept its schedule");
    let (c, _) = claim_with_event(&store, T0 + 102, "a").await;
    let mut cm = commit(&c, Some("gone"), None, AfterCommit::Release);
    cm.timers = Some(vec![]);
    write(&store, T0 + 103, vec![Op::Commit(Box::new(cm))], false).await;
    assert!(store.timer_list(e.id).await.unwrap().is_empty(), "leaving the state deletes its timers");
    assert_eq!(get(&store, "a").await.timer_at, None);
}

/// A commit whose entity read "with lock" changed fails whole; fired subscriptions are
/// stored with the entry and reset on request.
pub async fn preconditions_and_fired<S: Store>(store: S) {
    create_one(&store, "a").await;
    let other = create_one(&store, "b").await;
    let (e, ev) = claim_with_event(&store, T0, "a").await;
    let mut stale = commit(&e, Some("busy"), Some(ev.id), AfterCommit::Release);
    stale.preconditions = vec![(other.id, other.version + 1)];
    let r = write(&store, T0 + 1, vec![Op::Commit(Box::new(stale))], false).await;
    assert_eq!(
        r.results[0],
        Err(OpError::Precondition { entity_id: other.id, expected: other.version + 1, found: other.version })
    );
    assert_eq!(get(&store, "a").await.version, 1);
    let mut ok = commit(&e, Some("busy"), Some(ev.id), AfterCommit::Release);
    ok.preconditions = vec![(other.id, other.version)];
    ok.fired = Some(vec![EventName::new("all_ready")]);
    let r = write(&store, T0 + 2, vec![Op::Commit(Box::new(ok))], false).await;
    assert!(r.results[0].is_ok(), "{:?}", r.results[0]);
    assert_eq!(get(&store, "a").await.fired, [EventName::new("all_ready")]);
}

fn open_op(request_id: &str, name: &str) -> Option<OpenOperation> {
    Some(OpenOperation { request_id: request_id.into(), name: name.into(), dimensions: json!({}) })
}

/// One step of a workflow with its telemetry: from `e`'s state to `to` (`None`: nothing
/// entered), at the lease holder's version `version`.
struct Step<'a> {
    e: &'a EntityRow,
    version: i64,
    to: Option<&'a str>,
    kind: HistoryKind,
    retry: u32,
    request_id: &'a str,
    /// The inbox event processed (with when it was raised), else the event whose workflow runs.
    event: Option<(&'a InboxItem, &'static str)>,
    current_event: Option<i64>,
    outcome: &'static str,
    error: Option<&'a str>,
    at_rest: bool,
    after: AfterCommit,
}

impl Step<'_> {
    fn commit(&self, from: &str) -> Commit {
        let fence = Fence { entity_id: self.e.id, version: self.version, owner: OWNER.into() };
        let event = self.event.map(|(item, kind)| EventRecord {
            kind,
            seq: item.id,
            raised_at: item.created_at,
            rejected: self.kind == HistoryKind::Rejected,
            failed: self.kind == HistoryKind::Fault,
        });
        Commit {
            to: self.to.map(StateName::new),
            retry: self.retry,
            // A workflow step leaves the entity with an auto action to run (busy).
            auto_at: (self.to.is_some() && !self.at_rest).then_some(T0 + 10_000),
            event: self.event.map(|(item, _)| item.event.clone()),
            consume: self.event.map(|(item, _)| item.id),
            request_id: Some(self.request_id.into()),
            detail: self.error.map(String::from),
            telemetry: Telemetry {
                event,
                transition: self.to.map(|_| TransitionRecord {
                    kind: if self.event.is_some() { "event" } else { "auto_action" },
                    start_health: Some("ok"),
                    end_health: "ok",
                    entry_time: T0,
                    start_time: T0,
                    action_start_time: None,
                    outcome: self.outcome,
                }),
                error: self.error.map(|d| ErrorRecord { kind: "action_error", details: d.into(), exception: None }),
                at_rest: self.at_rest,
                complete: true,
                current_event: self.current_event,
            },
            ..Commit::new(fence, StateName::new(from), self.kind, self.after)
        }
    }
}

/// Writes a small history through batches only: operations (two creates, a workflow with a
/// retry, a failed event, one left open), a workflow whose errors park its entity, a paused
/// entity, a rejected event and an entity due soon. Returns the ids of `a`, `b`, `c`, `d`.
async fn telemetry_fixture<S: Store>(store: &S) -> [i64; 4] {
    let mut a = new_entity("a", "idle", None);
    a.operation = open_op("op-a", "m.create");
    a.request_id = Some("op-a".into());
    let mut b = new_entity("b", "idle", None);
    b.operation = open_op("op-b", "m.create");
    b.request_id = Some("op-b".into());
    let c = new_entity("c", "idle", None);
    let r = write(store, T0, vec![Op::Create(a), Op::Create(b), Op::Create(c)], false).await;
    assert!(r.results.iter().all(|r| r.is_ok()), "{r:?}");
    // a: op-go raised at T0+1; idle → busy, a retry, → done at T0+201 (success, 200 ms).
    let mut go = push("a", "go");
    go.request_id = Some("op-go".into());
    go.operation = open_op("op-go", "m.go");
    let r = write(store, T0 + 1, vec![Op::Push(go)], true).await;
    let (e, item) = (r.claimed[0].entity.clone(), r.claimed[0].inbox_head.clone().expect("head"));
    let base = Step {
        e: &e,
        version: e.version,
        to: Some("busy"),
        kind: HistoryKind::Event,
        retry: 0,
        request_id: "op-go",
        event: Some((&item, "raised")),
        current_event: None,
        outcome: "ok",
        error: None,
        at_rest: false,
        after: AfterCommit::Hold,
    };
    let retry = Step {
        version: e.version + 1,
        kind: HistoryKind::Auto,
        retry: 1,
        event: None,
        current_event: Some(item.id),
        outcome: "retry",
        ..base
    };
    for (now, c) in [(T0 + 101, base.commit("idle")), (T0 + 150, retry.commit("busy"))] {
        let r = write(store, now, vec![Op::Commit(Box::new(c))], false).await;
        assert!(r.results[0].is_ok(), "{:?}", r.results[0]);
    }
    let done = Step {
        e: &e,
        version: e.version + 2,
        to: Some("done"),
        kind: HistoryKind::Auto,
        retry: 0,
        request_id: "op-go",
        event: None,
        current_event: Some(item.id),
        outcome: "ok",
        error: None,
        at_rest: true,
        after: AfterCommit::Release,
    };
    let r = write(store, T0 + 201, vec![Op::Commit(Box::new(done.commit("busy")))], false).await;
    assert!(r.results[0].is_ok(), "{:?}", r.results[0]);
    // b: op-boom raised at T0+300 fails at T0+400 (failed, 100 ms).
    let mut boom = push("b", "boom");
    boom.request_id = Some("op-boom".into());
    boom.operation = open_op("op-boom", "m.go");
    let r = write(store, T0 + 300, vec![Op::Push(boom)], true).await;
    let (eb, item) = (r.claimed[0].entity.clone(), r.claimed[0].inbox_head.clone().expect("head"));
    let fault = Step {
        e: &eb,
        version: eb.version,
        to: None,
        kind: HistoryKind::Fault,
        retry: 0,
        request_id: "op-boom",
        event: Some((&item, "raised")),
        current_event: None,
        outcome: "error",
        error: Some("provider down"),
        at_rest: true,
        after: AfterCommit::Release,
    };
    let mut cm = fault.commit("idle");
    cm.action = Some(ActionName::new("go"));
    let r = write(store, T0 + 400, vec![Op::Commit(Box::new(cm))], false).await;
    assert!(r.results[0].is_ok(), "{:?}", r.results[0]);
    // c (no operation): idle → busy at T0+650, two errors (T0+700, T0+800), then parked.
    let mut go = push("c", "go");
    go.request_id = Some("req-c".into());
    let r = write(store, T0 + 600, vec![Op::Push(go)], true).await;
    let (ec, item) = (r.claimed[0].entity.clone(), r.claimed[0].inbox_head.clone().expect("head"));
    let first = Step {
        e: &ec,
        version: ec.version,
        to: Some("busy"),
        kind: HistoryKind::Event,
        retry: 0,
        request_id: "req-c",
        event: Some((&item, "raised")),
        current_event: None,
        outcome: "ok",
        error: None,
        at_rest: false,
        after: AfterCommit::Hold,
    };
    let err1 = Step {
        version: ec.version + 1,
        kind: HistoryKind::Auto,
        retry: 1,
        event: None,
        current_event: Some(item.id),
        outcome: "error",
        error: Some("provider down"),
        ..first
    };
    let mut park = Step { version: ec.version + 2, retry: 2, error: Some("rate limited"), ..err1 }.commit("busy");
    park.run_status = Some((RunStatus::Failed, None));
    park.after = AfterCommit::Release;
    for (now, c) in [(T0 + 650, first.commit("idle")), (T0 + 700, err1.commit("busy")), (T0 + 800, park)] {
        let r = write(store, now, vec![Op::Commit(Box::new(c))], false).await;
        assert!(r.results[0].is_ok(), "{:?}", r.results[0]);
    }
    // op-open queued on b at T0+850 stays open; b is paused.
    let mut open = push("b", "go");
    open.request_id = Some("op-open".into());
    open.operation = open_op("op-open", "m.go");
    let pause = Op::Command {
        machine: MachineName::new("m"),
        key: EntityKey::new("b"),
        command: Command::Pause,
        operation: None,
    };
    let r = write(store, T0 + 850, vec![Op::Push(open), pause], false).await;
    assert!(r.results.iter().all(|r| r.is_ok()), "{r:?}");
    // a rejects `bad` at T0+901.
    let r = write(store, T0 + 900, vec![Op::Push(push("a", "bad"))], true).await;
    assert_eq!(r.claimed.len(), 1, "only a is due");
    let (ea, item) = (r.claimed[0].entity.clone(), r.claimed[0].inbox_head.clone().expect("head"));
    let reject = Step {
        e: &ea,
        version: ea.version,
        to: None,
        kind: HistoryKind::Rejected,
        retry: 0,
        request_id: "req-bad",
        event: Some((&item, "raised")),
        current_event: None,
        outcome: "ok",
        error: None,
        at_rest: true,
        after: AfterCommit::Release,
    };
    let r = write(store, T0 + 901, vec![Op::Commit(Box::new(reject.commit("done")))], false).await;
    assert!(r.results[0].is_ok(), "{:?}", r.results[0]);
    // d: due at T0+960.
    let r = write(store, T0 + 950, vec![Op::Create(new_entity("d", "waiting", Some(T0 + 960)))], false).await;
    let Ok(Applied::Created(d)) = &r.results[0] else { panic!("{:?}", r.results[0]) };
    [e.id, eb.id, ec.id, d.id]
}

fn approx(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

fn transition_stats(machine: &str, from: Option<&str>, to: &str, count: u64) -> (String, Option<String>, String, u64) {
    (machine.into(), from.map(String::from), to.into(), count)
}

/// An entity's processed events are listed oldest first with their request ids, states,
/// outcomes and errors; an event ends when its workflow comes to rest.
pub async fn events_are_listed_per_entity<S: Store>(store: S) {
    let [a, b, c, _] = telemetry_fixture(&store).await;
    let events = store.events_list(a).await.unwrap();
    let view: Vec<_> = events
        .iter()
        .map(|e| {
            (
                e.event.as_str(),
                e.request_id.as_deref(),
                e.kind.as_str(),
                e.start_state.as_str(),
                e.end_state.as_deref(),
                e.end_time,
                e.rejected,
                e.failed,
            )
        })
        .collect();
    assert_eq!(
        view,
        [
            ("go", Some("op-go"), "raised", "idle", Some("done"), Some(T0 + 201), false, false),
            ("bad", Some("req-bad"), "raised", "done", Some("done"), Some(T0 + 901), true, false),
        ]
    );
    assert_eq!((events[0].start_time, events[1].start_time), (T0 + 1, T0 + 900));
    assert!(events[0].id < events[1].id);
    let failed = store.events_list(b).await.unwrap();
    assert_eq!(failed.len(), 1, "the queued event is not processed yet: {failed:?}");
    assert_eq!(
        (failed[0].failed, failed[0].end_state.as_deref(), failed[0].error.as_deref()),
        (true, Some("idle"), Some("provider down"))
    );
    let parked = store.events_list(c).await.unwrap();
    assert_eq!((parked.len(), parked[0].end_state.as_ref(), parked[0].end_time), (1, None, None), "still running");
    assert!(store.events_list(i64::MAX).await.unwrap().is_empty());
}

/// Stats: per operation name (counts, success rate, nearest-rank duration percentiles),
/// per machine transition (count, error rate, mean retries) and the most frequent errors,
/// all time or since a moment.
pub async fn stats_summarise_telemetry<S: Store>(store: S) {
    let empty = store.stats(None).await.unwrap();
    assert_eq!(empty, Stats::default());
    telemetry_fixture(&store).await;
    let s = store.stats(None).await.unwrap();
    let ops: Vec<_> =
        s.operations.iter().map(|o| (o.name.as_str(), o.count, o.ended, o.success, o.p50_ms, o.p99_ms)).collect();
    assert_eq!(ops, [("m.create", 2, 2, 2, 0, 0), ("m.go", 3, 2, 1, 200, 200)]);
    assert!(approx(s.operations[0].success_rate, 1.0) && approx(s.operations[1].success_rate, 0.5), "{s:?}");
    let tr: Vec<_> = s.transitions.iter().map(|t| (t.machine.clone(), t.from.clone(), t.to.clone(), t.count)).collect();
    assert_eq!(
        tr,
        [
            transition_stats("m", None, "idle", 3),
            transition_stats("m", None, "waiting", 1),
            transition_stats("m", Some("busy"), "busy", 3),
            transition_stats("m", Some("busy"), "done", 1),
            transition_stats("m", Some("idle"), "busy", 2),
        ]
    );
    let busy = &s.transitions[2];
    assert!(approx(busy.error_rate, 2.0 / 3.0) && approx(busy.mean_retries, 4.0 / 3.0), "{busy:?}");
    assert!(s.transitions.iter().filter(|t| t.to != "busy").all(|t| t.error_rate == 0.0 && t.mean_retries == 0.0));
    let errors: Vec<_> = s.top_errors.iter().map(|e| (e.kind.as_str(), e.details.as_str(), e.count)).collect();
    assert_eq!(errors, [("action_error", "provider down", 2), ("action_error", "rate limited", 1)]);

    let since = store.stats(Some(T0 + 450)).await.unwrap();
    let ops: Vec<_> =
        since.operations.iter().map(|o| (o.name.as_str(), o.count, o.ended, o.success, o.p50_ms)).collect();
    assert_eq!(ops, [("m.go", 1, 0, 0, 0)], "only op-open started since");
    assert_eq!(since.operations[0].success_rate, 0.0, "no ended operation: rate 0");
    let tr: Vec<_> =
        since.transitions.iter().map(|t| (t.machine.clone(), t.from.clone(), t.to.clone(), t.count)).collect();
    assert_eq!(
        tr,
        [
            transition_stats("m", None, "waiting", 1),
            transition_stats("m", Some("busy"), "busy", 2),
            transition_stats("m", Some("idle"), "busy", 1),
        ]
    );
    assert!(approx(since.transitions[1].error_rate, 1.0) && approx(since.transitions[1].mean_retries, 1.5));
    let errors: Vec<_> = since.top_errors.iter().map(|e| (e.details.as_str(), e.count)).collect();
    assert_eq!(errors, [("provider down", 1), ("rate limited", 1)]);
    assert!(store.stats(Some(T0 + 10_000)).await.unwrap() == Stats::default());
}

/// The metrics snapshot counts transitions, rejected events, faults, parked entities,
/// entities per state and run status, due work and operations per outcome; listing filters
/// by run status.
pub async fn metrics_snapshot_and_run_status_filter<S: Store>(store: S) {
    let [_, b, c, _] = telemetry_fixture(&store).await;
    let m = store.metrics_snapshot(T0 + 1_000).await.unwrap();
    let tr: Vec<_> = m.transitions.iter().map(|t| (t.machine.clone(), t.from.clone(), t.to.clone(), t.count)).collect();
    assert_eq!(
        tr,
        [
            transition_stats("m", None, "idle", 3),
            transition_stats("m", None, "waiting", 1),
            transition_stats("m", Some("busy"), "busy", 3),
            transition_stats("m", Some("busy"), "done", 1),
            transition_stats("m", Some("idle"), "busy", 2),
        ]
    );
    assert_eq!((m.events_rejected, m.faults, m.parked, m.due_backlog), (1, 3, 1, 1));
    let entities: Vec<_> =
        m.entities.iter().map(|e| (e.machine.as_str(), e.state.as_str(), e.run_status, e.count)).collect();
    assert_eq!(
        entities,
        [
            ("m", "busy", RunStatus::Failed, 1),
            ("m", "done", RunStatus::Active, 1),
            ("m", "idle", RunStatus::Paused, 1),
            ("m", "waiting", RunStatus::Active, 1),
        ]
    );
    assert_eq!(m.operations, [("failed".to_string(), 1), ("open".to_string(), 1), ("success".to_string(), 3)]);
    assert_eq!(store.metrics_snapshot(T0 + 955).await.unwrap().due_backlog, 0, "d is not due yet");

    let by_status = |status: &str, machine: Option<&str>| {
        let filter =
            EntityFilter { run_status: Some(status.into()), machine: machine.map(String::from), ..Default::default() };
        let store = &store;
        async move { store.entity_list(filter).await.unwrap().iter().map(|e| e.id).collect::<Vec<_>>() }
    };
    assert_eq!(by_status("paused", None).await, [b]);
    assert_eq!(by_status("failed", Some("m")).await, [c]);
    assert_eq!(by_status("failed", Some("n")).await, Vec::<i64>::new());
    assert_eq!(by_status("active", None).await.len(), 2);
    assert!(by_status("killed", None).await.is_empty());
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
        Err(OpError::TaskRefused { task: t, reason }) if t == task && reason.starts_with(starts) => {}
        other => panic!("expected task {task} refused with `{starts}…`, got {other:?}"),
    }
}

/// Agent tasks (DESIGN §5): an entity created waiting for an agent offers one task, leased
/// only once available and only by one agent at a time; heartbeats extend the lease; a
/// report with an expired or superseded token, or a second report, is refused and changes
/// nothing; an expired lease is offered again (attempt + 1); an accepted report lands in
/// the entity's inbox; entering a state cancels open tasks; paused entities' tasks are not
/// leased; kill cancels them.
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

    let hb = |token: &str| Op::TaskHeartbeat { task: t.id, token: token.into() };
    refused(task_op(&store, T0 + 300, hb("forged")).await, t.id, "lease token superseded");
    assert_eq!(task_op(&store, T0 + 500, hb(&token)).await, Ok(Applied::Extended { locked_until: T0 + 1_500 }));

    // The lease runs out: the report is refused, the task is offered again.
    let done = TaskResult::Complete { target: StateName::new("done"), properties: Properties::new() };
    let report = |token: &str| Op::TaskReport { task: t.id, token: token.into(), result: done.clone() };
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
    refused(task_op(&store, T0 + 1_900, report(&token2)).await, t.id, "already reported");
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
    let report3 = Op::TaskReport { task: task3, token: token3, result: done.clone() };
    refused(task_op(&store, T0 + 2_004, report3).await, task3, "canceled");
    assert!(store.task_list(TaskFilter { open_only: true, ..TaskFilter::default() }).await.unwrap().is_empty());

    // A definition upgrade that renames the state keeps the open task, for the new version.
    let mut c = new_entity("c", "working", None);
    c.offer = Some(offer(T0));
    write(&store, T0, vec![Op::Create(c)], false).await;
    assert_eq!(
        store.machine_migrate("m", vec![("working".into(), "toiling".into())], "h2", T0 + 2_005).await.unwrap(),
        1
    );
    let moved = lease(&store, T0 + 2_006, "mig-").await;
    assert_eq!((moved.len(), moved[0].state.as_str(), moved[0].entity_version), (1, "toiling", 2));
    let report = Op::TaskReport { task: moved[0].id, token: moved[0].token.clone().unwrap(), result: done.clone() };
    assert!(task_op(&store, T0 + 2_007, report).await.is_ok());

    // Paused entities' tasks wait; kill cancels them.
    let mut b = new_entity("b", "working", None);
    b.offer = Some(offer(T0));
    write(&store, T0, vec![Op::Create(b)], false).await;
    let cmd =
        |command| Op::Command { machine: MachineName::new("m"), key: EntityKey::new("b"), command, operation: None };
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
}

/// Instantiates every conformance check as a `#[tokio::test]` for one backend.
///
/// `$make` is an async expression yielding a fresh, empty store; `$dialect` a [`Dialect`].
/// With `optional` first, `$make` yields an `Option` of a store, and each check returns at
/// once on `None` (a backend that is not available on this machine; `$make` says so).
#[macro_export]
macro_rules! store_conformance_suite {
    ($make:expr, $dialect:expr) => {
        $crate::store_conformance_suite!(optional async { Some($make.await) }, $dialect);
    };
    (optional $make:expr, $dialect:expr) => {
        mod conformance {
            #[allow(unused_imports)]
            use super::*;
            use $crate::conformance as suite;

            #[tokio::test]
            async fn create_get_and_duplicate() {
                let Some(store) = $make.await else { return };
                suite::create_get_and_duplicate(store).await
            }
            #[tokio::test]
            async fn push_claim_fifo() {
                let Some(store) = $make.await else { return };
                suite::push_claim_fifo(store).await
            }
            #[tokio::test]
            async fn commit_applies_and_reports_head() {
                let Some(store) = $make.await else { return };
                suite::commit_applies_and_reports_head(store).await
            }
            #[tokio::test]
            async fn commit_is_fenced() {
                let Some(store) = $make.await else { return };
                suite::commit_is_fenced(store).await
            }
            #[tokio::test]
            async fn release_never_strands_events() {
                let Some(store) = $make.await else { return };
                suite::release_never_strands_events(store).await
            }
            #[tokio::test]
            async fn rejection_keeps_version() {
                let Some(store) = $make.await else { return };
                suite::rejection_keeps_version(store).await
            }
            #[tokio::test]
            async fn effects_are_atomic() {
                let Some(store) = $make.await else { return };
                suite::effects_are_atomic(store, $dialect).await
            }
            #[tokio::test]
            async fn expired_leases_move_and_renewal_extends() {
                let Some(store) = $make.await else { return };
                suite::expired_leases_move_and_renewal_extends(store).await
            }
            #[tokio::test]
            async fn auto_time_survives_events_and_release() {
                let Some(store) = $make.await else { return };
                suite::auto_time_survives_events_and_release(store).await
            }
            #[tokio::test]
            async fn successors_and_change_notices() {
                let Some(store) = $make.await else { return };
                suite::successors_and_change_notices(store).await
            }
            #[tokio::test]
            async fn timers_fire_through_the_inbox() {
                let Some(store) = $make.await else { return };
                suite::timers_fire_through_the_inbox(store).await
            }
            #[tokio::test]
            async fn preconditions_and_fired() {
                let Some(store) = $make.await else { return };
                suite::preconditions_and_fired(store).await
            }
            #[tokio::test]
            async fn listing_counts_and_metadata() {
                let Some(store) = $make.await else { return };
                suite::listing_counts_and_metadata(store).await
            }
            #[tokio::test]
            async fn events_are_listed_per_entity() {
                let Some(store) = $make.await else { return };
                suite::events_are_listed_per_entity(store).await
            }
            #[tokio::test]
            async fn stats_summarise_telemetry() {
                let Some(store) = $make.await else { return };
                suite::stats_summarise_telemetry(store).await
            }
            #[tokio::test]
            async fn agent_tasks_lease_and_report() {
                let Some(store) = $make.await else { return };
                suite::agent_tasks_lease_and_report(store).await
            }
            #[tokio::test]
            async fn metrics_snapshot_and_run_status_filter() {
                let Some(store) = $make.await else { return };
                suite::metrics_snapshot_and_run_status_filter(store).await
            }
        }
    };
}
