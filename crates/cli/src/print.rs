//! What `get`, `list`, `history`, `ops`, `op`, `related`, the operator commands, `create`,
//! `raise` and `check` print,
//! text and `--json`, from the API's shapes (settle-client's [`Entity`], [`HistoryEntry`],
//! [`Operation`], from settle-api). The local commands convert store rows to these shapes
//! (settle-api's `From` conversions, the server's own) and the `--server` commands receive
//! them, so both print through the same code and the same bytes.

use serde_json::{Value, json};
use settle_client::{Entity, HistoryEntry, Operation};
use settle_store::{EntityRow, InboxItem};

/// What `get` prints beyond the entity's list fields: from the database locally, from the
/// API's single-entity read over `--server`.
pub struct Detail {
    /// When the lease ends.
    pub lease_until: Option<i64>,
    /// Errors the fault policy counts now.
    pub recent_errors: usize,
    /// Queued events: name and parameters.
    pub inbox: Vec<(String, Value)>,
}

impl Detail {
    /// The detail of an entity row and its inbox.
    pub fn of(e: &EntityRow, inbox: &[InboxItem]) -> Detail {
        Detail {
            lease_until: e.lease_until,
            recent_errors: e.recent_errors.len(),
            inbox: inbox.iter().map(|i| (i.event.to_string(), i.params.clone())).collect(),
        }
    }
}

/// Writes one line to standard error in a single write: the lines of processes that share
/// it (the demo, its server and its agents) never interleave within a line.
pub fn stderr_line(line: std::fmt::Arguments<'_>) {
    use std::io::Write as _;
    let mut text = line.to_string();
    text.push('\n');
    let _ = std::io::stderr().lock().write_all(text.as_bytes());
}

/// The entity's JSON line (`list --json`, `get --json`).
pub fn entity_json(e: &Entity) -> Value {
    let mut v = json!({
        "machine": e.machine,
        "key": e.key,
        "state": e.state,
        "version": e.version,
        "retry": e.retry,
        "properties": e.properties,
        "created_at": e.created_at,
        "entered_at": e.entered_at,
        "due_at": e.due_at,
        "lease_owner": e.lease_owner,
        "run_status": e.run_status,
        "sleep_until": e.sleep_until,
        "machine_version": e.machine_version,
    });
    // Only the server knows them (its GET): shown when there are any.
    if let Some(fires) = e.next_fires.as_ref().filter(|f| !f.is_empty()) {
        v["next_fires"] = serde_json::to_value(fires).unwrap_or_default();
    }
    if let Some(limits) = e.limits.as_ref().filter(|l| !l.is_empty()) {
        v["limits"] = serde_json::to_value(limits).unwrap_or_default();
    }
    v
}

fn history_json(h: &HistoryEntry) -> Value {
    json!({
        "from": h.from,
        "to": h.to,
        "kind": h.kind,
        "action": h.action,
        "event": h.event,
        "retry": h.retry,
        "request_id": h.request_id,
        "at": h.at,
        "detail": h.detail,
    })
}

fn operation_json(o: &Operation) -> Value {
    json!({
        "request_id": o.request_id,
        "name": o.name,
        "machine": o.machine,
        "key": o.key,
        "started_at": o.started_at,
        "ended_at": o.ended_at,
        "first_response_at": o.first_response_at,
        "outcome": o.outcome,
        "error": o.error,
        "restart_count": o.restart_count,
        "dimensions": o.dimensions,
    })
}

/// Formats epoch milliseconds as UTC `YYYY-MM-DD HH:MM:SS.mmm`.
pub fn fmt_time(ms: i64) -> String {
    settle_core::time::format_time(ms).replacen('T', " ", 1).trim_end_matches('Z').to_string()
}

/// A request id short enough for a table: whole up to 12 characters, else its end (the
/// random part of a generated UUIDv7; its start is a timestamp shared by close requests).
pub fn short_id(id: Option<&str>) -> String {
    match id {
        None => "-".to_string(),
        Some(id) if id.chars().count() <= 12 => id.to_string(),
        Some(id) => {
            let tail: Vec<char> = id.chars().rev().take(8).collect();
            format!("…{}", tail.into_iter().rev().collect::<String>())
        }
    }
}

