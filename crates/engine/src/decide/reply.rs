//! Sync nested events without a held action (DESIGN §1): an event raised with a reply is
//! answered when its workflow ends on the entity it was raised on, by an event raised on
//! the raiser in the commit that ends it. Which commits end which workflows is decided
//! here, from the commit and the held snapshot before it lands.

use serde_json::{Map, Value, json};
use settle_core::EventName;
use settle_store::{Commit, HistoryKind, InboxKind, Push, Reply, RunStatus};

use super::Held;
use crate::registry::Registry;

/// The replies `c` owes, written with it: to the event it processes, if that event's
/// workflow ends here (rejected, ignored, its action failed, handled without a move, or
/// the entity at rest after it), and to the event whose workflow the entity was in, if
/// that one ends here (the entity at rest, or another event accepted and moving it on).
pub(crate) fn replies(held: &Held, c: &Commit, registry: &Registry) -> Vec<Push> {
    let t = &c.telemetry;
    let state = c.to.as_ref().unwrap_or(&c.from);
    let parked = matches!(c.run_status, Some((RunStatus::Failed, _)));
    let mut out = Vec::new();
    if let (Some(ev), Some(name)) = (&t.event, &c.event)
        && let Some(reply) = &ev.reply
        && (c.to.is_none() || t.at_rest)
    {
        let outcome = if ev.rejected {
            "rejected"
        } else if ev.failed || parked {
            "failed"
        } else if c.kind == HistoryKind::Ignored {
            "ignored"
        } else {
            "accepted"
        };
        let reason = if outcome == "accepted" { None } else { c.detail.as_deref() };
        out.push(answer(held, reply, name, (outcome, state.as_str(), reason), c, registry));
    }
    let taken_over = t.event.is_some() && c.to.is_some();
    if let Some(trigger) = &held.trigger
        && let Some(reply) = &trigger.reply
        && (t.at_rest || taken_over)
    {
        let outcome = if parked {
            "failed"
        } else if taken_over {
            "interrupted"
        } else {
            "accepted"
        };
        let reason = if parked { c.detail.as_deref() } else { None };
        let state = if taken_over { c.from.as_str() } else { state.as_str() };
        out.push(answer(held, reply, &trigger.event, (outcome, state, reason), c, registry));
    }
    out
}

/// The reply to `reply`'s raiser about `event`: what came of it, as many of `machine`,
/// `key`, `event`, `outcome`, `state` and `reason` as the reply event declares (all, when
/// this engine does not know the raiser's machine).
fn answer(
    held: &Held,
    reply: &Reply,
    event: &EventName,
    (outcome, state, reason): (&str, &str, Option<&str>),
    c: &Commit,
    registry: &Registry,
) -> Push {
    let values = [
        json!(held.entity.machine.as_str()),
        json!(held.entity.key.as_str()),
        json!(event.as_str()),
        json!(outcome),
        json!(state),
        reason.map_or(Value::Null, |r| json!(r)),
    ];
    let declared = registry.machine(&reply.machine).ok().and_then(|m| m.event(&reply.event)).map(|e| &e.params);
    let params: Map<String, Value> = settle_core::validate::REPLY_PARAMS
        .into_iter()
        .zip(values)
        .filter(|(name, _)| declared.is_none_or(|d| d.iter().any(|p| p == name)))
        .map(|(name, v)| (name.to_string(), v))
        .collect();
    Push {
        machine: reply.machine.clone(),
        key: reply.key.clone(),
        event: reply.event.clone(),
        params: Value::Object(params),
        request_id: c.request_id.clone(),
        kind: InboxKind::Reply,
        join_from: None,
        operation: None,
        reply: None,
    }
}
