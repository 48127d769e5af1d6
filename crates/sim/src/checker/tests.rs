//! Each invariant sees the bug it exists for: the observations a broken engine or store
//! would produce, planted in a small sequence, and the invariant fails on them (and holds
//! on the observations of a correct run).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use settle_core::Machine;
use settle_store::AgentTask;

use super::*;

fn machines() -> Vec<Arc<Machine>> {
    vec![
        Arc::new(settle_builtin::sleeper(Duration::from_secs(30))),
        Arc::new(settle_builtin::fan_parent()),
        Arc::new(settle_builtin::fan_child()),
    ]
}

#[allow(clippy::too_many_arguments)]
fn row(
    id: i64,
    entity: i64,
    name: &str,
    from: Option<&str>,
    to: Option<&str>,
    kind: &str,
    event: Option<&str>,
    at: i64,
) -> HistoryRow {
    let (machine, key) = name.split_once('/').unwrap();
    HistoryRow {
        id,
        entity_id: entity,
        machine: machine.into(),
        key: key.into(),
        from: from.map(Into::into),
        to: to.map(Into::into),
        kind: kind.into(),
        event: event.map(Into::into),
        at,
    }
}

fn seen(history: Vec<HistoryRow>, fired: Vec<Fired>, events: &[(i64, i64)], edges: &[(i64, i64)]) -> Seen {
    Seen {
        history,
        fired,
        events: events.iter().copied().collect(),
        edges: edges.to_vec(),
        hook_twice: None,
        count_drift: None,
        present: None,
        now: 0,
        slots: Vec::new(),
        holds: Vec::new(),
    }
}

fn timer(id: i64, entity: i64, event: &str, raised_at: i64, rejected: bool) -> Fired {
    Fired { id, entity_id: entity, event: event.into(), kind: "timer".into(), raised_at, rejected }
}

#[track_caller]
fn fails(r: Result<(), Violation>, needle: &str) {
    match r {
        Err(v) => assert!(v.what.contains(needle), "expected `{needle}` in: {}", v.what),
        Ok(()) => panic!("the invariant held; expected it to fail with `{needle}`"),
    }
}

#[test]
fn a_commit_by_a_node_that_does_not_hold_the_lease_is_caught() {
    let mut c = Checker::new(&machines());
    c.before_write(HashMap::from([(1, Some("node0.0".to_string())), (2, None)]));
    assert!(c.landed(1, "node0.0", &[(1, 3)]).is_ok(), "the holder commits");
    // Created by the batch: not in the store when it began.
    assert!(c.landed(1, "node0.0", &[(5, 1)]).is_ok());
    // The lease-owner half of the fence gone: node0.0 commits while node1.0 holds it (a
    // takeover that did not move the version), or after it was released.
    c.before_write(HashMap::from([(1, Some("node1.0".to_string())), (2, None)]));
    fails(
        c.landed(2, "node0.0", &[(1, 4)]),
        "whose lease it was not: when the batch began the entity was held by node1.0",
    );
    fails(c.landed(2, "node0.0", &[(2, 2)]), "held by nobody");
    // The version half gone too: a version made twice.
    c.before_write(HashMap::from([(1, Some("node1.0".to_string()))]));
    fails(c.landed(3, "node1.0", &[(1, 3)]), "two writers: entity#1: version 3 committed by node0.0 and by node1.0");
}

#[test]
fn a_broken_history_chain_or_an_event_processed_twice_is_caught() {
    let mut c = Checker::new(&machines());
    let z = "sleeper/z1";
    let ok = seen(
        vec![
            row(1, 1, z, None, Some("asleep"), "create", None, 0),
            row(2, 1, z, Some("asleep"), Some("awake"), "event", Some("wake"), 5),
        ],
        vec![],
        &[(1, 1)],
        &[],
    );
    assert!(c.seen(1, &ok).is_ok());
    // A commit applied with a stale snapshot: it starts from a state the entity left.
    fails(
        c.seen(
            2,
            &seen(vec![row(3, 1, z, Some("asleep"), Some("awake"), "event", Some("wake"), 6)], vec![], &[(1, 2)], &[]),
        ),
        "history chain broken at row 3",
    );
    let mut c = Checker::new(&machines());
    assert!(c.seen(1, &ok).is_ok());
    // An event processed again: one more history row than processed events.
    fails(
        c.seen(2, &seen(vec![row(3, 1, z, Some("awake"), None, "rejected", Some("wake"), 6)], vec![], &[(1, 1)], &[])),
        "2 history rows processed an event, but 1 events",
    );
    fails(
        Checker::new(&machines())
            .seen(1, &seen(vec![row(9, 1, z, Some("asleep"), None, "rejected", Some("x"), 1)], vec![], &[], &[])),
        "before its creation",
    );
}

