//! Request rate limits, as token buckets on the engine's [`Clock`](settle_store::Clock)
//! (tests move it instead of sleeping; a clock that steps back refills nothing):
//!
//! - [`RateLimiter`]: per configured bearer token, refilled at `--rate-limit` requests per
//!   second with a burst of as many. A request finding its token's bucket empty is
//!   answered 429 `rate-limited` with `Retry-After` (whole seconds, at least 1) by
//!   [`crate::auth::guard`], before the handler. The buckets are fixed when the server
//!   starts, one per token, each behind its own lock: tokens do not contend.
//! - [`AuthFailures`]: per client address, the failed authentications (a bearer token that
//!   matches none), [`AUTH_FAILURES_PER_MINUTE`] in a burst and as many a minute after that.
//!   An address with none left is answered 429 `auth-throttled` with `Retry-After` on every
//!   request that presents a token, before the token is looked at, so guessing goes no
//!   faster with a right guess in the batch. IPv6 addresses count by their /64 prefix (what
//!   one host is usually given); at most [`MAX_ADDRESSES`] addresses are tracked at once.
//!
//! An open server (no tokens) is not limited: it serves loopback only, every caller is an
//! admin who could stop everything anyway, and its callers (`settle demo --agents`, `settle
//! bench agents`, the dashboard) share one address, so a per-address limit would be one
//! global throttle.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

use settle_store::SharedClock;

/// A refill rate: `n` units per `period_ms`, bursts of `n`. A bucket's level is kept in
/// ticks: a unit is `period_ms` ticks, and `n` ticks come back every millisecond.
#[derive(Debug, Clone, Copy)]
struct Rate {
    n: u64,
    period_ms: u64,
}

/// A bucket's level, in ticks of its [`Rate`] (below zero: a debt, see
/// [`RateLimiter::charge`]), and when it was last refilled.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    ticks: i64,
    at: i64,
}

impl Rate {
    fn capacity(self) -> i64 {
        i64::try_from(self.n.saturating_mul(self.period_ms)).unwrap_or(i64::MAX)
    }

    fn unit(self) -> i64 {
        i64::try_from(self.period_ms).unwrap_or(i64::MAX)
    }

    fn full(self, now: i64) -> Bucket {
        Bucket { ticks: self.capacity(), at: now }
    }

    /// Refills `b` up to `now`.
    fn refill(self, b: &mut Bucket, now: i64) {
        let elapsed = now.saturating_sub(b.at).max(0);
        let n = i64::try_from(self.n).unwrap_or(i64::MAX);
        b.ticks = b.ticks.saturating_add(elapsed.saturating_mul(n)).min(self.capacity());
        b.at = b.at.max(now);
    }

    /// Whether `b` holds a whole unit now: `Ok`, or `Err(seconds)` until it does (at least 1).
    fn has_one(self, b: &mut Bucket, now: i64) -> Result<(), u64> {
        self.refill(b, now);
        if b.ticks >= self.unit() {
            return Ok(());
        }
        let wait_ms = u64::try_from(self.unit() - b.ticks).unwrap_or(u64::MAX).div_ceil(self.n);
        Err(wait_ms.div_ceil(1000).max(1))
    }

    /// Takes one unit from `b` now: `Ok`, or `Err(seconds)` until one is back.
    fn take(self, b: &mut Bucket, now: i64) -> Result<(), u64> {
        self.has_one(b, now)?;
        b.ticks -= self.unit();
        Ok(())
    }

    /// Whether `b` has refilled completely by `now`.
    fn is_full(self, b: &Bucket, now: i64) -> bool {
        let mut b = *b;
        self.refill(&mut b, now);
        b.ticks == self.capacity()
    }
}

/// The buckets of every token; `rate` requests per second, burst `rate`; 0 is off.
#[derive(Debug)]
pub struct RateLimiter {
    rate: Rate,
    clock: SharedClock,
    buckets: Vec<Mutex<Option<Bucket>>>,
}

impl RateLimiter {
    /// Limits each of `tokens` tokens to `rate` requests per second (burst `rate`) on
    /// `clock`; `rate` 0 limits nothing.
    pub fn new(rate: u32, tokens: usize, clock: SharedClock) -> RateLimiter {
        let buckets = if rate == 0 { Vec::new() } else { (0..tokens).map(|_| Mutex::new(None)).collect() };
        RateLimiter { rate: Rate { n: u64::from(rate), period_ms: 1000 }, clock, buckets }
    }

    /// The limit, in requests per second (0: off).
    pub fn rate(&self) -> u32 {
        u32::try_from(self.rate.n).unwrap_or(u32::MAX)
    }

