//! What a held lock is: its token, ttl and validity deadline, and the
//! limits every lease keeps.

use crate::error::LockError;
use crate::observe;
use crate::token::Token;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

/// Why a held lock was lost ([`LockGuard::loss_reason`](crate::LockGuard::loss_reason)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LossReason {
    /// A renewal or an extension found the key gone or held by another
    /// owner: the lease expired on the server (a pause, a cut-off) and may
    /// have been taken since.
    TakenOver,
    /// The validity deadline passed without a successful renewal: Redis
    /// did not answer in time, so the lease cannot be trusted any more.
    Expired,
    /// `max_hold` was reached.
    MaxHold,
    /// An operator broke the lock ([`LockClient::force_release`](crate::LockClient::force_release),
    /// `lockctl release`); the holder found out at its next renewal.
    ForceReleased,
}

impl LossReason {
    /// The reason, in words, for logs.
    pub(crate) fn text(self) -> &'static str {
        match self {
            LossReason::TakenOver => "a renewal found the lock taken over or expired",
            LossReason::Expired => "the validity deadline passed without a successful renewal",
            LossReason::MaxHold => "max_hold reached",
            LossReason::ForceReleased => "an operator force-released the lock",
        }
    }
}

/// The longest key accepted, prefix included.
pub const MAX_KEY_LEN: usize = 1024;

/// The shortest ttl accepted: a renewal every ttl/3 must have a chance to
/// finish a round trip.
pub const MIN_TTL: Duration = Duration::from_millis(10);

/// The longest ttl or wait accepted (24 hours): anything longer is a unit
/// mistake.
pub const MAX_DURATION: Duration = Duration::from_secs(24 * 60 * 60);

/// How long a fence counter is kept after the last fenced acquisition of
/// its lock: a day, or ten ttls when that is longer. Past it the counter
/// expires, and the next token starts from the server's clock (in
/// microseconds), above every token it gave as long as that clock has not
/// stepped back by more than this.
pub(crate) fn fence_retention(ttl: Duration) -> Duration {
    (ttl.saturating_mul(10)).max(Duration::from_secs(24 * 60 * 60))
}

/// When a lease of `ttl` acquired or renewed at `from` is due for
/// renewal: a third of its ttl later (as Redisson's watchdog and most lock
/// libraries do), which leaves two more tries before it expires.
pub(crate) fn renewal_due(from: Instant, ttl: Duration) -> Instant {
    from + ttl / 3
}

/// The clock drift allowed for a lease of `ttl`: 1 % plus 2 ms, as in the
/// Redlock reference. The local validity deadline ends this much before the
/// server's expiry.
pub(crate) fn drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

/// How long a holder keeps a lock at least and at most (`min_hold`,
/// `max_hold`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct HoldLimits {
    pub(crate) min: Option<Duration>,
    pub(crate) max: Option<Duration>,
}

impl HoldLimits {
    pub(crate) fn check(&self, ttl: Duration) -> Result<(), LockError> {
        if let Some(max) = self.max
            && max < ttl
        {
            return Err(LockError::config(format!(
                "max_hold {max:?} is shorter than the ttl {ttl:?}"
            )));
        }
        if let (Some(min), Some(max)) = (self.min, self.max)
            && min > max
        {
            return Err(LockError::config(format!(
                "min_hold {min:?} is longer than max_hold {max:?}"
            )));
        }
        for (what, hold) in [("min_hold", self.min), ("max_hold", self.max)] {
            if hold.is_some_and(|h| h > MAX_DURATION) {
                return Err(LockError::config(format!(
                    "{what} is longer than 24h; check the unit"
                )));
            }
        }
        Ok(())
    }
}

/// Which keys a lease holds, and how.
pub(crate) enum Scope {
    /// One key, exclusively: the lease's storage key.
    One,
    /// Several keys, exclusively, under one token: every one of them in
    /// canonical order (the first is the lease's storage key).
    Several(Box<[Part]>),
    /// A place in the key's holder set: a shared holder or a permit.
    Member(Membership),
}

