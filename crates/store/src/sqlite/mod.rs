//! The embedded SQLite store: one file, WAL, every commit synced before it is told.
//!
//! One dedicated writer thread owns the only write connection; every [`Batch`] becomes one
//! `BEGIN IMMEDIATE … COMMIT`, so batches are the group commit. The log is synced by a
//! thread of its own (`durable.rs`, one sync for every commit made since the last), so the
//! writer goes on to the next batch while the last one syncs; a write is answered, and a
//! read sees a commit, only once it is durable. Reads use a small pool of read-only
//! connections, which WAL lets run beside the writer.
//!
//! An engine opens the store with [`SqliteStore::open`], which also takes an exclusive
//! lock on `<file>.lock`: only one engine process may drive a SQLite file, so after a
//! crash the next engine knows every lease in the file is stale and reclaims them at once.
//! [`SqliteStore::open_read_only`] opens for inspection without the lock.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

mod bulk;
mod checkpoint;
mod claim;
mod counts;
mod dialect;
mod durable;
mod feed;
mod prune;
mod read;
mod schedule;
mod schema;
mod sets;

use rusqlite::{Connection, OptionalExtension, params};

use self::read::*;
use crate::connections::{ReaderPool, WriterThread};
use crate::machine;
use crate::sql::{ENTITY_COLS, EVENT_COLS, OPERATION_COLS, TASK_COLS};
use crate::{
    AgentTask, Batch, BatchResult, EntityFilter, EntityRow, Error, EventRow, HistoryRow, InboxItem, MachineRecord,
    MetricsSnapshot, Millis, OperationRow, Result, Stats, Store, SuccessorSnapshot, TaskFilter, TimerRow,
};

/// The SQLite implementation of [`Store`]. Cheap to clone; clones share the writer.
#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    writer: Option<WriterThread<Connection>>,
    /// Read-only connections (a new one parses the schema).
    readers: ReaderPool<Connection>,
    /// The writer's checkpoint thread (none when opened read-only), stopped when its last
    /// reference goes: this field comes before `lock`, so dropping the handle stops it
    /// before letting the lock go, unless a job on the writer still holds a reference.
    checkpoints: Option<Arc<checkpoint::Checkpoints>>,
    /// The thread that syncs the writer's commits (none when opened read-only); like
    /// `checkpoints`, it stops (after a last sync) when its last reference goes.
    syncer: Option<Arc<durable::Syncer>>,
    lock: Option<File>,
    /// Whether an agent task may be open: false until the writer offers one (or finds
    /// one open at start). This process is the file's only writer, so while it is false
    /// entering a state has no task to cancel.
    tasks_open: Arc<AtomicBool>,
}

impl Drop for Inner {
    /// Closes the writer's connection before the other fields go (the readers, the
    /// checkpoint and sync threads, then the lock): the handle's file is closed, and its
    /// log removed by the last connection, once the last handle is dropped, not a moment
    /// later on the writer's thread, where it could remove the log of a file made at the
    /// same path meanwhile.
    fn drop(&mut self) {
        if let Some(writer) = &mut self.writer {
            writer.close();
        }
    }
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore").field("path", &self.inner.path).finish()
    }
}

fn db_err(e: rusqlite::Error) -> Error {
    Error::Db(e.to_string())
}

fn lock_path(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".lock");
    PathBuf::from(p)
}

