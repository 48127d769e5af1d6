//! Operator commands on one entity: `pause`, `resume`, `sleep`, `kill`, `release`, `retry`.
//! Each starts an engine on the database that processes nothing, writes the command as an
//! operation (idempotent per `--request-id`), prints the entity afterwards and stops.

use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::json;
use settle_engine::Command;

use settle_server::time::parse_time;

use crate::inspect::fmt_time;

/// The entity a command applies to.
#[derive(clap::Args, Debug)]
pub struct Target {
    /// Machine name.
    machine: String,
    /// Entity key.
    key: String,
    /// Idempotency key: a command repeated with the same id is done once.
    #[arg(long)]
    request_id: Option<String>,
    /// One JSON object.
    #[arg(long)]
    json: bool,
}

/// Which command, with `sleep`'s wake-up time as given.
#[derive(Debug)]
pub enum Kind {
    Pause,
    Resume,
    Sleep(String),
    Kill,
    Release,
    Retry,
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

pub fn run(db: &str, target: Target, kind: Kind) -> anyhow::Result<ExitCode> {
    let command = match kind {
        Kind::Pause => Command::Pause,
        Kind::Resume => Command::Resume,
        Kind::Sleep(until) => {
            let until = parse_time(&until, now_ms()).map_err(|e| anyhow::anyhow!("--until: {e}"))?;
            Command::Sleep { until }
        }
        Kind::Kill => Command::Kill,
        Kind::Release => Command::Release,
        Kind::Retry => Command::Retry,
    };
    crate::runtime()?.block_on(apply(db, target, command))
}

async fn apply(db: &str, t: Target, command: Command) -> anyhow::Result<ExitCode> {
    let engine = crate::start_command_engine(db).await?;
    let result = engine.command(&t.machine, &t.key, command, t.request_id.clone()).await;
    engine.shutdown().await;
    let done = result?;
    let e = &done.entity;
    if t.json {
        let v = json!({
            "machine": e.machine.as_str(),
            "key": e.key.as_str(),
            "command": command.as_str(),
            "state": e.state.as_str(),
            "run_status": e.run_status.as_str(),
            "sleep_until": e.sleep_until,
            "request_id": done.request_id,
            "replayed": done.replayed,
        });
        println!("{v}");
    } else {
        let until = e.sleep_until.map(|t| format!(" until {}", fmt_time(t))).unwrap_or_default();
        println!(
            "{} {}: {}; state {}, run status {}{until}",
            e.machine,
            e.key,
            command.as_str(),
            e.state,
            e.run_status.as_str()
        );
        if done.replayed {
            println!("replayed: request id {} was seen before; nothing was done again", done.request_id);
        } else {
            println!("request id {}", done.request_id);
        }
    }
    Ok(ExitCode::SUCCESS)
}
