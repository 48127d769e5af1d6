//! SQLite's calendar schedules: the statements of [`crate::schedule`], run on the reader
//! (reads) or the writer (changes).

use rusqlite::{Connection, OptionalExtension, params};

use crate::Millis;
use crate::bulk::sqlite;
use crate::schedule::{self, ScheduleAdvance, ScheduleRow};

fn count(n: u64) -> i64 {
    n.min(i64::MAX as u64) as i64
}

pub(super) fn list(c: &Connection) -> rusqlite::Result<Vec<ScheduleRow>> {
    c.prepare_cached(&schedule::select_all())?.query_map([], |r| schedule::decode(r))?.collect()
}

pub(super) fn sync(c: &Connection, row: &ScheduleRow) -> rusqlite::Result<ScheduleRow> {
    c.prepare_cached(&sqlite(schedule::SYNC))?.execute(params![
        row.machine,
        row.name,
        row.spec,
        row.next_fire,
        row.next_at,
        row.updated_at
    ])?;
    c.prepare_cached(&sqlite(&schedule::select_one()))?
        .query_row(params![row.machine, row.name], |r| schedule::decode(r))
}

pub(super) fn claim(
    c: &Connection,
    (machine, name): (&str, &str),
    owner: &str,
    now: Millis,
    lease_until: Millis,
) -> rusqlite::Result<Option<ScheduleRow>> {
    c.prepare_cached(&sqlite(&schedule::claim()))?
        .query_row(params![machine, name, owner, now, lease_until], |r| schedule::decode(r))
        .optional()
}

pub(super) fn advance(c: &Connection, a: &ScheduleAdvance) -> rusqlite::Result<bool> {
    let n = c.prepare_cached(&sqlite(schedule::ADVANCE))?.execute(params![
        a.machine,
        a.name,
        a.owner,
        a.next_fire,
        a.next_at,
        a.buffered,
        a.last_fire,
        count(a.fired),
        count(a.missed),
        count(a.skipped),
        a.now,
    ])?;
    Ok(n == 1)
}

pub(super) fn pause(
    c: &Connection,
    (machine, name): (&str, &str),
    paused: bool,
    (next_fire, next_at): (Millis, Millis),
    now: Millis,
) -> rusqlite::Result<Option<ScheduleRow>> {
    c.prepare_cached(&sqlite(schedule::PAUSE))?.execute(params![machine, name, paused, next_fire, next_at, now])?;
    c.prepare_cached(&sqlite(&schedule::select_one()))?
        .query_row(params![machine, name], |r| schedule::decode(r))
        .optional()
}

pub(super) fn running(c: &Connection, fire_id: &str) -> rusqlite::Result<bool> {
    let under = schedule::under(fire_id);
    let row: Option<String> =
        c.prepare_cached(&sqlite(schedule::RUNNING))?.query_row(params![fire_id, under], |r| r.get(0)).optional()?;
    Ok(row.is_some())
}
