//! Starting engines for the commands (on a database, with the machines [`defs`] says:
//! stored, `--machines` or built-in), running one until it is stopped, and the signals that
//! stop it.

use std::process::ExitCode;

use settle_engine::{Config, Engine};
use settle_store::{AnyStore, Store};

use crate::{defs, demo_run};

/// The deployment's retention (`--retention-defaults`, `SETTLE_RETENTION`), when given.
static RETENTION: std::sync::OnceLock<settle_core::retention::Defaults> = std::sync::OnceLock::new();

/// Sets the retention every engine this process starts uses (once, from the command line).
pub(crate) fn set_retention(d: settle_core::retention::Defaults) {
    let _ = RETENTION.set(d);
}

/// The deployment's archive (`--archive`, `SETTLE_ARCHIVE`), when given.
static ARCHIVE: std::sync::OnceLock<settle_engine::ArchiveConfig> = std::sync::OnceLock::new();

/// Sets the archive every engine this process starts writes to (once, from the command line).
pub(crate) fn set_archive(a: settle_engine::ArchiveConfig) {
    let _ = ARCHIVE.set(a);
}

/// Reads a size: bytes, or a number with `KiB`, `MiB`, `GiB` (or `K`, `M`, `G`, `KB`, `MB`,
/// `GB`, all powers of 1024).
pub(crate) fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (n, unit) = t.split_at(split);
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        _ => return Err(format!("invalid size `{text}` (expected e.g. `64MiB`, `1GiB` or a number of bytes)")),
    };
    let n: u64 =
        n.parse().map_err(|_| format!("invalid size `{text}` (expected e.g. `64MiB`, `1GiB` or a number of bytes)"))?;
    match n.checked_mul(1 << shift) {
        Some(b) if b > 0 => Ok(b),
        _ => Err(format!("invalid size `{text}`: it must be more than 0 and less than 16 EiB")),
    }
}

/// A multi-threaded runtime for a command.
pub(crate) fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread().enable_all().build()?)
}

/// Starts an engine on `db` running `machines`.
pub(crate) async fn start_engine(db: &str, machines: &defs::Machines) -> anyhow::Result<Engine<AnyStore>> {
    start_engine_on(AnyStore::open(db)?, machines).await
}

/// Starts an engine on an open store running `machines`.
pub(crate) async fn start_engine_on(store: AnyStore, machines: &defs::Machines) -> anyhow::Result<Engine<AnyStore>> {
    start_engine_with(store, machines, Config::default()).await
}

/// Starts an engine on an existing database that processes nothing (it claims no due
/// work): for operator commands, which are written through the engine and return.
pub(crate) async fn start_command_engine(db: &str, machines: &defs::Machines) -> anyhow::Result<Engine<AnyStore>> {
    // Refuse a missing or foreign database before opening it for writing (which would
    // create it).
    drop(AnyStore::open_read_only(db)?);
    start_driver_engine(AnyStore::open(db)?, machines).await
}

/// Starts an engine on an existing database that writes nothing at all ([`Config::read_only`]):
/// for the read-only commands and the dry runs, which look through one and return.
pub(crate) async fn start_read_only_engine(db: &str, machines: &defs::Machines) -> anyhow::Result<Engine<AnyStore>> {
    drop(AnyStore::open_read_only(db)?);
    start_engine_with(AnyStore::open(db)?, machines, Config { read_only: true, ..Config::default() }).await
}

/// An engine that writes (creates, raises, commands) but claims no due work: the driver of
/// `--instances` runs, whose workers do the processing.
pub(crate) async fn start_driver_engine(
    store: AnyStore,
    machines: &defs::Machines,
) -> anyhow::Result<Engine<AnyStore>> {
    start_engine_with(store, machines, Config { max_inflight: 0, ..Config::default() }).await
}

/// Starts an engine on an open store running `machines` with `config`.
pub(crate) async fn start_engine_with(
    store: AnyStore,
    machines: &defs::Machines,
    config: Config,
) -> anyhow::Result<Engine<AnyStore>> {
    start_built(engine_builder(store, machines, config).await?).await
}

