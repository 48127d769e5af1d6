//! Fault policies (DESIGN §4): what happens to an entity whose action fails.
//!
//! An action that returns an error or panics is a fault. The machine's [`FaultPolicy`]
//! turns it into a [`FaultDecision`]: sleep for an exponential backoff and try again, or,
//! when too many errors fell within the policy's window, park the entity as `failed` for an
//! operator. The decision is a pure function of the entity's recent error times and "now",
//! both given by the caller, who stores the updated error list with the entity.
//!
//! ```
//! use std::time::Duration;
//! use settle_core::{FaultDecision, FaultPolicy};
//! let policy = FaultPolicy::default(); // 8 errors within 4h park; backoff 1s..10min
//! let (decision, errors) = policy.decide(&[], 1_000);
//! assert_eq!(decision, FaultDecision::Backoff(Duration::from_secs(1)));
//! let (decision, errors) = policy.decide(&errors, 2_000);
//! assert_eq!(decision, FaultDecision::Backoff(Duration::from_secs(2)));
//! assert_eq!(errors, [1_000, 2_000]);
//! ```

use std::time::Duration;

/// How errors of one machine's entities turn into sleeps or parking. Declared in TOML as
/// `[fault]` (every key optional):
///
/// ```toml
/// [fault]
/// max_errors = 8
/// window = "4h"
/// backoff = { min = "1s", max = "10m" }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FaultPolicy {
    /// The entity is parked when this many errors fall within [`window`](Self::window).
    /// A valid policy has at least 1.
    pub max_errors: u32,
    /// How far back errors count. A valid policy's window is not zero.
    pub window: Duration,
    /// The backoff after the first error within the window; it doubles with each further
    /// error. A valid policy's minimum is not zero.
    pub backoff_min: Duration,
    /// The longest backoff. A valid policy's maximum is at least its minimum.
    pub backoff_max: Duration,
}

impl FaultPolicy {
    /// The policy of a machine that declares none: 8 errors within 4 hours park the
    /// entity; otherwise back off exponentially from 1 second to 10 minutes.
    pub const DEFAULT: FaultPolicy = FaultPolicy {
        max_errors: 8,
        window: Duration::from_secs(4 * 3600),
        backoff_min: Duration::from_secs(1),
        backoff_max: Duration::from_secs(600),
    };

    /// Decides what a new error at `now_ms` (milliseconds, on the caller's clock) means for
    /// an entity whose previous errors happened at `recent_errors_ms` (in any order).
    ///
    /// The new error is added to the list; errors older than `now_ms - window` are dropped
    /// (one exactly `window` old still counts), and only the `max_errors` newest are kept.
    /// If as many errors as `max_errors` remain, the entity is parked
    /// ([`FaultDecision::Park`]); otherwise it sleeps for [`backoff`](Self::backoff) of
    /// their count. Returns the decision and the updated list, oldest first, to store with
    /// the entity for the next call. A `max_errors` of zero (invalid) behaves as 1.
    ///
    /// ```
    /// use std::time::Duration;
    /// use settle_core::{FaultDecision, FaultPolicy};
    /// let policy = FaultPolicy { max_errors: 3, window: Duration::from_secs(60), ..FaultPolicy::DEFAULT };
    /// // The error at 0 is more than a minute old at 70s: it no longer counts.
    /// let (decision, errors) = policy.decide(&[0, 30_000], 70_000);
    /// assert_eq!((decision, errors), (FaultDecision::Backoff(Duration::from_secs(2)), vec![30_000, 70_000]));
    /// // A third error within the minute parks the entity.
    /// let (decision, _) = policy.decide(&[30_000, 70_000], 80_000);
    /// assert_eq!(decision, FaultDecision::Park);
    /// ```
    pub fn decide(&self, recent_errors_ms: &[i64], now_ms: i64) -> (FaultDecision, Vec<i64>) {
        let window_ms = i64::try_from(self.window.as_millis()).unwrap_or(i64::MAX);
        let since = now_ms.saturating_sub(window_ms);
        let mut errors: Vec<i64> = recent_errors_ms.iter().copied().filter(|&t| t >= since).chain([now_ms]).collect();
        errors.sort_unstable();
        let keep = usize::try_from(self.max_errors.max(1)).unwrap_or(usize::MAX);
        if errors.len() > keep {
            errors.drain(..errors.len() - keep);
        }
        let count = u32::try_from(errors.len()).unwrap_or(u32::MAX);
        let decision =
            if count >= self.max_errors { FaultDecision::Park } else { FaultDecision::Backoff(self.backoff(count)) };
        (decision, errors)
    }

