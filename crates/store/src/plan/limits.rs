//! Limits (DESIGN §10): taking a slot, and a start of the rate, before a limited auto
//! action starts ([`acquire`]), giving the slot back with the commit that ends the action
//! ([`leave`]), and handing it to the next in line in the same transaction ([`fill`]).
//!
//! Four tables hold a limit's state: `limit_slots` (per limit and key value: how many are
//! in use, of how many; the rate's next start; the round of the line), `limit_holds` (who
//! holds one), `limit_waiters` (who waits) and `limit_fair` (the line's fairness values,
//! each with its turn). A line is admitted round-robin across its fairness values (the
//! value of the limit's `fair_by`; one value without it): the value with the lowest turn
//! goes next, its first by priority then arrival, and its turn moves one round on; a value
//! that starts waiting takes the current round, so it waits at most one round. Both are
//! found through indexes, not scans. A rate spaces starts evenly (`per / rate` apart): a line
//! held only by its rate has its next woken when the rate allows.
//!
//! Every change locks the slot row first (PostgreSQL: by the `INSERT … ON CONFLICT` or
//! `UPDATE` that changes it), so instances sharing a database never count past a limit; a
//! slot is handed on in the transaction that frees it, so no slot stays free while work
//! waits for it.
//!
//! The statements are written once for both databases (`$N` parameters read alike on
//! both) and run through [`Dialect::rows`]; the rules are here. Only entities of machines
//! that declare limits ever reach them: an engine asks ([`crate::Op::Acquire`],
//! [`crate::Commit::acquire`], [`crate::Commit::leave_limits`]) only for those, so work
//! without limits pays nothing. A wait and an admission are each recorded in the entity's
//! history (a row of kind `limit`, so in the change feed); a slot taken at once is not.

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

/// The entity's version, lease holder and run status (locked on PostgreSQL: `Dialect::LOCK`
/// follows).
const FENCE: &str = "SELECT version, lease_owner, run_status FROM entities WHERE id = $1";
/// An entity paused, put to sleep or failed while its engine held it is let go: due at the
/// end of its sleep, else not until resumed.
const LET_GO: &str = "UPDATE entities SET lease_owner = NULL, lease_until = NULL,
     due_at = CASE WHEN run_status = 'sleeping' THEN sleep_until ELSE NULL END WHERE id = $1";
/// The limits whose slots an entity holds for its own action (0), and the line it waits in
/// (1).
const MINE: &str = "SELECT name, key, 0 FROM limit_holds WHERE entity_id = $1 AND task_id = 0
     UNION ALL SELECT name, key, 1 FROM limit_waiters WHERE entity_id = $1";
/// A limit's slot row for a key value, made if new, its terms brought to the definition's;
/// locked until the transaction ends.
const SLOT: &str = "INSERT INTO limit_slots (name, key, in_use, max, spacing_us) VALUES ($1, $2, 0, $3, $4)
     ON CONFLICT (name, key) DO UPDATE SET max = excluded.max, spacing_us = excluded.spacing_us
     RETURNING in_use, max, spacing_us, next_us, round, waiting, task_holds";
/// A slot taken at once where nothing stands in the way: the row exists with the
/// definition's terms (`$3`, `$4`), nobody waits, no canceled task keeps a slot, one is
/// free and the rate lets one start now (`$5`); the rate's next start moves on. No row: the
/// full path decides ([`SLOT`]).
const TAKE: &str = "UPDATE limit_slots SET in_use = in_use + 1,
        next_us = CASE WHEN spacing_us IS NULL THEN next_us
                       WHEN next_us > CAST($5 AS BIGINT) * 1000 THEN next_us + spacing_us
                       ELSE CAST($5 AS BIGINT) * 1000 + spacing_us END
     WHERE name = $1 AND key = $2 AND max IS NOT DISTINCT FROM CAST($3 AS BIGINT)
       AND spacing_us IS NOT DISTINCT FROM CAST($4 AS BIGINT) AND waiting = 0 AND task_holds = 0
       AND (max IS NULL OR in_use < max) AND (spacing_us IS NULL OR next_us / 1000 <= CAST($5 AS BIGINT))
     RETURNING in_use";
