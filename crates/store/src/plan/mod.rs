//! The batch plan: what a [`Batch`] writes, decided once for both SQL stores.
//!
//! A batch is cut into *segments* of operations planned together. Creates, pushes, commits,
//! releases and agent heartbeats and reports join a segment (which never fences the same
//! entity twice); an operator command, a lease of agent tasks, a renewal of leases and the
//! marking of hung operations each make a segment of their own (so does a round of pruning,
//! [`prune`], with a read and a write of its own), and so does a commit that
//! carries application SQL (under a savepoint: its SQL may fail after its rows are written).
//!
//! A segment is planned in four steps ([`segment`]):
//! 1. **read**, in a few set-based reads: the entities it touches (locked until the batch
//!    commits, on PostgreSQL), the predecessors of those whose state may change, the
//!    predecessors or successors a commit pushes an event to, the first inbox item each
//!    fenced entity keeps, the timers that change, the agent tasks heartbeaten or reported
//!    (locked, with their entities), what a commanded entity holds;
//! 2. **open operations** of external creates, raises and commands, which tells replayed
//!    request ids;
//! 3. **decide** every operation in batch order against an in-memory copy of those rows —
//!    fences, preconditions, existence, leases of tasks, the new columns and due times,
//!    history, telemetry, inbox items — exactly as if they applied one after another. Every
//!    check comes before any write, so a failing operation leaves nothing to undo. The
//!    rules of commands, agent tasks, renewals and hung operations are pure functions of
//!    their own ([`ops`]);
//! 4. **write** one set of rows per table.
//!
//! A [`Dialect`] carries out each read and each set of rows: SQLite row by row with cached
//! statements (in-process, no round trips), PostgreSQL as one statement over arrays, so the
//! round trips of a batch do not grow with its size. Only the dialects know SQL; only the
//! plan decides. What differs between the databases beyond SQL — claiming due entities and
//! firing timers, where PostgreSQL skips rows other instances hold — is the dialect's
//! [`finish`](Dialect::finish).

pub(crate) mod limits;
pub(crate) mod ops;
pub(crate) mod prune;
pub(crate) mod rows;
mod segment;

pub(crate) use self::rows::{Finish, ReadSet, Reads, Writes};

use crate::{Batch, BatchResult, Claim, Claimed, Fence, Millis, Op, OpError, SqlStatement};

/// The entities a batch creates due at once, and those at rest it makes due with an event
/// (where the dialect can), leased to its claiming engine as they are written
/// ([`Claim::take_created`], [`Claim::take_raised`]): whose they become, the room left,
/// those taken.
pub(crate) struct Take<'a> {
    /// New entities may be taken ([`Claim::take_created`]).
    pub(crate) created: bool,
    /// Existing entities an event made due may be taken ([`Claim::take_raised`], where
    /// the dialect can: [`Dialect::TAKES_RAISED`]).
    pub(crate) raised: bool,
    pub(crate) owner: &'a str,
    pub(crate) until: Millis,
    pub(crate) machines: &'a [String],
    pub(crate) room: usize,
    pub(crate) taken: Vec<Claimed>,
}

