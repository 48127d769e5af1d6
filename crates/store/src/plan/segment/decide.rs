//! Deciding a segment's operations, one after another, against the rows read for it: the
//! checks every operation must pass before anything is written (fences, preconditions,
//! keys that must exist or be free), and what each one changes — the entity's new columns
//! and due time, its history and telemetry rows, inbox items, successor edges, timers and
//! agent tasks — collected in the segment's [`Plan`](super::Plan).

use settle_core::machine::Related;

use super::{Answer, Head, Item, Slot, Work};
use crate::plan::rows::{
    Current, ErrorInsert, EventEnd, EventInsert, HistoryInsert, InboxDelete, InboxInsert, TaskInsert, Text, min_opt,
};
use crate::sql::json_text;
use crate::{
    AfterCommit, Applied, Commit, Fence, HistoryKind, InboxKind, NewEntity, OpError, OpenOperation, Push, PushRelated,
    RunStatus, TaskOffer, TimerPlan, TimerRow,
};

impl Work {
    /// Whether op `i`'s request id was used before (answered with its operation's id).
    pub(super) fn replayed(&self, i: usize, o: Option<&OpenOperation>) -> Option<i64> {
        let o = o?;
        let opened = self.opened.get(&o.request_id)?;
        (opened.replay || self.opened_by.get(&o.request_id) != Some(&i)).then_some(opened.id)
    }

    /// Op `i` failed after this segment opened its operation: the operation goes again.
    pub(super) fn unopen(&mut self, i: usize, o: Option<&OpenOperation>) {
        if let Some(o) = o
            && self.opened_by.get(&o.request_id) == Some(&i)
            && self.opened.get(&o.request_id).is_some_and(|op| !op.replay)
        {
            self.plan.unopen.push(o.request_id.clone());
        }
    }

    pub(super) fn create_op(&mut self, i: usize, e: &NewEntity) -> Result<Answer, OpError> {
        if let Some(operation_id) = self.replayed(i, e.operation.as_ref()) {
            return Ok(Answer::Done(Box::new(Applied::Replayed { operation_id })));
        }
        if self.by_key.contains(&e.machine, &e.key) {
            self.unopen(i, e.operation.as_ref());
            return Err(OpError::AlreadyExists { machine: e.machine.to_string(), key: e.key.to_string() });
        }
        let slot = self.create(e);
        // An external create that leaves the entity at rest ends its operation now;
        // entities created by an action belong to that action's commit.
        if e.operation.is_some() && e.auto_at.is_none() && e.offer.is_none() && !e.notify_self {
            self.plan.complete(e.request_id.as_deref());
        }
        Ok(Answer::Created(slot))
    }

    /// A new entity in its initial state (its key is known to be free).
    fn create(&mut self, e: &NewEntity) -> usize {
        let now = self.now;
        let slot = self.slots.len();
        let cur = Current {
            id: self.entity_ids.next().expect("an id is reserved for every entity a segment may create"),
            machine: (&e.machine).into(),
            key: (&e.key).into(),
            state: (&e.state).into(),
            version: 1,
            retry: 0,
            entered_at: now,
            auto_at: e.auto_at,
            due_at: e.auto_at,
            lease_owner: None,
            lease_until: None,
            request_id: e.request_id.as_deref().map(Text::from),
            timer_at: None,
            run_status: RunStatus::Active,
            sleep_until: None,
            busy: e.auto_at.is_some() || e.offer.is_some(),
            event_id: None,
            ordinal: 0,
            has_predecessors: false,
            machine_hash: e.machine_hash.as_deref().map(Text::from),
            ended_at: None,
        };
        self.by_id.insert(cur.id, slot);
        self.slots.push(Slot {
            cur,
            orig: None,
            properties: Some(json_text(&e.properties)),
            fired: None,
            recent_errors: None,
            new_properties: Some(e.properties.clone()),
            pending: Vec::new(),
        });
        self.by_key.insert(&self.slots[slot].cur, slot);
        self.plan.history.push((
            slot,
            HistoryInsert {
                to_state: Some(e.state.to_string()),
                kind: HistoryKind::Create.as_str(),
                request_id: e.request_id.clone(),
                at: now,
                machine_hash: e.machine_hash.clone(),
                ordinal: Some(1),
                transition_kind: Some("create"),
                end_health: Some(e.health),
                entry_time: Some(now),
                start_time: Some(now),
                outcome: Some("ok"),
                ..HistoryInsert::default()
            },
        ));
        if e.notify_self {
            self.notice(slot, e.request_id.clone());
        }
        if !e.timers.is_empty() {
            self.set_timers(slot, &e.timers);
        }
        if let Some(o) = &e.offer {
            self.offer(slot, e.state.as_str(), e.request_id.clone(), 0, o);
        }
        let nonempty = !self.slots[slot].pending.is_empty();
        let cur = &mut self.slots[slot].cur;
        cur.due_at = cur.due(nonempty, now);
        slot
    }

