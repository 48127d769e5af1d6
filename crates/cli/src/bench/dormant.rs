//! `settle bench dormant`: what a large fleet at rest costs the engine (issue 17). It
//! writes N entities at rest of one simple machine and T more that each wait for a
//! one-shot timer, due over the next minute or so; restarts the engine (shut down, a new
//! one on the same database, as a restarted process would); and reports:
//!
//! - the RSS of this process while the restarted engine is idle (before the first timer
//!   is due), and its peak;
//! - the time to claim and process a small batch of due work as the fleet grows: after
//!   each growth step (`--steps`), `poke` is raised on `--due` pseudo-random entities
//!   and waited for (`wait=stable`), all at once; the batch's wall time and the slowest;
//! - how late the timers fired: for each, the commit time (`at`) of the history row of
//!   its `wake` transition minus the due time it was written with; max, p99, p50, and how
//!   many fired within 1 s.
//!
//! The entities are written straight to the store in batches, as `bench fleet` seeds
//! its fleet (no engine round trip per entity).

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::bail;
use serde_json::json;
use settle_core::EventName;
use settle_core::machine::{Machine, MachineBuilder, Schedule};
use settle_engine::{Engine, EventOutcome, RaiseOptions, Wait};
use settle_store::{AnyStore, Store, TimerPlan};

use super::fleet::{SEED_BATCH, at_rest, write_creates};
use super::measure::{median, round3};

/// Options of `settle bench dormant`.
#[derive(clap::Args, Debug)]
pub struct DormantArgs {
    /// Entities at rest (no due work, no timer).
    #[arg(long, default_value_t = 1_000_000)]
    entities: usize,
    /// Further entities, each with one pending one-shot timer.
    #[arg(long, default_value_t = 100_000)]
    timers: usize,
    /// Fleet sizes (entities at rest) at which claiming due work is timed, ascending, each
    /// at most `--entities`.
    #[arg(long, value_delimiter = ',', default_value = "10000,100000,1000000")]
    steps: Vec<usize>,
    /// Entities made due (an event raised on each) per measurement.
    #[arg(long, default_value_t = 100)]
    due: usize,
    /// The first timer is due this long after the timers are written (time for the
    /// restart and the idle RSS sample).
    #[arg(long, default_value = "15s")]
    lead: String,
    /// The timers' due times are spread evenly over this long.
    #[arg(long, default_value = "60s")]
    spread: String,
    /// Timed batches per step (after one warm-up); each step reports their median, so
    /// one slow batch (a checkpoint, the host) does not make the ratio. At 1,000,000 at
    /// rest one batch takes 15-50 ms on a 2-core host: the median of 5 put the ratio
    /// anywhere from 1.1 to 2.4 in one evening, the median of 25 within 1.5-1.7.
    #[arg(long, default_value_t = 25)]
    rounds: usize,
    /// Print one JSON line.
    #[arg(long)]
    json: bool,
}

/// The machine: entities rest in `resting` (`poke` → `touched`) or sleep in `asleep`
/// until their timer `alarm` raises `wake` (→ `awake`). No action has a handler.
const MACHINE: &str = "dormant";

fn machine() -> Machine {
    MachineBuilder::new(MACHINE)
        .state("resting")
        .initial()
        .state("touched")
        .state("asleep")
        .state("awake")
        .event("poke", ["resting", "touched"], "touch")
        .action("touch", ["touched"])
        .event("wake", ["asleep"], "rise")
        .action("rise", ["awake"])
        // The bench writes each timer's due time itself; the declared delay is for
        // entities that would enter `asleep` through the engine.
        .timer("alarm", "wake", Schedule::After(Duration::from_secs(60)), ["asleep"])
        .build()
        .expect("the dormant machine is valid")
}

/// Entities per write while seeding (as `bench fleet`).
/// Writes progress on stderr at most every 2 s.
struct Progress {
    what: &'static str,
    total: usize,
    started: Instant,
    last: Instant,
}

impl Progress {
    fn new(what: &'static str, total: usize) -> Self {
        Progress { what, total, started: Instant::now(), last: Instant::now() }
    }

    fn tick(&mut self, done: usize, of: usize) {
        if self.last.elapsed() >= Duration::from_secs(2) {
            let rate = done as f64 / self.started.elapsed().as_secs_f64();
            eprintln!("{}: {done} of {} written ({rate:.0}/s), growing to {of}", self.what, self.total);
            self.last = Instant::now();
        }
    }
}

/// Writes resting entities `from..to` (keys `d{run}-{i}`).
async fn seed_resting(store: &AnyStore, run: &str, from: usize, to: usize, p: &mut Progress) -> anyhow::Result<()> {
    let mut i = from;
    while i < to {
        let end = (i + SEED_BATCH).min(to);
        write_creates(
            store,
            (i..end).map(|n| at_rest(MACHINE, format!("d{run}-{n}"), "resting", Vec::new())).collect(),
        )
        .await?;
        i = end;
        p.tick(i, to);
    }
    Ok(())
}