impl<'a> Take<'a> {
    /// What a batch with `claim` may take as it writes (`takes_raised`: its dialect can
    /// take the entities it raises on).
    fn of(claim: Option<&'a Claim>, now: Millis, takes_raised: bool) -> Option<Take<'a>> {
        let c = claim?;
        let (created, raised) = (c.take_created, c.take_raised && takes_raised);
        if !(created || raised) || c.limit == 0 {
            return None;
        }
        Some(Take {
            created,
            raised,
            owner: &c.owner,
            until: now + c.lease_ms,
            machines: &c.machines,
            room: c.limit,
            taken: Vec::new(),
        })
    }

    /// Whether the claiming engine serves `machine`.
    pub(crate) fn serves(&self, machine: &str) -> bool {
        self.machines.is_empty() || self.machines.iter().any(|m| m == machine)
    }
}

/// What a plan needs from a SQL backend, in three phases per segment or batch: one read,
/// one write, and the batch's finish. Each phase is a whole set of statements, so a
/// backend with a network between it and the plan (PostgreSQL) sends each phase at once
/// (pipelined) and waits once.
pub(crate) trait Dialect {
    /// A failure of the database (the whole batch fails).
    type Error;
    /// Reads what a segment needs (see [`Reads`]), locking the entities it will write
    /// until the transaction ends (PostgreSQL), and opens its operations.
    fn read(&mut self, r: &Reads) -> Result<ReadSet, Self::Error>;
    /// Writes what a segment decided, set by set in the order of [`Writes`]'s fields;
    /// answers the ids of the new inbox items, in order. A new entity whose (machine, key)
    /// exists is a race lost to another writer: the whole batch fails (and is retried).
    fn write(&mut self, w: &Writes) -> Result<Vec<i64>, Self::Error>;

    /// Runs one of the plan's own statements, written once for both databases with `$N`
    /// parameters ([`limits`]), and answers its rows (integer and text columns).
    fn rows(&mut self, sql: &str, params: &[limits::Val]) -> Result<Vec<Vec<limits::Val>>, Self::Error>;
    /// What follows a read of rows the transaction is about to change: a lock until it ends
    /// where other writers exist (PostgreSQL), nothing where one writer is all there is.
    const LOCK: &'static str;

    /// Runs a commit's application SQL (after the rest of the commit is written).
    fn user_sql(&mut self, statements: &[SqlStatement]) -> Result<Result<(), OpError>, Self::Error>;

    /// Starts a savepoint around one operation.
    fn savepoint(&mut self) -> Result<(), Self::Error>;
    /// Keeps what the operation since the savepoint wrote.
    fn release_savepoint(&mut self) -> Result<(), Self::Error>;
    /// Undoes what the operation since the savepoint wrote.
    fn rollback_savepoint(&mut self) -> Result<(), Self::Error>;

