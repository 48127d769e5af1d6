//! The embedded SQLite store: one file, WAL, `synchronous=FULL`.
//!
//! One dedicated writer thread owns the only write connection; every [`Batch`] becomes one
//! `BEGIN IMMEDIATE … COMMIT` (one fsync), so batches are the group commit. Reads use a
//! small pool of read-only connections, which WAL lets run beside the writer.
//!
//! An engine opens the store with [`SqliteStore::open`], which also takes an exclusive
//! lock on `<file>.lock`: only one engine process may drive a SQLite file, so after a
//! crash the next engine knows every lease in the file is stale and reclaims them at once.
//! [`SqliteStore::open_read_only`] opens for inspection without the lock.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rusqlite::types::Value as SqlValue;
use rusqlite::{Connection, OpenFlags, OptionalExtension, Row, Transaction, TransactionBehavior, params};
use serde_json::Value;
use settle_core::{ActionName, EntityKey, EventName, MachineName, Properties, StateName};

use crate::sql::{
    ENTITY_COLS, OPERATION_COLS, TASK_COLS, WriterThread, json_text, needs_savepoint, report_push, task_refusal,
};
use crate::types::*;
use crate::{Error, Result, Store};

const MIGRATIONS: &[(i64, &str)] = &[
    (1, include_str!("../migrations/sqlite/0001_core.sql")),
    (2, include_str!("../migrations/sqlite/0002_workflows.sql")),
    (3, include_str!("../migrations/sqlite/0003_operate.sql")),
    (4, include_str!("../migrations/sqlite/0004_agents.sql")),
];

/// The SQLite implementation of [`Store`]. Cheap to clone; clones share the writer.
#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    writer: Option<WriterThread<Connection>>,
    readers: Mutex<Vec<Connection>>,
    lock: Option<File>,
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
    /// engine lock, sets WAL and `synchronous=FULL`, and runs pending migrations.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
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
            "PRAGMA journal_mode = WAL;
             PRAGMA synchronous = FULL;
             PRAGMA foreign_keys = ON;
             PRAGMA busy_timeout = 5000;",
        )
        .map_err(|e| open_err(e.to_string()))?;
        conn.set_prepared_statement_cache_capacity(128);
        migrate(&mut conn).map_err(|e| match e {
            Error::Db(m) => open_err(m),
            other => other,
        })?;
        let writer = WriterThread::spawn("settle-sqlite-writer", conn)
            .map_err(|e| open_err(format!("cannot start writer thread: {e}")))?;
        Ok(SqliteStore {
            inner: Arc::new(Inner { path, writer: Some(writer), readers: Mutex::new(Vec::new()), lock: Some(lock) }),
        })
    }

    /// Opens an existing database for reading only (no lock, no migrations, no writes).
    pub fn open_read_only(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        if !path.exists() {
            return Err(Error::Open { path: path.display().to_string(), message: "no such file".into() });
        }
        let store = SqliteStore {
            inner: Arc::new(Inner { path: path.clone(), writer: None, readers: Mutex::new(Vec::new()), lock: None }),
        };
        let conn = store.reader()?;
        let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0)).map_err(db_err)?;
        store.put_reader(conn);
        if version == 0 {
            return Err(Error::Open { path: path.display().to_string(), message: "not a settle database".into() });
        }
        Ok(store)
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    async fn on_writer<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let Some(writer) = &self.inner.writer else {
            return Err(Error::Db("store opened read-only".into()));
        };
        writer.run(f).await
    }

    fn reader(&self) -> Result<Connection> {
        if let Some(c) = self.inner.readers.lock().expect("reader pool lock").pop() {
            return Ok(c);
        }
        let conn = Connection::open_with_flags(
            &self.inner.path,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX | OpenFlags::SQLITE_OPEN_URI,
        )
        .map_err(|e| Error::Open { path: self.inner.path.display().to_string(), message: e.to_string() })?;
        conn.execute_batch("PRAGMA busy_timeout = 5000; PRAGMA query_only = 1;").map_err(db_err)?;
        Ok(conn)
    }

    fn put_reader(&self, conn: Connection) {
        let mut pool = self.inner.readers.lock().expect("reader pool lock");
        if pool.len() < 4 {
            pool.push(conn);
        }
    }

    async fn on_reader<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let this = self.clone();
        tokio::task::spawn_blocking(move || {
            let conn = this.reader()?;
            let out = f(&conn);
            this.put_reader(conn);
            out
        })
        .await
        .map_err(|e| Error::Db(format!("reader task failed: {e}")))?
    }
}

fn migrate(conn: &mut Connection) -> Result<()> {
    let current: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0)).map_err(db_err)?;
    let newest = MIGRATIONS.last().map(|m| m.0).unwrap_or(0);
    if current > newest {
        return Err(Error::SchemaTooNew { found: current, supported: newest });
    }
    for (version, sql) in MIGRATIONS.iter().filter(|m| m.0 > current) {
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(db_err)?;
        tx.execute_batch(sql).map_err(db_err)?;
        tx.pragma_update(None, "user_version", version).map_err(db_err)?;
        tx.commit().map_err(db_err)?;
    }
    Ok(())
}

/// When an entity is next due, from its current columns: never while paused, parked or
/// killed; at the end of a sleep or backoff; at its lease expiry while leased; now if its
/// inbox holds events; else at its auto action or first timer. Named parameter: `:now`.
const DUE_EXPR: &str = "CASE
    WHEN run_status IN ('paused', 'failed', 'killed') THEN NULL
    WHEN run_status IN ('sleeping', 'fault') THEN sleep_until
    WHEN lease_owner IS NOT NULL THEN lease_until
    WHEN EXISTS (SELECT 1 FROM inbox i WHERE i.entity_id = entities.id) THEN :now
    WHEN auto_at IS NULL THEN timer_at
    WHEN timer_at IS NULL THEN auto_at
    ELSE MIN(auto_at, timer_at) END";

