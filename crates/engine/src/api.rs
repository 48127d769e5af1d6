//! What callers of the engine send and get back: how long to wait ([`Wait`]), the options
//! of a raise, and the answers ([`EventOutcome`], [`Raised`], [`Created`], [`Commanded`]).

use std::time::Duration;

use serde_json::Value;
use settle_core::StateName;
use settle_store::{EntityRow, OperationRow};

/// How long [`Engine::raise`](crate::Engine::raise) waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// Until the event is durably queued in the entity's inbox.
    Queued,
    /// Until the event is accepted (its action committed), rejected or failed.
    Outcome,
    /// Until the entity is at rest again after the event was accepted (or the event was
    /// rejected or failed).
    Stable,
    /// Until the operation the event started has ended: every entity it reached (children
    /// it created, parents it woke, agents' tasks) is at rest again ([`Raised::operation`]
    /// holds it). For a replayed request id, until the first request's operation ended.
    Operation,
}

/// Options of [`Engine::raise`](crate::Engine::raise).
#[derive(Debug, Clone)]
pub struct RaiseOptions {
    /// The event's parameters (a JSON object, or null).
    pub params: Value,
    /// What to wait for.
    pub wait: Wait,
    /// How long to wait beyond queuing.
    pub timeout: Duration,
    /// The request id to record (generated when `None`).
    pub request_id: Option<String>,
    /// Refuse the event at once, unrecorded, when the entity is at rest and the event is
    /// not valid in its state (see [`settle_core::step::refuse_at_rest`]); the answer is
    /// then [`Raised::refused`]. Off by default: the event is queued and rejected in turn.
    pub refuse_at_rest: bool,
    /// The priority of the work the event starts (higher first in a limit's line; from
    /// -1000 to 1000). `None`: the event's declared priority, or for a bulk operation's or a
    /// schedule's event ([`RaiseOptions::background`]), that less
    /// [`settle_core::limits::BACKGROUND`].
    pub priority: Option<i64>,
    /// Raised by a bulk operation or a schedule: its default priority is lower.
    pub background: bool,
}

impl Default for RaiseOptions {
    fn default() -> Self {
        RaiseOptions {
            params: Value::Null,
            wait: Wait::Queued,
            timeout: Duration::from_secs(30),
            request_id: None,
            refuse_at_rest: false,
            priority: None,
            background: false,
        }
    }
}

impl RaiseOptions {
    /// Default options waiting for `wait`.
    pub fn wait(wait: Wait) -> Self {
        RaiseOptions { wait, ..RaiseOptions::default() }
    }
    /// Sets the parameters.
    pub fn params(mut self, params: Value) -> Self {
        self.params = params;
        self
    }
    /// Sets the timeout.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }
    /// Sets the request id: the operation's idempotency key.
    pub fn request_id(mut self, request_id: impl Into<String>) -> Self {
        self.request_id = Some(request_id.into());
        self
    }
    /// Refuses the event at once, unrecorded, if the entity is at rest and the event is
    /// not valid in its state (a replayed request id is never refused: it answers as the
    /// first time did).
    pub fn refuse_at_rest(mut self) -> Self {
        self.refuse_at_rest = true;
        self
    }
    /// Sets the priority of the work the event starts (from -1000 to 1000; higher first in
    /// a limit's line).
    pub fn priority(mut self, priority: i64) -> Self {
        self.priority = Some(priority);
        self
    }
}

/// What became of a raised event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventOutcome {
    /// The event's action committed; the entity entered `state`.
    Accepted {
        /// The state entered.
        state: StateName,
    },
    /// The event was not valid in `state`; nothing changed.
    Rejected {
        /// The state the entity was in.
        state: StateName,
        /// The declared reason, or the default one.
        reason: String,
    },
    /// The event was accepted and dropped: `state` (the entity's, or an ancestor of it)
    /// ignores it (`ignore`); nothing changed.
    Ignored {
        /// The state the entity was in.
        state: StateName,
    },
    /// The event's action failed (error, panic, refused or failed commit); nothing changed.
    Failed {
        /// What went wrong.
        error: String,
    },
}

/// The answer to [`Engine::raise`](crate::Engine::raise).
#[derive(Debug, Clone)]
pub struct Raised {
    /// The request id recorded with the event.
    pub request_id: String,
    /// The event's inbox id (`None` for a replayed request id).
    pub inbox_id: Option<i64>,
    /// The request id had been used before: nothing was raised again.
    pub replayed: bool,
    /// Refused at once and not recorded ([`RaiseOptions::refuse_at_rest`]): the entity was
    /// at rest and the event is not valid in its state; `outcome` says why.
    pub refused: bool,
    /// The outcome (unless only [`Wait::Queued`] was asked).
    pub outcome: Option<EventOutcome>,
    /// The entity when the wait ended (unless only [`Wait::Queued`] was asked).
    pub entity: Option<EntityRow>,
    /// The operation, ended ([`Wait::Operation`] only).
    pub operation: Option<OperationRow>,
}

/// The answer to [`Engine::create_with`](crate::Engine::create_with).
#[derive(Debug, Clone)]
pub struct Created {
    /// The entity (as it is now, for a replay).
    pub entity: EntityRow,
    /// The operation's request id.
    pub request_id: String,
    /// The request id had been used before: nothing was created.
    pub replayed: bool,
}

/// The answer to [`Engine::command`](crate::Engine::command).
#[derive(Debug, Clone)]
pub struct Commanded {
    /// The entity after the command (as it is now, for a replay).
    pub entity: EntityRow,
    /// The operation's request id.
    pub request_id: String,
    /// The request id had been used before: nothing was done again.
    pub replayed: bool,
}

/// How an agent's report was taken ([`Engine::agent_report`](crate::Engine::agent_report)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Report {
    /// Applied: queued durably for the entity, as the action's outcome.
    Applied,
    /// The report of this lease was applied before: this one is a replay and changed
    /// nothing (the first report stands).
    Replayed,
}
