//! Where a seed's world lives ([`Backend`], [`SeedDb`]): a SQLite file copied from a
//! template made once per run, or a fresh schema of a PostgreSQL database, dropped when the
//! seed ends; and the [`Observer`], the simulation's own connection to it, which reads what
//! the invariants check and arms the fault switches. Nothing is left behind: the template's
//! directory goes with the run, each seed's directory or schema with the seed.
//!
//! The fault switches (`sim_fault`): while `armed` is 1, inserting a history row aborts the
//! batch's transaction in the middle (a trigger), so the store must roll back what the
//! batch had already written; while `commit_armed` is 1, a chart's entry or exit action's
//! SQL fails, which fails that one commit (the entity backs off and tries again). Arming
//! them changes no schema (cached statements stay prepared).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use settle_store::AnyStore;
use settle_store::sqlite::SqliteStore;

/// The database a simulation runs on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Db {
    /// A SQLite file per seed (in `/dev/shm` when there is one).
    Sqlite,
    /// A schema per seed in the PostgreSQL database at this URL (several engine instances,
    /// each with its own connections, on one schema).
    Postgres(String),
}

impl Db {
    /// `sqlite` (or nothing) for SQLite, a `postgres://` URL for PostgreSQL.
    pub fn parse(s: &str) -> anyhow::Result<Db> {
        match s {
            "" | "sqlite" => Ok(Db::Sqlite),
            url if url.starts_with("postgres://") || url.starts_with("postgresql://") => {
                anyhow::ensure!(
                    !url.contains("schema="),
                    "--db {url}: the simulation makes a schema of its own for each seed; leave `schema=` out"
                );
                Ok(Db::Postgres(url.to_string()))
            }
            other => anyhow::bail!("--db {other}: expected `sqlite` or a postgres:// URL"),
        }
    }

    /// The store's name, for reports.
    pub fn name(&self) -> &'static str {
        match self {
            Db::Sqlite => "SQLite",
            Db::Postgres(_) => "PostgreSQL",
        }
    }
}

/// The SQLite template: Settle's schema with the simulation's tables, copied for each seed.
struct Template {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

/// What a run's seeds are made from: the template (SQLite) or the database (PostgreSQL).
pub(crate) struct Backend {
    db: Db,
    template: Option<Template>,
}

/// The charts' table, the fault switch and its triggers, in SQLite.
const SQLITE_SIM_TABLES: &str = "
    CREATE TABLE sim_fault (armed INTEGER NOT NULL, commit_armed INTEGER NOT NULL);
    INSERT INTO sim_fault VALUES (0, 0);
    CREATE TRIGGER sim_fault BEFORE INSERT ON history WHEN (SELECT armed FROM sim_fault) = 1 BEGIN
        SELECT RAISE(ABORT, 'simulated store failure in the middle of a batch');
    END;
    CREATE TRIGGER sim_commit_fault BEFORE INSERT ON chart_hooks
        WHEN (SELECT commit_armed FROM sim_fault) = 1 BEGIN
        SELECT RAISE(ABORT, 'simulated failure of a commit''s SQL');
    END;";

/// The same in PostgreSQL.
const POSTGRES_SIM_TABLES: &str = "
    CREATE TABLE sim_fault (armed INTEGER NOT NULL, commit_armed INTEGER NOT NULL);
    INSERT INTO sim_fault VALUES (0, 0);
    CREATE FUNCTION sim_fault() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
        IF (SELECT armed FROM sim_fault) = 1 THEN
            RAISE EXCEPTION 'simulated store failure in the middle of a batch';
        END IF;
        RETURN NEW;
    END $$;
    CREATE TRIGGER sim_fault BEFORE INSERT ON history FOR EACH ROW EXECUTE FUNCTION sim_fault();
    CREATE FUNCTION sim_commit_fault() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
        IF (SELECT commit_armed FROM sim_fault) = 1 THEN
            RAISE EXCEPTION 'simulated failure of a commit''s SQL';
        END IF;
        RETURN NEW;
    END $$;
    CREATE TRIGGER sim_commit_fault BEFORE INSERT ON chart_hooks FOR EACH ROW EXECUTE FUNCTION sim_commit_fault();";

/// A directory for one seed's database (or the run's template): in `SETTLE_SIM_TMP` when
/// set, else memory-backed where the system has it (the simulation checks what commits do,
/// not how long fsync takes), else the system's temporary directory.
fn scratch_dir() -> std::io::Result<tempfile::TempDir> {
    let b = tempfile::Builder::new().prefix("settle-sim-").to_owned();
    if let Some(dir) = std::env::var_os("SETTLE_SIM_TMP") {
        return b.tempdir_in(dir);
    }
    let shm = Path::new("/dev/shm");
    if shm.is_dir() { b.tempdir_in(shm) } else { b.tempdir() }
}

impl Backend {
    /// A backend for `db`: on SQLite, the template (migrations run once, not per seed).
    pub(crate) fn new(db: &Db) -> anyhow::Result<Backend> {
        let template = match db {
            Db::Sqlite => {
                let dir = scratch_dir()?;
                let built = dir.path().join("built.db");
                drop(SqliteStore::open(&built)?);
                let conn = rusqlite::Connection::open(&built)?;
                conn.execute_batch(settle_builtin::chart::CHART_HOOKS_TABLE)?;
                conn.execute_batch(SQLITE_SIM_TABLES)?;
                let path = dir.path().join("template.db");
                conn.execute("VACUUM INTO ?1", [path.display().to_string()])?;
                drop(conn);
                std::fs::remove_file(&built)?;
                Some(Template { _dir: dir, path })
            }
            Db::Postgres(_) => None,
        };
        Ok(Backend { db: db.clone(), template })
    }

