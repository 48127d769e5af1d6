//! The Prometheus text exposition of the store-wide figures (`settle_*`), read from the
//! database in one snapshot: what `GET /metrics` serves beside the engine's live
//! `settle_engine_*` metrics, and what `settle stats --prometheus` prints; and the
//! server's own counters of the requests it refused before their handler ([`Refusals`]).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use settle_core::Machine;
use settle_store::{MetricsSnapshot, RunStatus};

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

/// The path of `state` in `machine`: its ancestors and itself, outermost first, joined by
/// `/` (`active/running`); the state alone for a flat machine or an unknown one.
/// `error` when `state` of `machine` (a served one) is declared `health = "error"` (or
/// lies inside one that is), else `ok`.
pub(crate) fn state_health(machines: &[&Machine], machine: &str, state: &str) -> &'static str {
    match machines.iter().find(|m| m.name() == machine) {
        Some(m) if m.state(state).is_some() => m.health_of(state).as_str(),
        _ => "ok",
    }
}

pub(crate) fn state_path(machines: &[&Machine], machine: &str, state: &str) -> String {
    match machines.iter().find(|m| m.name() == machine) {
        Some(m) if m.is_nested() && m.state(state).is_some() => {
            let mut path: Vec<&str> = m.path(state).map(|s| s.name.as_str()).collect();
            path.reverse();
            path.join("/")
        }
        _ => state.to_string(),
    }
}

/// The schedules' progress as stored (the same on every instance): the next fire, counts
/// of fires fired, missed and skipped, and whether each is paused.
pub fn schedules_text(views: &[settle_engine::ScheduleView]) -> String {
    let mut out = String::new();
    if views.is_empty() {
        return out;
    }
    let rows: Vec<(String, &settle_store::ScheduleRow)> = views
        .iter()
        .filter_map(|v| {
            let labels = format!("machine=\"{}\",schedule=\"{}\"", label(&v.machine), label(&v.name));
            v.row.as_ref().map(|r| (labels, r))
        })
        .collect();
    header(
        &mut out,
        "settle_schedule_next_fire_timestamp_seconds",
        "gauge",
        "When each schedule next fires (Unix time).",
    );
    for (l, r) in &rows {
        if r.next_at != i64::MAX {
            let _ = writeln!(out, "settle_schedule_next_fire_timestamp_seconds{{{l}}} {}", r.next_at as f64 / 1000.0);
        }
    }
    type Count = fn(&settle_store::ScheduleRow) -> u64;
    let counts: [(&str, &str, Count); 3] = [
        ("settle_schedule_fires_total", "Fires fired.", |r| r.fired),
        ("settle_schedule_missed_total", "Fires missed while no engine ran, beyond the catch-up policy.", |r| r.missed),
        ("settle_schedule_skipped_total", "Fires not fired because the previous one still ran.", |r| r.skipped),
    ];
    for (name, help, count) in counts {
        header(&mut out, name, "counter", help);
        for (l, r) in &rows {
            let _ = writeln!(out, "{name}{{{l}}} {}", count(r));
        }
    }
    header(&mut out, "settle_schedule_paused", "gauge", "1 while an operator has paused the schedule.");
    for (l, r) in &rows {
        let _ = writeln!(out, "settle_schedule_paused{{{l}}} {}", u8::from(r.paused));
    }
    out
}

/// The concurrency limits now, per limit (their key values summed): slots in use and
/// entities waiting in line. Nothing when no limit has either.
pub fn limits_text(usage: &[settle_store::LimitUsage]) -> String {
    let mut out = String::new();
    if usage.is_empty() {
        return out;
    }
    let mut per: std::collections::BTreeMap<&str, (u64, u64)> = std::collections::BTreeMap::new();
    for u in usage {
        let t = per.entry(u.limit.as_str()).or_default();
        t.0 += u.in_use;
        t.1 += u.waiting;
    }
    header(&mut out, "settle_limit_in_use", "gauge", "Slots of each concurrency limit held now (all key values).");
    for (limit, (in_use, _)) in &per {
        let _ = writeln!(out, "settle_limit_in_use{{limit=\"{}\"}} {in_use}", label(limit));
    }
    header(&mut out, "settle_limit_waiting", "gauge", "Entities waiting in line for a slot of each concurrency limit.");
    for (limit, (_, waiting)) in &per {
        let _ = writeln!(out, "settle_limit_waiting{{limit=\"{}\"}} {waiting}", label(limit));
    }
    out
}

