//! Table-driven tests of the decisions: an entity in a state, an input, a time → the
//! commit or step decided. No tokio, no store.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use settle_core::fault::FaultPolicy;
use settle_core::machine::Schedule;
use settle_core::{Machine, MachineBuilder, Properties, Related};
use settle_store::{AfterCommit, AgentReport, EntityRow, HistoryKind, InboxItem, InboxKind, RunStatus, TaskResult};

use super::*;
use crate::handler::{Outcome, handler};
use crate::registry::Registry;

const NOW: i64 = 1_000_000;
const OWNER: &str = "engine-test";

/// A job: `idle` --go--> `working` (unstable, auto `work` after 1 s; retries) --> `done`
/// (requires `result`), or `broken` (error health). `poke` runs a handler in `idle`;
/// `check` is raised by a periodic timer in `done`; `report` waits on a subscription with a
/// timeout in `waiting`; `fetch` is executed by an agent.
fn job() -> Machine {
    job_builder().build().unwrap()
}

fn job_builder() -> MachineBuilder {
    MachineBuilder::new("job")
        .state("idle")
        .initial()
        .state("working")
        .auto("work")
        .wait(Duration::from_secs(1))
        .state("done")
        .requires(["result"])
        .state("broken")
        .error_health()
        .state("waiting")
        .state("fetching")
        .auto("fetch")
        .event("go", ["idle"], "start")
        .reject("working", "already working")
        .event("poke", ["idle"], "poke_it")
        .event("check", ["done"], "recheck")
        .event("report", ["waiting"], "finish")
        .subscribe("all(*) in [done]")
        .timeout(Duration::from_secs(600), "give_up")
        .event("give_up", ["waiting"], "fail")
        .action("start", ["working"])
        .action("work", ["done", "broken"])
        .action("poke_it", ["idle", "waiting"])
        .action("recheck", ["done"])
        .action("finish", ["done"])
        .action("fail", ["broken"])
        .action("fetch", ["done", "broken"])
        .agent("q", Duration::from_secs(30))
        .timer("tick", "check", Schedule::Every(Duration::from_secs(60)), ["done"])
        .fault_policy(FaultPolicy {
            max_errors: 3,
            window: Duration::from_secs(3600),
            backoff_min: Duration::from_secs(2),
            backoff_max: Duration::from_secs(8),
        })
}

/// The registry of `job`, with handlers bound to `poke_it` and `work`.
fn registry() -> Registry {
    let mut r = Registry::new();
    let m = job();
    r.hashes.insert(m.name().clone(), m.content_hash());
    r.machines.insert(m.name().clone(), Arc::new(m));
    for action in ["poke_it", "work"] {
        let h = handler(|_| async { Ok(Outcome::stay()) });
        r.handlers.insert(("job".into(), action.into()), h);
    }
    r
}

fn held(state: &str) -> Held {
    let e = EntityRow {
        id: 7,
        version: 3,
        created_at: NOW - 10_000,
        entered_at: NOW - 5_000,
        due_at: Some(NOW),
        lease_owner: Some(OWNER.into()),
        lease_until: Some(NOW + 60_000),
        request_id: Some("r-entry".into()),
        event_id: Some(40),
        ..crate::fixtures::entity("job", "j1", state)
    };
    Held::new(Arc::new(job()), e, None, None)
}

fn item(kind: InboxKind, event: &str, params: Value) -> InboxItem {
    InboxItem {
        id: 50,
        entity_id: 7,
        event: event.into(),
        params,
        request_id: Some("r-item".into()),
        kind,
        created_at: NOW - 100,
        reply: None,
    }
}

fn raised(event: &str) -> InboxItem {
    item(InboxKind::Raised, event, Value::Null)
}

/// The commit of a decided next step (panics on any other step).
fn committed(next: Next) -> Decided {
    match next {
        Next::Commit(d) => *d,
        other => panic!("expected a commit, got {other:?}"),
    }
}

/// A short description of a next step, for the tables.
fn step_of(next: &Next) -> String {
    match next {
        Next::Commit(d) => {
            let c = &d.commit;
            format!("commit {:?} {} -> {}", c.kind, c.from, c.to.as_deref().unwrap_or("-"))
        }
        Next::Run { action, item } => {
            format!("run {} for {}", action.name, item.as_ref().map_or("auto".to_string(), |i| i.event.to_string()))
        }
        Next::Evaluate { notice } => format!("evaluate notice {}", notice.id),
        Next::Hooks(h) => {
            let run: Vec<String> = h
                .run
                .iter()
                .map(|hook| {
                    format!("{} {} of {}", if hook.exit { "exit" } else { "entry" }, hook.action.name, hook.state)
                })
                .collect();
            format!("hooks [{}] after {}", run.join(", "), h.action.name)
        }
        Next::Acquire(a) => {
            let slots: Vec<String> = a
                .slots
                .iter()
                .map(|s| {
                    let max = s.max.map(|m| format!(" of {m}")).unwrap_or_default();
                    let rate = s.rate.map(|r| format!(" at {}/{}ms", r.starts, r.per_ms)).unwrap_or_default();
                    let fair = if s.fair.is_empty() { String::new() } else { format!(" fair {}", s.fair) };
                    format!("{}[{}]{max}{rate}{fair}", s.limit, s.key)
                })
                .collect();
            format!("acquire {}", slots.join(", "))
        }
        Next::Release => "release".to_string(),
    }
}

#[test]
fn the_next_step_of_a_held_entity() {
    let registry = registry();
    let env = Env { registry: &registry, owner: OWNER, now: NOW };
    let notice = item(InboxKind::Notice, "", Value::Null);
    let timer = |name: &str, event: &str| item(InboxKind::Timer, event, json!({ "timer": name }));
    type Case<'a> = (&'a str, Option<i64>, Vec<&'a str>, Option<InboxItem>, &'a str);
    // (state, auto_at, fired, inbox head) → the step decided
    let cases: Vec<Case<'_>> = vec![
        ("idle", None, vec![], Some(raised("go")), "commit Event idle -> working"),
        ("working", Some(NOW + 1), vec![], Some(raised("go")), "commit Rejected working -> -"),
        ("idle", None, vec![], Some(raised("poke")), "run poke_it for poke"),
        ("done", None, vec![], Some(timer("tick", "check")), "commit Event done -> done"),
        ("idle", None, vec![], Some(timer("tick", "check")), "commit Rejected idle -> -"),
        ("waiting", None, vec![], Some(timer("timeout:report", "give_up")), "commit Event waiting -> broken"),
        ("waiting", None, vec![], Some(notice.clone()), "evaluate notice 50"),
        ("waiting", None, vec!["report"], Some(notice.clone()), "commit Event waiting -> -"),
        ("idle", None, vec![], Some(notice), "commit Event idle -> -"),
        ("working", Some(NOW), vec![], None, "run work for auto"),
        ("working", Some(NOW + 1), vec![], None, "release"),
        ("working", None, vec![], None, "run work for auto"),
        ("fetching", Some(NOW), vec![], None, "commit Auto fetching -> -"),
        ("fetching", None, vec![], None, "release"),
        ("done", None, vec![], None, "release"),
    ];
    for (state, auto_at, fired, head, expected) in cases {
        let mut h = held(state);
        h.entity.properties.insert("result".into(), json!(1));
        h.entity.auto_at = auto_at;
        h.entity.fired = fired.iter().map(|f| (*f).into()).collect();
        h.inbox_head = head.clone();
        let next = next(&mut h, &env);
        assert_eq!(step_of(&next), expected, "{state} (auto at {auto_at:?}, fired {fired:?}) with {head:?}");
        assert!(h.inbox_head.is_none(), "the head is taken");
    }
}

