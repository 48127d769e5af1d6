//! The rows a plan reads and writes: one struct per table and kind of write, handed to a
//! [`Dialect`](super::Dialect) a whole set at a time.

use crate::changes::Changed;
use crate::decode::name;
pub(crate) use crate::decode::{Columns, Text};
use crate::{AgentTask, Claim, EntityRow, InboxItem, Millis, RunStatus, TimerRow};

/// What a segment reads (see [`Dialect::read`](super::Dialect::read)).
#[derive(Debug, Default)]
pub(crate) struct Reads {
    /// Entities to lock and read, by id (fenced, preconditions, joining predecessors).
    pub(crate) ids: Vec<i64>,
    /// Entities to lock and read, by (machine, key) (push targets, keys to create).
    pub(crate) keys: Vec<(String, String)>,
    /// Entities whose predecessors are to be locked and read, with their edges.
    pub(crate) notify: Vec<i64>,
    /// Entities whose successors are to be locked and read, with their edges.
    pub(crate) successors: Vec<i64>,
    /// For each fenced entity, the first inbox item it keeps after these deletions.
    pub(crate) heads: Vec<InboxDelete>,
    /// Entities whose timers are to be read.
    pub(crate) timers: Vec<i64>,
    /// Operations to open (a request id seen before is answered as existing).
    pub(crate) operations: Vec<OperationInsert>,
    /// Ids to reserve for new entities and for errors.
    pub(crate) new_entities: usize,
    pub(crate) new_errors: usize,
    /// Entities commanded, by (machine, key) (also in `keys`): their whole row and what
    /// they hold ([`Facts`]).
    pub(crate) commanded: Vec<(String, String)>,
    /// Agent tasks to lock and read, by id.
    pub(crate) tasks: Vec<i64>,
    /// Agent tasks (also in `tasks`) whose entities are locked and read with them (a report
    /// queues an event there).
    pub(crate) reported: Vec<i64>,
    /// Tasks of a queue an agent may lease at a time, at most so many (PostgreSQL skips
    /// those another instance is leasing).
    pub(crate) leasable: Option<(String, usize, Millis)>,
    /// Entities whose lease `.1` asks to renew (PostgreSQL skips those another instance has
    /// locked this moment).
    pub(crate) renew: Option<(Vec<i64>, String)>,
    /// Open operations started before this time, with their latest progress.
    pub(crate) open_before: Option<Millis>,
    /// Every leased entity (id, version, holder).
    pub(crate) leased: bool,
}

/// What [`Reads`] found.
#[derive(Debug, Default)]
pub(crate) struct ReadSet {
    pub(crate) rows: Vec<Current>,
    /// (predecessor, successor) edges of the `notify` entities.
    pub(crate) edges: Vec<(i64, i64)>,
    /// (predecessor, successor) edges of the `successors` entities.
    pub(crate) successor_edges: Vec<(i64, i64)>,
    pub(crate) heads: Vec<InboxItem>,
    /// The request ids of the change notices the `heads` deletions remove (distinct): their
    /// operations may end once those are gone. (A consumed event's request id is the
    /// commit's own, checked anyway.) PostgreSQL reads them here, in the read round trip;
    /// SQLite's delete returns them and its write checks them (no read).
    pub(crate) consumed: Vec<String>,
    pub(crate) timers: Vec<TimerRow>,
    /// Per operation of [`Reads::operations`], in order: its id, and whether it existed.
    pub(crate) operations: Vec<(i64, bool)>,
    /// Reserved ids, as many as asked.
    pub(crate) entity_ids: Vec<i64>,
    pub(crate) error_ids: Vec<i64>,
    /// Per commanded entity found: its row and what it holds.
    pub(crate) commanded: Vec<(EntityRow, Facts)>,
    /// The tasks asked for that exist.
    pub(crate) tasks: Vec<TaskRow>,
    /// Tasks an agent may lease now, oldest available first.
    pub(crate) leasable: Vec<AgentTask>,
    /// Of the entities asked to renew, those read (not locked by another instance): id and
    /// holder.
    pub(crate) renewable: Vec<(i64, Option<String>)>,
    pub(crate) open_operations: Vec<OpenOperation>,
    /// Every leased entity: (id, version, holder).
    pub(crate) leased: Vec<(i64, i64, String)>,
}

