//! Commits: what one fenced commit changes (state, version, properties, history, inbox),
//! what it refuses (stale fences, changed preconditions), and that its effects land
//! together or not at all.

use serde_json::{Value, json};
use settle_core::{EventName, Properties};

use super::{Dialect, T0, claim_with_event, commit, create_one, get, new_entity, push, write};
use crate::{AfterCommit, Applied, Commit, Fence, HistoryKind, Op, OpError, SqlStatement, Store, TimerPlan};

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

    // In one batch, each operation sees what those before it did to the entity: a second
    // commit with the first one's fence is stale, a release with the new version holds.
    create_one(&store, "b").await;
    let r = write(&store, T0 + 2, vec![Op::Push(push("b", "two"))], true).await;
    let c = r.claimed[0].clone();
    let mut first = commit(&c.entity, Some("busy"), None, AfterCommit::Hold);
    // Entering `busy` starts a timer, which the next commit of the batch drops.
    let timer = TimerPlan {
        name: "t".into(),
        event: EventName::new("tick"),
        due_at: T0 + 60_000,
        every_ms: None,
        restart: true,
    };
    first.timers = Some(vec![timer]);
    let again = commit(&c.entity, Some("done"), None, AfterCommit::Hold);
    let mut then = Commit { timers: Some(Vec::new()), ..commit(&c.entity, Some("idle"), None, AfterCommit::Hold) };
    then.fence.version += 1;
    then.from = "busy".into();
    let release = Fence { version: c.entity.version + 2, ..first.fence.clone() };
    let ops = vec![
        Op::Commit(Box::new(first)),
        Op::Commit(Box::new(again)),
        Op::Commit(Box::new(then)),
        Op::Release(release),
    ];
    let r = write(&store, T0 + 3, ops, false).await;
    assert!(matches!(r.results[0], Ok(Applied::Committed { version: 2, .. })), "{:?}", r.results[0]);
    assert_eq!(r.results[1], Err(OpError::LeaseLost { entity_id: c.entity.id }));
    assert!(matches!(r.results[2], Ok(Applied::Committed { version: 3, .. })), "{:?}", r.results[2]);
    assert!(r.results[3].is_ok(), "{:?}", r.results[3]);
    let e = get(&store, "b").await;
    assert_eq!((e.state.as_str(), e.version, e.lease_owner.as_deref()), ("idle", 3, None));
    assert_eq!(store.history_list(e.id).await.unwrap().len(), 3);
    assert_eq!(store.timer_list(e.id).await.unwrap(), Vec::new(), "the timer the batch started and dropped");
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