#[test]
fn a_plain_event_commits_its_transition_with_telemetry_and_the_caller_hears_accepted() {
    let registry = registry();
    let env = Env { registry: &registry, owner: OWNER, now: NOW };
    let mut h = held("idle");
    h.inbox_head = Some(raised("go"));
    let d = committed(next(&mut h, &env));
    let c = &d.commit;
    assert_eq!((c.fence.entity_id, c.fence.version, c.fence.owner.as_str()), (7, 3, OWNER));
    assert_eq!((c.to.as_deref(), c.retry, c.auto_at), (Some("working"), 0, Some(NOW + 1_000)));
    assert_eq!((c.kind, c.consume, c.request_id.as_deref()), (HistoryKind::Event, Some(50), Some("r-item")));
    assert_eq!(c.after, AfterCommit::Release, "the auto action waits 1 s: nothing to hold the lease for");
    assert!(c.notify_predecessors && !c.notify_self);
    assert_eq!(c.timers.as_deref(), Some(&[][..]), "the machine has timers: the entry replaces them");
    let t = c.telemetry.transition.as_ref().unwrap();
    assert_eq!((t.kind, t.start_time, t.outcome), ("event", NOW - 100, "ok"));
    assert!(!c.telemetry.at_rest && !c.telemetry.complete);
    assert_eq!(d.outcome, Some(EventOutcome::Accepted { state: "working".into() }));
    let mut expect = d.expect();
    assert_eq!(expect.event_id, Some(50), "the event just processed is the entity's workflow now");
    assert!(!expect.apply(&mut h, 4, NOW + 5), "working is not at rest");
    assert_eq!((h.entity.state.as_str(), h.entity.version, h.entity.entered_at), ("working", 4, NOW + 5));
    assert_eq!(h.entity.request_id.as_deref(), Some("r-item"));
}

#[test]
fn a_rejected_event_is_consumed_with_its_declared_reason_and_changes_nothing() {
    let registry = registry();
    let env = Env { registry: &registry, owner: OWNER, now: NOW };
    let mut h = held("working");
    h.entity.auto_at = Some(NOW - 1);
    h.inbox_head = Some(raised("go"));
    let d = committed(next(&mut h, &env));
    assert_eq!(d.outcome, Some(EventOutcome::Rejected { state: "working".into(), reason: "already working".into() }));
    let c = &d.commit;
    assert_eq!((c.to.as_ref(), c.properties.as_ref(), c.consume), (None, None, Some(50)));
    assert_eq!(c.detail.as_deref(), Some("already working"));
    assert_eq!(c.after, AfterCommit::Hold, "the auto action is due: keep the lease and run it");
    assert!(c.telemetry.event.as_ref().is_some_and(|e| e.rejected));
    assert!(matches!(&d.note, Some(Note::Rejected { reason, .. }) if reason == "already working"));
}

#[test]
fn outcomes_become_transitions_retries_or_faults() {
    let registry = registry();
    let env = Env { registry: &registry, owner: OWNER, now: NOW };
    let work = job().action("work").unwrap().clone();
    let with_result = Outcome::to("done").set("result", json!(42));
    type Case<'a> = (Outcome, u32, &'a str, u32, Option<i64>, bool);
    // (outcome, retry before) → (state entered or the fault, retry after, auto_at, at rest)
    let cases: Vec<Case<'_>> = vec![
        (with_result, 0, "done", 0, None, true),
        (Outcome::retry_after(Duration::from_millis(250)), 2, "working", 3, Some(NOW + 250), false),
        (Outcome::stay(), 0, "working", 1, Some(NOW + 1_000), false),
        (Outcome::to("done"), 0, "fault: state `done` of machine `job` requires `result`", 1, Some(NOW + 2_000), false),
        (
            Outcome::to("idle"),
            0,
            "fault: action `work` of machine `job` may not move to `idle` (declared: done, broken)",
            1,
            Some(NOW + 2_000),
            false,
        ),
        (
            Outcome::to("broken").create("nope", "n1", Properties::new()),
            0,
            "fault: create[0]: unknown machine `nope`",
            1,
            Some(NOW + 2_000),
            false,
        ),
        (
            Outcome::to("broken").raise("job", "j2", "go", json!({"x": 1})),
            0,
            "fault: raise[0]: event `go` on machine `job` has no parameter `x` (declared: none)",
            1,
            Some(NOW + 2_000),
            false,
        ),
        (
            Outcome::to("broken").raise_on(Related::Successors, "shout", Value::Null),
            0,
            "fault: raise_on[0]: raises `shout` on its successors, but no machine declares that event",
            1,
            Some(NOW + 2_000),
            false,
        ),
        (
            Outcome::to("broken").raise_on(Related::Predecessors, "go", json!([1])),
            0,
            "fault: raise_on[0]: raises `go` on its predecessors: parameters of event `go` on machine `job` must be a JSON object",
            1,
            Some(NOW + 2_000),
            false,
        ),
    ];
    for (outcome, retry, expected, retry_after, auto_at, at_rest) in cases {
        let mut h = held("working");
        h.entity.retry = retry;
        let d = committed(action_done(&mut h, &work, None, Ok(outcome.clone()), Vec::new(), NOW - 20, &env));
        let c = &d.commit;
        let got = match &d.note {
            Some(Note::Fault { details, .. }) => format!("fault: {details}"),
            _ => c.to.as_deref().unwrap_or("-").to_string(),
        };
        assert_eq!(got, expected, "{outcome:?}");
        assert_eq!((c.retry, c.auto_at, c.telemetry.at_rest), (retry_after, auto_at, at_rest), "{outcome:?}");
        assert_eq!(c.kind, if got.starts_with("fault") { HistoryKind::Fault } else { HistoryKind::Auto });
    }
}

#[test]
fn the_fault_policy_backs_off_doubling_then_parks() {
    let registry = registry();
    let env = Env { registry: &registry, owner: OWNER, now: NOW };
    let work = job().action("work").unwrap().clone();
    // Errors already recorded → run status, sleep until, auto action time
    let cases: Vec<(Vec<i64>, RunStatus, Option<i64>, i64)> = vec![
        (vec![], RunStatus::Fault, Some(NOW + 2_000), NOW + 2_000),
        (vec![NOW - 10], RunStatus::Fault, Some(NOW + 4_000), NOW + 4_000),
        (vec![NOW - 20, NOW - 10], RunStatus::Failed, None, NOW),
        // Errors older than the window are forgotten.
        (vec![NOW - 7_200_000, NOW - 3_700_000], RunStatus::Fault, Some(NOW + 2_000), NOW + 2_000),
    ];
    for (recent, status, until, auto_at) in cases {
        let mut h = held("working");
        h.entity.recent_errors = recent.clone();
        let error = FaultError::new("action_error", "action error: provider down");
        let d = committed(action_done(&mut h, &work, None, Err(error), Vec::new(), NOW - 20, &env));
        let c = &d.commit;
        assert_eq!(c.run_status, Some((status, until)), "after {recent:?}");
        assert_eq!((c.to.as_deref(), c.auto_at), (Some("working"), Some(auto_at)), "after {recent:?}");
        assert_eq!(c.telemetry.error.as_ref().map(|e| e.kind), Some("action_error"));
        assert_eq!(c.telemetry.at_rest, status == RunStatus::Failed, "a parked entity is at rest");
    }
}

