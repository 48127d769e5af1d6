//! `settle bench`: throughput and latency of the engine on this machine.
//!
//! `bench chain`: N entities, each raised once and driven through K unstable states with
//! no-op actions to a stable state; C callers keep C workflows in flight (a closed loop),
//! or with `--rate R` workflows start R a second whatever is in flight (an open loop,
//! [`open`]). Latency is from the raise (open loop: its scheduled time) to the entity's
//! next stable state, as a caller of `raise` sees it. `--nested`: the same steps as
//! substates of one parent with an entry and an exit action.

mod bulk;
mod deploy;
mod dormant;
mod fleet;
mod limits;
mod measure;
mod open;
mod schedule;
mod soak;
mod sweep;

pub(crate) use measure::{peak_rss_mb, proc_mb, round3, rss_mb};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::bail;
use serde_json::json;
use settle_engine::{Engine, EngineBuilder, EventOutcome, RaiseOptions, Wait};
use settle_store::{AnyStore, Store};

use crate::workers::Workers;
use settle_builtin::MAX_CHAIN_STEPS;

/// Benchmarks.
#[derive(clap::Subcommand, Debug)]
pub enum Bench {
    /// Entities through a chain of unstable states with no-op actions.
    #[command(after_help = "Examples:\n  settle bench chain --entities 10000 --steps 4 --concurrency 256\n  \
                            settle bench chain --entities 1000 --steps 3 --nested --json\n  \
                            settle bench chain --entities 20000 --rate 4000,8000 --rounds 3")]
    Chain(ChainArgs),
    /// Parents that each create children doing one step, and wait for all of them by
    /// subscription.
    #[command(after_help = "Example:\n  settle bench fanout --entities 1000 --children 4 --json")]
    Fanout(FanoutArgs),
    /// Entities with a pending one-shot timer: memory while they wait, and firing them all
    /// after an engine restart.
    #[command(after_help = "Example:\n  settle bench timers --entities 100000 --after 5s")]
    Timers(TimersArgs),
    /// Workflows whose one action is executed by external agents, all over HTTP: a
    /// `settle serve` process; callers raise with `wait=stable`, agents lease and complete.
    #[command(after_help = "Example:\n  settle bench agents --entities 5000 --agents 4 --batch 32 --json")]
    Agents(AgentsArgs),
    /// What an operator's reads cost on a large fleet: the overview and a filtered page of
    /// entities, on N entities (1,000,000 by default) spread over a nested machine's states.
    #[command(after_help = "Example:\n  settle --db fleet.db bench fleet --entities 100000 --repeat 11 --json")]
    Fleet(fleet::FleetArgs),
    /// A large fleet at rest with pending timers (1,000,000 entities and 100,000 timers by
    /// default): idle RSS after an engine restart, the time to claim due work as the fleet
    /// grows, and how late the timers fire.
    #[command(after_help = "Example:\n  settle bench dormant --entities 200000 --timers 20000 --json")]
    Dormant(dormant::DormantArgs),
    /// A long run with short retentions: servers created with four resources, then deleted
    /// with them, while the engine prunes what ended; checkpoints of rows, bytes and
    /// throughput show whether the database stays flat.
    #[command(after_help = "Example:\n  settle bench soak --workflows 100000 --retention 30s --json")]
    Soak(soak::SoakArgs),
    /// One bulk operation over a large fleet: N idle jobs (100,000 by default) paused at
    /// the rate asked for; entities a second. The same `--request-id` again follows that
    /// operation to its end (after a crash).
    #[command(after_help = "Example:\n  settle --db bulk.db bench bulk --entities 100000 --json")]
    Bulk(bulk::BulkArgs),
    /// A calendar schedule over a large fleet: N entities (100,000 by default) in a state a
    /// schedule raises an event on; RSS while they wait for the fire (after an engine
    /// restart), how late the fire starts, how long until every entity took its event.
    #[command(after_help = "Example:\n  settle --db schedule.db bench schedule --entities 100000 --json")]
    Schedule(schedule::ScheduleArgs),
    /// Flow control: workflows over tenants with and without limits (their cost), and a
    /// tenant arriving behind another's flood (how long its first waits). Scratch databases.
    #[command(after_help = "Example:\n  settle bench limits --workflows 10000 --tenants 100 --rounds 3 --json")]
    Limits(limits::LimitsArgs),
}

