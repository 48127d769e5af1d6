//! The machines a world runs beside the built-in ones (`settle-builtin`), with handlers
//! that answer at once and draw from the seed:
//!
//! - `chart` (the crash workload's statechart: `working` with three substeps, each with
//!   entry and exit actions): a step retries a fifth of the time, and every entry and exit
//!   action inserts its row into `chart_hooks` in the transition's commit; at most
//!   [`OPEN_CHARTS`] charts' workflows are open at once (a limit of workflows);
//! - `crowd` and its successors `worker` (in process) and `aworker` (executed by the
//!   world's agent, queue `crowd`): each worker retries a drawn number of times with
//!   drawn delays, or breaks for good, so the crowd's subscriptions (`all(*) in [done]`,
//!   with a timeout, and `any(*) in [broken]`) are evaluated with some successors done and
//!   some not; an `aworker`'s agent reports its whole outcome when done: it creates a
//!   `receipt` (its successor) and raises `heard` on its crowd, whose declarative internal
//!   action counts them with an expression; at most [`CROWD_CALLS`] workers of either kind
//!   work at once (a concurrency limit they share); one crowd at a time spawns its workers
//!   (`crowd_spawns`, a limit of the workflows `go` starts: its plain transition's commit
//!   takes the slot first, until the crowd waits at rest);
//! - `relay` and `job` (built-in): a sync nested event, in worlds of one node.

use std::time::Duration;

use serde_json::json;
use settle_builtin::draws::Draws;
use settle_core::{Machine, MachineBuilder, Properties};
use settle_engine::{EngineBuilder, Outcome};
use settle_store::AnyStore;

/// The agent queue of `aworker`.
pub(crate) const CROWD_QUEUE: &str = "crowd";

/// How long a crowd waits for all its workers before it gives up.
pub(crate) const CROWD_TIMEOUT: Duration = Duration::from_secs(90);

/// How many charts' workflows run at once (`open_charts`, a limit of the workflows their
/// `start` events begin; one line for all).
pub(crate) const OPEN_CHARTS: u32 = 1;

/// The built-in `chart`, with a limit of workflows: at most [`OPEN_CHARTS`] started by
/// `start` are open at once (from its event through its three steps, until it is `done`).
pub(crate) fn chart() -> Machine {
    let text = format!(
        "{}\n[limits.open_charts]\nevents = [\"start\"]\nmax = {OPEN_CHARTS}\n",
        settle_builtin::chart::chart().to_toml()
    );
    settle_core::toml::load("chart.toml", "chart", &text).expect("the limited chart is valid").0
}

