//! `settle`: the command-line face of Settle. Wiring only: parsing arguments, opening the
//! store, registering the built-in machines, printing. The engine lives in the libraries.

mod agent;
mod bench;
mod bulk;
mod cancel;
mod defs;
mod demo;
mod demo_run;
mod deploy;
mod engines;
mod feed;
mod inspect;
mod operate;
mod print;
mod prune;
mod remote;
mod report;
mod schedules;
mod serve;
mod simulate;
mod telemetry;
mod validate;
mod workers;
mod workload;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use engines::{Stop, run_engine, runtime};
use settle_core::graph::Format;
use validate::{load_machine, validate};

/// Settle: durable workflows on persistent state machines.
#[derive(Parser, Debug)]
#[command(
    name = "settle",
    version,
    about,
    after_help = "Examples:\n  settle demo --servers 100\n  settle list --machine server --state ready\n  \
                  settle --server http://127.0.0.1:7400 get server r1-srv-00000 --json\n\n\
                  Each command's --help ends with an example; `settle completions bash|zsh|fish` prints a \
                  completion script."
)]
struct Cli {
    /// Database: a SQLite file, or a PostgreSQL URL (`postgres://user@host:5432/db`, with
    /// an optional `?schema=NAME`) shared by many instances [default: settle.db]
    #[arg(long, global = true, env = "SETTLE_DB")]
    db: Option<String>,
    /// Talk to a `settle serve` at this URL instead of opening the database (`get`, `list`,
    /// `history`, `ops`, `op`, `related`, `create`, `raise`, `check` and the operator
    /// commands).
    #[arg(long, global = true, env = "SETTLE_SERVER", value_name = "URL")]
    server: Option<String>,
    /// Bearer token for `--server`.
    #[arg(long, global = true, env = "SETTLE_TOKEN", hide_env_values = true, value_name = "TOKEN")]
    token: Option<String>,
    /// Run the machines defined in this directory (every `*.toml`; a file with errors stops
    /// the command), deploying those not stored yet, instead of the definitions stored in
    /// the database: `run`, `serve`, `create`, `raise`, `check`, `deploy`, `prune`, `bulk`,
    /// `schedules`, `cancel` and the operator commands. An instance claims only entities of
    /// the machines it runs.
    #[arg(long, global = true, env = "SETTLE_MACHINES", value_name = "DIR")]
    machines: Option<PathBuf>,
    /// Run the built-in machines (the demo's and the benchmarks', with their handlers)
    /// instead of the definitions stored in the database: they are stored into a database
    /// that holds none, or only built-in ones; one that holds other definitions is refused.
    /// For the commands that take --machines.
    #[arg(long, global = true, conflicts_with = "machines")]
    builtin: bool,
    /// What the deployment keeps where a machine's definition does not say, for the
    /// engines this command starts: `ended=30d,operations=7d,tasks=7d,minutes=30d,history=forever` are the
    /// defaults; each a duration or `forever` (see README "Retention")
    #[arg(long, global = true, env = "SETTLE_RETENTION", value_name = "SPEC")]
    retention_defaults: Option<String>,
    /// Archive entities before retention removes them: one JSON object per entity with its
    /// history, events and errors, per line, in files of this directory (synced before the
    /// entities go). Every machine's, unless it says `[retention] archive = false`
    #[arg(long, global = true, env = "SETTLE_ARCHIVE", value_name = "DIR")]
    archive: Option<PathBuf>,
    /// Start a new archive file when the current one reaches this size (`64MiB`, `1GiB`,
    /// `500000` bytes)
    #[arg(long, global = true, env = "SETTLE_ARCHIVE_ROTATE", value_name = "SIZE", default_value = "64MiB")]
    archive_rotate: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Check machine definitions (TOML); exits 1 if any has errors.
    #[command(after_help = "Examples:\n  settle validate examples/machines/*.toml\n  \
                            settle validate examples/machines/server.toml --json")]
    Validate {
        /// Definition files.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// One JSON object: `ok`, each file's machine and diagnostics, the diagnostics
        /// across machines.
        #[arg(long)]
        json: bool,
    },
    /// Print a machine's diagram.
    #[command(after_help = "Examples:\n  settle graph examples/machines/server.toml\n  \
                            settle graph examples/machines/cluster.toml --format svg > cluster.svg")]
    Graph {
        /// Definition file.
        file: PathBuf,
        /// mermaid, dot or svg (laid out by Settle, no Graphviz needed).
        #[arg(long, default_value = "mermaid")]
        format: Format,
    },
    /// Run the demo: servers provisioned against a slow, flaky simulated provider.
    #[command(after_help = "Examples:\n  settle demo --servers 100 --fail-rate 0.3\n  \
                            settle demo --db postgres://settle@localhost:5432/settle --instances 3")]
    Demo(demo::Args),
    /// Process due work in the database until stopped (Ctrl-C or SIGTERM). On PostgreSQL,
    /// run as many of these as you like: each is a worker-only instance.
    #[command(after_help = "Examples:\n  settle run --until-idle\n  \
                            settle run --db postgres://settle@localhost:5432/settle --serve cluster \
                            --machines examples/machines")]
    Run {
        /// Exit once nothing is queued, running or scheduled.
        #[arg(long)]
        until_idle: bool,
        /// Stop when stdin closes (for workers started by `--instances`).
        #[arg(long, hide = true)]
        until_stdin_closes: bool,
        /// Process only entities of these machines; the others (of `--machines`, or the
        /// built-in ones) are known: created and raised on, processed by other instances.
        #[arg(long, value_delimiter = ',', value_name = "MACHINE,...")]
        serve: Vec<String>,
    },
    /// Create an entity in its machine's initial state.
    #[command(after_help = "Examples:\n  settle create server web-1 --idempotency-key create-web-1\n  \
                            settle create cluster db-1 --props '{\"max_replicas\": 3}' --machines examples/machines")]
    Create(operate::CreateArgs),
    /// Raise an event on an entity: queued, or with --wait processed until the entity is at
    /// rest again. A rejected event exits 1.
    #[command(after_help = "Examples:\n  settle raise server web-1 create\n  \
                            settle --server http://127.0.0.1:7400 raise cluster db-1 resize \
                            --params '{\"replicas\": 2}' --wait --json")]
    Raise(operate::RaiseArgs),
    /// List entities.
    #[command(after_help = "Examples:\n  settle list --machine server --state ready\n  \
                            settle list --status fault --json | jq -r .key\n  \
                            settle list --machine server --where 'props.region == \"eu\"' --entered-before -1h\n  \
                            settle list --status failed --error 'quota'\n  \
                            settle list --machine server --state provisioning --sort entered")]
    List(inspect::ListArgs),
    /// Show one entity.
    #[command(after_help = "Example:\n  settle get server r1-srv-00000 --json")]
    Get {
        /// Machine name.
        machine: String,
        /// Entity key.
        key: String,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// The change feed: every transition, rejection, fault and command, and every operation
    /// that ended, one line each as it commits (from now on, or after --since). From the
    /// database it reads the store; with --server it follows `GET /v1/feed` and reconnects
    /// after its last position, missing nothing.
    #[command(after_help = "Examples:\n  settle feed --machine server --type transition\n  \
                            settle feed --since 0 --once --json")]
    Feed(feed::FeedArgs),
    /// Why an entity failed, down to the first cause: its failure (the message of the
    /// action that moved it to an error-health state, or the error that parked it), then
    /// each entity that caused it (a subscription's matches), and theirs.
    #[command(after_help = "Example:\n  settle why server r1-srv-00008")]
    Why {
        /// Machine name.
        machine: String,
        /// Entity key.
        key: String,
        /// JSON output (the API's body).
        #[arg(long)]
        json: bool,
    },
    /// What an event would do to an entity if raised now (guards evaluated against its
    /// properties and --params): run an action, be ignored, or be rejected and why. Writes
    /// nothing; exit 1 when it would be rejected.
    #[command(after_help = "Example:\n  settle check cluster db-1 resize --params '{\"replicas\": 5}' \
                            --machines examples/machines")]
    Check(operate::CheckArgs),
    /// Show an entity's transition history (or, with --events, the events it processed).
    #[command(after_help = "Examples:\n  settle history server r1-srv-00000\n  \
                            settle history server r1-srv-00000 --events --json")]
    History {
        /// Machine name.
        machine: String,
        /// Entity key.
        key: String,
        /// List the entity's processed events (the `events` table) instead of its history.
        #[arg(long)]
        events: bool,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// Pause an entity: nothing runs, events queue.
    #[command(after_help = "Example:\n  settle pause server web-1 --request-id pause-web-1")]
    Pause(operate::Target),
    /// Resume a paused, sleeping, backing-off or parked entity.
    #[command(after_help = "Example:\n  settle resume server web-1 --json")]
    Resume(operate::Target),
    /// Put an entity to sleep until a time.
    #[command(after_help = "Examples:\n  settle sleep server web-1 --until +10m\n  \
                            settle sleep server web-1 --until 2026-11-22T10:00:00Z")]
    Sleep {
        #[command(flatten)]
        target: operate::Target,
        /// Wake-up time: RFC 3339 (`2026-11-22T10:00:00Z`, any offset) or from now (`+10m`).
        #[arg(long)]
        until: String,
    },
    /// Kill an entity: terminal, its queued events and timers are canceled.
    #[command(after_help = "Example:\n  settle kill server web-1 --request-id kill-web-1")]
    Kill(operate::Target),
    /// Drop an entity's lease so any engine may continue it.
    #[command(after_help = "Example:\n  settle release server web-1")]
    Release(operate::Target),
    /// Run an entity's pending auto action now (after a backoff, retry delay or parking).
    #[command(after_help = "Example:\n  settle retry server web-1")]
    Retry(operate::Target),
    /// Remove now what retention lets go: entities ended longer ago than their end state
    /// keeps them, with every row they left; ended operations, finished agent tasks and
    /// per-minute counts past their time. `run` and `serve` do it on their own.
    #[command(after_help = "Examples:\n  settle prune --dry-run\n  settle prune --machine server --json\n  \
                            SETTLE_RETENTION=ended=7d,operations=1d settle prune")]
    Prune(prune::Args),
    /// List operations, newest first.
    #[command(after_help = "Examples:\n  settle ops --outcome failed --limit 10\n  \
                            settle ops --limit 1 --json | jq -r .request_id | xargs settle op")]
    Ops {
        /// Only this outcome (`open`: not finished).
        #[arg(long, value_parser = ["success", "failed", "canceled", "hung", "open"])]
        outcome: Option<String>,
        /// At most this many.
        #[arg(long, default_value_t = 50)]
        limit: u64,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// One operation with everything it touched: the entities its request reached and the
    /// transitions it caused there, in order.
    #[command(after_help = "Examples:\n  settle op 0196f3a2-7c41-7d2e-9a51-3f0c2b8e4d17\n  \
                            settle --server http://127.0.0.1:7400 op create-web-1 --json")]
    Op {
        /// The operation's request id (`settle ops` lists them).
        request_id: String,
        /// One JSON object: the operation, its entities and its transitions.
        #[arg(long)]
        json: bool,
    },
    /// Cancel an operation: every entity it reached drops its queued events of it, stops
    /// its work in it (a result in flight is discarded) and runs its machine's `cancel`
    /// event where that is valid; an entity with no undo is left paused. The operation
    /// ends `canceled`; each entity's part is an operation of its own (`ID/cancel/N`).
    #[command(after_help = "Examples:\n  settle cancel create-web-1 --reason 'customer withdrew'\n  \
                            settle --server http://127.0.0.1:7400 cancel create-web-1 --undone --json")]
    Cancel(cancel::CancelArgs),
    /// Bulk operations: one command or event for every entity matching a filter, as one
    /// durable operation with a dry run, a reason, a rate, progress and cancel.
    #[command(after_help = "Examples:\n  settle bulk run resume --machine vm --status failed --dry-run\n  \
                            settle bulk run resume --machine vm --status failed --reason 'quota raised'\n  \
                            settle bulk list")]
    Bulk {
        #[command(subcommand)]
        command: bulk::BulkCommand,
    },
    /// Deploy new versions of machines to a running deployment: each is checked against
    /// the live entities (refused, naming them, if it would strand any), then stored as its
    /// machine's current version; `upgrade = "pin"` keeps working entities on their version
    /// until they rest, the default moves them at once. Running instances take it up within
    /// a second, without a restart. Over `--server`, an admin token.
    #[command(after_help = "Examples:\n  settle deploy machines/server.toml --dry-run\n  \
                            settle --server http://127.0.0.1:7400 deploy machines/*.toml")]
    Deploy(deploy::DeployArgs),
    /// Calendar schedules (`[schedules.NAME]` in a machine): each with its next fire and
    /// counts of fires fired, missed (no engine ran) and skipped (the last still ran);
    /// pause and resume.
    #[command(after_help = "Examples:\n  settle schedules\n  settle schedules list --json\n  \
                            settle --server http://127.0.0.1:7400 schedules pause backup nightly")]
    Schedules {
        #[command(subcommand)]
        command: Option<schedules::ScheduleCommand>,
    },
    /// An entity's predecessors (the entities it reports to, e.g. the parent that created
    /// it) and successors (those it created, whose states its subscriptions watch), with
    /// their states, and how far each subscription valid in its state is from firing.
    #[command(after_help = "Examples:\n  settle related server r1-srv-00000\n  \
                            settle related app r1-srv-00000-app --json")]
    Related {
        /// Machine name.
        machine: String,
        /// Entity key.
        key: String,
        /// One JSON object: the entity, its predecessors, successors and subscriptions.
        #[arg(long)]
        json: bool,
    },
    /// Key figures from the telemetry tables: operations, transitions, top errors.
    #[command(after_help = "Examples:\n  settle stats --since 1h\n  settle stats --prometheus")]
    Stats {
        /// Only what happened within this long before now (e.g. `1h`) [default: all time].
        #[arg(long)]
        since: Option<String>,
        /// One JSON object.
        #[arg(long, conflicts_with = "prometheus")]
        json: bool,
        /// Prometheus text exposition format.
        #[arg(long)]
        prometheus: bool,
    },
    /// Flow control: each concurrency limit (`[limits.NAME]` in a machine), per key value,
    /// with its slots in use, its maximum and the entities waiting in line. `settle get`
    /// says where one entity stands.
    #[command(after_help = "Examples:\n  settle limits\n  settle --server http://127.0.0.1:7400 limits --json")]
    Limits {
        /// One JSON object per line (the API's items).
        #[arg(long)]
        json: bool,
    },
    /// List stored machine definition versions with their entity counts.
    #[command(after_help = "Example:\n  settle machines --json")]
    Machines {
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// Serve the HTTP/JSON management API (see README "HTTP API").
    #[command(after_help = "Examples:\n  settle serve\n  \
                            settle serve --listen 0.0.0.0:7400 --tokens tokens.toml --machines examples/machines \
                            --tls-cert cert.pem --tls-key key.pem")]
    Serve(serve::Args),
    /// An external agent: serves an agent queue of a server over HTTP with the demo's
    /// simulated provider (slow, flaky).
    #[command(after_help = "Example:\n  settle agent --server http://127.0.0.1:7400 --queue provider --concurrency 16")]
    Agent(agent::Args),
    /// Benchmarks.
    #[command(subcommand, after_help = "Example:\n  settle bench chain --entities 10000 --steps 4 --json")]
    Bench(bench::Bench),
    /// Print a shell completion script (bash, zsh, fish, elvish or powershell).
    #[command(after_help = "Examples:\n  \
                            settle completions bash > ~/.local/share/bash-completion/completions/settle\n  \
                            settle completions zsh > ~/.zfunc/_settle\n  \
                            settle completions fish > ~/.config/fish/completions/settle.fish")]
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Deterministic simulation: random schedules of requests, node crashes and stalls,
    /// store failures, clock jumps and agent misbehaviour over the real engine and a SQLite
    /// file, with the invariants checked after every step.
    #[command(after_help = "Examples:\n  settle simulate --seeds 2000\n  settle simulate --for 1h\n  \
                            settle simulate --seed 1234")]
    Simulate(simulate::Args),
    /// Crash-test workload (used by the test suite).
    #[command(hide = true, after_help = "Example:\n  settle --db crash.db workload --jobs 200 --charts 20")]
    Workload(workload::Args),
}

fn db_path(db: &Option<String>) -> String {
    db.clone().unwrap_or_else(|| "settle.db".to_string())
}

fn main() -> ExitCode {
    let matches = <Cli as clap::CommandFactory>::command().get_matches();
    let cli = <Cli as clap::FromArgMatches>::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    // Flushes the OpenTelemetry export (feature `otlp`) when `main` returns. The faults a
    // simulation injects would log warnings by the thousand: it logs only if asked to.
    let quiet = matches!(cli.command, Command::Simulate(_));
    let _telemetry = telemetry::init(if quiet { "off" } else { "warn" });
    // A `--server` flag on a local-only command is refused; `SETTLE_SERVER` is ignored there.
    // The same for `--machines` on a command that starts no engine (or talks to a server).
    let given = |id: &str| matches!(matches.value_source(id), Some(clap::parser::ValueSource::CommandLine));
    let flags = Flags { server: given("server"), machines: given("machines") || cli.builtin, db: given("db") };
    if exits_after_printing(&cli.command) {
        die_quietly_on_closed_pipe();
    }
    if let Some(spec) = &cli.retention_defaults {
        match settle_core::retention::Defaults::BUILT_IN.with(spec) {
            Ok(d) => engines::set_retention(d),
            Err(e) => {
                eprintln!("error: --retention-defaults: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    if let Some(dir) = &cli.archive {
        match engines::parse_size(&cli.archive_rotate) {
            Ok(rotate_bytes) => engines::set_archive(settle_engine::ArchiveConfig { dir: dir.clone(), rotate_bytes }),
            Err(e) => {
                eprintln!("error: --archive-rotate: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    match run(cli, flags) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Whether a command prints and exits (every one but the processes that stay up and talk
/// to other processes: `serve`, `run`, `agent`, `demo` and the crash-test `workload`).
/// Those that do die quietly when their output is closed (`settle list --json | head -1`).
fn exits_after_printing(command: &Command) -> bool {
    !matches!(
        command,
        Command::Serve(_) | Command::Run { .. } | Command::Agent(_) | Command::Demo(_) | Command::Workload(_)
    )
}

/// Makes a write to a closed pipe end the process as it ends `cat` or `ls`: killed by
/// SIGPIPE, quietly (a shell reports status 141), instead of a panic ("failed printing to
/// stdout: Broken pipe") with a backtrace. Rust ignores SIGPIPE so that a write to a dead
/// peer is an error to handle. That stays so on TCP sockets (HTTP, PostgreSQL), written
/// without the signal (MSG_NOSIGNAL, SO_NOSIGPIPE); a PostgreSQL server gone from under a
/// Unix socket would now end a command that would have failed anyway. The processes that
/// stay up keep the error (see [`exits_after_printing`]).
#[cfg(unix)]
#[allow(unsafe_code)]
fn die_quietly_on_closed_pipe() {
    // SAFETY: `signal` only sets SIGPIPE's disposition back to the default action; no
    // handler is installed, so no code of ours ever runs in a signal context, and the
    // arguments are libc's own constants.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

#[cfg(not(unix))]
fn die_quietly_on_closed_pipe() {}

/// Global options given on the command line (not through the environment).
struct Flags {
    server: bool,
    /// `--machines` or `--builtin`.
    machines: bool,
    /// `--db` on the command line (not from `SETTLE_DB`).
    db: bool,
}

fn run(cli: Cli, flags: Flags) -> anyhow::Result<ExitCode> {
    // A command that works on the database or on files refuses a `--server` flag and
    // ignores `SETTLE_SERVER`.
    if flags.server
        && let Some(refusal) = local_only(&cli.command)
    {
        anyhow::bail!("{refusal}");
    }
    // `--db` on the command line names the database to work on: it wins over a
    // `SETTLE_SERVER` from the environment (both flags at once are refused).
    if flags.server && flags.db {
        anyhow::bail!("--server and --db both name where to work: give one");
    }
    let server = if local_only(&cli.command).is_some() || flags.db { None } else { cli.server.as_deref() };
    let command = match server {
        Some(server) => {
            if flags.machines {
                anyhow::bail!(
                    "--machines and --builtin apply to an engine this command starts; with --server (or \
                     SETTLE_SERVER) the server runs its own machines"
                );
            }
            match remote_run(server, cli.token.as_deref(), cli.command)? {
                Ok(code) => return Ok(code),
                Err(local) => local,
            }
        }
        None => cli.command,
    };
    if flags.machines
        && let Some(name) = without_engine(&command)
    {
        anyhow::bail!(
            "`settle {name}` does not take --machines or --builtin (they apply to run, serve, create, raise, check, \
             deploy, prune, bulk, schedules, cancel and the operator commands)"
        );
    }
    // The machines of the engine the command starts: loaded only where one is started.
    let machines = || -> anyhow::Result<defs::Machines> {
        defs::Machines::load(cli.machines.as_deref(), cli.builtin)
            .map_err(|report| anyhow::anyhow!("{}", report.trim_end()))
    };
    match command {
        Command::Validate { files, json } => validate(&files, json),
        Command::Graph { file, format } => {
            let (machine, _) = load_machine(&file).map_err(|report| anyhow::anyhow!("{}", report.trim_end()))?;
            print!("{}", settle_core::graph::render(&machine, format));
            Ok(ExitCode::SUCCESS)
        }
        Command::Demo(args) => runtime()?.block_on(demo::run(&db_path(&cli.db), args)),
        Command::Run { until_idle, until_stdin_closes, serve } => {
            let stop = match (until_idle, until_stdin_closes) {
                (true, _) => Stop::Idle,
                (_, true) => Stop::StdinClosed,
                _ => Stop::Signal,
            };
            let machines = defs::Machines { serve, ..machines()? };
            runtime()?.block_on(run_engine(&db_path(&cli.db), &machines, stop))
        }
        Command::List(a) => runtime()?.block_on(inspect::list(&db_path(&cli.db), a)),
        Command::Get { machine, key, json } => {
            runtime()?.block_on(inspect::get(&db_path(&cli.db), &machine, &key, json))
        }
        Command::Why { machine, key, json } => {
            runtime()?.block_on(inspect::why(&db_path(&cli.db), &machine, &key, json))
        }
        Command::Feed(args) => runtime()?.block_on(feed::local(&db_path(&cli.db), args)),
        Command::History { machine, key, events: false, json } => {
            runtime()?.block_on(inspect::history(&db_path(&cli.db), &machine, &key, json))
        }
        Command::History { machine, key, events: true, json } => {
            runtime()?.block_on(inspect::events(&db_path(&cli.db), &machine, &key, json))
        }
        Command::Pause(t) => operate::run(&db_path(&cli.db), &machines()?, t, operate::Kind::Pause),
        Command::Resume(t) => operate::run(&db_path(&cli.db), &machines()?, t, operate::Kind::Resume),
        Command::Sleep { target, until } => {
            operate::run(&db_path(&cli.db), &machines()?, target, operate::Kind::Sleep(until))
        }
        Command::Kill(t) => operate::run(&db_path(&cli.db), &machines()?, t, operate::Kind::Kill),
        Command::Release(t) => operate::run(&db_path(&cli.db), &machines()?, t, operate::Kind::Release),
        Command::Retry(t) => operate::run(&db_path(&cli.db), &machines()?, t, operate::Kind::Retry),
        Command::Create(args) => runtime()?.block_on(operate::create(&db_path(&cli.db), &machines()?, args)),
        Command::Raise(args) => runtime()?.block_on(operate::raise(&db_path(&cli.db), &machines()?, args)),
        Command::Bulk { command } => runtime()?.block_on(bulk::local(&db_path(&cli.db), &machines()?, command)),
        Command::Schedules { command } => {
            runtime()?.block_on(schedules::local(&db_path(&cli.db), &machines()?, command))
        }
        Command::Deploy(args) => runtime()?.block_on(deploy::local(&db_path(&cli.db), &machines()?, args)),
        Command::Cancel(args) => runtime()?.block_on(cancel::local(&db_path(&cli.db), &machines()?, args)),
        Command::Check(args) => runtime()?.block_on(operate::check(&db_path(&cli.db), &machines()?, args)),
        Command::Prune(args) => runtime()?.block_on(prune::run(&db_path(&cli.db), &machines()?, args)),
        Command::Ops { outcome, limit, json } => {
            runtime()?.block_on(inspect::operations(&db_path(&cli.db), outcome, limit, json))
        }
        Command::Stats { since, json, prometheus } => {
            let format = match (json, prometheus) {
                (true, _) => report::Format::Json,
                (_, true) => report::Format::Prometheus,
                _ => report::Format::Table,
            };
            runtime()?.block_on(report::stats(&db_path(&cli.db), since.as_deref(), format))
        }
        Command::Machines { json } => runtime()?.block_on(inspect::machines(&db_path(&cli.db), json)),
        Command::Limits { json } => runtime()?.block_on(inspect::limits(&db_path(&cli.db), json)),
        Command::Op { request_id, json } => {
            runtime()?.block_on(inspect::operation(&db_path(&cli.db), &request_id, json))
        }
        Command::Related { machine, key, json } => {
            runtime()?.block_on(inspect::related(&db_path(&cli.db), &machine, &key, json))
        }
        Command::Completions { shell } => {
            clap_complete::generate(
                shell,
                &mut <Cli as clap::CommandFactory>::command(),
                "settle",
                &mut std::io::stdout(),
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Serve(args) => serve::run(&db_path(&cli.db), machines()?, args),
        Command::Agent(args) => runtime()?.block_on(agent::run(args)),
        Command::Bench(b) => runtime()?.block_on(bench::run(cli.db.as_deref(), b)),
        Command::Workload(args) => runtime()?.block_on(workload::run(&db_path(&cli.db), args)),
        Command::Simulate(args) => {
            // `--db` on the command line chooses; `SETTLE_DB` (a deployment's own
            // database) is not where a simulation goes unless it is named.
            let db = if flags.db { cli.db.as_deref() } else { None };
            tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(simulate::run(db, args))
        }
    }
}

/// Runs `command` against the server at `server` through settle-client, printing as the
/// local command does; gives the command back when it has no HTTP face.
fn remote_run(server: &str, token: Option<&str>, command: Command) -> anyhow::Result<Result<ExitCode, Command>> {
    use operate::Kind;
    let client = remote::client(server, token)?;
    let c = &client;
    let future: std::pin::Pin<Box<dyn std::future::Future<Output = anyhow::Result<ExitCode>>>> = match command {
        Command::List(a) => Box::pin(remote::list(c, a)),
        Command::Get { machine, key, json } => Box::pin(async move { remote::get(c, &machine, &key, json).await }),
        Command::Why { machine, key, json } => Box::pin(async move { remote::why(c, &machine, &key, json).await }),
        Command::Feed(args) => Box::pin(feed::remote(c, args)),
        Command::History { events: true, .. } => anyhow::bail!(
            "`settle history --events` reads the database's events table, which the HTTP API does not offer; \
             run it without --server where the database is"
        ),
        Command::History { machine, key, json, .. } => {
            Box::pin(async move { remote::history(c, &machine, &key, json).await })
        }
        Command::Ops { outcome, limit, json } => {
            Box::pin(async move { remote::operations(c, outcome.as_deref(), limit, json).await })
        }
        Command::Pause(t) => Box::pin(remote::command(c, t, Kind::Pause)),
        Command::Resume(t) => Box::pin(remote::command(c, t, Kind::Resume)),
        Command::Sleep { target, until } => Box::pin(remote::command(c, target, Kind::Sleep(until))),
        Command::Kill(t) => Box::pin(remote::command(c, t, Kind::Kill)),
        Command::Release(t) => Box::pin(remote::command(c, t, Kind::Release)),
        Command::Retry(t) => Box::pin(remote::command(c, t, Kind::Retry)),
        Command::Create(args) => Box::pin(remote::create(c, args)),
        Command::Raise(args) => Box::pin(remote::raise(c, args)),
        Command::Bulk { command } => Box::pin(bulk::remote(c, command)),
        Command::Schedules { command } => Box::pin(schedules::remote(c, command)),
        Command::Deploy(args) => Box::pin(deploy::remote(c, args)),
        Command::Cancel(args) => Box::pin(cancel::remote(c, args)),
        Command::Check(args) => Box::pin(remote::check(c, args)),
        Command::Op { request_id, json } => Box::pin(async move { remote::operation(c, &request_id, json).await }),
        Command::Related { machine, key, json } => {
            Box::pin(async move { remote::related(c, &machine, &key, json).await })
        }
        Command::Limits { json } => Box::pin(async move { remote::limits(c, json).await }),
        local => return Ok(Err(local)),
    };
    Ok(Ok(runtime()?.block_on(future).map_err(remote::describe)?))
}

/// Why a command that only works on the database (or on files) refuses `--server`.
fn local_only(command: &Command) -> Option<String> {
    let (name, why) = match command {
        Command::Validate { .. } => ("validate", "checks local files"),
        Command::Graph { .. } => ("graph", "reads a local file"),
        Command::Demo(_) => ("demo", "runs its own engine on the database"),
        Command::Run { .. } => ("run", "processes the database directly"),
        Command::Stats { .. } => ("stats", "reads the database directly"),
        Command::Machines { .. } => ("machines", "reads the database directly"),
        Command::Prune(_) => ("prune", "writes the database directly"),
        Command::Serve(_) => ("serve", "is the server: it opens the database directly"),
        Command::Bench(_) => ("bench", "runs its own engines on a database"),
        Command::Workload(_) => ("workload", "runs its own engine on the database"),
        Command::Simulate(_) => ("simulate", "runs its own engines on temporary databases"),
        Command::Completions { .. } => ("completions", "prints a script"),
        // `settle agent --server URL` is its own option; everything else went to the server.
        _ => return None,
    };
    Some(format!("`settle {name}` {why}; it does not take --server"))
}

/// The name of a command that starts no engine on `--machines` (`None`: it uses them).
fn without_engine(command: &Command) -> Option<&'static str> {
    Some(match command {
        Command::Run { .. }
        | Command::Serve(_)
        | Command::Create(_)
        | Command::Raise(_)
        | Command::Bulk { .. }
        | Command::Schedules { .. }
        | Command::Deploy(_)
        | Command::Cancel(_)
        | Command::Check(_)
        | Command::Pause(_)
        | Command::Resume(_)
        | Command::Sleep { .. }
        | Command::Kill(_)
        | Command::Release(_)
        | Command::Retry(_)
        | Command::Prune(_) => return None,
        Command::Validate { .. } => "validate",
        Command::Graph { .. } => "graph",
        Command::Demo(_) => "demo",
        Command::List { .. } => "list",
        Command::Get { .. } => "get",
        Command::Why { .. } => "why",
        Command::Feed(_) => "feed",
        Command::History { .. } => "history",
        Command::Ops { .. } => "ops",
        Command::Op { .. } => "op",
        Command::Related { .. } => "related",
        Command::Completions { .. } => "completions",
        Command::Stats { .. } => "stats",
        Command::Machines { .. } => "machines",
        Command::Limits { .. } => "limits",
        Command::Agent(_) => "agent",
        Command::Bench(_) => "bench",
        Command::Workload(_) => "workload",
        Command::Simulate(_) => "simulate",
    })
}
