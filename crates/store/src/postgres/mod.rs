//! The PostgreSQL store: many engine instances on one database (DESIGN §2–§3).
//!
//! Same tables, migrations and semantics as the SQLite store; what differs is what
//! concurrent instances need:
//! - **Claims** take due entities with `FOR UPDATE SKIP LOCKED` in the batch's
//!   transaction, so instances never wait for each other's claims and never claim the same
//!   entity; a lease that expires makes its entity due, and any instance takes it over.
//! - **Fencing**: a commit names the lease owner and the version it read; after a
//!   takeover the old owner's commit matches no row and is refused (`LeaseLost`).
//! - **Notifications**: a batch that leaves work due for others ends with `pg_notify` on
//!   the wake-up channel; every handle `LISTEN`s on a dedicated connection and wakes its
//!   engine ([`Store::wakeup`]); engines still poll, so a lost notification only delays
//!   work. A batch also tells, on a second channel, which entities it moved; a handle
//!   listens there once something waits on entities ([`Store::changes`]).
//! - **Reconnection**: one writer thread owns the write connection. A batch that fails
//!   because the connection broke, or that lost a deadlock or serialization race, is
//!   retried as a whole (nothing of it was committed) with backoff for up to 15 minutes.
//!   Only a connection lost *during* `COMMIT` is reported as an error (the outcome is
//!   unknown; idempotency keys make the caller's retry safe). Reads use a small pool of
//!   connections and retry the same way.
//!
//! The URL is the driver's (`postgres://user:pw@host:port/db?...`) plus an optional
//! `schema=NAME`: Settle's tables then live in that schema (created if missing), so several
//! deployments, or tests, can share one database.

mod bulk;
mod claim;
mod conn;
mod counts;
mod dialect;
mod feed;
mod listen;
mod prune;
mod read;
mod schedule;
mod schema;
mod sets;
mod stmt;
mod writer;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::Notify;

use self::conn::{Backoff, Conn, Failure, Recovery, Target, pg_message};
use self::writer::{Writer, WriterConn, transact};
use crate::changes::Changes;
use crate::connections::{ReaderPool, WriterThread};
use crate::{
    AgentTask, Batch, BatchResult, EntityFilter, EntityRow, Error, EventRow, HistoryRow, InboxItem, MachineRecord,
    MetricsSnapshot, Millis, OperationRow, Result, Stats, Store, SuccessorSnapshot, TaskFilter, TimerRow,
};

/// The PostgreSQL implementation of [`Store`]. Cheap to clone; clones share the writer,
/// the reader pool and the wake-up listener.
#[derive(Clone)]
pub struct PgStore {
    inner: Arc<Inner>,
}

struct Inner {
    target: Target,
    writer: Option<WriterThread<Writer>>,
    readers: ReaderPool<Conn>,
    wake: Arc<Notify>,
    /// Entities other processes changed, for waiters in this one.
    changes: tokio::sync::broadcast::Sender<Changes>,
    /// This handle's name in notifications (its own are ignored).
    me: String,
    /// Something waits on changes (`Store::changes` was called): the listener then also
    /// listens on `changes_channel`.
    want_changes: Arc<AtomicBool>,
    /// Round trips to the server of the latest batch written.
    batch_round_trips: Arc<std::sync::atomic::AtomicU64>,
    /// When the earliest timer is due, as the latest batch read it (see `dialect::Tx`).
    next_timer: Arc<std::sync::atomic::AtomicI64>,
    /// The writing engine's clock ([`Store::use_clock`]): a batch re-run after a lost
    /// connection takes its time from it.
    clock: Arc<std::sync::RwLock<crate::SharedClock>>,
    /// Where batches that leave work due for others say so (every handle listens).
    channel: String,
    /// Where batches tell which entities they moved (handles with waiters listen).
    changes_channel: String,
    stop: Arc<AtomicBool>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Closing a connection blocks on the driver's own runtime, which may not run inside
        // another (the last handle is often dropped on an async task): close them aside.
        let readers = self.readers.drain();
        if !readers.is_empty() {
            let _ = std::thread::Builder::new().name("settle-pg-close".into()).spawn(move || drop(readers));
        }
    }
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore").field("url", &self.inner.target.display).finish()
    }
}

