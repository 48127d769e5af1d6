//! The fleet at scale: the counts the commits keep ([`Store::overview`]) agree with the
//! rows they count, whatever wrote them (creates, commits, faults, operator commands,
//! upgrades), and every way a filtered page is read ([`EntityFilter`]) finds exactly the
//! entities a scan would, page after page.

use std::collections::BTreeMap;

use settle_core::MachineName;

use super::telemetry::telemetry_fixture;
use super::{T0, command, new_entity, write};
use crate::{Command, EntityFilter, EntityRow, Op, StateMove, Store};

/// Every entity, by a plain scan of the whole table.
async fn everything<S: Store>(store: &S) -> Vec<EntityRow> {
    store.entity_list(EntityFilter::default()).await.unwrap()
}

/// Asserts that the overview's entity and operation counts equal those of the rows.
pub(super) async fn counts_agree<S: Store>(store: &S, now: i64) {
    let o = store.overview(now, 0).await.unwrap();
    let mut want: BTreeMap<(String, String, &str), u64> = BTreeMap::new();
    for e in everything(store).await {
        *want.entry((e.machine.to_string(), e.state.to_string(), e.run_status.as_str())).or_default() += 1;
    }
    let got: BTreeMap<_, _> =
        o.entities.iter().map(|c| ((c.machine.clone(), c.state.clone(), c.run_status.as_str()), c.count)).collect();
    assert_eq!(got, want, "entity counts");
    let mut ops: BTreeMap<String, u64> = BTreeMap::new();
    for op in store.operation_list(None, 10_000).await.unwrap() {
        *ops.entry(op.outcome.clone().unwrap_or_else(|| "open".into())).or_default() += 1;
    }
    assert_eq!(o.operations.into_iter().collect::<BTreeMap<_, _>>(), ops, "operation counts");
}

/// The overview's counts follow creates, commits, faults, commands, upgrades and a claim
/// that wakes an entity; its minutes hold every transition and error.
pub async fn overview_counts_follow_every_write<S: Store>(store: S) {
    telemetry_fixture(&store).await;
    counts_agree(&store, T0 + 1_000).await;
    let o = store.overview(T0 + 1_000, 0).await.unwrap();
    let m = store.metrics_snapshot(T0 + 1_000).await.unwrap();
    let transitions: u64 = m.transitions.iter().map(|t| t.count).sum();
    let minutes = (o.minutes.iter().map(|m| m.transitions).sum::<u64>(), o.minutes.iter().map(|m| m.errors).sum());
    assert_eq!(minutes, (transitions, m.faults));
    assert!(o.minutes.iter().all(|m| m.minute % 60_000 == 0 && m.minute <= T0 + 1_000), "{:?}", o.minutes);
    assert_eq!(o.due_backlog, 1, "d is due at T0+960");
    assert!(store.overview(T0 + 1_000, T0 + 3_600_000).await.unwrap().minutes.is_empty(), "nothing since then");
    // Operator commands: kill one, resume another.
    let r = write(&store, T0 + 2_000, vec![command("a", Command::Kill), command("b", Command::Resume)], false).await;
    assert!(r.results.iter().all(|r| r.is_ok()), "{r:?}");
    counts_agree(&store, T0 + 2_000).await;
    // An upgrade moves entities between states.
    let moves = vec![StateMove { version: String::new(), from: "busy".into(), to: "working".into() }];
    let moved = super::move_to(&store, "m", moves, "h2", T0 + 3_000).await;
    assert_eq!(moved, 1);
    counts_agree(&store, T0 + 3_000).await;
    // A sleeping entity that comes due wakes up (active again) as it is claimed.
    let r = write(&store, T0 + 4_000, vec![command("c", Command::Sleep { until: T0 + 4_500 })], false).await;
    assert!(r.results[0].is_ok(), "{r:?}");
    counts_agree(&store, T0 + 4_000).await;
    let claimed = write(&store, T0 + 5_000, vec![], true).await.claimed;
    let c = claimed.iter().find(|c| c.entity.key == "c").expect("c comes due");
    assert_eq!(c.entity.run_status, crate::RunStatus::Active);
    assert_eq!(c.entity, store.entity_get("m", "c").await.unwrap().unwrap(), "answers the row as written");
    counts_agree(&store, T0 + 5_000).await;
}

