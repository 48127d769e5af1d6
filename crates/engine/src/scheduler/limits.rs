//! Concurrency limits in the loop: a held entity asks for its limit's slot before its auto
//! action, with the commit that enters the state (`decide::entry_slots`, answered in the
//! commit's result) or, when that could not ask (events were waiting, a key could not be
//! evaluated, it was claimed in the state), as an operation of the next batch
//! (`decide::Next::Acquire`); the answer lets it go on, or lets it go (it waits in line in
//! the store, its lease dropped). An event a limit of workflows counts asks for its slots
//! the same way before it runs (`decide::event`); they are held until a commit brings the
//! entity to rest (`Commit::leave_workflows`, set by `push`).

use super::*;

impl<S: Store + Clone> Scheduler<S> {
    /// Queues the entity's ask for its slot; nothing else runs for it meanwhile.
    pub(super) fn acquire(&mut self, id: i64, ask: Box<settle_store::Acquire>) {
        let Some(slot) = self.held.get_mut(&id) else { return };
        slot.running = Some(Running::Acquiring { workflow: ask.workflow });
        self.ops.push(Op::Acquire(ask));
        self.pending.push(Pending::Acquire(id));
    }

    /// The answer to an entity's ask for its limit's slot: held, it goes on; waiting in
    /// line (or stopped meanwhile), its lease was dropped with the ask.
    pub(super) fn on_acquired(&mut self, id: i64, r: std::result::Result<Applied, OpError>) {
        match r {
            Ok(Applied::Acquired) => {
                let Some(slot) = self.held.get_mut(&id) else { return };
                match slot.running.take() {
                    Some(Running::Acquiring { workflow: true }) => slot.held.workflow_slots = true,
                    _ => slot.held.slots = true,
                }
                self.advance(id);
            }
            Ok(Applied::Waiting { limit, .. }) => {
                crate::metrics::limit_waited(&limit);
                self.held.remove(&id);
            }
            // Paused or put to sleep meanwhile: the store let it go.
            Ok(Applied::Released) => {
                self.held.remove(&id);
            }
            Ok(other) => unreachable!("an acquire answered with {other:?}"),
            Err(e) => {
                if matches!(e, OpError::LeaseLost { .. }) {
                    crate::metrics::lease_lost();
                }
                tracing::warn!(entity = id, error = %e, "asking for a limit's slot failed; letting the entity go");
                self.held.remove(&id);
            }
        }
    }
}

/// What a commit of `held` gives back of its limits: a commit that moves the entity on, or
/// stops it, ends its limited action ([`settle_store::Commit::leave_limits`]); one that
/// leaves it at rest ends its workflow ([`settle_store::Commit::leave_workflows`]: it may
/// hold slots from before this hold, so always asked on a machine that declares a limit of
/// workflows).
pub(super) fn leaving(held: &mut Held, c: &mut settle_store::Commit) {
    if (c.to.is_some() || c.run_status.is_some()) && held.machine.is_limited(&c.from) {
        c.leave_limits = true;
        // Held, its slots are all taken (no line) and, run here, no agent's call is out.
        c.held_all = held.slots && !decide::runs_at_an_agent(&held.machine, &c.from);
        held.slots = false;
    }
    let state = c.to.as_ref().unwrap_or(&c.from);
    let m = &held.machine;
    if m.has_workflow_limits() && m.state(state).is_some_and(|s| s.kind != settle_core::StateKind::Unstable) {
        c.leave_workflows = true;
        held.workflow_slots = false;
        held.rested = true;
    }
}
