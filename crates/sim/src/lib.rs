//! settle-sim: deterministic simulation of the engine under faults (`settle simulate`).
//!
//! Each seed builds a world on a fresh SQLite file: one to three engine nodes
//! ([`settle_engine::sim::SimNode`]: the real scheduler and decisions, stepped), a
//! [`ManualClock`], the reference scenario's machines (servers and their four resources,
//! provisioned in process or through agents), fan-out parents and children, and sleepers
//! with a timer. A random schedule drawn from the seed then interleaves requests (creates,
//! raised events, replays of earlier request ids, operator commands), node steps (deliver
//! the handlers' results, write a batch), clock moves and faults:
//!
//! - a node crashes between its actions and their commit (dropped, with what it held; a
//!   new node takes its place) or stalls while its leases expire and others take over;
//! - a batch write fails before the store sees it, fails after it committed (the result is
//!   lost), or fails in the middle (a trigger aborts the transaction after some of its
//!   statements ran: the store rolls it back);
//! - the clock jumps;
//! - an agent reports twice, or reports after its lease expired and another agent took
//!   the task.
//!
//! After every step the invariants are checked over what the store recorded since the last
//! step (see [`Checker`]); at the end the faults stop, every node is healed, paused or
//! parked entities are resumed, and the world runs until nothing is due, then the end
//! invariants are checked. A failing seed prints the violation, the trace of the steps
//! that touched the entities involved, the faults it still fails without, and the command
//! that replays it.

mod backend;
mod checker;
mod faults;
mod machines;
mod observe;
mod requests;
mod world;

use std::time::{Duration, Instant};

use backend::Backend;
pub use backend::Db;
pub use checker::Violation;
use faults::Faults;
use settle_builtin::draws::mix;
use world::World;

/// What `settle simulate` runs.
#[derive(Debug, Clone)]
pub struct Options {
    /// How many seeds to run (from `from`).
    pub seeds: u64,
    /// The first seed.
    pub from: u64,
    /// Run this one seed and print its trace.
    pub seed: Option<u64>,
    /// Keep running seeds from a random start for this long instead of `seeds`.
    pub run_for: Option<Duration>,
    /// With `seed`: keep the seed's database at this path (SQLite).
    pub keep: Option<std::path::PathBuf>,
    /// Steps of each seed's random schedule (before the healing run).
    pub steps: usize,
    /// The database the worlds run on.
    pub db: Db,
    /// Set to stop: the seed running ends at its next step, and its database with it
    /// (nothing is left behind); the run answers that not every seed ran.
    pub stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            seeds: 200,
            from: 0,
            seed: None,
            run_for: None,
            keep: None,
            steps: 150,
            db: Db::Sqlite,
            stop: Default::default(),
        }
    }
}

/// How one seed ended.
struct Ran {
    /// The trace: one line per step (`step N: ...`).
    trace: Vec<(usize, String)>,
    result: Result<Summary, Violation>,
}

/// What a seed did, when it held.
#[derive(Debug, Default, Clone, Copy)]
struct Summary {
    steps: usize,
    entities: u64,
    batches: u64,
    commits: u64,
    reports: u64,
    faults: u64,
    /// Entities pruning removed.
    pruned: u64,
}

impl Summary {
    fn add(&mut self, s: &Summary) {
        self.steps += s.steps;
        self.entities += s.entities;
        self.batches += s.batches;
        self.commits += s.commits;
        self.reports += s.reports;
        self.faults += s.faults;
        self.pruned += s.pruned;
    }
}

/// Runs the simulation `args` describes, printing to stdout (the result, a failing seed's
/// report) and stderr (progress every 5 s); answers whether every invariant held.
pub async fn run(args: Options) -> anyhow::Result<bool> {
    let backend = Backend::new(&args.db)?;
    let on = args.db.name();
    if let Some(seed) = args.seed {
        let ran = run_seed_keeping(&backend, seed, args.steps, Faults::ALL, args.keep.as_deref(), &args.stop).await?;
        for (_, line) in &ran.trace {
            println!("{line}");
        }
        if stopped(&args.stop) {
            eprintln!("simulate: seed {seed} interrupted");
            return Ok(false);
        }
        return Ok(match ran.result {
            Ok(s) => {
                println!(
                    "seed {seed}: every invariant held on {on} ({} steps, {} entities, {} batches, {} commits, {} agent \
                     reports, {} faults, {} pruned)",
                    s.steps, s.entities, s.batches, s.commits, s.reports, s.faults, s.pruned
                );
                true
            }
            Err(v) => {
                report_failure(&backend, seed, args.steps, &v, &ran.trace, &args.stop).await?;
                false
            }
        });
    }
    let started = Instant::now();
    let first = match args.run_for {
        Some(_) => mix(settle_store::clock::now_ms() as u64) % 1_000_000_000,
        None => args.from,
    };
    let mut total = Summary::default();
    let mut last_progress = Instant::now();
    let mut seed = first;
    loop {
        let done = seed - first;
        match args.run_for {
            Some(limit) if started.elapsed() >= limit => break,
            None if done >= args.seeds => break,
            _ => {}
        }
        let ran = run_seed(&backend, seed, args.steps, Faults::ALL, &args.stop).await?;
        if stopped(&args.stop) {
            eprintln!("simulate: interrupted in seed {seed}, after {done} seeds that held");
            return Ok(false);
        }
        match ran.result {
            Ok(s) => total.add(&s),
            Err(v) => {
                eprintln!("seed {seed}: invariant violated after {done} seeds that held");
                report_failure(&backend, seed, args.steps, &v, &ran.trace, &args.stop).await?;
                return Ok(false);
            }
        }
        seed += 1;
        if last_progress.elapsed() >= Duration::from_secs(5) {
            last_progress = Instant::now();
            eprintln!(
                "simulate: {} seeds held ({first}..{seed}) on {on}, {:.0}s, {} commits, {} faults injected",
                seed - first,
                started.elapsed().as_secs_f64(),
                total.commits,
                total.faults
            );
        }
    }
    println!(
        "simulate: seeds {first}..{seed}: every invariant held on {on} ({} seeds, {} steps, {} entities, {} batches, \
         {} commits, {} agent reports, {} faults injected, {} entities pruned, {:.1}s)",
        seed - first,
        total.steps,
        total.entities,
        total.batches,
        total.commits,
        total.reports,
        total.faults,
        total.pruned,
        started.elapsed().as_secs_f64()
    );
    Ok(true)
}

