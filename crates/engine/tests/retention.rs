//! Retention carried out by the engine, on SQLite and, when `SETTLE_TEST_PG` is set, on
//! PostgreSQL (a schema per test): the periodic job removes entities whose end state's
//! retention passed — `done` after an hour, `failed` after a day — with every row they
//! left, and never a live entity or its latest history; a child that ended stays while its
//! parent lives; `Engine::prune` dry-runs and runs on demand; a pruned key can be created
//! again; a request id is a replay inside the operations' retention and a new request
//! after it; with an archive, each entity is written there whole before it goes, and
//! kept while the archive cannot be written.

mod common;

use std::time::Duration;

use settle_core::Machine;
use settle_core::retention::Defaults;
use settle_engine::{Config, Engine, ManualClock, RaiseOptions, Wait};
use settle_store::{AnyStore, Store};

use common::stores;

fn load(name: &str, text: &str) -> Machine {
    settle_core::toml::load(&format!("{name}.toml"), name, text).expect("loads").0
}

/// A job runs, then is `done` (kept an hour) or `failed` (kept a day); `spawn` creates a
/// `step` child, which ends in `gone` (the deployment's default: two hours here).
const JOB: &str = r#"
initial = "queued"
[states.queued]
[states.running]
[states.done]
kind = "terminal"
[states.failed]
kind = "terminal"
health = "error"
retain = "1d"
[events.start]
in = ["queued"]
action = "to_running"
[events.spawn]
in = ["running"]
action = "spawn_step"
[events.finish]
in = ["running"]
action = "to_done"
[events.fail]
in = ["running"]
action = "to_failed"
[actions.to_running]
to = ["running"]
[actions.spawn_step]
to = ["running"]
create = [{ machine = "step", key = "key + '-step'" }]
may_create = ["step"]
[actions.to_done]
to = ["done"]
[actions.to_failed]
to = ["failed"]

[retention]
ended = "1h"
"#;

const STEP: &str = r#"
initial = "live"
[states.live]
[states.gone]
kind = "deleted"
[events.remove]
in = ["live"]
action = "to_gone"
[actions.to_gone]
to = ["gone"]
"#;

const HOUR: u64 = 3_600_000;

async fn start(store: AnyStore) -> (Engine<AnyStore>, ManualClock) {
    let clock = common::clock();
    let config = Config {
        retention: Defaults::BUILT_IN.with("ended=2h,operations=30m,tasks=1h,minutes=1d").unwrap(),
        prune_every: Duration::from_secs(600),
        prune_limit: 3,
        ..Config::default()
    };
    let engine = Engine::builder(store)
        .config(config)
        .clock(clock.clone())
        .machine(load("job", JOB))
        .machine(load("step", STEP))
        .start()
        .await
        .unwrap();
    (engine, clock)
}

async fn raise(engine: &Engine<AnyStore>, machine: &str, key: &str, event: &str) {
    let r = engine.raise(machine, key, event, RaiseOptions::wait(Wait::Stable)).await.unwrap();
    assert!(matches!(r.outcome, Some(settle_engine::EventOutcome::Accepted { .. })), "{key} {event}: {:?}", r.outcome);
}

async fn exists(engine: &Engine<AnyStore>, machine: &str, key: &str) -> bool {
    engine.store().entity_get(machine, key).await.unwrap().is_some()
}

