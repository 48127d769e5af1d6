//! Concurrency limits (DESIGN §10): taking a slot before a limited auto action starts
//! ([`acquire`]), giving it back with the commit that ends the action ([`leave`]), and
//! handing it to the first in line in the same transaction ([`fill`]).
//!
//! Three tables hold a limit's state: `limit_slots` (per limit and key value: how many are
//! in use, of how many), `limit_holds` (who holds one) and `limit_waiters` (who waits, in
//! the order they are admitted: priority, then arrival, through an index). Every change
//! locks the slot row first (PostgreSQL: by the `INSERT … ON CONFLICT` or `UPDATE` that
//! changes it), so instances sharing a database never count past a limit; a slot is handed
//! on in the transaction that frees it, so no slot stays free while work waits for it.
//!
//! The statements are written once for both databases (`$N` parameters read alike on
//! both) and run through [`Dialect::rows`]; the rules are here. Only entities of machines
//! that declare limits ever reach them: an engine asks ([`crate::Op::Acquire`],
//! [`crate::Commit::leave_limits`]) only for those, so work without limits pays nothing.

use super::Dialect;
use crate::{Acquire, Applied, Millis, OpError};

/// A value bound to, or read from, one of these statements.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Val {
    Int(i64),
    Text(String),
    Null,
}

impl Val {
    fn int(&self) -> i64 {
        match self {
            Val::Int(n) => *n,
            other => unreachable!("an integer column, not {other:?}"),
        }
    }

    fn text(&self) -> String {
        match self {
            Val::Text(s) => s.clone(),
            other => unreachable!("a text column, not {other:?}"),
        }
    }
}

fn t(s: &str) -> Val {
    Val::Text(s.to_string())
}

/// The entity's version and lease holder (locked on PostgreSQL: `Dialect::LOCK` follows).
const FENCE: &str = "SELECT version, lease_owner FROM entities WHERE id = $1";
/// The limits whose slots an entity holds for its own action.
const HELD: &str = "SELECT name FROM limit_holds WHERE entity_id = $1 AND task_id = 0";
/// A limit's slot row for a key value, made if new, its `max` brought to the definition's;
/// locked until the transaction ends.
const SLOT: &str = "INSERT INTO limit_slots (name, key, in_use, max) VALUES ($1, $2, 0, $3)
     ON CONFLICT (name, key) DO UPDATE SET max = excluded.max RETURNING in_use, max";
const TAKE: &str = "UPDATE limit_slots SET in_use = in_use + $3 WHERE name = $1 AND key = $2";
const GIVE_BACK: &str =
    "UPDATE limit_slots SET in_use = in_use - $3 WHERE name = $1 AND key = $2 RETURNING in_use, max";
const HOLD: &str = "INSERT INTO limit_holds (entity_id, name, key, since) VALUES ($1, $2, $3, $4)";
const LEAVE_HOLDS: &str = "DELETE FROM limit_holds WHERE entity_id = $1 AND task_id = 0 RETURNING name, key";
/// The task of the entity `$1` its leaving canceled now (`$2`) while an agent held it.
const IN_FLIGHT: &str = "SELECT id, locked_until FROM agent_tasks
     WHERE entity_id = $1 AND status = 'canceled' AND finished_at = $2 AND token IS NOT NULL AND locked_until > $2
     ORDER BY id DESC LIMIT 1";
/// A slot kept by a canceled task `$5` until `$6`, its lock's end.
const TASK_HOLD: &str =
    "INSERT INTO limit_holds (entity_id, name, key, since, task_id, until) VALUES ($1, $2, $3, $4, $5, $6)";
/// The task holds of a key value whose lock ran out by `$3`: their calls are over.
const EXPIRED: &str = "DELETE FROM limit_holds WHERE name = $1 AND key = $2 AND task_id <> 0 AND until <= $3
     RETURNING entity_id";
/// The entity's canceled task still holding a slot of limit `$2`: when its lock runs out.
const OWN_CALL: &str = "SELECT until FROM limit_holds WHERE entity_id = $1 AND name = $2 AND task_id <> 0";
/// The slots task `$1` kept, given up (its agent answered).
const TASK_DONE: &str = "DELETE FROM limit_holds WHERE task_id = $1 RETURNING entity_id, name, key";
const WAITING_FOR: &str = "SELECT name, key FROM limit_waiters WHERE entity_id = $1";
const WAIT: &str = "INSERT INTO limit_waiters (entity_id, name, key, priority, since) VALUES ($1, $2, $3, $4, $5)";
const UNWAIT: &str = "DELETE FROM limit_waiters WHERE entity_id = $1";
/// The first `$3` in line for a slot of limit `$1`, key value `$2`.
const FIRST: &str = "SELECT seq, entity_id FROM limit_waiters WHERE name = $1 AND key = $2
     ORDER BY priority DESC, seq LIMIT $3";
const ADMITTED: &str = "DELETE FROM limit_waiters WHERE seq = $1";
/// An entity becomes due at `$2` (an admitted one: now), unless a lease holder has it (it
/// goes on when its lease is dropped), it does not run, or it is due sooner.
const DUE: &str = "UPDATE entities SET due_at = $2
     WHERE id = $1 AND lease_owner IS NULL AND run_status = 'active' AND (due_at IS NULL OR due_at > $2)";
