//! settle-store: where Settle keeps everything.
//!
//! One [`Store`] trait, implemented by [`SqliteStore`] (embedded, default) and [`PgStore`]
//! (PostgreSQL, many engine instances on one database), chosen at run time through
//! [`AnyStore`], and checked by one conformance suite that every implementation must pass
//! (`conformance`, built with the `testing` feature). Only this crate knows SQL.
//!
//! Writes go through [`Store::write`]: a [`Batch`] of independent, individually atomic
//! operations committed in one transaction (group commit), optionally followed by a claim
//! of due entities in the same transaction.

mod any;
mod batch;
mod bulk;
mod changes;
pub mod clock;
#[cfg(feature = "testing")]
pub mod conformance;
mod connections;
mod decode;
mod detail;
mod entity;
pub mod feed;
mod history;
mod inbox;
mod limit;
mod machine;
mod operation;
mod page;
mod plan;
pub mod postgres;
mod prune;
mod report;
mod schedule;
mod sql;
pub mod sqlite;
mod task;
mod telemetry;
mod timer;
mod trace;
mod why;

use std::future::Future;
use std::sync::Arc;

pub use any::{AnyStore, is_postgres_url};
pub use batch::{
    Acquire, AfterCommit, Applied, Batch, BatchResult, Cancel, CancelOutcome, Claim, Claimed, Commit, Fence, Op,
    OpError, Rate, SlotAsk, SqlStatement, Trigger, Undo,
};
pub use bulk::{BulkAdvance, BulkRow};
pub use changes::{Changed, Changes};
pub use clock::{Clock, ManualClock, SharedClock, SystemClock};
pub use detail::{ErrorRow, OperationTrace};
pub use entity::{
    COMMANDS, Command, EntityFilter, EntityOrder, EntityRow, NewEntity, RunStatus, SuccessorSnapshot, command_applies,
};
pub use feed::{FeedFilter, FeedItem, FeedPage, FeedPos};
pub use history::{HistoryKind, HistoryRow};
pub use inbox::{InboxItem, InboxKind, Push, PushRelated, Reply};
pub use limit::{EntityLimit, LimitUsage};
pub use machine::{Deploy, MachineRecord, Moves, NewVersion, StateMove, current_versions};
pub use operation::{OpenOperation, OperationFilter, OperationRow, OperationWindow};
pub use postgres::PgStore;
pub use prune::{Prune, PruneRule, Pruned, PrunedEntity, PrunedRows, Storage, Trim};
pub use report::{
    EntityCount, ErrorStats, MetricsSnapshot, MinuteCount, OperationStats, Overview, Stats, TransitionCount,
    TransitionStats, percentile,
};
pub use schedule::{ScheduleAdvance, ScheduleRow};
pub use sqlite::SqliteStore;
pub use task::{AgentReport, AgentTask, TaskCheck, TaskFilter, TaskOffer, TaskRefusal, TaskResult};
pub use telemetry::{CauseRef, ErrorRecord, EventRecord, EventRow, Telemetry, TransitionRecord};
pub use timer::{TimerPlan, TimerRow};
pub use why::{Failure, Why, why};

/// Milliseconds since the Unix epoch: every time the store keeps. Properties and parameters
/// are JSON, stored as text, so every backend agrees.
pub type Millis = i64;

/// A store failure: the operation as a whole could not be carried out.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The database reported an error.
    #[error("database error: {0}")]
    Db(String),
    /// The database file could not be opened or prepared.
    #[error("cannot open database `{path}`: {message}")]
    Open {
        /// Path or URL.
        path: String,
        /// Why.
        message: String,
    },
    /// Another engine process holds this database.
    #[error("another settle engine is running on `{path}` (lock held on `{lock}`)")]
    Locked {
        /// Database path.
        path: String,
        /// Lock file path.
        lock: String,
    },
    /// The database was written by a newer Settle.
    #[error("database schema version {found} is newer than this settle supports ({supported})")]
    SchemaTooNew {
        /// Version found.
        found: i64,
        /// Newest version known.
        supported: i64,
    },
    /// Stored data could not be decoded.
    #[error("corrupt stored data: {0}")]
    Corrupt(String),
    /// The store's writer has stopped (after a fatal error or shutdown).
    #[error("store writer stopped")]
    Closed,
}

