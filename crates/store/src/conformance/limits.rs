//! Concurrency limits: an acquire takes a free slot or waits in line, dropping its lease;
//! the commit that ends a limited action gives its slot back and hands it to the first in
//! line (by priority, then arrival), due at once; an expired lease keeps the slot for the
//! entity that goes on; kill and a pause with nothing in flight give slots and places up;
//! raising a limit admits those waiting.

use super::{OWNER, T0, command, commit, get, new_entity, write};
use crate::{Acquire, AfterCommit, Applied, Claim, Command, EntityRow, Fence, Op, OpError, SlotAsk, Store};

fn ask(e: &EntityRow, owner: &str, key: &str, max: u32, priority: i64) -> Op {
    let slot = SlotAsk { limit: "calls".into(), key: key.into(), max: Some(max), rate: None, fair: String::new() };
    ask_for(e, owner, slot, priority)
}

/// `e`'s ask for `slot` under `owner`'s lease.
pub(super) fn ask_for(e: &EntityRow, owner: &str, slot: SlotAsk, priority: i64) -> Op {
    Op::Acquire(Box::new(Acquire {
        fence: Fence { entity_id: e.id, version: e.version, owner: owner.into() },
        slots: vec![slot],
        priority: Some(priority),
        workflow: false,
        request_id: None,
    }))
}

/// The commit that ends `e`'s action (a transition to `done`), giving its slot back.
pub(super) fn end(e: &EntityRow) -> Op {
    let mut c = commit(e, Some("done"), None, AfterCommit::Release);
    c.event = None;
    c.leave_limits = true;
    Op::Commit(Box::new(c))
}

/// Offers `e`'s agent task (queue `q`, a 10 s lock, available at `at`) by a commit under its
/// lease written at `at + 1`, the lease then as `after` says; answers the entity's version.
async fn offer_task<S: Store>(store: &S, e: &EntityRow, at: crate::Millis, after: AfterCommit) -> i64 {
    let mut offer = commit(e, None, None, after);
    offer.event = None;
    offer.offer =
        Some(crate::TaskOffer { queue: "q".into(), action: "work".into(), lock_ms: 10_000, available_at: at });
    let r = write(store, at + 1, vec![Op::Commit(Box::new(offer))], false).await;
    match r.results[0] {
        Ok(Applied::Committed { version, .. }) => version,
        ref other => panic!("the offer failed: {other:?}"),
    }
}

/// (in use, max, waiting) of `calls` for `key`; zeros when nothing is in use or waiting.
pub(super) async fn usage<S: Store>(store: &S, key: &str) -> (u64, u64, u64) {
    let all = store.limit_list().await.unwrap();
    all.iter()
        .find(|u| u.limit == "calls" && u.key == key)
        .map_or((0, 0, 0), |u| (u.in_use, u.max.unwrap_or(u64::MAX), u.waiting))
}

/// Entities `keys`, all due at once, claimed by `OWNER`.
pub(super) async fn claimed<S: Store>(store: &S, keys: &[&str]) -> Vec<EntityRow> {
    let ops = keys.iter().map(|k| Op::Create(new_entity(k, "working", Some(T0)))).collect();
    write(store, T0, ops, false).await;
    let r = write(store, T0, vec![], true).await;
    keys.iter().map(|k| r.claimed.iter().find(|c| c.entity.key == *k).expect("claimed").entity.clone()).collect()
}

