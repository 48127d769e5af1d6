//! `settle bulk`: one command or event for every entity matching a filter, as one durable
//! operation (DESIGN §9) — a dry run first (`--dry-run`: how many, and a sample), then
//! the run with a reason and a rate, followed until it ends (progress on stderr); `show`,
//! `list` and `cancel`. On the database (`--db`) this process runs the operation itself;
//! with `--server` the server does, and this process follows it.

use std::process::ExitCode;
use std::time::Duration;

use serde_json::{Value, json};
use settle_client::{Bulk, BulkDryRun, BulkFilter, BulkRequest, Client};
use settle_store::{AnyStore, Store};

use crate::defs::Machines;
use crate::print;

/// The subcommands.
#[derive(clap::Subcommand, Debug)]
pub enum BulkCommand {
    /// Apply ACTION to every entity matching the filter (at least one of --machine,
    /// --state, --status, --prefix, --health, --where, --error, or a time range), at most
    /// --rate a second, with a --reason.
    /// --dry-run only says how many match and shows the first ten. Waits for the end,
    /// printing progress on stderr (unless --no-wait); exit 1 if any entity refused.
    #[command(after_help = "Examples:\n  settle bulk run resume --machine vm --status failed --dry-run\n  \
                            settle bulk run resume --machine vm --status failed --reason 'quota raised' --rate 500\n  \
                            settle bulk run raise --event delete --machine server --health error --reason cleanup\n  \
                            settle bulk run retry --machine vm --error quota --entered-before -1h --reason 'quota raised'\n  \
                            settle bulk run pause --machine vm --where 'props.region == \"eu\"' --reason 'eu maintenance'")]
    Run(Box<RunArgs>),
    /// One bulk operation and its progress.
    #[command(after_help = "Example:\n  settle bulk show 01J9Z6Q4M4K8")]
    Show {
        /// Its request id.
        id: String,
        /// JSON output (the API's body).
        #[arg(long)]
        json: bool,
    },
    /// The newest bulk operations, newest first.
    #[command(after_help = "Example:\n  settle bulk list --json")]
    List {
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// Cancel a running bulk operation: the page in flight finishes, nothing after it.
    #[command(after_help = "Example:\n  settle bulk cancel 01J9Z6Q4M4K8")]
    Cancel {
        /// Its request id.
        id: String,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
}

/// `settle bulk run`.
#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// What to do to each entity.
    #[arg(value_parser = ["pause", "resume", "retry", "release", "kill", "raise"])]
    pub action: String,
    /// The event to raise (with `raise`).
    #[arg(long)]
    pub event: Option<String>,
    /// The event's parameters, a JSON object (with `raise`).
    #[arg(long)]
    pub params: Option<String>,
    /// Only this machine.
    #[arg(long)]
    pub machine: Option<String>,
    /// Only this state (a parent state: its substates).
    #[arg(long)]
    pub state: Option<String>,
    /// Only this run status.
    #[arg(long, value_parser = ["active", "paused", "sleeping", "fault", "failed", "killed"])]
    pub status: Option<String>,
    /// Only keys starting with this.
    #[arg(long)]
    pub prefix: Option<String>,
    /// Only states of this health (`error`: the failing).
    #[arg(long, value_parser = ["ok", "error"])]
    pub health: Option<String>,
    #[command(flatten)]
    pub narrow: NarrowArgs,
    /// Why (required for a run; recorded with the operation).
    #[arg(long)]
    pub reason: Option<String>,
    /// At most this many entities a second.
    #[arg(long, default_value_t = settle_engine::DEFAULT_RATE)]
    pub rate: u32,
    /// For `raise`: the priority of the work its events start, from -1000 to 1000 (default:
    /// each event's declared priority less 10, below live requests).
    #[arg(long, allow_hyphen_values = true)]
    pub priority: Option<i64>,
    /// Only count and show what matches.
    #[arg(long)]
    pub dry_run: bool,
    /// The operation's request id (the same id again follows that operation).
    #[arg(long)]
    pub request_id: Option<String>,
    /// Start it and return (a server, or `settle run`, carries it out).
    #[arg(long)]
    pub no_wait: bool,
    /// JSON output (the API's body).
    #[arg(long)]
    pub json: bool,
}

/// The criteria no index holds, shared by `settle list` and `settle bulk run`.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct NarrowArgs {
    /// Only entities for which this property expression holds (the guards' language:
    /// `props.region == "eu" && in_state('up')`).
    #[arg(long = "where", value_name = "EXPR")]
    pub expr: Option<String>,
    /// Only entities whose newest error contains this text (ignoring case; `#` stands for
    /// any number, as in an error group).
    #[arg(long)]
    pub error: Option<String>,
    /// Only entities created at or after this time (RFC 3339, or `-2h`: that long ago).
    #[arg(long, value_name = "TIME", allow_hyphen_values = true)]
    pub created_after: Option<String>,
    /// Only entities created before this time.
    #[arg(long, value_name = "TIME", allow_hyphen_values = true)]
    pub created_before: Option<String>,
    /// Only entities that entered their state at or after this time.
    #[arg(long, value_name = "TIME", allow_hyphen_values = true)]
    pub entered_after: Option<String>,
    /// Only entities that entered their state before this time (`-1h`: in it for more
    /// than an hour).
    #[arg(long, value_name = "TIME", allow_hyphen_values = true)]
    pub entered_before: Option<String>,
}

