//! Removing what retention lets go, as an operation of a batch ([`Op::Prune`](crate::Op)):
//! entities ended long enough ago with every row they left in any table, ended operations
//! (and with them their request ids' replay window), finished agent tasks and per-minute
//! counts past their time. Small batches, so the writer is never held long; the engine
//! decides the cut-off times from the definitions' retention and its clock
//! (`settle_core::retention`), the store applies them.

use crate::Millis;

/// A live entity's past trimmed with a commit ([`crate::Commit::trim`]): its history rows,
/// processed events and errors (with their exceptions) older than `before` or beyond its
/// latest `rows` of each go; its latest of each, and the event of the workflow it is in
/// (and any still running), stay.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Trim {
    /// Rows written before this time go (`None`: none by age).
    pub before: Option<Millis>,
    /// Rows beyond the latest this many go (`None`: none by count; at least 1).
    pub rows: Option<u32>,
}

/// One round of pruning: at most [`Prune::limit`] entities and, of each other kind, at most
/// [`Prune::rows`] rows.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Prune {
    /// Per end state: entities in it that ended before a time go.
    pub ended: Vec<PruneRule>,
    /// Ended operations that ended before this time go (`None`: kept forever).
    pub operations_before: Option<Millis>,
    /// Finished agent tasks that finished before this time go (`None`: kept forever).
    pub tasks_before: Option<Millis>,
    /// Per-minute counts of minutes that began before this time go (`None`: kept).
    pub minutes_before: Option<Millis>,
    /// At most this many entities in the round (over all rules).
    pub limit: usize,
    /// At most this many rows of ended operations, of finished tasks and of minute counts.
    pub rows: usize,
    /// Count what would go, change nothing.
    pub dry_run: bool,
    /// Only choose the entities that would go, remove nothing of any kind: the first step
    /// of a round that archives them before they go ([`Pruned::rows`] is empty).
    pub choose_only: bool,
    /// Remove only these of the entities the round chooses (the second step: those
    /// archived). The other kinds go as usual.
    pub only: Option<Vec<i64>>,
}

/// The entities of one end state past their retention.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PruneRule {
    /// The machine.
    pub machine: String,
    /// One of its end states (terminal or deleted).
    pub state: String,
    /// Entities that entered it before this time may go.
    pub before: Millis,
    /// Where the previous round of this rule stopped (`ended_at`, id): the round goes on
    /// after it, past the entities it had to keep. `None`: from the start.
    pub after: Option<(Millis, i64)>,
}

/// An entity removed (or, in a dry run, that would be).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrunedEntity {
    /// Its id.
    pub id: i64,
    /// Its machine.
    pub machine: String,
    /// Its key (free to be used again).
    pub key: String,
    /// The end state it was in.
    pub state: String,
    /// When it entered that state.
    pub ended_at: Millis,
}

/// Rows removed, per table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PrunedRows {
    /// `entities`.
    pub entities: u64,
    /// `history`.
    pub history: u64,
    /// `events`.
    pub events: u64,
    /// `errors`.
    pub errors: u64,
    /// `exceptions`.
    pub exceptions: u64,
    /// `inbox`.
    pub inbox: u64,
    /// `timers`.
    pub timers: u64,
    /// `agent_tasks` (of pruned entities, and finished ones past their time).
    pub agent_tasks: u64,
    /// `successors`.
    pub successors: u64,
    /// `operations`.
    pub operations: u64,
    /// `minute_counts`.
    pub minute_counts: u64,
}

impl PrunedRows {
    /// Each table's name with its count, in a fixed order.
    pub fn tables(&self) -> [(&'static str, u64); 11] {
        [
            ("entities", self.entities),
            ("history", self.history),
            ("events", self.events),
            ("errors", self.errors),
            ("exceptions", self.exceptions),
            ("inbox", self.inbox),
            ("timers", self.timers),
            ("agent_tasks", self.agent_tasks),
            ("successors", self.successors),
            ("operations", self.operations),
            ("minute_counts", self.minute_counts),
        ]
    }

    /// Every row counted.
    pub fn total(&self) -> u64 {
        self.tables().iter().map(|(_, n)| n).sum()
    }

    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: &PrunedRows) {
        self.entities += other.entities;
        self.history += other.history;
        self.events += other.events;
        self.errors += other.errors;
        self.exceptions += other.exceptions;
        self.inbox += other.inbox;
        self.timers += other.timers;
        self.agent_tasks += other.agent_tasks;
        self.successors += other.successors;
        self.operations += other.operations;
        self.minute_counts += other.minute_counts;
    }
}

/// What a round of pruning did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Pruned {
    /// The entities removed.
    pub entities: Vec<PrunedEntity>,
    /// Entities past their retention kept, because an entity linked to them (a
    /// predecessor or successor) has not ended, or they still hold work.
    pub kept: u64,
    /// Rows removed, per table.
    pub rows: PrunedRows,
    /// Per rule of [`Prune::ended`], in order: where its next round goes on (`None`: it
    /// reached the end of what is past retention, start over next time).
    pub next: Vec<Option<(Millis, i64)>>,
    /// Another round would find more to remove now.
    pub more: bool,
    /// Another instance is pruning this database now (PostgreSQL): nothing was done.
    pub busy: bool,
}

/// Every table Settle keeps, for [`Storage`].
pub(crate) const TABLES: &[&str] = &[
    "entities",
    "history",
    "events",
    "errors",
    "exceptions",
    "inbox",
    "timers",
    "agent_tasks",
    "successors",
    "operations",
    "minute_counts",
    "entity_counts",
    "operation_counts",
    "machines",
    "meta",
    "limit_slots",
    "limit_holds",
    "limit_waiters",
    "limit_fair",
];

/// How much the store holds: rows per table and bytes in all (see `Store::storage`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Storage {
    /// Each table with its row count.
    pub tables: Vec<(String, u64)>,
    /// The database's size: SQLite's file (pages in use and free, without its WAL),
    /// PostgreSQL's tables with their indexes and TOAST, in the schema.
    pub bytes: u64,
}

impl Storage {
    /// Rows of every table together.
    pub fn rows(&self) -> u64 {
        self.tables.iter().map(|(_, n)| n).sum()
    }
}