#[test]
fn a_timer_firing_again_early_or_after_its_state_was_left_is_caught() {
    let z = "sleeper/z1";
    let created = || {
        let mut c = Checker::new(&machines());
        c.requested(z.into(), 1_000);
        assert!(
            c.seen(1, &seen(vec![row(1, 1, z, None, Some("asleep"), "create", None, 1_200)], vec![], &[], &[])).is_ok()
        );
        c
    };
    // Due 30 s after the request: fired then, accepted.
    let mut c = created();
    let woke = row(2, 1, z, Some("asleep"), Some("awake"), "event", Some("wake"), 31_000);
    assert!(c.seen(2, &seen(vec![woke.clone()], vec![timer(10, 1, "wake", 31_000, false)], &[(1, 1)], &[])).is_ok());
    // The same timer fires again before its first firing left the state: rejected, but a
    // firing all the same.
    let again = row(3, 1, z, Some("awake"), None, "rejected", Some("wake"), 31_000);
    fails(
        c.seen(
            3,
            &seen(
                vec![again],
                vec![timer(10, 1, "wake", 31_000, false), timer(11, 1, "wake", 31_000, true)],
                &[(1, 2)],
                &[],
            ),
        ),
        "fired 2 times in one stay",
    );
    // Early: 20 s after the request.
    let mut c = created();
    let early = row(2, 1, z, Some("asleep"), Some("awake"), "event", Some("wake"), 20_000);
    fails(
        c.seen(2, &seen(vec![early], vec![timer(10, 1, "wake", 20_000, false)], &[(1, 1)], &[])),
        "before it was due",
    );
    // After the state was left (its timer should have been canceled).
    let mut c = created();
    assert!(c.seen(2, &seen(vec![woke], vec![timer(10, 1, "wake", 31_000, false)], &[(1, 1)], &[])).is_ok());
    let late = row(3, 1, z, Some("awake"), None, "rejected", Some("wake"), 50_000);
    fails(
        c.seen(
            3,
            &seen(
                vec![late],
                vec![timer(10, 1, "wake", 31_000, false), timer(12, 1, "wake", 50_000, true)],
                &[(1, 2)],
                &[],
            ),
        ),
        "while the entity was in none of its states",
    );
}

fn task(id: i64, token: &str, locked_until: i64) -> AgentTask {
    AgentTask {
        id,
        queue: "q".into(),
        machine: "vm".into(),
        key: format!("v{id}").into(),
        entity_id: id,
        state: "provisioning".into(),
        action: "provision".into(),
        entity_version: 1,
        retry: 0,
        properties: Default::default(),
        errors: 0,
        request_id: None,
        status: "leased".into(),
        attempt: 1,
        token: Some(token.into()),
        agent: Some("a".into()),
        locked_until: Some(locked_until),
        lock_ms: 100,
        available_at: 0,
        created_at: 0,
        outcome: None,
        error: None,
        event: None,
        params: serde_json::Value::Null,
    }
}

fn stored(status: &str) -> Stored {
    Stored { status: status.into(), token: None, locked_until: None }
}

