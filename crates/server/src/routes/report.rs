//! An agent's `complete` report as the action's outcome ([`ActionOutcome`]), the value a
//! Rust handler returns: its shape is checked here (which field, why); whether its
//! machines, events and targets exist and fit is the engine's check when it arrives.

use serde_json::Value;
use settle_core::step::{Create, InternalEvent, PropChange, Raise};
use settle_core::{ActionOutcome, Broadcast, EntityKey, EventName, MachineName, Properties, Related, StateName};

use super::check_key;
use crate::model::{CompleteRequest, ReportCreate, ReportRaise};
use crate::problem::{Kind, Problem};

/// The outcome a `complete` report asks for, or the field whose shape is wrong.
///
/// A created entity's first event is one of the outcome's raises, before those of `raise`:
/// [`Report::field`] names the part of the request a raise came from.
pub(crate) fn outcome(req: CompleteRequest) -> Result<Report, Problem> {
    shape(&req)?;
    let (mut origins, mut related, mut internal) = (Vec::new(), Vec::new(), Vec::new());
    let mut out = ActionOutcome {
        target: req.target.map(StateName::new),
        delay: req.delay_ms.map(std::time::Duration::from_millis),
        error: req.error,
        ..ActionOutcome::default()
    };
    for (k, v) in members(req.properties) {
        out.changes.push(PropChange::from_json(k, v));
    }
    for (i, c) in req.create.into_iter().enumerate() {
        let ReportCreate { machine, key, properties, event, params, reply } = c;
        let at = format!("create[{i}]");
        let properties = members(properties);
        let (machine, key) = (MachineName::new(machine), EntityKey::new(key));
        if let Some(event) = event {
            let params = params_of(params);
            let first = Raise {
                machine: machine.clone(),
                key: key.clone(),
                event: EventName::new(event),
                params,
                join: false,
                reply: reply.map(EventName::new),
            };
            out.raises.push(first);
            origins.push(format!("{at}.event"));
        } else if params.is_some() {
            return Err(bad(&format!("{at}.params"), "parameters without an `event` to carry them"));
        } else if reply.is_some() {
            return Err(bad(&format!("{at}.reply"), "a reply without an `event` to answer"));
        }
        out.creates.push(Create { machine, key, properties });
    }
    for (i, r) in req.raise.into_iter().enumerate() {
        let ReportRaise { event, params, machine, key, on, join, reply } = r;
        let at = format!("raise[{i}]");
        let params = params_of(params);
        let event = EventName::new(event);
        match (machine, key, on) {
            (Some(machine), Some(key), None) => {
                let join = join.unwrap_or(false);
                out.raises.push(Raise {
                    machine: MachineName::new(machine),
                    key: EntityKey::new(key),
                    event,
                    params,
                    join,
                    reply: reply.map(EventName::new),
                });
                origins.push(at);
            }
            (None, None, Some(on)) if on == settle_core::machine::SELF => {
                if join.is_some() {
                    return Err(bad(&format!("{at}.join"), "only an entity named by `machine` and `key` can join"));
                }
                if reply.is_some() {
                    return Err(bad(&format!("{at}.reply"), "only an entity named by `machine` and `key` replies"));
                }
                out.internal.push(InternalEvent { event, params });
                internal.push(i);
            }
            (None, None, Some(on)) => {
                let on = Related::parse(&on).ok_or_else(|| {
                    bad(&format!("{at}.on"), &format!("`predecessors`, `successors` or `self`, not `{on}`"))
                })?;
                if join.is_some() {
                    return Err(bad(&format!("{at}.join"), "only an entity named by `machine` and `key` can join"));
                }
                if reply.is_some() {
                    return Err(bad(&format!("{at}.reply"), "only an entity named by `machine` and `key` replies"));
                }
                out.related.push(Broadcast { event, on, params });
                related.push(i);
            }
            _ => return Err(bad(&at, "name the entity by `machine` and `key`, or the related ones by `on`")),
        }
    }
    Ok(Report { outcome: out, origins, related, internal })
}

/// A report's outcome, and where in the request each of its raises came from.
pub(crate) struct Report {
    pub(crate) outcome: ActionOutcome,
    /// For each of the outcome's raises, the request's field: `create[j].event` or `raise[k]`.
    origins: Vec<String>,
    /// For each of the outcome's raises by relation, its index in the request's `raise`.
    related: Vec<usize>,
    /// For each of the outcome's events raised on the reporter itself, its index in the
    /// request's `raise`.
    internal: Vec<usize>,
}