    /// Takes one request from the bucket of token `token` (its position in
    /// [`crate::auth::Tokens`]) now: `Ok`, or `Err(seconds)` to wait before the next request
    /// would pass (at least 1). Unknown positions and a rate of 0 pass.
    pub fn check(&self, token: usize) -> Result<(), u64> {
        let Some(bucket) = self.buckets.get(token) else { return Ok(()) };
        let now = self.clock.now_ms();
        let mut guard = bucket.lock().unwrap_or_else(PoisonError::into_inner);
        let bucket = guard.get_or_insert(self.rate.full(now));
        self.rate.take(bucket, now)
    }

    /// Charges token `token` `extra` requests more than the one its request took (a
    /// request that carries many, as a batch of reports): taken even beyond what its
    /// bucket holds, as a debt its next requests wait out. So the token's average stays at
    /// its rate, however it groups its requests.
    pub fn charge(&self, token: usize, extra: u64) {
        let Some(bucket) = self.buckets.get(token) else { return };
        let now = self.clock.now_ms();
        let mut guard = bucket.lock().unwrap_or_else(PoisonError::into_inner);
        let bucket = guard.get_or_insert(self.rate.full(now));
        self.rate.refill(bucket, now);
        let extra = i64::try_from(extra).unwrap_or(i64::MAX).saturating_mul(self.rate.unit());
        bucket.ticks = bucket.ticks.saturating_sub(extra);
    }
}

/// Failed authentications an address may make in a burst, and per minute after that.
pub const AUTH_FAILURES_PER_MINUTE: u32 = 10;

/// Most client addresses whose failures are tracked at once; beyond, new addresses share
/// one bucket until tracked ones have refilled.
pub const MAX_ADDRESSES: usize = 10_000;

/// Failed authentications per client address (see the [module](self)).
#[derive(Debug)]
pub struct AuthFailures {
    rate: Rate,
    clock: SharedClock,
    addresses: Mutex<HashMap<IpAddr, Bucket>>,
    /// How many addresses are tracked: none (the usual case) costs no lock.
    tracked: AtomicUsize,
}

impl AuthFailures {
    /// `per_minute` failures per address (in a burst, then as many a minute) on `clock`; 0
    /// limits nothing.
    pub fn new(per_minute: u32, clock: SharedClock) -> AuthFailures {
        AuthFailures {
            rate: Rate { n: u64::from(per_minute), period_ms: 60_000 },
            clock,
            addresses: Mutex::new(HashMap::new()),
            tracked: AtomicUsize::new(0),
        }
    }

    /// Failures an address may make per minute (0: off).
    pub fn per_minute(&self) -> u32 {
        u32::try_from(self.rate.n).unwrap_or(u32::MAX)
    }

    /// Whether `addr` (`None`: unknown) may try a token now: `Ok`, or `Err(seconds)` until
    /// it may.
    pub fn check(&self, addr: Option<IpAddr>) -> Result<(), u64> {
        if self.rate.n == 0 || self.tracked.load(Ordering::Relaxed) == 0 {
            return Ok(());
        }
        let now = self.clock.now_ms();
        let mut addresses = self.addresses.lock().unwrap_or_else(PoisonError::into_inner);
        let mut key = key(addr);
        // An address not tracked while the table is full is charged to the shared bucket
        // (see `failed`): it is checked against that one.
        if !addresses.contains_key(&key) && addresses.len() >= MAX_ADDRESSES {
            key = OVERFLOW;
        }
        match addresses.get_mut(&key) {
            Some(bucket) => self.rate.has_one(bucket, now),
            None => Ok(()),
        }
    }

    /// Counts a failed authentication of `addr`: `Ok`, or `Err(seconds)` when the address
    /// has no failure left (it is refused until then).
    pub fn failed(&self, addr: Option<IpAddr>) -> Result<(), u64> {
        if self.rate.n == 0 {
            return Ok(());
        }
        let now = self.clock.now_ms();
        let mut addresses = self.addresses.lock().unwrap_or_else(PoisonError::into_inner);
        let mut key = key(addr);
        if !addresses.contains_key(&key) && addresses.len() >= MAX_ADDRESSES {
            addresses.retain(|_, b| !self.rate.is_full(b, now));
            if addresses.len() >= MAX_ADDRESSES {
                key = OVERFLOW;
            }
        }
        let bucket = addresses.entry(key).or_insert_with(|| self.rate.full(now));
        let taken = self.rate.take(bucket, now);
        let left = self.rate.has_one(bucket, now);
        self.tracked.store(addresses.len(), Ordering::Relaxed);
        taken.and(left)
    }
}

/// The bucket the addresses share that the full table cannot track.
const OVERFLOW: IpAddr = IpAddr::V6(Ipv6Addr::UNSPECIFIED);

