//! Telemetry read back: processed events per entity, key performance indicators and the
//! metrics snapshot, over one small history written through batches only
//! ([`telemetry_fixture`]).

use serde_json::json;
use settle_core::{ActionName, EntityKey, MachineName, StateName};

use super::{OWNER, T0, new_entity, push, write};
use crate::{
    AfterCommit, Applied, Command, Commit, EntityFilter, EntityRow, ErrorRecord, EventRecord, Fence, HistoryKind,
    InboxItem, Op, OpenOperation, RunStatus, Stats, Store, Telemetry, TransitionRecord,
};

fn open_op(request_id: &str, name: &str) -> Option<OpenOperation> {
    Some(OpenOperation { request_id: request_id.into(), name: name.into(), dimensions: json!({}) })
}

/// One step of a workflow with its telemetry: from `e`'s state to `to` (`None`: nothing
/// entered), at the lease holder's version `version`.
struct Step<'a> {
    e: &'a EntityRow,
    version: i64,
    to: Option<&'a str>,
    kind: HistoryKind,
    retry: u32,
    request_id: &'a str,
    /// The inbox event processed (with when it was raised), else the event whose workflow runs.
    event: Option<(&'a InboxItem, &'static str)>,
    current_event: Option<i64>,
    outcome: &'static str,
    error: Option<&'a str>,
    at_rest: bool,
    after: AfterCommit,
}

impl Step<'_> {
    fn commit(&self, from: &str) -> Commit {
        let fence = Fence { entity_id: self.e.id, version: self.version, owner: OWNER.into() };
        let event = self.event.map(|(item, kind)| EventRecord {
            kind,
            seq: item.id,
            raised_at: item.created_at,
            rejected: self.kind == HistoryKind::Rejected,
            failed: self.kind == HistoryKind::Fault,
        });
        Commit {
            to: self.to.map(StateName::new),
            retry: self.retry,
            // A workflow step leaves the entity with an auto action to run (busy).
            auto_at: (self.to.is_some() && !self.at_rest).then_some(T0 + 10_000),
            event: self.event.map(|(item, _)| item.event.clone()),
            consume: self.event.map(|(item, _)| item.id),
            request_id: Some(self.request_id.into()),
            detail: self.error.map(String::from),
            telemetry: Telemetry {
                event,
                transition: self.to.map(|_| TransitionRecord {
                    kind: if self.event.is_some() { "event" } else { "auto_action" },
                    start_health: Some("ok"),
                    end_health: "ok",
                    entry_time: T0,
                    start_time: T0,
                    action_start_time: None,
                    outcome: self.outcome,
                }),
                error: self.error.map(|d| ErrorRecord { kind: "action_error", details: d.into(), exception: None }),
                at_rest: self.at_rest,
                complete: true,
                current_event: self.current_event,
            },
            ..Commit::new(fence, StateName::new(from), self.kind, self.after)
        }
    }
}

