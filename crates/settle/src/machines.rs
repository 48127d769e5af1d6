//! The machines this binary knows, with their handlers: the demo's `server`, the
//! benchmark's `chain`, and the crash-test `job`. `settle run` can drive all of them.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::json;
use settle_core::{Machine, MachineBuilder};
use settle_engine::{EngineBuilder, Outcome};
use settle_store::Store;

use crate::sim::Draws;

/// Settings of the simulated provider behind the demo's `server` machine.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct ProviderSettings {
    /// Probability that a provider call fails transiently.
    pub fail_rate: f64,
    /// Seed of the simulation.
    pub seed: u64,
    /// Shortest provider call, in milliseconds.
    pub min_latency_ms: u64,
    /// Longest provider call, in milliseconds.
    pub max_latency_ms: u64,
}

impl Default for ProviderSettings {
    fn default() -> Self {
        ProviderSettings { fail_rate: 0.2, seed: 1, min_latency_ms: 100, max_latency_ms: 800 }
    }
}

/// `server`: new → creating → provisioning → configuring → ready.
pub fn server() -> Machine {
    MachineBuilder::new("server")
        .state("new")
        .initial()
        .state("creating")
        .auto("create_server")
        .state("provisioning")
        .auto("provision")
        .state("configuring")
        .auto("configure")
        .state("ready")
        .requires(["endpoint"])
        .event("create", ["new"], "begin_create")
        .reject("creating", "already in progress")
        .reject("provisioning", "already in progress")
        .reject("configuring", "already in progress")
        .reject("ready", "already exists")
        .action("begin_create", ["creating"])
        .action("create_server", ["provisioning"])
        .action("provision", ["configuring"])
        .action("configure", ["ready"])
        .build()
        .expect("the demo machine is valid")
}

/// Binds the simulated provider to the `server` machine's actions. Each call takes a
/// random latency and fails at `fail_rate`; a failure re-enters the state with an
/// exponential backoff (the entity's retry count drives it).
pub fn bind_server<S: Store + Clone>(b: EngineBuilder<S>, p: ProviderSettings) -> EngineBuilder<S> {
    let steps = [("create_server", "provisioning"), ("provision", "configuring"), ("configure", "ready")];
    steps.into_iter().fold(b.machine(server()), |b, (action, next)| {
        b.on("server", action, move |ctx| async move {
            let mut draws = Draws::new(p.seed, &ctx.idempotency_key());
            let latency = draws.range(p.min_latency_ms, p.max_latency_ms.max(p.min_latency_ms + 1));
            tokio::time::sleep(Duration::from_millis(latency)).await;
            if draws.next_f64() < p.fail_rate {
                let backoff = (100u64 << ctx.retry.min(5)).min(2_000);
                return Ok(Outcome::retry_after(Duration::from_millis(backoff + draws.range(0, 100))));
            }
            let mut out = Outcome::to(next);
            if next == "ready" {
                out = out.set("endpoint", json!(format!("{}.servers.example", ctx.key)));
            }
            Ok(out)
        })
    })
}

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

/// Binds no-op handlers to every step of `chain{steps}`.
pub fn bind_chain<S: Store + Clone>(mut b: EngineBuilder<S>, steps: usize) -> EngineBuilder<S> {
    b = b.machine(chain(steps));
    for i in 1..=steps {
        let next = if i == steps { "done".to_string() } else { format!("u{}", i + 1) };
        b = b.on(&format!("chain{steps}"), &format!("step{i}"), move |_| {
            let next = next.clone();
            async move { Ok(Outcome::to(next)) }
        });
    }
    b
}

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