impl SqliteStore {
    /// Opens (creating if needed) the database at `path` for an engine: takes the exclusive
    /// engine lock, sets WAL, runs pending migrations (synced as they commit), and starts
    /// the thread that syncs the writer's commits from then on.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        Self::open_with(path, checkpoint::Limits::DEFAULT)
    }

    /// [`open`](Self::open), with the log checkpointed at `limits`.
    fn open_with(path: impl AsRef<Path>, limits: checkpoint::Limits) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let open_err = |message: String| Error::Open { path: path.display().to_string(), message };
        let lock_file = lock_path(&path);
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_file)
            .map_err(|e| open_err(format!("cannot create lock file `{}`: {e}", lock_file.display())))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(Error::Locked { path: path.display().to_string(), lock: lock_file.display().to_string() });
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(open_err(format!("cannot lock: {e}"))),
        }
        let mut conn = Connection::open(&path).map_err(|e| open_err(e.to_string()))?;
        conn.execute_batch(
            // Freed pages go back to the file system (`Store::reclaim_space`): set before the
            // first table exists, so it holds for databases created from now on.
            "PRAGMA auto_vacuum = INCREMENTAL;
             PRAGMA journal_mode = WAL;
             PRAGMA synchronous = FULL;
             PRAGMA foreign_keys = ON;
             PRAGMA busy_timeout = 5000;",
        )
        .map_err(|e| open_err(e.to_string()))?;
        conn.set_prepared_statement_cache_capacity(128);
        schema::migrate(&mut conn).map_err(|e| match e {
            Error::Db(m) => open_err(m),
            other => other,
        })?;
        let tasks_open: bool = conn
            .query_row("SELECT EXISTS (SELECT 1 FROM agent_tasks WHERE status IN ('ready', 'leased'))", [], |r| {
                r.get(0)
            })
            .map_err(|e| open_err(e.to_string()))?;
        let checkpoints = checkpoint::Checkpoints::start(&path, &conn, limits).map_err(open_err)?;
        // From here on commits are synced by the syncer's thread, not in the writer.
        let syncer = durable::Syncer::start(&path, &conn)
            .map_err(|e| open_err(format!("cannot start the log's sync thread: {e}")))?;
        conn.execute_batch("PRAGMA synchronous = NORMAL;").map_err(|e| open_err(e.to_string()))?;
        let writer = WriterThread::spawn("settle-sqlite-writer", conn)
            .map_err(|e| open_err(format!("cannot start writer thread: {e}")))?;
        Ok(SqliteStore {
            inner: Arc::new(Inner {
                path,
                writer: Some(writer),
                readers: ReaderPool::new(),
                lock: Some(lock),
                checkpoints: Some(Arc::new(checkpoints)),
                syncer: Some(Arc::new(syncer)),
                tasks_open: Arc::new(AtomicBool::new(tasks_open)),
            }),
        })
    }

    /// Opens an existing database for reading only (no lock, no migrations, no writes).
    pub fn open_read_only(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        if !path.exists() {
            return Err(Error::Open { path: path.display().to_string(), message: "no such file".into() });
        }
        let store = SqliteStore {
            inner: Arc::new(Inner {
                path: path.clone(),
                writer: None,
                readers: ReaderPool::new(),
                lock: None,
                checkpoints: None,
                syncer: None,
                tasks_open: Arc::new(AtomicBool::new(true)),
            }),
        };
        let conn = store.reader()?;
        let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0)).map_err(db_err)?;
        store.inner.readers.put(conn);
        if version == 0 {
            return Err(Error::Open { path: path.display().to_string(), message: "not a settle database".into() });
        }
        Ok(store)
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }
}

impl Store for SqliteStore {
    async fn write(&self, batch: Batch) -> Result<BatchResult> {
        let (result, durable) = self.write_committed(batch).await?;
        durable::settled(durable).await?;
        Ok(result)
    }

    async fn write_committed(&self, batch: Batch) -> Result<(BatchResult, Option<crate::Durability>)> {
        let tasks_open = self.inner.tasks_open.clone();
        let (result, durable) = self
            .on_writer_committed(move |conn| {
                let span = crate::trace::commit_span("sqlite", &batch);
                let _entered = span.enter();
                // One transaction per batch, committed by the plan's finish.
                // (Prepared once: a statement parsed and planned again every batch costs more
                // than running it.)
                let begin = conn.prepare_cached("BEGIN IMMEDIATE").and_then(|mut s| s.execute([]));
                let result = begin.map_err(db_err).and_then(|_| {
                    match crate::plan::apply_batch(&mut dialect::Tx(conn, &tasks_open, 0), &batch) {
                        Ok(result) => Ok(result),
                        Err(e) => {
                            let _ = conn.execute_batch("ROLLBACK");
                            Err(db_err(e))
                        }
                    }
                });
                crate::trace::finish(&span, &batch, &result);
                result
            })
            .await?;
        // A batch that failed was rolled back: nothing of it is to become durable.
        Ok((result?, durable))
    }

    async fn entity_get(&self, machine: &str, key: &str) -> Result<Option<EntityRow>> {
        let (machine, key) = (machine.to_string(), key.to_string());
        self.on_reader(move |c| {
            c.prepare_cached(&format!("SELECT {ENTITY_COLS} FROM entities WHERE machine = ?1 AND key = ?2"))
                .and_then(|mut s| s.query_row([machine, key], entity_from_row).optional())
                .map_err(db_err)
        })
        .await
    }

