//! One segment of a batch: consecutive creates, pushes, commits and releases, planned
//! together (see the [module docs](super)).
//!
//! The segment is decided operation by operation, in batch order, against the rows read
//! for it ([`Slot`]s), exactly as the operations would apply one after another; the
//! decisions are collected as rows per table and written at the end, one set per table.
//!
//! This module reads and drives: what a segment must read, the rows read turned into
//! slots, then each operation decided ([`decide`]) and everything written ([`write`](mod@write)).

mod decide;
mod ops;
mod write;

use std::collections::BTreeSet;

use settle_core::Properties;
use settle_core::machine::Related;

use super::Dialect;

use super::rows::OpenOperation as OpenOp;
use super::rows::*;
use crate::decode::HashMap;
use crate::sql::json_text;
use crate::{AgentTask, Applied, EntityRow, InboxItem, Millis, Op, OpError, OpenOperation, TimerRow};

/// An entity the segment reads or creates: its columns as they become.
struct Slot {
    cur: Current,
    /// As read (`None`: created in this segment).
    orig: Option<Current>,
    /// New JSON columns, when they change (properties always, for a new entity).
    properties: Option<String>,
    fired: Option<String>,
    recent_errors: Option<String>,
    /// The entity's properties as given (new entities: their row is answered).
    new_properties: Option<Properties>,
    /// The inbox items this segment adds to the entity (indexes into `Plan::inbox`).
    pending: Vec<usize>,
}

/// What an operation answers, before the ids the writes assign are known.
enum Answer {
    Done(Box<Applied>),
    Created(usize),
    Pushed { item: usize, slot: usize },
    Committed { held: bool, version: i64, head: Head, created: Vec<usize> },
}

/// The inbox head a held entity is told about.
enum Head {
    None,
    Stored(Box<InboxItem>),
    New(usize),
}

/// An operation's request id as opened in this segment.
#[derive(Clone, Copy)]
struct Opened {
    id: i64,
    /// It existed before this operation: a replay.
    replay: bool,
}

/// A new inbox item; its entity is a slot.
struct Item {
    slot: usize,
    row: InboxInsert,
}

/// Everything the segment decided, written at its end.
#[derive(Default)]
struct Plan {
    inbox: Vec<Item>,
    deletes: Vec<InboxDelete>,
    history: Vec<(usize, HistoryInsert)>,
    successors: Vec<(usize, usize, Option<String>)>,
    /// Entities whose timers are replaced by the rows listed for them.
    timer_slots: Vec<usize>,
    timers: Vec<(usize, TimerRow)>,
    cancel: Vec<i64>,
    offers: Vec<(usize, TaskInsert)>,
    errors: Vec<ErrorInsert>,
    exceptions: Vec<(usize, String)>,
    /// Events, with the index of their error in `errors`.
    events: Vec<(EventInsert, Option<usize>)>,
    ends: Vec<EventEnd>,
    /// Per request id, in first-seen order.
    op_updates: Vec<OperationUpdate>,
    complete: Vec<String>,
    /// Operations opened for operations that then failed: removed again.
    unopen: Vec<String>,
    inbox_clear: Vec<i64>,
    /// (entity, request id): the entity's inbox items of that operation are dropped.
    inbox_drop: Vec<(i64, String)>,
    /// Task rows rewritten, each once (its latest row).
    task_updates: Vec<TaskRow>,
    offer_now: Vec<i64>,
    op_cancel: Vec<String>,
    op_done: Vec<String>,
    hung: Vec<String>,
    renewals: Vec<Renewal>,
    trims: Vec<(i64, crate::Trim)>,
}

impl Plan {
    fn op_update(&mut self, request_id: &str) -> &mut OperationUpdate {
        let i = match self.op_updates.iter().position(|u| u.request_id == request_id) {
            Some(i) => i,
            None => {
                self.op_updates.push(OperationUpdate {
                    request_id: request_id.to_string(),
                    first_response_at: None,
                    error_seen: false,
                    error: None,
                });
                self.op_updates.len() - 1
            }
        };
        &mut self.op_updates[i]
    }

