//! The canonical JSON rendering of a validated [`Machine`] and its content hash: the
//! definition's version, stored with it. The text must never change for a definition
//! that does not change: keys of later features appear only when used.

use std::time::Duration;

use super::def::Health;
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
                if !a.raise.is_empty() {
                    action["raise"] = a
                        .raise
                        .iter()
                        .map(|r| json!({"event": r.event.as_str(), "on": r.on.as_str(), "params": r.params}))
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
        if let Some(f) = &self.fault {
            machine["fault"] = json!({
                "max_errors": f.max_errors,
                "window_ms": ms(f.window),
                "backoff": {"min_ms": ms(f.backoff_min), "max_ms": ms(f.backoff_max)},
            });
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
/// One `when` alternative, as stored.
fn alternative_json(a: &Alternative) -> serde_json::Value {
    let mut alt = serde_json::json!({ "in": a.valid_in.iter().map(|s| s.as_str()).collect::<Vec<_>>() });
    if let Some(g) = &a.guard {
        alt["guard"] = serde_json::Value::from(g.source());
    }
    match &a.then {
        Then::Action(action) => alt["action"] = serde_json::Value::from(action.as_str()),
        Then::Reject(reason) => alt["reject"] = serde_json::Value::from(reason.as_str()),
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
}