#[test]
fn an_event_whose_action_fails_is_consumed_and_its_caller_hears_failed() {
    let registry = registry();
    let env = Env { registry: &registry, owner: OWNER, now: NOW };
    let poke = job().action("poke_it").unwrap().clone();
    let mut h = held("idle");
    let error = FaultError::new("panic", "action panicked: boom");
    let d = committed(action_done(&mut h, &poke, Some(raised("poke")), Err(error), Vec::new(), NOW - 5, &env));
    assert_eq!(d.outcome, Some(EventOutcome::Failed { error: "action panicked: boom".into() }));
    let c = &d.commit;
    assert_eq!((c.to.as_ref(), c.consume, c.kind), (None, Some(50), HistoryKind::Fault));
    assert!(c.telemetry.at_rest && c.telemetry.complete);
    assert_eq!(c.run_status, None, "one error backs off nothing: the state is stable");
}

#[test]
fn subscription_progress_counts_what_the_pattern_sees() {
    let registry = registry();
    let m = job();
    let child = |state: &str| EntityRow { state: state.into(), ..held("idle").entity };
    let mut waiting = held("waiting").entity;
    let progress = |e: &EntityRow, kids: &[EntityRow]| subscription_progress(&m, &registry, e, kids);
    let p = progress(&waiting, &[child("done"), child("idle")]);
    assert_eq!(p.len(), 1, "{p:?}");
    assert_eq!((p[0].event.as_str(), p[0].fired), ("report", false));
    let seen = p[0].progress;
    assert_eq!((seen.selected, seen.satisfying, seen.holds), (2, 1, false));
    // It holds exactly when the subscription would fire, and says so once it did.
    let kids = [child("done"), child("done")];
    assert!(progress(&waiting, &kids)[0].progress.holds);
    assert!(subscription_fires(&m, &registry, "waiting", &[], &kids).is_some());
    waiting.fired = vec!["report".into()];
    assert!(progress(&waiting, &kids)[0].fired);
    assert!(progress(&held("idle").entity, &kids).is_empty(), "no subscription is valid in idle");
}

#[test]
fn a_fired_subscription_runs_its_event_and_records_it_once_per_entry() {
    let registry = registry();
    let env = Env { registry: &registry, owner: OWNER, now: NOW };
    let m = job();
    let child = |state: &str| EntityRow { state: state.into(), ..held("idle").entity };
    let fire = subscription_fires(&m, &registry, "waiting", &[], &[child("done"), child("done")]);
    assert_eq!(fire.as_ref().map(|f| f.0.as_str()), Some("report"));
    assert_eq!(subscription_fires(&m, &registry, "waiting", &[], &[child("done"), child("idle")]), None);
    assert_eq!(subscription_fires(&m, &registry, "waiting", &["report".into()], &[child("done")]), None);
    let mut h = held("waiting");
    h.entity.properties.insert("result".into(), json!(1));
    let notice = item(InboxKind::Notice, "", Value::Null);
    let d = committed(evaluated(&mut h, notice.clone(), fire, Some(57), &env));
    let c = &d.commit;
    assert_eq!((c.to.as_deref(), c.event.as_deref()), (Some("done"), Some("report")));
    assert_eq!(c.consume_notices_upto, Some(57), "every notice the snapshot covered");
    assert_eq!(c.fired.as_deref(), Some(&[][..]), "a new state entry starts with none fired");
    let mut h = held("waiting");
    let d = committed(evaluated(&mut h, notice, None, None, &env));
    assert!(d.commit.quiet && d.commit.consume_notices_upto == Some(50));
}

#[test]
fn agent_reports_conclude_the_current_entry_only() {
    let registry = registry();
    let env = Env { registry: &registry, owner: OWNER, now: NOW };
    let report = |version: i64, result: TaskResult| {
        let r = AgentReport { task: 9, entity_version: version, attempt: 1, leased_at: NOW - 300, agent: None, result };
        item(InboxKind::Agent, "fetch", r.to_json())
    };
    let properties: Properties = [("result".to_string(), json!(1))].into_iter().collect();
    let complete = TaskResult::complete("done", properties);
    let failed = TaskResult::Fail { error: "quota".into(), retryable: false };
    // (entity version, report) → what is committed
    let cases = [
        (3, complete.clone(), "done", HistoryKind::Auto),
        (2, complete, "-", HistoryKind::Event),
        (3, failed, "fetching", HistoryKind::Fault),
    ];
    for (version, result, to, kind) in cases {
        let mut h = held("fetching");
        h.inbox_head = Some(report(version, result.clone()));
        let d = committed(next(&mut h, &env));
        let c = &d.commit;
        assert_eq!((c.to.as_deref().unwrap_or("-"), c.kind, c.consume), (to, kind, Some(50)), "{result:?}");
        if kind == HistoryKind::Fault {
            assert_eq!(c.run_status.map(|s| s.0), Some(RunStatus::Failed), "not retryable: parked at once");
        }
        if version == 2 {
            assert!(c.quiet && matches!(d.note, Some(Note::ReportDropped { stale: true, .. })));
        }
    }
}

#[test]
fn entering_a_state_writes_its_timers_and_its_agent_task() {
    let registry = registry();
    let env = Env { registry: &registry, owner: OWNER, now: NOW };
    let work = job().action("work").unwrap().clone();
    let mut h = held("working");
    let d = transition::finish(
        &mut h,
        Ran {
            action: &work,
            item: None,
            outcome: Outcome::to("done").set("result", json!(1)),
            locks: Vec::new(),
            started: None,
        },
        &env,
    );
    let timers = d.commit.timers.unwrap();
    assert_eq!(timers.len(), 1);
    let t = &timers[0];
    assert_eq!(
        (t.name.as_str(), t.event.as_str(), t.due_at, t.every_ms, t.restart),
        ("tick", "check", NOW + 60_000, Some(60_000), true)
    );
    // Entering `waiting` starts its subscription's timeout.
    let poke = job().action("poke_it").unwrap().clone();
    let mut h = held("idle");
    let d = transition::finish(
        &mut h,
        Ran {
            action: &poke,
            item: Some(raised("poke")),
            outcome: Outcome::to("waiting"),
            locks: Vec::new(),
            started: Some(NOW),
        },
        &env,
    );
    let timers = d.commit.timers.unwrap();
    assert_eq!(
        timers.iter().map(|t| (t.name.as_str(), t.due_at)).collect::<Vec<_>>(),
        [("timeout:report", NOW + 600_000)]
    );
    assert!(d.commit.notify_self, "a state with subscriptions evaluates them on entry");
    // A new entity whose initial auto action an agent executes offers its task.
    let fetcher = MachineBuilder::new("fetcher")
        .state("fetching")
        .initial()
        .auto("fetch")
        .state("done")
        .action("fetch", ["done"])
        .agent("q", Duration::from_secs(30))
        .build()
        .unwrap();
    let new = new_entity(&fetcher, "f1".into(), Properties::new(), None, NOW).unwrap();
    let offer = new.offer.unwrap();
    assert_eq!((offer.queue.as_str(), offer.lock_ms, offer.available_at, new.auto_at), ("q", 30_000, NOW, None));
}

#[test]
fn the_current_event_is_the_one_that_moved_the_entity_on_or_stays() {
    use settle_store::{Commit, Fence};
    // (moves on, processes an event, at rest) → the entity's current event afterwards, and
    // the event its auto actions run for (`None`: unchanged; `Some(None)`: none).
    let go = || Some(Some(settle_store::Trigger { event: "go".into(), params: json!({"n": 1}), reply: None }));
    let cases = [
        (true, true, false, Some(42), go()), // an event moved it into a working state: that event
        (true, false, false, Some(5), None), // an auto action moved it on: the event it works for
        (false, true, false, Some(5), None), // an event that did not move it: unchanged
        (false, false, false, Some(5), None), // nothing processed: unchanged
        (true, true, true, None, Some(None)), // at rest: none
        (false, false, true, None, Some(None)), // at rest: none
    ];
    for (moves, event, at_rest, want, trigger) in cases {
        let fence = Fence { entity_id: 7, version: 3, owner: OWNER.into() };
        let mut c = Commit::new(fence, "idle".into(), HistoryKind::Event, AfterCommit::Release);
        c.to = moves.then(|| "working".into());
        c.event = event.then(|| "go".into());
        c.consume = Some(42);
        c.telemetry.current_event = Some(5);
        c.telemetry.at_rest = at_rest;
        c.telemetry.event = event.then_some(settle_store::EventRecord {
            kind: "raised",
            seq: 42,
            raised_at: NOW,
            rejected: false,
            failed: false,
            params: json!({"n": 1}),
            reply: None,
        });
        let d = Decided::new(c);
        let expect = d.expect();
        assert_eq!(
            (expect.event_id, expect.trigger),
            (want, trigger),
            "moves {moves}, event {event}, at rest {at_rest}"
        );
    }
}

