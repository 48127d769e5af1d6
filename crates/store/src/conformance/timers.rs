//! Timers: set with a state entry, fired through the inbox by a claim, kept, restarted or
//! deleted as a commit plans them.

use settle_core::EventName;

use super::{T0, claim_with_event, commit, create_one, get, write};
use crate::{AfterCommit, InboxKind, Millis, Op, Store, TimerPlan};

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