impl NarrowArgs {
    /// As the engine reads it.
    pub fn text(&self) -> settle_engine::NarrowText<'_> {
        settle_engine::NarrowText {
            expr: self.expr.as_deref(),
            error: self.error.as_deref(),
            created_after: self.created_after.as_deref(),
            created_before: self.created_before.as_deref(),
            entered_after: self.entered_after.as_deref(),
            entered_before: self.entered_before.as_deref(),
        }
    }
}

impl RunArgs {
    fn request(&self) -> anyhow::Result<BulkRequest> {
        let params = match &self.params {
            None => None,
            Some(p) => Some(serde_json::from_str::<Value>(p).map_err(|e| anyhow::anyhow!("--params: not JSON: {e}"))?),
        };
        Ok(BulkRequest {
            action: self.action.clone(),
            event: self.event.clone(),
            params,
            filter: BulkFilter {
                machine: self.machine.clone(),
                state: self.state.clone(),
                status: self.status.clone(),
                prefix: self.prefix.clone(),
                health: self.health.clone(),
                expr: self.narrow.expr.clone(),
                error: self.narrow.error.clone(),
                created_after: self.narrow.created_after.clone(),
                created_before: self.narrow.created_before.clone(),
                entered_after: self.narrow.entered_after.clone(),
                entered_before: self.narrow.entered_before.clone(),
            },
            reason: self.reason.clone(),
            rate: Some(self.rate),
            priority: self.priority,
            dry_run: self.dry_run,
        })
    }
}

/// `machine=vm status=failed`.
fn filter_text(f: &BulkFilter) -> String {
    let parts = [
        ("machine", &f.machine),
        ("state", &f.state),
        ("status", &f.status),
        ("prefix", &f.prefix),
        ("health", &f.health),
        ("where", &f.expr),
        ("error", &f.error),
        ("created_after", &f.created_after),
        ("created_before", &f.created_before),
        ("entered_after", &f.entered_after),
        ("entered_before", &f.entered_before),
    ];
    parts.iter().filter_map(|(k, v)| v.as_ref().map(|v| format!("{k}={v}"))).collect::<Vec<_>>().join(" ")
}

fn print_dry_run(d: &BulkDryRun, as_json: bool) {
    if as_json {
        println!("{}", serde_json::to_value(d).unwrap_or_default());
        return;
    }
    let count = if d.more { format!("more than {}", d.bound) } else { d.count.to_string() };
    println!("dry run: {count} entities match {}; nothing done", filter_text(&d.filter));
    for e in &d.sample {
        println!("  {}/{}  ({}, {})", e.machine, e.key, e.state, e.run_status);
    }
    if d.count > d.sample.len() as u64 {
        println!("  … and {} more", d.count - d.sample.len() as u64);
    }
}

fn what(b: &Bulk) -> String {
    match &b.event {
        Some(e) => format!("raise {e}"),
        None => b.action.clone(),
    }
}

fn print_bulk(b: &Bulk, as_json: bool) {
    if as_json {
        println!("{}", serde_json::to_value(b).unwrap_or_default());
        return;
    }
    println!(
        "bulk {}: {} on {} — {}: {} of {} done, {} failed, {} remaining (at most {}/s)",
        b.request_id,
        what(b),
        filter_text(&b.filter),
        b.status,
        b.done,
        b.total,
        b.failed,
        b.remaining,
        b.rate
    );
    println!("reason: {}", b.reason);
    if let Some(e) = &b.last_error {
        println!("last refusal: {e}");
    }
}

