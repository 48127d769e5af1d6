//! A crash-test workload (hidden command `settle workload`): creates entities one by one,
//! raises `start` on each, and prints `ack KEY` as soon as each raise is durable. Run again
//! on the same file, it continues: entities already created or started are left alone. It
//! exits once every entity is done and nothing is pending.
//!
//! It prints `ready` once its engine runs (a crash test times its kill from there, not
//! from the process's start, which on a busy host may take longer than the whole delay).
//!
//! `--jobs N`: N `job`s (the built-in machine: three unstable steps). `--charts N`: N
//! `chart`s, a statechart whose steps are substates of `working`, with entry and exit
//! actions on both levels. Each entry or exit action prints `hook KEY ACTION STATE` when it
//! runs (before its transition commits) and inserts that row into the table
//! `chart_hooks` in the transition's commit; a crash between the two re-runs the whole
//! transition, so the printed lines may repeat while the table holds each row once.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use serde_json::json;
use settle_engine::{Config, EngineBuilder, Outcome, RaiseOptions, Wait};
use settle_store::{AnyStore, Store};

use settle_builtin::chart::{CHART_HOOKS_TABLE, chart};
use settle_builtin::draws::Draws;

/// Options of `settle workload`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Number of jobs.
    #[arg(long, default_value_t = 200)]
    jobs: usize,
    /// Number of charts (the statechart workload).
    #[arg(long, default_value_t = 0)]
    charts: usize,
}

/// Prints `line` and flushes it at once: a crash test reads each line as the kill may fall
/// right after it.
fn say(line: std::fmt::Arguments<'_>) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// Binds `chart` and its handlers: steps that take a few milliseconds and retry a quarter
/// of the time (a retry re-enters the step: no exit or entry action), and entry and exit
/// actions that print, take a few milliseconds, and insert their row.
fn bind_chart(b: EngineBuilder<AnyStore>) -> EngineBuilder<AnyStore> {
    let mut b = b.machine(chart());
    for (action, next) in [("work1", "step2"), ("work2", "step3"), ("work3", "done")] {
        b = b.on("chart", action, move |ctx| async move {
            let mut draws = Draws::new(7, &ctx.idempotency_key());
            tokio::time::sleep(Duration::from_millis(draws.range(0, 10))).await;
            if draws.next_f64() < 0.25 {
                return Ok(Outcome::retry_after(Duration::from_millis(draws.range(1, 10))));
            }
            Ok(Outcome::to(next))
        });
    }
    for hook in ["enter_working", "leave_working", "enter_step", "leave_step"] {
        b = b.on("chart", hook, move |ctx| async move {
            let (key, state) = (ctx.key.to_string(), ctx.state.to_string());
            say(format_args!("hook {key} {hook} {state}"));
            let mut draws = Draws::new(11, &format!("{}-{hook}", ctx.idempotency_key()));
            tokio::time::sleep(Duration::from_millis(draws.range(1, 8))).await;
            Ok(Outcome::stay().sql(
                "INSERT INTO chart_hooks (key, hook, state) VALUES ($1, $2, $3)",
                [json!(key), json!(hook), json!(state)],
            ))
        });
    }
    b
}

pub async fn run(db: &str, args: Args) -> anyhow::Result<ExitCode> {
    let store = AnyStore::open(db)?;
    store.sql_execute(CHART_HOOKS_TABLE).await?;
    let b = crate::engines::engine_builder(store, &crate::defs::Machines::BUILT_IN, Config::default()).await?;
    let engine = crate::engines::start_built(bind_chart(b)).await?;
    say(format_args!("ready"));
    let (ack_tx, mut ack_rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let printer = tokio::spawn(async move {
        while let Some(key) = ack_rx.recv().await {
            say(format_args!("ack {key}"));
        }
    });
    // One entity at a time, so that a crash can fall between any two raises.
    let entities = (0..args.jobs)
        .map(|i| ("job", format!("job-{i:05}")))
        .chain((0..args.charts).map(|i| ("chart", format!("chart-{i:05}"))));
    for (machine, key) in entities {
        let entity = match engine.get(machine, &key).await? {
            Some(e) => e,
            None => engine.create(machine, &key, Default::default()).await?,
        };
        let queued = !engine.store().inbox_list(entity.id).await?.is_empty();
        if entity.state == "idle" && !queued {
            engine.raise(machine, &key, "start", RaiseOptions::wait(Wait::Queued)).await?;
            let _ = ack_tx.send(key);
        }
    }
    drop(ack_tx);
    printer.await?;
    engine.wait_idle().await?;
    engine.shutdown().await;
    println!("all done");
    Ok(ExitCode::SUCCESS)
}
