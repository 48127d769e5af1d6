//! Connections: the target parsed from a URL, a connection with its statement cache, and
//! failures ([`Failure`]) and their classification into "retry on a new connection",
//! "retry the transaction" and "give up".

use std::collections::HashMap;
use std::time::{Duration, Instant};

use postgres::error::SqlState;
use postgres::types::ToSql;
use postgres::{Client, NoTls, Row, Statement};

use crate::Error;

/// Where to connect: the driver's configuration, the schema Settle's tables live in, and
/// the URL with its password hidden (for messages).
#[derive(Clone)]
pub(crate) struct Target {
    pub(crate) config: postgres::Config,
    /// The same, for the asynchronous client of the writer.
    pub(crate) async_config: tokio_postgres::Config,
    pub(crate) schema: Option<String>,
    pub(crate) display: String,
}

impl Target {
    /// Parses `postgres://user@host:port/db?schema=name&...`. `schema` is Settle's own
    /// parameter (the schema for its tables, created if missing); the rest goes to the
    /// driver.
    pub(crate) fn parse(url: &str) -> Result<Self, Error> {
        let open_err = |message: String| Error::Open { path: redact(url), message };
        let (base, query) = match url.split_once('?') {
            Some((b, q)) => (b, q),
            None => (url, ""),
        };
        let mut schema = None;
        let mut rest = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            match pair.split_once('=') {
                Some(("schema", value)) => schema = Some(value.to_string()),
                _ => rest.push(pair),
            }
        }
        if let Some(s) = &schema
            && !valid_schema(s)
        {
            return Err(open_err(format!(
                "invalid schema name `{s}`: use letters, digits and `_` (at most 63, not starting with a digit)"
            )));
        }
        let driver_url = if rest.is_empty() { base.to_string() } else { format!("{base}?{}", rest.join("&")) };
        let mut config: postgres::Config = driver_url.parse().map_err(|e| open_err(format!("invalid URL: {e}")))?;
        if config.get_application_name().is_none() {
            config.application_name("settle");
        }
        config.connect_timeout(Duration::from_secs(5));
        let mut async_config: tokio_postgres::Config =
            driver_url.parse().map_err(|e| open_err(format!("invalid URL: {e}")))?;
        if async_config.get_application_name().is_none() {
            async_config.application_name("settle");
        }
        async_config.connect_timeout(Duration::from_secs(5));
        Ok(Target { config, async_config, schema, display: redact(url) })
    }

    /// The schema's name in SQL: validated, so it is safe to quote as an identifier.
    pub(crate) fn schema_ident(&self) -> Option<String> {
        self.schema.as_ref().map(|s| format!("\"{s}\""))
    }

    /// A new connection, its search path set to the schema.
    pub(crate) fn connect(&self) -> Result<Conn, postgres::Error> {
        let mut client = self.config.connect(NoTls)?;
        if let Some(ident) = self.schema_ident() {
            // Identifiers cannot be parameters; the name was validated in `parse`.
            client.batch_execute(&format!("SET search_path TO {ident}"))?;
        }
        client.batch_execute(INDEX_SETTINGS)?;
        Ok(Conn { client, statements: HashMap::new() })
    }
}

fn valid_schema(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && !s.starts_with(|c: char| c.is_ascii_digit())
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The URL with any password replaced by `***`.
pub(crate) fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_string() };
    let (auth, host) = match rest.split_once('@') {
        Some((a, h)) => (a, h),
        None => return url.to_string(),
    };
    match auth.split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
        None => url.to_string(),
    }
}

/// Planner settings of every connection of the store: its statements find their rows
/// through indexes, but on a young or fast-growing table (or with autovacuum off) the
/// statistics lag behind and the planner would pick sequential scans, hash joins and
/// bitmap scans (of partial indexes bloated by dead entries) that cost milliseconds per
/// batch or lookup. A disabled plan node still costs its plan 10^10, which would make
/// the server compile such statements to machine code (JIT) at every execution: JIT is
/// off. Reports over whole tables turn all of them back on for their transaction
/// ([`REPORT_SETTINGS`]).
pub(crate) const INDEX_SETTINGS: &str = "SET enable_seqscan = off; SET enable_hashjoin = off; SET enable_mergejoin = off; SET enable_bitmapscan = off; \
     SET plan_cache_mode = force_generic_plan; SET jit = off";