/// `$3` slots given back, `$4` of them kept by canceled tasks (the row locked until the
/// transaction ends).
const GIVE_BACK: &str = "UPDATE limit_slots SET in_use = in_use - $3, task_holds = task_holds - $4
     WHERE name = $1 AND key = $2 RETURNING in_use, max, spacing_us, next_us, round, waiting, task_holds";
/// One fewer in line (the row locked until the transaction ends).
const UNWAITED: &str = "UPDATE limit_slots SET waiting = waiting - 1 WHERE name = $1 AND key = $2
     RETURNING in_use, max, spacing_us, next_us, round, waiting, task_holds";
/// One more slot kept by a canceled task.
const TASK_KEPT: &str = "UPDATE limit_slots SET task_holds = task_holds + 1 WHERE name = $1 AND key = $2";
const SAVE: &str = "UPDATE limit_slots SET in_use = $3, next_us = $4, round = $5, waiting = $6, task_holds = $7
     WHERE name = $1 AND key = $2";
/// A slot held by the entity `$1`, for its auto action or (`$5` 1) its workflow.
const HOLD: &str = "INSERT INTO limit_holds (entity_id, name, key, since, workflow) VALUES ($1, $2, $3, $4, $5)";
/// The slots the entity holds for its auto action.
const LEAVE_HOLDS: &str =
    "DELETE FROM limit_holds WHERE entity_id = $1 AND task_id = 0 AND workflow = 0 RETURNING name, key";
/// The slots the entity holds for its workflow.
const LEAVE_WORKFLOWS: &str = "DELETE FROM limit_holds WHERE entity_id = $1 AND workflow = 1 RETURNING name, key";
/// The slots the entity holds for a workflow it has not started: it is at rest (admitted,
/// its event not run yet).
const LEAVE_UNSTARTED: &str = "DELETE FROM limit_holds WHERE entity_id = $1 AND workflow = 1
     AND EXISTS (SELECT 1 FROM entities WHERE id = $1 AND event_id IS NULL) RETURNING name, key";
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
/// The priority of the request entity `$1` works for (its workflow's).
const REQUEST_PRIORITY: &str =
    "SELECT o.priority FROM entities e JOIN operations o ON o.request_id = e.request_id WHERE e.id = $1";
/// The priority of request `$1` (a queued event's).
const PRIORITY_OF: &str = "SELECT priority FROM operations WHERE request_id = $1";
const WAIT: &str = "INSERT INTO limit_waiters (entity_id, name, key, priority, since, fair, workflow)
     VALUES ($1, $2, $3, $4, $5, $6, $7)";
/// One more waiting of a fairness value; a value that had none waiting takes its turn no
/// earlier than the current round `$4` (so it is admitted within one round).
const FAIR_JOIN: &str = "INSERT INTO limit_fair (name, key, fair, turn, waiting) VALUES ($1, $2, $3, $4, 1)
     ON CONFLICT (name, key, fair) DO UPDATE SET waiting = limit_fair.waiting + 1,
        turn = CASE WHEN limit_fair.waiting = 0 AND limit_fair.turn < $4 THEN $4 ELSE limit_fair.turn END";
/// One fewer waiting of a fairness value, its turn moved on by `$4` (1: it was admitted).
const FAIR_LEAVE: &str =
    "UPDATE limit_fair SET waiting = waiting - 1, turn = turn + $4 WHERE name = $1 AND key = $2 AND fair = $3";
const UNWAIT: &str = "DELETE FROM limit_waiters WHERE entity_id = $1 RETURNING name, key, fair";
/// The fairness value of a line whose turn is next: the lowest turn, through its index.
const NEXT_FAIR: &str = "SELECT fair, turn FROM limit_fair WHERE name = $1 AND key = $2 AND waiting > 0
     ORDER BY turn, fair LIMIT 1";
/// The first in line of a fairness value: by priority, then arrival.
const FIRST: &str =
    "SELECT seq, entity_id, since, workflow FROM limit_waiters WHERE name = $1 AND key = $2 AND fair = $3
     ORDER BY priority DESC, seq LIMIT 1";