    /// The backoff after the `errors`-th error within the window: `backoff_min` doubled
    /// `errors - 1` times, capped at `backoff_max` (`errors` of 0 counts as 1).
    ///
    /// ```
    /// use std::time::Duration;
    /// let policy = settle_core::FaultPolicy::default();
    /// assert_eq!(policy.backoff(1), Duration::from_secs(1));
    /// assert_eq!(policy.backoff(4), Duration::from_secs(8));
    /// assert_eq!(policy.backoff(11), Duration::from_secs(600)); // 1024s, capped at 10min
    /// ```
    pub fn backoff(&self, errors: u32) -> Duration {
        2u32.checked_pow(errors.saturating_sub(1))
            .and_then(|factor| self.backoff_min.checked_mul(factor))
            .map_or(self.backoff_max, |d| d.min(self.backoff_max))
    }
}

impl Default for FaultPolicy {
    /// [`FaultPolicy::DEFAULT`].
    fn default() -> Self {
        FaultPolicy::DEFAULT
    }
}

/// What to do with an entity after an error ([`FaultPolicy::decide`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FaultDecision {
    /// Too many errors within the window: park the entity as `failed` for an operator.
    Park,
    /// Sleep this long, then try again.
    Backoff(Duration),
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i64 = 1_000;
    const H: i64 = 3_600 * S;

    fn secs(s: u64) -> FaultDecision {
        FaultDecision::Backoff(Duration::from_secs(s))
    }

    #[test]
    fn default_is_eight_errors_within_four_hours_backoff_one_second_to_ten_minutes() {
        assert_eq!(
            FaultPolicy::default(),
            FaultPolicy {
                max_errors: 8,
                window: Duration::from_secs(14_400),
                backoff_min: Duration::from_secs(1),
                backoff_max: Duration::from_secs(600),
            }
        );
    }

    #[test]
    fn backs_off_exponentially_then_parks_at_max_errors() {
        let policy = FaultPolicy::default();
        let mut errors = Vec::new();
        let mut decisions = Vec::new();
        for i in 0..8 {
            let (decision, next) = policy.decide(&errors, i * 60 * S);
            decisions.push(decision);
            errors = next;
        }
        assert_eq!(decisions, [secs(1), secs(2), secs(4), secs(8), secs(16), secs(32), secs(64), FaultDecision::Park]);
        assert_eq!(errors, (0..8).map(|i| i * 60 * S).collect::<Vec<_>>());
    }

    #[test]
    fn backoff_is_capped_at_max() {
        let policy = FaultPolicy { max_errors: 100, ..FaultPolicy::default() };
        let errors: Vec<i64> = (0..12).collect();
        assert_eq!(policy.decide(&errors, 12).0, secs(600));
        // Doubling that overflows is capped too.
        assert_eq!(policy.backoff(40), Duration::from_secs(600));
        assert_eq!(policy.backoff(u32::MAX), Duration::from_secs(600));
        assert_eq!(policy.backoff(0), Duration::from_secs(1));
    }

    #[test]
    fn errors_outside_the_window_are_dropped() {
        let policy = FaultPolicy::default();
        let now = 10 * H;
        // Exactly 4h old still counts; older does not.
        let (decision, errors) = policy.decide(&[now - 4 * H - 1, now - 4 * H, now - H], now);
        assert_eq!((decision, errors), (secs(4), vec![now - 4 * H, now - H, now]));
        // Seven old errors and a new one long after: a fresh start.
        let old: Vec<i64> = (0..7).collect();
        assert_eq!(policy.decide(&old, 5 * H), (secs(1), vec![5 * H]));
    }

    #[test]
    fn keeps_at_most_max_errors_newest_in_order() {
        let policy = FaultPolicy { max_errors: 3, ..FaultPolicy::default() };
        let (decision, errors) = policy.decide(&[50, 10, 40, 20, 30], 60);
        assert_eq!((decision, errors), (FaultDecision::Park, vec![40, 50, 60]));
    }

    #[test]
    fn one_error_parks_when_max_errors_is_one_or_zero() {
        for max_errors in [0, 1] {
            let policy = FaultPolicy { max_errors, ..FaultPolicy::default() };
            assert_eq!(policy.decide(&[], 5), (FaultDecision::Park, vec![5]));
        }
    }

    #[test]
    fn extreme_times_do_not_overflow() {
        let policy = FaultPolicy { window: Duration::MAX, ..FaultPolicy::default() };
        assert_eq!(policy.decide(&[i64::MIN], i64::MIN + 1), (secs(2), vec![i64::MIN, i64::MIN + 1]));
        let policy = FaultPolicy::default();
        assert_eq!(policy.decide(&[i64::MAX - 1], i64::MAX), (secs(2), vec![i64::MAX - 1, i64::MAX]));
    }
}