/// `tree`: `up` (a parent: `a` initial, then `b`, unstable, whose handler-less auto action
/// moves to `down`), `down` and `side`; `noise` is valid in `down` and ignored in `up` and
/// `side`; in `down`, `mark` runs a declarative action and `tweak` is internal.
fn tree() -> Machine {
    MachineBuilder::new("tree")
        .state("up")
        .initial()
        .initial_child("a")
        .state("a")
        .parent("up")
        .state("b")
        .parent("up")
        .auto("next")
        .state("down")
        .state("side")
        .event("step", ["a"], "to_b")
        .event("noise", ["down"], "stay")
        .ignore(["up", "side"])
        .event("leave", ["down"], "to_side")
        .event("mark", ["down"], "marking")
        .event("tweak", ["down"], "tweaking")
        .internal()
        .event("label", ["down"], "labeling")
        .params(["n"])
        .action("marking", ["down"])
        .sets("flag", json!(true))
        .event("sprout", ["down"], "sprouting")
        .action("sprouting", ["down"])
        .creates("tree", "key + '-kid'", json!({"from": "key", "depth": 1}), Some(("step", Value::Null)))
        .action("labeling", ["down"])
        .sets("label", json!("key + '-' + string(params.n)"))
        .sets("twice", json!("params.n * 2"))
        .action("tweaking", Vec::<&str>::new())
        .action("to_b", ["b"])
        .action("next", ["down"])
        .action("stay", ["down"])
        .action("to_side", ["side"])
        .build()
        .unwrap()
}

/// `registry()` with `tree` too, and handlers bound to `job`'s `recheck` and `finish`.
fn registry_with_tree() -> Registry {
    let mut r = registry();
    let t = tree();
    r.hashes.insert(t.name().clone(), t.content_hash());
    r.machines.insert(t.name().clone(), Arc::new(t));
    for action in ["recheck", "finish"] {
        r.handlers.insert(("job".into(), action.into()), handler(|_| async { Ok(Outcome::stay()) }));
    }
    r
}

fn held_tree(state: &str) -> Held {
    let e =
        EntityRow { id: 8, version: 2, retry: 1, event_id: Some(41), ..crate::fixtures::entity("tree", "t1", state) };
    Held::new(Arc::new(tree()), e, None, None)
}

#[test]
fn a_rejected_or_ignored_event_is_recorded_and_changes_nothing_else() {
    let registry = registry_with_tree();
    let env = Env { registry: &registry, owner: OWNER, now: NOW };
    // (entity, event) → kind, detail, at rest afterwards
    let cases: Vec<(Held, &str, HistoryKind, &str, bool)> = vec![
        (held("working"), "go", HistoryKind::Rejected, "already working", false),
        (held("done"), "go", HistoryKind::Rejected, "event `go` is not valid in state `done`", true),
        (held_tree("side"), "noise", HistoryKind::Ignored, "ignored in `side`", true),
        (held_tree("a"), "noise", HistoryKind::Ignored, "ignored in `up`, which contains `a`", true),
    ];
    for (mut h, event, kind, detail, at_rest) in cases {
        h.entity.retry = 2;
        let (state, hash) = (h.entity.state.clone(), registry.hash(h.machine.name()));
        let raised = raised(event);
        h.inbox_head = Some(raised.clone());
        let d = committed(next(&mut h, &env));
        let c = &d.commit;
        assert_eq!((c.kind, c.detail.as_deref(), c.to.as_ref()), (kind, Some(detail), None), "{state} {event}");
        assert_eq!((c.retry, c.event.as_deref(), c.consume), (2, Some(event), Some(50)), "{state} {event}");
        assert_eq!((c.request_id.as_deref(), &c.machine_hash), (Some("r-item"), &hash), "{state} {event}");
        let t = &c.telemetry;
        assert_eq!((t.at_rest, t.complete, t.current_event), (at_rest, true, h.entity.event_id), "{state} {event}");
        let record = t.event.as_ref().map(|r| (r.kind, r.seq, r.rejected, r.failed));
        assert_eq!(record, Some(("raised", 50, kind == HistoryKind::Rejected, false)), "{state} {event}");
        assert_eq!(d.item, Some(raised), "whoever waits on the event hears of it");
        let answer = match kind {
            HistoryKind::Rejected => EventOutcome::Rejected { state: state.clone(), reason: detail.into() },
            _ => EventOutcome::Ignored { state: state.clone() },
        };
        assert_eq!(d.outcome, Some(answer), "{state} {event}");
    }
}

#[test]
fn an_event_reaches_its_action_with_its_own_parameters() {
    let registry = registry_with_tree();
    let env = Env { registry: &registry, owner: OWNER, now: NOW };
    let run_item = |next: Next| match next {
        Next::Run { item: Some(item), .. } => item,
        other => panic!("expected an action to run, got {other:?}"),
    };
    // A timer's event: the timer's name is the inbox's business, not the action's.
    let mut h = held("done");
    h.entity.properties.insert("result".into(), json!(1));
    h.inbox_head = Some(item(InboxKind::Timer, "check", json!({"timer": "tick"})));
    let i = run_item(next(&mut h, &env));
    assert_eq!((i.event.as_str(), &i.params), ("check", &Value::Null));
    // A subscription that fired: what matched reaches the action.
    let mut h = held("waiting");
    let notice = item(InboxKind::Notice, "", Value::Null);
    let fired = json!({"matched": [{"machine": "job", "key": "j2"}]});
    let i = run_item(evaluated(&mut h, notice, Some(("report".into(), fired.clone())), Some(60), &env));
    assert_eq!((i.event.as_str(), &i.params), ("report", &fired));
    assert_eq!(h.firing.as_ref().map(|f| f.notices_upto), Some(60));
}

#[test]
fn a_due_auto_action_without_a_handler_moves_on_by_itself() {
    let registry = registry_with_tree();
    let env = Env { registry: &registry, owner: OWNER, now: NOW };
    let mut h = held_tree("b");
    h.entity.auto_at = Some(NOW - 1);
    let d = committed(next(&mut h, &env));
    assert_eq!((d.commit.kind, d.commit.to.as_deref()), (HistoryKind::Auto, Some("down")));
}

#[test]
fn successors_are_seen_in_their_states_ancestors_too() {
    let (t, j) = (tree(), job());
    let rows = [crate::fixtures::entity("tree", "t1", "b"), crate::fixtures::entity("job", "j1", "done")];
    let machine_of = |name: &str| match name {
        "tree" => Some(&t),
        "job" => Some(&j),
        _ => None,
    };
    let ancestors = with_views(machine_of, &rows, |views| {
        views.iter().map(|v| (v.state.to_string(), v.ancestors.join(","))).collect::<Vec<_>>()
    });
    assert_eq!(ancestors, [("b".to_string(), "up".to_string()), ("done".to_string(), String::new())]);
}

