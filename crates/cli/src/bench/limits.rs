//! `settle bench limits`: what flow control costs and what it buys. Each round runs on
//! fresh scratch databases (SQLite):
//!
//! - **throughput**: `--workflows` workflows (10,000) over `--tenants` tenants (100), each
//!   one auto action, driven by `--per-tenant` (5) callers per tenant (each raises and waits
//!   for the entity at rest, then the next), twice: with the machine declaring no limit, and
//!   with `--per-tenant` at once per tenant and one global rate (`--rate` starts a second,
//!   round-robin across tenants). The limits hold but do not bind: what the report's ratio
//!   shows is what they cost.
//! - **fairness**: the limited machine again, its action taking `--work-ms` (50): a tenant
//!   queues `--flood` (10,000) workflows, then another tenant raises one; the report gives
//!   how long that one waited to start, and how many of the flood were still queued then.
//!
//! `--of workflows` makes both limits count the workflows `go` starts (held from the event
//! until the entity is at rest) instead of the runs of `work`.
//!
//! Medians over `--rounds` (3). The run fails if a workflow did not finish, if the limit was
//! ever exceeded (the action counts its tenant's calls in flight), or if the late tenant's
//! workflow never started.

use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::bail;
use serde_json::json;
use settle_core::limits::LimitDef;
use settle_core::{Machine, MachineBuilder, Properties};
use settle_engine::{Engine, Outcome, RaiseOptions, Wait};
use settle_store::{AnyStore, EntityFilter, Store};

use super::Scratch;
use super::measure::{median, round3};

/// Options of `settle bench limits`.
#[derive(clap::Args, Debug)]
pub struct LimitsArgs {
    /// Workflows of the throughput runs.
    #[arg(long, default_value_t = 10_000)]
    workflows: usize,
    /// Tenants they are spread over.
    #[arg(long, default_value_t = 100)]
    tenants: usize,
    /// At most this many actions at once per tenant.
    #[arg(long, default_value_t = 5)]
    per_tenant: u32,
    /// At most this many starts a second in all (round-robin across tenants; the clock
    /// counts milliseconds, so at most a thousandth of it in one millisecond).
    #[arg(long, default_value_t = 1_000_000)]
    rate: u32,
    /// Workflows the first tenant queues in the fairness run.
    #[arg(long, default_value_t = 10_000)]
    flood: usize,
    /// How long each action takes in the fairness run (ms).
    #[arg(long, default_value_t = 50)]
    work_ms: u64,
    /// Rounds; the report gives medians.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// What the limits count: the `work` action's runs (`actions`), or the workflows the
    /// `go` event starts (`workflows`: from the event until the entity is at rest).
    #[arg(long, value_enum, default_value_t = Of::Actions)]
    of: Of,
    /// Print one JSON line.
    #[arg(long)]
    json: bool,
}

/// What the bench's limits count.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Of {
    /// The auto action of `working`.
    Actions,
    /// The workflows `go` starts.
    Workflows,
}

impl Of {
    fn as_str(self) -> &'static str {
        match self {
            Of::Actions => "actions",
            Of::Workflows => "workflows",
        }
    }
}

/// `tjob`: idle -go→ working (auto `work`) → done; with `limits`, `tenant_calls` (per
/// tenant, at once) and `total_rate` (starts a second in all, fair by tenant), taken in that
/// order, counting the runs of `work` or the workflows of `go` (`of`).
fn machine(limits: Option<(u32, u32)>, of: Of) -> Machine {
    let mut b = MachineBuilder::new("tjob")
        .properties(["tenant"])
        .state("idle")
        .initial()
        .state("working")
        .auto("work")
        .state("done")
        .event("go", ["idle"], "begin")
        .action("begin", ["working"])
        .action("work", ["done"]);
    let (states, events) = match of {
        Of::Actions => (vec!["working".to_string()], Vec::new()),
        Of::Workflows => (Vec::new(), vec!["go".to_string()]),
    };
    if let Some((per_tenant, rate)) = limits {
        b = b
            .limit(LimitDef {
                name: "tenant_calls".into(),
                states: states.clone(),
                events: events.clone(),
                max: Some(per_tenant),
                key: Some("props.tenant".into()),
                ..LimitDef::default()
            })
            .limit(LimitDef {
                name: "total_rate".into(),
                states,
                events,
                rate: Some(rate),
                per_ms: Some(1_000),
                fair_by: Some("props.tenant".into()),
                ..LimitDef::default()
            });
    }
    b.build().expect("the bench's machine is valid")
}

/// What the action saw: calls in flight per tenant, the most at once, when each key started.
#[derive(Default)]
struct Seen {
    now: HashMap<String, u32>,
    most: u32,
    started: HashMap<String, Instant>,
}

