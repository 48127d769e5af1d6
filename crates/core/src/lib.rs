//! settle-core: the pure heart of Settle.
//!
//! - [`machine`]: the machine model ([`MachineDef`] as written, [`Machine`] validated),
//!   the [`MachineBuilder`], and the canonical JSON and content hash of a definition;
//! - [`pattern`]: subscription patterns over successors (`all(*) in [ready]`);
//! - [`toml`]: loading definitions from TOML with line numbers;
//! - [`validate`]: every check on a definition, reported at once, and the checks across a
//!   set of machines ([`validate::check_set`]);
//! - [`step`]: the step function the runtime consults for each event and action outcome;
//! - [`fault`]: fault policies, turning an entity's errors into backoff or parking;
//! - [`retention`]: how long ended entities, operations, tasks and counts are kept;
//! - [`calendar`]: calendar schedules, their cron expressions and zones, and what fires when;
//! - [`upgrade`]: whether stored entities fit a new definition, and where they move;
//! - [`graph`]: Mermaid and DOT diagrams;
//! - [`svg`]: SVG diagrams, with a layered layout of their own (for the dashboard).
//!
//! This crate does no IO, reads no clock and spawns nothing: time and randomness come in
//! as arguments, decisions come out as data. See `examples/machines/` for definitions.
//!
//! Imports go one way. At the bottom are [`names`], [`duration`], [`fault`], [`retention`] and the raw
//! definition (`machine::def`, with [`StateKind`] and [`Health`]); [`pattern`] and the
//! single-definition checks of [`validate`] build on the definition only; the validated
//! [`Machine`] builds on them (a definition becomes a machine once validated); everything
//! that needs a validated machine comes after it: [`validate::check_set`], [`step`],
//! [`upgrade`], [`graph`] (and [`svg`], which draws [`graph`]'s edges) and [`toml::load`].

pub mod calendar;
pub mod cost;
pub mod duration;
mod edges;
pub mod expr;
pub mod fault;
pub mod graph;
pub mod guard;
pub mod limits;
pub mod machine;
pub mod names;
pub mod pattern;
pub mod retention;
pub mod step;
pub mod svg;
pub mod time;
pub mod toml;
pub mod upgrade;
pub mod validate;

#[cfg(test)]
mod fixtures;

pub use fault::{FaultDecision, FaultPolicy};
pub use machine::{
    Action, AgentBinding, Broadcast, Event, Health, History, Machine, MachineBuilder, MachineDef, Related, Schedule,
    State, StateKind, Subscription, SubscriptionTimeout, Target, Timer,
};
pub use names::{ActionName, EntityKey, EventName, MachineName, StateName};
pub use pattern::{Pattern, SuccessorView};
pub use step::{ActionOutcome, EventStep, Permission, Properties, RaiseError, Refusal, Rejection};
pub use upgrade::UpgradeRefused;
pub use validate::{Diagnostic, Report, Severity};
