//! The engine's metrics reach a Prometheus recorder (feature `prometheus`).
#![cfg(feature = "prometheus")]

use settle_core::MachineBuilder;
use settle_engine::{Engine, RaiseOptions, Wait};
use settle_store::SqliteStore;

#[tokio::test]
async fn transitions_and_rejections_are_counted() {
    let handle = settle_engine::metrics::install_prometheus().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let door = MachineBuilder::new("door")
        .state("closed")
        .initial()
        .state("open")
        .event("open", ["closed"], "swing")
        .action("swing", ["open"])
        .build()
        .unwrap();
    let engine =
        Engine::builder(SqliteStore::open(dir.path().join("m.db")).unwrap()).machine(door).start().await.unwrap();
    engine.create("door", "d", Default::default()).await.unwrap();
    engine.raise("door", "d", "open", RaiseOptions::wait(Wait::Stable)).await.unwrap();
    engine.raise("door", "d", "open", RaiseOptions::wait(Wait::Stable)).await.unwrap();
    engine.shutdown().await;
    let text = handle.render();
    assert!(text.contains(r#"settle_engine_transitions_total{machine="door",from="closed",to="open"} 1"#), "{text}");
    assert!(text.contains(r#"settle_engine_events_rejected_total{machine="door",event="open"} 1"#), "{text}");
    assert!(text.contains("settle_engine_batch_ops"), "{text}");
}
