//! Telemetry read back: processed events per entity, key performance indicators and the
//! metrics snapshot, over one small history written through batches only
//! ([`telemetry_fixture`]).

use serde_json::json;
use settle_core::{ActionName, StateName};

use super::{OWNER, T0, command, new_entity, push, write};
use crate::{
    AfterCommit, Applied, Command, Commit, EntityFilter, EntityRow, ErrorRecord, EventRecord, Fence, HistoryKind,
    InboxItem, Millis, NewEntity, Op, OpenOperation, Push, RunStatus, Stats, Store, Telemetry, TransitionRecord,
};

fn open_op(request_id: &str, name: &str) -> Option<OpenOperation> {
    Some(OpenOperation { request_id: request_id.into(), name: name.into(), dimensions: json!({}), priority: 0 })
}

/// `event` raised on `key` by request `request_id`, opening an operation named `operation`
/// if given.
fn raise(key: &str, event: &str, request_id: &str, operation: Option<&str>) -> Push {
    Push {
        request_id: Some(request_id.into()),
        operation: operation.and_then(|name| open_op(request_id, name)),
        ..push(key, event)
    }
}

/// Raises `push` and claims its entity, the only one due, with that event.
async fn claim_raised<S: Store>(store: &S, now: Millis, push: Push) -> (EntityRow, InboxItem) {
    let r = write(store, now, vec![Op::Push(push)], true).await;
    assert_eq!(r.claimed.len(), 1, "only the raised entity is due");
    let c = r.claimed.into_iter().next().expect("claimed");
    (c.entity, c.inbox_head.expect("head"))
}

/// Writes `commits` one batch each, at their times; each must apply.
async fn commit_all<S: Store>(store: &S, commits: impl IntoIterator<Item = (Millis, Commit)>) {
    for (now, c) in commits {
        let r = write(store, now, vec![Op::Commit(Box::new(c))], false).await;
        assert!(r.results[0].is_ok(), "{:?}", r.results[0]);
    }
}

/// One step of a workflow with its telemetry: from `e`'s state to `to` (`None`: nothing
/// entered), at the lease holder's version `version`.
#[derive(Clone, Copy)]
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

impl<'a> Step<'a> {
    /// `e`, as claimed, processes `item`, raised by request `request_id`: it enters `to`
    /// holding its lease, or (`None`) rejects the event and is at rest.
    fn raised(e: &'a EntityRow, item: &'a InboxItem, request_id: &'a str, to: Option<&'a str>) -> Self {
        Step {
            e,
            version: e.version,
            to,
            kind: if to.is_some() { HistoryKind::Event } else { HistoryKind::Rejected },
            retry: 0,
            request_id,
            event: Some((item, "raised")),
            current_event: None,
            outcome: "ok",
            error: None,
            at_rest: to.is_none(),
            after: if to.is_some() { AfterCommit::Hold } else { AfterCommit::Release },
        }
    }

    /// The auto action that follows this step in the same workflow enters `to` with retry
    /// count `retry`.
    fn then(&self, to: &'a str, retry: u32) -> Self {
        Step {
            version: self.version + 1,
            to: Some(to),
            kind: HistoryKind::Auto,
            retry,
            event: None,
            current_event: self.event.map(|(item, _)| item.id).or(self.current_event),
            outcome: "ok",
            error: None,
            ..*self
        }
    }

    /// This step's action fails with `error`.
    fn failing(self, error: &'a str) -> Self {
        Step { outcome: "error", error: Some(error), ..self }
    }

    /// The workflow comes to rest with this step, which drops the lease.
    fn resting(self) -> Self {
        Step { at_rest: true, after: AfterCommit::Release, ..self }
    }