/// One key of a lease on several keys.
pub(crate) struct Part {
    pub(crate) storage_key: Arc<str>,
    /// Where the caller's key starts in `storage_key`.
    pub(crate) key_start: usize,
    pub(crate) fence: Option<u64>,
}

impl Part {
    /// The key as the caller named it.
    pub(crate) fn key(&self) -> &str {
        caller_key(&self.storage_key, self.key_start)
    }
}

/// The keys of a shared holder or a permit, beside the lock key.
#[derive(Clone)]
pub(crate) struct Membership {
    /// The holder set.
    pub(crate) holders: String,
    /// The writer mark.
    pub(crate) writer: String,
    /// `shared` or `permits:N`: what the lock key holds while there are
    /// holders.
    pub(crate) marker: String,
    /// N, or 0 for shared.
    pub(crate) limit: u32,
}

/// The caller's key inside a storage key (`<prefix>{<key>}`).
fn caller_key(storage_key: &str, key_start: usize) -> &str {
    let end = storage_key.len().saturating_sub(1);
    storage_key.get(key_start..end).unwrap_or_default()
}

/// What a held lock knows about itself; shared by the guard and its
/// heartbeat.
pub(crate) struct Lease {
    /// The Redis key: the prefix, then the caller's key in braces. Shared
    /// with the process's line for the key (one allocation per lock).
    pub(crate) storage_key: Arc<str>,
    /// Where the caller's key starts in `storage_key`.
    key_start: usize,
    pub(crate) token: Token,
    pub(crate) fence: Option<u64>,
    ttl_ms: AtomicU64,
    /// Until when we may trust that we own the lock: the start of the last
    /// successful acquire or renew, plus ttl, minus drift. Monotonic clock.
    valid_until: Mutex<Instant>,
    lost: AtomicBool,
    /// Why it was lost, set once, before `lost`.
    reason: OnceLock<LossReason>,
    lost_notify: Notify,
    /// When this holder got the lock (for the hold time).
    pub(crate) acquired: Instant,
    /// `min_hold`: a release before this only shortens the lease to it.
    min_until: Option<Instant>,
    /// `max_hold`: the lease is never trusted past this.
    max_until: Option<Instant>,
    /// Serialises renewals (heartbeat and `extend`), so an older PEXPIRE can
    /// never land after a newer one and shorten the lease behind our back:
    /// one permit, inside the lease (no allocation of its own); the
    /// heartbeat takes it with `try_acquire` and holds it through a round.
    pub(crate) renewing: tokio::sync::Semaphore,
    pub(crate) scope: Scope,
}

