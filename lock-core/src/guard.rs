//! [`LockGuard`]: proof of ownership, the loss signal, release and `Drop`.

use crate::client::{ClientInner, MIN_TTL, spawn_release};
use crate::error::LockError;
use crate::heartbeat::{Enrolment, Heartbeat};
use crate::line::{HandedLease, LetGo, Owner, Turn, YIELD};
use crate::observe;
use crate::token::Token;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

/// The clock drift allowed for a lease of `ttl`: 1 % plus 2 ms, as in the
/// Redlock reference. The local validity deadline ends this much before the
/// server's expiry.
pub(crate) fn drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

/// How long a holder keeps a lock at least and at most (`min_hold`,
/// `max_hold`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Holds {
    pub(crate) min: Option<Duration>,
    pub(crate) max: Option<Duration>,
}

impl Holds {
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
            if hold.is_some_and(|h| h > crate::client::MAX_DURATION) {
                return Err(LockError::config(format!(
                    "{what} is longer than 24h; check the unit"
                )));
            }
        }
        Ok(())
    }
}

/// What a held lock knows about itself; shared by the guard and its
/// heartbeat.
pub(crate) struct Lease {
    /// The Redis key: the prefix, then the caller's key in braces. Shared
    /// with the process's line for the key (one allocation per lock).
    pub(crate) storage_key: Arc<str>,
    /// Where the caller's key starts in `storage_key`.
    key_at: usize,
    pub(crate) token: Token,
    pub(crate) fence: Option<u64>,
    ttl_ms: AtomicU64,
    /// Until when we may trust that we own the lock: the start of the last
    /// successful acquire or renew, plus ttl, minus drift. Monotonic clock.
    valid_until: Mutex<Instant>,
    lost: AtomicBool,
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
}

