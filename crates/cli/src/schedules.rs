//! `settle schedules`: the calendar schedules of the machines, each with its next fire and
//! counts of fires fired, missed and skipped; `pause` and `resume`. On the database the
//! definitions are those stored (or `--machines`); with `--server`, the server's.

use std::process::ExitCode;

use settle_client::{Client, Schedule};
use settle_store::{AnyStore, Store};

use crate::defs::Machines;
use crate::print::fmt_time;

/// The subcommands (none: list them).
#[derive(clap::Subcommand, Debug)]
pub enum ScheduleCommand {
    /// Every schedule, with its next fire and counts (the default).
    #[command(after_help = "Example:\n  settle schedules list --json")]
    List {
        /// One JSON object per line (the API's body).
        #[arg(long)]
        json: bool,
    },
    /// Pause a schedule: nothing fires until it is resumed.
    #[command(after_help = "Example:\n  settle schedules pause backup nightly")]
    Pause {
        /// Its machine.
        machine: String,
        /// Its name.
        name: String,
    },
    /// Resume a paused schedule from its next fire after now.
    #[command(after_help = "Example:\n  settle schedules resume backup nightly")]
    Resume {
        /// Its machine.
        machine: String,
        /// Its name.
        name: String,
    },
}

fn print(items: &[Schedule], json: bool) {
    if json {
        for s in items {
            println!("{}", serde_json::to_string(s).unwrap_or_default());
        }
        return;
    }
    if items.is_empty() {
        println!("no schedules (a machine declares them as [schedules.NAME])");
        return;
    }
    println!(
        "{:<12} {:<16} {:<28} {:<24} {:<26} {:>6} {:>6} {:>7}",
        "MACHINE", "SCHEDULE", "CRON", "DOES", "NEXT", "FIRED", "MISSED", "SKIPPED"
    );
    for s in items {
        let next = match (s.paused, s.next_at) {
            (true, _) => "paused".to_string(),
            (false, Some(t)) => fmt_time(t),
            (false, None) => "-".to_string(),
        };
        println!(
            "{:<12} {:<16} {:<28} {:<24} {:<26} {:>6} {:>6} {:>7}",
            s.machine, s.name, s.cron, s.does, next, s.fired, s.missed, s.skipped
        );
    }
}

fn one(s: &Schedule) {
    let state = if s.paused {
        "paused".to_string()
    } else {
        format!("next fire {}", s.next_at.map(fmt_time).unwrap_or("-".into()))
    };
    println!("{}/{}: {state}", s.machine, s.name);
}

/// `settle schedules …` on the database.
pub async fn local(db: &str, machines: &Machines, command: Option<ScheduleCommand>) -> anyhow::Result<ExitCode> {
    match command.unwrap_or(ScheduleCommand::List { json: false }) {
        ScheduleCommand::List { json } => {
            let store = AnyStore::open_read_only(db)?;
            let rows = store.schedule_list().await?;
            let defs = machines.definitions(&store).await?;
            let defs: Vec<&settle_core::Machine> = defs.iter().collect();
            let items: Vec<Schedule> = settle_engine::schedule_views(&defs, &rows)
                .iter()
                .map(settle_server::routes::schedules::body)
                .collect();
            print(&items, json);
            Ok(ExitCode::SUCCESS)
        }
        ScheduleCommand::Pause { machine, name } => set(db, machines, &machine, &name, true).await,
        ScheduleCommand::Resume { machine, name } => set(db, machines, &machine, &name, false).await,
    }
}

/// Pauses or resumes a schedule on the database (an engine of `machines` computes its next
/// fire).
async fn set(db: &str, machines: &Machines, machine: &str, name: &str, paused: bool) -> anyhow::Result<ExitCode> {
    // Refuse a missing database rather than create it.
    drop(AnyStore::open_read_only(db)?);
    let engine = crate::engines::start_command_engine(db, machines).await?;
    let result = engine.schedule_pause(machine, name, paused).await;
    let views = engine.schedules().await;
    engine.shutdown().await;
    result?;
    let v = views?.into_iter().find(|v| v.machine == machine && v.name == name);
    if let Some(v) = v {
        one(&settle_server::routes::schedules::body(&v));
    }
    Ok(ExitCode::SUCCESS)
}

/// `settle schedules …` over HTTP.
pub async fn remote(c: &Client, command: Option<ScheduleCommand>) -> anyhow::Result<ExitCode> {
    match command.unwrap_or(ScheduleCommand::List { json: false }) {
        ScheduleCommand::List { json } => print(&c.schedules().await?, json),
        ScheduleCommand::Pause { machine, name } => one(&c.schedule_pause(&machine, &name, true).await?),
        ScheduleCommand::Resume { machine, name } => one(&c.schedule_pause(&machine, &name, false).await?),
    }
    Ok(ExitCode::SUCCESS)
}
