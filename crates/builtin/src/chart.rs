//! `chart`: the statechart the crash test (`settle workload --charts`) and the simulation
//! drive: a parent state with three substeps, entry and exit actions on both levels.

use settle_core::{Machine, MachineBuilder};

/// The table the charts' entry and exit actions insert into, in their transitions' commits.
pub const CHART_HOOKS_TABLE: &str =
    "CREATE TABLE IF NOT EXISTS chart_hooks (key TEXT NOT NULL, hook TEXT NOT NULL, state TEXT NOT NULL)";

/// `chart`: idle -start→ working (a parent: initial `step1`) ; step1 → step2 → step3
/// (substates of `working`, each an auto action) → done. `working` has `enter_working` and
/// `leave_working`, each step `enter_step` and `leave_step`.
pub fn chart() -> Machine {
    MachineBuilder::new("chart")
        .state("idle")
        .initial()
        .state("working")
        .initial_child("step1")
        .on_entry("enter_working")
        .on_exit("leave_working")
        .state("step1")
        .parent("working")
        .auto("work1")
        .on_entry("enter_step")
        .on_exit("leave_step")
        .state("step2")
        .parent("working")
        .auto("work2")
        .on_entry("enter_step")
        .on_exit("leave_step")
        .state("step3")
        .parent("working")
        .auto("work3")
        .on_entry("enter_step")
        .on_exit("leave_step")
        .state("done")
        .event("start", ["idle"], "begin")
        .reject("done", "already done")
        .action("begin", ["working"])
        .action("work1", ["step2"])
        .action("work2", ["step3"])
        .action("work3", ["done"])
        .effect("enter_working")
        .effect("leave_working")
        .effect("enter_step")
        .effect("leave_step")
        .build()
        .expect("the chart machine is valid")
}
