//! Writing a batch and acting on its result: the next batch taken from what is queued,
//! written, acted on at once, and its callers answered once it is durable.

use std::future::Future;

use settle_store::{Batch, BatchResult, Claim, Command, Op, Store};
use tokio::sync::oneshot;

use super::{Pending, Scheduler};

impl<S: Store + Clone> Scheduler<S> {
    /// Writes the next batch, acts on it, and answers its callers (and the barriers it
    /// passes) once it is durable.
    pub(super) async fn write_batch(&mut self) {
        // Every commit queued before a barrier is written by this batch (or was before).
        let barriers = std::mem::take(&mut self.barriers);
        let durable = self.write_batch_inner().await;
        let answers = std::mem::take(&mut self.answers);
        self.deferring = false;
        let answer = move || {
            for a in answers {
                a();
            }
            for b in barriers {
                let _ = b.send(());
            }
        };
        match durable {
            None => answer(),
            // The batch is committed, and acted on; its callers hear of it once it is
            // durable, while the next batch is written.
            Some(d) => {
                tokio::spawn(async move {
                    match d.await {
                        Ok(()) => answer(),
                        // Nothing of the batch is told: its callers' channels close.
                        Err(e) => tracing::error!(error = %e, "a written batch could not be made durable"),
                    }
                });
            }
        }
    }

    /// Writes the next batch and acts on its result; answers what makes it durable if it
    /// is not yet (its answers to callers are then in `self.answers`).
    async fn write_batch_inner(&mut self) -> Option<settle_store::Durability> {
        let (batch, pending, offers) = self.take_batch()?;
        let started = std::time::Instant::now();
        let wrote = !batch.ops.is_empty();
        let (written, durable) = match self.store.write_committed(batch).await {
            Ok((r, durable)) => (Ok(r), durable),
            Err(e) => (Err(e), None),
        };
        self.stats.write_micros += started.elapsed().as_micros() as u64;
        if wrote && written.is_ok() {
            self.committed.send_modify(|n| *n += 1);
        }
        self.deferring = durable.is_some();
        self.finish_batch(pending, offers, written);
        durable
    }

    /// Sends `value` on `tx`: now, or once the batch being acted on is durable.
    pub(super) fn answer_send<T: Send + 'static>(&mut self, tx: oneshot::Sender<T>, value: T) {
        self.answer(move || {
            let _ = tx.send(value);
        });
    }

    /// Tells a caller: now, or once the batch being acted on is durable.
    pub(super) fn answer(&mut self, a: impl FnOnce() + Send + 'static) {
        if self.deferring {
            self.answers.push(Box::new(a));
        } else {
            a();
        }
    }

    /// The next batch: every queued operation and a claim of due entities (when this
    /// engine has room and is not stopping), with what to do with each result and whether
    /// it offers agent tasks; `None` when there is nothing to write.
    pub(crate) fn take_batch(&mut self) -> Option<(Batch, Vec<Pending>, bool)> {
        let capacity = self.config.max_inflight.saturating_sub(self.held.len()).min(self.config.claim_batch);
        let claim = (self.shutdown.is_none() && capacity > 0).then(|| Claim {
            owner: self.config.owner.clone(),
            lease_ms: self.lease_ms(),
            limit: capacity,
            machines: self.served.clone(),
            take_created: !self.claim_full,
            take_raised: !self.claim_full,
        });
        self.claim_limit = claim.as_ref().map_or(0, |c| c.limit);
        self.claim_now = false;
        if self.ops.is_empty() && claim.is_none() {
            return None;
        }
        if claim.is_some() {
            // A wake-up already received announced work committed before this claim: the
            // claim sees it. Dropping it spares a claim of nothing after this batch (with
            // several instances, every batch of one wakes all the others).
            let woken = self.wakeup.notified();
            tokio::pin!(woken);
            let _ = woken.as_mut().poll(&mut std::task::Context::from_waker(std::task::Waker::noop()));
        }
        let ops = std::mem::take(&mut self.ops);
        let pending = std::mem::take(&mut self.pending);
        crate::metrics::batch(ops.len(), self.held.len());
        let offers = ops.iter().any(|op| match op {
            Op::Commit(c) => c.offer.is_some(),
            Op::Create(n) => n.offer.is_some(),
            Op::Command { command, .. } => matches!(command, Command::Resume | Command::Retry),
            _ => false,
        });
        let batch = Batch { now: self.clock.now_ms(), ops, claim };
        self.stats.batches += 1;
        self.stats.ops += batch.ops.len() as u64;
        Some((batch, pending, offers))
    }

    /// Acts on a written batch ([`take_batch`](Self::take_batch)): answers callers, moves
    /// the held entities on, takes the claimed ones.
    pub(crate) fn finish_batch(
        &mut self,
        pending: Vec<Pending>,
        offers: bool,
        written: settle_store::Result<BatchResult>,
    ) {
        if let Ok(r) = &written {
            self.stats.claimed += r.claimed.len() as u64;
            if self.claim_limit > 0 {
                self.claim_full = r.claimed.len() >= self.claim_limit;
            }
        }
        if offers && written.is_ok() {
            self.offered.notify_waiters();
        }
        match written {
            Ok(result) => self.on_result(pending, result),
            Err(e) => self.on_store_error(pending, e),
        }
    }
}