/// An engine builder on an open store with `machines` bound, and `config` (its lease from
/// `SETTLE_LEASE` if set, its retention from `--retention-defaults` and its archive from
/// `--archive` if given).
pub(crate) async fn engine_builder(
    store: AnyStore,
    machines: &defs::Machines,
    mut config: Config,
) -> anyhow::Result<settle_engine::EngineBuilder<AnyStore>> {
    if let Some(retention) = RETENTION.get() {
        config.retention = *retention;
    }
    if let Some(archive) = ARCHIVE.get() {
        config.archive = Some(archive.clone());
    }
    if let Ok(lease) = std::env::var("SETTLE_LEASE") {
        config.lease = settle_core::duration::parse(&lease).map_err(|e| anyhow::anyhow!("SETTLE_LEASE: {e}"))?;
    }
    // The built-in machines run against the simulated provider, whose settings the latest
    // demo run on this database chose (they are part of the `server`'s definition, and a
    // stored version identical to it runs with its handlers); machines of a directory have
    // none.
    let provider = match machines.source {
        defs::Source::BuiltIn | defs::Source::Stored => demo_run::stored_settings(&store).await?.unwrap_or_default(),
        defs::Source::Dir { .. } => settle_builtin::ProviderSettings::default(),
    };
    if matches!(machines.source, defs::Source::BuiltIn) && !config.read_only {
        defs::refuse_foreign(&store).await?;
    }
    Ok(machines.bind(Engine::builder(store).config(config), provider))
}

/// Starts a built engine; missing handlers are explained.
pub(crate) async fn start_built(b: settle_engine::EngineBuilder<AnyStore>) -> anyhow::Result<Engine<AnyStore>> {
    match b.start().await {
        Ok(engine) => Ok(engine),
        Err(settle_engine::Error::MissingHandlers(actions)) => anyhow::bail!("{}", defs::missing_handlers(&actions)),
        Err(e) => Err(e.into()),
    }
}

/// When `settle run` stops.
pub(crate) enum Stop {
    Signal,
    Idle,
    StdinClosed,
}

pub(crate) async fn run_engine(db: &str, machines: &defs::Machines, stop: Stop) -> anyhow::Result<ExitCode> {
    if matches!(machines.source, defs::Source::Stored) {
        // Nothing to run is said before anything is opened for writing (or created).
        let nothing = |why: &str| {
            anyhow::anyhow!(
                "{why}: nothing to run. Deploy machines (`settle deploy FILE...`), or run with --machines DIR (or \
                 --builtin for the built-in ones)"
            )
        };
        let store = AnyStore::open_read_only(db).map_err(|e| nothing(&e.to_string()))?;
        if store.machine_list().await?.is_empty() {
            return Err(nothing(&format!("no machine definitions are stored in {db}")));
        }
    }
    let engine = start_engine(db, machines).await?;
    if let Some(what) = machines.describe() {
        eprintln!("settle: running {what}");
    }
    eprintln!("settle: processing due work in {}", engine.store().location());
    match stop {
        Stop::Idle => engine.wait_idle().await?,
        Stop::Signal => {
            shutdown_signal().await;
            eprintln!("settle: stopping (finishing running actions)");
        }
        Stop::StdinClosed => {
            tokio::select! {
                _ = stdin_closed() => {}
                _ = shutdown_signal() => {}
            }
        }
    }
    engine.shutdown().await;
    Ok(ExitCode::SUCCESS)
}

/// Resolves when stdin reaches its end (the parent closed the pipe, or died).
pub(crate) async fn stdin_closed() {
    use tokio::io::AsyncReadExt;
    let mut stdin = tokio::io::stdin();
    let mut buf = [0u8; 256];
    while let Ok(n) = stdin.read(&mut buf).await {
        if n == 0 {
            return;
        }
    }
}

/// Resolves on Ctrl-C or SIGTERM.
pub(crate) fn shutdown_signal() -> impl std::future::Future<Output = ()> + Send + 'static {
    // The handlers are installed here, before the future is first polled: a signal sent
    // from now on ends it, even while the runtime is busy elsewhere (a spawned listener
    // installs nothing until it runs, and the signal's default action kills the process).
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut interrupt = signal(SignalKind::interrupt()).expect("signal handler");
        let mut term = signal(SignalKind::terminate()).expect("signal handler");
        async move {
            tokio::select! {
                _ = interrupt.recv() => {}
                _ = term.recv() => {}
            }
        }
    }
    #[cfg(not(unix))]
    {
        async {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes_read_bytes_and_binary_units() {
        assert_eq!(parse_size("500000"), Ok(500_000));
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("256 KiB"), Ok(256 << 10));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        for bad in ["", "0", "MiB", "12 parsecs", "-1", "99999999999999GiB"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }
}