    /// The database the seeds run on.
    pub(crate) fn db(&self) -> &Db {
        &self.db
    }

    /// The database of seed `seed`: a copy of the template, or a new schema.
    pub(crate) async fn seed(&self, seed: u64) -> anyhow::Result<SeedDb> {
        match (&self.db, &self.template) {
            (Db::Sqlite, Some(t)) => {
                let dir = scratch_dir()?;
                let path = dir.path().join("sim.db");
                std::fs::copy(&t.path, &path)?;
                let store = SqliteStore::open(&path)?;
                let conn = rusqlite::Connection::open(&path)?;
                conn.busy_timeout(Duration::from_secs(5))?;
                Ok(SeedDb { place: Place::Dir { _dir: dir, store }, observer: Observer::Sqlite(conn) })
            }
            (Db::Postgres(url), _) => {
                let schema = format!("sim_{seed}_{}_{}", std::process::id(), unique());
                let sep = if url.contains('?') { '&' } else { '?' };
                let url = format!("{url}{sep}schema={schema}");
                // The first store creates the schema and runs the migrations.
                drop(settle_store::postgres::PgStore::open(&url).with_context(|| format!("--db {}", redact(&url)))?);
                let observer = Observer::postgres(&url, &schema).await?;
                observer.exec(settle_builtin::chart::CHART_HOOKS_TABLE).await?;
                observer.exec(POSTGRES_SIM_TABLES).await?;
                Ok(SeedDb { place: Place::Schema { url, schema }, observer })
            }
            (Db::Sqlite, None) => unreachable!("a SQLite backend has its template"),
        }
    }
}

/// A short unique suffix (schemas of runs in parallel never meet).
fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    settle_builtin::draws::mix(nanos as u64 ^ N.fetch_add(1, Ordering::Relaxed)) % 1_000_000
}

/// A URL without its password.
fn redact(url: &str) -> String {
    match (url.find("://"), url.find('@')) {
        (Some(s), Some(at)) if url[s + 3..at].contains(':') => {
            let colon = s + 3 + url[s + 3..at].find(':').unwrap_or(0);
            format!("{}:***{}", &url[..colon], &url[at..])
        }
        _ => url.to_string(),
    }
}

enum Place {
    Dir { _dir: tempfile::TempDir, store: SqliteStore },
    Schema { url: String, schema: String },
}

/// One seed's database: its stores and its observer.
pub(crate) struct SeedDb {
    place: Place,
    pub(crate) observer: Observer,
}

impl SeedDb {
    /// A store for the node named `name`: on SQLite the one store (an engine locks its
    /// file); on PostgreSQL a store of its own (its own connections, named `name`, so that
    /// a connection fault can cut them).
    pub(crate) fn node_store(&self, name: &str) -> anyhow::Result<AnyStore> {
        Ok(match &self.place {
            Place::Dir { store, .. } => AnyStore::Sqlite(store.clone()),
            Place::Schema { url, schema } => {
                let app = format!("{schema}_{}", name.replace('.', "_"));
                AnyStore::Postgres(settle_store::postgres::PgStore::open(&format!("{url}&application_name={app}"))?)
            }
        })
    }

