//! Entities: creation and duplicate keys, listing, counting, stored definitions and
//! metadata.

use settle_core::MachineName;

use super::{T0, create_one, get, new_entity, write};
use crate::{EntityFilter, HistoryKind, NewEntity, Op, OpError, Store, TaskOffer, TimerPlan};

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

    // A create's operation ends at once when the entity is created at rest, and stays open
    // while it has work: an auto action, an agent task, its own subscriptions to evaluate.
    let opened = |key: &str| crate::OpenOperation {
        request_id: format!("op-{key}"),
        name: "m.create".into(),
        dimensions: serde_json::json!({}),
        priority: 0,
    };
    let with_op = |key: &str| NewEntity {
        request_id: Some(format!("op-{key}")),
        operation: Some(opened(key)),
        ..new_entity(key, "idle", None)
    };
    let timer = TimerPlan { name: "t".into(), event: "tick".into(), due_at: T0 + 9_000, every_ms: None, restart: true };
    let offer = TaskOffer { queue: "q".into(), action: "work".into(), lock_ms: 1_000, available_at: T0 };
    let ops = vec![
        Op::Create(with_op("rest")),
        Op::Create(NewEntity { auto_at: Some(T0 + 5), ..with_op("auto") }),
        Op::Create(NewEntity { offer: Some(offer), ..with_op("task") }),
        Op::Create(NewEntity { notify_self: true, ..with_op("notice") }),
        Op::Create(NewEntity { timers: vec![timer.clone()], ..with_op("timed") }),
    ];
    let r = write(&store, T0, ops, false).await;
    assert!(r.results.iter().all(Result::is_ok), "{:?}", r.results);
    for (key, open) in [("rest", false), ("auto", true), ("task", true), ("notice", true), ("timed", false)] {
        let op = store.operation_get(&format!("op-{key}")).await.unwrap().expect("opened");
        assert_eq!(op.ended_at.is_none(), open, "operation of `{key}`: {op:?}");
    }
    // A timer planned at creation is stored with the entity, and makes it due then.
    let timed = get(&store, "timed").await;
    let timers = store.timer_list(timed.id).await.unwrap();
    assert_eq!(timers.iter().map(|t| (t.name.as_str(), t.due_at)).collect::<Vec<_>>(), [("t", T0 + 9_000)]);
    assert_eq!(timed.due_at, Some(T0 + 9_000));
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
    // A parent state lists its substates, only in the machines that nest them.
    let within =
        EntityFilter { state: Some("busy".into()), substates: vec![("m".into(), "done".into())], ..Default::default() };
    let within = store.entity_list(within).await.unwrap();
    assert_eq!(within.iter().map(|e| e.key.as_str()).collect::<Vec<_>>(), ["k3", "k4"]);
    let across =
        EntityFilter { state: Some("idle".into()), substates: vec![("n".into(), "none".into())], ..Default::default() };
    assert_eq!(store.entity_list(across).await.unwrap().len(), 4, "exact matches in every machine stay");
    assert_eq!(store.entity_count_by_state("m").await.unwrap(), vec![("done".to_string(), 2), ("idle".to_string(), 3)]);
    assert_eq!(store.entity_count_pending().await.unwrap(), 1);
    super::put_version(&store, "m", "abc", "{}", T0).await;
    // Deployed again: one row, its deploy time moves.
    super::put_version(&store, "m", "abc", "{}", T0 + 1).await;
    super::put_version(&store, "m", "def", "{\"v\":2}", T0 + 2).await;
    let machines = store.machine_list().await.unwrap();
    assert_eq!(
        machines.iter().map(|m| (m.hash.as_str(), m.created_at)).collect::<Vec<_>>(),
        [("abc", T0 + 1), ("def", T0 + 2)]
    );
    assert_eq!(store.meta_get("demo").await.unwrap(), None);
    store.meta_put("demo", "1").await.unwrap();
    store.meta_put("demo", "2").await.unwrap();
    assert_eq!(store.meta_get("demo").await.unwrap().as_deref(), Some("2"));
}
