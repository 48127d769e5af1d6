//! The outcome of an action, whoever wrote it (DESIGN §1, §5): a Rust handler, a
//! declarative action or an agent's report all decide the same value, and the runtime
//! commits it through the same decide → plan → commit.
//!
//! [`ActionOutcome::to_json`] is the durable encoding an agent's report travels in (the
//! entity's inbox): exact, ordered, and read back by [`ActionOutcome::from_json`], whose
//! errors name the field at fault.

use std::time::Duration;

use serde_json::{Map, Value, json};

use super::{PropChange, Properties};
use crate::machine::{Action, Broadcast, Related, is_engine_property};
use crate::names::{EntityKey, EventName, MachineName, StateName};

/// What an action decided: the state to enter (none: the same state again, a retry) and
/// the effects committed with it, in the order they were asked for.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ActionOutcome {
    /// The state to enter: one of the action's declared targets. `None` re-enters the
    /// current state (its auto action runs again).
    pub target: Option<StateName>,
    /// The delay before the entered state's auto action (overrides its declared wait).
    pub delay: Option<Duration>,
    /// Property changes, applied in order.
    pub changes: Vec<PropChange>,
    /// Entities created in the commit, recorded as this entity's successors.
    pub creates: Vec<Create>,
    /// Events raised on entities named by machine and key, through their inboxes.
    pub raises: Vec<Raise>,
    /// Events raised on every entity related to this one a given way.
    pub related: Vec<Broadcast>,
    /// Events raised on the entity itself (SCXML's internal events): processed after this
    /// transition commits, before anything else in its inbox, in the order raised.
    pub internal: Vec<InternalEvent>,
    /// Why the action failed, when its target is an error-health state: recorded in the
    /// entity's errors (kind `failure`) with the entry, and shown as its failure's cause.
    pub error: Option<String>,
}

/// An event an action raises on its own entity ([`ActionOutcome::internal`]).
#[derive(Debug, Clone, PartialEq)]
pub struct InternalEvent {
    /// The event, one of the entity's machine.
    pub event: EventName,
    /// Its parameters (a JSON object, or null).
    pub params: Value,
}

/// An entity an action creates (committed with the action; it becomes a successor).
#[derive(Debug, Clone, PartialEq)]
pub struct Create {
    /// Its machine.
    pub machine: MachineName,
    /// Its key.
    pub key: EntityKey,
    /// Constructor properties.
    pub properties: Properties,
}

/// An event an action raises on another entity, named by machine and key (through its
/// durable inbox, in the action's commit).
#[derive(Debug, Clone, PartialEq)]
pub struct Raise {
    /// The entity's machine.
    pub machine: MachineName,
    /// The entity's key.
    pub key: EntityKey,
    /// The event.
    pub event: EventName,
    /// Its parameters (a JSON object, or null).
    pub params: Value,
    /// Whether the entity joins the raiser's workflow (becomes its successor).
    pub join: bool,
    /// A sync nested event: the event of the raiser's own machine to raise on it when this
    /// event's workflow ends on the entity (rejected, ignored or failed, or the entity at
    /// rest again), with what came of it (`machine`, `key`, `event`, `outcome`, `state`,
    /// `reason`, as the reply event declares them). The raiser goes on meanwhile: it waits
    /// in the state its outcome entered, as long as that state says.
    pub reply: Option<EventName>,
}

