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

/// Runs `settle simulate`.
pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    // The injected faults would log errors by the thousand: quiet unless SETTLE_LOG asks.
    let _quiet = std::env::var_os("SETTLE_LOG")
        .is_none()
        .then(|| tracing_subscriber::util::SubscriberInitExt::set_default(tracing_subscriber::registry()));
    let options = settle_sim::Options {
        seeds: args.seeds,
        from: args.from,
        seed: args.seed,
        run_for: args.for_,
        keep: args.keep,
        steps: args.steps,
    };
    Ok(if settle_sim::run(options).await? { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}