fn conversion(col: usize, e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> rusqlite::Error {
    rusqlite::Error::FromSqlConversionFailure(col, rusqlite::types::Type::Text, e.into())
}

fn parse_json_obj(text: &str) -> rusqlite::Result<Properties> {
    serde_json::from_str(text).map_err(|e| conversion(0, e))
}

fn entity_from_row(r: &Row<'_>) -> rusqlite::Result<EntityRow> {
    let status = r.get_ref(16)?.as_str()?;
    Ok(EntityRow {
        id: r.get(0)?,
        machine: MachineName::new(r.get_ref(1)?.as_str()?),
        key: EntityKey::new(r.get_ref(2)?.as_str()?),
        state: StateName::new(r.get_ref(3)?.as_str()?),
        properties: parse_json_obj(r.get_ref(4)?.as_str()?)?,
        version: r.get(5)?,
        retry: r.get(6)?,
        created_at: r.get(7)?,
        entered_at: r.get(8)?,
        auto_at: r.get(9)?,
        due_at: r.get(10)?,
        lease_owner: r.get(11)?,
        lease_until: r.get(12)?,
        request_id: r.get(13)?,
        fired: serde_json::from_str::<Vec<String>>(r.get_ref(14)?.as_str()?)
            .map_err(|e| conversion(14, e))?
            .into_iter()
            .map(EventName::from)
            .collect(),
        timer_at: r.get(15)?,
        run_status: RunStatus::parse(status).ok_or_else(|| conversion(16, format!("unknown run status `{status}`")))?,
        sleep_until: r.get(17)?,
        recent_errors: serde_json::from_str(r.get_ref(18)?.as_str()?).map_err(|e| conversion(18, e))?,
        event_id: r.get(19)?,
        machine_hash: r.get(20)?,
    })
}

fn inbox_from_row(r: &Row<'_>) -> rusqlite::Result<InboxItem> {
    let params: String = r.get(3)?;
    let kind = r.get_ref(6)?.as_str()?;
    Ok(InboxItem {
        id: r.get(0)?,
        entity_id: r.get(1)?,
        event: EventName::new(r.get_ref(2)?.as_str()?),
        params: serde_json::from_str(&params).map_err(|e| conversion(3, e))?,
        request_id: r.get(4)?,
        created_at: r.get(5)?,
        kind: InboxKind::parse(kind).ok_or_else(|| conversion(6, format!("unknown inbox kind `{kind}`")))?,
    })
}

fn task_from_row(r: &Row<'_>) -> rusqlite::Result<AgentTask> {
    let errors: String = r.get(10)?;
    let errors: Vec<Value> = serde_json::from_str(&errors).map_err(|e| conversion(10, e))?;
    Ok(AgentTask {
        id: r.get(0)?,
        queue: r.get(1)?,
        machine: MachineName::new(r.get::<_, String>(2)?),
        key: EntityKey::new(r.get::<_, String>(3)?),
        entity_id: r.get(4)?,
        state: StateName::new(r.get::<_, String>(5)?),
        action: ActionName::new(r.get::<_, String>(6)?),
        entity_version: r.get(7)?,
        retry: r.get(8)?,
        properties: parse_json_obj(&r.get::<_, String>(9)?)?,
        errors: errors.len() as u32,
        request_id: r.get(11)?,
        status: r.get(12)?,
        attempt: r.get(13)?,
        token: r.get(14)?,
        agent: r.get(15)?,
        locked_until: r.get(16)?,
        lock_ms: r.get(17)?,
        available_at: r.get(18)?,
        created_at: r.get(19)?,
        outcome: r.get(20)?,
        error: r.get(21)?,
    })
}

fn history_from_row(r: &Row<'_>) -> rusqlite::Result<HistoryRow> {
    let kind: String = r.get(4)?;
    Ok(HistoryRow {
        id: r.get(0)?,
        entity_id: r.get(1)?,
        from: r.get::<_, Option<String>>(2)?.map(StateName::from),
        to: r.get::<_, Option<String>>(3)?.map(StateName::from),
        kind: HistoryKind::parse(&kind).ok_or_else(|| conversion(4, format!("unknown history kind `{kind}`")))?,
        action: r.get::<_, Option<String>>(5)?.map(ActionName::from),
        event: r.get::<_, Option<String>>(6)?.map(EventName::from),
        retry: r.get(7)?,
        request_id: r.get(8)?,
        at: r.get(9)?,
        detail: r.get(10)?,
    })
}

fn operation_from_row(r: &Row<'_>) -> rusqlite::Result<OperationRow> {
    Ok(OperationRow {
        id: r.get(0)?,
        request_id: r.get(1)?,
        name: r.get(2)?,
        machine: r.get(3)?,
        entity_key: r.get(4)?,
        started_at: r.get(5)?,
        ended_at: r.get(6)?,
        first_response_at: r.get(7)?,
        outcome: r.get(8)?,
        error: r.get(9)?,
        restart_count: r.get(10)?,
        dimensions: serde_json::from_str(r.get_ref(11)?.as_str()?).map_err(|e| conversion(11, e))?,
    })
}

/// Why an operation stopped: its own failure (rolled back alone) or the database's.
enum Fail {
    Op(OpError),
    Db(rusqlite::Error),
}

impl From<rusqlite::Error> for Fail {
    fn from(e: rusqlite::Error) -> Self {
        Fail::Db(e)
    }
}

fn is_unique_violation(e: &rusqlite::Error) -> bool {
    matches!(e, rusqlite::Error::SqliteFailure(f, _) if f.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE || f.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY)
}

/// Opens an operation; `Some(id)` of the existing one if its request id was seen before.
fn open_operation(
    tx: &Transaction<'_>,
    now: Millis,
    op: &OpenOperation,
    machine: &str,
    key: &str,
) -> rusqlite::Result<Option<i64>> {
    let inserted = tx
        .prepare_cached(
            "INSERT INTO operations (request_id, name, machine, entity_key, started_at, dimensions)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT (request_id) DO NOTHING",
        )?
        .execute(params![op.request_id, op.name, machine, key, now, json_text(&op.dimensions)])?;
    if inserted == 1 {
        return Ok(None);
    }
    tx.prepare_cached("SELECT id FROM operations WHERE request_id = ?1")?
        .query_row([&op.request_id], |r| r.get(0))
        .map(Some)
}

/// Ends the operation `request_id` if nothing it reached is still busy or queued.
fn complete_operation(tx: &Transaction<'_>, request_id: &str, now: Millis) -> rusqlite::Result<()> {
    tx.prepare_cached(
        "UPDATE operations SET ended_at = ?2,
            outcome = CASE WHEN canceled = 1 THEN 'canceled' WHEN error_seen = 1 THEN 'failed' ELSE 'success' END
         WHERE request_id = ?1 AND ended_at IS NULL
           AND NOT EXISTS (SELECT 1 FROM entities WHERE request_id = ?1 AND busy = 1)
           AND NOT EXISTS (SELECT 1 FROM inbox WHERE request_id = ?1)",
    )?
    .execute(params![request_id, now])?;
    Ok(())
}

fn insert_entity(tx: &Transaction<'_>, now: Millis, e: &NewEntity) -> Result<Applied, Fail> {
    if let Some(op) = &e.operation {
        if let Some(operation_id) = open_operation(tx, now, op, &e.machine, &e.key)? {
            return Ok(Applied::Replayed { operation_id });
        }
        // The caller's answer (the entity exists) is this commit.
        tx.prepare_cached("UPDATE operations SET first_response_at = ?2 WHERE request_id = ?1")?
            .execute(params![op.request_id, now])?;
    }
    let props = json_text(&e.properties);
    let inserted = tx
        .prepare_cached(
            "INSERT INTO entities (machine, key, state, properties, version, retry, created_at, entered_at, auto_at,
                due_at, request_id, busy, machine_hash)
             VALUES (?1, ?2, ?3, ?4, 1, 0, ?5, ?5, ?6, ?6, ?7, ?8, ?9)",
        )?
        .execute(params![
            e.machine.as_str(),
            e.key.as_str(),
            e.state.as_str(),
            props,
            now,
            e.auto_at,
            e.request_id,
            e.auto_at.is_some() || e.offer.is_some(),
            e.machine_hash
        ]);
    match inserted {
        Ok(_) => {}
        Err(err) if is_unique_violation(&err) => {
            return Err(Fail::Op(OpError::AlreadyExists { machine: e.machine.to_string(), key: e.key.to_string() }));
        }
        Err(err) => return Err(err.into()),
    }
    let id = tx.last_insert_rowid();
    tx.prepare_cached(
        "INSERT INTO history (entity_id, from_state, to_state, kind, retry, request_id, at, machine_hash,
            ordinal, transition_kind, end_health, entry_time, start_time, outcome)
         VALUES (?1, NULL, ?2, 'create', 0, ?3, ?4, ?5, 1, 'create', ?6, ?4, ?4, 'ok')",
    )?
    .execute(params![id, e.state.as_str(), e.request_id, now, e.machine_hash, e.health])?;
    if e.notify_self {
        tx.prepare_cached(
            "INSERT INTO inbox (entity_id, event, params, request_id, kind, created_at)
             VALUES (?1, ?2, '{}', ?3, 'notice', ?4)",
        )?
        .execute(params![id, InboxKind::NOTICE_EVENT, e.request_id, now])?;
    }
    if !e.timers.is_empty() {
        set_timers(tx, id, &e.timers)?;
    }
    if let Some(offer) = &e.offer {
        offer_task(tx, now, id, e.state.as_str(), 1, 0, e.request_id.as_deref(), offer)?;
    }
    if e.notify_self || !e.timers.is_empty() {
        refresh_due(tx, id, now, !e.timers.is_empty())?;
    }
    // An external create that leaves the entity at rest ends its operation now; entities
    // created by an action belong to that action's commit, which checks at its end.
    if e.operation.is_some()
        && let Some(r) = &e.request_id
        && e.auto_at.is_none()
        && e.offer.is_none()
        && !e.notify_self
    {
        complete_operation(tx, r, now)?;
    }
    let row = tx
        .prepare_cached(&format!("SELECT {ENTITY_COLS} FROM entities WHERE id = ?1"))?
        .query_row([id], entity_from_row)?;
    Ok(Applied::Created(row))
}

