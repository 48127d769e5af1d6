//! How an engine is tuned ([`Config`]): its lease owner name and lease length, how much it
//! holds and claims at once, its fallback poll, the supervisor's pace, retention and the
//! pace of pruning, and its clock.

use std::sync::Arc;
use std::time::Duration;

use settle_core::retention::Defaults;
use settle_store::{SharedClock, SystemClock};

/// Engine tuning. The defaults suit one process on SQLite.
#[derive(Debug, Clone)]
pub struct Config {
    /// This instance's lease owner name (unique per process).
    pub owner: String,
    /// Lease length; leases of running actions are renewed every third of it.
    pub lease: Duration,
    /// Most entities processed at once (bounds memory and concurrent actions).
    pub max_inflight: usize,
    /// Most entities claimed per batch.
    pub claim_batch: usize,
    /// Fallback poll for due work when nothing wakes the engine.
    pub poll: Duration,
    /// An operation with no progress for this long is marked `hung` by the supervisor.
    pub hung_after: Duration,
    /// How often the supervisor looks for hung operations.
    pub supervise_every: Duration,
    /// What the deployment keeps, where a machine's definition does not say
    /// (`settle_core::retention`).
    pub retention: Defaults,
    /// How often the engine looks for what retention lets go (while a round finds more, the
    /// next follows after [`Config::prune_pause`]). Zero: never on its own (`settle prune`
    /// still runs rounds). An engine that processes nothing (`max_inflight` 0) never does.
    pub prune_every: Duration,
    /// The pause between rounds of pruning while more is past its retention: the writer
    /// serves live work in between.
    pub prune_pause: Duration,
    /// Most entities one round of pruning removes (of the other kinds, ten times as many
    /// rows): small enough that a round never holds the writer long.
    pub prune_limit: usize,
    /// Where entities removed by retention are archived first (JSON Lines, rotated by
    /// size), if anywhere: every machine's, unless its definition says `[retention]
    /// archive = false`. `None`: only a machine that says `archive = true` needs one (and
    /// the engine refuses to start without it).
    pub archive: Option<crate::ArchiveConfig>,
    /// How long (real time) narrowing one page of entities by an expression or an error
    /// text may take ([`Engine::narrowed`](crate::Engine::narrowed)): beyond, it stops with
    /// [`Error::TooCostly`](crate::Error::TooCostly). Default: 2 s.
    pub narrow_budget: Duration,
    /// An engine that writes nothing (read-only commands and dry runs look through it): it
    /// stores no definition, releases no lease, claims nothing, runs no supervisor, no
    /// pruning, no bulk operation and no schedule, and refuses every write asked of it
    /// ([`Error::ReadOnly`](crate::Error::ReadOnly)); a dry run of pruning or of a deploy
    /// answers as on any engine. Default: `false`.
    pub read_only: bool,
    /// Where time comes from: the system clock, or a [`ManualClock`](settle_store::ManualClock)
    /// that tests advance. Every due time, lease, backoff, timer and sleep the engine
    /// decides is counted on it.
    pub clock: SharedClock,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            owner: format!("engine-{}", uuid::Uuid::now_v7()),
            lease: Duration::from_secs(60),
            max_inflight: 1024,
            claim_batch: 256,
            poll: Duration::from_secs(1),
            hung_after: Duration::from_secs(600),
            supervise_every: Duration::from_secs(10),
            retention: Defaults::BUILT_IN,
            prune_every: Duration::from_secs(60),
            prune_pause: Duration::from_millis(20),
            prune_limit: 200,
            archive: None,
            read_only: false,
            narrow_budget: Duration::from_secs(2),
            clock: Arc::new(SystemClock),
        }
    }
}

impl<S> crate::engine::Inner<S> {
    /// `Ok` unless the engine is read-only ([`Config::read_only`]): then `what` is refused.
    pub(crate) fn writable(&self, what: &'static str) -> crate::Result<()> {
        if self.read_only { Err(crate::Error::ReadOnly(what)) } else { Ok(()) }
    }
}