    fn error(&mut self, request_id: Option<&str>, details: &str) {
        if let Some(r) = request_id {
            let u = self.op_update(r);
            u.error_seen = true;
            u.error.get_or_insert_with(|| details.to_string());
        }
    }

    fn complete(&mut self, request_id: Option<&str>) {
        if let Some(r) = request_id
            && !self.complete.iter().any(|c| c == r)
        {
            self.complete.push(r.to_string());
        }
    }
}

struct Work {
    now: Millis,
    slots: Vec<Slot>,
    by_id: HashMap<i64, usize>,
    by_key: ByKey,
    /// Predecessors of each slot (read, and added in this segment).
    predecessors: HashMap<usize, Vec<i64>>,
    /// Successors of each slot whose successors were read (and those added in this
    /// segment).
    successors: HashMap<usize, Vec<i64>>,
    /// The first stored inbox item each fenced entity keeps after its commit's deletions.
    heads: HashMap<i64, InboxItem>,
    /// Stored timers of the entities whose timers change.
    timers: HashMap<i64, Vec<TimerRow>>,
    opened: HashMap<String, Opened>,
    /// Request ids opened by this segment, and by which operation.
    opened_by: HashMap<String, usize>,
    /// Ids reserved for the entities and errors this segment creates.
    entity_ids: std::vec::IntoIter<i64>,
    error_ids: std::vec::IntoIter<i64>,
    /// Commanded entities, by id: their row and what they hold.
    commanded: HashMap<i64, (EntityRow, Facts)>,
    /// Agent tasks read, by id, as this segment leaves them so far.
    tasks: HashMap<i64, TaskRow>,
    leasable: Vec<AgentTask>,
    renewable: Vec<(i64, Option<String>)>,
    open_operations: Vec<OpenOp>,
    plan: Plan,
}

fn key_of(machine: &str, key: &str) -> (String, String) {
    (machine.to_string(), key.to_string())
}

/// The slots by machine and key, looked up by borrowed names (no key built per lookup).
#[derive(Default)]
struct ByKey(HashMap<Text, HashMap<Text, usize>>);

impl ByKey {
    fn get(&self, machine: &str, key: &str) -> Option<usize> {
        self.0.get(machine)?.get(key).copied()
    }

    fn contains(&self, machine: &str, key: &str) -> bool {
        self.get(machine, key).is_some()
    }

    /// Files the slot whose row is `cur`.
    fn insert(&mut self, cur: &Current, slot: usize) {
        self.0.entry(cur.machine.clone()).or_default().insert(cur.key.clone(), slot);
    }
}

/// What a segment did: a result per operation, in order, and whether it left an entity due
/// now that its writer does not hold (another instance may claim it).
pub(crate) struct Done {
    pub(crate) results: Vec<Result<Applied, OpError>>,
    pub(crate) due_now: bool,
}

