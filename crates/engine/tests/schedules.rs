//! Calendar schedules on a manual clock, on SQLite and, when `SETTLE_TEST_PG` is set, on
//! PostgreSQL: a schedule raising an event on each entity in a state fires on time, then,
//! after a three-day downtime, each catch-up policy fires what it says and counts the
//! rest as missed; overlap policies decide what a creating schedule fires while its last
//! fire's entity still works; a paused schedule fires nothing and resumes from the next
//! fire after now.

mod common;

use std::time::Duration;

use settle_core::machine::{CalendarCreate, CalendarDef};
use settle_core::{Machine, MachineBuilder};
use settle_engine::{Engine, ScheduleView};
use settle_store::{AnyStore, EntityFilter, HistoryKind, ManualClock, Store};

use common::{T0, settle_at, stores};

const HOUR: u64 = 3_600_000;

/// `name`: new -go→ ready; `backup` in ready re-enters it. An hourly schedule raises
/// `backup` on each entity in ready, with catch-up policy `catch_up`.
fn fleet(name: &str, catch_up: &str, limit: Option<u32>) -> Machine {
    MachineBuilder::new(name)
        .state("new")
        .initial()
        .state("ready")
        .event("go", ["new"], "up")
        .event("backup", ["ready"], "copy")
        .action("up", ["ready"])
        .action("copy", ["ready"])
        .schedule(CalendarDef {
            name: "hourly".into(),
            cron: "0 * * * *".into(),
            raise: Some("backup".into()),
            valid_in: vec!["ready".into()],
            catch_up: Some(catch_up.into()),
            catch_up_limit: limit,
            overlap: Some("allow_all".into()),
            ..CalendarDef::default()
        })
        .build()
        .unwrap()
}

/// `name`: each hour a `working` entity is created; it works for 90 minutes (its auto
/// action waits), then is `done`. Overlap policy `overlap`.
fn reports(name: &str, overlap: &str) -> Machine {
    MachineBuilder::new(name)
        .state("working")
        .initial()
        .auto("finish")
        .wait(Duration::from_secs(90 * 60))
        .state("done")
        .action("finish", ["done"])
        .schedule(CalendarDef {
            name: "hourly".into(),
            cron: "0 * * * *".into(),
            create: Some(CalendarCreate::default()),
            overlap: Some(overlap.into()),
            ..CalendarDef::default()
        })
        .build()
        .unwrap()
}

async fn engine(store: &AnyStore, clock: &ManualClock, machines: Vec<Machine>) -> Engine<AnyStore> {
    let mut b = Engine::builder(store.clone()).clock(clock.clone());
    for m in machines {
        b = b.machine(m);
    }
    b.start().await.unwrap()
}

async fn view(engine: &Engine<AnyStore>, machine: &str) -> ScheduleView {
    engine.schedules().await.unwrap().into_iter().find(|v| v.machine == machine).unwrap()
}

/// The `backup` events an entity took, by request id.
async fn backups(engine: &Engine<AnyStore>, machine: &str, key: &str) -> Vec<String> {
    let history = engine.history(machine, key).await.unwrap();
    history
        .iter()
        .filter(|h| h.kind != HistoryKind::Command && h.event.as_deref() == Some("backup"))
        .filter_map(|h| h.request_id.clone())
        .collect()
}

