//! The PostgreSQL dialect's end of a batch, where the databases really differ: due timers
//! fired and due entities claimed skipping rows other instances hold (`SKIP LOCKED`), the
//! next due times read, other processes told, and the commit — one pipeline.

use postgres::types::ToSql;

use super::conn::Failure;
use super::counts::add_counts;
use super::dialect::{INBOX_COLS, Tx};
use super::read::entity_from_row_at;
use super::stmt::{Slots, Stmt, col, one};
use super::writer::CommitError;
use crate::plan::Finish;
use crate::sql::ENTITY_COLS;
use crate::{Claimed, Millis};

type R<T> = std::result::Result<T, Failure>;

impl Tx<'_> {
    /// Ends the batch (see [`Dialect::finish`](crate::plan::Dialect::finish)).
    pub(super) fn finish_batch(&mut self, f: &Finish<'_>) -> R<(Vec<Claimed>, Option<Millis>)> {
        let tx = self;
        let mut p = Slots::default();
        let mut params: Vec<Box<dyn ToSql + Sync + Send>> = Vec::new();
        // The claim (if any) as CTEs, then one row: when the next entity and timer are
        // due, and the batch's notifications (others learn of it when it commits: work to
        // claim, entities moved), joined with the claimed rows.
        let mut sql = String::new();
        let claiming = f.claim.is_some();
        let next_entity = if let Some(claim) = f.claim {
            // A timer created by another instance since is missed here at worst once: its
            // entity is due (by `timer_at`), and this batch reads the earliest timer again.
            if f.now >= tx.next_timer.load(std::sync::atomic::Ordering::Relaxed) {
                p.add(fire_timers(f.now, 1_000));
            }
            // A sleeping or faulted entity claimed is active again: its counts move
            // (`woken`, run whether read or not).
            sql.push_str(&format!(
                "WITH picked AS (
                SELECT id, due_at AS was_due, machine, state, run_status AS was_status FROM entities
                WHERE due_at <= $1 AND (cardinality($5::text[]) = 0 OR machine = ANY($5::text[]))
                ORDER BY due_at LIMIT $4 FOR UPDATE SKIP LOCKED),
             woken AS ({}),
             claimed AS (
                UPDATE entities e SET lease_owner = $2, lease_until = $3, due_at = $3, sleep_until = NULL,
                    run_status = CASE WHEN run_status IN ('sleeping', 'fault') THEN 'active' ELSE run_status END
                FROM picked p WHERE e.id = p.id
                RETURNING p.was_due, {}),
             tail AS (SELECT ",
                add_counts!(
                    "SELECT machine, state, was_status, -1 FROM picked WHERE was_status IN ('sleeping', 'fault')
                     UNION ALL
                     SELECT machine, state, 'active', 1 FROM picked WHERE was_status IN ('sleeping', 'fault')"
                ),
                ENTITY_COLS.split(", ").map(|c| format!("e.{c}")).collect::<Vec<_>>().join(", ")
            ));
            params.extend([
                one(f.now),
                one(claim.owner.clone()),
                one(f.now + claim.lease_ms),
                one(claim.limit as i64),
                col(claim.machines.clone()),
            ]);
            // The statement sees the claimed rows as they were (due now): they are due
            // again when their lease ends.
            "LEAST((SELECT MIN(due_at) FROM entities
                WHERE due_at IS NOT NULL AND (cardinality($5::text[]) = 0 OR machine = ANY($5::text[]))
                  AND id NOT IN (SELECT id FROM claimed)),
               (SELECT MAX($3::bigint) FROM claimed))"
                .to_string()
        } else {
            sql.push_str("SELECT ");
            "(SELECT MIN(due_at) FROM entities WHERE due_at IS NOT NULL)".to_string()
        };
        sql.push_str(&next_entity);
        sql.push_str(", (SELECT MIN(due_at) FROM timers)");
        if f.others_due {
            let n = params.len();
            sql.push_str(&format!(", pg_notify(${}, ${})", n + 1, n + 2));
            params.extend([one(tx.channel.to_string()), one(tx.me.to_string())]);
        }
        let payloads = crate::changes::encode(tx.me, &f.changed);
        let width = sql_tail_width(f.others_due, !payloads.is_empty());
        if !payloads.is_empty() {
            let n = params.len();
            sql.push_str(&format!(
                ", (SELECT count(pg_notify(${}, payload)) FROM unnest(${}::text[]) AS payload)",
                n + 1,
                n + 2
            ));
            params.extend([one(tx.changes_channel.to_string()), col(payloads)]);
        }
        if claiming {
            sql.push_str(&format!(
                ")
             SELECT t.*, c.*, {INBOX_COLS}, v.event, v.params, v.reply FROM tail t
             LEFT JOIN claimed c ON TRUE
             LEFT JOIN LATERAL ({}) i ON TRUE
             LEFT JOIN events v ON v.id = c.event_id",
                crate::sql::inbox_head("entity_id = c.id", "TRUE")
            ));
        }
        let at = p.add(Stmt::new(sql, params));
        let rows = tx.c.send_and_commit(&p.0).map_err(|e| match e {
            CommitError::Failed(e) => Failure::Pg(e),
            CommitError::Unknown(e) => Failure::CommitUnknown(e),
        })?;
        let rows = &rows[at];
        let first =
            rows.first().ok_or_else(|| Failure::Corrupt("the batch's last statement returned no row".into()))?;
        let next: Option<Millis> = first.try_get(0)?;
        let next_timer: Option<Millis> = first.try_get(1)?;
        tx.next_timer.store(next_timer.unwrap_or(Millis::MAX), std::sync::atomic::Ordering::Relaxed);
        let mut claimed = Vec::new();
        if claiming {
            let entity_width = ENTITY_COLS.split(", ").count();
            let mut picked = Vec::with_capacity(rows.len());
            for r in rows {
                // No row claimed: the tail's one row, joined with nothing.
                let Some(was) = r.try_get::<_, Option<i64>>(width)? else { continue };
                let entity = entity_from_row_at(r, width + 1)?;
                let head_at = width + 1 + entity_width;
                let inbox_head = match r.try_get::<_, Option<i64>>(head_at)? {
                    Some(_) => Some(super::read::inbox_from_row_at(r, head_at)?),
                    None => None,
                };
                let trigger_at = head_at + INBOX_COLS.split(", ").count();
                let trigger = crate::decode::trigger(&crate::decode::At(r, trigger_at))?;
                picked.push((was, Claimed { entity, inbox_head, trigger }));
            }
            // Oldest due first, as claimed.
            picked.sort_by_key(|(was, c)| (*was, c.entity.id));
            claimed = picked.into_iter().map(|(_, c)| c).collect();
        }
        Ok((claimed, next))
    }
}

