//! PostgreSQL's calendar schedules: the statements of [`crate::schedule`], each one
//! statement in autocommit on a pooled connection.

use super::conn::{Conn, Failure};
use crate::Millis;
use crate::schedule::{self, ScheduleAdvance, ScheduleRow};

type R<T> = std::result::Result<T, Failure>;

fn count(n: u64) -> i64 {
    n.min(i64::MAX as u64) as i64
}

pub(super) fn list(c: &mut Conn) -> R<Vec<ScheduleRow>> {
    c.query(&schedule::select_all(), &[])?.iter().map(schedule::decode).collect()
}

pub(super) fn sync(c: &mut Conn, row: &ScheduleRow) -> R<ScheduleRow> {
    c.exec(schedule::SYNC, &[&row.machine, &row.name, &row.spec, &row.next_fire, &row.next_at, &row.updated_at])?;
    c.opt(&schedule::select_one(), &[&row.machine, &row.name])?
        .map(|r| schedule::decode(&r))
        .transpose()?
        .ok_or_else(|| Failure::Corrupt("a schedule just stored is gone".into()))
}

pub(super) fn claim(
    c: &mut Conn,
    (machine, name): (&str, &str),
    owner: &str,
    now: Millis,
    lease_until: Millis,
) -> R<Option<ScheduleRow>> {
    c.opt(&schedule::claim(), &[&machine, &name, &owner, &now, &lease_until])?.map(|r| schedule::decode(&r)).transpose()
}

pub(super) fn advance(c: &mut Conn, a: &ScheduleAdvance) -> R<bool> {
    let (fired, missed, skipped) = (count(a.fired), count(a.missed), count(a.skipped));
    let n = c.exec(
        schedule::ADVANCE,
        &[
            &a.machine,
            &a.name,
            &a.owner,
            &a.next_fire,
            &a.next_at,
            &a.buffered,
            &a.last_fire,
            &fired,
            &missed,
            &skipped,
            &a.now,
        ],
    )?;
    Ok(n == 1)
}

pub(super) fn pause(
    c: &mut Conn,
    (machine, name): (&str, &str),
    paused: bool,
    (next_fire, next_at): (Millis, Millis),
    now: Millis,
) -> R<Option<ScheduleRow>> {
    c.exec(schedule::PAUSE, &[&machine, &name, &paused, &next_fire, &next_at, &now])?;
    c.opt(&schedule::select_one(), &[&machine, &name])?.map(|r| schedule::decode(&r)).transpose()
}

pub(super) fn running(c: &mut Conn, fire_id: &str) -> R<bool> {
    let under = schedule::under(fire_id);
    Ok(c.opt(schedule::RUNNING, &[&fire_id, &under])?.is_some())
}