/// Every index path of a filtered page (state pairs, parents, run status, key prefix,
/// plain scan) returns what filtering every row would, in its order, and paging through
/// it with a cursor returns each entity once.
pub async fn filtered_pages_match_a_scan<S: Store>(store: S) {
    // Created in four writes whose times do not follow their ids: the entered order is
    // not the id order.
    for (group, at) in [T0 + 7, T0, T0 + 3, T0].into_iter().enumerate() {
        let mut ops = Vec::new();
        for i in (0..24).filter(|i| i % 4 == group) {
            let state = ["idle", "busy", "done"][i % 3];
            let mut e = new_entity(&format!("{}-{i:02}", ["srv", "db", "srv-x"][i % 4 % 3]), state, None);
            e.request_id = None;
            if i % 5 == 0 {
                e.machine = MachineName::new("n");
            }
            ops.push(Op::Create(e));
        }
        write(&store, at, ops, false).await;
    }
    let all = everything(&store).await;
    let paused: Vec<_> =
        all.iter().filter(|e| e.machine.as_str() == "m").step_by(4).map(|e| e.key.to_string()).collect();
    write(&store, T0 + 1, paused.iter().map(|k| command(k, Command::Pause)).collect(), false).await;
    let all = everything(&store).await;
    assert_eq!(all.len(), 24);

    let filters = [
        EntityFilter { machine: Some("m".into()), ..Default::default() },
        EntityFilter { state: Some("idle".into()), ..Default::default() },
        EntityFilter { machine: Some("n".into()), state: Some("busy".into()), ..Default::default() },
        // A parent: `busy` in every machine and `done` in m.
        EntityFilter { state: Some("busy".into()), substates: vec![("m".into(), "done".into())], ..Default::default() },
        EntityFilter { run_status: Some("paused".into()), ..Default::default() },
        EntityFilter { run_status: Some("active".into()), machine: Some("m".into()), ..Default::default() },
        EntityFilter { key_prefix: Some("srv-".into()), ..Default::default() },
        EntityFilter { key_prefix: Some("srv-x".into()), machine: Some("m".into()), ..Default::default() },
        EntityFilter { key_prefix: Some("d".into()), state: Some("idle".into()), ..Default::default() },
        EntityFilter { key_prefix: Some("".into()), run_status: Some("paused".into()), ..Default::default() },
        EntityFilter { machine: Some("nobody".into()), ..Default::default() },
        EntityFilter { key_prefix: Some("zzz".into()), ..Default::default() },
        // Only some (machine, state) pairs (the error-health states of a list of failures),
        // alone and with the other filters.
        EntityFilter { pairs: Some(vec![pair("m", "busy"), pair("n", "idle")]), ..Default::default() },
        EntityFilter { pairs: Some(vec![pair("m", "done")]), run_status: Some("paused".into()), ..Default::default() },
        EntityFilter {
            pairs: Some(vec![pair("m", "busy"), pair("m", "idle")]),
            state: Some("idle".into()),
            ..Default::default()
        },
        EntityFilter { pairs: Some(vec![pair("m", "idle")]), key_prefix: Some("srv".into()), ..Default::default() },
        EntityFilter { pairs: Some(vec![]), ..Default::default() },
    ];
    for f in filters {
        let mut want: Vec<&EntityRow> = all
            .iter()
            .filter(|e| f.machine.as_ref().is_none_or(|m| e.machine.as_str() == m))
            .filter(|e| {
                f.state.as_ref().is_none_or(|s| {
                    e.state.as_str() == s
                        || f.substates.iter().any(|(m, ss)| e.machine.as_str() == m && e.state.as_str() == ss)
                })
            })
            .filter(|e| f.run_status.as_ref().is_none_or(|s| e.run_status.as_str() == s))
            .filter(|e| f.key_prefix.as_ref().is_none_or(|p| e.key.as_str().starts_with(p.as_str())))
            .filter(|e| f.pairs.as_ref().is_none_or(|only| only.contains(&pair(e.machine.as_str(), e.state.as_str()))))
            .collect();
        if f.key_prefix.is_some() {
            want.sort_by(|a, b| (a.machine.as_str(), a.key.as_str()).cmp(&(b.machine.as_str(), b.key.as_str())));
        }
        let want: Vec<i64> = want.iter().map(|e| e.id).collect();
        let whole: Vec<i64> = store.entity_list(f.clone()).await.unwrap().iter().map(|e| e.id).collect();
        assert_eq!(whole, want, "{f:?}");
        // Counted through the same index, exactly up to a bound, then one more.
        assert_eq!(store.entity_count(f.clone(), 1_000).await.unwrap(), want.len() as u64, "count {f:?}");
        assert_eq!(store.entity_count(f.clone(), 2).await.unwrap(), want.len().min(3) as u64, "bounded {f:?}");
        // Pages of two, each continuing after the previous one's last entity.
        let mut paged = Vec::new();
        let mut page = EntityFilter { limit: Some(2), ..f.clone() };
        loop {
            let rows = store.entity_list(page.clone()).await.unwrap();
            paged.extend(rows.iter().map(|e| e.id));
            let Some(last) = rows.last().filter(|_| rows.len() == 2) else { break };
            page.after_id = Some(last.id);
            page.after_key = Some((last.machine.to_string(), last.key.to_string()));
        }
        assert_eq!(paged, want, "paged {f:?}");
        if f.key_prefix.is_none() {
            entered_orders_match_a_sort(&store, &all, &f, &want).await;
        }
    }
}