/// `settle list`, a page at a time: the header before the first text row (`header` says
/// whether it is still due, and is cleared once printed).
pub fn entity_rows(page: &[Entity], as_json: bool, header: &mut bool) {
    for e in page {
        if as_json {
            println!("{}", entity_json(e));
            continue;
        }
        if *header {
            println!("{:<12} {:<24} {:<20} {:<10} {:>7}  properties", "MACHINE", "KEY", "STATE", "RUN", "VERSION");
            *header = false;
        }
        println!(
            "{:<12} {:<24} {:<20} {:<10} {:>7}  {}",
            e.machine,
            e.key,
            e.state,
            e.run_status,
            e.version,
            Value::Object(e.properties.clone())
        );
    }
}

/// `settle list`'s note on stderr when nothing matched.
pub fn no_entities(header_due: bool, as_json: bool) {
    if header_due && !as_json {
        eprintln!("no entities");
    }
}

/// `settle get`: one entity; `detail` when the database was read.
pub fn entity(e: &Entity, detail: Option<&Detail>, as_json: bool) {
    if as_json {
        let mut v = entity_json(e);
        if let Some(d) = detail {
            v["inbox"] = d.inbox.iter().map(|(event, params)| json!({"event": event, "params": params})).collect();
            v["recent_errors"] = json!(d.recent_errors);
        }
        println!("{v}");
        return;
    }
    println!("machine:    {}", e.machine);
    println!("key:        {}", e.key);
    println!("state:      {} (entered {}, retry {})", e.state, fmt_time(e.entered_at), e.retry);
    println!("version:    {}", e.version);
    if let Some(v) = &e.machine_version {
        println!("definition: {} (the machine's version it runs under)", v.chars().take(12).collect::<String>());
    }
    let until = e.sleep_until.map(|t| format!(" until {}", fmt_time(t))).unwrap_or_default();
    println!("run status: {}{until}", e.run_status);
    if let Some(d) = detail {
        println!("errors:     {} recent (counted by the fault policy)", d.recent_errors);
    }
    println!("properties: {}", Value::Object(e.properties.clone()));
    match e.due_at {
        Some(due) => println!("due:        {}", fmt_time(due)),
        None => println!("due:        nothing pending"),
    }
    for l in e.limits.iter().flatten() {
        println!("limit:      {}", l.says);
    }
    for f in e.next_fires.iter().flatten() {
        let when = match (f.paused, f.at) {
            (true, _) => "paused".to_string(),
            (false, Some(t)) => format!("next {}", fmt_time(t)),
            (false, None) => "no fire to come".to_string(),
        };
        println!("schedule:   {} {when} ({})", f.schedule, f.does);
    }
    if let Some(owner) = &e.lease_owner {
        match detail {
            Some(d) => println!("lease:      {owner} until {}", d.lease_until.map(fmt_time).unwrap_or_default()),
            None => println!("lease:      {owner}"),
        }
    }
    if let Some(d) = detail {
        println!(
            "inbox:      {} event(s){}",
            d.inbox.len(),
            if d.inbox.is_empty() {
                String::new()
            } else {
                format!(": {}", d.inbox.iter().map(|(event, _)| event.as_str()).collect::<Vec<_>>().join(", "))
            }
        );
    }
}

/// What a history row did, as its table shows it: the event and action, the retry, the
/// detail.
fn history_what(h: &HistoryEntry) -> String {
    let what = match (h.event.as_deref(), h.action.as_deref()) {
        (Some(ev), Some(a)) => format!("event {ev} → {a}"),
        (Some(ev), None) => format!("event {ev}"),
        (None, Some(a)) => format!("auto {a}"),
        (None, None) => String::new(),
    };
    let retry = if h.retry > 0 { format!(" (retry {})", h.retry) } else { String::new() };
    let detail = h.detail.as_deref().map(|d| format!(": {d}")).unwrap_or_default();
    format!("{what}{retry}{detail}")
}