impl PgStore {
    /// Connects to the database at `url` for an engine (or any writer): creates the schema
    /// if the URL names one, runs pending migrations (serialised between instances by an
    /// advisory lock), starts the writer thread and the wake-up listener.
    ///
    /// Blocks while it connects; safe to call from async code (it connects on a thread of
    /// its own, as the driver's blocking client may not run inside another runtime).
    pub fn open(url: &str) -> Result<Self> {
        aside(|| Self::open_here(url))
    }

    fn open_here(url: &str) -> Result<Self> {
        let target = Target::parse(url)?;
        let open_err = |message: String| Error::Open { path: target.display.clone(), message };
        let mut conn = schema::first_connection(&target, true)?;
        schema::migrate(&mut conn).map_err(|e| match e {
            Error::Db(m) => open_err(m),
            other => other,
        })?;
        drop(conn);
        let writer_conn = WriterConn::connect(&target).map_err(|e| open_err(pg_message(&e)))?;
        let writer =
            WriterThread::spawn("settle-pg-writer", Writer { target: target.clone(), conn: Some(writer_conn) })
                .map_err(|e| open_err(format!("cannot start writer thread: {e}")))?;
        let store = Self::handle(target, Some(writer));
        store.start_listener()?;
        Ok(store)
    }

    /// Connects for reading only: no migrations, no writer; fails if the database holds no
    /// Settle tables.
    pub fn open_read_only(url: &str) -> Result<Self> {
        aside(|| Self::open_read_only_here(url))
    }

    fn open_read_only_here(url: &str) -> Result<Self> {
        let target = Target::parse(url)?;
        let mut conn = schema::first_connection(&target, false)?;
        let version = schema::schema_version(&mut conn)
            .map_err(|e| Error::Open { path: target.display.clone(), message: pg_message(&e) })?;
        if version == 0 {
            return Err(Error::Open { path: target.display.clone(), message: "not a settle database".into() });
        }
        let store = Self::handle(target, None);
        store.inner.readers.put(conn);
        Ok(store)
    }

    fn handle(target: Target, writer: Option<WriterThread<Writer>>) -> Self {
        let channel = crate::changes::channel("settle_wake", target.schema.as_deref());
        let changes_channel = crate::changes::channel("settle_changes", target.schema.as_deref());
        PgStore {
            inner: Arc::new(Inner {
                target,
                writer,
                readers: ReaderPool::new(),
                wake: Arc::new(Notify::new()),
                changes: tokio::sync::broadcast::channel(4096).0,
                me: format!("{}-{}", std::process::id(), uuid_like()),
                batch_round_trips: Arc::new(std::sync::atomic::AtomicU64::new(0)),
                next_timer: Arc::new(std::sync::atomic::AtomicI64::new(Millis::MIN)),
                clock: Arc::new(std::sync::RwLock::new(Arc::new(crate::SystemClock))),
                channel,
                changes_channel,
                want_changes: Arc::new(AtomicBool::new(false)),
                stop: Arc::new(AtomicBool::new(false)),
            }),
        }
    }

    /// The URL, password hidden.
    pub fn url(&self) -> &str {
        &self.inner.target.display
    }

    /// How many round trips to the server the latest batch written through this handle
    /// took (`BEGIN` and `COMMIT` included): a diagnostic, and what the tests check to
    /// keep a batch's round trips from growing with its size.
    pub fn last_batch_round_trips(&self) -> u64 {
        self.inner.batch_round_trips.load(Ordering::Relaxed)
    }

    /// The schema Settle's tables are in, if the URL named one.
    pub fn schema(&self) -> Option<&str> {
        self.inner.target.schema.as_deref()
    }

