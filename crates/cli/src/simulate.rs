//! `settle simulate`: the deterministic simulation of `settle-sim`, from the command line
//! (see docs/simulation.md).

use std::process::ExitCode;
use std::time::Duration;

/// Options of `settle simulate`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// How many seeds to run (from `--from`).
    #[arg(long, default_value_t = 200)]
    seeds: u64,
    /// The first seed.
    #[arg(long, default_value_t = 0)]
    from: u64,
    /// Run this one seed and print its trace.
    #[arg(long, conflicts_with_all = ["seeds", "from", "for_"])]
    seed: Option<u64>,
    /// Keep running seeds from a random start for this long (e.g. `10m`, `8h`) instead of
    /// `--seeds`.
    #[arg(long = "for", value_name = "DURATION", value_parser = settle_core::duration::parse)]
    for_: Option<Duration>,
    /// With `--seed`: keep the seed's database at this path, to inspect with the other
    /// commands (`settle --db PATH list`, `history`, `ops`).
    #[arg(long, value_name = "PATH", requires = "seed")]
    keep: Option<std::path::PathBuf>,
    /// Steps of each seed's random schedule (before the healing run).
    #[arg(long, default_value_t = 150)]
    steps: usize,
}

/// Runs `settle simulate` on `db` (the global `--db`): none or `sqlite`, a SQLite file per
/// seed; a `postgres://` URL, a schema per seed in that database, dropped when the seed
/// ends, with several engine instances each on its own connections.
pub async fn run(db: Option<&str>, args: Args) -> anyhow::Result<ExitCode> {
    let db = settle_sim::Db::parse(db.unwrap_or("sqlite")).map_err(|e| {
        anyhow::anyhow!("{e}; `settle simulate` makes a database for each seed (on SQLite, in a temporary directory)")
    })?;
    let options = settle_sim::Options {
        seeds: args.seeds,
        from: args.from,
        seed: args.seed,
        run_for: args.for_,
        keep: args.keep,
        steps: args.steps,
        db,
        stop: Default::default(),
    };
    // Ctrl-C or SIGTERM ends the seed running at its next step, with its database.
    let stop = options.stop.clone();
    let signalled = crate::engines::shutdown_signal();
    let signal = tokio::spawn(async move {
        signalled.await;
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    let held = settle_sim::run(options).await;
    signal.abort();
    Ok(if held? { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}
