//! `settle demo`: the reference scenario (DESIGN §8) for N servers at once. Each server
//! creates its `app`, `database`, `alias` and `dns` resources; `app → database → alias`
//! provision in sequence and `dns` beside them, against a slow, flaky simulated provider.
//! A subscription moves the server to `ready` when all are ready; if one fails (or the
//! timeout passes) the server undoes what was created and ends `failed`. Progress bar, and
//! a summary read back from the database. A demo interrupted by a crash resumes where it
//! stopped when `settle demo` runs again on the same file.

use crate::demo_run::{DemoRun, META_KEY, stored_run};
use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use crate::workers::Workers;
use anyhow::{Context, bail};
use settle_engine::{RaiseOptions, Wait};
use settle_store::{AnyStore, EntityFilter, EntityRow, HistoryKind, Store};

use settle_builtin::ProviderSettings;

/// Options of `settle demo`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Number of servers to provision.
    #[arg(long, default_value_t = 500)]
    servers: u32,
    /// Probability that a provider call fails transiently, in [0, 1).
    #[arg(long, default_value_t = 0.2)]
    fail_rate: f64,
    /// Probability that a resource's provisioning fails for good, in [0, 1); its server
    /// then undoes everything and ends `failed`.
    #[arg(long, default_value_t = 0.0)]
    fatal_rate: f64,
    /// How long a server waits for all its resources before giving up (e.g. `10m`, `2s`).
    #[arg(long, default_value = "10m")]
    timeout: String,
    /// Seed of the simulated provider [default: from the clock].
    #[arg(long)]
    seed: Option<u64>,
    /// Worker processes (`settle run`) that do the processing, restarted if they die; this
    /// process then only creates the servers and watches. Needs PostgreSQL (`--db
    /// postgres://...`). 0: this process does everything.
    #[arg(long, default_value_t = 0)]
    instances: usize,
    /// Run the scenario through the HTTP server: start `settle serve --scenario` on the
    /// database and this many agent processes (`settle agent`) that make the provider
    /// calls over HTTP; create the servers and follow them with the HTTP client. 0: in
    /// process.
    #[arg(long, default_value_t = 0, conflicts_with = "instances")]
    agents: usize,
}

/// The request id of the `create` of the demo's server `key` (keys hold the run number).
fn create_request(key: &str) -> String {
    format!("demo-create-{key}")
}

/// The request id of the `create` event raised on the demo's server `key`.
fn raise_request(key: &str) -> String {
    format!("demo-raise-{key}")
}

async fn servers_of(store: &AnyStore, run: &DemoRun) -> anyhow::Result<Vec<EntityRow>> {
    let prefix = run.prefix();
    let mut all = Vec::new();
    let mut after = None;
    loop {
        let page = store
            .entity_list(EntityFilter {
                machine: Some("server".into()),
                after_id: after,
                limit: Some(5000),
                ..Default::default()
            })
            .await?;
        after = page.last().map(|e| e.id);
        let full = page.len() == 5000;
        all.extend(page.into_iter().filter(|e| e.key.starts_with(&prefix)));
        if !full {
            return Ok(all);
        }
    }
}