impl ActionOutcome {
    /// The durable encoding: `target` (absent: the same state), `delay_ms`, `changes` as
    /// `{"set": k, "value": v}` / `{"unset": k}` in order, `create`, `raise`, `raise_on`,
    /// `raise_self`.
    /// Empty parts are left out.
    pub fn to_json(&self) -> Value {
        let mut o = Map::new();
        if let Some(t) = &self.target {
            o.insert("target".into(), json!(t.as_str()));
        }
        if let Some(d) = self.delay {
            o.insert("delay_ms".into(), json!(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)));
        }
        if let Some(e) = &self.error {
            o.insert("error".into(), json!(e));
        }
        if !self.changes.is_empty() {
            let changes = self.changes.iter().map(|c| match c {
                PropChange::Set(k, v) => json!({"set": k, "value": v}),
                PropChange::Remove(k) => json!({"unset": k}),
            });
            o.insert("changes".into(), Value::Array(changes.collect()));
        }
        if !self.creates.is_empty() {
            let creates = self
                .creates
                .iter()
                .map(|c| json!({"machine": c.machine.as_str(), "key": c.key.as_str(), "properties": c.properties}));
            o.insert("create".into(), Value::Array(creates.collect()));
        }
        if !self.raises.is_empty() {
            let raises = self.raises.iter().map(|r| {
                let mut raise = json!({"machine": r.machine.as_str(), "key": r.key.as_str(),
                                       "event": r.event.as_str(), "params": r.params, "join": r.join});
                if let Some(reply) = &r.reply {
                    raise["reply"] = json!(reply.as_str());
                }
                raise
            });
            o.insert("raise".into(), Value::Array(raises.collect()));
        }
        if !self.related.is_empty() {
            let related = self
                .related
                .iter()
                .map(|b| json!({"on": b.on.as_str(), "event": b.event.as_str(), "params": b.params}));
            o.insert("raise_on".into(), Value::Array(related.collect()));
        }
        if !self.internal.is_empty() {
            let internal = self.internal.iter().map(|i| json!({"event": i.event.as_str(), "params": i.params}));
            o.insert("raise_self".into(), Value::Array(internal.collect()));
        }
        Value::Object(o)
    }

    /// Reads [`ActionOutcome::to_json`] back; the error names the field at fault.
    pub fn from_json(v: &Value) -> Result<Self, String> {
        let o = v.as_object().ok_or("an outcome must be a JSON object")?;
        let mut out = ActionOutcome {
            target: opt_str(o, "target", "target")?.map(StateName::new),
            error: opt_str(o, "error", "error")?.map(str::to_string),
            delay: match o.get("delay_ms") {
                None | Some(Value::Null) => None,
                Some(d) => Some(Duration::from_millis(d.as_u64().ok_or("delay_ms: must be a non-negative integer")?)),
            },
            ..ActionOutcome::default()
        };
        for (i, c) in array(o, "changes")?.iter().enumerate() {
            let at = format!("changes[{i}]");
            let c = c.as_object().ok_or_else(|| format!("{at}: must be an object"))?;
            out.changes.push(match (opt_str(c, "set", &at)?, opt_str(c, "unset", &at)?) {
                (Some(k), None) => PropChange::Set(k.to_string(), c.get("value").cloned().unwrap_or(Value::Null)),
                (None, Some(k)) => PropChange::Remove(k.to_string()),
                _ => return Err(format!("{at}: must name exactly one of `set` and `unset`")),
            });
        }
        for (i, c) in array(o, "create")?.iter().enumerate() {
            let at = format!("create[{i}]");
            let c = c.as_object().ok_or_else(|| format!("{at}: must be an object"))?;
            out.creates.push(Create {
                machine: MachineName::new(str_of(c, "machine", &at)?),
                key: EntityKey::new(str_of(c, "key", &at)?),
                properties: object_of(c, "properties", &at)?,
            });
        }
        for (i, r) in array(o, "raise")?.iter().enumerate() {
            let at = format!("raise[{i}]");
            let r = r.as_object().ok_or_else(|| format!("{at}: must be an object"))?;
            out.raises.push(Raise {
                machine: MachineName::new(str_of(r, "machine", &at)?),
                key: EntityKey::new(str_of(r, "key", &at)?),
                event: EventName::new(str_of(r, "event", &at)?),
                params: r.get("params").cloned().unwrap_or(Value::Null),
                join: r.get("join").and_then(Value::as_bool).unwrap_or(false),
                reply: opt_str(r, "reply", &at)?.map(EventName::new),
            });
        }
        for (i, b) in array(o, "raise_on")?.iter().enumerate() {
            let at = format!("raise_on[{i}]");
            let b = b.as_object().ok_or_else(|| format!("{at}: must be an object"))?;
            out.related.push(Broadcast {
                event: EventName::new(str_of(b, "event", &at)?),
                on: Related::parse(str_of(b, "on", &at)?)
                    .ok_or_else(|| format!("{at}.on: `predecessors` or `successors`"))?,
                params: b.get("params").cloned().unwrap_or(Value::Null),
            });
        }
        for (i, r) in array(o, "raise_self")?.iter().enumerate() {
            let at = format!("raise_self[{i}]");
            let r = r.as_object().ok_or_else(|| format!("{at}: must be an object"))?;
            out.internal.push(InternalEvent {
                event: EventName::new(str_of(r, "event", &at)?),
                params: r.get("params").cloned().unwrap_or(Value::Null),
            });
        }
        Ok(out)
    }
}

