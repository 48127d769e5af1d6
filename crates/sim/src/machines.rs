//! The simulation's `chart` handlers: answers at once, retries drawn from the seed, and
//! entry and exit actions that insert their row in their transition's commit.

use std::time::Duration;

use serde_json::json;
use settle_builtin::draws::Draws;
use settle_engine::{EngineBuilder, Outcome};
use settle_store::sqlite::SqliteStore;

/// `chart` (the crash workload's statechart: `working` with three substeps, each with
/// entry and exit actions) with handlers that answer at once: a step retries a fifth of
/// the time (drawn from the seed and the attempt), and every entry and exit action inserts
/// its row into `chart_hooks` in the transition's commit.
pub(crate) fn bind_chart(mut b: EngineBuilder<SqliteStore>, seed: u64) -> EngineBuilder<SqliteStore> {
    b = b.machine(settle_builtin::chart::chart());
    for (action, next) in [("work1", "step2"), ("work2", "step3"), ("work3", "done")] {
        b = b.on("chart", action, move |ctx| async move {
            if Draws::new(seed, &ctx.idempotency_key()).next_f64() < 0.2 {
                return Ok(Outcome::retry_after(Duration::from_millis(200)));
            }
            Ok(Outcome::to(next))
        });
    }
    for hook in ["enter_working", "leave_working", "enter_step", "leave_step"] {
        b = b.on("chart", hook, move |ctx| async move {
            Ok(Outcome::stay().sql(
                "INSERT INTO chart_hooks (key, hook, state) VALUES ($1, $2, $3)",
                [json!(ctx.key.to_string()), json!(hook), json!(ctx.state.to_string())],
            ))
        });
    }
    b
}

/// The entry and exit actions a chart that went from `idle` to `done` ran, each once:
/// (hook, state), sorted.
pub(crate) const CHART_HOOKS: [(&str, &str); 8] = [
    ("enter_step", "step1"),
    ("enter_step", "step2"),
    ("enter_step", "step3"),
    ("enter_working", "working"),
    ("leave_step", "step1"),
    ("leave_step", "step2"),
    ("leave_step", "step3"),
    ("leave_working", "working"),
];