/// `settle history`: transition rows, oldest first.
pub fn history(rows: &[HistoryEntry], as_json: bool) {
    for h in rows {
        if as_json {
            println!("{}", history_json(h));
            continue;
        }
        println!(
            "{}  {:<9}  {:<8} {:>14} → {:<14} {}",
            fmt_time(h.at),
            short_id(h.request_id.as_deref()),
            h.kind,
            h.from.as_deref().unwrap_or("-"),
            h.to.as_deref().unwrap_or("-"),
            history_what(h),
        );
    }
}

/// `settle ops`: operations, newest first.
pub fn operations(rows: &[Operation], as_json: bool) {
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
        let entity = match (&o.machine, &o.key) {
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
}

/// `settle op`: one operation, the entities it touched and the transitions it caused.
/// JSON: one object, `operation` (as a `settle ops --json` line), `entities` (as `settle
/// list --json` lines, by id), `transitions` (as `settle history --json` lines with the
/// entity's `machine` and `key`, by entity then time, as the API lists them), `truncated`
/// (more than 1000 entities were touched; the first 1000 are listed). The text lists the
/// transitions in the order they were committed.
pub fn operation_trace(t: &settle_api::OperationTrace, as_json: bool) {
    if as_json {
        let transitions: Vec<Value> = t
            .transitions
            .iter()
            .map(|tr| {
                let mut v = json!({"machine": tr.machine, "key": tr.key});
                if let (Some(all), Value::Object(fields)) = (v.as_object_mut(), history_json(&tr.entry)) {
                    all.extend(fields);
                }
                v
            })
            .collect();
        let v = json!({
            "operation": operation_json(&t.operation),
            "entities": t.entities.iter().map(entity_json).collect::<Vec<_>>(),
            "transitions": transitions,
            "truncated": t.truncated,
        });
        println!("{v}");
        return;
    }
    let o = &t.operation;
    let entity = match (&o.machine, &o.key) {
        (Some(m), Some(k)) => format!(" on {m} {k}"),
        _ => String::new(),
    };
    println!("operation {}: {}{entity}", o.request_id, o.name);
    match (o.outcome.as_deref(), o.ended_at) {
        (Some(outcome), Some(ended)) => println!(
            "outcome:   {outcome} after {} ms (started {}, ended {})",
            ended - o.started_at,
            fmt_time(o.started_at),
            fmt_time(ended)
        ),
        (outcome, _) => println!("outcome:   {} (started {})", outcome.unwrap_or("open"), fmt_time(o.started_at)),
    }
    if let Some(error) = &o.error {
        println!("error:     {error}");
    }
    if o.restart_count > 0 {
        println!("restarts:  {}", o.restart_count);
    }
    println!(
        "\nentities ({}{}):",
        t.entities.len(),
        if t.truncated { ", more were touched: the list stops there" } else { "" }
    );
    let mut header = true;
    entity_rows(&t.entities, false, &mut header);
    println!("\ntransitions ({}):", t.transitions.len());
    // In the order they were committed (the API lists them by entity, then time).
    let mut rows: Vec<&settle_api::TraceEntry> = t.transitions.iter().collect();
    rows.sort_by_key(|tr| tr.entry.at);
    let width = rows.iter().map(|tr| tr.machine.chars().count() + 1 + tr.key.chars().count()).max().unwrap_or(0);
    for tr in rows {
        let h = &tr.entry;
        let line = format!(
            "{}  {:<width$}  {:<8} {:>14} → {:<14} {}",
            fmt_time(h.at),
            format!("{} {}", tr.machine, tr.key),
            h.kind,
            h.from.as_deref().unwrap_or("-"),
            h.to.as_deref().unwrap_or("-"),
            history_what(h),
        );
        println!("{}", line.trim_end());
    }
}

/// `settle related`: the entity, its predecessors and successors, and its subscriptions'
/// progress. JSON: one object, `entity`, `predecessors` and `successors` (each as `settle
/// list --json` lines, by id) and `subscriptions` (`event`, `pattern`, `selected`,
/// `satisfying`, `holds`, `fired`, as the API's `related` route has them).
pub fn related(e: &Entity, r: &settle_api::Related, as_json: bool) {
    if as_json {
        let v = json!({
            "entity": entity_json(e),
            "predecessors": r.predecessors.iter().map(entity_json).collect::<Vec<_>>(),
            "successors": r.successors.iter().map(entity_json).collect::<Vec<_>>(),
            "subscriptions": r.subscriptions,
        });
        println!("{v}");
        return;
    }
    println!("{} {}: state {}, run status {}", e.machine, e.key, e.state, e.run_status);
    for (title, list) in [("predecessors", &r.predecessors), ("successors", &r.successors)] {
        if list.is_empty() {
            println!("\n{title}: none");
            continue;
        }
        println!("\n{title} ({}):", list.len());
        let mut header = true;
        entity_rows(list, false, &mut header);
    }
    if r.subscriptions.is_empty() {
        println!("\nsubscriptions in state {}: none", e.state);
        return;
    }
    println!("\nsubscriptions in state {}:", e.state);
    let width = r.subscriptions.iter().map(|p| p.event.chars().count()).max().unwrap_or(0);
    for p in &r.subscriptions {
        let status = match (p.fired, p.holds) {
            (true, _) => "fired",
            (false, true) => "holds",
            (false, false) => "waiting",
        };
        println!("  {:<width$}  {}: {} of {} selected satisfy; {status}", p.event, p.pattern, p.satisfying, p.selected);
    }
}

/// `settle why`: the chain of causes, one entity a block, indented by depth; `--json`: the
/// API's body. Exit 0 whether or not it is failing (the first line says).
pub fn why(w: &settle_api::Why, as_json: bool) {
    if as_json {
        println!("{}", serde_json::to_value(w).unwrap_or_default());
        return;
    }
    for (i, s) in w.chain.iter().enumerate() {
        let pad = "  ".repeat(s.depth as usize);
        let now = match (&s.state, &s.run_status) {
            (Some(state), Some(rs)) => format!("now {state}, {rs}{}", if s.failing { ", failing" } else { "" }),
            _ => "not stored any more".to_string(),
        };
        let lead = if i == 0 { "" } else { "caused by " };
        println!("{pad}{lead}{}/{}  ({now})", s.machine, s.key);
        match (&s.details, s.at) {
            (Some(d), Some(at)) => {
                let request = s.request_id.as_deref().map(|r| format!(", request {r}")).unwrap_or_default();
                println!("{pad}  {}: {d}  ({}{request})", s.kind.as_deref().unwrap_or("failure"), fmt_time(at));
            }
            _ if i == 0 && !w.failing => println!("{pad}  not failing: nothing to explain"),
            _ => println!("{pad}  no failure recorded"),
        }
        if i == 0 {
            for l in &w.limits {
                println!("{pad}  limit: {}", l.says);
            }
        }
    }
}

/// What an operator command or `create` did: the entity afterwards, under `request_id`.
pub struct Done<'a> {
    /// The entity afterwards (as it is now, for a replay).
    pub entity: &'a Entity,
    /// `pause`, `kill`, ..., `create`.
    pub command: &'a str,
    /// The operation's request id.
    pub request_id: &'a str,
    /// The request id had been used before: nothing was done again.
    pub replayed: bool,
}

