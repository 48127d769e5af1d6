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
use std::sync::{Arc, Mutex, mpsc};

use rusqlite::types::Value as SqlValue;
use rusqlite::{Connection, OpenFlags, OptionalExtension, Row, Transaction, TransactionBehavior, params};
use serde_json::Value;
use settle_core::{ActionName, EntityKey, EventName, MachineName, Properties, StateName};
use tokio::sync::oneshot;

use crate::types::*;
use crate::{Error, Result, Store};

const MIGRATIONS: &[(i64, &str)] = &[
    (1, include_str!("../migrations/sqlite/0001_core.sql")),
    (2, include_str!("../migrations/sqlite/0002_workflows.sql")),
];

type Job = Box<dyn FnOnce(&mut Connection) + Send>;

/// The SQLite implementation of [`Store`]. Cheap to clone; clones share the writer.
#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    writer: Option<Mutex<mpsc::Sender<Job>>>,
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
        let (tx, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("settle-sqlite-writer".into())
            .spawn(move || {
                let mut conn = conn;
                while let Ok(job) = rx.recv() {
                    job(&mut conn);
                }
            })
            .map_err(|e| open_err(format!("cannot start writer thread: {e}")))?;
        Ok(SqliteStore {
            inner: Arc::new(Inner {
                path,
                writer: Some(Mutex::new(tx)),
                readers: Mutex::new(Vec::new()),
                lock: Some(lock),
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
        let (tx, rx) = oneshot::channel();
        let job: Job = Box::new(move |conn| {
            let _ = tx.send(f(conn));
        });
        writer.lock().expect("writer sender lock").send(job).map_err(|_| Error::Closed)?;
        rx.await.map_err(|_| Error::Closed)?
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

const ENTITY_COLS: &str = "id, machine, key, state, properties, version, retry, created_at, entered_at, auto_at, due_at, lease_owner, lease_until, request_id, fired, timer_at";

fn parse_json_obj(text: &str) -> rusqlite::Result<Properties> {
    serde_json::from_str(text)
        .map_err(|e| rusqlite::Error::FromSqlConversionFailure(0, rusqlite::types::Type::Text, Box::new(e)))
}

fn entity_from_row(r: &Row<'_>) -> rusqlite::Result<EntityRow> {
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
            .map_err(|e| rusqlite::Error::FromSqlConversionFailure(14, rusqlite::types::Type::Text, Box::new(e)))?
            .into_iter()
            .map(EventName::from)
            .collect(),
        timer_at: r.get(15)?,
    })
}

fn inbox_from_row(r: &Row<'_>) -> rusqlite::Result<InboxItem> {
    let params: String = r.get(3)?;
    Ok(InboxItem {
        id: r.get(0)?,
        entity_id: r.get(1)?,
        event: EventName::new(r.get_ref(2)?.as_str()?),
        params: serde_json::from_str(&params)
            .map_err(|e| rusqlite::Error::FromSqlConversionFailure(3, rusqlite::types::Type::Text, Box::new(e)))?,
        request_id: r.get(4)?,
        created_at: r.get(5)?,
        kind: {
            let k = r.get_ref(6)?.as_str()?;
            InboxKind::parse(k).ok_or_else(|| {
                rusqlite::Error::FromSqlConversionFailure(
                    6,
                    rusqlite::types::Type::Text,
                    format!("unknown inbox kind `{k}`").into(),
                )
            })?
        },
    })
}

fn history_from_row(r: &Row<'_>) -> rusqlite::Result<HistoryRow> {
    let kind: String = r.get(4)?;
    Ok(HistoryRow {
        id: r.get(0)?,
        entity_id: r.get(1)?,
        from: r.get::<_, Option<String>>(2)?.map(StateName::from),
        to: r.get::<_, Option<String>>(3)?.map(StateName::from),
        kind: HistoryKind::parse(&kind).ok_or_else(|| {
            rusqlite::Error::FromSqlConversionFailure(
                4,
                rusqlite::types::Type::Text,
                format!("unknown history kind `{kind}`").into(),
            )
        })?,
        action: r.get::<_, Option<String>>(5)?.map(ActionName::from),
        event: r.get::<_, Option<String>>(6)?.map(EventName::from),
        retry: r.get(7)?,
        request_id: r.get(8)?,
        at: r.get(9)?,
        detail: r.get(10)?,
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

fn json_text(v: &impl serde::Serialize) -> String {
    serde_json::to_string(v).expect("JSON values serialize")
}

fn insert_entity(tx: &Transaction<'_>, now: Millis, e: &NewEntity) -> Result<EntityRow, Fail> {
    let props = json_text(&e.properties);
    let inserted = tx
        .prepare_cached(
            "INSERT INTO entities (machine, key, state, properties, version, retry, created_at, entered_at, auto_at, due_at, request_id)
             VALUES (?1, ?2, ?3, ?4, 1, 0, ?5, ?5, ?6, ?6, ?7)",
        )?
        .execute(params![e.machine.as_str(), e.key.as_str(), e.state.as_str(), props, now, e.auto_at, e.request_id]);
    match inserted {
        Ok(_) => {}
        Err(err) if is_unique_violation(&err) => {
            return Err(Fail::Op(OpError::AlreadyExists { machine: e.machine.to_string(), key: e.key.to_string() }));
        }
        Err(err) => return Err(err.into()),
    }
    let id = tx.last_insert_rowid();
    tx.prepare_cached(
        "INSERT INTO history (entity_id, from_state, to_state, kind, retry, request_id, at) VALUES (?1, NULL, ?2, 'create', 0, ?3, ?4)",
    )?
    .execute(params![id, e.state.as_str(), e.request_id, now])?;
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
    if e.notify_self || !e.timers.is_empty() {
        refresh_due(tx, id, now)?;
    }
    let (timer_at, due_at): (Option<Millis>, Option<Millis>) = if e.notify_self || !e.timers.is_empty() {
        tx.prepare_cached("SELECT timer_at, due_at FROM entities WHERE id = ?1")?
            .query_row([id], |r| Ok((r.get(0)?, r.get(1)?)))?
    } else {
        (None, e.auto_at)
    };
    Ok(EntityRow {
        id,
        machine: e.machine.clone(),
        key: e.key.clone(),
        state: e.state.clone(),
        properties: e.properties.clone(),
        version: 1,
        retry: 0,
        created_at: now,
        entered_at: now,
        auto_at: e.auto_at,
        due_at,
        lease_owner: None,
        lease_until: None,
        request_id: e.request_id.clone(),
        fired: Vec::new(),
        timer_at,
    })
}

fn push_event(tx: &Transaction<'_>, now: Millis, p: &Push) -> Result<(i64, i64), Fail> {
    let entity_id: Option<i64> = tx
        .prepare_cached("SELECT id FROM entities WHERE machine = ?1 AND key = ?2")?
        .query_row(params![p.machine.as_str(), p.key.as_str()], |r| r.get(0))
        .optional()?;
    let Some(entity_id) = entity_id else {
        return Err(Fail::Op(OpError::NotFound { machine: p.machine.to_string(), key: p.key.to_string() }));
    };
    tx.prepare_cached(
        "INSERT INTO inbox (entity_id, event, params, request_id, kind, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )?
    .execute(params![entity_id, p.event.as_str(), json_text(&p.params), p.request_id, p.kind.as_str(), now])?;
    let inbox_id = tx.last_insert_rowid();
    if let Some(pred) = p.join_from {
        add_successor(tx, now, pred, entity_id, p.request_id.as_deref())?;
    }
    tx.prepare_cached(
        "UPDATE entities SET due_at = ?2 WHERE id = ?1 AND lease_owner IS NULL AND (due_at IS NULL OR due_at > ?2)",
    )?
    .execute(params![entity_id, now])?;
    Ok((entity_id, inbox_id))
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
    let (hold, lease_until) = match c.after {
        AfterCommit::Hold { lease_ms } => (true, Some(now + lease_ms)),
        AfterCommit::Release => (false, None),
    };
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
    let consumed = c.consume.unwrap_or(-1);
    let fired = c.fired.as_ref().map(|f| json_text(&f.iter().map(|e| e.as_str()).collect::<Vec<_>>()));
    // The fence: only the lease holder, at the version it read, may write. A released
    // entity is next due now (queued events), else at its auto action or first timer.
    let updated = if let Some(to) = &c.to {
        tx.prepare_cached(
            "UPDATE entities SET
                state = ?4, version = version + 1, retry = ?5, entered_at = ?6,
                properties = COALESCE(?7, properties),
                lease_owner = CASE WHEN ?8 THEN lease_owner ELSE NULL END,
                lease_until = ?9,
                auto_at = ?11,
                request_id = COALESCE(?12, request_id),
                fired = COALESCE(?13, fired),
                due_at = CASE WHEN ?8 THEN ?9
                              WHEN EXISTS (SELECT 1 FROM inbox WHERE entity_id = ?1 AND id <> ?10) THEN ?6
                              WHEN ?11 IS NULL THEN timer_at
                              WHEN timer_at IS NULL THEN ?11
                              ELSE MIN(?11, timer_at) END
             WHERE id = ?1 AND version = ?2 AND lease_owner = ?3",
        )?
        .execute(params![
            f.entity_id,
            f.version,
            f.owner,
            to.as_str(),
            c.retry,
            now,
            c.properties.as_ref().map(json_text),
            hold,
            lease_until,
            consumed,
            c.auto_at,
            c.request_id,
            fired
        ])?
    } else {
        tx.prepare_cached(
            "UPDATE entities SET
                properties = COALESCE(?4, properties),
                fired = COALESCE(?9, fired),
                lease_owner = CASE WHEN ?5 THEN lease_owner ELSE NULL END,
                lease_until = ?6,
                due_at = CASE WHEN ?5 THEN ?6
                              WHEN EXISTS (SELECT 1 FROM inbox WHERE entity_id = ?1 AND id <> ?7) THEN ?8
                              WHEN auto_at IS NULL THEN timer_at
                              WHEN timer_at IS NULL THEN auto_at
                              ELSE MIN(auto_at, timer_at) END
             WHERE id = ?1 AND version = ?2 AND lease_owner = ?3",
        )?
        .execute(params![
            f.entity_id,
            f.version,
            f.owner,
            c.properties.as_ref().map(json_text),
            hold,
            lease_until,
            consumed,
            now,
            fired
        ])?
    };
    if updated == 0 {
        return Err(Fail::Op(OpError::LeaseLost { entity_id: f.entity_id }));
    }
    if let Some(id) = c.consume {
        tx.prepare_cached("DELETE FROM inbox WHERE id = ?1 AND entity_id = ?2")?.execute([id, f.entity_id])?;
    }
    if let Some(upto) = c.consume_notices_upto {
        tx.prepare_cached("DELETE FROM inbox WHERE entity_id = ?1 AND kind = 'notice' AND id <= ?2")?
            .execute([f.entity_id, upto])?;
    }
    if !c.quiet {
        tx.prepare_cached(
            "INSERT INTO history (entity_id, from_state, to_state, kind, action, event, retry, request_id, at, detail)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
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
            c.detail
        ])?;
    }
    for (index, stmt) in c.sql.iter().enumerate() {
        let params: Vec<SqlValue> = stmt.params.iter().map(json_to_sql).collect();
        let run = tx.prepare_cached(&stmt.sql).and_then(|mut s| s.execute(rusqlite::params_from_iter(params)));
        if let Err(e) = run {
            return Err(Fail::Op(OpError::Sql { index, message: e.to_string() }));
        }
    }
    let mut created = Vec::with_capacity(c.creates.len());
    for e in &c.creates {
        let id = insert_entity(tx, now, e)?.id;
        add_successor(tx, now, f.entity_id, id, c.request_id.as_deref())?;
        created.push(id);
    }
    for p in &c.pushes {
        push_event(tx, now, p)?;
    }
    if c.notify_predecessors {
        notify_predecessors(tx, f.entity_id, now, c.request_id.as_deref())?;
    }
    let mut due_changed = false;
    if c.notify_self {
        tx.prepare_cached(
            "INSERT INTO inbox (entity_id, event, params, request_id, kind, created_at)
             VALUES (?1, ?2, '{}', ?3, 'notice', ?4)",
        )?
        .execute(params![f.entity_id, InboxKind::NOTICE_EVENT, c.request_id, now])?;
        due_changed = true;
    }
    if let Some(plans) = &c.timers {
        set_timers(tx, f.entity_id, plans)?;
        due_changed = true;
    }
    if due_changed {
        refresh_due(tx, f.entity_id, now)?;
    }
    let inbox_head = if hold { inbox_head(tx, f.entity_id)? } else { None };
    let version = if c.to.is_some() { f.version + 1 } else { f.version };
    Ok(Applied::Committed { version, inbox_head, created })
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
    Ok(())
}

/// Recomputes an entity's timer time and due time after its timers or inbox changed.
fn refresh_due(tx: &Transaction<'_>, id: i64, now: Millis) -> rusqlite::Result<()> {
    tx.prepare_cached(
        "UPDATE entities SET timer_at = (SELECT MIN(due_at) FROM timers WHERE entity_id = ?1) WHERE id = ?1",
    )?
    .execute([id])?;
    tx.prepare_cached(
        "UPDATE entities SET due_at = CASE
            WHEN lease_owner IS NOT NULL THEN lease_until
            WHEN EXISTS (SELECT 1 FROM inbox WHERE entity_id = ?1) THEN ?2
            WHEN auto_at IS NULL THEN timer_at
            WHEN timer_at IS NULL THEN auto_at
            ELSE MIN(auto_at, timer_at) END
         WHERE id = ?1",
    )?
    .execute(params![id, now])?;
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
               AND lease_owner IS NULL AND (due_at IS NULL OR due_at > ?2)",
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

/// Turns due timers into inbox events (one-shot timers are deleted, periodic ones
/// rescheduled) in the claiming transaction; the params name the timer.
fn fire_timers(tx: &Transaction<'_>, now: Millis, limit: usize) -> rusqlite::Result<()> {
    let due: Vec<TimerRow> = tx
        .prepare_cached(
            "SELECT entity_id, name, event, due_at, every_ms FROM timers WHERE due_at <= ?1 ORDER BY due_at LIMIT ?2",
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
        refresh_due(tx, t.entity_id, now)?;
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

fn apply_op(tx: &Transaction<'_>, now: Millis, op: &Op) -> Result<Applied, Fail> {
    match op {
        Op::Create(e) => insert_entity(tx, now, e).map(Applied::Created),
        Op::Push(p) => push_event(tx, now, p).map(|(entity_id, inbox_id)| Applied::Pushed { inbox_id, entity_id }),
        Op::Commit(c) => apply_commit(tx, now, c),
        Op::Release(f) => {
            let n = tx
                .prepare_cached(
                    "UPDATE entities SET lease_owner = NULL, lease_until = NULL,
                        due_at = CASE WHEN EXISTS (SELECT 1 FROM inbox WHERE entity_id = ?1) THEN ?4 ELSE auto_at END
                     WHERE id = ?1 AND version = ?2 AND lease_owner = ?3",
                )?
                .execute(params![f.entity_id, f.version, f.owner, now])?;
            if n == 0 {
                return Err(Fail::Op(OpError::LeaseLost { entity_id: f.entity_id }));
            }
            Ok(Applied::Released)
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

/// Whether an op can fail after writing something, so it needs a savepoint to undo alone.
fn needs_savepoint(op: &Op) -> bool {
    match op {
        Op::Commit(c) => {
            !(c.sql.is_empty() && c.creates.is_empty() && c.pushes.is_empty() && c.preconditions.is_empty())
        }
        Op::Create(_) | Op::Push(_) | Op::Release(_) | Op::Renew { .. } => false,
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
        let entities: Vec<EntityRow> = tx
            .prepare_cached(&format!(
                "UPDATE entities SET lease_owner = ?1, lease_until = ?2, due_at = ?2
                 WHERE id IN (SELECT id FROM entities WHERE due_at <= ?3 ORDER BY due_at LIMIT ?4)
                 RETURNING {ENTITY_COLS}"
            ))?
            .query_map(params![claim.owner, until, now, claim.limit as i64], entity_from_row)?
            .collect::<rusqlite::Result<_>>()?;
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
                 ORDER BY id LIMIT ?4"
            );
            let limit = filter.limit.map(|l| l.min(i64::MAX as u64) as i64).unwrap_or(-1);
            let mut stmt = c.prepare_cached(&sql).map_err(db_err)?;
            stmt.query_map(params![filter.machine, filter.state, filter.after_id.unwrap_or(0), limit], entity_from_row)
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

    fn exclusive(&self) -> bool {
        self.inner.lock.is_some()
    }

    async fn sql_execute(&self, sql: &str) -> Result<()> {
        let sql = sql.to_string();
        self.on_writer(move |conn| conn.execute_batch(&sql).map_err(db_err)).await
    }

    async fn lease_release_all(&self, now: Millis) -> Result<u64> {
        self.on_writer(move |c| {
            c.execute(
                "UPDATE entities SET lease_owner = NULL, lease_until = NULL,
                    due_at = CASE WHEN auto_at IS NOT NULL AND auto_at > ?1 THEN auto_at ELSE ?1 END
                 WHERE lease_owner IS NOT NULL",
                [now],
            )
            .map(|n| n as u64)
            .map_err(db_err)
        })
        .await
    }
}
