//! The change feed (DESIGN §9): history rows and operation ends in the order they
//! committed; a reader resuming from any position it was given gets exactly the rest, in
//! pages of any size; a filter narrows what is sent, never where the reader stands.

use serde_json::json;
use settle_core::{EntityKey, MachineName};

use super::{T0, claim_with_event, commit, new_entity, write};
use crate::{AfterCommit, Command, FeedFilter, FeedItem, FeedPos, Op, OpenOperation, Store};

/// Reads on from `after` until `want` changes arrived and nothing more is readable: the
/// items and where it ended. (On PostgreSQL a change becomes readable once every older
/// transaction in the cluster ended: other tests' may hold it back for a moment.)
pub async fn read_all<S: Store>(
    store: &S,
    after: FeedPos,
    filter: &FeedFilter,
    limit: usize,
    want: usize,
) -> (Vec<FeedItem>, FeedPos) {
    let mut items = Vec::new();
    let mut at = after;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let page = store.feed_read(at, filter.clone(), limit).await.expect("feed read");
        assert!(page.until >= at, "a read never goes back: {at} then {}", page.until);
        assert!(page.items.len() <= limit, "at most the limit");
        for i in &page.items {
            assert!(i.pos() > at && i.pos() <= page.until, "{} outside ({at}, {}]", i.pos(), page.until);
        }
        items.extend(page.items);
        at = page.until;
        if !page.more {
            if items.len() >= want {
                return (items, at);
            }
            assert!(std::time::Instant::now() < deadline, "only {} of {want} changes: {items:?}", items.len());
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }
}

fn describe(items: &[FeedItem]) -> Vec<String> {
    items
        .iter()
        .map(|i| match i {
            FeedItem::Transition { key, row, .. } => {
                format!("{} {} {}", key.as_deref().unwrap_or("?"), row.kind.as_str(), row.to.as_deref().unwrap_or("-"))
            }
            FeedItem::Operation { row, .. } => {
                format!("end {} {}", row.request_id, row.outcome.as_deref().unwrap_or("-"))
            }
        })
        .collect()
}

/// Creates, a command ending its operation and an event's move, over four writes: the
/// feed from the head before them holds each once, in commit order, whatever the page
/// size; from any position it holds exactly what followed; each filter keeps only its
/// changes and still moves the reader past the others.
pub async fn the_feed_resumes_from_any_position_without_gaps<S: Store>(store: S) {
    let head = store.feed_head().await.expect("head");
    let (none, at) = read_all(&store, FeedPos::START, &FeedFilter::all(), 10, 0).await;
    assert!(none.is_empty(), "a new store's feed is empty: {none:?}");
    assert!(at >= head, "reading an empty feed ends at the head or later");

    write(
        &store,
        T0,
        vec![Op::Create(new_entity("a", "idle", None)), Op::Create(new_entity("b", "idle", None))],
        false,
    )
    .await;
    write(&store, T0 + 1, vec![Op::Create(new_entity("c", "idle", None))], false).await;
    let pause = Op::Command {
        machine: MachineName::new("m"),
        key: EntityKey::new("a"),
        command: Command::Pause,
        operation: Some(OpenOperation {
            request_id: "op-pause".into(),
            name: "m.pause".into(),
            dimensions: json!({}),
            priority: 0,
        }),
    };
    write(&store, T0 + 2, vec![pause], false).await;
    let (b, ev) = claim_with_event(&store, T0 + 3, "b").await;
    let c = commit(&b, Some("done"), Some(ev.id), AfterCommit::Release);
    write(&store, T0 + 4, vec![Op::Commit(Box::new(c))], false).await;

    let (all, end) = read_all(&store, head, &FeedFilter::all(), 100, 6).await;
    assert_eq!(
        describe(&all),
        ["a create idle", "b create idle", "c create idle", "a command -", "end op-pause success", "b event done"]
    );
    assert!(all.windows(2).all(|w| w[0].pos() < w[1].pos()), "strictly in order");
    assert!(all[0].pos().commit == all[1].pos().commit, "one write, one commit");
    assert!(all[1].pos().commit < all[2].pos().commit, "a later write, a later commit");
    if let FeedItem::Transition { machine, row, .. } = &all[5] {
        assert_eq!(machine.as_deref(), Some("m"));
        assert_eq!(row.event.as_deref(), Some("go"));
        assert_eq!(row.request_id.as_deref(), Some("req-go"));
    }

    for limit in 1..=3 {
        let (paged, _) = read_all(&store, head, &FeedFilter::all(), limit, all.len()).await;
        assert_eq!(paged, all, "pages of {limit}");
    }
    for (n, item) in all.iter().enumerate() {
        let (rest, _) = read_all(&store, item.pos(), &FeedFilter::all(), 2, all.len() - n - 1).await;
        assert_eq!(rest, all[n + 1..], "resumed after {}", item.pos());
        let text = item.pos().to_string();
        assert_eq!(text.parse::<FeedPos>(), Ok(item.pos()), "a position survives its text");
    }

    let store = &store;
    let only = |f: FeedFilter| async move { describe(&read_all(store, head, &f, 2, 0).await.0) };
    let all_of = FeedFilter::all();
    assert_eq!(only(FeedFilter { key: Some("b".into()), ..all_of.clone() }).await, ["b create idle", "b event done"]);
    assert_eq!(only(FeedFilter { state: Some("done".into()), ..all_of.clone() }).await, ["b event done"]);
    assert_eq!(
        only(FeedFilter { request_id: Some("op-pause".into()), ..all_of.clone() }).await,
        ["a command -", "end op-pause success"]
    );
    assert_eq!(only(FeedFilter { transitions: false, ..all_of.clone() }).await, ["end op-pause success"]);
    assert_eq!(only(FeedFilter { operations: false, ..all_of.clone() }).await.len(), 5);
    assert_eq!(only(FeedFilter { machine: Some("other".into()), ..all_of.clone() }).await, Vec::<String>::new());
    let (nothing, moved) = read_all(store, head, &FeedFilter { machine: Some("other".into()), ..all_of }, 2, 0).await;
    assert!(nothing.is_empty());
    assert!(moved >= end, "a filter that keeps nothing still moves the reader past it");

    // What commits later comes after where a reader stopped.
    write(store, T0 + 5, vec![Op::Create(new_entity("d", "idle", None))], false).await;
    let (later, _) = read_all(store, end, &FeedFilter::all(), 10, 1).await;
    assert_eq!(describe(&later), ["d create idle"]);
    assert!(store.feed_head().await.unwrap() >= later[0].pos(), "the head is past what committed");
}
