//! How an engine is tuned ([`Config`]): its lease owner name and lease length, how much it
//! holds and claims at once, its fallback poll, the supervisor's pace, and its clock.

use std::sync::Arc;
use std::time::Duration;

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
            clock: Arc::new(SystemClock),
        }
    }
}
