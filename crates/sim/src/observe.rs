//! What the checker reads from a seed's database, with the [`Observer`]: plain data for
//! the invariants ([`Seen`], [`End`], the leases, the tasks) and what the healing run needs.
//! Every query is written once and reads alike on SQLite and PostgreSQL.

use std::collections::{HashMap, HashSet};

use crate::backend::{Observer, Param, Val};
use crate::checker::{End, Fired, HistoryRow, HoldSeen, Seen, SlotSeen, Stored};

/// The first fleet count that is not the count of its rows: (`entities` or `operations`,
/// what it counts, its count, the rows'). One statement, so one snapshot on PostgreSQL too
/// (its counts are kept per shard: summed).
const COUNT_DRIFT: &str = "SELECT what, item, counted, actual FROM (
        SELECT 'entities' AS what, k.machine || '/' || k.state || '/' || k.run_status AS item,
            CAST(COALESCE((SELECT SUM(c.n) FROM entity_counts c
                WHERE c.machine = k.machine AND c.state = k.state AND c.run_status = k.run_status), 0) AS BIGINT) AS counted,
            (SELECT COUNT(*) FROM entities e
                WHERE e.machine = k.machine AND e.state = k.state AND e.run_status = k.run_status) AS actual
        FROM (SELECT machine, state, run_status FROM entity_counts
              UNION SELECT machine, state, run_status FROM entities) k
        UNION ALL
        SELECT 'operations', k.outcome,
            CAST(COALESCE((SELECT SUM(c.n) FROM operation_counts c WHERE c.outcome = k.outcome), 0) AS BIGINT),
            (SELECT COUNT(*) FROM operations o WHERE COALESCE(o.outcome, 'open') = k.outcome)
        FROM (SELECT outcome FROM operation_counts UNION SELECT COALESCE(outcome, 'open') FROM operations) k
     ) d WHERE counted <> actual ORDER BY what, item LIMIT 1";

