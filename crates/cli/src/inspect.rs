//! Read-only views of a database file: `list`, `get`, `history`, `ops`, `op`, `related`,
//! `machines`. They
//! open the file read-only (never creating it) and never take the engine lock, so they work
//! beside a running engine. They print through [`crate::print`], as `--server` does.

use std::process::ExitCode;

use serde_json::{Value, json};
use settle_store::{AnyStore, EntityFilter, EntityRow, EventRow, Store};

pub(crate) use crate::print::fmt_time;
use crate::print::{self, short_id};

pub(crate) fn open(db: &str) -> anyhow::Result<AnyStore> {
    Ok(AnyStore::open_read_only(db)?)
}

fn event_json(e: &EventRow) -> Value {
    json!({
        "id": e.id,
        "event": e.event.as_str(),
        "kind": e.kind,
        "request_id": e.request_id,
        "start_state": e.start_state.as_str(),
        "end_state": e.end_state.as_deref(),
        "start_time": e.start_time,
        "end_time": e.end_time,
        "rejected": e.rejected,
        "failed": e.failed,
        "error": e.error,
        "exception": e.exception,
    })
}

/// `settle list`'s filters and order.
#[derive(clap::Args, Debug)]
pub struct ListArgs {
    /// Only this machine.
    #[arg(long)]
    pub machine: Option<String>,
    /// Only this state.
    #[arg(long)]
    pub state: Option<String>,
    /// Only this run status.
    #[arg(long, value_parser = ["active", "paused", "sleeping", "fault", "failed", "killed"])]
    pub status: Option<String>,
    /// Only keys that start with this (listed by machine and key).
    #[arg(long)]
    pub prefix: Option<String>,
    #[command(flatten)]
    pub narrow: crate::bulk::NarrowArgs,
    /// The order: `id` (default), `entered` (longest in its state first) or `-entered`
    /// (newest in its state first); not with --prefix or --status.
    #[arg(long, value_parser = ["id", "entered", "-entered"], allow_hyphen_values = true)]
    pub sort: Option<String>,
    /// One JSON object per line.
    #[arg(long)]
    pub json: bool,
}

impl ListArgs {
    /// The store's order of `--sort`.
    pub fn order(&self) -> anyhow::Result<settle_store::EntityOrder> {
        let order = match self.sort.as_deref() {
            Some("entered") => settle_store::EntityOrder::EnteredFirst,
            Some("-entered") => settle_store::EntityOrder::EnteredLast,
            _ => settle_store::EntityOrder::Id,
        };
        if order != settle_store::EntityOrder::Id && (self.prefix.is_some() || self.status.is_some()) {
            anyhow::bail!("--sort: a list by entered time cannot also filter by --prefix or --status");
        }
        Ok(order)
    }
}

pub async fn list(db: &str, a: ListArgs) -> anyhow::Result<ExitCode> {
    let ListArgs { machine, state, status: run_status, prefix, .. } = &a;
    let as_json = a.json;
    let order = a.order()?;
    let narrow = settle_engine::Narrow::parse(a.narrow.text(), settle_store::clock::now_ms())
        .map_err(|e| anyhow::anyhow!("--{}", e.replacen('_', "-", 1)))?;
    let store = open(db)?;
    let machines = crate::defs::stored_machines(&store).await?;
    // A parent state lists the entities in its substates, as the stored definitions nest them.
    let substates = match &state {
        Some(st) => {
            let of_machine = machines.iter().filter(|m| machine.as_deref().is_none_or(|n| m.name() == n));
            settle_core::Machine::substates_across(of_machine, st)
        }
        None => Vec::new(),
    };
    let (mut after, mut after_key, mut after_entered) = (None, None, None);
    let mut header = true;
    loop {
        let page = store
            .entity_list(EntityFilter {
                machine: machine.clone(),
                state: state.clone(),
                substates: substates.clone(),
                after_id: after,
                limit: Some(1000),
                run_status: run_status.clone(),
                key_prefix: prefix.clone(),
                after_key: after_key.clone(),
                order,
                after_entered,
                ..EntityFilter::default()
            })
            .await?;
        // The criteria no index holds, entity by entity, by the stored definitions.
        let machine = |name: &str| machines.iter().find(|m| m.name() == name);
        let (keeps, _) = settle_engine::keeps(&store, &narrow, &page, machine).await?;
        let kept: Vec<settle_client::Entity> =
            page.iter().zip(keeps).filter(|(_, keep)| *keep).map(|(e, _)| settle_client::Entity::from(e)).collect();
        print::entity_rows(&kept, as_json, &mut header);
        match page.last() {
            Some(last) if page.len() == 1000 => {
                after = Some(last.id);
                after_key = Some((last.machine.to_string(), last.key.to_string()));
                after_entered = Some((last.entered_at, last.id));
            }
            _ => break,
        }
    }
    print::no_entities(header, as_json);
    Ok(ExitCode::SUCCESS)
}

