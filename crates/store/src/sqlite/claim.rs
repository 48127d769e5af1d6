//! The SQLite dialect's end of a batch, where the databases really differ: firing due
//! timers, claiming due entities (the single writer needs no `SKIP LOCKED`) and reading the
//! next due time.

use rusqlite::{Connection, OptionalExtension, params};

use super::read::{INBOX_COLS, entity_from_row, inbox_from_row, timer_from_row};
use crate::sql::{ENTITY_COLS, json_text};
use crate::{Claim, Claimed, Millis, RunStatus, TimerRow};

// A `LIMIT` is a cast of its parameter, not the bare parameter: SQLite reads a bare one's
// bound value when it prepares the statement, and then prepares it again (parses and plans)
// each time the parameter is bound, that is on every batch.

/// Due timers of active entities, oldest first.
const DUE_TIMERS: &str = "SELECT t.entity_id, t.name, t.event, t.due_at, t.every_ms
     FROM timers t JOIN entities e ON e.id = t.entity_id
     WHERE t.due_at <= ?1 AND e.run_status = 'active' ORDER BY t.due_at LIMIT CAST(?2 AS INTEGER)";
/// Due entities, oldest due first.
const DUE: &str = "SELECT id FROM entities WHERE due_at <= ?1 ORDER BY due_at LIMIT CAST(?2 AS INTEGER)";
/// Due entities of some machines: walks the due index, not the (machine, key) one, which
/// would visit every entity of the machines.
const DUE_OF: &str = "SELECT id FROM entities INDEXED BY entities_due
     WHERE due_at <= ?1 AND machine IN (SELECT value FROM json_each(?3))
     ORDER BY due_at LIMIT CAST(?2 AS INTEGER)";

/// Leases a claimed entity. A sleeping or backing-off entity that comes due wakes up: it
/// is active again.
pub(super) const LEASE: &str =
    "UPDATE entities SET lease_owner = ?2, lease_until = ?3, due_at = ?3, sleep_until = NULL,
        run_status = CASE WHEN run_status IN ('sleeping', 'fault') THEN 'active' ELSE run_status END
     WHERE id = ?1";

/// Turns due timers of active entities into inbox events (one-shot timers are deleted,
/// periodic ones rescheduled) in the claiming transaction; the params name the timer. A
/// paused or sleeping entity's timers wait.
pub(super) fn fire_timers(tx: &Connection, now: Millis, limit: usize) -> rusqlite::Result<()> {
    let due: Vec<TimerRow> = tx
        .prepare_cached(DUE_TIMERS)?
        .query_map(params![now, limit as i64], timer_from_row)?
        .collect::<rusqlite::Result<_>>()?;
    for t in &due {
        tx.prepare_cached(
            "INSERT INTO inbox (entity_id, event, params, request_id, kind, created_at)
             VALUES (?1, ?2, ?3, NULL, 'timer', ?4)",
        )?
        .execute(params![
            t.entity_id,
            t.event.as_str(),
            json_text(&serde_json::json!({ "timer": t.name })),
            now
        ])?;
        match t.every_ms {
            Some(every) if every > 0 => {
                let next = (t.due_at + every).max(now + 1);
                tx.prepare_cached("UPDATE timers SET due_at = ?3 WHERE entity_id = ?1 AND name = ?2")?
                    .execute(params![t.entity_id, t.name, next])?;
            }
            _ => {
                tx.prepare_cached("DELETE FROM timers WHERE entity_id = ?1 AND name = ?2")?
                    .execute(params![t.entity_id, t.name])?;
            }
        }
        // Active, with an event queued now: due now, or when its lease ends.
        tx.prepare_cached(
            "UPDATE entities SET timer_at = (SELECT MIN(due_at) FROM timers WHERE entity_id = ?1),
                due_at = CASE WHEN lease_owner IS NOT NULL THEN lease_until ELSE ?2 END
             WHERE id = ?1",
        )?
        .execute(params![t.entity_id, now])?;
    }
    Ok(())
}