/// What the store holds after a batch write at `now`: history rows after `after`, and the
/// rest whole.
pub(crate) async fn seen(o: &Observer, after: i64, now: i64) -> anyhow::Result<Seen> {
    let history = o
        .rows(
            "SELECT h.id, h.entity_id, e.machine, e.key, h.from_state, h.to_state, h.kind, h.event, h.at \
             FROM history h JOIN entities e ON e.id = h.entity_id WHERE h.id > $1 ORDER BY h.id",
            &[Param::I(after)],
        )
        .await?
        .into_iter()
        .map(|r| HistoryRow {
            id: r[0].int(),
            entity_id: r[1].int(),
            machine: r[2].text(),
            key: r[3].text(),
            from: r[4].opt_text(),
            to: r[5].opt_text(),
            kind: r[6].text(),
            event: r[7].opt_text(),
            at: r[8].int(),
        })
        .collect();
    let fired = o
        .rows(
            "SELECT id, entity_id, event, kind, start_time, CASE WHEN rejected THEN 1 ELSE 0 END FROM events \
             WHERE kind IN ('timer', 'subscription') ORDER BY id",
            &[],
        )
        .await?
        .into_iter()
        .map(|r| Fired {
            id: r[0].int(),
            entity_id: r[1].int(),
            event: r[2].text(),
            kind: r[3].text(),
            raised_at: r[4].int(),
            rejected: r[5].int() != 0,
        })
        .collect();
    let events = o
        .rows("SELECT entity_id, COUNT(*) FROM events WHERE NOT failed GROUP BY entity_id", &[])
        .await?
        .into_iter()
        .map(|r| (r[0].int(), r[1].int()))
        .collect();
    let edges = o
        .rows("SELECT predecessor_id, successor_id FROM successors ORDER BY predecessor_id, successor_id", &[])
        .await?
        .into_iter()
        .map(|r| (r[0].int(), r[1].int()))
        .collect();
    let hook_twice = o
        .rows(
            "SELECT key, hook, state FROM chart_hooks GROUP BY key, hook, state HAVING COUNT(*) > 1 \
             ORDER BY key, hook, state",
            &[],
        )
        .await?
        .into_iter()
        .next()
        .map(|r| (r[0].text(), r[1].text(), r[2].text()));
    let present = Some(o.rows("SELECT id FROM entities", &[]).await?.iter().map(|r| r[0].int()).collect());
    let turns = o.rows("SELECT name, key, turn FROM limit_fair WHERE waiting > 0", &[]).await?;
    let slots = o
        .rows(
            "SELECT s.name, s.key, s.in_use, s.max, \
                (SELECT COUNT(*) FROM limit_holds h WHERE h.name = s.name AND h.key = s.key), \
                (SELECT COUNT(*) FROM limit_waiters w WHERE w.name = s.name AND w.key = s.key), \
                s.spacing_us, s.next_us, s.round, \
                (SELECT COUNT(*) FROM limit_waiters w JOIN entities e ON e.id = w.entity_id \
                  WHERE w.name = s.name AND w.key = s.key \
                    AND (e.lease_owner IS NOT NULL OR e.due_at * 1000 <= s.next_us)), \
                s.waiting, s.task_holds, \
                (SELECT COUNT(*) FROM limit_holds h WHERE h.name = s.name AND h.key = s.key AND h.task_id <> 0) \
             FROM limit_slots s ORDER BY s.name, s.key",
            &[],
        )
        .await?
        .into_iter()
        .map(|r| SlotSeen {
            limit: r[0].text(),
            key: r[1].text(),
            in_use: r[2].int(),
            max: r[3].opt_int(),
            holds: r[4].int(),
            waiting: r[5].int(),
            spacing_us: r[6].opt_int(),
            next_us: r[7].int(),
            round: r[8].int(),
            woken: r[9].int() > 0,
            counted: (r[10].int(), r[11].int()),
            task_holds: r[12].int(),
            turns: turns
                .iter()
                .filter(|t| t[0].text() == r[0].text() && t[1].text() == r[1].text())
                .map(|t| t[2].int())
                .collect(),
        })
        .collect();
    let holds = o
        .rows(
            "SELECT h.name, h.entity_id, e.state, h.task_id, h.key, h.since, h.workflow, \
                CASE WHEN e.lease_owner IS NOT NULL OR e.due_at IS NOT NULL \
                  OR e.run_status IN ('paused', 'sleeping') THEN 1 ELSE 0 END \
             FROM limit_holds h JOIN entities e ON e.id = h.entity_id ORDER BY h.entity_id",
            &[],
        )
        .await?
        .into_iter()
        .map(|r| HoldSeen {
            limit: r[0].text(),
            entity_id: r[1].int(),
            state: r[2].text(),
            task: r[3].int(),
            key: r[4].text(),
            since: r[5].int(),
            workflow: r[6].int() == 1,
            moving: r[7].int() == 1,
        })
        .collect();
    let count_drift = o
        .rows(COUNT_DRIFT, &[])
        .await?
        .into_iter()
        .next()
        .map(|r| (format!("{} {}", r[0].text(), r[1].text()), r[2].int(), r[3].int()));
    Ok(Seen { history, fired, events, edges, hook_twice, present, now, slots, holds, count_drift })
}

/// A row of some table that belongs to an entity no longer in the store: (table, entity id).
pub(crate) async fn orphan(o: &Observer) -> anyhow::Result<Option<(String, i64)>> {
    for (table, column) in [
        ("history", "entity_id"),
        ("events", "entity_id"),
        ("errors", "entity_id"),
        ("inbox", "entity_id"),
        ("timers", "entity_id"),
        ("agent_tasks", "entity_id"),
        ("successors", "predecessor_id"),
        ("successors", "successor_id"),
    ] {
        let sql = format!("SELECT {column} FROM {table} WHERE {column} NOT IN (SELECT id FROM entities) LIMIT 1");
        if let Some(r) = o.rows(&sql, &[]).await?.first() {
            return Ok(Some((table.to_string(), r[0].int())));
        }
    }
    Ok(None)
}

/// Every entity's lease owner (`None`: not leased).
pub(crate) async fn leases(o: &Observer) -> anyhow::Result<HashMap<i64, Option<String>>> {
    Ok(o.rows("SELECT id, lease_owner FROM entities", &[])
        .await?
        .into_iter()
        .map(|r| (r[0].int(), r[1].opt_text()))
        .collect())
}

