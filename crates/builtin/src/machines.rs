//! The machines `settle` knows, with their handlers: the reference scenario's `server` and
//! its resources (the demo), the benchmarks' `chain` and fan-out machines, the crash-test
//! `job`, and `relay` (a sync nested event on a `job`). `settle run` can drive all of
//! them: [`bind_built_in`] binds them all.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::json;
use settle_core::Properties;
use settle_core::{Machine, MachineBuilder};
use settle_engine::{ActionContext, EngineBuilder, Outcome};
use settle_store::Store;

use crate::draws::Draws;

/// Settings of the simulated provider behind the demo's machines, and of the scenario.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct ProviderSettings {
    /// Probability that a provider call fails transiently (retried).
    pub fail_rate: f64,
    /// Probability that a provisioning call fails permanently (the resource fails).
    #[serde(default)]
    pub fatal_rate: f64,
    /// Seed of the simulation.
    pub seed: u64,
    /// Shortest provider call, in milliseconds.
    pub min_latency_ms: u64,
    /// Longest provider call, in milliseconds.
    pub max_latency_ms: u64,
    /// How long a server waits for all its resources before it gives up, in milliseconds.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
}

fn default_timeout_ms() -> u64 {
    600_000
}

impl Default for ProviderSettings {
    fn default() -> Self {
        ProviderSettings {
            fail_rate: 0.2,
            fatal_rate: 0.0,
            seed: 1,
            min_latency_ms: 100,
            max_latency_ms: 800,
            timeout_ms: default_timeout_ms(),
        }
    }
}

/// Binds every built-in machine with its handlers: the scenario's (`server` and its
/// resources, with the simulated `provider`), `job`, `relay`, the fan-out machines, and
/// `chain1` to `chain{MAX_CHAIN_STEPS}`.
pub fn bind_built_in<S: Store + Clone>(mut b: EngineBuilder<S>, provider: ProviderSettings) -> EngineBuilder<S> {
    b = bind_server(b, provider);
    b = bind_job(b);
    b = bind_relay(b);
    b = bind_fanout(b);
    for steps in 1..=MAX_CHAIN_STEPS {
        b = bind_chain(b, steps);
    }
    b
}

/// The resources a `server` creates, in provisioning order: `app`, then `database`, then
/// `alias` (each waits for the one before); `dns` runs beside them.
pub const RESOURCES: [&str; 4] = ["app", "database", "alias", "dns"];

/// The resource that starts when `kind` is ready, if any.
fn next_resource(kind: &str) -> Option<&'static str> {
    match kind {
        "app" => Some("database"),
        "database" => Some("alias"),
        _ => None,
    }
}

/// The reference scenario's `server` (DESIGN §8): `create` → `creating`, whose action
/// creates the four resources → `creating_resources`, where two subscriptions wait:
/// all successors `ready` → `ready`; any successor `failed` (or the timeout) → `undoing`,
/// whose auto action deletes what was created → `failed`.
pub fn server(timeout: Duration) -> Machine {
    MachineBuilder::new("server")
        .state("new")
        .initial()
        .state("creating")
        .auto("create_resources")
        .state("creating_resources")
        .state("ready")
        .requires(["endpoint"])
        .state("undoing")
        .error_health()
        .auto("undo")
        .state("failed")
        .error_health()
        .event("create", ["new"], "begin_create")
        .reject("creating", "already in progress")
        .reject("creating_resources", "already in progress")
        .reject("ready", "already exists")
        .reject("undoing", "creation failed")
        .reject("failed", "creation failed")
        .event("resources_ready", ["creating_resources"], "finish")
        .subscribe("all(*) in [ready]")
        .timeout(timeout, "resources_timeout")
        .event("resources_failed", ["creating_resources"], "abandon")
        .subscribe("any(*) in [failed]")
        .event("resources_timeout", ["creating_resources"], "abandon")
        .action("begin_create", ["creating"])
        .action("create_resources", ["creating_resources"])
        .action("finish", ["ready"])
        .action("abandon", ["undoing"])
        .action("undo", ["failed"])
        .build()
        .expect("the server machine is valid")
}