/// What a segment writes (see [`Dialect::write`](super::Dialect::write)), in this order.
#[derive(Debug, Default)]
pub(crate) struct Writes {
    pub(crate) now: Millis,
    pub(crate) entities: Vec<EntityInsert>,
    pub(crate) updates: Vec<EntityUpdate>,
    pub(crate) deletes: Vec<InboxDelete>,
    pub(crate) inbox: Vec<InboxInsert>,
    /// Entities whose whole inbox is dropped (after the new items are written: a kill).
    pub(crate) inbox_clear: Vec<i64>,
    /// (entity, request id): the entity's inbox items of that operation are dropped (after
    /// the new items are written: a cancel).
    pub(crate) inbox_drop: Vec<(i64, String)>,
    pub(crate) history: Vec<HistoryInsert>,
    pub(crate) successors: Vec<SuccessorInsert>,
    /// Entities whose timers become `timers`' rows for them.
    pub(crate) timer_entities: Vec<i64>,
    pub(crate) timers: Vec<TimerRow>,
    /// Entities whose open agent tasks are canceled.
    pub(crate) cancel: Vec<i64>,
    /// Task rows rewritten (leased, heartbeat, reported), each once, after the
    /// cancellations and before the offers (which see them).
    pub(crate) task_updates: Vec<TaskRow>,
    /// Entities whose ready task is offered now, not after its delay (a retry).
    pub(crate) offer_now: Vec<i64>,
    pub(crate) offers: Vec<TaskInsert>,
    pub(crate) errors: Vec<ErrorInsert>,
    pub(crate) exceptions: Vec<ExceptionInsert>,
    pub(crate) events: Vec<EventInsert>,
    pub(crate) ends: Vec<EventEnd>,
    /// Operations opened for operations that then failed: removed again.
    pub(crate) unopen: Vec<String>,
    pub(crate) op_updates: Vec<OperationUpdate>,
    /// Operations whose work was dropped (by a kill): they end as canceled.
    pub(crate) op_cancel: Vec<String>,
    /// Operations done when applied (commands): they end now, successful.
    pub(crate) op_done: Vec<String>,
    /// Request ids whose operations end if nothing of them is busy or queued any more.
    pub(crate) complete: Vec<String>,
    /// Open operations marked hung.
    pub(crate) hung: Vec<String>,
    /// Leases renewed.
    pub(crate) renewals: Vec<Renewal>,
    /// The open operations live on through a restart (their count of restarts goes up).
    pub(crate) restarted: bool,
    /// Live entities whose past is trimmed to their retention, after the rows above.
    pub(crate) trims: Vec<(i64, crate::Trim)>,
    /// How the number of entities per (machine, state, run status) changes (no trigger
    /// keeps the counts: sqlite/counts.rs, postgres/counts.rs).
    pub(crate) counts: Vec<CountDelta>,
}

/// A change in the number of entities of one (machine, state, run status).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CountDelta {
    pub(crate) machine: String,
    pub(crate) state: String,
    pub(crate) run_status: &'static str,
    pub(crate) n: i64,
}

/// Adds up changes of entity counts: `(machine, state, run status, n)` each, in any order;
/// the sums that are not zero, in key order.
pub(crate) fn count_deltas<'a>(
    changes: impl IntoIterator<Item = (&'a str, &'a str, &'static str, i64)>,
) -> Vec<CountDelta> {
    let mut sums: std::collections::BTreeMap<(&str, &str, &'static str), i64> = Default::default();
    for (machine, state, run_status, n) in changes {
        *sums.entry((machine, state, run_status)).or_default() += n;
    }
    sums.into_iter()
        .filter(|(_, n)| *n != 0)
        .map(|((machine, state, run_status), n)| CountDelta {
            machine: machine.to_string(),
            state: state.to_string(),
            run_status,
            n,
        })
        .collect()
}

/// How a batch ends (see [`Dialect::finish`](super::Dialect::finish)).
#[derive(Debug)]
pub(crate) struct Finish<'a> {
    pub(crate) now: Millis,
    pub(crate) claim: Option<&'a Claim>,
    /// The entities the batch changed, for other processes.
    pub(crate) changed: Vec<Changed>,
    /// The batch left an entity due now that its writer does not hold.
    pub(crate) others_due: bool,
}

