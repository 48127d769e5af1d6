use super::*;
use crate::Machine;
use crate::machine::def::CalendarCreate;
use crate::time::parse_time;

fn at(text: &str) -> Millis {
    parse_time(text, 0).unwrap()
}

fn cal(cron: &str, zone: &str, f: impl FnOnce(&mut CalendarDef)) -> Calendar {
    let mut def = CalendarDef {
        name: "nightly".into(),
        cron: cron.into(),
        zone: Some(zone.into()),
        raise: Some("backup".into()),
        valid_in: vec!["ready".into()],
        ..CalendarDef::default()
    };
    f(&mut def);
    Calendar::from_def(&def).unwrap()
}

fn problems(f: impl FnOnce(&mut CalendarDef)) -> Vec<String> {
    let mut def = CalendarDef {
        name: "s".into(),
        cron: "0 3 * * *".into(),
        raise: Some("go".into()),
        valid_in: vec!["up".into()],
        ..CalendarDef::default()
    };
    f(&mut def);
    Calendar::from_def(&def).err().unwrap_or_default()
}

#[test]
fn a_declaration_is_checked_key_by_key() {
    assert!(problems(|_| {}).is_empty());
    assert!(problems(|d| d.cron = "61 * * * *".into())[0].starts_with("`cron` `61 * * * *` does not parse"));
    assert_eq!(problems(|d| d.cron = "0 0 30 2 *".into()), ["`cron` `0 0 30 2 *` never fires"]);
    assert!(problems(|d| d.zone = Some("Mars/Olympus".into()))[0].starts_with("`zone` `Mars/Olympus` is not a known"));
    assert_eq!(
        problems(|d| d.overlap = Some("queue".into())),
        ["`overlap` `queue` is none of `skip`, `buffer_one`, `allow_all`"]
    );
    assert_eq!(problems(|d| d.catch_up = Some("some".into())), ["`catch_up` `some` is none of `once`, `all`, `skip`"]);
    assert_eq!(problems(|d| d.catch_up_limit = Some(3)), ["`catch_up_limit` applies only with `catch_up = \"all\"`"]);
    assert_eq!(
        problems(|d| {
            d.catch_up = Some("all".into());
            d.catch_up_limit = Some(0);
        }),
        ["`catch_up_limit` 0 is outside 1 to 1000"]
    );
    assert_eq!(problems(|d| d.valid_in.clear()), ["`raise` needs `in`: the states whose entities it reaches"]);
    assert_eq!(
        problems(|d| d.create = Some(CalendarCreate::default())),
        ["both `raise` and `create` declared (a schedule does one of them)"]
    );
    assert_eq!(
        problems(|d| {
            d.raise = None;
            d.create = Some(CalendarCreate { key: Some("params.fire +".into()), ..CalendarCreate::default() });
        })
        .len(),
        2,
        "`in` given to a creating schedule, and the key's syntax"
    );
    assert_eq!(
        problems(|d| {
            d.raise = None;
            d.valid_in.clear();
        }),
        ["nothing to do: declare `raise` (with `in`) or `create`"]
    );
}

#[test]
fn fires_follow_the_expression_in_its_zone() {
    let c = cal("0 3 * * *", "UTC", |_| {});
    assert_eq!(c.after(at("2026-11-27T02:59:59Z")), Some(at("2026-11-27T03:00:00Z")));
    assert_eq!(c.after(at("2026-11-27T03:00:00Z")), Some(at("2026-11-28T03:00:00Z")));
    assert_eq!(c.after(at("2026-11-27T03:00:00.500Z")), Some(at("2026-11-28T03:00:00Z")));
    let paris = cal("0 3 * * *", "Europe/Paris", |_| {});
    assert_eq!(paris.after(at("2026-11-27T00:00:00Z")), Some(at("2026-11-27T02:00:00Z")), "03:00 CET is 02:00 UTC");
    assert_eq!(paris.describe(), "0 3 * * * (Europe/Paris)");
    // The first Monday of the month, at nine.
    let first_monday = cal("0 9 * * MON#1", "UTC", |_| {});
    assert_eq!(first_monday.after(at("2026-11-27T00:00:00Z")), Some(at("2026-12-07T09:00:00Z")));
    // Seconds, when six fields are given.
    let every_10s = cal("*/10 * * * * *", "UTC", |_| {});
    assert_eq!(every_10s.after(at("2026-11-27T00:00:01Z")), Some(at("2026-11-27T00:00:10Z")));
}