/// The snapshot in the Prometheus text exposition format (version 0.0.4). `machines`
/// give each state's path (a label beside the leaf state).
pub fn store_text(m: &MetricsSnapshot, machines: &[&Machine]) -> String {
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
        "Errors recorded: action errors, panics, refused outcomes, failed commits (not failures: see settle_failing_entities).",
    );
    let _ = writeln!(out, "settle_faults_total {}", m.faults);
    header(
        &mut out,
        "settle_entities",
        "gauge",
        "Entities by machine, (leaf) state, the state's path (its parents and itself, outermost first) and run status.",
    );
    for e in &m.entities {
        let _ = writeln!(
            out,
            "settle_entities{{machine=\"{}\",state=\"{}\",path=\"{}\",run_status=\"{}\",health=\"{}\"}} {}",
            label(&e.machine),
            label(&e.state),
            label(&state_path(machines, &e.machine, &e.state)),
            e.run_status.as_str(),
            state_health(machines, &e.machine, &e.state),
            e.count
        );
    }
    header(
        &mut out,
        "settle_failing_entities",
        "gauge",
        "Entities in a state declared `health = \"error\"` (killed ones aside).",
    );
    let failing: u64 = m
        .entities
        .iter()
        .filter(|e| e.run_status != RunStatus::Killed && state_health(machines, &e.machine, &e.state) == "error")
        .map(|e| e.count)
        .sum();
    let _ = writeln!(out, "settle_failing_entities {failing}");
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
    header(
        &mut out,
        "settle_agent_tasks",
        "gauge",
        "Open agent tasks by queue and status: ready (waiting for an agent) or leased.",
    );
    for (queue, status, n) in &m.tasks {
        let _ = writeln!(out, "settle_agent_tasks{{queue=\"{}\",status=\"{}\"}} {n}", label(queue), label(status));
    }
    out
}

/// Why the server refused a request before its handler (`settle_http_refused_total`'s
/// `reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// A `Host` that does not name the server (DNS rebinding).
    Host,
    /// An `Origin` that is not the server's own nor allowed (a cross-site request).
    Origin,
    /// A request that can change something without JSON or a bearer token (a simple
    /// cross-site request without `Origin`).
    SimpleRequest,
    /// A bearer token that matches no configured token.
    UnknownToken,
    /// An address that failed authentication too often, refused before its token is looked at.
    AuthThrottled,
    /// A token over its request rate limit.
    RateLimited,
    /// A long poll beyond its queue's or its token's share.
    TooManyPolls,
    /// A browser's request from another site (`Sec-Fetch-Site`) to a server without tokens.
    CrossSite,
    /// A request with two `Host` headers, or whose target names another host.
    BadHost,
    /// A change-feed stream beyond its token's share or the server's bound.
    TooManyStreams,
}

impl Refusal {
    const ALL: [Refusal; 10] = [
        Refusal::Host,
        Refusal::Origin,
        Refusal::SimpleRequest,
        Refusal::UnknownToken,
        Refusal::AuthThrottled,
        Refusal::RateLimited,
        Refusal::TooManyPolls,
        Refusal::CrossSite,
        Refusal::BadHost,
        Refusal::TooManyStreams,
    ];

    /// The `reason` label.
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::Host => "host",
            Refusal::Origin => "origin",
            Refusal::SimpleRequest => "simple_request",
            Refusal::UnknownToken => "unknown_token",
            Refusal::AuthThrottled => "auth_throttled",
            Refusal::RateLimited => "rate_limited",
            Refusal::TooManyPolls => "too_many_polls",
            Refusal::CrossSite => "cross_site",
            Refusal::BadHost => "bad_host",
            Refusal::TooManyStreams => "too_many_streams",
        }
    }
}

