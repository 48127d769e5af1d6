//! The machines an engine knows and the handlers bound to their actions, shared by the
//! engine's API, its scheduler and the decisions. A deploy replaces the registry whole
//! ([`Registries`]); each entity runs under its own version ([`Registry::version_of`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use settle_core::{ActionName, Machine, MachineName};

use crate::error::{Error, Result};
use crate::handler::Handler;

/// Machines and their bound handlers.
#[derive(Clone)]
pub(crate) struct Registry {
    /// The current version of each machine: what new entities start under.
    pub(crate) machines: HashMap<MachineName, Arc<Machine>>,
    pub(crate) handlers: HashMap<(MachineName, ActionName), Handler>,
    /// Content hash (definition version) of each machine's current version.
    pub(crate) hashes: HashMap<MachineName, String>,
    /// Every version known, by content hash: the current ones and the older ones stored
    /// (entities pinned to them run under them).
    pub(crate) versions: HashMap<String, Arc<Machine>>,
    /// The machines whose entities this engine processes (`None`: all registered).
    pub(crate) served: Option<Vec<MachineName>>,
    /// [`Registry::agent_check`], built once (an agent's every report reads it).
    checked: std::sync::OnceLock<settle_store::TaskCheck>,
}

impl Registry {
    pub(crate) fn new() -> Self {
        Registry {
            machines: HashMap::new(),
            handlers: HashMap::new(),
            hashes: HashMap::new(),
            versions: HashMap::new(),
            served: None,
            checked: std::sync::OnceLock::new(),
        }
    }
    /// The version an entity runs under, with its hash: the one it records when known,
    /// else its machine's current one. A version this engine does not know yet (deployed
    /// by another instance a moment ago) keeps its hash, so that the entity's commits do
    /// not take it back to an older one, and runs under the current definition meanwhile.
    pub(crate) fn version_of(&self, e: &settle_store::EntityRow) -> Result<(String, Arc<Machine>)> {
        if let Some(h) = &e.machine_hash
            && let Some(m) = self.versions.get(h).filter(|m| m.name() == &e.machine)
        {
            return Ok((h.clone(), m.clone()));
        }
        let m = self.machine(&e.machine)?;
        let hash = e.machine_hash.clone().or_else(|| self.hashes.get(m.name()).cloned()).unwrap_or_default();
        Ok((hash, m.clone()))
    }
    /// What a cascading delete (`cascade = ["delete"]`) raises on an entity's successors:
    /// for each delete event (`delete = "…"`), to the successors of the machines that
    /// declare it (a successor whose machine declares none is left as it is).
    pub(crate) fn delete_cascade(&self) -> Vec<settle_store::PushRelated> {
        let mut by_event: std::collections::BTreeMap<&settle_core::EventName, Vec<MachineName>> = Default::default();
        for m in self.machines.values() {
            if let Some(event) = m.delete_event() {
                by_event.entry(event).or_default().push(m.name().clone());
            }
        }
        by_event
            .into_iter()
            .map(|(event, mut machines)| {
                machines.sort();
                settle_store::PushRelated {
                    on: settle_core::machine::Related::Successors,
                    machines,
                    event: event.clone(),
                    params: serde_json::Value::Null,
                }
            })
            .collect()
    }
    /// Makes `machine` (of content hash `hash`) its machine's current version.
    pub(crate) fn set_current(&mut self, machine: Arc<Machine>, hash: String) {
        self.versions.insert(hash.clone(), machine.clone());
        self.hashes.insert(machine.name().clone(), hash);
        self.machines.insert(machine.name().clone(), machine);
        self.checked = std::sync::OnceLock::new();
    }
    /// Whether this engine processes entities of `machine` (else other instances do, and
    /// this one only creates them and raises events on them).
    pub(crate) fn serves(&self, machine: &str) -> bool {
        self.served.as_ref().is_none_or(|s| s.iter().any(|m| m == machine))
    }
    /// The names of the machines served, sorted.
    pub(crate) fn served_names(&self) -> Vec<String> {
        let mut served: Vec<String> = self.machines.keys().filter(|m| self.serves(m)).map(|m| m.to_string()).collect();
        served.sort();
        served
    }
    /// What an agent's completion is checked against when it is applied: the agent-run
    /// actions, by (machine, action) (targets, `may_create`, `may_raise`), and their
    /// machines (a reply asked for, events raised on the entity itself); any queue.
    pub(crate) fn agent_check(&self) -> settle_store::TaskCheck {
        self.checked.get_or_init(|| self.build_agent_check()).clone()
    }

    fn build_agent_check(&self) -> settle_store::TaskCheck {
        let (mut actions, mut machines) = (std::collections::BTreeMap::new(), std::collections::BTreeMap::new());
        // A pinned entity's report is checked against its machine's current version.
        for m in self.machines.values() {
            for a in m.actions().iter().filter(|a| a.agent.is_some()) {
                actions.insert((m.name().to_string(), a.name.to_string()), a.clone());
            }
            if m.actions().iter().any(|a| a.agent.is_some()) {
                machines.insert(m.name().to_string(), m.clone());
            }
        }
        settle_store::TaskCheck { queues: None, actions: Arc::new(actions), machines: Arc::new(machines) }
    }
    pub(crate) fn machine(&self, name: &str) -> Result<&Arc<Machine>> {
        self.machines.get(name).ok_or_else(|| Error::UnknownMachine(name.to_string()))
    }
    pub(crate) fn handler(&self, machine: &MachineName, action: &ActionName) -> Option<&Handler> {
        self.handlers.get(&(machine.clone(), action.clone()))
    }
    pub(crate) fn hash(&self, machine: &str) -> Option<String> {
        self.hashes.get(machine).cloned()
    }
}

/// The registry an engine runs on, replaced whole when a version is deployed: readers take
/// the current one (an `Arc`, cheap), and the scheduler notices a new one by its generation.
pub(crate) struct Registries {
    current: std::sync::RwLock<Arc<Registry>>,
    generation: AtomicU64,
}

impl Registries {
    pub(crate) fn new(registry: Arc<Registry>) -> Self {
        Registries { current: std::sync::RwLock::new(registry), generation: AtomicU64::new(0) }
    }
    /// The current registry.
    pub(crate) fn load(&self) -> Arc<Registry> {
        self.current.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
    /// How many times it was replaced.
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }
    /// Replaces it.
    pub(crate) fn replace(&self, registry: Registry) {
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(registry);
        self.generation.fetch_add(1, Ordering::AcqRel);
    }
}