    async fn on_writer<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Writer) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        WriterThread::run_on(self.inner.writer.as_ref(), f).await
    }

    /// Runs `f` on a pooled connection on a blocking thread (see [`PgStore::read`]).
    async fn on_reader<T: Send + 'static>(
        &self,
        f: impl Fn(&mut Conn) -> std::result::Result<T, Failure> + Send + 'static,
    ) -> Result<T> {
        let this = self.clone();
        self.inner.readers.run(move || this.read(f)).await
    }

    /// Runs `f` on a pooled connection, reconnecting (with backoff) if the connection is
    /// gone, and again after a lost race.
    fn read<T>(&self, f: impl Fn(&mut Conn) -> std::result::Result<T, Failure>) -> Result<T> {
        let mut backoff = Backoff::new();
        loop {
            let pooled = self.inner.readers.take();
            let mut conn = match pooled {
                Some(c) if !c.client.is_closed() => c,
                _ => match self.inner.target.connect() {
                    Ok(c) => c,
                    Err(e) => {
                        if !backoff.wait("store reader", &pg_message(&e)) {
                            return Err(Error::Db(format!("cannot reach PostgreSQL: {}", pg_message(&e))));
                        }
                        continue;
                    }
                },
            };
            match f(&mut conn) {
                Ok(out) => {
                    self.inner.readers.put(conn);
                    return Ok(out);
                }
                Err(failure) => match failure.recovery() {
                    Recovery::Reconnect | Recovery::Retry => {
                        if !backoff.wait("store reader", &format!("{failure:?}")) {
                            return Err(failure.into_error());
                        }
                    }
                    Recovery::Fail => {
                        // Leave no transaction open on a pooled connection.
                        if conn.batch("ROLLBACK").is_ok() {
                            self.inner.readers.put(conn);
                        }
                        return Err(failure.into_error());
                    }
                },
            }
        }
    }
}

/// Runs `f` on a thread of its own and waits for it.
fn aside<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| s.spawn(f).join().expect("store open thread panicked"))
}

/// A random suffix for this handle's name (std's per-process random hash keys).
fn uuid_like() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0));
    format!("{:016x}", h.finish())
}

impl Store for PgStore {
    async fn write(&self, batch: Batch) -> Result<BatchResult> {
        let (channel, me) = (self.inner.channel.clone(), self.inner.me.clone());
        let changes_channel = self.inner.changes_channel.clone();
        let counter = self.inner.batch_round_trips.clone();
        let next_timer = self.inner.next_timer.clone();
        let clock = self.inner.clock.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        self.on_writer(move |w| {
            let mut batch = batch;
            let span = crate::trace::commit_span("postgres", &batch);
            let _entered = span.enter();
            let before = w.conn.as_ref().map_or(0, |c| c.round_trips);
            let written = transact(w, "store write", |c, reconnected| {
                // Time went on while the connection came back: on the engine's clock.
                if reconnected {
                    batch.now = batch.now.max(clock.now_ms());
                }
                let mut tx = dialect::Tx {
                    c,
                    channel: &channel,
                    changes_channel: &changes_channel,
                    me: &me,
                    next_timer: &next_timer,
                };
                crate::plan::apply_batch(&mut tx, &batch)
            });
            let after = w.conn.as_ref().map_or(0, |c| c.round_trips);
            counter.store(after.saturating_sub(before), Ordering::Relaxed);
            crate::trace::finish(&span, &batch, &written);
            written
        })
        .await
    }

    async fn entity_get(&self, machine: &str, key: &str) -> Result<Option<EntityRow>> {
        let (machine, key) = (machine.to_string(), key.to_string());
        self.on_reader(move |c| read::entity_get(c, &machine, &key)).await
    }

    async fn entity_list(&self, filter: EntityFilter) -> Result<Vec<EntityRow>> {
        self.on_reader(move |c| read::entity_list(c, &filter)).await
    }

    async fn entity_count_by_state(&self, machine: &str) -> Result<Vec<(String, u64)>> {
        let machine = machine.to_string();
        self.on_reader(move |c| read::entity_count_by_state(c, &machine)).await
    }

