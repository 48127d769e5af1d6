//! The store conformance suite on PostgreSQL (each check in a schema of its own), plus
//! PostgreSQL-only checks: concurrent claims from several handles, wake-ups, URLs.
//! Needs `SETTLE_TEST_PG`; without it every test says it skipped and passes.

use std::collections::HashSet;
use std::time::Duration;

use settle_store::conformance::Dialect;
use settle_store::{Batch, Claim, NewEntity, Op, PgStore, Store};

const POSTGRES: Dialect = Dialect {
    create_widgets: "CREATE TABLE widgets (name TEXT PRIMARY KEY)",
    insert_widget: "INSERT INTO widgets (name) VALUES ($1)",
};

async fn fresh() -> Option<PgStore> {
    let url = settle_store::postgres::test_url("conf")?;
    Some(tokio::task::spawn_blocking(move || PgStore::open(&url)).await.unwrap().expect("open PostgreSQL store"))
}

settle_store::store_conformance_suite!(optional fresh(), POSTGRES);

fn entity(key: &str, auto_at: Option<i64>) -> NewEntity {
    NewEntity { auto_at, ..settle_store::conformance::entity(key, "idle") }
}

async fn open(url: &str) -> PgStore {
    let url = url.to_string();
    tokio::task::spawn_blocking(move || PgStore::open(&url)).await.unwrap().unwrap()
}

/// Two handles (as two instances would) claim the same due entities concurrently: every
/// entity is claimed exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_claims_never_overlap() {
    let Some(url) = settle_store::postgres::test_url("claims") else { return };
    let a = open(&url).await;
    let b = open(&url).await;
    let ops = (0..400).map(|i| Op::Create(entity(&format!("e{i}"), Some(1)))).collect();
    a.write(Batch { now: 10, ops, claim: None }).await.unwrap();
    let claim = |store: PgStore, owner: &'static str| async move {
        let mut got = Vec::new();
        loop {
            let r =
                store.write(Batch { now: 20, ops: vec![], claim: Some(Claim::new(owner, 60_000, 16)) }).await.unwrap();
            if r.claimed.is_empty() {
                return got;
            }
            for c in r.claimed {
                assert_eq!(c.entity.lease_owner.as_deref(), Some(owner));
                got.push(c.entity.id);
            }
        }
    };
    let (x, y) = tokio::join!(tokio::spawn(claim(a.clone(), "engine-a")), tokio::spawn(claim(b, "engine-b")));
    let (x, y) = (x.unwrap(), y.unwrap());
    let xs: HashSet<i64> = x.iter().copied().collect();
    let ys: HashSet<i64> = y.iter().copied().collect();
    assert_eq!(xs.len() + ys.len(), 400, "a: {}, b: {}", xs.len(), ys.len());
    assert!(xs.is_disjoint(&ys), "an entity was claimed twice");
    assert_eq!(x.len(), xs.len());
}

/// A batch that makes work due wakes the other handles' engines, not its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_wake_other_handles() {
    let Some(url) = settle_store::postgres::test_url("wake") else { return };
    let a = open(&url).await;
    let b = open(&url).await;
    let wake_b = b.wakeup().expect("PostgreSQL handles have wake-ups");
    // The listener wakes once when it (re)connects; consume that.
    tokio::time::timeout(Duration::from_secs(10), wake_b.notified()).await.expect("listener starts");
    a.write(Batch { now: 10, ops: vec![Op::Create(entity("x", Some(10)))], claim: None }).await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), wake_b.notified()).await.expect("b is woken by a's create");
}

