//! The PostgreSQL schema: the schema a URL names (created if missing) and the migrations
//! (`migrations/postgres`), applied in one transaction, serialised between instances that
//! start together by an advisory lock; the version kept in `settle_schema`. And the renaming
//! of states a definition upgrade asks of the stored entities.

use super::conn::{Conn, Failure, Target, pg_message};
use super::counts::add_counts;
use super::stmt::{Stmt, one};
use super::writer::WriterConn;
use crate::{Error, Millis, Result};

const MIGRATIONS: &[(i64, &str)] = &[
    (1, include_str!("../../migrations/postgres/0001_core.sql")),
    (2, include_str!("../../migrations/postgres/0002_workflows.sql")),
    (3, include_str!("../../migrations/postgres/0003_operate.sql")),
    (4, include_str!("../../migrations/postgres/0004_agents.sql")),
    (5, include_str!("../../migrations/postgres/0005_write_path.sql")),
    (6, include_str!("../../migrations/postgres/0006_fleet.sql")),
    (7, include_str!("../../migrations/postgres/0007_detail.sql")),
    (8, include_str!("../../migrations/postgres/0008_trigger.sql")),
    (9, include_str!("../../migrations/postgres/0009_reply.sql")),
    (10, include_str!("../../migrations/postgres/0010_internal.sql")),
    (11, include_str!("../../migrations/postgres/0011_retention.sql")),
    (12, include_str!("../../migrations/postgres/0012_failures.sql")),
    (13, include_str!("../../migrations/postgres/0013_bulk.sql")),
    (14, include_str!("../../migrations/postgres/0014_feed.sql")),
    (15, include_str!("../../migrations/postgres/0015_entered.sql")),
    (16, include_str!("../../migrations/postgres/0016_schedules.sql")),
    (17, include_str!("../../migrations/postgres/0017_counts.sql")),
    (18, include_str!("../../migrations/postgres/0018_origin.sql")),
    (19, include_str!("../../migrations/postgres/0019_limits.sql")),
    (20, include_str!("../../migrations/postgres/0020_rates.sql")),
    (21, include_str!("../../migrations/postgres/0021_priority.sql")),
    (22, include_str!("../../migrations/postgres/0022_workflow_limits.sql")),
];

/// The first connection of a handle: to the schema the URL names, created first if
/// `create_schema`.
pub(super) fn first_connection(target: &Target, create_schema: bool) -> Result<Conn> {
    let open_err = |message: String| Error::Open { path: target.display.clone(), message };
    if create_schema && let Some(ident) = target.schema_ident() {
        let mut plain = Target { schema: None, ..target.clone() }.connect().map_err(|e| open_err(pg_message(&e)))?;
        // Instances starting together on a new schema would race in `CREATE SCHEMA IF NOT
        // EXISTS` (a unique violation): the migrations' advisory lock serialises them.
        let key = format!("settle-migrate:{}", target.schema.as_deref().unwrap_or_default());
        let create = |c: &mut Conn| -> std::result::Result<(), postgres::Error> {
            c.batch("BEGIN")?;
            c.exec("SELECT pg_advisory_xact_lock(hashtext($1))", &[&key])?;
            // The name was validated when the URL was parsed; identifiers cannot be parameters.
            c.batch(&format!("CREATE SCHEMA IF NOT EXISTS {ident}"))?;
            c.batch("COMMIT")
        };
        create(&mut plain).map_err(|e| open_err(pg_message(&e)))?;
    }
    target.connect().map_err(|e| open_err(pg_message(&e)))
}

/// The version of the schema (0: none, not a Settle database).
pub(super) fn schema_version(c: &mut Conn) -> std::result::Result<i64, postgres::Error> {
    let exists: bool = c.one("SELECT to_regclass('settle_schema') IS NOT NULL", &[])?.try_get(0)?;
    if !exists {
        return Ok(0);
    }
    c.one("SELECT COALESCE(MAX(version), 0) FROM settle_schema", &[])?.try_get(0)
}

