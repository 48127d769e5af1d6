//! `settle prune`: removes now what retention lets go (the engine of `settle run` and
//! `settle serve` does it on its own, every minute), or with `--dry-run` says what that
//! would be and changes nothing. Prints a line of progress per second of a long run, then
//! the entities by machine and state (a sample of keys) and the rows per table.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Instant;

use serde_json::json;
use settle_engine::PruneReport;

use crate::defs::Machines;

/// `settle prune`'s options.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Say what would be removed; change nothing.
    #[arg(long)]
    dry_run: bool,
    /// Only the ended entities of this machine (ended operations, finished tasks and
    /// per-minute counts belong to the deployment: they are pruned without --machine).
    #[arg(long, value_name = "MACHINE")]
    machine: Option<String>,
    /// One JSON object.
    #[arg(long)]
    json: bool,
}

/// How many keys the summary shows.
const SAMPLE: usize = 10;

pub async fn run(db: &str, machines: &Machines, a: Args) -> anyhow::Result<ExitCode> {
    let engine = if a.dry_run {
        crate::engines::start_read_only_engine(db, machines).await?
    } else {
        crate::engines::start_command_engine(db, machines).await?
    };
    let started = Instant::now();
    let mut last = Instant::now();
    let (mut entities, mut rows) = (0usize, 0u64);
    let verb = if a.dry_run { "would remove" } else { "removed" };
    let result = engine
        .prune(a.machine.as_deref(), a.dry_run, |round| {
            entities += round.entities.len();
            rows += round.rows.total();
            if last.elapsed().as_secs() >= 1 {
                last = Instant::now();
                eprintln!("settle: {verb} {entities} entities, {rows} rows so far");
            }
        })
        .await;
    engine.shutdown().await;
    let report = result?;
    print(&report, a.dry_run, started.elapsed().as_secs_f64(), a.json);
    Ok(ExitCode::SUCCESS)
}

fn by_state(r: &PruneReport) -> BTreeMap<(String, String), (u64, Vec<&str>)> {
    let mut out: BTreeMap<(String, String), (u64, Vec<&str>)> = BTreeMap::new();
    for e in &r.entities {
        let entry = out.entry((e.machine.clone(), e.state.clone())).or_default();
        entry.0 += 1;
        if entry.1.len() < SAMPLE {
            entry.1.push(&e.key);
        }
    }
    out
}

fn print(r: &PruneReport, dry_run: bool, seconds: f64, as_json: bool) {
    let states = by_state(r);
    if as_json {
        let states: Vec<_> = states
            .iter()
            .map(|((machine, state), (n, keys))| json!({"machine": machine, "state": state, "entities": n, "sample": keys}))
            .collect();
        let rows: serde_json::Map<_, _> = r.rows.tables().iter().map(|(t, n)| (t.to_string(), json!(n))).collect();
        let out = json!({
            "dry_run": dry_run,
            "entities": r.entities.len(),
            "kept": r.kept,
            "archived": r.archived,
            "states": states,
            "rows": rows,
            "rows_total": r.rows.total(),
            "rounds": r.rounds,
            "seconds": seconds,
        });
        println!("{out}");
        return;
    }
    let verb = if dry_run { "would remove" } else { "removed" };
    println!("{verb} {} entities and {} rows in {} rounds ({seconds:.1}s)", r.entities.len(), r.rows.total(), r.rounds);
    for ((machine, state), (n, keys)) in &states {
        let more = if *n as usize > keys.len() { ", …" } else { "" };
        println!("  {machine}/{state}: {n} ({}{more})", keys.join(", "));
    }
    if r.archived > 0 {
        println!("archived {} of them first (--archive)", r.archived);
    }
    if r.kept > 0 {
        println!("kept {} past their retention: linked to a live entity, or holding work", r.kept);
    }
    let tables: Vec<String> = r.rows.tables().iter().filter(|(_, n)| *n > 0).map(|(t, n)| format!("{t} {n}")).collect();
    if !tables.is_empty() {
        println!("rows: {}", tables.join(", "));
    }
    if dry_run {
        println!("(dry run: nothing changed)");
    }
}