/// A read-only handle refuses a database without Settle's tables; bad URLs say why.
#[tokio::test]
async fn read_only_and_bad_urls() {
    let Some(url) = settle_store::postgres::test_url("ro") else { return };
    let u = url.clone();
    let e = tokio::task::spawn_blocking(move || PgStore::open_read_only(&u)).await.unwrap().unwrap_err();
    assert!(e.to_string().contains("not a settle database"), "{e}");
    let store = open(&url).await;
    store.meta_put("k", "v").await.unwrap();
    let ro = tokio::task::spawn_blocking(move || PgStore::open_read_only(&url)).await.unwrap().unwrap();
    assert_eq!(ro.meta_get("k").await.unwrap().as_deref(), Some("v"));
    assert!(ro.meta_put("k", "w").await.is_err(), "read-only handles do not write");
    let e = PgStore::open("postgres://postgres@127.0.0.1:1/none").unwrap_err();
    assert!(e.to_string().contains("cannot open database `postgres://postgres@127.0.0.1:1/none`"), "{e}");
}

/// Application SQL whose parameter does not convert to the column's type fails that
/// commit alone with `OpError::Sql` (not a retry of the whole batch, as for a lost
/// connection), and changes nothing.
#[tokio::test]
async fn unconvertible_sql_parameter_fails_the_commit_alone() {
    use settle_store::{AfterCommit, Applied, Commit, Fence, HistoryKind, OpError, Push, SqlStatement};
    let Some(url) = settle_store::postgres::test_url("sqlparam") else { return };
    let store = open(&url).await;
    store.sql_execute("CREATE TABLE counters (n BIGINT NOT NULL)").await.unwrap();
    let push = Push::raised("m", "a", "go", serde_json::json!({}));
    let r = store
        .write(Batch {
            now: 10,
            ops: vec![Op::Create(entity("a", None)), Op::Push(push)],
            claim: Some(Claim::new("engine-a", 60_000, 10)),
        })
        .await
        .unwrap();
    let e = r.claimed[0].entity.clone();
    let fence = Fence { entity_id: e.id, version: e.version, owner: "engine-a".into() };
    let commit = Commit {
        to: Some("busy".into()),
        sql: vec![SqlStatement {
            sql: "INSERT INTO counters (n) VALUES ($1)".into(),
            params: vec![serde_json::json!("not a number")],
        }],
        ..Commit::new(fence, e.state.clone(), HistoryKind::Event, AfterCommit::Release)
    };
    let started = std::time::Instant::now();
    let r = store.write(Batch { now: 20, ops: vec![Op::Commit(Box::new(commit))], claim: None }).await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(5), "the batch was retried: {:?}", started.elapsed());
    match &r.results[0] {
        Err(OpError::Sql { index: 0, message }) => assert!(message.contains("not a number"), "{message}"),
        other => panic!("expected OpError::Sql, got {other:?}"),
    }
    assert!(!matches!(r.results[0], Ok(Applied::Committed { .. })));
    let after = store.entity_get("m", "a").await.unwrap().unwrap();
    assert_eq!((after.state.as_str(), after.version), ("idle", e.version));
}

/// Instances started together on a new schema all start: creating the schema and
/// migrating it are serialised between them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_starting_together_on_a_new_schema() {
    for _ in 0..3 {
        let Some(url) = settle_store::postgres::test_url("together") else { return };
        let starts: Vec<_> = (0..4)
            .map(|_| {
                let url = url.clone();
                std::thread::spawn(move || PgStore::open(&url))
            })
            .collect();
        for s in starts {
            s.join().expect("no panic").expect("every instance starts");
        }
    }
}

fn push_op(key: &str, request_id: &str) -> Op {
    use settle_store::{InboxKind, OpenOperation, Push};
    Op::Push(Push {
        machine: "m".into(),
        key: key.into(),
        event: "go".into(),
        params: serde_json::json!({}),
        request_id: Some(request_id.into()),
        kind: InboxKind::Raised,
        join_from: None,
        operation: Some(OpenOperation {
            request_id: request_id.into(),
            name: "m.go".into(),
            dimensions: serde_json::json!({}),
            priority: 0,
        }),
        reply: None,
    })
}

