//! The acquisition of a lock, by kind: one exclusive key (`one_key.rs`),
//! several keys at once (`several_keys.rs`), a shared holder or a permit
//! (`shared.rs`). Each is built from the steps here: the request, this
//! process's wait queues, and the loop of attempts woken by release
//! messages until the wait runs out.

use crate::admission::Admitted;
use crate::backend::{LockKeys, Subscription};
use crate::client_state::ClientInner;
use crate::error::{ErrorKind, LockError};
use crate::guard::{LockGuard, RenewSchedule};
use crate::lease::{
    Held, HoldLimits, HolderSet, Lease, MIN_TTL, Part, Scope, renewal_due, validity_end,
};
use crate::observe;
use crate::options::{LockOptions, Mode};
use crate::queue::{Front, Handoff, Next, Offered, Owner, PassOn, Position, Queues, Taken, YIELD};
use crate::release::LetGo;
use crate::scripts::Wake;
use crate::token::{Holder, Token};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;
use tokio::time::Instant;

mod one_key;
mod several_keys;
mod shared;

pub(crate) use several_keys::canonical;
pub(crate) use shared::{mismatch, shared_marker};

impl ClientInner {
    /// Checks `options` and works out what an acquisition of `key` needs.
    pub(crate) fn request<'k>(
        self: &Arc<Self>,
        key: &'k str,
        options: &LockOptions,
    ) -> Result<Request<'k>, LockError> {
        let inner = self;
        let ttl = options.ttl;
        let wait = options
            .check(inner.default_wait)
            .map_err(|e| e.with_key(key))?;
        let storage_key = inner.shared_storage_key(key)?;
        let fence_key = options.fencing.then(|| fence_key(&storage_key));
        let started = Instant::now();
        let deadline = started + wait;
        let check_at = started + crate::waits::THRESHOLD;
        let call_bound = inner.backend.call_bound(ttl, inner.op_timeout);
        Ok(Request {
            key,
            key_start: inner.prefix.len() + 1,
            storage_key,
            fence_key,
            ttl,
            renew: options.renew,
            holds: options.holds,
            label: options.label,
            started,
            deadline,
            check_at,
            call_bound,
            end: deadline + call_bound,
            admitted: std::sync::Mutex::new(None),
        })
    }

    /// One key, of any kind, as `options` say; ends early when the wait
    /// is found to be part of a cycle across processes (`waits.rs`).
    pub(crate) async fn acquire_key(
        self: &Arc<Self>,
        key: &str,
        options: LockOptions,
        attempts: &AtomicU32,
    ) -> Result<LockGuard, LockError> {
        let wait = options.wait.unwrap_or(self.default_wait);
        let keys = [key];
        let watch = crate::waits::watch(self, &keys, wait);
        // Written inside `select!`, where the acquisition is stored once
        // (a future passed by value to a helper would be stored twice).
        tokio::select! {
            biased;
            acquired = async {
                match options.mode {
                    Mode::Exclusive => self.acquire_one(key, options, attempts).await,
                    Mode::Shared | Mode::Permits(_) => {
                        self.acquire_shared(key, options, attempts).await
                    }
                }
            } => acquired,
            deadlock = watch => Err(deadlock),
        }
    }

    /// Several keys, exclusively (`keys` in canonical order, at least two),
    /// as [`acquire_key`](Self::acquire_key) does one.
    pub(crate) async fn acquire_keys(
        self: &Arc<Self>,
        keys: &[Arc<str>],
        options: LockOptions,
        attempts: &AtomicU32,
    ) -> Result<LockGuard, LockError> {
        let keys: Vec<&str> = keys.iter().map(|key| &**key).collect();
        let wait = options.wait.unwrap_or(self.default_wait);
        let watch = crate::waits::watch(self, &keys, wait);
        tokio::select! {
            biased;
            acquired = self.acquire_several(&keys, options, attempts) => acquired,
            deadlock = watch => Err(deadlock),
        }
    }

    /// [`join_queue`](Self::join_queue) for one of the request's keys:
    /// first in the queue, the task promises to act by `until` (see
    /// [`Front::promise`]).
    pub(crate) async fn join_queue_of(
        self: &Arc<Self>,
        key: &Arc<str>,
        request: &Request<'_>,
        until: Instant,
    ) -> Result<(Owner, Option<Handoff>), LockError> {
        let inner = self;
        let wait = request.deadline > request.started;
        loop {
            let position = inner
                .queues
                .join(key, wait, until)
                .ok_or_else(|| request.contended())?;
            let (handoff, holder, ahead) = match position {
                Position::Front(owner) => return Ok((owner, None)),
                Position::Behind {
                    handoff,
                    holder,
                    ahead,
                } => (handoff, holder, ahead),
            };
            let waiter = Waiter {
                inner,
                key,
                handoff,
            };
            let wakes = (request.check_at, request.deadline);
            match waiter.wait(holder, ahead, wakes, until).await {
                Waited::TimedOut => return Err(request.contended()),
                Waited::Front { owner, handoff } => return Ok((owner, handoff)),
                Waited::Again => continue,
            }
        }
    }

    /// The loop of attempts every kind of lock shares: one attempt, then,
    /// while the key is held elsewhere, more attempts woken by the release
    /// message of the key found held or by the backoff timer, until the wait
    /// runs out. Before each step it promises, as first in the queues of
    /// `fronts`, when it will act next.
    pub(crate) async fn contend_with<C: Contender>(
        self: &Arc<Self>,
        request: &Request<'_>,
        contender: &mut C,
        fronts: &[Front<'_>],
        attempts: &AtomicU32,
    ) -> Result<C::Won, LockError> {
        let inner = self;
        let promise = |wait: Duration| {
            let until = Instant::now() + wait;
            fronts.iter().for_each(|front| front.promise(until));
        };
        let mut attempt: u32 = 0;
        let mut listener = Listener::default();
        let mut retry = false;
        let mut came_back_at_once = false;
        loop {
            listener.prepare(inner, request.deadline, &promise).await;
            // Listen before asking, so a release in between is not missed.
            let mut released =
                std::pin::pin!(listener.subscription.as_ref().map(Subscription::released));
            if let Some(released) = released.as_mut().as_pin_mut() {
                released.enable();
            }
            let admitted = inner.admitted(request, fronts).await?;
            attempts.fetch_add(1, Ordering::Relaxed);
            promise(request.limit(inner.op_timeout));
            let (mut free_in, mut foreign, mut ahead) = (None, false, false);
            let last_error = match contender.attempt(retry).await {
                Ok(won) => {
                    request.keep_admission(admitted);
                    return Ok(won);
                }
                Err(Lost::Busy(left)) => {
                    free_in = left;
                    None
                }
                Err(Lost::Ahead(left)) => {
                    (free_in, ahead) = (left, true);
                    None
                }
                Err(Lost::Foreign(left)) => {
                    (free_in, foreign) = (left, true);
                    None
                }
                Err(Lost::Retry(e)) => Some(e),
                Err(Lost::Fail(e)) => {
                    return Err(e
                        .with_key(request.key)
                        .with_waited(request.started.elapsed()));
                }
            };
            // Not won: the reserved room goes back before any pause.
            drop(admitted);
            retry = true;
            let now = Instant::now();
            if now >= request.deadline {
                if let Some(e) = last_error {
                    return Err(e.with_key(request.key).with_waited(now - request.started));
                }
                return Err(self.contended_or_foreign(request).await);
            }
            if last_error.is_none() && listener.target.follow(contender.listen_on()) {
                // Held elsewhere: from now on, hear its release, and ask
                // again at once in case it came before we listened.
                continue;
            }
            // A holder that stopped (crashed, or a client that publishes
            // nothing) frees the key at its expiry: the next attempt comes
            // then at the latest, not a backoff later. Another library's
            // release is heard by nobody: its waiters poll on a short cap.
            // Contenders that split a Redlock vote come back on their
            // backoff, where they may split again; the one ahead comes back
            // at once and, its rivals' undos landed, wins. Only every other
            // time in a row: a grant that stays in its way (the lease of a
            // holder that crashed after taking a minority) is waited for
            // like any other.
            let quick = ahead && !came_back_at_once;
            came_back_at_once = quick;
            let backoff = match (quick, foreign) {
                (true, _) => Duration::ZERO,
                (false, true) => inner.backoff.foreign_delay(attempt),
                (false, false) => inner.backoff.delay(attempt),
            };
            let pause = backoff
                .min(free_in.unwrap_or(Duration::MAX))
                .min(request.deadline.saturating_duration_since(Instant::now()))
                .min(listener.heard_for());
            attempt = attempt.saturating_add(1);
            observe::retry(request.key, attempt, pause);
            promise(pause);
            pause_or_hear(released.as_mut(), request.check_at, pause).await;
        }
    }

    /// Past the client's renewal capacity, waits (within the request's
    /// wait) until a new lease may be taken. No SET is sent meanwhile, so
    /// nothing is taken only to be lost or dropped.
    /// The admission is a reservation, kept until the lease has joined the
    /// heartbeat (see `admission.rs`); `None` for a lease without renewal.
    async fn admitted(
        &self,
        request: &Request<'_>,
        fronts: &[Front<'_>],
    ) -> Result<Option<Admitted>, LockError> {
        let admission = self.heartbeat.admission();
        if !request.renew {
            return Ok(None);
        }
        if let Some(admitted) = admission.admit(request.ttl) {
            return Ok(Some(admitted));
        }
        fronts
            .iter()
            .for_each(|front| front.promise(request.deadline));
        admission
            .wait_for(request.ttl, request.deadline, request.check_at)
            .await
            .map(Some)
            .map_err(|e| {
                e.with_key(request.key)
                    .with_waited(request.started.elapsed())
            })
    }

    /// The error for a wait that ran out: `Contended`, unless the key is not
    /// a lock at all (checked only on this failure path, and only within
    /// what is left of the acquisition's bound: when that is less than half
    /// a call's bound, the check is left out rather than cut so short that
    /// its timeout would take a healthy connection for a dead one).
    async fn contended_or_foreign(self: &Arc<Self>, request: &Request<'_>) -> LockError {
        let inner = self;
        let waited = request.started.elapsed();
        let limit = request.limit(inner.op_timeout);
        let storage_key = &request.storage_key;
        if limit >= request.call_bound / 2
            && let Some(kind) = inner
                .backend
                .foreign_type(storage_key, request.ttl, limit)
                .await
        {
            return LockError::new(ErrorKind::Server)
                .with_key(request.key)
                .with_waited(waited)
                .with_message(format!(
                    "Redis key {storage_key:?} holds a {kind}, not a lock; another \
                     program uses it: choose another key or key prefix"
                ));
        }
        LockError::new(ErrorKind::Contended)
            .with_key(request.key)
            .with_waited(waited)
    }
}

/// Sleeps for `pause`, or until `released` (the release message of the key
/// found held, when listening) comes. The task wakes at `check_at` on the
/// way, when it falls inside the pause (see [`Request::check_at`]).
async fn pause_or_hear<F: std::future::Future>(
    mut released: std::pin::Pin<&mut Option<F>>,
    check_at: Instant,
    pause: Duration,
) {
    let now = Instant::now();
    let pause_end = now + pause;
    let mut wake_at = check_at.max(now).min(pause_end);
    loop {
        let heard = match released.as_mut().as_pin_mut() {
            Some(released) => tokio::time::timeout_at(wake_at, released).await.is_ok(),
            None => {
                tokio::time::sleep_until(wake_at).await;
                false
            }
        };
        if heard || wake_at >= pause_end {
            return;
        }
        wake_at = pause_end;
    }
}

/// How long a waiter's listeners mark lasts at most (see
/// [`Wake::Listeners`]); it is set again before an attempt once less than
/// half of that is left.
const LISTEN_FOR: Duration = Duration::from_secs(30);

/// How long a listeners mark outlasts the wait it is set for.
const LISTEN_MARGIN: Duration = Duration::from_secs(1);

/// How long after setting its listeners mark a waiter sets it again, at its
/// next attempt, whatever the mark has left: a mark lost with a failover
/// or a restart (asynchronous replication, no persistence) is back that
/// soon after, and meanwhile the waiter comes back on its backoff timer.
/// At most one round trip a second per waiting key and process.
const LISTEN_AGAIN: Duration = Duration::from_secs(1);

/// How soon a waiter marks again after its mark found no server (a
/// failover under way): the new primary gets the mark within this.
const MARK_AGAIN: Duration = Duration::from_millis(100);

/// What a waiter listens on: the release messages of the key its last
/// attempt found held, and, on a cluster, the mark that has that key's
/// releases publish them.
#[derive(Default)]
pub(crate) struct Listener {
    pub(crate) target: Target,
    pub(crate) subscription: Option<Subscription>,
    /// When the listeners mark was last set, and until when it lasts.
    marked: Option<(Instant, Instant)>,
    /// The last mark found no server: it is set again within
    /// [`MARK_AGAIN`].
    mark_again: bool,
    /// [`Backend::moves`](crate::backend::Backend::moves) when it was set:
    /// after a failover it is set again on the new primary.
    marked_in: u64,
}

/// The key a waiter listens for.
#[derive(Default)]
pub(crate) struct Target {
    /// The key found held.
    pub(crate) key: Option<Arc<str>>,
    /// Subscribe before the next attempt.
    subscribe: bool,
}

impl Target {
    /// Listens for `held`'s release from now on: whether that is new, so
    /// that the caller asks again at once, in case the release came before
    /// it listened.
    pub(crate) fn follow(&mut self, held: &Arc<str>) -> bool {
        if self.key.as_ref() == Some(held) {
            return false;
        }
        self.key = Some(held.clone());
        self.subscribe = true;
        true
    }
}

impl Listener {
    /// Subscribes again before the next attempt (the connection may have
    /// dropped the subscription).
    pub(crate) fn renew(&mut self) {
        self.subscription = None;
        self.mark_again = false;
        self.target.subscribe = self.target.key.is_some();
    }

    /// Before an attempt: subscribes when [`Target::follow`] asked
    /// for it, and where a release publishes only to marked listeners (a
    /// cluster), marks that this waiter listens, for as long as its wait
    /// may last (at most [`LISTEN_FOR`], then again), and again every
    /// [`LISTEN_AGAIN`] in case the mark was lost. Marked before the
    /// attempt, so a release after it is published. Should marking fail,
    /// the waiter drops its subscription and comes back on its timer, as
    /// when it cannot subscribe. `promise` is told how long each step may
    /// take.
    pub(crate) async fn prepare(
        &mut self,
        inner: &ClientInner,
        deadline: Instant,
        promise: &impl Fn(Duration),
    ) {
        let Some(key) = &self.target.key else {
            return;
        };
        let left = |now: Instant| deadline.saturating_duration_since(now);
        if std::mem::take(&mut self.target.subscribe) {
            let limit = inner.op_timeout.min(left(Instant::now()));
            promise(limit);
            self.subscription = inner.wakeups.subscribe(key, limit).await;
            self.marked = None;
        }
        if self.subscription.is_none() || inner.backend.wake() != Wake::Listeners {
            return;
        }
        let now = Instant::now();
        let needed = left(now).min(LISTEN_FOR / 2);
        let moves = inner.backend.moves();
        if self.marked_in == moves
            && self
                .marked
                .is_some_and(|(at, until)| until >= now + needed && now < at + LISTEN_AGAIN)
        {
            return;
        }
        self.marked_in = moves;
        let how_long = (left(now) + LISTEN_MARGIN).min(LISTEN_FOR);
        let limit = inner.op_timeout.min(left(now));
        promise(limit);
        match inner.backend.listen(key, how_long, limit).await {
            Ok(()) => {
                self.marked = Some((now, now + how_long));
                self.mark_again = false;
            }
            // A server that did not answer (its primary failing over, a
            // connection cut): the subscription stays, and with it what
            // is still marked (replicated to a promoted replica), and the
            // mark is set again soon, before an attempt within
            // [`MARK_AGAIN`].
            Err(e) if e.kind() == ErrorKind::Unavailable => {
                self.marked = None;
                self.mark_again = true;
            }
            Err(_) => {
                self.subscription = None;
                self.marked = None;
                self.mark_again = false;
            }
        }
    }

    /// How long a pause may last with its release heard: until the mark
    /// runs out, where one is needed.
    pub(crate) fn heard_for(&self) -> Duration {
        if self.mark_again {
            return MARK_AGAIN;
        }
        match (&self.subscription, self.marked) {
            (Some(_), Some((_, until))) => until.saturating_duration_since(Instant::now()),
            _ => Duration::MAX,
        }
    }
}

/// What one acquisition needs to know, worked out once.
pub(crate) struct Request<'k> {
    /// The key as the caller named it.
    pub(crate) key: &'k str,
    pub(crate) storage_key: Arc<str>,
    /// Where `key` starts in `storage_key`.
    pub(crate) key_start: usize,
    pub(crate) fence_key: Option<String>,
    pub(crate) ttl: Duration,
    pub(crate) renew: bool,
    holds: HoldLimits,
    /// The metrics label of the lease.
    label: &'static str,
    pub(crate) started: Instant,
    /// When the wait runs out: no attempt starts later.
    pub(crate) deadline: Instant,
    /// When a wait still under way is recorded (`waits.rs`): every wait of
    /// the acquisition wakes by then, so that the watch beside it, which
    /// has no timer of its own, sees the time pass.
    pub(crate) check_at: Instant,
    /// How long one call may wait on the servers.
    call_bound: Duration,
    /// The deadline plus one call's bound: nothing waits on Redis past it.
    pub(crate) end: Instant,
    /// The admission of the attempt that won, kept until the request is
    /// dropped, after its guard joined the heartbeat: until then the lease
    /// counts against the capacity (see `admission.rs`).
    admitted: std::sync::Mutex<Option<Admitted>>,
}