/// Applies pending migrations in one transaction, under an advisory lock per schema so
/// that instances starting together do not race.
pub(super) fn migrate(c: &mut Conn) -> Result<()> {
    let run = |c: &mut Conn| -> std::result::Result<Option<Error>, postgres::Error> {
        c.batch("BEGIN")?;
        c.exec("SELECT pg_advisory_xact_lock(hashtext('settle-migrate:' || current_schema()))", &[])?;
        c.batch("CREATE TABLE IF NOT EXISTS settle_schema (version BIGINT NOT NULL, applied_at BIGINT NOT NULL)")?;
        let current: i64 = c.one("SELECT COALESCE(MAX(version), 0) FROM settle_schema", &[])?.try_get(0)?;
        let newest = MIGRATIONS.last().map(|m| m.0).unwrap_or(0);
        if current > newest {
            c.batch("ROLLBACK")?;
            return Ok(Some(Error::SchemaTooNew { found: current, supported: newest }));
        }
        for (version, sql) in MIGRATIONS.iter().filter(|m| m.0 > current) {
            c.batch(sql)?;
            c.exec(
                "INSERT INTO settle_schema (version, applied_at) VALUES ($1, $2)",
                &[version, &crate::clock::now_ms()],
            )?;
        }
        c.batch("COMMIT")?;
        Ok(None)
    };
    match run(c) {
        Ok(None) => Ok(()),
        Ok(Some(e)) => Err(e),
        Err(e) => Err(Error::Db(format!("migration failed: {}", pg_message(&e)))),
    }
}

/// A deploy's writes, in the caller's transaction (see `Store::machine_deploy`): the
/// versions, the moves, the marker. Returns how many entities each machine's moves moved.
pub(super) fn deploy(c: &mut WriterConn, d: &crate::Deploy) -> std::result::Result<Vec<u64>, Failure> {
    use crate::machine;
    for v in &d.versions {
        c.exec(machine::INSERT_VERSION, &[&v.name, &v.hash, &v.definition, &v.origin, &d.now])?;
    }
    let mut moved = Vec::with_capacity(d.moves.len());
    for m in &d.moves {
        moved.push(migrate_states(c, &m.machine, &m.moves, &m.hash, d.now)?);
    }
    if let Some((key, value)) = &d.meta {
        c.exec(machine::META_PUT, &[key, value])?;
    }
    Ok(moved)
}