/// Advances the clock by `ms` and lets the engine run every round that comes due.
async fn pass(engine: &Engine<AnyStore>, clock: &ManualClock, ms: u64) {
    let end = settle_store::Clock::now_ms(clock) + ms as i64;
    loop {
        clock.advance(Duration::from_secs(600));
        engine.wait_caught_up().await.unwrap();
        if settle_store::Clock::now_ms(clock) >= end {
            return;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ended_entities_go_when_their_states_retention_passes_and_live_ones_never() {
    for (_dir, store) in stores("retention_periodic").await {
        let (engine, clock) = start(store).await;
        // Four done jobs (more than one round's limit of 3), one failed, one live with a
        // child that ended, one whose child lives.
        for i in 0..4 {
            let key = format!("ok-{i}");
            engine.create("job", &key, Default::default()).await.unwrap();
            raise(&engine, "job", &key, "start").await;
            raise(&engine, "job", &key, "finish").await;
        }
        for key in ["bad", "live", "parent"] {
            engine.create("job", key, Default::default()).await.unwrap();
            raise(&engine, "job", key, "start").await;
        }
        raise(&engine, "job", "bad", "fail").await;
        raise(&engine, "job", "live", "spawn").await;
        raise(&engine, "step", "live-step", "remove").await;
        raise(&engine, "job", "parent", "spawn").await;
        let live_history = engine.history("job", "live").await.unwrap();
        // A failure is an error row, and SQLite keeps the newest error row until a newer one
        // exists (its id would be handed out again): another job fails after `bad`.
        engine.create("job", "later", Default::default()).await.unwrap();
        raise(&engine, "job", "later", "start").await;
        raise(&engine, "job", "later", "fail").await;
        let newest_op = engine.store().operation_list(None, 1).await.unwrap()[0].request_id.clone();

        // Within the hour nothing goes.
        pass(&engine, &clock, HOUR / 2).await;
        assert!(exists(&engine, "job", "ok-0").await);
        // After it, the done jobs go (in two rounds of at most 3); the failed one stays a day.
        pass(&engine, &clock, HOUR).await;
        for i in 0..4 {
            assert!(!exists(&engine, "job", &format!("ok-{i}")).await, "ok-{i} is pruned");
        }
        assert!(
            engine.history("job", "ok-0").await.is_err() || engine.history("job", "ok-0").await.unwrap().is_empty()
        );
        assert!(exists(&engine, "job", "bad").await, "failed is kept a day");
        // A day later: the failed job goes; the ended child of a live job stays, and so
        // does every live entity with its history.
        pass(&engine, &clock, 25 * HOUR).await;
        assert!(!exists(&engine, "job", "bad").await);
        assert!(exists(&engine, "step", "live-step").await, "its parent lives");
        assert!(exists(&engine, "step", "parent-step").await);
        assert_eq!(engine.history("job", "live").await.unwrap(), live_history);
        // Old operations are gone too (kept 30 minutes).
        // (SQLite keeps the newest operation until a newer one exists: its id would be
        // handed out again.)
        let ops = engine.store().operation_list(None, 1_000).await.unwrap();
        assert!(ops.iter().all(|o| o.request_id == newest_op), "{ops:?}");
        // The pruned keys can be used again.
        engine.create("job", "ok-0", Default::default()).await.unwrap();
        engine.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prune_on_demand_dry_runs_then_removes_exactly_that() {
    for (_dir, store) in stores("retention_on_demand").await {
        let clock = common::clock();
        // No periodic job: only what is asked for.
        let config = Config { prune_every: Duration::ZERO, prune_limit: 2, ..Config::default() };
        let engine = Engine::builder(store)
            .config(config)
            .clock(clock.clone())
            .machine(load("job", JOB))
            .machine(load("step", STEP))
            .start()
            .await
            .unwrap();
        for i in 0..5 {
            let key = format!("j{i}");
            engine.create("job", &key, Default::default()).await.unwrap();
            raise(&engine, "job", &key, "start").await;
            raise(&engine, "job", &key, if i < 4 { "finish" } else { "fail" }).await;
        }
        clock.advance(Duration::from_millis(2 * HOUR));
        let before = engine.store().storage().await.unwrap();
        let mut rounds = 0;
        let dry = engine.prune(Some("job"), true, |_| rounds += 1).await.unwrap();
        assert_eq!(engine.store().storage().await.unwrap(), before, "a dry run changes nothing");
        let keys: Vec<&str> = dry.entities.iter().map(|e| e.key.as_str()).collect();
        assert_eq!(keys, ["j0", "j1", "j2", "j3"], "done after an hour; failed stays a day");
        assert!(rounds >= 2, "rounds of at most 2: {rounds}");
        let done = engine.prune(Some("job"), false, |_| ()).await.unwrap();
        assert_eq!((done.entities, done.rows.history), (dry.entities, dry.rows.history));
        // Every table lost what the rounds counted (the counts tables aside: PostgreSQL
        // keeps its fleet counts in shards, where a delete may add a row).
        let after = engine.store().storage().await.unwrap();
        let table = |s: &settle_store::Storage, t: &str| s.tables.iter().find(|(n, _)| n == t).unwrap().1;
        for (t, n) in done.rows.tables() {
            assert_eq!(table(&before, t) - table(&after, t), n, "{t}");
        }
        assert!(exists(&engine, "job", "j4").await);
        assert!(engine.prune(Some("nope"), true, |_| ()).await.is_err(), "an unknown machine is refused");
        engine.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_id_replays_inside_the_operations_retention_and_is_new_after_it() {
    for (_dir, store) in stores("retention_replay").await {
        let (engine, clock) = start(store).await;
        let req = || Some("req-1".to_string());
        let first = engine.create_with("job", "a", Default::default(), req()).await.unwrap();
        assert!(!first.replayed);
        // Inside the window (operations are kept 30 minutes after they end): a replay,
        // and the id stays bound to what it first asked.
        pass(&engine, &clock, HOUR / 6).await;
        let again = engine.create_with("job", "a", Default::default(), req()).await.unwrap();
        assert!(again.replayed, "a replay inside the window");
        let reused = engine.create_with("job", "b", Default::default(), req()).await;
        assert!(matches!(reused, Err(settle_engine::Error::KeyReused { .. })), "{reused:?}");
        // Newer work (on SQLite the newest operation stays until a newer one exists: its
        // id would be handed out again).
        engine.create("job", "other", Default::default()).await.unwrap();
        // After it the operation is gone: the same id is a new request.
        pass(&engine, &clock, HOUR).await;
        assert!(engine.operation("req-1").await.unwrap().is_none(), "the operation was pruned");
        let later = engine.create_with("job", "b", Default::default(), req()).await.unwrap();
        assert!(!later.replayed, "a new request after the window");
        assert!(exists(&engine, "job", "a").await && exists(&engine, "job", "b").await);
        engine.shutdown().await;
    }
}

/// The states a history entered, row by row (`None`: a row that entered none).
fn states(history: &[settle_store::HistoryRow]) -> Vec<Option<String>> {
    history.iter().map(|h| h.to.as_deref().map(str::to_string)).collect()
}

/// The archive's whole lines in `dir`, in file order: (key, machine, history `to` states).
fn archived(dir: &std::path::Path) -> Vec<(String, String, Vec<Option<String>>)> {
    let Ok(files) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut files: Vec<_> = files.map(|f| f.unwrap().path()).collect();
    files.sort();
    let mut out = Vec::new();
    for f in files {
        for line in std::fs::read_to_string(&f).unwrap().lines() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            let to = v["history"].as_array().unwrap().iter().map(|h| h["to"].as_str().map(str::to_string)).collect();
            out.push((v["key"].as_str().unwrap().into(), v["machine"].as_str().unwrap().into(), to));
        }
    }
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn archive_then_delete_writes_each_entity_whole_before_it_goes() {
    for (dir, store) in stores("retention_archive").await {
        let clock = common::clock();
        let archive = dir.path().join("archive");
        // Every write starts a new file (rotated at one byte); `every`: the periodic job's.
        let start = |store: AnyStore, every: Duration| {
            let config = Config {
                retention: Defaults::BUILT_IN.with("ended=2h").unwrap(),
                prune_every: every,
                prune_limit: 3,
                archive: Some(settle_engine::ArchiveConfig { dir: archive.clone(), rotate_bytes: 1 }),
                ..Config::default()
            };
            // `step` says it is not archived; `job` is, as the deployment has an archive.
            let step = format!("{STEP}\n[retention]\narchive = false\n");
            Engine::builder(store)
                .config(config)
                .clock(clock.clone())
                .machine(load("job", JOB))
                .machine(load("step", &step))
                .start()
        };
        let engine = start(store.clone(), Duration::from_secs(600)).await.unwrap();
        let mut expect = Vec::new();
        for i in 0..5 {
            let key = format!("ok-{i}");
            engine.create("job", &key, Default::default()).await.unwrap();
            raise(&engine, "job", &key, "start").await;
            raise(&engine, "job", &key, "finish").await;
            let to = states(&engine.history("job", &key).await.unwrap());
            expect.push((key, "job".to_string(), to));
        }
        engine.create("job", "p", Default::default()).await.unwrap();
        for event in ["start", "spawn", "finish"] {
            raise(&engine, "job", "p", event).await;
        }
        raise(&engine, "step", "p-step", "remove").await;
        // A live job, newer than all of them (SQLite keeps the newest entity and history row
        // until a newer one exists).
        engine.create("job", "fresh", Default::default()).await.unwrap();
        expect.push(("p".into(), "job".into(), states(&engine.history("job", "p").await.unwrap())));
        expect.sort();

        // The periodic job (rounds of 3): the jobs archived then removed, the step removed
        // without being archived.
        pass(&engine, &clock, 3 * HOUR).await;
        assert!(!exists(&engine, "job", "ok-0").await && !exists(&engine, "step", "p-step").await);
        assert_eq!(archived(&archive), expect);
        let files = std::fs::read_dir(&archive).unwrap().count();
        assert!(files >= 2, "rotated: {files} file(s)");

        // On demand alone from here (no periodic job racing the calls below).
        engine.shutdown().await;
        let engine = start(store, Duration::ZERO).await.unwrap();
        // An archive that cannot be written: nothing is removed, the error says where.
        let moved = dir.path().join("moved");
        std::fs::rename(&archive, &moved).unwrap();
        std::fs::write(&archive, "not a directory").unwrap();
        engine.create("job", "late", Default::default()).await.unwrap();
        raise(&engine, "job", "late", "start").await;
        raise(&engine, "job", "late", "finish").await;
        engine.create("job", "fresh-2", Default::default()).await.unwrap();
        clock.advance(Duration::from_millis(3 * HOUR));
        let e = engine.prune(None, false, |_| ()).await.unwrap_err();
        assert!(e.to_string().contains("archiving to") && e.to_string().contains("nothing was removed"), "{e}");
        assert!(exists(&engine, "job", "late").await, "kept while its archive failed");
        // Once it can, the same entity is archived, then removed.
        std::fs::remove_file(&archive).unwrap();
        let report = engine.prune(None, false, |_| ()).await.unwrap();
        assert_eq!(report.entities.iter().map(|e| e.key.as_str()).collect::<Vec<_>>(), ["late"]);
        assert!(!exists(&engine, "job", "late").await);
        assert_eq!(archived(&archive).iter().map(|l| l.0.as_str()).collect::<Vec<_>>(), ["late"]);
        engine.shutdown().await;

        // A machine that asks for an archive where there is none is refused at start.
        let (_d, sqlite) = common::sqlite();
        let wants = format!("{JOB}archive = true\n");
        let e = Engine::builder(AnyStore::Sqlite(sqlite)).machine(load("job", &wants)).start().await.err().unwrap();
        assert!(e.to_string().contains("machine `job` archives"), "{e}");
    }
}

/// A live entity that goes back and forth between `a` and `b`.
const PINGER: &str = r#"
initial = "a"
[states.a]
[states.b]
[events.to_b]
in = ["a"]
action = "go_b"
[events.to_a]
in = ["b"]
action = "go_a"
[actions.go_b]
to = ["b"]
[actions.go_a]
to = ["a"]
"#;

/// Flips `key` of `machine` `n` times.
async fn flip(engine: &Engine<AnyStore>, machine: &str, key: &str, n: usize) {
    for _ in 0..n {
        let state = engine.store().entity_get(machine, key).await.unwrap().unwrap().state;
        raise(engine, machine, key, if state.as_str() == "a" { "to_b" } else { "to_a" }).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_entity_keeps_its_latest_past_by_count_and_by_age() {
    for (_dir, store) in stores("retention_live").await {
        let clock = common::clock();
        let config = Config {
            retention: Defaults::BUILT_IN.with("history=1h").unwrap(),
            prune_every: Duration::ZERO,
            ..Config::default()
        };
        let counted = format!("{PINGER}\n[retention]\nhistory = \"forever\"\nhistory_rows = 4\n");
        let engine = Engine::builder(store)
            .config(config)
            .clock(clock.clone())
            .machine(load("counted", &counted))
            .machine(load("aged", PINGER))
            .start()
            .await
            .unwrap();
        // By count: at most the latest 4, plus what came since the last trim (one in 16
        // state entries trims).
        engine.create("counted", "c", Default::default()).await.unwrap();
        flip(&engine, "counted", "c", 40).await;
        let h = engine.history("counted", "c").await.unwrap();
        assert!(h.len() >= 4 && h.len() <= 4 + 16, "{} rows", h.len());
        assert_eq!(h.last().unwrap().to.as_deref(), Some("a"), "the latest (40 flips from `a`) stays");
        let events = engine.store().events_list(engine.store().entity_get("counted", "c").await.unwrap().unwrap().id);
        assert!(events.await.unwrap().len() <= 4 + 16);
        // By age (the deployment's `history`): rows older than an hour go, the latest stays.
        engine.create("aged", "g", Default::default()).await.unwrap();
        flip(&engine, "aged", "g", 20).await;
        assert_eq!(engine.history("aged", "g").await.unwrap().len(), 21, "nothing is an hour old yet");
        clock.advance(Duration::from_millis(2 * HOUR));
        flip(&engine, "aged", "g", 16).await;
        let h = engine.history("aged", "g").await.unwrap();
        let now = settle_store::Clock::now_ms(&clock);
        assert!(!h.is_empty() && h.len() <= 16, "{} rows", h.len());
        assert!(h.iter().all(|r| r.at >= now - HOUR as i64), "{h:?}");
        engine.shutdown().await;
    }
}