    pub(super) fn push_op(&mut self, i: usize, p: &Push) -> Result<Answer, OpError> {
        let Some(target) = self.by_key.get(&p.machine, &p.key) else {
            self.unopen(i, p.operation.as_ref());
            return Err(OpError::NotFound { machine: p.machine.to_string(), key: p.key.to_string() });
        };
        if let Some(operation_id) = self.replayed(i, p.operation.as_ref()) {
            return Ok(Answer::Done(Box::new(Applied::Replayed { operation_id })));
        }
        if self.killed(target) {
            // Killed is terminal: nothing would ever take the event (nor end its operation).
            self.unopen(i, p.operation.as_ref());
            return Err(OpError::Killed { machine: p.machine.to_string(), key: p.key.to_string() });
        }
        let item = self.push(target, p);
        Ok(Answer::Pushed { item, slot: target })
    }

    /// Whether the entity in `slot` is killed: it takes no more events or notices.
    fn killed(&self, slot: usize) -> bool {
        self.slots[slot].cur.run_status == RunStatus::Killed
    }

    /// Appends `p` to the inbox of `target` (known to exist).
    pub(super) fn push(&mut self, target: usize, p: &Push) -> usize {
        let reply = p.reply.as_ref().map(|r| r.to_json().to_string());
        let item = self.add_item(target, p.event.as_str(), json_text(&p.params), p.request_id.clone(), p.kind.as_str());
        self.plan.inbox[item].row.reply = reply;
        if let Some(pred) = p.join_from {
            match self.by_id.get(&pred) {
                Some(&s) => self.join(s, target, p.request_id.clone()),
                None => tracing::warn!(predecessor = pred, "joining from an entity that does not exist; ignored"),
            }
        }
        self.slots[target].cur.receive(self.now);
        item
    }

    fn add_item(
        &mut self,
        slot: usize,
        event: &str,
        params: String,
        request_id: Option<String>,
        kind: &'static str,
    ) -> usize {
        let i = self.plan.inbox.len();
        self.plan.inbox.push(Item {
            slot,
            row: InboxInsert {
                entity_id: 0,
                event: event.to_string(),
                params,
                request_id,
                kind,
                created_at: self.now,
                reply: None,
            },
        });
        self.slots[slot].pending.push(i);
        i
    }

    /// A change notice to the entity of `slot`. Notices in a row for the same operation
    /// make one: the entity evaluates what it waits on as that is when it runs, which
    /// covers every change noticed (a parent's children ending in one batch wake it once).
    fn notice(&mut self, slot: usize, request_id: Option<String>) {
        if let Some(&last) = self.slots[slot].pending.last() {
            let row = &self.plan.inbox[last].row;
            if row.kind == InboxKind::Notice.as_str() && row.request_id == request_id {
                return;
            }
        }
        self.add_item(slot, InboxKind::NOTICE_EVENT, "{}".to_string(), request_id, InboxKind::Notice.as_str());
    }

    /// Records `pred` as a predecessor of `succ`.
    fn join(&mut self, pred: usize, succ: usize, request_id: Option<String>) {
        if pred == succ {
            return;
        }
        self.plan.successors.push((pred, succ, request_id));
        self.slots[succ].cur.has_predecessors = true;
        let (pred_id, succ_id) = (self.slots[pred].cur.id, self.slots[succ].cur.id);
        let list = self.predecessors.entry(succ).or_default();
        if !list.contains(&pred_id) {
            list.push(pred_id);
        }
        let list = self.successors.entry(pred).or_default();
        if !list.contains(&succ_id) {
            list.push(succ_id);
        }
    }