fn push_event(tx: &Transaction<'_>, now: Millis, p: &Push) -> Result<Applied, Fail> {
    let entity_id: Option<i64> = tx
        .prepare_cached("SELECT id FROM entities WHERE machine = ?1 AND key = ?2")?
        .query_row(params![p.machine.as_str(), p.key.as_str()], |r| r.get(0))
        .optional()?;
    let Some(entity_id) = entity_id else {
        return Err(Fail::Op(OpError::NotFound { machine: p.machine.to_string(), key: p.key.to_string() }));
    };
    if let Some(op) = &p.operation
        && let Some(operation_id) = open_operation(tx, now, op, &p.machine, &p.key)?
    {
        return Ok(Applied::Replayed { operation_id });
    }
    tx.prepare_cached(
        "INSERT INTO inbox (entity_id, event, params, request_id, kind, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )?
    .execute(params![entity_id, p.event.as_str(), json_text(&p.params), p.request_id, p.kind.as_str(), now])?;
    let inbox_id = tx.last_insert_rowid();
    if let Some(pred) = p.join_from {
        add_successor(tx, now, pred, entity_id, p.request_id.as_deref())?;
    }
    tx.prepare_cached(
        "UPDATE entities SET due_at = ?2
         WHERE id = ?1 AND lease_owner IS NULL AND run_status = 'active' AND (due_at IS NULL OR due_at > ?2)",
    )?
    .execute(params![entity_id, now])?;
    Ok(Applied::Pushed { inbox_id, entity_id })
}

fn inbox_head(tx: &Transaction<'_>, entity_id: i64) -> rusqlite::Result<Option<InboxItem>> {
    tx.prepare_cached(
        "SELECT id, entity_id, event, params, request_id, created_at, kind FROM inbox WHERE entity_id = ?1 ORDER BY id LIMIT 1",
    )?
    .query_row([entity_id], inbox_from_row)
    .optional()
}

fn json_to_sql(v: &Value) -> SqlValue {
    match v {
        Value::Null => SqlValue::Null,
        Value::Bool(b) => SqlValue::Integer(*b as i64),
        Value::Number(n) => match n.as_i64() {
            Some(i) => SqlValue::Integer(i),
            None => SqlValue::Real(n.as_f64().unwrap_or(f64::NAN)),
        },
        Value::String(s) => SqlValue::Text(s.clone()),
        other => SqlValue::Text(other.to_string()),
    }
}

fn apply_commit(tx: &Transaction<'_>, now: Millis, c: &Commit) -> Result<Applied, Fail> {
    let f = &c.fence;
    let hold = matches!(c.after, AfterCommit::Hold);
    for &(entity_id, expected) in &c.preconditions {
        let found: i64 = tx
            .prepare_cached("SELECT version FROM entities WHERE id = ?1")?
            .query_row([entity_id], |r| r.get(0))
            .optional()?
            .unwrap_or(0);
        if found != expected {
            return Err(Fail::Op(OpError::Precondition { entity_id, expected, found }));
        }
    }
    let fired = c.fired.as_ref().map(|f| json_text(&f.iter().map(|e| e.as_str()).collect::<Vec<_>>()));
    let (status, sleep_until) = match c.run_status {
        Some((s, until)) => (Some(s.as_str()), until),
        None => (None, None),
    };
    // The fence: only the lease holder, at the version it read, may write. The lease is
    // kept only by a `Hold` commit on an entity that is (still) active; it then keeps its
    // lease time and due time (renewals extend them), so the due index is not touched.
    // Otherwise the entity's next due time is computed from its new columns.
    let updated = tx
        .prepare_cached(
            "UPDATE entities SET
                state = COALESCE(?4, state),
                version = version + (?4 IS NOT NULL),
                retry = CASE WHEN ?4 IS NOT NULL THEN ?5 ELSE retry END,
                entered_at = CASE WHEN ?4 IS NOT NULL THEN ?6 ELSE entered_at END,
                auto_at = CASE WHEN ?4 IS NOT NULL THEN ?7 ELSE auto_at END,
                busy = CASE WHEN ?4 IS NOT NULL THEN ?7 IS NOT NULL AND COALESCE(?11, run_status) <> 'failed'
                            ELSE busy AND COALESCE(?11, run_status) <> 'failed' END,
                request_id = CASE WHEN ?4 IS NOT NULL THEN COALESCE(?8, request_id) ELSE request_id END,
                properties = COALESCE(?9, properties),
                fired = COALESCE(?10, fired),
                run_status = COALESCE(?11, run_status),
                sleep_until = CASE WHEN ?11 IS NOT NULL THEN ?12 ELSE sleep_until END,
                recent_errors = COALESCE(?13, recent_errors),
                machine_hash = COALESCE(?14, machine_hash),
                ordinal = CASE WHEN ?4 IS NULL THEN ordinal WHEN ?17 THEN 1 ELSE ordinal + 1 END,
                event_id = CASE WHEN ?18 THEN NULL WHEN ?4 IS NOT NULL AND ?17 THEN ?16 ELSE event_id END,
                lease_owner = CASE WHEN ?15 AND COALESCE(?11, run_status) = 'active' THEN lease_owner END,
                lease_until = CASE WHEN ?15 AND COALESCE(?11, run_status) = 'active' THEN lease_until END,
                due_at = CASE
                    WHEN COALESCE(?11, run_status) IN ('paused', 'failed', 'killed') THEN NULL
                    WHEN COALESCE(?11, run_status) IN ('sleeping', 'fault') THEN
                        CASE WHEN ?11 IS NOT NULL THEN ?12 ELSE sleep_until END
                    WHEN ?15 THEN due_at
                    WHEN EXISTS (SELECT 1 FROM inbox WHERE entity_id = ?1 AND id <> ?16) THEN ?6
                    WHEN (CASE WHEN ?4 IS NOT NULL THEN ?7 ELSE auto_at END) IS NULL THEN timer_at
                    WHEN timer_at IS NULL THEN CASE WHEN ?4 IS NOT NULL THEN ?7 ELSE auto_at END
                    ELSE MIN(CASE WHEN ?4 IS NOT NULL THEN ?7 ELSE auto_at END, timer_at) END
             WHERE id = ?1 AND version = ?2 AND lease_owner = ?3",
        )?
        .execute(params![
            f.entity_id,
            f.version,
            f.owner,
            c.to.as_deref(),
            c.retry,
            now,
            c.auto_at,
            c.request_id,
            c.properties.as_ref().map(json_text),
            fired,
            status,
            sleep_until,
            c.recent_errors.as_ref().map(json_text),
            c.machine_hash,
            hold,
            c.consume.unwrap_or(-1),
            c.telemetry.event.is_some(),
            c.telemetry.at_rest
        ])?;
    if updated == 0 {
        return Err(Fail::Op(OpError::LeaseLost { entity_id: f.entity_id }));
    }
    // (Not `RETURNING`: SQLite compiles it as a temporary trigger and re-prepares the
    // statement on every run.)
    let (held, has_predecessors, machine, key, ordinal): (bool, bool, String, String, i64) = tx
        .prepare_cached(
            "SELECT lease_owner IS NOT NULL, has_predecessors, machine, key, ordinal FROM entities WHERE id = ?1",
        )?
        .query_row([f.entity_id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)))?;
    if let Some(id) = c.consume {
        tx.prepare_cached("DELETE FROM inbox WHERE id = ?1 AND entity_id = ?2")?.execute([id, f.entity_id])?;
    }
    if let Some(upto) = c.consume_notices_upto {
        tx.prepare_cached("DELETE FROM inbox WHERE entity_id = ?1 AND kind = 'notice' AND id <= ?2")?
            .execute([f.entity_id, upto])?;
    }
    // The event this commit belongs to: the one it processes (its id is its inbox id),
    // else the one whose workflow the entity is in.
    let t = &c.telemetry;
    let event_id = if t.event.is_some() && c.to.is_some() { c.consume } else { t.current_event };
    if !c.quiet {
        // A state entry's history row is also its `transitions` row.
        let tr = if c.to.is_some() { t.transition.as_ref() } else { None };
        tx.prepare_cached(
            "INSERT INTO history (entity_id, from_state, to_state, kind, action, event, retry, request_id, at, detail,
                machine_hash, event_id, ordinal, transition_kind, start_health, end_health, entry_time, start_time,
                action_start_time, outcome)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20)",
        )?
        .execute(params![
            f.entity_id,
            c.from.as_str(),
            c.to.as_deref(),
            c.kind.as_str(),
            c.action.as_deref(),
            c.event.as_deref(),
            c.retry,
            c.request_id,
            now,
            c.detail,
            c.machine_hash,
            tr.and(event_id),
            tr.map(|_| ordinal),
            tr.map(|t| t.kind),
            tr.and_then(|t| t.start_health),
            tr.map(|t| t.end_health),
            tr.map(|t| t.entry_time),
            tr.map(|t| t.start_time),
            tr.and_then(|t| t.action_start_time),
            tr.map(|t| t.outcome)
        ])?;
    }
    write_telemetry(tx, now, c, event_id, &machine, &key)?;
    for (index, stmt) in c.sql.iter().enumerate() {
        let params: Vec<SqlValue> = stmt.params.iter().map(json_to_sql).collect();
        let run = tx.prepare_cached(&stmt.sql).and_then(|mut s| s.execute(rusqlite::params_from_iter(params)));
        if let Err(e) = run {
            return Err(Fail::Op(OpError::Sql { index, message: e.to_string() }));
        }
    }
    let mut created = Vec::with_capacity(c.creates.len());
    for e in &c.creates {
        let Applied::Created(row) = insert_entity(tx, now, e)? else {
            unreachable!("entities created by actions open no operation")
        };
        add_successor(tx, now, f.entity_id, row.id, c.request_id.as_deref())?;
        created.push(row.id);
    }
    for p in &c.pushes {
        push_event(tx, now, p)?;
    }
    if c.notify_predecessors && has_predecessors {
        notify_predecessors(tx, f.entity_id, now, c.request_id.as_deref())?;
    }
    if c.notify_self {
        tx.prepare_cached(
            "INSERT INTO inbox (entity_id, event, params, request_id, kind, created_at)
             VALUES (?1, ?2, '{}', ?3, 'notice', ?4)",
        )?
        .execute(params![f.entity_id, InboxKind::NOTICE_EVENT, c.request_id, now])?;
    }
    if let Some(plans) = &c.timers {
        set_timers(tx, f.entity_id, plans)?;
    }
    let version = if c.to.is_some() { f.version + 1 } else { f.version };
    if c.to.is_some() {
        cancel_tasks(tx, f.entity_id, now)?;
    }
    if let Some(offer) = &c.offer {
        let state = c.to.as_ref().unwrap_or(&c.from);
        offer_task(tx, now, f.entity_id, state, version, c.retry, c.request_id.as_deref(), offer)?;
        tx.prepare_cached("UPDATE entities SET auto_at = NULL, busy = run_status <> 'failed' WHERE id = ?1")?
            .execute([f.entity_id])?;
    }
    if c.timers.is_some() || c.notify_self || c.consume_notices_upto.is_some() || c.offer.is_some() {
        refresh_due(tx, f.entity_id, now, c.timers.is_some())?;
    }
    if c.telemetry.complete
        && let Some(r) = &c.request_id
    {
        complete_operation(tx, r, now)?;
    }
    let inbox_head = if held { inbox_head(tx, f.entity_id)? } else { None };
    Ok(Applied::Committed { held, version, inbox_head, created })
}

