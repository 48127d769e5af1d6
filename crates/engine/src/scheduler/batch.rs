//! Writing a batch and acting on its result: the next batch taken from what is queued,
//! written, acted on at once, and its callers answered once it is durable.

use std::future::Future;

use settle_store::{Batch, BatchResult, Claim, Command, Op, Store};
use tokio::sync::oneshot;

use super::{Pending, Scheduler};

impl<S: Store + Clone> Scheduler<S> {
    /// Takes the next batch and hands it to the store (its write is queued before this
    /// returns), `last` being the batch written before it and not yet acted on: its claim
    /// counts against this one's room and says whether this one may take what it creates.
    pub(crate) fn start_batch(&mut self, last: Option<&Written>) -> Option<InFlight> {
        // The entities the last batch claimed are not held yet.
        let mut claiming = 0;
        if let Some(Written { result: Ok((r, _)), claim_limit, .. }) = last {
            claiming = r.claimed.len();
            self.note_claim(*claim_limit, r);
        }
        // Every commit queued before a barrier is written by this batch (or was before).
        let barriers = std::mem::take(&mut self.barriers);
        let Some((batch, pending, offers)) = self.take_batch_after(claiming) else {
            for b in barriers {
                let _ = b.send(());
            }
            return None;
        };
        let wrote = !batch.ops.is_empty();
        let store = self.store.clone();
        let mut write: WriteFuture = Box::pin(async move { store.write_committed(batch).await });
        // The first poll queues the write (`Store::write`); its answer is awaited later
        // (unless the writer was quick enough to answer already).
        let ready = match write.as_mut().poll(&mut std::task::Context::from_waker(std::task::Waker::noop())) {
            std::task::Poll::Ready(r) => Some(r),
            std::task::Poll::Pending => None,
        };
        let claim_limit = self.claim_limit;
        let started = std::time::Instant::now();
        Some(InFlight { write, ready, pending, offers, barriers, claim_limit, wrote, started })
    }

    /// Acts on a written batch, and answers its callers (and the barriers it passes) once
    /// it is durable.
    pub(crate) fn act_on(&mut self, w: Written) {
        self.stats.write_micros += w.micros;
        let (written, durable) = match w.result {
            Ok((r, durable)) => (Ok(r), durable),
            Err(e) => (Err(e), None),
        };
        if w.wrote && written.is_ok() {
            self.committed.send_modify(|n| *n += 1);
        }
        self.deferring = durable.is_some();
        self.finish_batch_of(w.claim_limit, w.pending, w.offers, written);
        let answers = std::mem::take(&mut self.answers);
        self.deferring = false;
        let barriers = w.barriers;
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

    /// Sends `value` on `tx`: now, or once the batch being acted on is durable.
    pub(super) fn answer_send<T: Send + 'static>(&mut self, tx: oneshot::Sender<T>, value: T) {
        self.answer(move || {
            let _ = tx.send(value);
        });
    }

    /// Tells a caller: once the batch being acted on is acted on, or durable if it is not
    /// yet ([`finish_batch_of`](Self::finish_batch_of)).
    pub(super) fn answer(&mut self, a: impl FnOnce() + Send + 'static) {
        self.answers.push(Box::new(a));
    }

    /// The next batch: every queued operation and a claim of due entities (when this
    /// engine has room and is not stopping), with what to do with each result and whether
    /// it offers agent tasks; `None` when there is nothing to write.
    pub(crate) fn take_batch(&mut self) -> Option<(Batch, Vec<Pending>, bool)> {
        self.take_batch_after(0)
    }

    /// [`take_batch`](Self::take_batch), with `claiming` entities claimed by a batch not
    /// yet acted on (not in `held`) counted against the room for the claim.
    fn take_batch_after(&mut self, claiming: usize) -> Option<(Batch, Vec<Pending>, bool)> {
        let capacity = self.config.max_inflight.saturating_sub(self.held.len() + claiming).min(self.config.claim_batch);
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
        self.finish_batch_of(self.claim_limit, pending, offers, written);
    }

    /// [`finish_batch`](Self::finish_batch) of a batch whose claim had `claim_limit`.
    fn finish_batch_of(
        &mut self,
        claim_limit: usize,
        pending: Vec<Pending>,
        offers: bool,
        written: settle_store::Result<BatchResult>,
    ) {
        if let Ok(r) = &written {
            self.stats.claimed += r.claimed.len() as u64;
            self.note_claim(claim_limit, r);
        }
        if offers && written.is_ok() {
            self.offered.notify_waiters();
        }
        match written {
            Ok(result) => self.on_result(pending, result),
            Err(e) => self.on_store_error(pending, e),
        }
        if !self.deferring {
            for a in std::mem::take(&mut self.answers) {
                a();
            }
        }
    }

    /// Whether the claim of a written batch (with `claim_limit`, 0: none) took all it
    /// could: then older due work may be waiting ([`Scheduler::claim_full`]).
    fn note_claim(&mut self, claim_limit: usize, r: &BatchResult) {
        if claim_limit > 0 {
            self.claim_full = r.claimed.len() >= claim_limit;
        }
    }
}

/// A store write in progress.
type WriteFuture = std::pin::Pin<
    Box<dyn Future<Output = settle_store::Result<(BatchResult, Option<settle_store::Durability>)>> + Send>,
>;

/// A batch handed to the store, with what to do once it is written.
pub(crate) struct InFlight {
    write: WriteFuture,
    /// The store's answer, if it came at the first poll.
    ready: Option<settle_store::Result<(BatchResult, Option<settle_store::Durability>)>>,
    pending: Vec<Pending>,
    offers: bool,
    /// Told once it is written (`Msg::Barrier`).
    barriers: Vec<oneshot::Sender<()>>,
    /// Its claim's limit (0: no claim).
    claim_limit: usize,
    /// Whether it carries operations (not only a claim).
    wrote: bool,
    started: std::time::Instant,
}

impl InFlight {
    /// Waits for the store's answer.
    pub(crate) async fn written(self) -> Written {
        let result = match self.ready {
            Some(r) => r,
            None => self.write.await,
        };
        Written {
            result,
            micros: self.started.elapsed().as_micros() as u64,
            pending: self.pending,
            offers: self.offers,
            barriers: self.barriers,
            claim_limit: self.claim_limit,
            wrote: self.wrote,
        }
    }
}

impl Written {
    /// How many entities its claim took (0 if it failed).
    #[cfg(test)]
    pub(crate) fn claimed(&self) -> usize {
        self.result.as_ref().map_or(0, |(r, _)| r.claimed.len())
    }
}

/// A batch the store answered, not yet acted on.
pub(crate) struct Written {
    result: settle_store::Result<(BatchResult, Option<settle_store::Durability>)>,
    micros: u64,
    pending: Vec<Pending>,
    offers: bool,
    barriers: Vec<oneshot::Sender<()>>,
    claim_limit: usize,
    wrote: bool,
}
