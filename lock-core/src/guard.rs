//! [`LockGuard`]: proof of ownership, the loss signal, release and `Drop`.

use crate::client_state::ClientInner;
use crate::current::LockInfo;
use crate::error::LockError;
use crate::heartbeat::Enrolment;
use crate::lease::{Lease, LossReason, MAX_DURATION, MIN_TTL, Part, Scope, renewal_due};
use crate::observe;
use crate::queue::{Front, HandedLease, Next, Owner, Taken, YIELD};
use crate::release::{self, Expiry, LetGo};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// Whether the heartbeat renews a new guard's lease, and when first.
pub(crate) enum RenewSchedule {
    /// Renewed from this moment on.
    From(Instant),
    /// Not renewed: the lease expires after its ttl.
    Off,
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
///
/// ```
/// use lock_core::LockClient;
/// use std::time::Duration;
///
/// # async fn copy_the_files() {}
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), lock_core::LockError> {
/// let client = LockClient::in_memory();
/// let guard = client.lock("backup", Duration::from_secs(30)).await?;
/// tokio::select! {
///     () = copy_the_files() => {}
///     // Stop the work as soon as the lock is no longer ours.
///     () = guard.lost() => eprintln!("lost {}: {:?}", guard.key(), guard.loss_reason()),
/// }
/// let was_still_ours = guard.release().await?;
/// assert!(was_still_ours);
/// # Ok(()) }
/// ```
///
/// A guard taken inside a `#[distributed_lock]` body, through the same
/// client, on a key that body (or one around it) holds is a **re-entry**:
/// it was granted at once, without a Redis command, and stands for the lock
/// the body holds. Its `is_lost`, `lost`, `remaining`, `ttl` and
/// `fencing_token` describe that lease; releasing or dropping it leaves the
/// lock held, and [`extend`](Self::extend) refuses. See
/// [`LockClient::lock_with`](crate::LockClient::lock_with).
#[must_use = "dropping the guard releases the lock at once"]
pub struct LockGuard {
    client: Arc<ClientInner>,
    lease: Arc<Lease>,
    heartbeat: Option<Enrolment>,
    stage: Stage,
    /// Until it lets go, the guard is first in its process's queue for its
    /// key (or keys) (`queue.rs`) and must pass the turn on, whatever
    /// happens.
    place: Place,
}

/// Where a guard stands in its process's queues.
enum Place {
    /// In none: a shared holder, a permit, a re-entry, or a guard that
    /// passed its turn on.
    Nowhere,
    /// First in its key's queue, as this owner.
    First(Owner),
    /// First in the queue of each of its keys (in the lease's order), as
    /// these owners.
    FirstOfEach(Box<[Owner]>),
}

impl LockGuard {
    /// The guard of `lease`, first in its key's queue from `front` on.
    pub(crate) fn new(
        client: Arc<ClientInner>,
        lease: Lease,
        renewal: RenewSchedule,
        front: Front<'_>,
        taken: Taken,
    ) -> LockGuard {
        let lease = Arc::new(lease);
        let owner = front.keep(&lease, taken);
        LockGuard::held(client, lease, renewal, Place::First(owner))
    }

    /// The guard of a lease on several keys, first in each key's queue from
    /// `fronts` on (in the lease's order).
    pub(crate) fn several(
        client: Arc<ClientInner>,
        lease: Lease,
        renewal: RenewSchedule,
        fronts: Vec<Front<'_>>,
    ) -> LockGuard {
        let lease = Arc::new(lease);
        let owners = fronts
            .into_iter()
            .map(|front| front.keep(&lease, Taken::FromRedis))
            .collect();
        LockGuard::held(client, lease, renewal, Place::FirstOfEach(owners))
    }

    /// The guard of a shared holder or a permit: in no queue (the holders
    /// of a process do not wait for one another).
    pub(crate) fn shared(
        client: Arc<ClientInner>,
        lease: Lease,
        renewal: RenewSchedule,
    ) -> LockGuard {
        LockGuard::held(client, Arc::new(lease), renewal, Place::Nowhere)
    }

    fn held(
        client: Arc<ClientInner>,
        lease: Arc<Lease>,
        renewal: RenewSchedule,
        place: Place,
    ) -> LockGuard {
        lease.gauge.up();
        let heartbeat = match renewal {
            RenewSchedule::From(due) => {
                Some(client.heartbeat.join(&client.renewals, lease.clone(), due))
            }
            RenewSchedule::Off => None,
        };
        LockGuard {
            client,
            lease,
            heartbeat,
            stage: Stage::Held,
            place,
        }
    }

    /// A re-entry of `lease`, held by an enclosing annotated body of this
    /// task: it neither renews nor releases, and is nobody in the queue.
    /// `key`: the key re-entered (one of a lease on several keys).
    pub(crate) fn reentry(client: Arc<ClientInner>, lease: Arc<Lease>, key: &str) -> LockGuard {
        let part = match &lease.held.scope {
            Scope::Several(parts) => parts
                .iter()
                .position(|p| p.key() == key)
                .and_then(|i| u32::try_from(i).ok()),
            _ => None,
        };
        LockGuard {
            client,
            lease,
            heartbeat: None,
            stage: Stage::Reentry { part },
            place: Place::Nowhere,
        }
    }

    /// The client and the lease, for the task scope of an annotated body.
    pub(crate) fn holding(&self) -> (&Arc<ClientInner>, &Arc<Lease>) {
        (&self.client, &self.lease)
    }

    /// What an annotated body holding this guard is told by
    /// [`current_lock`](crate::current_lock).
    pub(crate) fn info(&self) -> LockInfo {
        match &self.lease.held.scope {
            Scope::Several(parts) => LockInfo::several(
                parts
                    .iter()
                    .map(|p| (p.key().to_owned(), p.fence))
                    .collect(),
            ),
            _ => LockInfo::new(self.key().to_owned(), self.fencing_token()),
        }
    }

    /// Every key this guard holds, in canonical (sorted) order: one, or
    /// those of [`LockClient::lock_all`](crate::LockClient::lock_all).
    pub fn keys(&self) -> Vec<&str> {
        match &self.lease.held.scope {
            Scope::Several(parts) => parts.iter().map(Part::key).collect(),
            _ => vec![self.key()],
        }
    }

    /// The fencing token of one of the keys held, when the lock was taken
    /// with fencing: each key of a lock on several keys has its own.
    /// `None` for a key this guard does not hold.
    pub fn fencing_token_of(&self, key: &str) -> Option<u64> {
        match &self.lease.held.scope {
            Scope::Several(parts) => parts.iter().find(|p| p.key() == key)?.fence,
            _ if key == self.key() => self.lease.fence,
            _ => None,
        }
    }

    /// Whether this guard is a shared hold or a permit (see
    /// [`LockOptions::shared`](crate::LockOptions::shared) and
    /// [`LockOptions::permits`](crate::LockOptions::permits)).
    pub fn is_shared(&self) -> bool {
        self.lease.is_shared()
    }

    /// The key as the caller named it (without the client's prefix); for a
    /// lock on several keys, the first in canonical order.
    pub fn key(&self) -> &str {
        match self.reentered_part() {
            Some(part) => part.key(),
            None => self.lease.key(),
        }
    }

    /// Of a re-entry of one key of a lease on several, that key.
    fn reentered_part(&self) -> Option<&Part> {
        let (Stage::Reentry { part: Some(at) }, Scope::Several(parts)) =
            (&self.stage, &self.lease.held.scope)
        else {
            return None;
        };
        parts.get(*at as usize)
    }

    /// The fencing token, when the lock was taken with fencing: larger for
    /// every later holder of the same key. Pass it to the protected resource
    /// and have it refuse writes carrying a smaller token than it has seen.
    pub fn fencing_token(&self) -> Option<u64> {
        match self.reentered_part() {
            Some(part) => part.fence,
            None => self.lease.fence,
        }
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

    /// Why the lock was lost: `None` while it is held (and after a
    /// release). [`LossReason::ForceReleased`] when an operator broke it
    /// (`LockClient::force_release`, `lockctl release`).
    pub fn loss_reason(&self) -> Option<LossReason> {
        self.lease.loss_reason()
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
    /// lease is unchanged, and the heartbeat keeps trying),
    /// [`ErrorKind::Config`](crate::ErrorKind::Config) on a re-entry (see the type's docs): the
    /// lease belongs to the outermost holder, whose ttl and renewal stay as
    /// they were taken.
    pub async fn extend(&self, ttl: Duration) -> Result<(), LockError> {
        if matches!(self.stage, Stage::Reentry { .. }) {
            return Err(LockError::config(
                "this guard re-entered a lock an enclosing annotated body holds; \
                 its lease is the outer one's: give the outermost lock the ttl it needs",
            )
            .with_key(self.key()));
        }
        if ttl < MIN_TTL || ttl > MAX_DURATION {
            return Err(LockError::options(format!(
                "ttl {ttl:?} is out of range ({MIN_TTL:?} to 24h)"
            ))
            .with_key(self.key()));
        }
        if self.lease.is_lost() {
            return Err(LockError::lost(self.key(), self.lease.loss_reason()));
        }
        let lease = &self.lease;
        // Only a shortening extension waits for the heartbeat's renewal in
        // flight (which could otherwise land after it and lengthen the key
        // again); a lengthening one only raises the expiry, as renewals do,
        // and never keeps the heartbeat out: this future may be kept
        // unpolled, and the lease must still be renewed. (Never closed, so
        // acquiring fails only if that changes: then go ahead.)
        let _one = match ttl < lease.ttl() {
            true => lease.renewing.acquire().await.ok(),
            false => None,
        };
        let sent = Instant::now();
        let limit = self.client.op_timeout;
        let backend = &self.client.backend;
        // A renewal never shortens the lease: a shorter ttl is set exactly.
        let answer = if ttl < lease.ttl() {
            // Trusted no longer than the new ttl from the moment it is sent:
            // should the answer be lost, or this future dropped, the server
            // may have shortened the key all the same.
            lease.shortened(sent, ttl);
            self.renew_from(sent, ttl);
            release::expire(backend, lease, ttl, Expiry::Exact, limit).await
        } else {
            release::expire(backend, lease, ttl, Expiry::Renew, limit).await
        };
        match answer {
            Ok(true) => {
                lease.renewed(sent, ttl);
                // The next renewal comes a third of the new ttl from now:
                // after an extension to a shorter ttl, the old schedule
                // would come too late.
                self.renew_from(sent, ttl);
                Ok(())
            }
            Ok(false) => {
                lease.mark_lost(LossReason::TakenOver);
                Err(LockError::lost(self.key(), lease.loss_reason()))
            }
            Err(e) => Err(e.with_key(self.key())),
        }
    }

    /// Moves the next renewal to a third of `ttl` after `sent`.
    fn renew_from(&self, sent: Instant, ttl: Duration) {
        if let Some(enrolment) = self.heartbeat {
            self.client
                .heartbeat
                .reschedule(enrolment, &self.lease, renewal_due(sent, ttl));
        }
    }

    /// Gives the lock up with compare-and-delete.
    ///
    /// `Ok(true)`: it was ours and is now free. `Ok(false)`: it had already
    /// expired or been taken by another owner, whose lock is left untouched.
    /// An error ([`ErrorKind::Unavailable`](crate::ErrorKind::Unavailable)) comes within the operation
    /// timeout; the lease then expires by itself.
    ///
    /// A re-entry (see the type's docs) sends nothing and leaves the lock
    /// held: `Ok(true)` while the outer lease is held, `Ok(false)` once it is
    /// known lost.
    pub async fn release(mut self) -> Result<bool, LockError> {
        if matches!(self.stage, Stage::Reentry { .. }) {
            self.stage = Stage::Done;
            return Ok(!self.lease.is_lost());
        }
        self.stop_heartbeat();
        let lease = self.lease.clone();
        let how = LetGo::keeping(lease.keep_for());
        let Letting::Release { spent } = self.let_go() else {
            return Ok(true);
        };
        // Should this future be dropped from here on, `Drop` sends the
        // release again in the background (both commands are safe to
        // repeat).
        self.stage = Stage::Releasing { spent };
        let result = match how {
            // min_hold: shorten the lease to what is left of it, keep the key.
            LetGo::ShortenTo(_) if lease.is_lost() => Ok(false),
            how => {
                how.send(&self.client.backend, &lease.held, self.client.op_timeout)
                    .await
            }
        };
        self.stage = Stage::Done;
        lease.retire();
        if let Ok(owned) = result {
            observe::released(self.key(), lease.acquired(), owned, lease.gauge.label());
        }
        // After the release: the next task of this process finds the key
        // free in Redis (unless another process was quicker).
        self.leave_queue(spent);
        result.map_err(|e| e.with_key(self.key()))
    }

    /// Gives the lock up without waiting for Redis to confirm it: sends the
    /// compare-and-delete (with its wake-up of waiters) and returns once it
    /// is written to the connection, one round trip sooner than
    /// [`release`](Self::release). Commands this process sends later on the
    /// same connection (the next acquisition of this key, say) are
    /// processed after it, and the process may exit right after it returns:
    /// the command has left it. What the reply says is not waited for: a
    /// release that fails is logged (WARN) and counted
    /// (`lock_core_release_failures_total` with the `metrics` feature), and
    /// the lease then expires by itself, as after a failed `release`.
    ///
    /// `#[distributed_lock]` releases this way. Where the reply cannot be
    /// left behind (Redis Cluster, TLS or Unix-socket connections, Sentinel,
    /// a lock on several keys, shared holds and permits, a `min_hold` not
    /// over yet) it is awaited as by `release`, and its answer dropped. An
    /// error means the command could not be written (the connection was
    /// down): the lease expires by itself.
    pub async fn send_release(mut self) -> Result<(), LockError> {
        let unheard = matches!(self.lease.held.scope, Scope::One)
            && !matches!(self.stage, Stage::Reentry { .. })
            && self.lease.keep_for().is_none();
        if !unheard {
            return self.release().await.map(drop);
        }
        self.stop_heartbeat();
        let lease = self.lease.clone();
        let Letting::Release { spent } = self.let_go() else {
            return Ok(());
        };
        self.stage = Stage::Releasing { spent };
        let owned = !lease.is_lost();
        let limit = self.client.op_timeout;
        let sent = self
            .client
            .backend
            .send_release(&lease.held.storage_key, &lease.held.token, limit)
            .await;
        self.stage = Stage::Done;
        lease.retire();
        if sent.is_ok() {
            observe::released(self.key(), lease.acquired(), owned, lease.gauge.label());
        }
        self.leave_queue(spent);
        sent.map_err(|e| e.with_key(self.key()))
    }

    /// Hands the lease to the next task of this process, if any waits and
    /// the budget allows.
    fn hand_off(&self) -> Next {
        let owner = match &self.place {
            Place::First(owner) => *owner,
            // A lease on several keys is released in Redis, and each queue
            // passed on after it.
            Place::FirstOfEach(_) => return Next::Release { spent: false },
            Place::Nowhere => return Next::NotFirst,
        };
        let lease = &self.lease;
        // A lease kept for its min_hold is not handed on: the point is that
        // nobody runs the same work again before it is over.
        // Made only when a task waits for it.
        let handed = || {
            (!lease.is_lost() && lease.keep_for().is_none()).then(|| HandedLease {
                token: lease.held.token.clone(),
                valid_until: lease.valid_until(),
            })
        };
        self.client
            .queues
            .hand_off(&lease.held.storage_key, owner, handed, self.client.handoff)
    }

    /// Decides, once for every way of letting go (`release`,
    /// `send_release`, `Drop`), whether the lease goes to the next task of
    /// this process or is released in Redis. Handed over, the lease is
    /// retired and counted released here.
    fn let_go(&mut self) -> Letting {
        match self.hand_off() {
            Next::HandedOver => {
                self.stage = Stage::Done;
                self.place = Place::Nowhere;
                // This guard's lease is over; waiters still watching it
                // must not take its validity deadline for a loss.
                self.lease.retire();
                let lease = &self.lease;
                observe::released(self.key(), lease.acquired(), true, lease.gauge.label());
                Letting::HandedOver
            }
            Next::NotFirst => {
                self.place = Place::Nowhere;
                Letting::Release { spent: false }
            }
            Next::Release { spent } => Letting::Release { spent },
        }
    }

    fn leave_queue(&mut self, spent: bool) {
        let queues = &self.client.queues;
        match std::mem::replace(&mut self.place, Place::Nowhere) {
            Place::Nowhere => {}
            Place::First(owner) => {
                let after = if spent { YIELD } else { Duration::ZERO };
                queues.pass_front(&self.lease.held.storage_key, owner, after);
            }
            Place::FirstOfEach(owners) => {
                if let Scope::Several(parts) = &self.lease.held.scope {
                    for (part, owner) in parts.iter().zip(owners) {
                        queues.pass_front(&part.storage_key, owner, Duration::ZERO);
                    }
                }
            }
        }
    }

    fn stop_heartbeat(&mut self) {
        if let Some(enrolment) = self.heartbeat.take() {
            self.client.heartbeat.leave(enrolment, &self.lease);
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        self.stop_heartbeat();
        let spent = match std::mem::replace(&mut self.stage, Stage::Held) {
            Stage::Held => match self.let_go() {
                Letting::HandedOver => false,
                Letting::Release { spent } => {
                    self.release_in_background();
                    spent
                }
            },
            // `release` was dropped before its answer came: the command may
            // never have been sent.
            Stage::Releasing { spent } => {
                self.release_in_background();
                spent
            }
            // The enclosing body owns the lease and releases it.
            Stage::Reentry { .. } | Stage::Done => false,
        };
        self.stage = Stage::Done;
        self.leave_queue(spent);
    }
}

impl LockGuard {
    /// Lets go of the lease in the background, as `release` would have,
    /// and counts it released.
    fn release_in_background(&self) {
        let lease = &self.lease;
        let owned = !lease.is_lost();
        let how = LetGo::keeping(lease.keep_for());
        let until = Instant::now() + lease.ttl();
        self.client
            .release_in_background(lease.held.clone(), how, until);
        lease.retire();
        observe::released(self.key(), lease.acquired(), owned, lease.gauge.label());
    }
}

/// How a guard lets its lease go: to the next task of this process, or by
/// a release in Redis (`spent`: the hand-off budget ran out, so the queue
/// pauses before its next task goes to Redis).
enum Letting {
    HandedOver,
    Release { spent: bool },
}

/// Where a guard is in letting go.
#[derive(Clone, Copy)]
enum Stage {
    /// The lock is held.
    Held,
    /// `release` sent (or is about to send) its command and awaits the
    /// answer; `spent`: a hand-off budget ran out.
    Releasing { spent: bool },
    /// A re-entry of a lease an enclosing annotated body holds: never
    /// renewed, released or handed on from here. `part`: of a lease on
    /// several keys, the key re-entered.
    Reentry { part: Option<u32> },
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
