//! Calendar schedules: what each machine declares and how far each has fired.

use serde::{Deserialize, Serialize};

/// A calendar schedule and its progress. Times are milliseconds since the Unix epoch.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Schedule {
    /// Its machine.
    pub machine: String,
    /// Its name.
    pub name: String,
    /// The cron expression and its time zone: `0 3 * * * (Europe/Paris)`.
    pub cron: String,
    /// What each fire does: `raise EVENT in [STATES]` or `create`.
    pub does: String,
    /// Paused by an operator: nothing fires.
    pub paused: bool,
    /// The next fire's instant (null: not stored yet, or none to come).
    pub next_fire: Option<i64>,
    /// When that fire runs (its instant plus its jitter).
    pub next_at: Option<i64>,
    /// A fire held until the previous one ends (`overlap = "buffer_one"`).
    pub buffered: Option<i64>,
    /// The instant of the last fire.
    pub last_fire: Option<i64>,
    /// When the last fire ran.
    pub last_fired_at: Option<i64>,
    /// Fires fired.
    pub fired: u64,
    /// Fires missed while no engine ran, beyond the catch-up policy.
    pub missed: u64,
    /// Fires not fired because the one before still ran (overlap).
    pub skipped: u64,
}

/// `GET /v1/schedules`: every schedule of the served machines.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ScheduleList {
    /// The schedules, by machine and name.
    pub items: Vec<Schedule>,
}

#[cfg(feature = "store")]
impl Schedule {
    /// A schedule as declared (`cron`, `does`) with its stored progress, if any.
    pub fn new(machine: &str, name: &str, cron: String, does: String, row: Option<&settle_store::ScheduleRow>) -> Self {
        let never = |t: i64| (t != i64::MAX).then_some(t);
        Schedule {
            machine: machine.to_string(),
            name: name.to_string(),
            cron,
            does,
            paused: row.is_some_and(|r| r.paused),
            next_fire: row.and_then(|r| never(r.next_fire)),
            next_at: row.and_then(|r| never(r.next_at)),
            buffered: row.and_then(|r| r.buffered),
            last_fire: row.and_then(|r| r.last_fire),
            last_fired_at: row.and_then(|r| r.last_fired_at),
            fired: row.map_or(0, |r| r.fired),
            missed: row.map_or(0, |r| r.missed),
            skipped: row.map_or(0, |r| r.skipped),
        }
    }
}
