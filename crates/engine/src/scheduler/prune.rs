//! The scheduler's periodic pruning: every `prune_every` a round of [`Op::Prune`] joins the
//! next batch; while a round finds more past its retention, the next follows after
//! `prune_pause`, so live work shares the writer with it. Each rule goes on where the last
//! round stopped (past the entities it had to keep). On PostgreSQL a round another
//! instance is running makes this one wait for the next period.

use settle_store::{Applied, Millis, Op, OpError, Prune, Store};

use super::{Pending, Scheduler};
use crate::prune::{Cursors, advance, round};

/// The state of the periodic job.
#[derive(Default)]
pub(crate) struct PruneJob {
    /// When the next round may go.
    next_at: Millis,
    /// A round is in a batch being written.
    pub(super) running: bool,
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
        let p = round(&self.registry, &self.config.retention, now, None, &self.prune.cursors, self.config.prune_limit);
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
}