/// `3].params` as `(3, ".params")`.
fn index_and_tail(rest: &str) -> Option<(usize, &str)> {
    let (i, tail) = rest.split_once(']')?;
    Some((i.parse().ok()?, tail))
}

impl Report {
    /// The request's field for a field of the outcome (`raise[i]`, `raise_on[i]`, with
    /// what follows them): a created entity's first event is one of the outcome's raises.
    pub(crate) fn field(&self, outcome_field: &str) -> String {
        if let Some((i, tail)) = outcome_field.strip_prefix("raise[").and_then(index_and_tail)
            && let Some(origin) = self.origins.get(i)
        {
            // A created entity's reply is its own field, beside its first event.
            if let (".reply", Some(create)) = (tail, origin.strip_suffix(".event")) {
                return format!("{create}.reply");
            }
            return format!("{origin}{tail}");
        }
        if let Some((i, tail)) = outcome_field.strip_prefix("raise_on[").and_then(index_and_tail)
            && let Some(k) = self.related.get(i)
        {
            return format!("raise[{k}]{tail}");
        }
        if let Some((i, tail)) = outcome_field.strip_prefix("raise_self[").and_then(index_and_tail)
            && let Some(k) = self.internal.get(i)
        {
            return format!("raise[{k}]{tail}");
        }
        outcome_field.to_string()
    }
}

fn bad(field: &str, why: &str) -> Problem {
    Problem::new(Kind::InvalidBody, format!("{field}: {why}")).field(field)
}

/// What the API document constrains in a `complete` body, beyond its types: `delay_ms` at
/// most a year, object members objects (or null), created keys fitting the key pattern.
/// [`outcome`] checks it first; a report of many checks it for the whole request before
/// any of its reports is applied.
pub(crate) fn shape(req: &CompleteRequest) -> Result<(), Problem> {
    if let Some(ms) = req.delay_ms.filter(|ms| !crate::contract::DELAY_MS.contains(*ms)) {
        let max = crate::contract::DELAY_MS.max;
        return Err(Problem::new(Kind::InvalidBody, format!("delay_ms must be from 0 to {max} (a year), not {ms}"))
            .field("delay_ms"));
    }
    let object = |field: &str, v: &Option<Value>| match v {
        None | Some(Value::Null | Value::Object(_)) => Ok(()),
        Some(_) => Err(bad(field, "must be a JSON object")),
    };
    // Property names starting with `$` (`$history`) are the engine's.
    let properties = |field: &str, v: &Option<Value>| {
        object(field, v)?;
        match v
            .as_ref()
            .and_then(Value::as_object)
            .and_then(|m| m.keys().find(|k| settle_core::machine::is_engine_property(k)))
        {
            Some(k) => Err(bad(field, &format!("`{k}`: a property starting with `$` is the engine's"))),
            None => Ok(()),
        }
    };
    properties("properties", &req.properties)?;
    for (i, c) in req.create.iter().enumerate() {
        let at = format!("create[{i}]");
        check_key(&c.key).map_err(|p| p.field(format!("{at}.key")))?;
        properties(&format!("{at}.properties"), &c.properties)?;
        object(&format!("{at}.params"), &c.params)?;
    }
    for (i, r) in req.raise.iter().enumerate() {
        object(&format!("raise[{i}].params"), &r.params)?;
    }
    Ok(())
}

/// An object member checked by [`shape`]: its members (none for null or absent).
fn members(v: Option<Value>) -> Properties {
    match v {
        Some(Value::Object(m)) => m,
        _ => Properties::new(),
    }
}

