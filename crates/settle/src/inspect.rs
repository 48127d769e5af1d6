//! Read-only views of a database file: `list`, `get`, `history`. They open the file
//! read-only and never take the engine lock, so they work beside a running engine.

use std::path::Path;
use std::process::ExitCode;

use serde_json::{Value, json};
use settle_store::{EntityFilter, EntityRow, HistoryRow, SqliteStore, Store};

fn open(db: &Path) -> anyhow::Result<SqliteStore> {
    Ok(SqliteStore::open_read_only(db)?)
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
    db: &Path,
    machine: Option<String>,
    state: Option<String>,
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
            })
            .await?;
        for e in &page {
            if as_json {
                println!("{}", entity_json(e));
            } else {
                if first {
                    println!("{:<12} {:<24} {:<16} {:>7}  properties", "MACHINE", "KEY", "STATE", "VERSION");
                    first = false;
                }
                println!(
                    "{:<12} {:<24} {:<16} {:>7}  {}",
                    e.machine.as_str(),
                    e.key.as_str(),
                    e.state.as_str(),
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

async fn find(store: &SqliteStore, machine: &str, key: &str) -> anyhow::Result<EntityRow> {
    store.entity_get(machine, key).await?.ok_or_else(|| anyhow::anyhow!("no entity `{key}` of machine `{machine}`"))
}

pub async fn get(db: &Path, machine: &str, key: &str, as_json: bool) -> anyhow::Result<ExitCode> {
    let store = open(db)?;
    let e = find(&store, machine, key).await?;
    let inbox = store.inbox_list(e.id).await?;
    if as_json {
        let mut v = entity_json(&e);
        v["inbox"] = inbox.iter().map(|i| json!({"event": i.event.as_str(), "params": i.params})).collect();
        println!("{v}");
    } else {
        println!("machine:    {}", e.machine);
        println!("key:        {}", e.key);
        println!("state:      {} (entered {}, retry {})", e.state, fmt_time(e.entered_at), e.retry);
        println!("version:    {}", e.version);
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

pub async fn history(db: &Path, machine: &str, key: &str, as_json: bool) -> anyhow::Result<ExitCode> {
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
                "{}  {:<8} {:>14} → {:<14} {what}{retry}{detail}",
                fmt_time(h.at),
                h.kind.as_str(),
                h.from.as_deref().unwrap_or("-"),
                h.to.as_deref().unwrap_or("-"),
            );
        }
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