impl Request<'_> {
    fn keys<'a>(
        &'a self,
        writer: Option<(&'a str, Duration)>,
        holder: Option<&'a Arc<Holder>>,
    ) -> LockKeys<'a> {
        LockKeys {
            lock: &self.storage_key,
            fence: self.fence_key.as_deref(),
            writer,
            holder,
        }
    }

    /// How long an exclusive waiter's writer mark lasts: past its next
    /// attempt (the backoff's cap, twice over, and a round trip's margin),
    /// and never past the end of its wait. A waiter that gives up leaves it
    /// that long at most; the attempt that wins deletes it.
    pub(crate) fn writer_for(&self, inner: &ClientInner) -> Duration {
        let gap = inner.backoff.cap() * 2 + Duration::from_millis(100);
        gap.min(self.end.saturating_duration_since(Instant::now()))
            .max(MIN_TTL)
    }

    /// The bound of one call: `call`, cut to what is left before `end`.
    pub(crate) fn limit(&self, call: Duration) -> Duration {
        call.min(self.end.saturating_duration_since(Instant::now()))
    }

    /// Keeps the admission of the attempt that won (see `admitted`).
    fn keep_admission(&self, admitted: Option<Admitted>) {
        let mut kept = self.admitted.lock().unwrap_or_else(|p| p.into_inner());
        *kept = admitted.map(Admitted::won);
    }

    fn contended(&self) -> LockError {
        LockError::new(ErrorKind::Contended)
            .with_key(self.key)
            .with_waited(self.started.elapsed())
    }

    /// The guard of a lease won, or taken over, by a command sent at `sent`.
    fn guard(
        &self,
        inner: &Arc<ClientInner>,
        token: Token,
        fence: Option<u64>,
        sent: Instant,
        front: Front<'_>,
        taken: Taken,
    ) -> LockGuard {
        let lease = self.lease(token, fence, validity_end(sent, self.ttl));
        LockGuard::new(inner.clone(), lease, self.renewal(sent), front, taken)
    }

    /// How a lease won by a command sent at `sent` is renewed.
    pub(crate) fn renewal(&self, sent: Instant) -> RenewSchedule {
        match self.renew {
            true => RenewSchedule::From(renewal_due(sent, self.ttl)),
            false => RenewSchedule::Off,
        }
    }

    pub(crate) fn lease(&self, token: Token, fence: Option<u64>, valid_until: Instant) -> Lease {
        Lease::new(
            self.storage_key.clone(),
            self.key_start,
            token,
            fence,
            self.ttl,
            valid_until,
            self.holds,
        )
        .labelled(self.label)
    }
}