/// Leases up to `claim.limit` due entities (oldest due first) to the claiming engine, with
/// the first event of each one's inbox.
pub(super) fn claim_due(tx: &Connection, now: Millis, claim: &Claim) -> rusqlite::Result<Vec<Claimed>> {
    let until = now + claim.lease_ms;
    let ids: Vec<i64> = if claim.machines.is_empty() {
        tx.prepare_cached(DUE)?
            .query_map(params![now, claim.limit as i64], |r| r.get(0))?
            .collect::<rusqlite::Result<_>>()?
    } else {
        tx.prepare_cached(DUE_OF)?
            .query_map(params![now, claim.limit as i64, json_text(&claim.machines)], |r| r.get(0))?
            .collect::<rusqlite::Result<_>>()?
    };
    let mut claimed = Vec::with_capacity(ids.len());
    let mut update = tx.prepare_cached(LEASE)?;
    let mut select = tx.prepare_cached(&format!("SELECT {ENTITY_COLS} FROM entities WHERE id = ?1"))?;
    // The oldest internal event goes first (a probe of the small partial index), else the
    // oldest item.
    let mut internal = tx.prepare_cached(&format!(
        "SELECT {INBOX_COLS} FROM inbox WHERE entity_id = ?1 AND kind = 'internal' ORDER BY id LIMIT 1"
    ))?;
    let mut head =
        tx.prepare_cached(&format!("SELECT {INBOX_COLS} FROM inbox WHERE entity_id = ?1 ORDER BY id LIMIT 1"))?;
    let mut woken = Vec::new();
    for id in ids {
        // Read before the lease is written (the row as it was tells whether it wakes up),
        // then given the columns the update writes.
        let mut entity = select.query_row([id], entity_from_row)?;
        update.execute(params![id, claim.owner, until])?;
        if matches!(entity.run_status, RunStatus::Sleeping | RunStatus::Fault) {
            woken.push((entity.machine.to_string(), entity.state.to_string(), entity.run_status.as_str()));
            entity.run_status = RunStatus::Active;
        }
        entity.lease_owner = Some(claim.owner.clone());
        entity.lease_until = Some(until);
        entity.due_at = Some(until);
        entity.sleep_until = None;
        let inbox_head = match internal.query_row([id], inbox_from_row).optional()? {
            Some(item) => Some(item),
            None => head.query_row([id], inbox_from_row).optional()?,
        };
        // Only an entity mid-workflow has one.
        let trigger = match entity.event_id {
            Some(event_id) => trigger(tx, event_id)?,
            None => None,
        };
        claimed.push(Claimed { entity, inbox_head, trigger });
    }
    if !woken.is_empty() {
        let changes = woken.iter().flat_map(|(machine, state, was)| {
            [(machine.as_str(), state.as_str(), *was, -1), (machine.as_str(), state.as_str(), "active", 1)]
        });
        super::counts::add(tx, &crate::plan::rows::count_deltas(changes))?;
    }
    Ok(claimed)
}

/// The event `event_id` as the trigger of its workflow (read by primary key).
pub(super) fn trigger(tx: &Connection, event_id: i64) -> rusqlite::Result<Option<crate::Trigger>> {
    Ok(tx
        .prepare_cached("SELECT event, params, reply FROM events WHERE id = ?1")?
        .query_row([event_id], |r| crate::decode::trigger(r))
        .optional()?
        .flatten())
}

/// The earliest due time left, among the entities of `machines` (empty: all).
pub(super) fn next_due_of(tx: &Connection, machines: &[String]) -> rusqlite::Result<Option<Millis>> {
    if machines.is_empty() {
        tx.prepare_cached("SELECT MIN(due_at) FROM entities WHERE due_at IS NOT NULL")?.query_row([], |r| r.get(0))
    } else {
        tx.prepare_cached(
            "SELECT MIN(due_at) FROM entities INDEXED BY entities_due WHERE due_at IS NOT NULL
                   AND machine IN (SELECT value FROM json_each(?1))",
        )?
        .query_row([json_text(&machines)], |r| r.get(0))
    }
}

#[cfg(test)]
mod tests {
    use rusqlite::StatementStatus;

    use super::*;

    /// The statements of every batch's end are planned once, whatever limits they are given
    /// (a bare `LIMIT ?` made SQLite prepare them again each time it was bound).
    #[test]
    fn the_claims_statements_are_prepared_once() {
        let c = super::super::schema::migrated_in_memory();
        for limit in [1, 2, 3, 2] {
            fire_timers(&c, 10, limit).unwrap();
            let claim = Claim::new("me", 1_000, limit);
            claim_due(&c, 10 + limit as i64, &claim).unwrap();
            claim_due(&c, 10 + limit as i64, &Claim { machines: vec!["m".into()], ..claim }).unwrap();
        }
        for sql in [DUE_TIMERS, DUE, DUE_OF] {
            let stmt = c.prepare_cached(sql).unwrap();
            assert_eq!(stmt.get_status(StatementStatus::RePrepare), 0, "prepared again: {sql}");
        }
    }
}
