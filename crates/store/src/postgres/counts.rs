//! The PostgreSQL dialect's entity counts: no trigger keeps them (migration 0017); every
//! statement that adds or removes entities of a (machine, state, run status) carries an
//! upsert of its changes, in the same statement or pipeline, so they commit or roll back
//! with it:
//! - the plan's changes per segment ([`deltas`], computed from its slots: creates and
//!   commits, commands, cancels);
//! - a claim that wakes sleeping or faulted entities (`claim.rs`, a CTE over the rows it
//!   picked);
//! - pruning (`prune.rs`, over the rows it deleted) and a definition upgrade's renamed states
//!   (`schema.rs`, over the rows it moved).
//!
//! Each adds to the shard of its transaction (its id modulo 64): instances writing at once
//! seldom wait for the same counter row, and a reader sums the shards.

use super::stmt::{Stmt, ints, strings};
use crate::plan::rows::CountDelta;

/// An upsert adding up, per (machine, state, run status), the `n` of the rows of `$source`
/// (a query of those four columns, in that order) to the transaction's shard; keys whose
/// changes sum to 0 are skipped, and the rows are locked in key order.
macro_rules! add_counts {
    ($source:expr) => {
        concat!(
            "INSERT INTO entity_counts (machine, state, run_status, shard, n)
             SELECT c.machine, c.state, c.run_status, (txid_current() % 64)::smallint, SUM(c.n)::bigint
             FROM (",
            $source,
            ") AS c(machine, state, run_status, n)
             GROUP BY 1, 2, 3 HAVING SUM(c.n) <> 0 ORDER BY 1, 2, 3
             ON CONFLICT (machine, state, run_status, shard) DO UPDATE SET n = entity_counts.n + excluded.n"
        )
    };
}
pub(super) use add_counts;

/// The plan's changes of one segment ([`crate::plan::Writes::counts`]), as one statement.
pub(super) fn deltas(d: &[CountDelta]) -> Stmt {
    Stmt::new(
        add_counts!("SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[])"),
        vec![strings(d, |c| &c.machine), strings(d, |c| &c.state), strings(d, |c| c.run_status), ints(d, |c| c.n)],
    )
}
