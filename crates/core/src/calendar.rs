//! Calendar schedules (DESIGN §9, "Schedules"): a machine's `[schedules.NAME]`, firing on
//! a cron expression in a time zone, either raising an event on each of its entities in
//! given states or creating one entity of the machine.
//!
//! Everything here is pure: [`Calendar::after`] finds the next fire after an instant (the
//! cron expression parsed by `croner`, read in the zone by `jiff` with its bundled time
//! zone database, so a fresh machine needs nothing installed), and [`step`] decides, from a
//! schedule's stored progress and whether its previous fire still runs, what to fire now
//! and where to go on. The runtime stores the progress as one row per schedule and fires
//! with a request id made from the fire's instant ([`fire_id`]), so a fire repeated after a
//! crash, or by a second instance, is a replay.
//!
//! - *Catch-up* ([`CatchUp`]): a fire due more than [`LATE`] ago was missed (nothing ran to
//!   fire it); `once` fires the latest missed one in place of them all (unless a fire on
//!   time does), `all` fires the latest `catch_up_limit` of them, `skip` none. Missed fires
//!   not fired are counted.
//! - *Overlap* ([`Overlap`]): while the previous fire still runs, `skip` fires nothing,
//!   `buffer_one` holds the latest fire until it ends, `allow_all` fires anyway. Several
//!   fires due at once overlap each other: `skip` fires the first, `buffer_one` the first
//!   and holds the last. Fires not fired are counted as skipped.
//! - *Daylight saving*: a wall-clock time a change skips fires at the first instant after
//!   the gap; one it repeats fires once, at its first occurrence (croner's rules).
//! - *Jitter*: a fire runs up to `jitter` after its instant, by an amount derived from the
//!   machine, the schedule and the instant (every instance agrees on it).

use std::time::Duration;

use croner::Cron;
use croner::parser::{CronParser, Seconds};
use jiff::Timestamp;
use jiff::tz::TimeZone;

use crate::expr::Expression;
use crate::machine::def::{CalendarDef, Origin};
use crate::time::format_time;

/// Milliseconds since the Unix epoch.
pub type Millis = i64;

/// How late a fire may run and still be on time; past it, the fire was missed.
pub const LATE: Millis = 60_000;
/// The most missed fires `catch_up = "all"` may fire, and its default.
pub const CATCH_UP_MAX: u32 = 1_000;
/// `catch_up_limit` when not declared.
pub const CATCH_UP_DEFAULT: u32 = 10;
/// The most entities a second a raising schedule's fire reaches when `rate` is not
/// declared.
pub const DEFAULT_RATE: u32 = 1_000;
/// How many fires [`step`] counts through before it stops counting (a schedule firing
/// every second, after a year's downtime).
const COUNT_AT_MOST: usize = 1_000_000;

/// What a fire does while the previous one still runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overlap {
    /// Fire nothing (counted as skipped).
    Skip,
    /// Hold the latest fire until the previous one ends.
    BufferOne,
    /// Fire anyway.
    AllowAll,
}

/// What a schedule fires for the fires it missed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CatchUp {
    /// The latest one, in place of them all.
    Once,
    /// The latest N of them.
    All(u32),
    /// None.
    Skip,
}

/// What a fire does.
#[derive(Debug, Clone, PartialEq)]
pub enum Fire {
    /// Raise `event` on each entity of the machine in one of `states`.
    Raise {
        /// The event.
        event: String,
        /// The states.
        states: Vec<String>,
        /// Entities a second at most.
        rate: u32,
    },
    /// Create one entity of the machine.
    Create {
        /// Its key's expression (`None`: the default key).
        key: Option<Expression>,
        /// Its constructor properties.
        properties: serde_json::Map<String, serde_json::Value>,
    },
}

/// A validated schedule. Compares equal by its declaration (where it was declared aside).
#[derive(Clone, PartialEq)]
pub struct Calendar {
    /// As declared.
    pub def: CalendarDef,
    cron: Cron,
    zone: TimeZone,
    /// What each fire does.
    pub fire: Fire,
    /// While the previous fire runs.
    pub overlap: Overlap,
    /// For missed fires.
    pub catch_up: CatchUp,
    /// At most this long after its instant a fire runs.
    pub jitter: Duration,
}

impl std::fmt::Debug for Calendar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Calendar({:?})", self.def)
    }
}

/// Parses a cron expression as schedules read it (seconds optional).
pub fn parse_cron(text: &str) -> Result<Cron, String> {
    CronParser::builder()
        .seconds(Seconds::Optional)
        .build()
        .parse(text)
        .map_err(|e| format!("`cron` `{text}` does not parse: {e}"))
}

