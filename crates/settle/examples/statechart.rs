//! Statechart: the `cluster` and `replica` machines of `examples/machines/` (substates,
//! entry and exit actions, guards, internal transitions, ignored events, declarative
//! actions that raise events on related entities), driven through their life with one
//! Rust handler: `provision` creates two replicas, so the cluster has successors to pause
//! and resume, and the replicas a predecessor to tell they are up.
//!
//! Run with `cargo run -p settle --example statechart`.

use serde_json::{Value, json};
use settle::{Engine, EventOutcome, Machine, Outcome, RaiseOptions, SqliteStore, Wait};

const CLUSTER: &str = include_str!("../../../examples/machines/cluster.toml");
const REPLICA: &str = include_str!("../../../examples/machines/replica.toml");

fn load(name: &str, text: &str) -> Result<Machine, Box<dyn std::error::Error>> {
    let (machine, _warnings) = settle::core::toml::load(&format!("examples/machines/{name}.toml"), name, text)
        .map_err(|report| report.to_string())?;
    Ok(machine)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let store = SqliteStore::open(dir.path().join("statechart.db"))?;
    let engine = Engine::builder(store)
        .machine(load("cluster", CLUSTER)?)
        .machine(load("replica", REPLICA)?)
        // One target (`online`): without this handler, a plain transition. With it, the
        // commit that enters `online` also creates the cluster's replicas.
        .on("cluster", "provision", |ctx| async move {
            let key = ctx.key.clone();
            Ok(Outcome::to("online").create("replica", format!("{key}-r1"), Default::default()).create(
                "replica",
                format!("{key}-r2"),
                Default::default(),
            ))
        })
        .start()
        .await?;
    let stable = |params: Value| RaiseOptions::wait(Wait::Stable).params(params);
    let show = |what: &str, e: &settle::EntityRow| {
        println!("{what:<36} {:<11} {}", e.state.as_str(), Value::Object(e.properties.clone()));
    };

    engine.create("cluster", "db1", json!({"max_replicas": 5}).as_object().cloned().unwrap()).await?;
    let c = engine.raise("cluster", "db1", "create", stable(Value::Null)).await?.entity.unwrap();
    show("create: online, its initial child", &c);
    assert_eq!((c.state.as_str(), &c.properties["endpoint"]), ("serving", &json!("db.internal:5432")));

    for r in ["db1-r1", "db1-r2"] {
        engine.raise("replica", r, "ready", stable(Value::Null)).await?;
    }
    engine.wait_idle().await?;
    let c = engine.get("cluster", "db1").await?.unwrap();
    show("replicas up: they told the cluster", &c);
    assert_eq!(c.properties["replica_ready"], json!(true));

    let (_, verdict) = engine.can_fire("cluster", "db1", "resize", &json!({"replicas": 9})).await?;
    println!("{:<36} {verdict:?}", "can resize to 9 fire?");
    let grown = engine.raise("cluster", "db1", "resize", stable(json!({"replicas": 3}))).await?;
    show("resize to 3: the guard holds", grown.entity.as_ref().unwrap());
    let refused = engine.raise("cluster", "db1", "resize", stable(json!({"replicas": 9}))).await?;
    let Some(EventOutcome::Rejected { reason, .. }) = refused.outcome else { panic!("{:?}", refused.outcome) };
    println!("{:<36} rejected: {reason}", "resize to 9");

    let beat = engine.raise("cluster", "db1", "heartbeat", stable(Value::Null)).await?.entity.unwrap();
    show("heartbeat: internal, no entry", &beat);

    let c = engine.raise("cluster", "db1", "maintain", stable(Value::Null)).await?.entity.unwrap();
    engine.wait_idle().await?;
    show("maintain: online > maintenance", &c);
    for r in ["db1-r1", "db1-r2"] {
        let replica = engine.get("replica", r).await?.unwrap();
        println!("  {r} {}", replica.state.as_str());
        assert_eq!(replica.state, "paused", "the maintenance's entry action paused it");
    }
    let c = engine.raise("cluster", "db1", "patched", stable(Value::Null)).await?.entity.unwrap();
    engine.wait_idle().await?;
    show("patched: left maintenance only", &c);
    assert_eq!(engine.get("replica", "db1-r1").await?.unwrap().state, "syncing", "resumed, `up` entered anew");

    let stopped = engine.raise("cluster", "db1", "stop", stable(Value::Null)).await?.entity.unwrap();
    show("stop: left online (endpoint closed)", &stopped);
    let again = engine.raise("cluster", "db1", "stop", stable(Value::Null)).await?;
    println!("{:<36} {:?}", "stop again", again.outcome.unwrap());

    println!("\nhistory of db1:");
    for h in engine.history("cluster", "db1").await? {
        println!(
            "  {:<9} {:<10} {:>12} -> {:<12} {}",
            h.kind.as_str(),
            h.event.as_deref().unwrap_or("-"),
            h.from.as_deref().unwrap_or("-"),
            h.to.as_deref().unwrap_or("-"),
            h.action.as_deref().unwrap_or("")
        );
    }
    engine.shutdown().await;
    Ok(())
}
