//! The store operations the engine's API sends its scheduler: a create, a push (raise),
//! an operator command, each as the operation of its request id. Checked here against the
//! registry (the machine exists, the properties fit, their size too), shared with the
//! deterministic simulation (`crate::sim`).

use settle_core::step::Properties;
use settle_core::{EntityKey, EventName, Machine};
use settle_store::{Command, InboxKind, Millis, NewEntity, Op, OpenOperation, Push};

use crate::decide;
use crate::error::{Error, Result};
use crate::registry::Registry;

/// The store operation creating entity `key` of `machine` as the operation `request_id`
/// of `priority` (checked: the machine exists, the properties fit its initial state).
pub(crate) fn create_op(
    registry: &Registry,
    machine: &str,
    key: &str,
    properties: Properties,
    request_id: &str,
    priority: i64,
    now: Millis,
) -> Result<NewEntity> {
    let m = registry.machine(machine)?;
    settle_core::step::check_properties_size(properties.iter(), "properties")
        .map_err(|(field, reason)| Error::TooLarge { field, reason })?;
    let mut new = decide::new_entity(m, EntityKey::new(key), properties, Some(request_id.to_string()), now)?;
    new.machine_hash = registry.hash(machine);
    new.operation = Some(OpenOperation {
        request_id: request_id.to_string(),
        name: format!("{machine}:new"),
        dimensions: serde_json::json!({"machine": machine}),
        priority,
    });
    Ok(new)
}

/// The store operation raising `event` (already checked against `m`) on entity `key` as
/// the operation `request_id`, of `priority`.
pub(crate) fn push_op(
    m: &Machine,
    key: &str,
    event: &str,
    params: serde_json::Value,
    request_id: &str,
    priority: i64,
) -> Push {
    Push {
        machine: m.name().clone(),
        key: EntityKey::new(key),
        event: EventName::new(event),
        params,
        request_id: Some(request_id.to_string()),
        kind: InboxKind::Raised,
        join_from: None,
        operation: Some(OpenOperation {
            request_id: request_id.to_string(),
            name: format!("{}.{event}", m.name()),
            dimensions: serde_json::json!({"machine": m.name().as_str(), "event": event}),
            priority,
        }),
        reply: None,
    }
}

/// The store operation of an operator command on entity `key` of `machine`, as the
/// operation `request_id`.
pub(crate) fn command_op(
    registry: &Registry,
    machine: &str,
    key: &str,
    command: Command,
    request_id: &str,
    reason: Option<&str>,
) -> Result<Op> {
    let m = registry.machine(machine)?;
    let mut dimensions = serde_json::json!({"machine": machine, "command": command.as_str()});
    if let Some(r) = reason.map(str::trim).filter(|r| !r.is_empty()) {
        dimensions["reason"] = serde_json::json!(r);
    }
    Ok(Op::Command {
        machine: m.name().clone(),
        key: EntityKey::new(key),
        command,
        operation: Some(OpenOperation {
            request_id: request_id.to_string(),
            name: format!("{machine}.{}", command.as_str()),
            dimensions,
            priority: 0,
        }),
    })
}