/// A resource of a server: `waiting` -start→ `provisioning` → `ready` | `failed`;
/// `delete` from any of them → `deleting` → `gone` (deleted).
pub fn resource(kind: &str) -> Machine {
    resource_machine(kind, false).build().expect("the resource machine is valid")
}

/// One simulated provider call: waits its latency, then fails transiently (`Err(delay)`:
/// retry after it), fails permanently (`Ok(false)`), or succeeds (`Ok(true)`).
async fn provider_call(p: ProviderSettings, ctx: &ActionContext, fatal_rate: f64) -> Result<bool, Duration> {
    let mut draws = Draws::new(p.seed, &ctx.idempotency_key());
    let latency = draws.range(p.min_latency_ms, p.max_latency_ms.max(p.min_latency_ms + 1));
    if latency > 0 {
        // A provider without latency (the simulation's) answers on the first poll.
        tokio::time::sleep(Duration::from_millis(latency)).await;
    }
    let x = draws.next_f64();
    if x < fatal_rate {
        return Ok(false);
    }
    if x < fatal_rate + p.fail_rate {
        let backoff = (100u64 << ctx.retry.min(5)).min(2_000);
        return Err(Duration::from_millis(backoff + draws.range(0, 100)));
    }
    Ok(true)
}

/// A provisioned resource `kind` moves to `ready` and starts the next resource of its
/// server's chain (its `next` property), if any.
fn ready_then_next(ctx: &ActionContext, kind: &str) -> Outcome {
    let mut out = Outcome::to("ready");
    if let Some(next) = ctx.properties.get("next").and_then(|v| v.as_str()) {
        let server = ctx.key.strip_suffix(&format!("-{kind}")).unwrap_or(&ctx.key);
        out = out.raise(next, format!("{server}-{next}"), "start", json!(null));
    }
    out
}

/// Binds the scenario's machines (`server` and its resources) with the simulated provider.
pub fn bind_server<S: Store + Clone>(mut b: EngineBuilder<S>, p: ProviderSettings) -> EngineBuilder<S> {
    b = bind_server_machine(b, Duration::from_millis(p.timeout_ms));
    for kind in RESOURCES {
        b = b
            .machine(resource(kind))
            .on(kind, "provision", move |ctx| async move {
                match provider_call(p, &ctx, p.fatal_rate).await {
                    Err(delay) => Ok(Outcome::retry_after(delay)),
                    Ok(false) => Ok(Outcome::to("failed").error("provider refused the request")),
                    Ok(true) => Ok(ready_then_next(&ctx, kind)),
                }
            })
            .on(kind, "deprovision", move |ctx| async move {
                match provider_call(p, &ctx, 0.0).await {
                    Err(delay) => Ok(Outcome::retry_after(delay)),
                    Ok(_) => Ok(Outcome::to("gone")),
                }
            });
    }
    b
}

/// `server` with its handlers (shared by the in-process demo and the agents' one).
fn bind_server_machine<S: Store + Clone>(b: EngineBuilder<S>, timeout: Duration) -> EngineBuilder<S> {
    b.machine(server(timeout))
        .on("server", "create_resources", |ctx| async move {
            let mut out = Outcome::to("creating_resources");
            for kind in RESOURCES {
                let mut props = Properties::new();
                if let Some(next) = next_resource(kind) {
                    props.insert("next".into(), json!(next));
                }
                out = out.create(kind, format!("{}-{kind}", ctx.key), props);
            }
            // `app` and `dns` start now; `database` and `alias` wait for their predecessor.
            Ok(out.raise("app", format!("{}-app", ctx.key), "start", json!(null)).raise(
                "dns",
                format!("{}-dns", ctx.key),
                "start",
                json!(null),
            ))
        })
        .on("server", "finish", |ctx| async move {
            Ok(Outcome::to("ready").set("endpoint", json!(format!("{}.servers.example", ctx.key))))
        })
        .on("server", "undo", |ctx| async move {
            let reason = ctx.event.as_ref().map(|e| e.to_string()).unwrap_or_else(|| "resources failed".into());
            let mut out = Outcome::to("failed").set("undone", json!(true)).set("reason", json!(reason));
            for kind in RESOURCES {
                out = out.raise(kind, format!("{}-{kind}", ctx.key), "delete", json!(null));
            }
            Ok(out)
        })
}