    /// Appends `r`'s event to the inbox of every entity related to `slot` its way, of the
    /// machines it names.
    fn push_related(&mut self, slot: usize, r: &PushRelated, request_id: Option<&String>) {
        let related = match r.on {
            Related::Predecessors => self.predecessors.get(&slot),
            Related::Successors => self.successors.get(&slot),
        };
        let params = json_text(&r.params);
        for id in related.cloned().unwrap_or_default() {
            let Some(&target) = self.by_id.get(&id) else {
                tracing::warn!(entity = id, on = r.on.as_str(), "a related entity was not read; its event is lost");
                continue;
            };
            if !r.machines.iter().any(|m| m.as_str() == &*self.slots[target].cur.machine) || self.killed(target) {
                continue;
            }
            self.add_item(target, r.event.as_str(), params.clone(), request_id.cloned(), InboxKind::Nested.as_str());
            self.slots[target].cur.receive(self.now);
        }
    }

    pub(super) fn release(&mut self, f: &Fence) -> Result<Answer, OpError> {
        let slot = self.fenced(f)?;
        let now = self.now;
        let nonempty = self.inbox_nonempty(slot);
        let cur = &mut self.slots[slot].cur;
        cur.lease_owner = None;
        cur.lease_until = None;
        cur.due_at = cur.due(nonempty, now);
        Ok(Answer::Done(Box::new(Applied::Released)))
    }

    /// The slot of a fenced entity, if its lease holder and version match.
    fn fenced(&self, f: &Fence) -> Result<usize, OpError> {
        match self.by_id.get(&f.entity_id) {
            Some(&s)
                if self.slots[s].cur.version == f.version
                    && self.slots[s].cur.lease_owner.as_deref() == Some(f.owner.as_str()) =>
            {
                Ok(s)
            }
            _ => Err(OpError::LeaseLost { entity_id: f.entity_id }),
        }
    }

    /// Whether the entity's inbox holds anything after what its commit consumes.
    pub(super) fn inbox_nonempty(&self, slot: usize) -> bool {
        let s = &self.slots[slot];
        !s.pending.is_empty() || s.orig.as_ref().is_some_and(|o| self.heads.contains_key(&o.id))
    }

