//! Reports read back from the telemetry tables: key performance indicators ([`Stats`]) and
//! the counters and gauges of a metrics exposition ([`MetricsSnapshot`]).

use crate::RunStatus;

/// Key performance indicators read back from the telemetry tables (see [`crate::Store::stats`]).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Stats {
    /// Per operation name, by name.
    pub operations: Vec<OperationStats>,
    /// Per machine transition (machine, start state, end state), in that order.
    pub transitions: Vec<TransitionStats>,
    /// The most frequent errors (kind and details), most frequent first.
    pub top_errors: Vec<ErrorStats>,
}

/// Statistics of the operations with one name.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct OperationStats {
    /// The operation name, e.g. `server.create`.
    pub name: String,
    /// Operations started.
    pub count: u64,
    /// Of those, ended (with any outcome).
    pub ended: u64,
    /// Of those, ended with `success`.
    pub success: u64,
    /// `success / ended`, or 0 when none ended.
    pub success_rate: f64,
    /// Median duration (end − start) of the ended ones, in ms (nearest rank; 0 when none).
    pub p50_ms: i64,
    /// 99th percentile duration of the ended ones, in ms (nearest rank; 0 when none).
    pub p99_ms: i64,
}

/// Statistics of one transition of one machine.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TransitionStats {
    /// The machine.
    pub machine: String,
    /// The state left (`None`: the entity was created).
    pub from: Option<String>,
    /// The state entered.
    pub to: String,
    /// How many times it happened.
    pub count: u64,
    /// Share of them with outcome `error`, in [0, 1].
    pub error_rate: f64,
    /// Mean retry count of the entries.
    pub mean_retries: f64,
}

/// How often one error occurred.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ErrorStats {
    /// action_error | panic | refused | commit_failed.
    pub kind: String,
    /// What went wrong.
    pub details: String,
    /// Occurrences.
    pub count: u64,
}

/// Counters and gauges for a metrics exposition (Prometheus), read in one snapshot (see
/// [`crate::Store::metrics_snapshot`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MetricsSnapshot {
    /// Transitions ever made, per machine, start state (`None`: creation) and end state.
    pub transitions: Vec<TransitionCount>,
    /// Events rejected.
    pub events_rejected: u64,
    /// Errors recorded (faults of actions and commits; not failures, entries into
    /// error-health states).
    pub faults: u64,
    /// Entities parked for an operator (run status `failed`).
    pub parked: u64,
    /// Entities per machine, state and run status.
    pub entities: Vec<EntityCount>,
    /// Entities whose due time has passed: work waiting to be claimed.
    pub due_backlog: u64,
    /// Operations per outcome; unfinished ones without an outcome count as `open`.
    pub operations: Vec<(String, u64)>,
    /// Open agent tasks per queue and status (`ready`: waiting for an agent, `leased`).
    pub tasks: Vec<(String, String, u64)>,
}

/// What a fleet overview shows, read from the counts the commits keep (never by
/// scanning entities or telemetry; see [`crate::Store::overview`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Overview {
    /// Entities per machine, state and run status (only those with entities), ordered.
    pub entities: Vec<EntityCount>,
    /// Entities whose due time has passed: work waiting to be claimed.
    pub due_backlog: u64,
    /// Operations per outcome; unfinished ones count as `open`. Ordered by outcome.
    pub operations: Vec<(String, u64)>,
    /// Open agent tasks per queue and status (`ready`, `leased`).
    pub tasks: Vec<(String, String, u64)>,
    /// Transitions and errors per minute since the time asked for, oldest first; minutes
    /// with neither are left out.
    pub minutes: Vec<MinuteCount>,
}

impl Overview {
    /// The overview of these counts and minutes (each store reads them its own way).
    pub(crate) fn new(
        entities: Vec<EntityCount>,
        due_backlog: u64,
        operations: Vec<(String, u64)>,
        tasks: Vec<(String, String, u64)>,
        minutes: Vec<MinuteCount>,
    ) -> Overview {
        Overview { entities, due_backlog, operations, tasks, minutes }
    }
}

/// Transitions and errors in one minute.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MinuteCount {
    /// The minute's start (ms since the epoch, a multiple of 60,000).
    pub minute: crate::Millis,
    /// State entries recorded in it.
    pub transitions: u64,
    /// Errors recorded in it (faults of actions and commits).
    pub errors: u64,
}

/// How many times one transition happened.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TransitionCount {
    /// The machine.
    pub machine: String,
    /// The state left (`None`: the entity was created).
    pub from: Option<String>,
    /// The state entered.
    pub to: String,
    /// How many times.
    pub count: u64,
}

/// How many entities are in one state with one run status.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EntityCount {
    /// The machine.
    pub machine: String,
    /// The state.
    pub state: String,
    /// The run status.
    pub run_status: RunStatus,
    /// How many.
    pub count: u64,
}

/// The value at quantile `q` (in [0, 1]) of ascending `sorted` values by nearest rank:
/// index `round((n − 1) · q)`; 0 when empty.
pub fn percentile(sorted: &[i64], q: f64) -> i64 {
    if sorted.is_empty() {
        return 0;
    }
    let idx = ((sorted.len() as f64 - 1.0) * q.clamp(0.0, 1.0)).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}
