//! Reference machines shared by the unit tests of several core modules.

use crate::machine::MachineBuilder;

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
