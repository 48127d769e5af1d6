//! Bulk operations as the store keeps them: started once per request id, leased to one
//! instance at a time (another takes over only after the lease ends), advanced page by
//! page by the holder alone, done with the last page, canceled at any time.

use serde_json::json;

use super::T0;
use crate::{BulkAdvance, BulkRow, Store};

fn advance(request_id: &str, owner: &str, now: i64, cursor: &str, done: u64, finished: bool) -> BulkAdvance {
    BulkAdvance {
        request_id: request_id.into(),
        owner: owner.into(),
        now,
        lease_until: now + 10_000,
        cursor: Some(cursor.into()),
        done,
        failed: 1,
        last_error: Some(format!("refused at {cursor}")),
        finished,
    }
}

/// Start, replay, lease, advance, take over, finish, cancel.
pub async fn bulk_operations_start_once_lease_and_advance<S: Store>(store: S) {
    let filter = json!({"machine": "vm", "status": "failed"});
    let mut row = BulkRow::new("bulk-1".into(), "resume".into(), filter.clone(), "quota raised".into(), 50, T0);
    row.total = 7;
    let (stored, new) = store.bulk_start(row.clone()).await.unwrap();
    assert!(new);
    assert_eq!((stored.status.as_str(), stored.total, stored.done, stored.filter.clone()), ("running", 7, 0, filter));
    // The same request id again: the stored one, nothing new.
    let (again, new) = store.bulk_start(BulkRow { reason: "other".into(), ..row.clone() }).await.unwrap();
    assert!(!new);
    assert_eq!(again.reason, "quota raised");
    let mut raise = BulkRow::new("bulk-2".into(), "raise".into(), json!({"machine": "vm"}), "poke".into(), 5, T0 + 1);
    raise.event = Some("create".into());
    raise.params = json!({"n": 1});
    store.bulk_start(raise).await.unwrap();

    // A leases the oldest; B finds the next; A's lease keeps bulk-1 from B until it ends.
    let a = store.bulk_claim("a", T0, T0 + 10_000).await.unwrap().unwrap();
    assert_eq!((a.request_id.as_str(), a.owner.as_deref()), ("bulk-1", Some("a")));
    let b = store.bulk_claim("b", T0, T0 + 10_000).await.unwrap().unwrap();
    assert_eq!(
        (b.request_id.as_str(), b.event.as_deref(), b.params.clone()),
        ("bulk-2", Some("create"), json!({"n": 1}))
    );
    assert_eq!(store.bulk_claim("c", T0 + 5_000, T0 + 15_000).await.unwrap(), None, "both leased");
    // Only the holder advances.
    assert!(store.bulk_advance(advance("bulk-1", "a", T0 + 1, "id:10", 3, false)).await.unwrap());
    assert!(!store.bulk_advance(advance("bulk-1", "b", T0 + 1, "id:99", 9, false)).await.unwrap());
    let one = store.bulk_get("bulk-1").await.unwrap().unwrap();
    assert_eq!((one.cursor.as_deref(), one.done, one.failed, one.updated_at), (Some("id:10"), 3, 1, T0 + 1));
    assert_eq!(one.last_error.as_deref(), Some("refused at id:10"));
    // A's lease (renewed to T0 + 10 001) ends: C takes over and finishes it.
    let c = store.bulk_claim("c", T0 + 10_002, T0 + 20_000).await.unwrap().unwrap();
    assert_eq!((c.request_id.as_str(), c.cursor.as_deref()), ("bulk-1", Some("id:10")));
    assert!(!store.bulk_advance(advance("bulk-1", "a", T0 + 10_003, "id:20", 1, false)).await.unwrap());
    assert!(store.bulk_advance(advance("bulk-1", "c", T0 + 10_004, "id:20", 4, true)).await.unwrap());
    let one = store.bulk_get("bulk-1").await.unwrap().unwrap();
    assert_eq!((one.status.as_str(), one.done, one.failed, one.ended_at), ("done", 7, 2, Some(T0 + 10_004)));
    assert!(!store.bulk_advance(advance("bulk-1", "c", T0 + 10_005, "id:30", 1, false)).await.unwrap(), "done");
    // Canceled: ended, no longer leased or advanced; canceling again changes nothing.
    let canceled = store.bulk_cancel("bulk-2", T0 + 3).await.unwrap().unwrap();
    assert_eq!((canceled.status.as_str(), canceled.ended_at, canceled.owner), ("canceled", Some(T0 + 3), None));
    assert!(!store.bulk_advance(advance("bulk-2", "b", T0 + 4, "id:1", 1, false)).await.unwrap());
    assert_eq!(store.bulk_cancel("bulk-2", T0 + 9).await.unwrap().unwrap().ended_at, Some(T0 + 3));
    assert_eq!(store.bulk_cancel("nobody", T0).await.unwrap(), None);
    assert_eq!(store.bulk_claim("d", T0 + 50_000, T0 + 60_000).await.unwrap(), None, "nothing runs");
    let listed: Vec<String> = store.bulk_list(10).await.unwrap().into_iter().map(|b| b.request_id).collect();
    assert_eq!(listed, ["bulk-2", "bulk-1"], "newest first");
    assert_eq!(store.bulk_list(1).await.unwrap().len(), 1);
}
