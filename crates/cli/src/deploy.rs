//! `settle deploy FILE…`: new versions of machines to a running deployment, on the
//! database or over `--server` (admin). Each version is checked against the live entities
//! first and refused, naming them, if it would strand any; then stored as its machine's
//! current version, its `upgrade` policy moving the entities (`migrate`: at once; `pin`:
//! those at rest now, the working ones once they rest). Every running instance takes it up
//! within a second, without a restart.

use std::path::PathBuf;
use std::process::ExitCode;

use settle_client::{Client, Deployed};

use crate::defs::Machines;

/// `settle deploy`'s arguments.
#[derive(clap::Args, Debug)]
pub struct DeployArgs {
    /// Machine definitions (TOML), one machine a file.
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// Check against the live entities and say what would happen; change nothing.
    #[arg(long)]
    dry_run: bool,
    /// The result as JSON (the API's body).
    #[arg(long)]
    json: bool,
}

/// What a deploy did, one line a machine (or the API's body with `--json`).
fn print(machines: &[Deployed], dry_run: bool, json: bool) {
    if json {
        let body = settle_client::DeployResult { dry_run, machines: machines.to_vec() };
        println!("{}", serde_json::to_string(&body).unwrap_or_default());
        return;
    }
    let short = |h: &str| h.chars().take(12).collect::<String>();
    for d in machines {
        if d.unchanged {
            println!("{}: unchanged (version {})", d.machine, short(&d.version));
            continue;
        }
        let was =
            d.previous.as_deref().map(|p| format!(" (was {})", short(p))).unwrap_or_else(|| " (new machine)".into());
        let verb = if dry_run { "would deploy" } else { "deployed" };
        let pinned = if d.pinned > 0 { format!(", {} pinned until at rest", d.pinned) } else { String::new() };
        println!(
            "{verb} {} version {}{was}, {}: {} moved now{pinned}",
            d.machine,
            short(&d.version),
            d.upgrade,
            d.moved
        );
    }
    if dry_run {
        println!("dry run: nothing changed");
    }
}

/// `settle deploy` on the database (an engine that processes nothing checks and stores, on
/// the definitions stored, or `--machines`).
pub async fn local(db: &str, machines: &Machines, args: DeployArgs) -> anyhow::Result<ExitCode> {
    let mut loaded = Vec::new();
    for path in &args.files {
        let (m, _warnings) = crate::validate::load_machine(path).map_err(|report| anyhow::anyhow!("{report}"))?;
        loaded.push(m);
    }
    // A dry run writes nothing at all; a deploy needs no handler (it stores and moves).
    let engine = if args.dry_run {
        crate::engines::start_read_only_engine(db, machines).await?
    } else {
        crate::engines::start_command_engine(db, machines).await?
    };
    let result = engine.deploy(loaded, args.dry_run).await;
    engine.shutdown().await;
    let done: Vec<Deployed> = result?.into_iter().map(settle_server::routes::machines::deployed).collect();
    print(&done, args.dry_run, args.json);
    Ok(ExitCode::SUCCESS)
}

/// `settle deploy` over HTTP (`POST /v1/machines`).
pub async fn remote(c: &Client, args: DeployArgs) -> anyhow::Result<ExitCode> {
    let mut files = Vec::new();
    for path in &args.files {
        let text =
            std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("{}: cannot read: {e}", path.display()))?;
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        files.push((name, text));
    }
    let done = c.deploy(files, args.dry_run).await?;
    print(&done.machines, done.dry_run, args.json);
    Ok(ExitCode::SUCCESS)
}
