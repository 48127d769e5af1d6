//! `settle cancel REQUEST_ID`: cancel an operation. Every entity it reached drops its
//! queued events of it, stops the work it does in it (a result in flight is discarded, an
//! agent's task canceled) and runs its machine's `cancel` event where that is valid; one
//! with no undo is left paused. On the database this process runs the cancel (and, with
//! `--undone`, the undo) itself; over `--server` the server does (`POST
//! /v1/operations/{id}/cancel`). Prints what became of each entity.

use std::process::ExitCode;
use std::time::Duration;

use settle_client::{CancelResult, CanceledEntity, Client};
use settle_store::AnyStore;

use crate::defs::Machines;

/// `settle cancel`'s arguments.
#[derive(clap::Args, Debug)]
pub struct CancelArgs {
    /// The operation's request id (`settle ops --outcome open` lists those still running).
    request_id: String,
    /// Why: recorded with the cancel and in each entity's history.
    #[arg(long)]
    reason: Option<String>,
    /// Also wait until the operation and every entity's undo have ended.
    #[arg(long)]
    undone: bool,
    /// How long to wait (the cancel goes on after; exit 1 if it had not got through).
    #[arg(long, default_value = "30s")]
    timeout: String,
    /// The result as JSON (the API's body).
    #[arg(long)]
    json: bool,
}

/// What the cancel did, an entity a line (or the API's body with `--json`); exit 1 when
/// the wait ran out first.
fn print(r: &CancelResult, finished: bool, json: bool) -> ExitCode {
    if json {
        println!("{}", serde_json::to_string(r).unwrap_or_default());
    } else {
        let o = &r.operation;
        let outcome = o.outcome.as_deref().unwrap_or("open: its undo still runs");
        let again = if r.replayed { " (asked before: the same cancel)" } else { "" };
        println!("operation {}: {outcome}{again}", o.request_id);
        println!("reason: {}", r.bulk.reason);
        for c in &r.entities {
            println!("  {}", line(c));
        }
        let b = &r.bulk;
        println!(
            "cancel {}: {}, {} of {} entities, {} refused",
            b.request_id,
            b.status,
            b.done,
            b.total.max(b.done + b.failed),
            b.failed
        );
        if let Some(e) = &b.last_error {
            println!("last refusal: {e}");
        }
    }
    if !finished {
        crate::print::stderr_line(format_args!(
            "the wait ran out; the cancel goes on (settle op {} shows it)",
            r.operation.request_id
        ));
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

fn line(c: &CanceledEntity) -> String {
    let e = &c.entity;
    let did = c.did.as_deref().and_then(|d| d.split_once(": ").map(|(_, what)| what)).unwrap_or("nothing of it here");
    let part = match &c.part {
        Some(p) if p.ended_at.is_none() => "  [undo running]",
        _ => "",
    };
    format!("{}/{}  {} ({})  {did}{part}", e.machine, e.key, e.state, e.run_status)
}

fn timeout(text: &str) -> anyhow::Result<Duration> {
    settle_core::duration::parse(text).map_err(|e| anyhow::anyhow!("--timeout: {e}"))
}

/// `settle cancel` on the database: an engine of this process runs the cancel.
pub async fn local(db: &str, machines: &Machines, a: CancelArgs) -> anyhow::Result<ExitCode> {
    let wait = timeout(&a.timeout)?;
    // Refuse a missing database rather than create it.
    drop(AnyStore::open_read_only(db)?);
    let engine = crate::engines::start_engine(db, machines).await?;
    let result = settle_server::routes::operations::cancel_and_wait(
        &engine,
        &a.request_id,
        a.reason.as_deref(),
        a.undone,
        wait,
        |e| settle_client::Entity::from(e),
    )
    .await;
    engine.shutdown().await;
    let (body, finished) = result?;
    Ok(print(&body, finished, a.json))
}

/// `settle cancel` over HTTP.
pub async fn remote(c: &Client, a: CancelArgs) -> anyhow::Result<ExitCode> {
    // The server waits up to 30 s; a shorter --timeout is this process's own.
    let wait = timeout(&a.timeout)?;
    let call = c.cancel_operation(&a.request_id, a.reason.as_deref(), a.undone);
    let body = tokio::time::timeout(wait.max(Duration::from_secs(1)), call)
        .await
        .map_err(|_| anyhow::anyhow!("no answer within {}; the cancel goes on on the server", a.timeout))??;
    let finished = body.bulk.status != "running"
        && (!a.undone
            || (body.operation.ended_at.is_some()
                && body.entities.iter().all(|e| e.part.as_ref().is_none_or(|p| p.ended_at.is_some()))));
    Ok(print(&body, finished, a.json))
}
