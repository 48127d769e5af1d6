//! Pruning ([`Op::Prune`]): a round removes every row an ended entity left, in every table,
//! and nothing of any other entity; an entity linked to a live one, or with work queued,
//! stays; a dry run reports exactly what a round removes and changes nothing; a removed
//! key can be created again; an operation past its time is gone, and its request id starts
//! a new operation; the fleet counts still equal their rows.

use std::collections::BTreeMap;

use serde_json::json;
use settle_core::{EntityKey, MachineName};

use super::fleet::counts_agree;
use super::{T0, claim_with_event, commit, create_one, get, new_entity, push, write};
use crate::{
    AfterCommit, Applied, Command, ErrorRecord, EventRecord, Millis, Op, OpenOperation, Prune, PruneRule, Pruned,
    Store, Telemetry, Trim,
};

/// Rows per table.
async fn rows<S: Store>(store: &S) -> BTreeMap<String, u64> {
    store.storage().await.expect("storage").tables.into_iter().collect()
}

/// One round at `now`, with rules for the end states of machine `m` ended before `before`.
async fn round<S: Store>(store: &S, now: Millis, before: Millis, dry_run: bool) -> Pruned {
    let rule = |state: &str| PruneRule { machine: "m".into(), state: state.into(), before, after: None };
    let p = Prune {
        ended: vec![rule("deleted"), rule("done")],
        operations_before: Some(before),
        tasks_before: Some(before),
        minutes_before: Some(before),
        limit: 100,
        rows: 1_000,
        dry_run,
        ..Prune::default()
    };
    let r = write(store, now, vec![Op::Prune(Box::new(p))], false).await;
    match r.results.into_iter().next().expect("one result") {
        Ok(Applied::Pruned(p)) => *p,
        other => panic!("prune failed: {other:?}"),
    }
}

/// Moves `key` to `to` (an end state unless `idle`) by an event, creating `creates`, with
/// an error recorded on the way.
async fn end<S: Store>(store: &S, now: Millis, key: &str, to: &str, creates: &[&str]) {
    end_trimming(store, now, key, to, creates, None).await;
}

/// [`end`], the commit carrying `trim`.
async fn end_trimming<S: Store>(store: &S, now: Millis, key: &str, to: &str, creates: &[&str], trim: Option<Trim>) {
    let (e, ev) = claim_with_event(store, now, key).await;
    let mut c = commit(&e, Some(to), Some(ev.id), AfterCommit::Release);
    c.ended = to != "idle";
    c.trim = trim;
    c.creates = creates.iter().map(|k| new_entity(k, "idle", None)).collect();
    c.telemetry = Telemetry {
        event: Some(EventRecord::of(&ev, false, false)),
        error: Some(ErrorRecord {
            kind: "action_error",
            details: format!("{key} failed once"),
            exception: Some("trace".into()),
            retried: true,
            cause: Vec::new(),
        }),
        // A trimming commit rests: its event ends, and so may the ones trimmed.
        at_rest: trim.is_some(),
        complete: trim.is_some(),
        ..Telemetry::default()
    };
    let r = write(store, now + 1, vec![Op::Commit(Box::new(c))], false).await;
    assert!(r.results[0].is_ok(), "{:?}", r.results[0]);
}

