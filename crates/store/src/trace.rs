//! The `store.commit` span around each batch's transaction, from `BEGIN` to `COMMIT` on
//! the writer (level `info`; `debug` for a batch that only claims): the backend, how many
//! operations and entity commits the batch carries, the request ids of its operations
//! (the first [`MAX_REQUEST_IDS`] distinct ones, comma-separated), how many entities it
//! claimed, and the error if it failed. Inside it, one `debug` event per entity commit
//! with its request id.
//!
//! With no subscriber listening at that level, a batch pays one disabled-span check:
//! nothing is counted, collected or allocated.

use tracing::field::Empty;
use tracing::{Level, Span};

use crate::{Batch, BatchResult, Op, Result};

/// At most this many request ids are listed on a span.
pub(crate) const MAX_REQUEST_IDS: usize = 16;

/// The span of `batch`'s transaction (enter it on the writer).
pub(crate) fn commit_span(backend: &'static str, batch: &Batch) -> Span {
    // A batch with no operations only claims due entities (the engine's idle polls among
    // them): `debug`, so that an idle engine exports nothing at `info`.
    macro_rules! span {
        ($level:expr) => {
            tracing::span!(
                $level,
                "store.commit",
                backend,
                ops = batch.ops.len(),
                commits = Empty,
                request_ids = Empty,
                claimed = Empty,
                error = Empty,
                otel.status_code = Empty,
            )
        };
    }
    let span = if batch.ops.is_empty() { span!(Level::DEBUG) } else { span!(Level::INFO) };
    if !span.is_disabled() {
        let commits = batch.ops.iter().filter(|op| matches!(op, Op::Commit(_))).count();
        span.record("commits", commits);
        if let Some(ids) = request_ids(batch) {
            span.record("request_ids", ids.as_str());
        }
    }
    span
}

/// Records on `span` how `batch` ended, and emits the per-commit events (inside `span`:
/// call it while entered).
pub(crate) fn finish(span: &Span, batch: &Batch, result: &Result<BatchResult>) {
    if span.is_disabled() {
        return;
    }
    let results = match result {
        Ok(r) => {
            span.record("claimed", r.claimed.len());
            Some(&r.results)
        }
        Err(e) => {
            span.record("error", tracing::field::display(e));
            span.record("otel.status_code", "error");
            None
        }
    };
    if !tracing::enabled!(Level::DEBUG) {
        return;
    }
    for (i, op) in batch.ops.iter().enumerate() {
        let Op::Commit(c) = op else { continue };
        let error = match results.and_then(|r| r.get(i)) {
            Some(Err(e)) => Some(e.to_string()),
            _ => None,
        };
        tracing::debug!(
            entity_id = c.fence.entity_id,
            request_id = c.request_id.as_deref(),
            from = c.from.as_str(),
            to = c.to.as_ref().map(|s| s.as_str()),
            error,
            "commit"
        );
    }
}

/// The distinct request ids of `batch`'s operations, in order, comma-separated: at most
/// [`MAX_REQUEST_IDS`] of them, then `…` if there are more.
fn request_ids(batch: &Batch) -> Option<String> {
    let mut ids: Vec<&str> = Vec::new();
    let mut more = false;
    for op in &batch.ops {
        let id = match op {
            Op::Create(n) => n.request_id.as_deref().or(n.operation.as_ref().map(|o| o.request_id.as_str())),
            Op::Push(p) => p.request_id.as_deref().or(p.operation.as_ref().map(|o| o.request_id.as_str())),
            Op::Commit(c) => c.request_id.as_deref(),
            Op::Command { operation, .. } => operation.as_ref().map(|o| o.request_id.as_str()),
            Op::Cancel(c) => c.operation.as_ref().map(|o| o.request_id.as_str()),
            _ => None,
        };
        let Some(id) = id else { continue };
        if ids.contains(&id) {
            continue;
        }
        if ids.len() == MAX_REQUEST_IDS {
            more = true;
            break;
        }
        ids.push(id);
    }
    if ids.is_empty() {
        return None;
    }
    let mut out = ids.join(",");
    if more {
        out.push_str(",…");
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AfterCommit, Commit, Fence, HistoryKind};

    fn commit(request_id: Option<&str>) -> Op {
        let fence = Fence { entity_id: 1, version: 1, owner: "me".into() };
        let mut c = Commit::new(fence, "idle".into(), HistoryKind::Event, AfterCommit::Hold);
        c.request_id = request_id.map(str::to_string);
        Op::Commit(Box::new(c))
    }

    #[test]
    fn request_ids_are_distinct_and_bounded() {
        let batch = |ops| Batch { now: 0, ops, claim: None };
        assert_eq!(request_ids(&batch(vec![])), None);
        assert_eq!(request_ids(&batch(vec![commit(None)])), None);
        let b = batch(vec![commit(Some("a")), commit(None), commit(Some("b")), commit(Some("a"))]);
        assert_eq!(request_ids(&b).as_deref(), Some("a,b"));
        let many: Vec<_> = (0..40).map(|i| commit(Some(&format!("r{}", i % 20)))).collect();
        let listed = request_ids(&batch(many)).unwrap();
        assert_eq!(listed.split(',').count(), MAX_REQUEST_IDS + 1);
        assert!(listed.starts_with("r0,r1,") && listed.ends_with("r15,…"), "{listed}");
    }
}