    async fn entity_list(&self, filter: EntityFilter) -> Result<Vec<EntityRow>> {
        self.on_reader(move |c| read::entity_list(c, &filter).map_err(db_err)).await
    }

    async fn entity_count_by_state(&self, machine: &str) -> Result<Vec<(String, u64)>> {
        let machine = machine.to_string();
        self.on_reader(move |c| {
            let mut stmt = c
                .prepare_cached("SELECT state, COUNT(*) FROM entities WHERE machine = ?1 GROUP BY state ORDER BY state")
                .map_err(db_err)?;
            stmt.query_map([machine], |r| Ok((r.get(0)?, r.get::<_, i64>(1)? as u64)))
                .and_then(|rows| rows.collect())
                .map_err(db_err)
        })
        .await
    }

    async fn entity_count_pending(&self) -> Result<u64> {
        self.on_reader(|c| {
            c.query_row("SELECT COUNT(*) FROM entities WHERE due_at IS NOT NULL", [], |r| r.get::<_, i64>(0))
                .map(|n| n as u64)
                .map_err(db_err)
        })
        .await
    }

    async fn history_list(&self, entity_id: i64) -> Result<Vec<HistoryRow>> {
        self.on_reader(move |c| {
            let mut stmt = c
                .prepare_cached(
                    "SELECT id, entity_id, from_state, to_state, kind, action, event, retry, request_id, at, detail
                     FROM history WHERE entity_id = ?1 ORDER BY id",
                )
                .map_err(db_err)?;
            stmt.query_map([entity_id], history_from_row).and_then(|rows| rows.collect()).map_err(db_err)
        })
        .await
    }

    async fn successor_snapshot(&self, entity_id: i64) -> Result<SuccessorSnapshot> {
        self.on_reader(move |c| {
            // One read transaction: WAL gives it a consistent snapshot.
            c.execute_batch("BEGIN").map_err(db_err)?;
            let read = (|| {
                let successors = c
                    .prepare_cached(&format!(
                        "SELECT {} FROM entities e JOIN successors s ON s.successor_id = e.id
                         WHERE s.predecessor_id = ?1 ORDER BY e.id",
                        ENTITY_COLS.split(", ").map(|col| format!("e.{col}")).collect::<Vec<_>>().join(", ")
                    ))?
                    .query_map([entity_id], entity_from_row)?
                    .collect::<rusqlite::Result<Vec<_>>>()?;
                let newest_notice: Option<i64> = c
                    .prepare_cached("SELECT MAX(id) FROM inbox WHERE entity_id = ?1 AND kind = 'notice'")?
                    .query_row([entity_id], |r| r.get(0))?;
                Ok(SuccessorSnapshot { successors, newest_notice })
            })();
            c.execute_batch("COMMIT").map_err(db_err)?;
            read.map_err(db_err)
        })
        .await
    }

    async fn predecessor_list(&self, entity_id: i64) -> Result<Vec<EntityRow>> {
        self.on_reader(move |c| predecessor_list(c, entity_id).map_err(db_err)).await
    }

    async fn entity_count(&self, filter: EntityFilter, bound: u64) -> Result<u64> {
        self.on_reader(move |c| read::entity_count(c, &filter, bound).map_err(db_err)).await
    }

    async fn bulk_start(&self, row: crate::BulkRow) -> Result<(crate::BulkRow, bool)> {
        self.on_writer(move |c| bulk::start(c, &row).map_err(db_err)).await
    }

    async fn bulk_get(&self, request_id: &str) -> Result<Option<crate::BulkRow>> {
        let request_id = request_id.to_string();
        self.on_reader(move |c| bulk::get(c, &request_id).map_err(db_err)).await
    }

    async fn bulk_list(&self, limit: u64) -> Result<Vec<crate::BulkRow>> {
        self.on_reader(move |c| bulk::list(c, limit).map_err(db_err)).await
    }

    async fn bulk_claim(&self, owner: &str, now: Millis, lease_until: Millis) -> Result<Option<crate::BulkRow>> {
        let owner = owner.to_string();
        self.on_writer(move |c| bulk::claim(c, &owner, now, lease_until).map_err(db_err)).await
    }