/// The columns of an entity the plan reads and rewrites (everything but the JSON columns,
/// which are only written when they change). Locked until the batch commits.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct Current {
    pub(crate) id: i64,
    pub(crate) machine: Text,
    pub(crate) key: Text,
    pub(crate) state: Text,
    pub(crate) version: i64,
    pub(crate) retry: i64,
    pub(crate) entered_at: Millis,
    pub(crate) auto_at: Option<Millis>,
    pub(crate) due_at: Option<Millis>,
    pub(crate) lease_owner: Option<Text>,
    pub(crate) lease_until: Option<Millis>,
    pub(crate) request_id: Option<Text>,
    pub(crate) timer_at: Option<Millis>,
    pub(crate) run_status: RunStatus,
    pub(crate) sleep_until: Option<Millis>,
    pub(crate) busy: bool,
    pub(crate) event_id: Option<i64>,
    pub(crate) ordinal: i64,
    pub(crate) has_predecessors: bool,
    pub(crate) machine_hash: Option<Text>,
    /// When it entered the end state it is in (`None`: it has not ended).
    pub(crate) ended_at: Option<Millis>,
}

/// The columns of [`Current`], in its field order (`SELECT {CURRENT_COLS} FROM entities`).
pub(crate) const CURRENT_COLS: &str = "id, machine, key, state, version, retry, entered_at, auto_at, due_at, \
     lease_owner, lease_until, request_id, timer_at, run_status, sleep_until, busy, event_id, ordinal, \
     has_predecessors, machine_hash, ended_at";

impl Current {
    /// Decodes the columns of `SELECT {CURRENT_COLS}`.
    pub(crate) fn from_columns<C: Columns>(r: &C) -> Result<Current, C::Error> {
        let run_status = r.with_text(13, |s| RunStatus::parse(s).ok_or_else(|| format!("unknown run status `{s}`")))?;
        Ok(Current {
            id: r.int(0)?,
            machine: r.with_text(1, name)?,
            key: r.with_text(2, |s| Text::from(s))?,
            state: r.with_text(3, name)?,
            version: r.int(4)?,
            retry: r.int(5)?,
            entered_at: r.int(6)?,
            auto_at: r.opt_int(7)?,
            due_at: r.opt_int(8)?,
            lease_owner: r.with_opt_text(9, name)?,
            lease_until: r.opt_int(10)?,
            request_id: r.with_opt_text(11, |s| Text::from(s))?,
            timer_at: r.opt_int(12)?,
            run_status: run_status.map_err(|m| C::corrupt(13, m))?,
            sleep_until: r.opt_int(14)?,
            busy: r.flag(15)?,
            event_id: r.opt_int(16)?,
            ordinal: r.int(17)?,
            has_predecessors: r.flag(18)?,
            machine_hash: r.with_opt_text(19, name)?,
            ended_at: r.opt_int(20)?,
        })
    }

    /// When the entity is next due, from its columns: never while paused, parked or
    /// killed; at the end of a sleep or backoff; at its lease expiry while leased; now if
    /// its inbox holds events; else at its auto action or first timer. This is the one
    /// definition of `due_at` the write path uses.
    pub(crate) fn due(&self, inbox_nonempty: bool, now: Millis) -> Option<Millis> {
        match self.run_status {
            RunStatus::Paused | RunStatus::Failed | RunStatus::Killed => None,
            RunStatus::Sleeping | RunStatus::Fault => self.sleep_until,
            RunStatus::Active if self.lease_owner.is_some() => self.lease_until,
            RunStatus::Active if inbox_nonempty => Some(now),
            RunStatus::Active => min_opt(self.auto_at, self.timer_at),
        }
    }

    /// A free, active entity that just received an inbox item is due now (an earlier due
    /// time is kept); others keep their due time.
    pub(crate) fn receive(&mut self, now: Millis) {
        if self.lease_owner.is_none() && self.run_status == RunStatus::Active && self.due_at.is_none_or(|d| d > now) {
            self.due_at = Some(now);
        }
    }
}

/// The earlier of two optional times.
pub(crate) fn min_opt(a: Option<Millis>, b: Option<Millis>) -> Option<Millis> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, None) => a,
        (None, b) => b,
    }
}

/// What a commanded entity holds besides its row, read with it.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Facts {
    /// Its inbox holds an item.
    pub(crate) inbox: bool,
    /// The distinct request ids of its inbox items.
    pub(crate) inbox_requests: Vec<String>,
    /// It has an open (ready or leased) agent task.
    pub(crate) open_task: bool,
}

