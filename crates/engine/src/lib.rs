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

mod engine;
mod error;
mod handler;
pub mod metrics;
mod scheduler;
mod watch;

pub use engine::{Commanded, Config, Created, Engine, EngineBuilder, EventOutcome, RaiseOptions, Raised, Wait};
pub use error::{Error, Result};
pub use handler::{ActionContext, CreateEffect, Handler, HandlerError, HandlerFuture, Outcome, RaiseEffect, handler};
pub use settle_store::{Clock, Command, ManualClock, RunStatus, SystemClock};

use settle_store::clock::now_ms;
