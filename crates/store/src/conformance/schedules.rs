//! Calendar schedules' progress as the store keeps it: stored once per declaration (a new
//! one starts afresh, its counts kept), leased to one instance at a time while it has
//! something to do, advanced by the holder alone, paused and resumed; a fire runs while an
//! operation or bulk operation under its request id is open.

use serde_json::json;

use super::{T0, create_one, push, write};
use crate::{BulkRow, Op, OpenOperation, ScheduleAdvance, ScheduleRow, Store};

fn advance(owner: &str, next_fire: i64, fired: u64, now: i64) -> ScheduleAdvance {
    ScheduleAdvance {
        machine: "vm".into(),
        name: "nightly".into(),
        owner: owner.into(),
        next_fire,
        next_at: next_fire + 5,
        buffered: None,
        last_fire: (fired > 0).then_some(next_fire - 100),
        fired,
        missed: 2,
        skipped: 1,
        now,
    }
}

/// Sync, claim, advance, take over, pause, resume, running.
pub async fn schedules_sync_lease_advance_and_pause<S: Store>(store: S) {
    let row = ScheduleRow::new("vm", "nightly", "0 3 * * *|UTC".into(), T0 + 100, T0 + 105, T0);
    let stored = store.schedule_sync(row.clone()).await.unwrap();
    assert_eq!((stored.next_fire, stored.next_at, stored.fired, stored.paused), (T0 + 100, T0 + 105, 0, false));
    // The same declaration again changes nothing; another one starts from its first fire.
    assert_eq!(store.schedule_sync(ScheduleRow { next_fire: T0 + 999, ..row.clone() }).await.unwrap(), stored);
    store.schedule_sync(ScheduleRow::new("db", "weekly", "x".into(), T0 + 50, T0 + 50, T0)).await.unwrap();

    // Nothing due yet: no lease. Due: A holds it; B cannot take it until A's lease ends.
    assert_eq!(store.schedule_claim("vm", "nightly", "a", T0 + 104, T0 + 1_000).await.unwrap(), None);
    let a = store.schedule_claim("vm", "nightly", "a", T0 + 105, T0 + 1_000).await.unwrap().unwrap();
    assert_eq!(a.owner.as_deref(), Some("a"));
    assert_eq!(store.schedule_claim("vm", "nightly", "b", T0 + 500, T0 + 2_000).await.unwrap(), None);
    assert!(!store.schedule_advance(advance("b", T0 + 200, 1, T0 + 501)).await.unwrap(), "only the holder");
    assert!(store.schedule_advance(advance("a", T0 + 200, 1, T0 + 502)).await.unwrap());
    let now = store.schedule_list().await.unwrap().into_iter().find(|s| s.machine == "vm").unwrap();
    assert_eq!(
        (now.next_fire, now.next_at, now.last_fire, now.last_fired_at, now.fired, now.missed, now.skipped, now.owner),
        (T0 + 200, T0 + 205, Some(T0 + 100), Some(T0 + 502), 1, 2, 1, None)
    );
    // A lease that ran out is taken over; the old holder's decision is refused.
    store.schedule_claim("vm", "nightly", "a", T0 + 205, T0 + 300).await.unwrap().unwrap();
    assert!(store.schedule_claim("vm", "nightly", "b", T0 + 301, T0 + 900).await.unwrap().is_some());
    assert!(!store.schedule_advance(advance("a", T0 + 300, 1, T0 + 302)).await.unwrap());
    assert!(store.schedule_advance(advance("b", T0 + 300, 0, T0 + 303)).await.unwrap());
    let now = store.schedule_list().await.unwrap().into_iter().find(|s| s.machine == "vm").unwrap();
    assert_eq!((now.last_fire, now.fired, now.missed), (Some(T0 + 100), 1, 4), "no fire keeps the last one");

    // Paused: never leased; resumed from the fire given.
    let paused = store.schedule_pause("vm", "nightly", true, (0, 0), T0 + 310).await.unwrap().unwrap();
    assert!(paused.paused);
    assert_eq!(paused.next_fire, T0 + 300, "a pause keeps the next fire");
    assert_eq!(store.schedule_claim("vm", "nightly", "a", T0 + 10_000, T0 + 11_000).await.unwrap(), None);
    let resumed = store.schedule_pause("vm", "nightly", false, (T0 + 20_000, T0 + 20_001), T0 + 311).await.unwrap();
    assert_eq!(resumed.map(|r| (r.paused, r.next_fire, r.next_at)), Some((false, T0 + 20_000, T0 + 20_001)));
    assert_eq!(store.schedule_pause("vm", "nobody", true, (0, 0), T0).await.unwrap(), None);
    // A new declaration: afresh from its first fire, its counts kept.
    let changed = ScheduleRow::new("vm", "nightly", "0 4 * * *|UTC".into(), T0 + 400, T0 + 400, T0 + 320);
    let changed = store.schedule_sync(changed).await.unwrap();
    assert_eq!((changed.next_fire, changed.fired, changed.missed), (T0 + 400, 1, 4));
    let names: Vec<(String, String)> =
        store.schedule_list().await.unwrap().into_iter().map(|s| (s.machine, s.name)).collect();
    assert_eq!(names, [("db".into(), "weekly".into()), ("vm".into(), "nightly".into())]);

    // A fire runs while an operation or a bulk operation under its id is open.
    let fire = "schedule:vm:nightly:2026-11-27T03:00:00.000Z";
    assert!(!store.schedule_running(fire).await.unwrap());
    create_one(&store, "e1").await;
    let mut p = push("e1", "go");
    p.request_id = Some(format!("{fire}/ready/7"));
    p.operation = Some(OpenOperation {
        request_id: format!("{fire}/ready/7"),
        name: "vm.go".into(),
        dimensions: json!({}),
        priority: 0,
    });
    write(&store, T0 + 1, vec![Op::Push(p)], false).await;
    assert!(store.schedule_running(fire).await.unwrap(), "an entity's operation under it is open");
    assert!(!store.schedule_running("schedule:vm:nightly:2026-11-27T03:00:00.000").await.unwrap(), "a prefix of it");
    assert!(!store.schedule_running("schedule:vm:nightly:2026-11-28T03:00:00.000Z").await.unwrap());
    let other = "schedule:vm:other_x:2026-11-27T03:00:00.000Z";
    let bulk = BulkRow::new(format!("{other}/ready"), "raise".into(), json!({"machine": "vm"}), "r".into(), 5, T0);
    store.bulk_start(bulk).await.unwrap();
    assert!(store.schedule_running(other).await.unwrap(), "its bulk operation runs");
    assert!(!store.schedule_running("schedule:vm:other%x:2026-11-27T03:00:00.000Z").await.unwrap(), "no pattern");
    store.bulk_cancel(&format!("{other}/ready"), T0 + 2).await.unwrap();
    assert!(!store.schedule_running(other).await.unwrap());
}