/// What a report's transaction sets: every plan, for queries that read whole tables.
pub(crate) const REPORT_SETTINGS: &str = "SET LOCAL enable_seqscan = on; SET LOCAL enable_hashjoin = on; \
     SET LOCAL enable_mergejoin = on; SET LOCAL enable_bitmapscan = on; SET LOCAL jit TO DEFAULT";

/// Parameters of a statement.
pub(crate) type Params<'a> = &'a [&'a (dyn ToSql + Sync)];

/// One connection and its prepared statements (prepared once per connection, by text).
pub(crate) struct Conn {
    pub(crate) client: Client,
    statements: HashMap<String, Statement>,
}

impl Conn {
    fn statement(&mut self, sql: &str) -> Result<Statement, postgres::Error> {
        if let Some(s) = self.statements.get(sql) {
            return Ok(s.clone());
        }
        let s = self.client.prepare(sql)?;
        self.statements.insert(sql.to_string(), s.clone());
        Ok(s)
    }

    /// Runs a statement; the number of rows it changed.
    pub(crate) fn exec(&mut self, sql: &str, params: Params<'_>) -> Result<u64, postgres::Error> {
        let s = self.statement(sql)?;
        self.client.execute(&s, params)
    }

    /// Runs a query; its rows.
    pub(crate) fn query(&mut self, sql: &str, params: Params<'_>) -> Result<Vec<Row>, postgres::Error> {
        let s = self.statement(sql)?;
        self.client.query(&s, params)
    }

    /// Runs a query that returns at most one row.
    pub(crate) fn opt(&mut self, sql: &str, params: Params<'_>) -> Result<Option<Row>, postgres::Error> {
        let s = self.statement(sql)?;
        self.client.query_opt(&s, params)
    }

    /// Runs a query that returns exactly one row.
    pub(crate) fn one(&mut self, sql: &str, params: Params<'_>) -> Result<Row, postgres::Error> {
        let s = self.statement(sql)?;
        self.client.query_one(&s, params)
    }

    /// Runs unparameterised SQL (transaction control, DDL).
    pub(crate) fn batch(&mut self, sql: &str) -> Result<(), postgres::Error> {
        self.client.batch_execute(sql)
    }
}

/// What to do about a failed statement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Recovery {
    /// The connection is gone (server restart, network): reconnect and run again.
    Reconnect,
    /// The transaction lost a race (deadlock, serialization): run it again.
    Retry,
    /// A real error: report it.
    Fail,
}

pub(crate) fn recovery(e: &postgres::Error) -> Recovery {
    if e.is_closed() {
        return Recovery::Reconnect;
    }
    match e.code() {
        // Not from the server: the socket failed, or the driver refused something on our
        // side (a parameter that does not convert, an unexpected row count), which no
        // reconnection mends.
        None if io_failure(e) => Recovery::Reconnect,
        None => Recovery::Fail,
        Some(c)
            if *c == SqlState::ADMIN_SHUTDOWN
                || *c == SqlState::CRASH_SHUTDOWN
                || *c == SqlState::CANNOT_CONNECT_NOW
                || c.code().starts_with("08") =>
        {
            Recovery::Reconnect
        }
        Some(c) if *c == SqlState::T_R_SERIALIZATION_FAILURE || *c == SqlState::T_R_DEADLOCK_DETECTED => {
            Recovery::Retry
        }
        Some(_) => Recovery::Fail,
    }
}

/// Whether an IO error is among the causes of `e`.
fn io_failure(e: &postgres::Error) -> bool {
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if s.is::<std::io::Error>() {
            return true;
        }
        source = s.source();
    }
    false
}

/// How long a handle keeps trying to reach the database before it reports the failure.
pub(crate) const GIVE_UP_AFTER: Duration = Duration::from_secs(15 * 60);