#[test]
fn notices_nothing_listens_to_are_consumed_quietly_and_a_due_agent_action_is_offered() {
    let registry = registry_with_tree();
    let env = Env { registry: &registry, owner: OWNER, now: NOW };
    // (state, how the notice is handled, newest notice of the snapshot) → notices consumed up to
    for (state, evaluate, newest, upto) in
        [("idle", false, None, i64::MAX), ("waiting", true, Some(70), 70), ("waiting", true, None, 50)]
    {
        let mut h = held(state);
        h.entity.retry = 2;
        let notice = InboxItem { request_id: Some("r-notice".into()), ..item(InboxKind::Notice, "", Value::Null) };
        let d = if evaluate {
            committed(evaluated(&mut h, notice, None, newest, &env))
        } else {
            h.inbox_head = Some(notice);
            committed(next(&mut h, &env))
        };
        let c = &d.commit;
        assert!(c.quiet, "{state}: no history row");
        assert_eq!((c.consume, c.consume_notices_upto), (Some(50), Some(upto)), "{state}");
        assert_eq!((c.retry, c.request_id.as_deref(), c.to.as_ref()), (2, Some("r-notice"), None), "{state}");
        let t = &c.telemetry;
        assert_eq!((t.at_rest, t.complete, t.current_event), (true, true, Some(40)), "{state}");
    }
    // An agent's auto action due without its task (a resume, a retry-now): offered now.
    let mut h = held("fetching");
    h.entity.retry = 3;
    h.entity.auto_at = Some(NOW);
    let d = committed(next(&mut h, &env));
    let c = &d.commit;
    assert!(c.quiet, "no history row");
    assert_eq!((c.retry, c.request_id.as_deref(), c.to.as_ref()), (3, Some("r-entry"), None));
    assert_eq!(
        c.offer.as_ref().map(|o| (o.queue.as_str(), o.action.as_str(), o.available_at)),
        Some(("q", "fetch", NOW))
    );
    assert_eq!((&c.machine_hash, c.telemetry.current_event), (&registry.hash("job"), Some(40)));
}

#[test]
fn a_failed_action_is_a_fault_recorded_with_its_cause() {
    let registry = registry();
    let env = Env { registry: &registry, owner: OWNER, now: NOW };
    let poke = job().action("poke_it").unwrap().clone();
    let work = job().action("work").unwrap().clone();
    // An event's action and an auto action, each failing once after an earlier error.
    for (state, action, item) in [("idle", &poke, Some(raised("poke"))), ("working", &work, None)] {
        let mut h = held(state);
        h.entity.retry = 2;
        h.entity.recent_errors = vec![NOW - 5_000];
        let failed = Err(FaultError::new("action_error", "action error: quota exceeded"));
        let d = committed(action_done(&mut h, action, item.clone(), failed, Vec::new(), NOW - 20, &env));
        let c = &d.commit;
        assert_eq!((c.kind, c.action.as_deref()), (HistoryKind::Fault, Some(action.name.as_str())), "{state}");
        assert_eq!(c.detail.as_deref(), Some("action error: quota exceeded"), "{state}");
        assert_eq!(c.recent_errors, Some(vec![NOW - 5_000, NOW]), "{state}: the errors the policy counts");
        assert_eq!(c.machine_hash, registry.hash("job"), "{state}");
        let error = c.telemetry.error.as_ref().map(|e| (e.kind, e.details.as_str()));
        assert_eq!(error, Some(("action_error", "action error: quota exceeded")), "{state}");
        // An event's action changes no state and keeps the retry count; an auto action
        // re-enters its state after the backoff, counting a retry.
        let (retry, to) = if item.is_some() { (2, None) } else { (3, Some("working")) };
        assert_eq!((c.retry, c.to.as_deref()), (retry, to), "{state}");
    }
}

#[test]
fn a_faults_record_says_whether_it_is_retried_and_what_comes_next() {
    let registry = registry_with_tree();
    let env = Env { registry: &registry, owner: OWNER, now: NOW };
    let work = job().action("work").unwrap().clone();
    let to_b = tree().action("to_b").unwrap().clone();
    let error = |fatal: bool| FaultError { fatal, ..FaultError::new("action_error", "boom") };
    // An event's action failing while the state's own auto action is due: the entity
    // keeps its lease to run it; the event is answered.
    let mut h = held_tree("b");
    h.entity.auto_at = Some(NOW - 1);
    let step = raised("step");
    let d = committed(action_done(&mut h, &to_b, Some(step.clone()), Err(error(false)), Vec::new(), NOW, &env));
    let c = &d.commit;
    assert_eq!((c.after, c.to.as_ref(), d.item.as_ref()), (AfterCommit::Hold, None, Some(&step)));
    assert_eq!(c.telemetry.error.as_ref().map(|e| e.retried), Some(false), "an event's action is not retried");
    assert_eq!((c.telemetry.current_event, c.telemetry.complete), (Some(41), true));
    assert_eq!(d.outcome, Some(EventOutcome::Failed { error: "boom".into() }));
    // An auto action backing off runs again; parked, it waits for an operator.
    for (fatal, retried, at_rest) in [(false, true, false), (true, false, true)] {
        let mut h = held("working");
        let d = committed(action_done(&mut h, &work, None, Err(error(fatal)), Vec::new(), NOW, &env));
        let t = &d.commit.telemetry;
        assert_eq!(t.error.as_ref().map(|e| e.retried), Some(retried), "fatal {fatal}");
        assert_eq!((t.at_rest, t.complete, t.current_event), (at_rest, at_rest, Some(40)), "fatal {fatal}");
        let tr = t.transition.as_ref().map(|tr| (tr.kind, tr.outcome, tr.entry_time));
        assert_eq!(tr, Some(("auto_action", "error", NOW - 5_000)), "fatal {fatal}");
    }
}

#[test]
fn an_internal_transition_commits_its_effects_and_stays() {
    let registry = registry_with_tree();
    let env = Env { registry: &registry, owner: OWNER, now: NOW };
    let tweaking = tree().action("tweaking").unwrap().clone();
    let outcome = Outcome::stay()
        .set("tweaked", json!(1))
        .sql("UPDATE audit SET n = n + 1", [])
        .create("tree", "t2", Properties::new())
        .raise("tree", "t3", "leave", Value::Null)
        .raise_on(Related::Successors, "noise", Value::Null);
    let mut h = held_tree("down");
    let tweak = item(InboxKind::Raised, "tweak", Value::Null);
    let d = committed(action_done(&mut h, &tweaking, Some(tweak), Ok(outcome), vec![(9, 4)], NOW - 20, &env));
    let c = &d.commit;
    assert_eq!((c.kind, c.internal, c.to.as_ref(), c.retry), (HistoryKind::Internal, true, None, 1));
    assert_eq!((c.consume, c.action.as_deref(), c.event.as_deref()), (Some(50), Some("tweaking"), Some("tweak")));
    assert_eq!(c.properties, Some(json!({"tweaked": 1}).as_object().cloned().unwrap()));
    assert_eq!((c.request_id.as_deref(), &c.machine_hash), (Some("r-item"), &registry.hash("tree")));
    assert_eq!((c.sql.len(), c.creates.len(), c.pushes.len(), c.push_related.len()), (1, 1, 1, 1));
    assert_eq!(c.preconditions, [(9, 4)]);
    let t = &c.telemetry;
    assert_eq!((t.at_rest, t.complete, t.current_event), (true, true, Some(41)));
    assert_eq!(t.transition.as_ref().map(|tr| (tr.kind, tr.outcome)), Some(("internal", "ok")));
    assert_eq!(t.event.as_ref().map(|r| r.seq), Some(50));
    assert_eq!((d.item.as_ref().map(|i| i.id), d.action.as_deref()), (Some(50), Some("tweaking")));
    assert_eq!(d.outcome, Some(EventOutcome::Accepted { state: "down".into() }));
    // Naming its own state is staying; naming another is refused.
    let stays = Outcome::to("down");
    let d =
        committed(action_done(&mut held_tree("down"), &tweaking, Some(raised("tweak")), Ok(stays), vec![], NOW, &env));
    assert_eq!(d.commit.kind, HistoryKind::Internal);
    let moves = Outcome::to("side");
    let d =
        committed(action_done(&mut held_tree("down"), &tweaking, Some(raised("tweak")), Ok(moves), vec![], NOW, &env));
    assert!(
        matches!(&d.note, Some(Note::Fault { details, .. }) if details.contains("an internal transition stays in its state"))
    );
}