/// Prints a failing seed: the violation, the trace of the steps touching its entities, the
/// faults it still fails without, and the command that replays it.
async fn report_failure(
    backend: &Backend,
    seed: u64,
    steps: usize,
    v: &Violation,
    trace: &[(usize, String)],
    stop: &Stop,
) -> anyhow::Result<()> {
    println!("seed {seed}: INVARIANT VIOLATED at step {}: {}", v.step, v.what);
    // Shrink: drop each fault kind in turn while the seed still fails.
    let mut faults = Faults::ALL;
    for name in Faults::ALL.names() {
        let fewer = faults.without(name);
        if run_seed(backend, seed, steps, fewer, stop).await?.result.is_err() && !stopped(stop) {
            faults = fewer;
        }
    }
    let needed = faults.names();
    println!(
        "faults it needs: {}",
        if needed.is_empty() { "none (it fails without any injected fault)".to_string() } else { needed.join(", ") }
    );
    println!("trace (the steps that touched {}, and the faults of the kinds it needs):", v.entities.join(", "));
    let tags: Vec<String> = needed.iter().map(|n| format!("FAULT {n}:")).collect();
    for (step, line) in trace.iter().filter(|(s, _)| *s <= v.step) {
        let relevant = v.entities.iter().any(|e| line.contains(e.as_str())) || tags.iter().any(|t| line.starts_with(t));
        if relevant {
            println!("  {step:>4} {line}");
        }
    }
    let db = match backend.db() {
        Db::Sqlite => String::new(),
        Db::Postgres(url) => format!(" --db {url}"),
    };
    println!("replay: settle simulate --seed {seed} --steps {steps}{db}");
    Ok(())
}

/// The flag that stops a run.
type Stop = std::sync::Arc<std::sync::atomic::AtomicBool>;

fn stopped(stop: &Stop) -> bool {
    stop.load(std::sync::atomic::Ordering::Relaxed)
}

/// Runs one seed with `faults`.
async fn run_seed(backend: &Backend, seed: u64, steps: usize, faults: Faults, stop: &Stop) -> anyhow::Result<Ran> {
    run_seed_keeping(backend, seed, steps, faults, None, stop).await
}

/// Runs one seed with `faults`, copying its database to `keep` at the end.
async fn run_seed_keeping(
    backend: &Backend,
    seed: u64,
    steps: usize,
    faults: Faults,
    keep: Option<&std::path::Path>,
    stop: &Stop,
) -> anyhow::Result<Ran> {
    let mut w = World::new(seed, faults, backend.seed(seed).await?).await?;
    let result = w.run(steps, stop).await;
    if let Some(path) = keep {
        w.db.keep(path).await?;
    }
    let trace = std::mem::take(&mut w.trace);
    let result = match result {
        Ok(Ok(())) => Ok(Summary {
            steps: w.step,
            entities: (w.checker.entities.len() + w.checker.entities.pruned_total()) as u64,
            batches: w.batches,
            commits: w.checker.landed.len() as u64,
            reports: w.checker.agents.reports,
            faults: w.injected,
            pruned: w.checker.entities.pruned_total() as u64,
        }),
        Ok(Err(v)) => Err(v),
        Err(e) => Err(Violation { step: w.step, what: format!("the simulation failed: {e:#}"), entities: vec![] }),
    };
    w.shutdown().await?;
    Ok(Ran { trace, result })
}

/// The simulation as a unit test of this crate, in process: seeds `SETTLE_SIM_FROM` ..
/// `+SETTLE_SIM_SEEDS` (default 0..60) hold every invariant. The mutation harness
/// (`scripts/mutants.sh`) runs it against every mutant of the decision and plan modules:
/// without the `settle` binary, a mutant rebuilds only the crates below this one.
#[cfg(test)]
mod seeds {
    #[tokio::test(flavor = "current_thread")]
    async fn the_seeds_hold_every_invariant() {
        let var = |name: &str, default: u64| std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default);
        let options = super::Options {
            seeds: var("SETTLE_SIM_SEEDS", 60),
            from: var("SETTLE_SIM_FROM", 0),
            ..Default::default()
        };
        assert!(super::run(options).await.expect("the simulation runs"), "a seed broke an invariant (see above)");
    }
}