/// Options of `settle bench agents`.
#[derive(clap::Args, Debug)]
pub struct AgentsArgs {
    /// Number of entities (one workflow each).
    #[arg(long, default_value_t = 5_000)]
    entities: usize,
    /// Callers in flight at once (each raises and waits for the entity to be at rest).
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Agent loops (each leases up to `--batch` tasks per long poll, and reports them in one request that leases the next batch).
    #[arg(long, default_value_t = 4)]
    agents: usize,
    /// Most tasks per lease.
    #[arg(long, default_value_t = 32)]
    batch: u32,
    /// Print one JSON line.
    #[arg(long)]
    json: bool,
}

/// The machine `bench agents` serves: `go` → `working`, whose auto action agents execute.
const AGENT_BENCH_MACHINE: &str = r#"
initial = "idle"
[states.idle]
[states.working]
auto = "work"
[states.done]
kind = "terminal"
[events.go]
in = ["idle"]
action = "start"
[actions.start]
to = ["working"]
[actions.work]
to = ["done"]
agent = "bench"
lock = "30s"
"#;

async fn agents(db: Option<&str>, args: AgentsArgs) -> anyhow::Result<ExitCode> {
    if args.entities == 0 || args.concurrency == 0 || args.agents == 0 || args.batch == 0 {
        bail!("--entities, --concurrency, --agents and --batch must be at least 1");
    }
    let (path, _scratch) = bench_db(db);
    let dir = std::env::temp_dir().join(format!("settle-bench-machines-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("job.toml"), AGENT_BENCH_MACHINE)?;
    let server = crate::workers::Server::start(&path, &["--machines", &dir.display().to_string()]).await;
    let _ = std::fs::remove_dir_all(&dir);
    let server = server?;
    let client = settle_client::Client::new(&server.url)?;
    let suffix = uuid_suffix();
    let keys: Arc<Vec<String>> = Arc::new((0..args.entities).map(|i| format!("a{suffix}-{i}")).collect());
    // Create them first (not timed), 64 requests in flight.
    let c = client.clone();
    drive(&keys, 64, move |key| {
        let c = c.clone();
        async move {
            c.create("job", &key, json!({}), None).await?;
            Ok(())
        }
    })
    .await?;
    // Agents: lease a batch, complete each at once (a provider that answers instantly),
    // all of a batch's reports in one request that also leases the next batch.
    // A stop seen by every agent, wherever it is in its loop.
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut agent_tasks = tokio::task::JoinSet::new();
    for i in 0..args.agents {
        let (c, mut stopped, batch) = (client.clone(), stopped.clone(), args.batch);
        agent_tasks.spawn(async move {
            let name = format!("bench-agent-{i}");
            let mut leased = Vec::new();
            loop {
                if leased.is_empty() {
                    if *stopped.borrow() {
                        return anyhow::Ok(());
                    }
                    leased = tokio::select! {
                        _ = stopped.changed() => return anyhow::Ok(()),
                        r = c.lease("bench", &name, batch, Duration::from_secs(1)) => r?,
                    };
                    continue;
                }
                // The batch's reports go in one request, which also leases the next batch:
                // while the queue has work, one round trip per batch.
                let reports = leased
                    .drain(..)
                    .map(|task| settle_client::TaskReport {
                        task: task.id,
                        complete: Some(settle_client::CompleteRequest {
                            token: task.token,
                            target: Some("done".into()),
                            ..Default::default()
                        }),
                        fail: None,
                    })
                    .collect();
                let next = settle_client::NextTasks {
                    queue: "bench".into(),
                    agent: name.clone(),
                    max: Some(u64::from(batch)),
                };
                let handled = c.report_many(reports, Some(next)).await?;
                if let Some(refused) = handled.results.iter().find(|r| !r.accepted) {
                    bail!("a report was refused: {refused:?}");
                }
                leased = handled.tasks.unwrap_or_default();
            }
        });
    }
    let c = client.clone();
    let driven = drive(&keys, args.concurrency, move |key| {
        let c = c.clone();
        async move {
            let raised = c
                .raise(
                    "job",
                    &key,
                    "go",
                    json!({}),
                    Some((settle_client::WaitFor::Stable, Duration::from_secs(60))),
                    None,
                )
                .await?;
            match raised {
                settle_client::Raised::Done { entity: Some(e), .. } if e.state == "done" => Ok(()),
                other => bail!("workflow {key} did not finish: {other:?}"),
            }
        }
    })
    .await;
    let _ = stop.send(true);
    drop(stopped);
    let server_rss = proc_mb(server.pid(), "VmHWM:");
    while let Some(r) = agent_tasks.join_next().await {
        r??;
    }
    server.stop().await?;
    let (seconds, latencies) = driven?;
    let extra = json!({"agents": args.agents, "batch": args.batch, "server_peak_rss_mb": round3(server_rss)});
    report(args.json, args.entities, args.entities * 2, seconds, &latencies, extra);
    if !args.json {
        println!("server peak RSS: {server_rss:.1} MiB");
    }
    Ok(ExitCode::SUCCESS)
}

/// Options of `settle bench timers`.
#[derive(clap::Args, Debug)]
pub struct TimersArgs {
    /// Number of entities, each with one pending timer.
    #[arg(long, default_value_t = 100_000)]
    entities: usize,
    /// When the timers fire, after each entity's creation (e.g. `20s`).
    #[arg(long, default_value = "20s")]
    after: String,
    /// Print one JSON line.
    #[arg(long)]
    json: bool,
}

async fn timers(db: Option<&str>, args: TimersArgs) -> anyhow::Result<ExitCode> {
    let after = settle_core::duration::parse(&args.after).map_err(|e| anyhow::anyhow!("--after: {e}"))?;
    let (path, _scratch) = bench_db(db);
    let machine = || settle_builtin::sleeper(after);
    // Phase 1: an engine with no capacity to process writes the entities and timers.
    let writer = Engine::builder(AnyStore::open(&path)?)
        .origin(crate::defs::ORIGIN)
        .machine(machine())
        .config(settle_engine::Config { max_inflight: 0, ..settle_engine::Config::default() })
        .start()
        .await?;
    let keys: Arc<Vec<String>> = Arc::new((0..args.entities).map(|i| format!("t{}-{i}", uuid_suffix())).collect());
    let started = Instant::now();
    create_all(&writer, "sleeper", &keys, Default::default()).await?;
    let create_s = started.elapsed().as_secs_f64();
    writer.shutdown().await;
    drop(writer);
    if create_s >= after.as_secs_f64() {
        bail!("creating took {create_s:.1} s, longer than --after; raise --after to measure waiting");
    }
    // Phase 2: a fresh engine waits for the timers, then processes them all.
    let restarted = Instant::now();
    let engine = Engine::builder(AnyStore::open(&path)?).origin(crate::defs::ORIGIN).machine(machine()).start().await?;
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let rss_waiting = rss_mb();
    let waited = restarted.elapsed();
    engine.wait_idle().await?;
    let all_fired_s = restarted.elapsed().as_secs_f64();
    let counts = engine.store().entity_count_by_state("sleeper").await?;
    engine.shutdown().await;
    let awake = counts.iter().find(|(s, _)| s == "awake").map_or(0, |(_, n)| *n);
    if awake != args.entities as u64 {
        bail!("only {awake} of {} timers fired: {counts:?}", args.entities);
    }
    let v = json!({
        "timers": args.entities,
        "create_s": round3(create_s),
        "rss_waiting_mb": round3(rss_waiting),
        "rss_sampled_after_restart_s": round3(waited.as_secs_f64()),
        "all_fired_after_restart_s": round3(all_fired_s),
        "peak_rss_mb": round3(peak_rss_mb()),
    });
    if args.json {
        println!("{v}");
    } else {
        println!("{} timers written in {create_s:.2} s", args.entities);
        println!("after a restart, RSS while they wait: {rss_waiting:.1} MiB");
        println!("all fired and processed {all_fired_s:.2} s after the restart (they were due {})", args.after);
    }
    Ok(ExitCode::SUCCESS)
}

/// Options of `settle bench fanout`.
#[derive(clap::Args, Debug)]
pub struct FanoutArgs {
    /// Number of parents (one workflow each).
    #[arg(long, default_value_t = 2_000)]
    entities: usize,
    /// Children per parent.
    #[arg(long, default_value_t = 4)]
    children: u64,
    #[command(flatten)]
    drive: DriveArgs,
}

/// Options of `settle bench chain` and `settle bench fanout`: how the workflows are driven.
#[derive(clap::Args, Debug)]
pub struct DriveArgs {
    /// Workflows in flight at once. Several (`--concurrency 32,64,128`) make a sweep: the
    /// benchmark runs at each, `--rounds` times, and reports each one's medians, the peak
    /// and the knee (see `--rounds`).
    #[arg(long, value_delimiter = ',', default_value = "64")]
    concurrency: Vec<usize>,
    /// An open loop instead: start this many workflows a second on a fixed schedule,
    /// however many are in flight; each latency counts from the workflow's scheduled
    /// start. Several (`--rate 4000,8000`) make a sweep that reports the highest rate kept
    /// up with (at least 95 % of it done a second) and its latency.
    #[arg(long, value_delimiter = ',', conflicts_with = "concurrency")]
    rate: Vec<usize>,
    /// Runs at each concurrency (or rate): ascending in the first round, descending in the
    /// next and so on. Each run creates its own workflows, on a fresh scratch file unless
    /// `--db` is given (then every run adds its workflows to that database). With one
    /// concurrency (or rate) and one round, the plain report of that run.
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// Worker processes (`settle run`) that process the workflows while this process
    /// raises and watches; needs `--db postgres://...`. 0: this process processes.
    #[arg(long, default_value_t = 0)]
    instances: usize,
    /// Print one JSON line.
    #[arg(long)]
    json: bool,
}

/// Options of `settle bench chain`.
#[derive(clap::Args, Debug)]
pub struct ChainArgs {
    /// Number of entities (one workflow each).
    #[arg(long, default_value_t = 10_000)]
    entities: usize,
    /// Unstable states per workflow (1 to 8).
    #[arg(long, default_value_t = 3)]
    steps: usize,
    /// The steps as substates of one parent with an entry and an exit action (Rust
    /// handlers, run once each per workflow): the cost of a statechart over a flat chain.
    #[arg(long)]
    nested: bool,
    /// Halfway through, deploy a new version of the chain's machine that pins its
    /// entities (`upgrade = "pin"`) while the load runs: the report says what the deploy
    /// moved and pinned and how long it took, and the run fails unless every workflow
    /// finished and moved to the new version.
    #[arg(long)]
    deploy: bool,
    #[command(flatten)]
    drive: DriveArgs,
}

/// Removes a scratch database and its side files when dropped.
struct Scratch(pub(super) PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm", ".lock"] {
            let mut p = self.0.clone().into_os_string();
            p.push(suffix);
            let _ = std::fs::remove_file(p);
        }
    }
}

