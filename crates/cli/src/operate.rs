//! Writes on one entity: the operator commands (`pause`, `resume`, `sleep`, `kill`,
//! `release`, `retry`), `create` and `raise`. Locally each starts an engine on the database
//! that processes nothing (`raise --wait` excepted: it processes until the entity is at rest),
//! writes the request as an operation (idempotent per request id), prints what it did and
//! stops. Over `--server` [`crate::remote`] does the same through the API; both print
//! through [`crate::print`].

use std::process::ExitCode;
use std::time::Duration;

use serde_json::{Map, Value};
use settle_core::time::parse_time;
use settle_engine::{Command, Engine, EventOutcome, RaiseOptions, Wait};
use settle_store::{AnyStore, Store};

use crate::defs::Machines;
use crate::print;

/// The entity a command applies to.
#[derive(clap::Args, Debug)]
pub struct Target {
    /// Machine name.
    pub(crate) machine: String,
    /// Entity key.
    pub(crate) key: String,
    /// Idempotency key: a command repeated with the same id is done once.
    #[arg(long)]
    pub(crate) request_id: Option<String>,
    /// Why: kept with the operation and in the entity's history (`pause: <reason>`).
    #[arg(long)]
    pub(crate) reason: Option<String>,
    /// One JSON object.
    #[arg(long)]
    pub(crate) json: bool,
}

/// Which command, with `sleep`'s wake-up time as given.
#[derive(Debug)]
pub enum Kind {
    Pause,
    Resume,
    Sleep(String),
    Kill,
    Release,
    Retry,
}

impl Kind {
    /// The command's name (its path segment in the API).
    pub fn name(&self) -> &'static str {
        match self {
            Kind::Pause => "pause",
            Kind::Resume => "resume",
            Kind::Sleep(_) => "sleep",
            Kind::Kill => "kill",
            Kind::Release => "release",
            Kind::Retry => "retry",
        }
    }
}

/// Arguments of `settle create`.
#[derive(clap::Args, Debug)]
pub struct CreateArgs {
    /// Machine name.
    pub(crate) machine: String,
    /// The new entity's key.
    pub(crate) key: String,
    /// Constructor properties: a JSON object.
    #[arg(long, value_name = "JSON")]
    props: Option<String>,
    /// Idempotency key (the operation's request id): a create repeated with the same key
    /// creates nothing and shows the entity as it is.
    #[arg(long, visible_alias = "request-id", value_name = "K")]
    pub(crate) idempotency_key: Option<String>,
    /// One JSON object.
    #[arg(long)]
    pub(crate) json: bool,
}

impl CreateArgs {
    /// `--props` as a JSON object (none: `{}`).
    pub(crate) fn properties(&self) -> anyhow::Result<Map<String, Value>> {
        match self.props.as_deref().map(serde_json::from_str::<Value>).transpose() {
            Err(e) => anyhow::bail!("--props: not JSON: {e}"),
            Ok(None | Some(Value::Null)) => Ok(Map::new()),
            Ok(Some(Value::Object(o))) => Ok(o),
            Ok(Some(_)) => anyhow::bail!("--props must be a JSON object"),
        }
    }
}

/// Arguments of `settle raise`.
#[derive(clap::Args, Debug)]
pub struct RaiseArgs {
    /// Machine name.
    pub(crate) machine: String,
    /// Entity key.
    pub(crate) key: String,
    /// Event name.
    pub(crate) event: String,
    /// The event's parameters: a JSON object.
    #[arg(long, value_name = "JSON")]
    params: Option<String>,
    /// Wait, and show the outcome and the entity: `--wait` (or `--wait=operation`) until
    /// the operation the event started has ended, every entity it reached at rest again
    /// (exit 1 unless it ended `success`); `--wait=stable` until this entity is at rest
    /// again.
    #[arg(
        long,
        value_name = "WHAT",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "operation"
    )]
    pub(crate) wait: Option<WaitFor>,
    /// How long `--wait` waits (the event is still processed after).
    #[arg(long, default_value = "30s", requires = "wait")]
    timeout: String,
    /// Idempotency key (the operation's request id): an event raised again with the same
    /// key is raised once.
    #[arg(long, visible_alias = "request-id", value_name = "K")]
    pub(crate) idempotency_key: Option<String>,
    /// The priority of the work the event starts, from -1000 to 1000 (default: the event's
    /// declared one, else 0): work waiting in a limit's line goes by it, higher first.
    #[arg(long, allow_hyphen_values = true)]
    pub(crate) priority: Option<i64>,
    /// One JSON object.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `--params` as JSON (none: null).
