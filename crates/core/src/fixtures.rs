//! Reference machines, and helpers on them, shared by the unit tests of several core
//! modules.

use std::time::Duration;

use crate::machine::{MachineBuilder, MachineDef, Schedule, StateKind};
use crate::validate;

/// A clean machine `m`: `idle` (initial) --go/start--> `busy` --auto work--> `idle`. The
/// base that validation tests add their problems to.
pub fn base() -> MachineBuilder {
    MachineBuilder::new("m")
        .state("idle")
        .initial()
        .state("busy")
        .auto("work")
        .event("go", ["idle"], "start")
        .action("start", ["busy"])
        .action("work", ["idle", "busy"])
}

/// Every diagnostic [`validate::check`] finds in `def`, as displayed.
pub fn messages(def: &MachineDef) -> Vec<String> {
    validate::check(def).diagnostics.iter().map(ToString::to_string).collect()
}

/// The reference server as TOML: a wait, a required property, error health, a deleted
/// state, parameters, rejection reasons and transition waits. Built by [`server`].
pub const SERVER: &str = include_str!("testdata/server.toml");

/// [`SERVER`] built in Rust: the same machine.
pub fn server() -> MachineBuilder {
    MachineBuilder::new("server")
        .state("new")
        .initial()
        .state("creating")
        .auto("create_resources")
        .wait(Duration::ZERO)
        .state("ready")
        .requires(["endpoint"])
        .state("failed")
        .error_health()
        .auto("undo")
        .state("gone")
        .kind(StateKind::Deleted)
        .event("create", ["new"], "begin_create")
        .params(["region"])
        .reject("ready", "already exists")
        .reject("creating", "already in progress")
        .event("delete", ["ready"], "undo")
        .action("begin_create", ["creating"])
        .action("create_resources", ["ready", "creating", "failed"])
        .target_wait("failed", Duration::from_secs(1))
        .target_wait("creating", Duration::from_secs(5))
        .action("undo", ["gone", "failed"])
}

/// The reference scenario's subscriber as TOML: subscriptions with a timeout, and timers.
/// Built by [`subscriber`].
pub const SUBSCRIBER: &str = include_str!("testdata/subscriber.toml");

/// [`SUBSCRIBER`] built in Rust: the same machine.
pub fn subscriber() -> MachineBuilder {
    MachineBuilder::new("server")
        .state("waiting")
        .initial()
        .state("ready")
        .state("failed")
        .error_health()
        .event("resources_ready", ["waiting"], "finish")
        .subscribe("all(*) in [ready]")
        .timeout(Duration::from_secs(600), "resources_timeout")
        .event("resources_failed", ["waiting"], "give_up")
        .subscribe("any(*) health error")
        .event("resources_timeout", ["waiting"], "give_up")
        .event("check", ["ready", "failed"], "probe")
        .timer("health", "check", Schedule::Every(Duration::from_secs(300)), ["ready"])
        .timer("retry", "check", Schedule::After(Duration::from_secs(5400)), ["failed"])
        .action("finish", ["ready"])
        .action("give_up", ["failed"])
        .action("probe", ["ready", "failed"])
}

/// A statechart: a cloud instance with substates, entry and exit actions, a guarded
/// event, an internal transition and ignored events (see the file's comments).
pub const INSTANCE: &str = include_str!("testdata/instance.toml");

/// [`INSTANCE`], loaded and validated.
pub fn instance() -> crate::Machine {
    crate::toml::load("instance.toml", "instance", INSTANCE).unwrap_or_else(|r| panic!("{r}")).0
}