/// A won attempt.
pub(crate) struct Won<F = Option<u64>> {
    /// The token now stored under the key (or keys).
    pub(crate) token: Token,
    /// The fencing token, or one per key, or `()` for a kind without.
    pub(crate) fence: F,
    /// When the winning command was sent: where the lease's validity starts.
    pub(crate) sent: Instant,
}

/// One kind of acquisition attempt, repeated by
/// [`ClientInner::contend_with`].
pub(crate) trait Contender {
    /// What a won attempt gives.
    type Won;
    /// One attempt in Redis; `retry`: not the first of this acquisition.
    async fn attempt(&mut self, retry: bool) -> Result<Self::Won, Lost>;
    /// The key whose release may end the wait: the one the last attempt
    /// found held.
    fn listen_on(&self) -> &Arc<str>;
}

/// Why an attempt did not win.
pub(crate) enum Lost {
    /// Someone else holds the key; its lease has this long left, when
    /// the attempt learnt it.
    Busy(Option<Duration>),
    /// As `Busy`, held by another library's client, whose release tells
    /// nobody: only an attempt notices it.
    Foreign(Option<Duration>),
    /// As `Busy`, on Redlock, where contenders split the servers between
    /// them and this attempt won the first server that answered: it is
    /// the one to try again at once, while the others back off.
    Ahead(Option<Duration>),
    /// No answer, or a passing one (the server loading, busy, failing
    /// over): try again within the wait.
    Retry(LockError),
    /// An answer that waiting will not change.
    Fail(LockError),
}