/// The first raise of `outcome` whose reply is not an event of `machine` (`is_event` says
/// which names are): the field at fault (`raise[i].reply`) and why. (An internal event is
/// checked against the machine like any raise, by [`check_raise`](super::check_raise).)
pub fn foreign_reply(
    outcome: &ActionOutcome,
    machine: &str,
    is_event: impl Fn(&str) -> bool,
) -> Option<(String, String)> {
    outcome.raises.iter().enumerate().find_map(|(i, r)| {
        let reply = r.reply.as_ref().filter(|e| !is_event(e.as_str()))?;
        Some((format!("raise[{i}].reply"), format!("the reply `{reply}` is not an event of machine `{machine}`")))
    })
}

/// The first property of `outcome` that is the engine's (its name starts with `$`, as
/// `$history`): the field at fault (`properties`, `create[i].properties`) and why. Only the
/// engine writes those.
pub fn engine_property(outcome: &ActionOutcome) -> Option<(String, String)> {
    let why = |p: &str| format!("`{p}`: a property starting with `$` is the engine's");
    let changed = outcome.changes.iter().map(|c| match c {
        PropChange::Set(k, _) | PropChange::Remove(k) => k,
    });
    if let Some(k) = changed.into_iter().find(|k| is_engine_property(k)) {
        return Some(("properties".into(), why(k)));
    }
    outcome.creates.iter().enumerate().find_map(|(i, c)| {
        let k = c.properties.keys().find(|k| is_engine_property(k))?;
        Some((format!("create[{i}].properties"), why(k)))
    })
}

/// What of `outcome` goes beyond what `action` declares it may create and raise
/// (`may_create`, `may_raise`): the field at fault (`create[0]`, `raise[1]`, `raise_on[0]`)
/// and why. An action that declares neither is held to nothing, unless an agent executes
/// it: an agent's action creates and raises only what it declares.
pub fn beyond_declaration(action: &Action, outcome: &ActionOutcome) -> Option<(String, String)> {
    let agent = action.agent.is_some();
    let listed = |list: &[String]| if list.is_empty() { "none".to_string() } else { list.join(", ") };
    if action.may_create.is_some() || agent {
        let may: Vec<String> = action.may_create.iter().flatten().map(|m| m.to_string()).collect();
        if let Some((i, c)) =
            outcome.creates.iter().enumerate().find(|(_, c)| !may.iter().any(|m| m == c.machine.as_str()))
        {
            let why = format!(
                "action `{}` may not create a `{}` entity (`may_create`: {})",
                action.name,
                c.machine,
                listed(&may)
            );
            return Some((format!("create[{i}]"), why));
        }
    }
    if action.may_raise.is_some() || agent {
        let may: Vec<String> = action.may_raise.iter().flatten().map(|e| e.to_string()).collect();
        let allowed = |e: &EventName| may.iter().any(|m| m == e.as_str());
        let raised = outcome.raises.iter().enumerate().map(|(i, r)| (format!("raise[{i}]"), &r.event));
        let related = outcome.related.iter().enumerate().map(|(i, b)| (format!("raise_on[{i}]"), &b.event));
        let internal = outcome.internal.iter().enumerate().map(|(i, r)| (format!("raise_self[{i}]"), &r.event));
        for (at, event) in raised.chain(related).chain(internal) {
            if !allowed(event) {
                let why = format!("action `{}` may not raise `{event}` (`may_raise`: {})", action.name, listed(&may));
                return Some((at, why));
            }
        }
    }
    None
}

/// The property changes a declarative action's `set` makes for an entity with `props` and
/// `key`, running for an event with `params` (null: none; for an auto action, those of the
/// workflow's event): each expression evaluated, each other value as written (`null`
/// removes the property). `Err` names the entry at fault (`set.NAME`) and why it could not
/// be evaluated.
pub fn declared_changes(
    action: &Action,
    props: &Properties,
    params: &Value,
    key: &str,
) -> Result<Vec<PropChange>, (String, String)> {
    let values = evaluated(&action.set, &action.set_exprs, "set", (props, params, key))?;
    Ok(values.into_iter().map(|(name, value)| PropChange::from_json(name, value)).collect())
}

