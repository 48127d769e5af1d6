//! Settle: a durable workflow engine on persistent state machines, as a library.
//!
//! This crate is the one dependency an embedding application needs. It re-exports the
//! parts of Settle by what they are for:
//!
//! - defining machines: [`MachineBuilder`], [`Machine`], loading TOML ([`core::toml`]) and
//!   checking definitions ([`core::validate`]);
//! - running them: [`Engine`] and its [`EngineBuilder`], action handlers
//!   ([`ActionContext`] in, [`Outcome`] out), [`RaiseOptions`] and [`Wait`];
//! - keeping them: the [`Store`] trait, [`SqliteStore`] (embedded, the default),
//!   [`PgStore`] (PostgreSQL, many instances), [`AnyStore`] (either, from a path or URL);
//! - time: [`Clock`], with [`SystemClock`] in production and [`ManualClock`] in tests;
//! - talking to a `settle serve` over HTTP: [`client`] (feature `client`, on by default);
//! - serving the HTTP API from this process: `settle::server` (feature `server`).
//!
//! The crates behind it ([`core`], [`engine`], [`store`]) stay reachable for everything
//! else.
//!
//! ```
//! use settle::{Engine, MachineBuilder, Outcome, RaiseOptions, SqliteStore, Wait};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let door = MachineBuilder::new("door")
//!     .state("closed").initial()
//!     .state("opening").auto("swing")     // unstable: its auto action runs on entry
//!     .state("open")
//!     .event("open", ["closed"], "unlatch")
//!     .action("unlatch", ["opening"])     // one target, no handler: a plain transition
//!     .action("swing", ["open"])
//!     .build()?;
//! # let dir = tempfile::tempdir()?;
//! # let path = dir.path().join("doors.db");
//! let engine = Engine::builder(SqliteStore::open(&path)?)
//!     .machine(door)
//!     .on("door", "swing", |_ctx| async { Ok(Outcome::to("open").set("hinges", "oiled".into())) })
//!     .start()
//!     .await?;
//! engine.create("door", "front", Default::default()).await?;
//! let raised = engine.raise("door", "front", "open", RaiseOptions::wait(Wait::Stable)).await?;
//! assert_eq!(raised.entity.unwrap().state, "open");
//! engine.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! A longer walk-through is `examples/quickstart.rs` (`cargo run -p settle --example
//! quickstart`).

pub use settle_core as core;
pub use settle_engine as engine;
pub use settle_store as store;

#[cfg(feature = "client")]
pub use settle_client as client;
#[cfg(feature = "server")]
pub use settle_server as server;

pub use settle_core::{
    ActionName, EntityKey, EventName, Machine, MachineBuilder, MachineName, Properties, StateKind, StateName,
};
pub use settle_engine::{
    ActionContext, Clock, Command, Config, Engine, EngineBuilder, Error, EventOutcome, HandlerError, ManualClock,
    Outcome, RaiseOptions, Raised, RunStatus, SystemClock, Wait,
};
pub use settle_store::{AnyStore, EntityRow, HistoryKind, HistoryRow, PgStore, SqliteStore, Store};