    fn commit(&self, from: &str) -> Commit {
        let fence = Fence { entity_id: self.e.id, version: self.version, owner: OWNER.into() };
        let event = self.event.map(|(item, kind)| EventRecord {
            kind,
            seq: item.id,
            raised_at: item.created_at,
            rejected: self.kind == HistoryKind::Rejected,
            failed: self.kind == HistoryKind::Fault,
            params: item.params.clone(),
            reply: None,
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
                error: self.error.map(|d| ErrorRecord {
                    kind: "action_error",
                    details: d.into(),
                    exception: None,
                    retried: false,
                    cause: Vec::new(),
                }),
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
pub(super) async fn telemetry_fixture<S: Store>(store: &S) -> [i64; 4] {
    let created_by = |key: &str, request_id: &str| NewEntity {
        operation: open_op(request_id, "m.create"),
        request_id: Some(request_id.into()),
        ..new_entity(key, "idle", None)
    };
    let creates = [created_by("a", "op-a"), created_by("b", "op-b"), new_entity("c", "idle", None)];
    let r = write(store, T0, creates.into_iter().map(Op::Create).collect(), false).await;
    assert!(r.results.iter().all(|r| r.is_ok()), "{r:?}");
    // a: op-go raised at T0+1; idle → busy, a retry, → done at T0+201 (success, 200 ms).
    let (e, item) = claim_raised(store, T0 + 1, raise("a", "go", "op-go", Some("m.go"))).await;
    let go = Step::raised(&e, &item, "op-go", Some("busy"));
    let retry = Step { outcome: "retry", ..go.then("busy", 1) };
    let done = retry.then("done", 0).resting();
    commit_all(
        store,
        [(T0 + 101, go.commit("idle")), (T0 + 150, retry.commit("busy")), (T0 + 201, done.commit("busy"))],
    )
    .await;
    // b: op-boom raised at T0+300 fails at T0+400 (failed, 100 ms).
    let (eb, item) = claim_raised(store, T0 + 300, raise("b", "boom", "op-boom", Some("m.go"))).await;
    let fault = Step { kind: HistoryKind::Fault, ..Step::raised(&eb, &item, "op-boom", None).failing("provider down") };
    let mut cm = fault.commit("idle");
    cm.action = Some(ActionName::new("go"));
    commit_all(store, [(T0 + 400, cm)]).await;
    // c (no operation): idle → busy at T0+650, two errors (T0+700, T0+800), then parked.
    let (ec, item) = claim_raised(store, T0 + 600, raise("c", "go", "req-c", None)).await;
    let first = Step::raised(&ec, &item, "req-c", Some("busy"));
    let err1 = first.then("busy", 1).failing("provider down");
    let mut park = err1.then("busy", 2).failing("rate limited").commit("busy");
    park.run_status = Some((RunStatus::Failed, None));
    park.after = AfterCommit::Release;
    commit_all(store, [(T0 + 650, first.commit("idle")), (T0 + 700, err1.commit("busy")), (T0 + 800, park)]).await;
    // op-open queued on b at T0+850 stays open; b is paused.
    let open = raise("b", "go", "op-open", Some("m.go"));
    let pause = command("b", Command::Pause);
    let r = write(store, T0 + 850, vec![Op::Push(open), pause], false).await;
    assert!(r.results.iter().all(|r| r.is_ok()), "{r:?}");
    // a rejects `bad` at T0+901.
    let (ea, item) = claim_raised(store, T0 + 900, raise("a", "bad", "req-bad", None)).await;
    commit_all(store, [(T0 + 901, Step::raised(&ea, &item, "req-bad", None).commit("done"))]).await;
    // d: due at T0+960.
    let r = write(store, T0 + 950, vec![Op::Create(new_entity("d", "waiting", Some(T0 + 960)))], false).await;
    let Ok(Applied::Created(d)) = &r.results[0] else { panic!("{:?}", r.results[0]) };
    [e.id, eb.id, ec.id, d.id]
}

fn approx(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

/// A transition and how many times it happened: (machine, from, to, count).
type TransitionCount = (String, Option<String>, String, u64);

fn transition_stats(machine: &str, from: Option<&str>, to: &str, count: u64) -> TransitionCount {
    (machine.into(), from.map(String::from), to.into(), count)
}

/// Every transition [`telemetry_fixture`] makes, all time.
fn fixture_transitions() -> Vec<TransitionCount> {
    vec![
        transition_stats("m", None, "idle", 3),
        transition_stats("m", None, "waiting", 1),
        transition_stats("m", Some("busy"), "busy", 3),
        transition_stats("m", Some("busy"), "done", 1),
        transition_stats("m", Some("idle"), "busy", 2),
    ]
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

/// An entity's errors read newest first (and only its own), and the newest of several
/// entities at once; an operation's trace holds the
/// entity it started on and each history row its request id caused, and nothing for an
/// unknown request id; of several request ids, those whose operations ended are read at
/// once.
pub async fn entity_errors_and_operation_traces<S: Store>(store: S) {
    let [a, b, c, _] = telemetry_fixture(&store).await;
    let details = |rows: Vec<crate::ErrorRow>| rows.into_iter().map(|e| (e.details, e.at)).collect::<Vec<_>>();
    assert_eq!(
        details(store.error_list(c, 10).await.unwrap()),
        [("rate limited".to_string(), T0 + 800), ("provider down".to_string(), T0 + 700)]
    );
    assert_eq!(details(store.error_list(c, 1).await.unwrap()).len(), 1, "the limit holds");
    let boom = store.error_list(b, 10).await.unwrap();
    assert_eq!((boom.len(), boom[0].request_id.as_deref()), (1, Some("op-boom")));
    assert!(store.error_list(a, 10).await.unwrap().is_empty());
    // The newest of each, in the order asked, those without errors left out.
    let newest: Vec<_> =
        store.error_newest(vec![c, a, b, i64::MAX]).await.unwrap().into_iter().map(|(id, e)| (id, e.details)).collect();
    assert_eq!(newest, [(c, "rate limited".to_string()), (b, boom[0].details.clone())]);
    assert!(store.error_newest(Vec::new()).await.unwrap().is_empty());
    let go = store.operation_trace("op-go", 100).await.unwrap();
    assert_eq!(go.entities.iter().map(|e| e.id).collect::<Vec<_>>(), [a]);
    let steps: Vec<_> = go.transitions.iter().map(|h| (h.to.as_deref(), h.retry, h.entity_id)).collect();
    assert_eq!(steps, [(Some("busy"), 0, a), (Some("busy"), 1, a), (Some("done"), 0, a)]);
    assert!(!go.truncated);
    let created = store.operation_trace("op-a", 100).await.unwrap();
    assert_eq!(created.entities.iter().map(|e| e.id).collect::<Vec<_>>(), [a]);
    assert_eq!(created.transitions.iter().map(|h| h.kind).collect::<Vec<_>>(), [crate::HistoryKind::Create]);
    assert_eq!(store.operation_trace("no-such-request", 100).await.unwrap(), crate::OperationTrace::default());
    // Of several request ids, the operations that ended (an open one and an unknown one
    // are left out).
    let ids = ["op-go", "op-open", "op-a", "no-such-request"].map(String::from).to_vec();
    let mut ended: Vec<_> =
        store.operations_ended(ids).await.unwrap().into_iter().map(|o| (o.request_id, o.outcome)).collect();
    ended.sort();
    assert_eq!(ended, [("op-a".into(), Some("success".into())), ("op-go".into(), Some("success".into()))]);
    assert!(store.operations_ended(Vec::new()).await.unwrap().is_empty());
    operations_scan_a_window(&store).await;
}

/// A windowed page of operations keeps what passes its filter among the window's, newest
/// first, and says where a full window ended (the fixture's five operations).
async fn operations_scan_a_window<S: Store>(store: &S) {
    use crate::OperationFilter as F;
    let scan = |f: F, before: Option<i64>, window: u64, limit: u64| async move {
        let w = store.operation_scan(f, before, window, limit).await.unwrap();
        (w.items.iter().map(|o| o.request_id.clone()).collect::<Vec<_>>(), w.low, w.items)
    };
    let go = || F { name: Some("m.go".into()), ..F::default() };
    let (all, low, _) = scan(F::default(), None, 100, 100).await;
    assert_eq!(all, ["op-open", "op-boom", "op-go", "op-b", "op-a"], "newest first");
    assert_eq!(low, None, "the window reached the oldest");
    let (ids, low, items) = scan(F::default(), None, 2, 100).await;
    assert_eq!((ids, low), (vec!["op-open".to_string(), "op-boom".into()], Some(items[1].id)));
    let (ids, _, _) = scan(go(), None, 100, 100).await;
    assert_eq!(ids, ["op-open", "op-boom", "op-go"]);
    let (ids, _, _) = scan(F { outcome: Some("failed".into()), ..F::default() }, None, 100, 100).await;
    assert_eq!(ids, ["op-boom"]);
    let (ids, _, _) = scan(F { outcome: Some("open".into()), ..F::default() }, None, 100, 100).await;
    assert_eq!(ids, ["op-open"]);
    let range = F { started_after: Some(T0 + 1), started_before: Some(T0 + 850), ..go() };
    let (ids, _, _) = scan(range, None, 100, 100).await;
    assert_eq!(ids, ["op-boom", "op-go"], "after inclusive, before exclusive");
    let (ids, low, _) = scan(F { machine: Some("no-such-machine".into()), ..F::default() }, None, 100, 100).await;
    assert_eq!((ids.len(), low), (0, None), "nothing passes: no rows, and the window was not full");
    let (ids, low, _) = scan(F { machine: Some("no-such-machine".into()), ..F::default() }, None, 3, 100).await;
    assert!(ids.is_empty() && low.is_some(), "nothing passes in a full window: go on from its end");
    // A window of one, page after page, reaches each operation once.
    let (mut before, mut seen) = (None, Vec::new());
    loop {
        let (ids, low, _) = scan(go(), before, 1, 100).await;
        seen.extend(ids);
        match low {
            Some(l) => before = Some(l),
            None => break,
        }
    }
    assert_eq!(seen, ["op-open", "op-boom", "op-go"]);
    let (ids, _, _) = scan(go(), None, 100, 1).await;
    assert_eq!(ids, ["op-open"], "the limit holds");
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
    assert_eq!(tr, fixture_transitions());
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
    assert_eq!(tr, fixture_transitions());
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