async fn find(store: &AnyStore, machine: &str, key: &str) -> anyhow::Result<EntityRow> {
    store.entity_get(machine, key).await?.ok_or_else(|| anyhow::anyhow!("no entity `{key}` of machine `{machine}`"))
}

pub async fn get(db: &str, machine: &str, key: &str, as_json: bool) -> anyhow::Result<ExitCode> {
    let store = open(db)?;
    let e = find(&store, machine, key).await?;
    let inbox = store.inbox_list(e.id).await?;
    let mut shown = settle_client::Entity::from(&e);
    let limits = store.limit_of(e.id).await?;
    shown.limits = Some(limits.iter().map(settle_client::EntityLimit::from).collect());
    print::entity(&shown, Some(&print::Detail::of(&e, &inbox)), as_json);
    Ok(ExitCode::SUCCESS)
}

/// `settle limits`: each concurrency limit's key values with slots in use or work waiting.
pub async fn limits(db: &str, as_json: bool) -> anyhow::Result<ExitCode> {
    let usage = open(db)?.limit_list().await?;
    print::limits(&usage.iter().map(settle_client::LimitUsage::from).collect::<Vec<_>>(), as_json);
    Ok(ExitCode::SUCCESS)
}

/// `settle why`: the chain of causes of the entity's failure, read from the database.
pub async fn why(db: &str, machine: &str, key: &str, as_json: bool) -> anyhow::Result<ExitCode> {
    let store = open(db)?;
    let w = settle_store::why(&store, machine, key)
        .await?
        .ok_or_else(|| anyhow::anyhow!("no entity `{key}` of machine `{machine}`"))?;
    let mut shown = settle_api::Why::from(&w);
    let e = find(&store, machine, key).await?;
    shown.limits = store.limit_of(e.id).await?.iter().map(settle_api::EntityLimit::from).collect();
    print::why(&shown, as_json);
    Ok(ExitCode::SUCCESS)
}

pub async fn history(db: &str, machine: &str, key: &str, as_json: bool) -> anyhow::Result<ExitCode> {
    let store = open(db)?;
    let e = find(&store, machine, key).await?;
    let rows = store.history_list(e.id).await?;
    print::history(&rows.iter().map(settle_client::HistoryEntry::from).collect::<Vec<_>>(), as_json);
    Ok(ExitCode::SUCCESS)
}

/// `settle history --events`: the events the entity processed, with their request ids.
pub async fn events(db: &str, machine: &str, key: &str, as_json: bool) -> anyhow::Result<ExitCode> {
    let store = open(db)?;
    let e = find(&store, machine, key).await?;
    let rows = store.events_list(e.id).await?;
    for (i, ev) in rows.iter().enumerate() {
        if as_json {
            println!("{}", event_json(ev));
            continue;
        }
        if i == 0 {
            println!(
                "{:<23}  {:<9}  {:<12} {:<20} {:>14} → {:<14} {:>8}  outcome",
                "RAISED", "REQUEST", "KIND", "EVENT", "START", "END", "MS"
            );
        }
        let outcome = if ev.rejected {
            "rejected".to_string()
        } else if ev.failed {
            format!("failed{}", ev.error.as_deref().map(|d| format!(": {d}")).unwrap_or_default())
        } else if ev.end_time.is_none() {
            "running".to_string()
        } else {
            "ok".to_string()
        };
        println!(
            "{:<23}  {:<9}  {:<12} {:<20} {:>14} → {:<14} {:>8}  {outcome}",
            fmt_time(ev.start_time),
            short_id(ev.request_id.as_deref()),
            ev.kind,
            ev.event.as_str(),
            ev.start_state.as_str(),
            ev.end_state.as_deref().unwrap_or("-"),
            ev.end_time.map(|t| (t - ev.start_time).to_string()).unwrap_or_else(|| "-".into()),
        );
    }
    if rows.is_empty() && !as_json {
        eprintln!("no events processed");
    }
    Ok(ExitCode::SUCCESS)
}

/// `settle ops`: operations, newest first.
pub async fn operations(db: &str, outcome: Option<String>, limit: u64, as_json: bool) -> anyhow::Result<ExitCode> {
    let store = open(db)?;
    let rows = store.operation_list(outcome, limit).await?;
    print::operations(&rows.iter().map(settle_client::Operation::from).collect::<Vec<_>>(), as_json);
    Ok(ExitCode::SUCCESS)
}