pub async fn run(db: Option<&str>, bench: Bench) -> anyhow::Result<ExitCode> {
    if db.is_some() && matches!(bench, Bench::Limits(_)) {
        bail!("bench limits runs on scratch databases of its own, one per run: drop --db");
    }
    // The benchmarks' machines are never merged into a deployment of other definitions.
    if let Some(db) = db {
        crate::defs::refuse_foreign(&AnyStore::open(db)?).await?;
    }
    match bench {
        Bench::Chain(args) => chain(db, args).await,
        Bench::Fanout(args) => fanout(db, args).await,
        Bench::Timers(args) => timers(db, args).await,
        Bench::Agents(args) => agents(db, args).await,
        Bench::Fleet(args) => {
            let (path, _scratch) = bench_db(db);
            fleet::fleet(&path, args).await
        }
        Bench::Dormant(args) => {
            let (path, _scratch) = bench_db(db);
            dormant::dormant(&path, args).await
        }
        Bench::Soak(args) => {
            let (path, _scratch) = bench_db(db);
            soak::soak(&path, args).await
        }
        Bench::Bulk(args) => {
            let (path, _scratch) = bench_db(db);
            bulk::bulk(&path, args).await
        }
        Bench::Schedule(args) => {
            let (path, _scratch) = bench_db(db);
            schedule::schedule(&path, args).await
        }
        Bench::Limits(args) => limits::limits(args).await,
    }
}

