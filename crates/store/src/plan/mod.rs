//! The batch plan: what a [`Batch`] writes, decided once for both SQL stores.
//!
//! A batch is cut into runs of operations. Creates, pushes, commits and releases form
//! *segments* (a segment never fences the same entity twice); every other operation
//! (operator commands, agent task operations, lease renewals, hung-operation marking) and
//! every commit that carries application SQL runs alone, in batch order, under a savepoint
//! when it can fail after writing.
//!
//! A segment is planned in four steps ([`segment`]):
//! 1. **read**, in a few set-based reads: the entities it touches (locked until the batch
//!    commits, on PostgreSQL), the predecessors of those whose state may change, the first
//!    inbox item each fenced entity keeps, the timers that change;
//! 2. **open operations** of external creates and raises, which tells replayed request
//!    ids;
//! 3. **decide** every operation in batch order against an in-memory copy of those rows —
//!    fences, preconditions, existence, the new columns and due times, history, telemetry,
//!    inbox items — exactly as if they applied one after another. Every check comes before
//!    any write, so a failing operation leaves nothing to undo;
//! 4. **write** one set of rows per table.
//!
//! A [`Dialect`] carries out each read and each set of rows: SQLite row by row with cached
//! statements (in-process, no round trips), PostgreSQL as one statement over arrays, so the
//! round trips of a batch do not grow with its size. Only the dialects know SQL; only the
//! plan decides.

pub(crate) mod rows;
mod segment;

use self::rows::*;
use crate::types::*;

/// The reads and writes a plan needs from a SQL backend, each over a whole set of rows.
/// Writes keep the order of their rows (ids are assigned in that order).
pub(crate) trait Dialect {
    /// A failure of the database (the whole batch fails).
    type Error;

    /// Reads, and locks until the transaction ends, the entities with these ids, with
    /// these (machine, key) pairs, and the predecessors of the entities `notify` names.
    fn lock(&mut self, ids: &[i64], keys: &[(String, String)], notify: &[i64]) -> Result<Vec<Current>, Self::Error>;
    /// The successor edges (predecessor, successor) of these successors.
    fn edges(&mut self, successors: &[i64]) -> Result<Vec<(i64, i64)>, Self::Error>;
    /// For each entity, its first inbox item that is neither `consume` nor a notice up to
    /// `notices_upto` (none if it has none).
    fn inbox_heads(&mut self, rows: &[InboxDelete]) -> Result<Vec<InboxItem>, Self::Error>;
    /// The timers of these entities.
    fn timers(&mut self, entities: &[i64]) -> Result<Vec<TimerRow>, Self::Error>;
    /// Opens operations whose request id is new; answers each row's operation id and
    /// whether it existed before.
    fn open_operations(&mut self, rows: &[OperationInsert]) -> Result<Vec<(i64, bool)>, Self::Error>;

    /// Inserts entities; their ids, in order. A (machine, key) that exists is a race
    /// lost to another writer: the whole batch fails (and is retried).
    fn insert_entities(&mut self, rows: &[EntityInsert]) -> Result<Vec<i64>, Self::Error>;
    /// Writes the columns of entities read with [`Dialect::lock`].
    fn update_entities(&mut self, rows: &[EntityUpdate]) -> Result<(), Self::Error>;
    /// Deletes consumed inbox items and covered change notices.
    fn delete_inbox(&mut self, rows: &[InboxDelete]) -> Result<(), Self::Error>;
    /// Appends inbox items; their ids, in order.
    fn insert_inbox(&mut self, rows: &[InboxInsert]) -> Result<Vec<i64>, Self::Error>;
    /// Appends history rows.
    fn insert_history(&mut self, rows: &[HistoryInsert]) -> Result<(), Self::Error>;
    /// Adds successor edges (existing ones are kept).
    fn insert_successors(&mut self, rows: &[SuccessorInsert]) -> Result<(), Self::Error>;
    /// Replaces the timers of `entities` by `rows`.
    fn replace_timers(&mut self, entities: &[i64], rows: &[TimerRow]) -> Result<(), Self::Error>;
    /// Cancels the open agent tasks of these entities.
    fn cancel_tasks(&mut self, entities: &[i64], now: Millis) -> Result<(), Self::Error>;
    /// Offers agent tasks to entities without an open one.
    fn offer_tasks(&mut self, rows: &[TaskInsert]) -> Result<(), Self::Error>;
    /// Records errors; their ids, in order.
    fn insert_errors(&mut self, rows: &[ErrorInsert]) -> Result<Vec<i64>, Self::Error>;
    /// Records exception details.
    fn insert_exceptions(&mut self, rows: &[ExceptionInsert]) -> Result<(), Self::Error>;
    /// Records processed events.
    fn insert_events(&mut self, rows: &[EventInsert]) -> Result<(), Self::Error>;
    /// Ends events' workflows (those not ended yet).
    fn end_events(&mut self, rows: &[EventEnd]) -> Result<(), Self::Error>;
    /// Removes operations opened by operations that then failed.
    fn delete_operations(&mut self, request_ids: &[String]) -> Result<(), Self::Error>;
    /// Records first responses and errors of operations.
    fn update_operations(&mut self, rows: &[OperationUpdate]) -> Result<(), Self::Error>;
    /// Ends each operation nothing of which is busy or queued any more.
    fn complete_operations(&mut self, request_ids: &[String], now: Millis) -> Result<(), Self::Error>;