/// A step as the engine commits it: the event's action moves the entity on (`to`), with
/// its history, telemetry and operation bookkeeping.
fn step(c: &settle_store::Claimed, to: &str, at_rest: bool) -> Op {
    use settle_store::{AfterCommit, Commit, EventRecord, Fence, HistoryKind, Telemetry, TransitionRecord};
    let e = &c.entity;
    let item = c.inbox_head.as_ref();
    let fence = Fence { entity_id: e.id, version: e.version, owner: "engine-a".into() };
    let after = if at_rest { AfterCommit::Release } else { AfterCommit::Hold };
    Op::Commit(Box::new(Commit {
        to: Some(to.into()),
        consume: item.map(|i| i.id),
        event: item.map(|i| i.event.clone()),
        action: Some("go".into()),
        request_id: item.and_then(|i| i.request_id.clone()).or_else(|| e.request_id.clone()),
        notify_predecessors: true,
        telemetry: Telemetry {
            event: item.map(|i| EventRecord::of(i, false, false)),
            transition: Some(TransitionRecord {
                kind: "event",
                start_health: Some("ok"),
                end_health: "ok",
                entry_time: e.entered_at,
                start_time: e.entered_at,
                action_start_time: None,
                outcome: "ok",
            }),
            error: None,
            at_rest,
            complete: at_rest,
            current_event: e.event_id,
        },
        ..Commit::new(fence, e.state.clone(), HistoryKind::Event, after)
    }))
}

/// The round trips to PostgreSQL of a batch do not grow with the batch: creating, raising
/// on, stepping and finishing 64 entities at once takes as many as doing it for one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trips_per_batch_do_not_grow_with_the_batch() {
    let mut trips: Vec<(usize, [u64; 4])> = Vec::new();
    for n in [1usize, 8, 64] {
        let Some(url) = settle_store::postgres::test_url("trips") else { return };
        let store = open(&url).await;
        let claim = || Some(Claim::new("engine-a", 60_000, 1_000));
        let creates = (0..n).map(|i| Op::Create(entity(&format!("e{i}"), None))).collect();
        store.write(Batch { now: 10, ops: creates, claim: claim() }).await.unwrap();
        let created = store.last_batch_round_trips();
        let pushes = (0..n).map(|i| push_op(&format!("e{i}"), &format!("r{i}"))).collect();
        let r = store.write(Batch { now: 20, ops: pushes, claim: claim() }).await.unwrap();
        let raised = store.last_batch_round_trips();
        assert_eq!(r.claimed.len(), n);
        let steps = r.claimed.iter().map(|c| step(c, "busy", false)).collect();
        let r = store.write(Batch { now: 30, ops: steps, claim: claim() }).await.unwrap();
        let stepped = store.last_batch_round_trips();
        assert!(r.results.iter().all(|r| r.is_ok()), "{:?}", r.results);
        let mut finish = Vec::new();
        for e in store.entity_list(Default::default()).await.unwrap() {
            finish.push(step(&settle_store::Claimed { entity: e, inbox_head: None, trigger: None }, "done", true));
        }
        let r = store.write(Batch { now: 40, ops: finish, claim: claim() }).await.unwrap();
        let finished = store.last_batch_round_trips();
        assert!(r.results.iter().all(|r| r.is_ok()), "{:?}", r.results);
        let done = store.entity_list(Default::default()).await.unwrap();
        assert!(done.iter().all(|e| e.state == "done" && e.lease_owner.is_none()), "{done:?}");
        trips.push((n, [created, raised, stepped, finished]));
    }
    eprintln!("round trips per batch (create, raise, step, finish) by batch size: {trips:?}");
    for (n, t) in &trips[1..] {
        assert_eq!(t, &trips[0].1, "a batch of {n} took {t:?} round trips, a batch of 1 {:?}", trips[0].1);
    }
}