/// Writes the commit's `events`, `transitions`, `errors` and `exceptions` rows and closes
/// the event whose workflow ends.
fn write_telemetry(
    tx: &Transaction<'_>,
    now: Millis,
    c: &Commit,
    event_id: Option<i64>,
    machine: &str,
    key: &str,
) -> rusqlite::Result<()> {
    let t = &c.telemetry;
    let f = &c.fence;
    let mut error_id = None;
    if let Some(err) = &t.error {
        tx.prepare_cached(
            "INSERT INTO errors (entity_id, operation_id, request_id, at, kind, details)
             VALUES (?1, (SELECT id FROM operations WHERE request_id = ?2), ?2, ?3, ?4, ?5)",
        )?
        .execute(params![f.entity_id, c.request_id, now, err.kind, err.details])?;
        let id = tx.last_insert_rowid();
        error_id = Some(id);
        if let Some(details) = &err.exception {
            tx.prepare_cached("INSERT INTO exceptions (error_id, at, details) VALUES (?1, ?2, ?3)")?
                .execute(params![id, now, details])?;
        }
        if let Some(r) = &c.request_id {
            tx.prepare_cached(
                "UPDATE operations SET error_seen = 1, error = COALESCE(error, ?2) WHERE request_id = ?1",
            )?
            .execute(params![r, err.details])?;
        }
    }
    if let (Some(ev), Some(name)) = (&t.event, &c.event) {
        // An event that changes no state (rejected, failed) ends at once.
        let ended = c.to.is_none();
        // An event accepted while another one's workflow was still running interrupts it:
        // that one ends here, in the state it had reached.
        if !ended && let Some(previous) = t.current_event {
            tx.prepare_cached("UPDATE events SET end_state = ?2, end_time = ?3 WHERE id = ?1 AND end_time IS NULL")?
                .execute(params![previous, c.from.as_str(), now])?;
        }
        tx.prepare_cached(
            "INSERT INTO events (id, operation_id, request_id, seq, entity_id, machine, entity_key, event, kind,
                start_state, start_time, rejected, failed, error_id, exception, end_state, end_time)
             VALUES (?1, (SELECT id FROM operations WHERE request_id = ?2), ?2, ?1, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10,
                ?11, ?12, ?13, CASE WHEN ?14 THEN ?8 END, CASE WHEN ?14 THEN ?15 END)",
        )?
        .execute(params![
            ev.seq,
            c.request_id,
            f.entity_id,
            machine,
            key,
            name.as_str(),
            ev.kind,
            c.from.as_str(),
            ev.raised_at,
            ev.rejected,
            ev.failed,
            error_id,
            t.error.as_ref().and_then(|e| e.exception.clone()),
            ended,
            now
        ])?;
        if ev.kind == "raised"
            && let Some(r) = &c.request_id
        {
            tx.prepare_cached(
                "UPDATE operations SET first_response_at = COALESCE(first_response_at, ?2) WHERE request_id = ?1",
            )?
            .execute(params![r, now])?;
        }
    }
    // Reaching an error-health state fails the operation.
    if t.transition.as_ref().is_some_and(|tr| tr.end_health == "error")
        && c.to.is_some()
        && let Some(r) = &c.request_id
    {
        tx.prepare_cached("UPDATE operations SET error_seen = 1, error = COALESCE(error, ?2) WHERE request_id = ?1")?
            .execute(params![r, format!("entered error state `{}`", c.to.as_deref().unwrap_or_default())])?;
    }
    // The workflow of the entity's event ends when the entity is at rest.
    if t.at_rest
        && c.to.is_some()
        && let Some(id) = event_id
    {
        tx.prepare_cached("UPDATE events SET end_state = ?2, end_time = ?3 WHERE id = ?1 AND end_time IS NULL")?
            .execute(params![id, c.to.as_deref(), now])?;
    }
    Ok(())
}

fn add_successor(
    tx: &Transaction<'_>,
    now: Millis,
    pred: i64,
    succ: i64,
    request_id: Option<&str>,
) -> rusqlite::Result<()> {
    if pred == succ {
        return Ok(());
    }
    tx.prepare_cached(
        "INSERT INTO successors (predecessor_id, successor_id, request_id, created_at) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (predecessor_id, successor_id) DO NOTHING",
    )?
    .execute(params![pred, succ, request_id, now])?;
    tx.prepare_cached("UPDATE entities SET has_predecessors = 1 WHERE id = ?1 AND has_predecessors = 0")?
        .execute([succ])?;
    Ok(())
}

/// Recomputes an entity's due time (and, when its timers changed, its timer time).
fn refresh_due(tx: &Transaction<'_>, id: i64, now: Millis, timers_changed: bool) -> rusqlite::Result<()> {
    if timers_changed {
        tx.prepare_cached(
            "UPDATE entities SET timer_at = (SELECT MIN(due_at) FROM timers WHERE entity_id = ?1) WHERE id = ?1",
        )?
        .execute([id])?;
    }
    tx.prepare_cached(&format!("UPDATE entities SET due_at = {DUE_EXPR} WHERE id = :id"))?
        .execute(rusqlite::named_params! {":id": id, ":now": now})?;
    Ok(())
}