    async fn bulk_advance(&self, advance: crate::BulkAdvance) -> Result<bool> {
        self.on_writer(move |c| bulk::advance(c, &advance).map_err(db_err)).await
    }

    async fn bulk_cancel(&self, request_id: &str, now: Millis) -> Result<Option<crate::BulkRow>> {
        let request_id = request_id.to_string();
        self.on_writer(move |c| bulk::cancel(c, &request_id, now).map_err(db_err)).await
    }

    async fn schedule_list(&self) -> Result<Vec<crate::ScheduleRow>> {
        self.on_reader(move |c| schedule::list(c).map_err(db_err)).await
    }

    async fn schedule_sync(&self, row: crate::ScheduleRow) -> Result<crate::ScheduleRow> {
        self.on_writer(move |c| schedule::sync(c, &row).map_err(db_err)).await
    }

    async fn schedule_claim(
        &self,
        machine: &str,
        name: &str,
        owner: &str,
        now: Millis,
        lease_until: Millis,
    ) -> Result<Option<crate::ScheduleRow>> {
        let (machine, name, owner) = (machine.to_string(), name.to_string(), owner.to_string());
        self.on_writer(move |c| schedule::claim(c, (&machine, &name), &owner, now, lease_until).map_err(db_err)).await
    }

    async fn schedule_advance(&self, advance: crate::ScheduleAdvance) -> Result<bool> {
        self.on_writer(move |c| schedule::advance(c, &advance).map_err(db_err)).await
    }

    async fn schedule_pause(
        &self,
        machine: &str,
        name: &str,
        paused: bool,
        next: (Millis, Millis),
        now: Millis,
    ) -> Result<Option<crate::ScheduleRow>> {
        let (machine, name) = (machine.to_string(), name.to_string());
        self.on_writer(move |c| schedule::pause(c, (&machine, &name), paused, next, now).map_err(db_err)).await
    }

    async fn schedule_running(&self, fire_id: &str) -> Result<bool> {
        let fire_id = fire_id.to_string();
        self.on_reader(move |c| schedule::running(c, &fire_id).map_err(db_err)).await
    }

    async fn feed_read(
        &self,
        after: crate::FeedPos,
        filter: crate::FeedFilter,
        limit: usize,
    ) -> Result<crate::FeedPage> {
        self.on_reader(move |c| feed::read(c, after, &filter, limit).map_err(db_err)).await
    }

    async fn feed_head(&self) -> Result<crate::FeedPos> {
        self.on_reader(|c| feed::head(c).map_err(db_err)).await
    }

    async fn error_list(&self, entity_id: i64, limit: u64) -> Result<Vec<crate::ErrorRow>> {
        self.on_reader(move |c| error_list(c, entity_id, limit).map_err(db_err)).await
    }

    async fn error_newest(&self, entity_ids: Vec<i64>) -> Result<Vec<(i64, crate::ErrorRow)>> {
        self.on_reader(move |c| {
            let mut out = Vec::new();
            for id in entity_ids {
                out.extend(error_list(c, id, 1).map_err(db_err)?.into_iter().map(|e| (id, e)));
            }
            Ok(out)
        })
        .await
    }

    async fn operation_trace(&self, request_id: &str, limit: u64) -> Result<crate::OperationTrace> {
        let request_id = request_id.to_string();
        self.on_reader(move |c| in_read_transaction(c, |c| operation_trace(c, &request_id, limit))).await
    }

    async fn operation_reached(&self, request_id: &str, after: Option<i64>, limit: u64) -> Result<Vec<EntityRow>> {
        let request_id = request_id.to_string();
        self.on_reader(move |c| in_read_transaction(c, |c| read::operation_reached(c, &request_id, after, limit))).await
    }

    async fn timer_list(&self, entity_id: i64) -> Result<Vec<TimerRow>> {
        self.on_reader(move |c| {
            let mut stmt = c
                .prepare_cached(
                    "SELECT entity_id, name, event, due_at, every_ms FROM timers WHERE entity_id = ?1 ORDER BY name",
                )
                .map_err(db_err)?;
            stmt.query_map([entity_id], timer_from_row).and_then(|rows| rows.collect()).map_err(db_err)
        })
        .await
    }

