//! Entities: the stored row ([`EntityRow`]), its lifecycle status beside the machine state
//! ([`RunStatus`]) and the operator commands that change it ([`Command`]), what a create
//! inserts ([`NewEntity`]), which entities to list ([`EntityFilter`]), and what a subscriber
//! reads of its successors ([`SuccessorSnapshot`]).

use settle_core::{EntityKey, EventName, MachineName, Properties, StateName};

use crate::{Millis, OpenOperation, TaskOffer, TimerPlan};

/// A stored entity.
#[derive(Debug, Clone, PartialEq)]
pub struct EntityRow {
    /// Store-assigned id.
    pub id: i64,
    /// The entity's machine.
    pub machine: MachineName,
    /// The user's key, unique within the machine.
    pub key: EntityKey,
    /// The current state.
    pub state: StateName,
    /// The entity's properties.
    pub properties: Properties,
    /// Bumped by every transition: the fencing token of commits.
    pub version: i64,
    /// Retry count of the current state entry.
    pub retry: u32,
    /// When the entity was created.
    pub created_at: Millis,
    /// When the current state was entered.
    pub entered_at: Millis,
    /// When the auto action of the current (unstable) state is due; `None` when at rest.
    pub auto_at: Option<Millis>,
    /// When the entity next has work: the earliest of its queued events (now), its auto
    /// action, and, while leased, its lease expiry. `None`: dormant.
    pub due_at: Option<Millis>,
    /// The engine instance holding the lease, if any.
    pub lease_owner: Option<String>,
    /// Until when the lease is held.
    pub lease_until: Option<Millis>,
    /// The request that caused the latest state entry; auto actions carry it on.
    pub request_id: Option<String>,
    /// Subscription events already fired during the current state entry.
    pub fired: Vec<EventName>,
    /// The earliest due time of the entity's timers.
    pub timer_at: Option<Millis>,
    /// Lifecycle status beside the machine state.
    pub run_status: RunStatus,
    /// Until when a `sleeping` or `fault` entity waits.
    pub sleep_until: Option<Millis>,
    /// Times of the entity's recent errors, as its fault policy keeps them.
    pub recent_errors: Vec<Millis>,
    /// The telemetry event whose workflow the entity is in.
    pub event_id: Option<i64>,
    /// The definition version of the entity's latest transition.
    pub machine_hash: Option<String>,
}

/// An entity's lifecycle status, beside its machine state (DESIGN §4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum RunStatus {
    /// Runs normally.
    #[default]
    Active,
    /// Nothing runs; events queue and run on resume.
    Paused,
    /// Nothing runs until `sleep_until` (an operator's `sleep`); events queue.
    Sleeping,
    /// Backing off after an error until `sleep_until`, then the state is re-entered.
    Fault,
    /// Parked by the fault policy for an operator.
    Failed,
    /// Terminal: never runs again; its pending work was canceled.
    Killed,
}

impl RunStatus {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Active => "active",
            RunStatus::Paused => "paused",
            RunStatus::Sleeping => "sleeping",
            RunStatus::Fault => "fault",
            RunStatus::Failed => "failed",
            RunStatus::Killed => "killed",
        }
    }
    /// Parses the stored name.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "active" => RunStatus::Active,
            "paused" => RunStatus::Paused,
            "sleeping" => RunStatus::Sleeping,
            "fault" => RunStatus::Fault,
            "failed" => RunStatus::Failed,
            "killed" => RunStatus::Killed,
            _ => return None,
        })
    }
}

/// An operator command on an entity's run status (DESIGN §4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// Stop auto actions and timers; events queue.
    Pause,
    /// Back to `active` from paused, sleeping, fault or failed (clears the error count).
    Resume,
    /// Sleep until a time.
    Sleep {
        /// Wake-up time.
        until: Millis,
    },
    /// Terminal: cancel pending work (queued events, timers); never run again.
    Kill,
    /// Drop the lease now so any instance may continue.
    Release,
    /// Run the pending auto action now (after a backoff, a retry delay or parking).
    Retry,
}

/// The operator commands an entity is offered, by name, in the order a console shows them.
pub const COMMANDS: [&str; 6] = ["pause", "resume", "retry", "release", "sleep", "kill"];

/// Whether operator command `name` would change anything on `e` now: `Err` says why not
/// (a console offers only those that apply, and says why the others do not). The store
/// still accepts every command on an entity that is not killed; this is what is worth
/// offering.
pub fn command_applies(name: &str, e: &EntityRow) -> Result<(), &'static str> {
    use RunStatus::*;
    let status = e.run_status;
    if status == Killed {
        return Err(if name == "kill" { "already killed" } else { "killed: it takes nothing but kill" });
    }
    match name {
        "pause" if status == Paused => Err("already paused"),
        "resume" if status == Active => Err("already active"),
        "retry" if e.auto_at.is_none() && !matches!(status, Fault | Failed) => {
            Err("no action pending in its state to run again")
        }
        "release" if e.lease_owner.is_none() => Err("no engine holds its lease"),
        "pause" | "resume" | "retry" | "release" | "sleep" | "kill" => Ok(()),
        _ => Err("not an operator command"),
    }
}

impl Command {
    /// The command's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Command::Pause => "pause",
            Command::Resume => "resume",
            Command::Sleep { .. } => "sleep",
            Command::Kill => "kill",
            Command::Release => "release",
            Command::Retry => "retry",
        }
    }
}