/// A database file for a benchmark: `--db` if given, else a scratch file removed after.
fn bench_db(db: Option<&str>) -> (String, Option<Scratch>) {
    match db {
        Some(p) => (p.to_string(), None),
        None => {
            let p = std::env::temp_dir().join(format!("settle-bench-{}.db", std::process::id()));
            (p.display().to_string(), Some(Scratch(p)))
        }
    }
}

/// The engine a benchmark drives: with `instances` > 0, one that only writes while that
/// many worker processes (on PostgreSQL) do the processing; else one that processes too.
async fn bench_engine(
    db: &str,
    instances: usize,
    local: impl FnOnce(AnyStore) -> EngineBuilder<AnyStore>,
) -> anyhow::Result<(Engine<AnyStore>, Option<Workers>)> {
    crate::workers::check_db(db, instances)?;
    let store = AnyStore::open(db)?;
    if instances == 0 {
        return Ok((local(store).start().await?, None));
    }
    let engine = crate::engines::start_driver_engine(store, &crate::defs::Machines::BUILT_IN).await?;
    let workers = Workers::start(db, instances)?;
    Ok((engine, Some(workers)))
}

/// Raises `go` and waits until the workflow reaches `state`: first for the answer of a
/// `wait=stable` raise (the entity at rest again), then, if it rested short of `state`
/// (a fan-out parent waits for its children in a stable state), for the state itself.
/// Whichever instance does the work answers: this engine's scheduler, or another instance
/// through the store's change notifications.
async fn raise_until(e: &Engine<AnyStore>, machine: &str, key: &str, state: &str) -> anyhow::Result<()> {
    let limit = Duration::from_secs(60);
    let raised = e.raise(machine, key, "go", RaiseOptions::wait(Wait::Stable).timeout(limit)).await?;
    match (&raised.outcome, &raised.entity) {
        (Some(EventOutcome::Accepted { .. }), Some(entity)) if entity.state == state => Ok(()),
        (Some(EventOutcome::Accepted { .. }), Some(_)) => {
            e.wait_for_state(machine, key, &[state], limit).await?;
            Ok(())
        }
        other => bail!("workflow {key} did not finish: {other:?}"),
    }
}

