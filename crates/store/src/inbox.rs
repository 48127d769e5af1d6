//! The durable inbox of an entity: the events waiting in it ([`InboxItem`]), where each came
//! from ([`InboxKind`]), and an event to append ([`Push`]) to one entity or to every related
//! one ([`PushRelated`]).

use serde_json::Value;
use settle_core::machine::Related;
use settle_core::{EntityKey, EventName, MachineName};

use crate::{Millis, OpenOperation};

/// An event waiting in an entity's durable inbox.
#[derive(Debug, Clone, PartialEq)]
pub struct InboxItem {
    /// Store-assigned, increasing: the processing order.
    pub id: i64,
    /// The entity it was raised on.
    pub entity_id: i64,
    /// The event's name.
    pub event: EventName,
    /// Its parameters (a JSON object, or null).
    pub params: Value,
    /// The request that raised it.
    pub request_id: Option<String>,
    /// Where it came from.
    pub kind: InboxKind,
    /// When it was raised.
    pub created_at: Millis,
    /// Whom to tell when the event's workflow ends: a sync nested event's reply.
    pub reply: Option<Reply>,
}

/// A sync nested event's reply (DESIGN §1): when the workflow of the event that asks for it
/// ends on the entity it was raised on (the event rejected, ignored or failed; or the
/// entity at rest, or another event accepted before it was), the engine raises `event` on
/// the entity that raised it, in the same commit, with what came of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// The raising entity's machine.
    pub machine: MachineName,
    /// Its key.
    pub key: EntityKey,
    /// The event to raise on it.
    pub event: EventName,
}

impl Reply {
    /// As stored: `{"machine", "key", "event"}`.
    pub fn to_json(&self) -> Value {
        serde_json::json!({"machine": self.machine.as_str(), "key": self.key.as_str(), "event": self.event.as_str()})
    }
    /// Reads what [`Reply::to_json`] stored.
    pub fn from_json(v: &Value) -> Option<Reply> {
        let field = |name: &str| v.get(name).and_then(Value::as_str);
        Some(Reply {
            machine: MachineName::new(field("machine")?),
            key: EntityKey::new(field("key")?),
            event: EventName::new(field("event")?),
        })
    }
}

/// Where an inbox item came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum InboxKind {
    /// Raised by a caller of the API.
    #[default]
    Raised,
    /// Raised by another entity's action.
    Nested,
    /// Raised by a timer.
    Timer,
    /// A notice that a successor changed state: the entity's subscriptions are to be
    /// evaluated. Its `event` is [`InboxKind::NOTICE_EVENT`].
    Notice,
    /// An agent's report on a task (DESIGN §5): the outcome of the entity's agent-bound
    /// auto action. Its `event` is [`InboxKind::AGENT_EVENT`]; its params are an
    /// [`AgentReport`](crate::AgentReport) with the task's id, attempt and state entry.
    Agent,
    /// The reply to a sync nested event this entity raised ([`Reply`]): what came of it.
    /// Dropped, not an error, when the entity is no longer there to take it.
    Reply,
    /// Raised by the entity's own action on itself (SCXML's internal event): processed
    /// after the transition that raised it commits, before any other queued item — the
    /// entity's inbox head is its oldest internal event, if it has one.
    Internal,
}

impl InboxKind {
    /// The event name of notices.
    pub const NOTICE_EVENT: &'static str = "$successors";
    /// The event name of agent reports.
    pub const AGENT_EVENT: &'static str = "$agent";

    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            InboxKind::Raised => "raised",
            InboxKind::Nested => "nested",
            InboxKind::Timer => "timer",
            InboxKind::Notice => "notice",
            InboxKind::Agent => "agent",
            InboxKind::Reply => "reply",
            InboxKind::Internal => "internal",
        }
    }
    /// Parses the stored name.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "raised" => InboxKind::Raised,
            "nested" => InboxKind::Nested,
            "timer" => InboxKind::Timer,
            "notice" => InboxKind::Notice,
            "agent" => InboxKind::Agent,
            "reply" => InboxKind::Reply,
            "internal" => InboxKind::Internal,
            _ => return None,
        })
    }
}

/// An event to append to an entity's inbox.
#[derive(Debug, Clone, PartialEq)]
pub struct Push {
    /// The entity's machine.
    pub machine: MachineName,
    /// The entity's key.
    pub key: EntityKey,
    /// The event.
    pub event: EventName,
    /// Its parameters.
    pub params: Value,
    /// The request raising it.
    pub request_id: Option<String>,
    /// Where it comes from.
    pub kind: InboxKind,
    /// Records this entity as a predecessor of the target (the event joins the target into
    /// its workflow).
    pub join_from: Option<i64>,
    /// Opens this operation (an external raise); replays of its request id push nothing.
    pub operation: Option<OpenOperation>,
    /// Asks for a reply when the event's workflow ends (a sync nested event).
    pub reply: Option<Reply>,
}

impl Push {
    /// `event`, with `params`, raised on the entity `key` of `machine` from outside: no
    /// request id, operation, reply or workflow to join (set the fields for those).
    pub fn raised(machine: &str, key: &str, event: &str, params: Value) -> Push {
        Push {
            machine: MachineName::new(machine),
            key: EntityKey::new(key),
            event: EventName::new(event),
            params,
            request_id: None,
            kind: InboxKind::Raised,
            join_from: None,
            operation: None,
            reply: None,
        }
    }
}

/// An event appended, with a commit, to the inbox of every entity related one way to the
/// committing entity (a declarative action's `raise`): its predecessors or its successors
/// as they are when the commit applies (successors it creates in the same commit
/// included), of the machines listed (those that declare the event). Each receives it as
/// a nested event of the commit's request.
#[derive(Debug, Clone, PartialEq)]
pub struct PushRelated {
    /// Predecessors or successors.
    pub on: Related,
    /// The machines whose entities receive it; related entities of other machines do not.
    pub machines: Vec<MachineName>,
    /// The event.
    pub event: EventName,
    /// Its parameters.
    pub params: Value,
}
