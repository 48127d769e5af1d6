//! The machines an engine knows and the handlers bound to their actions, shared by the
//! engine's API, its scheduler and the decisions.

use std::collections::HashMap;
use std::sync::Arc;

use settle_core::{ActionName, Machine, MachineName};

use crate::error::{Error, Result};
use crate::handler::Handler;

/// Machines and their bound handlers.
pub(crate) struct Registry {
    pub(crate) machines: HashMap<MachineName, Arc<Machine>>,
    pub(crate) handlers: HashMap<(MachineName, ActionName), Handler>,
    /// Content hash (definition version) of each machine.
    pub(crate) hashes: HashMap<MachineName, String>,
    /// The machines whose entities this engine processes (`None`: all registered).
    pub(crate) served: Option<Vec<MachineName>>,
}

impl Registry {
    pub(crate) fn new() -> Self {
        Registry { machines: HashMap::new(), handlers: HashMap::new(), hashes: HashMap::new(), served: None }
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
        let (mut actions, mut machines) = (std::collections::BTreeMap::new(), std::collections::BTreeMap::new());
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
