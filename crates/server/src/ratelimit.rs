//! Per-token request rate limits: a token bucket per configured bearer token, refilled at
//! `--rate-limit` requests per second with a burst of as many. A request finding its
//! token's bucket empty is answered 429 `rate-limited` with `Retry-After` (whole seconds, at
//! least 1) by [`crate::auth::guard`], before the handler.
//!
//! The buckets are fixed when the server starts, one per token, each behind its own lock:
//! a request costs one short lock of its token's bucket, and tokens do not contend. Time
//! comes from the engine's [`Clock`](settle_store::Clock), so tests move it instead of
//! sleeping; a clock that steps back refills nothing.
//!
//! An open server (no tokens) is not limited: it serves loopback only, every caller is an
//! admin who could stop everything anyway, and its callers (`settle demo --agents`, `settle
//! bench agents`, the dashboard) share one address, so a per-address limit would be one
//! global throttle.

use std::sync::{Mutex, PoisonError};

use settle_store::SharedClock;

/// A bucket's level, in thousandths of a request, and when it was last refilled.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    milli: u64,
    at: i64,
}

/// The buckets of every token; `rate` requests per second, burst `rate`; 0 is off.
#[derive(Debug)]
pub struct RateLimiter {
    rate: u64,
    clock: SharedClock,
    buckets: Vec<Mutex<Option<Bucket>>>,
}

impl RateLimiter {
    /// Limits each of `tokens` tokens to `rate` requests per second (burst `rate`) on
    /// `clock`; `rate` 0 limits nothing.
    pub fn new(rate: u32, tokens: usize, clock: SharedClock) -> RateLimiter {
        let buckets = if rate == 0 { Vec::new() } else { (0..tokens).map(|_| Mutex::new(None)).collect() };
        RateLimiter { rate: u64::from(rate), clock, buckets }
    }

    /// The limit, in requests per second (0: off).
    pub fn rate(&self) -> u32 {
        u32::try_from(self.rate).unwrap_or(u32::MAX)
    }

    /// Takes one request from the bucket of token `token` (its position in
    /// [`crate::auth::Tokens`]) now: `Ok`, or `Err(seconds)` to wait before the next request
    /// would pass (at least 1). Unknown positions and a rate of 0 pass.
    pub fn check(&self, token: usize) -> Result<(), u64> {
        let Some(bucket) = self.buckets.get(token) else { return Ok(()) };
        let now = self.clock.now_ms();
        let capacity = self.rate * 1000;
        let mut guard = bucket.lock().unwrap_or_else(PoisonError::into_inner);
        let bucket = guard.get_or_insert(Bucket { milli: capacity, at: now });
        let elapsed = u64::try_from(now.saturating_sub(bucket.at)).unwrap_or(0);
        bucket.milli = bucket.milli.saturating_add(elapsed.saturating_mul(self.rate)).min(capacity);
        bucket.at = bucket.at.max(now);
        if bucket.milli >= 1000 {
            bucket.milli -= 1000;
            return Ok(());
        }
        // Refilled at `rate` thousandths per ms: the ms until a whole request is back.
        let wait_ms = (1000 - bucket.milli).div_ceil(self.rate);
        Err(wait_ms.div_ceil(1000).max(1))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use settle_store::{Clock, ManualClock};

    use super::*;

    fn limiter(rate: u32) -> (RateLimiter, ManualClock) {
        let clock = ManualClock::new(1_000_000);
        (RateLimiter::new(rate, 2, Arc::new(clock.clone())), clock)
    }

    #[test]
    fn a_burst_of_rate_passes_then_refills_at_rate() {
        let (l, clock) = limiter(5);
        for _ in 0..5 {
            assert_eq!(l.check(0), Ok(()));
        }
        assert_eq!(l.check(0), Err(1));
        // 200 ms refills one request at 5/s.
        clock.advance(Duration::from_millis(199));
        assert_eq!(l.check(0), Err(1));
        clock.advance(Duration::from_millis(1));
        assert_eq!(l.check(0), Ok(()));
        assert_eq!(l.check(0), Err(1));
        // A long pause refills the burst, no more.
        clock.advance(Duration::from_secs(60));
        for _ in 0..5 {
            assert_eq!(l.check(0), Ok(()));
        }
        assert!(l.check(0).is_err());
    }

    #[test]
    fn tokens_have_their_own_buckets() {
        let (l, _clock) = limiter(2);
        assert!(l.check(0).is_ok() && l.check(0).is_ok() && l.check(0).is_err());
        assert!(l.check(1).is_ok() && l.check(1).is_ok() && l.check(1).is_err());
        // Beyond the configured tokens: not limited.
        assert!((0..10).all(|_| l.check(2).is_ok()));
    }

    #[test]
    fn retry_after_is_whole_seconds_and_at_least_one() {
        let (l, clock) = limiter(1);
        assert_eq!(l.check(0), Ok(()));
        assert_eq!(l.check(0), Err(1));
        clock.advance(Duration::from_millis(999));
        assert_eq!(l.check(0), Err(1));
        clock.advance(Duration::from_millis(1));
        assert_eq!(l.check(0), Ok(()));
        let (fast, _) = limiter(1000);
        for _ in 0..1000 {
            assert!(fast.check(0).is_ok());
        }
        assert_eq!(fast.check(0), Err(1));
    }

    #[test]
    fn zero_is_off_and_a_clock_stepping_back_refills_nothing() {
        let (off, _) = limiter(0);
        assert!((0..10_000).all(|_| off.check(0).is_ok()));
        let (l, clock) = limiter(1);
        clock.advance(Duration::from_secs(10));
        assert!(l.check(0).is_ok());
        clock.set(clock.now_ms() - 5_000);
        assert_eq!(l.check(0), Err(1));
        // Time counts again from the latest instant seen.
        clock.set(clock.now_ms() + 5_999);
        assert_eq!(l.check(0), Err(1));
        clock.advance(Duration::from_millis(1));
        assert_eq!(l.check(0), Ok(()));
    }
}
