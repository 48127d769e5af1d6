//! settle-engine: the runtime around the pure core and the store.
//!
//! An [`Engine`] owns one scheduler task. The scheduler is the only writer: it gathers
//! everything that must be written (created entities, raised events, action outcomes,
//! lease renewals) into one [`settle_store::Batch`] per round — one transaction, one
//! fsync — and claims due entities in the same transaction. Actions run as short-lived
//! tasks outside any transaction and report back with an [`Outcome`]. What an entity does
//! next, and what an outcome or a fault commits, is decided by a pure module (`decide`,
//! over [`settle_core::step`]); the scheduler only carries the decisions out. No task or
//! timer exists per entity: a dormant entity costs nothing in memory, and due work is
//! found through the store's index of due times.
//!
//! Time comes from [`Config::clock`]: the system clock, or a [`ManualClock`] that tests
//! move ([`Engine::drive`], [`Engine::wait_caught_up`]).
//!
//! Modules: `engine` (the API), `builder` (starting), `api` (what callers send and get),
//! `config`, `registry` (machines and handlers), `decide` (the decisions), `scheduler` (the
//! loop), `msg` (its inbox), `waiters` (callers waiting on it), `opwatch` (callers waiting
//! for operations to end), `nested` (sync nested events), `prune` (retention carried out), [`sim`] (the scheduler stepped by a simulation), `handler` (what actions get and return), `watch` (other instances' commits), `feed` (following the change feed),
//! [`metrics`], `error`.

mod api;
mod archive;
mod builder;
mod bulk;
mod cancel;
mod config;
mod decide;
mod deploy;
mod engine;
mod error;
mod feed;
#[cfg(test)]
mod fixtures;
mod handler;
pub mod metrics;
mod msg;
mod narrow;
mod nested;
mod ops;
mod opwatch;
mod prune;
mod registry;
mod scheduler;
mod schedules;
pub mod sim;
mod waiters;
mod watch;

pub use api::{Commanded, Created, EventOutcome, RaiseOptions, Raised, Report, Wait};
pub use archive::ArchiveConfig;
pub use builder::EngineBuilder;
pub use bulk::{
    BulkAction, BulkRequest, COUNT_BOUND, DEFAULT_RATE, DryRun, MAX_RATE, Selection, entity_request_id, health_pairs,
};
pub use cancel::{CancelStarted, CanceledEntity, cancel_request_id};
pub use config::Config;
pub use decide::subscription_progress_with;
pub use deploy::Deployed;
pub use engine::{Engine, SubscriptionProgress, can_fire};
pub use error::{Error, Result, Stranded};
pub use feed::FeedWatch;
pub use handler::{ActionContext, CreateEffect, Handler, HandlerError, HandlerFuture, Outcome, RaiseEffect, handler};
pub use narrow::{
    ERROR_TEXT_MAX, ErrorText, NARROW_FIELDS, Narrow, NarrowText, Narrowed, error_group, error_matches, keeps,
    newest_errors,
};
pub use prune::PruneReport;
pub use schedules::{ScheduleView, describe_fire, views as schedule_views};
pub use settle_store::{Clock, Command, ManualClock, RunStatus, SharedClock, SystemClock};
