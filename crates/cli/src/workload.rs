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

use std::process::ExitCode;

use settle_builtin::chart::{CHART_HOOKS_TABLE, bind_chart, say};
use settle_engine::{Config, RaiseOptions, Wait};
use settle_store::{AnyStore, Store};

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