/// A lease extended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Renewal {
    /// The entity.
    pub(crate) id: i64,
    /// Its lease's new end, and its due time.
    pub(crate) until: Millis,
}

/// An open operation, with its latest progress as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OpenOperation {
    /// Its request id.
    pub(crate) request_id: String,
    /// When it started.
    pub(crate) started_at: Millis,
    /// When an entity still busy for it last entered a state.
    pub(crate) last_entered: Option<Millis>,
    /// When one of its events was last queued.
    pub(crate) last_queued: Option<Millis>,
}

/// An agent task's row as the plan reads and rewrites it: what a lease, a heartbeat or a
/// report checks and changes. Locked until the batch commits.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TaskRow {
    pub(crate) id: i64,
    pub(crate) entity_id: i64,
    pub(crate) queue: String,
    pub(crate) action: String,
    pub(crate) entity_version: i64,
    pub(crate) request_id: Option<String>,
    pub(crate) status: String,
    pub(crate) attempt: u32,
    pub(crate) token: Option<String>,
    pub(crate) agent: Option<String>,
    pub(crate) leased_at: Option<Millis>,
    pub(crate) locked_until: Option<Millis>,
    pub(crate) lock_ms: i64,
    pub(crate) available_at: Millis,
    pub(crate) finished_at: Option<Millis>,
    pub(crate) outcome: Option<String>,
    pub(crate) error: Option<String>,
}

/// The columns of [`TaskRow`], in its field order (`SELECT {TASK_ROW_COLS} FROM agent_tasks`).
pub(crate) const TASK_ROW_COLS: &str = "id, entity_id, queue, action, entity_version, request_id, status, attempt, \
     token, agent, leased_at, locked_until, lock_ms, available_at, finished_at, outcome, error";

impl TaskRow {
    /// Decodes the columns of `SELECT {TASK_ROW_COLS}`.
    pub(crate) fn from_columns<C: Columns>(r: &C) -> Result<TaskRow, C::Error> {
        let attempt = r.int(7)?;
        Ok(TaskRow {
            id: r.int(0)?,
            entity_id: r.int(1)?,
            queue: r.text(2)?,
            action: r.text(3)?,
            entity_version: r.int(4)?,
            request_id: r.opt_text(5)?,
            status: r.text(6)?,
            attempt: u32::try_from(attempt).map_err(|_| C::corrupt(7, format!("attempt {attempt} out of range")))?,
            token: r.opt_text(8)?,
            agent: r.opt_text(9)?,
            leased_at: r.opt_int(10)?,
            locked_until: r.opt_int(11)?,
            lock_ms: r.int(12)?,
            available_at: r.int(13)?,
            finished_at: r.opt_int(14)?,
            outcome: r.opt_text(15)?,
            error: r.opt_text(16)?,
        })
    }
}

/// New values of an entity read as [`Current`]; the JSON columns only when they change.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct EntityUpdate {
    pub(crate) row: Current,
    pub(crate) properties: Option<String>,
    pub(crate) fired: Option<String>,
    pub(crate) recent_errors: Option<String>,
    /// Which of its indexed columns changed (SQLite rewrites the entries of every index
    /// whose column an UPDATE sets, changed or not; its dialect sets only these).
    pub(crate) indexed: Indexed,
}

/// Which indexed columns of an entity an update changes: a bit per column, so that the
/// combination is its own number (below [`Indexed::COMBINATIONS`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Indexed(pub(crate) u8);

impl Indexed {
    pub(crate) const STATE: Indexed = Indexed(1);
    pub(crate) const ENTERED_AT: Indexed = Indexed(1 << 1);
    pub(crate) const DUE_AT: Indexed = Indexed(1 << 2);
    /// `request_id` or `busy` (the index of busy entities by request).
    pub(crate) const BUSY: Indexed = Indexed(1 << 3);
    pub(crate) const RUN_STATUS: Indexed = Indexed(1 << 4);
    pub(crate) const ENDED_AT: Indexed = Indexed(1 << 5);
    /// How many combinations of the columns there are.
    pub(crate) const COMBINATIONS: usize = 1 << 6;

    /// Whether every column of `columns` changed.
    pub(crate) fn has(self, columns: Indexed) -> bool {
        self.0 & columns.0 == columns.0
    }

