//! Quickstart: define a machine, bind a handler, run an engine on a SQLite file, raise an
//! event and wait for the entity to come to rest, then print its history.
//!
//! Run with `cargo run -p settle --example quickstart`.

use std::time::Duration;

use serde_json::json;
use settle::{Engine, MachineBuilder, Outcome, RaiseOptions, SqliteStore, Wait};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dns = MachineBuilder::new("dns")
        .state("absent")
        .initial()
        .state("publishing")
        .auto("publish") // unstable: its auto action runs on entry
        .state("published")
        .requires(["address"]) // invariant: `published` needs an address
        .event("publish", ["absent"], "begin")
        .params(["address"])
        .reject("publishing", "already in progress")
        .action("begin", ["publishing"])
        .action("publish", ["published", "publishing"])
        .build()?;

    let dir = tempfile::tempdir()?;
    let store = SqliteStore::open(dir.path().join("quickstart.db"))?;
    let engine = Engine::builder(store)
        .machine(dns)
        // `begin` has one target; without a handler it would be a plain transition. This
        // handler also keeps the event's parameter as a property for the auto action.
        .on("dns", "begin", |ctx| async move {
            Ok(Outcome::to("publishing").set("requested", ctx.params["address"].clone()))
        })
        .on("dns", "publish", |ctx| async move {
            // A real action would call a slow, flaky provider here, passing
            // ctx.idempotency_key(); on failure it returns Outcome::retry_after(..).
            if ctx.retry == 0 {
                return Ok(Outcome::retry_after(Duration::from_millis(50)));
            }
            let address = ctx.properties["requested"].clone();
            Ok(Outcome::to("published").set("address", address))
        })
        .start()
        .await?;

    engine.create("dns", "www.example.com", Default::default()).await?;
    let raised = engine
        .raise(
            "dns",
            "www.example.com",
            "publish",
            RaiseOptions::wait(Wait::Stable).params(json!({"address": "192.0.2.7"})),
        )
        .await?;
    let entity = raised.entity.expect("waited for a stable state");
    println!("{} is {} with {}", entity.key, entity.state, serde_json::Value::Object(entity.properties));
    for h in engine.history("dns", "www.example.com").await? {
        println!(
            "  {:<8} {:>10} -> {:<10} retry {}",
            h.kind.as_str(),
            h.from.as_deref().unwrap_or("-"),
            h.to.as_deref().unwrap_or("-"),
            h.retry
        );
    }
    engine.shutdown().await;
    Ok(())
}