/// Entities listed in an operation's trace, at most (as the API's trace route lists them).
const TRACE_ENTITIES: u64 = 1000;

/// `settle op`: one operation with the entities it touched and the transitions it caused
/// there, read as the API's `GET /v1/operations/{id}/trace` reads them.
pub async fn operation(db: &str, request_id: &str, as_json: bool) -> anyhow::Result<ExitCode> {
    let store = open(db)?;
    let row = store
        .operation_get(request_id)
        .await?
        .ok_or_else(|| anyhow::anyhow!("no operation with request id `{request_id}`"))?;
    let t = store.operation_trace(request_id, TRACE_ENTITIES).await?;
    let transitions = t
        .transitions
        .iter()
        .filter_map(|h| {
            let e = t.entities.iter().find(|e| e.id == h.entity_id)?;
            let entry = settle_client::HistoryEntry::from(h);
            Some(settle_api::TraceEntry { machine: e.machine.to_string(), key: e.key.to_string(), entry })
        })
        .collect();
    let trace = settle_api::OperationTrace {
        operation: settle_client::Operation::from(&row),
        entities: t.entities.iter().map(settle_client::Entity::from).collect(),
        transitions,
        truncated: t.truncated,
    };
    print::operation_trace(&trace, as_json);
    Ok(ExitCode::SUCCESS)
}

/// `settle related`: the entity's predecessors and successors, and how far each
/// subscription valid in its state is from firing, read as the API's `related` route
/// reads them (the machines' definitions are the newest stored ones).
pub async fn related(db: &str, machine: &str, key: &str, as_json: bool) -> anyhow::Result<ExitCode> {
    let store = open(db)?;
    let e = find(&store, machine, key).await?;
    let predecessors = store.predecessor_list(e.id).await?;
    let successors = store.successor_snapshot(e.id).await?.successors;
    let machines = crate::defs::stored_machines(&store).await?;
    let related = settle_api::Related {
        predecessors: predecessors.iter().map(settle_client::Entity::from).collect(),
        successors: successors.iter().map(settle_client::Entity::from).collect(),
        subscriptions: subscription_progress(&machines, &e, &successors),
    };
    print::related(&settle_client::Entity::from(&e), &related, as_json);
    Ok(ExitCode::SUCCESS)
}

/// How far each subscription valid in `entity`'s state is from firing over `successors`,
/// as the engine evaluates it, with the stored definitions (no engine runs here).
fn subscription_progress(
    machines: &[settle_core::Machine],
    entity: &EntityRow,
    successors: &[EntityRow],
) -> Vec<settle_api::SubscriptionProgress> {
    let of = |name: &str| machines.iter().find(|m| m.name().as_str() == name);
    let Some(machine) = of(entity.machine.as_str()) else {
        return Vec::new();
    };
    settle_engine::subscription_progress_with(machine, of, entity, successors)
        .into_iter()
        .map(settle_server::model::subscription_progress_of)
        .collect()
}

/// `settle machines`: stored definition versions, the newest per machine marked current,
/// and those of the built-in machines marked so.
pub async fn machines(db: &str, as_json: bool) -> anyhow::Result<ExitCode> {
    let store = open(db)?;
    let versions = store.machine_versions().await?;
    let built_in = crate::defs::built_in(&store).await?;
    // Listed by name, then creation time: the last of each name is its current version.
    for (i, (m, entities)) in versions.iter().enumerate() {
        let current = versions.get(i + 1).is_none_or(|(next, _)| next.name != m.name);
        let is_built_in = crate::defs::is_built_in(m, &built_in);
        if as_json {
            let v = json!({
                "machine": m.name.as_str(),
                "hash": m.hash,
                "created_at": m.created_at,
                "entities": entities,
                "current": current,
                "built_in": is_built_in,
            });
            println!("{v}");
            continue;
        }
        if i == 0 {
            println!(
                "{:<20} {:<14} {:<23} {:>9}  {:<7}  ORIGIN",
                "MACHINE", "VERSION", "DEPLOYED", "ENTITIES", "CURRENT"
            );
        }
        println!(
            "{:<20} {:<14} {:<23} {:>9}  {:<7}  {}",
            m.name.as_str(),
            m.hash.chars().take(12).collect::<String>(),
            fmt_time(m.created_at),
            entities,
            if current { "*" } else { "" },
            if is_built_in { "built-in" } else { "" }
        );
    }
    if versions.is_empty() && !as_json {
        eprintln!("no machines stored");
    }
    Ok(ExitCode::SUCCESS)
}