/// What an entity's history row records of it: its state, version of its definition, and
/// the request it works for.
const NOTED: &str = "SELECT state, machine_hash, request_id FROM entities WHERE id = $1";
const ADMITTED: &str = "DELETE FROM limit_waiters WHERE seq = $1";
/// An entity becomes due at `$2` (an admitted one: now), unless a lease holder has it (it
/// goes on when its lease is dropped), it does not run (a fault's backoff ended: it asked),
/// or it is due sooner.
const DUE: &str = "UPDATE entities SET due_at = $2
     WHERE id = $1 AND lease_owner IS NULL AND run_status IN ('active', 'fault') AND (due_at IS NULL OR due_at > $2)";
/// A waiting entity's lease is dropped: it is due again when admitted, at once if events
/// wait in its inbox (they run while its action waits; not while its workflow does, `$4`
/// 1: they wait behind the event that starts it), when a timer of its fires, or at `$3`
/// (its own canceled call's lock runs out; null: never).
const PARK: &str = "UPDATE entities SET lease_owner = NULL, lease_until = NULL,
     due_at = CASE WHEN CAST($4 AS BIGINT) = 0 AND EXISTS (SELECT 1 FROM inbox WHERE entity_id = $1) THEN $2
                   WHEN CAST($3 AS BIGINT) IS NOT NULL AND (timer_at IS NULL OR timer_at > $3) THEN $3
                   ELSE timer_at END
     WHERE id = $1 RETURNING due_at";

/// A limit's slot row for one key value, read under its lock and written back ([`SAVE`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Slot {
    in_use: i64,
    /// `None`: a limit of rate only.
    max: Option<i64>,
    /// The least time between two starts (`None`: no rate).
    spacing_us: Option<i64>,
    /// The earliest time the next start may be.
    next_us: i64,
    /// The turn of the fairness value admitted last.
    round: i64,
    /// How many wait in its line (`limit_waiters` rows): none, and nothing is looked up.
    waiting: i64,
    /// How many of its slots canceled tasks keep (`limit_holds` rows with a task).
    task_holds: i64,
}

impl Slot {
    fn read(row: &[Val]) -> Slot {
        let opt = |v: &Val| match v {
            Val::Null => None,
            v => Some(v.int()),
        };
        Slot {
            in_use: row[0].int(),
            max: opt(&row[1]),
            spacing_us: opt(&row[2]),
            next_us: row[3].int(),
            round: row[4].int(),
            waiting: row[5].int(),
            task_holds: row[6].int(),
        }
    }

    /// Whether a slot is free (of `max`).
    fn free(&self) -> bool {
        self.max.is_none_or(|m| self.in_use < m)
    }

    /// When the rate lets the next start happen, in milliseconds, if later than `now`. The
    /// clock counts milliseconds: a start whose time under the rate falls within the current
    /// millisecond may happen now, and takes that time (so starts spaced by the rate fall in
    /// the milliseconds they are counted in, and no window of `per` sees more than `rate`).
    fn rate_wait(&self, now: Millis) -> Option<Millis> {
        self.spacing_us?;
        let at = self.next_us.div_euclid(1_000);
        (at > now).then_some(at)
    }

    /// Whether one more may start now.
    fn room(&self, now: Millis) -> bool {
        self.free() && self.rate_wait(now).is_none()
    }

    /// One more starts now (at the rate's next start, if that is later within this
    /// millisecond): a slot taken, and the rate's next start moved on.
    fn take(&mut self, now: Millis) {
        self.in_use += 1;
        if let Some(spacing) = self.spacing_us {
            self.next_us = self.next_us.max(now.saturating_mul(1_000)).saturating_add(spacing);
        }
    }

    /// Writes it back, if it changed since `read`.
    fn save<D: Dialect>(&self, d: &mut D, name: &str, key: &str, read: &Slot) -> Result<(), D::Error> {
        if self != read {
            let v = [self.in_use, self.next_us, self.round, self.waiting, self.task_holds].map(Val::Int);
            let [a, b, c, e, f] = v;
            d.rows(SAVE, &[t(name), t(key), a, b, c, e, f])?;
        }
        Ok(())
    }
}

fn opt_int(n: Option<i64>) -> Val {
    n.map_or(Val::Null, Val::Int)
}