/// Creates `keys` entities of `machine` with `properties`, 512 at a time in flight.
async fn create_all(
    engine: &Engine<AnyStore>,
    machine: &str,
    keys: &Arc<Vec<String>>,
    properties: settle_core::Properties,
) -> anyhow::Result<()> {
    let mut tasks = tokio::task::JoinSet::new();
    let next = Arc::new(AtomicUsize::new(0));
    for _ in 0..512.min(keys.len()) {
        let (engine, keys, next, machine, props) =
            (engine.clone(), keys.clone(), next.clone(), machine.to_string(), properties.clone());
        tasks.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(key) = keys.get(i) else { return anyhow::Ok(()) };
                engine.create(&machine, key, props.clone()).await?;
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r??;
    }
    Ok(())
}

/// Runs one workflow per key with `concurrency` in flight; returns each one's latency.
async fn drive<F, Fut>(keys: &Arc<Vec<String>>, concurrency: usize, one: F) -> anyhow::Result<(f64, Vec<Duration>)>
where
    F: Fn(String) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send,
{
    let start = Instant::now();
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..concurrency.min(keys.len()) {
        let (keys, next, one) = (keys.clone(), next.clone(), one.clone());
        tasks.spawn(async move {
            let mut latencies = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(key) = keys.get(i) else { return anyhow::Ok(latencies) };
                let t0 = Instant::now();
                one(key.clone()).await?;
                latencies.push(t0.elapsed());
            }
        });
    }
    let mut latencies = Vec::with_capacity(keys.len());
    let mut results = Vec::new();
    while let Some(r) = tasks.join_next().await {
        results.push(r?);
    }
    let seconds = start.elapsed().as_secs_f64();
    for r in results {
        latencies.extend(r?);
    }
    latencies.sort_unstable();
    Ok((seconds, latencies))
}

