//! The SQLite dialect's entity counts: no trigger keeps them; every write that changes
//! entities adds its changes here, in its own transaction (see migration 0017).

use rusqlite::{Connection, params};

use crate::plan::rows::CountDelta;

/// Adds `deltas` to the entity counts on `c` (rows that fall to 0 stay: readers skip them).
pub(super) fn add(c: &Connection, deltas: &[CountDelta]) -> rusqlite::Result<()> {
    let mut stmt = c.prepare_cached(
        "INSERT INTO entity_counts (machine, state, run_status, n) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (machine, state, run_status) DO UPDATE SET n = n + excluded.n",
    )?;
    for d in deltas {
        stmt.execute(params![d.machine, d.state, d.run_status, d.n])?;
    }
    Ok(())
}