#[test]
fn agent_reports_answered_against_the_protocol_are_caught() {
    let refused = |r: &str| Answer::Refused(r.into());
    let mut a = Agents::default();
    a.leased(&[task(1, "a", 100), task(2, "b", 100), task(3, "c", 100), task(4, "e", 100), task(5, "f", 100)]);
    // Applied once, then replays.
    assert!(a.reported(1, "a", 50, &Answer::Applied, Some(&stored("done"))).is_ok());
    assert!(a.reported(1, "a", 60, &Answer::Replayed, Some(&stored("done"))).is_ok());
    // Applied twice (a replay not recognised): caught; refused instead of replayed too.
    assert!(
        a.reported(1, "a", 70, &Answer::Applied, Some(&stored("done")))
            .unwrap_err()
            .contains("protocol answers Replayed")
    );
    assert!(a.reported(1, "a", 70, &refused("already reported"), None).is_err());
    // Applied after the lease expired (the expiry rule broken).
    let e = a.reported(2, "b", 150, &Answer::Applied, Some(&stored("done"))).unwrap_err();
    assert!(e.contains("Refused(\"lease expired\") or Refused(\"not leased\")"), "{e}");
    assert!(a.reported(2, "b", 150, &refused("lease expired 50 ms ago"), None).is_ok());
    // Applied with a superseded token.
    a.leased(&[task(3, "d", 300)]);
    assert!(a.reported(3, "c", 120, &Answer::Applied, Some(&stored("done"))).is_err());
    assert!(
        a.reported(3, "c", 120, &refused("lease token superseded: the task was leased again (attempt 2)"), None)
            .is_ok()
    );
    // Refused while the token holds the live lease.
    assert!(a.reported(4, "e", 50, &refused("lease expired 0 ms ago"), None).is_err());
    // Canceled: only if the task is canceled after the batch.
    let canceled = refused("canceled: the entity left the task's state, or was killed");
    assert!(a.reported(5, "f", 50, &canceled, Some(&stored("leased"))).is_err());
    assert!(a.reported(5, "f", 50, &canceled, Some(&stored("canceled"))).is_ok());
    assert_eq!(a.entity(5).as_deref(), Some("vm/v5"));
}

#[test]
fn a_subscription_firing_without_its_pattern_or_never_firing_is_caught() {
    let (f, c1, c2) = ("fanparent/f1", "fanchild/f1-0", "fanchild/f1-1");
    let edges = [(1, 2), (1, 3)];
    let start = seen(
        vec![
            row(1, 1, f, None, Some("idle"), "create", None, 0),
            row(2, 1, f, Some("idle"), Some("spawning"), "event", Some("go"), 10),
            row(3, 1, f, Some("spawning"), Some("waiting"), "auto", None, 20),
            row(4, 2, c1, None, Some("working"), "create", None, 20),
            row(5, 3, c2, None, Some("working"), "create", None, 20),
        ],
        vec![],
        &[(1, 1)],
        &edges,
    );
    let one_done =
        seen(vec![row(6, 2, c1, Some("working"), Some("done"), "auto", None, 30)], vec![], &[(1, 1)], &edges);
    let both_done =
        seen(vec![row(7, 3, c2, Some("working"), Some("done"), "auto", None, 35)], vec![], &[(1, 1)], &edges);
    let fires = |id| {
        seen(
            vec![row(id, 1, f, Some("waiting"), Some("done"), "event", Some("children_done"), 40)],
            vec![],
            &[(1, 2)],
            &edges,
        )
    };
    // Fired with one child done of two: the pattern never held.
    let mut c = Checker::new(&machines());
    assert!(c.seen(1, &start).is_ok() && c.seen(2, &one_done).is_ok());
    fails(c.seen(3, &fires(7)), "subscription `children_done` fired in `waiting` (history row 7), but its pattern");
    // Fired once both are done: holds.
    let mut c = Checker::new(&machines());
    assert!(c.seen(1, &start).is_ok() && c.seen(2, &one_done).is_ok() && c.seen(3, &both_done).is_ok());
    assert!(c.seen(4, &fires(8)).is_ok());
    // At rest with both done and the parent still waiting: it never fired.
    let mut c = Checker::new(&machines());
    assert!(c.seen(1, &start).is_ok() && c.seen(2, &one_done).is_ok() && c.seen(3, &both_done).is_ok());
    fails(c.end(9, &End::default()), "its subscription `children_done` never fired though its pattern");
    // Killed, it need not.
    let killed = End { killed: [f.to_string()].into_iter().collect(), ..End::default() };
    assert!(c.end(9, &killed).is_ok());
}

