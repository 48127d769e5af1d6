//! The rules of the operations a batch applies beside creates, pushes and commits: operator
//! commands ([`command`]), agent task leases, heartbeats and reports ([`task`]), lease
//! renewals ([`lease`]), the marking of hung operations ([`upkeep`]) and which entities a
//! round of pruning removes ([`prune`]). Each is a pure
//! function of the rows read for it, answering the rows to write; the segment
//! ([`super::segment`]) reads for them, applies them in batch order with the rest, and
//! writes their rows in its sets.

pub(crate) mod cancel;
pub(crate) mod command;
pub(crate) mod lease;
pub(crate) mod prune;
pub(crate) mod task;
pub(crate) mod upkeep;
