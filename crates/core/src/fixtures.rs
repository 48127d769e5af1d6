//! Reference machines, and helpers on them, shared by the unit tests of several core
//! modules.

use crate::machine::{MachineBuilder, MachineDef};
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