    /// Runs a commit's application SQL (after the rest of the commit is written).
    fn user_sql(&mut self, statements: &[SqlStatement]) -> Result<Result<(), OpError>, Self::Error>;
    /// Applies an operation that is not planned in segments: commands, agent task
    /// operations, renewals, hung-operation marking. A task report answers the push that
    /// carries it to its entity, which the plan then applies.
    fn other(&mut self, now: Millis, op: &Op) -> Result<Result<Other, OpError>, Self::Error>;

    /// Starts a savepoint around one operation.
    fn savepoint(&mut self) -> Result<(), Self::Error>;
    /// Keeps what the operation since the savepoint wrote.
    fn release_savepoint(&mut self) -> Result<(), Self::Error>;
    /// Undoes what the operation since the savepoint wrote.
    fn rollback_savepoint(&mut self) -> Result<(), Self::Error>;

    /// Turns due timers of active entities into inbox events.
    fn fire_timers(&mut self, now: Millis, limit: usize) -> Result<(), Self::Error>;
    /// Leases due entities (with their first inbox item).
    fn claim(&mut self, now: Millis, claim: &Claim) -> Result<Vec<Claimed>, Self::Error>;
    /// The earliest due time left, among the machines claims take (all if none named).
    fn next_due(&mut self, machines: &[String]) -> Result<Option<Millis>, Self::Error>;
}

/// What [`Dialect::other`] did.
pub(crate) enum Other {
    /// The operation is applied.
    Applied(Applied),
    /// The operation is a push still to apply (an agent's report).
    Push(Push),
}

/// How an operation is applied.
#[derive(PartialEq, Eq)]
enum Kind {
    Segment,
    /// A commit with application SQL: a segment of its own, under a savepoint.
    Alone,
    Other,
}

fn kind(op: &Op) -> Kind {
    match op {
        Op::Commit(c) if !c.sql.is_empty() => Kind::Alone,
        Op::Create(_) | Op::Push(_) | Op::Commit(_) | Op::Release(_) => Kind::Segment,
        _ => Kind::Other,
    }
}

/// The entity an operation fences, if any.
fn fenced(op: &Op) -> Option<i64> {
    match op {
        Op::Commit(c) => Some(c.fence.entity_id),
        Op::Release(f) => Some(f.entity_id),
        _ => None,
    }
}

/// Whether an operation applied alone can fail after writing, so it needs a savepoint.
fn needs_savepoint(op: &Op) -> bool {
    matches!(op, Op::Command { .. } | Op::TaskReport { .. })
}

/// A written batch: its result, and whether it left work that other instances may claim
/// (an entity due now that the writer does not hold), so they should be woken.
pub(crate) struct Written {
    pub(crate) result: BatchResult,
    pub(crate) others_due: bool,
}

/// Applies a batch (inside the caller's transaction) and claims due work.
pub(crate) fn apply_batch<D: Dialect>(d: &mut D, batch: &Batch) -> Result<Written, D::Error> {
    let now = batch.now;
    let ops = &batch.ops;
    let mut results = Vec::with_capacity(ops.len());
    let mut others_due = false;
    let mut i = 0;
    while i < ops.len() {
        match kind(&ops[i]) {
            Kind::Segment => {
                let mut fences = std::collections::HashSet::new();
                let mut end = i;
                while end < ops.len()
                    && kind(&ops[end]) == Kind::Segment
                    && fenced(&ops[end]).is_none_or(|id| fences.insert(id))
                {
                    end += 1;
                }
                let segment: Vec<&Op> = ops[i..end].iter().collect();
                let done = segment::apply(d, now, &segment)?;
                others_due |= done.due_now;
                results.extend(done.results);
                i = end;
            }
            Kind::Alone => {
                let Op::Commit(c) = &ops[i] else { unreachable!("alone means a commit") };
                d.savepoint()?;
                let done = segment::apply(d, now, &[&ops[i]])?;
                let mut r = done.results.into_iter().next().expect("one result per operation");
                if r.is_ok()
                    && let Err(e) = d.user_sql(&c.sql)?
                {
                    r = Err(e);
                }
                if r.is_ok() {
                    others_due |= done.due_now;
                    d.release_savepoint()?;
                } else {
                    d.rollback_savepoint()?;
                }
                results.push(r);
                i += 1;
            }
            Kind::Other => {
                let op = &ops[i];
                let savepoint = needs_savepoint(op);
                if savepoint {
                    d.savepoint()?;
                }
                let r = match d.other(now, op)? {
                    // A command may make its entity due (resume, retry, release).
                    Ok(Other::Applied(applied)) => {
                        others_due |= matches!(applied, Applied::Commanded(_));
                        Ok(applied)
                    }
                    Ok(Other::Push(push)) => {
                        let push = Op::Push(push);
                        let done = segment::apply(d, now, &[&push])?;
                        others_due |= done.due_now;
                        done.results.into_iter().next().expect("one result per operation")
                    }
                    Err(e) => Err(e),
                };
                if savepoint {
                    if r.is_ok() {
                        d.release_savepoint()?;
                    } else {
                        d.rollback_savepoint()?;
                    }
                }
                results.push(r);
                i += 1;
            }
        }
    }
    let mut claimed = Vec::new();
    let mut machines: &[String] = &[];
    if let Some(claim) = &batch.claim {
        d.fire_timers(now, 1_000)?;
        claimed = d.claim(now, claim)?;
        machines = &claim.machines;
    }
    let next_due = d.next_due(machines)?;
    Ok(Written { result: BatchResult { results, claimed, next_due }, others_due })
}