/// A round removes an ended entity's every row and nothing else; what keeps an entity
/// keeps it; a dry run changes nothing; keys and request ids are free again.
pub async fn pruning_removes_every_row_an_ended_entity_left<S: Store>(store: S) {
    // `p` ends in `deleted` after creating `c1`, which ends in `done`: both may go.
    create_one(&store, "p").await;
    let (p, ev) = claim_with_event(&store, T0, "p").await;
    let mut c = commit(&p, Some("working"), Some(ev.id), AfterCommit::Release);
    c.creates = vec![new_entity("c1", "idle", None)];
    assert!(write(&store, T0 + 1, vec![Op::Commit(Box::new(c))], false).await.results[0].is_ok());
    end(&store, T0 + 10, "c1", "done", &[]).await;
    end(&store, T0 + 20, "p", "deleted", &[]).await;
    // `live` stays in `idle`; its successor `c2` ended, but a live predecessor keeps it.
    create_one(&store, "live").await;
    end(&store, T0 + 30, "live", "idle", &["c2"]).await;
    end(&store, T0 + 40, "c2", "done", &[]).await;
    // `queued` ended, but an event waits in its inbox.
    create_one(&store, "queued").await;
    end(&store, T0 + 50, "queued", "deleted", &[]).await;
    write(&store, T0 + 60, vec![Op::Push(push("queued", "late"))], false).await;
    // An operation, ended at once (an operator command is done when applied).
    create_one(&store, "o1").await;
    let op = OpenOperation { request_id: "op-old".into(), name: "m.pause".into(), dimensions: json!({}), priority: 0 };
    let pause = |command| Op::Command {
        machine: MachineName::new("m"),
        key: EntityKey::new("o1"),
        command,
        operation: Some(op.clone()),
    };
    let old = write(&store, T0 + 70, vec![pause(Command::Pause)], false).await;
    assert!(old.results[0].is_ok(), "{:?}", old.results[0]);
    assert!(store.operation_get("op-old").await.unwrap().unwrap().ended_at.is_some());
    let live_before = (
        store.history_list(get(&store, "live").await.id).await.unwrap(),
        store.events_list(get(&store, "live").await.id).await.unwrap(),
        store.error_list(get(&store, "live").await.id, 100).await.unwrap(),
    );
    let (p, c1) = (get(&store, "p").await, get(&store, "c1").await);
    let expected_history =
        (store.history_list(p.id).await.unwrap().len() + store.history_list(c1.id).await.unwrap().len()) as u64;
    let expected_events =
        (store.events_list(p.id).await.unwrap().len() + store.events_list(c1.id).await.unwrap().len()) as u64;
    assert!(expected_history >= 4 && expected_events >= 2, "{expected_history} {expected_events}");

    // Nothing has ended before T0: nothing goes.
    let none = round(&store, T0 + 100, T0, false).await;
    assert_eq!((none.entities.len(), none.rows.total(), none.kept), (0, 0, 0), "{none:?}");

    // A newer operation, ended at the cut-off (not past it): on SQLite `op-old` is then not
    // the newest operation, whose id would be handed out again.
    let now = T0 + 10 * 60_000;
    let newer =
        OpenOperation { request_id: "op-newer".into(), name: "m.resume".into(), dimensions: json!({}), priority: 0 };
    let resume = Op::Command {
        machine: MachineName::new("m"),
        key: EntityKey::new("o1"),
        command: Command::Resume,
        operation: Some(newer),
    };
    assert!(write(&store, now, vec![resume], false).await.results[0].is_ok());

    // A dry run says what goes and changes nothing.
    let before = rows(&store).await;
    let dry = round(&store, now, now, true).await;
    assert_eq!(rows(&store).await, before, "a dry run changes nothing");
    let keys: Vec<&str> = dry.entities.iter().map(|e| e.key.as_str()).collect();
    assert_eq!(keys, ["p", "c1"], "by rule, then by end time");
    assert_eq!(dry.kept, 2, "c2 (a live predecessor) and queued (an event waits)");
    assert!(!dry.more, "{dry:?}");

    // The round removes exactly what the dry run said.
    let done = round(&store, now, now, false).await;
    assert_eq!((done.entities.clone(), done.rows, done.kept), (dry.entities.clone(), dry.rows, dry.kept));
    let r = done.rows;
    assert_eq!((r.entities, r.history, r.events, r.errors), (2, expected_history, expected_events, 2), "{r:?}");
    assert_eq!((r.exceptions, r.successors, r.operations), (2, 1, 1), "{r:?}");
    assert!(r.minute_counts >= 1, "{r:?}");
    let after = rows(&store).await;
    for (table, n) in r.tables() {
        assert_eq!(before[table] - after[table], n, "{table}: the round's count is what the table lost");
    }
    assert_eq!(before["entities"] - after["entities"], 2);
    for gone in [&p, &c1] {
        assert!(store.entity_get("m", &gone.key).await.unwrap().is_none());
        assert!(store.history_list(gone.id).await.unwrap().is_empty());
        assert!(store.events_list(gone.id).await.unwrap().is_empty());
        assert!(store.error_list(gone.id, 100).await.unwrap().is_empty());
    }
    // Everything of every other entity is still there.
    let live = get(&store, "live").await;
    assert_eq!(
        (
            store.history_list(live.id).await.unwrap(),
            store.events_list(live.id).await.unwrap(),
            store.error_list(live.id, 100).await.unwrap()
        ),
        live_before
    );
    for kept in ["c2", "queued", "o1"] {
        get(&store, kept).await;
    }
    assert_eq!(store.successor_snapshot(live.id).await.unwrap().successors.len(), 1);
    counts_agree(&store, now).await;

    // The keys are free again; the pruned operation's request id opens a new operation.
    let again =
        write(&store, now + 1, vec![Op::Create(new_entity("p", "idle", None)), pause(Command::Resume)], false).await;
    assert!(matches!(again.results[0], Ok(Applied::Created(_))), "{:?}", again.results[0]);
    assert!(
        matches!(again.results[1], Ok(Applied::Commanded(_))),
        "a new operation, not a replay: {:?}",
        again.results[1]
    );
    counts_agree(&store, now + 1).await;
}

