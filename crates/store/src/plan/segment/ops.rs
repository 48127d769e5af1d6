//! Applying the rules of [`ops`](crate::plan::ops) in a segment: an operator command, an
//! agent task's heartbeat or report, a lease of tasks, a renewal, the marking of hung
//! operations — each decided by its pure rule against the rows read for the segment (as
//! the operations before it in the segment left them), its rows collected in the plan.

use super::{Answer, Plan, Work};
use crate::plan::ops::{cancel, command, lease, task, upkeep};
use crate::plan::rows::{HistoryInsert, TaskRow};
use crate::{
    Applied, Cancel, CancelOutcome, Command, HistoryKind, InboxKind, Millis, OpError, OpenOperation, Push, RunStatus,
    TaskCheck, TaskRefusal, TaskResult,
};

fn done(applied: Applied) -> Answer {
    Answer::Done(Box::new(applied))
}

impl Plan {
    /// Rewrites a task's row (its latest row wins).
    fn task_update(&mut self, row: TaskRow) {
        match self.task_updates.iter_mut().find(|t| t.id == row.id) {
            Some(t) => *t = row,
            None => self.task_updates.push(row),
        }
    }
}

impl Work {
    /// An operator command on `key` of `machine` (op `i`).
    pub(super) fn command(
        &mut self,
        i: usize,
        machine: &str,
        key: &str,
        c: Command,
        operation: Option<&OpenOperation>,
    ) -> Result<Answer, OpError> {
        let Some(slot) = self.by_key.get(machine, key) else {
            self.unopen(i, operation);
            return Err(OpError::NotFound { machine: machine.to_string(), key: key.to_string() });
        };
        if let Some(operation_id) = self.replayed(i, operation) {
            return Ok(done(Applied::Replayed { operation_id }));
        }
        let id = self.slots[slot].cur.id;
        let (before, mut facts) = self.commanded.get(&id).cloned().expect("a commanded entity is read with its facts");
        facts.inbox |= self.inbox_nonempty(slot);
        let effect = match command::decide(&self.slots[slot].cur, &facts, c, self.now) {
            Ok(effect) => effect,
            Err(e) => {
                self.unopen(i, operation);
                return Err(e);
            }
        };
        let request_id = operation.map(|o| o.request_id.clone());
        let reason = operation.and_then(|o| o.dimensions.get("reason")).and_then(|r| r.as_str());
        let s = &mut self.slots[slot];
        let from = s.cur.state.to_string();
        s.cur = effect.row.clone();
        if effect.clear_errors {
            s.recent_errors = Some("[]".into());
        }
        if effect.offer_now {
            self.plan.offer_now.push(id);
        }
        if let Some(canceled) = &effect.canceled {
            // Its inbox (also what this segment queued), timers and open tasks go.
            self.plan.inbox_clear.push(id);
            self.plan.timer_slots.push(slot);
            self.plan.cancel.push(id);
            for r in canceled {
                self.plan.op_cancel.push(r.clone());
                self.plan.complete(Some(r.as_str()));
            }
        }
        self.plan.history.push((
            slot,
            HistoryInsert {
                // Its entity id is the slot's, filled in when the plan is written.
                from_state: Some(from),
                kind: HistoryKind::Command.as_str(),
                request_id: request_id.clone(),
                at: self.now,
                // The command, with the reason the operator gave (the operation's `reason`).
                detail: Some(match reason {
                    Some(r) => format!("{}: {r}", c.as_str()),
                    None => c.as_str().to_string(),
                }),
                ..HistoryInsert::default()
            },
        ));
        // A command is done when it is applied.
        if let Some(r) = request_id {
            self.plan.op_done.push(r);
        }
        Ok(done(Applied::Commanded(command::entity_after(&before, &effect.row, effect.clear_errors))))
    }