/// The latency at fraction `p` (0 to 1) of `sorted`, in ms.
fn percentile_ms(sorted: &[Duration], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize].as_secs_f64() * 1000.0
}

/// Prints the report: one JSON line, or a few lines for people.
fn report(
    json_out: bool,
    workflows: usize,
    transitions: usize,
    seconds: f64,
    latencies: &[Duration],
    extra: serde_json::Value,
) {
    let pct = |p: f64| percentile_ms(latencies, p);
    let mut v = json!({
        "workflows": workflows,
        "transitions": transitions,
        "seconds": round3(seconds),
        "workflows_per_s": round3(workflows as f64 / seconds),
        "transitions_per_s": round3(transitions as f64 / seconds),
        "p50_ms": round3(pct(0.50)),
        "p99_ms": round3(pct(0.99)),
        "peak_rss_mb": round3(peak_rss_mb()),
    });
    if let (Some(obj), Some(more)) = (v.as_object_mut(), extra.as_object()) {
        obj.extend(more.clone());
    }
    if json_out {
        println!("{v}");
    } else {
        println!(
            "{workflows} workflows ({transitions} transitions) in {seconds:.2} s: {:.0} workflows/s, {:.0} transitions/s",
            workflows as f64 / seconds,
            transitions as f64 / seconds
        );
        println!("latency: p50 {:.2} ms, p99 {:.2} ms", pct(0.50), pct(0.99));
        if let Some(rate) = extra.get("rate") {
            let kept = if extra["kept_up"] == true { "kept up with" } else { "fell behind" };
            println!("open loop: {rate} started a second; the engine {kept} it");
        }
        println!("peak RSS: {:.1} MiB", peak_rss_mb());
        if let Some(d) = extra.get("deploy") {
            println!(
                "deployed version {} halfway in {} ms: {} moved at once, {} pinned until done; every workflow under it at the end",
                d["version"].as_str().unwrap_or_default(),
                d["took_ms"],
                d["moved"],
                d["pinned"]
            );
        }
    }
}

async fn fanout(db: Option<&str>, args: FanoutArgs) -> anyhow::Result<ExitCode> {
    if args.entities == 0 || args.children == 0 {
        bail!("--entities and --children must be at least 1");
    }
    let mut properties = settle_core::Properties::new();
    properties.insert("children".into(), json!(args.children));
    let run = Workflows {
        machine: "fanparent".into(),
        prefix: 'f',
        properties,
        entities: args.entities,
        // Per parent: go, spawn, children_done (3); per child: create excluded, work (1).
        transitions: args.entities * (3 + args.children as usize),
        extra: json!({"children": args.children}),
        count_hooks: false,
        deploy: false,
        drive: args.drive,
    };
    run.run(db, settle_builtin::bind_fanout, |setup_s, load| {
        format!(
            "created {} parents in {setup_s:.2} s; each creates {} children and waits for all; {load}",
            args.entities, args.children
        )
    })
    .await
}