/// The operator commands and `create`: one line on the entity, one on the request id.
pub fn done(d: &Done<'_>, as_json: bool) {
    let e = d.entity;
    if as_json {
        let fields =
            json!({"command": d.command, "state": e.state, "run_status": e.run_status, "sleep_until": e.sleep_until});
        println!("{}", request_json(&e.machine, &e.key, Some(d.request_id), d.replayed, fields));
        return;
    }
    let until = e.sleep_until.map(|t| format!(" until {}", fmt_time(t))).unwrap_or_default();
    println!("{} {}: {}; state {}, run status {}{until}", e.machine, e.key, d.command, e.state, e.run_status);
    request_line(d.request_id, d.replayed, "done");
}

/// The JSON line of a request on an entity (`create`, the operator commands, `raise`):
/// the entity's machine and key, the request id, whether it was a replay, and `fields`.
fn request_json(machine: &str, key: &str, request_id: Option<&str>, replayed: bool, fields: Value) -> Value {
    let mut v = json!({"machine": machine, "key": key, "request_id": request_id, "replayed": replayed});
    if let (Some(all), Value::Object(fields)) = (v.as_object_mut(), fields) {
        all.extend(fields);
    }
    v
}

/// The line naming a request's id; for a replay, that nothing was `done` again.
fn request_line(request_id: &str, replayed: bool, done: &str) {
    if replayed {
        println!("replayed: request id {request_id} was seen before; nothing was {done} again");
    } else {
        println!("request id {request_id}");
    }
}