impl Lost {
    /// A failed call: retried within the wait when Redis may answer later.
    pub(crate) fn from_error(e: LockError) -> Lost {
        if e.kind() == ErrorKind::Unavailable {
            Lost::Retry(e)
        } else {
            Lost::Fail(e)
        }
    }
}

/// A token that may be stored under a key while a call about it is in
/// flight. Dropped before [`keep`](Self::keep) (the caller's future dropped,
/// the call failed or timed out), it is released in the background, so a
/// cancelled acquisition never leaves the key held by nobody until its ttl.
pub(crate) struct MayHold<'a> {
    inner: &'a Arc<ClientInner>,
    key: &'a Arc<str>,
    what: MayHoldKeys<'a>,
    token: Token,
    /// The ttl the call asked for: its release is sent again until then.
    ttl: Duration,
    armed: bool,
}

/// What a [`MayHold`] may hold.
#[derive(Clone, Copy)]
pub(crate) enum MayHoldKeys<'a> {
    /// Its key, exclusively.
    One,
    /// These keys (its key among them), exclusively.
    Several(&'a [Arc<str>]),
    /// A place in its key's holder set.
    Shared(&'a HolderSet),
}

impl<'a> MayHold<'a> {
    fn new(
        inner: &'a Arc<ClientInner>,
        key: &'a Arc<str>,
        token: Token,
        ttl: Duration,
    ) -> MayHold<'a> {
        MayHold::of(inner, key, MayHoldKeys::One, token, ttl)
    }

    pub(crate) fn of(
        inner: &'a Arc<ClientInner>,
        key: &'a Arc<str>,
        what: MayHoldKeys<'a>,
        token: Token,
        ttl: Duration,
    ) -> MayHold<'a> {
        MayHold {
            inner,
            key,
            what,
            token,
            ttl,
            armed: true,
        }
    }

    pub(crate) fn token(&self) -> &Token {
        &self.token
    }

    /// The outcome is known: nothing to release (the lock is ours, or was
    /// never taken).
    pub(crate) fn keep(mut self) -> Token {
        self.armed = false;
        self.token.clone()
    }
}

