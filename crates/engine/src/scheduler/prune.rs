//! The scheduler's periodic pruning: every `prune_every` a round of [`Op::Prune`] joins the
//! next batch; while a round finds more past its retention, the next follows after
//! `prune_pause`, so live work shares the writer with it. Each rule goes on where the last
//! round stopped (past the entities it had to keep). On PostgreSQL a round another
//! instance is running makes this one wait for the next period. Where entities of a machine
//! that archives would go, the round is two: one that chooses, then (once a task has
//! written them to the archive and synced it) one that removes those chosen.

use settle_store::{Applied, Commit, EntityRow, Millis, Op, OpError, Prune, Pruned, Store, Trim};

use super::{Pending, Scheduler};
use crate::msg::Msg;
use crate::prune::{Cursors, advance, after_choosing, archived_by, round};

/// Every this many state entries, a commit trims its entity's past (history, events,
/// errors) to its machine's retention: the rows beyond it are at most this many.
pub(crate) const TRIM_EVERY: i64 = 16;

/// The state of the periodic job.
#[derive(Default)]
pub(crate) struct PruneJob {
    /// When the next round may go.
    next_at: Millis,
    /// A round is in a batch being written.
    pub(super) running: bool,
    /// A task is writing the chosen entities to the archive: not caught up.
    pub(super) archiving: bool,
    cursors: Cursors,
}

impl PruneJob {
    pub(crate) fn new(now: Millis) -> Self {
        PruneJob { next_at: now, ..PruneJob::default() }
    }
}

impl<S: Store + Clone> Scheduler<S> {
    fn prunes(&self) -> bool {
        !self.config.prune_every.is_zero() && self.config.max_inflight > 0
    }

    /// The trim a commit of `e` carries: on every [`TRIM_EVERY`]th state entry, when its
    /// machine keeps less than all of its past.
    pub(super) fn trim_for(&self, e: &EntityRow, c: &Commit) -> Option<Trim> {
        let entering = c.to.is_some() || c.internal;
        if !entering || (e.version + 1) % TRIM_EVERY != 0 {
            return None;
        }
        let kept = self.registry.machine(&e.machine).ok()?.history_kept(&self.config.retention);
        (!kept.keeps_all()).then(|| Trim { before: kept.age.cutoff(self.clock.now_ms()), rows: kept.rows })
    }

    /// When the next round of pruning goes (never, if this engine does not prune).
    pub(super) fn next_prune(&self) -> Millis {
        if !self.prunes() || self.prune.running { Millis::MAX } else { self.prune.next_at }
    }

    /// Adds a round of pruning to the batch when one is due.
    pub(crate) fn maybe_prune(&mut self) {
        let now = self.clock.now_ms();
        if self.next_prune() > now {
            return;
        }
        let mut p =
            round(&self.registry, &self.config.retention, now, None, &self.prune.cursors, self.config.prune_limit);
        let archives = archived_by(&self.registry, &self.archive, &p).next().is_some();
        p.choose_only = archives;
        self.prune.running = true;
        self.ops.push(Op::Prune(Box::new(p.clone())));
        self.pending.push(Pending::PruneJob(Box::new(p)));
    }

    /// A periodic round's result: metrics, where each rule goes on, when the next goes.
    pub(super) fn pruned(&mut self, p: &Prune, r: Result<Applied, OpError>) {
        let now = self.clock.now_ms();
        self.prune.running = false;
        let every = self.config.prune_every.as_millis() as Millis;
        self.prune.next_at = now + every;
        match r {
            Ok(Applied::Pruned(pruned)) if !pruned.busy && p.choose_only => {
                self.archive_then_remove(p, *pruned);
            }
            Ok(Applied::Pruned(pruned)) if !pruned.busy => {
                crate::metrics::pruned(&pruned.rows);
                advance(&mut self.prune.cursors, p, &pruned.next);
                if pruned.more {
                    self.prune.next_at = now + self.config.prune_pause.as_millis() as Millis;
                }
                if !pruned.entities.is_empty() {
                    tracing::debug!(entities = pruned.entities.len(), rows = pruned.rows.total(), "pruned");
                }
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "pruning failed"),
        }
    }

    /// The first step of a round that archives chose `pruned`: a task writes those of
    /// machines that archive to the archive, then the round that removes them follows
    /// ([`Msg::PruneArchived`]); with none to archive, it follows at once.
    fn archive_then_remove(&mut self, p: &Prune, pruned: Pruned) {
        self.prune.running = true;
        let (next, chosen) = after_choosing(&self.registry, &self.archive, p, pruned.entities);
        let (Some(archive), false) = (self.archive.clone(), chosen.is_empty()) else {
            return self.archived(Some(Box::new(next)));
        };
        let (store, tx, now) = (self.store.clone(), self.tx.clone(), self.clock.now_ms());
        self.prune.archiving = true;
        tokio::spawn(async move {
            let next = match crate::archive::write(&store, &archive, &chosen, now).await {
                Ok(_) => Some(Box::new(next)),
                Err(e) => {
                    tracing::warn!(error = %e, "archiving before pruning failed");
                    None
                }
            };
            let _ = tx.send(Msg::PruneArchived(next));
        });
    }

    /// The round after archiving: the one that removes what was archived, or (archiving
    /// failed) none until the next period.
    pub(super) fn archived(&mut self, next: Option<Box<Prune>>) {
        self.prune.archiving = false;
        match next {
            Some(p) => {
                self.ops.push(Op::Prune(p.clone()));
                self.pending.push(Pending::PruneJob(p));
            }
            None => {
                self.prune.running = false;
                self.prune.next_at = self.clock.now_ms() + self.config.prune_every.as_millis() as Millis;
            }
        }
    }
}