async fn chain(db: Option<&str>, args: ChainArgs) -> anyhow::Result<ExitCode> {
    if !(1..=MAX_CHAIN_STEPS).contains(&args.steps) {
        bail!("--steps must be between 1 and {MAX_CHAIN_STEPS}, got {}", args.steps);
    }
    if args.entities == 0 {
        bail!("--entities must be at least 1");
    }
    let steps = args.steps;
    let run = Workflows {
        machine: if args.nested { format!("chain{steps}_nested") } else { format!("chain{steps}") },
        prefix: 'b',
        properties: Default::default(),
        entities: args.entities,
        transitions: args.entities * (steps + 1),
        extra: json!({"steps": steps, "nested": args.nested}),
        count_hooks: args.nested,
        deploy: args.deploy,
        drive: args.drive,
    };
    run.run(
        db,
        |b| settle_builtin::bind_chain(b, steps),
        |setup_s, load| {
            format!("created {} entities in {setup_s:.2} s; running {} workflows, {load}", args.entities, args.entities)
        },
    )
    .await
}

/// A workflow benchmark (`bench chain`, `bench fanout`): one entity of `machine` per
/// workflow, raised `go` until it is `done`.
struct Workflows {
    /// The workflows' machine.
    machine: String,
    /// The start of the entities' keys (`{prefix}{run id}-{i}`).
    prefix: char,
    /// The entities' properties when created.
    properties: settle_core::Properties,
    /// How many workflows.
    entities: usize,
    /// How they are driven.
    drive: DriveArgs,
    /// Transitions all the workflows make, for the report.
    transitions: usize,
    /// The benchmark's own fields of the report (beside `concurrency` and `instances`).
    extra: serde_json::Value,
    /// Report the runs of `chain{steps}_nested`'s entry and exit actions in this process
    /// (`entry_runs`, `exit_runs`; 0 when worker processes ran them).
    count_hooks: bool,
    /// Deploy a pinning version of `machine` halfway through ([`deploy::midway`]).
    deploy: bool,
}

impl Workflows {
    /// Runs the workflows at each concurrency of `--concurrency`, `--rounds` times, and
    /// prints the report: of the one run, or of the sweep ([`sweep`]).
    async fn run(
        self,
        db: Option<&str>,
        bind: impl Fn(EngineBuilder<AnyStore>) -> EngineBuilder<AnyStore>,
        created: impl Fn(f64, &str) -> String,
    ) -> anyhow::Result<ExitCode> {
        let (lp, levels) = match &self.drive.rate[..] {
            [] => (sweep::Loop::Closed, &self.drive.concurrency),
            _ => (sweep::Loop::Open, &self.drive.rate),
        };
        let order = sweep::order(levels, self.drive.rounds, lp)?;
        if let [level] = order[..] {
            let (seconds, latencies, extra) = self.once(db, &bind, (lp, level), Some(&created)).await?;
            report(self.drive.json, self.entities, self.transitions, seconds, &latencies, extra);
            return Ok(ExitCode::SUCCESS);
        }
        let mut runs = Vec::with_capacity(order.len());
        for (i, &level) in order.iter().enumerate() {
            let (seconds, latencies, _) = self.once(db, &bind, (lp, level), None).await?;
            let run = sweep::Run {
                level,
                workflows_per_s: self.entities as f64 / seconds,
                p50_ms: percentile_ms(&latencies, 0.50),
                p99_ms: percentile_ms(&latencies, 0.99),
            };
            if !self.drive.json {
                eprintln!(
                    "run {}/{}: {}, {:.0} workflows/s, p50 {:.2} ms, p99 {:.2} ms",
                    i + 1,
                    order.len(),
                    load_text((lp, level)),
                    run.workflows_per_s,
                    run.p50_ms,
                    run.p99_ms
                );
            }
            runs.push(run);
        }
        let mut extra = self.extra.clone();
        extra["workflows"] = json!(self.entities);
        extra["transitions"] = json!(self.transitions);
        extra["rounds"] = json!(self.drive.rounds);
        extra["instances"] = json!(self.drive.instances);
        sweep::report(self.drive.json, &sweep::summarize(&runs), extra, lp);
        Ok(ExitCode::SUCCESS)
    }

