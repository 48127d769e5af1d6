//! Entities: creation and duplicate keys, listing, counting, stored definitions and
//! metadata.

use settle_core::MachineName;

use super::{T0, create_one, get, new_entity, write};
use crate::{EntityFilter, HistoryKind, Op, OpError, Store};

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
