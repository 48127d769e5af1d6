//! `bench chain --deploy`: a new version of the chain's machine deployed halfway through
//! the run, while the workflows are in flight. It pins (`upgrade = "pin"`): the workflows
//! working then finish under the version they started with and move once at rest; those
//! not started yet move at once. The run fails unless every workflow finished and is under
//! the new version at the end.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, bail};
use serde_json::{Value, json};
use settle_engine::Engine;
use settle_store::{AnyStore, Store};

/// What the deploy did.
pub(super) struct Midway {
    /// The version deployed.
    version: String,
    /// Entities it moved at once (at rest: not started yet, or done).
    moved: u64,
    /// Entities working then, left under the old version until at rest.
    pinned: u64,
    /// How long the deploy took.
    took_ms: f64,
}

/// Waits for `halfway`, then deploys `machine` again with `upgrade = "pin"`.
pub(super) async fn midway(
    engine: Engine<AnyStore>,
    machine: String,
    halfway: Arc<tokio::sync::Notify>,
) -> anyhow::Result<Midway> {
    halfway.notified().await;
    let current = engine.machine(&machine)?;
    let text = format!("upgrade = \"pin\"\n{}", current.to_toml());
    let (next, _) = settle_core::toml::load(&format!("{machine}.toml"), &machine, &text)
        .map_err(|report| anyhow::anyhow!("the pinning version of `{machine}` does not load: {report}"))?;
    let t0 = Instant::now();
    let done = engine.deploy(vec![next], false).await?;
    let took_ms = t0.elapsed().as_secs_f64() * 1000.0;
    let d = done.into_iter().next().context("the deploy answered no machine")?;
    Ok(Midway { version: d.version, moved: d.moved, pinned: d.pinned, took_ms })
}

/// Checks that every entity of `machine` is under the deployed version now (the run's
/// workflows have all finished), and reports the deploy. With worker processes, the
/// entities one of them brought to rest before it took the deploy up are moved first, as
/// the deploying engine does on its own two polls later (`Engine::settle_versions`).
pub(super) async fn check(engine: &Engine<AnyStore>, machine: &str, m: Midway, workers: bool) -> anyhow::Result<Value> {
    let stale = || async {
        let counts = engine.store().entity_count_by_version(machine).await?;
        anyhow::Ok(counts.iter().filter(|(h, _, _)| *h != m.version).map(|(_, _, n)| n).sum::<u64>())
    };
    let mut settled = 0;
    if workers && stale().await? > 0 {
        settled = engine.settle_versions().await?;
    }
    let left = stale().await?;
    if left > 0 {
        bail!("{left} workflows of `{machine}` are not under the deployed version {} after the run", m.version);
    }
    Ok(json!({
        "version": m.version.chars().take(12).collect::<String>(),
        "moved": m.moved,
        "pinned": m.pinned,
        "took_ms": (m.took_ms * 10.0).round() / 10.0,
        "settled_after": settled,
    }))
}