fn parse_params(params: Option<&str>) -> anyhow::Result<Value> {
    match params.map(serde_json::from_str::<Value>).transpose() {
        Err(e) => anyhow::bail!("--params: not JSON: {e}"),
        Ok(None) => Ok(Value::Null),
        Ok(Some(v @ (Value::Null | Value::Object(_)))) => Ok(v),
        Ok(Some(_)) => anyhow::bail!("--params must be a JSON object"),
    }
}

/// Arguments of `settle check`.
#[derive(clap::Args, Debug)]
pub struct CheckArgs {
    /// Machine name.
    pub(crate) machine: String,
    /// Entity key.
    pub(crate) key: String,
    /// Event name.
    pub(crate) event: String,
    /// The event's parameters: a JSON object (guards read them).
    #[arg(long, value_name = "JSON")]
    params: Option<String>,
    /// One JSON object.
    #[arg(long)]
    pub(crate) json: bool,
}

impl CheckArgs {
    /// `--params` as JSON (none: null).
    pub(crate) fn params(&self) -> anyhow::Result<Value> {
        parse_params(self.params.as_deref())
    }
}

/// `settle check` on the database `db`: what the event would do to the entity now. It
/// reads the database only (no engine starts): the machine is the one of `--machines`, or
/// else its newest stored definition.
pub async fn check(db: &str, machines: &Machines, a: CheckArgs) -> anyhow::Result<ExitCode> {
    let params = a.params()?;
    let store = crate::inspect::open(db)?;
    let machine = machines.definitions(&store).await?.into_iter().find(|m| m.name() == a.machine.as_str());
    let machine = machine.ok_or_else(|| {
        anyhow::anyhow!(
            "unknown machine `{}`: no definition of it is stored in {db} (or given with --machines)",
            a.machine
        )
    })?;
    let entity = store
        .entity_get(&a.machine, &a.key)
        .await?
        .ok_or_else(|| anyhow::anyhow!("entity `{}` of machine `{}` not found", a.key, a.machine))?;
    let permission = settle_engine::can_fire(&machine, &entity, &a.event, &params)?;
    let verdict = settle_server::model::verdict_of(&permission);
    let check = settle_client::EventCheck { event: a.event.clone(), state: entity.state.to_string(), verdict };
    Ok(print::check(&a.machine, &a.key, &check, a.json))
}

impl RaiseArgs {
    /// `--params` as JSON (none: null).
    pub(crate) fn params(&self) -> anyhow::Result<Value> {
        parse_params(self.params.as_deref())
    }

    /// `--timeout`, parsed.
    pub(crate) fn timeout(&self) -> anyhow::Result<Duration> {
        settle_core::duration::parse(&self.timeout).map_err(|e| anyhow::anyhow!("--timeout: {e}"))
    }
}

/// An operator command on the database `db`.
pub fn run(db: &str, machines: &Machines, target: Target, kind: Kind) -> anyhow::Result<ExitCode> {
    let command = match kind {
        Kind::Pause => Command::Pause,
        Kind::Resume => Command::Resume,
        Kind::Sleep(until) => {
            let until =
                parse_time(&until, settle_store::clock::now_ms()).map_err(|e| anyhow::anyhow!("--until: {e}"))?;
            Command::Sleep { until }
        }
        Kind::Kill => Command::Kill,
        Kind::Release => Command::Release,
        Kind::Retry => Command::Retry,
    };
    crate::engines::runtime()?.block_on(apply(db, machines, target, command))
}

async fn apply(db: &str, machines: &Machines, t: Target, command: Command) -> anyhow::Result<ExitCode> {
    let engine = crate::engines::start_command_engine(db, machines).await?;
    let result =
        engine.command_with_reason(&t.machine, &t.key, command, t.request_id.clone(), t.reason.as_deref()).await;
    engine.shutdown().await;
    let done = result?;
    let entity = settle_client::Entity::from(&done.entity);
    let d = print::Done {
        entity: &entity,
        command: command.as_str(),
        request_id: &done.request_id,
        replayed: done.replayed,
    };
    print::done(&d, t.json);
    Ok(ExitCode::SUCCESS)
}

