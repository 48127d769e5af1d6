//! `settle stats`: key figures read back from the telemetry tables, as tables, one JSON
//! object, or the Prometheus text exposition format. Read-only, like `inspect`.

use std::fmt::Write as _;
use std::process::ExitCode;

use serde_json::{Value, json};
use settle_store::{Stats, Store};

use crate::inspect::fmt_time;

/// How `settle stats` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Table,
    Json,
    Prometheus,
}

pub async fn stats(db: &str, since: Option<&str>, format: Format) -> anyhow::Result<ExitCode> {
    let store = crate::inspect::open(db)?;
    let now = settle_store::clock::now_ms();
    if format == Format::Prometheus {
        if since.is_some() {
            anyhow::bail!("--since does not apply to --prometheus (counters are totals)");
        }
        let machines = crate::defs::stored_machines(&store).await?;
        let machines: Vec<&settle_core::Machine> = machines.iter().collect();
        print!("{}", settle_server::metrics::store_text(&store.metrics_snapshot(now).await?, &machines));
        return Ok(ExitCode::SUCCESS);
    }
    let since = match since {
        Some(d) => {
            let d = settle_core::duration::parse(d).map_err(|e| anyhow::anyhow!("--since: {e}"))?;
            Some(now.saturating_sub(i64::try_from(d.as_millis()).unwrap_or(i64::MAX)))
        }
        None => None,
    };
    let stats = store.stats(since).await?;
    match format {
        Format::Json => println!("{}", stats_json(&stats, since)),
        _ => print!("{}", tables(&stats, since)),
    }
    Ok(ExitCode::SUCCESS)
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

fn stats_json(s: &Stats, since: Option<i64>) -> Value {
    json!({
        "since": since,
        "operations": s.operations.iter().map(|o| json!({
            "name": o.name,
            "count": o.count,
            "ended": o.ended,
            "success": o.success,
            "success_rate": round3(o.success_rate),
            "p50_ms": o.p50_ms,
            "p99_ms": o.p99_ms,
        })).collect::<Vec<_>>(),
        "transitions": s.transitions.iter().map(|t| json!({
            "machine": t.machine,
            "from": t.from,
            "to": t.to,
            "count": t.count,
            "error_rate": round3(t.error_rate),
            "mean_retries": round3(t.mean_retries),
        })).collect::<Vec<_>>(),
        "top_errors": s.top_errors.iter().map(|e| json!({
            "kind": e.kind,
            "details": e.details,
            "count": e.count,
        })).collect::<Vec<_>>(),
    })
}

fn percent(x: f64) -> String {
    format!("{:.1}%", x * 100.0)
}

fn tables(s: &Stats, since: Option<i64>) -> String {
    let mut out = String::new();
    let scope = since.map(|t| format!(" since {}", fmt_time(t))).unwrap_or_default();
    let _ = writeln!(out, "operations{scope}:");
    if s.operations.is_empty() {
        let _ = writeln!(out, "  none");
    } else {
        let _ = writeln!(
            out,
            "  {:<28} {:>8} {:>8} {:>8} {:>8} {:>9} {:>9}",
            "NAME", "COUNT", "ENDED", "SUCCESS", "RATE", "P50 MS", "P99 MS"
        );
        for o in &s.operations {
            let _ = writeln!(
                out,
                "  {:<28} {:>8} {:>8} {:>8} {:>8} {:>9} {:>9}",
                o.name,
                o.count,
                o.ended,
                o.success,
                percent(o.success_rate),
                o.p50_ms,
                o.p99_ms
            );
        }
    }
    let _ = writeln!(out, "\ntransitions{scope}:");
    if s.transitions.is_empty() {
        let _ = writeln!(out, "  none");
    } else {
        let _ = writeln!(
            out,
            "  {:<14} {:>20} → {:<20} {:>8} {:>8} {:>8}",
            "MACHINE", "FROM", "TO", "COUNT", "ERRORS", "RETRIES"
        );
        for t in &s.transitions {
            let _ = writeln!(
                out,
                "  {:<14} {:>20} → {:<20} {:>8} {:>8} {:>8.2}",
                t.machine,
                t.from.as_deref().unwrap_or("(created)"),
                t.to,
                t.count,
                percent(t.error_rate),
                t.mean_retries
            );
        }
    }
    let _ = writeln!(out, "\ntop errors{scope}:");
    if s.top_errors.is_empty() {
        let _ = writeln!(out, "  none");
    } else {
        let _ = writeln!(out, "  {:>8}  {:<14} details", "COUNT", "KIND");
        for e in &s.top_errors {
            let _ = writeln!(out, "  {:>8}  {:<14} {}", e.count, e.kind, e.details.replace('\n', " "));
        }
    }
    out
}