/// Follows `get` until the operation ends, a line of progress on stderr each second.
async fn follow<F, Fut>(mut get: F) -> anyhow::Result<Bulk>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<Bulk>>,
{
    let mut last = None;
    loop {
        let b = get().await?;
        if b.status != "running" {
            return Ok(b);
        }
        let line = format!("progress: {} of {} done, {} failed, {} remaining", b.done, b.total, b.failed, b.remaining);
        if last.as_ref() != Some(&line) {
            print::stderr_line(format_args!("{line}"));
            last = Some(line);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

fn finished(b: &Bulk, as_json: bool) -> ExitCode {
    print_bulk(b, as_json);
    if b.failed > 0 { ExitCode::FAILURE } else { ExitCode::SUCCESS }
}

/// `settle bulk …` on the database.
pub async fn local(db: &str, machines: &Machines, command: BulkCommand) -> anyhow::Result<ExitCode> {
    match command {
        BulkCommand::Run(a) => {
            let req = a.request()?;
            // A dry run writes nothing at all.
            let engine = if a.dry_run {
                crate::engines::start_read_only_engine(db, machines).await?
            } else {
                // Refuse a missing database rather than create it.
                drop(AnyStore::open_read_only(db)?);
                crate::engines::start_engine(db, machines).await?
            };
            let result = run_local(&engine, &a, req).await;
            engine.shutdown().await;
            result
        }
        BulkCommand::Show { id, json } => {
            let store = AnyStore::open_read_only(db)?;
            let row = store.bulk_get(&id).await?.ok_or_else(|| anyhow::anyhow!("no bulk operation `{id}`"))?;
            print_bulk(&Bulk::from(&row), json);
            Ok(ExitCode::SUCCESS)
        }
        BulkCommand::List { json } => {
            let store = AnyStore::open_read_only(db)?;
            list(&store.bulk_list(100).await?.iter().map(Bulk::from).collect::<Vec<_>>(), json);
            Ok(ExitCode::SUCCESS)
        }
        BulkCommand::Cancel { id, json } => {
            let store = AnyStore::open(db)?;
            let now = settle_store::clock::now_ms();
            let row = store.bulk_cancel(&id, now).await?.ok_or_else(|| anyhow::anyhow!("no bulk operation `{id}`"))?;
            print_bulk(&Bulk::from(&row), json);
            Ok(ExitCode::SUCCESS)
        }
    }
}

async fn run_local(
    engine: &settle_engine::Engine<AnyStore>,
    a: &RunArgs,
    req: BulkRequest,
) -> anyhow::Result<ExitCode> {
    let selection = settle_server::routes::bulk::selection(&req.filter, settle_store::clock::now_ms())
        .map_err(|p| anyhow::anyhow!("{}", p.detail()))?;
    if a.dry_run {
        let d = engine.bulk_dry_run(&selection, settle_server::routes::bulk::SAMPLE).await?;
        print_dry_run(&settle_server::routes::bulk::dry_run_body(&req, &d, |e| settle_client::Entity::from(e)), a.json);
        return Ok(ExitCode::SUCCESS);
    }
    let action =
        settle_engine::BulkAction::parse(&req.action, req.event.as_deref(), req.params.clone().unwrap_or(Value::Null))
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    let request = settle_engine::BulkRequest {
        request_id: a.request_id.clone(),
        action,
        selection,
        reason: req.reason.clone().unwrap_or_default(),
        rate: a.rate,
        priority: a.priority,
    };
    let (row, _) = engine.bulk_start(request).await?;
    if a.no_wait {
        print_bulk(&Bulk::from(&row), a.json);
        return Ok(ExitCode::SUCCESS);
    }
    let id = row.request_id.clone();
    let b = follow(|| async {
        let row = engine.bulk_get(&id).await?.ok_or_else(|| anyhow::anyhow!("no bulk operation `{id}`"))?;
        Ok(Bulk::from(&row))
    })
    .await?;
    Ok(finished(&b, a.json))
}

/// `settle bulk …` over HTTP.
pub async fn remote(c: &Client, command: BulkCommand) -> anyhow::Result<ExitCode> {
    match command {
        BulkCommand::Run(a) => {
            let req = a.request()?;
            if a.dry_run {
                print_dry_run(&c.bulk_dry_run(&req).await?, a.json);
                return Ok(ExitCode::SUCCESS);
            }
            let b = c.bulk_start(&req, a.request_id.as_deref()).await?;
            if a.no_wait {
                print_bulk(&b, a.json);
                return Ok(ExitCode::SUCCESS);
            }
            let id = b.request_id.clone();
            let b = follow(|| async { Ok(c.bulk(&id).await?) }).await?;
            Ok(finished(&b, a.json))
        }
        BulkCommand::Show { id, json } => {
            print_bulk(&c.bulk(&id).await?, json);
            Ok(ExitCode::SUCCESS)
        }
        BulkCommand::List { json } => {
            list(&c.bulk_list().await?, json);
            Ok(ExitCode::SUCCESS)
        }
        BulkCommand::Cancel { id, json } => {
            print_bulk(&c.bulk_cancel(&id).await?, json);
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn list(items: &[Bulk], as_json: bool) {
    if as_json {
        for b in items {
            println!("{}", json!(b));
        }
        return;
    }
    if items.is_empty() {
        println!("no bulk operations");
        return;
    }
    println!("{:<28} {:<14} {:<9} {:>9} {:>9} {:>7}  filter", "REQUEST", "ACTION", "STATUS", "DONE", "TOTAL", "FAILED");
    for b in items {
        println!(
            "{:<28} {:<14} {:<9} {:>9} {:>9} {:>7}  {}",
            b.request_id,
            what(b),
            b.status,
            b.done,
            b.total,
            b.failed,
            filter_text(&b.filter)
        );
    }
}
