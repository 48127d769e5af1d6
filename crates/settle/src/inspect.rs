//! Read-only views of a database file: `list`, `get`, `history`, `ops`, `machines`. They
//! open the file read-only (never creating it) and never take the engine lock, so they work
//! beside a running engine.

use std::process::ExitCode;

use serde_json::{Value, json};
use settle_store::{AnyStore, EntityFilter, EntityRow, EventRow, HistoryRow, OperationRow, Store};

pub(crate) fn open(db: &str) -> anyhow::Result<AnyStore> {
    Ok(AnyStore::open_read_only(db)?)
}

fn entity_json(e: &EntityRow) -> Value {
    json!({
        "machine": e.machine.as_str(),
        "key": e.key.as_str(),
        "state": e.state.as_str(),
        "version": e.version,
        "retry": e.retry,
        "properties": e.properties,
        "created_at": e.created_at,
        "entered_at": e.entered_at,
        "due_at": e.due_at,
        "lease_owner": e.lease_owner,
        "run_status": e.run_status.as_str(),
        "sleep_until": e.sleep_until,
    })
}

/// A request id short enough for a table: whole up to 12 characters, else its end (the
/// random part of a generated UUIDv7; its start is a timestamp shared by close requests).
fn short_id(id: Option<&str>) -> String {
    match id {
        None => "-".to_string(),
        Some(id) if id.chars().count() <= 12 => id.to_string(),
        Some(id) => {
            let tail: Vec<char> = id.chars().rev().take(8).collect();
            format!("…{}", tail.into_iter().rev().collect::<String>())
        }
    }
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

fn operation_json(o: &OperationRow) -> Value {
    json!({
        "request_id": o.request_id,
        "name": o.name,
        "machine": o.machine,
        "key": o.entity_key,
        "started_at": o.started_at,
        "ended_at": o.ended_at,
        "first_response_at": o.first_response_at,
        "outcome": o.outcome,
        "error": o.error,
        "restart_count": o.restart_count,
        "dimensions": o.dimensions,
    })
}

fn history_json(h: &HistoryRow) -> Value {
    json!({
        "from": h.from.as_deref(),
        "to": h.to.as_deref(),
        "kind": h.kind.as_str(),
        "action": h.action.as_deref(),
        "event": h.event.as_deref(),
        "retry": h.retry,
        "request_id": h.request_id,
        "at": h.at,
        "detail": h.detail,
    })
}

/// Formats epoch milliseconds as UTC `YYYY-MM-DD HH:MM:SS.mmm`.
pub fn fmt_time(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}.{:03}", rem / 3600, rem % 3600 / 60, rem % 60, ms.rem_euclid(1000))
}

pub async fn list(
    db: &str,
    machine: Option<String>,
    state: Option<String>,
    run_status: Option<String>,
    as_json: bool,
) -> anyhow::Result<ExitCode> {
    let store = open(db)?;
    let mut after = None;
    let mut first = true;
    loop {
        let page = store
            .entity_list(EntityFilter {
                machine: machine.clone(),
                state: state.clone(),
                after_id: after,
                limit: Some(1000),
                run_status: run_status.clone(),
            })
            .await?;
        for e in &page {
            if as_json {
                println!("{}", entity_json(e));
            } else {
                if first {
                    println!(
                        "{:<12} {:<24} {:<20} {:<10} {:>7}  properties",
                        "MACHINE", "KEY", "STATE", "RUN", "VERSION"
                    );
                    first = false;
                }
                println!(
                    "{:<12} {:<24} {:<20} {:<10} {:>7}  {}",
                    e.machine.as_str(),
                    e.key.as_str(),
                    e.state.as_str(),
                    e.run_status.as_str(),
                    e.version,
                    Value::Object(e.properties.clone())
                );
            }
        }
        match page.last() {
            Some(last) if page.len() == 1000 => after = Some(last.id),
            _ => break,
        }
    }
    if first && !as_json {
        eprintln!("no entities");
    }
    Ok(ExitCode::SUCCESS)
}

async fn find(store: &AnyStore, machine: &str, key: &str) -> anyhow::Result<EntityRow> {
    store.entity_get(machine, key).await?.ok_or_else(|| anyhow::anyhow!("no entity `{key}` of machine `{machine}`"))
}

