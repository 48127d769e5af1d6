//! Supervision of operations: an operation open since before a deadline with no progress
//! since (nothing it reached entered a state or retried, none of its events was queued) is
//! marked hung, for an operator to look at. It may still end later.

use crate::Millis;
use crate::plan::rows::OpenOperation;

/// The request ids of the operations hung at `before`: started before it, with no progress
/// since.
pub(crate) fn hung(open: &[OpenOperation], before: Millis) -> Vec<String> {
    let since = |t: Option<Millis>| t.is_some_and(|t| t >= before);
    open.iter()
        .filter(|o| o.started_at < before && !since(o.last_entered) && !since(o.last_queued))
        .map(|o| o.request_id.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hung_means_old_and_without_progress_since_the_deadline() {
        let op = |id: &str, started_at, last_entered, last_queued| OpenOperation {
            request_id: id.into(),
            started_at,
            last_entered,
            last_queued,
        };
        let before = 1_000;
        let open = [
            op("idle", 10, None, None),
            op("stale", 10, Some(999), Some(500)),
            op("moving", 10, Some(1_000), None),
            op("queued", 10, None, Some(1_000)),
            op("young", 1_000, None, None),
        ];
        assert_eq!(hung(&open, before), vec!["idle".to_string(), "stale".to_string()]);
    }
}
