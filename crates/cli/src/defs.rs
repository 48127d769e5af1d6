//! Where the machines of an engine this binary starts come from: the built-in ones (the
//! demo's, the benchmarks', the crash test's, with their Rust handlers), or every `*.toml`
//! of a directory (`--machines DIR`, no Rust handlers: actions with one target run as plain
//! transitions, agent-bound actions through agents).
//!
//! An instance claims only entities of the machines it runs, so a fleet's instances may
//! run different sets on one PostgreSQL database.

use std::path::{Path, PathBuf};

use settle_core::Machine;
use settle_engine::EngineBuilder;
use settle_store::AnyStore;

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
    /// errors, with file and line, is the `Err`), else the built-in machines.
    pub fn load(dir: Option<&Path>) -> Result<Machines, String> {
        let source = match dir {
            None => Source::BuiltIn,
            Some(dir) => Source::Dir { dir: dir.to_path_buf(), machines: load_dir(dir)? },
        };
        Ok(Machines { source, serve: Vec::new() })
    }

    /// Registers the machines (and, for the built-in ones, their handlers), serving those
    /// of `serve` only if it names any.
    pub fn bind(
        &self,
        mut b: EngineBuilder<AnyStore>,
        provider: settle_builtin::ProviderSettings,
    ) -> EngineBuilder<AnyStore> {
        if !self.serve.is_empty() {
            b = b.serve_only(self.serve.iter().map(String::as_str));
        }
        match &self.source {
            Source::BuiltIn => settle_builtin::bind_built_in(b, provider),
            Source::Dir { machines, .. } => {
                for m in machines {
                    b = b.machine(m.clone());
                }
                b
            }
        }
    }

    /// What they are, for people: `machine(s) a, b from DIR` (`None`: the built-in ones).
    pub fn describe(&self) -> Option<String> {
        let serving =
            if self.serve.is_empty() { String::new() } else { format!(", serving {}", self.serve.join(", ")) };
        match &self.source {
            Source::BuiltIn if self.serve.is_empty() => None,
            Source::BuiltIn => Some(format!("the built-in machines{serving}")),
            Source::Dir { dir, machines } => {
                let names: Vec<&str> = machines.iter().map(|m| m.name().as_str()).collect();
                Some(format!("machine(s) {} from {}{serving}", names.join(", "), dir.display()))
            }
        }
    }
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
