//! `settle bench schedule`: what a calendar schedule over a large fleet costs. It writes N
//! entities in `ready` of a machine whose schedule raises `tick` on each entity in
//! `ready`, once, at an instant `--lead` from now (a cron expression naming that second);
//! restarts the engine (as a restarted process would); and reports:
//!
//! - the RSS of this process while the restarted engine waits for the fire (the entities
//!   cost a schedule nothing while they wait: the schedule is one row), and its peak;
//! - how late the fire started (its bulk operation's start minus the instant);
//! - how long from the instant until every entity took its event, and the entities a
//!   second that makes; that every entity took it exactly once.
//!
//! The entities are written straight to the store in batches, as `bench fleet` seeds.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::bail;
use serde_json::json;
use settle_core::machine::{CalendarDef, Machine, MachineBuilder};
use settle_engine::Engine;
use settle_store::{AnyStore, EntityFilter, Store};

use super::fleet::{SEED_BATCH, at_rest, write_creates};
use super::measure::round3;

/// Options of `settle bench schedule`.
#[derive(clap::Args, Debug)]
pub struct ScheduleArgs {
    /// Entities the schedule reaches.
    #[arg(long, default_value_t = 100_000)]
    entities: usize,
    /// The fire comes this long after the entities are written (time for the restart and
    /// the idle RSS sample).
    #[arg(long, default_value = "10s")]
    lead: String,
    /// Entities a second the fire may reach (the schedule's `rate`).
    #[arg(long, default_value_t = 100_000)]
    rate: u32,
    /// Print one JSON line.
    #[arg(long)]
    json: bool,
}

const MACHINE: &str = "scheduled";

/// `ready` -tick→ `ticked`; the schedule `once` raises `tick` on each entity in `ready` at
/// `cron` (UTC).
fn machine(cron: &str, rate: u32) -> Machine {
    MachineBuilder::new(MACHINE)
        .state("ready")
        .initial()
        .state("ticked")
        .event("tick", ["ready"], "mark")
        .action("mark", ["ticked"])
        .schedule(CalendarDef {
            name: "once".into(),
            cron: cron.into(),
            raise: Some("tick".into()),
            valid_in: vec!["ready".into()],
            rate: Some(rate),
            ..CalendarDef::default()
        })
        .build()
        .expect("the scheduled machine is valid")
}

/// The cron expression naming the second of `at` (ms, UTC): `S M H D Mo *`.
fn cron_at(at: i64) -> String {
    let t = settle_core::time::format_time(at);
    // 2026-11-27T10:30:05.000Z
    let field = |a: usize, b: usize| t[a..b].trim_start_matches('0').to_string();
    let num = |s: String| if s.is_empty() { "0".to_string() } else { s };
    format!(
        "{} {} {} {} {} *",
        num(field(17, 19)),
        num(field(14, 16)),
        num(field(11, 13)),
        num(field(8, 10)),
        num(field(5, 7))
    )
}

