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
    fn zero_base_never_spins() {
        let b = Backoff::new(Duration::ZERO, Duration::ZERO);
        assert!(b.delay(0) >= FLOOR);
    }
}