    async fn entity_count_pending(&self) -> Result<u64> {
        self.on_reader(read::entity_count_pending).await
    }

    async fn history_list(&self, entity_id: i64) -> Result<Vec<HistoryRow>> {
        self.on_reader(move |c| read::history_list(c, entity_id)).await
    }

    async fn successor_snapshot(&self, entity_id: i64) -> Result<SuccessorSnapshot> {
        self.on_reader(move |c| read::successor_snapshot(c, entity_id)).await
    }

    async fn predecessor_list(&self, entity_id: i64) -> Result<Vec<EntityRow>> {
        self.on_reader(move |c| read::predecessor_list(c, entity_id)).await
    }

    async fn error_list(&self, entity_id: i64, limit: u64) -> Result<Vec<crate::ErrorRow>> {
        self.on_reader(move |c| read::error_list(c, entity_id, limit)).await
    }

    async fn error_newest(&self, entity_ids: Vec<i64>) -> Result<Vec<(i64, crate::ErrorRow)>> {
        self.on_reader(move |c| read::error_newest(c, &entity_ids)).await
    }

    async fn operation_trace(&self, request_id: &str, limit: u64) -> Result<crate::OperationTrace> {
        let request_id = request_id.to_string();
        self.on_reader(move |c| read::operation_trace(c, &request_id, limit)).await
    }

    async fn operation_reached(&self, request_id: &str, after: Option<i64>, limit: u64) -> Result<Vec<EntityRow>> {
        let request_id = request_id.to_string();
        self.on_reader(move |c| read::operation_reached(c, &request_id, after, limit)).await
    }

    async fn timer_list(&self, entity_id: i64) -> Result<Vec<TimerRow>> {
        self.on_reader(move |c| read::timer_list(c, entity_id)).await
    }

    async fn task_list(&self, filter: TaskFilter) -> Result<Vec<AgentTask>> {
        self.on_reader(move |c| read::task_list(c, &filter)).await
    }

    async fn inbox_list(&self, entity_id: i64) -> Result<Vec<InboxItem>> {
        self.on_reader(move |c| read::inbox_list(c, entity_id)).await
    }

    async fn machine_deploy(&self, deploy: crate::Deploy) -> Result<Vec<u64>> {
        self.on_writer(move |w| transact(w, "machine_deploy", |c, _| schema::deploy(c, &deploy))).await
    }

    async fn machine_list(&self) -> Result<Vec<MachineRecord>> {
        self.on_reader(read::machine_list).await
    }

    async fn limit_list(&self) -> Result<Vec<crate::LimitUsage>> {
        self.on_reader(|c| read::all(c.query(crate::limit::LIST, &[])?, crate::limit::decode_usage)).await
    }

    async fn limit_of(&self, entity_id: i64) -> Result<Vec<crate::EntityLimit>> {
        self.on_reader(move |c| {
            read::all(c.query(crate::limit::OF_ENTITY, &[&entity_id])?, crate::limit::decode_entity)
        })
        .await
    }

    async fn meta_get(&self, key: &str) -> Result<Option<String>> {
        let key = key.to_string();
        self.on_reader(move |c| read::meta_get(c, &key)).await
    }

    async fn meta_put(&self, key: &str, value: &str) -> Result<()> {
        let (key, value) = (key.to_string(), value.to_string());
        self.on_writer(move |w| {
            transact(w, "meta_put", |c, _| {
                c.exec(crate::machine::META_PUT, &[&key, &value])?;
                Ok(())
            })
        })
        .await
    }

    async fn sql_execute(&self, sql: &str) -> Result<()> {
        let sql = sql.to_string();
        self.on_writer(move |w| transact(w, "sql_execute", |c, _| Ok(c.batch(&sql)?))).await
    }