/// Exponential backoff between reconnection attempts: 50 ms doubling to 5 s.
pub(crate) struct Backoff {
    next: Duration,
    started: Instant,
    attempts: u32,
}

impl Backoff {
    pub(crate) fn new() -> Self {
        Backoff { next: Duration::from_millis(50), started: Instant::now(), attempts: 0 }
    }

    /// Sleeps before the next attempt; `false` once the time to give up has come.
    pub(crate) fn wait(&mut self, what: &str, error: &dyn std::fmt::Display) -> bool {
        self.attempts += 1;
        if self.started.elapsed() > GIVE_UP_AFTER {
            tracing::error!(%error, attempts = self.attempts, "{what}: giving up");
            return false;
        }
        if self.attempts == 1 || self.attempts.is_multiple_of(10) {
            tracing::warn!(%error, attempts = self.attempts, "{what}: database unavailable, retrying");
        }
        std::thread::sleep(self.next);
        self.next = (self.next * 2).min(Duration::from_secs(5));
        true
    }

    pub(crate) fn attempts(&self) -> u32 {
        self.attempts
    }
}

/// A database failure below the store's API.
#[derive(Debug)]
pub(crate) enum Failure {
    Pg(postgres::Error),
    Corrupt(String),
    /// The batch lost a race with another instance that no lock prevents (an entity key
    /// created concurrently): running it again sees the winner's row.
    Race(String),
    /// The connection was lost while the transaction committed: its outcome is unknown.
    CommitUnknown(postgres::Error),
}

impl From<postgres::Error> for Failure {
    fn from(e: postgres::Error) -> Self {
        Failure::Pg(e)
    }
}

impl Failure {
    pub(crate) fn into_error(self) -> Error {
        match self {
            Failure::Pg(e) => Error::Db(pg_message(&e)),
            Failure::Corrupt(m) => Error::Corrupt(m),
            Failure::Race(m) => Error::Db(format!("lost a race with another instance: {m}")),
            Failure::CommitUnknown(e) => {
                Error::Db(format!("connection lost while committing; the outcome is unknown ({})", pg_message(&e)))
            }
        }
    }

    pub(crate) fn recovery(&self) -> Recovery {
        match self {
            Failure::Pg(e) => recovery(e),
            Failure::Corrupt(_) => Recovery::Fail,
            Failure::Race(_) => Recovery::Retry,
            Failure::CommitUnknown(_) => Recovery::Fail,
        }
    }
}

/// The server's message (with detail) when there is one, else the driver's.
pub(crate) fn pg_message(e: &postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => match db.detail() {
            Some(detail) => format!("{}: {} ({detail})", db.code().code(), db.message()),
            None => format!("{}: {}", db.code().code(), db.message()),
        },
        None => match std::error::Error::source(e) {
            Some(cause) => format!("{e}: {cause}"),
            None => e.to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_is_taken_from_the_url() {
        let t = Target::parse("postgres://postgres@127.0.0.1:5432/test?schema=tenant_1").unwrap();
        assert_eq!(t.schema.as_deref(), Some("tenant_1"));
        assert_eq!(t.config.get_dbname(), Some("test"));
        let t = Target::parse("postgres://u:secret@h/db?sslmode=disable&schema=s").unwrap();
        assert_eq!(t.schema.as_deref(), Some("s"));
        assert!(!t.display.contains("secret"), "{}", t.display);
    }

    #[test]
    fn bad_schema_names_are_refused() {
        for bad in ["", "a-b", "1abc", "x\"; DROP TABLE t; --"] {
            let e = Target::parse(&format!("postgres://h/db?schema={bad}")).err().expect(bad);
            assert!(e.to_string().contains("invalid schema name"), "{e}");
        }
    }

    #[test]
    fn passwords_are_hidden() {
        assert_eq!(redact("postgres://me:pw@host/db"), "postgres://me:***@host/db");
        assert_eq!(redact("postgres://me@host/db"), "postgres://me@host/db");
    }
}