    /// One run at `load` (a concurrency or a rate): creates the entities (not timed) and
    /// prints on stderr (unless `--json`) what `created` says of the seconds that took and
    /// of the load; then runs the workflows, on an engine of this process with the
    /// machines `bind` registers or on the worker processes. Answers the seconds, the
    /// sorted latencies and the report's fields of this benchmark.
    async fn once(
        &self,
        db: Option<&str>,
        bind: &impl Fn(EngineBuilder<AnyStore>) -> EngineBuilder<AnyStore>,
        load: (sweep::Loop, usize),
        created: Option<Created<'_>>,
    ) -> anyhow::Result<(f64, Vec<Duration>, serde_json::Value)> {
        let (path, _scratch) = bench_db(db);
        let (engine, workers) =
            bench_engine(&path, self.drive.instances, |s| bind(Engine::builder(s).origin(crate::defs::ORIGIN))).await?;
        let run_id = uuid_suffix();
        let keys: Arc<Vec<String>> =
            Arc::new((0..self.entities).map(|i| format!("{}{run_id}-{i}", self.prefix)).collect());
        let setup = Instant::now();
        create_all(&engine, &self.machine, &keys, self.properties.clone()).await?;
        if let Some(created) = created.filter(|_| !self.drive.json) {
            eprintln!("{}", created(setup.elapsed().as_secs_f64(), &load_text(load)));
        }
        let (e, machine) = (engine.clone(), self.machine.clone());
        let finished = Arc::new(AtomicUsize::new(0));
        let halfway = Arc::new(tokio::sync::Notify::new());
        let deployed =
            self.deploy.then(|| tokio::spawn(deploy::midway(engine.clone(), self.machine.clone(), halfway.clone())));
        let (half, count, notify) = (self.entities.div_ceil(2), finished.clone(), halfway.clone());
        let one = move |key: String| {
            let (e, machine, count, notify) = (e.clone(), machine.clone(), count.clone(), notify.clone());
            async move {
                raise_until(&e, &machine, &key, "done").await?;
                if count.fetch_add(1, Ordering::Relaxed) + 1 == half {
                    notify.notify_one();
                }
                Ok(())
            }
        };
        let (seconds, latencies) = match load {
            (sweep::Loop::Closed, concurrency) => drive(&keys, concurrency, one).await?,
            (sweep::Loop::Open, rate) => open::drive(&keys, rate, one).await?,
        };
        let mut extra = self.extra.clone();
        if let Some(task) = deployed {
            let report = task.await??;
            extra["deploy"] = deploy::check(&engine, &self.machine, report, workers.is_some()).await?;
        }
        stop(engine, workers).await;
        match load {
            (sweep::Loop::Closed, concurrency) => extra["concurrency"] = json!(concurrency),
            (sweep::Loop::Open, rate) => {
                extra["rate"] = json!(rate);
                extra["kept_up"] = json!(open::kept_up(self.entities as f64 / seconds, rate));
            }
        }
        extra["instances"] = json!(self.drive.instances);
        if self.count_hooks {
            let runs = &settle_builtin::NESTED_CHAIN_HOOKS;
            extra["entry_runs"] = json!(runs.entered.load(Ordering::Relaxed));
            extra["exit_runs"] = json!(runs.left.load(Ordering::Relaxed));
        }
        Ok((seconds, latencies, extra))
    }
}

/// What a run prints once its entities are created, given the seconds that took and how
/// its workflows are started ([`load_text`]).
type Created<'a> = &'a dyn Fn(f64, &str) -> String;

/// How a run's workflows are started, for people: `64 in flight`, `8000 started a second
/// (open loop)`.
fn load_text((lp, level): (sweep::Loop, usize)) -> String {
    match lp {
        sweep::Loop::Closed => format!("{level} in flight"),
        sweep::Loop::Open => format!("{level} started a second (open loop)"),
    }
}

async fn stop(engine: Engine<AnyStore>, workers: Option<Workers>) {
    if let Some(w) = workers {
        w.stop(Duration::from_secs(30)).await;
    }
    engine.shutdown().await;
}

fn uuid_suffix() -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    format!("{:x}", settle_builtin::draws::mix(nanos as u64) & 0xffff_ffff)
}
