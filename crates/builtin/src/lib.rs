//! settle-builtin: the machines the `settle` binary knows, with their handlers, and the
//! seeded draws their simulated providers use. The demo, the benchmarks, the crash-test
//! workload, `settle run`/`serve` and the deterministic simulation (`settle-sim`) all run
//! these: one definition of each, in a crate of its own so that none of them has to
//! depend on the binary.
//!
//! - [`machines`](crate::bind_built_in): the reference scenario (`server` and its four
//!   resources against a slow, flaky simulated provider, in process or through agents),
//!   fan-out parents and children, `sleeper`, the `chain` benchmarks, `job`, `relay`;
//! - [`chart`]: the statechart `chart` (entry and exit actions on two levels);
//! - [`draws`]: splitmix64 draws, a pure function of a seed and a key.

pub mod chart;
pub mod draws;
mod machines;

pub use machines::*;