/// Writes a change notice to every predecessor of `id` and makes the free ones due.
fn notify_predecessors(tx: &Transaction<'_>, id: i64, now: Millis, request_id: Option<&str>) -> rusqlite::Result<()> {
    let inserted = tx
        .prepare_cached(
            "INSERT INTO inbox (entity_id, event, params, request_id, kind, created_at)
             SELECT predecessor_id, ?2, '{}', ?3, 'notice', ?4 FROM successors WHERE successor_id = ?1",
        )?
        .execute(params![id, InboxKind::NOTICE_EVENT, request_id, now])?;
    if inserted > 0 {
        tx.prepare_cached(
            "UPDATE entities SET due_at = ?2
             WHERE id IN (SELECT predecessor_id FROM successors WHERE successor_id = ?1)
               AND lease_owner IS NULL AND run_status = 'active' AND (due_at IS NULL OR due_at > ?2)",
        )?
        .execute(params![id, now])?;
    }
    Ok(())
}

fn set_timers(tx: &Transaction<'_>, id: i64, plans: &[TimerPlan]) -> rusqlite::Result<()> {
    let existing: Vec<String> = tx
        .prepare_cached("SELECT name FROM timers WHERE entity_id = ?1")?
        .query_map([id], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    for name in existing.iter().filter(|n| !plans.iter().any(|p| &p.name == *n)) {
        tx.prepare_cached("DELETE FROM timers WHERE entity_id = ?1 AND name = ?2")?.execute(params![id, name])?;
    }
    for p in plans {
        let sql = if p.restart {
            "INSERT INTO timers (entity_id, name, event, due_at, every_ms) VALUES (?1, ?2, ?3, ?4, ?5)
             ON CONFLICT (entity_id, name) DO UPDATE SET
                event = excluded.event, due_at = excluded.due_at, every_ms = excluded.every_ms"
        } else {
            "INSERT INTO timers (entity_id, name, event, due_at, every_ms) VALUES (?1, ?2, ?3, ?4, ?5)
             ON CONFLICT (entity_id, name) DO NOTHING"
        };
        tx.prepare_cached(sql)?.execute(params![id, p.name, p.event.as_str(), p.due_at, p.every_ms])?;
    }
    Ok(())
}

/// Turns due timers of active entities into inbox events (one-shot timers are deleted,
/// periodic ones rescheduled) in the claiming transaction; the params name the timer. A
/// paused or sleeping entity's timers wait.
fn fire_timers(tx: &Transaction<'_>, now: Millis, limit: usize) -> rusqlite::Result<()> {
    let due: Vec<TimerRow> = tx
        .prepare_cached(
            "SELECT t.entity_id, t.name, t.event, t.due_at, t.every_ms FROM timers t JOIN entities e ON e.id = t.entity_id
             WHERE t.due_at <= ?1 AND e.run_status = 'active' ORDER BY t.due_at LIMIT ?2",
        )?
        .query_map(params![now, limit as i64], timer_from_row)?
        .collect::<rusqlite::Result<_>>()?;
    for t in &due {
        tx.prepare_cached(
            "INSERT INTO inbox (entity_id, event, params, request_id, kind, created_at)
             VALUES (?1, ?2, ?3, NULL, 'timer', ?4)",
        )?
        .execute(params![
            t.entity_id,
            t.event.as_str(),
            json_text(&serde_json::json!({ "timer": t.name })),
            now
        ])?;
        match t.every_ms {
            Some(every) if every > 0 => {
                let next = (t.due_at + every).max(now + 1);
                tx.prepare_cached("UPDATE timers SET due_at = ?3 WHERE entity_id = ?1 AND name = ?2")?
                    .execute(params![t.entity_id, t.name, next])?;
            }
            _ => {
                tx.prepare_cached("DELETE FROM timers WHERE entity_id = ?1 AND name = ?2")?
                    .execute(params![t.entity_id, t.name])?;
            }
        }
        refresh_due(tx, t.entity_id, now, true)?;
    }
    Ok(())
}

fn timer_from_row(r: &Row<'_>) -> rusqlite::Result<TimerRow> {
    Ok(TimerRow {
        entity_id: r.get(0)?,
        name: r.get(1)?,
        event: EventName::new(r.get_ref(2)?.as_str()?),
        due_at: r.get(3)?,
        every_ms: r.get(4)?,
    })
}

/// An operator command. Kill bumps the version (any commit in flight is refused) and
/// cancels queued events and timers; release drops the lease; the others set the run
/// status. Recorded in history; the entity's due time follows its new status.
fn apply_command(
    tx: &Transaction<'_>,
    now: Millis,
    machine: &str,
    key: &str,
    command: Command,
    operation: Option<&OpenOperation>,
) -> Result<Applied, Fail> {
    let current: Option<(i64, String, String, Option<String>)> = tx
        .prepare_cached("SELECT id, state, run_status, request_id FROM entities WHERE machine = ?1 AND key = ?2")?
        .query_row(params![machine, key], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .optional()?;
    let Some((id, state, status, entity_request)) = current else {
        return Err(Fail::Op(OpError::NotFound { machine: machine.to_string(), key: key.to_string() }));
    };
    if let Some(op) = operation
        && let Some(operation_id) = open_operation(tx, now, op, machine, key)?
    {
        return Ok(Applied::Replayed { operation_id });
    }
    if status == "killed" && command != Command::Kill {
        return Err(Fail::Op(OpError::Killed { machine: machine.to_string(), key: key.to_string() }));
    }
    let sql = match command {
        Command::Pause => "UPDATE entities SET run_status = 'paused', sleep_until = NULL WHERE id = ?1",
        Command::Resume => {
            "UPDATE entities SET run_status = 'active', sleep_until = NULL, recent_errors = '[]',
                auto_at = CASE WHEN auto_at IS NOT NULL AND ?3 IN ('fault', 'failed') THEN ?2 ELSE auto_at END,
                busy = auto_at IS NOT NULL OR EXISTS (SELECT 1 FROM agent_tasks t
                    WHERE t.entity_id = ?1 AND t.status IN ('ready', 'leased'))
             WHERE id = ?1"
        }
        Command::Sleep { .. } => "UPDATE entities SET run_status = 'sleeping', sleep_until = ?4 WHERE id = ?1",
        Command::Kill => {
            "UPDATE entities SET run_status = 'killed', sleep_until = NULL, version = version + 1, busy = 0,
                lease_owner = NULL, lease_until = NULL, auto_at = NULL, timer_at = NULL
             WHERE id = ?1"
        }
        Command::Release => "UPDATE entities SET lease_owner = NULL, lease_until = NULL WHERE id = ?1",
        Command::Retry => {
            "UPDATE entities SET run_status = 'active', sleep_until = NULL,
                auto_at = CASE WHEN auto_at IS NOT NULL THEN ?2 ELSE auto_at END,
                busy = auto_at IS NOT NULL OR EXISTS (SELECT 1 FROM agent_tasks t
                    WHERE t.entity_id = ?1 AND t.status IN ('ready', 'leased'))
             WHERE id = ?1"
        }
    };
    let until = match command {
        Command::Sleep { until } => Some(until),
        _ => None,
    };
    let (p3, p4) = (status.as_str(), until);
    match command {
        Command::Resume => tx.prepare_cached(sql)?.execute(params![id, now, p3])?,
        Command::Sleep { .. } => tx.prepare_cached(sql)?.execute(params![id, now, p3, p4])?,
        Command::Retry => tx.prepare_cached(sql)?.execute(params![id, now])?,
        _ => tx.prepare_cached(sql)?.execute(params![id])?,
    };
    if command == Command::Retry {
        // A task waiting for its delay or backoff is offered now.
        tx.prepare_cached("UPDATE agent_tasks SET available_at = ?2 WHERE entity_id = ?1 AND status = 'ready'")?
            .execute(params![id, now])?;
    }
    let request_id = operation.map(|o| o.request_id.clone());
    if command == Command::Kill {
        // Cancel pending work; the operations it belonged to end as canceled.
        let mut canceled: Vec<String> = tx
            .prepare_cached("SELECT DISTINCT request_id FROM inbox WHERE entity_id = ?1 AND request_id IS NOT NULL")?
            .query_map([id], |r| r.get(0))?
            .collect::<rusqlite::Result<_>>()?;
        canceled.extend(entity_request);
        tx.prepare_cached("DELETE FROM inbox WHERE entity_id = ?1")?.execute([id])?;
        tx.prepare_cached("DELETE FROM timers WHERE entity_id = ?1")?.execute([id])?;
        cancel_tasks(tx, id, now)?;
        for r in &canceled {
            tx.prepare_cached("UPDATE operations SET canceled = 1 WHERE request_id = ?1 AND ended_at IS NULL")?
                .execute([r])?;
            complete_operation(tx, r, now)?;
        }
    }
    tx.prepare_cached(
        "INSERT INTO history (entity_id, from_state, to_state, kind, retry, request_id, at, detail)
         VALUES (?1, ?2, NULL, 'command', 0, ?3, ?4, ?5)",
    )?
    .execute(params![id, state, request_id, now, command.as_str()])?;
    refresh_due(tx, id, now, false)?;
    if let Some(r) = &request_id {
        // A command is done when it is applied.
        tx.prepare_cached(
            "UPDATE operations SET first_response_at = ?2, ended_at = ?2, outcome = 'success'
             WHERE request_id = ?1 AND ended_at IS NULL",
        )?
        .execute(params![r, now])?;
    }
    let row = tx
        .prepare_cached(&format!("SELECT {ENTITY_COLS} FROM entities WHERE id = ?1"))?
        .query_row([id], entity_from_row)?;
    Ok(Applied::Commanded(row))
}

/// Writes an agent task for the entity's state entry `version`.
#[allow(clippy::too_many_arguments)]
fn offer_task(
    tx: &Transaction<'_>,
    now: Millis,
    entity_id: i64,
    state: &str,
    version: i64,
    retry: u32,
    request_id: Option<&str>,
    o: &TaskOffer,
) -> rusqlite::Result<()> {
    // One open task per entity: a repeated offer (e.g. after a resume) keeps the open one.
    tx.prepare_cached(
        "INSERT INTO agent_tasks (entity_id, queue, action, state, entity_version, retry, lock_ms, request_id,
            status, available_at, created_at)
         SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, 'ready', ?9, ?10
         WHERE NOT EXISTS (SELECT 1 FROM agent_tasks WHERE entity_id = ?1 AND status IN ('ready', 'leased'))",
    )?
    .execute(params![
        entity_id,
        o.queue,
        o.action.as_str(),
        state,
        version,
        retry,
        o.lock_ms,
        request_id,
        o.available_at,
        now
    ])?;
    Ok(())
}

/// Cancels the entity's open tasks (it left the state, or was killed): their reports
/// are refused from now on.
fn cancel_tasks(tx: &Transaction<'_>, entity_id: i64, now: Millis) -> rusqlite::Result<()> {
    tx.prepare_cached(
        "UPDATE agent_tasks SET status = 'canceled', outcome = 'canceled', finished_at = ?2
         WHERE entity_id = ?1 AND status IN ('ready', 'leased')",
    )?
    .execute(params![entity_id, now])?;
    Ok(())
}

fn lease_tasks(
    tx: &Transaction<'_>,
    now: Millis,
    queue: &str,
    agent: &str,
    limit: usize,
    token_prefix: &str,
) -> rusqlite::Result<Vec<AgentTask>> {
    let ids: Vec<i64> = tx
        .prepare_cached(
            "SELECT t.id FROM agent_tasks t JOIN entities e ON e.id = t.entity_id
             WHERE t.queue = ?1 AND t.status IN ('ready', 'leased') AND t.available_at <= ?2 AND e.run_status = 'active'
             ORDER BY t.available_at, t.id LIMIT ?3",
        )?
        .query_map(params![queue, now, limit as i64], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    let mut tasks = Vec::with_capacity(ids.len());
    for id in ids {
        tx.prepare_cached(
            "UPDATE agent_tasks SET status = 'leased', attempt = attempt + 1, token = ?2 || id, agent = ?3,
                leased_at = ?4, locked_until = ?4 + lock_ms, available_at = ?4 + lock_ms
             WHERE id = ?1",
        )?
        .execute(params![id, token_prefix, agent, now])?;
        tasks.push(
            tx.prepare_cached(&format!(
                "SELECT {TASK_COLS} FROM agent_tasks t JOIN entities e ON e.id = t.entity_id WHERE t.id = ?1"
            ))?
            .query_row([id], task_from_row)?,
        );
    }
    Ok(tasks)
}

/// Checks that `token` holds task `task` now; answers its lock time, or why not.
fn check_task(tx: &Transaction<'_>, now: Millis, task: i64, token: &str) -> Result<(i64,), Fail> {
    type Lease = (String, Option<String>, Option<i64>, i64, u32);
    let row: Option<Lease> = tx
        .prepare_cached("SELECT status, token, locked_until, lock_ms, attempt FROM agent_tasks WHERE id = ?1")?
        .query_row([task], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)))
        .optional()?;
    let Some((status, held, locked_until, lock_ms, attempt)) = row else {
        return Err(Fail::Op(OpError::TaskRefused { task, reason: "no such task".into() }));
    };
    task_refusal(&status, held.as_deref(), locked_until, attempt, token, now)
        .map(|reason| Err(Fail::Op(OpError::TaskRefused { task, reason })))
        .unwrap_or(Ok((lock_ms,)))
}

