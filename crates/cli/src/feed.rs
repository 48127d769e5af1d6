//! `settle feed`: the change feed, one line a change, as it commits — from the database
//! (read directly, four times a second while nothing is new), or from a server
//! (`GET /v1/feed`, reconnecting with the last position after an interruption).

use std::process::ExitCode;
use std::time::Duration;

use settle_client::{Change, Client, FeedQuery};
use settle_store::{FeedFilter, FeedPos, Store};

use crate::print::fmt_time;

/// Options of `settle feed`.
#[derive(clap::Args, Debug)]
pub struct FeedArgs {
    /// Only this machine's entities (and operations on them).
    #[arg(long)]
    machine: Option<String>,
    /// Only this entity (with --machine).
    #[arg(long, requires = "machine")]
    key: Option<String>,
    /// Only transitions into this state.
    #[arg(long)]
    state: Option<String>,
    /// Only what this request caused.
    #[arg(long)]
    request_id: Option<String>,
    /// Only `transition`s or only `operation` ends.
    #[arg(long = "type", value_parser = ["transition", "operation"])]
    kind: Option<String>,
    /// Start after this position (a change's id; `0`: the oldest kept). Default: from now on.
    #[arg(long)]
    since: Option<String>,
    /// Print what is there and stop (the position to go on from goes to stderr). Database only.
    #[arg(long)]
    once: bool,
    /// One JSON object a line (the API's `Change`).
    #[arg(long)]
    json: bool,
}

fn print(c: &Change, json: bool) {
    if json {
        println!("{}", serde_json::to_value(c).unwrap_or_default());
        return;
    }
    let entity = format!("{}/{}", c.machine.as_deref().unwrap_or("?"), c.key.as_deref().unwrap_or("?"));
    if let Some(t) = &c.transition {
        let moved = match (&t.from, &t.to) {
            (_, None) => String::new(),
            (None, Some(to)) => format!(" → {to}"),
            (Some(from), Some(to)) => format!(" {from} → {to}"),
        };
        let cause = t.event.as_deref().map(|e| format!(" (event {e})")).unwrap_or_default();
        let detail = t.detail.as_deref().map(|d| format!(": {d}")).unwrap_or_default();
        let request = t.request_id.as_deref().map(|r| format!("  request {r}")).unwrap_or_default();
        println!("{}  {}  {entity}  {}{moved}{cause}{detail}{request}", c.id, fmt_time(t.at), t.kind);
    } else if let Some(o) = &c.operation {
        let error = o.error.as_deref().map(|e| format!(": {e}")).unwrap_or_default();
        let outcome = o.outcome.as_deref().unwrap_or("ended");
        println!(
            "{}  {}  {entity}  operation {} {outcome}{error}  request {}",
            c.id,
            fmt_time(o.ended_at.unwrap_or(o.started_at)),
            o.name,
            o.request_id
        );
    }
}

/// `settle feed` on the database.
pub async fn local(db: &str, args: FeedArgs) -> anyhow::Result<ExitCode> {
    let store = crate::inspect::open(db)?;
    let filter = FeedFilter {
        machine: args.machine,
        key: args.key,
        state: args.state,
        request_id: args.request_id,
        transitions: args.kind.as_deref() != Some("operation"),
        operations: args.kind.as_deref() != Some("transition"),
    };
    let mut at = match args.since.as_deref() {
        Some(s) => s.parse::<FeedPos>().map_err(|e| anyhow::anyhow!("--since: {e}"))?,
        None => store.feed_head().await?,
    };
    loop {
        let page = store.feed_read(at, filter.clone(), settle_store::feed::MAX_PAGE).await?;
        for item in &page.items {
            print(&Change::from(item), args.json);
        }
        at = page.until;
        if page.more {
            continue;
        }
        if args.once {
            eprintln!("next: settle feed --since {at}");
            return Ok(ExitCode::SUCCESS);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// `settle feed --server`: the server's stream, resumed after an interruption.
pub async fn remote(c: &Client, args: FeedArgs) -> anyhow::Result<ExitCode> {
    if args.once {
        anyhow::bail!("--once reads the database; from a server the feed is a stream (stop it with Ctrl-C)");
    }
    let q = FeedQuery {
        machine: args.machine,
        key: args.key,
        state: args.state,
        request_id: args.request_id,
        kind: args.kind,
        since: args.since,
    };
    let mut last: Option<String> = None;
    loop {
        let mut stream = match c.feed(&q, last.as_deref()).await {
            Ok(s) => s,
            // Refused (a bad filter, a token): no retry helps.
            Err(e) if e.status().is_some() => return Err(e.into()),
            Err(e) => {
                eprintln!("settle: cannot reach the feed ({e}); trying again in 1 s");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let why = loop {
            match stream.next().await {
                Ok(Some(change)) => print(&change, args.json),
                Ok(None) => break "the server ended the stream".to_string(),
                Err(e) => break e.to_string(),
            }
            last = stream.last_id().map(str::to_string);
        };
        last = stream.last_id().map(str::to_string).or(last);
        let after = last.as_deref().map(|l| format!(" after {l}")).unwrap_or_default();
        eprintln!("settle: {why}; reconnecting{after} in 1 s");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