/// What became of a raised event, as `settle raise` reports it.
pub enum Raised {
    /// Durably queued (no `--wait`).
    Queued {
        /// The request id had been used before: nothing was raised again.
        replayed: bool,
    },
    /// Processed (`--wait`): the entity at rest again, or the operation ended; `outcome`
    /// is `None` for a replay.
    Done {
        /// What became of the event.
        outcome: Option<settle_client::Outcome>,
        /// The entity when the wait ended.
        entity: Option<Box<Entity>>,
        /// The operation, ended (`--wait=operation`).
        operation: Option<Box<Operation>>,
    },
    /// Not valid in the entity's state; nothing changed.
    Rejected {
        /// The entity's state.
        state: String,
        /// Why.
        reason: String,
    },
    /// The event's action failed; nothing changed.
    Failed {
        /// What went wrong.
        error: String,
    },
}

/// The request a raise is part of, and what became of it.
pub struct Raise<'a> {
    /// The entity's machine.
    pub machine: &'a str,
    /// The entity's key.
    pub key: &'a str,
    /// The event raised.
    pub event: &'a str,
    /// The request id (`None` when the event was refused before being recorded).
    pub request_id: Option<&'a str>,
    /// What became of it.
    pub raised: Raised,
}

impl Raise<'_> {
    /// Whether `settle raise` succeeds: not rejected, not failed, and an operation waited
    /// for ended `success`.
    pub fn ok(&self) -> bool {
        match &self.raised {
            Raised::Rejected { .. }
            | Raised::Failed { .. }
            | Raised::Done {
                outcome: Some(settle_client::Outcome::Rejected { .. } | settle_client::Outcome::Failed { .. }),
                ..
            } => false,
            Raised::Done { operation: Some(op), .. } => op.outcome.as_deref() == Some("success"),
            _ => true,
        }
    }
}