#[test]
fn a_declarative_action_commits_what_it_declares() {
    let registry = registry_with_tree();
    let env = Env { registry: &registry, owner: OWNER, now: NOW };
    let mut h = held_tree("down");
    h.inbox_head = Some(raised("mark"));
    let d = committed(next(&mut h, &env));
    assert_eq!(d.commit.to.as_deref(), Some("down"));
    assert_eq!(d.commit.properties, Some(json!({"flag": true}).as_object().cloned().unwrap()));
}

#[test]
fn a_declarative_action_computes_its_values_from_the_event_and_the_entity() {
    let registry = registry_with_tree();
    let env = Env { registry: &registry, owner: OWNER, now: NOW };
    let mut h = held_tree("down");
    h.inbox_head = Some(item(InboxKind::Raised, "label", json!({"n": 3})));
    let d = committed(next(&mut h, &env));
    assert_eq!(d.commit.to.as_deref(), Some("down"));
    assert_eq!(d.commit.properties, Some(json!({"label": "t1-3", "twice": 6}).as_object().cloned().unwrap()));
    // A value that cannot be computed is a fault of the transition: nothing of it commits.
    let mut h = held_tree("down");
    h.inbox_head = Some(item(InboxKind::Raised, "label", json!({"n": "three"})));
    let d = committed(next(&mut h, &env));
    assert_eq!((d.commit.to.as_deref(), &d.commit.properties), (None, &None));
    assert!(
        matches!(&d.note, Some(Note::Fault { details, .. }) if details.contains("set.twice: `params.n * 2`")),
        "{:?}",
        d.note
    );
}

#[test]
fn a_declarative_action_creates_entities_and_raises_their_first_event() {
    let registry = registry_with_tree();
    let env = Env { registry: &registry, owner: OWNER, now: NOW };
    let mut h = held_tree("down");
    h.inbox_head = Some(raised("sprout"));
    let d = committed(next(&mut h, &env));
    let c = &d.commit;
    let created: Vec<(&str, &str, Value)> =
        c.creates.iter().map(|n| (n.machine.as_str(), n.key.as_str(), Value::Object(n.properties.clone()))).collect();
    assert_eq!(created, [("tree", "t1-kid", json!({"from": "t1", "depth": 1}))]);
    let pushed: Vec<(&str, &str)> = c.pushes.iter().map(|p| (p.key.as_str(), p.event.as_str())).collect();
    assert_eq!(pushed, [("t1-kid", "step")]);
}

#[test]
fn a_transition_commits_the_actions_whole_outcome() {
    let registry = registry_with_tree();
    let env = Env { registry: &registry, owner: OWNER, now: NOW };
    let work = job().action("work").unwrap().clone();
    let outcome = Outcome::to("done")
        .set("result", json!(1))
        .sql("UPDATE audit SET n = n + 1", [])
        .create("tree", "t9", Properties::new())
        .raise("tree", "t3", "leave", Value::Null)
        .raise_on(Related::Successors, "noise", Value::Null);
    let mut h = held("working");
    let d = committed(action_done(&mut h, &work, None, Ok(outcome), vec![(9, 4)], NOW - 20, &env));
    let c = &d.commit;
    assert_eq!(
        (c.kind, c.to.as_deref(), c.retry, c.action.as_deref()),
        (HistoryKind::Auto, Some("done"), 0, Some("work"))
    );
    assert_eq!(c.properties, Some(json!({"result": 1}).as_object().cloned().unwrap()));
    assert_eq!((c.sql.len(), c.creates.len(), c.pushes.len(), c.push_related.len()), (1, 1, 1, 1));
    assert_eq!((c.preconditions.as_slice(), c.notify_predecessors), (&[(9, 4)][..], true));
    assert!(c.timers.is_some(), "entering `done` plans its periodic timer");
    assert_eq!(&c.machine_hash, &registry.hash("job"));
    let t = &c.telemetry;
    assert_eq!(t.transition.as_ref().map(|tr| (tr.kind, tr.outcome)), Some(("auto_action", "ok")));
    assert_eq!((t.at_rest, t.complete), (true, true));
    // A retry at once keeps the lease to run again; an agent's action offers its task
    // instead, and lets the lease go.
    let fetch = job().action("fetch").unwrap().clone();
    for (state, action, after, auto_at, offered) in [
        ("working", &work, AfterCommit::Hold, Some(NOW), false),
        ("fetching", &fetch, AfterCommit::Release, None, true),
    ] {
        let again = Outcome::retry_after(Duration::ZERO);
        let d = committed(action_done(&mut held(state), action, None, Ok(again), vec![], NOW - 20, &env));
        let c = &d.commit;
        assert_eq!((c.to.as_deref(), c.retry, c.after, c.auto_at), (Some(state), 1, after, auto_at), "{state}");
        assert_eq!(c.offer.is_some(), offered, "{state}");
        assert!(c.timers.is_none(), "{state}: staying in the state plans no timers");
        let outcome = c.telemetry.transition.as_ref().map(|tr| tr.outcome);
        assert_eq!(outcome, Some("retry"), "{state}");
    }
}

#[test]
fn an_events_action_answers_whoever_raised_it() {
    let registry = registry_with_tree();
    let env = Env { registry: &registry, owner: OWNER, now: NOW };
    let poke = job().action("poke_it").unwrap().clone();
    let mut h = held("idle");
    let d = committed(action_done(&mut h, &poke, Some(raised("poke")), Ok(Outcome::to("waiting")), vec![], NOW, &env));
    assert_eq!((d.item.as_ref().map(|i| i.id), d.action.as_deref()), (Some(50), Some("poke_it")));
    assert_eq!(d.outcome, Some(EventOutcome::Accepted { state: "waiting".into() }));
    let c = &d.commit;
    assert_eq!((c.kind, c.consume, c.event.as_deref()), (HistoryKind::Event, Some(50), Some("poke")));
    assert_eq!(c.telemetry.transition.as_ref().map(|t| t.kind), Some("event_action"));
}