/// The agent queue the scenario's resources are provisioned through (`settle demo --agents`).
pub const PROVIDER_QUEUE: &str = "provider";

/// A resource provisioned by external agents: like [`resource`], but `provision` and
/// `deprovision` are bound to [`PROVIDER_QUEUE`] (an agent reports the target), and a
/// successful provisioning goes through `provisioned`, whose auto action starts the next
/// resource in the chain (an agent's report carries only a target and properties).
pub fn resource_via_agents(kind: &str) -> Machine {
    resource_machine(kind, true).build().expect("the agent-provisioned resource machine is valid")
}

/// The one definition of a resource behind [`resource`] and (`via_agents`)
/// [`resource_via_agents`].
fn resource_machine(kind: &str, via_agents: bool) -> MachineBuilder {
    let lock = Duration::from_secs(10);
    let mut b = MachineBuilder::new(kind).state("waiting").initial().state("provisioning").auto("provision");
    let mut deletable = vec!["waiting", "provisioning", "ready", "failed"];
    if via_agents {
        b = b.state("provisioned").auto("announce");
        deletable.insert(2, "provisioned");
    }
    b = b
        .state("ready")
        .state("failed")
        .error_health()
        .state("deleting")
        .auto("deprovision")
        .state("gone")
        .kind(settle_core::StateKind::Deleted)
        .event("start", ["waiting"], "begin")
        .reject("provisioning", "already in progress")
        .reject("ready", "already ready")
        .event("delete", deletable, "remove")
        .reject("deleting", "already being deleted")
        .reject("gone", "already deleted")
        .action("begin", ["provisioning"]);
    if !via_agents {
        return b
            .action("provision", ["ready", "failed"])
            .action("remove", ["deleting"])
            .action("deprovision", ["gone"]);
    }
    b.action("provision", ["provisioned", "failed", "provisioning"])
        .agent(PROVIDER_QUEUE, lock)
        .action("announce", ["ready"])
        .action("remove", ["deleting"])
        .action("deprovision", ["gone", "deleting"])
        .agent(PROVIDER_QUEUE, lock)
        // Transient provider failures come back as agent faults: retry soon, park after many.
        .fault_policy(settle_core::FaultPolicy {
            max_errors: 20,
            window: Duration::from_secs(3600),
            backoff_min: Duration::from_millis(100),
            backoff_max: Duration::from_secs(2),
        })
}

/// Binds the scenario for `settle serve --scenario`: `server` with its handlers, and the
/// resources of [`resource_via_agents`], whose provider calls external agents make.
pub fn bind_server_via_agents<S: Store + Clone>(mut b: EngineBuilder<S>, timeout: Duration) -> EngineBuilder<S> {
    b = bind_server_machine(b, timeout);
    for kind in RESOURCES {
        b = b
            .machine(resource_via_agents(kind))
            .on(kind, "announce", move |ctx| async move { Ok(ready_then_next(&ctx, kind)) });
    }
    b
}

/// `sleeper`: created `asleep`, with a one-shot timer that raises `wake` after `after`;
/// `awake` is terminal.
pub fn sleeper(after: Duration) -> Machine {
    MachineBuilder::new("sleeper")
        .state("asleep")
        .initial()
        .state("awake")
        .kind(settle_core::StateKind::Terminal)
        .event("wake", ["asleep"], "rise")
        .action("rise", ["awake"])
        .timer("alarm", "wake", settle_core::machine::Schedule::After(after), ["asleep"])
        .build()
        .expect("the sleeper machine is valid")
}