/// Applies an [`Acquire`]: every slot asked for is held, or the entity waits in line for
/// the first that is not free or whose rate lets nothing start now (keeping those it took)
/// and its lease is dropped. An entity whose previous call of a limit is still in flight
/// (its task canceled while an agent held it) waits for that call's lock to run out, out of
/// line. An entity paused or put to sleep meanwhile takes nothing: it leaves its limits and
/// is let go ([`Applied::Released`]). Answers whether it left an entity due now (an
/// admitted waiter, or the waiting one with events).
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
    if !matches!(&fence[0][2], Val::Text(s) if s == "active" || s == "fault") {
        // Paused (or put to sleep) while its engine held it: it starts nothing, and leaves
        // its limits as a stopped entity does.
        let due_now = stopped(d, now, id)?;
        d.rows(LET_GO, &[Val::Int(id)])?;
        return Ok((Ok(Applied::Released), due_now));
    }
    let (answer, due_now) = take_or_wait(d, now, a)?;
    Ok((Ok(answer), due_now))
}

/// [`acquire`] of an entity fenced and active in this transaction (a commit of it kept its
/// lease, its row locked), so neither is looked up again: takes its slots (answering
/// [`Applied::Acquired`]) or puts it in line ([`Applied::Waiting`]).
pub(crate) fn take_or_wait<D: Dialect>(d: &mut D, now: Millis, a: &Acquire) -> Result<(Applied, bool), D::Error> {
    let id = a.fence.entity_id;
    let mine = d.rows(MINE, &[Val::Int(id)])?;
    let mut held: Vec<String> = mine.iter().filter(|r| r[2] == Val::Int(0)).map(|r| r[0].text()).collect();
    let line = mine.iter().find(|r| r[2] == Val::Int(1)).map(|r| (r[0].text(), r[1].text()));
    let mut asks: Vec<&crate::SlotAsk> = a.slots.iter().collect();
    asks.sort_by(|x, y| x.limit.cmp(&y.limit));
    let mut due_now = false;
    let workflow = Val::Int(i64::from(a.workflow));
    for ask in asks {
        let (name, key) = (ask.limit.as_str(), ask.key.as_str());
        let max = ask.max.map(i64::from);
        let spacing = ask.rate.map(crate::Rate::spacing_us);
        if !held.contains(&ask.limit)
            && !d.rows(TAKE, &[t(name), t(key), opt_int(max), opt_int(spacing), Val::Int(now)])?.is_empty()
        {
            // Free, nobody in line: taken without reading the row first.
            d.rows(HOLD, &[Val::Int(id), t(name), t(key), Val::Int(now), workflow.clone()])?;
            held.push(ask.limit.clone());
            continue;
        }
        let row = d.rows(SLOT, &[t(name), t(key), opt_int(max), opt_int(spacing)])?;
        let read = Slot::read(&row[0]);
        let mut slot = read;
        expire(d, now, name, key, &mut slot)?;
        // Room made by raising the limit, by calls whose lock ran out, or by time (a rate)
        // goes to those in line first.
        let admitted = fill(d, now, name, key, &mut slot)?;
        due_now |= admitted.iter().any(|e| *e != id);
        if admitted.contains(&id) {
            held.push(ask.limit.clone());
        }
        if held.contains(&ask.limit) {
            slot.save(d, name, key, &read)?;
            continue;
        }
        let waiting = || Applied::Waiting { limit: ask.limit.clone(), key: ask.key.clone() };
        let own = if slot.task_holds > 0 { d.rows(OWN_CALL, &[Val::Int(id), t(name)])? } else { Vec::new() };
        if let Some(own) = own.first() {
            // Its previous call is still in flight: not a second one beside it.
            slot.save(d, name, key, &read)?;
            let parked = d.rows(PARK, &[Val::Int(id), Val::Int(now), own[0].clone(), workflow])?;
            due_now |= parked.first().is_some_and(|r| matches!(r[0], Val::Int(at) if at <= now));
            return Ok((waiting(), due_now));
        }
        if slot.room(now) {
            slot.take(now);
            slot.save(d, name, key, &read)?;
            d.rows(HOLD, &[Val::Int(id), t(name), t(key), Val::Int(now), workflow.clone()])?;
            held.push(ask.limit.clone());
            continue;
        }
        // No room: wait in line, keeping a place held already.
        if line.as_ref().is_none_or(|(n, k)| n != name || k != key) {
            if line.is_some() {
                unwait(d, now, id)?;
            }
            slot.waiting += 1;
            let priority = match (a.priority, &a.request_id) {
                (Some(p), _) => Some(p),
                (None, Some(request)) => d.rows(PRIORITY_OF, &[t(request)])?.first().map(|r| r[0].int()),
                (None, None) => d.rows(REQUEST_PRIORITY, &[Val::Int(id)])?.first().map(|r| r[0].int()),
            };
            let priority = Val::Int(priority.unwrap_or(0));
            let at = [Val::Int(id), t(name), t(key), priority, Val::Int(now), t(&ask.fair), workflow.clone()];
            d.rows(WAIT, &at)?;
            d.rows(FAIR_JOIN, &[t(name), t(key), t(&ask.fair), Val::Int(slot.round)])?;
            let why = if slot.free() {
                "its rate".to_string()
            } else {
                format!("{} of {} in use", slot.in_use, slot.max.unwrap_or(0))
            };
            note(d, now, id, format!("waiting for `{name}`{}: {why}", of_key(key)))?;
        }
        slot.save(d, name, key, &read)?;
        let parked = d.rows(PARK, &[Val::Int(id), Val::Int(now), Val::Null, workflow])?;
        due_now |= parked.first().is_some_and(|r| matches!(r[0], Val::Int(at) if at <= now));
        wake_for_rate(d, now, name, key, &slot)?;
        return Ok((waiting(), due_now));
    }
    if line.is_some() {
        unwait(d, now, id)?;
    }
    Ok((Applied::Acquired, due_now))
}