/// Writes `count` sleeping entities (keys `t{run}-{i}`), timer `i` due `lead + i·spread/count`
/// after its batch is written; answers (entity id, due time) per timer.
async fn seed_timers(
    store: &AnyStore,
    run: &str,
    count: usize,
    lead: Duration,
    spread: Duration,
) -> anyhow::Result<Vec<(i64, i64)>> {
    let mut p = Progress::new("sleeping entities", count);
    let mut out = Vec::with_capacity(count);
    let mut i = 0;
    while i < count {
        let end = (i + SEED_BATCH).min(count);
        let base = settle_store::clock::now_ms() + lead.as_millis() as i64;
        let due = |n: usize| base + (spread.as_millis() * n as u128 / count as u128) as i64;
        let ops = (i..end)
            .map(|n| {
                let timer = TimerPlan {
                    name: "alarm".into(),
                    event: EventName::new("wake"),
                    due_at: due(n),
                    every_ms: None,
                    restart: true,
                };
                at_rest(MACHINE, format!("t{run}-{n}"), "asleep", vec![timer])
            })
            .collect();
        let ids = write_creates(store, ops).await?;
        out.extend(ids.into_iter().zip((i..end).map(due)));
        i = end;
        p.tick(i, count);
    }
    Ok(out)
}

/// Raises `poke` on `due` pseudo-random entities of the first `size`, all at once, each
/// waiting until its entity is at rest again; answers the batch's wall time and the
/// slowest raise, in ms.
async fn claim_once(
    engine: &Engine<AnyStore>,
    run: &str,
    size: usize,
    due: usize,
    salt: u64,
) -> anyhow::Result<(f64, f64)> {
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for j in 0..due {
        let n =
            (settle_builtin::draws::mix(salt.wrapping_mul(1_000_003).wrapping_add(j as u64)) % size as u64) as usize;
        let (engine, key) = (engine.clone(), format!("d{run}-{n}"));
        tasks.spawn(async move {
            let t = Instant::now();
            let opts = RaiseOptions::wait(Wait::Stable).timeout(Duration::from_secs(120));
            let raised = engine.raise(MACHINE, &key, "poke", opts).await?;
            match (&raised.outcome, &raised.entity) {
                (Some(EventOutcome::Accepted { .. }), Some(e)) if e.state == "touched" => Ok(t.elapsed()),
                other => bail!("poke on {key} did not finish: {other:?}"),
            }
        });
    }
    let mut slowest = Duration::ZERO;
    while let Some(r) = tasks.join_next().await {
        slowest = slowest.max(r??);
    }
    Ok((started.elapsed().as_secs_f64() * 1000.0, slowest.as_secs_f64() * 1000.0))
}

