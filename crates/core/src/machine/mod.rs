//! The machine model: the raw definition ([`MachineDef`], what TOML and the builder
//! produce, possibly invalid) and the validated [`Machine`] the runtime executes.
//!
//! A definition becomes a machine only through [`Machine::from_def`], which runs every
//! check of [`crate::validate`] and refuses the definition if any error is found.
//!
//! - `def`: the definition as written, and the leaf enums [`StateKind`] and [`Health`];
//!   it names no other part of the model, so [`crate::pattern`] and [`crate::validate`]
//!   build on it;
//! - `model`: [`Machine`] and its validated parts;
//! - `builder`: [`MachineBuilder`], a definition written in Rust;
//! - `canonical`: [`Machine::canonical_json`] and [`Machine::content_hash`], the
//!   definition's stored version;
//! - `to_toml`: [`Machine::to_toml`], the definition written back as TOML;
//! - `tree`: substates, and the queries that understand nesting ([`Machine::path`],
//!   [`Machine::event_level`], [`Machine::transition_path`], …).
//!
//! Everything is re-exported here: `settle_core::machine::X` is the path to use.

mod builder;
mod canonical;
pub(crate) mod def;
mod model;
mod to_toml;
mod tree;

pub use builder::MachineBuilder;
pub use def::{
    ActionDef, CalendarCreate, CalendarDef, CreateDef, EventDef, FaultDef, Health, History, LimitDef, MachineDef,
    MigrateDef, Origin, RaiseDef, RetentionDef, StateDef, StateKind, TimerDef, WhenDef, effective_kind,
};
pub use model::{
    Action, AgentBinding, Alternative, Broadcast, Creation, Event, KeyedRaise, Machine, Related, SELF, Schedule, State,
    Subscription, SubscriptionTimeout, Target, Then, Timer,
};
pub use tree::{HISTORY_PROPERTY, Level, Memory, Path, Transition, is_engine_property};