pub async fn run(db: &str, args: Args) -> anyhow::Result<ExitCode> {
    if !(0.0..1.0).contains(&args.fail_rate) {
        bail!("--fail-rate must be in [0, 1), got {}", args.fail_rate);
    }
    if !(0.0..1.0).contains(&args.fatal_rate) || args.fail_rate + args.fatal_rate >= 1.0 {
        bail!("--fatal-rate must be in [0, 1) and, with --fail-rate, below 1; got {}", args.fatal_rate);
    }
    let timeout = settle_core::duration::parse(&args.timeout).map_err(|e| anyhow::anyhow!("--timeout: {e}"))?;
    if args.servers == 0 {
        bail!("--servers must be at least 1");
    }
    crate::workers::check_db(db, args.instances)?;
    let store = AnyStore::open(db)?;
    // The demo's machines are never merged into a deployment of other definitions.
    crate::defs::refuse_foreign(&store).await?;
    let demo = match stored_run(&store).await? {
        Some(prev) if !prev.done => {
            eprintln!(
                "resuming unfinished demo run {} ({} servers, fail rate {}) in {}",
                prev.run, prev.servers, prev.provider.fail_rate, db
            );
            prev
        }
        prev => {
            let seed = args.seed.unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64)
                    .unwrap_or(1)
            });
            DemoRun {
                run: prev.map_or(1, |p| p.run + 1),
                servers: args.servers,
                provider: ProviderSettings {
                    fail_rate: args.fail_rate,
                    fatal_rate: args.fatal_rate,
                    seed,
                    timeout_ms: timeout.as_millis() as u64,
                    ..ProviderSettings::default()
                },
                done: false,
            }
        }
    };
    store.meta_put(META_KEY, &serde_json::to_string(&demo)?).await?;
    if args.agents > 0 {
        drop(store);
        return run_with_agents(db, demo, args.agents).await;
    }
    let started = Instant::now();
    let (engine, mut workers) = if args.instances > 0 {
        // Workers read the provider settings stored above when they start.
        (
            crate::engines::start_driver_engine(store.clone(), &crate::defs::Machines::BUILT_IN).await?,
            Some(Workers::start(db, args.instances)?),
        )
    } else {
        (crate::engines::start_engine_on(store.clone(), &crate::defs::Machines::BUILT_IN).await?, None)
    };

    // Create the servers that do not exist yet, then raise `create` on each, every request
    // with its own request id: a resumed run sends the requests whose answers a crash lost
    // again, and the store recognises them (a replay, not a second `create`).
    let existing = servers_of(&store, &demo).await?;
    let have: std::collections::HashSet<String> = existing.iter().map(|e| e.key.to_string()).collect();
    let p = &demo.provider;
    eprintln!(
        "demo run {}: {} servers × {} resources, provider latency {}–{} ms, transient failure rate {}, \
         fatal rate {}, timeout {}, seed {}",
        demo.run,
        demo.servers,
        settle_builtin::RESOURCES.len(),
        p.min_latency_ms,
        p.max_latency_ms,
        p.fail_rate,
        p.fatal_rate,
        settle_core::duration::format(Duration::from_millis(p.timeout_ms)),
        p.seed
    );
    let mut tasks = tokio::task::JoinSet::new();
    let limit = std::sync::Arc::new(tokio::sync::Semaphore::new(256));
    for i in 0..demo.servers {
        let (engine, key, limit) = (engine.clone(), demo.key(i), limit.clone());
        let exists = have.contains(&key);
        tasks.spawn(async move {
            let _permit = limit.acquire_owned().await?;
            if !exists {
                match engine.create_with("server", &key, Default::default(), Some(create_request(&key))).await {
                    Ok(_) | Err(settle_engine::Error::AlreadyExists { .. }) => {}
                    Err(e) => return Err(anyhow::anyhow!("creating server {key}: {e}")),
                }
            }
            let options = RaiseOptions::wait(Wait::Queued).request_id(raise_request(&key));
            let raised = engine.raise("server", &key, "create", options).await?;
            anyhow::Ok(raised.replayed)
        });
    }
    let mut replayed = 0;
    while let Some(r) = tasks.join_next().await {
        replayed += u32::from(r??);
    }
    if replayed > 0 {
        eprintln!(
            "{replayed} servers had been asked to `create` before the interruption (replays: nothing raised twice)"
        );
    }

    show_progress(&store, &demo, workers.as_mut()).await?;
    match workers.take() {
        None => engine.wait_idle().await?,
        Some(mut w) => {
            // Servers are final; let the workers finish whatever is still due.
            while store.entity_count_pending().await? > 0 {
                w.supervise()?;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            let restarts = w.restarts;
            w.stop(Duration::from_secs(30)).await;
            eprintln!("{} worker processes stopped; {restarts} restarted after dying", args.instances);
        }
    }
    engine.shutdown().await;
    let done = DemoRun { done: true, ..demo.clone() };
    store.meta_put(META_KEY, &serde_json::to_string(&done)?).await?;
    summary(&store, &demo, started.elapsed(), db).await?;
    Ok(ExitCode::SUCCESS)
}