    /// The cancel of an operation on one entity it reached (op `i`).
    pub(super) fn cancel(&mut self, i: usize, c: &Cancel) -> Result<Answer, OpError> {
        let operation = c.operation.as_ref();
        let Some(slot) = self.by_key.get(&c.machine, &c.key) else {
            self.unopen(i, operation);
            return Err(OpError::NotFound { machine: c.machine.to_string(), key: c.key.to_string() });
        };
        if let Some(operation_id) = self.replayed(i, operation) {
            return Ok(done(Applied::Replayed { operation_id }));
        }
        let id = self.slots[slot].cur.id;
        let (before, mut facts) = self.commanded.get(&id).cloned().expect("a commanded entity is read with its facts");
        facts.inbox |= self.inbox_nonempty(slot);
        let effect = cancel::decide(&self.slots[slot].cur, &facts, &c.canceled, c.undo.as_ref(), self.now);
        let request_id = operation.map(|o| o.request_id.clone());
        let from = self.slots[slot].cur.state.to_string();
        self.slots[slot].cur = effect.row.clone();
        if effect.drop_queued {
            self.plan.inbox_drop.push((id, c.canceled.clone()));
        }
        if effect.stopped {
            self.plan.cancel.push(id);
        }
        if effect.outcome != CancelOutcome::Untouched {
            self.plan.op_cancel.push(c.canceled.clone());
            self.plan.complete(Some(c.canceled.as_str()));
        }
        let undo = c.undo.as_ref().filter(|_| effect.undo);
        if let Some(u) = undo {
            let push = Push {
                machine: c.machine.clone(),
                key: c.key.clone(),
                event: u.event.clone(),
                params: serde_json::Value::Null,
                request_id: request_id.clone(),
                kind: InboxKind::Raised,
                join_from: None,
                operation: None,
                reply: None,
            };
            self.push(slot, &push);
        }
        if effect.outcome != CancelOutcome::Untouched {
            let what = match effect.outcome {
                CancelOutcome::Undone { stopped } => {
                    let event = undo.map(|u| u.event.as_str()).unwrap_or_default();
                    if stopped { format!("its work stopped, `{event}` raised") } else { format!("`{event}` raised") }
                }
                CancelOutcome::Paused => "its work stopped, no cancel event valid here: paused".to_string(),
                _ => "its queued events of it dropped".to_string(),
            };
            self.plan.history.push((
                slot,
                HistoryInsert {
                    from_state: Some(from),
                    kind: HistoryKind::Command.as_str(),
                    request_id: request_id.clone(),
                    at: self.now,
                    detail: Some(format!("cancel of operation {}: {what}", c.canceled)),
                    ..HistoryInsert::default()
                },
            ));
        }
        // Done when applied, unless its undo runs: then when that ends (its event queued
        // keeps it open).
        if let Some(r) = request_id.filter(|_| undo.is_none()) {
            self.plan.op_done.push(r);
        }
        let entity = command::entity_after(&before, &effect.row, false);
        Ok(done(Applied::Canceled { entity: Box::new(entity), outcome: effect.outcome }))
    }

    /// Task `id` as this segment leaves it so far: a task of an entity whose open tasks a
    /// commit of this segment canceled is canceled.
    fn task_now(&self, id: i64) -> Result<TaskRow, OpError> {
        let mut row = self.tasks.get(&id).cloned().ok_or(OpError::Task(TaskRefusal::Unknown { task: id }))?;
        if matches!(row.status.as_str(), "ready" | "leased") && self.plan.cancel.contains(&row.entity_id) {
            row.status = "canceled".into();
        }
        Ok(row)
    }

    pub(super) fn heartbeat(&mut self, id: i64, token: &str, check: &TaskCheck) -> Result<Answer, OpError> {
        let row = task::heartbeat(&self.task_now(id)?, token, check, self.now)?;
        let locked_until = row.locked_until.expect("a heartbeat sets the lease's end");
        self.tasks.insert(id, row.clone());
        self.plan.task_update(row);
        Ok(done(Applied::Extended { locked_until }))
    }

    /// A report: the task is done and the report queued for its entity, in this segment.
    pub(super) fn report(
        &mut self,
        id: i64,
        token: &str,
        result: &TaskResult,
        check: &TaskCheck,
    ) -> Result<Answer, OpError> {
        let row = self.task_now(id)?;
        let Some(&slot) = self.by_id.get(&row.entity_id) else {
            return Err(OpError::Task(TaskRefusal::Refused { task: id, reason: "its entity is gone".into() }));
        };
        let (machine, key) = (self.slots[slot].cur.machine.to_string(), self.slots[slot].cur.key.to_string());
        match task::report(&row, &machine, token, result, check, self.now)? {
            task::Reported::Replayed => Ok(done(Applied::ReportReplayed { task: id })),
            task::Reported::Done { row, report } => {
                if self.slots[slot].cur.run_status == RunStatus::Killed {
                    return Err(OpError::Killed { machine, key });
                }
                let push = report.push(machine, key, row.request_id.clone());
                self.tasks.insert(id, (*row).clone());
                self.plan.task_update(*row);
                let item = self.push(slot, &push);
                Ok(Answer::Pushed { item, slot })
            }
        }
    }

    /// Leases the tasks read as leasable to `agent`.
    pub(super) fn lease_tasks(&mut self, agent: &str, token_prefix: &str) -> Answer {
        let mut leased = Vec::with_capacity(self.leasable.len());
        for t in std::mem::take(&mut self.leasable) {
            let (row, told) = task::lease_to(&t, agent, token_prefix, self.now);
            self.plan.task_update(row);
            leased.push(told);
        }
        done(Applied::Leased(leased))
    }

    pub(super) fn renew(&mut self, ids: &[i64], owner: &str, until: Millis) -> Answer {
        let renewals = lease::renew(ids, &self.renewable, owner, until);
        let n = renewals.len() as u64;
        self.plan.renewals.extend(renewals);
        done(Applied::Renewed(n))
    }

    pub(super) fn mark_hung(&mut self, before: Millis) -> Answer {
        let hung = upkeep::hung(&self.open_operations, before);
        let n = hung.len() as u64;
        self.plan.hung.extend(hung);
        done(Applied::MarkedHung(n))
    }
}