/// No id is handed out twice: whatever a round removes, the entities and history rows
/// written after it have larger ids than every one before it (SQLite keeps the newest row
/// of a table until a newer one exists, as it would give its id to the next).
pub async fn pruning_never_hands_an_id_out_again<S: Store>(store: S) {
    let mut last = (0, 0);
    for (i, key) in ["a", "b", "c"].into_iter().enumerate() {
        let now = T0 + i as Millis * 60_000;
        create_one(&store, key).await;
        let e = get(&store, key).await;
        let history = store.history_list(e.id).await.unwrap();
        let first = history.first().expect("its creation").id;
        assert!(
            e.id > last.0 && first > last.1,
            "{key}: entity {} after {}, history {first} after {}",
            e.id,
            last.0,
            last.1
        );
        end(&store, now + 10, key, "deleted", &[]).await;
        let newest = store.history_list(e.id).await.unwrap().last().expect("history").id;
        last = (e.id, newest);
        round(&store, now + 20, now + 20, false).await;
        counts_agree(&store, now + 20).await;
    }
    // Once newer rows exist, the older ended entities go.
    let done = round(&store, T0 + 600_000, T0 + 600_000, false).await;
    for gone in ["a", "b"] {
        assert!(store.entity_get("m", gone).await.unwrap().is_none(), "{gone}: {done:?}");
    }
}

/// A commit that trims its entity's past ([`Trim`]) leaves its latest rows of history,
/// events and errors (by count and by age), never an exception without its error, and
/// nothing of any other entity changed.
pub async fn trimming_keeps_a_live_entitys_latest_past<S: Store>(store: S) {
    create_one(&store, "t").await;
    create_one(&store, "other").await;
    // (A trim that keeps all: each commit rests, its event ends.)
    let all = Some(Trim::default());
    for i in 0..5 {
        end_trimming(&store, T0 + 100 * i, "t", "idle", &[], all).await;
        end_trimming(&store, T0 + 100 * i + 50, "other", "idle", &[], all).await;
    }
    let t = get(&store, "t").await;
    let other = get(&store, "other").await;
    let other_before = past(&store, other.id).await;
    let (history, events, errors) = past(&store, t.id).await;
    assert_eq!((history.len(), events, errors), (6, 5, 5), "created, five events, five errors");
    // By count: the latest 3 of each stay (the trimming commit's own among them).
    end_trimming(&store, T0 + 600, "t", "idle", &[], Some(Trim { before: None, rows: Some(3) })).await;
    let (history, events, errors) = past(&store, t.id).await;
    assert_eq!((history.len(), events, errors), (3, 3, 3));
    assert_eq!(history.last().map(|h| h.at), Some(T0 + 601), "the latest stays");
    // By age: everything before the cut-off goes but the latest of each.
    end_trimming(&store, T0 + 700, "t", "idle", &[], Some(Trim { before: Some(T0 + 650), rows: None })).await;
    let (history, events, errors) = past(&store, t.id).await;
    assert_eq!((history.len(), events, errors), (1, 1, 1), "{history:?}");
    assert_eq!(past(&store, other.id).await, other_before, "another entity keeps all of its past");
    // Every error here was recorded with an exception: they went together.
    let tables = rows(&store).await;
    assert_eq!(tables["exceptions"], tables["errors"], "no exception without its error, nor an error without it");
    counts_agree(&store, T0 + 800).await;
}

/// An entity's history rows, and how many processed events and errors it has.
async fn past<S: Store>(store: &S, id: i64) -> (Vec<crate::HistoryRow>, usize, usize) {
    (
        store.history_list(id).await.unwrap(),
        store.events_list(id).await.unwrap().len(),
        store.error_list(id, 100).await.unwrap().len(),
    )
}
