//! `chart`: the statechart the crash test (`settle workload --charts`) and the simulation
//! drive: a parent state with three substeps, entry and exit actions on both levels.

use std::io::Write;
use std::time::Duration;

use serde_json::json;
use settle_core::{Machine, MachineBuilder};
use settle_engine::{EngineBuilder, Outcome};
use settle_store::Store;

use crate::draws::Draws;

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

/// Prints `line` and flushes it at once: a crash test reads each line as the kill may fall
/// right after it.
pub fn say(line: std::fmt::Arguments<'_>) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// Binds `chart` and its handlers: steps that take a few milliseconds and retry a quarter
/// of the time (a retry re-enters the step: no exit or entry action), and entry and exit
/// actions that print, take a few milliseconds, and insert their row.
pub fn bind_chart<S: Store + Clone>(b: EngineBuilder<S>) -> EngineBuilder<S> {
    let mut b = b.machine(chart());
    for (action, next) in [("work1", "step2"), ("work2", "step3"), ("work3", "done")] {
        b = b.on("chart", action, move |ctx| async move {
            let mut draws = Draws::new(7, &ctx.idempotency_key());
            tokio::time::sleep(Duration::from_millis(draws.range(0, 10))).await;
            if draws.next_f64() < 0.25 {
                return Ok(Outcome::retry_after(Duration::from_millis(draws.range(1, 10))));
            }
            Ok(Outcome::to(next))
        });
    }
    for hook in ["enter_working", "leave_working", "enter_step", "leave_step"] {
        b = b.on("chart", hook, move |ctx| async move {
            let (key, state) = (ctx.key.to_string(), ctx.state.to_string());
            say(format_args!("hook {key} {hook} {state}"));
            let mut draws = Draws::new(11, &format!("{}-{hook}", ctx.idempotency_key()));
            tokio::time::sleep(Duration::from_millis(draws.range(1, 8))).await;
            Ok(Outcome::stay().sql(
                "INSERT INTO chart_hooks (key, hook, state) VALUES ($1, $2, $3)",
                [json!(key), json!(hook), json!(state)],
            ))
        });
    }
    b
}