/// An agent's report reads its task once, with the other operations of its batch: a batch
/// of reports (and heartbeats) is one read, one write and the finish, whatever its size —
/// the task row is read and locked in the segment's read, with its entity, and the report
/// reaches the entity's inbox in the same write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_read_their_task_once_in_the_batchs_read() {
    use settle_store::{AgentTask, Applied, TaskCheck, TaskOffer, TaskResult};
    let mut trips = Vec::new();
    for n in [1usize, 16] {
        let Some(url) = settle_store::postgres::test_url("reports") else { return };
        let store = open(&url).await;
        let offer = TaskOffer { queue: "q".into(), action: "work".into(), lock_ms: 60_000, available_at: 0 };
        // Twice as many tasks: the first batch of reports prepares the statements (a round
        // trip of its own on a new connection), the second is measured.
        let creates =
            (0..2 * n).map(|i| Op::Create(NewEntity { offer: Some(offer.clone()), ..entity(&format!("e{i}"), None) }));
        store.write(Batch { now: 10, ops: creates.collect(), claim: None }).await.unwrap();
        let lease = Op::TaskLease { queue: "q".into(), agent: "a".into(), limit: 2 * n, token_prefix: "t-".into() };
        let r = store.write(Batch { now: 20, ops: vec![lease], claim: None }).await.unwrap();
        let Ok(Applied::Leased(tasks)) = &r.results[0] else { panic!("{:?}", r.results[0]) };
        assert_eq!(tasks.len(), 2 * n);
        let op = |t: &AgentTask, i: usize| match i % 2 {
            0 => Op::TaskReport {
                task: t.id,
                token: t.token.clone().unwrap(),
                result: TaskResult::Fail { error: "no".into(), retryable: true },
                check: TaskCheck::default(),
            },
            _ => Op::TaskHeartbeat { task: t.id, token: t.token.clone().unwrap(), check: TaskCheck::default() },
        };
        for half in tasks.chunks(n) {
            let ops = half.iter().enumerate().map(|(i, t)| op(t, i)).collect();
            let r = store.write(Batch { now: 30, ops, claim: None }).await.unwrap();
            assert!(r.results.iter().all(|r| r.is_ok()), "{:?}", r.results);
        }
        trips.push((n, store.last_batch_round_trips()));
    }
    eprintln!("round trips of a batch of reports and heartbeats by size: {trips:?}");
    for (n, t) in &trips {
        assert_eq!(*t, 3, "a batch of {n} reports and heartbeats took {t} round trips (read, write, finish expected)");
    }
}

/// A commit through one handle tells the other handles which entity changed, and that it
/// is at rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commits_are_told_to_other_handles() {
    use settle_store::Changes;
    let Some(url) = settle_store::postgres::test_url("changes") else { return };
    let a = open(&url).await;
    let b = open(&url).await;
    let mut told = b.changes().expect("PostgreSQL handles tell changes");
    // b listens from its first subscriber on, and says so: anything before was not heard.
    let first = tokio::time::timeout(Duration::from_secs(10), told.recv()).await.expect("b starts listening");
    assert_eq!(first.unwrap(), Changes::Lost);
    let claim = Some(Claim::new("engine-a", 60_000, 10));
    a.write(Batch { now: 10, ops: vec![Op::Create(entity("x", None))], claim: None }).await.unwrap();
    let r = a.write(Batch { now: 20, ops: vec![push_op("x", "r1")], claim }).await.unwrap();
    let c = r.claimed[0].clone();
    a.write(Batch { now: 30, ops: vec![step(&c, "done", true)], claim: None }).await.unwrap();
    let seen = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match told.recv().await.expect("listening") {
                Changes::Entities(list) => {
                    if let Some(ch) = list.iter().find(|ch| ch.entity_id == c.entity.id) {
                        return *ch;
                    }
                }
                Changes::Lost => {}
            }
        }
    })
    .await
    .expect("b hears of a's commit");
    assert!(seen.at_rest);
}

/// Reads the whole feed on from `at` until `want` items arrived (the conformance suite's
/// reader: other tests' transactions in the cluster may hold the feed back for a moment).
async fn feed_until(
    store: &PgStore,
    at: settle_store::FeedPos,
    want: usize,
) -> (Vec<settle_store::FeedItem>, settle_store::FeedPos) {
    settle_store::conformance::feed_read_all(store, at, &settle_store::FeedFilter::all(), 100, want).await
}