    async fn inbox_list(&self, entity_id: i64) -> Result<Vec<InboxItem>> {
        self.on_reader(move |c| {
            let mut stmt = c
                .prepare_cached(&format!("SELECT {INBOX_COLS} FROM inbox WHERE entity_id = ?1 ORDER BY id"))
                .map_err(db_err)?;
            stmt.query_map([entity_id], inbox_from_row).and_then(|rows| rows.collect()).map_err(db_err)
        })
        .await
    }

    async fn machine_deploy(&self, deploy: crate::Deploy) -> Result<Vec<u64>> {
        self.on_writer(move |c| {
            let tx = c.transaction().map_err(db_err)?;
            let moved = schema::deploy(&tx, &deploy).map_err(db_err)?;
            tx.commit().map_err(db_err)?;
            Ok(moved)
        })
        .await
    }

    async fn machine_list(&self) -> Result<Vec<MachineRecord>> {
        self.on_reader(|c| {
            let mut stmt = c.prepare_cached(&machine::sqlite(machine::LIST)).map_err(db_err)?;
            stmt.query_map([], |r| machine::decode(r)).and_then(|rows| rows.collect()).map_err(db_err)
        })
        .await
    }

    async fn limit_list(&self) -> Result<Vec<crate::LimitUsage>> {
        self.on_reader(|c| {
            let mut stmt = c.prepare_cached(&machine::sqlite(crate::limit::LIST)).map_err(db_err)?;
            stmt.query_map([], |r| crate::limit::decode_usage(r)).and_then(|rows| rows.collect()).map_err(db_err)
        })
        .await
    }

    async fn limit_of(&self, entity_id: i64) -> Result<Vec<crate::EntityLimit>> {
        self.on_reader(move |c| {
            let mut stmt = c.prepare_cached(&machine::sqlite(crate::limit::OF_ENTITY)).map_err(db_err)?;
            stmt.query_map([entity_id], |r| crate::limit::decode_entity(r))
                .and_then(|rows| rows.collect())
                .map_err(db_err)
        })
        .await
    }