    pub(super) fn commit(&mut self, c: &Commit) -> Result<Answer, OpError> {
        let now = self.now;
        let s = self.fenced(&c.fence)?;
        for &(entity_id, expected) in &c.preconditions {
            let found = self.by_id.get(&entity_id).map_or(0, |&p| self.slots[p].cur.version);
            if found != expected {
                return Err(OpError::Precondition { entity_id, expected, found });
            }
        }
        // Effects that cannot apply fail the whole commit before anything is decided.
        let mut creating: Vec<(&str, &str)> = Vec::with_capacity(c.creates.len());
        for e in &c.creates {
            let k = (e.machine.as_str(), e.key.as_str());
            if self.by_key.contains(k.0, k.1) || creating.contains(&k) {
                return Err(OpError::AlreadyExists { machine: e.machine.to_string(), key: e.key.to_string() });
            }
            creating.push(k);
        }
        for p in c.pushes.iter().filter(|p| p.kind != InboxKind::Reply) {
            let k = (p.machine.as_str(), p.key.as_str());
            if !self.by_key.contains(k.0, k.1) && !creating.contains(&k) {
                return Err(OpError::NotFound { machine: p.machine.to_string(), key: p.key.to_string() });
            }
        }

        let hold = matches!(c.after, AfterCommit::Hold);
        let entity_id = c.fence.entity_id;
        let slot = &mut self.slots[s];
        let cur = &mut slot.cur;
        let status = c.run_status.map_or(cur.run_status, |(status, _)| status);
        let mut superseded = None;
        match &c.to {
            Some(to) => {
                cur.state = to.into();
                cur.version += 1;
                cur.retry = i64::from(c.retry);
                cur.entered_at = now;
                cur.ended_at = c.ended.then_some(now);
                cur.auto_at = c.auto_at;
                cur.busy = c.auto_at.is_some() && status != RunStatus::Failed;
                if let Some(r) = &c.request_id
                    && cur.request_id.as_deref() != Some(r.as_str())
                {
                    // Another operation's workflow takes the entity over: the one it worked
                    // for no longer waits on it, and may end.
                    superseded = cur.request_id.replace(r.as_str().into());
                }
            }
            None => {
                cur.busy = cur.busy && status != RunStatus::Failed;
                if c.internal {
                    cur.version += 1;
                }
            }
        }
        // A row of `transitions`: a state entry, or an internal transition (it stays).
        let moved = c.to.is_some() || c.internal;
        if let Some(p) = &c.properties {
            slot.properties = Some(json_text(p));
        }
        if let Some(f) = &c.fired {
            slot.fired = Some(json_text(&f.iter().map(|e| e.as_str()).collect::<Vec<_>>()));
        }
        if let Some((status, until)) = c.run_status {
            cur.run_status = status;
            cur.sleep_until = until;
        }
        if let Some(errors) = &c.recent_errors {
            slot.recent_errors = Some(json_text(errors));
        }
        if let Some(h) = &c.machine_hash {
            cur.machine_hash = Some(h.as_str().into());
        }
        let t = &c.telemetry;
        if moved {
            cur.ordinal = if t.event.is_some() { 1 } else { cur.ordinal + 1 };
        }
        if t.at_rest {
            cur.event_id = None;
        } else if moved && let Some(ev) = &t.event {
            // The event it processes begins a workflow (an event's id is its inbox id).
            cur.event_id = Some(ev.seq);
        }
        if !(hold && status == RunStatus::Active) {
            cur.lease_owner = None;
            cur.lease_until = None;
        }
        let (machine, key, ordinal, version) = (cur.machine.clone(), cur.key.clone(), cur.ordinal, cur.version);
        let has_predecessors = cur.has_predecessors;

        if c.consume.is_some() || c.consume_notices_upto.is_some() {
            self.plan.deletes.push(InboxDelete {
                entity_id,
                consume: c.consume.unwrap_or(-1),
                notices_upto: c.consume_notices_upto.unwrap_or(-1),
                internal: c.consumes_internal,
            });
        }
        // The event a state entry belongs to: the one it processes (its id is its inbox
        // id), else the one whose workflow the entity is in. Only a state entry records it.
        let event_id = if moved { t.event.as_ref().map(|ev| ev.seq).or(t.current_event) } else { None };
        if let Some(t) = c.trim {
            self.plan.trims.push((entity_id, t));
        }
        if !c.quiet {
            // A state entry's history row is also its `transitions` row.
            let tr = if moved { t.transition.as_ref() } else { None };
            self.plan.history.push((
                s,
                HistoryInsert {
                    entity_id,
                    from_state: Some(c.from.to_string()),
                    to_state: c.to.as_ref().or(c.internal.then_some(&c.from)).map(|s| s.to_string()),
                    kind: c.kind.as_str(),
                    action: c.action.as_ref().map(|a| a.to_string()),
                    event: c.event.as_ref().map(|e| e.to_string()),
                    retry: i64::from(c.retry),
                    request_id: c.request_id.clone(),
                    at: now,
                    detail: c.detail.clone(),
                    machine_hash: c.machine_hash.clone(),
                    event_id: tr.and(event_id),
                    ordinal: tr.map(|_| ordinal),
                    transition_kind: tr.map(|t| t.kind),
                    start_health: tr.and_then(|t| t.start_health),
                    end_health: tr.map(|t| t.end_health),
                    entry_time: tr.map(|t| t.entry_time),
                    start_time: tr.map(|t| t.start_time),
                    action_start_time: tr.and_then(|t| t.action_start_time),
                    outcome: tr.map(|t| t.outcome),
                },
            ));
        }
        self.telemetry(c, entity_id, &machine, &key, event_id);

        let mut created = Vec::with_capacity(c.creates.len());
        for e in &c.creates {
            let new = self.create(e);
            self.join(s, new, c.request_id.clone());
            created.push(new);
        }
        for p in &c.pushes {
            // A reply whose entity is gone is dropped (it only tells what came of an event).
            let Some(target) = self.by_key.get(&p.machine, &p.key) else { continue };
            // An event for a killed entity is dropped: queued, it would never be taken and
            // its operation would never end.
            if !self.killed(target) {
                self.push(target, p);
            }
        }
        for r in &c.push_related {
            self.push_related(s, r, c.request_id.as_ref());
        }
        if c.notify_predecessors && has_predecessors {
            let preds = self.predecessors.get(&s).cloned().unwrap_or_default();
            for pred in preds {
                match self.by_id.get(&pred) {
                    Some(&p) if self.killed(p) => {}
                    Some(&p) => {
                        self.notice(p, c.request_id.clone());
                        self.slots[p].cur.receive(now);
                    }
                    None => tracing::warn!(predecessor = pred, "a predecessor was not read; its notice is lost"),
                }
            }
        }
        if c.notify_self {
            self.notice(s, c.request_id.clone());
        }
        if let Some(plans) = &c.timers {
            self.set_timers(s, plans);
        }
        if c.to.is_some() {
            // Entering a state ends the tasks offered for the one left.
            self.plan.cancel.push(entity_id);
        }
        if let Some(o) = &c.offer {
            let state = c.to.as_ref().unwrap_or(&c.from).to_string();
            self.offer(s, &state, c.request_id.clone(), c.retry, o);
            let cur = &mut self.slots[s].cur;
            cur.auto_at = None;
            cur.busy = cur.run_status != RunStatus::Failed;
        }
        let nonempty = self.inbox_nonempty(s);
        let cur = &mut self.slots[s].cur;
        cur.due_at = cur.due(nonempty, now);
        let held = cur.lease_owner.is_some();
        self.plan.complete(superseded.as_deref());
        if c.telemetry.complete {
            self.plan.complete(c.request_id.as_deref());
            // The operation the entity works for may have waited only on this entity's
            // other queued events (another operation's): at rest now, it may end too.
            let working_for = self.slots[s].cur.request_id.clone();
            self.plan.complete(working_for.as_deref());
        }
        // An internal event goes first (the oldest: a stored one before one of this batch),
        // then the oldest item.
        let stored = self.heads.get(&entity_id);
        let internal = |i: &&usize| self.plan.inbox[**i].row.kind == InboxKind::Internal.as_str();
        let head = if !held {
            Head::None
        } else if let Some(item) = stored.filter(|i| i.kind == InboxKind::Internal) {
            Head::Stored(Box::new(item.clone()))
        } else if let Some(&i) = self.slots[s].pending.iter().find(internal) {
            Head::New(i)
        } else if let Some(item) = stored {
            Head::Stored(Box::new(item.clone()))
        } else {
            match self.slots[s].pending.first() {
                Some(&i) => Head::New(i),
                None => Head::None,
            }
        };
        Ok(Answer::Committed { held, version, head, created })
    }

