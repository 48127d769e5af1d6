//! The SQLite schema: its migrations (`migrations/sqlite`), applied in order at open, the
//! version kept in `PRAGMA user_version`; and the renaming of states a definition upgrade
//! asks of the stored entities.

use rusqlite::{Connection, TransactionBehavior, params};

use super::db_err;
use crate::{Error, Millis, Result};

const MIGRATIONS: &[(i64, &str)] = &[
    (1, include_str!("../../migrations/sqlite/0001_core.sql")),
    (2, include_str!("../../migrations/sqlite/0002_workflows.sql")),
    (3, include_str!("../../migrations/sqlite/0003_operate.sql")),
    (4, include_str!("../../migrations/sqlite/0004_agents.sql")),
    (5, include_str!("../../migrations/sqlite/0005_outcomes.sql")),
    (6, include_str!("../../migrations/sqlite/0006_fleet.sql")),
    (7, include_str!("../../migrations/sqlite/0007_detail.sql")),
    (8, include_str!("../../migrations/sqlite/0008_trigger.sql")),
    (9, include_str!("../../migrations/sqlite/0009_reply.sql")),
    (10, include_str!("../../migrations/sqlite/0010_internal.sql")),
    (11, include_str!("../../migrations/sqlite/0011_retention.sql")),
    (12, include_str!("../../migrations/sqlite/0012_failures.sql")),
    (13, include_str!("../../migrations/sqlite/0013_bulk.sql")),
    (14, include_str!("../../migrations/sqlite/0014_feed.sql")),
    (15, include_str!("../../migrations/sqlite/0015_entered.sql")),
    (16, include_str!("../../migrations/sqlite/0016_schedules.sql")),
    (17, include_str!("../../migrations/sqlite/0017_counts.sql")),
    (18, include_str!("../../migrations/sqlite/0018_tallies.sql")),
    (19, include_str!("../../migrations/sqlite/0019_predecessors.sql")),
    (20, include_str!("../../migrations/sqlite/0020_origin.sql")),
    (21, include_str!("../../migrations/sqlite/0021_limits.sql")),
    (22, include_str!("../../migrations/sqlite/0022_rates.sql")),
    (23, include_str!("../../migrations/sqlite/0023_priority.sql")),
    (24, include_str!("../../migrations/sqlite/0024_workflow_limits.sql")),
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

/// A deploy's writes, in the caller's transaction (see `Store::machine_deploy`): the
/// versions, the moves, the marker. Returns how many entities each machine's moves moved.
pub(super) fn deploy(tx: &Connection, d: &crate::Deploy) -> rusqlite::Result<Vec<u64>> {
    use crate::machine;
    let mut insert = tx.prepare_cached(&machine::sqlite(machine::INSERT_VERSION))?;
    for v in &d.versions {
        insert.execute(params![v.name, v.hash, v.definition, v.origin, d.now])?;
    }
    let mut moved = Vec::with_capacity(d.moves.len());
    for m in &d.moves {
        moved.push(migrate_states(tx, &m.machine, &m.moves, &m.hash, d.now)?);
    }
    if let Some((key, value)) = &d.meta {
        tx.prepare_cached(&machine::sqlite(machine::META_PUT))?.execute([key, value])?;
    }
    Ok(moved)
}

/// Moves entities of `machine` to the version `hash` (see `Store::machine_deploy`).
fn migrate_states(
    tx: &Connection,
    machine: &str,
    moves: &[crate::StateMove],
    hash: &str,
    now: Millis,
) -> rusqlite::Result<u64> {
    let mut moved = 0;
    for m in moves {
        let (old, new, version) = (&m.from, &m.to, &m.version);
        if old == new {
            moved += tx.execute(
                "UPDATE entities SET machine_hash = ?3
                 WHERE machine = ?1 AND state = ?2 AND COALESCE(machine_hash, '') = ?4 AND lease_owner IS NULL",
                params![machine, old, hash, version],
            )? as u64;
            continue;
        }
        tx.execute(
            "INSERT INTO history (entity_id, from_state, to_state, kind, retry, at, detail, machine_hash)
             SELECT id, state, ?3, 'command', 0, ?4, 'upgrade: state renamed', ?5
             FROM entities
             WHERE machine = ?1 AND state = ?2 AND COALESCE(machine_hash, '') = ?6 AND lease_owner IS NULL",
            params![machine, old, new, now, hash, version],
        )?;
        // A renamed state keeps its open agent task, fenced by the entity's new version.
        tx.execute(
            "UPDATE agent_tasks SET state = ?3, entity_version = entity_version + 1
             WHERE status IN ('ready', 'leased')
               AND entity_id IN (SELECT id FROM entities WHERE machine = ?1 AND state = ?2
                                 AND COALESCE(machine_hash, '') = ?4 AND lease_owner IS NULL)",
            params![machine, old, new, version],
        )?;
        // The counts follow the entities that move, by run status.
        let by_status: Vec<(String, i64)> = tx
            .prepare_cached(
                "SELECT run_status, COUNT(*) FROM entities
                 WHERE machine = ?1 AND state = ?2 AND COALESCE(machine_hash, '') = ?3 AND lease_owner IS NULL
                 GROUP BY run_status",
            )?
            .query_map(params![machine, old, version], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<rusqlite::Result<_>>()?;
        let changes = by_status.iter().filter_map(|(status, n)| {
            let status = crate::RunStatus::parse(status)?.as_str();
            Some([(machine, old.as_str(), status, -n), (machine, new.as_str(), status, *n)])
        });
        super::counts::add(tx, &crate::plan::rows::count_deltas(changes.flatten()))?;
        moved += tx.execute(
            "UPDATE entities SET state = ?3, version = version + 1, machine_hash = ?4
             WHERE machine = ?1 AND state = ?2 AND COALESCE(machine_hash, '') = ?5 AND lease_owner IS NULL",
            params![machine, old, new, hash, version],
        )? as u64;
    }
    Ok(moved)
}

/// Test support: an in-memory file with every migration applied.
#[cfg(test)]
pub(super) fn migrated_in_memory() -> Connection {
    let mut c = Connection::open_in_memory().unwrap();
    migrate(&mut c).unwrap();
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An in-memory file at `version`, as the migrations up to it left it.
    fn at_version(version: i64) -> Connection {
        let c = Connection::open_in_memory().unwrap();
        for (v, sql) in MIGRATIONS.iter().filter(|m| m.0 <= version) {
            c.execute_batch(sql).unwrap();
            c.pragma_update(None, "user_version", v).unwrap();
        }
        c
    }

    /// A file of version 17 (counts kept by triggers) moves to 18 with its counts as they
    /// were and no trigger left: the writes keep them from then on.
    #[test]
    fn version_18_drops_the_count_triggers_and_keeps_the_counts() {
        let mut c = at_version(17);
        c.execute_batch(
            "INSERT INTO operations (request_id, name, started_at) VALUES ('a', 'm.go', 1), ('b', 'm.go', 1),
                 ('c', 'm.go', 1);
             UPDATE operations SET outcome = 'success', ended_at = 2 WHERE request_id = 'a';
             UPDATE operations SET outcome = 'hung' WHERE request_id = 'b';",
        )
        .unwrap();
        let counts = |c: &Connection| -> Vec<(String, i64)> {
            let mut s = c.prepare("SELECT outcome, n FROM operation_counts WHERE n > 0 ORDER BY outcome").unwrap();
            s.query_map([], |r| Ok((r.get(0)?, r.get(1)?))).unwrap().map(Result::unwrap).collect()
        };
        let before = counts(&c);
        assert_eq!(before, [("hung".to_string(), 1), ("open".into(), 1), ("success".into(), 1)]);
        migrate(&mut c).unwrap();
        assert_eq!(counts(&c), before);
        let triggers: i64 =
            c.query_row("SELECT COUNT(*) FROM sqlite_master WHERE type = 'trigger'", [], |r| r.get(0)).unwrap();
        assert_eq!(triggers, 0, "no trigger keeps a count any more");
        let version: i64 = c.query_row("PRAGMA user_version", [], |r| r.get(0)).unwrap();
        assert_eq!(version, MIGRATIONS.last().unwrap().0);
    }

    /// A successor whose edge predates the flag (a file of version 18 and older may hold
    /// one) says it has predecessors after version 19; an entity without an edge does not.
    #[test]
    fn version_19_flags_every_successor() {
        let mut c = at_version(18);
        c.execute_batch(
            "INSERT INTO entities (id, machine, key, state, version, created_at, entered_at)
             VALUES (1, 'm', 'parent', 'idle', 1, 0, 0), (2, 'm', 'child', 'idle', 1, 0, 0), (3, 'm', 'alone', 'idle', 1, 0, 0);
             INSERT INTO successors (predecessor_id, successor_id, created_at) VALUES (1, 2, 0);",
        )
        .unwrap();
        migrate(&mut c).unwrap();
        let flags: Vec<(i64, bool)> = c
            .prepare("SELECT id, has_predecessors FROM entities ORDER BY id")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        assert_eq!(flags, [(1, false), (2, true), (3, false)]);
    }
}
