//! What the concurrency limits look like now (DESIGN §10): per limit and key value, the
//! slots in use and the work waiting ([`Store::limit_list`](crate::Store::limit_list)), and
//! where one entity stands ([`Store::limit_of`](crate::Store::limit_of)). The rows change in
//! the batch plan (`plan/limits.rs`); these are the reads, one statement each for both
//! databases.

use crate::decode::Columns;

/// One key value of a concurrency limit, now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitUsage {
    /// The limit's name.
    pub limit: String,
    /// The key value (`""`: the limit has no key).
    pub key: String,
    /// Slots held.
    pub in_use: u64,
    /// How many may be held at once (as the newest definition to take one declared it).
    pub max: u64,
    /// Entities waiting in line.
    pub waiting: u64,
}

/// Where an entity stands with a concurrency limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntityLimit {
    /// The limit's name.
    pub limit: String,
    /// The entity's key value.
    pub key: String,
    /// Its place in line, from 1 (`None`: it holds a slot).
    pub place: Option<u64>,
    /// Slots of this key value held, of `max`.
    pub in_use: u64,
    /// How many may be held at once.
    pub max: u64,
}

/// Every limit's key values with slots in use or work waiting, by limit and key.
pub(crate) const LIST: &str = "SELECT s.name, s.key, s.in_use, s.max,
        (SELECT COUNT(*) FROM limit_waiters w WHERE w.name = s.name AND w.key = s.key)
     FROM limit_slots s WHERE s.in_use > 0 OR EXISTS (SELECT 1 FROM limit_waiters w WHERE w.name = s.name AND w.key = s.key)
     ORDER BY s.name, s.key";

/// The slots entity `$1` holds (place 0) and the line it waits in (its place counted
/// through the line's index).
pub(crate) const OF_ENTITY: &str = "SELECT h.name, h.key, 0, s.in_use, s.max
     FROM limit_holds h JOIN limit_slots s ON s.name = h.name AND s.key = h.key WHERE h.entity_id = $1
     UNION ALL
     SELECT w.name, w.key,
        (SELECT COUNT(*) FROM limit_waiters o WHERE o.name = w.name AND o.key = w.key
           AND (o.priority > w.priority OR (o.priority = w.priority AND o.seq <= w.seq))),
        s.in_use, s.max
     FROM limit_waiters w JOIN limit_slots s ON s.name = w.name AND s.key = w.key WHERE w.entity_id = $1";

pub(crate) fn decode_usage<C: Columns>(r: &C) -> Result<LimitUsage, C::Error> {
    Ok(LimitUsage {
        limit: r.text(0)?,
        key: r.text(1)?,
        in_use: r.int(2)?.max(0) as u64,
        max: r.int(3)?.max(0) as u64,
        waiting: r.int(4)? as u64,
    })
}

pub(crate) fn decode_entity<C: Columns>(r: &C) -> Result<EntityLimit, C::Error> {
    let place = r.int(2)?;
    Ok(EntityLimit {
        limit: r.text(0)?,
        key: r.text(1)?,
        place: (place > 0).then_some(place as u64),
        in_use: r.int(3)?.max(0) as u64,
        max: r.int(4)?.max(0) as u64,
    })
}