    /// What differs between `before` and `after`.
    pub(crate) fn between(before: &Current, after: &Current) -> Indexed {
        [
            (before.state != after.state, Indexed::STATE),
            (before.entered_at != after.entered_at, Indexed::ENTERED_AT),
            (before.due_at != after.due_at, Indexed::DUE_AT),
            (before.request_id != after.request_id || before.busy != after.busy, Indexed::BUSY),
            (before.run_status != after.run_status, Indexed::RUN_STATUS),
            (before.ended_at != after.ended_at, Indexed::ENDED_AT),
        ]
        .into_iter()
        .filter(|(changed, _)| *changed)
        .fold(Indexed::default(), |all, (_, column)| all | column)
    }
}

impl std::ops::BitOr for Indexed {
    type Output = Indexed;

    fn bitor(self, other: Indexed) -> Indexed {
        Indexed(self.0 | other.0)
    }
}

/// A new entity (with its reserved id). `created_at` and `entered_at` are the batch's
/// time; version 1, retry 0. Leased when the batch's claim takes it as it is created.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct EntityInsert {
    pub(crate) id: i64,
    pub(crate) machine: String,
    pub(crate) key: String,
    pub(crate) state: String,
    pub(crate) properties: String,
    pub(crate) created_at: Millis,
    pub(crate) auto_at: Option<Millis>,
    pub(crate) due_at: Option<Millis>,
    pub(crate) lease_owner: Option<String>,
    pub(crate) lease_until: Option<Millis>,
    pub(crate) request_id: Option<String>,
    pub(crate) busy: bool,
    pub(crate) machine_hash: Option<String>,
    pub(crate) timer_at: Option<Millis>,
    pub(crate) has_predecessors: bool,
}

/// Inbox items to delete for one entity: the item a commit consumes, and the change notices
/// up to an id (`-1`: none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct InboxDelete {
    pub(crate) entity_id: i64,
    pub(crate) consume: i64,
    pub(crate) notices_upto: i64,
    /// The item consumed is an internal event: the next head may be another one.
    pub(crate) internal: bool,
}

/// A new inbox item.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct InboxInsert {
    pub(crate) entity_id: i64,
    pub(crate) event: String,
    pub(crate) params: String,
    pub(crate) request_id: Option<String>,
    pub(crate) kind: &'static str,
    pub(crate) created_at: Millis,
    /// A sync nested event's [`Reply`](crate::Reply), as JSON text.
    pub(crate) reply: Option<String>,
}

/// A history row (also the `transitions` row of a state entry).
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct HistoryInsert {
    pub(crate) entity_id: i64,
    pub(crate) from_state: Option<String>,
    pub(crate) to_state: Option<String>,
    pub(crate) kind: &'static str,
    pub(crate) action: Option<String>,
    pub(crate) event: Option<String>,
    pub(crate) retry: i64,
    pub(crate) request_id: Option<String>,
    pub(crate) at: Millis,
    pub(crate) detail: Option<String>,
    pub(crate) machine_hash: Option<String>,
    pub(crate) event_id: Option<i64>,
    pub(crate) ordinal: Option<i64>,
    pub(crate) transition_kind: Option<&'static str>,
    pub(crate) start_health: Option<&'static str>,
    pub(crate) end_health: Option<&'static str>,
    pub(crate) entry_time: Option<Millis>,
    pub(crate) start_time: Option<Millis>,
    pub(crate) action_start_time: Option<Millis>,
    pub(crate) outcome: Option<&'static str>,
}

/// A successor edge (kept if it exists).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SuccessorInsert {
    pub(crate) predecessor_id: i64,
    pub(crate) successor_id: i64,
    pub(crate) request_id: Option<String>,
    pub(crate) created_at: Millis,
}

/// An agent task offered for an entity's state entry (only if it has no open task).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TaskInsert {
    pub(crate) entity_id: i64,
    pub(crate) queue: String,
    pub(crate) action: String,
    pub(crate) state: String,
    pub(crate) entity_version: i64,
    pub(crate) retry: i64,
    pub(crate) lock_ms: i64,
    pub(crate) request_id: Option<String>,
    pub(crate) available_at: Millis,
    pub(crate) created_at: Millis,
    /// The event whose workflow the state entry belongs to (its `events` row).
    pub(crate) event_id: Option<i64>,
}