/// Declared values with their expressions evaluated over `(props, params, key)`: a value
/// without an expression as written. `Err` names the entry (`{at}.NAME`) and why.
fn evaluated(
    values: &[(String, Value)],
    exprs: &[Option<crate::expr::Expression>],
    at: &str,
    (props, params, key): (&Properties, &Value, &str),
) -> Result<Vec<(String, Value)>, (String, String)> {
    let mut out = Vec::with_capacity(values.len());
    for (i, (name, value)) in values.iter().enumerate() {
        let value = match exprs.get(i).and_then(Option::as_ref) {
            Some(expr) => expr
                .eval(props, params, key)
                .map_err(|why| (format!("{at}.{name}"), format!("`{}`: {why}", expr.source())))?,
            None => value.clone(),
        };
        out.push((name.clone(), value));
    }
    Ok(out)
}

/// The entities a declarative action's `create` makes for an entity with `props` and `key`,
/// running for an event with `params` (each key and property expression evaluated), and
/// the events it raises on entities named by key: each created entity's first event, then
/// its `raise` by machine and key. `Err` names the entry at fault (`create[i].key`,
/// `create[i].properties.NAME`, `raise[i].key`) and why.
pub fn declared_creates(
    action: &Action,
    props: &Properties,
    params: &Value,
    key: &str,
) -> Result<(Vec<Create>, Vec<Raise>), (String, String)> {
    let (mut creates, mut raises) = (Vec::new(), Vec::new());
    for (i, c) in action.create.iter().enumerate() {
        let at = format!("create[{i}]");
        let new_key = computed_key(&c.key, (props, params, key), &format!("{at}.key"))?;
        let scope = (props, params, key);
        let properties: Properties =
            evaluated(&c.properties, &c.property_exprs, &format!("{at}.properties"), scope)?.into_iter().collect();
        if let Some((event, event_params)) = &c.event {
            raises.push(Raise {
                machine: c.machine.clone(),
                key: new_key.clone(),
                event: event.clone(),
                params: event_params.clone(),
                join: false,
                reply: c.reply.clone(),
            });
        }
        creates.push(Create { machine: c.machine.clone(), key: new_key, properties });
    }
    for (i, r) in action.raise_keyed.iter().enumerate() {
        let target = computed_key(&r.key, (props, params, key), &format!("raise[{i}].key"))?;
        let raise = Raise {
            machine: r.machine.clone(),
            key: target,
            event: r.event.clone(),
            params: r.params.clone(),
            join: false,
            reply: r.reply.clone(),
        };
        raises.push(raise);
    }
    Ok((creates, raises))
}

/// A key computed by its expression: a non-empty string, or why not (naming `field`).
fn computed_key(
    expr: &crate::expr::Expression,
    (props, params, key): (&Properties, &Value, &str),
    field: &str,
) -> Result<EntityKey, (String, String)> {
    match expr.eval(props, params, key) {
        Ok(Value::String(k)) if !k.is_empty() => Ok(EntityKey::new(k)),
        Ok(other) => Err((field.to_string(), format!("`{}` gave {other}, not a key", expr.source()))),
        Err(why) => Err((field.to_string(), format!("`{}`: {why}", expr.source()))),
    }
}

fn array<'a>(o: &'a Map<String, Value>, field: &str) -> Result<&'a [Value], String> {
    match o.get(field) {
        None | Some(Value::Null) => Ok(&[]),
        Some(Value::Array(a)) => Ok(a),
        Some(_) => Err(format!("{field}: must be an array")),
    }
}

fn opt_str<'a>(o: &'a Map<String, Value>, field: &str, at: &str) -> Result<Option<&'a str>, String> {
    match o.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(if at == field {
            format!("{field}: must be a string")
        } else {
            format!("{at}.{field}: must be a string")
        }),
    }
}

fn str_of<'a>(o: &'a Map<String, Value>, field: &str, at: &str) -> Result<&'a str, String> {
    opt_str(o, field, at)?.ok_or_else(|| format!("{at}.{field}: missing"))
}

fn object_of(o: &Map<String, Value>, field: &str, at: &str) -> Result<Properties, String> {
    match o.get(field) {
        None | Some(Value::Null) => Ok(Properties::new()),
        Some(Value::Object(m)) => Ok(m.clone()),
        Some(_) => Err(format!("{at}.{field}: must be a JSON object")),
    }
}