    async fn storage(&self) -> Result<crate::Storage> {
        self.on_reader(|c| {
            let mut tables = Vec::with_capacity(crate::prune::TABLES.len());
            for table in crate::prune::TABLES {
                // A table name is an identifier, not a parameter: each is a constant here.
                let n: i64 = c.one(&format!("SELECT count(*) FROM {table}"), &[])?.try_get(0)?;
                tables.push((table.to_string(), n as u64));
            }
            let bytes: i64 = c
                .one(
                    "SELECT COALESCE(sum(pg_total_relation_size(c.oid)), 0)::bigint FROM pg_class c
                     JOIN pg_namespace n ON n.oid = c.relnamespace
                     WHERE n.nspname = current_schema() AND c.relkind = 'r'",
                    &[],
                )?
                .try_get(0)?;
            Ok(crate::Storage { tables, bytes: bytes as u64 })
        })
        .await
    }

    async fn reclaim_space(&self, _max_pages: u64) -> Result<u64> {
        // Dead rows' space is reused once a vacuum has passed; autovacuum does it when it
        // runs and keeps up. Where it does not (switched off, or behind on a busy table),
        // each call vacuums Settle's tables with many dead rows: plain VACUUM, which blocks
        // no reader or writer; another instance's vacuum of the same table makes this one
        // give up at once (lock_timeout).
        self.on_reader(|c| {
            let dead = c.query(
                "SELECT relname::text FROM pg_stat_user_tables
                  WHERE schemaname = current_schema() AND relname = ANY($1::text[])
                    AND n_dead_tup > 1000 AND n_dead_tup > n_live_tup / 5
                  ORDER BY n_dead_tup DESC",
                &[&crate::prune::TABLES],
            )?;
            if dead.is_empty() {
                return Ok(0);
            }
            c.batch("SET lock_timeout = '200ms'")?;
            for row in dead {
                let table: String = row.try_get(0)?;
                // Only a name of TABLES (the query's filter) reaches the statement.
                if let Some(table) = crate::prune::TABLES.iter().find(|t| **t == table)
                    && let Err(e) = c.batch(&format!("VACUUM {table}"))
                {
                    tracing::debug!(table, error = %e, "vacuum skipped");
                }
            }
            c.batch("RESET lock_timeout")?;
            Ok(0)
        })
        .await
    }

    async fn entity_count(&self, filter: EntityFilter, bound: u64) -> Result<u64> {
        self.on_reader(move |c| read::entity_count(c, &filter, bound)).await
    }

    async fn bulk_start(&self, row: crate::BulkRow) -> Result<(crate::BulkRow, bool)> {
        self.on_reader(move |c| bulk::start(c, &row)).await
    }

    async fn bulk_get(&self, request_id: &str) -> Result<Option<crate::BulkRow>> {
        let request_id = request_id.to_string();
        self.on_reader(move |c| bulk::get(c, &request_id)).await
    }

    async fn bulk_list(&self, limit: u64) -> Result<Vec<crate::BulkRow>> {
        self.on_reader(move |c| bulk::list(c, limit)).await
    }

    async fn bulk_claim(&self, owner: &str, now: Millis, lease_until: Millis) -> Result<Option<crate::BulkRow>> {
        let owner = owner.to_string();
        self.on_reader(move |c| bulk::claim(c, &owner, now, lease_until)).await
    }

    async fn bulk_advance(&self, advance: crate::BulkAdvance) -> Result<bool> {
        self.on_reader(move |c| bulk::advance(c, &advance)).await
    }

    async fn bulk_cancel(&self, request_id: &str, now: Millis) -> Result<Option<crate::BulkRow>> {
        let request_id = request_id.to_string();
        self.on_reader(move |c| bulk::cancel(c, &request_id, now)).await
    }

    async fn schedule_list(&self) -> Result<Vec<crate::ScheduleRow>> {
        self.on_reader(schedule::list).await
    }

    async fn schedule_sync(&self, row: crate::ScheduleRow) -> Result<crate::ScheduleRow> {
        self.on_reader(move |c| schedule::sync(c, &row)).await
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
        self.on_reader(move |c| schedule::claim(c, (&machine, &name), &owner, now, lease_until)).await
    }