    async fn meta_get(&self, key: &str) -> Result<Option<String>> {
        let key = key.to_string();
        self.on_reader(move |c| {
            c.query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0)).optional().map_err(db_err)
        })
        .await
    }

    async fn meta_put(&self, key: &str, value: &str) -> Result<()> {
        let (key, value) = (key.to_string(), value.to_string());
        self.on_writer(move |c| {
            c.prepare_cached(&machine::sqlite(machine::META_PUT))
                .and_then(|mut s| s.execute([key, value]))
                .map(|_| ())
                .map_err(db_err)
        })
        .await
    }

    async fn operation_get(&self, request_id: &str) -> Result<Option<OperationRow>> {
        let request_id = request_id.to_string();
        self.on_reader(move |c| {
            c.prepare_cached(&format!("SELECT {OPERATION_COLS} FROM operations WHERE request_id = ?1"))
                .and_then(|mut s| s.query_row([request_id], operation_from_row).optional())
                .map_err(db_err)
        })
        .await
    }

    async fn operations_ended(&self, request_ids: Vec<String>) -> Result<Vec<OperationRow>> {
        if request_ids.is_empty() {
            return Ok(Vec::new());
        }
        self.on_reader(move |c| {
            let mut stmt = c
                .prepare_cached(&format!(
                    "SELECT {OPERATION_COLS} FROM operations WHERE request_id = ?1 AND ended_at IS NOT NULL"
                ))
                .map_err(db_err)?;
            let mut out = Vec::new();
            for r in &request_ids {
                if let Some(row) = stmt.query_row([r], operation_from_row).optional().map_err(db_err)? {
                    out.push(row);
                }
            }
            Ok(out)
        })
        .await
    }

    async fn operation_page(
        &self,
        outcome: Option<String>,
        before: Option<i64>,
        limit: u64,
    ) -> Result<Vec<OperationRow>> {
        self.on_reader(move |c| {
            let mut stmt = c
                .prepare_cached(&format!(
                    "SELECT {OPERATION_COLS} FROM operations
                     WHERE (?1 IS NULL OR (?1 = 'open' AND ended_at IS NULL) OR outcome = ?1)
                       AND (?3 IS NULL OR id < ?3)
                     ORDER BY id DESC LIMIT CAST(?2 AS INTEGER)"
                ))
                .map_err(db_err)?;
            stmt.query_map(params![outcome, limit.min(i64::MAX as u64) as i64, before], operation_from_row)
                .and_then(|rows| rows.collect())
                .map_err(db_err)
        })
        .await
    }

    async fn operation_scan(
        &self,
        filter: crate::OperationFilter,
        before: Option<i64>,
        window: u64,
        limit: u64,
    ) -> Result<crate::OperationWindow> {
        self.on_reader(move |c| {
            let f = filter;
            let mut stmt = c.prepare_cached(&crate::sql::operation_scan_sql(false)).map_err(db_err)?;
            let (window, limit) = (window.min(i64::MAX as u64) as i64, limit.min(i64::MAX as u64) as i64);
            let mut rows = stmt
                .query(params![before, window, f.outcome, f.machine, f.name, f.started_after, f.started_before, limit])
                .map_err(db_err)?;
            let mut out = crate::OperationWindow::default();
            while let Some(r) = rows.next().map_err(db_err)? {
                let (low, n): (Option<i64>, i64) = (r.get(12).map_err(db_err)?, r.get(13).map_err(db_err)?);
                out.low = low.filter(|_| n == window);
                if r.get::<_, Option<i64>>(0).map_err(db_err)?.is_some() {
                    out.items.push(operation_from_row(r).map_err(db_err)?);
                }
            }
            Ok(out)
        })
        .await
    }

    async fn entity_count_by_version(&self, machine: &str) -> Result<Vec<(String, String, u64)>> {
        let machine = machine.to_string();
        self.on_reader(move |c| {
            let mut stmt = c
                .prepare_cached(
                    "SELECT COALESCE(machine_hash, ''), state, COUNT(*) FROM entities WHERE machine = ?1
                     GROUP BY 1, 2 ORDER BY 1, 2",
                )
                .map_err(db_err)?;
            stmt.query_map([machine], |r| Ok((r.get(0)?, r.get(1)?, r.get::<_, i64>(2)? as u64)))
                .and_then(|rows| rows.collect())
                .map_err(db_err)
        })
        .await
    }

    async fn machine_versions(&self) -> Result<Vec<(MachineRecord, u64)>> {
        self.on_reader(|c| {
            let mut stmt = c.prepare_cached(&machine::sqlite(machine::VERSIONS)).map_err(db_err)?;
            stmt.query_map([], |r| Ok((machine::decode(r)?, r.get::<_, i64>(5)? as u64)))
                .and_then(|rows| rows.collect())
                .map_err(db_err)
        })
        .await
    }

    async fn events_list(&self, entity_id: i64) -> Result<Vec<EventRow>> {
        self.on_reader(move |c| {
            let mut stmt = c
                .prepare_cached(&format!(
                    "SELECT {EVENT_COLS} FROM events ev
                     WHERE ev.entity_id = ?1 ORDER BY ev.id"
                ))
                .map_err(db_err)?;
            stmt.query_map([entity_id], event_from_row).and_then(|rows| rows.collect()).map_err(db_err)
        })
        .await
    }

    async fn events_by_id(&self, ids: Vec<i64>) -> Result<Vec<EventRow>> {
        self.on_reader(move |c| {
            let mut stmt =
                c.prepare_cached(&format!("SELECT {EVENT_COLS} FROM events ev WHERE ev.id = ?1")).map_err(db_err)?;
            let mut out = Vec::with_capacity(ids.len());
            for id in ids {
                out.extend(stmt.query_row([id], event_from_row).optional().map_err(db_err)?);
            }
            Ok(out)
        })
        .await
    }

    async fn entities_by_id(&self, ids: Vec<i64>) -> Result<Vec<EntityRow>> {
        self.on_reader(move |c| {
            let mut stmt =
                c.prepare_cached(&format!("SELECT {ENTITY_COLS} FROM entities WHERE id = ?1")).map_err(db_err)?;
            let mut out = Vec::with_capacity(ids.len());
            for id in ids {
                out.extend(stmt.query_row([id], entity_from_row).optional().map_err(db_err)?);
            }
            Ok(out)
        })
        .await
    }

    async fn stats(&self, since: Option<Millis>) -> Result<Stats> {
        let since = since.unwrap_or(Millis::MIN);
        self.on_reader(move |c| in_read_transaction(c, |c| read_stats(c, since))).await
    }

    async fn metrics_snapshot(&self, now: Millis) -> Result<MetricsSnapshot> {
        self.on_reader(move |c| in_read_transaction(c, |c| read_metrics(c, now))).await
    }

    async fn overview(&self, now: Millis, since: Millis) -> Result<crate::Overview> {
        self.on_reader(move |c| in_read_transaction(c, |c| read::read_overview(c, now, since))).await
    }

    async fn task_list(&self, filter: TaskFilter) -> Result<Vec<AgentTask>> {
        self.on_reader(move |c| {
            // Only the filters given, so that a lookup by id or entity uses its index
            // (the statement is built from fixed fragments; values are bound).
            let mut sql =
                format!("SELECT {TASK_COLS} FROM agent_tasks t JOIN entities e ON e.id = t.entity_id WHERE 1 = 1");
            let mut values: Vec<rusqlite::types::Value> = Vec::new();
            if let Some(id) = filter.id {
                values.push(id.into());
                sql.push_str(&format!(" AND t.id = ?{}", values.len()));
            }
            if let Some(entity) = filter.entity_id {
                values.push(entity.into());
                sql.push_str(&format!(" AND t.entity_id = ?{}", values.len()));
            }
            if let Some(queue) = filter.queue {
                values.push(queue.into());
                sql.push_str(&format!(" AND t.queue = ?{}", values.len()));
            }
            if filter.open_only {
                sql.push_str(" AND t.status IN ('ready', 'leased')");
            }
            values.push(filter.limit.map_or(-1, |l| l.min(i64::MAX as u64) as i64).into());
            sql.push_str(&format!(" ORDER BY t.id DESC LIMIT CAST(?{} AS INTEGER)", values.len()));
            let mut stmt = c.prepare_cached(&sql).map_err(db_err)?;
            stmt.query_map(rusqlite::params_from_iter(values), task_from_row)
                .and_then(|rows| rows.collect())
                .map_err(db_err)
        })
        .await
    }

    fn exclusive(&self) -> bool {
        self.inner.lock.is_some()
    }

    async fn sql_execute(&self, sql: &str) -> Result<()> {
        let sql = sql.to_string();
        self.on_writer(move |conn| conn.execute_batch(&sql).map_err(db_err)).await
    }

    async fn storage(&self) -> Result<crate::Storage> {
        self.on_reader(|conn| {
            let mut tables = Vec::with_capacity(crate::prune::TABLES.len());
            for table in crate::prune::TABLES {
                // A table name is an identifier, not a parameter: each is a constant here.
                let n: i64 =
                    conn.query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0)).map_err(db_err)?;
                tables.push((table.to_string(), n as u64));
            }
            let pages: i64 = conn.query_row("PRAGMA page_count", [], |r| r.get(0)).map_err(db_err)?;
            let size: i64 = conn.query_row("PRAGMA page_size", [], |r| r.get(0)).map_err(db_err)?;
            Ok(crate::Storage { tables, bytes: (pages * size) as u64 })
        })
        .await
    }

    async fn reclaim_space(&self, max_pages: u64) -> Result<u64> {
        self.on_writer(move |conn| {
            let free = |conn: &Connection| conn.query_row("PRAGMA freelist_count", [], |r| r.get::<_, i64>(0));
            let before = free(conn).map_err(db_err)?;
            let pages = before.min(i64::try_from(max_pages).unwrap_or(i64::MAX));
            if pages <= 0 {
                return Ok(0);
            }
            // A pragma takes no bound parameter; `pages` is a number computed here. It frees
            // a page per step: step it to the end.
            let mut vacuum = conn.prepare(&format!("PRAGMA incremental_vacuum({pages})")).map_err(db_err)?;
            let mut rows = vacuum.query([]).map_err(db_err)?;
            while rows.next().map_err(db_err)?.is_some() {}
            let after = free(conn).map_err(db_err)?;
            Ok(u64::try_from(before - after).unwrap_or(0))
        })
        .await
    }

    async fn lease_release_all(&self, now: Millis) -> Result<u64> {
        let tasks_open = self.inner.tasks_open.clone();
        self.on_writer(move |conn| {
            // One transaction, committed by the plan.
            conn.execute_batch("BEGIN IMMEDIATE").map_err(db_err)?;
            crate::plan::release_all(&mut dialect::Tx(conn, &tasks_open, 0), now).map_err(|e| {
                let _ = conn.execute_batch("ROLLBACK");
                db_err(e)
            })
        })
        .await
    }
}