/// Event parameters checked by [`shape`]: the object, or null.
fn params_of(v: Option<Value>) -> Value {
    match v {
        Some(v @ Value::Object(_)) => v,
        _ => Value::Null,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn req(v: Value) -> CompleteRequest {
        serde_json::from_value(v).expect("a request")
    }

    #[test]
    fn a_whole_report_becomes_the_outcome_in_order() {
        let o = outcome(req(json!({
            "token": "t", "target": "waiting", "delay_ms": 250,
            "properties": {"ip": "10.0.0.7", "old": null},
            "create": [{"machine": "app", "key": "s1-app", "properties": {"n": 1}, "event": "go", "params": {"x": 2}},
                       {"machine": "dns", "key": "s1-dns"}],
            "raise": [{"machine": "db", "key": "s1-db", "event": "start", "join": true},
                      {"on": "predecessors", "event": "child_ready", "params": {"k": "v"}},
                      {"on": "self", "event": "recheck", "params": {"depth": 2}}]
        })))
        .expect("valid");
        // The engine's refusals name the outcome's parts; the agent reads the request's.
        let fields = [
            "raise[0]",
            "raise[1].params",
            "raise_on[0]",
            "create[1]",
            "raise[9]",
            "target",
            "raise[0].reply",
            "raise_self[0]",
        ]
        .map(|f| o.field(f));
        let want = [
            "create[0].event",
            "raise[0].params",
            "raise[1]",
            "create[1]",
            "raise[9]",
            "target",
            "create[0].reply",
            "raise[2]",
        ];
        assert_eq!(fields, want);
        let o = o.outcome;
        assert_eq!(o.target.as_deref(), Some("waiting"));
        assert_eq!(o.delay, Some(std::time::Duration::from_millis(250)));
        assert_eq!(o.changes, vec![PropChange::Set("ip".into(), json!("10.0.0.7")), PropChange::Remove("old".into())]);
        assert_eq!(o.creates.iter().map(|c| c.key.as_str()).collect::<Vec<_>>(), ["s1-app", "s1-dns"]);
        assert_eq!(o.creates[0].properties, json!({"n": 1}).as_object().cloned().unwrap());
        // The first event of a created entity, then the raises asked for.
        let raised: Vec<_> = o.raises.iter().map(|r| (r.key.as_str(), r.event.as_str(), r.join)).collect();
        assert_eq!(raised, [("s1-app", "go", false), ("s1-db", "start", true)]);
        assert_eq!(o.raises[0].params, json!({"x": 2}));
        assert_eq!(
            o.related,
            vec![Broadcast { event: "child_ready".into(), on: Related::Predecessors, params: json!({"k": "v"}) }]
        );
        assert_eq!(o.internal, vec![InternalEvent { event: "recheck".into(), params: json!({"depth": 2}) }]);
    }

    #[test]
    fn a_retry_names_no_target() {
        let o = outcome(req(json!({"token": "t", "delay_ms": 5000}))).expect("valid").outcome;
        assert_eq!((o.target, o.delay), (None, Some(std::time::Duration::from_secs(5))));
        // At most a year: a delay beyond would overflow the clock, not wait.
        let Err(p) = outcome(req(json!({"token": "t", "delay_ms": 31_536_000_001u64}))) else { panic!("accepted") };
        assert_eq!((p.kind(), p.body().field.as_deref()), (Kind::InvalidBody, Some("delay_ms")));
    }

    #[test]
    fn a_field_of_the_wrong_shape_is_named() {
        let cases = [
            (json!({"token": "t", "properties": [1]}), "properties"),
            (json!({"token": "t", "create": [{"machine": "app", "key": ""}]}), "create[0].key"),
            (
                json!({"token": "t", "create": [{"machine": "app", "key": "k", "properties": 3}]}),
                "create[0].properties",
            ),
            (json!({"token": "t", "create": [{"machine": "app", "key": "k", "params": {}}]}), "create[0].params"),
            (json!({"token": "t", "raise": [{"event": "e"}]}), "raise[0]"),
            (json!({"token": "t", "raise": [{"event": "e", "machine": "m"}]}), "raise[0]"),
            (
                json!({"token": "t", "raise": [{"event": "e", "machine": "m", "key": "k", "on": "successors"}]}),
                "raise[0]",
            ),
            (json!({"token": "t", "raise": [{"event": "e", "on": "cousins"}]}), "raise[0].on"),
            (json!({"token": "t", "raise": [{"event": "e", "on": "successors", "join": true}]}), "raise[0].join"),
            (json!({"token": "t", "raise": [{"event": "e", "on": "self", "join": true}]}), "raise[0].join"),
            (json!({"token": "t", "properties": {"$history": {}}}), "properties"),
            (
                json!({"token": "t", "create": [{"machine": "m", "key": "k", "properties": {"$x": 1}}]}),
                "create[0].properties",
            ),
            (json!({"token": "t", "raise": [{"event": "e", "on": "self", "reply": "e"}]}), "raise[0].reply"),
            (
                json!({"token": "t", "raise": [{"event": "e", "machine": "m", "key": "k", "params": "x"}]}),
                "raise[0].params",
            ),
        ];
        for (v, field) in cases {
            let Err(p) = outcome(req(v.clone())) else { panic!("accepted: {v}") };
            assert_eq!(p.body().field.as_deref(), Some(field), "{v}");
        }
    }
}