/// Writes a small history through batches only: operations (two creates, a workflow with a
/// retry, a failed event, one left open), a workflow whose errors park its entity, a paused
/// entity, a rejected event and an entity due soon. Returns the ids of `a`, `b`, `c`, `d`.
async fn telemetry_fixture<S: Store>(store: &S) -> [i64; 4] {
    let mut a = new_entity("a", "idle", None);
    a.operation = open_op("op-a", "m.create");
    a.request_id = Some("op-a".into());
    let mut b = new_entity("b", "idle", None);
    b.operation = open_op("op-b", "m.create");
    b.request_id = Some("op-b".into());
    let c = new_entity("c", "idle", None);
    let r = write(store, T0, vec![Op::Create(a), Op::Create(b), Op::Create(c)], false).await;
    assert!(r.results.iter().all(|r| r.is_ok()), "{r:?}");
    // a: op-go raised at T0+1; idle → busy, a retry, → done at T0+201 (success, 200 ms).
    let mut go = push("a", "go");
    go.request_id = Some("op-go".into());
    go.operation = open_op("op-go", "m.go");
    let r = write(store, T0 + 1, vec![Op::Push(go)], true).await;
    let (e, item) = (r.claimed[0].entity.clone(), r.claimed[0].inbox_head.clone().expect("head"));
    let base = Step {
        e: &e,
        version: e.version,
        to: Some("busy"),
        kind: HistoryKind::Event,
        retry: 0,
        request_id: "op-go",
        event: Some((&item, "raised")),
        current_event: None,
        outcome: "ok",
        error: None,
        at_rest: false,
        after: AfterCommit::Hold,
    };
    let retry = Step {
        version: e.version + 1,
        kind: HistoryKind::Auto,
        retry: 1,
        event: None,
        current_event: Some(item.id),
        outcome: "retry",
        ..base
    };
    for (now, c) in [(T0 + 101, base.commit("idle")), (T0 + 150, retry.commit("busy"))] {
        let r = write(store, now, vec![Op::Commit(Box::new(c))], false).await;
        assert!(r.results[0].is_ok(), "{:?}", r.results[0]);
    }
    let done = Step {
        e: &e,
        version: e.version + 2,
        to: Some("done"),
        kind: HistoryKind::Auto,
        retry: 0,
        request_id: "op-go",
        event: None,
        current_event: Some(item.id),
        outcome: "ok",
        error: None,
        at_rest: true,
        after: AfterCommit::Release,
    };
    let r = write(store, T0 + 201, vec![Op::Commit(Box::new(done.commit("busy")))], false).await;
    assert!(r.results[0].is_ok(), "{:?}", r.results[0]);
    // b: op-boom raised at T0+300 fails at T0+400 (failed, 100 ms).
    let mut boom = push("b", "boom");
    boom.request_id = Some("op-boom".into());
    boom.operation = open_op("op-boom", "m.go");
    let r = write(store, T0 + 300, vec![Op::Push(boom)], true).await;
    let (eb, item) = (r.claimed[0].entity.clone(), r.claimed[0].inbox_head.clone().expect("head"));
    let fault = Step {
        e: &eb,
        version: eb.version,
        to: None,
        kind: HistoryKind::Fault,
        retry: 0,
        request_id: "op-boom",
        event: Some((&item, "raised")),
        current_event: None,
        outcome: "error",
        error: Some("provider down"),
        at_rest: true,
        after: AfterCommit::Release,
    };
    let mut cm = fault.commit("idle");
    cm.action = Some(ActionName::new("go"));
    let r = write(store, T0 + 400, vec![Op::Commit(Box::new(cm))], false).await;
    assert!(r.results[0].is_ok(), "{:?}", r.results[0]);
    // c (no operation): idle → busy at T0+650, two errors (T0+700, T0+800), then parked.
    let mut go = push("c", "go");
    go.request_id = Some("req-c".into());
    let r = write(store, T0 + 600, vec![Op::Push(go)], true).await;
    let (ec, item) = (r.claimed[0].entity.clone(), r.claimed[0].inbox_head.clone().expect("head"));
    let first = Step {
        e: &ec,
        version: ec.version,
        to: Some("busy"),
        kind: HistoryKind::Event,
        retry: 0,
        request_id: "req-c",
        event: Some((&item, "raised")),
        current_event: None,
        outcome: "ok",
        error: None,
        at_rest: false,
        after: AfterCommit::Hold,
    };
    let err1 = Step {
        version: ec.version + 1,
        kind: HistoryKind::Auto,
        retry: 1,
        event: None,
        current_event: Some(item.id),
        outcome: "error",
        error: Some("provider down"),
        ..first
    };
    let mut park = Step { version: ec.version + 2, retry: 2, error: Some("rate limited"), ..err1 }.commit("busy");
    park.run_status = Some((RunStatus::Failed, None));
    park.after = AfterCommit::Release;
    for (now, c) in [(T0 + 650, first.commit("idle")), (T0 + 700, err1.commit("busy")), (T0 + 800, park)] {
        let r = write(store, now, vec![Op::Commit(Box::new(c))], false).await;
        assert!(r.results[0].is_ok(), "{:?}", r.results[0]);
    }
    // op-open queued on b at T0+850 stays open; b is paused.
    let mut open = push("b", "go");
    open.request_id = Some("op-open".into());
    open.operation = open_op("op-open", "m.go");
    let pause = Op::Command {
        machine: MachineName::new("m"),
        key: EntityKey::new("b"),
        command: Command::Pause,
        operation: None,
    };
    let r = write(store, T0 + 850, vec![Op::Push(open), pause], false).await;
    assert!(r.results.iter().all(|r| r.is_ok()), "{r:?}");
    // a rejects `bad` at T0+901.
    let r = write(store, T0 + 900, vec![Op::Push(push("a", "bad"))], true).await;
    assert_eq!(r.claimed.len(), 1, "only a is due");
    let (ea, item) = (r.claimed[0].entity.clone(), r.claimed[0].inbox_head.clone().expect("head"));
    let reject = Step {
        e: &ea,
        version: ea.version,
        to: None,
        kind: HistoryKind::Rejected,
        retry: 0,
        request_id: "req-bad",
        event: Some((&item, "raised")),
        current_event: None,
        outcome: "ok",
        error: None,
        at_rest: true,
        after: AfterCommit::Release,
    };
    let r = write(store, T0 + 901, vec![Op::Commit(Box::new(reject.commit("done")))], false).await;
    assert!(r.results[0].is_ok(), "{:?}", r.results[0]);
    // d: due at T0+960.
    let r = write(store, T0 + 950, vec![Op::Create(new_entity("d", "waiting", Some(T0 + 960)))], false).await;
    let Ok(Applied::Created(d)) = &r.results[0] else { panic!("{:?}", r.results[0]) };
    [e.id, eb.id, ec.id, d.id]
}