impl Lease {
    pub(crate) fn new(
        storage_key: Arc<str>,
        key_at: usize,
        token: Token,
        fence: Option<u64>,
        ttl: Duration,
        valid_until: Instant,
        holds: Holds,
    ) -> Lease {
        let acquired = Instant::now();
        let max_until = holds.max.map(|max| acquired + max);
        let valid_until = max_until.map_or(valid_until, |max| valid_until.min(max));
        Lease {
            storage_key,
            key_at,
            token,
            fence,
            ttl_ms: AtomicU64::new(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX)),
            valid_until: Mutex::new(valid_until),
            lost: AtomicBool::new(false),
            lost_notify: Notify::new(),
            acquired,
            min_until: holds.min.map(|min| acquired + min),
            max_until,
            renewing: tokio::sync::Semaphore::new(1),
        }
    }

    /// The key as the caller named it (inside the braces of the storage key).
    pub(crate) fn key(&self) -> &str {
        let end = self.storage_key.len().saturating_sub(1);
        self.storage_key.get(self.key_at..end).unwrap_or_default()
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
    pub(crate) fn deadline_reason(&self) -> &'static str {
        if self.max_until.is_some_and(|max| Instant::now() >= max) {
            "max_hold reached"
        } else {
            "the validity deadline passed without a successful renewal"
        }
    }

    /// How long a release must keep the lease still (`min_hold`), if at all.
    pub(crate) fn keep_for(&self) -> Option<Duration> {
        let left = self.min_until?.saturating_duration_since(Instant::now());
        (left >= crate::client::MIN_TTL.min(Duration::from_millis(1))).then_some(left)
    }

    /// The lock is lost while held, for `reason`: signalled once, and
    /// logged.
    pub(crate) fn mark_lost(&self, reason: &'static str) {
        if !self.lost.swap(true, Ordering::AcqRel) {
            observe::lost(self.key(), reason);
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

/// A held lock.
///
/// While it lives (and renewal is on) a heartbeat renews the lease every
/// ttl/3. [`release`](Self::release) gives the lock up and says whether it was
/// still ours; dropping the guard without releasing stops the heartbeat and
/// releases in the background, without blocking.
///
/// Ownership can be lost while the guard is held (a pause longer than the
/// ttl, Redis restarted without data, an operator deleting the key): watch
/// [`is_lost`](Self::is_lost) or await [`lost`](Self::lost), and use
/// [`fencing_token`](Self::fencing_token) with the protected resource when a
/// late writer must be refused.
#[must_use = "dropping the guard releases the lock at once"]
pub struct LockGuard {
    client: Arc<ClientInner>,
    lease: Arc<Lease>,
    heartbeat: Option<Enrolment>,
    stage: Stage,
    /// Until it lets go, the guard is first in its process's line for the
    /// key (`line.rs`) and must pass the turn on, whatever happens.
    holds_line: bool,
    owner: Owner,
}

impl LockGuard {
    pub(crate) fn new(
        client: Arc<ClientInner>,
        lease: Lease,
        renew_at: Instant,
        renew: bool,
        turn: Turn<'_>,
        from_redis: bool,
    ) -> LockGuard {
        let lease = Arc::new(lease);
        let owner = turn.keep(&lease, from_redis);
        let heartbeat = renew.then(|| Heartbeat::join(&client, lease.clone(), renew_at));
        LockGuard {
            client,
            lease,
            heartbeat,
            stage: Stage::Held,
            holds_line: true,
            owner,
        }
    }

    /// The key as the caller named it (without the client's prefix).
    pub fn key(&self) -> &str {
        self.lease.key()
    }

    /// The fencing token, when the lock was taken with fencing: larger for
    /// every later holder of the same key. Pass it to the protected resource
    /// and have it refuse writes carrying a smaller token than it has seen.
    pub fn fencing_token(&self) -> Option<u64> {
        self.lease.fence
    }

    /// The current lease length (changed by [`extend`](Self::extend)).
    pub fn ttl(&self) -> Duration {
        self.lease.ttl()
    }

    /// How long the lease is certainly still ours, by the local monotonic
    /// clock; zero once lost.
    pub fn remaining(&self) -> Duration {
        if self.is_lost() {
            return Duration::ZERO;
        }
        self.lease
            .valid_until()
            .saturating_duration_since(Instant::now())
    }

    /// `true` once the lock is known lost: a renewal found another owner, or
    /// the validity deadline passed without a successful renewal.
    pub fn is_lost(&self) -> bool {
        self.lease.is_lost()
    }

    /// Completes when the lock is lost; never, if it stays held.
    ///
    /// ```no_run
    /// # async fn demo(client: &lock_core::LockClient) -> Result<(), lock_core::LockError> {
    /// # async fn work() {}
    /// let guard = client.lock("job", std::time::Duration::from_secs(10)).await?;
    /// tokio::select! {
    ///     () = work() => {}
    ///     () = guard.lost() => eprintln!("lost the lock; work abandoned"),
    /// }
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    pub async fn lost(&self) {
        self.lease.lost().await;
    }

    /// Sets the lease to `ttl` from now, if it is still ours; later renewals
    /// use the new ttl.
    ///
    /// Errors: [`ErrorKind::Lost`](crate::ErrorKind::Lost) when the lock is no longer ours,
    /// [`ErrorKind::Unavailable`](crate::ErrorKind::Unavailable) when Redis did not answer in time (the
    /// lease is unchanged, and the heartbeat keeps trying).
    pub async fn extend(&self, ttl: Duration) -> Result<(), LockError> {
        if ttl < MIN_TTL || ttl > crate::client::MAX_DURATION {
            return Err(LockError::config(format!(
                "ttl {ttl:?} is out of range ({MIN_TTL:?} to 24h)"
            ))
            .with_key(self.key()));
        }
        if self.lease.is_lost() {
            return Err(LockError::lost(self.key()));
        }
        let lease = &self.lease;
        // Never closed, so acquiring fails only if that changes: then go
        // ahead unserialised rather than fail the extension.
        let _one = lease.renewing.acquire().await.ok();
        let sent = Instant::now();
        let limit = self.client.op_timeout;
        let (backend, key, token) = (&self.client.backend, &*lease.storage_key, &lease.token);
        // A renewal never shortens the lease: a shorter ttl is set exactly.
        let answer = if ttl < lease.ttl() {
            backend.set_ttl(key, token, ttl, limit).await
        } else {
            backend.renew(key, token, ttl, limit).await
        };
        match answer {
            Ok(true) => {
                lease.renewed(sent, ttl);
                // The next renewal comes a third of the new ttl from now:
                // after an extension to a shorter ttl, the old schedule
                // would come too late.
                if let Some(enrolment) = self.heartbeat {
                    self.client.heartbeat.reschedule(enrolment, sent + ttl / 3);
                }
                Ok(())
            }
            Ok(false) => {
                lease.mark_lost("an extension found the lock taken over or expired");
                Err(LockError::lost(self.key()))
            }
            Err(e) => Err(e.with_key(self.key())),
        }
    }

    /// Gives the lock up with compare-and-delete.
    ///
    /// `Ok(true)`: it was ours and is now free. `Ok(false)`: it had already
    /// expired or been taken by another owner, whose lock is left untouched.
    /// An error ([`ErrorKind::Unavailable`](crate::ErrorKind::Unavailable)) comes within the operation
    /// timeout; the lease then expires by itself.
    pub async fn release(mut self) -> Result<bool, LockError> {
        self.stop_heartbeat();
        let lease = self.lease.clone();
        let keep_for = lease.keep_for();
        let spent = match keep_for {
            // A lease kept for its min_hold is shortened, never handed on.
            Some(_) => false,
            None => match self.let_go() {
                LetGo::HandedOff => {
                    self.stage = Stage::Done;
                    self.holds_line = false;
                    observe::released(self.key(), lease.acquired, true);
                    return Ok(true);
                }
                LetGo::Ended => {
                    self.holds_line = false;
                    false
                }
                LetGo::Release { spent } => spent,
            },
        };
        // Should this future be dropped from here on, `Drop` sends the
        // release again in the background (both commands are safe to
        // repeat).
        self.stage = Stage::Releasing { spent };
        let limit = self.client.op_timeout;
        let backend = &self.client.backend;
        let result = match keep_for {
            // min_hold: shorten the lease to what is left of it, keep the key.
            Some(_) if lease.is_lost() => Ok(false),
            Some(keep_for) => {
                backend
                    .set_ttl(&lease.storage_key, &lease.token, keep_for, limit)
                    .await
            }
            None => {
                backend
                    .release(&lease.storage_key, &lease.token, limit)
                    .await
            }
        };
        self.stage = Stage::Done;
        lease.retire();
        if let Ok(owned) = result {
            observe::released(self.key(), lease.acquired, owned);
        }
        // After the release: the next task of this process finds the key
        // free in Redis (unless another process was quicker).
        self.pass_line(spent);
        result.map_err(|e| e.with_key(self.key()))
    }

    /// Hands the lease to the next task of this process, if any waits and
    /// the budget allows.
    fn let_go(&self) -> LetGo {
        let lease = &self.lease;
        // A lease kept for its min_hold is not handed on: the point is that
        // nobody runs the same work again before it is over.
        // Made only when a task waits for it.
        let handed = || {
            (!lease.is_lost() && lease.keep_for().is_none()).then(|| HandedLease {
                token: lease.token.clone(),
                valid_until: lease.valid_until(),
            })
        };
        self.client
            .lines
            .let_go(&lease.storage_key, self.owner, handed, self.client.handoff)
    }

    fn pass_line(&mut self, spent: bool) {
        if std::mem::take(&mut self.holds_line) {
            let after = if spent { YIELD } else { Duration::ZERO };
            self.client
                .lines
                .pass(&self.lease.storage_key, self.owner, after);
        }
    }

    fn stop_heartbeat(&mut self) {
        if let Some(enrolment) = self.heartbeat.take() {
            self.client.heartbeat.leave(enrolment);
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        self.stop_heartbeat();
        let spent = match std::mem::replace(&mut self.stage, Stage::Done) {
            Stage::Held => self.let_go_in_background(),
            // `release` was dropped before its answer came: the command may
            // never have been sent.
            Stage::Releasing { spent } => {
                self.release_in_background();
                spent
            }
            Stage::Done => false,
        };
        self.pass_line(spent);
    }
}

impl LockGuard {
    /// The guard dropped while held: hands the lease on or releases it in
    /// the background. Returns whether a hand-off budget ran out.
    fn let_go_in_background(&mut self) -> bool {
        let owned = !self.lease.is_lost();
        let (release, spent) = match self.let_go() {
            LetGo::HandedOff => {
                self.holds_line = false;
                (false, false)
            }
            LetGo::Ended => {
                self.holds_line = false;
                (true, false)
            }
            LetGo::Release { spent } => (true, spent),
        };
        if release {
            self.release_in_background();
        }
        observe::released(self.key(), self.lease.acquired, owned);
        spent
    }

    fn release_in_background(&self) {
        spawn_release(
            self.client.clone(),
            self.lease.storage_key.clone(),
            self.lease.token.clone(),
            self.lease.keep_for(),
        );
        self.lease.retire();
    }
}

/// Where a guard is in letting go.
#[derive(Clone, Copy)]
enum Stage {
    /// The lock is held.
    Held,
    /// `release` sent (or is about to send) its command and awaits the
    /// answer; `spent`: a hand-off budget ran out.
    Releasing { spent: bool },
    /// Released, handed on, or dropped.
    Done,
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("key", &self.lease.key())
            .field("fencing_token", &self.lease.fence)
            .field("lost", &self.lease.is_lost())
            .finish()
    }
}
