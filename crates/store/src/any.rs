//! [`AnyStore`]: the store a `--db` argument names, SQLite or PostgreSQL, behind one type.

use std::sync::Arc;

use crate::{
    AgentTask, Batch, BatchResult, EntityFilter, EntityRow, EventRow, HistoryRow, InboxItem, MachineRecord,
    MetricsSnapshot, Millis, OperationRow, PgStore, Result, SqliteStore, Stats, Store, SuccessorSnapshot, TaskFilter,
    TimerRow,
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

macro_rules! delegate {
    ($self:ident, $s:ident => $call:expr) => {
        match $self {
            AnyStore::Sqlite($s) => $call.await,
            AnyStore::Postgres($s) => $call.await,
        }
    };
}

impl Store for AnyStore {
    async fn write(&self, batch: Batch) -> Result<BatchResult> {
        delegate!(self, s => s.write(batch))
    }
    async fn entity_get(&self, machine: &str, key: &str) -> Result<Option<EntityRow>> {
        delegate!(self, s => s.entity_get(machine, key))
    }
    async fn entity_list(&self, filter: EntityFilter) -> Result<Vec<EntityRow>> {
        delegate!(self, s => s.entity_list(filter))
    }
    async fn entity_count_by_state(&self, machine: &str) -> Result<Vec<(String, u64)>> {
        delegate!(self, s => s.entity_count_by_state(machine))
    }
    async fn entity_count_pending(&self) -> Result<u64> {
        delegate!(self, s => s.entity_count_pending())
    }
    async fn history_list(&self, entity_id: i64) -> Result<Vec<HistoryRow>> {
        delegate!(self, s => s.history_list(entity_id))
    }
    async fn successor_snapshot(&self, entity_id: i64) -> Result<SuccessorSnapshot> {
        delegate!(self, s => s.successor_snapshot(entity_id))
    }
    async fn timer_list(&self, entity_id: i64) -> Result<Vec<TimerRow>> {
        delegate!(self, s => s.timer_list(entity_id))
    }
    async fn task_list(&self, filter: TaskFilter) -> Result<Vec<AgentTask>> {
        delegate!(self, s => s.task_list(filter))
    }
    async fn inbox_list(&self, entity_id: i64) -> Result<Vec<InboxItem>> {
        delegate!(self, s => s.inbox_list(entity_id))
    }
    async fn machine_put(&self, name: &str, hash: &str, definition: &str, now: Millis) -> Result<()> {
        delegate!(self, s => s.machine_put(name, hash, definition, now))
    }
    async fn machine_list(&self) -> Result<Vec<MachineRecord>> {
        delegate!(self, s => s.machine_list())
    }
    async fn meta_get(&self, key: &str) -> Result<Option<String>> {
        delegate!(self, s => s.meta_get(key))
    }
    async fn meta_put(&self, key: &str, value: &str) -> Result<()> {
        delegate!(self, s => s.meta_put(key, value))
    }
    async fn sql_execute(&self, sql: &str) -> Result<()> {
        delegate!(self, s => s.sql_execute(sql))
    }
    async fn operation_get(&self, request_id: &str) -> Result<Option<OperationRow>> {
        delegate!(self, s => s.operation_get(request_id))
    }
    async fn operation_list(&self, outcome: Option<String>, limit: u64) -> Result<Vec<OperationRow>> {
        delegate!(self, s => s.operation_list(outcome, limit))
    }
    async fn machine_migrate(
        &self,
        machine: &str,
        moves: Vec<(String, String)>,
        hash: &str,
        now: Millis,
    ) -> Result<u64> {
        delegate!(self, s => s.machine_migrate(machine, moves, hash, now))
    }
    async fn machine_versions(&self) -> Result<Vec<(MachineRecord, u64)>> {
        delegate!(self, s => s.machine_versions())
    }
    async fn events_list(&self, entity_id: i64) -> Result<Vec<EventRow>> {
        delegate!(self, s => s.events_list(entity_id))
    }
    async fn events_by_id(&self, ids: Vec<i64>) -> Result<Vec<EventRow>> {
        delegate!(self, s => s.events_by_id(ids))
    }
    async fn entities_by_id(&self, ids: Vec<i64>) -> Result<Vec<EntityRow>> {
        delegate!(self, s => s.entities_by_id(ids))
    }
    async fn stats(&self, since: Option<Millis>) -> Result<Stats> {
        delegate!(self, s => s.stats(since))
    }
    async fn metrics_snapshot(&self, now: Millis) -> Result<MetricsSnapshot> {
        delegate!(self, s => s.metrics_snapshot(now))
    }
    fn exclusive(&self) -> bool {
        match self {
            AnyStore::Sqlite(s) => s.exclusive(),
            AnyStore::Postgres(s) => s.exclusive(),
        }
    }
    async fn lease_release_all(&self, now: Millis) -> Result<u64> {
        delegate!(self, s => s.lease_release_all(now))
    }
    fn wakeup(&self) -> Option<Arc<tokio::sync::Notify>> {
        match self {
            AnyStore::Sqlite(s) => s.wakeup(),
            AnyStore::Postgres(s) => s.wakeup(),
        }
    }
    fn changes(&self) -> Option<tokio::sync::broadcast::Receiver<crate::Changes>> {
        match self {
            AnyStore::Sqlite(s) => s.changes(),
            AnyStore::Postgres(s) => s.changes(),
        }
    }
}