#[test]
fn the_checkers_own_pattern_reading() {
    use subscriptions::Mini;
    let p = Mini::parse("all(*) in [ready]").unwrap();
    assert!(!p.holds(&[]), "all needs at least one");
    assert!(p.holds(&[("app", "ready"), ("db", "ready")]));
    assert!(!p.holds(&[("app", "ready"), ("db", "creating")]));
    let p = Mini::parse("all(db) in [ready, gone]").unwrap();
    assert!(p.holds(&[("app", "creating"), ("db", "gone")]));
    let p = Mini::parse("any(type=db) in [failed]").unwrap();
    assert!(p.holds(&[("db", "failed")]) && !p.holds(&[("app", "failed")]));
    let p = Mini::parse("none(*) in [failed]").unwrap();
    assert!(p.holds(&[]) && !p.holds(&[("x", "failed")]));
    assert_eq!(Mini::parse("count(type=db in [ready]) >= 2"), None);
    assert_eq!(Mini::parse("any(*) health error"), None);
}

#[test]
fn an_entity_pruned_while_live_or_before_its_retention_is_caught() {
    let z = "sleeper/z1";
    let history = vec![
        row(1, 1, z, None, Some("asleep"), "create", None, 0),
        row(2, 1, z, Some("asleep"), Some("awake"), "event", Some("wake"), 1_000),
        row(3, 2, "sleeper/z2", None, Some("asleep"), "create", None, 0),
    ];
    let observed = |present: &[i64], now: i64| Seen {
        present: Some(present.iter().copied().collect()),
        now,
        ..seen(vec![], vec![], &[(1, 1)], &[])
    };
    let start = |c: &mut Checker| c.seen(1, &Seen { present: None, ..seen(history.clone(), vec![], &[(1, 1)], &[]) });
    let keep = crate::world::retention().ended.cutoff(0).unwrap().abs();
    // Gone a minute after it woke (its retention): it leaves the checks, its events too.
    let mut c = Checker::new(&machines());
    start(&mut c).unwrap();
    c.seen(2, &Seen { events: HashMap::new(), ..observed(&[2], 1_000 + keep) }).unwrap();
    assert!(c.entities.was_pruned(z) && c.entities.pruned_now == 1);
    // Gone before its retention passed.
    let mut c = Checker::new(&machines());
    start(&mut c).unwrap();
    fails(c.seen(2, &observed(&[2], 1_000 + keep - 1)), "sleeper/z1: gone");
    // A live entity gone.
    let mut c = Checker::new(&machines());
    start(&mut c).unwrap();
    fails(
        c.seen(2, &observed(&[1], 1_000 + keep)),
        "sleeper/z2: gone from the store while in `asleep`, not an end state",
    );
    // A child that ended, gone while its parent still waits on it.
    let (f, k) = ("fanparent/f", "fanchild/f-0");
    let family = vec![
        row(1, 1, f, None, Some("idle"), "create", None, 0),
        row(2, 1, f, Some("idle"), Some("waiting"), "event", Some("go"), 10),
        row(3, 2, k, None, Some("working"), "create", None, 10),
        row(4, 2, k, Some("working"), Some("done"), "auto", None, 20),
    ];
    let mut c = Checker::new(&machines());
    c.seen(1, &seen(family, vec![], &[(1, 1)], &[(1, 2)])).unwrap();
    let gone_child =
        Seen { present: Some([1].into_iter().collect()), now: 20 + keep, ..seen(vec![], vec![], &[(1, 1)], &[]) };
    fails(
        c.seen(2, &gone_child),
        "fanchild/f-0: gone from the store while fanparent/f (linked to it) is live in `waiting`",
    );
}

