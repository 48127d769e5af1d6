//! Writing what a segment decided: its [`Plan`](super::Plan) turned into one set of rows per table (ids
//! filled in from the slots), handed to the [`Dialect`] at once, and the operations' answers
//! turned into their results with the ids the writes assigned.

use serde_json::Value;
use settle_core::EventName;

use super::{Answer, Done, Head, Slot, Work};
use crate::plan::Dialect;
use crate::plan::rows::{
    EntityInsert, EntityUpdate, EventInsert, ExceptionInsert, HistoryInsert, InboxInsert, SuccessorInsert, TaskInsert,
    Writes,
};
use crate::{Applied, Claimed, EntityRow, InboxItem, InboxKind, OpError, RunStatus, TimerRow};

impl Work {
    /// Writes everything decided, set by set, and turns the answers into results.
    /// New entities due at once, and (where the dialect reads their rows back) entities at
    /// rest given an event, are leased while `take` has room, and answered in it.
    pub(super) fn write<D: Dialect>(
        mut self,
        d: &mut D,
        answers: Vec<Result<Answer, OpError>>,
        take: Option<&mut crate::plan::Take<'_>>,
    ) -> Result<Done, D::Error> {
        let now = self.now;
        // Slots leased as they are written: new ones, and existing ones with the inbox
        // item that heads their inbox now.
        let mut taken = Vec::new();
        let mut raised: Vec<(usize, usize)> = Vec::new();
        if let Some(t) = &take {
            let inbox = &self.plan.inbox;
            for (i, s) in self.slots.iter_mut().enumerate() {
                if taken.len() + raised.len() >= t.room {
                    break;
                }
                let c = &mut s.cur;
                // Free, active and due now: what a claim would take next.
                if !(c.lease_owner.is_none()
                    && c.run_status == RunStatus::Active
                    && c.due_at.is_some_and(|at| at <= now)
                    && t.serves(&c.machine))
                {
                    continue;
                }
                match &s.orig {
                    // New, with nothing queued.
                    None if t.created && s.pending.is_empty() => taken.push(i),
                    // At rest before (free, active, no due time: nothing was queued or
                    // scheduled) and given events by this segment: the first of them heads
                    // its inbox (an internal one first, as a claim reads it).
                    Some(o)
                        if t.raised
                            && o.due_at.is_none()
                            && o.lease_owner.is_none()
                            && o.run_status == RunStatus::Active =>
                    {
                        let internal = s.pending.iter().find(|&&p| inbox[p].row.kind == InboxKind::Internal.as_str());
                        let Some(&head) = internal.or(s.pending.first()) else { continue };
                        raised.push((i, head));
                    }
                    _ => continue,
                }
                c.lease_owner = Some(t.owner.into());
                c.lease_until = Some(t.until);
                c.due_at = Some(t.until);
            }
        }
        let due_now = self.slots.iter().any(|s| {
            s.orig.as_ref() != Some(&s.cur)
                && s.cur.lease_owner.is_none()
                && s.cur.run_status == RunStatus::Active
                && s.cur.due_at.is_some_and(|at| at <= now)
        });
        let mut slots = self.slots;
        let plan = self.plan;
        let mut w = Writes { now, ..Writes::default() };
        // What the slots were and are: the entity counts' changes.
        w.counts = crate::plan::rows::count_deltas(slots.iter().flat_map(|s| {
            let after = count_key(&s.cur);
            match &s.orig {
                None => [Some((after.0, after.1, after.2, 1)), None],
                Some(o) if count_key(o) != after => {
                    let before = count_key(o);
                    [Some((before.0, before.1, before.2, -1)), Some((after.0, after.1, after.2, 1))]
                }
                Some(_) => [None, None],
            }
            .into_iter()
            .flatten()
        }));
        for s in &mut slots {
            match &s.orig {
                None => w.entities.push(EntityInsert {
                    id: s.cur.id,
                    machine: s.cur.machine.to_string(),
                    key: s.cur.key.to_string(),
                    state: s.cur.state.to_string(),
                    properties: s.properties.clone().unwrap_or_else(|| "{}".into()),
                    created_at: now,
                    auto_at: s.cur.auto_at,
                    due_at: s.cur.due_at,
                    lease_owner: s.cur.lease_owner.as_deref().map(str::to_string),
                    lease_until: s.cur.lease_until,
                    request_id: s.cur.request_id.as_deref().map(str::to_string),
                    busy: s.cur.busy,
                    machine_hash: s.cur.machine_hash.as_deref().map(str::to_string),
                    timer_at: s.cur.timer_at,
                    has_predecessors: s.cur.has_predecessors,
                }),
                Some(orig) => {
                    if *orig != s.cur || s.properties.is_some() || s.fired.is_some() || s.recent_errors.is_some() {
                        // The row moves into the update: from here on only a slot's id is
                        // read (a created entity's whole row is, and it is not moved).
                        let indexed = crate::plan::rows::Indexed::between(orig, &s.cur);
                        let row = std::mem::take(&mut s.cur);
                        s.cur.id = row.id;
                        w.updates.push(EntityUpdate {
                            indexed,
                            row,
                            properties: s.properties.take(),
                            fired: s.fired.take(),
                            recent_errors: s.recent_errors.take(),
                        });
                    }
                }
            }
        }
        let slots = &slots;
        let id = |i: usize| slots[i].cur.id;
        w.deletes = plan.deletes;
        w.trims = plan.trims;
        w.inbox = plan.inbox.iter().map(|item| InboxInsert { entity_id: id(item.slot), ..item.row.clone() }).collect();
        w.history = plan.history.into_iter().map(|(slot, h)| HistoryInsert { entity_id: id(slot), ..h }).collect();
        w.successors = plan
            .successors
            .into_iter()
            .map(|(pred, succ, request_id)| SuccessorInsert {
                predecessor_id: id(pred),
                successor_id: id(succ),
                request_id,
                created_at: now,
            })
            .collect();
        w.timer_entities = plan.timer_slots.iter().map(|&s| id(s)).collect();
        w.timers = plan.timers.into_iter().map(|(slot, t)| TimerRow { entity_id: id(slot), ..t }).collect();
        w.cancel = plan.cancel;
        w.offers = plan.offers.into_iter().map(|(slot, t)| TaskInsert { entity_id: id(slot), ..t }).collect();
        w.exceptions = plan
            .exceptions
            .into_iter()
            .map(|(e, details)| ExceptionInsert { error_id: plan.errors[e].id, at: now, details })
            .collect();
        w.events = plan
            .events
            .into_iter()
            .map(|(e, error)| EventInsert { error_id: error.map(|i| plan.errors[i].id), ..e })
            .collect();
        w.errors = plan.errors;
        // Only an event's first end counts; an event recorded by this segment ends in its
        // own row (a dialect may write all sets in one statement, which cannot update a
        // row it inserts).
        for e in plan.ends {
            if let Some(new) = w.events.iter_mut().find(|x| x.id == e.id) {
                if new.end_time.is_none() {
                    new.end_state = Some(e.end_state);
                    new.end_time = Some(e.end_time);
                }
            } else if !w.ends.iter().any(|x| x.id == e.id) {
                w.ends.push(e);
            }
        }
        w.unopen = plan.unopen;
        w.op_updates = plan.op_updates;
        w.complete = plan.complete;
        w.inbox_clear = plan.inbox_clear;
        w.inbox_drop = plan.inbox_drop;
        w.task_updates = plan.task_updates;
        w.offer_now = plan.offer_now;
        w.op_cancel = plan.op_cancel;
        w.op_done = plan.op_done;
        w.hung = plan.hung;
        w.renewals = plan.renewals;
        let inbox_ids = d.write(&w)?;
        let item = |i: usize| -> InboxItem {
            let row = &plan.inbox[i].row;
            InboxItem {
                id: inbox_ids[i],
                entity_id: slots[plan.inbox[i].slot].cur.id,
                event: EventName::new(row.event.as_str()),
                params: serde_json::from_str(&row.params).unwrap_or(Value::Null),
                request_id: row.request_id.clone(),
                kind: InboxKind::parse(row.kind).unwrap_or_default(),
                created_at: row.created_at,
                reply: row
                    .reply
                    .as_deref()
                    .and_then(|r| serde_json::from_str(r).ok())
                    .and_then(|v| crate::Reply::from_json(&v)),
            }
        };
        if let Some(t) = take {
            t.room -= taken.len() + raised.len();
            t.taken.extend(taken.iter().map(|&i| Claimed {
                entity: new_row(&slots[i]),
                inbox_head: None,
                trigger: None,
            }));
            if !raised.is_empty() {
                // Their whole rows (properties, fired, recent errors: the plan reads less),
                // and the trigger of the workflow each is in.
                let ids: Vec<i64> = raised.iter().map(|&(i, _)| slots[i].cur.id).collect();
                let mut rows = d.taken_rows(&ids)?;
                for &(i, head) in &raised {
                    let id = slots[i].cur.id;
                    let Some(at) = rows.iter().position(|(r, _)| r.id == id) else {
                        // Not possible in the writer's own transaction; the lease ends
                        // and a claim takes the entity then.
                        tracing::warn!(entity = id, "an entity leased as it was raised on was not read back");
                        continue;
                    };
                    let (entity, trigger) = rows.swap_remove(at);
                    t.taken.push(Claimed { entity, inbox_head: Some(item(head)), trigger });
                }
            }
        }
        let results = answers
            .into_iter()
            .map(|a| {
                a.map(|a| match a {
                    Answer::Done(applied) => *applied,
                    Answer::Created(slot) => Applied::Created(new_row(&slots[slot])),
                    Answer::Pushed { item, slot } => {
                        Applied::Pushed { inbox_id: inbox_ids[item], entity_id: slots[slot].cur.id }
                    }
                    Answer::Committed { held, version, head, created } => Applied::Committed {
                        held,
                        version,
                        inbox_head: match head {
                            Head::None => None,
                            Head::Stored(i) => Some(*i),
                            Head::New(i) => Some(item(i)),
                        },
                        created: created.iter().map(|&s| slots[s].cur.id).collect(),
                        acquired: None,
                    },
                })
            })
            .collect();
        Ok(Done { results, due_now })
    }
}

/// The row of an entity this segment created, as a read of it would return it.
fn new_row(s: &Slot) -> EntityRow {
    let c = &s.cur;
    EntityRow {
        id: c.id,
        machine: c.machine.clone().into(),
        key: c.key.clone().into(),
        state: c.state.clone().into(),
        properties: s.new_properties.clone().unwrap_or_default(),
        version: c.version,
        retry: c.retry as u32,
        created_at: c.entered_at,
        entered_at: c.entered_at,
        auto_at: c.auto_at,
        due_at: c.due_at,
        lease_owner: c.lease_owner.as_deref().map(str::to_string),
        lease_until: c.lease_until,
        request_id: c.request_id.as_deref().map(str::to_string),
        fired: Vec::new(),
        timer_at: c.timer_at,
        run_status: c.run_status,
        sleep_until: c.sleep_until,
        recent_errors: Vec::new(),
        event_id: c.event_id,
        machine_hash: c.machine_hash.as_deref().map(str::to_string),
    }
}

/// What an entity is counted under: its machine, state and run status.
fn count_key(c: &crate::plan::rows::Current) -> (&str, &str, &'static str) {
    (&c.machine, &c.state, c.run_status.as_str())
}
