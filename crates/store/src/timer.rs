//! Timers are rows: the timers an entity should have after a commit ([`TimerPlan`]) and the
//! timers stored ([`TimerRow`]).

use settle_core::EventName;

use crate::Millis;

/// A timer an entity should have after a commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimerPlan {
    /// Unique per entity.
    pub name: String,
    /// The event it raises.
    pub event: EventName,
    /// When it is next due.
    pub due_at: Millis,
    /// Period, for periodic timers.
    pub every_ms: Option<i64>,
    /// Reset the due time even if the timer exists (a new state entry); otherwise an
    /// existing timer keeps its schedule.
    pub restart: bool,
}

/// A stored timer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimerRow {
    /// The entity.
    pub entity_id: i64,
    /// The timer's name.
    pub name: String,
    /// The event it raises.
    pub event: EventName,
    /// When it is next due.
    pub due_at: Millis,
    /// Period, for periodic timers.
    pub every_ms: Option<i64>,
}