/// The time zone named `name` (IANA, e.g. `Europe/Paris`), from the bundled database.
pub fn zone(name: &str) -> Result<TimeZone, String> {
    jiff::tz::db()
        .get(name)
        .map_err(|_| format!("`zone` `{name}` is not a known time zone (IANA names, e.g. `Europe/Paris`)"))
}

impl Calendar {
    /// Checks a declared schedule on its own (the machine's names are checked by
    /// [`crate::validate`]): every problem, each starting with the key at fault.
    pub fn from_def(def: &CalendarDef) -> Result<Calendar, Vec<String>> {
        let mut problems = Vec::new();
        let cron = parse_cron(&def.cron).map_err(|e| problems.push(e)).ok();
        let zone = zone(def.zone.as_deref().unwrap_or("UTC")).map_err(|e| problems.push(e)).ok();
        let overlap = match def.overlap.as_deref().unwrap_or("skip") {
            "skip" => Overlap::Skip,
            "buffer_one" => Overlap::BufferOne,
            "allow_all" => Overlap::AllowAll,
            other => {
                problems.push(format!("`overlap` `{other}` is none of `skip`, `buffer_one`, `allow_all`"));
                Overlap::Skip
            }
        };
        let catch_up = match def.catch_up.as_deref().unwrap_or("once") {
            "once" => CatchUp::Once,
            "skip" => CatchUp::Skip,
            "all" => CatchUp::All(def.catch_up_limit.unwrap_or(CATCH_UP_DEFAULT)),
            other => {
                problems.push(format!("`catch_up` `{other}` is none of `once`, `all`, `skip`"));
                CatchUp::Once
            }
        };
        match (def.catch_up_limit, catch_up) {
            (Some(n), CatchUp::All(_)) if n == 0 || n > CATCH_UP_MAX => {
                problems.push(format!("`catch_up_limit` {n} is outside 1 to {CATCH_UP_MAX}"));
            }
            (Some(_), CatchUp::Once | CatchUp::Skip) => {
                problems.push("`catch_up_limit` applies only with `catch_up = \"all\"`".into());
            }
            _ => {}
        }
        if let Some(r) = def.rate
            && (r == 0 || r > 100_000)
        {
            problems.push(format!("`rate` {r} is outside 1 to 100000 entities a second"));
        }
        let fire = match (&def.raise, &def.create) {
            (Some(event), None) => {
                if def.valid_in.is_empty() {
                    problems.push("`raise` needs `in`: the states whose entities it reaches".into());
                }
                Some(Fire::Raise {
                    event: event.clone(),
                    states: def.valid_in.clone(),
                    rate: def.rate.unwrap_or(DEFAULT_RATE),
                })
            }
            (None, Some(c)) => {
                if !def.valid_in.is_empty() {
                    problems.push("`in` applies only to a schedule that raises an event".into());
                }
                if def.rate.is_some() {
                    problems.push("`rate` applies only to a schedule that raises an event".into());
                }
                let key = c
                    .key
                    .as_deref()
                    .map(|k| Expression::parse(k).map_err(|e| problems.push(format!("`create.key` `{k}`: {e}"))).ok());
                Some(Fire::Create { key: key.flatten(), properties: c.properties.clone() })
            }
            (Some(_), Some(_)) => {
                problems.push("both `raise` and `create` declared (a schedule does one of them)".into());
                None
            }
            (None, None) => {
                problems.push("nothing to do: declare `raise` (with `in`) or `create`".into());
                None
            }
        };
        let (Some(cron), Some(zone), Some(fire)) = (cron, zone, fire) else {
            return Err(problems);
        };
        let cal = Calendar {
            def: CalendarDef { origin: Origin::default(), ..def.clone() },
            cron,
            zone,
            fire,
            overlap,
            catch_up,
            jitter: Duration::from_millis(def.jitter_ms.unwrap_or(0)),
        };
        // 2000-01-01: a cron expression that never matches (`0 0 30 2 *`) has no fire.
        if cal.after(946_684_800_000).is_none() {
            problems.push(format!("`cron` `{}` never fires", def.cron));
        }
        if problems.is_empty() { Ok(cal) } else { Err(problems) }
    }

    /// The schedule's name.
    pub fn name(&self) -> &str {
        &self.def.name
    }

    /// The zone's name.
    pub fn zone_name(&self) -> &str {
        self.def.zone.as_deref().unwrap_or("UTC")
    }

