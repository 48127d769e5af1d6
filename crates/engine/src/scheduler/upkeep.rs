//! The scheduler's periodic jobs, each run when it is due on the engine's clock: the
//! supervisor's round (operations marked hung, sync nested waits past their lease let go,
//! the due backlog measured, freed space given back to the file system) and the renewal of
//! the leases it holds.

use settle_store::{Millis, Op, Store};

use super::{Pending, Scheduler};

/// The most pages one supervisor round gives back to the file system (4 MiB of 4 KiB pages).
const RECLAIM_PAGES: u64 = 1024;

impl<S: Store + Clone> Scheduler<S> {
    pub(super) fn next_supervise(&self) -> Millis {
        if self.config.read_only {
            return Millis::MAX;
        }
        self.last_supervise + self.config.supervise_every.as_millis() as Millis
    }

    /// Every `supervise_every`: mark operations without progress for `hung_after` as hung.
    pub(crate) fn maybe_supervise(&mut self) {
        let now = self.clock.now_ms();
        if self.config.read_only || now - self.last_supervise < self.config.supervise_every.as_millis() as i64 {
            return;
        }
        self.last_supervise = now;
        // Sync nested events waited on past their action's lease: the action times out.
        self.waiters.expire(now);
        let store = self.store.clone();
        tokio::spawn(async move {
            if let Ok(n) = store.entity_count_pending().await {
                crate::metrics::due_backlog(n);
            }
            // Space freed since the last round goes back to the file system, a bounded
            // amount at a time so the writer is never held long.
            match store.reclaim_space(RECLAIM_PAGES).await {
                Ok(pages) => crate::metrics::pages_reclaimed(pages),
                Err(e) => tracing::warn!(error = %e, "reclaiming free pages failed"),
            }
        });
        self.ops.push(Op::MarkHung { before: now - self.config.hung_after.as_millis() as i64 });
        self.pending.push(Pending::Supervise);
    }

    pub(crate) fn maybe_renew(&mut self) {
        let now = self.clock.now_ms();
        if self.held.is_empty() || now - self.last_renew < self.lease_ms() / 3 {
            return;
        }
        self.last_renew = now;
        let ids: Vec<i64> = self.held.keys().copied().collect();
        self.ops.push(Op::Renew { ids, owner: self.config.owner.clone(), until: now + self.lease_ms() });
        self.pending.push(Pending::Renew);
    }
}
