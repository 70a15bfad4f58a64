//! What a held lock is: its token, ttl and validity deadline, and the
//! limits every lease keeps.

use crate::error::LockError;
// Where the rest of the crate finds it, beside the leases it describes.
pub(crate) use crate::error::LossReason;
use crate::observe;
use crate::token::Token;
use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

/// A lease's state: held.
const HELD: u8 = 0;
/// A lease's state: let go by its guard (nothing lost).
const RETIRED: u8 = 1;

// A lost lease's state is its reason's code, past `RETIRED`. (`LossReason`
// itself is in `error.rs`: a `Lost` error carries it.)
impl LossReason {
    /// The state of a lease lost for this reason (above [`RETIRED`]).
    fn code(self) -> u8 {
        match self {
            LossReason::TakenOver => 2,
            LossReason::Expired => 3,
            LossReason::MaxHold => 4,
            LossReason::ForceReleased => 5,
            LossReason::Refused => 6,
            LossReason::RuntimeShutDown => 7,
        }
    }

    /// The reason a lease in state `code` was lost, if it was.
    fn from_code(code: u8) -> Option<LossReason> {
        [
            LossReason::TakenOver,
            LossReason::Expired,
            LossReason::MaxHold,
            LossReason::ForceReleased,
            LossReason::Refused,
            LossReason::RuntimeShutDown,
        ]
        .into_iter()
        .find(|reason| reason.code() == code)
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

/// What a holder has in Redis: a key (or several, or a place in a key's
/// holder set) under its token. What a release lets go of, whether the
/// guard's, `Drop`'s, or that of an acquisition cut short.
#[derive(Clone)]
pub(crate) struct Held {
    /// The Redis key: the prefix, then the caller's key in braces. Shared
    /// with the process's queue for the key (one allocation per lock).
    pub(crate) storage_key: Arc<str>,
    pub(crate) scope: Scope,
    pub(crate) token: Token,
}

impl Held {
    /// `storage_key` alone, exclusively.
    pub(crate) fn one(storage_key: Arc<str>, token: Token) -> Held {
        Held {
            storage_key,
            scope: Scope::One,
            token,
        }
    }
}

/// Which keys a lease holds, and how.
#[derive(Clone)]
pub(crate) enum Scope {
    /// One key, exclusively: the lease's storage key.
    One,
    /// Several keys, exclusively, under one token: every one of them in
    /// canonical order (the first is the lease's storage key).
    Several(Box<[Part]>),
    /// A place in the key's holder set: a shared holder or a permit (boxed:
    /// every lease has a scope, few are shared).
    Shared(Box<HolderSet>),
}

/// One key of a lease on several keys.
#[derive(Clone)]
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
pub(crate) struct HolderSet {
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
    /// What it holds in Redis, under which token.
    pub(crate) held: Held,
    /// Where the caller's key starts in the storage key (a key is at most
    /// 1 KiB).
    key_start: u32,
    pub(crate) fence: Option<u64>,
    /// The ttl in milliseconds (at most 24 h).
    ttl_ms: AtomicU32,
    /// Until when we may trust that we own the lock: the start of the last
    /// successful acquire or renew, plus ttl, minus drift. Monotonic clock,
    /// as an [`Instant`] in nanoseconds after [`epoch`] (an atomic rather than
    /// a mutex: a lease is small when a process holds a million).
    valid_until: AtomicU64,
    /// [`HELD`], [`RETIRED`], or lost with a [`LossReason`] (its code):
    /// one byte for both whether and why.
    state: AtomicU8,
    lost_notify: Notify,
    /// When this holder got the lock (for the hold time), in nanoseconds
    /// after [`epoch`]; see [`acquired`](Self::acquired).
    acquired: u64,
    /// `min_hold` and `max_hold`, when set (seldom: boxed).
    holds: Option<Box<HoldUntil>>,
    /// Serialises the heartbeat's renewals with a shortening `extend`, so a
    /// renewal can never land after it and lengthen the key again:
    /// one permit, inside the lease (no allocation of its own); the
    /// heartbeat takes it with `try_acquire` and holds it through a round.
    pub(crate) renewing: tokio::sync::Semaphore,
    /// Its `template` label, and its place in the `lock_core_held` gauge.
    pub(crate) gauge: observe::Held,
}

/// The instants a lease's hold limits fall on.
struct HoldUntil {
    /// `min_hold`: a release before this only shortens the lease to it.
    min: Option<Instant>,
    /// `max_hold`: the lease is never trusted past this.
    max: Option<Instant>,
}

/// The instant [`Lease`] counts its validity from: the first time any lease
/// asked. An instant before it counts as it (long past for any lease).
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn to_nanos(at: Instant) -> u64 {
    u64::try_from(at.saturating_duration_since(epoch()).as_nanos()).unwrap_or(u64::MAX)
}

fn from_nanos(nanos: u64) -> Instant {
    epoch() + Duration::from_nanos(nanos)
}

/// A ttl in milliseconds, as a lease keeps it (ttls are at most 24 h).
fn ttl_millis(ttl: Duration) -> u32 {
    u32::try_from(ttl.as_millis()).unwrap_or(u32::MAX)
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
        let holds = (holds.min.is_some() || max_until.is_some()).then(|| {
            Box::new(HoldUntil {
                min: holds.min.map(|min| acquired + min),
                max: max_until,
            })
        });
        Lease {
            held: Held::one(storage_key, token),
            key_start: u32::try_from(key_start).unwrap_or(u32::MAX),
            fence,
            ttl_ms: AtomicU32::new(ttl_millis(ttl)),
            valid_until: AtomicU64::new(to_nanos(valid_until)),
            state: AtomicU8::new(HELD),
            lost_notify: Notify::new(),
            acquired: to_nanos(acquired),
            holds,
            renewing: tokio::sync::Semaphore::new(1),
            gauge: observe::Held::new(observe::UNLABELLED),
        }
    }

    /// The same lease, labelled `label` in metrics.
    pub(crate) fn labelled(mut self, label: &'static str) -> Lease {
        self.gauge = observe::Held::new(label);
        self
    }

    /// The same lease, holding `scope`.
    pub(crate) fn with_scope(mut self, scope: Scope) -> Lease {
        self.held.scope = scope;
        self
    }

    /// Whether this is a shared hold or a permit.
    /// The fencing token of `key`, one of the keys this lease holds.
    pub(crate) fn fence_of(&self, key: &str) -> Option<u64> {
        match &self.held.scope {
            Scope::Several(parts) => parts.iter().find(|p| p.key() == key)?.fence,
            _ => self.fence,
        }
    }

    pub(crate) fn is_shared(&self) -> bool {
        matches!(self.held.scope, Scope::Shared(_))
    }

    /// The key as the caller named it (inside the braces of the storage key).
    pub(crate) fn key(&self) -> &str {
        caller_key(&self.held.storage_key, self.key_start as usize)
    }

    /// When this holder got the lock.
    pub(crate) fn acquired(&self) -> Instant {
        from_nanos(self.acquired)
    }

    pub(crate) fn ttl(&self) -> Duration {
        Duration::from_millis(u64::from(self.ttl_ms.load(Ordering::Acquire)))
    }

    pub(crate) fn valid_until(&self) -> Instant {
        from_nanos(self.valid_until.load(Ordering::Acquire))
    }

    /// `max_hold`'s instant, if set.
    fn max_until(&self) -> Option<Instant> {
        self.holds.as_ref().and_then(|holds| holds.max)
    }

    /// Records a successful renewal sent at `sent` for `ttl`.
    pub(crate) fn renewed(&self, sent: Instant, ttl: Duration) {
        self.ttl_ms.store(ttl_millis(ttl), Ordering::Release);
        let end = validity_end(sent, ttl);
        let until = self.max_until().map_or(end, |max| end.min(max));
        self.valid_until.store(to_nanos(until), Ordering::Release);
    }

    /// Records that the lease is being shortened to `ttl` by a command sent
    /// at `sent`: from now on it is trusted no longer than that, whatever
    /// the answer.
    pub(crate) fn shortened(&self, sent: Instant, ttl: Duration) {
        self.ttl_ms.store(ttl_millis(ttl), Ordering::Release);
        self.valid_until
            .fetch_min(to_nanos(validity_end(sent, ttl)), Ordering::AcqRel);
    }

    pub(crate) fn is_lost(&self) -> bool {
        if self.state.load(Ordering::Acquire) != HELD {
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
        if self.max_until().is_some_and(|max| Instant::now() >= max) {
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
        LossReason::from_code(self.state.load(Ordering::Acquire))
    }

    /// How long a release must keep the lease still (`min_hold`), if at all.
    pub(crate) fn keep_for(&self) -> Option<Duration> {
        let min_until = self.holds.as_ref()?.min?;
        let left = min_until.saturating_duration_since(Instant::now());
        (left >= MIN_TTL.min(Duration::from_millis(1))).then_some(left)
    }

    /// The lock is lost while held, for `reason`: signalled once, and
    /// logged.
    pub(crate) fn mark_lost(&self, reason: LossReason) {
        // Lost is not held, though the guard lives on until dropped.
        self.gauge.down();
        let lost =
            self.state
                .compare_exchange(HELD, reason.code(), Ordering::AcqRel, Ordering::Acquire);
        if lost.is_ok() {
            observe::lost(self.key(), reason.text());
            self.lost_notify.notify_waiters();
        }
    }

    /// The guard let go: nothing is held any more, nothing went wrong.
    pub(crate) fn retire(&self) {
        self.gauge.down();
        let retired =
            self.state
                .compare_exchange(HELD, RETIRED, Ordering::AcqRel, Ordering::Acquire);
        if retired.is_ok() {
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