    /// Whether one engine alone drives the store (SQLite): a node restarting alone then
    /// reclaims every lease at once.
    pub(crate) fn exclusive(&self) -> bool {
        matches!(self.place, Place::Dir { .. })
    }

    /// Cuts every connection of node `name` (PostgreSQL): its next statements meet a closed
    /// connection. Answers how many it cut (none on SQLite).
    pub(crate) async fn cut_connections(&self, name: &str) -> anyhow::Result<u64> {
        let Place::Schema { schema, .. } = &self.place else { return Ok(0) };
        let app = format!("{schema}_{}", name.replace('.', "_"));
        let rows = self
            .observer
            .rows(
                "SELECT COUNT(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1",
                &[Param::T(&app)],
            )
            .await?;
        Ok(rows.first().and_then(|r| r.first()).map_or(0, Val::int) as u64)
    }

    /// Keeps the database at `path` (SQLite only).
    pub(crate) async fn keep(&self, path: &Path) -> anyhow::Result<()> {
        match &self.observer {
            Observer::Sqlite(conn) => {
                let _ = std::fs::remove_file(path);
                conn.execute("VACUUM INTO ?1", [path.display().to_string()])?;
                Ok(())
            }
            Observer::Postgres(..) => anyhow::bail!("--keep keeps a SQLite database; on PostgreSQL, use --db sqlite"),
        }
    }

    /// Ends the seed's database: the directory is removed, or the schema dropped (after its
    /// nodes' connections are cut). The nodes must be gone.
    pub(crate) async fn close(self) -> anyhow::Result<()> {
        match self.place {
            Place::Dir { _dir, store } => {
                drop(self.observer);
                drop(store);
                // Let the nodes' tasks see their channels close and let go of the file.
                tokio::task::yield_now().await;
                drop(_dir);
            }
            Place::Schema { schema, .. } => {
                let like = format!("{schema}\\_%");
                self.observer
                    .rows(
                        "SELECT COUNT(pg_terminate_backend(pid)) FROM pg_stat_activity \
                         WHERE application_name LIKE $1 AND pid <> pg_backend_pid()",
                        &[Param::T(&like)],
                    )
                    .await?;
                self.observer.exec(&format!("DROP SCHEMA \"{schema}\" CASCADE")).await?;
            }
        }
        Ok(())
    }
}

/// A parameter of an [`Observer`] query.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Param<'a> {
    /// An integer.
    I(i64),
    /// A text.
    T(&'a str),
}

/// A value an [`Observer`] query returns: integers (booleans as 0 and 1), texts, NULL.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Val {
    I(i64),
    T(String),
    N,
}

impl Val {
    /// The integer (0 for NULL or a text).
    pub(crate) fn int(&self) -> i64 {
        match self {
            Val::I(i) => *i,
            _ => 0,
        }
    }
    /// The integer, `None` for NULL.
    pub(crate) fn opt_int(&self) -> Option<i64> {
        match self {
            Val::I(i) => Some(*i),
            _ => None,
        }
    }
    /// The text (empty for NULL).
    pub(crate) fn text(&self) -> String {
        self.opt_text().unwrap_or_default()
    }
    /// The text, `None` for NULL.
    pub(crate) fn opt_text(&self) -> Option<String> {
        match self {
            Val::T(t) => Some(t.clone()),
            Val::I(i) => Some(i.to_string()),
            Val::N => None,
        }
    }
}

/// The simulation's own connection to a seed's database. Queries are written once, with
/// `$1`-style parameters both databases read, and answer rows of [`Val`]s.
pub(crate) enum Observer {
    Sqlite(rusqlite::Connection),
    Postgres(tokio_postgres::Client, tokio::task::JoinHandle<()>),
}

impl Observer {
    async fn postgres(url: &str, schema: &str) -> anyhow::Result<Observer> {
        let base = url.split_once('?').map_or(url, |(b, _)| b);
        let (client, conn) = tokio_postgres::connect(base, tokio_postgres::NoTls).await?;
        let task = tokio::spawn(async move {
            let _ = conn.await;
        });
        client.batch_execute(&format!("SET search_path TO \"{schema}\"")).await?;
        Ok(Observer::Postgres(client, task))
    }

    /// Runs statements (no parameters, no rows).
    pub(crate) async fn exec(&self, sql: &str) -> anyhow::Result<()> {
        match self {
            Observer::Sqlite(c) => c.execute_batch(sql)?,
            Observer::Postgres(c, _) => c.batch_execute(sql).await?,
        }
        Ok(())
    }