fn created_key(item: &settle_store::FeedItem) -> String {
    match item {
        settle_store::FeedItem::Transition { key, row, .. } => {
            format!("{}:{}", key.as_deref().unwrap_or("?"), row.kind.as_str())
        }
        settle_store::FeedItem::Operation { row, .. } => format!("end:{}", row.request_id),
    }
}

/// A transaction that began before a later write commits after it: the feed holds the
/// later write back until the older one ended, so a reader that resumes from where it
/// stopped gets both (a cursor over ids alone would have skipped the older one's row).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_feed_waits_for_a_transaction_still_running() {
    let Some(url) = settle_store::postgres::test_url("feedgap") else { return };
    let store = open(&url).await;
    let head = store.feed_head().await.unwrap();
    let r = store.write(Batch { now: 10, ops: vec![Op::Create(entity("e0", None))], claim: None }).await.unwrap();
    let Ok(settle_store::Applied::Created(e0)) = &r.results[0] else { panic!("{:?}", r.results) };
    let e0 = e0.id;
    // Another connection opens a transaction that writes a history row of e0, and waits.
    let base = std::env::var("SETTLE_TEST_PG").unwrap();
    let schema = url.rsplit("schema=").next().unwrap().to_string();
    let (written, wait_written) = std::sync::mpsc::channel();
    let (commit, wait_commit) = std::sync::mpsc::channel::<()>();
    let other = std::thread::spawn(move || {
        let mut c = postgres::Client::connect(&base, postgres::NoTls).unwrap();
        c.batch_execute(&format!("SET search_path TO \"{schema}\"")).unwrap();
        let mut tx = c.transaction().unwrap();
        tx.execute("INSERT INTO history (entity_id, kind, at, detail) VALUES ($1, 'fault', 11, 'older')", &[&e0])
            .unwrap();
        written.send(()).unwrap();
        wait_commit.recv().unwrap();
        tx.commit().unwrap();
    });
    wait_written.recv().unwrap();
    // A later write commits first.
    store.write(Batch { now: 12, ops: vec![Op::Create(entity("e1", None))], claim: None }).await.unwrap();
    let page = store.feed_read(head, settle_store::FeedFilter::all(), 100).await.unwrap();
    let seen: Vec<String> = page.items.iter().map(created_key).collect();
    assert!(!seen.contains(&"e1:create".to_string()), "the later write waits for the older transaction: {seen:?}");
    let (first, at) = feed_until(&store, head, 1).await;
    assert_eq!(first.iter().map(created_key).collect::<Vec<_>>(), ["e0:create"]);
    commit.send(()).unwrap();
    other.join().unwrap();
    let (rest, _) = feed_until(&store, at, 2).await;
    assert_eq!(
        rest.iter().map(created_key).collect::<Vec<_>>(),
        ["e0:fault", "e1:create"],
        "nothing skipped, in commit order"
    );
}

/// Two handles (as two instances) write concurrently while a reader follows the feed page
/// by page: it gets every change exactly once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_following_two_writers_misses_nothing() {
    let Some(url) = settle_store::postgres::test_url("feedrace") else { return };
    let (a, b) = (open(&url).await, open(&url).await);
    let head = a.feed_head().await.unwrap();
    let writer = |store: PgStore, name: &'static str| async move {
        for batch in 0..40 {
            let ops = (0..5).map(|i| Op::Create(entity(&format!("{name}{batch}-{i}"), None))).collect();
            store.write(Batch { now: 10, ops, claim: None }).await.unwrap();
        }
    };
    let (wa, wb) = (tokio::spawn(writer(a.clone(), "a")), tokio::spawn(writer(b, "b")));
    let reader = tokio::spawn(async move { feed_until(&a, head, 400).await.0 });
    wa.await.unwrap();
    wb.await.unwrap();
    let items = reader.await.unwrap();
    assert_eq!(items.len(), 400);
    assert!(items.windows(2).all(|w| w[0].pos() < w[1].pos()), "in order, each once");
    let keys: HashSet<String> = items.iter().map(created_key).collect();
    assert_eq!(keys.len(), 400, "every create once");
}