fn apply_op(tx: &Transaction<'_>, now: Millis, op: &Op) -> Result<Applied, Fail> {
    match op {
        Op::Create(e) => insert_entity(tx, now, e),
        Op::Push(p) => push_event(tx, now, p),
        Op::Commit(c) => apply_commit(tx, now, c),
        Op::Command { machine, key, command, operation } => {
            apply_command(tx, now, machine, key, *command, operation.as_ref())
        }
        Op::MarkHung { before } => {
            // No progress since `before`: nothing it reached entered a state (or retried)
            // since, and no event of it was queued since.
            let n = tx
                .prepare_cached(
                    "UPDATE operations SET outcome = 'hung'
                     WHERE ended_at IS NULL AND outcome IS NULL AND started_at < ?1
                       AND NOT EXISTS (SELECT 1 FROM entities e WHERE e.request_id = operations.request_id
                                          AND e.busy = 1 AND e.entered_at >= ?1)
                       AND NOT EXISTS (SELECT 1 FROM inbox i WHERE i.request_id = operations.request_id
                                          AND i.created_at >= ?1)",
                )?
                .execute([before])?;
            Ok(Applied::MarkedHung(n as u64))
        }
        Op::Release(f) => {
            let n = tx
                .prepare_cached(
                    "UPDATE entities SET lease_owner = NULL, lease_until = NULL
                     WHERE id = ?1 AND version = ?2 AND lease_owner = ?3",
                )?
                .execute(params![f.entity_id, f.version, f.owner])?;
            if n == 0 {
                return Err(Fail::Op(OpError::LeaseLost { entity_id: f.entity_id }));
            }
            refresh_due(tx, f.entity_id, now, false)?;
            Ok(Applied::Released)
        }
        Op::TaskLease { queue, agent, limit, token_prefix } => {
            lease_tasks(tx, now, queue, agent, *limit, token_prefix).map(Applied::Leased).map_err(Fail::from)
        }
        Op::TaskHeartbeat { task, token } => {
            let (lock_ms,) = check_task(tx, now, *task, token)?;
            let until = now + lock_ms;
            tx.prepare_cached("UPDATE agent_tasks SET locked_until = ?2, available_at = ?2 WHERE id = ?1")?
                .execute(params![task, until])?;
            Ok(Applied::Extended { locked_until: until })
        }
        Op::TaskReport { task, token, result } => {
            check_task(tx, now, *task, token)?;
            let (outcome, error) = match result {
                TaskResult::Complete { .. } => ("complete", None),
                TaskResult::Fail { error, .. } => ("fail", Some(error.as_str())),
            };
            tx.prepare_cached(
                "UPDATE agent_tasks SET status = 'done', finished_at = ?2, outcome = ?3, error = ?4 WHERE id = ?1",
            )?
            .execute(params![task, now, outcome, error])?;
            let push = tx
                .prepare_cached(
                    "SELECT e.machine, e.key, t.entity_version, t.attempt, t.leased_at, t.agent, t.request_id
                     FROM agent_tasks t JOIN entities e ON e.id = t.entity_id WHERE t.id = ?1",
                )?
                .query_row([task], |r| {
                    let report = AgentReport {
                        task: *task,
                        entity_version: r.get(2)?,
                        attempt: r.get(3)?,
                        leased_at: r.get(4)?,
                        agent: r.get(5)?,
                        result: result.clone(),
                    };
                    Ok(report_push(r.get::<_, String>(0)?, r.get::<_, String>(1)?, &report, r.get(6)?))
                })?;
            push_event(tx, now, &push)
        }
        Op::Renew { ids, owner, until } => {
            let mut stmt = tx.prepare_cached(
                "UPDATE entities SET lease_until = ?3, due_at = ?3 WHERE id = ?1 AND lease_owner = ?2",
            )?;
            let mut n = 0;
            for id in ids {
                n += stmt.execute(params![id, owner, until])? as u64;
            }
            Ok(Applied::Renewed(n))
        }
    }
}