    /// The rows of a query.
    pub(crate) async fn rows(&self, sql: &str, params: &[Param<'_>]) -> anyhow::Result<Vec<Vec<Val>>> {
        match self {
            Observer::Sqlite(c) => {
                let mut stmt = c.prepare_cached(sql)?;
                let n = stmt.column_count();
                let bound: Vec<rusqlite::types::Value> = params
                    .iter()
                    .map(|p| match p {
                        Param::I(i) => rusqlite::types::Value::Integer(*i),
                        Param::T(t) => rusqlite::types::Value::Text(t.to_string()),
                    })
                    .collect();
                let rows = stmt.query_map(rusqlite::params_from_iter(bound), |r| {
                    (0..n)
                        .map(|i| {
                            Ok(match r.get_ref(i)? {
                                rusqlite::types::ValueRef::Integer(v) => Val::I(v),
                                rusqlite::types::ValueRef::Text(t) => Val::T(String::from_utf8_lossy(t).into_owned()),
                                rusqlite::types::ValueRef::Real(f) => Val::I(f as i64),
                                _ => Val::N,
                            })
                        })
                        .collect::<rusqlite::Result<Vec<Val>>>()
                })?;
                Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
            }
            Observer::Postgres(c, _) => {
                let bound: Vec<Box<dyn tokio_postgres::types::ToSql + Sync + Send>> = params
                    .iter()
                    .map(|p| -> Box<dyn tokio_postgres::types::ToSql + Sync + Send> {
                        match p {
                            Param::I(i) => Box::new(*i),
                            Param::T(t) => Box::new(t.to_string()),
                        }
                    })
                    .collect();
                let refs: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> =
                    bound.iter().map(|b| b.as_ref() as &(dyn tokio_postgres::types::ToSql + Sync)).collect();
                let rows = c.query(sql, &refs).await?;
                rows.iter()
                    .map(|r| {
                        (0..r.len())
                            .map(|i| {
                                use tokio_postgres::types::Type;
                                let ty = r.columns()[i].type_().clone();
                                Ok(if ty == Type::INT8 {
                                    r.try_get::<_, Option<i64>>(i)?.map_or(Val::N, Val::I)
                                } else if ty == Type::INT4 {
                                    r.try_get::<_, Option<i32>>(i)?.map_or(Val::N, |v| Val::I(i64::from(v)))
                                } else if ty == Type::INT2 {
                                    r.try_get::<_, Option<i16>>(i)?.map_or(Val::N, |v| Val::I(i64::from(v)))
                                } else if ty == Type::BOOL {
                                    r.try_get::<_, Option<bool>>(i)?.map_or(Val::N, |v| Val::I(i64::from(v)))
                                } else {
                                    r.try_get::<_, Option<String>>(i)?.map_or(Val::N, Val::T)
                                })
                            })
                            .collect::<Result<Vec<Val>, tokio_postgres::Error>>()
                    })
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(Into::into)
            }
        }
    }
}

impl Drop for Observer {
    fn drop(&mut self) {
        if let Observer::Postgres(_, task) = self {
            task.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_db_flag() {
        assert_eq!(Db::parse("sqlite").unwrap(), Db::Sqlite);
        assert_eq!(Db::parse("postgres://u@h/db").unwrap(), Db::Postgres("postgres://u@h/db".into()));
        assert!(Db::parse("postgres://u@h/db?schema=x").unwrap_err().to_string().contains("leave `schema=` out"));
        assert!(Db::parse("mysql://x").is_err());
        assert_eq!(redact("postgres://u:secret@h/db"), "postgres://u:***@h/db");
    }

    #[tokio::test]
    async fn a_sqlite_run_leaves_nothing_behind() {
        let backend = Backend::new(&Db::Sqlite).unwrap();
        let template = backend.template.as_ref().unwrap().path.clone();
        let seed = backend.seed(1).await.unwrap();
        let rows = seed.observer.rows("SELECT armed, commit_armed FROM sim_fault", &[]).await.unwrap();
        assert_eq!(rows, vec![vec![Val::I(0), Val::I(0)]]);
        let Place::Dir { _dir: dir, .. } = &seed.place else { panic!("a directory") };
        let seed_dir = dir.path().to_path_buf();
        seed.close().await.unwrap();
        assert!(!seed_dir.exists(), "the seed's directory is removed");
        drop(backend);
        assert!(!template.exists(), "the template is removed with the run");
    }
}