use settle_store::Clock as _;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedule_fires_on_time_then_catches_up_after_three_days_down_by_its_policy() {
    for (_dir, store) in stores("schedule_catch_up").await {
        let clock = ManualClock::new(T0);
        let machines = || vec![fleet("once", "once", None), fleet("all", "all", Some(5)), fleet("skip", "skip", None)];
        let e = engine(&store, &clock, machines()).await;
        for m in ["once", "all", "skip"] {
            for k in ["a", "b"] {
                e.create(m, k, Default::default()).await.unwrap();
                e.raise(m, k, "go", Default::default()).await.unwrap();
            }
        }
        let first = view(&e, "once").await.row.unwrap();
        assert_eq!(first.next_fire, T0 + HOUR as i64, "the first fire after the start: 01:00");
        // 01:00: each fires once, on time, on each entity in `ready`.
        let all_fired = |n: u64| {
            let e = e.clone();
            move || {
                let e = e.clone();
                async move {
                    let views = e.schedules().await.unwrap();
                    views.iter().all(|v| v.row.as_ref().is_some_and(|r| r.fired + r.missed >= n))
                        && e.bulk_list(100).await.unwrap().iter().all(|b| b.status != "running")
                }
            }
        };
        settle_at(&clock, T0 + HOUR as i64 + 5, all_fired(1)).await;
        e.wait_idle().await.unwrap();
        let id = |m: &str, at: &str| format!("schedule:{m}:hourly:{at}");
        let a = e.get("once", "a").await.unwrap().unwrap();
        assert_eq!(
            backups(&e, "once", "a").await,
            [format!("{}/ready/{}", id("once", "2026-01-01T01:00:00.000Z"), a.id)]
        );
        e.shutdown().await;

        // Down for three days and ten minutes: 72 fires (02:00 on day one to 01:00 on day
        // four) were due when an engine runs again.
        clock.advance(Duration::from_millis(3 * 24 * HOUR + 10 * 60_000));
        let e = engine(&store, &clock, machines()).await;
        settle_at(&clock, clock.now_ms(), all_fired(73)).await;
        e.wait_idle().await.unwrap();
        let row = |v: ScheduleView| v.row.unwrap();
        let once = row(view(&e, "once").await);
        assert_eq!((once.fired, once.missed, once.skipped), (2, 71, 0), "once: the latest for them all");
        assert_eq!(once.last_fire, Some(T0 + 73 * HOUR as i64));
        assert_eq!(once.next_fire, T0 + 74 * HOUR as i64);
        let all = row(view(&e, "all").await);
        assert_eq!((all.fired, all.missed), (6, 67), "all: the latest five");
        let skip = row(view(&e, "skip").await);
        assert_eq!((skip.fired, skip.missed), (1, 72), "skip: none of them");
        // What each entity took.
        assert_eq!(backups(&e, "once", "b").await.len(), 2);
        let latest = backups(&e, "all", "b").await;
        assert_eq!(latest.len(), 6);
        assert!(latest[1].starts_with(&id("all", "2026-01-03T21:00:00.000Z")), "{latest:?}");
        assert!(latest[5].starts_with(&id("all", "2026-01-04T01:00:00.000Z")), "{latest:?}");
        assert_eq!(backups(&e, "skip", "b").await.len(), 1);
        e.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlap_policies_decide_while_the_last_fire_still_works() {
    for (_dir, store) in stores("schedule_overlap").await {
        let clock = ManualClock::new(T0);
        let machines = vec![reports("skip", "skip"), reports("buffer", "buffer_one"), reports("allow", "allow_all")];
        let e = engine(&store, &clock, machines).await;
        let keys = |m: &'static str| {
            let e = e.clone();
            async move {
                let f = EntityFilter { machine: Some(m.into()), ..EntityFilter::default() };
                let rows = e.store().entity_list(f).await.unwrap();
                rows.into_iter().map(|r| r.key.to_string()).collect::<Vec<_>>()
            }
        };
        let decided = |hours: i64| {
            let e = e.clone();
            move || {
                let e = e.clone();
                async move {
                    let views = e.schedules().await.unwrap();
                    views.iter().all(|v| v.row.as_ref().is_some_and(|r| r.next_fire > T0 + hours * HOUR as i64))
                }
            }
        };
        // 01:00: each creates its first entity, which works until 02:30.
        settle_at(&clock, T0 + HOUR as i64 + 1, decided(1)).await;
        for m in ["skip", "buffer", "allow"] {
            assert_eq!(keys(m).await, ["hourly-2026-01-01T01:00:00.000Z"], "{m}");
        }
        // 02:00: the first still works. skip skips, buffer holds, allow creates.
        settle_at(&clock, T0 + 2 * HOUR as i64 + 1, decided(2)).await;
        assert_eq!(keys("skip").await.len(), 1);
        assert_eq!(keys("buffer").await.len(), 1);
        assert_eq!(view(&e, "buffer").await.row.unwrap().buffered, Some(T0 + 2 * HOUR as i64));
        assert_eq!(keys("allow").await.len(), 2);
        // 02:30: the first is done; the held fire fires (within a second).
        let held_fired = || {
            let e = e.clone();
            async move { view(&e, "buffer").await.row.unwrap().buffered.is_none() }
        };
        settle_at(&clock, T0 + 150 * 60_000 + 1_500, held_fired).await;
        assert_eq!(keys("buffer").await, ["hourly-2026-01-01T01:00:00.000Z", "hourly-2026-01-01T02:00:00.000Z"]);
        // 03:00: skip's first is done: it creates; buffer's second (02:30 to 04:00) still
        // works: held again; allow creates its third.
        settle_at(&clock, T0 + 3 * HOUR as i64 + 1, decided(3)).await;
        assert_eq!(keys("skip").await, ["hourly-2026-01-01T01:00:00.000Z", "hourly-2026-01-01T03:00:00.000Z"]);
        assert_eq!(keys("buffer").await.len(), 2);
        assert_eq!(view(&e, "buffer").await.row.unwrap().buffered, Some(T0 + 3 * HOUR as i64));
        assert_eq!(keys("allow").await.len(), 3);
        let counts = |v: ScheduleView| v.row.map(|r| (r.fired, r.skipped, r.missed)).unwrap();
        assert_eq!(counts(view(&e, "skip").await), (2, 1, 0));
        assert_eq!(counts(view(&e, "buffer").await), (2, 0, 0));
        assert_eq!(counts(view(&e, "allow").await), (3, 0, 0));
        e.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_schedule_fires_nothing_and_resumes_from_its_next_fire() {
    for (_dir, store) in stores("schedule_pause").await {
        let clock = ManualClock::new(T0);
        let e = engine(&store, &clock, vec![reports("r", "allow_all")]).await;
        let paused = e.schedule_pause("r", "hourly", true).await.unwrap();
        assert!(paused.paused);
        // 01:00 and 02:00 pass: nothing.
        clock.advance(Duration::from_millis(2 * HOUR + 60_000));
        e.wait_idle().await.unwrap();
        let resumed = e.schedule_pause("r", "hourly", false).await.unwrap();
        assert_eq!(
            (resumed.paused, resumed.next_fire, resumed.fired, resumed.missed),
            (false, T0 + 3 * HOUR as i64, 0, 0)
        );
        let created = || {
            let e = e.clone();
            async move { view(&e, "r").await.row.unwrap().fired == 1 }
        };
        settle_at(&clock, T0 + 3 * HOUR as i64 + 1, created).await;
        let rows =
            e.store().entity_list(EntityFilter { machine: Some("r".into()), ..EntityFilter::default() }).await.unwrap();
        assert_eq!(rows.iter().map(|r| r.key.to_string()).collect::<Vec<_>>(), ["hourly-2026-01-01T03:00:00.000Z"]);
        let unknown = e.schedule_pause("r", "nightly", true).await.unwrap_err();
        assert_eq!(unknown.to_string(), "machine `r` has no schedule `nightly`");
        e.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daily_schedule_keeps_its_wall_clock_time_across_daylight_saving_changes() {
    for (_dir, store) in stores("schedule_dst").await {
        // 2026-03-27T12:00Z; Paris moves its clocks forward on the 29th (02:00 → 03:00).
        let start = settle_core::time::parse_time("2026-03-27T12:00:00Z", 0).unwrap();
        let clock = ManualClock::new(start);
        let m = MachineBuilder::new("db")
            .state("ready")
            .initial()
            .event("backup", ["ready"], "copy")
            .action("copy", ["ready"])
            .schedule(CalendarDef {
                name: "nightly".into(),
                cron: "30 2 * * *".into(),
                zone: Some("Europe/Paris".into()),
                raise: Some("backup".into()),
                valid_in: vec!["ready".into()],
                ..CalendarDef::default()
            })
            .build()
            .unwrap();
        let e = engine(&store, &clock, vec![m]).await;
        e.create("db", "d1", Default::default()).await.unwrap();
        let mut fires = Vec::new();
        for day in 1..=4 {
            let fired = |n: u64| {
                let e = e.clone();
                move || {
                    let e = e.clone();
                    async move {
                        view(&e, "db").await.row.is_some_and(|r| r.fired >= n)
                            && e.bulk_list(10).await.unwrap().iter().all(|b| b.status != "running")
                    }
                }
            };
            settle_at(&clock, start + day * 86_400_000, fired(day as u64)).await;
            // Each night's backup done before the next (`overlap = "skip"` would skip it).
            e.wait_idle().await.unwrap();
            fires.push(settle_core::time::format_time(view(&e, "db").await.row.unwrap().last_fire.unwrap()));
        }
        assert_eq!(
            fires,
            [
                "2026-03-28T01:30:00.000Z", // 02:30 CET
                "2026-03-29T01:00:00.000Z", // 02:30 does not exist that night: 03:00 CEST, the first instant after
                "2026-03-30T00:30:00.000Z", // 02:30 CEST
                "2026-03-31T00:30:00.000Z",
            ]
        );
        assert_eq!(backups(&e, "db", "d1").await.len(), 4, "each night once");
        assert_eq!(view(&e, "db").await.row.map(|r| (r.skipped, r.missed)), Some((0, 0)));
        e.shutdown().await;
    }
}
