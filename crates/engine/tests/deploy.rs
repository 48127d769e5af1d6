//! Definitions deployed to a running engine, on SQLite and, when `SETTLE_TEST_PG` is set,
//! on PostgreSQL, on a manual clock: a pinned machine's working entities finish under the
//! version they started with, then move; those at rest move at once; new ones start under
//! the new version; a version that would strand live entities is refused with their keys
//! and changes nothing; a migrating machine moves everyone at once; another instance takes
//! a deploy up without a restart.

mod common;

use std::time::Duration;

use settle_core::Machine;
use settle_engine::{Engine, Error, RaiseOptions, Wait};
use settle_store::{AnyStore, ManualClock, Store};

use common::{T0, settle_at, stores};

/// `job`, version `v`: new -start→ working, whose auto action waits an hour, then `finish`
/// records `v` and enters `done` (named `finished` from version 2 on, `renamed_from` done).
/// `pin` unless `migrate`; `drop_end` leaves the end state out (version 3).
fn job(v: u32, migrate: bool, drop_end: bool) -> Machine {
    let end = if v >= 2 { "finished" } else { "done" };
    let renamed = if v >= 2 { "renamed_from = [\"done\"]\n" } else { "" };
    let end_state = if drop_end { String::new() } else { format!("[states.{end}]\n{renamed}") };
    let target = if drop_end { "working" } else { end };
    let upgrade = if migrate { "" } else { "upgrade = \"pin\"\n" };
    let text = format!(
        "initial = \"new\"\n{upgrade}[states.new]\n[states.working]\nauto = \"finish\"\nwait = \"1h\"\n{end_state}\
         [events.start]\nin = [\"new\"]\naction = \"begin\"\n[actions.begin]\nto = [\"working\"]\n\
         [actions.finish]\nto = [\"{target}\"]\nset = {{ v = {v} }}\n"
    );
    settle_core::toml::load("job.toml", "job", &text).unwrap().0
}

async fn engine(store: &AnyStore, clock: &ManualClock, machine: Machine) -> Engine<AnyStore> {
    Engine::builder(store.clone()).clock(clock.clone()).machine(machine).start().await.unwrap()
}