/// The longest error text an action's outcome or failure may carry, in bytes (an agent's
/// report beyond it is refused, naming the field).
pub const ERROR_MAX_BYTES: usize = 8 * 1024;
/// The most property data (as JSON) one outcome may set, or one entity be created with,
/// in bytes.
pub const PROPERTIES_MAX_BYTES: usize = 256 * 1024;

/// Checks `error` (the text of `field`) against [`ERROR_MAX_BYTES`]: `Err((field, reason))`.
pub fn check_error_size(error: &str, field: &str) -> Result<(), (String, String)> {
    if error.len() > ERROR_MAX_BYTES {
        return Err((field.to_string(), format!("{} bytes of error text; at most {ERROR_MAX_BYTES}", error.len())));
    }
    Ok(())
}

/// Checks property values (as they would be stored) against [`PROPERTIES_MAX_BYTES`]:
/// `Err((field, reason))`.
pub fn check_properties_size<'a>(
    values: impl IntoIterator<Item = (&'a String, &'a Value)>,
    field: &str,
) -> Result<(), (String, String)> {
    let mut bytes = 0usize;
    for (k, v) in values {
        bytes += k.len() + serde_json::to_string(v).map_or(0, |t| t.len());
        if bytes > PROPERTIES_MAX_BYTES {
            return Err((
                field.to_string(),
                format!(
                    "more than {PROPERTIES_MAX_BYTES} bytes of properties (as JSON); at most {PROPERTIES_MAX_BYTES}"
                ),
            ));
        }
    }
    Ok(())
}