/// `f`'s entities (ids `want`, of `all`) by entered time both ways, whole and in pages of
/// two each after the previous one's last (entered at, id), and counted.
async fn entered_orders_match_a_sort<S: Store>(store: &S, all: &[EntityRow], f: &EntityFilter, want: &[i64]) {
    use crate::EntityOrder;
    let mut rows: Vec<&EntityRow> = all.iter().filter(|e| want.contains(&e.id)).collect();
    rows.sort_by_key(|e| (e.entered_at, e.id));
    for order in [EntityOrder::EnteredFirst, EntityOrder::EnteredLast] {
        let mut want: Vec<i64> = rows.iter().map(|e| e.id).collect();
        if order == EntityOrder::EnteredLast {
            want.reverse();
        }
        let f = EntityFilter { order, ..f.clone() };
        let whole: Vec<i64> = store.entity_list(f.clone()).await.unwrap().iter().map(|e| e.id).collect();
        assert_eq!(whole, want, "{f:?}");
        assert_eq!(store.entity_count(f.clone(), 1_000).await.unwrap(), want.len() as u64, "count {f:?}");
        let (mut paged, mut page) = (Vec::new(), EntityFilter { limit: Some(2), ..f.clone() });
        loop {
            let rows = store.entity_list(page.clone()).await.unwrap();
            paged.extend(rows.iter().map(|e| e.id));
            let Some(last) = rows.last().filter(|_| rows.len() == 2) else { break };
            page.after_entered = Some((last.entered_at, last.id));
        }
        assert_eq!(paged, want, "paged {f:?}");
    }
}

fn pair(machine: &str, state: &str) -> (String, String) {
    (machine.to_string(), state.to_string())
}

/// A deploy moves the entities no engine holds, of the version and state it names: a
/// renamed state with a history row, a state that stays by its version alone; an entity
/// held now is left to its engine's next commit. The counts per version follow.
pub async fn versions_move_the_entities_no_engine_holds<S: Store>(store: S) {
    let mut ops = Vec::new();
    for (key, state, hash) in
        [("a", "idle", Some("h1")), ("b", "idle", Some("h1")), ("c", "busy", Some("h1")), ("d", "idle", None)]
    {
        let mut e = new_entity(key, state, None);
        e.machine_hash = hash.map(String::from);
        ops.push(Op::Create(e));
    }
    write(&store, T0, ops, false).await;
    // `b` is held: an event claims it.
    let (held, _) = super::claim_with_event(&store, T0 + 1, "b").await;
    assert_eq!(held.key.as_str(), "b");
    let by_version = store.entity_count_by_version("m").await.unwrap();
    let want =
        |v: &[(&str, &str, u64)]| v.iter().map(|(h, s, n)| (h.to_string(), s.to_string(), *n)).collect::<Vec<_>>();
    assert_eq!(by_version, want(&[("", "idle", 1), ("h1", "busy", 1), ("h1", "idle", 2)]));
    let moves = vec![
        StateMove { version: "h1".into(), from: "idle".into(), to: "idle".into() },
        StateMove { version: "h1".into(), from: "busy".into(), to: "working".into() },
    ];
    assert_eq!(
        super::move_to(&store, "m", moves, "h2", T0 + 2).await,
        2,
        "a and c; b is held, d is of no version named"
    );
    assert_eq!(
        store.entity_count_by_version("m").await.unwrap(),
        want(&[("", "idle", 1), ("h1", "idle", 1), ("h2", "idle", 1), ("h2", "working", 1)])
    );
    let (a, c) = (super::get(&store, "a").await, super::get(&store, "c").await);
    assert_eq!((a.version, a.machine_hash.as_deref()), (1, Some("h2")), "a state that stays keeps the version number");
    assert_eq!((c.state.as_str(), c.version, c.machine_hash.as_deref()), ("working", 2, Some("h2")));
    let history = store.history_list(c.id).await.unwrap();
    let last = history.last().unwrap();
    assert_eq!((last.from.as_deref(), last.to.as_deref()), (Some("busy"), Some("working")));
    assert_eq!(store.history_list(a.id).await.unwrap().len(), 1, "a version alone writes no history");
    // The entities of no recorded version move when named by "".
    let moves = vec![StateMove { version: String::new(), from: "idle".into(), to: "idle".into() }];
    assert_eq!(super::move_to(&store, "m", moves, "h2", T0 + 3).await, 1);
    counts_agree(&store, T0 + 3).await;
}