/// The tasks `ids` as stored.
pub(crate) async fn tasks(o: &Observer, ids: &[i64]) -> anyhow::Result<HashMap<i64, Stored>> {
    let mut out = HashMap::new();
    for id in ids {
        let rows =
            o.rows("SELECT status, token, locked_until FROM agent_tasks WHERE id = $1", &[Param::I(*id)]).await?;
        if let Some(r) = rows.first() {
            out.insert(*id, Stored { status: r[0].text(), token: r[1].opt_text(), locked_until: r[2].opt_int() });
        }
    }
    Ok(out)
}

fn name(r: &[Val], machine: usize, key: usize) -> String {
    format!("{}/{}", r[machine].text(), r[key].text())
}

/// What the store holds at rest, at `now`.
pub(crate) async fn end(o: &Observer, now: i64) -> anyhow::Result<End> {
    let processed: HashSet<i64> = o.rows("SELECT id FROM events", &[]).await?.iter().map(|r| r[0].int()).collect();
    let killed: HashSet<String> = o
        .rows("SELECT machine, key FROM entities WHERE run_status = 'killed'", &[])
        .await?
        .iter()
        .map(|r| name(r, 0, 1))
        .collect();
    let open_operations = o
        .rows("SELECT request_id, name, machine, entity_key FROM operations WHERE ended_at IS NULL ORDER BY id", &[])
        .await?
        .iter()
        .map(|r| (r[0].text(), r[1].text(), name(r, 2, 3)))
        .collect();
    let queued = o
        .rows(
            "SELECT e.machine, e.key, i.event FROM inbox i JOIN entities e ON e.id = i.entity_id \
             WHERE e.run_status <> 'killed' ORDER BY i.id",
            &[],
        )
        .await?
        .iter()
        .map(|r| (name(r, 0, 1), r[2].text()))
        .collect();
    let due_timers = o
        .rows(
            "SELECT e.machine, e.key, t.event, t.due_at FROM timers t JOIN entities e ON e.id = t.entity_id \
             WHERE e.run_status <> 'killed' AND t.due_at <= $1 ORDER BY t.due_at",
            &[Param::I(now)],
        )
        .await?
        .iter()
        .map(|r| (name(r, 0, 1), r[2].text(), r[3].int()))
        .collect();
    let mut done_charts = Vec::new();
    for r in o.rows("SELECT key FROM entities WHERE machine = 'chart' AND state = 'done' ORDER BY id", &[]).await? {
        let key = r[0].text();
        let ran = o
            .rows("SELECT hook, state FROM chart_hooks WHERE key = $1 ORDER BY hook, state", &[Param::T(&key)])
            .await?
            .iter()
            .map(|r| (r[0].text(), r[1].text()))
            .collect();
        done_charts.push((key, ran));
    }
    let limited = o
        .rows(
            "SELECT e.machine, e.key, 'holds a slot of ' || h.name FROM limit_holds h JOIN entities e ON e.id = h.entity_id \
             WHERE h.task_id = 0 OR h.until > $1 \
             UNION ALL \
             SELECT e.machine, e.key, 'waits for ' || w.name FROM limit_waiters w JOIN entities e ON e.id = w.entity_id",
            &[Param::I(now)],
        )
        .await?
        .iter()
        .map(|r| (name(r, 0, 1), r[2].text()))
        .collect();
    Ok(End { processed, killed, open_operations, queued, due_timers, done_charts, limited })
}

/// Entities an operator or the fault policy stopped (paused, sleeping, backing off,
/// parked), as (machine, key).
pub(crate) async fn stopped(o: &Observer) -> anyhow::Result<Vec<(String, String)>> {
    Ok(o.rows(
        "SELECT machine, key FROM entities WHERE run_status IN ('paused', 'sleeping', 'fault', 'failed') ORDER BY id",
        &[],
    )
    .await?
    .iter()
    .map(|r| (r[0].text(), r[1].text()))
    .collect())
}

/// The earliest due time of a live entity, and how many agent tasks are open.
pub(crate) async fn pending(o: &Observer) -> anyhow::Result<(Option<i64>, i64)> {
    let due =
        o.rows("SELECT MIN(due_at) FROM entities WHERE due_at IS NOT NULL AND run_status <> 'killed'", &[]).await?;
    let tasks = o.rows("SELECT COUNT(*) FROM agent_tasks WHERE status IN ('ready', 'leased')", &[]).await?;
    Ok((due.first().and_then(|r| r[0].opt_int()), tasks.first().map_or(0, |r| r[0].int())))
}
