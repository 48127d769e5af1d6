//! Telemetry (DESIGN §6): what a commit records beside its transition ([`Telemetry`]: its
//! event, state entry and error), and the processed events read back ([`EventRow`]).

use settle_core::{EventName, StateName};

use crate::Millis;

/// Telemetry written with a commit (DESIGN §6).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Telemetry {
    /// The inbox event this commit processes.
    pub event: Option<EventRecord>,
    /// The state entry this commit makes.
    pub transition: Option<TransitionRecord>,
    /// The error this commit records.
    pub error: Option<ErrorRecord>,
    /// The entity is at rest after the commit: its event's workflow ends.
    pub at_rest: bool,
    /// The operation of the commit's request may be complete: check it.
    pub complete: bool,
    /// The event whose workflow the entity was in before this commit.
    pub current_event: Option<i64>,
}

/// A processed event, for the `events` table.
#[derive(Debug, Clone, PartialEq)]
pub struct EventRecord {
    /// raised | nested | subscription | timer.
    pub kind: &'static str,
    /// Its inbox id.
    pub seq: i64,
    /// When it was raised.
    pub raised_at: Millis,
    /// Rejected in the entity's state.
    pub rejected: bool,
    /// Its action failed.
    pub failed: bool,
    /// Its parameters (null: none), stored with it: the task of a state its workflow
    /// enters carries them.
    pub params: serde_json::Value,
    /// The reply owed when its workflow ends (a sync nested event).
    pub reply: Option<crate::Reply>,
}

impl EventRecord {
    /// The record of processing inbox item `item` (rejected in the entity's state, or its
    /// action failed): its kind named for the `events` table, its id, raise time and
    /// parameters (none for an agent's report, whose params encode the report).
    pub fn of(item: &crate::InboxItem, rejected: bool, failed: bool) -> EventRecord {
        use crate::InboxKind;
        EventRecord {
            kind: match item.kind {
                InboxKind::Raised => "raised",
                InboxKind::Nested => "nested",
                InboxKind::Timer => "timer",
                InboxKind::Notice => "subscription",
                InboxKind::Agent => "agent",
                InboxKind::Reply => "reply",
                InboxKind::Internal => "internal",
            },
            seq: item.id,
            raised_at: item.created_at,
            rejected,
            failed,
            params: if item.kind == InboxKind::Agent { serde_json::Value::Null } else { item.params.clone() },
            reply: item.reply.clone(),
        }
    }
}

/// A state entry, for the `transitions` table.
#[derive(Debug, Clone, PartialEq)]
pub struct TransitionRecord {
    /// create | event | event_action | auto_action.
    pub kind: &'static str,
    /// Health of the state left (`None` on creation).
    pub start_health: Option<&'static str>,
    /// Health of the state entered.
    pub end_health: &'static str,
    /// When the state left was entered.
    pub entry_time: Millis,
    /// When transitioning started: the event was received, or the action started.
    pub start_time: Millis,
    /// When the action started, if one ran.
    pub action_start_time: Option<Millis>,
    /// ok | retry | error.
    pub outcome: &'static str,
}

/// An error, for the `errors` table (and `exceptions` for panics).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ErrorRecord {
    /// action_error | panic | refused | commit_failed, or `failure`: the entity entered an
    /// error-health state (`details` says why, `cause` names who).
    pub kind: &'static str,
    /// What went wrong.
    pub details: String,
    /// Exception details (a panic's message), if any.
    pub exception: Option<String>,
    /// The fault policy backs off and tries again: the error is recorded, but the
    /// operation does not fail by it (it fails if the retries end parked).
    pub retried: bool,
    /// The entities whose states caused a failure: the successors a subscription matched.
    pub cause: Vec<CauseRef>,
}

/// An entity named as the cause of another's failure, in the state it was seen in (the
/// `cause` column of `errors`, JSON).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CauseRef {
    /// Its machine.
    pub machine: String,
    /// Its key.
    pub key: String,
    /// The state it was in.
    pub state: String,
}

impl CauseRef {
    /// The stored text of a list of causes (`None`: none).
    pub(crate) fn encode(list: &[CauseRef]) -> Option<String> {
        (!list.is_empty()).then(|| {
            let items: Vec<_> = list
                .iter()
                .map(|c| serde_json::json!({"machine": c.machine, "key": c.key, "state": c.state}))
                .collect();
            serde_json::Value::Array(items).to_string()
        })
    }
    /// Reads [`CauseRef::encode`] back (anything else is no cause).
    pub(crate) fn decode(text: Option<&str>) -> Vec<CauseRef> {
        let Some(v) = text.and_then(|t| serde_json::from_str::<serde_json::Value>(t).ok()) else { return Vec::new() };
        let field = |c: &serde_json::Value, f: &str| c.get(f).and_then(|v| v.as_str()).map(str::to_string);
        v.as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| {
                Some(CauseRef { machine: field(c, "machine")?, key: field(c, "key")?, state: field(c, "state")? })
            })
            .collect()
    }
}

/// One processed event of an entity, as the `events` telemetry table holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct EventRow {
    /// Its id (the inbox id it had).
    pub id: i64,
    /// The request that raised it.
    pub request_id: Option<String>,
    /// The event's name.
    pub event: EventName,
    /// raised | nested | subscription | timer.
    pub kind: String,
    /// The state it was processed in.
    pub start_state: StateName,
    /// The state the entity was at rest in afterwards (`None` while its workflow runs).
    pub end_state: Option<StateName>,
    /// When it was raised.
    pub start_time: Millis,
    /// When the entity was at rest again (`None` while its workflow runs).
    pub end_time: Option<Millis>,
    /// Rejected in the entity's state.
    pub rejected: bool,
    /// Its action failed.
    pub failed: bool,
    /// The error recorded with it, if any.
    pub error: Option<String>,
    /// Exception details (a panic's message), if any.
    pub exception: Option<String>,
    /// Why it was rejected, or how its action failed.
    pub reason: Option<String>,
    /// The state its action entered (when accepted).
    pub entered: Option<StateName>,
}
