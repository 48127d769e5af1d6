//! Calendar schedules' progress (DESIGN §9, "Schedules"): one row of `schedules` per
//! (machine, schedule) ([`ScheduleRow`]): the next fire's instant and when it runs
//! (`next_at`, with its jitter), a fire held until the previous one ends, the last fire,
//! counts of fires fired, missed and skipped, and whether an operator paused it. The
//! engine decides what to fire (`settle_core::calendar::step`); the store keeps the row
//! under a lease, so one instance at a time decides for a schedule. A fire carries a
//! request id made from its instant, so one repeated after a crash is a replay.
//!
//! The statements are written once for both stores (`$N`; SQLite reads them as `?N`).

use crate::Millis;

/// A schedule's progress as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleRow {
    /// Its machine.
    pub machine: String,
    /// Its name.
    pub name: String,
    /// The declaration it follows (its cron, zone, …): a different one starts it afresh.
    pub spec: String,
    /// The next fire's instant.
    pub next_fire: Millis,
    /// When that fire runs (its instant plus its jitter).
    pub next_at: Millis,
    /// A fire held until the previous one ends.
    pub buffered: Option<Millis>,
    /// The instant of the last fire.
    pub last_fire: Option<Millis>,
    /// When the last fire ran.
    pub last_fired_at: Option<Millis>,
    /// Fires fired.
    pub fired: u64,
    /// Fires missed (the engine was down past a catch-up policy).
    pub missed: u64,
    /// Fires not fired because the previous one still ran.
    pub skipped: u64,
    /// Paused by an operator: nothing fires.
    pub paused: bool,
    /// The instance deciding for it, while leased.
    pub owner: Option<String>,
    /// When it last changed.
    pub updated_at: Millis,
}

impl ScheduleRow {
    /// A new schedule whose first fire is `next_fire`, run at `next_at`.
    pub fn new(
        machine: &str,
        name: &str,
        spec: String,
        next_fire: Millis,
        next_at: Millis,
        now: Millis,
    ) -> ScheduleRow {
        ScheduleRow {
            machine: machine.to_string(),
            name: name.to_string(),
            spec,
            next_fire,
            next_at,
            buffered: None,
            last_fire: None,
            last_fired_at: None,
            fired: 0,
            missed: 0,
            skipped: 0,
            paused: false,
            owner: None,
            updated_at: now,
        }
    }
}

/// What a decision for a schedule writes: [`Store::schedule_advance`](crate::Store::schedule_advance),
/// by the instance holding its lease, which it releases.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleAdvance {
    /// The machine.
    pub machine: String,
    /// The schedule.
    pub name: String,
    /// The instance holding it.
    pub owner: String,
    /// The next fire's instant.
    pub next_fire: Millis,
    /// When it runs.
    pub next_at: Millis,
    /// A fire held until the previous one ends.
    pub buffered: Option<Millis>,
    /// The last fire fired now, if any.
    pub last_fire: Option<Millis>,
    /// Fires fired now.
    pub fired: u64,
    /// Fires missed now.
    pub missed: u64,
    /// Fires skipped now.
    pub skipped: u64,
    /// Now.
    pub now: Millis,
}

pub(crate) const COLS: &str = "machine, name, spec, next_fire, next_at, buffered, last_fire, last_fired_at, fired, missed, skipped, paused, owner, \
     updated_at";

pub(crate) fn select_all() -> String {
    format!("SELECT {COLS} FROM schedules ORDER BY machine, name")
}

pub(crate) fn select_one() -> String {
    format!("SELECT {COLS} FROM schedules WHERE machine = $1 AND name = $2")
}

/// A new schedule, or one whose declaration changed: from its first fire, its counts kept.
pub(crate) const SYNC: &str = "INSERT INTO schedules (machine, name, spec, next_fire, next_at, fired, missed, \
     skipped, paused, updated_at) VALUES ($1, $2, $3, $4, $5, 0, 0, 0, FALSE, $6) \
     ON CONFLICT (machine, name) DO UPDATE SET spec = excluded.spec, next_fire = excluded.next_fire, \
     next_at = excluded.next_at, buffered = NULL, updated_at = excluded.updated_at \
     WHERE schedules.spec <> excluded.spec";

/// Leases a schedule with something to do now (a fire due, or one held), not leased by
/// another instance (or its lease run out).
pub(crate) fn claim() -> String {
    format!(
        "UPDATE schedules SET owner = $3, lease_until = $5 \
         WHERE machine = $1 AND name = $2 AND NOT paused AND (next_at <= $4 OR buffered IS NOT NULL) \
         AND (owner IS NULL OR owner = $3 OR lease_until < $4) RETURNING {COLS}"
    )
}

/// A decision written by the lease holder, which lets go of it.
pub(crate) const ADVANCE: &str = "UPDATE schedules SET next_fire = $4, next_at = $5, buffered = $6, \
     last_fire = COALESCE($7, last_fire), last_fired_at = CASE WHEN $7 IS NULL THEN last_fired_at ELSE $11 END, \
     fired = fired + $8, missed = missed + $9, skipped = skipped + $10, updated_at = $11, owner = NULL, \
     lease_until = NULL WHERE machine = $1 AND name = $2 AND owner = $3";

/// Pauses (`$3` true) or resumes from the next fire given, dropping a held one.
pub(crate) const PAUSE: &str = "UPDATE schedules SET paused = $3, \
     next_fire = CASE WHEN $3 THEN next_fire ELSE $4 END, next_at = CASE WHEN $3 THEN next_at ELSE $5 END, \
     buffered = CASE WHEN $3 THEN buffered ELSE NULL END, updated_at = $6 WHERE machine = $1 AND name = $2";

/// Whether the fire `$1` still runs: its operation (a creating schedule's) or one of its
/// entities' (`$1/…`) has not ended, or its bulk operations (`$1/state`) still run. A row
/// answers "yes". Prefixes are compared by `substr`, not by a range or `LIKE`, which a
/// collation or a `_` in a name would bend; each side reads only what is open (the
/// partial indexes of open operations and running bulk operations).
pub(crate) const RUNNING: &str = "SELECT request_id FROM operations WHERE ended_at IS NULL \
     AND (request_id = $1 OR substr(request_id, 1, length(CAST($2 AS TEXT))) = $2) \
     UNION ALL SELECT request_id FROM bulk_operations WHERE status = 'running' \
     AND substr(request_id, 1, length(CAST($2 AS TEXT))) = $2 LIMIT 1";

/// The prefix of the request ids under fire `fire_id`.
pub(crate) fn under(fire_id: &str) -> String {
    format!("{fire_id}/")
}

/// A schedule, from `SELECT {COLS}`.
pub(crate) fn decode<C: crate::decode::Columns>(r: &C) -> Result<ScheduleRow, C::Error> {
    let count = |col| r.int(col).map(|n| n.max(0) as u64);
    Ok(ScheduleRow {
        machine: r.text(0)?,
        name: r.text(1)?,
        spec: r.text(2)?,
        next_fire: r.int(3)?,
        next_at: r.int(4)?,
        buffered: r.opt_int(5)?,
        last_fire: r.opt_int(6)?,
        last_fired_at: r.opt_int(7)?,
        fired: count(8)?,
        missed: count(9)?,
        skipped: count(10)?,
        paused: r.flag(11)?,
        owner: r.opt_text(12)?,
        updated_at: r.int(13)?,
    })
}