/// The entity `id` gives up its place in line, if it has one (the line's slot row locked
/// first, as every change of a line does). Were it the next, woken for the rate, the one
/// after it is woken instead.
fn unwait<D: Dialect>(d: &mut D, now: Millis, id: i64) -> Result<(), D::Error> {
    for w in d.rows(UNWAIT, &[Val::Int(id)])? {
        let (name, key) = (w[0].text(), w[1].text());
        let slot = d.rows(UNWAITED, &[t(&name), t(&key)])?;
        d.rows(FAIR_LEAVE, &[t(&name), t(&key), w[2].clone(), Val::Int(0)])?;
        if let Some(row) = slot.first() {
            wake_for_rate(d, now, &name, &key, &Slot::read(row))?;
        }
    }
    Ok(())
}

/// The next to be admitted from a line: its place (`limit_waiters.seq`), entity, fairness
/// value and that value's turn.
struct Next {
    seq: i64,
    entity: i64,
    /// When it went into line.
    since: Millis,
    fair: Val,
    turn: i64,
    /// It waits for its workflow (1) or its auto action (0).
    workflow: Val,
}

/// The next to be admitted from the line of limit `name`, key value `key`: the first, by
/// priority then arrival, of the fairness value whose turn is lowest.
fn next_in_line<D: Dialect>(d: &mut D, name: &str, key: &str) -> Result<Option<Next>, D::Error> {
    let Some(fair) = d.rows(NEXT_FAIR, &[t(name), t(key)])?.into_iter().next() else { return Ok(None) };
    let first = d.rows(FIRST, &[t(name), t(key), fair[0].clone()])?;
    Ok(first.first().map(|w| Next {
        seq: w[0].int(),
        entity: w[1].int(),
        since: w[2].int(),
        fair: fair[0].clone(),
        turn: fair[1].int(),
        workflow: w[3].clone(),
    }))
}

/// A line that has room of slots but must wait for its rate: its next is woken when the
/// rate lets it start (it asks again then, and is admitted).
fn wake_for_rate<D: Dialect>(d: &mut D, now: Millis, name: &str, key: &str, slot: &Slot) -> Result<(), D::Error> {
    let Some(at) = slot.rate_wait(now).filter(|_| slot.free() && slot.waiting > 0) else { return Ok(()) };
    if let Some(next) = next_in_line(d, name, key)? {
        d.rows(DUE, &[Val::Int(next.entity), Val::Int(at)])?;
    }
    Ok(())
}

