//! What other processes changed: the entities each of their batches committed, told to
//! this process (PostgreSQL's `LISTEN/NOTIFY`), so that a caller waiting here for an
//! entity is answered whichever instance moved it.

use std::sync::Arc;

use crate::types::{Applied, Batch, Op, OpError};

/// One entity a batch of another process committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Changed {
    /// The entity.
    pub entity_id: i64,
    /// It is at rest afterwards (in a stable state, or changed by an operator command).
    pub at_rest: bool,
}

/// What [`Store::changes`](crate::Store::changes) tells.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Changes {
    /// These entities changed, in one committed batch of another process.
    Entities(Arc<[Changed]>),
    /// Some notifications may have been missed (the listener reconnected, or this receiver
    /// fell behind): any entity may have changed.
    Lost,
}

/// The entities a written batch changed, as other processes should hear of them: every
/// committed step and every applied operator command.
pub(crate) fn changed(batch: &Batch, results: &[Result<Applied, OpError>]) -> Vec<Changed> {
    batch
        .ops
        .iter()
        .zip(results)
        .filter_map(|(op, r)| match (op, r) {
            (Op::Commit(c), Ok(Applied::Committed { .. })) => {
                Some(Changed { entity_id: c.fence.entity_id, at_rest: c.telemetry.at_rest })
            }
            (Op::Command { .. }, Ok(Applied::Commanded(e))) => Some(Changed { entity_id: e.id, at_rest: true }),
            _ => None,
        })
        .collect()
}

/// Largest notification payload written (PostgreSQL refuses 8000 bytes and more).
const MAX_PAYLOAD: usize = 7900;

/// The notification payloads for a batch of `sender`: `SENDER;W;ID,ID!,...` where `W` is
/// `1` if the batch gave others work to claim, and `!` marks an entity at rest. Split into
/// several payloads when long; none when there is nothing to tell.
pub(crate) fn encode(sender: &str, work: bool, changed: &[Changed]) -> Vec<String> {
    if !work && changed.is_empty() {
        return Vec::new();
    }
    let head = format!("{sender};{};", if work { 1 } else { 0 });
    let mut out = Vec::new();
    let mut current = head.clone();
    for c in changed {
        let item = format!("{}{}", c.entity_id, if c.at_rest { "!" } else { "" });
        if current.len() + item.len() + 1 > MAX_PAYLOAD && current.len() > head.len() {
            out.push(std::mem::replace(&mut current, head.clone()));
        }
        if current.len() > head.len() {
            current.push(',');
        }
        current.push_str(&item);
    }
    out.push(current);
    out
}

/// Decodes [`encode`]: the sender, whether there is work, and the changed entities. A
/// payload of an older Settle (just the sender) means work and no changes.
pub(crate) fn decode(payload: &str) -> Option<(&str, bool, Vec<Changed>)> {
    let mut parts = payload.splitn(3, ';');
    let sender = parts.next()?;
    let Some(work) = parts.next() else { return Some((sender, true, Vec::new())) };
    let ids = parts.next()?;
    let mut changed = Vec::new();
    for item in ids.split(',').filter(|s| !s.is_empty()) {
        let (id, at_rest) = match item.strip_suffix('!') {
            Some(id) => (id, true),
            None => (item, false),
        };
        changed.push(Changed { entity_id: id.parse().ok()?, at_rest });
    }
    Some((sender, work == "1", changed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_round_trip() {
        let changed = [Changed { entity_id: 7, at_rest: false }, Changed { entity_id: 12, at_rest: true }];
        let p = encode("me-1", true, &changed);
        assert_eq!(p, vec!["me-1;1;7,12!".to_string()]);
        assert_eq!(decode(&p[0]), Some(("me-1", true, changed.to_vec())));
        assert_eq!(decode("me-1;0;"), Some(("me-1", false, Vec::new())));
        assert!(encode("me", false, &[]).is_empty(), "nothing to tell");
        assert_eq!(encode("me", true, &[]), vec!["me;1;".to_string()]);
    }

    #[test]
    fn an_old_payload_means_work() {
        assert_eq!(decode("123-abc"), Some(("123-abc", true, Vec::new())));
        assert_eq!(decode("me;1;x"), None, "garbage is not read as anything");
    }

    #[test]
    fn long_batches_are_split_below_the_limit() {
        let changed: Vec<Changed> =
            (0..5000).map(|i| Changed { entity_id: 1_000_000_000 + i, at_rest: i % 2 == 0 }).collect();
        let payloads = encode("sender", false, &changed);
        assert!(payloads.len() > 1);
        let mut back = Vec::new();
        for p in &payloads {
            assert!(p.len() < 8000, "{}", p.len());
            let (sender, work, c) = decode(p).unwrap();
            assert_eq!((sender, work), ("sender", false));
            back.extend(c);
        }
        assert_eq!(back, changed);
    }
}