/// Counters of the requests refused, by [`Refusal`], since the server started.
#[derive(Debug, Default)]
pub struct Refusals([AtomicU64; 10]);

impl Refusals {
    /// Counts one refusal.
    pub fn count(&self, r: Refusal) {
        self.0[r as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// How many requests were refused for `r`.
    pub fn get(&self, r: Refusal) -> u64 {
        self.0[r as usize].load(Ordering::Relaxed)
    }

    /// The counters in the Prometheus text format.
    pub fn text(&self) -> String {
        let mut out = String::new();
        header(
            &mut out,
            "settle_http_refused_total",
            "counter",
            "Requests refused before their handler, by reason: host (DNS rebinding), origin (cross-site), \
             simple_request (no JSON nor token), unknown_token, auth_throttled (too many failed authentications \
             from the address), rate_limited, too_many_polls, cross_site (a browser's request from another site to \
             a server without tokens), bad_host (two Host headers, or a target naming another host), \
             too_many_streams.",
        );
        for r in Refusal::ALL {
            let _ = writeln!(out, "settle_http_refused_total{{reason=\"{}\"}} {}", r.as_str(), self.get(r));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use settle_store::{EntityCount, MetricsSnapshot, RunStatus, TransitionCount};

    #[test]
    fn prometheus_text_escapes_labels_and_declares_types() {
        let m = MetricsSnapshot {
            tasks: vec![("dns".into(), "ready".into(), 3)],
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
        let text = super::store_text(&m, &[]);
        assert!(text.contains("settle_transitions_total{machine=\"m\",from=\"\",to=\"new\"} 2\n"), "{text}");
        assert!(text.contains(r#"settle_transitions_total{machine="m",from="a\"b\\c\nd",to="x"} 1"#), "{text}");
        assert!(text.contains(
            "settle_entities{machine=\"m\",state=\"new\",path=\"new\",run_status=\"paused\",health=\"ok\"} 2\n"
        ));
        assert!(text.contains("settle_failing_entities 0\n"));
        assert!(text.contains("settle_operations_total{outcome=\"success\"} 7\n"));
        assert!(text.contains("settle_operations_open 2\n"));
        assert!(text.contains("settle_agent_tasks{queue=\"dns\",status=\"ready\"} 3\n"), "{text}");
        for line in ["settle_events_rejected_total 3", "settle_faults_total 4", "settle_parked_entities 1"] {
            assert!(text.lines().any(|l| l == line), "{line}: {text}");
        }
        assert!(text.contains("# TYPE settle_due_backlog gauge\nsettle_due_backlog 5\n"));
        let usage = |key: &str, in_use, waiting| settle_store::LimitUsage {
            limit: "calls".into(),
            key: key.into(),
            in_use,
            max: Some(3),
            waiting,
            spacing_us: None,
            next_start_at: None,
        };
        let limits = super::limits_text(&[usage("eu", 3, 7), usage("us", 1, 0)]);
        assert!(limits.contains("settle_limit_in_use{limit=\"calls\"} 4\n"), "{limits}");
        assert!(limits.contains("settle_limit_waiting{limit=\"calls\"} 7\n"), "{limits}");
        assert_eq!(super::limits_text(&[]), "");
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

    #[test]
    fn refusals_are_counted_by_reason() {
        let r = super::Refusals::default();
        r.count(super::Refusal::Origin);
        r.count(super::Refusal::Origin);
        r.count(super::Refusal::TooManyPolls);
        let text = r.text();
        assert!(text.contains("# TYPE settle_http_refused_total counter\n"), "{text}");
        assert!(text.contains("settle_http_refused_total{reason=\"origin\"} 2\n"), "{text}");
        assert!(text.contains("settle_http_refused_total{reason=\"too_many_polls\"} 1\n"), "{text}");
        assert!(text.contains("settle_http_refused_total{reason=\"host\"} 0\n"), "{text}");
    }
}