/// `settle raise`: the outcome (or where to follow it), the request id, and with `--wait`
/// the entity at rest.
pub fn raise(r: &Raise<'_>, as_json: bool) {
    let operation = r.request_id.map(settle_server::operation_location);
    let (outcome, entity, replayed) = match &r.raised {
        Raised::Queued { replayed } => (None, None, *replayed),
        Raised::Done { outcome, entity, .. } => (outcome.clone(), entity.as_deref(), outcome.is_none()),
        Raised::Rejected { state, reason } => {
            (Some(settle_client::Outcome::Rejected { state: state.clone(), reason: reason.clone() }), None, false)
        }
        Raised::Failed { error } => (Some(settle_client::Outcome::Failed { error: error.clone() }), None, false),
    };
    let ended = match &r.raised {
        Raised::Done { operation: Some(op), .. } => Some(op.as_ref()),
        _ => None,
    };
    if as_json {
        let mut fields =
            json!({"event": r.event, "operation": operation, "outcome": outcome, "entity": entity.map(entity_json)});
        if let Some(op) = ended {
            fields["operation_ended"] = operation_json(op);
        }
        println!("{}", request_json(r.machine, r.key, r.request_id, replayed, fields));
        return;
    }
    let (m, k, ev) = (r.machine, r.key, r.event);
    match &r.raised {
        Raised::Queued { .. } if !replayed => println!("{m} {k}: event {ev} queued"),
        Raised::Queued { .. } | Raised::Done { outcome: None, .. } => {}
        Raised::Done { outcome: Some(settle_client::Outcome::Accepted { state }), .. } => {
            println!("{m} {k}: event {ev} accepted; entered {state}")
        }
        Raised::Done { outcome: Some(settle_client::Outcome::Ignored { state }), .. } => {
            println!("{m} {k}: event {ev} ignored in state {state}")
        }
        // The server answers these as problems; shown here for completeness.
        Raised::Done { outcome: Some(settle_client::Outcome::Rejected { state, reason }), .. }
        | Raised::Rejected { state, reason } => println!("{m} {k}: event {ev} rejected in state {state}: {reason}"),
        Raised::Done { outcome: Some(settle_client::Outcome::Failed { error }), .. } | Raised::Failed { error } => {
            println!("{m} {k}: event {ev} failed: {error}")
        }
    }
    if let Some(id) = r.request_id {
        request_line(id, replayed, "raised");
    }
    if let (Raised::Queued { .. }, Some(op)) = (&r.raised, &operation) {
        println!("operation {op}");
    }
    if let Some(op) = ended {
        let took = op.ended_at.map(|end| format!(" after {} ms", end - op.started_at)).unwrap_or_default();
        let outcome = op.outcome.as_deref().unwrap_or("open");
        match &op.error {
            Some(error) => println!("operation ended {outcome}{took}: {error}"),
            None => println!("operation ended {outcome}{took}"),
        }
    }
    if let Some(e) = entity {
        self::entity(e, None, false);
    }
}

/// `settle check`: what the event would do; exit 1 when it would be refused.
pub fn check(machine: &str, key: &str, c: &settle_client::EventCheck, as_json: bool) -> std::process::ExitCode {
    use settle_client::Verdict;
    if as_json {
        println!("{}", serde_json::to_string(c).expect("serializable"));
    } else {
        let (ev, state) = (&c.event, &c.state);
        match &c.verdict {
            Verdict::Fires { action, internal: false } => {
                println!("{machine} {key}: event {ev} would run {action} (in state {state})")
            }
            Verdict::Fires { action, internal: true } => {
                println!("{machine} {key}: event {ev} would run {action} as an internal transition (in state {state})")
            }
            Verdict::Ignored { state: level } => {
                println!("{machine} {key}: event {ev} would be ignored in {level} (in state {state})")
            }
            Verdict::Refused { reason } => {
                println!("{machine} {key}: event {ev} would be rejected in state {state}: {reason}")
            }
        }
    }
    if matches!(c.verdict, Verdict::Refused { .. }) {
        std::process::ExitCode::FAILURE
    } else {
        std::process::ExitCode::SUCCESS
    }
}

/// `settle limits`: one line per limit and key value (`--json`: the API's items, one per
/// line).
pub fn limits(items: &[settle_client::LimitUsage], as_json: bool) {
    if as_json {
        for u in items {
            println!("{}", serde_json::to_string(u).unwrap_or_default());
        }
        return;
    }
    if items.is_empty() {
        println!("no limit has a slot in use or work waiting (a machine declares them as [limits.NAME])");
        return;
    }
    println!("{:<24} {:<24} {:>8} {:>8} {:>8}  RATE", "LIMIT", "KEY", "IN USE", "MAX", "WAITING");
    for u in items {
        let key = if u.key.is_empty() { "(all)" } else { u.key.as_str() };
        let max = u.max.map_or_else(|| "-".to_string(), |m| m.to_string());
        let rate =
            u.every_us.map_or_else(|| "-".to_string(), |us| format!("one start every {}", settle_api::spacing(us)));
        println!("{:<24} {:<24} {:>8} {:>8} {:>8}  {rate}", u.limit, key, u.in_use, max, u.waiting);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn formats_utc_times() {
        assert_eq!(super::fmt_time(0), "1970-01-01 00:00:00.000");
        assert_eq!(super::fmt_time(1_795_000_000_123), "2026-11-18 11:06:40.123");
    }
}