    /// The commit's `events`, `errors` and `exceptions` rows, and what it changes in its
    /// operation.
    fn telemetry(&mut self, c: &Commit, entity_id: i64, machine: &str, key: &str, event_id: Option<i64>) {
        let now = self.now;
        let t = &c.telemetry;
        let request_id = c.request_id.as_deref();
        let mut error = None;
        if let Some(err) = &t.error {
            error = Some(self.plan.errors.len());
            self.plan.errors.push(ErrorInsert {
                id: self.error_ids.next().expect("an id is reserved for every error a segment records"),
                entity_id,
                request_id: c.request_id.clone(),
                at: now,
                kind: err.kind,
                details: err.details.clone(),
                cause: crate::CauseRef::encode(&err.cause),
            });
            if let Some(details) = &err.exception {
                self.plan.exceptions.push((error.expect("set above"), details.clone()));
            }
            // A retried error is history; the operation fails if the retries end parked. A
            // failure fails it below, with the state it entered.
            if !err.retried && err.kind != "failure" {
                self.plan.error(request_id, &err.details);
            }
        }
        if let (Some(ev), Some(name)) = (&t.event, &c.event) {
            // An event that changes no state (rejected, failed) ends at once.
            let ended = c.to.is_none();
            // An event accepted while another one's workflow was still running interrupts
            // it: that one ends here, in the state it had reached.
            if !ended && let Some(previous) = t.current_event {
                self.plan.ends.push(EventEnd { id: previous, end_state: c.from.to_string(), end_time: now });
            }
            self.plan.events.push((
                EventInsert {
                    id: ev.seq,
                    request_id: c.request_id.clone(),
                    entity_id,
                    machine: machine.to_string(),
                    entity_key: key.to_string(),
                    event: name.to_string(),
                    kind: ev.kind,
                    start_state: c.from.to_string(),
                    start_time: ev.raised_at,
                    rejected: ev.rejected,
                    failed: ev.failed,
                    error_id: None,
                    exception: t.error.as_ref().and_then(|e| e.exception.clone()),
                    end_state: ended.then(|| c.from.to_string()),
                    end_time: ended.then_some(now),
                    reason: if ended { c.detail.clone() } else { None },
                    entered: c.to.as_ref().map(|s| s.to_string()),
                    // No parameters (null, or `{}`) are stored as none.
                    params: (!ev.params.is_null() && ev.params.as_object().is_none_or(|o| !o.is_empty()))
                        .then(|| crate::sql::json_text(&ev.params)),
                    // Owed when its workflow ends later; one that ends here is answered now.
                    reply: if ended { None } else { ev.reply.as_ref().map(|r| r.to_json().to_string()) },
                },
                error,
            ));
            if ev.kind == "raised"
                && let Some(r) = request_id
            {
                self.plan.op_update(r).first_response_at = Some(now);
                // The request's own event rejected: the operation did not do what it asked.
                if ev.rejected {
                    let reason = c.detail.as_deref().unwrap_or("no reason given");
                    self.plan.error(request_id, &format!("event `{name}` rejected in state `{}`: {reason}", c.from));
                }
            }
        }
        // Reaching an error-health state fails the operation.
        if let Some(to) = &c.to
            && t.transition.as_ref().is_some_and(|tr| tr.end_health == "error")
        {
            match t.error.as_ref().filter(|e| e.kind == "failure") {
                Some(f) => self.plan.error(request_id, &format!("entered error state `{to}`: {}", f.details)),
                None => self.plan.error(request_id, &format!("entered error state `{to}`")),
            }
        }
        // The workflow of the entity's event ends when the entity is at rest.
        if t.at_rest
            && let (Some(to), Some(id)) = (&c.to, event_id)
        {
            self.plan.ends.push(EventEnd { id, end_state: to.to_string(), end_time: now });
        }
    }

