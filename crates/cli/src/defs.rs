//! Where the machines of a command come from, decided here once for every command:
//!
//! - `--machines DIR`: every `*.toml` of a directory (no Rust handlers: actions with one
//!   target run as plain transitions, agent-bound actions through agents). An engine that
//!   starts with them deploys them (all, with their entities' moves, in one transaction).
//! - otherwise the definitions stored in the database: each machine's current version (and
//!   the older versions live entities still run under). Nothing is deployed. A stored
//!   version identical to one of this binary's built-in machines runs with its Rust
//!   handlers.
//! - the built-in machines (the demo's, the benchmarks', the crash test's, with their
//!   handlers) only where a command asks for them: `demo`, `bench`, `simulate`, and
//!   `--builtin`. They are stored marked [`ORIGIN`], and only into a database that holds
//!   no definitions but built-in ones ([`refuse_foreign`]): never merged into another
//!   deployment.
//!
//! An instance claims only entities of the machines it runs, so a fleet's instances may
//! run different sets on one PostgreSQL database.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use settle_core::Machine;
use settle_engine::{Engine, EngineBuilder};
use settle_store::{AnyStore, MachineRecord, Store};

/// The origin the versions of the built-in machines are stored with (`settle machines`
/// shows it).
pub const ORIGIN: &str = "built-in";

/// The machines an engine runs.
#[derive(Debug, Clone)]
pub struct Machines {
    /// Their definitions.
    pub source: Source,
    /// Process only entities of these (`settle run --serve`); empty: all of them.
    pub serve: Vec<String>,
}

/// Where the definitions come from.
#[derive(Debug, Clone)]
pub enum Source {
    /// The definitions stored in the database.
    Stored,
    /// The machines this binary knows, with their handlers.
    BuiltIn,
    /// The machines defined in a directory.
    Dir {
        /// The directory.
        dir: PathBuf,
        /// Its machines, by file name.
        machines: Vec<Machine>,
    },
}

impl Machines {
    /// The built-in machines, all served.
    pub const BUILT_IN: Machines = Machines { source: Source::BuiltIn, serve: Vec::new() };

    /// `--machines DIR` if given (every file is checked; the report of every file with
    /// errors, with file and line, is the `Err`), else the built-in machines if
    /// `built_in` (`--builtin`), else the definitions stored in the database.
    pub fn load(dir: Option<&Path>, built_in: bool) -> Result<Machines, String> {
        let source = match (dir, built_in) {
            (Some(dir), _) => Source::Dir { dir: dir.to_path_buf(), machines: load_dir(dir)? },
            (None, true) => Source::BuiltIn,
            (None, false) => Source::Stored,
        };
        Ok(Machines { source, serve: Vec::new() })
    }

    /// Registers the machines (and, for the built-in ones, their handlers), serving those
    /// of `serve` only if it names any. The built-in machines lend their handlers to the
    /// stored versions identical to them.
    pub fn bind(
        &self,
        mut b: EngineBuilder<AnyStore>,
        provider: settle_builtin::ProviderSettings,
    ) -> EngineBuilder<AnyStore> {
        if !self.serve.is_empty() {
            b = b.serve_only(self.serve.iter().map(String::as_str));
        }
        match &self.source {
            Source::Stored => lenders(b, provider).stored_definitions(),
            Source::BuiltIn => settle_builtin::bind_built_in(b, provider).origin(ORIGIN),
            Source::Dir { machines, .. } => {
                for m in machines {
                    b = b.machine(m.clone());
                }
                b
            }
        }
    }

    /// The definitions a command that starts no engine reads (`schedules`, `check`): those
    /// of the directory, the built-in ones, or the current versions stored in `store`.
    pub async fn definitions(&self, store: &AnyStore) -> anyhow::Result<Vec<Machine>> {
        Ok(match &self.source {
            Source::Dir { machines, .. } => machines.clone(),
            Source::BuiltIn => built_in(store).await?.into_values().collect(),
            Source::Stored => stored_machines(store).await?,
        })
    }

    /// What they are, for people: `machine(s) a, b from DIR` (`None`: those stored).
    pub fn describe(&self) -> Option<String> {
        let serving =
            if self.serve.is_empty() { String::new() } else { format!(", serving {}", self.serve.join(", ")) };
        match &self.source {
            Source::Stored if self.serve.is_empty() => None,
            Source::Stored => Some(format!("the machines stored in the database{serving}")),
            Source::BuiltIn => Some(format!("the built-in machines{serving}")),
            Source::Dir { dir, machines } => {
                let names: Vec<&str> = machines.iter().map(|m| m.name().as_str()).collect();
                Some(format!("machine(s) {} from {}{serving}", names.join(", "), dir.display()))
            }
        }
    }
}