/// An error, with its reserved id (its operation is found by request id).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ErrorInsert {
    pub(crate) id: i64,
    pub(crate) entity_id: i64,
    pub(crate) request_id: Option<String>,
    pub(crate) at: Millis,
    pub(crate) kind: &'static str,
    pub(crate) details: String,
    /// [`CauseRef::encode`](crate::CauseRef) of the failure's causes.
    pub(crate) cause: Option<String>,
}

/// Exception details of an error.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ExceptionInsert {
    pub(crate) error_id: i64,
    pub(crate) at: Millis,
    pub(crate) details: String,
}

/// A processed event (its operation is found by request id).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct EventInsert {
    pub(crate) id: i64,
    pub(crate) request_id: Option<String>,
    pub(crate) entity_id: i64,
    pub(crate) machine: String,
    pub(crate) entity_key: String,
    pub(crate) event: String,
    pub(crate) kind: &'static str,
    pub(crate) start_state: String,
    pub(crate) start_time: Millis,
    pub(crate) rejected: bool,
    pub(crate) failed: bool,
    pub(crate) error_id: Option<i64>,
    pub(crate) exception: Option<String>,
    pub(crate) end_state: Option<String>,
    pub(crate) end_time: Option<Millis>,
    /// Why it was rejected, or how its action failed.
    pub(crate) reason: Option<String>,
    /// The state its action entered.
    pub(crate) entered: Option<String>,
    /// Its parameters (JSON), when it has any.
    pub(crate) params: Option<String>,
    /// The reply its workflow's end owes (JSON text); none once it ended.
    pub(crate) reply: Option<String>,
}

/// An event's workflow ends (only if it has not ended yet).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct EventEnd {
    pub(crate) id: i64,
    pub(crate) end_state: String,
    pub(crate) end_time: Millis,
}

/// An operation to open (nothing if its request id exists).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct OperationInsert {
    pub(crate) request_id: String,
    pub(crate) name: String,
    pub(crate) machine: String,
    pub(crate) entity_key: String,
    pub(crate) started_at: Millis,
    pub(crate) dimensions: String,
    pub(crate) first_response_at: Option<Millis>,
    pub(crate) priority: i64,
}

/// Changes to an operation: its first response (kept if set), an error (the first kept).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct OperationUpdate {
    pub(crate) request_id: String,
    pub(crate) first_response_at: Option<Millis>,
    pub(crate) error_seen: bool,
    pub(crate) error: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row() -> Current {
        Current {
            id: 1,
            machine: "m".into(),
            key: "k".into(),
            state: "s".into(),
            version: 1,
            retry: 0,
            entered_at: 0,
            auto_at: None,
            due_at: None,
            lease_owner: None,
            lease_until: None,
            request_id: None,
            timer_at: None,
            run_status: RunStatus::Active,
            sleep_until: None,
            busy: false,
            event_id: None,
            ordinal: 0,
            has_predecessors: false,
            machine_hash: None,
            ended_at: None,
        }
    }

    #[test]
    fn due_follows_run_status_lease_inbox_and_times() {
        let now = 100;
        let mut r = row();
        assert_eq!(r.due(false, now), None, "dormant");
        assert_eq!(r.due(true, now), Some(now), "queued events");
        r.auto_at = Some(300);
        r.timer_at = Some(200);
        assert_eq!(r.due(false, now), Some(200), "the earlier of auto action and timer");
        r.lease_owner = Some("me".into());
        r.lease_until = Some(900);
        assert_eq!(r.due(true, now), Some(900), "a leased entity is due when its lease ends");
        r.run_status = RunStatus::Fault;
        r.sleep_until = Some(500);
        assert_eq!(r.due(true, now), Some(500), "backing off");
        for s in [RunStatus::Paused, RunStatus::Failed, RunStatus::Killed] {
            r.run_status = s;
            assert_eq!(r.due(true, now), None, "{s:?}");
        }
    }

    #[test]
    fn receiving_makes_only_free_active_entities_due() {
        let mut r = row();
        r.receive(100);
        assert_eq!(r.due_at, Some(100));
        r.due_at = Some(50);
        r.receive(100);
        assert_eq!(r.due_at, Some(50), "an earlier due time is kept");
        let mut leased = row();
        leased.lease_owner = Some("me".into());
        leased.due_at = Some(900);
        leased.receive(100);
        assert_eq!(leased.due_at, Some(900));
        let mut paused = row();
        paused.run_status = RunStatus::Paused;
        paused.receive(100);
        assert_eq!(paused.due_at, None);
    }
}