/// A deploy is written whole: its versions stored as their machines' current ones (with
/// their origin; a clock set back still makes them the newest), its entities moved and its
/// marker written, in one transaction; a version deployed again becomes current again.
pub async fn a_deploy_is_written_whole<S: Store>(store: S) {
    for key in ["a", "b"] {
        super::create_one(&store, key).await;
    }
    let version = |name: &str, hash: &str, origin: &str| crate::NewVersion {
        name: name.into(),
        hash: hash.into(),
        definition: format!("{{\"v\":\"{hash}\"}}"),
        origin: origin.into(),
    };
    let moves = |hash: &str| crate::Moves {
        machine: "m".into(),
        hash: hash.into(),
        moves: vec![StateMove { version: String::new(), from: "idle".into(), to: "ready".into() }],
    };
    let first = crate::Deploy {
        versions: vec![version("m", "h1", ""), version("n", "n1", "built-in")],
        moves: vec![moves("h1"), crate::Moves { machine: "n".into(), hash: "n1".into(), moves: vec![] }],
        meta: Some(("marker".into(), "first".into())),
        now: T0 + 10,
    };
    assert_eq!(store.machine_deploy(first).await.unwrap(), vec![2, 0]);
    assert_eq!(store.meta_get("marker").await.unwrap().as_deref(), Some("first"));
    let a = super::get(&store, "a").await;
    assert_eq!((a.state.as_str(), a.machine_hash.as_deref(), a.version), ("ready", Some("h1"), 2));
    // A second deploy on a clock set back: still after the first.
    let second = crate::Deploy {
        versions: vec![version("m", "h2", "")],
        meta: Some(("marker".into(), "second".into())),
        now: T0,
        ..Default::default()
    };
    assert_eq!(store.machine_deploy(second).await.unwrap(), Vec::<u64>::new());
    let listed = |records: Vec<crate::MachineRecord>| -> Vec<(String, String, String)> {
        records.into_iter().map(|r| (r.name.to_string(), r.hash, r.origin)).collect()
    };
    let current = |records: &[crate::MachineRecord], name: &str| {
        records.iter().filter(|r| r.name == name).max_by_key(|r| r.created_at).map(|r| r.hash.clone())
    };
    let records = store.machine_list().await.unwrap();
    assert_eq!(current(&records, "m").as_deref(), Some("h2"));
    assert_eq!(
        listed(records),
        [("m", "h1", ""), ("m", "h2", ""), ("n", "n1", "built-in")].map(|(a, b, c)| (
            a.to_string(),
            b.to_string(),
            c.to_string()
        ))
    );
    // The first version deployed again (a roll back) is current again, with its new origin.
    let back = crate::Deploy { versions: vec![version("m", "h1", "again")], now: T0 + 20, ..Default::default() };
    store.machine_deploy(back).await.unwrap();
    let records = store.machine_list().await.unwrap();
    assert_eq!(current(&records, "m").as_deref(), Some("h1"));
    assert_eq!(records.iter().filter(|r| r.name == "m").count(), 2, "one row per version");
    let versions = store.machine_versions().await.unwrap();
    let h1 = versions.iter().find(|(r, _)| r.hash == "h1").unwrap();
    assert_eq!((h1.0.origin.as_str(), h1.1), ("again", 2), "both entities run under h1");
    counts_agree(&store, T0 + 20).await;
}