#[test]
fn a_limit_exceeded_a_slot_left_idle_or_an_action_without_its_slot_is_caught() {
    let w = || vec![Arc::new(crate::machines::worker("worker", false))];
    let slot = |in_use, holds, waiting| SlotSeen {
        limit: "crowd_calls".into(),
        key: String::new(),
        in_use,
        max: Some(2),
        holds,
        waiting,
        spacing_us: None,
        next_us: 0,
        woken: false,
        round: 0,
        turns: if waiting > 0 { vec![0] } else { vec![] },
        counted: (waiting, 0),
        task_holds: 0,
    };
    // The workers' rate: one start of crowd `x` every 50 ms; each holder started 100 ms
    // after the one before.
    let pace = |holds| SlotSeen {
        limit: "crowd_pace".into(),
        key: "x".into(),
        in_use: holds,
        max: None,
        holds,
        waiting: 0,
        spacing_us: Some(50_000),
        next_us: 1_000_000,
        woken: false,
        round: 0,
        turns: vec![],
        counted: (0, 0),
        task_holds: 0,
    };
    let hold = |entity: i64, state: &str| {
        let of = |limit: &str, key: &str| HoldSeen {
            limit: limit.into(),
            entity_id: entity,
            state: state.into(),
            task: 0,
            key: key.into(),
            since: entity * 100,
            workflow: false,
            moving: true,
        };
        [of("crowd_calls", ""), of("crowd_pace", "x")]
    };
    let batch = |history: Vec<HistoryRow>, mut slots: Vec<SlotSeen>, holds: Vec<[HoldSeen; 2]>| {
        slots.push(pace(holds.len() as i64));
        Seen { slots, holds: holds.concat(), ..seen(history, vec![], &[], &[]) }
    };
    let created = || {
        let mut c = Checker::new(&w());
        let rows = vec![
            row(1, 1, "worker/a", None, Some("working"), "create", None, 0),
            row(2, 2, "worker/b", None, Some("working"), "create", None, 0),
            row(3, 3, "worker/c", None, Some("working"), "create", None, 0),
        ];
        // a and b take the two slots; c waits.
        assert!(c.seen(1, &batch(rows, vec![slot(2, 2, 1)], vec![hold(1, "working"), hold(2, "working")])).is_ok());
        c
    };
    // A correct run: a's action ends under its slot, which goes to c at once.
    let mut c = created();
    let done = vec![row(4, 1, "worker/a", Some("working"), Some("done"), "auto", None, 5)];
    assert!(c.seen(2, &batch(done, vec![slot(2, 2, 0)], vec![hold(2, "working"), hold(3, "working")])).is_ok());
    // Over the limit: a third holder.
    fails(
        created().seen(
            2,
            &batch(vec![], vec![slot(3, 3, 0)], vec![hold(1, "working"), hold(2, "working"), hold(3, "working")]),
        ),
        "over its limit, 3 hold a slot of 2",
    );
    // The count drifting from the holders (a slot given back twice, or never).
    fails(created().seen(2, &batch(vec![], vec![slot(1, 2, 1)], vec![])), "counts 1 in use, but 2 hold a slot");
    // A slot given back but not handed on: idle while c waits.
    let done = vec![row(4, 1, "worker/a", Some("working"), Some("done"), "auto", None, 5)];
    fails(
        created().seen(2, &batch(done, vec![slot(1, 1, 1)], vec![hold(2, "working")])),
        "a slot is free (1 of 2 in use) while 1 wait in line",
    );
    // c's action ran although it waited (no slot seen before its end).
    let ran = vec![row(4, 3, "worker/c", Some("working"), Some("done"), "auto", None, 5)];
    fails(
        created().seen(2, &batch(ran, vec![slot(2, 2, 0)], vec![hold(1, "working"), hold(2, "working")])),
        "worker/c: its action in `working` ended (history 4, auto) without a slot of `crowd_calls` held before",
    );
    // a left its state without giving its slot back.
    let done = vec![row(4, 1, "worker/a", Some("working"), Some("done"), "auto", None, 5)];
    fails(
        created().seen(2, &batch(done, vec![slot(2, 2, 1)], vec![hold(1, "done"), hold(2, "working")])),
        "worker/a: holds a slot of `crowd_calls` in state `done`, which it does not limit",
    );
    // Two starts of crowd x 30 ms apart: faster than its rate.
    let mut fast = hold(3, "working");
    fast[1].since = 230;
    fails(
        created().seen(2, &batch(vec![], vec![slot(2, 2, 0)], vec![hold(2, "working"), fast])),
        "worker/c: started under `crowd_pace` (key `x`) at 230, 30 ms from worker/b's start: faster than its rate",
    );
    // Waiting for the rate with a slot free, and nobody woken for the next start.
    let mut stalled = pace(1);
    (stalled.waiting, stalled.counted) = (1, (1, 0));
    let mut seen = batch(vec![], vec![slot(2, 2, 1)], vec![hold(1, "working"), hold(2, "working")]);
    seen.slots[1] = stalled.clone();
    fails(created().seen(2, &seen), "crowd_pace` (key `x`): 1 wait for the rate, and none is due by the next start");
    stalled.woken = true;
    seen.slots[1] = stalled;
    assert!(created().seen(2, &seen).is_ok(), "woken for the rate: fine");
    // A fairness value left two rounds behind.
    let mut unfair = slot(2, 2, 2);
    (unfair.round, unfair.turns) = (3, vec![3, 5]);
    fails(
        created().seen(2, &batch(vec![], vec![unfair], vec![hold(1, "working"), hold(2, "working")])),
        "a fairness value waits with turn 5 while the line is at round 3",
    );
    // The slot row's count of its line drifting from the line.
    let mut drifted = slot(2, 2, 1);
    drifted.counted = (0, 0);
    fails(
        created().seen(2, &batch(vec![], vec![drifted], vec![hold(1, "working"), hold(2, "working")])),
        "counts 0 in line and 0 kept by tasks, but 1 wait and tasks keep 0",
    );
    // At rest, someone still in line.
    let end = End { limited: vec![("worker/c".into(), "waits for crowd_calls".into())], ..End::default() };
    fails(created().end(9, &end), "worker/c: at rest, still waits for crowd_calls");
}