/// Columns of the finish statement's tail: the next due entity and timer, and one per
/// notification kind sent.
fn sql_tail_width(wake: bool, changes: bool) -> usize {
    2 + usize::from(wake) + usize::from(changes)
}

/// Turns due timers of active entities into inbox events (one-shot timers deleted,
/// periodic ones rescheduled), in one statement. Timers whose row or entity another
/// instance has locked are left for the next claim (it never waits for a lock, so it
/// cannot deadlock with a commit replacing that entity's timers).
fn fire_timers(now: Millis, limit: i64) -> Stmt {
    Stmt::new(
        // `due` walks the due index (a scalar subquery, which the planner cannot turn into
        // a join starting from `entities`).
        "WITH due AS MATERIALIZED (
            SELECT t.entity_id, t.name, t.event, t.due_at, t.every_ms FROM timers t
            WHERE t.due_at <= $1 AND (SELECT e.run_status FROM entities e WHERE e.id = t.entity_id) = 'active'
            ORDER BY t.due_at LIMIT $2 FOR UPDATE OF t SKIP LOCKED),
         held AS MATERIALIZED (
            SELECT e.id FROM entities e WHERE e.id IN (SELECT entity_id FROM due) AND e.run_status = 'active'
            FOR NO KEY UPDATE SKIP LOCKED),
         fired AS MATERIALIZED (SELECT d.* FROM due d WHERE d.entity_id IN (SELECT id FROM held)),
         queued AS (
            INSERT INTO inbox (entity_id, event, params, request_id, kind, created_at)
            SELECT entity_id, event, jsonb_build_object('timer', name)::text, NULL, 'timer', $1
            FROM fired ORDER BY due_at, entity_id, name),
         moved AS (
            UPDATE timers t SET due_at = GREATEST(f.due_at + f.every_ms, $1 + 1) FROM fired f
            WHERE t.entity_id = f.entity_id AND t.name = f.name AND f.every_ms > 0
            RETURNING t.entity_id, t.due_at),
         gone AS (
            DELETE FROM timers t USING fired f
            WHERE t.entity_id = f.entity_id AND t.name = f.name AND COALESCE(f.every_ms, 0) <= 0)
         UPDATE entities e SET
            timer_at = LEAST(
                (SELECT MIN(t.due_at) FROM timers t WHERE t.entity_id = e.id
                    AND NOT EXISTS (SELECT 1 FROM fired f WHERE f.entity_id = t.entity_id AND f.name = t.name)),
                (SELECT MIN(m.due_at) FROM moved m WHERE m.entity_id = e.id)),
            due_at = CASE WHEN e.lease_owner IS NOT NULL THEN e.lease_until ELSE $1 END
         WHERE e.id IN (SELECT entity_id FROM fired)",
        vec![one(now), one(limit)],
    )
}
