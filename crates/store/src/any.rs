//! [`AnyStore`]: the store a `--db` argument names, SQLite or PostgreSQL, behind one type.

use std::sync::Arc;

use crate::{
    AgentTask, Batch, BatchResult, EntityFilter, EntityRow, ErrorRow, EventRow, HistoryRow, InboxItem, MachineRecord,
    MetricsSnapshot, Millis, OperationRow, OperationTrace, Overview, PgStore, Result, SqliteStore, Stats, Store,
    SuccessorSnapshot, TaskFilter, TimerRow,
};

/// Either backend, chosen at run time from a database argument: a `postgres://` or
/// `postgresql://` URL selects PostgreSQL, anything else is a SQLite file path.
#[derive(Debug, Clone)]
pub enum AnyStore {
    /// The embedded SQLite file.
    Sqlite(SqliteStore),
    /// A PostgreSQL database shared by many instances.
    Postgres(PgStore),
}

/// Whether `db` names a PostgreSQL database (a `postgres://` or `postgresql://` URL).
pub fn is_postgres_url(db: &str) -> bool {
    db.starts_with("postgres://") || db.starts_with("postgresql://")
}

impl AnyStore {
    /// Opens `db` for an engine (see [`SqliteStore::open`], [`PgStore::open`]).
    pub fn open(db: &str) -> Result<Self> {
        if is_postgres_url(db) {
            Ok(AnyStore::Postgres(PgStore::open(db)?))
        } else {
            Ok(AnyStore::Sqlite(SqliteStore::open(db)?))
        }
    }

    /// Opens an existing `db` for reading only.
    pub fn open_read_only(db: &str) -> Result<Self> {
        if is_postgres_url(db) {
            Ok(AnyStore::Postgres(PgStore::open_read_only(db)?))
        } else {
            Ok(AnyStore::Sqlite(SqliteStore::open_read_only(db)?))
        }
    }

    /// Where the data is: the file path, or the URL with its password hidden.
    pub fn location(&self) -> String {
        match self {
            AnyStore::Sqlite(s) => s.path().display().to_string(),
            AnyStore::Postgres(s) => s.url().to_string(),
        }
    }
}

/// Implements each listed [`Store`] method by calling the same method of the backend.
macro_rules! delegate {
    ($(fn $name:ident(&self $(, $arg:ident: $ty:ty)*) -> $ret:ty;)*) => {
        $(
            async fn $name(&self $(, $arg: $ty)*) -> Result<$ret> {
                match self {
                    AnyStore::Sqlite(s) => s.$name($($arg),*).await,
                    AnyStore::Postgres(s) => s.$name($($arg),*).await,
                }
            }
        )*
    };
}

