//! `settle bench bulk`: a bulk operation over a large fleet. It seeds N idle `job`
//! entities (keys `bulk-0000000`…, skipped when the database holds them already), then
//! pauses all of them with one bulk operation at the rate asked for, following its
//! progress, and reports entities a second. The operation's request id is `--request-id`:
//! run again after a crash, the command follows the same operation to its end (what the
//! crash test does), and the report says it resumed. It checks that every entity ended
//! paused and that the operation counted each once.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::bail;
use serde_json::json;
use settle_engine::{BulkAction, BulkRequest, Command, Selection};
use settle_store::{AnyStore, EntityFilter, Store};

use super::fleet::{SEED_BATCH, at_rest, write_creates};

/// Options of `settle bench bulk`.
#[derive(clap::Args, Debug)]
pub struct BulkArgs {
    /// Entities to pause (seeded when missing).
    #[arg(long, default_value_t = 100_000)]
    entities: usize,
    /// At most this many entities a second.
    #[arg(long, default_value_t = settle_engine::MAX_RATE)]
    rate: u32,
    /// The bulk operation's request id (the same id again follows that operation).
    #[arg(long, default_value = "bench-bulk")]
    request_id: String,
    /// Print one JSON line.
    #[arg(long)]
    json: bool,
}

const PREFIX: &str = "bulk-";

pub async fn bulk(db: &str, args: BulkArgs) -> anyhow::Result<ExitCode> {
    if args.entities == 0 || args.rate == 0 {
        bail!("--entities and --rate must be at least 1");
    }
    // Seeding goes straight to the store of the engine that runs the operation (one
    // engine holds a SQLite database).
    let engine = crate::engines::start_engine(db, &crate::defs::Machines::BUILT_IN).await?;
    let store = engine.store().clone();
    let mine = EntityFilter { machine: Some("job".into()), key_prefix: Some(PREFIX.into()), ..EntityFilter::default() };
    let have = store.entity_count(mine, args.entities as u64).await? as usize;
    let seeding = Instant::now();
    let mut i = have;
    while i < args.entities {
        let end = (i + SEED_BATCH).min(args.entities);
        write_creates(
            &store,
            (i..end).map(|n| at_rest("job", format!("{PREFIX}{n:07}"), "idle", Vec::new())).collect(),
        )
        .await?;
        i = end;
    }
    let seed_s = seeding.elapsed().as_secs_f64();
    if !args.json && have < args.entities {
        eprintln!("seeded {} idle jobs in {seed_s:.1} s", args.entities - have);
    }
    let request = BulkRequest {
        request_id: Some(args.request_id.clone()),
        action: BulkAction::Command(Command::Pause),
        selection: Selection { machine: Some("job".into()), prefix: Some(PREFIX.into()), ..Selection::default() },
        reason: "settle bench bulk".into(),
        rate: args.rate,
        priority: None,
    };
    let started = Instant::now();
    let result = follow(&engine, request, args.json).await;
    let seconds = started.elapsed().as_secs_f64();
    let (row, new, done_before) = match result {
        Ok(r) => r,
        Err(e) => {
            engine.shutdown().await;
            return Err(e);
        }
    };
    let paused = EntityFilter {
        machine: Some("job".into()),
        key_prefix: Some(PREFIX.into()),
        run_status: Some("paused".into()),
        ..EntityFilter::default()
    };
    let paused = store.entity_count(paused, args.entities as u64).await?;
    engine.shutdown().await;
    if row.status != "done" || row.done + row.failed != row.total || row.failed > 0 || paused < args.entities as u64 {
        bail!(
            "bulk operation {}: {} with {} done and {} failed of {}; {paused} of {} jobs paused",
            row.request_id,
            row.status,
            row.done,
            row.failed,
            row.total,
            args.entities
        );
    }
    let commanded = row.done - done_before;
    let per_s = commanded as f64 / seconds.max(1e-9);
    let v = json!({
        "workload": "bulk",
        "entities": args.entities,
        "request_id": row.request_id,
        "resumed": !new,
        "commanded_now": commanded,
        "done": row.done,
        "failed": row.failed,
        "seconds": super::measure::round3(seconds),
        "entities_per_s": per_s.round(),
        "seed_s": super::measure::round3(seed_s),
    });
    if args.json {
        println!("{v}");
    } else {
        println!(
            "bulk pause of {} jobs: {} done ({} in this run{}) in {seconds:.1} s: {per_s:.0} entities/s",
            args.entities,
            row.done,
            commanded,
            if new { "" } else { ", resumed" }
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Starts (or finds) the operation and waits for its end, a progress line on stderr every
/// few seconds: the row, whether it was new, and how many were done before this run.
async fn follow(
    engine: &settle_engine::Engine<AnyStore>,
    request: BulkRequest,
    quiet: bool,
) -> anyhow::Result<(settle_store::BulkRow, bool, u64)> {
    let (row, new) = engine.bulk_start(request).await?;
    let done_before = row.done;
    let id = row.request_id.clone();
    loop {
        match engine.bulk_wait(&id, Duration::from_secs(5)).await {
            Ok(row) => return Ok((row, new, done_before)),
            Err(settle_engine::Error::Timeout { .. }) => {
                if !quiet && let Some(r) = engine.bulk_get(&id).await? {
                    eprintln!("progress: {} of {} done, {} failed", r.done, r.total, r.failed);
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
}