impl Drop for MayHold<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let scope = match self.what {
            MayHoldKeys::One => Scope::One,
            MayHoldKeys::Several(keys) => Scope::Several(
                keys.iter()
                    .map(|k| Part {
                        storage_key: k.clone(),
                        key_start: 0,
                        fence: None,
                    })
                    .collect(),
            ),
            MayHoldKeys::Shared(holder_set) => Scope::Shared(Box::new(holder_set.clone())),
        };
        let held = Held {
            storage_key: self.key.clone(),
            scope,
            token: self.token.clone(),
        };
        let until = Instant::now() + self.ttl;
        self.inner
            .release_in_background(held, LetGo::Release, until);
    }
}

/// How a wait in the queue ended.
enum Waited {
    /// The wait ran out.
    TimedOut,
    /// First in the queue now, with what was handed over, if anything.
    Front {
        owner: Owner,
        handoff: Option<Handoff>,
    },
    /// The queue moved under us; join again.
    Again,
}

/// A waiter's place in the queue: the receiver of its hand-off.
///
/// Dropped before the hand-off was taken out (the wait ran out just as it came,
/// or the caller's future was dropped), it closes the channel and passes on
/// whatever was handed to it already: the turn to the next waiter, the
/// lease to the next waiter or back to Redis. A key is never left with a
/// waiter that is gone.
struct Waiter<'a> {
    inner: &'a Arc<ClientInner>,
    key: &'a Arc<str>,
    handoff: Offered,
}

