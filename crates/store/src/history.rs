//! An entity's append-only history: one [`HistoryRow`] per state entry, rejection, fault or
//! command, of a [`HistoryKind`].

use settle_core::{ActionName, EventName, StateName};

use crate::Millis;

/// What a history row records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HistoryKind {
    /// The entity was created and entered its initial state.
    Create,
    /// An event's action moved the entity.
    Event,
    /// An auto action moved the entity (including re-entry for a retry).
    Auto,
    /// An event was rejected; nothing changed.
    Rejected,
    /// An action failed (error, panic, refused or failed commit); see `detail`.
    Fault,
    /// An operator command (pause, resume, sleep, kill, release, retry); see `detail`.
    Command,
    /// An internal transition: an event's action committed its effects without leaving or
    /// entering any state.
    Internal,
    /// An event was accepted and dropped (`ignore`); nothing changed.
    Ignored,
    /// A limit held the entity's auto action back (it went into the limit's line) or let it
    /// start (admitted from the line); see `detail`. Its state did not change.
    Limit,
}

impl HistoryKind {
    /// The lowercase name stored in the `kind` column.
    pub fn as_str(self) -> &'static str {
        match self {
            HistoryKind::Create => "create",
            HistoryKind::Event => "event",
            HistoryKind::Auto => "auto",
            HistoryKind::Rejected => "rejected",
            HistoryKind::Fault => "fault",
            HistoryKind::Command => "command",
            HistoryKind::Internal => "internal",
            HistoryKind::Ignored => "ignored",
            HistoryKind::Limit => "limit",
        }
    }
    /// Parses the stored name.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "create" => HistoryKind::Create,
            "event" => HistoryKind::Event,
            "auto" => HistoryKind::Auto,
            "rejected" => HistoryKind::Rejected,
            "fault" => HistoryKind::Fault,
            "command" => HistoryKind::Command,
            "internal" => HistoryKind::Internal,
            "ignored" => HistoryKind::Ignored,
            "limit" => HistoryKind::Limit,
            _ => return None,
        })
    }
}

/// One row of an entity's append-only transition history.
#[derive(Debug, Clone, PartialEq)]
pub struct HistoryRow {
    /// Store-assigned, increasing.
    pub id: i64,
    /// The entity.
    pub entity_id: i64,
    /// The state before (`None` on creation).
    pub from: Option<StateName>,
    /// The state entered (`None` when nothing was entered: rejections, failed events).
    pub to: Option<StateName>,
    /// What happened.
    pub kind: HistoryKind,
    /// The action that ran, if any.
    pub action: Option<ActionName>,
    /// The event processed, if any.
    pub event: Option<EventName>,
    /// Retry count of the entry.
    pub retry: u32,
    /// The request that caused it.
    pub request_id: Option<String>,
    /// When it was committed.
    pub at: Millis,
    /// Rejection reason or error text.
    pub detail: Option<String>,
}