#[test]
fn daylight_saving_skips_no_day_and_repeats_none() {
    // Europe/Paris: 2026-03-29 02:00 CET jumps to 03:00 CEST; 2026-10-25 03:00 CEST falls
    // back to 02:00 CET, so 02:30 happens twice.
    let c = cal("30 2 * * *", "Europe/Paris", |_| {});
    let mut fires = vec![];
    let mut t = at("2026-03-27T12:00:00Z");
    for _ in 0..4 {
        t = c.after(t).unwrap();
        fires.push(format_time(t));
    }
    assert_eq!(
        fires,
        [
            "2026-03-28T01:30:00.000Z", // 02:30 CET
            "2026-03-29T01:00:00.000Z", // 02:30 does not exist: the first instant after the gap, 03:00 CEST
            "2026-03-30T00:30:00.000Z", // 02:30 CEST
            "2026-03-31T00:30:00.000Z",
        ]
    );
    let mut fires = vec![];
    let mut t = at("2026-10-23T12:00:00Z");
    for _ in 0..3 {
        t = c.after(t).unwrap();
        fires.push(format_time(t));
    }
    assert_eq!(
        fires,
        [
            "2026-10-24T00:30:00.000Z", // 02:30 CEST
            "2026-10-25T00:30:00.000Z", // the first 02:30 (CEST); the second (CET) does not fire again
            "2026-10-26T01:30:00.000Z", // 02:30 CET
        ]
    );
}

fn progress(next: &str) -> Progress {
    Progress { next_fire: at(next), buffered: None }
}

#[test]
fn a_three_day_downtime_under_each_catch_up_policy() {
    // Hourly; the engine stopped after the fire of 00:00 and starts again three days and
    // ten minutes later: 72 fires (01:00 on day one to 00:00 on day four) were due.
    let now = at("2026-11-04T00:10:00Z");
    let hourly = |catch_up: &str, limit: Option<u32>| {
        cal("0 * * * *", "UTC", |d| {
            d.catch_up = Some(catch_up.into());
            d.catch_up_limit = limit;
        })
    };
    let s = step(&hourly("once", None), "vm", progress("2026-11-01T01:00:00Z"), false, now);
    assert_eq!(s.fires, [at("2026-11-04T00:00:00Z")], "once: the latest, for them all");
    assert_eq!((s.missed, s.skipped), (71, 0));
    assert_eq!(s.next.next_fire, at("2026-11-04T01:00:00Z"));
    let s = step(&hourly("all", Some(5)), "vm", progress("2026-11-01T01:00:00Z"), false, now);
    // `all` fires several at once: with the default overlap (`skip`) only the first of them.
    assert_eq!(s.fires, [at("2026-11-03T20:00:00Z")]);
    assert_eq!((s.missed, s.skipped), (67, 4));
    let all = cal("0 * * * *", "UTC", |d| {
        d.catch_up = Some("all".into());
        d.catch_up_limit = Some(5);
        d.overlap = Some("allow_all".into());
    });
    let s = step(&all, "vm", progress("2026-11-01T01:00:00Z"), false, now);
    assert_eq!(
        s.fires,
        (20..=23)
            .map(|h| at(&format!("2026-11-03T{h}:00:00Z")))
            .chain([at("2026-11-04T00:00:00Z")])
            .collect::<Vec<_>>()
    );
    assert_eq!((s.missed, s.skipped), (67, 0));
    let s = step(&hourly("skip", None), "vm", progress("2026-11-01T01:00:00Z"), false, now);
    assert_eq!((s.fires.len(), s.missed, s.skipped), (0, 72, 0));
    assert_eq!(s.next.next_fire, at("2026-11-04T01:00:00Z"));
    // A fire within a minute of its time is on time, whatever the policy.
    let s = step(&hourly("skip", None), "vm", progress("2026-11-04T00:00:00Z"), false, at("2026-11-04T00:00:40Z"));
    assert_eq!((s.fires, s.missed), (vec![at("2026-11-04T00:00:00Z")], 0));
    // Nothing due: nothing changes.
    let s = step(&hourly("once", None), "vm", progress("2026-11-04T01:00:00Z"), false, now);
    assert_eq!(s, Step { fires: vec![], next: progress("2026-11-04T01:00:00Z"), missed: 0, skipped: 0 });
}

