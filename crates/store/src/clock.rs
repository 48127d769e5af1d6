//! Time, as everything above the pure core reads it.
//!
//! The engine, the server and the binary never read the system clock themselves: they ask
//! a [`Clock`]. Production uses [`SystemClock`]; tests use a [`ManualClock`] and move time
//! forward with [`ManualClock::advance`], so that timers, backoff, leases, sleeps and hung
//! operations are tested by advancing time rather than by waiting for it.
//!
//! The store itself reads no clock: every batch carries the time it is written at
//! ([`crate::Batch::now`]).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use tokio::sync::Notify;

use crate::Millis;

/// A future that resolves when a clock reaches a time.
pub type Sleep = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Where the time comes from.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// Now, in milliseconds since the Unix epoch.
    fn now_ms(&self) -> Millis;
    /// Resolves once [`now_ms`](Clock::now_ms) is at or past `at`.
    fn sleep_until(&self, at: Millis) -> Sleep;
}

/// A shared clock, as the engine and the server hold it.
pub type SharedClock = Arc<dyn Clock>;

/// The system's wall clock, with tokio's timers for sleeping.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> Millis {
        now_ms()
    }
    fn sleep_until(&self, at: Millis) -> Sleep {
        let wait = Duration::from_millis((at - now_ms()).max(0) as u64);
        Box::pin(tokio::time::sleep(wait))
    }
}

/// The wall clock in milliseconds since the Unix epoch: the one place that reads it.
/// Prefer a [`Clock`] where one is at hand.
pub fn now_ms() -> Millis {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// A clock that moves only when told to: for tests and simulations. Clones share the time.
///
/// ```
/// use std::time::Duration;
/// use settle_store::clock::{Clock, ManualClock};
/// let clock = ManualClock::new(1_000);
/// clock.advance(Duration::from_secs(2));
/// assert_eq!(clock.now_ms(), 3_000);
/// ```
#[derive(Debug, Clone)]
pub struct ManualClock {
    inner: Arc<Manual>,
}

#[derive(Debug)]
struct Manual {
    now: AtomicI64,
    moved: Notify,
}

impl ManualClock {
    /// A clock standing at `start` (ms since the epoch).
    pub fn new(start: Millis) -> Self {
        ManualClock { inner: Arc::new(Manual { now: AtomicI64::new(start), moved: Notify::new() }) }
    }
    /// A clock standing at the system's time now.
    pub fn starting_now() -> Self {
        ManualClock::new(now_ms())
    }
    /// Moves time forward by `by`, waking every sleeper whose time has come.
    pub fn advance(&self, by: Duration) {
        self.inner.now.fetch_add(by.as_millis() as i64, Ordering::SeqCst);
        self.inner.moved.notify_waiters();
    }
    /// Moves time forward to `at`; does nothing if the clock is already there or later.
    pub fn advance_to(&self, at: Millis) {
        if self.inner.now.fetch_max(at, Ordering::SeqCst) < at {
            self.inner.moved.notify_waiters();
        }
    }
    /// Sets the time to `at` (backwards too: a clock jump), waking every sleeper whose time
    /// has come.
    pub fn set(&self, at: Millis) {
        self.inner.now.store(at, Ordering::SeqCst);
        self.inner.moved.notify_waiters();
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> Millis {
        self.inner.now.load(Ordering::SeqCst)
    }
    fn sleep_until(&self, at: Millis) -> Sleep {
        let inner = self.inner.clone();
        Box::pin(async move {
            loop {
                // Registered before the check: an advance in between still wakes us.
                let moved = inner.moved.notified();
                tokio::pin!(moved);
                moved.as_mut().enable();
                if inner.now.load(Ordering::SeqCst) >= at {
                    return;
                }
                moved.await;
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_manual_sleep_ends_when_time_is_advanced_past_it() {
        let clock = ManualClock::new(0);
        let sleeper = tokio::spawn(clock.sleep_until(100));
        tokio::task::yield_now().await;
        clock.advance(Duration::from_millis(99));
        tokio::task::yield_now().await;
        assert!(!sleeper.is_finished(), "not yet due");
        clock.advance(Duration::from_millis(1));
        sleeper.await.unwrap();
        clock.sleep_until(50).await; // already past: at once
    }

    #[test]
    fn the_system_clock_reads_the_wall_clock() {
        let before = now_ms();
        let read = SystemClock.now_ms();
        assert!(read >= before && read < before + 60_000);
    }
}