/// The entity `id` leaves the limits of its auto action (it ended, or the entity stopped):
/// its place in a line (of either kind) is given up, and its action's slots (not its
/// workflow's: [`leave_workflows`]) are given back and handed to the first in line — unless its
/// leaving canceled an agent's task that an agent held: that call is still in flight, so the
/// task keeps the slots until its agent answers ([`task_answered`]) or its lock runs out
/// (then the first in line is woken to take them). Answers whether an entity is due now.
///
/// `held_all`: the entity holds every slot its action asked for (so it waits in no line) and
/// its action ran in an engine (so no agent's call of it is in flight): neither is looked up.
pub(crate) fn leave<D: Dialect>(d: &mut D, now: Millis, id: i64, held_all: bool) -> Result<bool, D::Error> {
    if !held_all {
        unwait(d, now, id)?;
    }
    let mut holds: Vec<(String, String)> =
        d.rows(LEAVE_HOLDS, &[Val::Int(id)])?.iter().map(|r| (r[0].text(), r[1].text())).collect();
    if holds.is_empty() {
        return Ok(false);
    }
    // In name order, as they are taken: two instances lock slot rows in the same order.
    holds.sort();
    let call = if held_all { None } else { d.rows(IN_FLIGHT, &[Val::Int(id), Val::Int(now)])?.into_iter().next() };
    if let Some(call) = call {
        let (task, until) = (call[0].int(), call[1].int());
        for (name, key) in &holds {
            d.rows(TASK_HOLD, &[Val::Int(id), t(name), t(key), Val::Int(now), Val::Int(task), Val::Int(until)])?;
            d.rows(TASK_KEPT, &[t(name), t(key)])?;
            // Whoever is next in line looks again when the call's lock runs out.
            if let Some(next) = next_in_line(d, name, key)? {
                d.rows(DUE, &[Val::Int(next.entity), Val::Int(until)])?;
            }
        }
        return Ok(false);
    }
    let mut due_now = false;
    for (name, key) in holds {
        due_now |= give_back(d, now, &name, &key, 0)?;
    }
    Ok(due_now)
}

/// The entity `id`'s workflow ended (it came to rest, was killed, or its work was
/// canceled): the slots of limits of workflows it holds go back, to the first in line.
/// Answers whether an entity admitted is due now.
pub(crate) fn leave_workflows<D: Dialect>(d: &mut D, now: Millis, id: i64) -> Result<bool, D::Error> {
    give_back_all(d, now, LEAVE_WORKFLOWS, id)
}