fn apply_batch(conn: &mut Connection, batch: &Batch) -> rusqlite::Result<BatchResult> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let now = batch.now;
    let mut results = Vec::with_capacity(batch.ops.len());
    for op in &batch.ops {
        let savepoint = needs_savepoint(op);
        if savepoint {
            tx.execute_batch("SAVEPOINT op")?;
        }
        match apply_op(&tx, now, op) {
            Ok(applied) => {
                if savepoint {
                    tx.execute_batch("RELEASE op")?;
                }
                results.push(Ok(applied));
            }
            Err(Fail::Op(e)) => {
                if savepoint {
                    tx.execute_batch("ROLLBACK TO op; RELEASE op")?;
                }
                results.push(Err(e));
            }
            Err(Fail::Db(e)) => return Err(e),
        }
    }
    let mut claimed = Vec::new();
    if let Some(claim) = &batch.claim {
        fire_timers(&tx, now, 1_000)?;
        let until = now + claim.lease_ms;
        // A sleeping or backing-off entity that comes due wakes up: it is active again.
        let ids: Vec<i64> = tx
            .prepare_cached("SELECT id FROM entities WHERE due_at <= ?1 ORDER BY due_at LIMIT ?2")?
            .query_map(params![now, claim.limit as i64], |r| r.get(0))?
            .collect::<rusqlite::Result<_>>()?;
        let mut entities = Vec::with_capacity(ids.len());
        for id in ids {
            tx.prepare_cached(
                "UPDATE entities SET lease_owner = ?2, lease_until = ?3, due_at = ?3, sleep_until = NULL,
                    run_status = CASE WHEN run_status IN ('sleeping', 'fault') THEN 'active' ELSE run_status END
                 WHERE id = ?1",
            )?
            .execute(params![id, claim.owner, until])?;
            entities.push(
                tx.prepare_cached(&format!("SELECT {ENTITY_COLS} FROM entities WHERE id = ?1"))?
                    .query_row([id], entity_from_row)?,
            );
        }
        for entity in entities {
            let inbox_head = inbox_head(&tx, entity.id)?;
            claimed.push(Claimed { entity, inbox_head });
        }
    }
    let next_due: Option<Millis> =
        tx.prepare_cached("SELECT MIN(due_at) FROM entities WHERE due_at IS NOT NULL")?.query_row([], |r| r.get(0))?;
    tx.commit()?;
    Ok(BatchResult { results, claimed, next_due })
}

/// Runs `read` in one read transaction: WAL gives it a consistent snapshot.
fn in_read_transaction<T>(c: &Connection, read: impl FnOnce(&Connection) -> rusqlite::Result<T>) -> Result<T> {
    c.execute_batch("BEGIN").map_err(db_err)?;
    let out = read(c);
    c.execute_batch("COMMIT").map_err(db_err)?;
    out.map_err(db_err)
}

fn count(n: i64) -> u64 {
    n.max(0) as u64
}

/// The KPIs of [`Store::stats`]: counts in SQL, duration percentiles from the sorted
/// durations.
fn read_stats(c: &Connection, since: Millis) -> rusqlite::Result<Stats> {
    let mut operations: Vec<OperationStats> = c
        .prepare_cached(
            "SELECT name, COUNT(*), COUNT(ended_at), SUM(ended_at IS NOT NULL AND outcome = 'success')
             FROM operations WHERE started_at >= ?1 GROUP BY name ORDER BY name",
        )?
        .query_map([since], |r| {
            let (ended, success) = (count(r.get(2)?), count(r.get(3)?));
            Ok(OperationStats {
                name: r.get(0)?,
                count: count(r.get(1)?),
                ended,
                success,
                success_rate: if ended == 0 { 0.0 } else { success as f64 / ended as f64 },
                p50_ms: 0,
                p99_ms: 0,
            })
        })?
        .collect::<rusqlite::Result<_>>()?;
    let mut durations: std::collections::HashMap<String, Vec<i64>> = std::collections::HashMap::new();
    let mut stmt = c.prepare_cached(
        "SELECT name, ended_at - started_at FROM operations
         WHERE started_at >= ?1 AND ended_at IS NOT NULL ORDER BY name, 2",
    )?;
    let mut rows = stmt.query([since])?;
    while let Some(r) = rows.next()? {
        durations.entry(r.get(0)?).or_default().push(r.get(1)?);
    }
    for op in &mut operations {
        let sorted = durations.remove(&op.name).unwrap_or_default();
        op.p50_ms = percentile(&sorted, 0.50);
        op.p99_ms = percentile(&sorted, 0.99);
    }
    let transitions = c
        .prepare_cached(
            "SELECT machine, start_state, end_state, COUNT(*), AVG(outcome = 'error'), AVG(retry_count)
             FROM transitions WHERE end_time >= ?1
             GROUP BY machine, start_state, end_state ORDER BY machine, start_state, end_state",
        )?
        .query_map([since], |r| {
            Ok(TransitionStats {
                machine: r.get(0)?,
                from: r.get(1)?,
                to: r.get(2)?,
                count: count(r.get(3)?),
                error_rate: r.get::<_, Option<f64>>(4)?.unwrap_or(0.0),
                mean_retries: r.get::<_, Option<f64>>(5)?.unwrap_or(0.0),
            })
        })?
        .collect::<rusqlite::Result<_>>()?;
    let top_errors = c
        .prepare_cached(
            "SELECT kind, details, COUNT(*) FROM errors WHERE at >= ?1
             GROUP BY kind, details ORDER BY COUNT(*) DESC, kind, details LIMIT 10",
        )?
        .query_map([since], |r| Ok(ErrorStats { kind: r.get(0)?, details: r.get(1)?, count: count(r.get(2)?) }))?
        .collect::<rusqlite::Result<_>>()?;
    Ok(Stats { operations, transitions, top_errors })
}

/// The counters and gauges of [`Store::metrics_snapshot`].
fn read_metrics(c: &Connection, now: Millis) -> rusqlite::Result<MetricsSnapshot> {
    let scalar = |sql: &str, p: &[&dyn rusqlite::ToSql]| -> rusqlite::Result<u64> {
        c.prepare_cached(sql)?.query_row(p, |r| r.get::<_, i64>(0)).map(count)
    };
    let transitions = c
        .prepare_cached(
            "SELECT machine, start_state, end_state, COUNT(*) FROM transitions
             GROUP BY machine, start_state, end_state ORDER BY machine, start_state, end_state",
        )?
        .query_map([], |r| {
            Ok(TransitionCount { machine: r.get(0)?, from: r.get(1)?, to: r.get(2)?, count: count(r.get(3)?) })
        })?
        .collect::<rusqlite::Result<_>>()?;
    let entities = c
        .prepare_cached(
            "SELECT machine, state, run_status, COUNT(*) FROM entities
             GROUP BY machine, state, run_status ORDER BY machine, state, run_status",
        )?
        .query_map([], |r| {
            let status = r.get_ref(2)?.as_str()?;
            Ok(EntityCount {
                machine: r.get(0)?,
                state: r.get(1)?,
                run_status: RunStatus::parse(status)
                    .ok_or_else(|| conversion(2, format!("unknown run status `{status}`")))?,
                count: count(r.get(3)?),
            })
        })?
        .collect::<rusqlite::Result<_>>()?;
    let operations = c
        .prepare_cached(
            "SELECT COALESCE(outcome, 'open'), COUNT(*) FROM operations GROUP BY COALESCE(outcome, 'open') ORDER BY 1",
        )?
        .query_map([], |r| Ok((r.get(0)?, count(r.get(1)?))))?
        .collect::<rusqlite::Result<_>>()?;
    let tasks = c
        .prepare_cached(
            "SELECT queue, status, COUNT(*) FROM agent_tasks WHERE status IN ('ready', 'leased')
             GROUP BY queue, status ORDER BY queue, status",
        )?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, count(r.get(2)?))))?
        .collect::<rusqlite::Result<_>>()?;
    Ok(MetricsSnapshot {
        tasks,
        transitions,
        events_rejected: scalar("SELECT COUNT(*) FROM events WHERE rejected = 1", &[])?,
        faults: scalar("SELECT COUNT(*) FROM errors", &[])?,
        parked: scalar("SELECT COUNT(*) FROM entities WHERE run_status = 'failed'", &[])?,
        entities,
        due_backlog: scalar("SELECT COUNT(*) FROM entities WHERE due_at <= ?1", &[&now])?,
        operations,
    })
}

