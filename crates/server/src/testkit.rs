//! What the server's handler tests (`tests.rs`) and the `settle` binary's HTTP tests
//! (`crates/cli/tests/common`, which includes this file by path) check alike: the test
//! machines, everything a request could change in a store, what a problem document must
//! be, and a query value percent-encoded.
//!
//! It names nothing of this crate (only settle-store and serde_json), so that it compiles
//! in both.

use serde_json::Value;
use settle_store::{EntityFilter, Store, TaskFilter};

/// A door: `closed` ⇄ `open`, `paint` needs a `color`, `remove` deletes it; `open` is
/// rejected with a declared reason when the door is open already.
pub const DOOR: &str = include_str!("testdata/door.toml");

/// An agent-provisioned machine (DESIGN §5): `create` → `provisioning`, whose action agents
/// of queue `cloud` execute (lock 1 min) → `ready` or `provisioning` again.
pub const VM: &str = include_str!("testdata/vm.toml");

/// A site: `build` creates parts `-disk` and `-net` → `building`; all parts `up` → `up`;
/// any part in an error-health state → `failed` (error). `give_up` takes the same edge.
pub const SITE: &str = include_str!("testdata/site.toml");

/// A part of a site: `start` → `provisioning`, whose action agents of queue `cloud`
/// execute → `up`, or `broken` (error) with their reason.
pub const PART: &str = include_str!("testdata/part.toml");

/// Everything a request could change: agent tasks, entities with their histories and
/// inboxes, operations.
pub async fn dump(store: &impl Store) -> String {
    let mut out = String::new();
    for t in store.task_list(TaskFilter::default()).await.unwrap() {
        out.push_str(&format!("task {t:?}\n"));
    }
    for e in store.entity_list(EntityFilter::default()).await.unwrap() {
        out.push_str(&format!("{e:?}\n"));
        for h in store.history_list(e.id).await.unwrap() {
            out.push_str(&format!("  {h:?}\n"));
        }
        for i in store.inbox_list(e.id).await.unwrap() {
            out.push_str(&format!("  inbox {i:?}\n"));
        }
    }
    for o in store.operation_list(None, 10_000).await.unwrap() {
        out.push_str(&format!("{o:?}\n"));
    }
    out
}

/// `v` percent-encoded as a query value (every byte but the unreserved ones).
pub fn query_value(v: &str) -> String {
    v.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Asserts that an answer (`status`, `content_type`, `body`) is a problem document of
/// `want` and `slug`, with a title and a detail, and returns it.
#[track_caller]
pub fn problem(status: u16, content_type: Option<&str>, body: &str, want: u16, slug: &str) -> Value {
    assert_eq!(status, want, "{body}");
    assert_eq!(content_type, Some("application/problem+json"), "{body}");
    let v: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"));
    assert_eq!(v["type"], format!("https://settle.dev/problems/{slug}"), "{v}");
    assert_eq!(v["status"], want, "{v}");
    assert!(v["title"].is_string() && v["detail"].is_string(), "{v}");
    v
}
