//! A round of pruning ([`Op::Prune`](crate::Op)) as a segment of its own: read a page of
//! candidates per end state (locked, with what could keep them), choose by the pure rule
//! ([`super::ops::prune`]), then remove each chosen entity's rows from every table and the
//! other kinds' rows past their time — in a dry run under a savepoint rolled back, so what
//! it reports is exactly what a real round would remove. A round that archives is two:
//! one that only chooses ([`Prune::choose_only`]), then, once the archive is on disk, one
//! that removes those chosen ([`Prune::only`]) that nothing keeps by then.

use super::Dialect;
use super::ops::prune::{Candidate, choose};
use crate::{Applied, OpError, Prune, Pruned, PrunedEntity};

impl Candidate {
    /// A candidate of `rule` as both dialects read it: id, key, ended_at, leased, busy,
    /// queued, live_link, newest.
    pub(crate) fn from_columns<C: crate::decode::Columns>(r: &C, rule: &crate::PruneRule) -> Result<Self, C::Error> {
        Ok(Candidate {
            id: r.int(0)?,
            machine: rule.machine.clone(),
            key: r.text(1)?,
            state: rule.state.clone(),
            ended_at: r.int(2)?,
            leased: r.flag(3)?,
            busy: r.flag(4)?,
            queued: r.flag(5)?,
            live_link: r.flag(6)?,
            newest: r.flag(7)?,
        })
    }
}

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
    let mut choice = choose(&read.pages, &after, page, p.limit);
    if let Some(only) = &p.only {
        let only: std::collections::HashSet<i64> = only.iter().copied().collect();
        choice.remove.retain(|id| only.contains(id));
    }
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
    if p.choose_only {
        let (kept, next, more) = (choice.kept, choice.next, choice.more);
        return Ok(Ok(Applied::Pruned(Box::new(Pruned { entities, kept, next, more, ..Pruned::default() }))));
    }
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