#[test]
fn a_subscription_fired_stays_fired_while_its_level_is_not_entered_anew() {
    use super::transition::fired_after;
    let m = MachineBuilder::new("sub")
        .state("p")
        .initial()
        .initial_child("x")
        .state("x")
        .parent("p")
        .state("y")
        .parent("p")
        .state("q")
        .event("all_done", ["p"], "ack")
        .subscribe("all(*) in [done]")
        .event("hop", ["x"], "to_y")
        .action("ack", ["q"])
        .action("to_y", ["y"])
        .build()
        .unwrap();
    let entry = |state: &str, entered: &[&str]| settle_core::step::Entry {
        state: state.into(),
        retry: 0,
        auto_delay: None,
        left: Vec::new(),
        entered: entered.iter().map(|s| (*s).into()).collect(),
        history: None,
    };
    let fired: Vec<EventName> = vec!["all_done".into()];
    let names = |v: Option<Vec<EventName>>| v.map(|v| v.iter().map(|e| e.to_string()).collect::<Vec<_>>());
    // Moving between the parent's children keeps it; leaving the parent or entering it
    // anew drops it; staying adds the one firing.
    assert_eq!(names(fired_after(&m, &fired, None, &entry("y", &["y"]), true)), Some(vec!["all_done".into()]));
    assert_eq!(names(fired_after(&m, &fired, None, &entry("q", &["q"]), true)), Some(vec![]));
    assert_eq!(names(fired_after(&m, &fired, None, &entry("x", &["p", "x"]), true)), Some(vec![]));
    let hop: EventName = "hop".into();
    assert_eq!(
        names(fired_after(&m, &fired, Some(&hop), &entry("x", &[]), false)),
        Some(vec!["all_done".into(), "hop".into()])
    );
    assert_eq!(fired_after(&m, &fired, None, &entry("x", &[]), false), None, "unchanged");
}

#[test]
fn a_new_entity_and_a_reports_effects_are_checked_against_the_machines() {
    let registry = registry_with_tree();
    let outcome = Outcome::stay().create("nope", "n1", Properties::new());
    let refused = ("create[0]".to_string(), "unknown machine `nope`".to_string());
    assert_eq!(check_effects(&outcome.decided, &registry), Err(refused));
    let fine = Outcome::stay().create("tree", "t1", Properties::new()).raise("tree", "t1", "leave", Value::Null);
    assert_eq!(check_effects(&fine.decided, &registry), Ok(()));
    // A new entity whose initial state waits before its auto action.
    let m = MachineBuilder::new("w")
        .state("s")
        .initial()
        .auto("go")
        .wait(Duration::from_secs(1))
        .state("t")
        .action("go", ["t"])
        .build()
        .unwrap();
    let new = new_entity(&m, "k".into(), Properties::new(), None, NOW).unwrap();
    assert_eq!(new.auto_at, Some(NOW + 1_000));
}

#[test]
fn a_reply_goes_with_the_commit_that_ends_its_events_workflow() {
    use settle_store::{Commit, Fence, Reply, RunStatus, Trigger};
    let asker = Reply { machine: "job".into(), key: "asker".into(), event: "answer".into() };
    let record = |rejected: bool, failed: bool| settle_store::EventRecord {
        kind: "nested",
        seq: 42,
        raised_at: NOW,
        rejected,
        failed,
        params: Value::Null,
        reply: Some(asker.clone()),
    };
    // (the commit processes the asking event: None, or (rejected, failed); it moves the
    // entity; it leaves it at rest; it parks it; the held entity's workflow asked for a
    // reply) → the replies it carries: (outcome, state).
    type Case = (Option<(bool, bool)>, bool, bool, bool, bool, Vec<(&'static str, &'static str)>);
    let cases: [Case; 8] = [
        (Some((true, false)), false, true, false, false, vec![("rejected", "idle")]),
        (Some((false, true)), false, true, false, false, vec![("failed", "idle")]),
        (Some((false, false)), true, true, false, false, vec![("accepted", "working")]),
        (Some((false, false)), true, false, false, false, vec![]), // its workflow goes on
        (None, true, false, false, true, vec![]),                  // an auto action: still working
        (None, true, true, false, true, vec![("accepted", "working")]), // at rest: the workflow ends
        (None, false, true, true, true, vec![("failed", "idle")]), // parked
        (Some((false, false)), true, false, false, true, vec![("interrupted", "idle")]), // taken over
    ];
    let registry = registry();
    for (event, moves, at_rest, parked, asked, want) in cases {
        let mut h = held("idle");
        h.trigger = asked.then(|| Trigger { event: "go".into(), params: Value::Null, reply: Some(asker.clone()) });
        let fence = Fence { entity_id: 7, version: 3, owner: OWNER.into() };
        let mut c = Commit::new(fence, "idle".into(), HistoryKind::Event, AfterCommit::Release);
        c.to = moves.then(|| "working".into());
        c.event = event.map(|_| "poke".into());
        c.telemetry.event = event.map(|(rejected, failed)| record(rejected, failed));
        c.telemetry.at_rest = at_rest;
        c.run_status = parked.then_some((RunStatus::Failed, None));
        let got: Vec<(String, String)> = replies(&h, &c, &registry)
            .iter()
            .map(|p| {
                assert_eq!((p.machine.as_str(), p.key.as_str(), p.kind), ("job", "asker", InboxKind::Reply));
                (p.params["outcome"].as_str().unwrap().into(), p.params["state"].as_str().unwrap().into())
            })
            .collect();
        let want: Vec<(String, String)> = want.iter().map(|(o, s)| (o.to_string(), s.to_string())).collect();
        assert_eq!(got, want, "event {event:?}, moves {moves}, at rest {at_rest}, parked {parked}, asked {asked}");
    }
}

/// `job` with its auto actions `work` (a handler) and `fetch` (an agent) limited to two at
/// once per `props.region`.
fn limited() -> Held {
    let m = job_builder()
        .properties(["region"])
        .limit(settle_core::limits::LimitDef {
            name: "calls".into(),
            states: vec!["working".into(), "fetching".into()],
            max: Some(2),
            key: Some("props.region".into()),
            ..Default::default()
        })
        .build()
        .unwrap();
    let mut h = held("working");
    h.machine = Arc::new(m);
    h.entity.properties.insert("region".into(), json!("eu"));
    h
}

#[test]
fn a_limited_auto_action_takes_its_slot_before_it_runs() {
    let r = registry();
    let env = Env { registry: &r, owner: OWNER, now: NOW };
    // Due, without its slot: ask for it, with the key's value and the limit's size.
    let mut h = limited();
    assert_eq!(step_of(&next(&mut h, &env)), "acquire calls[eu] of 2");
    let Next::Acquire(a) = next(&mut h, &env) else { unreachable!() };
    assert_eq!((a.fence.entity_id, a.fence.version, a.fence.owner.as_str()), (7, 3, OWNER));
    // Holding it: the action runs.
    h.slots = true;
    assert_eq!(step_of(&next(&mut h, &env)), "run work for auto");
    // Events still go first, slot or none.
    let mut h = limited();
    h.inbox_head = Some(raised("go"));
    assert!(step_of(&next(&mut h, &env)).starts_with("commit Rejected"), "{}", step_of(&next(&mut limited(), &env)));
    // A key that cannot be evaluated is the action's fault, named.
    let mut h = limited();
    h.entity.properties.clear();
    let d = committed(next(&mut h, &env));
    assert_eq!((d.commit.kind, d.commit.to.as_deref()), (HistoryKind::Fault, Some("working")));
    let detail = d.commit.detail.unwrap();
    assert!(detail.starts_with("limit `calls`: its key `props.region` could not be evaluated"), "{detail}");
}

#[test]
fn a_paced_fair_limit_asks_with_its_rate_and_the_entitys_fairness_value() {
    let r = registry();
    let env = Env { registry: &r, owner: OWNER, now: NOW };
    let m = job_builder()
        .properties(["tenant"])
        .limit(settle_core::limits::LimitDef {
            name: "paced".into(),
            states: vec!["working".into()],
            rate: Some(5),
            per_ms: Some(60_000),
            fair_by: Some("props.tenant".into()),
            ..Default::default()
        })
        .build()
        .unwrap();
    let mut h = held("working");
    h.machine = Arc::new(m);
    h.entity.properties.insert("tenant".into(), json!("acme"));
    assert_eq!(step_of(&next(&mut h, &env)), "acquire paced[] at 5/60000ms fair acme");
    // A fairness value that cannot be evaluated is the action's fault, named.
    h.entity.properties.clear();
    let d = committed(next(&mut h, &env));
    assert_eq!(d.commit.kind, HistoryKind::Fault);
    let detail = d.commit.detail.unwrap();
    assert!(detail.starts_with("limit `paced`: its fair_by `props.tenant` could not be evaluated"), "{detail}");
}

