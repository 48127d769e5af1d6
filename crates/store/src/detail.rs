//! Reads behind one entity's or one operation's page: the entity's errors and
//! predecessors, and what an operation touched. Each goes through an index (`errors_entity`,
//! `successors`' keys, `events_operation`, `history_entity`), never a scan of a table that
//! grows with the fleet.

use crate::{EntityRow, HistoryRow, Millis};

/// One recorded error of an entity (the `errors` table).
#[derive(Debug, Clone, PartialEq)]
pub struct ErrorRow {
    /// Store id, increasing.
    pub id: i64,
    /// The request whose work failed, if any.
    pub request_id: Option<String>,
    /// When it happened.
    pub at: Millis,
    /// `action_error`, `panic`, `refused`, `commit_failed`, or `failure` (it entered an
    /// error-health state).
    pub kind: String,
    /// What went wrong.
    pub details: String,
    /// Who caused a failure: the successors its subscription matched, in their states.
    pub cause: Vec<crate::CauseRef>,
}

/// What one operation touched: every entity its events reached (and the entity it was
/// started on) and every history row its request id caused there.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct OperationTrace {
    /// The entities, by id.
    pub entities: Vec<EntityRow>,
    /// Their history rows caused by the operation, by entity then id.
    pub transitions: Vec<HistoryRow>,
    /// More entities were touched than the limit asked for.
    pub truncated: bool,
}

/// The most entities a cancel looks at among those an operation reached.
pub(crate) const REACHED_MAX: u64 = 1_000_000;

/// The entity ids of a trace, by id: the operation's own entity (kept even past the
/// limit) and up to `limit` of those its events reached (`reached` is sorted and holds at
/// most `limit + 1`, so one more tells that some were left out).
pub(crate) fn trace_ids(own: Option<i64>, mut reached: Vec<i64>, limit: u64) -> (Vec<i64>, bool) {
    let truncated = reached.len() as u64 > limit;
    reached.truncate(limit as usize);
    reached.extend(own);
    reached.sort_unstable();
    reached.dedup();
    (reached, truncated)
}

/// Adds to a trace's entity ids those the operation created without their processing any
/// of its events (an action's new entities, which its successor edges name with the
/// request id): `created_by(id)` lists the successors `id` created under the operation.
/// Transitively, at most `limit` entities in all; `true` when some were left out.
pub(crate) fn with_created<E>(
    mut ids: Vec<i64>,
    limit: u64,
    mut created_by: impl FnMut(i64) -> Result<Vec<i64>, E>,
) -> Result<(Vec<i64>, bool), E> {
    let mut seen: std::collections::HashSet<i64> = ids.iter().copied().collect();
    let mut frontier = ids.clone();
    let mut truncated = false;
    while let Some(id) = frontier.pop() {
        for child in created_by(id)? {
            if seen.contains(&child) {
                continue;
            }
            if ids.len() as u64 >= limit {
                truncated = true;
                continue;
            }
            seen.insert(child);
            ids.push(child);
            frontier.push(child);
        }
    }
    ids.sort_unstable();
    Ok((ids, truncated))
}

#[cfg(test)]
mod tests {
    use super::{trace_ids, with_created};

    #[test]
    fn a_trace_adds_what_its_entities_created_within_the_limit() {
        // 1 created 2 and 3; 3 created 4; 2 names 1 again (an edge back changes nothing).
        let created = |id: i64| -> Result<Vec<i64>, ()> {
            Ok(match id {
                1 => vec![2, 3],
                2 => vec![1],
                3 => vec![4],
                _ => vec![],
            })
        };
        assert_eq!(with_created(vec![1], 10, created), Ok((vec![1, 2, 3, 4], false)));
        assert_eq!(with_created(vec![1], 3, created).map(|(ids, cut)| (ids.len(), cut)), Ok((3, true)));
        assert_eq!(with_created(vec![], 10, created), Ok((vec![], false)));
    }

    #[test]
    fn a_trace_keeps_the_own_entity_and_says_when_it_cut() {
        assert_eq!(trace_ids(Some(5), vec![1, 5, 9], 10), (vec![1, 5, 9], false));
        assert_eq!(trace_ids(Some(7), vec![1, 2, 3], 2), (vec![1, 2, 7], true));
        assert_eq!(trace_ids(None, vec![], 2), (vec![], false));
    }
}