/// Moves entities of `machine` to the version `hash` (see `Store::machine_deploy`).
fn migrate_states(
    c: &mut WriterConn,
    machine: &str,
    moves: &[crate::StateMove],
    hash: &str,
    now: Millis,
) -> std::result::Result<u64, Failure> {
    let mut moved = 0;
    for m in moves {
        let (old, new, version) = (&m.from, &m.to, &m.version);
        if old == new {
            moved += c.exec(
                "UPDATE entities SET machine_hash = $3
                 WHERE machine = $1 AND state = $2 AND COALESCE(machine_hash, '') = $4 AND lease_owner IS NULL",
                &[&machine, old, &hash, version],
            )?;
            continue;
        }
        c.exec(
            "INSERT INTO history (entity_id, from_state, to_state, kind, retry, at, detail, machine_hash)
             SELECT id, state, $3, 'command', 0, $4, 'upgrade: state renamed', $5
             FROM entities
             WHERE machine = $1 AND state = $2 AND COALESCE(machine_hash, '') = $6 AND lease_owner IS NULL",
            &[&machine, old, new, &now, &hash, version],
        )?;
        // A renamed state keeps its open agent task, fenced by the entity's new version.
        c.exec(
            "UPDATE agent_tasks SET state = $3, entity_version = entity_version + 1
             WHERE status IN ('ready', 'leased')
               AND entity_id IN (SELECT id FROM entities WHERE machine = $1 AND state = $2
                                 AND COALESCE(machine_hash, '') = $4 AND lease_owner IS NULL)",
            &[&machine, old, new, version],
        )?;
        // The counts follow the entities that move, by run status, in the same statement.
        let rows = c.send(&[Stmt::new(
            concat!(
                "WITH m AS (
                    UPDATE entities SET state = $3, version = version + 1, machine_hash = $4
                    WHERE machine = $1 AND state = $2 AND COALESCE(machine_hash, '') = $5 AND lease_owner IS NULL
                    RETURNING run_status),
                 counted AS (",
                add_counts!(
                    "SELECT $1::text, $2::text, run_status, -1 FROM m
                     UNION ALL SELECT $1::text, $3::text, run_status, 1 FROM m"
                ),
                ") SELECT count(*) FROM m"
            ),
            vec![
                one(machine.to_string()),
                one(old.clone()),
                one(new.clone()),
                one(hash.to_string()),
                one(version.clone()),
            ],
        )])?;
        let n: i64 = rows[0].first().map(|r| r.try_get(0)).transpose()?.unwrap_or(0);
        moved += n as u64;
    }
    Ok(moved)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A schema of version 16 (entity counts kept by triggers, over several shards) moves to
    /// 17 with every entity counted once, a count that had drifted recounted, and no trigger
    /// left on `entities`: the writes keep the counts from then on.
    #[test]
    fn version_17_drops_the_entity_count_triggers_and_recounts() {
        let Some(url) = crate::postgres::test_url("migrate17") else { return };
        let target = Target::parse(&url).unwrap();
        let mut c = first_connection(&target, true).unwrap();
        c.batch("BEGIN").unwrap();
        for (_, sql) in MIGRATIONS.iter().filter(|m| m.0 <= 16) {
            c.batch(sql).unwrap();
        }
        c.batch(
            "CREATE TABLE settle_schema (version BIGINT NOT NULL, applied_at BIGINT NOT NULL);
             INSERT INTO settle_schema VALUES (16, 0);
             COMMIT",
        )
        .unwrap();
        // Two transactions (two shards, as the triggers kept them), then a drift.
        for key in ["a", "b"] {
            c.exec(
                "INSERT INTO entities (machine, key, state, version, created_at, entered_at) VALUES ('m', $1, 'idle', 1, 0, 0)",
                &[&key],
            )
            .unwrap();
        }
        c.exec("UPDATE entities SET run_status = 'paused' WHERE key = 'b'", &[]).unwrap();
        c.exec("INSERT INTO entity_counts VALUES ('m', 'gone', 'active', 63, 5)", &[]).unwrap();
        let counts = |c: &mut Conn| -> Vec<(String, String, i64)> {
            c.query(
                "SELECT state, run_status, SUM(n)::bigint FROM entity_counts GROUP BY 1, 2 HAVING SUM(n) <> 0 ORDER BY 1, 2",
                &[],
            )
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect()
        };
        let s = |a: &str, b: &str, n: i64| (a.to_string(), b.to_string(), n);
        assert_eq!(counts(&mut c), [s("gone", "active", 5), s("idle", "active", 1), s("idle", "paused", 1)]);
        migrate(&mut c).unwrap();
        assert_eq!(counts(&mut c), [s("idle", "active", 1), s("idle", "paused", 1)]);
        let triggers: i64 = c
            .one("SELECT COUNT(*) FROM pg_trigger WHERE tgrelid = 'entities'::regclass AND NOT tgisinternal", &[])
            .unwrap()
            .get(0);
        assert_eq!(triggers, 0, "no trigger keeps the entity counts any more");
        c.exec("INSERT INTO entities (machine, key, state, version, created_at, entered_at) VALUES ('m', 'c', 'idle', 1, 0, 0)", &[])
            .unwrap();
        assert_eq!(counts(&mut c), [s("idle", "active", 1), s("idle", "paused", 1)], "plain SQL is not counted");
        let version: i64 = c.one("SELECT MAX(version) FROM settle_schema", &[]).unwrap().get(0);
        assert_eq!(version, MIGRATIONS.last().unwrap().0);
        let ident = target.schema_ident().unwrap();
        c.batch(&format!("DROP SCHEMA {ident} CASCADE")).unwrap();
    }
}