fn approx(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

fn transition_stats(machine: &str, from: Option<&str>, to: &str, count: u64) -> (String, Option<String>, String, u64) {
    (machine.into(), from.map(String::from), to.into(), count)
}

/// An entity's processed events are listed oldest first with their request ids, states,
/// outcomes and errors; an event ends when its workflow comes to rest.
pub async fn events_are_listed_per_entity<S: Store>(store: S) {
    let [a, b, c, _] = telemetry_fixture(&store).await;
    let events = store.events_list(a).await.unwrap();
    let view: Vec<_> = events
        .iter()
        .map(|e| {
            (
                e.event.as_str(),
                e.request_id.as_deref(),
                e.kind.as_str(),
                e.start_state.as_str(),
                e.end_state.as_deref(),
                e.end_time,
                e.rejected,
                e.failed,
            )
        })
        .collect();
    assert_eq!(
        view,
        [
            ("go", Some("op-go"), "raised", "idle", Some("done"), Some(T0 + 201), false, false),
            ("bad", Some("req-bad"), "raised", "done", Some("done"), Some(T0 + 901), true, false),
        ]
    );
    assert_eq!((events[0].start_time, events[1].start_time), (T0 + 1, T0 + 900));
    assert!(events[0].id < events[1].id);
    let failed = store.events_list(b).await.unwrap();
    assert_eq!(failed.len(), 1, "the queued event is not processed yet: {failed:?}");
    assert_eq!(
        (failed[0].failed, failed[0].end_state.as_deref(), failed[0].error.as_deref()),
        (true, Some("idle"), Some("provider down"))
    );
    let parked = store.events_list(c).await.unwrap();
    assert_eq!((parked.len(), parked[0].end_state.as_ref(), parked[0].end_time), (1, None, None), "still running");
    assert!(store.events_list(i64::MAX).await.unwrap().is_empty());
}

/// Stats: per operation name (counts, success rate, nearest-rank duration percentiles),
/// per machine transition (count, error rate, mean retries) and the most frequent errors,
/// all time or since a moment.
pub async fn stats_summarise_telemetry<S: Store>(store: S) {
    let empty = store.stats(None).await.unwrap();
    assert_eq!(empty, Stats::default());
    telemetry_fixture(&store).await;
    let s = store.stats(None).await.unwrap();
    let ops: Vec<_> =
        s.operations.iter().map(|o| (o.name.as_str(), o.count, o.ended, o.success, o.p50_ms, o.p99_ms)).collect();
    assert_eq!(ops, [("m.create", 2, 2, 2, 0, 0), ("m.go", 3, 2, 1, 200, 200)]);
    assert!(approx(s.operations[0].success_rate, 1.0) && approx(s.operations[1].success_rate, 0.5), "{s:?}");
    let tr: Vec<_> = s.transitions.iter().map(|t| (t.machine.clone(), t.from.clone(), t.to.clone(), t.count)).collect();
    assert_eq!(
        tr,
        [
            transition_stats("m", None, "idle", 3),
            transition_stats("m", None, "waiting", 1),
            transition_stats("m", Some("busy"), "busy", 3),
            transition_stats("m", Some("busy"), "done", 1),
            transition_stats("m", Some("idle"), "busy", 2),
        ]
    );
    let busy = &s.transitions[2];
    assert!(approx(busy.error_rate, 2.0 / 3.0) && approx(busy.mean_retries, 4.0 / 3.0), "{busy:?}");
    assert!(s.transitions.iter().filter(|t| t.to != "busy").all(|t| t.error_rate == 0.0 && t.mean_retries == 0.0));
    let errors: Vec<_> = s.top_errors.iter().map(|e| (e.kind.as_str(), e.details.as_str(), e.count)).collect();
    assert_eq!(errors, [("action_error", "provider down", 2), ("action_error", "rate limited", 1)]);

    let since = store.stats(Some(T0 + 450)).await.unwrap();
    let ops: Vec<_> =
        since.operations.iter().map(|o| (o.name.as_str(), o.count, o.ended, o.success, o.p50_ms)).collect();
    assert_eq!(ops, [("m.go", 1, 0, 0, 0)], "only op-open started since");
    assert_eq!(since.operations[0].success_rate, 0.0, "no ended operation: rate 0");
    let tr: Vec<_> =
        since.transitions.iter().map(|t| (t.machine.clone(), t.from.clone(), t.to.clone(), t.count)).collect();
    assert_eq!(
        tr,
        [
            transition_stats("m", None, "waiting", 1),
            transition_stats("m", Some("busy"), "busy", 2),
            transition_stats("m", Some("idle"), "busy", 1),
        ]
    );
    assert!(approx(since.transitions[1].error_rate, 1.0) && approx(since.transitions[1].mean_retries, 1.5));
    let errors: Vec<_> = since.top_errors.iter().map(|e| (e.details.as_str(), e.count)).collect();
    assert_eq!(errors, [("provider down", 1), ("rate limited", 1)]);
    assert!(store.stats(Some(T0 + 10_000)).await.unwrap() == Stats::default());
}

/// The metrics snapshot counts transitions, rejected events, faults, parked entities,
/// entities per state and run status, due work and operations per outcome; listing filters
/// by run status.
pub async fn metrics_snapshot_and_run_status_filter<S: Store>(store: S) {
    let [_, b, c, _] = telemetry_fixture(&store).await;
    let m = store.metrics_snapshot(T0 + 1_000).await.unwrap();
    let tr: Vec<_> = m.transitions.iter().map(|t| (t.machine.clone(), t.from.clone(), t.to.clone(), t.count)).collect();
    assert_eq!(
        tr,
        [
            transition_stats("m", None, "idle", 3),
            transition_stats("m", None, "waiting", 1),
            transition_stats("m", Some("busy"), "busy", 3),
            transition_stats("m", Some("busy"), "done", 1),
            transition_stats("m", Some("idle"), "busy", 2),
        ]
    );
    assert_eq!((m.events_rejected, m.faults, m.parked, m.due_backlog), (1, 3, 1, 1));
    let entities: Vec<_> =
        m.entities.iter().map(|e| (e.machine.as_str(), e.state.as_str(), e.run_status, e.count)).collect();
    assert_eq!(
        entities,
        [
            ("m", "busy", RunStatus::Failed, 1),
            ("m", "done", RunStatus::Active, 1),
            ("m", "idle", RunStatus::Paused, 1),
            ("m", "waiting", RunStatus::Active, 1),
        ]
    );
    assert_eq!(m.operations, [("failed".to_string(), 1), ("open".to_string(), 1), ("success".to_string(), 3)]);
    assert_eq!(store.metrics_snapshot(T0 + 955).await.unwrap().due_backlog, 0, "d is not due yet");

    let by_status = |status: &str, machine: Option<&str>| {
        let filter =
            EntityFilter { run_status: Some(status.into()), machine: machine.map(String::from), ..Default::default() };
        let store = &store;
        async move { store.entity_list(filter).await.unwrap().iter().map(|e| e.id).collect::<Vec<_>>() }
    };
    assert_eq!(by_status("paused", None).await, [b]);
    assert_eq!(by_status("failed", Some("m")).await, [c]);
    assert_eq!(by_status("failed", Some("n")).await, Vec::<i64>::new());
    assert_eq!(by_status("active", None).await.len(), 2);
    assert!(by_status("killed", None).await.is_empty());
}