pub async fn dormant(db: &str, args: DormantArgs) -> anyhow::Result<ExitCode> {
    let duration = |name: &str, s: &str| settle_core::duration::parse(s).map_err(|e| anyhow::anyhow!("--{name}: {e}"));
    let (lead, spread) = (duration("lead", &args.lead)?, duration("spread", &args.spread)?);
    if args.entities == 0 || args.timers == 0 || args.due == 0 || args.rounds == 0 {
        bail!("--entities, --timers, --due and --rounds must be at least 1");
    }
    let mut steps = args.steps.clone();
    if steps.iter().any(|s| *s == 0 || *s > args.entities) || steps.windows(2).any(|w| w[0] >= w[1]) {
        bail!("--steps must be ascending, each between 1 and --entities ({})", args.entities);
    }
    steps.dedup();
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let run = format!("{:x}", settle_builtin::draws::mix(nanos as u64) & 0xffff_ffff);

    // Phase 1: grow the fleet at rest, timing a batch of due work at each step.
    let engine = Engine::builder(AnyStore::open(db)?).origin(crate::defs::ORIGIN).machine(machine()).start().await?;
    let mut progress = Progress::new("entities at rest", args.entities);
    let seeding = Instant::now();
    let mut seed_s = 0.0;
    let mut have = 0;
    let mut claims = Vec::new();
    for (i, &size) in steps.iter().enumerate() {
        let t = Instant::now();
        seed_resting(engine.store(), &run, have, size, &mut progress).await?;
        seed_s += t.elapsed().as_secs_f64();
        have = size;
        // One warm-up batch (caches, prepared statements), then the timed ones.
        let salt = |r: usize| ((args.rounds + 1) * i + r) as u64;
        claim_once(&engine, &run, size, args.due.min(10), salt(0)).await?;
        let mut rounds = Vec::with_capacity(args.rounds);
        for r in 1..=args.rounds {
            rounds.push(claim_once(&engine, &run, size, args.due, salt(r)).await?);
        }
        let ms = median(rounds.iter().map(|r| r.0).collect());
        let slowest_ms = median(rounds.iter().map(|r| r.1).collect());
        eprintln!(
            "{size} entities at rest: {} due ones processed in {ms:.1} ms (median of {}; slowest raise {slowest_ms:.1} ms)",
            args.due, args.rounds
        );
        let each: Vec<f64> = rounds.iter().map(|r| round3(r.0)).collect();
        claims.push(json!({"entities": size, "ms": round3(ms), "slowest_ms": round3(slowest_ms), "rounds_ms": each}));
    }
    let t = Instant::now();
    seed_resting(engine.store(), &run, have, args.entities, &mut progress).await?;
    seed_s += t.elapsed().as_secs_f64();
    let t = Instant::now();
    let due_times = seed_timers(engine.store(), &run, args.timers, lead, spread).await?;
    let timers_s = t.elapsed().as_secs_f64();
    eprintln!(
        "{} entities at rest and {} timers written in {:.1} s; restarting the engine",
        args.entities,
        args.timers,
        seeding.elapsed().as_secs_f64()
    );

    // Phase 2: restart, then sample RSS while idle (before the first timer is due).
    engine.shutdown().await;
    drop(engine);
    let first_due = due_times.iter().map(|(_, d)| *d).min().unwrap_or(0);
    let restarted = Instant::now();
    let engine = Engine::builder(AnyStore::open(db)?).origin(crate::defs::ORIGIN).machine(machine()).start().await?;
    let start_ms = restarted.elapsed().as_secs_f64() * 1000.0;
    let until_first = (first_due - settle_store::clock::now_ms() - 1_000).max(0) as u64;
    tokio::time::sleep(Duration::from_millis(until_first.min(3_000))).await;
    let rss_idle = super::measure::rss_mb();
    let idle_sampled_s = restarted.elapsed().as_secs_f64();
    if until_first == 0 {
        eprintln!("warning: the first timer was due before the idle sample; raise --lead");
    }

    // Phase 3: wait for every timer, then read when each fired.
    let limit = lead + spread + Duration::from_secs(300);
    tokio::time::timeout(limit, engine.wait_idle())
        .await
        .map_err(|_| anyhow::anyhow!("the timers had not all fired {} s after the restart", limit.as_secs()))??;
    let all_fired_s = restarted.elapsed().as_secs_f64();
    let mut late_ms = Vec::with_capacity(due_times.len());
    for (id, due) in &due_times {
        let history = engine.store().history_list(*id).await?;
        let fired = history.iter().find(|h| {
            h.event.as_ref().is_some_and(|e| e.as_str() == "wake")
                && h.to.as_ref().is_some_and(|s| s.as_str() == "awake")
        });
        if let Some(h) = fired {
            late_ms.push(h.at - due);
        }
    }
    engine.shutdown().await;
    let fired = late_ms.len();
    late_ms.sort_unstable();
    let pct = |p: f64| late_ms.get(((late_ms.len() as f64 - 1.0) * p).round() as usize).copied().unwrap_or(0);
    let within_1s = late_ms.iter().filter(|ms| **ms <= 1_000).count();
    let (first_ms, last_ms) = (claims.first().map(|c| c["ms"].as_f64().unwrap_or(0.0)), claims.last());
    let ratio = match (first_ms, last_ms.and_then(|c| c["ms"].as_f64())) {
        (Some(a), Some(b)) if a > 0.0 => round3(b / a),
        _ => 0.0,
    };
    let peak_rss = super::measure::peak_rss_mb();
    let v = json!({
        "entities": args.entities,
        "timers": args.timers,
        "seed_s": round3(seed_s),
        "timers_write_s": round3(timers_s),
        "restart_ms": round3(start_ms),
        "rss_idle_mb": round3(rss_idle),
        "rss_idle_sampled_after_restart_s": round3(idle_sampled_s),
        "peak_rss_mb": round3(peak_rss),
        "due_per_step": args.due,
        "rounds_per_step": args.rounds,
        "claim": claims,
        "claim_last_over_first": ratio,
        "timers_fired": fired,
        "timers_within_1s": within_1s,
        "lateness_max_ms": late_ms.last().copied().unwrap_or(0),
        "lateness_p99_ms": pct(0.99),
        "lateness_p50_ms": pct(0.50),
        "lateness_min_ms": late_ms.first().copied().unwrap_or(0),
        "all_fired_after_restart_s": round3(all_fired_s),
    });
    if args.json {
        println!("{v}");
    } else {
        println!(
            "{} entities at rest, {} pending timers (written in {seed_s:.1} s + {timers_s:.1} s)",
            args.entities, args.timers
        );
        println!("restart: engine started in {start_ms:.0} ms; idle RSS {rss_idle:.1} MiB (peak {peak_rss:.1} MiB)");
        for c in v["claim"].as_array().into_iter().flatten() {
            println!(
                "  {:>9} entities: {} due processed in {} ms (slowest {} ms)",
                c["entities"].as_u64().unwrap_or(0),
                args.due,
                c["ms"],
                c["slowest_ms"]
            );
        }
        println!("  claim time, largest step over smallest: {ratio}×");
        println!(
            "timers: {fired} of {} fired; {within_1s} within 1 s of due; lateness max {} ms, p99 {} ms, p50 {} ms",
            args.timers, v["lateness_max_ms"], v["lateness_p99_ms"], v["lateness_p50_ms"]
        );
    }
    if fired != args.timers {
        bail!("only {fired} of {} timers fired", args.timers);
    }
    Ok(ExitCode::SUCCESS)
}
