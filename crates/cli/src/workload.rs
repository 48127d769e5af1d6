//! A crash-test workload (hidden command `settle workload`): creates `job` entities one
//! by one, raises `start` on each, and prints `ack KEY` as soon as each raise is durable. Run
//! again on the same file, it continues: entities already created or started are left
//! alone. It exits once every job is `done` and nothing is pending.

use std::io::Write;
use std::process::ExitCode;

use settle_engine::{RaiseOptions, Wait};
use settle_store::Store;

/// Options of `settle workload`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Number of jobs.
    #[arg(long, default_value_t = 200)]
    jobs: usize,
}

pub async fn run(db: &str, args: Args) -> anyhow::Result<ExitCode> {
    let engine = crate::start_engine(db, &crate::defs::Machines::BUILT_IN).await?;
    let (ack_tx, mut ack_rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let printer = tokio::spawn(async move {
        while let Some(key) = ack_rx.recv().await {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "ack {key}");
            let _ = out.flush();
        }
    });
    // One job at a time, so that a crash can fall between any two raises.
    for i in 0..args.jobs {
        let key = format!("job-{i:05}");
        let entity = match engine.get("job", &key).await? {
            Some(e) => e,
            None => engine.create("job", &key, Default::default()).await?,
        };
        let queued = !engine.store().inbox_list(entity.id).await?.is_empty();
        if entity.state == "idle" && !queued {
            engine.raise("job", &key, "start", RaiseOptions::wait(Wait::Queued)).await?;
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