type Shared = Arc<Mutex<Seen>>;

/// A scratch database and an engine on it running `tjob`, its action taking `work`.
async fn start(
    limits: Option<(u32, u32)>,
    of: Of,
    work: Duration,
    seen: Shared,
) -> anyhow::Result<(Engine<AnyStore>, Scratch)> {
    static N: AtomicUsize = AtomicUsize::new(0);
    let path = std::env::temp_dir().join(format!(
        "settle-bench-limits-{}-{}.db",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let scratch = Scratch(path.clone());
    let store = AnyStore::open(&path.display().to_string())?;
    let engine = Engine::builder(store)
        .machine(machine(limits, of))
        .on("tjob", "work", move |ctx| {
            let seen = seen.clone();
            async move {
                let tenant = ctx.properties.get("tenant").and_then(|t| t.as_str()).unwrap_or_default().to_string();
                {
                    let mut s = seen.lock().unwrap();
                    s.started.entry(ctx.key.to_string()).or_insert_with(Instant::now);
                    let n = s.now.entry(tenant.clone()).or_default();
                    *n += 1;
                    let n = *n;
                    s.most = s.most.max(n);
                }
                if !work.is_zero() {
                    tokio::time::sleep(work).await;
                }
                *seen.lock().unwrap().now.entry(tenant).or_default() -= 1;
                Ok(Outcome::to("done"))
            }
        })
        .start()
        .await?;
    Ok((engine, scratch))
}

/// Runs `one` for every key, 512 at once.
async fn each<F, Fut>(keys: Vec<(String, String)>, one: F) -> anyhow::Result<()>
where
    F: Fn(String, String) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send,
{
    let keys = Arc::new(keys);
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..512.min(keys.len()) {
        let (keys, next, one) = (keys.clone(), next.clone(), one.clone());
        tasks.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some((key, tenant)) = keys.get(i).cloned() else { return anyhow::Ok(()) };
                one(key, tenant).await?;
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r??;
    }
    Ok(())
}

fn props(tenant: &str) -> Properties {
    [("tenant".to_string(), json!(tenant))].into_iter().collect()
}

/// Creates `keys` (with their tenants), idle.
async fn create(engine: &Engine<AnyStore>, keys: &[(String, String)]) -> anyhow::Result<()> {
    let engine = engine.clone();
    each(keys.to_vec(), move |key, tenant| {
        let engine = engine.clone();
        async move {
            engine.create("tjob", &key, props(&tenant)).await?;
            Ok(())
        }
    })
    .await
}

/// Raises `go` on `keys`, each answered once queued.
async fn raise(engine: &Engine<AnyStore>, keys: &[(String, String)]) -> anyhow::Result<()> {
    let engine = engine.clone();
    each(keys.to_vec(), move |key, _| {
        let engine = engine.clone();
        async move {
            engine.raise("tjob", &key, "go", RaiseOptions::wait(Wait::Queued)).await?;
            Ok(())
        }
    })
    .await
}

/// How many of `tjob` are in `state`.
async fn count(engine: &Engine<AnyStore>, state: &str, bound: u64) -> anyhow::Result<u64> {
    let f = EntityFilter { machine: Some("tjob".into()), state: Some(state.into()), ..EntityFilter::default() };
    Ok(engine.store().entity_count(f, bound).await?)
}

/// One throughput run: workflows a second, and the most calls of one tenant seen at once.
async fn throughput(args: &LimitsArgs, limited: bool) -> anyhow::Result<(f64, u32)> {
    let seen = Shared::default();
    let limits = limited.then_some((args.per_tenant, args.rate));
    let (engine, _scratch) = start(limits, args.of, Duration::ZERO, seen.clone()).await?;
    let keys: Vec<(String, String)> =
        (0..args.workflows).map(|i| (format!("w{i:07}"), format!("t{:04}", i % args.tenants))).collect();
    create(&engine, &keys).await?;
    let started = Instant::now();
    // Each tenant's workflows, driven by `per_tenant` callers of its own.
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..args.tenants {
        let mine: Arc<Vec<String>> = Arc::new(keys.iter().skip(t).step_by(args.tenants).map(|k| k.0.clone()).collect());
        let next = Arc::new(AtomicUsize::new(0));
        for _ in 0..args.per_tenant {
            let (engine, mine, next) = (engine.clone(), mine.clone(), next.clone());
            tasks.spawn(async move {
                loop {
                    let Some(key) = mine.get(next.fetch_add(1, Ordering::Relaxed)) else { return anyhow::Ok(()) };
                    let wait = RaiseOptions::wait(Wait::Stable).timeout(Duration::from_secs(120));
                    engine.raise("tjob", key, "go", wait).await?;
                }
            });
        }
    }
    while let Some(r) = tasks.join_next().await {
        if let Err(e) = r.map_err(anyhow::Error::from).and_then(|r| r) {
            engine.shutdown().await;
            return Err(e);
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let n = args.workflows as u64;
    let done = count(&engine, "done", n).await?;
    engine.shutdown().await;
    if done < n {
        bail!("{done} of {n} workflows finished");
    }
    let most = seen.lock().unwrap().most;
    Ok((args.workflows as f64 / seconds, most))
}

/// One fairness run: how long the late tenant's workflow waited to start (ms), how many of
/// the flood were still waiting then, and the most calls of one tenant at once.
async fn fairness(args: &LimitsArgs) -> anyhow::Result<(f64, u64, u32)> {
    let seen = Shared::default();
    let (engine, _scratch) =
        start(Some((args.per_tenant, args.rate)), args.of, Duration::from_millis(args.work_ms), seen.clone()).await?;
    let flood: Vec<(String, String)> = (0..args.flood).map(|i| (format!("f{i:07}"), "flood".to_string())).collect();
    let late = vec![("late".to_string(), "late".to_string())];
    create(&engine, &flood).await?;
    create(&engine, &late).await?;
    raise(&engine, &flood).await?;
    let raised = Instant::now();
    raise(&engine, &late).await?;
    let deadline = raised + Duration::from_secs(120);
    let waited = loop {
        if let Some(at) = seen.lock().unwrap().started.get("late") {
            break at.duration_since(raised);
        }
        if Instant::now() > deadline {
            engine.shutdown().await;
            bail!("the late tenant's workflow did not start within 2 minutes");
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    };
    let behind =
        count(&engine, "working", args.flood as u64 + 1).await? + count(&engine, "idle", args.flood as u64 + 1).await?;
    engine.shutdown().await;
    let most = seen.lock().unwrap().most;
    Ok((waited.as_secs_f64() * 1000.0, behind, most))
}

pub async fn limits(args: LimitsArgs) -> anyhow::Result<ExitCode> {
    if args.workflows == 0 || args.tenants == 0 || args.per_tenant == 0 || args.rate == 0 || args.rounds == 0 {
        bail!("--workflows, --tenants, --per-tenant, --rate and --rounds must be at least 1");
    }
    let (mut plain, mut limited, mut waited, mut behind) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for round in 1..=args.rounds {
        // Alternated, so neither run has the warmer machine.
        let (a, b) = if round % 2 == 1 {
            let a = throughput(&args, false).await?;
            (a, throughput(&args, true).await?)
        } else {
            let b = throughput(&args, true).await?;
            (throughput(&args, false).await?, b)
        };
        if b.1 > args.per_tenant {
            bail!("a tenant had {} calls at once, over its limit of {}", b.1, args.per_tenant);
        }
        let (w, left, most) = fairness(&args).await?;
        if most > args.per_tenant {
            bail!("a tenant had {most} calls at once, over its limit of {}", args.per_tenant);
        }
        if !args.json {
            eprintln!(
                "round {round}: {:.0} workflows/s without limits, {:.0} with; the late tenant started after {w:.1} ms, \
                 {left} of the flood still waiting",
                a.0, b.0
            );
        }
        plain.push(a.0);
        limited.push(b.0);
        waited.push(w);
        behind.push(left as f64);
    }
    let (p, l, w) = (median(plain), median(limited), median(waited));
    let v = json!({
        "workload": "limits",
        "workflows": args.workflows,
        "tenants": args.tenants,
        "per_tenant": args.per_tenant,
        "rate": args.rate,
        "rounds": args.rounds,
        "of": args.of.as_str(),
        "plain_workflows_per_s": p.round(),
        "limited_workflows_per_s": l.round(),
        "limited_over_plain": round3(l / p),
        "flood": args.flood,
        "work_ms": args.work_ms,
        "late_first_start_ms": round3(w),
        "flood_waiting_then": median(behind).round(),
    });
    if args.json {
        println!("{v}");
    } else {
        println!(
            "{} workflows over {} tenants, {} callers each: {p:.0}/s without limits, {l:.0}/s with {} per tenant and \
             {}/s in all ({:.0} %)",
            args.workflows,
            args.tenants,
            args.per_tenant,
            args.per_tenant,
            args.rate,
            100.0 * l / p
        );
        println!(
            "a tenant arriving behind another's {} queued workflows started its first after {w:.1} ms (medians of {})",
            args.flood, args.rounds
        );
    }
    Ok(ExitCode::SUCCESS)
}