/// Plans and writes `ops` (each entity fenced at most once; a command, a task lease, a
/// renewal or a hung-marking alone).
/// New entities due at once, and entities at rest given an event, are leased as they are
/// written while `take` has room.
pub(crate) fn apply<D: Dialect>(
    d: &mut D,
    now: Millis,
    ops: &[&Op],
    take: Option<&mut super::Take<'_>>,
) -> Result<Done, D::Error> {
    // 1. Read: the entities the segment touches (locked), predecessors of those that may
    // change state, the related entities of those that push to them, the inbox each fenced entity keeps, the timers that change.
    let mut ids = BTreeSet::new();
    let mut keys = BTreeSet::new();
    let mut notify = Vec::new();
    let mut successors = Vec::new();
    let mut heads = Vec::new();
    let mut timer_ids = Vec::new();
    let mut commanded = Vec::new();
    let mut tasks = Vec::new();
    let mut reported = Vec::new();
    let (mut leasable, mut renew, mut open_before) = (None, None, None);
    for op in ops {
        match op {
            Op::Create(e) => {
                keys.insert(key_of(&e.machine, &e.key));
            }
            Op::Push(p) => {
                keys.insert(key_of(&p.machine, &p.key));
                ids.extend(p.join_from);
            }
            Op::Release(f) => {
                ids.insert(f.entity_id);
                heads.push(InboxDelete { entity_id: f.entity_id, consume: -1, notices_upto: -1, internal: false });
            }
            Op::Commit(c) => {
                let id = c.fence.entity_id;
                ids.insert(id);
                ids.extend(c.preconditions.iter().map(|p| p.0));
                keys.extend(c.creates.iter().map(|e| key_of(&e.machine, &e.key)));
                keys.extend(c.pushes.iter().map(|p| key_of(&p.machine, &p.key)));
                let related = |on| c.push_related.iter().any(|p| p.on == on);
                if c.notify_predecessors || related(Related::Predecessors) {
                    notify.push(id);
                }
                if related(Related::Successors) {
                    successors.push(id);
                }
                heads.push(InboxDelete {
                    entity_id: id,
                    consume: c.consume.unwrap_or(-1),
                    notices_upto: c.consume_notices_upto.unwrap_or(-1),
                    internal: c.consumes_internal,
                });
                if c.timers.is_some() {
                    timer_ids.push(id);
                }
            }
            Op::Command { machine, key, .. } => {
                keys.insert(key_of(machine, key));
                commanded.push(key_of(machine, key));
            }
            Op::Cancel(c) => {
                keys.insert(key_of(&c.machine, &c.key));
                commanded.push(key_of(&c.machine, &c.key));
            }
            Op::TaskHeartbeat { task, .. } => tasks.push(*task),
            Op::TaskReport { task, .. } => {
                tasks.push(*task);
                reported.push(*task);
            }
            Op::TaskLease { queue, limit, .. } => leasable = Some((queue.clone(), *limit, now)),
            Op::Renew { ids, owner, .. } => renew = Some((ids.clone(), owner.clone())),
            Op::MarkHung { before } => open_before = Some(*before),
            Op::Prune(_) => unreachable!("a round of pruning is planned on its own (plan/prune.rs)"),
            Op::Acquire(_) => unreachable!("an acquire is applied on its own (plan/limits.rs)"),
        }
    }
    // Operations of external creates and raises are opened with the reads; a request id
    // seen before makes its operation a replay (and one opened for an operation that then
    // fails is removed again).
    let mut opened_by: HashMap<String, usize> = HashMap::default();
    let mut operations: Vec<OperationInsert> = Vec::new();
    let mut new_entities = 0;
    let mut new_errors = 0;
    for (i, op) in ops.iter().enumerate() {
        let row = match op {
            Op::Create(e) => {
                new_entities += 1;
                e.operation.as_ref().map(|o| operation_row(o, &e.machine, &e.key, now, Some(now)))
            }
            Op::Push(p) => p.operation.as_ref().map(|o| operation_row(o, &p.machine, &p.key, now, None)),
            Op::Command { machine, key, operation, .. } => {
                operation.as_ref().map(|o| operation_row(o, machine, key, now, None))
            }
            Op::Cancel(c) => c.operation.as_ref().map(|o| operation_row(o, &c.machine, &c.key, now, None)),
            Op::Commit(c) => {
                new_entities += c.creates.len();
                new_errors += usize::from(c.telemetry.error.is_some());
                None
            }
            _ => None,
        };
        if let Some(row) = row
            && !opened_by.contains_key(&row.request_id)
        {
            opened_by.insert(row.request_id.clone(), i);
            operations.push(row);
        }
    }
    let reads = Reads {
        ids: ids.into_iter().collect(),
        keys: keys.into_iter().collect(),
        notify,
        successors,
        heads,
        timers: timer_ids,
        operations,
        new_entities,
        new_errors,
        commanded,
        tasks,
        reported,
        leasable,
        renew,
        open_before,
        leased: false,
    };
    let read = d.read(&reads)?;
    let mut w = Work {
        now,
        slots: Vec::with_capacity(read.rows.len()),
        by_id: HashMap::with_capacity_and_hasher(read.rows.len(), Default::default()),
        by_key: ByKey::default(),
        predecessors: HashMap::default(),
        successors: HashMap::default(),
        heads: HashMap::default(),
        timers: HashMap::default(),
        opened: HashMap::default(),
        opened_by,
        entity_ids: read.entity_ids.into_iter(),
        error_ids: read.error_ids.into_iter(),
        commanded: read.commanded.into_iter().map(|(e, f)| (e.id, (e, f))).collect(),
        tasks: read.tasks.into_iter().map(|t| (t.id, t)).collect(),
        leasable: read.leasable,
        renewable: read.renewable,
        open_operations: read.open_operations,
        plan: Plan::default(),
    };
    for row in read.rows {
        if w.by_id.contains_key(&row.id) {
            continue;
        }
        let i = w.slots.len();
        w.by_id.insert(row.id, i);
        w.by_key.insert(&row, i);
        w.slots.push(Slot {
            orig: Some(row.clone()),
            cur: row,
            properties: None,
            fired: None,
            recent_errors: None,
            new_properties: None,
            pending: Vec::new(),
        });
    }
    for (pred, succ) in read.edges {
        if let Some(&s) = w.by_id.get(&succ) {
            w.predecessors.entry(s).or_default().push(pred);
        }
    }
    for (pred, succ) in read.successor_edges {
        if let Some(&p) = w.by_id.get(&pred) {
            w.successors.entry(p).or_default().push(succ);
        }
    }
    for item in read.heads {
        w.heads.insert(item.entity_id, item);
    }
    // An operation waiting only on change notices these commits consume may end with them
    // (a notice to a predecessor at rest carries the successor's request id).
    for r in &read.consumed {
        w.plan.complete(Some(r.as_str()));
    }
    for t in read.timers {
        w.timers.entry(t.entity_id).or_default().push(t);
    }
    for (row, (id, existed)) in reads.operations.iter().zip(read.operations) {
        w.opened.insert(row.request_id.clone(), Opened { id, replay: existed });
    }

    // 3. Decide, in order.
    let mut answers = Vec::with_capacity(ops.len());
    for (i, op) in ops.iter().enumerate() {
        let answer = match op {
            Op::Create(e) => w.create_op(i, e),
            Op::Push(p) => w.push_op(i, p),
            Op::Commit(c) => w.commit(c),
            Op::Release(f) => w.release(f),
            Op::Command { machine, key, command, operation } => {
                w.command(i, machine.as_str(), key.as_str(), *command, operation.as_ref())
            }
            Op::Cancel(c) => w.cancel(i, c),
            Op::TaskHeartbeat { task, token, check } => w.heartbeat(*task, token, check),
            Op::TaskReport { task, token, result, check } => w.report(*task, token, result, check),
            Op::TaskLease { agent, token_prefix, .. } => Ok(w.lease_tasks(agent, token_prefix)),
            Op::Renew { ids, owner, until } => Ok(w.renew(ids, owner, *until)),
            Op::MarkHung { before } => Ok(w.mark_hung(*before)),
            Op::Prune(_) => unreachable!("a round of pruning is planned on its own (plan/prune.rs)"),
            Op::Acquire(_) => unreachable!("an acquire is applied on its own (plan/limits.rs)"),
        };
        answers.push(answer);
    }

    // 4. Write.
    w.write(d, answers, take)
}

fn operation_row(
    o: &OpenOperation,
    machine: &str,
    key: &str,
    now: Millis,
    first_response_at: Option<Millis>,
) -> OperationInsert {
    OperationInsert {
        request_id: o.request_id.clone(),
        name: o.name.clone(),
        machine: machine.to_string(),
        entity_key: key.to_string(),
        started_at: now,
        dimensions: json_text(&o.dimensions),
        first_response_at,
        priority: o.priority,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A slot is found by its machine and key, borrowed; the same key of another machine
    /// is another entity.
    #[test]
    fn slots_are_found_by_machine_and_key() {
        let row = |id, machine: &str, key: &str| Current {
            id,
            machine: machine.into(),
            key: key.into(),
            ..Current::default()
        };
        let mut by_key = ByKey::default();
        by_key.insert(&row(1, "vm", "a"), 0);
        by_key.insert(&row(2, "vm", "b"), 1);
        by_key.insert(&row(3, "disk", "a"), 2);
        assert_eq!(
            [by_key.get("vm", "a"), by_key.get("vm", "b"), by_key.get("disk", "a")],
            [Some(0), Some(1), Some(2)]
        );
        assert!(!by_key.contains("disk", "b") && !by_key.contains("net", "a"));
    }
}