impl Waiter<'_> {
    /// Waits behind the task ahead until it hands over, or until its lease
    /// is lost or it let its promise pass (then moves up front itself,
    /// promising `until`), or until the deadline. `wakes`: the wait's check
    /// (see `Request::check_at`), when the task wakes once and waits on,
    /// and the deadline.
    async fn wait(
        mut self,
        holder: Option<Arc<Lease>>,
        ahead: Owner,
        (check_at, deadline): (Instant, Instant),
        until: Instant,
    ) -> Waited {
        let queues = &self.inner.queues;
        let waited = queues.wait_behind(self.key, ahead, holder, &mut self.handoff, until);
        let mut waited = std::pin::pin!(waited);
        let mut wake_at = check_at.min(deadline);
        let outcome = loop {
            match tokio::time::timeout_at(wake_at, waited.as_mut()).await {
                Err(_) if wake_at < deadline => wake_at = deadline,
                Err(_) => return Waited::TimedOut,
                Ok(outcome) => break outcome,
            }
        };
        match outcome {
            Ok(None) => Waited::Again,
            Ok(Some(handoff)) => {
                let owner = match &handoff {
                    Handoff::Lease { owner, .. } | Handoff::Free { owner, .. } => *owner,
                };
                Waited::Front {
                    owner,
                    handoff: Some(handoff),
                }
            }
            Err(owner) => Waited::Front {
                owner,
                handoff: None,
            },
        }
    }
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        if let Some(handoff) = self.handoff.close() {
            pass_on(self.inner, self.key, handoff);
        }
    }
}