/// Checks what `outcome` would store against the size limits: its error text, the
/// properties it sets, those of each entity it creates. `Err((field, reason))`, the field
/// as an agent's report names it.
pub fn check_size(outcome: &ActionOutcome) -> Result<(), (String, String)> {
    if let Some(e) = &outcome.error {
        check_error_size(e, "error")?;
    }
    let set = outcome.changes.iter().filter_map(|c| match c {
        PropChange::Set(k, v) => Some((k, v)),
        PropChange::Remove(_) => None,
    });
    check_properties_size(set, "properties")?;
    for (i, c) in outcome.creates.iter().enumerate() {
        check_properties_size(c.properties.iter(), &format!("create[{i}].properties"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full() -> ActionOutcome {
        ActionOutcome {
            target: Some(StateName::new("ready")),
            delay: Some(Duration::from_millis(1500)),
            changes: vec![
                PropChange::Set("a".into(), json!(1)),
                PropChange::Remove("b".into()),
                PropChange::Set("c".into(), Value::Null),
            ],
            creates: vec![Create {
                machine: MachineName::new("app"),
                key: EntityKey::new("web-app"),
                properties: json!({"size": 2}).as_object().cloned().unwrap(),
            }],
            raises: vec![Raise {
                machine: MachineName::new("app"),
                key: EntityKey::new("web-app"),
                event: EventName::new("start"),
                params: json!({"n": 1}),
                join: true,
                reply: None,
            }],
            related: vec![Broadcast {
                event: EventName::new("child_ready"),
                on: Related::Predecessors,
                params: Value::Null,
            }],
            internal: vec![InternalEvent { event: EventName::new("recheck"), params: json!({"depth": 2}) }],
            error: Some("the provider refused: quota".into()),
        }
    }

    #[test]
    fn every_part_survives_its_encoding_in_order() {
        let o = full();
        assert_eq!(ActionOutcome::from_json(&o.to_json()), Ok(o));
        // A set to null stays a set; an unset stays an unset.
        let v = full().to_json();
        assert_eq!(v["changes"][2], json!({"set": "c", "value": null}));
        assert_eq!(v["changes"][1], json!({"unset": "b"}));
    }

    #[test]
    fn an_empty_outcome_is_an_empty_object_and_stays_in_its_state() {
        let o = ActionOutcome::default();
        assert_eq!(o.to_json(), json!({}));
        assert_eq!(ActionOutcome::from_json(&json!({})), Ok(o.clone()));
    }

    #[test]
    fn an_outcome_is_held_to_what_its_action_declares() {
        let m = crate::MachineBuilder::new("server")
            .state("provisioning")
            .initial()
            .auto("provision")
            .state("ready")
            .event("check", ["ready"], "inspect")
            .action("provision", ["ready"])
            .agent("cloud", Duration::from_secs(60))
            .may_create(["app"])
            .may_raise(["start", "child_ready", "recheck"])
            .action("inspect", ["ready", "provisioning"])
            .action("undeclared_agent", ["ready"])
            .agent("cloud", Duration::from_secs(60))
            .build()
            .unwrap();
        let (declared, handler, agent) =
            (m.action("provision").unwrap(), m.action("inspect").unwrap(), m.action("undeclared_agent").unwrap());
        // Within the declaration; a handler's action that declares nothing is held to nothing.
        assert_eq!(beyond_declaration(declared, &full()), None);
        assert_eq!(beyond_declaration(handler, &full()), None);
        assert_eq!(beyond_declaration(declared, &ActionOutcome::default()), None);
        assert_eq!(beyond_declaration(agent, &ActionOutcome::default()), None);
        // An agent's action that declares nothing may create and raise nothing.
        let why = |f: &str, w: &str| Some((f.to_string(), w.to_string()));
        assert_eq!(
            beyond_declaration(agent, &full()),
            why("create[0]", "action `undeclared_agent` may not create a `app` entity (`may_create`: none)")
        );
        let raises_only = ActionOutcome { creates: Vec::new(), ..full() };
        assert_eq!(
            beyond_declaration(agent, &raises_only),
            why("raise[0]", "action `undeclared_agent` may not raise `start` (`may_raise`: none)")
        );
        // The field counts raises by key and by relation apart.
        let mut two = full();
        two.raises.push(Raise { event: "stop".into(), ..two.raises[0].clone() });
        assert_eq!(
            beyond_declaration(declared, &two),
            why("raise[1]", "action `provision` may not raise `stop` (`may_raise`: start, child_ready, recheck)")
        );
        let mut related = full();
        related.related.push(Broadcast { event: "boom".into(), on: Related::Successors, params: Value::Null });
        assert_eq!(
            beyond_declaration(declared, &related),
            why("raise_on[1]", "action `provision` may not raise `boom` (`may_raise`: start, child_ready, recheck)")
        );
        let mut own = full();
        own.internal.push(InternalEvent { event: "sneak".into(), params: Value::Null });
        assert_eq!(
            beyond_declaration(declared, &own),
            why("raise_self[1]", "action `provision` may not raise `sneak` (`may_raise`: start, child_ready, recheck)")
        );
        let mut db = full();
        db.creates.push(Create { machine: "db".into(), ..db.creates[0].clone() });
        assert_eq!(
            beyond_declaration(declared, &db),
            why("create[1]", "action `provision` may not create a `db` entity (`may_create`: app)")
        );
    }

    #[test]
    fn the_engines_properties_are_no_outcomes_to_write() {
        assert_eq!(engine_property(&full()), None);
        let why = "`$history`: a property starting with `$` is the engine's".to_string();
        let mut set = full();
        set.changes.push(PropChange::Remove("$history".into()));
        assert_eq!(engine_property(&set), Some(("properties".into(), why.clone())));
        let mut created = full();
        created.creates[0].properties.insert("$history".into(), json!({}));
        assert_eq!(engine_property(&created), Some(("create[0].properties".into(), why)));
    }

    #[test]
    fn a_bad_field_is_named() {
        let cases = [
            (json!([]), "an outcome must be a JSON object"),
            (json!({"target": 3}), "target: must be a string"),
            (json!({"delay_ms": -1}), "delay_ms: must be a non-negative integer"),
            (json!({"changes": {}}), "changes: must be an array"),
            (
                json!({"changes": [{"set": "a", "unset": "b"}]}),
                "changes[0]: must name exactly one of `set` and `unset`",
            ),
            (json!({"create": [{"machine": "app"}]}), "create[0].key: missing"),
            (
                json!({"create": [{"machine": "app", "key": "k", "properties": 1}]}),
                "create[0].properties: must be a JSON object",
            ),
            (json!({"raise": [{"machine": "app", "key": "k"}]}), "raise[0].event: missing"),
            (json!({"raise_on": [{"event": "e", "on": "cousins"}]}), "raise_on[0].on: `predecessors` or `successors`"),
        ];
        for (v, want) in cases {
            assert_eq!(ActionOutcome::from_json(&v), Err(want.to_string()), "{v}");
        }
    }
}