    async fn schedule_advance(&self, advance: crate::ScheduleAdvance) -> Result<bool> {
        self.on_reader(move |c| schedule::advance(c, &advance)).await
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
        self.on_reader(move |c| schedule::pause(c, (&machine, &name), paused, next, now)).await
    }

    async fn schedule_running(&self, fire_id: &str) -> Result<bool> {
        let fire_id = fire_id.to_string();
        self.on_reader(move |c| schedule::running(c, &fire_id)).await
    }

    async fn feed_read(
        &self,
        after: crate::FeedPos,
        filter: crate::FeedFilter,
        limit: usize,
    ) -> Result<crate::FeedPage> {
        self.on_reader(move |c| feed::read(c, after, &filter, limit)).await
    }

    async fn feed_head(&self) -> Result<crate::FeedPos> {
        self.on_reader(feed::head).await
    }

    async fn operation_get(&self, request_id: &str) -> Result<Option<OperationRow>> {
        let request_id = request_id.to_string();
        self.on_reader(move |c| read::operation_get(c, &request_id)).await
    }

    async fn operations_ended(&self, request_ids: Vec<String>) -> Result<Vec<OperationRow>> {
        if request_ids.is_empty() {
            return Ok(Vec::new());
        }
        self.on_reader(move |c| read::operations_ended(c, &request_ids)).await
    }

    async fn operation_page(
        &self,
        outcome: Option<String>,
        before: Option<i64>,
        limit: u64,
    ) -> Result<Vec<OperationRow>> {
        self.on_reader(move |c| read::operation_list(c, outcome.as_deref(), before, limit)).await
    }

    async fn operation_scan(
        &self,
        filter: crate::OperationFilter,
        before: Option<i64>,
        window: u64,
        limit: u64,
    ) -> Result<crate::OperationWindow> {
        self.on_reader(move |c| read::operation_scan(c, &filter, before, window, limit)).await
    }

    async fn entity_count_by_version(&self, machine: &str) -> Result<Vec<(String, String, u64)>> {
        let machine = machine.to_string();
        self.on_reader(move |c| {
            let rows = c.query(
                "SELECT COALESCE(machine_hash, ''), state, COUNT(*) FROM entities WHERE machine = $1
                 GROUP BY 1, 2 ORDER BY 1, 2",
                &[&machine],
            )?;
            read::all(rows, |r| Ok((r.try_get(0)?, r.try_get(1)?, read::count(r, 2)?)))
        })
        .await
    }

    async fn machine_versions(&self) -> Result<Vec<(MachineRecord, u64)>> {
        self.on_reader(read::machine_versions).await
    }

    async fn events_list(&self, entity_id: i64) -> Result<Vec<EventRow>> {
        self.on_reader(move |c| read::events_list(c, entity_id)).await
    }

    async fn events_by_id(&self, ids: Vec<i64>) -> Result<Vec<EventRow>> {
        self.on_reader(move |c| read::events_by_id(c, &ids)).await
    }

    async fn entities_by_id(&self, ids: Vec<i64>) -> Result<Vec<EntityRow>> {
        self.on_reader(move |c| read::entities_by_id(c, &ids)).await
    }

    async fn stats(&self, since: Option<Millis>) -> Result<Stats> {
        let since = since.unwrap_or(Millis::MIN);
        self.on_reader(move |c| read::stats(c, since)).await
    }

    async fn metrics_snapshot(&self, now: Millis) -> Result<MetricsSnapshot> {
        self.on_reader(move |c| read::metrics(c, now)).await
    }

    async fn overview(&self, now: Millis, since: Millis) -> Result<crate::Overview> {
        self.on_reader(move |c| read::overview(c, now, since)).await
    }

    fn exclusive(&self) -> bool {
        false
    }

    fn use_clock(&self, clock: crate::SharedClock) {
        *self.inner.clock.write().unwrap_or_else(std::sync::PoisonError::into_inner) = clock;
    }