/// A new entity to insert.
#[derive(Debug, Clone, PartialEq)]
pub struct NewEntity {
    /// Its machine.
    pub machine: MachineName,
    /// Its key.
    pub key: EntityKey,
    /// The initial state.
    pub state: StateName,
    /// Constructor properties.
    pub properties: Properties,
    /// When its auto action is due (unstable initial state), else `None`.
    pub auto_at: Option<Millis>,
    /// The request that created it.
    pub request_id: Option<String>,
    /// The timers of its initial state.
    pub timers: Vec<TimerPlan>,
    /// Queue a change notice to itself (its initial state has subscriptions).
    pub notify_self: bool,
    /// Opens this operation (an external create); replays of its request id create nothing.
    pub operation: Option<OpenOperation>,
    /// The definition version it is created under.
    pub machine_hash: Option<String>,
    /// Health of the initial state (`ok` or `error`), for telemetry.
    pub health: &'static str,
    /// The agent task its initial state offers (its auto action is agent-bound).
    pub offer: Option<TaskOffer>,
}

/// Which entities to list.
#[derive(Debug, Clone, Default)]
pub struct EntityFilter {
    /// Only this machine.
    pub machine: Option<String>,
    /// Only this state.
    pub state: Option<String>,
    /// With `state`: entities in one of these (machine, state) pairs match too — the
    /// substates of `state` in the machines that nest it (`Machine::within`), so that
    /// listing a parent lists every entity in it.
    pub substates: Vec<(String, String)>,
    /// Only entities with id greater than this (cursor).
    pub after_id: Option<i64>,
    /// At most this many (`None`: all).
    pub limit: Option<u64>,
    /// Only this run status (its stored name, e.g. `paused`; see [`RunStatus::as_str`]).
    pub run_status: Option<String>,
    /// Only entities whose key starts with this. The page is then in (machine, key) order
    /// (byte-wise) instead of id order, and continues after `after_key`; `after_id` is
    /// ignored.
    pub key_prefix: Option<String>,
    /// With `key_prefix`: only entities after this (machine, key) (cursor).
    pub after_key: Option<(String, String)>,
    /// Only entities in one of these (machine, state) pairs (the states declared
    /// `health = "error"`, for a list of failing entities); `None`: any.
    pub pairs: Option<Vec<(String, String)>>,
    /// The page's order (without a key prefix): by id, or by when each entered its state.
    pub order: EntityOrder,
    /// With an order by entered time: only entities after this (entered at, id) in that
    /// order (cursor); `after_id` is ignored.
    pub after_entered: Option<(Millis, i64)>,
}

/// The order of a page of entities.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum EntityOrder {
    /// By id (creation order).
    #[default]
    Id,
    /// Longest in its state first: by the time it entered it, then id.
    EnteredFirst,
    /// Newest in its state first: the reverse.
    EnteredLast,
}

/// What a subscriber sees when it evaluates its subscriptions: its successors, and the
/// newest change notice in its inbox, read in one snapshot (every notice up to it is
/// covered by these successor states).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SuccessorSnapshot {
    /// The successors, by id.
    pub successors: Vec<EntityRow>,
    /// The newest change notice of the subscriber, if any.
    pub newest_notice: Option<i64>,
}

#[cfg(test)]
mod tests {
    use super::{COMMANDS, RunStatus, command_applies};
    use crate::EntityRow;

    fn entity(status: RunStatus, auto: bool, leased: bool) -> EntityRow {
        EntityRow {
            id: 1,
            machine: "m".into(),
            key: "k".into(),
            state: "s".into(),
            properties: Default::default(),
            version: 1,
            retry: 0,
            created_at: 0,
            entered_at: 0,
            auto_at: auto.then_some(5),
            due_at: None,
            lease_owner: leased.then(|| "engine-a".into()),
            lease_until: None,
            request_id: None,
            fired: Vec::new(),
            timer_at: None,
            run_status: status,
            sleep_until: None,
            recent_errors: Vec::new(),
            event_id: None,
            machine_hash: None,
        }
    }

    fn offered(e: &EntityRow) -> Vec<&'static str> {
        COMMANDS.into_iter().filter(|c| command_applies(c, e).is_ok()).collect()
    }

    #[test]
    fn only_the_commands_that_would_change_something_apply() {
        // At rest and active, nobody holding it: pause, sleep, kill.
        assert_eq!(offered(&entity(RunStatus::Active, false, false)), ["pause", "sleep", "kill"]);
        // Working (an auto action pending, leased): retry and release too.
        assert_eq!(offered(&entity(RunStatus::Active, true, true)), ["pause", "retry", "release", "sleep", "kill"]);
        // Parked: resume or retry it.
        assert_eq!(offered(&entity(RunStatus::Failed, false, false)), ["pause", "resume", "retry", "sleep", "kill"]);
        assert_eq!(offered(&entity(RunStatus::Paused, false, false)), ["resume", "sleep", "kill"]);
        assert!(offered(&entity(RunStatus::Killed, true, true)).is_empty());
        assert_eq!(command_applies("resume", &entity(RunStatus::Active, false, false)), Err("already active"));
        assert_eq!(
            command_applies("release", &entity(RunStatus::Active, false, false)),
            Err("no engine holds its lease")
        );
        assert_eq!(command_applies("kill", &entity(RunStatus::Killed, false, false)), Err("already killed"));
        assert_eq!(command_applies("jump", &entity(RunStatus::Active, false, false)), Err("not an operator command"));
    }
}