pub async fn get(db: &str, machine: &str, key: &str, as_json: bool) -> anyhow::Result<ExitCode> {
    let store = open(db)?;
    let e = find(&store, machine, key).await?;
    let inbox = store.inbox_list(e.id).await?;
    if as_json {
        let mut v = entity_json(&e);
        v["inbox"] = inbox.iter().map(|i| json!({"event": i.event.as_str(), "params": i.params})).collect();
        v["recent_errors"] = json!(e.recent_errors.len());
        println!("{v}");
    } else {
        println!("machine:    {}", e.machine);
        println!("key:        {}", e.key);
        println!("state:      {} (entered {}, retry {})", e.state, fmt_time(e.entered_at), e.retry);
        println!("version:    {}", e.version);
        let until = e.sleep_until.map(|t| format!(" until {}", fmt_time(t))).unwrap_or_default();
        println!("run status: {}{until}", e.run_status.as_str());
        println!("errors:     {} recent (counted by the fault policy)", e.recent_errors.len());
        println!("properties: {}", Value::Object(e.properties.clone()));
        match e.due_at {
            Some(due) => println!("due:        {}", fmt_time(due)),
            None => println!("due:        nothing pending"),
        }
        if let Some(owner) = &e.lease_owner {
            println!("lease:      {owner} until {}", e.lease_until.map(fmt_time).unwrap_or_default());
        }
        println!(
            "inbox:      {} event(s){}",
            inbox.len(),
            if inbox.is_empty() {
                String::new()
            } else {
                format!(": {}", inbox.iter().map(|i| i.event.as_str()).collect::<Vec<_>>().join(", "))
            }
        );
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn history(db: &str, machine: &str, key: &str, as_json: bool) -> anyhow::Result<ExitCode> {
    let store = open(db)?;
    let e = find(&store, machine, key).await?;
    let rows = store.history_list(e.id).await?;
    for h in &rows {
        if as_json {
            println!("{}", history_json(h));
        } else {
            let what = match (h.event.as_deref(), h.action.as_deref()) {
                (Some(ev), Some(a)) => format!("event {ev} → {a}"),
                (Some(ev), None) => format!("event {ev}"),
                (None, Some(a)) => format!("auto {a}"),
                (None, None) => String::new(),
            };
            let retry = if h.retry > 0 { format!(" (retry {})", h.retry) } else { String::new() };
            let detail = h.detail.as_deref().map(|d| format!(": {d}")).unwrap_or_default();
            println!(
                "{}  {:<9}  {:<8} {:>14} → {:<14} {what}{retry}{detail}",
                fmt_time(h.at),
                short_id(h.request_id.as_deref()),
                h.kind.as_str(),
                h.from.as_deref().unwrap_or("-"),
                h.to.as_deref().unwrap_or("-"),
            );
        }
    }
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
    for (i, o) in rows.iter().enumerate() {
        if as_json {
            println!("{}", operation_json(o));
            continue;
        }
        if i == 0 {
            println!(
                "{:<36}  {:<24} {:<32} {:<23} {:>9}  {:<8} error",
                "REQUEST ID", "NAME", "ENTITY", "STARTED", "MS", "OUTCOME"
            );
        }
        let entity = match (&o.machine, &o.entity_key) {
            (Some(m), Some(k)) => format!("{m} {k}"),
            _ => "-".to_string(),
        };
        println!(
            "{:<36}  {:<24} {:<32} {:<23} {:>9}  {:<8} {}",
            o.request_id,
            o.name,
            entity,
            fmt_time(o.started_at),
            o.ended_at.map(|t| (t - o.started_at).to_string()).unwrap_or_else(|| "-".into()),
            o.outcome.as_deref().unwrap_or("open"),
            o.error.as_deref().unwrap_or(""),
        );
    }
    if rows.is_empty() && !as_json {
        eprintln!("no operations");
    }
    Ok(ExitCode::SUCCESS)
}

/// `settle machines`: stored definition versions, the newest per machine marked current.
pub async fn machines(db: &str, as_json: bool) -> anyhow::Result<ExitCode> {
    let store = open(db)?;
    let versions = store.machine_versions().await?;
    // Listed by name, then creation time: the last of each name is its current version.
    for (i, (m, entities)) in versions.iter().enumerate() {
        let current = versions.get(i + 1).is_none_or(|(next, _)| next.name != m.name);
        if as_json {
            let v = json!({
                "machine": m.name.as_str(),
                "hash": m.hash,
                "created_at": m.created_at,
                "entities": entities,
                "current": current,
            });
            println!("{v}");
            continue;
        }
        if i == 0 {
            println!("{:<20} {:<14} {:<23} {:>9}  current", "MACHINE", "VERSION", "STORED", "ENTITIES");
        }
        println!(
            "{:<20} {:<14} {:<23} {:>9}  {}",
            m.name.as_str(),
            m.hash.chars().take(12).collect::<String>(),
            fmt_time(m.created_at),
            entities,
            if current { "*" } else { "" }
        );
    }
    if versions.is_empty() && !as_json {
        eprintln!("no machines stored");
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    #[test]
    fn formats_utc_times() {
        assert_eq!(super::fmt_time(0), "1970-01-01 00:00:00.000");
        assert_eq!(super::fmt_time(1_795_000_000_123), "2026-11-18 11:06:40.123");
    }
}