#[test]
fn a_limited_agent_task_is_offered_once_its_slot_is_taken() {
    let r = registry();
    let env = Env { registry: &r, owner: OWNER, now: NOW };
    // Entering the state offers nothing (the entity is due to take its slot first); a
    // state without a limit offers its task as it is entered.
    let mut h = limited();
    assert!(super::parts::entry_offer(&h.machine, "fetching", NOW).is_none());
    assert!(super::parts::entry_offer(&job(), "fetching", NOW).is_some());
    h.entity.state = "fetching".into();
    h.entity.auto_at = Some(NOW);
    assert_eq!(step_of(&next(&mut h, &env)), "acquire calls[eu] of 2");
    // Held: the task is offered (the entity keeps its slot while the agent works).
    h.slots = true;
    let d = committed(next(&mut h, &env));
    assert_eq!(d.commit.offer.as_ref().map(|o| o.queue.as_str()), Some("q"));
    assert!(!d.commit.leave_limits && d.commit.to.is_none());
    // Offered already (no auto time): nothing to ask for, the agent's report comes.
    let mut h = limited();
    h.entity.state = "fetching".into();
    h.entity.auto_at = None;
    assert_eq!(step_of(&next(&mut h, &env)), "release");
    // Backing off after a failed task offers nothing either: it asks again when due.
    let mut h = limited();
    h.entity.state = "fetching".into();
    let d = fault(&mut h, None, Some("fetch"), FaultError::new("agent", "boom"), &env);
    assert_eq!((d.commit.offer.is_none(), d.commit.auto_at), (true, Some(NOW + 2_000)));
}

#[test]
fn a_commit_entering_a_limited_state_to_run_its_action_asks_for_the_slots_with_it() {
    let mut h = limited();
    h.entity.state = "idle".into();
    let fence = h.fence(OWNER);
    let entering = |to: &str, auto_at: Option<Millis>, after: AfterCommit| {
        let mut c = Commit::new(fence.clone(), "idle".into(), HistoryKind::Event, after);
        c.to = Some(to.into());
        c.auto_at = auto_at;
        c
    };
    // Held on into `working`, its action due now: the slot of its region goes with it.
    let c = entering("working", Some(NOW), AfterCommit::Hold);
    let asks = entry_slots(&h, &c, NOW).expect("asked");
    let asks: Vec<_> = asks.iter().map(|a| (a.limit.as_str(), a.key.as_str(), a.max)).collect();
    assert_eq!(asks, [("calls", "eu", Some(2))]);
    // Properties the commit sets are the ones the key reads.
    let mut c = entering("working", Some(NOW), AfterCommit::Hold);
    c.properties = Some(Properties::from_iter([("region".to_string(), json!("us"))]));
    assert_eq!(entry_slots(&h, &c, NOW).unwrap()[0].key, "us");
    // Nothing asked when the holder does not run the action next: let go, the action
    // later (a backoff), paused, a task offered already, or a state without a limit.
    assert_eq!(entry_slots(&h, &entering("working", Some(NOW), AfterCommit::Release), NOW), None);
    assert_eq!(entry_slots(&h, &entering("working", Some(NOW + 1), AfterCommit::Hold), NOW), None);
    let mut paused = entering("working", Some(NOW), AfterCommit::Hold);
    paused.run_status = Some((RunStatus::Paused, None));
    assert_eq!(entry_slots(&h, &paused, NOW), None);
    let mut offered = entering("fetching", Some(NOW), AfterCommit::Hold);
    offered.offer = super::parts::entry_offer(&job(), "fetching", NOW);
    assert_eq!(entry_slots(&h, &offered, NOW), None);
    assert_eq!(entry_slots(&h, &entering("done", Some(NOW), AfterCommit::Hold), NOW), None);
    // Leaving, an agent's state may have a call in flight; a handler's has none.
    assert!(runs_at_an_agent(&h.machine, "fetching") && !runs_at_an_agent(&h.machine, "working"));
    // A key that cannot be evaluated: not asked here; the holder's own ask faults it.
    h.entity.properties.clear();
    assert_eq!(entry_slots(&h, &entering("working", Some(NOW), AfterCommit::Hold), NOW), None);
}

#[test]
fn an_event_a_limit_of_workflows_counts_takes_its_slots_before_it_runs() {
    let r = registry();
    let env = Env { registry: &r, owner: OWNER, now: NOW };
    let m = job_builder()
        .properties(["tenant"])
        .limit(settle_core::limits::LimitDef {
            name: "starts".into(),
            events: vec!["go".into(), "poke".into()],
            max: Some(3),
            key: Some("props.tenant".into()),
            ..Default::default()
        })
        .build()
        .unwrap();
    let at_rest = || {
        let mut h = held("idle");
        h.machine = Arc::new(m.clone());
        h.entity.properties.insert("tenant".into(), json!("acme"));
        let mut go = raised("go");
        go.request_id = Some("req-go".into());
        h.inbox_head = Some(go);
        h
    };
    // Valid here, its action a plain transition: its commit takes the slots first (or is not
    // applied), at the priority of the event's request.
    let mut h = at_rest();
    let d = committed(next(&mut h, &env));
    assert_eq!((d.commit.to.as_deref(), d.commit.request_id.as_deref()), (Some("working"), Some("req-go")));
    let slots = d.commit.take_first.expect("its slots, first");
    assert_eq!((slots[0].limit.as_str(), slots[0].key.as_str(), slots[0].max), ("starts", "acme", Some(3)));
    // An action that runs a handler asks before it runs; the event stays at the head of
    // the inbox.
    let mut h = at_rest();
    let mut poke = raised("poke");
    poke.request_id = Some("req-poke".into());
    h.inbox_head = Some(poke);
    let Next::Acquire(a) = next(&mut h, &env) else { panic!("an ask") };
    assert_eq!((a.workflow, a.request_id.as_deref(), a.slots[0].key.as_str()), (true, Some("req-poke"), "acme"));
    assert_eq!(h.inbox_head.as_ref().map(|i| i.event.as_str()), Some("poke"));
    // Holding them: it runs.
    h.workflow_slots = true;
    assert_eq!(step_of(&next(&mut h, &env)), "run poke_it for poke");
    // Not valid here: rejected at once, nothing asked; other events ask for nothing.
    let mut h = at_rest();
    h.entity.state = "done".into();
    assert!(step_of(&next(&mut h, &env)).starts_with("commit Rejected"));
    let mut h = at_rest();
    h.inbox_head = Some(raised("check"));
    h.entity.state = "done".into();
    assert!(!matches!(next(&mut h, &env), Next::Acquire(_)));
    // A key that cannot be evaluated rejects the event, naming the limit.
    let mut h = at_rest();
    h.entity.properties.clear();
    let d = committed(next(&mut h, &env));
    assert_eq!(d.commit.kind, HistoryKind::Rejected);
    let detail = d.commit.detail.unwrap();
    assert!(detail.contains("limit `starts`: its key `props.tenant` could not be evaluated"), "{detail}");
    // Claimed at rest with nothing to do: a quiet commit lets it go (its holder gives back
    // any slot a canceled event left it); once at rest in this hold, a plain release.
    let mut h = at_rest();
    h.inbox_head = None;
    let d = committed(next(&mut h, &env));
    assert!(d.commit.quiet && d.commit.to.is_none() && d.commit.after == AfterCommit::Release);
    h.rested = true;
    assert_eq!(step_of(&next(&mut h, &env)), "release");
}
