//! What the limits look like now (DESIGN §10): per limit and key value, the slots in use,
//! the work waiting and the rate's next start ([`Store::limit_list`](crate::Store::limit_list)), and
//! where one entity stands ([`Store::limit_of`](crate::Store::limit_of)). The rows change in
//! the batch plan (`plan/limits.rs`); these are the reads, one statement each for both
//! databases.

use crate::Millis;
use crate::decode::Columns;

/// One key value of a limit, now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitUsage {
    /// The limit's name.
    pub limit: String,
    /// The key value (`""`: the limit has no key).
    pub key: String,
    /// Slots held.
    pub in_use: u64,
    /// How many may be held at once (as the newest definition to take one declared it;
    /// `None`: a limit of rate only).
    pub max: Option<u64>,
    /// Entities waiting in line.
    pub waiting: u64,
    /// Its rate: the least time between two starts, in microseconds (`None`: no rate).
    pub spacing_us: Option<u64>,
    /// With a rate, the millisecond the next start may be in (in the past: one may start
    /// now).
    pub next_start_at: Option<Millis>,
}

/// Where an entity stands with a limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntityLimit {
    /// The limit's name.
    pub limit: String,
    /// The entity's key value.
    pub key: String,
    /// Its place in line, from 1, as the line would be admitted if nothing joined it
    /// (round-robin across fairness values; `None`: it holds a slot).
    pub place: Option<u64>,
    /// Slots of this key value held.
    pub in_use: u64,
    /// How many may be held at once (`None`: a limit of rate only).
    pub max: Option<u64>,
    /// With a rate, the least time between two starts, in microseconds.
    pub spacing_us: Option<u64>,
    /// With a rate, the earliest time the next start may be (as [`LimitUsage`]).
    pub next_start_at: Option<Millis>,
}

/// Every limit's key values with slots in use or work waiting, by limit and key.
pub(crate) const LIST: &str = "SELECT s.name, s.key, s.in_use, s.max,
        (SELECT COUNT(*) FROM limit_waiters w WHERE w.name = s.name AND w.key = s.key), s.spacing_us, s.next_us
     FROM limit_slots s WHERE s.in_use > 0 OR EXISTS (SELECT 1 FROM limit_waiters w WHERE w.name = s.name AND w.key = s.key)
     ORDER BY s.name, s.key";

/// The slots entity `$1` holds (place 0) and the line it waits in. Its place: it is the
/// `rank`-th of its fairness value (by priority, then arrival), admitted in round
/// `turn + rank - 1`; before it go, of each other value `g`, those of its rounds before that
/// one (or the same round, for a value ordered before its own).
pub(crate) const OF_ENTITY: &str = "SELECT h.name, h.key, 0, s.in_use, s.max, s.next_us, s.spacing_us
     FROM limit_holds h JOIN limit_slots s ON s.name = h.name AND s.key = h.key WHERE h.entity_id = $1
     UNION ALL
     SELECT m.name, m.key,
        m.rank + CAST(COALESCE((SELECT SUM(CASE
            WHEN m.turn + m.rank - 1 - g.turn + (CASE WHEN g.fair < m.fair THEN 1 ELSE 0 END) <= 0 THEN 0
            WHEN m.turn + m.rank - 1 - g.turn + (CASE WHEN g.fair < m.fair THEN 1 ELSE 0 END) >= g.waiting
              THEN g.waiting
            ELSE m.turn + m.rank - 1 - g.turn + (CASE WHEN g.fair < m.fair THEN 1 ELSE 0 END) END)
          FROM limit_fair g WHERE g.name = m.name AND g.key = m.key AND g.fair <> m.fair AND g.waiting > 0), 0) AS BIGINT),
        s.in_use, s.max, s.next_us, s.spacing_us
     FROM (SELECT w.name, w.key, w.fair, f.turn,
             (SELECT COUNT(*) FROM limit_waiters o WHERE o.name = w.name AND o.key = w.key AND o.fair = w.fair
                AND (o.priority > w.priority OR (o.priority = w.priority AND o.seq <= w.seq))) AS rank
           FROM limit_waiters w JOIN limit_fair f ON f.name = w.name AND f.key = w.key AND f.fair = w.fair
           WHERE w.entity_id = $1) m
     JOIN limit_slots s ON s.name = m.name AND s.key = m.key";

/// The millisecond the next start a rate allows falls in, from `next_us` (none without a
/// rate).
fn next_start(next_us: i64, spacing_us: Option<i64>) -> Option<Millis> {
    spacing_us.map(|_| next_us.div_euclid(1_000))
}

pub(crate) fn decode_usage<C: Columns>(r: &C) -> Result<LimitUsage, C::Error> {
    let spacing = r.opt_int(5)?;
    Ok(LimitUsage {
        limit: r.text(0)?,
        key: r.text(1)?,
        in_use: r.int(2)?.max(0) as u64,
        max: r.opt_int(3)?.map(|m| m.max(0) as u64),
        waiting: r.int(4)? as u64,
        spacing_us: spacing.map(|s| s.max(0) as u64),
        next_start_at: next_start(r.int(6)?, spacing),
    })
}

pub(crate) fn decode_entity<C: Columns>(r: &C) -> Result<EntityLimit, C::Error> {
    let place = r.int(2)?;
    Ok(EntityLimit {
        limit: r.text(0)?,
        key: r.text(1)?,
        place: (place > 0).then_some(place as u64),
        in_use: r.int(3)?.max(0) as u64,
        max: r.opt_int(4)?.map(|m| m.max(0) as u64),
        spacing_us: r.opt_int(6)?.map(|s| s.max(0) as u64),
        next_start_at: next_start(r.int(5)?, r.opt_int(6)?),
    })
}
