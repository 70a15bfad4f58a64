//! [`LockOptions`]: how one acquisition behaves.

use crate::error::LockError;
use crate::lease::{HoldLimits, MIN_TTL, check_duration};
use std::time::Duration;

/// How one acquisition behaves: lease length, how long to wait, renewal,
/// fencing.
///
/// ```
/// use lock_core::LockOptions;
/// use std::time::Duration;
///
/// let opts = LockOptions::new(Duration::from_secs(30))
///     .wait(Duration::from_secs(2))
///     .renew(true)
///     .fencing(true);
/// assert_eq!(opts.ttl(), Duration::from_secs(30));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockOptions {
    pub(crate) ttl: Duration,
    pub(crate) wait: Option<Duration>,
    pub(crate) renew: bool,
    pub(crate) fencing: bool,
    pub(crate) holds: HoldLimits,
    pub(crate) mode: Mode,
    pub(crate) label: &'static str,
}

/// How many holders a key admits at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// One holder (the default).
    Exclusive,
    /// Any number of shared holders, and no exclusive one meanwhile.
    Shared,
    /// At most this many holders.
    Permits(u32),
}

impl LockOptions {
    /// A lease of `ttl`, renewed while held, waiting as long as the client's
    /// default wait, without a fencing token.
    pub fn new(ttl: Duration) -> LockOptions {
        LockOptions {
            ttl,
            wait: None,
            renew: true,
            fencing: false,
            holds: HoldLimits::default(),
            mode: Mode::Exclusive,
            label: LockOptions::UNLABELLED,
        }
    }

    /// The `template` label of a lock taken without [`label`](Self::label).
    pub const UNLABELLED: &'static str = crate::observe::UNLABELLED;

    /// The `template` label of this lock's metrics (with lock-core's
    /// `metrics` feature; see the crate docs): the `held` and `waiting`
    /// gauges and the wait and hold histograms. Name the kind of lock, not
    /// the lock: `"order:{id}"` or `"nightly-report"`, never a rendered
    /// key like `"order:42"`, which would make one series per order. Without
    /// it the label is [`UNLABELLED`](Self::UNLABELLED). The attribute sets
    /// its key template.
    ///
    /// ```
    /// use lock_core::LockOptions;
    /// use std::time::Duration;
    ///
    /// let opts = LockOptions::new(Duration::from_secs(30)).label("order:{id}");
    /// assert_eq!(opts.metrics_label(), "order:{id}");
    /// ```
    pub fn label(mut self, label: &'static str) -> LockOptions {
        self.label = label;
        self
    }

    /// The `template` label of this lock's metrics (see [`label`](Self::label)).
    pub fn metrics_label(&self) -> &'static str {
        self.label
    }

    /// How long [`LockClient::lock_with`](crate::LockClient::lock_with) may wait for the lock.
    /// `Duration::ZERO` makes exactly one attempt.
    pub fn wait(mut self, wait: Duration) -> LockOptions {
        self.wait = Some(wait);
        self
    }

    /// Whether a heartbeat renews the lease every ttl/3 while the guard lives
    /// (default `true`). Without renewal the lock simply expires after `ttl`
    /// and the guard reports it lost from then on.
    pub fn renew(mut self, renew: bool) -> LockOptions {
        self.renew = renew;
        self
    }

    /// Whether to take a fencing token: a number that grows with every
    /// successive holder of the key, for the protected resource to check
    /// (default `false`). It costs a counter key beside the lock key, kept
    /// for a day (or ten ttls, when longer) after the last fenced
    /// acquisition; a counter that expired starts again from the server's
    /// clock in microseconds, above every token the old one gave.
    pub fn fencing(mut self, fencing: bool) -> LockOptions {
        self.fencing = fencing;
        self
    }

    /// Keep the lock at least this long after it was acquired, even when the
    /// guard is released sooner: the release then shortens the lease to what
    /// is left instead of deleting it. For scheduled jobs: a run that
    /// finishes fast must not let another replica run the same tick.
    pub fn min_hold(mut self, min_hold: Duration) -> LockOptions {
        self.holds.min = Some(min_hold);
        self
    }

    /// Hold the lock at most this long: renewal stops then and the lock is
    /// reported lost, so a runaway holder cannot keep it forever. At least
    /// the ttl.
    pub fn max_hold(mut self, max_hold: Duration) -> LockOptions {
        self.holds.max = Some(max_hold);
        self
    }

    /// A shared lock (`true`) instead of an exclusive one: any number of
    /// shared holders at once, and none while an exclusive holder holds the
    /// key. Once an exclusive waiter is waiting for the key, new shared
    /// holders wait behind it, so a stream of readers cannot starve a
    /// writer. Each shared holder has its own token and expiry: a crashed
    /// one's hold runs out by itself. Not on Redlock. Replaces
    /// [`permits`](Self::permits).
    pub fn shared(mut self, shared: bool) -> LockOptions {
        self.mode = if shared {
            Mode::Shared
        } else {
            Mode::Exclusive
        };
        self
    }

    /// At most `permits` holders of the key at once, across every client
    /// (a semaphore whose permits expire with their holders' leases). Every
    /// holder of a key must ask for the same number: one asking with
    /// another gets [`ErrorKind::Config`](crate::ErrorKind::Config). `permits(1)` is a
    /// lock that another holder with `permits(1)` excludes, stored like
    /// any other permits. Not on Redlock. Replaces
    /// [`shared`](Self::shared).
    pub fn permits(mut self, permits: u32) -> LockOptions {
        self.mode = Mode::Permits(permits);
        self
    }

    /// Whether the lock is shared.
    pub fn is_shared(&self) -> bool {
        self.mode == Mode::Shared
    }

    /// The number of permits, for a lock taken with [`permits`](Self::permits).
    pub fn permit_count(&self) -> Option<u32> {
        match self.mode {
            Mode::Permits(n) => Some(n),
            _ => None,
        }
    }

    /// Checks every duration; returns the wait, `default_wait` when none
    /// was set.
    pub(crate) fn check(&self, default_wait: Duration) -> Result<Duration, LockError> {
        let wait = self.wait.unwrap_or(default_wait);
        let checked = check_duration("ttl", self.ttl, MIN_TTL)
            .and_then(|()| check_duration("wait", wait, Duration::ZERO))
            .and_then(|()| self.holds.check(self.ttl));
        checked.map_err(LockError::in_options)?;
        if self.mode == Mode::Permits(0) {
            return Err(LockError::options("permits must be at least 1"));
        }
        Ok(wait)
    }

    /// The lease length.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The wait, when set; otherwise the client's default applies.
    pub fn wait_time(&self) -> Option<Duration> {
        self.wait
    }

    /// Whether the lease is renewed.
    pub fn renews(&self) -> bool {
        self.renew
    }

    /// Whether a fencing token is taken.
    pub fn fences(&self) -> bool {
        self.fencing
    }
}
