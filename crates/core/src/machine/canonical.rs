//! The canonical JSON rendering of a validated [`Machine`] and its content hash: the
//! definition's version, stored with it. The text must never change for a definition
//! that does not change: keys of later features appear only when used.

use std::time::Duration;

use super::def::{Health, History};
use super::model::{Alternative, Machine, Schedule, Then};

impl Machine {
    /// A canonical, stable JSON rendering of the definition (stored with the machine):
    /// compact, object keys sorted — whatever order serde_json's maps keep in this build
    /// (its `preserve_order` feature, enabled by any crate in a build, would otherwise
    /// change the text and so every definition's hash).
    pub fn canonical_json(&self) -> String {
        use serde_json::{Map, Value, json};
        let ms = |d: Duration| Value::from(d.as_millis() as u64);
        let states: Vec<Value> = self
            .states()
            .iter()
            .map(|s| {
                let mut state = json!({
                    "name": s.name.as_str(),
                    "kind": s.kind.as_str(),
                    "auto": s.auto.as_deref(),
                    "wait_ms": ms(s.wait),
                    "health": if s.health == Health::Error { "error" } else { "ok" },
                    "requires": s.requires,
                });
                if !s.renamed_from.is_empty() {
                    state["renamed_from"] = s.renamed_from.iter().map(|n| n.as_str()).collect();
                }
                // Keys of substates and entry/exit actions only when used.
                if let Some(p) = &s.parent {
                    state["parent"] = Value::from(p.as_str());
                }
                if let Some(c) = &s.initial_child {
                    state["initial"] = Value::from(c.as_str());
                }
                if let Some(h) = s.history {
                    state["history"] = Value::from(h.as_str());
                }
                if let Some(k) = s.retain {
                    state["retain"] = k.to_json();
                }
                if !s.on_entry.is_empty() {
                    state["on_entry"] = s.on_entry.iter().map(|a| a.as_str()).collect();
                }
                if !s.on_exit.is_empty() {
                    state["on_exit"] = s.on_exit.iter().map(|a| a.as_str()).collect();
                }
                if !s.on_entry_from.is_empty() {
                    let from: Map<String, Value> = s
                        .on_entry_from
                        .iter()
                        .map(|(e, a)| (e.to_string(), a.iter().map(|a| a.as_str()).collect()))
                        .collect();
                    state["on_entry_from"] = Value::from(from);
                }
                state
            })
            .collect();
        let events: Vec<Value> = self
            .events()
            .iter()
            .map(|e| {
                let reject: Map<String, Value> =
                    e.reject.iter().map(|(k, v)| (k.to_string(), Value::from(v.as_str()))).collect();
                let mut event = json!({
                    "name": e.name.as_str(),
                    "in": e.valid_in.iter().map(|s| s.as_str()).collect::<Vec<_>>(),
                    "params": e.params,
                    "reject": reject,
                });
                match e.action() {
                    Some(action) => event["action"] = Value::from(action.as_str()),
                    None => event["when"] = e.alternatives.iter().map(alternative_json).collect(),
                }
                if !e.ignore.is_empty() {
                    event["ignore"] = e.ignore.iter().map(|s| s.as_str()).collect();
                }
                if e.internal {
                    event["internal"] = Value::from(true);
                }
                if e.priority != 0 {
                    event["priority"] = Value::from(e.priority);
                }
                // Keys of later features only when used: older definitions keep their hash.
                if let Some(sub) = &e.subscribe {
                    event["subscribe"] = Value::from(sub.pattern.to_string());
                    if let Some(t) = &sub.timeout {
                        event["timeout"] = json!({"after_ms": ms(t.after), "event": t.event.as_str()});
                    }
                }
                event
            })
            .collect();
        let actions: Vec<Value> = self
            .actions()
            .iter()
            .map(|a| {
                let mut action = json!({
                    "name": a.name.as_str(),
                    "to": a.targets.iter().map(|t| json!({"state": t.state.as_str(), "wait_ms": ms(t.wait)})).collect::<Vec<_>>(),
                });
                if let Some(b) = &a.agent {
                    action["agent"] = json!({"queue": b.queue, "lock_ms": ms(b.lock)});
                }
                if !a.set.is_empty() {
                    let set: Map<String, Value> = a.set.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
                    action["set"] = Value::from(set);
                }
                if let Some(m) = &a.may_create {
                    action["may_create"] = m.iter().map(|m| m.as_str()).collect();
                }
                if let Some(e) = &a.may_raise {
                    action["may_raise"] = e.iter().map(|e| e.as_str()).collect();
                }
                if !a.raise.is_empty() || !a.raise_keyed.is_empty() || !a.raise_self.is_empty() {
                    action["raise"] = a
                        .raise
                        .iter()
                        .map(|r| json!({"event": r.event.as_str(), "on": r.on.as_str(), "params": r.params}))
                        .chain(a.raise_keyed.iter().map(|r| {
                            let mut raise = json!({"event": r.event.as_str(), "machine": r.machine.as_str(),
                                                   "key": r.key.source(), "params": r.params});
                            // Only when asked: the hash of a definition without it stays.
                            if let Some(reply) = &r.reply {
                                raise["reply"] = json!(reply.as_str());
                            }
                            raise
                        }))
                        .chain(a.raise_self.iter().map(|(event, params)| {
                            json!({"event": event.as_str(), "on": super::model::SELF, "params": params})
                        }))
                        .collect();
                }
                if !a.create.is_empty() {
                    action["create"] = a
                        .create
                        .iter()
                        .map(|c| {
                            let properties: Map<String, Value> = c.properties.iter().cloned().collect();
                            let (event, params) = match &c.event {
                                Some((e, p)) => (Value::from(e.as_str()), p.clone()),
                                None => (Value::Null, Value::Null),
                            };
                            let mut create = json!({"machine": c.machine.as_str(), "key": c.key.source(),
                                                    "properties": properties, "event": event, "params": params});
                            if let Some(reply) = &c.reply {
                                create["reply"] = json!(reply.as_str());
                            }
                            create
                        })
                        .collect();
                }
                action
            })
            .collect();
        let mut machine = json!({
            "name": self.name().as_str(),
            "initial": self.initial_declared().name.as_str(),
            "states": states,
            "events": events,
            "actions": actions,
        });
        if !self.timers().is_empty() {
            let timers: Vec<Value> = self
                .timers()
                .iter()
                .map(|t| {
                    let (key, d) = match t.schedule {
                        Schedule::Every(d) => ("every_ms", d),
                        Schedule::After(d) => ("after_ms", d),
                    };
                    json!({
                        "name": t.name,
                        "event": t.event.as_str(),
                        key: ms(d),
                        "in": t.valid_in.iter().map(|s| s.as_str()).collect::<Vec<_>>(),
                    })
                })
                .collect();
            machine["timers"] = Value::from(timers);
        }
        if !self.schedules().is_empty() {
            let schedules: Vec<Value> =
                self.schedules().iter().map(|c| serde_json::to_value(&c.def).unwrap_or(Value::Null)).collect();
            machine["schedules"] = Value::from(schedules);
        }
        if !self.limits().is_empty() {
            let limits: Vec<Value> =
                self.limits().iter().map(|l| serde_json::to_value(&l.def).unwrap_or(Value::Null)).collect();
            machine["limits"] = Value::from(limits);
        }
        if let Some(f) = &self.fault {
            machine["fault"] = json!({
                "max_errors": f.max_errors,
                "window_ms": ms(f.window),
                "backoff": {"min_ms": ms(f.backoff_min), "max_ms": ms(f.backoff_max)},
            });
        }
        if let Some(r) = &self.retention {
            let mut retention = Map::new();
            if let Some(k) = r.ended {
                retention.insert("ended".into(), k.to_json());
            }
            if let Some(a) = r.archive {
                retention.insert("archive".into(), Value::from(a));
            }
            if let Some(k) = r.history {
                retention.insert("history".into(), k.to_json());
            }
            if let Some(n) = r.history_rows {
                retention.insert("history_rows".into(), Value::from(n));
            }
            machine["retention"] = Value::from(retention);
        }
        if self.upgrade == crate::upgrade::Policy::Pin {
            machine["upgrade"] = Value::from(self.upgrade.as_str());
        }
        if !self.cascade.is_empty() {
            machine["cascade"] = self.cascade.iter().map(String::as_str).collect();
        }
        if let Some(e) = &self.cancel {
            machine["cancel"] = Value::from(e.as_str());
        }
        if let Some(e) = &self.delete {
            machine["delete"] = Value::from(e.as_str());
        }
        if !self.properties.is_empty() {
            machine["properties"] = self.properties.iter().map(String::as_str).collect();
        }
        if !self.migrate.is_empty() {
            let migrate: Map<String, Value> =
                self.migrate.iter().map(|(old, new)| (old.to_string(), Value::from(new.as_str()))).collect();
            machine["migrate"] = Value::from(migrate);
        }
        let mut out = String::new();
        write_sorted(&machine, &mut out);
        out
    }