/// Gives back the slots the holds `delete` deletes (returning their name and key) and hands
/// them on, in name order.
fn give_back_all<D: Dialect>(d: &mut D, now: Millis, delete: &str, id: i64) -> Result<bool, D::Error> {
    let mut holds: Vec<(String, String)> =
        d.rows(delete, &[Val::Int(id)])?.iter().map(|r| (r[0].text(), r[1].text())).collect();
    holds.sort();
    let mut due_now = false;
    for (name, key) in holds {
        due_now |= give_back(d, now, &name, &key, 0)?;
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

/// Gives a slot of limit `name`, key value `key` back (`task`: 1 if a canceled task kept
/// it, 0 if its entity held it) and hands it on; answers whether an admitted entity is due
/// now.
fn give_back<D: Dialect>(d: &mut D, now: Millis, name: &str, key: &str, task: i64) -> Result<bool, D::Error> {
    let rows = d.rows(GIVE_BACK, &[t(name), t(key), Val::Int(1), Val::Int(task)])?;
    let Some(row) = rows.first() else { return Ok(false) };
    let read = Slot::read(row);
    let mut slot = read;
    expire(d, now, name, key, &mut slot)?;
    let admitted = fill(d, now, name, key, &mut slot)?;
    slot.save(d, name, key, &read)?;
    Ok(!admitted.is_empty())
}

/// Gives back the slots of limit `name`, key value `key` whose canceled tasks' locks ran
/// out by `now` (to be saved with the slot).
fn expire<D: Dialect>(d: &mut D, now: Millis, name: &str, key: &str, slot: &mut Slot) -> Result<(), D::Error> {
    if slot.task_holds > 0 {
        let gone = d.rows(EXPIRED, &[t(name), t(key), Val::Int(now)])?.len() as i64;
        slot.in_use -= gone;
        slot.task_holds -= gone;
    }
    Ok(())
}

/// Work of the entity `$1` in flight at an agent: a task offered or leased.
const AT_AN_AGENT: &str = "SELECT id FROM agent_tasks WHERE entity_id = $1 AND status IN ('ready', 'leased')";

/// The entity `id` was stopped (paused, put to sleep) with no engine's lease on it: it
/// leaves its limits unless an agent's task of it is out — that call is in flight, and its
/// slot goes back with the commit of its report. A workflow's slot stays with a workflow
/// under way (it goes on when resumed); one admitted for a workflow not started yet goes
/// back (resumed, its event asks again).
pub(crate) fn stopped<D: Dialect>(d: &mut D, now: Millis, id: i64) -> Result<bool, D::Error> {
    if !d.rows(AT_AN_AGENT, &[Val::Int(id)])?.is_empty() {
        return Ok(false);
    }
    let action = leave(d, now, id, false)?;
    Ok(give_back_all(d, now, LEAVE_UNSTARTED, id)? || action)
}

/// Admits from the line of limit `name`, key value `key` (its row locked, read into `slot`,
/// to be saved by the caller) while there is room: each admitted takes its slot (and its
/// start of the rate), holds it, and is due now; its fairness value's turn moves one round
/// on. A line left waiting only for its rate has its next woken when the rate allows.
/// Answers the entities admitted.
fn fill<D: Dialect>(d: &mut D, now: Millis, name: &str, key: &str, slot: &mut Slot) -> Result<Vec<i64>, D::Error> {
    let mut admitted = Vec::new();
    while slot.waiting > 0 && slot.room(now) {
        let Some(next) = next_in_line(d, name, key)? else { return Ok(admitted) };
        d.rows(ADMITTED, &[Val::Int(next.seq)])?;
        slot.waiting -= 1;
        d.rows(FAIR_LEAVE, &[t(name), t(key), next.fair, Val::Int(1)])?;
        d.rows(HOLD, &[Val::Int(next.entity), t(name), t(key), Val::Int(now), next.workflow])?;
        d.rows(DUE, &[Val::Int(next.entity), Val::Int(now)])?;
        let waited = waited(now.saturating_sub(next.since));
        note(d, now, next.entity, format!("admitted by `{name}`{} after {waited} in line", of_key(key)))?;
        slot.take(now);
        slot.round = slot.round.max(next.turn);
        admitted.push(next.entity);
    }
    wake_for_rate(d, now, name, key, slot)?;
    Ok(admitted)
}

/// How long one waited in line: `250 ms`, `3.2 s`.
fn waited(ms: Millis) -> String {
    if ms < 1_000 { format!("{ms} ms") } else { format!("{:.1} s", ms as f64 / 1_000.0) }
}

/// ` (key K)` of a limit's key value, nothing for a limit without a key.
fn of_key(key: &str) -> String {
    if key.is_empty() { String::new() } else { format!(" (key {key})") }
}

/// Records in the entity's history, and so in the change feed, that a limit held it back
/// or admitted it (`detail`): a [`crate::HistoryKind::Limit`] row in its state.
fn note<D: Dialect>(d: &mut D, now: Millis, entity: i64, detail: String) -> Result<(), D::Error> {
    let Some(row) = d.rows(NOTED, &[Val::Int(entity)])?.into_iter().next() else { return Ok(()) };
    let text = |v: &Val| match v {
        Val::Text(s) => Some(s.clone()),
        _ => None,
    };
    let history = super::rows::HistoryInsert {
        entity_id: entity,
        from_state: text(&row[0]),
        kind: crate::HistoryKind::Limit.as_str(),
        request_id: text(&row[2]),
        at: now,
        detail: Some(detail),
        machine_hash: text(&row[1]),
        ..Default::default()
    };
    d.write(&super::rows::Writes { now, history: vec![history], ..Default::default() })?;
    Ok(())
}