/// The built-in machines by name, as this binary defines them with the simulated provider
/// settings of the latest demo run on `store` (the `server`'s timeout is part of its
/// definition).
pub async fn built_in(store: &AnyStore) -> anyhow::Result<BTreeMap<String, Machine>> {
    let provider = crate::demo_run::stored_settings(store).await?.unwrap_or_default();
    let b = lenders(Engine::builder(store.clone()), provider);
    Ok(b.registered().map(|m| (m.name().to_string(), m.clone())).collect())
}

/// Every machine this binary has handlers for: those `--builtin` runs, and the crash test's
/// `chart` (`settle workload`). A stored version identical to one of them runs with them.
fn lenders(b: EngineBuilder<AnyStore>, provider: settle_builtin::ProviderSettings) -> EngineBuilder<AnyStore> {
    settle_builtin::chart::bind_chart(settle_builtin::bind_built_in(b, provider))
}

/// Whether a stored version is one of the built-in machines: stored marked [`ORIGIN`], or
/// identical to this binary's (stored before versions had an origin).
pub fn is_built_in(r: &MachineRecord, built_in: &BTreeMap<String, Machine>) -> bool {
    r.origin == ORIGIN || built_in.get(r.name.as_str()).is_some_and(|m| m.content_hash() == r.hash)
}

/// Refuses to run the built-in machines on `store` when it holds other definitions: a
/// machine whose current version is not built-in (a user's deployment). They are never
/// merged into one.
pub async fn refuse_foreign(store: &AnyStore) -> anyhow::Result<()> {
    let built_in = built_in(store).await?;
    let stored = store.machine_list().await?;
    let foreign: Vec<&str> = settle_store::current_versions(&stored)
        .into_iter()
        .filter(|(_, r)| !is_built_in(r, &built_in))
        .map(|(name, _)| name)
        .collect();
    if foreign.is_empty() {
        return Ok(());
    }
    anyhow::bail!(
        "{} holds definitions of its own (machine(s) {}): the built-in machines run only on a database that holds          none, or only built-in ones, and are never merged into another deployment. Use another database (--db)          for the demo and the benchmarks; run this one's definitions without --builtin, or with --machines DIR",
        store.location(),
        foreign.join(", ")
    )
}

/// The current version of every machine stored in `store`, read back (one that no longer
/// reads as a definition is left out, with a warning).
pub async fn stored_machines(store: &AnyStore) -> anyhow::Result<Vec<Machine>> {
    let stored = store.machine_list().await?;
    let mut machines = Vec::new();
    for (name, r) in settle_store::current_versions(&stored) {
        match Machine::from_canonical_json(&r.definition) {
            Ok(m) => machines.push(m),
            Err(e) => eprintln!("warning: stored definition of machine `{name}` ({}) does not read back: {e}", r.hash),
        }
    }
    Ok(machines)
}

/// Why the machines of a directory cannot run without Rust handlers: the actions that
/// need one.
pub fn missing_handlers(actions: &[String]) -> String {
    format!(
        "cannot run these machines: no handler for {}. `settle` runs actions with exactly one target itself; \
         an action with several targets needs a Rust handler (embed settle-engine) or an agent queue \
         (`agent = \"QUEUE\"`)",
        actions.join(", ")
    )
}

/// Every `*.toml` of `dir`, by file name; `Err` holds the report of every file with errors.
pub fn load_dir(dir: &Path) -> Result<Vec<Machine>, String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: cannot read directory: {e}", dir.display()))?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "toml") && p.is_file())
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(format!("{}: no machine definitions (*.toml)", dir.display()));
    }
    let mut report = String::new();
    let mut machines = Vec::new();
    for path in &files {
        match crate::validate::load_machine(path) {
            Ok((m, _warnings)) => machines.push(m),
            Err(r) => report.push_str(&r),
        }
    }
    if report.is_empty() {
        let set: Vec<&Machine> = machines.iter().collect();
        let checked = settle_core::validate::check_set(&set);
        if checked.has_errors() {
            report = checked.to_string();
        }
    }
    if report.is_empty() { Ok(machines) } else { Err(report) }
}
