//! The SQLite schema: its migrations (`migrations/sqlite`), applied in order at open, the
//! version kept in `PRAGMA user_version`.

use rusqlite::{Connection, TransactionBehavior};

use super::db_err;
use crate::{Error, Result};

const MIGRATIONS: &[(i64, &str)] = &[
    (1, include_str!("../../migrations/sqlite/0001_core.sql")),
    (2, include_str!("../../migrations/sqlite/0002_workflows.sql")),
    (3, include_str!("../../migrations/sqlite/0003_operate.sql")),
    (4, include_str!("../../migrations/sqlite/0004_agents.sql")),
    (5, include_str!("../../migrations/sqlite/0005_outcomes.sql")),
    (6, include_str!("../../migrations/sqlite/0006_fleet.sql")),
    (7, include_str!("../../migrations/sqlite/0007_detail.sql")),
];

/// Applies the migrations newer than the file's version, each in a transaction of its own.
pub(super) fn migrate(conn: &mut Connection) -> Result<()> {
    let current: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0)).map_err(db_err)?;
    let newest = MIGRATIONS.last().map(|m| m.0).unwrap_or(0);
    if current > newest {
        return Err(Error::SchemaTooNew { found: current, supported: newest });
    }
    for (version, sql) in MIGRATIONS.iter().filter(|m| m.0 > current) {
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(db_err)?;
        tx.execute_batch(sql).map_err(db_err)?;
        tx.pragma_update(None, "user_version", version).map_err(db_err)?;
        tx.commit().map_err(db_err)?;
    }
    Ok(())
}