/// The address failures count against: IPv6 by its /64 prefix (IPv4-mapped ones as IPv4),
/// an unknown address as `0.0.0.0`.
fn key(addr: Option<IpAddr>) -> IpAddr {
    match addr {
        None => IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
        Some(IpAddr::V4(v4)) => IpAddr::V4(v4),
        Some(IpAddr::V6(v6)) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & !((1u128 << 64) - 1))),
        },
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
    fn a_batch_is_charged_as_its_requests_and_the_debt_waited_out() {
        let (l, clock) = limiter(20);
        assert_eq!(l.check(0), Ok(()));
        l.charge(0, 99);
        // 100 taken of a burst of 20: 80 owed, plus one for the next request, at 20/s.
        assert_eq!(l.check(0), Err(5));
        clock.advance(Duration::from_millis(4_049));
        assert!(l.check(0).is_err());
        clock.advance(Duration::from_millis(1));
        assert_eq!(l.check(0), Ok(()));
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

    fn failures(per_minute: u32) -> (AuthFailures, ManualClock) {
        let clock = ManualClock::new(1_000_000);
        (AuthFailures::new(per_minute, Arc::new(clock.clone())), clock)
    }

    #[test]
    fn a_new_address_while_the_table_is_full_is_checked_against_the_shared_bucket() {
        let (f, _clock) = failures(3);
        for i in 0..MAX_ADDRESSES as u32 {
            let addr = IpAddr::V4(std::net::Ipv4Addr::from(0x7f01_0000 + i));
            assert_eq!(f.failed(Some(addr)), Ok(()), "{addr}");
        }
        let new: IpAddr = "127.2.0.1".parse().unwrap();
        assert_eq!(f.check(Some(new)), Ok(()));
        assert_eq!(f.failed(Some(new)), Ok(()));
        assert_eq!(f.failed(Some(new)), Ok(()));
        assert_eq!(f.failed(Some(new)), Err(20));
        assert_eq!(f.check(Some(new)), Err(20), "refused: it shares the bucket it was charged to");
        let other: IpAddr = "127.2.0.2".parse().unwrap();
        assert_eq!(f.check(Some(other)), Err(20), "so is every address the table cannot track");
    }

    #[test]
    fn failed_authentications_are_slowed_per_address() {
        let (f, clock) = failures(3);
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        assert_eq!(f.check(Some(a)), Ok(()));
        assert_eq!(f.failed(Some(a)), Ok(()));
        assert_eq!(f.failed(Some(a)), Ok(()));
        // The third failure uses the last one: refused until one is back (20 s at 3/min).
        assert_eq!(f.failed(Some(a)), Err(20));
        assert_eq!(f.check(Some(a)), Err(20));
        // Another address is unaffected.
        assert_eq!(f.check(Some(b)), Ok(()));
        assert_eq!(f.failed(Some(b)), Ok(()));
        clock.advance(Duration::from_millis(19_001));
        assert_eq!(f.check(Some(a)), Err(1));
        clock.advance(Duration::from_millis(999));
        assert_eq!(f.check(Some(a)), Ok(()));
        // One failure back, used at once: refused again.
        assert_eq!(f.failed(Some(a)), Err(20));
        // Unknown addresses share one bucket.
        assert!(f.failed(None).is_ok() && f.failed(None).is_ok());
        assert!(f.failed(None).is_err() && f.check(None).is_err());
    }

    #[test]
    fn ipv6_counts_by_its_64_prefix_and_ipv4_mapped_as_ipv4() {
        let (f, _clock) = failures(1);
        let one: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let same_64: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        let other_64: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert!(f.failed(Some(one)).is_err());
        assert!(f.check(Some(same_64)).is_err());
        assert!(f.check(Some(other_64)).is_ok());
        let v4: IpAddr = "192.0.2.7".parse().unwrap();
        let mapped: IpAddr = "::ffff:192.0.2.7".parse().unwrap();
        assert!(f.failed(Some(mapped)).is_err());
        assert!(f.check(Some(v4)).is_err());
    }

    #[test]
    fn tracked_addresses_are_bounded() {
        let (f, clock) = failures(2);
        for i in 0..MAX_ADDRESSES as u32 {
            assert!(f.failed(Some(IpAddr::V4(i.into()))).is_ok());
        }
        // Full: a new address shares the overflow bucket until tracked ones refill.
        let late: IpAddr = "203.0.113.9".parse().unwrap();
        assert!(f.failed(Some(late)).is_ok());
        assert!(f.failed(Some(late)).is_err());
        assert!(
            f.check(Some("203.0.113.10".parse().unwrap())).is_err(),
            "an address the full table does not track is checked against the shared bucket it would be charged to"
        );
        clock.advance(Duration::from_secs(60));
        // Everyone has refilled: the full buckets are dropped and the new address tracked alone.
        assert!(f.failed(Some(late)).is_ok());
        assert_eq!(f.addresses.lock().unwrap().len(), 1);
        // Off.
        let (off, _) = failures(0);
        assert!((0..100).all(|_| off.failed(Some(late)).is_ok()));
    }
}