    /// Reads a round of pruning: per rule, up to `page` entities of its machine and state
    /// that ended before its time, after its cursor, in `(ended_at, id)` order, locked,
    /// with what could keep them; on PostgreSQL first takes the database's pruning lock
    /// for the transaction (held by another instance: `busy`, nothing read).
    fn prune_read(&mut self, p: &crate::Prune, page: usize) -> Result<prune::PruneRead, Self::Error>;
    /// Removes the chosen entities' rows from every table, then up to `rows` each of the
    /// ended operations, finished tasks and minute counts past their time; counts the rows.
    fn prune_write(&mut self, w: &prune::PruneWrite<'_>) -> Result<prune::PruneWritten, Self::Error>;

    /// Ends the batch: turns due timers of active entities into inbox events, claims due
    /// entities (if asked), reads the earliest due time left, tells other processes what
    /// the batch changed (PostgreSQL) and commits.
    fn finish(&mut self, f: &Finish<'_>) -> Result<(Vec<Claimed>, Option<Millis>), Self::Error>;

    /// Whether a batch leases the existing entities it makes due as it writes them
    /// ([`Claim::take_raised`]): only where reading their rows back ([`taken_rows`])
    /// costs less than the claim would (SQLite, in process). PostgreSQL's claim statement
    /// takes them in the batch's last round trip instead.
    ///
    /// [`taken_rows`]: Dialect::taken_rows
    const TAKES_RAISED: bool;
    /// The whole rows of the entities `ids`, as written so far in this transaction (those
    /// a batch leased as it raised on them), each with the event whose workflow it is in
    /// (as a claim reads them); called only where [`Dialect::TAKES_RAISED`].
    fn taken_rows(&mut self, ids: &[i64]) -> Result<Vec<(crate::EntityRow, Option<crate::Trigger>)>, Self::Error>;
}

/// How an operation is applied.
#[derive(PartialEq, Eq)]
enum Kind {
    /// With the operations around it.
    Segment,
    /// A segment of its own.
    Own,
    /// Operator commands: a run of them on distinct entities shares one segment (a bulk
    /// operation's page is one segment, not one per entity).
    Commands,
    /// A commit with application SQL: a segment of its own, under a savepoint.
    Sql,
    /// A round of pruning ([`prune`]).
    Prune,
    /// Taking the slots of concurrency limits ([`limits`]).
    Acquire,
}

fn kind(op: &Op) -> Kind {
    match op {
        Op::Commit(c) if !c.sql.is_empty() => Kind::Sql,
        Op::Create(_)
        | Op::Push(_)
        | Op::Commit(_)
        | Op::Release(_)
        | Op::TaskHeartbeat { .. }
        | Op::TaskReport { .. } => Kind::Segment,
        Op::Command { .. } | Op::Cancel(_) => Kind::Commands,
        Op::TaskLease { .. } | Op::Renew { .. } | Op::MarkHung { .. } => Kind::Own,
        Op::Prune(_) => Kind::Prune,
        Op::Acquire(_) => Kind::Acquire,
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

/// Where the segment starting at `ops[i]` (of kind `Segment` or `Commands`) ends: the
/// operations of its kind after it, each entity fenced (a segment) or commanded (a run of
/// commands) at most once.
fn segment_end(ops: &[Op], i: usize) -> usize {
    let first = kind(&ops[i]);
    let (mut fences, mut commanded) = (crate::decode::HashSet::default(), crate::decode::HashSet::default());
    let mut end = i;
    while let Some(op) = ops.get(end) {
        if kind(op) != first {
            break;
        }
        let fresh = match op {
            Op::Command { machine, key, .. } => commanded.insert((machine.as_str(), key.as_str())),
            Op::Cancel(c) => commanded.insert((c.machine.as_str(), c.key.as_str())),
            _ => fenced(op).is_none_or(|id| fences.insert(id)),
        };
        if !fresh {
            break;
        }
        end += 1;
    }
    end
}

/// Applies a batch inside the caller's transaction, claims due work, and ends the
/// transaction ([`Dialect::finish`]).
pub(crate) fn apply_batch<D: Dialect>(d: &mut D, batch: &Batch) -> Result<BatchResult, D::Error> {
    let now = batch.now;
    let ops = &batch.ops;
    let mut results = Vec::with_capacity(ops.len());
    let mut others_due = false;
    let mut take = Take::of(batch.claim.as_ref(), now, D::TAKES_RAISED);
    let mut i = 0;
    while i < ops.len() {
        match kind(&ops[i]) {
            Kind::Segment | Kind::Commands => {
                let end = segment_end(ops, i);
                // Commits that take their workflow's slots first: those left waiting are
                // not applied, and answer as their ask did.
                let mut asked = Vec::new();
                for op in &ops[i..end] {
                    let (answer, due_now) = take_first(d, now, op)?;
                    others_due |= due_now;
                    asked.push(answer);
                }
                let segment: Vec<&Op> =
                    ops[i..end].iter().zip(&asked).filter(|(_, a)| a.is_none()).map(|(o, _)| o).collect();
                let done = segment::apply(d, now, &segment, take.as_mut())?;
                others_due |= done.due_now;
                let mut applied = done.results.into_iter();
                let mut done_results: Vec<_> = asked
                    .into_iter()
                    .map(|a| a.unwrap_or_else(|| applied.next().expect("one result per operation applied")))
                    .collect();
                others_due |= leave_limits(d, now, &ops[i..end], &done_results)?;
                others_due |= acquire_entered(d, now, &ops[i..end], &mut done_results)?;
                results.extend(done_results);
                i = end;
            }
            Kind::Own => {
                let done = segment::apply(d, now, &[&ops[i]], None)?;
                others_due |= done.due_now;
                results.extend(done.results);
                i += 1;
            }
            Kind::Acquire => {
                let Op::Acquire(a) = &ops[i] else { unreachable!("an acquire") };
                let (r, due_now) = limits::acquire(d, now, a)?;
                others_due |= due_now;
                results.push(r);
                i += 1;
            }
            Kind::Prune => {
                let Op::Prune(p) = &ops[i] else { unreachable!("a round of pruning") };
                results.push(prune::apply(d, p)?);
                i += 1;
            }
            Kind::Sql => {
                let Op::Commit(c) = &ops[i] else { unreachable!("application SQL is a commit's") };
                let (asked, due_now) = take_first(d, now, &ops[i])?;
                others_due |= due_now;
                if let Some(answer) = asked {
                    results.push(answer);
                    i += 1;
                    continue;
                }
                // Nothing is taken under a savepoint: its rows may be undone.
                d.savepoint()?;
                let done = segment::apply(d, now, &[&ops[i]], None)?;
                let mut r = done.results.into_iter().next().expect("one result per operation");
                if r.is_ok()
                    && let Err(e) = d.user_sql(&c.sql)?
                {
                    r = Err(e);
                }
                if r.is_ok() {
                    others_due |= done.due_now;
                    others_due |= leave_limits(d, now, &ops[i..=i], std::slice::from_ref(&r))?;
                    others_due |= acquire_entered(d, now, &ops[i..=i], std::slice::from_mut(&mut r))?;
                    d.release_savepoint()?;
                } else {
                    d.rollback_savepoint()?;
                }
                results.push(r);
                i += 1;
            }
        }
    }
    let changed = crate::changes::changed(batch, &results);
    // The claim takes what the creates left of its limit; older due work comes first.
    let taken = take.map(|t| t.taken).unwrap_or_default();
    let rest =
        batch.claim.as_ref().filter(|_| !taken.is_empty()).map(|c| Claim { limit: c.limit - taken.len(), ..c.clone() });
    let finish = Finish { now, claim: rest.as_ref().or(batch.claim.as_ref()), changed, others_due };
    let (mut claimed, next_due) = d.finish(&finish)?;
    claimed.extend(taken);
    Ok(BatchResult { results, claimed, next_due })
}

/// Gives back the limits' slots of the entities whose operations in `ops` (with their
/// `results`) end or stop their limited actions or their workflows: commits that say so
/// ([`crate::Commit::leave_limits`], [`crate::Commit::leave_workflows`]), kills (both
/// kinds), cancels that stop its work (its action's: the undo is its workflow's), and pauses and
/// sleeps that find no action in flight, neither in an engine nor at an agent (one in
/// flight gives its slots back with the commit that ends it); and the agents' answers to
/// tasks canceled under them, whose slots their calls kept.
/// Answers whether an entity admitted meanwhile is due now.
fn leave_limits<D: Dialect>(
    d: &mut D,
    now: Millis,
    ops: &[Op],
    results: &[Result<crate::Applied, OpError>],
) -> Result<bool, D::Error> {
    use crate::{Applied, CancelOutcome, Command};
    let mut due_now = false;
    for (op, r) in ops.iter().zip(results) {
        due_now |= match (op, r) {
            (Op::Commit(c), Ok(Applied::Committed { .. })) if c.leave_limits || c.leave_workflows => {
                let id = c.fence.entity_id;
                let action = c.leave_limits && limits::leave(d, now, id, c.held_all)?;
                let workflow = c.leave_workflows && limits::leave_workflows(d, now, id)?;
                action || workflow
            }
            (Op::Command { command, .. }, Ok(Applied::Commanded(e))) => match command {
                Command::Kill => limits::leave(d, now, e.id, false)? | limits::leave_workflows(d, now, e.id)?,
                Command::Pause | Command::Sleep { .. } if e.lease_owner.is_none() => limits::stopped(d, now, e.id)?,
                _ => false,
            },
            (
                Op::Cancel(_),
                Ok(Applied::Canceled {
                    entity,
                    outcome: CancelOutcome::Paused | CancelOutcome::Undone { stopped: true },
                }),
            ) => limits::leave(d, now, entity.id, false)?,
            // An agent answering a task canceled under it: the call it kept slots for is over.
            (
                Op::TaskReport { task, .. } | Op::TaskHeartbeat { task, .. },
                Err(OpError::Task(crate::TaskRefusal::Refused { reason, .. })),
            ) if reason.starts_with("canceled") => limits::task_answered(d, now, *task)?,
            _ => false,
        };
    }
    Ok(due_now)
}

/// An operation's answer.
type Answer = Result<crate::Applied, OpError>;

/// The slots of its workflow a commit takes before it applies ([`crate::Commit::take_first`]):
/// `None` if it asks for none or they are held (it applies; a lease lost is its own answer
/// then), else the answer it gives instead (waiting in line, or let go). Answers too whether
/// an entity is due now.
fn take_first<D: Dialect>(d: &mut D, now: Millis, op: &Op) -> Result<(Option<Answer>, bool), D::Error> {
    let Op::Commit(c) = op else { return Ok((None, false)) };
    let Some(slots) = &c.take_first else { return Ok((None, false)) };
    let ask = crate::Acquire {
        fence: c.fence.clone(),
        slots: slots.clone(),
        priority: None,
        workflow: true,
        request_id: c.request_id.clone(),
    };
    let (answer, due_now) = limits::acquire(d, now, &ask)?;
    Ok(match answer {
        Ok(crate::Applied::Acquired) | Err(_) => (None, due_now),
        other => (Some(other), due_now),
    })
}

/// Takes the slots that commits entering a limited state ask for
/// ([`crate::Commit::acquire`]), after the slots of the states they left went back: where
/// the commit left its lease held and no event waiting, the answer goes into its result
/// (waiting in line or let go, the lease is dropped and the result says so). Answers whether
/// an entity is due now.
fn acquire_entered<D: Dialect>(
    d: &mut D,
    now: Millis,
    ops: &[Op],
    results: &mut [Result<crate::Applied, OpError>],
) -> Result<bool, D::Error> {
    use crate::Applied;
    let mut due_now = false;
    for (op, r) in ops.iter().zip(results) {
        let (Op::Commit(c), Ok(Applied::Committed { held, version, inbox_head: None, acquired, .. })) = (op, r) else {
            continue;
        };
        let Some(slots) = c.acquire.as_ref().filter(|_| *held) else { continue };
        let fence = crate::Fence { entity_id: c.fence.entity_id, version: *version, owner: c.fence.owner.clone() };
        let ask = crate::Acquire { fence, slots: slots.clone(), priority: None, workflow: false, request_id: None };
        let (answer, due) = limits::take_or_wait(d, now, &ask)?;
        due_now |= due;
        *held = matches!(answer, Applied::Acquired);
        *acquired = Some(Box::new(answer));
    }
    Ok(due_now)
}

/// Drops every lease (an exclusive engine starting: whoever held them is gone), in the
/// caller's transaction, and ends it: each leased entity is released as by
/// [`Op::Release`] (due at its auto action, or now if its inbox holds events), and the open
/// operations count a restart. Answers how many leases were dropped.
pub(crate) fn release_all<D: Dialect>(d: &mut D, now: Millis) -> Result<u64, D::Error> {
    let leased = d.read(&Reads { leased: true, ..Reads::default() })?.leased;
    let ops: Vec<Op> = leased
        .into_iter()
        .map(|(entity_id, version, owner)| Op::Release(Fence { entity_id, version, owner }))
        .collect();
    let ops: Vec<&Op> = ops.iter().collect();
    let done = segment::apply(d, now, &ops, None)?;
    let released = done.results.iter().filter(|r| r.is_ok()).count() as u64;
    if released > 0 {
        // A previous engine died with work in flight: the open operations live on.
        d.write(&Writes { now, restarted: true, ..Writes::default() })?;
    }
    d.finish(&Finish { now, claim: None, changed: Vec::new(), others_due: done.due_now })?;
    Ok(released)
}
