//! The writer's connection: the asynchronous client on a runtime of the writer thread's
//! own, so that a set of statements is sent at once (pipelined) and waited for once. The
//! server still runs them one after another, in order; what is saved is the wait for each
//! answer before sending the next statement. `BEGIN` travels with the transaction's first
//! statements, and a batch's `COMMIT` with its last ones.

use std::collections::HashMap;

use futures_util::future::{try_join, try_join_all};
use postgres::types::ToSql;
use postgres::{NoTls, Row, Statement};

use super::conn::{Backoff, Failure, Params, Recovery, Target, pg_message, recovery};
use super::stmt::{JsonParam, Stmt};
use crate::{Error, Result};

/// One statement of a pipeline: its SQL and parameters.
pub(crate) type Item<'a> = (&'a str, Params<'a>);

/// Borrows statements as pipeline items.
fn with_items<T>(stmts: &[Stmt], f: impl FnOnce(&[Item<'_>]) -> T) -> T {
    let refs: Vec<Vec<&(dyn ToSql + Sync)>> =
        stmts.iter().map(|s| s.params.iter().map(|p| p.as_ref() as &(dyn ToSql + Sync)).collect()).collect();
    let items: Vec<Item<'_>> = stmts.iter().zip(&refs).map(|(s, r)| (s.sql.as_str(), r.as_slice())).collect();
    f(&items)
}

/// A failure of a pipeline that carried `COMMIT`.
#[derive(Debug)]
pub(crate) enum CommitError {
    /// A statement failed: the transaction was rolled back (its `COMMIT` ran as a
    /// `ROLLBACK`), nothing of it is visible.
    Failed(postgres::Error),
    /// The connection was lost: whether the transaction committed is unknown.
    Unknown(postgres::Error),
}

/// The store writer's connection.
pub(crate) struct WriterConn {
    rt: tokio::runtime::Runtime,
    client: tokio_postgres::Client,
    statements: HashMap<String, Statement>,
    /// Requests sent to the server and waited for (one per pipeline, preparations
    /// included).
    pub(crate) round_trips: u64,
    /// A transaction was begun and its `BEGIN` is not sent yet.
    begin_pending: bool,
    /// A transaction is open (begun, not committed or rolled back).
    in_txn: bool,
}

impl WriterConn {
    /// Connects to `target`, its search path set to the schema, with the writer's planner
    /// settings ([`INDEX_SETTINGS`](super::conn::INDEX_SETTINGS)).
    pub(crate) fn connect(target: &Target) -> Result<WriterConn, postgres::Error> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a current-thread runtime starts");
        let (client, connection) = rt.block_on(target.async_config.connect(NoTls))?;
        // Driven whenever the writer waits on the runtime, i.e. while it talks to the server.
        rt.spawn(async move {
            let _ = connection.await;
        });
        let mut conn =
            WriterConn { rt, client, statements: HashMap::new(), round_trips: 0, begin_pending: false, in_txn: false };
        if let Some(ident) = target.schema_ident() {
            // Identifiers cannot be parameters; the name was validated when parsed.
            conn.batch(&format!("SET search_path TO {ident}"))?;
        }
        conn.batch(super::conn::INDEX_SETTINGS)?;
        if std::env::var("SETTLE_PG_AUTOEXPLAIN").is_ok() {
            conn.batch(
                "LOAD 'auto_explain'; SET auto_explain.log_min_duration = '1ms'; SET auto_explain.log_analyze = on;",
            )?;
        }
        Ok(conn)
    }

    /// Whether the connection is gone.
    pub(crate) fn is_closed(&self) -> bool {
        self.client.is_closed()
    }

    /// Begins a transaction; its `BEGIN` goes with the next statements.
    pub(crate) fn begin(&mut self) {
        self.begin_pending = true;
        self.in_txn = true;
    }

    /// Whether a transaction is open.
    pub(crate) fn in_txn(&self) -> bool {
        self.in_txn
    }

    /// Prepares the statements of `sqls` not prepared yet, in one round trip.
    fn prepare<'s>(&mut self, sqls: impl Iterator<Item = &'s str>) -> Result<(), postgres::Error> {
        let mut new: Vec<&str> = sqls.filter(|s| !self.statements.contains_key(*s)).collect();
        new.sort_unstable();
        new.dedup();
        if new.is_empty() {
            return Ok(());
        }
        self.round_trips += 1;
        let client = &self.client;
        let prepared = self.rt.block_on(try_join_all(new.iter().map(|sql| client.prepare(sql))))?;
        for (sql, s) in new.into_iter().zip(prepared) {
            self.statements.insert(sql.to_string(), s);
        }
        Ok(())
    }

    /// Runs `items` in one round trip (a pending `BEGIN` first, `COMMIT` last if `commit`);
    /// the rows of each, in order.
    fn run(&mut self, items: &[Item<'_>], commit: bool) -> Result<Vec<Vec<Row>>, postgres::Error> {
        self.prepare(items.iter().map(|i| i.0))?;
        let statements: Vec<&Statement> = items.iter().map(|i| &self.statements[i.0]).collect();
        let begin = std::mem::take(&mut self.begin_pending);
        if commit {
            self.in_txn = false;
        }
        self.round_trips += 1;
        let client = &self.client;
        self.rt.block_on(async {
            let opening = async { if begin { client.batch_execute("BEGIN").await } else { Ok(()) } };
            let queries = try_join_all(statements.iter().zip(items).map(|(s, (_, params))| client.query(*s, params)));
            let closing = async { if commit { client.batch_execute("COMMIT").await } else { Ok(()) } };
            // Polled in this order: the requests go out in this order.
            let ((_, rows), _) = try_join(try_join(opening, queries), closing).await?;
            Ok(rows)
        })
    }

    /// Runs `stmts` in one round trip; the rows of each, in order.
    pub(crate) fn send(&mut self, stmts: &[Stmt]) -> Result<Vec<Vec<Row>>, postgres::Error> {
        with_items(stmts, |items| self.run(items, false))
    }

    /// Runs `stmts` and commits, in one round trip.
    pub(crate) fn send_and_commit(&mut self, stmts: &[Stmt]) -> Result<Vec<Vec<Row>>, CommitError> {
        with_items(stmts, |items| self.run(items, true)).map_err(|e| match recovery(&e) {
            Recovery::Reconnect => CommitError::Unknown(e),
            _ => CommitError::Failed(e),
        })
    }

    /// Runs a query; its rows.
    pub(crate) fn query(&mut self, sql: &str, params: Params<'_>) -> Result<Vec<Row>, postgres::Error> {
        Ok(self.run(&[(sql, params)], false)?.pop().unwrap_or_default())
    }

    /// Runs a statement; the number of rows it changed.
    pub(crate) fn exec(&mut self, sql: &str, params: Params<'_>) -> Result<u64, postgres::Error> {
        self.prepare(std::iter::once(sql))?;
        let statement = self.statements[sql].clone();
        let begin = std::mem::take(&mut self.begin_pending);
        self.round_trips += 1;
        let client = &self.client;
        self.rt.block_on(async {
            if begin {
                let (_, n) = try_join(client.batch_execute("BEGIN"), client.execute(&statement, params)).await?;
                Ok(n)
            } else {
                client.execute(&statement, params).await
            }
        })
    }

    /// Runs unparameterised SQL (transaction control, DDL), after a pending `BEGIN`.
    pub(crate) fn batch(&mut self, sql: &str) -> Result<(), postgres::Error> {
        let begin = std::mem::take(&mut self.begin_pending);
        let upper = sql.trim_start().to_ascii_uppercase();
        if upper.starts_with("COMMIT") || upper.starts_with("ROLLBACK") && !upper.starts_with("ROLLBACK TO") {
            self.in_txn = false;
        }
        self.round_trips += 1;
        let sql = if begin { format!("BEGIN; {sql}") } else { sql.to_string() };
        self.rt.block_on(self.client.batch_execute(&sql))
    }

    /// Runs an application statement with parameters converted by the server's types.
    pub(crate) fn exec_dynamic(&mut self, sql: &str, params: &[serde_json::Value]) -> Result<u64, postgres::Error> {
        let values: Vec<JsonParam<'_>> = params.iter().map(JsonParam).collect();
        let refs: Vec<&(dyn ToSql + Sync)> = values.iter().map(|v| v as &(dyn ToSql + Sync)).collect();
        self.exec(sql, &refs)
    }
}

/// The writer thread's connection, reconnected on demand.
pub(super) struct Writer {
    pub(super) target: Target,
    pub(super) conn: Option<WriterConn>,
}

impl Writer {
    /// The connection, connecting (with backoff) if there is none.
    fn conn(&mut self, backoff: &mut Backoff) -> Result<&mut WriterConn> {
        while self.conn.as_ref().is_none_or(WriterConn::is_closed) {
            match WriterConn::connect(&self.target) {
                Ok(c) => {
                    if backoff.attempts() > 0 {
                        tracing::warn!(attempts = backoff.attempts(), "store writer reconnected to PostgreSQL");
                    }
                    self.conn = Some(c);
                }
                Err(e) => {
                    if !backoff.wait("store writer", &pg_message(&e)) {
                        return Err(Error::Db(format!("cannot reach PostgreSQL: {}", pg_message(&e))));
                    }
                }
            }
        }
        Ok(self.conn.as_mut().expect("connected above"))
    }
}

/// Runs `body` in a transaction on the writer's connection (committed after it, unless it
/// committed itself, as a batch's finish does), retrying the whole transaction on a lost
/// connection or a lost race. `now` is refreshed on a retry after a reconnection (the
/// batch's times were taken before the outage).
pub(super) fn transact<T>(
    w: &mut Writer,
    what: &str,
    mut body: impl FnMut(&mut WriterConn, bool) -> std::result::Result<T, Failure>,
) -> Result<T> {
    let mut backoff = Backoff::new();
    let mut reconnected = false;
    loop {
        let c = w.conn(&mut backoff)?;
        c.begin();
        let attempt = body(c, reconnected);
        let failure = match attempt {
            Ok(out) if !c.in_txn() => return Ok(out),
            Ok(out) => match c.batch("COMMIT") {
                Ok(()) => return Ok(out),
                Err(e) if recovery(&e) == Recovery::Reconnect => Failure::CommitUnknown(e),
                Err(e) => Failure::Pg(e),
            },
            Err(f) => f,
        };
        if let Failure::CommitUnknown(e) = &failure {
            w.conn = None;
            return Err(Error::Db(format!(
                "{what}: connection to PostgreSQL lost while committing; the outcome is unknown ({})",
                pg_message(e)
            )));
        }
        match failure.recovery() {
            Recovery::Reconnect => {
                w.conn = None;
                reconnected = true;
                if !backoff.wait(what, &format!("{failure:?}")) {
                    return Err(failure.into_error());
                }
            }
            Recovery::Retry => {
                let _ = c.batch("ROLLBACK");
                tracing::debug!(error = ?failure, "{what}: transaction lost a race; retrying");
                if !backoff.wait(what, &format!("{failure:?}")) {
                    return Err(failure.into_error());
                }
            }
            Recovery::Fail => {
                if c.batch("ROLLBACK").is_err() {
                    w.conn = None;
                }
                return Err(failure.into_error());
            }
        }
    }
}