impl Store for SqliteStore {
    async fn write(&self, batch: Batch) -> Result<BatchResult> {
        self.on_writer(move |conn| apply_batch(conn, &batch).map_err(db_err)).await
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
        self.on_reader(move |c| {
            let sql = format!(
                "SELECT {ENTITY_COLS} FROM entities
                 WHERE (?1 IS NULL OR machine = ?1) AND (?2 IS NULL OR state = ?2) AND id > ?3
                   AND (?5 IS NULL OR run_status = ?5)
                 ORDER BY id LIMIT ?4"
            );
            let limit = filter.limit.map(|l| l.min(i64::MAX as u64) as i64).unwrap_or(-1);
            let mut stmt = c.prepare_cached(&sql).map_err(db_err)?;
            stmt.query_map(
                params![filter.machine, filter.state, filter.after_id.unwrap_or(0), limit, filter.run_status],
                entity_from_row,
            )
            .and_then(|rows| rows.collect())
            .map_err(db_err)
        })
        .await
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
                .prepare_cached(
                    "SELECT id, entity_id, event, params, request_id, created_at, kind FROM inbox WHERE entity_id = ?1 ORDER BY id",
                )
                .map_err(db_err)?;
            stmt.query_map([entity_id], inbox_from_row).and_then(|rows| rows.collect()).map_err(db_err)
        })
        .await
    }

    async fn machine_put(&self, name: &str, hash: &str, definition: &str, now: Millis) -> Result<()> {
        let (name, hash, definition) = (name.to_string(), hash.to_string(), definition.to_string());
        self.on_writer(move |c| {
            c.execute(
                "INSERT INTO machines (name, hash, definition, created_at) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (name, hash) DO NOTHING",
                params![name, hash, definition, now],
            )
            .map(|_| ())
            .map_err(db_err)
        })
        .await
    }

    async fn machine_list(&self) -> Result<Vec<MachineRecord>> {
        self.on_reader(|c| {
            let mut stmt = c
                .prepare_cached("SELECT name, hash, definition, created_at FROM machines ORDER BY name, created_at")
                .map_err(db_err)?;
            stmt.query_map([], |r| {
                Ok(MachineRecord {
                    name: MachineName::new(r.get_ref(0)?.as_str()?),
                    hash: r.get(1)?,
                    definition: r.get(2)?,
                    created_at: r.get(3)?,
                })
            })
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
            c.execute(
                "INSERT INTO meta (key, value) VALUES (?1, ?2) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                [key, value],
            )
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

    async fn operation_list(&self, outcome: Option<String>, limit: u64) -> Result<Vec<OperationRow>> {
        self.on_reader(move |c| {
            let mut stmt = c
                .prepare_cached(&format!(
                    "SELECT {OPERATION_COLS} FROM operations
                     WHERE ?1 IS NULL OR (?1 = 'open' AND ended_at IS NULL) OR outcome = ?1
                     ORDER BY id DESC LIMIT ?2"
                ))
                .map_err(db_err)?;
            stmt.query_map(params![outcome, limit.min(i64::MAX as u64) as i64], operation_from_row)
                .and_then(|rows| rows.collect())
                .map_err(db_err)
        })
        .await
    }

    async fn machine_migrate(
        &self,
        machine: &str,
        moves: Vec<(String, String)>,
        hash: &str,
        now: Millis,
    ) -> Result<u64> {
        let (machine, hash) = (machine.to_string(), hash.to_string());
        self.on_writer(move |c| {
            let tx = c.transaction().map_err(db_err)?;
            let mut moved = 0;
            for (old, new) in &moves {
                tx.execute(
                    "INSERT INTO history (entity_id, from_state, to_state, kind, retry, at, detail, machine_hash)
                     SELECT id, state, ?3, 'command', 0, ?4, 'upgrade: state renamed', ?5
                     FROM entities WHERE machine = ?1 AND state = ?2",
                    params![machine, old, new, now, hash],
                )
                .map_err(db_err)?;
                // A renamed state keeps its open agent task, fenced by the entity's new version.
                tx.execute(
                    "UPDATE agent_tasks SET state = ?3, entity_version = entity_version + 1
                     WHERE status IN ('ready', 'leased')
                       AND entity_id IN (SELECT id FROM entities WHERE machine = ?1 AND state = ?2)",
                    params![machine, old, new],
                )
                .map_err(db_err)?;
                moved += tx
                    .execute(
                        "UPDATE entities SET state = ?3, version = version + 1, machine_hash = ?4
                         WHERE machine = ?1 AND state = ?2",
                        params![machine, old, new, hash],
                    )
                    .map_err(db_err)? as u64;
            }
            tx.commit().map_err(db_err)?;
            Ok(moved)
        })
        .await
    }

    async fn machine_versions(&self) -> Result<Vec<(MachineRecord, u64)>> {
        self.on_reader(|c| {
            let mut stmt = c
                .prepare_cached(
                    "SELECT m.name, m.hash, m.definition, m.created_at,
                        (SELECT COUNT(*) FROM entities e WHERE e.machine = m.name AND e.machine_hash = m.hash)
                     FROM machines m ORDER BY m.name, m.created_at",
                )
                .map_err(db_err)?;
            stmt.query_map([], |r| {
                Ok((
                    MachineRecord {
                        name: MachineName::new(r.get_ref(0)?.as_str()?),
                        hash: r.get(1)?,
                        definition: r.get(2)?,
                        created_at: r.get(3)?,
                    },
                    r.get::<_, i64>(4)? as u64,
                ))
            })
            .and_then(|rows| rows.collect())
            .map_err(db_err)
        })
        .await
    }

    async fn events_list(&self, entity_id: i64) -> Result<Vec<EventRow>> {
        self.on_reader(move |c| {
            let mut stmt = c
                .prepare_cached(
                    "SELECT ev.id, ev.request_id, ev.event, ev.kind, ev.start_state, ev.end_state, ev.start_time,
                        ev.end_time, ev.rejected, ev.failed, er.details, ev.exception
                     FROM events ev LEFT JOIN errors er ON er.id = ev.error_id
                     WHERE ev.entity_id = ?1 ORDER BY ev.id",
                )
                .map_err(db_err)?;
            stmt.query_map([entity_id], |r| {
                Ok(EventRow {
                    id: r.get(0)?,
                    request_id: r.get(1)?,
                    event: EventName::new(r.get_ref(2)?.as_str()?),
                    kind: r.get(3)?,
                    start_state: StateName::new(r.get_ref(4)?.as_str()?),
                    end_state: r.get::<_, Option<String>>(5)?.map(StateName::from),
                    start_time: r.get(6)?,
                    end_time: r.get(7)?,
                    rejected: r.get(8)?,
                    failed: r.get(9)?,
                    error: r.get(10)?,
                    exception: r.get(11)?,
                })
            })
            .and_then(|rows| rows.collect())
            .map_err(db_err)
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
            sql.push_str(&format!(" ORDER BY t.id DESC LIMIT ?{}", values.len()));
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

    async fn lease_release_all(&self, now: Millis) -> Result<u64> {
        self.on_writer(move |c| {
            let tx = c.transaction().map_err(db_err)?;
            let ids: Vec<i64> = tx
                .prepare("UPDATE entities SET lease_owner = NULL, lease_until = NULL WHERE lease_owner IS NOT NULL RETURNING id")
                .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())
                .map_err(db_err)?;
            for &id in &ids {
                refresh_due(&tx, id, now, false).map_err(db_err)?;
            }
            // A previous engine died with work in flight: the open operations live on
            // through this restart.
            if !ids.is_empty() {
                tx.execute("UPDATE operations SET restart_count = restart_count + 1 WHERE ended_at IS NULL", [])
                    .map_err(db_err)?;
            }
            tx.commit().map_err(db_err)?;
            Ok(ids.len() as u64)
        })
        .await
    }
}
