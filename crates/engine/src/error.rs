//! Errors of the engine's API. A rejected event is not an error: see [`crate::EventOutcome`].

use std::time::Duration;

use settle_core::{RaiseError, Refusal, Report};

/// Why the engine could not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The machine is not registered with this engine.
    #[error("unknown machine `{0}`")]
    UnknownMachine(String),
    /// The machine declares no schedule of this name.
    #[error("machine `{machine}` has no schedule `{name}`")]
    UnknownSchedule {
        /// Machine.
        machine: String,
        /// The schedule's name.
        name: String,
    },
    /// No entity with this machine and key.
    #[error("no entity `{key}` of machine `{machine}`")]
    NotFound {
        /// Machine.
        machine: String,
        /// Key.
        key: String,
    },
    /// An entity with this machine and key exists already.
    #[error("entity `{key}` of machine `{machine}` already exists")]
    AlreadyExists {
        /// Machine.
        machine: String,
        /// Key.
        key: String,
    },
    /// The request id (idempotency key) was used before for another request: a replay
    /// must ask for the same thing on the same entity.
    #[error("request id `{request_id}` was used before for `{used_for}` on `{entity}`")]
    KeyReused {
        /// The request id.
        request_id: String,
        /// What the first request asked (`server.create`, `server:new`, ...).
        used_for: String,
        /// The entity of the first request (`machine/key`).
        entity: String,
    },
    /// The event cannot be raised (unknown event, bad parameters).
    #[error(transparent)]
    Raise(#[from] RaiseError),
    /// The new entity's properties break its initial state's invariant.
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// A machine definition is invalid.
    #[error("invalid machine definition:\n{0}")]
    Invalid(Report),
    /// Actions that need an implementation have none bound.
    #[error("no handler bound for {}", .0.join(", "))]
    MissingHandlers(Vec<String>),
    /// A definition uses what this engine cannot run (named in the message).
    #[error("machine `{machine}`: {what}")]
    Unsupported {
        /// Machine.
        machine: String,
        /// What, and what to do instead.
        what: String,
    },
    /// A handler was bound to an action its machine does not declare.
    #[error("handler bound to unknown action `{action}` of machine `{machine}`")]
    UnknownAction {
        /// Machine.
        machine: String,
        /// Action.
        action: String,
    },
    /// The wait ran out; the request is durable and will still be processed.
    #[error("timed out after {waited:?} waiting for request {request_id}; it is still queued and will be processed")]
    Timeout {
        /// The request.
        request_id: String,
        /// How long we waited.
        waited: Duration,
    },
    /// A new machine definition does not fit the live entities: some are in (or, pinned,
    /// may come to rest in) a state it has no home for. Nothing was stored or moved.
    #[error("definition upgrade refused: {message}")]
    UpgradeRefused {
        /// What has no home, with the first keys of each state.
        message: String,
        /// The stranded entities, by state.
        stranded: Vec<Stranded>,
    },
    /// The entity was killed.
    #[error("entity `{key}` of machine `{machine}` was killed")]
    Killed {
        /// Machine.
        machine: String,
        /// Key.
        key: String,
    },
    /// An agent's heartbeat or report was refused: its lease is not held, the task is
    /// unknown or of a queue the caller does not serve, or the report does not fit the
    /// action; nothing changed.
    #[error(transparent)]
    Task(#[from] settle_store::TaskRefusal),
    /// Another instance is pruning the database (PostgreSQL: one at a time).
    #[error("another instance is pruning this database now; try again when it is done")]
    PruneBusy,
    /// Writing the archive failed: the entities it was for were not removed.
    #[error("archiving to {}: {message}; nothing was removed", dir.display())]
    Archive {
        /// The archive directory.
        dir: std::path::PathBuf,
        /// What failed.
        message: String,
    },
    /// A machine archives what retention removes, and the deployment has no archive.
    #[error(
        "machine `{0}` archives the entities retention removes ([retention] archive = true), but no archive \
         directory is set (--archive DIR, SETTLE_ARCHIVE, Config::archive)"
    )]
    NoArchive(String),
    /// The engine is shutting down.
    #[error("engine stopped")]
    Stopped,
    /// Narrowing a page by an expression or an error text took longer than the engine
    /// allows ([`Config::narrow_budget`](crate::Config::narrow_budget)); it stopped.
    #[error(
        "evaluating the filter took over {budget:?} on this page ({examined} entities examined): narrow it by \
         machine, state, status or key prefix, or simplify the expression"
    )]
    TooCostly {
        /// How many rows it examined before it stopped.
        examined: usize,
        /// The budget.
        budget: Duration,
    },
    /// What a request would store is larger than the engine keeps (`field`: its part).
    #[error("{field}: {reason}")]
    TooLarge {
        /// The part at fault (`properties`).
        field: String,
        /// How large, and the limit.
        reason: String,
    },
    /// The engine was started read-only ([`Config::read_only`](crate::Config::read_only)):
    /// it writes nothing.
    #[error("this engine is read-only: it writes nothing ({0} refused)")]
    ReadOnly(&'static str),
    /// No operation has this request id.
    #[error("no operation with request id `{0}`")]
    UnknownOperation(String),
    /// The operation to cancel has ended: nothing of it is left to stop.
    #[error("operation `{request_id}` has ended ({outcome}): nothing of it is left to cancel")]
    OperationEnded {
        /// Its request id.
        request_id: String,
        /// How it ended.
        outcome: String,
    },
    /// A bulk operation asked for what it cannot do (the message names the field).
    #[error("bulk operation: {0}")]
    Bulk(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] settle_store::Error),
}

/// Result with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Live entities a refused version would strand: in `state` (or, working in it, could
/// come to rest in `rest`), which the new version has no home for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stranded {
    /// The machine.
    pub machine: String,
    /// The state they are in.
    pub state: String,
    /// For pinned entities still working: the state they may come to rest in.
    pub rest: Option<String>,
    /// How many.
    pub count: u64,
    /// The keys of the first of them (up to ten).
    pub keys: Vec<String>,
}