/// A waiting entity's lease is dropped: it is due again when admitted, at once if events
/// wait in its inbox (they run while it waits), when a timer of its fires, or at `$3` (its
/// own canceled call's lock runs out; null: never).
const PARK: &str = "UPDATE entities SET lease_owner = NULL, lease_until = NULL,
     due_at = CASE WHEN EXISTS (SELECT 1 FROM inbox WHERE entity_id = $1) THEN $2
                   WHEN CAST($3 AS BIGINT) IS NOT NULL AND (timer_at IS NULL OR timer_at > $3) THEN $3
                   ELSE timer_at END
     WHERE id = $1 RETURNING due_at";

/// Applies an [`Acquire`]: every slot asked for is held, or the entity waits in line for
/// the first that is not free (keeping those it took) and its lease is dropped. An entity
/// whose previous call of a limit is still in flight (its task canceled while an agent held
/// it) waits for that call's lock to run out, out of line. Answers whether it left an
/// entity due now (an admitted waiter, or the waiting one with events).
pub(crate) fn acquire<D: Dialect>(
    d: &mut D,
    now: Millis,
    a: &Acquire,
) -> Result<(Result<Applied, OpError>, bool), D::Error> {
    let id = a.fence.entity_id;
    let fence = d.rows(&format!("{FENCE}{}", D::LOCK), &[Val::Int(id)])?;
    let fenced =
        fence.first().is_some_and(|r| r[0] == Val::Int(a.fence.version) && r[1] == Val::Text(a.fence.owner.clone()));
    if !fenced {
        return Ok((Err(OpError::LeaseLost { entity_id: id }), false));
    }
    let mut held: Vec<String> = d.rows(HELD, &[Val::Int(id)])?.iter().map(|r| r[0].text()).collect();
    let mut asks: Vec<&crate::SlotAsk> = a.slots.iter().collect();
    asks.sort_by(|x, y| x.limit.cmp(&y.limit));
    let mut due_now = false;
    for ask in asks {
        let slot = d.rows(SLOT, &[t(&ask.limit), t(&ask.key), Val::Int(i64::from(ask.max))])?;
        let in_use = expire(d, now, &ask.limit, &ask.key, slot[0][0].int())?;
        let max = slot[0][1].int();
        // Room made by raising the limit, or by calls whose lock ran out, goes to those in
        // line first.
        let admitted = fill(d, now, &ask.limit, &ask.key, in_use, max)?;
        due_now |= admitted.iter().any(|e| *e != id);
        if admitted.contains(&id) {
            held.push(ask.limit.clone());
        }
        if held.contains(&ask.limit) {
            continue;
        }
        let waiting = || Applied::Waiting { limit: ask.limit.clone(), key: ask.key.clone() };
        if let Some(own) = d.rows(OWN_CALL, &[Val::Int(id), t(&ask.limit)])?.first() {
            // Its previous call is still in flight: not a second one beside it.
            let parked = d.rows(PARK, &[Val::Int(id), Val::Int(now), own[0].clone()])?;
            due_now |= parked.first().is_some_and(|r| matches!(r[0], Val::Int(at) if at <= now));
            return Ok((Ok(waiting()), due_now));
        }
        if in_use + (admitted.len() as i64) < max {
            d.rows(TAKE, &[t(&ask.limit), t(&ask.key), Val::Int(1)])?;
            d.rows(HOLD, &[Val::Int(id), t(&ask.limit), t(&ask.key), Val::Int(now)])?;
            held.push(ask.limit.clone());
            continue;
        }
        // Every slot is taken: wait in line, keeping a place held already.
        let waits = d.rows(WAITING_FOR, &[Val::Int(id)])?;
        if waits.first().is_none_or(|w| w[0].text() != ask.limit || w[1].text() != ask.key) {
            d.rows(UNWAIT, &[Val::Int(id)])?;
            d.rows(WAIT, &[Val::Int(id), t(&ask.limit), t(&ask.key), Val::Int(a.priority), Val::Int(now)])?;
        }
        let parked = d.rows(PARK, &[Val::Int(id), Val::Int(now), Val::Null])?;
        due_now |= parked.first().is_some_and(|r| matches!(r[0], Val::Int(at) if at <= now));
        return Ok((Ok(waiting()), due_now));
    }
    d.rows(UNWAIT, &[Val::Int(id)])?;
    Ok((Ok(Applied::Acquired), due_now))
}