    async fn lease_release_all(&self, now: Millis) -> Result<u64> {
        let (channel, me) = (self.inner.channel.clone(), self.inner.me.clone());
        let changes_channel = self.inner.changes_channel.clone();
        let next_timer = self.inner.next_timer.clone();
        self.on_writer(move |w| {
            transact(w, "lease_release_all", |c, _| {
                let mut tx = dialect::Tx {
                    c,
                    channel: &channel,
                    changes_channel: &changes_channel,
                    me: &me,
                    next_timer: &next_timer,
                };
                crate::plan::release_all(&mut tx, now)
            })
        })
        .await
    }

    fn wakeup(&self) -> Option<Arc<Notify>> {
        Some(self.inner.wake.clone())
    }

    fn changes(&self) -> Option<tokio::sync::broadcast::Receiver<Changes>> {
        let receiver = self.inner.changes.subscribe();
        self.inner.want_changes.store(true, Ordering::Release);
        Some(receiver)
    }
}

/// Test support: a URL for a fresh schema in the database named by `SETTLE_TEST_PG`
/// (`postgres://postgres@127.0.0.1:5432/test`, say), so tests can run in parallel; `None`,
/// after saying so on stderr, when the variable is not set.
///
/// The schema is dropped when the thread that asked for it ends, unless that thread
/// panicked: a test that passes leaves nothing behind, one that fails keeps its data to
/// look at. (A test runs on a thread of its own; one that hands the URL to another thread
/// or process must keep its own thread until they are done, as a test does.)
pub fn test_url(prefix: &str) -> Option<String> {
    let Ok(base) = std::env::var("SETTLE_TEST_PG") else {
        eprintln!("skipped: PostgreSQL test ({prefix}): SETTLE_TEST_PG is not set");
        return None;
    };
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let schema = format!("{prefix}_{}_{n}_{}", std::process::id(), &uuid_like()[..8]);
    let sep = if base.contains('?') { '&' } else { '?' };
    test_schemas::drop_at_thread_end(&base, &schema);
    Some(format!("{base}{sep}schema={schema}"))
}

/// The schemas [`test_url`] handed out on this thread, dropped when it ends unless it
/// panicked.
mod test_schemas {
    use std::cell::RefCell;

    #[derive(Default)]
    struct Schemas {
        base: String,
        names: Vec<String>,
        panicked: bool,
    }

    impl Drop for Schemas {
        fn drop(&mut self) {
            if self.panicked || self.names.is_empty() {
                return;
            }
            let (base, names) = (std::mem::take(&mut self.base), std::mem::take(&mut self.names));
            // On a thread of its own: this one is ending, and the client needs a runtime
            // (whose thread-locals may be gone here).
            let dropping = std::thread::spawn(move || {
                let Ok(mut config) = base.parse::<postgres::Config>() else { return };
                config.connect_timeout(std::time::Duration::from_secs(5));
                let Ok(mut c) = config.connect(postgres::NoTls) else { return };
                let _ = c.batch_execute("SET lock_timeout = '10s'");
                for name in names {
                    let _ =
                        c.batch_execute(&format!("DROP SCHEMA IF EXISTS \"{}\" CASCADE", name.replace('"', "\"\"")));
                }
            });
            let _ = dropping.join();
        }
    }

    thread_local! {
        static SCHEMAS: RefCell<Schemas> = RefCell::default();
    }

    /// Drops `schema` of the database at `base` when this thread ends, unless it panics.
    pub(super) fn drop_at_thread_end(base: &str, schema: &str) {
        static HOOK: std::sync::Once = std::sync::Once::new();
        HOOK.call_once(|| {
            let previous = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                let _ = SCHEMAS.try_with(|s| s.try_borrow_mut().map(|mut s| s.panicked = true));
                previous(info);
            }));
        });
        let _ = SCHEMAS.try_with(|s| {
            let mut s = s.borrow_mut();
            s.base = base.split('?').next().unwrap_or(base).to_string();
            s.names.push(schema.to_string());
        });
    }
}
