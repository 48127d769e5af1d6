//! What other processes changed: the entities each of their batches committed, told to
//! this process (PostgreSQL's `LISTEN/NOTIFY`), so that a caller waiting here for an
//! entity is answered whichever instance moved it.

use std::sync::Arc;

use crate::{Applied, Batch, Op, OpError};

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
            (Op::Cancel(_), Ok(Applied::Canceled { entity, .. })) => {
                Some(Changed { entity_id: entity.id, at_rest: true })
            }
            _ => None,
        })
        .collect()
}

/// Largest notification payload written (PostgreSQL refuses 8000 bytes and more).
const MAX_PAYLOAD: usize = 7900;

/// The payloads telling the entities a batch of `sender` changed: `SENDER;ID,ID!,...`,
/// where `!` marks an entity at rest; split into several payloads when long.
pub(crate) fn encode(sender: &str, changed: &[Changed]) -> Vec<String> {
    if changed.is_empty() {
        return Vec::new();
    }
    let head = format!("{sender};");
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

/// Decodes [`encode`]: the sender and the changed entities.
pub(crate) fn decode(payload: &str) -> Option<(&str, Vec<Changed>)> {
    let (sender, ids) = payload.split_once(';')?;
    let mut changed = Vec::new();
    for item in ids.split(',').filter(|s| !s.is_empty()) {
        let (id, at_rest) = match item.strip_suffix('!') {
            Some(id) => (id, true),
            None => (item, false),
        };
        changed.push(Changed { entity_id: id.parse().ok()?, at_rest });
    }
    Some((sender, changed))
}

/// The sender of a wake-up payload (the payload is the sender; text after a `;` is
/// ignored).
pub(crate) fn sender(payload: &str) -> &str {
    payload.split(';').next().unwrap_or(payload)
}

/// A channel name for `prefix` and the store's schema, at most 63 bytes (PostgreSQL's
/// identifier limit; `pg_notify` refuses longer names): a long schema name is shortened
/// and made unique again by a hash of it.
pub(crate) fn channel(prefix: &str, schema: Option<&str>) -> String {
    let Some(schema) = schema else { return prefix.to_string() };
    let full = format!("{prefix}_{schema}");
    if full.len() <= 63 {
        return full;
    }
    // FNV-1a: stable across processes and versions (std's hashers are not).
    let hash = schema.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    let keep = 63 - prefix.len() - 1 - 17;
    format!("{prefix}_{}_{hash:016x}", &schema[..keep])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_round_trip() {
        let changed = [Changed { entity_id: 7, at_rest: false }, Changed { entity_id: 12, at_rest: true }];
        let p = encode("me-1", &changed);
        assert_eq!(p, vec!["me-1;7,12!".to_string()]);
        assert_eq!(decode(&p[0]), Some(("me-1", changed.to_vec())));
        assert!(encode("me", &[]).is_empty(), "nothing to tell");
        assert_eq!(decode("me;x"), None, "garbage is not read as anything");
        assert_eq!(decode("me"), None);
        assert_eq!(sender("123-abc"), "123-abc");
        assert_eq!(sender("123-abc;1;5,6"), "123-abc", "an older payload still names its sender");
    }

    #[test]
    fn long_batches_are_split_below_the_limit() {
        let changed: Vec<Changed> =
            (0..5000).map(|i| Changed { entity_id: 1_000_000_000 + i, at_rest: i % 2 == 0 }).collect();
        let payloads = encode("sender", &changed);
        assert!(payloads.len() > 1);
        let mut back = Vec::new();
        for p in &payloads {
            assert!(p.len() < 8000, "{}", p.len());
            let (sender, c) = decode(p).unwrap();
            assert_eq!(sender, "sender");
            back.extend(c);
        }
        assert_eq!(back, changed);
    }

    #[test]
    fn channel_names_fit_postgres_identifiers() {
        assert_eq!(channel("settle_wake", None), "settle_wake");
        assert_eq!(channel("settle_wake", Some("tenant_1")), "settle_wake_tenant_1");
        let long = "s".repeat(63);
        let a = channel("settle_changes", Some(&long));
        let b = channel("settle_changes", Some(&format!("{}t", "s".repeat(62))));
        assert!(a.len() <= 63 && b.len() <= 63, "{a} {b}");
        assert_ne!(a, b, "shortened names stay distinct");
    }
}