/// The entity `id` leaves its limits (its action ended, or it stopped): its place in a line
/// is given up, and its slots are given back and handed to the first in line — unless its
/// leaving canceled an agent's task that an agent held: that call is still in flight, so the
/// task keeps the slots until its agent answers ([`task_answered`]) or its lock runs out
/// (then the first in line is woken to take them). Answers whether an entity is due now.
pub(crate) fn leave<D: Dialect>(d: &mut D, now: Millis, id: i64) -> Result<bool, D::Error> {
    d.rows(UNWAIT, &[Val::Int(id)])?;
    let mut holds: Vec<(String, String)> =
        d.rows(LEAVE_HOLDS, &[Val::Int(id)])?.iter().map(|r| (r[0].text(), r[1].text())).collect();
    if holds.is_empty() {
        return Ok(false);
    }
    // In name order, as they are taken: two instances lock slot rows in the same order.
    holds.sort();
    if let Some(call) = d.rows(IN_FLIGHT, &[Val::Int(id), Val::Int(now)])?.first() {
        let (task, until) = (call[0].int(), call[1].int());
        for (name, key) in &holds {
            d.rows(TASK_HOLD, &[Val::Int(id), t(name), t(key), Val::Int(now), Val::Int(task), Val::Int(until)])?;
            // Whoever is first in line looks again when the call's lock runs out.
            if let Some(first) = d.rows(FIRST, &[t(name), t(key), Val::Int(1)])?.first() {
                d.rows(DUE, &[first[1].clone(), Val::Int(until)])?;
            }
        }
        return Ok(false);
    }
    let mut due_now = false;
    for (name, key) in holds {
        due_now |= give_back(d, now, &name, &key, 1)?;
    }
    Ok(due_now)
}

/// An agent answered task `task` after it was canceled (its report or heartbeat refused):
/// its call is over, so the slots it kept go back, to the first in line, and its entity is
/// due now (it may be waiting for that call). Answers whether an entity is due now.
pub(crate) fn task_answered<D: Dialect>(d: &mut D, now: Millis, task: i64) -> Result<bool, D::Error> {
    let mut kept: Vec<(i64, String, String)> =
        d.rows(TASK_DONE, &[Val::Int(task)])?.iter().map(|r| (r[0].int(), r[1].text(), r[2].text())).collect();
    kept.sort_by(|a, b| (&a.1, &a.2).cmp(&(&b.1, &b.2)));
    let due_now = !kept.is_empty();
    for (entity, name, key) in kept {
        give_back(d, now, &name, &key, 1)?;
        d.rows(DUE, &[Val::Int(entity), Val::Int(now)])?;
    }
    Ok(due_now)
}

/// Gives `n` slots of limit `name`, key value `key` back and hands them on; answers whether
/// an admitted entity is due now.
fn give_back<D: Dialect>(d: &mut D, now: Millis, name: &str, key: &str, n: i64) -> Result<bool, D::Error> {
    let slot = d.rows(GIVE_BACK, &[t(name), t(key), Val::Int(n)])?;
    let Some(row) = slot.first() else { return Ok(false) };
    let in_use = expire(d, now, name, key, row[0].int())?;
    Ok(!fill(d, now, name, key, in_use, row[1].int())?.is_empty())
}

/// Gives back the slots of limit `name`, key value `key` whose canceled tasks' locks ran
/// out by `now`; answers the slots in use after (`in_use` before).
fn expire<D: Dialect>(d: &mut D, now: Millis, name: &str, key: &str, in_use: i64) -> Result<i64, D::Error> {
    let gone = d.rows(EXPIRED, &[t(name), t(key), Val::Int(now)])?.len() as i64;
    if gone > 0 {
        d.rows(GIVE_BACK, &[t(name), t(key), Val::Int(gone)])?;
    }
    Ok(in_use - gone)
}

/// Work of the entity `$1` in flight at an agent: a task offered or leased.
const AT_AN_AGENT: &str = "SELECT id FROM agent_tasks WHERE entity_id = $1 AND status IN ('ready', 'leased')";

/// The entity `id` was stopped (paused, put to sleep) with no engine's lease on it: it
/// leaves its limits unless an agent's task of it is out — that call is in flight, and its
/// slot goes back with the commit of its report.
pub(crate) fn stopped<D: Dialect>(d: &mut D, now: Millis, id: i64) -> Result<bool, D::Error> {
    if !d.rows(AT_AN_AGENT, &[Val::Int(id)])?.is_empty() {
        return Ok(false);
    }
    leave(d, now, id)
}

/// Hands the free slots of limit `name`, key value `key` (`in_use` of `max` taken, its row
/// locked) to the first in line: each gets its slot and becomes due now. Answers the
/// entities admitted.
fn fill<D: Dialect>(
    d: &mut D,
    now: Millis,
    name: &str,
    key: &str,
    in_use: i64,
    max: i64,
) -> Result<Vec<i64>, D::Error> {
    if in_use >= max {
        return Ok(Vec::new());
    }
    let first = d.rows(FIRST, &[t(name), t(key), Val::Int(max - in_use)])?;
    let mut admitted = Vec::with_capacity(first.len());
    for row in &first {
        let (seq, entity) = (row[0].int(), row[1].int());
        d.rows(ADMITTED, &[Val::Int(seq)])?;
        d.rows(HOLD, &[Val::Int(entity), t(name), t(key), Val::Int(now)])?;
        d.rows(DUE, &[Val::Int(entity), Val::Int(now)])?;
        admitted.push(entity);
    }
    if !admitted.is_empty() {
        d.rows(TAKE, &[t(name), t(key), Val::Int(admitted.len() as i64)])?;
    }
    Ok(admitted)
}
