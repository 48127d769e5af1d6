//! Fairness and rates of limits: a line is admitted round-robin across its fairness values
//! (each value's waiters by priority), so work arriving behind another value's backlog
//! waits at most one round; a rate spaces starts `per / rate` apart, waking the next in
//! line when it may start, with or without a `max`.

use super::limits::{ask_for, claimed, end, usage};
use super::{OWNER, T0, command, get, write};
use serde_json::json;

use crate::{Applied, Command, EntityRow, Rate, SlotAsk, Store};

/// An ask for one slot of the global limit `calls` (at most `max`) by fairness value `fair`.
fn fair_ask(e: &EntityRow, fair: &str, priority: i64) -> crate::Op {
    let slot = SlotAsk { limit: "calls".into(), key: String::new(), max: Some(1), rate: None, fair: fair.into() };
    ask_for(e, OWNER, slot, priority)
}

/// An ask for a start of `calls`, key `r`: `rate` per second, at most `max` at once.
fn rated_ask(e: &EntityRow, max: Option<u32>, rate: u32) -> crate::Op {
    let slot = SlotAsk {
        limit: "calls".into(),
        key: "r".into(),
        max,
        rate: Some(Rate { starts: rate, per_ms: 1_000 }),
        fair: String::new(),
    };
    ask_for(e, OWNER, slot, 0)
}

/// Where each of `keys` stands in line (`None`: holding a slot, or out of line).
async fn places<S: Store>(store: &S, keys: &[&str]) -> Vec<Option<u64>> {
    let mut out = Vec::new();
    for k in keys {
        let e = get(store, k).await;
        out.push(store.limit_of(e.id).await.unwrap().first().and_then(|l| l.place));
    }
    out
}

/// The entities a write at `now` admitted (claimed by it), by key.
async fn admitted_at<S: Store>(store: &S, now: crate::Millis, ops: Vec<crate::Op>) -> Vec<String> {
    let r = write(store, now, ops, true).await;
    assert!(r.results.iter().all(Result::is_ok), "{:?}", r.results);
    r.claimed.iter().map(|c| c.entity.key.to_string()).collect()
}

/// Tenant `t1` queues three behind the holder, `t2` one after them: `t2`'s is admitted
/// after one of `t1`'s, not after all; `t1`'s own go by priority; a value that comes back
/// takes the current round, ahead of a value already served in it.
pub async fn limits_admit_round_robin_across_fair_values<S: Store>(store: S) {
    let e = claimed(&store, &["a", "b", "c", "d", "e", "f"]).await;
    let (a, b, c, d, x, f) = (&e[0], &e[1], &e[2], &e[3], &e[4], &e[5]);
    let r = write(
        &store,
        T0 + 1,
        vec![fair_ask(a, "t1", 0), fair_ask(b, "t1", 0), fair_ask(c, "t1", 0), fair_ask(d, "t1", 5)],
        false,
    )
    .await;
    assert_eq!(r.results[0], Ok(Applied::Acquired));
    let r = write(&store, T0 + 2, vec![fair_ask(x, "t2", 0)], false).await;
    assert!(matches!(r.results[0], Ok(Applied::Waiting { .. })), "{:?}", r.results);
    assert_eq!(usage(&store, "").await, (1, 1, 4));
    assert_eq!(
        places(&store, &["d", "e", "b", "c"]).await,
        [Some(1), Some(2), Some(3), Some(4)],
        "d first (t1's by priority), then t2's one, then the rest of t1's"
    );
    // Each end hands the slot to the next in that order.
    assert_eq!(admitted_at(&store, T0 + 3, vec![end(a)]).await, ["d"]);
    let d = get(&store, "d").await;
    assert_eq!(admitted_at(&store, T0 + 4, vec![end(&d)]).await, ["e"], "t2 waited one round, not three");
    let x = get(&store, "e").await;
    assert_eq!(admitted_at(&store, T0 + 5, vec![end(&x)]).await, ["b"]);
    // t2 comes back while t1 has c waiting: t1 was served this round, so t2 goes first.
    let r = write(&store, T0 + 6, vec![fair_ask(f, "t2", 0)], false).await;
    assert!(matches!(r.results[0], Ok(Applied::Waiting { .. })), "{:?}", r.results);
    assert_eq!(places(&store, &["f", "c"]).await, [Some(1), Some(2)]);
    let b = get(&store, "b").await;
    assert_eq!(admitted_at(&store, T0 + 7, vec![end(&b)]).await, ["f"]);
    let f = get(&store, "f").await;
    assert_eq!(admitted_at(&store, T0 + 8, vec![end(&f)]).await, ["c"]);
    assert_eq!(usage(&store, "").await, (1, 1, 0));
}