#[test]
fn a_workflow_without_its_slot_or_a_slot_left_at_rest_is_caught() {
    let charts = || vec![Arc::new(crate::machines::chart())];
    let slot = |holds| SlotSeen {
        limit: "open_charts".into(),
        key: String::new(),
        in_use: holds,
        max: Some(crate::machines::OPEN_CHARTS.into()),
        holds,
        waiting: 0,
        spacing_us: None,
        next_us: 0,
        woken: false,
        round: 0,
        turns: vec![],
        counted: (0, 0),
        task_holds: 0,
    };
    let hold = |entity: i64, state: &str, moving: bool| HoldSeen {
        limit: "open_charts".into(),
        entity_id: entity,
        state: state.into(),
        task: 0,
        key: String::new(),
        since: 0,
        workflow: true,
        moving,
    };
    let batch = |history: Vec<HistoryRow>, holds: Vec<HoldSeen>, events: &[(i64, i64)]| Seen {
        slots: vec![slot(holds.len() as i64)],
        holds,
        ..seen(history, vec![], events, &[])
    };
    // a is admitted at rest (due: it runs `start` next), then starts its workflow.
    let created = || {
        let mut c = Checker::new(&charts());
        let rows = vec![
            row(1, 1, "chart/a", None, Some("idle"), "create", None, 0),
            row(2, 2, "chart/b", None, Some("idle"), "create", None, 0),
        ];
        assert!(c.seen(1, &batch(rows, vec![hold(1, "idle", true)], &[])).is_ok());
        c
    };
    let started = vec![row(3, 1, "chart/a", Some("idle"), Some("step1"), "event", Some("start"), 5)];
    let mut c = created();
    let ok = c.seen(2, &batch(started, vec![hold(1, "step1", false)], &[(1, 1)]));
    assert!(ok.is_ok(), "{ok:?}");
    // b's `start` accepted with no slot held before.
    let b = vec![row(3, 2, "chart/b", Some("idle"), Some("step1"), "event", Some("start"), 5)];
    fails(
        created().seen(2, &batch(b, vec![hold(1, "idle", true)], &[(2, 1)])),
        "chart/b: its event `start` was accepted (history 3) without a slot of `open_charts` held before",
    );
    // a came to rest without giving its workflow's slot back.
    let done = vec![
        row(4, 1, "chart/a", Some("step1"), Some("step2"), "auto", None, 7),
        row(5, 1, "chart/a", Some("step2"), Some("step3"), "auto", None, 8),
        row(6, 1, "chart/a", Some("step3"), Some("done"), "auto", None, 9),
    ];
    fails(
        c.seen(3, &batch(done, vec![hold(1, "done", false)], &[(1, 1)])),
        "chart/a: holds a slot of `open_charts` for a workflow at rest in `done`, neither leased, due nor paused",
    );
}

#[test]
fn a_fleet_count_apart_from_its_rows_is_caught() {
    let mut c = Checker::new(&machines());
    let drift =
        Seen { count_drift: Some(("entities chart/step2/active".into(), 0, 1)), ..seen(vec![], vec![], &[], &[]) };
    fails(c.seen(1, &drift), "the fleet counts say 0 entities chart/step2/active, but 1 rows are");
    assert!(Checker::new(&machines()).seen(1, &seen(vec![], vec![], &[], &[])).is_ok());
}