/// The demo through the server and external agents (`--agents K`).
async fn run_with_agents(db: &str, demo: DemoRun, agents: usize) -> anyhow::Result<ExitCode> {
    let started = Instant::now();
    let mut server = crate::workers::Server::start(db, &["--scenario"]).await?;
    let p = &demo.provider;
    let url = server.url.clone();
    let agent_args: Vec<String> = [
        "agent",
        "--until-stdin-closes",
        "--server",
        &url,
        "--name",
        "demo-agent-{i}",
        // Provider calls mostly wait: many at once per agent, as a real one would.
        "--concurrency",
        "256",
        "--fail-rate",
        &p.fail_rate.to_string(),
        "--fatal-rate",
        &p.fatal_rate.to_string(),
        "--min-latency-ms",
        &p.min_latency_ms.to_string(),
        "--max-latency-ms",
        &p.max_latency_ms.to_string(),
        "--seed",
        &p.seed.to_string(),
    ]
    .map(String::from)
    .to_vec();
    let mut agents_running = Workers::start_with("agent", agent_args, agents)?;
    crate::print::stderr_line(format_args!(
        "demo run {} through {url}: {} servers, {agents} agent processes serving queue `{}`, transient failure \
         rate {}, fatal rate {}, seed {}",
        demo.run,
        demo.servers,
        settle_builtin::PROVIDER_QUEUE,
        p.fail_rate,
        p.fatal_rate,
        p.seed
    ));
    let client = settle_client::Client::new(&url)?;
    // Idempotency keys make every request safe to repeat: a resumed run sends them all again.
    let limit = std::sync::Arc::new(tokio::sync::Semaphore::new(32));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..demo.servers {
        let (client, key, limit) = (client.clone(), demo.key(i), limit.clone());
        tasks.spawn(async move {
            let _permit = limit.acquire_owned().await?;
            match client.create("server", &key, serde_json::json!({}), Some(&create_request(&key))).await {
                Ok(_) => {}
                Err(e) if e.problem_kind() == Some("entity-exists") => {}
                Err(e) => return Err(anyhow::anyhow!("creating server {key}: {e}")),
            }
            client
                .raise("server", &key, "create", serde_json::json!({}), None, Some(&raise_request(&key)))
                .await
                .map_err(|e| anyhow::anyhow!("raising create on {key}: {e}"))?;
            anyhow::Ok(())
        });
    }
    while let Some(r) = tasks.join_next().await {
        r??;
    }
    let prefix = demo.prefix();
    let tty = std::io::stderr().is_terminal();
    let mut last_line = Instant::now();
    loop {
        let filter =
            settle_client::ListFilter { machine: Some("server".into()), limit: Some(1000), ..Default::default() };
        let servers: Vec<_> =
            client.list_all(&filter).await?.into_iter().filter(|e| e.key.starts_with(&prefix)).collect();
        let finished = servers.iter().filter(|e| e.state == "ready" || e.state == "failed").count() as u32;
        if !tty || last_line.elapsed() >= Duration::from_secs(2) || finished == demo.servers {
            eprintln!("progress: {finished}/{} servers finished", demo.servers);
            last_line = Instant::now();
        }
        if finished == demo.servers {
            break;
        }
        agents_running.supervise()?;
        if agents_running.restarts > 3 * agents as u64 {
            bail!("the agents keep exiting ({} restarts); see their errors above", agents_running.restarts);
        }
        server.check().context("run the demo again to resume")?;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // Let the undo of failed servers finish (their resources are deleted by agents too).
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let mut busy = 0;
        for kind in settle_builtin::RESOURCES {
            let filter =
                settle_client::ListFilter { machine: Some(kind.into()), limit: Some(1000), ..Default::default() };
            busy += client
                .list_all(&filter)
                .await?
                .iter()
                .filter(|e| {
                    e.key.starts_with(&prefix) && !matches!(e.state.as_str(), "ready" | "failed" | "gone" | "waiting")
                })
                .count();
        }
        if busy == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let restarts = agents_running.restarts;
    agents_running.stop(Duration::from_secs(10)).await;
    eprintln!("{agents} agent processes stopped; {restarts} restarted after dying");
    server.stop().await?;
    let store = AnyStore::open(db)?;
    let done = DemoRun { done: true, ..demo.clone() };
    store.meta_put(META_KEY, &serde_json::to_string(&done)?).await?;
    summary(&store, &demo, started.elapsed(), db).await?;
    Ok(ExitCode::SUCCESS)
}

async fn show_progress(store: &AnyStore, demo: &DemoRun, mut workers: Option<&mut Workers>) -> anyhow::Result<()> {
    let tty = std::io::stderr().is_terminal();
    let bar = indicatif::ProgressBar::new(u64::from(demo.servers));
    if tty {
        bar.set_style(
            indicatif::ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} servers finished  {msg}")
                .expect("valid template")
                .progress_chars("=> "),
        );
    } else {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    let mut last_line = Instant::now();
    loop {
        let servers = servers_of(store, demo).await?;
        let mut counts: std::collections::BTreeMap<&str, u64> = Default::default();
        for s in &servers {
            *counts.entry(s.state.as_str()).or_default() += 1;
        }
        let count = |s: &str| counts.get(s).copied().unwrap_or(0);
        let finished = count("ready") + count("failed");
        let msg = ["creating_resources", "undoing", "ready", "failed"]
            .iter()
            .map(|s| format!("{s} {}", count(s)))
            .collect::<Vec<_>>()
            .join(", ");
        bar.set_position(finished);
        bar.set_message(msg.clone());
        if !tty && (last_line.elapsed() >= Duration::from_secs(2) || finished == u64::from(demo.servers)) {
            eprintln!("progress: {finished}/{} finished; {msg}", demo.servers);
            last_line = Instant::now();
        }
        if finished == u64::from(demo.servers) {
            bar.finish();
            return Ok(());
        }
        if let Some(w) = workers.as_deref_mut() {
            w.supervise()?;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn percentile(sorted: &[i64], p: f64) -> i64 {
    if sorted.is_empty() {
        return 0;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx]
}

async fn summary(store: &AnyStore, demo: &DemoRun, wall: Duration, db: &str) -> anyhow::Result<()> {
    let servers = servers_of(store, demo).await?;
    let mut by_state: std::collections::BTreeMap<String, u64> = Default::default();
    let mut resources: std::collections::BTreeMap<String, u64> = Default::default();
    let mut retries = 0u64;
    let mut times = Vec::new();
    let mut spans = Vec::new();
    for s in &servers {
        *by_state.entry(s.state.to_string()).or_default() += 1;
        for r in store.successor_snapshot(s.id).await?.successors {
            *resources.entry(r.state.to_string()).or_default() += 1;
            let h = store.history_list(r.id).await?;
            // Re-entries for a retry (in process) and faults (an agent's transient failure).
            retries += h
                .iter()
                .filter(|r| (r.kind == HistoryKind::Auto && r.retry > 0) || r.kind == HistoryKind::Fault)
                .count() as u64;
        }
        let h = store.history_list(s.id).await?;
        let start = h.iter().find(|r| r.event.as_deref() == Some("create") && r.kind == HistoryKind::Event);
        let ready = h.iter().find(|r| r.to.as_deref() == Some("ready"));
        if let (Some(a), Some(b)) = (start, ready) {
            times.push(b.at - a.at);
            spans.push((a.at, b.at));
        }
    }
    times.sort_unstable();
    // Peak number of servers in a workflow at the same moment.
    let mut edges: Vec<(i64, i32)> = spans.iter().flat_map(|&(a, b)| [(a, 1), (b, -1)]).collect();
    edges.sort_unstable();
    let peak = edges.iter().scan(0, |n, &(_, d)| {
        *n += d;
        Some(*n)
    });
    let peak = peak.max().unwrap_or(0);
    let by = |counts: &std::collections::BTreeMap<String, u64>| {
        counts.iter().map(|(s, n)| format!("{s} {n}")).collect::<Vec<_>>().join(", ")
    };
    let summary = format!(
        "demo run {} finished in {:.1} s\nservers by state: {}\nresources by state: {}\nprovider retries: {retries}\n\
         peak concurrent workflows: {peak}\ntime to ready: p50 {} ms, p99 {} ms, max {} ms\n\
         database left at {db} — try:\n  settle list --machine server --state ready\n  settle history server {}\n",
        demo.run,
        wall.as_secs_f64(),
        by(&by_state),
        by(&resources),
        percentile(&times, 0.50),
        percentile(&times, 0.99),
        times.last().copied().unwrap_or(0),
        demo.key(0)
    );
    print_summary(&summary)
}

/// Prints the demo's summary in one write. A reader that went away (`settle demo | head
/// -1`) ends the printing quietly: the demo ran, its workers are stopped, nothing is lost
/// but the lines nobody reads.
fn print_summary(text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => Ok(r?),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn percentiles() {
        let v: Vec<i64> = (1..=100).collect();
        assert_eq!(super::percentile(&v, 0.5), 51);
        assert_eq!(super::percentile(&v, 0.99), 99);
        assert_eq!(super::percentile(&[], 0.5), 0);
    }
}