impl Store for AnyStore {
    delegate! {
        fn write(&self, batch: Batch) -> BatchResult;
        fn entity_get(&self, machine: &str, key: &str) -> Option<EntityRow>;
        fn entity_list(&self, filter: EntityFilter) -> Vec<EntityRow>;
        fn entity_count_by_state(&self, machine: &str) -> Vec<(String, u64)>;
        fn entity_count_pending(&self) -> u64;
        fn history_list(&self, entity_id: i64) -> Vec<HistoryRow>;
        fn successor_snapshot(&self, entity_id: i64) -> SuccessorSnapshot;
        fn timer_list(&self, entity_id: i64) -> Vec<TimerRow>;
        fn task_list(&self, filter: TaskFilter) -> Vec<AgentTask>;
        fn inbox_list(&self, entity_id: i64) -> Vec<InboxItem>;
        fn predecessor_list(&self, entity_id: i64) -> Vec<EntityRow>;
        fn error_list(&self, entity_id: i64, limit: u64) -> Vec<ErrorRow>;
        fn error_newest(&self, entity_ids: Vec<i64>) -> Vec<(i64, ErrorRow)>;
        fn operation_trace(&self, request_id: &str, limit: u64) -> OperationTrace;
        fn operation_reached(&self, request_id: &str, after: Option<i64>, limit: u64) -> Vec<EntityRow>;
        fn machine_deploy(&self, deploy: crate::Deploy) -> Vec<u64>;
        fn machine_list(&self) -> Vec<MachineRecord>;
        fn limit_list(&self) -> Vec<crate::LimitUsage>;
        fn limit_of(&self, entity_id: i64) -> Vec<crate::EntityLimit>;
        fn meta_get(&self, key: &str) -> Option<String>;
        fn meta_put(&self, key: &str, value: &str) -> ();
        fn sql_execute(&self, sql: &str) -> ();
        fn reclaim_space(&self, max_pages: u64) -> u64;
        fn storage(&self) -> crate::Storage;
        fn operation_get(&self, request_id: &str) -> Option<OperationRow>;
        fn operations_ended(&self, request_ids: Vec<String>) -> Vec<OperationRow>;
        fn operation_page(&self, outcome: Option<String>, before: Option<i64>, limit: u64) -> Vec<OperationRow>;
        fn operation_scan(&self, filter: crate::OperationFilter, before: Option<i64>, window: u64, limit: u64) -> crate::OperationWindow;
        fn entity_count_by_version(&self, machine: &str) -> Vec<(String, String, u64)>;
        fn machine_versions(&self) -> Vec<(MachineRecord, u64)>;
        fn events_list(&self, entity_id: i64) -> Vec<EventRow>;
        fn events_by_id(&self, ids: Vec<i64>) -> Vec<EventRow>;
        fn entities_by_id(&self, ids: Vec<i64>) -> Vec<EntityRow>;
        fn stats(&self, since: Option<Millis>) -> Stats;
        fn metrics_snapshot(&self, now: Millis) -> MetricsSnapshot;
        fn overview(&self, now: Millis, since: Millis) -> Overview;
        fn lease_release_all(&self, now: Millis) -> u64;
        fn entity_count(&self, filter: EntityFilter, bound: u64) -> u64;
        fn bulk_start(&self, row: crate::BulkRow) -> (crate::BulkRow, bool);
        fn bulk_get(&self, request_id: &str) -> Option<crate::BulkRow>;
        fn bulk_list(&self, limit: u64) -> Vec<crate::BulkRow>;
        fn bulk_claim(&self, owner: &str, now: Millis, lease_until: Millis) -> Option<crate::BulkRow>;
        fn bulk_advance(&self, advance: crate::BulkAdvance) -> bool;
        fn bulk_cancel(&self, request_id: &str, now: Millis) -> Option<crate::BulkRow>;
        fn schedule_list(&self) -> Vec<crate::ScheduleRow>;
        fn schedule_sync(&self, row: crate::ScheduleRow) -> crate::ScheduleRow;
        fn schedule_claim(&self, machine: &str, name: &str, owner: &str, now: Millis, lease_until: Millis) -> Option<crate::ScheduleRow>;
        fn schedule_advance(&self, advance: crate::ScheduleAdvance) -> bool;
        fn schedule_pause(&self, machine: &str, name: &str, paused: bool, next: (Millis, Millis), now: Millis) -> Option<crate::ScheduleRow>;
        fn schedule_running(&self, fire_id: &str) -> bool;
        fn feed_read(&self, after: crate::FeedPos, filter: crate::FeedFilter, limit: usize) -> crate::FeedPage;
        fn feed_head(&self) -> crate::FeedPos;
    }

    fn exclusive(&self) -> bool {
        match self {
            AnyStore::Sqlite(s) => s.exclusive(),
            AnyStore::Postgres(s) => s.exclusive(),
        }
    }

    fn use_clock(&self, clock: crate::SharedClock) {
        match self {
            AnyStore::Sqlite(s) => s.use_clock(clock),
            AnyStore::Postgres(s) => s.use_clock(clock),
        }
    }
    fn wakeup(&self) -> Option<Arc<tokio::sync::Notify>> {
        match self {
            AnyStore::Sqlite(s) => s.wakeup(),
            AnyStore::Postgres(s) => s.wakeup(),
        }
    }
    async fn write_committed(&self, batch: Batch) -> Result<(BatchResult, Option<crate::Durability>)> {
        match self {
            AnyStore::Sqlite(s) => s.write_committed(batch).await,
            AnyStore::Postgres(s) => s.write_committed(batch).await,
        }
    }
    fn changes(&self) -> Option<tokio::sync::broadcast::Receiver<crate::Changes>> {
        match self {
            AnyStore::Sqlite(s) => s.changes(),
            AnyStore::Postgres(s) => s.changes(),
        }
    }
}