    /// SHA-256 of [`Machine::canonical_json`], hex-encoded: the definition's version hash.
    pub fn content_hash(&self) -> String {
        use sha2::{Digest, Sha256};
        let digest = Sha256::digest(self.canonical_json().as_bytes());
        digest.iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// Writes `v` as compact JSON with every object's keys in sorted order.
impl Machine {
    /// Reads a definition back from its [`canonical_json`](Machine::canonical_json), as a
    /// store keeps it: for tools that read the database without the definitions' files
    /// (listing a parent's entities, labelling metrics with state paths). The result is
    /// validated like any definition; its hash is the stored one.
    pub fn from_canonical_json(text: &str) -> Result<Machine, String> {
        let v: serde_json::Value = serde_json::from_str(text).map_err(|e| format!("not a stored definition: {e}"))?;
        let def =
            def_of(&v).ok_or_else(|| "not a stored definition: a field is missing or of the wrong type".to_string())?;
        Machine::from_def(&def).map(|(m, _)| m).map_err(|report| report.to_string())
    }
}

/// The definition a canonical rendering describes (`None`: it is not one).
fn def_of(v: &serde_json::Value) -> Option<super::def::MachineDef> {
    use super::def::{
        ActionDef, CreateDef, EventDef, FaultDef, MachineDef, MigrateDef, RaiseDef, RetentionDef, StateDef, StateKind,
        TimerDef, WhenDef,
    };
    use crate::retention::Keep;
    use serde_json::Value;
    let text = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
    let texts = |v: &Value, k: &str| -> Option<Vec<String>> {
        match v.get(k) {
            None | Some(Value::Null) => Some(Vec::new()),
            Some(list) => list.as_array()?.iter().map(|x| x.as_str().map(str::to_string)).collect(),
        }
    };
    let ms = |v: &Value, k: &str| v.get(k).and_then(Value::as_u64).map(Duration::from_millis);
    let table = |v: &Value, k: &str| -> Vec<(String, Value)> {
        v.get(k)
            .and_then(Value::as_object)
            .map(|o| o.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default()
    };
    let mut def = MachineDef { name: text(v, "name")?, initial: Some(text(v, "initial")?), ..MachineDef::default() };
    for s in v.get("states")?.as_array()? {
        let kind = match s.get("kind")?.as_str()? {
            "terminal" => Some(StateKind::Terminal),
            "deleted" => Some(StateKind::Deleted),
            _ => None,
        };
        def.states.push(StateDef {
            name: text(s, "name")?,
            kind,
            auto: text(s, "auto").into_iter().collect(),
            wait: ms(s, "wait_ms").filter(|d| !d.is_zero()),
            health: if text(s, "health").as_deref() == Some("error") { Health::Error } else { Health::Ok },
            requires: texts(s, "requires")?,
            renamed_from: texts(s, "renamed_from")?,
            parent: text(s, "parent"),
            initial_child: text(s, "initial"),
            history: match text(s, "history") {
                Some(h) => Some(History::parse(&h)?),
                None => None,
            },
            retain: match s.get("retain") {
                Some(k) => Some(Keep::from_json(k)?),
                None => None,
            },
            on_entry: texts(s, "on_entry")?,
            on_exit: texts(s, "on_exit")?,
            on_entry_from: table(s, "on_entry_from")
                .into_iter()
                .map(|(e, a)| {
                    Some((e, a.as_array()?.iter().map(|x| x.as_str().map(str::to_string)).collect::<Option<_>>()?))
                })
                .collect::<Option<_>>()?,
            ..StateDef::default()
        });
    }
    for e in v.get("events")?.as_array()? {
        let when = match e.get("when").and_then(Value::as_array) {
            None => Vec::new(),
            Some(alts) => alts
                .iter()
                .map(|w| {
                    Some(WhenDef {
                        valid_in: texts(w, "in")?,
                        guard: text(w, "guard"),
                        action: text(w, "action"),
                        reject: text(w, "reject"),
                        ignore: w.get("ignore").and_then(Value::as_bool).unwrap_or(false),
                        ..WhenDef::default()
                    })
                })
                .collect::<Option<_>>()?,
        };
        let timeout = e.get("timeout").and_then(|t| Some((ms(t, "after_ms")?, text(t, "event")?)));
        def.events.push(EventDef {
            name: text(e, "name")?,
            valid_in: texts(e, "in")?,
            action: text(e, "action").unwrap_or_default(),
            when,
            ignore: texts(e, "ignore")?,
            internal: e.get("internal").and_then(Value::as_bool).unwrap_or(false),
            priority: e.get("priority").and_then(Value::as_i64),
            params: texts(e, "params")?,
            reject: table(e, "reject")
                .into_iter()
                .map(|(k, r)| Some((k, r.as_str()?.to_string())))
                .collect::<Option<_>>()?,
            subscribe: text(e, "subscribe"),
            timeout,
            ..EventDef::default()
        });
    }
    for a in v.get("actions")?.as_array()? {
        let to = a.get("to")?.as_array()?;
        let targets: Vec<String> = to.iter().map(|t| text(t, "state")).collect::<Option<_>>()?;
        let target_waits = to
            .iter()
            .filter_map(|t| Some((text(t, "state")?, ms(t, "wait_ms")?)))
            .filter(|(_, d)| !d.is_zero())
            .collect();
        let agent = a.get("agent");
        let raise = match a.get("raise").and_then(Value::as_array) {
            None => Vec::new(),
            Some(list) => list
                .iter()
                .map(|r| {
                    Some(RaiseDef {
                        event: text(r, "event")?,
                        on: text(r, "on").unwrap_or_default(),
                        machine: text(r, "machine"),
                        key: text(r, "key"),
                        params: r.get("params").cloned().unwrap_or(Value::Null),
                        reply: text(r, "reply"),
                    })
                })
                .collect::<Option<_>>()?,
        };
        let create = match a.get("create").and_then(Value::as_array) {
            None => Vec::new(),
            Some(list) => list
                .iter()
                .map(|c| {
                    Some(CreateDef {
                        machine: text(c, "machine")?,
                        key: text(c, "key")?,
                        properties: table(c, "properties"),
                        event: text(c, "event"),
                        params: c.get("params").cloned().unwrap_or(Value::Null),
                        reply: text(c, "reply"),
                    })
                })
                .collect::<Option<_>>()?,
        };
        def.actions.push(ActionDef {
            name: text(a, "name")?,
            targets,
            target_waits,
            agent: agent.and_then(|b| text(b, "queue")),
            lock: agent.and_then(|b| ms(b, "lock_ms")),
            set: table(a, "set"),
            raise,
            create,
            may_create: if a.get("may_create").is_some() { Some(texts(a, "may_create")?) } else { None },
            may_raise: if a.get("may_raise").is_some() { Some(texts(a, "may_raise")?) } else { None },
            ..ActionDef::default()
        });
    }
    for t in v.get("timers").and_then(Value::as_array).into_iter().flatten() {
        def.timers.push(TimerDef {
            name: text(t, "name")?,
            event: text(t, "event")?,
            every: ms(t, "every_ms"),
            after: ms(t, "after_ms"),
            valid_in: texts(t, "in")?,
            ..TimerDef::default()
        });
    }
    for c in v.get("schedules").and_then(Value::as_array).into_iter().flatten() {
        def.schedules.push(serde_json::from_value(c.clone()).ok()?);
    }
    for l in v.get("limits").and_then(Value::as_array).into_iter().flatten() {
        def.limits.push(serde_json::from_value(l.clone()).ok()?);
    }
    if let Some(f) = v.get("fault") {
        let backoff = f.get("backoff")?;
        def.fault = Some(FaultDef {
            max_errors: u32::try_from(f.get("max_errors")?.as_u64()?).ok(),
            window: ms(f, "window_ms"),
            backoff_min: ms(backoff, "min_ms"),
            backoff_max: ms(backoff, "max_ms"),
            ..FaultDef::default()
        });
    }
    if let Some(r) = v.get("retention") {
        let ended = match r.get("ended") {
            Some(k) => Some(Keep::from_json(k)?),
            None => None,
        };
        let archive = match r.get("archive") {
            Some(a) => Some(a.as_bool()?),
            None => None,
        };
        let history = match r.get("history") {
            Some(k) => Some(Keep::from_json(k)?),
            None => None,
        };
        let history_rows = match r.get("history_rows") {
            Some(n) => Some(u32::try_from(n.as_u64()?).ok()?),
            None => None,
        };
        def.retention = Some(RetentionDef { ended, archive, history, history_rows, ..RetentionDef::default() });
    }
    def.migrate = table(v, "migrate")
        .into_iter()
        .map(|(from, to)| Some(MigrateDef { from, to: to.as_str()?.to_string(), ..MigrateDef::default() }))
        .collect::<Option<_>>()?;
    def.properties = texts(v, "properties")?;
    def.cascade = texts(v, "cascade")?;
    def.upgrade = match v.get("upgrade") {
        None => None,
        Some(u) => Some(u.as_str()?.to_string()),
    };
    def.cancel = match v.get("cancel") {
        None => None,
        Some(e) => Some(e.as_str()?.to_string()),
    };
    def.delete = match v.get("delete") {
        None => None,
        Some(e) => Some(e.as_str()?.to_string()),
    };
    Some(def)
}

/// One `when` alternative, as stored.
fn alternative_json(a: &Alternative) -> serde_json::Value {
    let mut alt = serde_json::json!({ "in": a.valid_in.iter().map(|s| s.as_str()).collect::<Vec<_>>() });
    if let Some(g) = &a.guard {
        alt["guard"] = serde_json::Value::from(g.source());
    }
    match &a.then {
        Then::Action(action) => alt["action"] = serde_json::Value::from(action.as_str()),
        Then::Reject(reason) => alt["reject"] = serde_json::Value::from(reason.as_str()),
        Then::Ignore => alt["ignore"] = serde_json::Value::from(true),
    }
    alt
}

fn write_sorted(v: &serde_json::Value, out: &mut String) {
    use serde_json::Value;
    match v {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::from(k.as_str()).to_string());
                out.push(':');
                write_sorted(&map[k], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_sorted(item, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use crate::fault::FaultPolicy;
    use crate::fixtures::{SERVER, SUBSCRIBER};
    use crate::toml::load;

    #[test]
    fn definitions_without_new_keys_keep_their_hash() {
        // Pinned before fault policies and upgrades existed: declaring neither changes nothing.
        let (server, _) = load("server.toml", "server", SERVER).unwrap();
        assert_eq!(server.content_hash(), "c90bcd10c3e34991d24dd53a46e922eaf1aa79d8866917a3e76e4423227a0802");
        let (subscriber, _) = load("server.toml", "server", SUBSCRIBER).unwrap();
        assert_eq!(subscriber.content_hash(), "96e07fcfa7a27ca07df2c95a363a7c3b9f50a8db214abeedf0a7d910a7e23191");
        let json = server.canonical_json();
        for key in ["fault", "migrate", "renamed_from"] {
            assert!(!json.contains(key), "{json}");
        }
        assert_eq!(server.fault_policy(), &FaultPolicy::DEFAULT);
        assert!(server.state_mapping().is_empty());
    }

    /// A stored definition reads back as the machine it was: same model, same hash, for
    /// every kind of item (substates, guards, hooks, declarative actions, timers,
    /// subscriptions, fault policies, migrations).
    #[test]
    fn stored_definitions_read_back_as_the_same_machine() {
        use crate::Machine;
        let machines = [
            load("server.toml", "server", SERVER).unwrap().0,
            load("s.toml", "server", SUBSCRIBER).unwrap().0,
            load("asker.toml", "asker", include_str!("../testdata/asker.toml")).unwrap().0,
            crate::fixtures::instance(),
            crate::fixtures::server()
                .fault_policy(FaultPolicy::DEFAULT)
                .migrate("old", "ready")
                .state("limbo")
                .renamed_from(["older"])
                .build()
                .unwrap(),
        ];
        for m in machines {
            let back =
                Machine::from_canonical_json(&m.canonical_json()).unwrap_or_else(|e| panic!("{}: {e}", m.name()));
            assert_eq!(back, m, "{}", m.name());
            assert_eq!(back.content_hash(), m.content_hash());
        }
        assert!(Machine::from_canonical_json("{}").unwrap_err().starts_with("not a stored definition"));
    }
}