/// Slots are taken while free, per key value; the rest wait in line (priority, then
/// arrival), handed the slot by the commit that frees it; `max` follows the definition.
pub async fn limits_hand_slots_on_in_line<S: Store>(store: S) {
    let e = claimed(&store, &["a", "b", "c", "d", "x"]).await;
    let (a, b, c, d, x) = (&e[0], &e[1], &e[2], &e[3], &e[4]);
    // Two slots for key `eu`: a and b take them; c waits, then d (ahead of c by priority).
    let r = write(
        &store,
        T0 + 1,
        vec![
            ask(a, OWNER, "eu", 2, 0),
            ask(b, OWNER, "eu", 2, 0),
            ask(c, OWNER, "eu", 2, 0),
            ask(d, OWNER, "eu", 2, 5),
        ],
        false,
    )
    .await;
    let waiting = Applied::Waiting { limit: "calls".into(), key: "eu".into() };
    assert_eq!(r.results, [Ok(Applied::Acquired), Ok(Applied::Acquired), Ok(waiting.clone()), Ok(waiting.clone())]);
    assert_eq!(usage(&store, "eu").await, (2, 2, 2));
    // Another key value has slots of its own.
    let r = write(&store, T0 + 1, vec![ask(x, OWNER, "us", 2, 0)], false).await;
    assert_eq!(r.results[0], Ok(Applied::Acquired));
    // A waiting entity's lease is dropped and it is not due: no claim takes it.
    let cw = get(&store, "c").await;
    assert_eq!((cw.lease_owner, cw.due_at), (None, None));
    let place = |id| {
        let store = &store;
        async move {
            store
                .limit_of(id)
                .await
                .unwrap()
                .into_iter()
                .map(|l| (l.place, l.in_use, l.max.unwrap_or(0)))
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(place(d.id).await, [(Some(1), 2, 2)], "the higher priority is first in line");
    assert_eq!(place(c.id).await, [(Some(2), 2, 2)]);
    assert_eq!(place(a.id).await, [(None, 2, 2)], "a holds a slot");
    // Asking again changes nothing: a keeps its slot, c its place.
    let r = write(&store, T0 + 2, vec![ask(a, OWNER, "eu", 2, 0)], false).await;
    assert_eq!(r.results[0], Ok(Applied::Acquired));
    assert_eq!(usage(&store, "eu").await, (2, 2, 2));
    // A stale fence is refused.
    let r = write(&store, T0 + 2, vec![ask(a, "engine-b", "eu", 2, 0)], false).await;
    assert_eq!(r.results[0], Err(OpError::LeaseLost { entity_id: a.id }));
    // a's action ends: its slot goes to d (first in line), due at once and claimed by the
    // same batch.
    let r = write(&store, T0 + 3, vec![end(a)], true).await;
    assert!(r.results[0].is_ok(), "{:?}", r.results[0]);
    let keys: Vec<&str> = r.claimed.iter().map(|c| c.entity.key.as_str()).collect();
    assert_eq!(keys, ["d"], "the admitted entity is due now");
    assert_eq!(usage(&store, "eu").await, (2, 2, 1));
    assert_eq!(place(d.id).await, [(None, 2, 2)], "d holds the slot a gave back");
    let d = r.claimed[0].entity.clone();
    let r = write(&store, T0 + 4, vec![ask(&d, OWNER, "eu", 2, 5)], false).await;
    assert_eq!(r.results[0], Ok(Applied::Acquired), "d's ask finds its slot held");
    assert_eq!(usage(&store, "eu").await, (2, 2, 1));
    // Raising the limit admits c at once.
    let r = write(&store, T0 + 5, vec![ask(b, OWNER, "eu", 3, 0)], true).await;
    assert_eq!(r.results[0], Ok(Applied::Acquired));
    assert_eq!(r.claimed.iter().map(|c| c.entity.key.as_str()).collect::<Vec<_>>(), ["c"]);
    assert_eq!(usage(&store, "eu").await, (3, 3, 0));
    // Lowering it takes no slot away: those holding them finish; nobody new starts until
    // fewer than the new max are in use.
    let c = r.claimed[0].clone().entity;
    let r = write(&store, T0 + 6, vec![ask(&c, OWNER, "eu", 1, 0)], false).await;
    assert_eq!(r.results[0], Ok(Applied::Acquired), "c holds its slot already");
    assert_eq!(usage(&store, "eu").await, (3, 1, 0));
    for e in [b, &d, &c] {
        let now = get(&store, &e.key).await;
        write(&store, T0 + 7, vec![end(&now)], false).await;
    }
    assert_eq!(usage(&store, "eu").await, (0, 0, 0), "every slot came back");
    assert!(store.limit_list().await.unwrap().iter().all(|u| u.key != "eu"));
    let _ = x;
}

/// An expired lease keeps the slot for the entity that goes on; kill gives it back; a pause
/// of a waiting entity gives up its place; events still reach a waiting entity.
pub async fn limits_survive_leases_and_commands<S: Store>(store: S) {
    let e = claimed(&store, &["a", "b", "c"]).await;
    let (a, b, c) = (&e[0], &e[1], &e[2]);
    let r =
        write(&store, T0 + 1, vec![ask(a, OWNER, "", 1, 0), ask(b, OWNER, "", 1, 0), ask(c, OWNER, "", 1, 0)], false)
            .await;
    assert_eq!(r.results[0], Ok(Applied::Acquired));
    assert_eq!(usage(&store, "").await, (1, 1, 2));
    // a's lease expires (its engine died mid-action): another engine claims it and finds its
    // slot still held — the slot went nowhere, so nobody else started meanwhile.
    let other = Claim::new("engine-b", 30_000, 100);
    let r = store.write(crate::Batch { now: T0 + 40_000, ops: vec![], claim: Some(other) }).await.unwrap();
    let keys: Vec<&str> = r.claimed.iter().map(|c| c.entity.key.as_str()).collect();
    assert_eq!(keys, ["a"], "waiting entities are not due; the expired lease is");
    let a2 = r.claimed[0].entity.clone();
    let r = write(&store, T0 + 40_001, vec![ask(&a2, "engine-b", "", 1, 0)], false).await;
    assert_eq!(r.results[0], Ok(Applied::Acquired));
    assert_eq!(usage(&store, "").await, (1, 1, 2));
    // Killing the holder gives its slot to b; pausing c (waiting, not leased) gives up its
    // place.
    let r = write(&store, T0 + 40_002, vec![command("a", Command::Kill), command("c", Command::Pause)], true).await;
    assert!(r.results.iter().all(Result::is_ok), "{:?}", r.results);
    assert_eq!(r.claimed.iter().map(|c| c.entity.key.as_str()).collect::<Vec<_>>(), ["b"]);
    assert_eq!(usage(&store, "").await, (1, 1, 0));
    assert!(store.limit_of(c.id).await.unwrap().is_empty(), "paused: out of line");
    // Resumed, c asks again and waits behind nobody: b holds the one slot.
    let r = write(&store, T0 + 40_003, vec![command("c", Command::Resume)], true).await;
    let c2 = r.claimed.iter().find(|x| x.entity.key == "c").expect("resumed: due").entity.clone();
    let r = write(&store, T0 + 40_004, vec![ask(&c2, OWNER, "", 1, 0)], false).await;
    assert_eq!(r.results[0], Ok(Applied::Waiting { limit: "calls".into(), key: "".into() }));
    // An event for a waiting entity makes it due (events run while it waits); asking again
    // keeps its place.
    let mut go = super::push("c", "go");
    go.request_id = Some("req-wake".into());
    let r = write(&store, T0 + 40_005, vec![Op::Push(go)], true).await;
    let c3 = r.claimed.iter().find(|x| x.entity.key == "c").expect("an event: due").entity.clone();
    let r = write(&store, T0 + 40_006, vec![ask(&c3, OWNER, "", 1, 0)], false).await;
    assert!(matches!(r.results[0], Ok(Applied::Waiting { .. })));
    assert_eq!(usage(&store, "").await, (1, 1, 1));
    let e = get(&store, "c").await;
    assert_eq!((e.lease_owner.as_deref(), e.due_at), (None, Some(T0 + 40_006)), "its event is still queued");
    // Paused while its engine holds it, before it asks: it takes nothing and is let go.
    let p = claimed(&store, &["p"]).await.remove(0);
    let r = write(&store, T0 + 40_010, vec![command("p", Command::Pause), ask(&p, OWNER, "", 1, 0)], false).await;
    assert_eq!(r.results[1], Ok(Applied::Released), "{:?}", r.results);
    let p = get(&store, "p").await;
    assert_eq!((p.lease_owner, p.due_at), (None, None));
    assert!(store.limit_of(p.id).await.unwrap().is_empty(), "neither holding nor in line");
    assert_eq!(usage(&store, "").await, (1, 1, 1));
}

/// A slot taken for an agent's task stays with it through a pause (the agent's call is in
/// flight; its report gives it back), while a pause of an entity with nothing in flight
/// gives its slot back at once.
pub async fn limits_stay_with_an_agent_task_through_a_pause<S: Store>(store: S) {
    let e = claimed(&store, &["a", "b"]).await;
    let (a, b) = (&e[0], &e[1]);
    let r = write(&store, T0 + 1, vec![ask(a, OWNER, "", 2, 0), ask(b, OWNER, "", 2, 0)], false).await;
    assert!(r.results.iter().all(|r| *r == Ok(Applied::Acquired)), "{:?}", r.results);
    // a's task is offered (the entity's lease dropped); b's action has not started.
    offer_task(&store, a, T0 + 1, AfterCommit::Release).await;
    let release = Op::Release(Fence { entity_id: b.id, version: b.version, owner: OWNER.into() });
    write(&store, T0 + 3, vec![release], false).await;
    let r = write(&store, T0 + 4, vec![command("a", Command::Pause), command("b", Command::Pause)], false).await;
    assert!(r.results.iter().all(Result::is_ok), "{:?}", r.results);
    assert_eq!(usage(&store, "").await, (1, 2, 0), "a's slot stays with its task; b's came back");
    assert_eq!(store.limit_of(a.id).await.unwrap().len(), 1);
    assert!(store.limit_of(b.id).await.unwrap().is_empty());
}

/// An entity that leaves its state while an agent holds its task (an event moved it on, or
/// a kill): the agent's call is still in flight, so the task keeps the slot — the next in
/// line waits — until the agent answers (its report refused as canceled) or its lock runs
/// out; the entity itself, needing the slot again, waits for its own call first.
pub async fn limits_stay_with_a_call_in_flight<S: Store>(store: S) {
    let e = claimed(&store, &["a", "b"]).await;
    let (a, b) = (&e[0], &e[1]);
    let r = write(&store, T0 + 1, vec![ask(a, OWNER, "", 1, 0), ask(b, OWNER, "", 1, 0)], false).await;
    assert_eq!(r.results[1], Ok(Applied::Waiting { limit: "calls".into(), key: "".into() }));
    let version = offer_task(&store, a, T0 + 1, AfterCommit::Hold).await;
    let lease = Op::TaskLease { queue: "q".into(), agent: "agent-1".into(), limit: 1, token_prefix: "t-".into() };
    let r = write(&store, T0 + 3, vec![lease], false).await;
    let Ok(Applied::Leased(tasks)) = &r.results[0] else { panic!("{:?}", r.results) };
    let task = tasks[0].clone();
    // An event moves a on while the agent works: the task is canceled, its slot kept.
    let a = EntityRow { version, ..get(&store, "a").await };
    let mut moved = commit(&a, Some("elsewhere"), None, AfterCommit::Hold);
    moved.leave_limits = true;
    let r = write(&store, T0 + 4, vec![Op::Commit(Box::new(moved))], false).await;
    assert!(r.results[0].is_ok(), "{:?}", r.results);
    assert_eq!(usage(&store, "").await, (1, 1, 1), "the call in flight keeps its slot; b still waits");
    // The agent answers: refused, the task was canceled — its call is over, b is admitted.
    let report = Op::TaskReport {
        task: task.id,
        token: task.token.clone().expect("a leased task has a token"),
        result: crate::TaskResult::Fail { error: "late".into(), retryable: true },
        check: crate::TaskCheck::default(),
    };
    let r = write(&store, T0 + 5, vec![report], true).await;
    assert!(matches!(&r.results[0], Err(OpError::Task(_))), "{:?}", r.results);
    assert_eq!(r.claimed.iter().map(|c| c.entity.key.as_str()).collect::<Vec<_>>(), ["b"]);
    assert_eq!(usage(&store, "").await, (1, 1, 0), "b holds the slot the call gave back");
    // A call whose agent never answers keeps the slot until its lock runs out.
    let e = claimed(&store, &["c", "d"]).await;
    let (c, dd) = (&e[0], &e[1]);
    let b = r.claimed[0].entity.clone();
    write(&store, T0 + 6, vec![ask(&b, OWNER, "", 1, 0), end(&b)], false).await;
    let r = write(&store, T0 + 7, vec![ask(c, OWNER, "", 1, 0), ask(dd, OWNER, "", 1, 0)], false).await;
    assert_eq!(r.results[0], Ok(Applied::Acquired));
    let version = offer_task(&store, c, T0 + 7, AfterCommit::Hold).await;
    let lease = Op::TaskLease { queue: "q".into(), agent: "agent-1".into(), limit: 1, token_prefix: "u-".into() };
    write(&store, T0 + 9, vec![lease], false).await;
    let c = EntityRow { version, ..get(&store, "c").await };
    let mut killed_off = commit(&c, Some("elsewhere"), None, AfterCommit::Release);
    killed_off.leave_limits = true;
    let r = write(&store, T0 + 10, vec![Op::Commit(Box::new(killed_off))], false).await;
    assert!(r.results[0].is_ok(), "{:?}", r.results);
    assert_eq!(usage(&store, "").await, (1, 1, 1));
    // d, first in line, is woken when the lock runs out (T0 + 9 + 10 s) and takes the slot.
    let waiting = get(&store, "d").await;
    assert_eq!(waiting.due_at, Some(T0 + 9 + 10_000), "woken when the call's lock runs out");
    let r = write(&store, T0 + 9 + 10_000, vec![], true).await;
    let d2 = r.claimed.iter().find(|x| x.entity.key == "d").expect("d is due").entity.clone();
    let r = write(&store, T0 + 9 + 10_001, vec![ask(&d2, OWNER, "", 1, 0)], false).await;
    assert_eq!(r.results[0], Ok(Applied::Acquired), "the expired call's slot is d's");
    assert_eq!(usage(&store, "").await, (1, 1, 0));
}

/// A commit entering a limited state asks for its slots in its own transaction
/// ([`crate::Commit::acquire`]): held, it keeps its lease; full, it waits in line with its
/// lease dropped; with events in its inbox (they go first) or its lease let go, nothing is
/// asked.
pub async fn limits_come_with_the_commit_that_enters_the_state<S: Store>(store: S) {
    let e = claimed(&store, &["a", "b", "c", "d"]).await;
    let slot = SlotAsk { limit: "calls".into(), key: "eu".into(), max: Some(1), rate: None, fair: String::new() };
    let entering = |e: &EntityRow, after: AfterCommit| {
        let mut c = commit(e, Some("working"), None, after);
        c.auto_at = Some(T0 + 1);
        c.acquire = Some(vec![slot.clone()]);
        Op::Commit(Box::new(c))
    };
    write(&store, T0 + 1, vec![Op::Push(super::push("c", "poke"))], false).await;
    let ops = vec![
        entering(&e[0], AfterCommit::Hold),
        entering(&e[1], AfterCommit::Hold),
        entering(&e[2], AfterCommit::Hold),
        entering(&e[3], AfterCommit::Release),
    ];
    let r = write(&store, T0 + 1, ops, false).await;
    let answers: Vec<_> = r
        .results
        .iter()
        .map(|r| match r {
            Ok(Applied::Committed { held, acquired, .. }) => (*held, acquired.as_deref().cloned()),
            other => panic!("{other:?}"),
        })
        .collect();
    let waiting = Applied::Waiting { limit: "calls".into(), key: "eu".into() };
    assert_eq!(answers, [(true, Some(Applied::Acquired)), (false, Some(waiting)), (true, None), (false, None)]);
    assert_eq!(usage(&store, "eu").await, (1, 1, 1), "a holds the slot, b waits");
    let b = get(&store, "b").await;
    assert_eq!((b.lease_owner, b.state.as_str(), b.due_at), (None, "working", None), "b waits, not due");
    // a's action (run in an engine, every slot held) ends: b is handed the slot, due at once.
    let a = EntityRow { version: e[0].version + 1, state: "working".into(), ..e[0].clone() };
    let mut ended = end(&a);
    if let Op::Commit(c) = &mut ended {
        c.held_all = true;
    }
    let r = write(&store, T0 + 2, vec![ended], true).await;
    assert!(r.results[0].is_ok(), "{:?}", r.results);
    let mut due: Vec<_> = r.claimed.iter().map(|c| c.entity.key.as_str()).collect();
    due.sort();
    assert_eq!(due, ["b", "d"], "b admitted; d let go at its action's time");
    assert_eq!(usage(&store, "eu").await, (1, 1, 0));
    // The change feed records b's wait and its admission, in its state.
    let filter =
        crate::FeedFilter { machine: Some("m".into()), key: Some("b".into()), transitions: true, ..Default::default() };
    // b's creation, its entry into `working`, its wait and its admission.
    let (items, _) = super::feed::read_all(&store, crate::FeedPos::START, &filter, 100, 4).await;
    let limits: Vec<_> = items
        .iter()
        .filter_map(|i| match i {
            crate::FeedItem::Transition { row, .. } if row.kind == crate::HistoryKind::Limit => {
                Some((row.at, row.from.as_deref().map(str::to_string), row.to.clone(), row.detail.clone().unwrap()))
            }
            _ => None,
        })
        .collect();
    let working = Some("working".to_string());
    assert_eq!(
        limits,
        [
            (T0 + 1, working.clone(), None, "waiting for `calls` (key eu): 1 of 1 in use".into()),
            (T0 + 2, working, None, "admitted by `calls` (key eu) after 1 ms in line".into()),
        ]
    );
}

/// A limit of workflows (`Acquire::workflow`): the slot is held until a commit brings the
/// entity to rest ([`crate::Commit::leave_workflows`]), not given back by the end of an
/// action; an entity waiting for one is not due for the events queued behind its own; a
/// kill gives the slot back.
pub async fn limits_hold_a_workflow_until_it_comes_to_rest<S: Store>(store: S) {
    let e = claimed(&store, &["a", "b"]).await;
    let (a, b) = (&e[0], &e[1]);
    let workflow = |e: &EntityRow| {
        let slot = SlotAsk { limit: "calls".into(), key: String::new(), max: Some(1), rate: None, fair: String::new() };
        let Op::Acquire(mut ask) = ask_for(e, OWNER, slot, 0) else { unreachable!("an ask") };
        ask.workflow = true;
        Op::Acquire(ask)
    };
    let r = write(&store, T0 + 1, vec![workflow(a), workflow(b)], false).await;
    let waiting = Applied::Waiting { limit: "calls".into(), key: String::new() };
    assert_eq!(r.results, [Ok(Applied::Acquired), Ok(waiting.clone())]);
    // An event for b makes it due; asking again, it keeps its place and is not due for its
    // inbox: what is queued waits behind the event that waits for the slot.
    write(&store, T0 + 2, vec![Op::Push(super::push("b", "poke"))], false).await;
    let r = write(&store, T0 + 2, vec![], true).await;
    let b2 = r.claimed.iter().find(|c| c.entity.key == "b").expect("an event: due").entity.clone();
    let r = write(&store, T0 + 3, vec![workflow(&b2)], false).await;
    assert_eq!(r.results[0], Ok(waiting));
    let bw = get(&store, "b").await;
    assert_eq!((bw.lease_owner, bw.due_at), (None, None), "waiting for its workflow: not due");
    assert_eq!(usage(&store, "").await, (1, 1, 1));
    // a's action ends (a transition within its workflow): the workflow's slot stays.
    let r = write(&store, T0 + 4, vec![end(a)], true).await;
    assert!(r.results[0].is_ok(), "{:?}", r.results);
    assert!(r.claimed.iter().all(|c| c.entity.key != "b"), "nobody admitted");
    assert_eq!(usage(&store, "").await, (1, 1, 1));
    // a comes to rest: its slot goes to b, due at once.
    let a2 = r.claimed.iter().find(|c| c.entity.key == "a").map(|c| c.entity.clone()).unwrap_or(get(&store, "a").await);
    let mut rest = commit(&a2, None, None, AfterCommit::Release);
    rest.event = None;
    rest.quiet = true;
    rest.leave_workflows = true;
    if a2.lease_owner.is_none() {
        // Let go by its commit: claim it again to hold the fence.
        let r = write(&store, T0 + 5, vec![Op::Push(super::push("a", "poke"))], true).await;
        let held = r.claimed.iter().find(|c| c.entity.key == "a").expect("due").entity.clone();
        rest = commit(&held, None, None, AfterCommit::Release);
        rest.event = None;
        rest.quiet = true;
        rest.leave_workflows = true;
    }
    let r = write(&store, T0 + 6, vec![Op::Commit(Box::new(rest))], true).await;
    assert!(r.results[0].is_ok(), "{:?}", r.results);
    assert!(r.claimed.iter().any(|c| c.entity.key == "b"), "b admitted, due at once");
    assert_eq!(usage(&store, "").await, (1, 1, 0));
    assert_eq!(store.limit_of(b.id).await.unwrap().iter().map(|l| l.place).collect::<Vec<_>>(), [None]);
    // An action of b's ending keeps it; a kill gives it back.
    write(&store, T0 + 7, vec![command("b", Command::Kill)], false).await;
    assert_eq!(usage(&store, "").await, (0, 0, 0), "every slot came back");
}

/// A commit that takes its workflow's slots first ([`crate::Commit::take_first`]): with
/// room, it applies and holds them; without, it is not applied (state, version and inbox as
/// they were), the entity waits in line at rest, its lease dropped, not due; a commit of
/// application SQL does the same.
pub async fn limits_come_before_the_commit_of_an_event_that_starts_a_workflow<S: Store>(store: S) {
    let e = claimed(&store, &["a", "b"]).await;
    let slot = SlotAsk { limit: "calls".into(), key: String::new(), max: Some(1), rate: None, fair: String::new() };
    let pushed =
        write(&store, T0 + 1, vec![Op::Push(super::push("a", "go")), Op::Push(super::push("b", "go"))], false).await;
    let inbox = |i: usize| match &pushed.results[i] {
        Ok(Applied::Pushed { inbox_id, .. }) => *inbox_id,
        other => panic!("{other:?}"),
    };
    let starting = |e: &EntityRow, consume: i64, sql: bool| {
        let mut c = commit(e, Some("done"), Some(consume), AfterCommit::Release);
        c.take_first = Some(vec![slot.clone()]);
        if sql {
            c.sql = vec![crate::SqlStatement { sql: "SELECT 1".into(), params: Vec::new() }];
        }
        Op::Commit(Box::new(c))
    };
    let r =
        write(&store, T0 + 2, vec![starting(&e[0], inbox(0), false), starting(&e[1], inbox(1), false)], false).await;
    let waiting = Applied::Waiting { limit: "calls".into(), key: String::new() };
    assert!(matches!(r.results[0], Ok(Applied::Committed { .. })), "{:?}", r.results[0]);
    assert_eq!(r.results[1], Ok(waiting.clone()));
    let (a, b) = (get(&store, "a").await, get(&store, "b").await);
    assert_eq!((a.state.as_str(), b.state.as_str()), ("done", "working"), "b's commit not applied");
    assert_eq!((b.version, b.lease_owner, b.due_at), (e[1].version, None, None), "b waits at rest, not due");
    assert_eq!(usage(&store, "").await, (1, 1, 1));
    assert_eq!(store.limit_of(a.id).await.unwrap().iter().map(|l| l.place).collect::<Vec<_>>(), [None]);
    // b's event is still queued: a commit of application SQL asking again waits too.
    let r = write(&store, T0 + 3, vec![Op::Push(super::push("b", "poke"))], true).await;
    let b2 = r.claimed.iter().find(|c| c.entity.key == "b").expect("due").entity.clone();
    let r = write(&store, T0 + 4, vec![starting(&b2, inbox(1), true)], false).await;
    assert_eq!(r.results[0], Ok(waiting));
    assert_eq!(get(&store, "b").await.state.as_str(), "working");
    assert_eq!(usage(&store, "").await, (1, 1, 1), "still one place in line");
}
