//! `settle agent`: an external agent (DESIGN §5) that serves an agent queue of a Settle
//! server over HTTP with the simulated provider of the reference scenario — slow and
//! flaky. It is what `settle demo --agents` runs, and an example of the protocol: long-poll
//! leases, heartbeats while working, `complete` or `fail` with the lease token.
//!
//! What it reports, for a task whose action declares `targets`: success → the first
//! target; a permanent provider failure → `failed` when the action declares it (else a
//! non-retryable `fail`); a transient failure → a retryable `fail` (the entity's fault
//! policy backs off and offers the task again).

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::bail;
use serde_json::json;
use settle_client::{Client, Task};
use tokio::sync::Semaphore;

use settle_builtin::draws::Draws;

/// Options of `settle agent`.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// The server's URL.
    #[arg(long, env = "SETTLE_SERVER", default_value = "http://127.0.0.1:7400")]
    server: String,
    /// Bearer token (an agent token naming the queue).
    #[arg(long, env = "SETTLE_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// The queue to serve.
    #[arg(long, default_value = settle_builtin::PROVIDER_QUEUE)]
    queue: String,
    /// This agent's name (recorded with the tasks it leases).
    #[arg(long)]
    name: Option<String>,
    /// Tasks worked on at once.
    #[arg(long, default_value_t = 32)]
    concurrency: u32,
    /// Probability that a provider call fails transiently, in [0, 1).
    #[arg(long, default_value_t = 0.2)]
    fail_rate: f64,
    /// Probability that a provisioning call fails for good, in [0, 1).
    #[arg(long, default_value_t = 0.0)]
    fatal_rate: f64,
    /// Shortest provider call (ms).
    #[arg(long, default_value_t = 100)]
    min_latency_ms: u64,
    /// Longest provider call (ms).
    #[arg(long, default_value_t = 800)]
    max_latency_ms: u64,
    /// Seed of the simulation.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Stop when stdin closes (for agents started by `settle demo --agents`).
    #[arg(long, hide = true)]
    until_stdin_closes: bool,
}

pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    if !(0.0..1.0).contains(&args.fail_rate) || !(0.0..1.0).contains(&args.fatal_rate) {
        bail!("--fail-rate and --fatal-rate must be in [0, 1)");
    }
    if args.concurrency == 0 || args.max_latency_ms < args.min_latency_ms {
        bail!("--concurrency must be at least 1 and --max-latency-ms at least --min-latency-ms");
    }
    let mut client = Client::new(&args.server)?;
    if let Some(t) = &args.token {
        client = client.with_token(t.clone());
    }
    let name = args.name.clone().unwrap_or_else(|| format!("settle-agent-{}", std::process::id()));
    crate::print::stderr_line(format_args!("agent {name} serving queue `{}` of {}", args.queue, args.server));
    let work = serve(client, args.clone(), name);
    if args.until_stdin_closes {
        tokio::select! {
            r = work => r?,
            _ = crate::engines::stdin_closed() => {}
        }
    } else {
        tokio::select! {
            r = work => r?,
            _ = crate::engines::shutdown_signal() => {}
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn serve(client: Client, args: Args, name: String) -> anyhow::Result<()> {
    let slots = Arc::new(Semaphore::new(args.concurrency as usize));
    let mut unreachable_since: Option<std::time::Instant> = None;
    loop {
        // Lease only what there is room for: a leased task nobody works on would only
        // wait for its lock to run out.
        let first = slots.clone().acquire_owned().await?;
        // The server leases at most 100 tasks per request.
        let free = (1 + slots.available_permits() as u32).min(100);
        match client.lease(&args.queue, &name, free, Duration::from_secs(20)).await {
            Ok(tasks) => {
                unreachable_since = None;
                let mut permit = Some(first);
                for task in tasks {
                    let permit = match permit.take() {
                        Some(p) => p,
                        None => slots.clone().acquire_owned().await?,
                    };
                    let (client, args) = (client.clone(), args.clone());
                    tokio::spawn(async move {
                        work_on(&client, &args, &task).await;
                        drop(permit);
                    });
                }
            }
            Err(e) if e.status().is_none() => {
                // The server is down or restarting: keep trying, say so once in a while.
                let since = *unreachable_since.get_or_insert_with(std::time::Instant::now);
                if since.elapsed() > Duration::from_secs(60) {
                    bail!("server unreachable for a minute: {e}");
                }
                eprintln!("lease failed, retrying: {e}");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => bail!("lease refused: {e}"),
        }
    }
}

/// Works on one task: the provider call (heartbeating meanwhile), then the report.
async fn work_on(client: &Client, args: &Args, task: &Task) {
    // Deterministic per task attempt: a rerun behaves alike.
    let mut draws = Draws::new(args.seed, &format!("{}/{}/{}/{}", task.machine, task.key, task.id, task.attempt));
    let latency = Duration::from_millis(draws.range(args.min_latency_ms, args.max_latency_ms + 1));
    let heartbeat_every = Duration::from_millis((task.lock_ms / 3).max(1) as u64);
    let call = tokio::time::sleep(latency);
    tokio::pin!(call);
    loop {
        tokio::select! {
            _ = &mut call => break,
            _ = tokio::time::sleep(heartbeat_every) => {
                if let Err(e) = client.heartbeat(task).await {
                    eprintln!("task {} ({} {}): lease lost, dropping it: {e}", task.id, task.machine, task.key);
                    return;
                }
            }
        }
    }
    let x = draws.next_f64();
    let deprovisioning = task.targets.first().map(String::as_str) == Some("gone");
    let fatal_rate = if deprovisioning { 0.0 } else { args.fatal_rate };
    let report = if x < fatal_rate {
        if task.targets.iter().any(|t| t == "failed") {
            let failed = settle_client::CompleteRequest {
                target: Some("failed".into()),
                error: Some("provider refused the request".into()),
                ..settle_client::CompleteRequest::default()
            };
            client.report(task, failed).await
        } else {
            client.fail(task, "provider refused the request", false).await
        }
    } else if x < fatal_rate + args.fail_rate {
        client.fail(task, "provider unavailable (simulated transient failure)", true).await
    } else {
        let target = task.targets.first().cloned().unwrap_or_default();
        client.complete(task, &target, json!({"provider_call_ms": latency.as_millis() as u64})).await
    };
    if let Err(e) = report {
        // Refused (the lease expired or the entity moved on): nothing changed; the task is
        // offered again if it still matters.
        eprintln!("task {} ({} {}): report not taken: {e}", task.id, task.machine, task.key);
    }
}