/// (state, version hash, `v` property) of `key`.
async fn at(e: &Engine<AnyStore>, key: &str) -> (String, String, Option<u64>) {
    let r = e.get("job", key).await.unwrap().unwrap();
    (r.state.to_string(), r.machine_hash.unwrap_or_default(), r.properties.get("v").and_then(|v| v.as_u64()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pinned_entities_finish_on_their_version_then_move_and_a_stranding_version_is_refused() {
    for (_dir, store) in stores("deploy_pin").await {
        let clock = ManualClock::new(T0);
        let (v1, v2) = (job(1, false, false), job(2, false, false));
        let (h1, h2) = (v1.content_hash(), v2.content_hash());
        let e = engine(&store, &clock, v1).await;
        for k in ["w1", "w2", "r1"] {
            e.create("job", k, Default::default()).await.unwrap();
        }
        for k in ["w1", "w2"] {
            e.raise("job", k, "start", RaiseOptions::wait(Wait::Outcome)).await.unwrap();
            assert_eq!(at(&e, k).await, ("working".into(), h1.clone(), None));
        }

        // A dry run changes nothing.
        let dry = e.deploy(vec![v2.clone()], true).await.unwrap();
        assert_eq!((dry[0].moved, dry[0].pinned, dry[0].upgrade), (1, 2, "pin"));
        assert_eq!(e.machine("job").unwrap().content_hash(), h1);

        let done = e.deploy(vec![v2.clone()], false).await.unwrap();
        assert_eq!(done.len(), 1);
        let d = &done[0];
        assert_eq!(
            (d.version.as_str(), d.previous.as_deref(), d.moved, d.pinned),
            (h2.as_str(), Some(h1.as_str()), 1, 2)
        );
        assert_eq!(e.machine("job").unwrap().content_hash(), h2, "new entities start under v2");
        // At rest: moved at once. Working: still under v1.
        assert_eq!(at(&e, "r1").await, ("new".into(), h2.clone(), None));
        assert_eq!(at(&e, "w1").await.1, h1);
        let by_version = e.store().entity_count_by_version("job").await.unwrap();
        let mut want = vec![(h1.clone(), "working".to_string(), 2), (h2.clone(), "new".to_string(), 1)];
        want.sort();
        assert_eq!(by_version, want);

        // Deploying the same version again changes nothing.
        let again = e.deploy(vec![v2.clone()], false).await.unwrap();
        assert!(again[0].unchanged);

        // r1 starts under v2; an hour on, the pinned ones finish under v1 (v = 1), then move
        // (v1's `done` is v2's `finished`); r1 finishes under v2.
        e.raise("job", "r1", "start", RaiseOptions::wait(Wait::Outcome)).await.unwrap();
        let later = T0 + 3_600_000 + 1_000;
        settle_at(&clock, later, || async {
            let mut all = true;
            for k in ["w1", "w2", "r1"] {
                all &= at(&e, k).await.0 == "finished";
            }
            all
        })
        .await;
        for k in ["w1", "w2"] {
            assert_eq!(at(&e, k).await, ("finished".into(), h2.clone(), Some(1)), "{k} finished on v1, then moved");
        }
        assert_eq!(at(&e, "r1").await, ("finished".into(), h2.clone(), Some(2)));

        // v3 has no end state: the finished ones would be stranded, and so would w3 (working
        // under v2), which can only come to rest in `finished`.
        e.create("job", "w3", Default::default()).await.unwrap();
        e.raise("job", "w3", "start", RaiseOptions::wait(Wait::Outcome)).await.unwrap();
        let v3 = job(3, false, true);
        let err = e.deploy(vec![v3], false).await.unwrap_err();
        let Error::UpgradeRefused { message, stranded } = &err else { panic!("{err}") };
        let listed: Vec<(&str, Option<&str>, u64, Vec<&str>)> = stranded
            .iter()
            .map(|s| (s.state.as_str(), s.rest.as_deref(), s.count, s.keys.iter().map(String::as_str).collect()))
            .collect();
        assert_eq!(
            listed,
            [("finished", None, 3, vec!["w1", "w2", "r1"]), ("working", Some("finished"), 1, vec!["w3"])],
            "{message}"
        );
        assert!(message.contains("in `finished`: w1, w2, r1"), "{message}");
        assert_eq!(e.machine("job").unwrap().content_hash(), h2, "a refused deploy changes nothing");
        assert_eq!(e.store().machine_list().await.unwrap().len(), 2);
        e.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migrating_machine_moves_every_entity_at_once() {
    for (_dir, store) in stores("deploy_migrate").await {
        let clock = ManualClock::new(T0);
        let (v1, v2) = (job(1, true, false), job(2, true, false));
        let (h1, h2) = (v1.content_hash(), v2.content_hash());
        let e = engine(&store, &clock, v1).await;
        e.create("job", "d1", Default::default()).await.unwrap();
        e.raise("job", "d1", "start", RaiseOptions::wait(Wait::Outcome)).await.unwrap();
        settle_at(&clock, T0 + 3_600_000 + 1_000, || async { at(&e, "d1").await.0 == "done" }).await;
        assert_eq!(at(&e, "d1").await.1, h1);
        e.create("job", "w1", Default::default()).await.unwrap();
        e.raise("job", "w1", "start", RaiseOptions::wait(Wait::Outcome)).await.unwrap();
        let d = e.deploy(vec![v2], false).await.unwrap();
        assert_eq!((d[0].moved, d[0].pinned, d[0].upgrade), (2, 0, "migrate"));
        assert_eq!(at(&e, "d1").await, ("finished".into(), h2.clone(), Some(1)), "renamed at once");
        assert_eq!(at(&e, "w1").await.1, h2, "a working entity moves too");
        settle_at(&clock, T0 + 2 * 3_600_000 + 2_000, || async { at(&e, "w1").await.0 == "finished" }).await;
        assert_eq!(at(&e, "w1").await, ("finished".into(), h2, Some(2)), "and finishes under v2");
        e.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_instance_takes_a_deploy_up_without_a_restart() {
    let Some(url) = settle_store::postgres::test_url("deploy_instances") else {
        eprintln!("skipped: SETTLE_TEST_PG is not set (PostgreSQL)");
        return;
    };
    let open = |url: String| async move {
        tokio::task::spawn_blocking(move || settle_store::PgStore::open(&url)).await.unwrap().unwrap()
    };
    let (a, b) = (AnyStore::Postgres(open(url.clone()).await), AnyStore::Postgres(open(url).await));
    let clock = ManualClock::new(T0);
    let (v1, v2) = (job(1, false, false), job(2, false, false));
    let ea = engine(&a, &clock, v1.clone()).await;
    let eb = engine(&b, &clock, v1).await;
    ea.deploy(vec![v2.clone()], false).await.unwrap();
    // Within its poll (a second) without being asked; `reload` takes it up at once.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while eb.machine("job").unwrap().content_hash() != v2.content_hash() {
        assert!(tokio::time::Instant::now() < deadline, "the other instance never took the deploy up");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eb.reload().await.unwrap();
    let created = eb.create("job", "b1", Default::default()).await.unwrap();
    assert_eq!(created.machine_hash.as_deref(), Some(v2.content_hash().as_str()));
    // A restart with the older definition runs the version deployed since.
    eb.shutdown().await;
    drop(eb);
    let eb = engine(&b, &clock, job(1, false, false)).await;
    assert_eq!(eb.machine("job").unwrap().content_hash(), v2.content_hash());
    eb.shutdown().await;
    ea.shutdown().await;
}