#[test]
fn overlap_policies_while_the_previous_fire_runs() {
    let with = |overlap: &str| cal("0 * * * *", "UTC", |d| d.overlap = Some(overlap.into()));
    let now = at("2026-11-27T10:00:05Z");
    let due = progress("2026-11-27T10:00:00Z");
    let s = step(&with("skip"), "vm", due, true, now);
    assert_eq!((s.fires.len(), s.skipped, s.next.buffered), (0, 1, None));
    let s = step(&with("allow_all"), "vm", due, true, now);
    assert_eq!((s.fires, s.skipped), (vec![at("2026-11-27T10:00:00Z")], 0));
    let buffer = with("buffer_one");
    let s = step(&buffer, "vm", due, true, now);
    assert_eq!((s.fires.len(), s.skipped, s.next.buffered), (0, 0, Some(at("2026-11-27T10:00:00Z"))));
    // Still running at the next fire: the later one replaces the held one (skipped).
    let s = step(&buffer, "vm", s.next, true, at("2026-11-27T11:00:01Z"));
    assert_eq!((s.fires.len(), s.skipped, s.next.buffered), (0, 1, Some(at("2026-11-27T11:00:00Z"))));
    // It ended: the held fire fires, late but counted as fired, nothing missed.
    let s = step(&buffer, "vm", s.next, false, at("2026-11-27T11:20:00Z"));
    assert_eq!((s.fires, s.skipped, s.missed, s.next.buffered), (vec![at("2026-11-27T11:00:00Z")], 0, 0, None));
    assert_eq!(s.next.next_fire, at("2026-11-27T12:00:00Z"));
}

#[test]
fn jitter_is_bounded_and_the_same_everywhere() {
    let c = cal("0 3 * * *", "UTC", |d| d.jitter_ms = Some(30_000));
    let t = at("2026-11-27T03:00:00Z");
    let due = c.due("vm", t);
    assert!((t..t + 30_000).contains(&due));
    assert_eq!(due, c.due("vm", t), "derived from the fire, not drawn");
    assert_ne!(
        (0..20)
            .map(|d| c.due("vm", t + d * 86_400_000) - (t + d * 86_400_000))
            .collect::<std::collections::BTreeSet<_>>()
            .len(),
        1
    );
    // Before its jittered time the fire is not due.
    let s = step(&c, "vm", Progress { next_fire: t, buffered: None }, false, due - 1);
    assert!(s.fires.is_empty());
    let s = step(&c, "vm", Progress { next_fire: t, buffered: None }, false, due);
    assert_eq!(s.fires, [t]);
    assert_eq!(fire_id("vm", "nightly", t), "schedule:vm:nightly:2026-11-27T03:00:00.000Z");
    // No fire to come: never due, whatever the jitter.
    assert_eq!(c.due("vm", Millis::MAX), Millis::MAX);
}

