//! `settle stats`: key figures read back from the telemetry tables, as tables, one JSON
//! object, or the Prometheus text exposition format. Read-only, like `inspect`.

use std::fmt::Write as _;
use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use settle_store::{MetricsSnapshot, Stats, Store};

use crate::inspect::fmt_time;

/// How `settle stats` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Table,
    Json,
    Prometheus,
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

pub async fn stats(db: &str, since: Option<&str>, format: Format) -> anyhow::Result<ExitCode> {
    let store = crate::inspect::open(db)?;
    let now = now_ms();
    if format == Format::Prometheus {
        if since.is_some() {
            anyhow::bail!("--since does not apply to --prometheus (counters are totals)");
        }
        print!("{}", prometheus(&store.metrics_snapshot(now).await?));
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

/// Escapes a label value of the Prometheus text format.
fn label(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// The snapshot in the Prometheus text exposition format (version 0.0.4).
fn prometheus(m: &MetricsSnapshot) -> String {
    let mut out = String::new();
    header(
        &mut out,
        "settle_transitions_total",
        "counter",
        "State entries committed, by machine, state left (empty on creation) and state entered.",
    );
    for t in &m.transitions {
        let _ = writeln!(
            out,
            "settle_transitions_total{{machine=\"{}\",from=\"{}\",to=\"{}\"}} {}",
            label(&t.machine),
            label(t.from.as_deref().unwrap_or("")),
            label(&t.to),
            t.count
        );
    }
    header(&mut out, "settle_events_rejected_total", "counter", "Events rejected in the entity's state.");
    let _ = writeln!(out, "settle_events_rejected_total {}", m.events_rejected);
    header(
        &mut out,
        "settle_faults_total",
        "counter",
        "Errors recorded: action errors, panics, refused outcomes, failed commits.",
    );
    let _ = writeln!(out, "settle_faults_total {}", m.faults);
    header(&mut out, "settle_entities", "gauge", "Entities by machine, state and run status.");
    for e in &m.entities {
        let _ = writeln!(
            out,
            "settle_entities{{machine=\"{}\",state=\"{}\",run_status=\"{}\"}} {}",
            label(&e.machine),
            label(&e.state),
            e.run_status.as_str(),
            e.count
        );
    }
    header(&mut out, "settle_parked_entities", "gauge", "Entities parked for an operator (run status failed).");
    let _ = writeln!(out, "settle_parked_entities {}", m.parked);
    header(&mut out, "settle_due_backlog", "gauge", "Entities whose due time has passed: work waiting to be claimed.");
    let _ = writeln!(out, "settle_due_backlog {}", m.due_backlog);
    header(
        &mut out,
        "settle_operations_total",
        "counter",
        "Operations by outcome (success, failed, canceled, hung); unfinished ones are in settle_operations_open.",
    );
    let mut open = 0;
    for (outcome, n) in &m.operations {
        if outcome == "open" {
            open = *n;
            continue;
        }
        let _ = writeln!(out, "settle_operations_total{{outcome=\"{}\"}} {n}", label(outcome));
    }
    header(&mut out, "settle_operations_open", "gauge", "Operations not finished and not marked hung.");
    let _ = writeln!(out, "settle_operations_open {open}");
    out
}

#[cfg(test)]
mod tests {
    use settle_store::{EntityCount, MetricsSnapshot, RunStatus, TransitionCount};

    #[test]
    fn prometheus_text_escapes_labels_and_declares_types() {
        let m = MetricsSnapshot {
            transitions: vec![
                TransitionCount { machine: "m".into(), from: None, to: "new".into(), count: 2 },
                TransitionCount { machine: "m".into(), from: Some("a\"b\\c\nd".into()), to: "x".into(), count: 1 },
            ],
            events_rejected: 3,
            faults: 4,
            parked: 1,
            entities: vec![EntityCount {
                machine: "m".into(),
                state: "new".into(),
                run_status: RunStatus::Paused,
                count: 2,
            }],
            due_backlog: 5,
            operations: vec![("open".into(), 2), ("success".into(), 7)],
        };
        let text = super::prometheus(&m);
        assert!(text.contains("settle_transitions_total{machine=\"m\",from=\"\",to=\"new\"} 2\n"), "{text}");
        assert!(text.contains(r#"settle_transitions_total{machine="m",from="a\"b\\c\nd",to="x"} 1"#), "{text}");
        assert!(text.contains("settle_entities{machine=\"m\",state=\"new\",run_status=\"paused\"} 2\n"));
        assert!(text.contains("settle_operations_total{outcome=\"success\"} 7\n"));
        assert!(text.contains("settle_operations_open 2\n"));
        for line in ["settle_events_rejected_total 3", "settle_faults_total 4", "settle_parked_entities 1"] {
            assert!(text.lines().any(|l| l == line), "{line}: {text}");
        }
        assert!(text.contains("# TYPE settle_due_backlog gauge\nsettle_due_backlog 5\n"));
        // Every sample's metric has a HELP and a TYPE line before it.
        let mut declared = std::collections::HashSet::new();
        for l in text.lines() {
            if let Some(rest) = l.strip_prefix("# TYPE ") {
                declared.insert(rest.split(' ').next().unwrap().to_string());
            } else if !l.starts_with('#') {
                let name = l.split(['{', ' ']).next().unwrap();
                assert!(declared.contains(name), "{name} undeclared: {text}");
            }
        }
    }
}