    /// The entity's timers become `plans`: a plan that does not restart keeps the schedule
    /// of a timer of its name that exists; timers not planned are deleted.
    fn set_timers(&mut self, slot: usize, plans: &[TimerPlan]) {
        let stored = self.slots[slot].orig.as_ref().and_then(|o| self.timers.get(&o.id)).cloned().unwrap_or_default();
        self.plan.timer_slots.push(slot);
        let mut timer_at = None;
        for p in plans {
            let kept = (!p.restart).then(|| stored.iter().find(|t| t.name == p.name)).flatten();
            let row = match kept {
                Some(t) => t.clone(),
                None => TimerRow {
                    entity_id: 0,
                    name: p.name.clone(),
                    event: p.event.clone(),
                    due_at: p.due_at,
                    every_ms: p.every_ms,
                },
            };
            timer_at = min_opt(timer_at, Some(row.due_at));
            self.plan.timers.push((slot, row));
        }
        self.slots[slot].cur.timer_at = timer_at;
    }

    fn offer(&mut self, slot: usize, state: &str, request_id: Option<String>, retry: u32, o: &TaskOffer) {
        let version = self.slots[slot].cur.version;
        self.plan.offers.push((
            slot,
            TaskInsert {
                entity_id: 0,
                queue: o.queue.clone(),
                action: o.action.to_string(),
                state: state.to_string(),
                entity_version: version,
                retry: i64::from(retry),
                lock_ms: o.lock_ms,
                request_id,
                available_at: o.available_at,
                created_at: self.now,
                event_id: self.slots[slot].cur.event_id,
            },
        ));
    }
}
