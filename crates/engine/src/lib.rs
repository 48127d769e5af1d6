//! settle-engine: the runtime around the pure core and the store.
//!
//! An [`Engine`] owns one scheduler task. The scheduler is the only writer: it gathers
//! everything that must be written (created entities, raised events, action outcomes,
//! lease renewals) into one [`settle_store::Batch`] per round — one transaction, one
//! fsync — and claims due entities in the same transaction. Actions run as short-lived
//! tasks outside any transaction and report back with an [`Outcome`]; the scheduler asks
//! [`settle_core::step`] whether it may be committed. No task or timer exists per entity:
//! a dormant entity costs nothing in memory, and due work is found through the store's
//! index of due times.

mod api;
mod builder;
mod config;
mod decide;
mod engine;
mod error;
#[cfg(test)]
mod fixtures;
mod handler;
pub mod metrics;
mod msg;
mod nested;
mod registry;
mod scheduler;
mod waiters;
mod watch;

pub use api::{Commanded, Created, EventOutcome, RaiseOptions, Raised, Wait};
pub use builder::EngineBuilder;
pub use config::Config;
pub use engine::Engine;
pub use error::{Error, Result};
pub use handler::{ActionContext, CreateEffect, Handler, HandlerError, HandlerFuture, Outcome, RaiseEffect, handler};
pub use settle_store::{Clock, Command, ManualClock, RunStatus, SharedClock, SystemClock};