impl Lease {
    pub(crate) fn new(
        storage_key: Arc<str>,
        key_start: usize,
        token: Token,
        fence: Option<u64>,
        ttl: Duration,
        valid_until: Instant,
        holds: HoldLimits,
    ) -> Lease {
        let acquired = Instant::now();
        let max_until = holds.max.map(|max| acquired + max);
        let valid_until = max_until.map_or(valid_until, |max| valid_until.min(max));
        Lease {
            storage_key,
            key_start,
            token,
            fence,
            ttl_ms: AtomicU64::new(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX)),
            valid_until: Mutex::new(valid_until),
            lost: AtomicBool::new(false),
            reason: OnceLock::new(),
            lost_notify: Notify::new(),
            acquired,
            min_until: holds.min.map(|min| acquired + min),
            max_until,
            renewing: tokio::sync::Semaphore::new(1),
            scope: Scope::One,
        }
    }

    /// The same lease, holding `scope`.
    pub(crate) fn with_scope(mut self, scope: Scope) -> Lease {
        self.scope = scope;
        self
    }

    /// Whether this is a shared hold or a permit.
    pub(crate) fn is_member(&self) -> bool {
        matches!(self.scope, Scope::Member(_))
    }

    /// The key as the caller named it (inside the braces of the storage key).
    pub(crate) fn key(&self) -> &str {
        caller_key(&self.storage_key, self.key_start)
    }

    pub(crate) fn ttl(&self) -> Duration {
        Duration::from_millis(self.ttl_ms.load(Ordering::Acquire))
    }

    pub(crate) fn valid_until(&self) -> Instant {
        *self.valid_until.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records a successful renewal sent at `sent` for `ttl`.
    pub(crate) fn renewed(&self, sent: Instant, ttl: Duration) {
        self.ttl_ms.store(
            u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
            Ordering::Release,
        );
        let mut until = self.valid_until.lock().unwrap_or_else(|p| p.into_inner());
        let end = validity_end(sent, ttl);
        *until = self.max_until.map_or(end, |max| end.min(max));
    }

    /// Records that the lease is being shortened to `ttl` by a command sent
    /// at `sent`: from now on it is trusted no longer than that, whatever
    /// the answer.
    pub(crate) fn shortened(&self, sent: Instant, ttl: Duration) {
        self.ttl_ms.store(
            u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
            Ordering::Release,
        );
        let mut until = self.valid_until.lock().unwrap_or_else(|p| p.into_inner());
        *until = (*until).min(validity_end(sent, ttl));
    }

    pub(crate) fn is_lost(&self) -> bool {
        if self.lost.load(Ordering::Acquire) {
            return true;
        }
        if Instant::now() >= self.valid_until() {
            self.mark_lost(self.deadline_reason());
            return true;
        }
        false
    }

    /// Why a lease whose validity deadline passed is lost.
    pub(crate) fn deadline_reason(&self) -> LossReason {
        if self.max_until.is_some_and(|max| Instant::now() >= max) {
            LossReason::MaxHold
        } else {
            LossReason::Expired
        }
    }

    /// Why the lease was lost; `None` while held, and after a release.
    pub(crate) fn loss_reason(&self) -> Option<LossReason> {
        if !self.is_lost() {
            return None;
        }
        self.reason.get().copied()
    }

    /// How long a release must keep the lease still (`min_hold`), if at all.
    pub(crate) fn keep_for(&self) -> Option<Duration> {
        let left = self.min_until?.saturating_duration_since(Instant::now());
        (left >= MIN_TTL.min(Duration::from_millis(1))).then_some(left)
    }

    /// The lock is lost while held, for `reason`: signalled once, and
    /// logged.
    pub(crate) fn mark_lost(&self, reason: LossReason) {
        if self.lost.load(Ordering::Acquire) {
            return;
        }
        let _ = self.reason.set(reason);
        if !self.lost.swap(true, Ordering::AcqRel) {
            observe::lost(self.key(), reason.text());
            self.lost_notify.notify_waiters();
        }
    }

    /// The guard let go: nothing is held any more, nothing went wrong.
    pub(crate) fn retire(&self) {
        if !self.lost.swap(true, Ordering::AcqRel) {
            self.lost_notify.notify_waiters();
        }
    }

    pub(crate) async fn lost(&self) {
        loop {
            let notified = self.lost_notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.is_lost() {
                return;
            }
            // Wake at the validity deadline too: a lease that is not renewed
            // (renewal off, or the heartbeat's runtime gone) is lost then.
            tokio::select! {
                () = notified => {}
                () = tokio::time::sleep_until(self.valid_until()) => {}
            }
        }
    }
}

/// Until when a lease of `ttl` acquired or renewed by a command sent at
/// `sent` may be trusted.
pub(crate) fn validity_end(sent: Instant, ttl: Duration) -> Instant {
    sent + ttl.saturating_sub(drift(ttl))
}

/// Checks a duration setting: at least `min`, at most [`MAX_DURATION`].
pub(crate) fn check_duration(what: &str, value: Duration, min: Duration) -> Result<(), LockError> {
    if value < min {
        return Err(LockError::config(format!(
            "{what} {value:?} is shorter than the minimum {min:?}"
        )));
    }
    if value > MAX_DURATION {
        return Err(LockError::config(format!(
            "{what} {value:?} is longer than 24h; check the unit"
        )));
    }
    Ok(())
}