const VM: &str = r#"
initial = "new"
[states.new]
[states.ready]
[states.backing_up]
auto = "copy"
[events.go]
in = ["new"]
action = "up"
[events.backup]
in = ["ready"]
action = "start_backup"
[events.resize]
in = ["ready"]
action = "up"
params = ["size"]
[actions.up]
to = ["ready"]
[actions.start_backup]
to = ["backing_up"]
[actions.copy]
to = ["ready"]
"#;

#[test]
fn schedules_load_from_toml_round_trip_and_name_what_is_wrong() {
    let text = format!(
        "{VM}\n[schedules.nightly]\ncron = \"0 3 * * *\"\nzone = \"Europe/Paris\"\nraise = \"backup\"\nin = [\"ready\"]\noverlap = \"buffer_one\"\ncatch_up = \"all\"\ncatch_up_limit = 3\njitter = \"30s\"\nrate = 50\n\n[schedules.report]\ncron = \"0 9 * * MON#1\"\ncreate = {{ key = \"'report-' + params.fire\", properties = {{ kind = \"monthly\" }} }}\n"
    );
    let (m, _) = crate::toml::load("vm.toml", "vm", &text).unwrap();
    let nightly = m.schedule("nightly").unwrap();
    assert_eq!(
        (nightly.overlap, nightly.catch_up, nightly.jitter),
        (Overlap::BufferOne, CatchUp::All(3), Duration::from_secs(30))
    );
    assert_eq!(nightly.fire, Fire::Raise { event: "backup".into(), states: vec!["ready".into()], rate: 50 });
    assert!(
        matches!(&m.schedule("report").unwrap().fire, Fire::Create { key: Some(_), properties } if properties["kind"] == "monthly")
    );
    // Back to TOML and from the stored canonical form: the same machine, the same hash.
    let again = crate::toml::load("vm.toml", "vm", &m.to_toml()).unwrap().0;
    assert_eq!(again, m);
    assert_eq!(again.content_hash(), m.content_hash());
    assert_eq!(Machine::from_canonical_json(&m.canonical_json()).unwrap(), m);
    let without = crate::toml::load("vm.toml", "vm", VM).unwrap().0;
    assert_ne!(without.content_hash(), m.content_hash(), "schedules are part of the version");

    let bad = |schedule: &str| {
        let text = format!("{VM}\n[schedules.s]\n{schedule}\n");
        crate::toml::load("vm.toml", "vm", &text).err().map(|r| r.to_string()).unwrap_or_default()
    };
    let unknown = bad("cron = \"0 3 * * *\"\nraise = \"nope\"\nin = [\"gone\"]");
    assert!(unknown.contains("schedule `s`: `raise` names unknown event `nope`"), "{unknown}");
    assert!(bad("cron = \"0 3 * * *\"\nraise = \"nope\"\nin = [\"gone\"]").contains("`in` names unknown state `gone`"));
    assert!(bad("cron = \"0 3 * * *\"\nraise = \"resize\"\nin = [\"ready\"]").contains("requires parameters"));
    assert!(
        bad("cron = \"0 3 * * *\"\nraise = \"backup\"\nin = [\"ready\"]\nevery = \"1h\"")
            .contains("unknown field `every`")
    );
    assert!(
        bad("cron = \"0 3 * * *\"\nraise = \"backup\"\nin = [\"ready\"]\njitter = \"soon\"").contains("schedule `s`")
    );
}

#[test]
fn a_creating_schedule_fires_on_time() {
    let mut def = CalendarDef { name: "hourly".into(), cron: "0 * * * *".into(), ..CalendarDef::default() };
    def.create = Some(CalendarCreate::default());
    def.overlap = Some("skip".into());
    let c = Calendar::from_def(&def).unwrap();
    let t = at("2026-01-01T01:00:00Z");
    let s = step(&c, "skip", Progress { next_fire: t, buffered: None }, false, t + 1);
    assert_eq!(s.fires, [t]);
}