/// A rate of 2 a second: starts half a second apart, the next in line woken when it may
/// start (not before), whether slots are free or not; with a `max` as well, a slot given
/// back before the rate allows a start wakes the next when it does.
pub async fn limits_space_starts_by_their_rate<S: Store>(store: S) {
    let e = claimed(&store, &["a", "b", "c"]).await;
    let (a, b, c) = (&e[0], &e[1], &e[2]);
    let r =
        write(&store, T0 + 1, vec![rated_ask(a, None, 2), rated_ask(b, None, 2), rated_ask(c, None, 2)], false).await;
    assert_eq!(r.results[0], Ok(Applied::Acquired));
    assert!(r.results[1..].iter().all(|r| matches!(r, Ok(Applied::Waiting { .. }))), "{:?}", r.results);
    let list = store.limit_list().await.unwrap();
    let u = list.iter().find(|u| u.key == "r").expect("listed");
    assert_eq!(
        (u.in_use, u.max, u.waiting, u.spacing_us, u.next_start_at),
        (1, None, 2, Some(500_000), Some(T0 + 501))
    );
    assert_eq!(get(&store, "b").await.due_at, Some(T0 + 501), "the next in line is woken when it may start");
    assert_eq!(get(&store, "c").await.due_at, None, "the one behind it is not");
    assert_eq!(places(&store, &["b", "c"]).await, [Some(1), Some(2)]);
    // Nothing is admitted before its time, even when a slot is given back.
    assert!(admitted_at(&store, T0 + 500, vec![end(a)]).await.is_empty());
    let r = write(&store, T0 + 501, vec![], true).await;
    let b = r.claimed.iter().find(|x| x.entity.key == "b").expect("b is due").entity.clone();
    let r = write(&store, T0 + 501, vec![rated_ask(&b, None, 2)], false).await;
    assert_eq!(r.results[0], Ok(Applied::Acquired));
    assert_eq!(get(&store, "c").await.due_at, Some(T0 + 1_001), "500 ms after b's start");
    let r = write(&store, T0 + 1_001, vec![], true).await;
    let c = r.claimed.iter().find(|x| x.entity.key == "c").expect("c is due").entity.clone();
    let r = write(&store, T0 + 1_001, vec![rated_ask(&c, None, 2)], false).await;
    assert_eq!(r.results[0], Ok(Applied::Acquired));
    for k in ["b", "c"] {
        let now = get(&store, k).await;
        write(&store, T0 + 1_100, vec![end(&now)], false).await;
    }
    // At most one at once and one a second: the slot comes back before the rate allows the
    // next start, which is woken when it does.
    let e = claimed(&store, &["p", "q"]).await;
    let (p, q) = (&e[0], &e[1]);
    let at = T0 + 5_000;
    let r = write(&store, at, vec![rated_ask(p, Some(1), 1), rated_ask(q, Some(1), 1)], false).await;
    assert_eq!(r.results[0], Ok(Applied::Acquired));
    assert_eq!(get(&store, "q").await.due_at, None, "no slot free: woken when one is");
    assert!(admitted_at(&store, at + 10, vec![end(p)]).await.is_empty());
    assert_eq!(get(&store, "q").await.due_at, Some(at + 1_000), "the slot is free; the rate wakes it");
    let r = write(&store, at + 1_000, vec![], true).await;
    let q = r.claimed.iter().find(|x| x.entity.key == "q").expect("q is due").entity.clone();
    let r = write(&store, at + 1_000, vec![rated_ask(&q, Some(1), 1)], false).await;
    assert_eq!(r.results[0], Ok(Applied::Acquired));
    assert_eq!(usage(&store, "r").await, (1, 1, 0));
    // The next, woken for the rate, leaves the line (paused): the one after it is woken
    // in its place.
    let q = get(&store, "q").await;
    write(&store, at + 1_001, vec![end(&q)], false).await;
    let e = claimed(&store, &["u", "v", "w"]).await;
    let at = at + 3_000;
    let asks = e.iter().map(|x| rated_ask(x, Some(1), 1)).collect();
    let r = write(&store, at, asks, false).await;
    assert_eq!(r.results[0], Ok(Applied::Acquired));
    assert_eq!((get(&store, "v").await.due_at, get(&store, "w").await.due_at), (None, None), "no slot is free");
    let u = get(&store, "u").await;
    write(&store, at + 1, vec![end(&u)], false).await;
    assert_eq!((get(&store, "v").await.due_at, get(&store, "w").await.due_at), (Some(at + 1_000), None));
    let r = write(&store, at + 2, vec![command("v", Command::Pause)], false).await;
    assert!(r.results[0].is_ok(), "{:?}", r.results);
    assert_eq!(get(&store, "w").await.due_at, Some(at + 1_000), "w is next: woken when the rate allows");
}

/// Work that waits without a priority of its own waits by its request's: the priority its
/// operation opened with (a request's, an event's default, a bulk operation's lower one).
pub async fn limits_order_waiting_work_by_its_requests_priority<S: Store>(store: S) {
    let made = |key: &str, priority: i64| {
        let request = format!("r-{key}");
        let operation = crate::OpenOperation {
            request_id: request.clone(),
            name: "m.create".into(),
            dimensions: json!({}),
            priority,
        };
        crate::Op::Create(crate::NewEntity {
            request_id: Some(request),
            operation: Some(operation),
            ..super::new_entity(key, "working", Some(T0))
        })
    };
    write(&store, T0, vec![made("a", 0), made("low", -10), made("plain", 0), made("high", 7)], false).await;
    let r = write(&store, T0, vec![], true).await;
    let held = |k: &str| r.claimed.iter().find(|c| c.entity.key == k).expect("claimed").entity.clone();
    let ask = |e: &EntityRow| {
        let slot = SlotAsk { limit: "calls".into(), key: String::new(), max: Some(1), rate: None, fair: String::new() };
        crate::Op::Acquire(Box::new(crate::Acquire {
            fence: crate::Fence { entity_id: e.id, version: e.version, owner: OWNER.into() },
            slots: vec![slot],
            priority: None,
            workflow: false,
            request_id: None,
        }))
    };
    let asks = ["a", "low", "plain", "high"].iter().map(|k| ask(&held(k))).collect();
    let r = write(&store, T0 + 1, asks, false).await;
    assert_eq!(r.results[0], Ok(Applied::Acquired));
    assert_eq!(places(&store, &["high", "plain", "low"]).await, [Some(1), Some(2), Some(3)]);
    let a = get(&store, "a").await;
    assert_eq!(admitted_at(&store, T0 + 2, vec![end(&a)]).await, ["high"]);
}
