//! A round of pruning ([`Op::Prune`](crate::Op)) as a segment of its own: read a page of
//! candidates per end state (locked, with what could keep them), choose by the pure rule
//! ([`super::ops::prune`]), then remove each chosen entity's rows from every table and the
//! other kinds' rows past their time — in a dry run under a savepoint rolled back, so what
//! it reports is exactly what a real round would remove.

use super::Dialect;
use super::ops::prune::{Candidate, choose};
use crate::{Applied, OpError, Prune, Pruned, PrunedEntity};

/// The count of [`crate::PrunedRows`] a dialect's delete statement adds to.
pub(crate) type Counter = fn(&mut crate::PrunedRows) -> &mut u64;

/// What a round reads: per rule of [`Prune::ended`], in order, up to a page of candidates.
#[derive(Debug, Default)]
pub(crate) struct PruneRead {
    /// Another instance is pruning (PostgreSQL): nothing is read.
    pub(crate) busy: bool,
    pub(crate) pages: Vec<Vec<Candidate>>,
}

/// What a round removes: these entities with all their rows, and the other kinds' rows
/// before their times, at most `rows` of each.
#[derive(Debug)]
pub(crate) struct PruneWrite<'a> {
    pub(crate) entities: &'a [i64],
    pub(crate) prune: &'a Prune,
    pub(crate) rows: usize,
}

/// What a round removed: rows per table, and whether operations, finished tasks or minute
/// counts past their time filled their share (more of them wait).
#[derive(Debug, Default)]
pub(crate) struct PruneWritten {
    pub(crate) rows: crate::PrunedRows,
    pub(crate) full: bool,
}

/// Applies one round.
pub(crate) fn apply<D: Dialect>(d: &mut D, p: &Prune) -> Result<Result<Applied, OpError>, D::Error> {
    let page = p.limit.max(1);
    let read = d.prune_read(p, page)?;
    if read.busy {
        return Ok(Ok(Applied::Pruned(Box::new(Pruned { busy: true, ..Pruned::default() }))));
    }
    let after: Vec<_> = p.ended.iter().map(|r| r.after).collect();
    let choice = choose(&read.pages, &after, page, p.limit);
    let by_id: std::collections::HashMap<i64, &Candidate> = read.pages.iter().flatten().map(|c| (c.id, c)).collect();
    let entities: Vec<PrunedEntity> = choice
        .remove
        .iter()
        .map(|id| {
            let c = by_id[id];
            PrunedEntity {
                id: c.id,
                machine: c.machine.clone(),
                key: c.key.clone(),
                state: c.state.clone(),
                ended_at: c.ended_at,
            }
        })
        .collect();
    let rows = p.rows.max(1);
    if p.dry_run {
        d.savepoint()?;
    }
    let removed = d.prune_write(&PruneWrite { entities: &choice.remove, prune: p, rows })?;
    if p.dry_run {
        d.rollback_savepoint()?;
    }
    Ok(Ok(Applied::Pruned(Box::new(Pruned {
        entities,
        kept: choice.kept,
        rows: removed.rows,
        next: choice.next,
        more: choice.more || removed.full,
        busy: false,
    }))))
}