/// Waits until a batch [`Store::write_committed`] answered is durable; an error if it
/// cannot be made so (nothing of it may then be told to anyone).
pub type Durability = std::pin::Pin<Box<dyn Future<Output = Result<()>> + Send>>;

/// Result with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The persistence boundary of Settle. Implementations must pass the conformance suite
/// (`conformance`, with the `testing` feature).
///
/// All methods are safe to call concurrently. [`Store::write`] is the only way entities,
/// inboxes and history change.
pub trait Store: Send + Sync + 'static {
    /// Applies a batch in one transaction; see [`Batch`].
    fn write(&self, batch: Batch) -> impl Future<Output = Result<BatchResult>> + Send;

    /// The entity `key` of `machine`.
    fn entity_get(&self, machine: &str, key: &str) -> impl Future<Output = Result<Option<EntityRow>>> + Send;
    /// Entities matching `filter`, by id.
    fn entity_list(&self, filter: EntityFilter) -> impl Future<Output = Result<Vec<EntityRow>>> + Send;
    /// Number of entities per state of `machine`.
    fn entity_count_by_state(&self, machine: &str) -> impl Future<Output = Result<Vec<(String, u64)>>> + Send;
    /// Number of entities with pending work (a due time set).
    fn entity_count_pending(&self) -> impl Future<Output = Result<u64>> + Send;
    /// The history of an entity, oldest first.
    fn history_list(&self, entity_id: i64) -> impl Future<Output = Result<Vec<HistoryRow>>> + Send;
    /// The successors of an entity and its newest change notice, in one snapshot.
    fn successor_snapshot(&self, entity_id: i64) -> impl Future<Output = Result<SuccessorSnapshot>> + Send;
    /// The timers of an entity, by name.
    fn timer_list(&self, entity_id: i64) -> impl Future<Output = Result<Vec<TimerRow>>> + Send;
    /// The events waiting in an entity's inbox, in processing order.
    fn inbox_list(&self, entity_id: i64) -> impl Future<Output = Result<Vec<InboxItem>>> + Send;
    /// The entities that have this entity as a successor, by id.
    fn predecessor_list(&self, entity_id: i64) -> impl Future<Output = Result<Vec<EntityRow>>> + Send;
    /// The entity's newest `limit` recorded errors, newest first.
    fn error_list(&self, entity_id: i64, limit: u64) -> impl Future<Output = Result<Vec<ErrorRow>>> + Send;
    /// The newest recorded error of each of these entities that has one, as (entity id,
    /// error), in the order asked: one index read each, in one call.
    fn error_newest(&self, entity_ids: Vec<i64>) -> impl Future<Output = Result<Vec<(i64, ErrorRow)>>> + Send;
    /// What the operation of `request_id` touched: up to `limit` entities (its own first
    /// among them, then those its events reached) and their history rows carrying the
    /// request id. Empty when no such operation exists.
    fn operation_trace(&self, request_id: &str, limit: u64) -> impl Future<Output = Result<OperationTrace>> + Send;
    /// The entities the operation of `request_id` reached (its own, those its events
    /// reached, those it created), in id order after id `after`, at most `limit`: what
    /// canceling it goes through. Empty when no such operation exists.
    fn operation_reached(
        &self,
        request_id: &str,
        after: Option<i64>,
        limit: u64,
    ) -> impl Future<Output = Result<Vec<EntityRow>>> + Send;

    /// Writes a deploy whole, in one transaction: every version of `deploy.versions` stored
    /// as its machine's current one (one stored before, by name and hash, is deployed again:
    /// a roll back makes it current again), then every machine's entities moved (see
    /// [`Moves`]: for each move, every entity no engine holds in `from` under `version`
    /// lands in `to`; a renamed state is recorded in history, its entity's version bumped
    /// and an open agent task kept for the new state; a state that stays changes only the
    /// version; an entity held now moves with its next commit, the engine's), then
    /// `deploy.meta`. A failure, or a crash, leaves none of it. Returns how many entities
    /// moved, per [`Moves`] in order.
    fn machine_deploy(&self, deploy: Deploy) -> impl Future<Output = Result<Vec<u64>>> + Send;
    /// All stored machine definition versions.
    fn machine_list(&self) -> impl Future<Output = Result<Vec<MachineRecord>>> + Send;
    /// Every concurrency limit's key values with slots in use or work waiting, by limit
    /// and key.
    fn limit_list(&self) -> impl Future<Output = Result<Vec<LimitUsage>>> + Send;
    /// The slots entity `entity_id` holds and the line it waits in, if any.
    fn limit_of(&self, entity_id: i64) -> impl Future<Output = Result<Vec<EntityLimit>>> + Send;

    /// Reads a small named value (application metadata, e.g. the demo's settings).
    fn meta_get(&self, key: &str) -> impl Future<Output = Result<Option<String>>> + Send;
    /// Writes a small named value durably.
    fn meta_put(&self, key: &str, value: &str) -> impl Future<Output = Result<()>> + Send;

    /// Runs application SQL (e.g. `CREATE TABLE` for tables that actions write to) outside
    /// any batch. Not for entity data, which only changes through [`Store::write`].
    fn sql_execute(&self, sql: &str) -> impl Future<Output = Result<()>> + Send;

    /// Gives space that deletes freed back to the file system, at most `max_pages` pages at
    /// a time, and says how many pages went back: SQLite's incremental vacuum (a database
    /// Settle creates has `auto_vacuum = INCREMENTAL`; one an earlier version created keeps
    /// its free pages for reuse until it is converted, see the README). PostgreSQL reuses
    /// the space a vacuum frees and answers 0; where autovacuum is off or behind, each
    /// call vacuums the table of Settle's with the most dead rows (README "Retention").
    fn reclaim_space(&self, max_pages: u64) -> impl Future<Output = Result<u64>> + Send;

    /// Rows per table and the database's size in bytes (counted: for benchmarks, checks
    /// and operators, not for a hot path).
    fn storage(&self) -> impl Future<Output = Result<Storage>> + Send;

    /// The operation opened with `request_id`.
    fn operation_get(&self, request_id: &str) -> impl Future<Output = Result<Option<OperationRow>>> + Send;
    /// Those of the operations of `request_ids` that have ended (in no particular order):
    /// one read for callers waiting on many operations.
    fn operations_ended(&self, request_ids: Vec<String>) -> impl Future<Output = Result<Vec<OperationRow>>> + Send;
    /// Operations, newest first, optionally only those with `outcome` (`open` for the
    /// unfinished ones), at most `limit`: the first [`Store::operation_page`].
    fn operation_list(
        &self,
        outcome: Option<String>,
        limit: u64,
    ) -> impl Future<Output = Result<Vec<OperationRow>>> + Send {
        self.operation_page(outcome, None, limit)
    }
    /// A page of operations, newest first, older than operation `before` (its store id;
    /// `None`: the newest), optionally only those with `outcome` (`open`: not ended).
    fn operation_page(
        &self,
        outcome: Option<String>,
        before: Option<i64>,
        limit: u64,
    ) -> impl Future<Output = Result<Vec<OperationRow>>> + Send;
    /// A page of operations of a bounded cost: of the `window` operations older than
    /// `before` (store id; `None`: the newest), newest first, those passing `filter`, at
    /// most `limit`, and the oldest id the window looked at when it was full.
    fn operation_scan(
        &self,
        filter: OperationFilter,
        before: Option<i64>,
        window: u64,
        limit: u64,
    ) -> impl Future<Output = Result<OperationWindow>> + Send;
    /// Number of entities of `machine` per (definition version, state); an entity with no
    /// version recorded counts under `""`.
    fn entity_count_by_version(&self, machine: &str)
    -> impl Future<Output = Result<Vec<(String, String, u64)>>> + Send;
    /// Machine definition versions with how many entities last ran under each.
    fn machine_versions(&self) -> impl Future<Output = Result<Vec<(MachineRecord, u64)>>> + Send;

    /// The processed events of an entity (the `events` telemetry table), oldest first.
    fn events_list(&self, entity_id: i64) -> impl Future<Output = Result<Vec<EventRow>>> + Send;
    /// The processed events with these ids (inbox ids), those that exist, in any order.
    fn events_by_id(&self, ids: Vec<i64>) -> impl Future<Output = Result<Vec<EventRow>>> + Send;
    /// The entities with these ids, those that exist, in any order.
    fn entities_by_id(&self, ids: Vec<i64>) -> impl Future<Output = Result<Vec<EntityRow>>> + Send;
    /// Key performance indicators from the telemetry tables: per operation name (started at
    /// or after `since`), per machine transition and the ten most frequent errors (both at
    /// or after `since`); `None`: all time.
    fn stats(&self, since: Option<Millis>) -> impl Future<Output = Result<Stats>> + Send;
    /// Counters and gauges for a metrics exposition; `now` decides which due times have
    /// passed (the due backlog).
    fn metrics_snapshot(&self, now: Millis) -> impl Future<Output = Result<MetricsSnapshot>> + Send;
    /// The fleet at a glance, from the counts every commit keeps (entities per machine,
    /// state and run status; operations per outcome; transitions and errors per minute at
    /// or after `since`) and the index of due work (`now` decides what is due): its cost
    /// does not grow with the number of entities.
    fn overview(&self, now: Millis, since: Millis) -> impl Future<Output = Result<Overview>> + Send;

    /// Agent tasks matching `filter`, newest first.
    fn task_list(&self, filter: TaskFilter) -> impl Future<Output = Result<Vec<AgentTask>>> + Send;

    /// How many entities match `filter` (its `limit` and cursors aside), counted through
    /// the index its page would read, up to `bound`: `bound + 1` means more than `bound`.
    fn entity_count(&self, filter: EntityFilter, bound: u64) -> impl Future<Output = Result<u64>> + Send;

    /// Starts bulk operation `row`, unless its request id was used before: the stored row,
    /// and whether it is new (see [`bulk`](crate::BulkRow)).
    fn bulk_start(&self, row: BulkRow) -> impl Future<Output = Result<(BulkRow, bool)>> + Send;
    /// The bulk operation `request_id`.
    fn bulk_get(&self, request_id: &str) -> impl Future<Output = Result<Option<BulkRow>>> + Send;
    /// The newest `limit` bulk operations, newest first.
    fn bulk_list(&self, limit: u64) -> impl Future<Output = Result<Vec<BulkRow>>> + Send;
    /// Leases the oldest running bulk operation not leased by another instance (or whose
    /// lease ended before `now`) to `owner` until `lease_until`.
    fn bulk_claim(
        &self,
        owner: &str,
        now: Millis,
        lease_until: Millis,
    ) -> impl Future<Output = Result<Option<BulkRow>>> + Send;
    /// Writes a page's progress; `false` when `owner` no longer holds it running (canceled,
    /// or taken over).
    fn bulk_advance(&self, advance: BulkAdvance) -> impl Future<Output = Result<bool>> + Send;
    /// Cancels the bulk operation `request_id` if it runs: the row after (`None`: none such).
    fn bulk_cancel(&self, request_id: &str, now: Millis) -> impl Future<Output = Result<Option<BulkRow>>> + Send;

    /// Every calendar schedule's progress, by machine and name (see
    /// [`ScheduleRow`]).
    fn schedule_list(&self) -> impl Future<Output = Result<Vec<ScheduleRow>>> + Send;
    /// Stores schedule `row` unless it is stored following the same declaration (`spec`);
    /// one stored with another starts again from `row`'s first fire, its counts kept. The
    /// row stored.
    fn schedule_sync(&self, row: ScheduleRow) -> impl Future<Output = Result<ScheduleRow>> + Send;
    /// Leases schedule `machine`/`name` to `owner` until `lease_until` if it has something
    /// to do at `now` (a fire due or held), is not paused, and no other instance holds it.
    fn schedule_claim(
        &self,
        machine: &str,
        name: &str,
        owner: &str,
        now: Millis,
        lease_until: Millis,
    ) -> impl Future<Output = Result<Option<ScheduleRow>>> + Send;
    /// Writes the lease holder's decision and lets go; `false` if it no longer held it.
    fn schedule_advance(&self, advance: ScheduleAdvance) -> impl Future<Output = Result<bool>> + Send;
    /// Pauses a schedule, or resumes it from `next_fire` (run at `next_at`), dropping a
    /// held fire: the row after (`None`: no such schedule).
    fn schedule_pause(
        &self,
        machine: &str,
        name: &str,
        paused: bool,
        next: (Millis, Millis),
        now: Millis,
    ) -> impl Future<Output = Result<Option<ScheduleRow>>> + Send;
    /// Whether the fire with request id `fire_id` still runs: its operation, or one of those
    /// under it (`fire_id/…`), has not ended, or a bulk operation under it still runs.
    fn schedule_running(&self, fire_id: &str) -> impl Future<Output = Result<bool>> + Send;

    /// The change feed after `after`: at most `limit` (up to [`feed::MAX_PAGE`]) history
    /// rows and operation ends matching `filter`, in the order they committed, and the
    /// position to read on from. Nothing can later commit at or before that position.
    fn feed_read(
        &self,
        after: FeedPos,
        filter: FeedFilter,
        limit: usize,
    ) -> impl Future<Output = Result<FeedPage>> + Send;
    /// Where the feed is now: a reader starting here gets what commits from now on.
    fn feed_head(&self) -> impl Future<Output = Result<FeedPos>> + Send;

    /// Whether this handle is the only engine on the store (SQLite's exclusive engine
    /// lock). An exclusive engine may reclaim every lease at start.
    fn exclusive(&self) -> bool;

    /// The clock of the engine that writes through this handle. A batch carries the time
    /// it was decided at (`Batch::now`); a store that re-runs a batch later (PostgreSQL,
    /// after a lost connection) moves that time on by this clock, never by the system's.
    /// Default: the system clock; the engine's builder hands its own.
    fn use_clock(&self, _clock: SharedClock) {}

    /// Drops every lease held by anyone; those entities become due now. Only for a caller
    /// that knows no other engine uses the store (SQLite's exclusive engine lock).
    fn lease_release_all(&self, now: Millis) -> impl Future<Output = Result<u64>> + Send;

    /// Notified when another process may have made work due (PostgreSQL's `LISTEN`): the
    /// engine then claims at once instead of at its next poll. `None`: nothing tells.
    fn wakeup(&self) -> Option<Arc<tokio::sync::Notify>> {
        None
    }

    /// Applies a batch as [`Store::write`] does, but may answer once it is committed and
    /// before it is durable, with what then makes it durable: whoever tells a caller of the
    /// batch's results waits for that first (`None`: durable already, as after `write`).
    /// An engine acts on the results at once and answers its callers once the batch is
    /// durable, so that its next batch is written while the last one syncs. Reads of the
    /// store still see only what is durable.
    fn write_committed(&self, batch: Batch) -> impl Future<Output = Result<(BatchResult, Option<Durability>)>> + Send {
        async move { Ok((self.write(batch).await?, None)) }
    }

    /// The entities other processes change, batch by batch, as they commit (PostgreSQL's
    /// `NOTIFY`), so that callers waiting in this process are answered whichever instance
    /// did the work. `None`: no other process writes (SQLite's exclusive engine lock).
    fn changes(&self) -> Option<tokio::sync::broadcast::Receiver<Changes>> {
        None
    }
}
