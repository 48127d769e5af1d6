//! `settle bench soak`: a long run of the reference kind of workflow — a server is created,
//! creates four resources and waits for them, then is deleted with them — with short
//! retentions, so the engine's pruning removes what ended while new work arrives. Prints
//! checkpoints at regular intervals (workflows done, rows in all tables, the database's
//! bytes, throughput over the interval): after the first retention period rows and bytes
//! should stay flat and throughput hold.

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::{Value, json};
use settle_core::retention::{Defaults, Keep};
use settle_engine::{Config, Engine, EventOutcome, RaiseOptions, Wait};
use settle_store::{AnyStore, Store};

use super::{peak_rss_mb, round3};

/// Options of `settle bench soak`.
#[derive(clap::Args, Debug)]
pub struct SoakArgs {
    /// Workflows to run: each creates a server, which creates four resources and waits
    /// for them; then deletes the server, which deletes them and waits.
    #[arg(long, default_value_t = 100_000)]
    workflows: usize,
    /// How long ended entities, ended operations, finished tasks and minute counts are
    /// kept (minute counts at least a minute); `forever`: no pruning, the baseline to
    /// compare a run's latency and throughput with.
    #[arg(long, default_value = "30s")]
    retention: String,
    /// Workflows in flight at once.
    #[arg(long, default_value_t = 128)]
    concurrency: usize,
    /// Checkpoints, spread evenly over the workflows.
    #[arg(long, default_value_t = 10)]
    checkpoints: usize,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

/// The machines of the workload (also read by the crash test of pruning, with
/// `--machines`): a server whose `go` creates four resources and a subscription waits for
/// all of them ready; `delete` raises `delete` on them and waits until all are gone. A
/// resource is provisioned by one step and deleted by an event.
const SERVER: &str = include_str!("soak_server.toml");
const RESOURCE: &str = include_str!("soak_resource.toml");

/// Transitions per workflow: the server's five, each resource's three.
const TRANSITIONS: usize = 5 + 4 * 3;

fn machine(name: &str, text: &str) -> anyhow::Result<settle_core::Machine> {
    settle_core::toml::load(&format!("{name}.toml"), name, text).map(|(m, _)| m).map_err(|r| anyhow::anyhow!("{r}"))
}

/// Raises `event` on server `key` and waits until it is in `state`.
async fn step(e: &Engine<AnyStore>, key: &str, event: &str, state: &str) -> anyhow::Result<()> {
    let limit = Duration::from_secs(120);
    let raised = e.raise("soak_server", key, event, RaiseOptions::wait(Wait::Stable).timeout(limit)).await?;
    match (&raised.outcome, &raised.entity) {
        (Some(EventOutcome::Accepted { .. }), Some(entity)) if entity.state == state => Ok(()),
        (Some(EventOutcome::Accepted { .. }), Some(_)) => {
            e.wait_for_state("soak_server", key, &[state], limit).await?;
            Ok(())
        }
        other => bail!("server {key}: {event} did not reach {state}: {other:?}"),
    }
}

/// One workflow: create, provision, delete.
async fn workflow(e: &Engine<AnyStore>, key: &str) -> anyhow::Result<()> {
    e.create("soak_server", key, Default::default()).await?;
    step(e, key, "go", "ready").await?;
    step(e, key, "delete", "gone").await
}

/// One checkpoint: workflows done, rows and bytes, throughput since the previous one.
async fn checkpoint(store: &AnyStore, done: usize, since: (usize, Instant), started: Instant) -> anyhow::Result<Value> {
    let storage = store.storage().await?;
    let wf = done - since.0;
    Ok(json!({
        "workflows": done,
        "seconds": round3(started.elapsed().as_secs_f64()),
        "rows": storage.rows(),
        "entities": storage.tables.iter().find(|(t, _)| t == "entities").map_or(0, |(_, n)| *n),
        "db_bytes": storage.bytes,
        "wf_per_s": round3(wf as f64 / since.1.elapsed().as_secs_f64().max(1e-9)),
    }))
}

pub(crate) async fn soak(db: &str, args: SoakArgs) -> anyhow::Result<ExitCode> {
    if args.workflows == 0 || args.concurrency == 0 || args.checkpoints == 0 {
        bail!("--workflows, --concurrency and --checkpoints must be at least 1");
    }
    let keep = Keep::parse(&args.retention).map_err(|e| anyhow::anyhow!("--retention: {e}"))?;
    let (retention, prune_every, period) = match keep {
        // Rounds of pruning ten times per retention period (so what waits past its time
        // stays a tenth of what is kept), and at least once a minute.
        Keep::For(period) => {
            let minutes = Keep::For(period.max(Duration::from_secs(60)));
            let every = (period / 10).clamp(Duration::from_millis(100), Duration::from_secs(60));
            (Defaults { ended: keep, operations: keep, tasks: keep, minutes, ..Defaults::FOREVER }, every, Some(period))
        }
        Keep::Forever => (Defaults::FOREVER, Duration::ZERO, None),
    };
    let config = Config { retention, prune_every, ..Config::default() };
    let store = AnyStore::open(db).with_context(|| format!("opening {db}"))?;
    let engine = Engine::builder(store.clone())
        .origin(crate::defs::ORIGIN)
        .config(config)
        .machine(machine("soak_server", SERVER)?)
        .machine(machine("soak_resource", RESOURCE)?)
        .start()
        .await?;
    let started = Instant::now();
    let done = Arc::new(AtomicUsize::new(0));
    let next = Arc::new(AtomicUsize::new(0));
    let run = format!("{:x}", std::process::id());
    let workers = args.concurrency.min(args.workflows);
    // Workers still running: a checkpoint stops waiting when none is (one failed).
    let active = Arc::new(AtomicUsize::new(workers));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..workers {
        let (engine, done, next, run, n) = (engine.clone(), done.clone(), next.clone(), run.clone(), args.workflows);
        let active = active.clone();
        tasks.spawn(async move {
            let mut latencies = Vec::new();
            let result = loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    break Ok(());
                }
                let t0 = Instant::now();
                if let Err(e) = workflow(&engine, &format!("soak-{run}-{i:08}")).await {
                    break Err(e);
                }
                latencies.push(t0.elapsed());
                done.fetch_add(1, Ordering::Relaxed);
            };
            active.fetch_sub(1, Ordering::Relaxed);
            result.map(|()| latencies)
        });
    }
    // Checkpoints as the work crosses each k/K of the workflows.
    let mut checkpoints = Vec::with_capacity(args.checkpoints);
    let mut since = (0, Instant::now());
    for k in 1..=args.checkpoints {
        let target = args.workflows * k / args.checkpoints;
        while done.load(Ordering::Relaxed) < target && active.load(Ordering::Relaxed) > 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let now = done.load(Ordering::Relaxed);
        let c = checkpoint(&store, now, since, started).await?;
        eprintln!(
            "settle: {} workflows, {} rows, {:.1} MiB, {} wf/s",
            c["workflows"],
            c["rows"],
            c["db_bytes"].as_u64().unwrap_or(0) as f64 / 1_048_576.0,
            c["wf_per_s"]
        );
        checkpoints.push(c);
        since = (now, Instant::now());
        if now < target {
            break;
        }
    }
    let mut latencies = Vec::with_capacity(args.workflows);
    while let Some(r) = tasks.join_next().await {
        latencies.extend(r??);
    }
    let seconds = started.elapsed().as_secs_f64();
    latencies.sort_unstable();
    // What is left once everything past its retention is gone.
    if let Some(period) = period {
        tokio::time::sleep(period).await;
        engine.prune(None, false, |_| ()).await?;
    }
    let after = store.storage().await?;
    engine.shutdown().await;
    let pct = |p: f64| latencies[((latencies.len() as f64 - 1.0) * p).round() as usize].as_secs_f64() * 1000.0;
    let ratio = |key: &str| {
        let (second, last) = (checkpoints.get(1).unwrap_or(&checkpoints[0]), checkpoints.last().unwrap());
        round3(last[key].as_f64().unwrap_or(0.0) / second[key].as_f64().unwrap_or(0.0).max(1e-9))
    };
    let out = json!({
        "workflows": args.workflows,
        "transitions": args.workflows * TRANSITIONS,
        "seconds": round3(seconds),
        "workflows_per_s": round3(args.workflows as f64 / seconds),
        "p50_ms": round3(pct(0.50)),
        "p99_ms": round3(pct(0.99)),
        "peak_rss_mb": round3(peak_rss_mb()),
        "retention": args.retention,
        "checkpoints": checkpoints,
        "last_over_second": {"rows": ratio("rows"), "db_bytes": ratio("db_bytes"), "wf_per_s": ratio("wf_per_s")},
        "after_prune": {
            "rows": after.rows(),
            "entities": after.tables.iter().find(|(t, _)| t == "entities").map_or(0, |(_, n)| *n),
            "db_bytes": after.bytes,
        },
    });
    if args.json {
        println!("{out}");
    } else {
        println!(
            "{} workflows in {seconds:.1} s: {:.0} workflows/s; p50 {:.1} ms, p99 {:.1} ms",
            args.workflows,
            args.workflows as f64 / seconds,
            pct(0.5),
            pct(0.99)
        );
        println!("checkpoints (workflows, rows, bytes, wf/s):");
        for c in &checkpoints {
            println!("  {} {} {} {}", c["workflows"], c["rows"], c["db_bytes"], c["wf_per_s"]);
        }
        println!("last over second: {}", out["last_over_second"]);
    }
    Ok(ExitCode::SUCCESS)
}