/// `fanparent`: idle -go→ spawning, whose action creates `children` `fanchild`
/// entities → waiting, until `all(fanchild) in [done]` → done.
pub fn fan_parent() -> Machine {
    MachineBuilder::new("fanparent")
        .state("idle")
        .initial()
        .state("spawning")
        .auto("spawn")
        .state("waiting")
        .state("done")
        .kind(settle_core::StateKind::Terminal)
        .event("go", ["idle"], "start")
        .event("children_done", ["waiting"], "finish")
        .subscribe("all(fanchild) in [done]")
        .action("start", ["spawning"])
        .action("spawn", ["waiting"])
        .action("finish", ["done"])
        .build()
        .expect("the fan-out parent machine is valid")
}

/// `fanchild`: created in `working`, whose no-op action moves it to `done`.
pub fn fan_child() -> Machine {
    MachineBuilder::new("fanchild")
        .state("working")
        .initial()
        .auto("work")
        .state("done")
        .kind(settle_core::StateKind::Terminal)
        .action("work", ["done"])
        .build()
        .expect("the fan-out child machine is valid")
}

/// Binds the fan-out machines; each parent creates as many children as its `children`
/// property says.
pub fn bind_fanout<S: Store + Clone>(b: EngineBuilder<S>) -> EngineBuilder<S> {
    b.machine(fan_parent())
        .machine(fan_child())
        .on("fanparent", "spawn", |ctx| async move {
            let n = ctx.properties.get("children").and_then(|v| v.as_u64()).unwrap_or(4);
            let mut out = Outcome::to("waiting");
            for i in 0..n {
                out = out.create("fanchild", format!("{}-{i}", ctx.key), Properties::new());
            }
            Ok(out)
        })
        .on("fanchild", "work", |_| async { Ok(Outcome::to("done")) })
}

/// Longest `chain{steps}` machine this binary knows: `bench chain --steps` accepts 1 to
/// this, and `settle run` binds every one of them.
pub const MAX_CHAIN_STEPS: usize = 8;

/// `chain{steps}`: idle -go→ u1 → … → u{steps} → done, each unstable step a no-op handler.
pub fn chain(steps: usize) -> Machine {
    let mut b = MachineBuilder::new(format!("chain{steps}")).state("idle").initial();
    for i in 1..=steps {
        b = b.state(format!("u{i}")).auto(format!("step{i}"));
    }
    b = b.state("done").event("go", ["idle"], "start").reject("done", "already done").action("start", ["u1"]);
    for i in 1..=steps {
        let next = if i == steps { "done".to_string() } else { format!("u{}", i + 1) };
        b = b.action(format!("step{i}"), [next]);
    }
    b.build().expect("the chain machine is valid")
}

/// `chain{steps}_nested`: `chain{steps}` as a statechart: its steps are substates of one
/// parent, `running` (idle -go→ running, entering u1 → … → u{steps} → done), whose entry
/// and exit actions are no-op handlers (run once each per workflow: moving between steps
/// stays in `running`).
pub fn nested_chain(steps: usize) -> Machine {
    let mut b = MachineBuilder::new(format!("chain{steps}_nested"))
        .state("idle")
        .initial()
        .state("running")
        .initial_child("u1")
        .on_entry("enter_running")
        .on_exit("leave_running");
    for i in 1..=steps {
        b = b.state(format!("u{i}")).parent("running").auto(format!("step{i}"));
    }
    b = b.state("done").event("go", ["idle"], "start").reject("done", "already done").action("start", ["running"]);
    for i in 1..=steps {
        let next = if i == steps { "done".to_string() } else { format!("u{}", i + 1) };
        b = b.action(format!("step{i}"), [next]);
    }
    b.effect("enter_running").effect("leave_running").build().expect("the nested chain machine is valid")
}