/// `settle create` on the database `db` (created if missing). The entity's work, if its
/// initial state has any, is left to `settle run`.
pub async fn create(db: &str, machines: &Machines, a: CreateArgs) -> anyhow::Result<ExitCode> {
    let properties = a.properties()?;
    if matches!(machines.source, crate::defs::Source::Stored) {
        // Only `--machines` (or `--builtin`) can start a database: nothing is stored in a
        // missing one.
        drop(AnyStore::open_read_only(db)?);
    }
    let engine = crate::engines::start_driver_engine(AnyStore::open(db)?, machines).await?;
    let result = engine.create_with(&a.machine, &a.key, properties, a.idempotency_key.clone()).await;
    engine.shutdown().await;
    let created = result?;
    let entity = settle_client::Entity::from(&created.entity);
    let d =
        print::Done { entity: &entity, command: "create", request_id: &created.request_id, replayed: created.replayed };
    print::done(&d, a.json);
    Ok(ExitCode::SUCCESS)
}

/// What `settle raise --wait` waits for.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitFor {
    /// The operation the event started has ended.
    Operation,
    /// The entity is at rest again.
    Stable,
}

impl WaitFor {
    /// The engine's wait.
    fn engine(self) -> Wait {
        match self {
            WaitFor::Operation => Wait::Operation,
            WaitFor::Stable => Wait::Stable,
        }
    }

    /// The client's wait.
    pub(crate) fn client(self) -> settle_client::WaitFor {
        match self {
            WaitFor::Operation => settle_client::WaitFor::Operation,
            WaitFor::Stable => settle_client::WaitFor::Stable,
        }
    }
}

/// `settle raise` on the database `db`. Without `--wait` the event is queued for `settle
/// run`; with it, this process runs the engine until the entity is at rest again.
pub async fn raise(db: &str, machines: &Machines, a: RaiseArgs) -> anyhow::Result<ExitCode> {
    let params = a.params()?;
    let timeout = a.timeout()?;
    let engine = if a.wait.is_some() {
        // Refuse a missing database rather than create it.
        drop(AnyStore::open_read_only(db)?);
        crate::engines::start_engine(db, machines).await?
    } else {
        crate::engines::start_command_engine(db, machines).await?
    };
    let result = raise_on(&engine, &a, params, timeout).await;
    engine.shutdown().await;
    let (request_id, raised) = result?;
    let r =
        print::Raise { machine: &a.machine, key: &a.key, event: &a.event, request_id: request_id.as_deref(), raised };
    print::raise(&r, a.json);
    Ok(if r.ok() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

async fn raise_on(
    engine: &Engine<AnyStore>,
    a: &RaiseArgs,
    params: Value,
    timeout: Duration,
) -> anyhow::Result<(Option<String>, print::Raised)> {
    // As the server does: an event invalid in the state of an entity at rest is refused at
    // once, unrecorded (nothing could make it valid before its turn).
    let mut options = RaiseOptions::wait(a.wait.map_or(Wait::Queued, WaitFor::engine))
        .params(params)
        .timeout(timeout)
        .refuse_at_rest();
    if let Some(p) = a.priority {
        options = options.priority(p);
    }
    if let Some(id) = &a.idempotency_key {
        options = options.request_id(id.clone());
    }
    let raised = engine.raise(&a.machine, &a.key, &a.event, options).await?;
    if raised.refused
        && let Some(EventOutcome::Rejected { state, reason }) = raised.outcome
    {
        return Ok((None, print::Raised::Rejected { state: state.to_string(), reason }));
    }
    let entity = raised.entity.as_ref().map(|e| Box::new(settle_client::Entity::from(e)));
    let operation = raised.operation.as_ref().map(|o| Box::new(settle_client::Operation::from(o)));
    let outcome = if a.wait.is_none() {
        print::Raised::Queued { replayed: raised.replayed }
    } else {
        match raised.outcome {
            Some(EventOutcome::Rejected { state, reason }) => {
                print::Raised::Rejected { state: state.to_string(), reason }
            }
            Some(EventOutcome::Failed { error }) => print::Raised::Failed { error },
            Some(EventOutcome::Accepted { state }) => print::Raised::Done {
                outcome: Some(settle_client::Outcome::Accepted { state: state.to_string() }),
                entity,
                operation,
            },
            Some(EventOutcome::Ignored { state }) => print::Raised::Done {
                outcome: Some(settle_client::Outcome::Ignored { state: state.to_string() }),
                entity,
                operation,
            },
            None => print::Raised::Done { outcome: None, entity, operation },
        }
    };
    Ok((Some(raised.request_id), outcome))
}
