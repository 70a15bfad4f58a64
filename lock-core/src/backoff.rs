//! The retry policy for acquisitions: exponential backoff with full jitter.

use rand::RngExt;
use std::time::Duration;

/// Exponential backoff with full jitter: attempt `n` sleeps a uniformly random
/// time in `[0, min(cap, base * 2^n)]`.
///
/// Randomness spreads contenders apart so they do not retry in lock-step; the
/// cap keeps a waiter from sleeping through most of a short wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
}

/// The shortest sleep between attempts, so a waiter never spins.
const FLOOR: Duration = Duration::from_micros(500);

/// The longest sleep between attempts while another library holds the
/// key: its release publishes nothing, so only an attempt notices it.
/// Sleeps are drawn from `[FOREIGN_CAP / 2, FOREIGN_CAP]` (about 67
/// attempts a second, a release noticed about 8 ms later on average),
/// where a lock-core holder's waiters sleep up to the cap (200 ms by
/// default) and are woken by its release message.
pub(crate) const FOREIGN_CAP: Duration = Duration::from_millis(20);

impl Backoff {
    /// A policy starting at `base` and never sleeping longer than `cap`.
    pub const fn new(base: Duration, cap: Duration) -> Backoff {
        Backoff { base, cap }
    }

    /// The first delay bound.
    pub fn base(&self) -> Duration {
        self.base
    }

    /// The longest delay.
    pub fn cap(&self) -> Duration {
        self.cap
    }

    /// The upper bound of the sleep after failed attempt number `attempt`
    /// (0-based).
    pub(crate) fn ceiling(&self, attempt: u32) -> Duration {
        let factor = 1u32.checked_shl(attempt.min(31)).unwrap_or(u32::MAX);
        self.base.saturating_mul(factor).min(self.cap).max(FLOOR)
    }

    /// A random sleep for failed attempt number `attempt`.
    pub(crate) fn delay(&self, attempt: u32) -> Duration {
        let ceiling = self.ceiling(attempt);
        let nanos = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
        let floor = u64::try_from(FLOOR.as_nanos()).unwrap_or(0);
        Duration::from_nanos(rand::rng().random_range(floor.min(nanos)..=nanos))
    }

    /// A random sleep for failed attempt number `attempt` when another
    /// library holds the key: [`delay`](Self::delay), but never above a
    /// draw from `[FOREIGN_CAP / 2, FOREIGN_CAP]` (half of it at least, so
    /// that the polling stays about as frequent as the cap says).
    pub(crate) fn foreign_delay(&self, attempt: u32) -> Duration {
        let cap = u64::try_from(FOREIGN_CAP.as_nanos()).unwrap_or(u64::MAX);
        let short = Duration::from_nanos(rand::rng().random_range(cap / 2..=cap));
        self.delay(attempt).min(short)
    }
}

impl Default for Backoff {
    /// 10 ms doubling up to 200 ms.
    fn default() -> Backoff {
        Backoff::new(Duration::from_millis(10), Duration::from_millis(200))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceiling_doubles_then_caps() {
        let b = Backoff::new(Duration::from_millis(10), Duration::from_millis(200));
        assert_eq!(b.ceiling(0), Duration::from_millis(10));
        assert_eq!(b.ceiling(1), Duration::from_millis(20));
        assert_eq!(b.ceiling(4), Duration::from_millis(160));
        assert_eq!(b.ceiling(5), Duration::from_millis(200));
        assert_eq!(b.ceiling(1000), Duration::from_millis(200));
    }

    #[test]
    fn delays_stay_inside_the_bounds_and_vary() {
        let b = Backoff::default();
        let delays: Vec<_> = (0..200).map(|_| b.delay(3)).collect();
        assert!(delays.iter().all(|d| *d >= FLOOR && *d <= b.ceiling(3)));
        let distinct: std::collections::HashSet<_> = delays.iter().collect();
        assert!(distinct.len() > 100, "jitter should spread delays");
    }

    #[test]
    fn foreign_delays_stay_under_their_cap_and_vary() {
        let b = Backoff::new(Duration::from_secs(5), Duration::from_secs(5));
        let delays: Vec<_> = (0..200).map(|_| b.foreign_delay(3)).collect();
        assert!(delays.iter().all(|d| *d >= FLOOR && *d <= FOREIGN_CAP));
        let distinct: std::collections::HashSet<_> = delays.iter().collect();
        assert!(distinct.len() > 100, "jitter should spread delays");
        // A policy shorter than the foreign cap is kept.
        let quick = Backoff::new(Duration::from_millis(1), Duration::from_millis(2));
        assert!((0..50).all(|_| quick.foreign_delay(9) <= Duration::from_millis(2)));
    }

    #[test]
    fn zero_base_never_spins() {
        let b = Backoff::new(Duration::ZERO, Duration::ZERO);
        assert!(b.delay(0) >= FLOOR);
    }
}