/// Binds no-op handlers to every step of `chain{steps}` and of `chain{steps}_nested` (and
/// to the latter's entry and exit actions).
pub fn bind_chain<S: Store + Clone>(mut b: EngineBuilder<S>, steps: usize) -> EngineBuilder<S> {
    b = b.machine(chain(steps)).machine(nested_chain(steps));
    for machine in [format!("chain{steps}"), format!("chain{steps}_nested")] {
        for i in 1..=steps {
            let next = if i == steps { "done".to_string() } else { format!("u{}", i + 1) };
            b = b.on(&machine, &format!("step{i}"), move |_| {
                let next = next.clone();
                async move { Ok(Outcome::to(next)) }
            });
        }
    }
    let nested = format!("chain{steps}_nested");
    b.on(&nested, "enter_running", |_| async {
        NESTED_CHAIN_HOOKS.entered.fetch_add(1, Ordering::Relaxed);
        Ok(Outcome::stay())
    })
    .on(&nested, "leave_running", |_| async {
        NESTED_CHAIN_HOOKS.left.fetch_add(1, Ordering::Relaxed);
        Ok(Outcome::stay())
    })
}

/// How often this process ran the entry and exit actions of `chain{steps}_nested` (every
/// run, including one repeated after a failed commit): `bench chain --nested` reports them.
pub struct ChainHookRuns {
    /// Runs of `enter_running`.
    pub entered: AtomicU64,
    /// Runs of `leave_running`.
    pub left: AtomicU64,
}

/// The runs of this process (see [`ChainHookRuns`]).
pub static NESTED_CHAIN_HOOKS: ChainHookRuns = ChainHookRuns { entered: AtomicU64::new(0), left: AtomicU64::new(0) };

/// `job`: idle -start→ step1 → step2 → step3 → done; each step sleeps a little and fails
/// transiently a third of the time (used by the crash test).
pub fn job() -> Machine {
    MachineBuilder::new("job")
        .state("idle")
        .initial()
        .state("step1")
        .auto("work1")
        .state("step2")
        .auto("work2")
        .state("step3")
        .auto("work3")
        .state("done")
        .requires(["result"])
        .event("start", ["idle"], "begin")
        .reject("done", "already done")
        .action("begin", ["step1"])
        .action("work1", ["step2"])
        .action("work2", ["step3"])
        .action("work3", ["done"])
        .build()
        .expect("the job machine is valid")
}

/// Binds the `job` machine's handlers.
pub fn bind_job<S: Store + Clone>(b: EngineBuilder<S>) -> EngineBuilder<S> {
    [("work1", "step2"), ("work2", "step3"), ("work3", "done")].into_iter().fold(
        b.machine(job()),
        |b, (action, next)| {
            b.on("job", action, move |ctx| async move {
                let mut draws = Draws::new(42, &ctx.idempotency_key());
                tokio::time::sleep(Duration::from_millis(draws.range(0, 20))).await;
                if draws.next_f64() < 0.33 {
                    return Ok(Outcome::retry_after(Duration::from_millis(draws.range(1, 30))));
                }
                let out = Outcome::to(next);
                Ok(if next == "done" { out.set("result", json!(ctx.retry)) } else { out })
            })
        },
    )
}

/// `relay`: idle -go→ relaying, whose action raises `start` on the `job` of the same key
/// and waits for it (a sync nested event, answered whichever instance runs the job) →
/// relayed, with the job's outcome and state.
pub fn relay() -> Machine {
    MachineBuilder::new("relay")
        .state("idle")
        .initial()
        .state("relaying")
        .auto("relay")
        .state("relayed")
        .event("go", ["idle"], "begin")
        .action("begin", ["relaying"])
        .action("relay", ["relayed"])
        .build()
        .expect("the relay machine is valid")
}

/// Binds the `relay` machine's handler.
pub fn bind_relay<S: Store + Clone>(b: EngineBuilder<S>) -> EngineBuilder<S> {
    b.machine(relay()).on("relay", "relay", |ctx| async move {
        let (outcome, job) = ctx.raise_and_wait("job", ctx.key.as_str(), "start", json!(null)).await?;
        Ok(Outcome::to("relayed")
            .set("job_outcome", json!(format!("{outcome:?}")))
            .set("job_state", json!(job.state.as_str())))
    })
}