    /// The first fire strictly after `at`; `None` if there is none (in range).
    pub fn after(&self, at: Millis) -> Option<Millis> {
        let ts = Timestamp::from_millisecond(at).ok()?;
        let zoned = ts.to_zoned(self.zone.clone());
        let next = self.cron.find_next_occurrence(&zoned, false).ok()?;
        let ms = next.timestamp().as_millisecond();
        // croner works in whole seconds: a fire at or before `at` (within its second) is past.
        if ms > at { Some(ms) } else { self.after(at - at.rem_euclid(1000) + 999) }
    }

    /// When the fire of `instant` runs: the instant plus its jitter, from a hash of the
    /// machine, the schedule and the instant.
    pub fn due(&self, machine: &str, instant: Millis) -> Millis {
        let j = self.jitter.as_millis() as u64;
        if j == 0 || instant == Millis::MAX {
            return instant;
        }
        // FNV-1a: stable across processes and versions (the std hasher is neither).
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in machine.bytes().chain([0]).chain(self.def.name.bytes()).chain([0]).chain(instant.to_le_bytes()) {
            h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
        instant.saturating_add((h % j) as Millis)
    }

    /// A one-line description: `0 3 * * * (Europe/Paris)`.
    pub fn describe(&self) -> String {
        format!("{} ({})", self.def.cron, self.zone_name())
    }
}

/// The request id of the fire of `instant` of schedule `name` of `machine`:
/// `schedule:vm:nightly:2026-11-27T03:00:00.000Z`.
pub fn fire_id(machine: &str, name: &str, instant: Millis) -> String {
    format!("schedule:{machine}:{name}:{}", format_time(instant))
}

/// A schedule's progress as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// The next fire's instant.
    pub next_fire: Millis,
    /// A fire held until the previous one ends (`buffer_one`).
    pub buffered: Option<Millis>,
}

/// What [`step`] decides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// The instants to fire now, oldest first.
    pub fires: Vec<Millis>,
    /// Where the schedule goes on.
    pub next: Progress,
    /// Fires missed and not fired (catch-up).
    pub missed: u64,
    /// Fires not fired because the previous one ran (overlap).
    pub skipped: u64,
}

/// What schedule `cal` (of `machine`) fires at `now`, from `progress`, given whether the
/// previous fire still runs. Fires whose time (instant plus jitter) has not come stay ahead.
/// Counting stops at a million due fires (a schedule firing every second, down for
/// eleven days): the rest are passed over uncounted.
pub fn step(cal: &Calendar, machine: &str, progress: Progress, running: bool, now: Millis) -> Step {
    let mut fires_due = Vec::new();
    let mut next = Some(progress.next_fire);
    while let Some(f) = next
        && cal.due(machine, f) <= now
    {
        if fires_due.len() == COUNT_AT_MOST {
            next = cal.after(now);
            break;
        }
        fires_due.push(f);
        next = cal.after(f);
    }
    let (missed_due, on_time): (Vec<Millis>, Vec<Millis>) = fires_due.iter().partition(|&&f| now - f > LATE);
    let mut candidates: Vec<Millis> = match cal.catch_up {
        CatchUp::Once if on_time.is_empty() => missed_due.last().copied().into_iter().collect(),
        CatchUp::Once | CatchUp::Skip => Vec::new(),
        CatchUp::All(n) => missed_due[missed_due.len().saturating_sub(n as usize)..].to_vec(),
    };
    let missed = (missed_due.len() - candidates.len()) as u64;
    candidates.extend(on_time);
    let mut buffered = progress.buffered;
    // A fire held before comes first, once the previous one has ended.
    if let Some(b) = buffered
        && !running
    {
        candidates.insert(0, b);
        buffered = None;
    }
    let mut held = false;
    let fires: Vec<Millis> = match cal.overlap {
        Overlap::AllowAll => candidates.clone(),
        Overlap::Skip if running => Vec::new(),
        Overlap::Skip => candidates.iter().copied().take(1).collect(),
        Overlap::BufferOne => {
            let fire_now = if running { 0 } else { candidates.len().min(1) };
            if let Some(&last) = candidates[fire_now..].last() {
                buffered = Some(last);
                held = true;
            }
            candidates[..fire_now].to_vec()
        }
    };
    // A held fire replaced by a later one was skipped too.
    let replaced = running && held && progress.buffered.is_some();
    let skipped = (candidates.len() - fires.len() - usize::from(held) + usize::from(replaced)) as u64;
    Step { fires, next: Progress { next_fire: next.unwrap_or(Millis::MAX), buffered }, missed, skipped }
}

#[cfg(test)]
mod tests;