/// Binds `chart` (see the [module](self)).
pub(crate) fn bind_chart(mut b: EngineBuilder<AnyStore>, seed: u64) -> EngineBuilder<AnyStore> {
    b = b.machine(chart());
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

/// `crowd`: idle -go→ spawning (creates its workers) → waiting; `all_done` (all its
/// successors `done`, or `gave_up` after [`CROWD_TIMEOUT`]) → finished; `one_broken` (any
/// `broken`) → troubled.
pub(crate) fn crowd() -> Machine {
    MachineBuilder::new("crowd")
        .state("idle")
        .initial()
        .state("spawning")
        .auto("spawn")
        .state("waiting")
        .state("finished")
        .state("troubled")
        .error_health()
        .state("timed_out")
        .error_health()
        .event("go", ["idle"], "start")
        .reject("waiting", "already going")
        .event("all_done", ["waiting"], "finish")
        .subscribe("all(*) in [done]")
        .timeout(CROWD_TIMEOUT, "gave_up")
        .event("one_broken", ["waiting"], "trouble")
        .subscribe("any(*) in [broken]")
        .event("gave_up", ["waiting"], "time_out")
        .event("heard", ["waiting", "finished", "troubled", "timed_out"], "note_heard")
        .internal()
        .action("start", ["spawning"])
        .action("spawn", ["waiting"])
        .action("finish", ["finished"])
        .action("trouble", ["troubled"])
        .action("time_out", ["timed_out"])
        .action("note_heard", Vec::<&str>::new())
        .sets("heard", json!("has(props.heard) ? props.heard + 1 : 1"))
        .limit(settle_core::limits::LimitDef {
            name: "crowd_spawns".into(),
            events: vec!["go".into()],
            max: Some(1),
            ..Default::default()
        })
        .build()
        .expect("the crowd machine is valid")
}

/// What an `aworker`'s agent files when it is done, created by its report.
fn receipt() -> Machine {
    MachineBuilder::new("receipt")
        .state("filed")
        .initial()
        .state("void")
        .kind(settle_core::StateKind::Terminal)
        .event("discard", ["filed"], "drop")
        .action("drop", ["void"])
        .build()
        .expect("the receipt machine is valid")
}

/// How many workers of every crowd work at once: `worker` and `aworker` share the limit
/// `crowd_calls`, so in-process actions and agents' tasks wait for each other's slots; its
/// line is admitted round-robin across crowds (`fair_by`).
pub(crate) const CROWD_CALLS: u32 = 2;

/// How many of one crowd's workers start a second (`crowd_pace`, per crowd).
pub(crate) const CROWD_PACE: u32 = 20;

/// A worker of a crowd: `ready` → `working` (a declarative step, so the commit entering the
/// limited state takes its slots) → `done` | `broken` | `working` again, at most
/// [`CROWD_CALLS`] at once among all workers and [`CROWD_PACE`] starts a second per crowd;
/// `agent`: its action executed by an agent of [`CROWD_QUEUE`].
pub(crate) fn worker(name: &str, agent: bool) -> Machine {
    let b = MachineBuilder::new(name)
        .properties(["crowd"])
        .state("ready")
        .initial()
        .auto("start")
        .state("working")
        .auto("work")
        .state("done")
        .state("broken")
        .error_health()
        .action("start", ["working"])
        .action("work", ["done", "broken", "working"]);
    let b = if agent {
        b.agent(CROWD_QUEUE, Duration::from_secs(10)).may_create(["receipt"]).may_raise(["heard"])
    } else {
        b
    };
    b.limit(settle_core::limits::LimitDef {
        name: "crowd_calls".into(),
        states: vec!["working".into()],
        max: Some(CROWD_CALLS),
        fair_by: Some("props.crowd".into()),
        ..Default::default()
    })
    .limit(settle_core::limits::LimitDef {
        name: "crowd_pace".into(),
        states: vec!["working".into()],
        rate: Some(CROWD_PACE),
        per_ms: Some(1_000),
        key: Some("props.crowd".into()),
        ..Default::default()
    })
    .build()
    .expect("the worker machine is valid")
}

/// Binds `crowd`, `worker` and `aworker`. A crowd creates its `workers` property's number
/// of workers (1 to 5), every other one an `aworker`. A worker's attempt breaks a tenth of
/// the time, retries after 100 ms to 20 s a third of the time, and is done otherwise.
pub(crate) fn bind_crowd(b: EngineBuilder<AnyStore>, seed: u64) -> EngineBuilder<AnyStore> {
    b.machine(crowd())
        .machine(worker("worker", false))
        .machine(worker("aworker", true))
        .machine(receipt())
        .on("crowd", "spawn", |ctx| async move {
            let n = ctx.properties.get("workers").and_then(|v| v.as_u64()).unwrap_or(3);
            let mut out = Outcome::to("waiting");
            for i in 0..n {
                let machine = if i % 2 == 1 { "aworker" } else { "worker" };
                let props: Properties = [("crowd".to_string(), json!(ctx.key.to_string()))].into_iter().collect();
                out = out.create(machine, format!("{}-{i}", ctx.key), props);
            }
            Ok(out)
        })
        .on("worker", "work", move |ctx| async move {
            let mut d = Draws::new(seed, &ctx.idempotency_key());
            let roll = d.next_f64();
            Ok(if roll < 0.1 {
                Outcome::to("broken")
            } else if roll < 0.43 {
                Outcome::retry_after(Duration::from_millis(d.range(100, 20_000)))
            } else {
                Outcome::to("done")
            })
        })
}

/// Binds `job`, with handlers that answer at once (a step retries a third of the time),
/// and `relay` (a sync nested event on the job of the same key).
pub(crate) fn bind_relay(mut b: EngineBuilder<AnyStore>, seed: u64) -> EngineBuilder<AnyStore> {
    b = b.machine(settle_builtin::job());
    for (action, next) in [("work1", "step2"), ("work2", "step3"), ("work3", "done")] {
        b = b.on("job", action, move |ctx| async move {
            let mut d = Draws::new(seed, &ctx.idempotency_key());
            if d.next_f64() < 0.33 {
                return Ok(Outcome::retry_after(Duration::from_millis(d.range(1, 3_000))));
            }
            let out = Outcome::to(next);
            Ok(if next == "done" { out.set("result", json!(ctx.retry)) } else { out })
        });
    }
    settle_builtin::bind_relay(b)
}