pub async fn schedule(db: &str, args: ScheduleArgs) -> anyhow::Result<ExitCode> {
    let lead = settle_core::duration::parse(&args.lead).map_err(|e| anyhow::anyhow!("--lead: {e}"))?;
    if args.entities == 0 || !(1..=100_000).contains(&args.rate) {
        bail!("--entities must be at least 1 and --rate from 1 to 100000");
    }
    // The fire: a whole second, at least `lead` from now.
    let instant = (settle_store::clock::now_ms() + lead.as_millis() as i64) / 1000 * 1000 + 1000;
    let m = machine(&cron_at(instant), args.rate);

    // Phase 1: the fleet, written straight to the store.
    let engine = Engine::builder(AnyStore::open(db)?)
        .origin(crate::defs::ORIGIN)
        .machine(m.clone())
        .config(idle())
        .start()
        .await?;
    let seeding = Instant::now();
    let mut last = Instant::now();
    let mut i = 0;
    while i < args.entities {
        let end = (i + SEED_BATCH).min(args.entities);
        let ops = (i..end).map(|n| at_rest(MACHINE, format!("s-{n:07}"), "ready", Vec::new())).collect();
        write_creates(engine.store(), ops).await?;
        i = end;
        if last.elapsed() >= Duration::from_secs(2) {
            eprintln!("{i} of {} entities written", args.entities);
            last = Instant::now();
        }
    }
    let seed_s = seeding.elapsed().as_secs_f64();
    engine.shutdown().await;
    drop(engine);
    if settle_store::clock::now_ms() + 1_000 > instant {
        bail!("writing took longer than --lead ({seed_s:.1} s): raise it");
    }

    // Phase 2: restart, sample RSS while the fleet waits for the fire.
    let restarted = Instant::now();
    let engine = Engine::builder(AnyStore::open(db)?).origin(crate::defs::ORIGIN).machine(m).start().await?;
    let start_ms = restarted.elapsed().as_secs_f64() * 1000.0;
    let until = (instant - settle_store::clock::now_ms() - 500).max(0) as u64;
    tokio::time::sleep(Duration::from_millis(until.min(3_000))).await;
    let rss_idle = super::measure::rss_mb();
    eprintln!("{} entities wait for the fire at {}", args.entities, settle_core::time::format_time(instant));

    // Phase 3: the fire, until every entity took its event.
    let bulk = format!("{}/ready", settle_core::calendar::fire_id(MACHINE, "once", instant));
    let wait = Duration::from_secs(60) + Duration::from_secs((args.entities as u64 / u64::from(args.rate)) * 2);
    let deadline =
        Instant::now() + wait + Duration::from_millis((instant - settle_store::clock::now_ms()).max(0) as u64);
    let row = loop {
        if let Some(row) = engine.bulk_get(&bulk).await? {
            break engine.bulk_wait(&bulk, wait).await.map(|_| row)?;
        }
        if Instant::now() > deadline {
            bail!("the schedule had not fired {} s after its instant", wait.as_secs());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    tokio::time::timeout(wait, engine.wait_idle())
        .await
        .map_err(|_| anyhow::anyhow!("the events were not all processed"))??;
    let done_ms = settle_store::clock::now_ms() - instant;
    let count = |state: &str| {
        let f = EntityFilter { machine: Some(MACHINE.into()), state: Some(state.into()), ..EntityFilter::default() };
        engine.store().entity_count(f, u64::MAX - 1)
    };
    let (ticked, left) = (count("ticked").await?, count("ready").await?);
    let views = engine.schedules().await?;
    let fired = views.first().and_then(|v| v.row.as_ref()).map_or(0, |r| r.fired);
    let bulk_row = engine.bulk_get(&bulk).await?.unwrap_or(row);
    engine.shutdown().await;
    if ticked != args.entities as u64 || left != 0 || bulk_row.done != args.entities as u64 || fired != 1 {
        bail!(
            "the fire reached {ticked} of {} entities ({left} left in ready, bulk done {}, fires {fired})",
            args.entities,
            bulk_row.done
        );
    }
    let v = json!({
        "entities": args.entities,
        "rate": args.rate,
        "seed_s": round3(seed_s),
        "restart_ms": round3(start_ms),
        "rss_idle_mb": round3(rss_idle),
        "peak_rss_mb": round3(super::measure::peak_rss_mb()),
        "fire_late_ms": bulk_row.created_at - instant,
        "all_ticked_after_ms": done_ms,
        "entities_per_s": round3(args.entities as f64 / (done_ms.max(1) as f64 / 1000.0)),
        "ticked": ticked,
    });
    if args.json {
        println!("{v}");
    } else {
        println!("{} entities written in {seed_s:.1} s; engine restarted in {start_ms:.0} ms", args.entities);
        println!("waiting for the fire: RSS {rss_idle:.1} MiB (peak {} MiB)", v["peak_rss_mb"]);
        println!(
            "fire: started {} ms after its instant; every entity ticked {done_ms} ms after it ({} entities/s)",
            v["fire_late_ms"], v["entities_per_s"]
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// An engine that only writes (the seeding one): it processes nothing, fires nothing.
fn idle() -> settle_engine::Config {
    settle_engine::Config { max_inflight: 0, ..settle_engine::Config::default() }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_cron_expression_names_the_second_given() {
        let at = settle_core::time::parse_time("2026-03-05T07:08:09Z", 0).unwrap();
        assert_eq!(super::cron_at(at), "9 8 7 5 3 *");
        let c = settle_core::calendar::parse_cron(&super::cron_at(at)).unwrap();
        assert!(format!("{c:?}").len() > 10);
    }
}