/// An offer its waiter did not take in time is passed on as if the waiter
/// had gone.
impl PassOn for ClientInner {
    fn queues(&self) -> &Queues {
        &self.queues
    }

    fn pass_on(self: Arc<Self>, key: &Arc<str>, handoff: Handoff) {
        observe::offer_withdrawn(key);
        pass_on(&self, key, handoff);
    }
}

/// Passes on a hand-off its receiver will never use.
pub(crate) fn pass_on(inner: &Arc<ClientInner>, key: &Arc<str>, handoff: Handoff) {
    let (handed, owner) = match handoff {
        Handoff::Free { after, owner } => return inner.queues.pass_front(key, owner, after),
        Handoff::Lease { lease, owner } => (lease, owner),
    };
    let held = Held::one(key.clone(), handed.token.clone());
    let until = handed.valid_until;
    let usable = Instant::now() + MIN_TTL < handed.valid_until;
    let spent =
        match inner
            .queues
            .hand_off(key, owner, move || usable.then_some(handed), inner.handoff)
        {
            Next::HandedOver => return,
            Next::NotFirst => {
                return inner.release_in_background(held, LetGo::Release, until);
            }
            Next::Release { spent } => spent,
        };
    inner.release_in_background(held, LetGo::Release, until);
    inner
        .queues
        .pass_front(key, owner, if spent { YIELD } else { Duration::ZERO });
}

/// The writer mark of a lock; shares its hash slot.
pub(crate) fn writer_key(storage_key: &str) -> String {
    let mut out = String::with_capacity(storage_key.len() + 7);
    out.push_str(storage_key);
    out.push_str(":writer");
    out
}

/// The fencing counter of a lock; shares its hash slot.
pub(crate) fn fence_key(storage_key: &str) -> String {
    let mut out = String::with_capacity(storage_key.len() + 6);
    out.push_str(storage_key);
    out.push_str(":fence");
    out
}
