//! [`LockClient`] and its builder: the one way in.

use crate::backend::{
    Attempt, Backend, ClusterNode, LockKeys, MemoryStore, MinReplicas, Node, Quorum, Subscription,
    Wakeups, redact,
};
use crate::backoff::Backoff;
use crate::error::{ErrorKind, LockError};
use crate::guard::{Holds, Lease, LockGuard, validity_end};
use crate::heartbeat::Heartbeat;
use crate::line::{Baton, HandedLease, HandoffBudget, LetGo, Lines, Owner, Place, Turn, YIELD};
use crate::observe;
use crate::token::Token;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::time::Instant;
use tracing::Instrument;

/// The longest key accepted, prefix included.
pub const MAX_KEY_LEN: usize = 1024;

/// The shortest ttl accepted: a renewal every ttl/3 must have a chance to
/// finish a round trip.
pub const MIN_TTL: Duration = Duration::from_millis(10);

/// The longest ttl or wait accepted (24 hours): anything longer is a unit
/// mistake.
pub const MAX_DURATION: Duration = Duration::from_secs(24 * 60 * 60);

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
    ttl: Duration,
    wait: Option<Duration>,
    renew: bool,
    fencing: bool,
    holds: Holds,
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
            holds: Holds::default(),
        }
    }

    /// How long [`LockClient::lock_with`] may wait for the lock.
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
    /// (default `false`). It costs a counter key per lock key that never
    /// expires.
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

/// A connection to where the locks live, shared by every task of a process.
///
/// Build one at startup with [`LockClient::builder`], then either install it
/// with [`set_global_client`](crate::set_global_client) or pass it (by
/// reference, `Arc` or clone: clones share one connection) to the code that
/// locks. It is `Send + Sync`, and it keeps working when the tokio runtime it
/// was built on has ended and another one uses it.
///
/// ```no_run
/// # async fn demo() -> Result<(), lock_core::LockError> {
/// use std::time::Duration;
///
/// let client = lock_core::LockClient::builder()
///     .url("redis://127.0.0.1:6379")
///     .key_prefix("myapp:lock:")
///     .build()
///     .await?;
/// let guard = client.lock("order:42", Duration::from_secs(30)).await?;
/// // ... only one holder across the fleet runs this ...
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct LockClient {
    pub(crate) inner: Arc<ClientInner>,
}

pub(crate) struct ClientInner {
    pub(crate) backend: Backend,
    prefix: String,
    default_ttl: Duration,
    default_wait: Duration,
    pub(crate) op_timeout: Duration,
    backoff: Backoff,
    pub(crate) heartbeat: Heartbeat,
    pub(crate) lines: Lines,
    pub(crate) handoff: HandoffBudget,
    wakeups: Wakeups,
}

impl fmt::Debug for LockClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockClient")
            .field("backend", &self.inner.backend.describe())
            .field("prefix", &self.inner.prefix)
            .field("default_ttl", &self.inner.default_ttl)
            .field("default_wait", &self.inner.default_wait)
            .field("operation_timeout", &self.inner.op_timeout)
            .finish()
    }
}

impl LockClient {
    /// Starts configuring a client.
    pub fn builder() -> LockClientBuilder {
        LockClientBuilder::default()
    }

    /// A client whose locks live in this process's memory, with the
    /// builder's defaults: for unit tests of code that locks, without a
    /// Redis server. Leases, renewal, loss, fencing, contention, waits and
    /// release checks behave as with one Redis server; clones of the client
    /// share its locks. For several clients on one store (replicas of a
    /// service in one test), see [`in_memory_on`](Self::in_memory_on).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lock_core::LockError> {
    /// let client = lock_core::LockClient::in_memory();
    /// let guard = client.lock("order:42", std::time::Duration::from_secs(30)).await?;
    /// assert!(client.try_lock("order:42", std::time::Duration::from_secs(30)).await?.is_none());
    /// assert!(guard.release().await?);
    /// # Ok(()) }
    /// ```
    pub fn in_memory() -> LockClient {
        LockClient::in_memory_on(&MemoryStore::new())
    }

    /// An in-memory client on `store`, with the builder's defaults: every
    /// client on one store sees the same locks.
    pub fn in_memory_on(store: &MemoryStore) -> LockClient {
        LockClient::assemble(LockClientBuilder::default(), Backend::Memory(store.clone()))
    }

    /// The client for a checked configuration and its backend.
    fn assemble(settings: LockClientBuilder, backend: Backend) -> LockClient {
        let wakeups = backend.wakeups();
        LockClient {
            inner: Arc::new(ClientInner {
                backend,
                lines: Lines::default(),
                handoff: settings.handoff,
                wakeups,
                prefix: settings.prefix,
                default_ttl: settings.default_ttl,
                default_wait: settings.default_wait,
                op_timeout: settings.op_timeout,
                backoff: settings.backoff,
                heartbeat: Heartbeat::default(),
            }),
        }
    }

    /// Takes the lock `key` for `ttl`, waiting up to the client's default
    /// wait. The lease is renewed until the guard is released or dropped.
    ///
    /// Errors: [`ErrorKind::Contended`] when the wait ran out,
    /// [`ErrorKind::Unavailable`] when Redis did not answer,
    /// [`ErrorKind::InvalidKey`], [`ErrorKind::Config`] for a ttl out of range.
    pub async fn lock(&self, key: &str, ttl: Duration) -> Result<LockGuard, LockError> {
        self.lock_with(key, LockOptions::new(ttl)).await
    }

    /// One attempt: `Ok(None)` when someone else holds the lock.
    pub async fn try_lock(&self, key: &str, ttl: Duration) -> Result<Option<LockGuard>, LockError> {
        match self
            .lock_with(key, LockOptions::new(ttl).wait(Duration::ZERO))
            .await
        {
            Ok(guard) => Ok(Some(guard)),
            Err(e) if e.kind() == ErrorKind::Contended => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Takes the lock `key` as `options` say.
    ///
    /// Tasks of this process that ask for the same key queue in arrival
    /// order, and only the first talks to Redis (see
    /// [`HandoffBudget`](crate::HandoffBudget)); across processes, a waiter
    /// hears a release at once through Redis pub/sub, with its backoff timer
    /// as the fallback.
    pub async fn lock_with(&self, key: &str, options: LockOptions) -> Result<LockGuard, LockError> {
        let span = tracing::debug_span!(
            "lock",
            key,
            attempts = tracing::field::Empty,
            waited_ms = tracing::field::Empty,
            outcome = tracing::field::Empty,
        );
        let attempts = AtomicU32::new(0);
        let started = Instant::now();
        let result = self
            .acquire(key, options, &attempts)
            .instrument(span.clone())
            .await;
        observe::acquisition(
            &span,
            result.as_ref().map(drop),
            attempts.load(Ordering::Relaxed),
            started,
        );
        result
    }

    async fn acquire(
        &self,
        key: &str,
        options: LockOptions,
        attempts: &AtomicU32,
    ) -> Result<LockGuard, LockError> {
        let request = self.request(key, &options)?;
        let inner = &self.inner;
        let (owner, baton) = self.join_queue(&request).await?;
        let turn = Turn::new(&inner.lines, &request.storage_key, owner);
        let turn = match baton {
            Some(Baton::Lease(handed, _)) => match self.take_over(&request, handed, turn).await {
                Ok(guard) => return Ok(guard),
                Err(turn) => turn,
            },
            Some(Baton::Turn { after, .. }) if after > Duration::ZERO => {
                tokio::time::sleep_until(request.deadline.min(Instant::now() + after)).await;
                turn
            }
            _ => turn,
        };
        self.contend(&request, turn, attempts).await
    }

    /// Checks `options` and works out what an acquisition of `key` needs.
    fn request<'k>(&self, key: &'k str, options: &LockOptions) -> Result<Request<'k>, LockError> {
        let inner = &self.inner;
        let ttl = options.ttl;
        check_duration("ttl", ttl, MIN_TTL).map_err(|e| e.with_key(key))?;
        let wait = options.wait.unwrap_or(inner.default_wait);
        check_duration("wait", wait, Duration::ZERO).map_err(|e| e.with_key(key))?;
        options.holds.check(ttl).map_err(|e| e.with_key(key))?;
        let storage_key = self.shared_storage_key(key)?;
        let fence_key = options.fencing.then(|| fence_key(&storage_key));
        let started = Instant::now();
        let deadline = started + wait;
        Ok(Request {
            key,
            key_at: inner.prefix.len() + 1,
            storage_key,
            fence_key,
            ttl,
            renew: options.renew,
            holds: options.holds,
            started,
            deadline,
            end: deadline + inner.backend.call_bound(ttl, inner.op_timeout),
        })
    }

    /// Joins this process's wait queue for the key: returns once this task
    /// is first, with the baton when one was handed over.
    async fn join_queue(&self, request: &Request<'_>) -> Result<(Owner, Option<Baton>), LockError> {
        let inner = &self.inner;
        let queue = request.deadline > request.started;
        loop {
            let place = inner
                .lines
                .join(&request.storage_key, queue)
                .ok_or_else(|| request.contended())?;
            let (baton, holder, ahead) = match place {
                Place::First(owner) => return Ok((owner, None)),
                Place::Behind {
                    baton,
                    holder,
                    owner,
                } => (baton, holder, owner),
            };
            let slot = BatonSlot {
                inner,
                key: &request.storage_key,
                baton,
            };
            match slot.wait(holder, ahead, request.deadline).await {
                InLine::TimedOut => return Err(request.contended()),
                InLine::Front(owner, baton) => return Ok((owner, baton)),
                InLine::Again => continue,
            }
        }
    }

    /// Takes over a lease the task ahead handed to this one. `Err(turn)`:
    /// it could not be taken over (expired, lost, or not transferable) and
    /// was let go; acquire the key afresh.
    async fn take_over<'a>(
        &self,
        request: &Request<'_>,
        handed: HandedLease,
        turn: Turn<'a>,
    ) -> Result<LockGuard, Turn<'a>> {
        let inner = &self.inner;
        let ttl = request.ttl;
        let now = Instant::now();
        if request.renew && request.fence_key.is_none() && now + MIN_TTL < handed.valid_until {
            // Nothing to change in Redis now: the lease stays as it is, and
            // the heartbeat sets it to our ttl when it is due (at once if
            // our ttl is the longer).
            let renew_at = handed
                .valid_until
                .checked_sub(ttl * 2 / 3)
                .unwrap_or(now)
                .max(now);
            let lease = request.lease(handed.token, None, handed.valid_until);
            return Ok(LockGuard::new(
                inner.clone(),
                lease,
                renew_at,
                true,
                turn,
                false,
            ));
        }
        let sent = Instant::now();
        if sent >= handed.valid_until {
            spawn_release(
                inner.clone(),
                request.storage_key.clone(),
                handed.token,
                None,
            );
            return Err(turn);
        }
        // Until the answer is in, the lease is this task's to let go: if the
        // call is cancelled, it is released in the background.
        let held = MayHold::new(inner, &request.storage_key, handed.token);
        let limit = request.limit(inner.op_timeout);
        let taken = inner
            .backend
            .take_over(request.keys(), held.token(), ttl, limit)
            .await;
        let Ok(Some(Attempt::Granted { fence })) = taken else {
            return Err(turn);
        };
        let lease = request.lease(held.keep(), fence, validity_end(sent, ttl));
        Ok(LockGuard::new(
            inner.clone(),
            lease,
            sent + ttl / 3,
            request.renew,
            turn,
            false,
        ))
    }

    /// Acquires the key in Redis, first in this process's queue: one
    /// attempt, then, while the key is held elsewhere, more attempts woken
    /// by its release message or the backoff timer, until the wait runs out.
    async fn contend(
        &self,
        request: &Request<'_>,
        turn: Turn<'_>,
        attempts: &AtomicU32,
    ) -> Result<LockGuard, LockError> {
        let inner = &self.inner;
        let mut attempt: u32 = 0;
        let mut subscription: Option<Subscription> = None;
        let mut subscribe = false;
        let mut listening = false;
        loop {
            if std::mem::take(&mut subscribe) {
                let limit = inner
                    .op_timeout
                    .min(request.deadline.saturating_duration_since(Instant::now()));
                subscription = inner.wakeups.subscribe(&request.storage_key, limit).await;
            }
            // Listen before asking, so a release in between is not missed.
            let mut released = std::pin::pin!(subscription.as_ref().map(Subscription::released));
            if let Some(released) = released.as_mut().as_pin_mut() {
                released.enable();
            }
            attempts.fetch_add(1, Ordering::Relaxed);
            let last_error = match self.attempt(request).await {
                Ok(Won(token, fence, sent)) => {
                    let ttl = request.ttl;
                    let lease = request.lease(token, fence, validity_end(sent, ttl));
                    return Ok(LockGuard::new(
                        inner.clone(),
                        lease,
                        sent + ttl / 3,
                        request.renew,
                        turn,
                        true,
                    ));
                }
                Err(Lost::Busy) => None,
                Err(Lost::Retry(e)) => Some(e),
                Err(Lost::Fail(e)) => {
                    return Err(e
                        .with_key(request.key)
                        .with_waited(request.started.elapsed()));
                }
            };
            let now = Instant::now();
            if now >= request.deadline {
                if let Some(e) = last_error {
                    return Err(e.with_key(request.key).with_waited(now - request.started));
                }
                return Err(self.contended_or_foreign(request).await);
            }
            if !listening && last_error.is_none() {
                // Held elsewhere: from now on, hear its release, and ask
                // again at once in case it came before we listened.
                listening = true;
                subscribe = true;
                continue;
            }
            let pause = inner
                .backoff
                .delay(attempt)
                .min(request.deadline.saturating_duration_since(Instant::now()));
            attempt = attempt.saturating_add(1);
            observe::retry(request.key, attempt, pause);
            match released.as_mut().as_pin_mut() {
                Some(released) => {
                    let _ = tokio::time::timeout(pause, released).await;
                }
                None => tokio::time::sleep(pause).await,
            }
        }
    }

    /// One attempt in Redis, with a token of its own: a late answer to an
    /// earlier attempt (or its undo) can never touch a later one's key.
    async fn attempt(&self, request: &Request<'_>) -> Result<Won, Lost> {
        let inner = &self.inner;
        // Should this future be dropped before the answer is in, the SET may
        // still be applied: the token is then released in the background.
        let held = MayHold::new(inner, &request.storage_key, Token::generate());
        let limit = request.limit(inner.op_timeout);
        let sent = Instant::now();
        // Every backend bounds the call by `limit` as a whole.
        let outcome = inner
            .backend
            .acquire(request.keys(), held.token(), request.ttl, limit)
            .await;
        match outcome {
            Ok(Attempt::Granted { fence }) => Ok(Won(held.keep(), fence, sent)),
            Ok(Attempt::Busy) => {
                held.keep();
                Err(Lost::Busy)
            }
            // The SET may have been applied with its answer lost: `held`
            // releases that token as it goes.
            Err(e) if e.kind() == ErrorKind::Unavailable => Err(Lost::Retry(e)),
            Err(e) => Err(Lost::Fail(e)),
        }
    }

    /// The error for a wait that ran out: `Contended`, unless the key is not
    /// a lock at all (checked only on this failure path, and only within
    /// what is left of the acquisition's bound).
    async fn contended_or_foreign(&self, request: &Request<'_>) -> LockError {
        let inner = &self.inner;
        let waited = request.started.elapsed();
        let limit = request.limit(inner.op_timeout);
        let storage_key = &request.storage_key;
        if limit > Duration::ZERO
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

    /// The Redis key a lock named `key` is stored under: the prefix, then the
    /// key inside braces (a hash tag, so the lock and its fence counter share
    /// a Redis Cluster slot).
    pub fn storage_key(&self, key: &str) -> Result<String, LockError> {
        let len = self.storage_key_len(key)?;
        let mut out = String::with_capacity(len);
        out.push_str(&self.inner.prefix);
        out.push('{');
        out.push_str(key);
        out.push('}');
        Ok(out)
    }

    /// [`storage_key`](Self::storage_key) as shared text: the lease and the
    /// process's line for the key share it.
    fn shared_storage_key(&self, key: &str) -> Result<Arc<str>, LockError> {
        self.storage_key(key).map(Arc::from)
    }

    /// The length of the storage key of `key`, or why `key` is not valid.
    fn storage_key_len(&self, key: &str) -> Result<usize, LockError> {
        if key.is_empty() {
            return Err(
                LockError::new(ErrorKind::InvalidKey).with_message("a lock key must not be empty")
            );
        }
        let len = self.inner.prefix.len() + key.len() + 2;
        if len > MAX_KEY_LEN {
            return Err(LockError::new(ErrorKind::InvalidKey).with_message(format!(
                "the key is {len} bytes with its prefix; the limit is {MAX_KEY_LEN}"
            )));
        }
        Ok(len)
    }

    /// The prefix every key this client writes starts with.
    pub fn key_prefix(&self) -> &str {
        &self.inner.prefix
    }

    /// The ttl used when none is given (the attribute without `ttl`).
    pub fn default_ttl(&self) -> Duration {
        self.inner.default_ttl
    }

    /// How long [`lock`](Self::lock) waits when no wait is given.
    pub fn default_wait(&self) -> Duration {
        self.inner.default_wait
    }

    /// The bound on each Redis call.
    pub fn operation_timeout(&self) -> Duration {
        self.inner.op_timeout
    }

    /// How many leases the heartbeat is renewing now: one per held guard
    /// with renewal on. Back to zero once every guard is released or
    /// dropped.
    pub fn heartbeats_running(&self) -> usize {
        self.inner.heartbeat.len()
    }

    /// How many keys some task of this client holds, or waits for or is
    /// acquiring, in its in-process queue: back to zero once every guard is
    /// released or dropped and no acquisition is under way. For tests that
    /// check nothing is left behind; not a stable API.
    #[doc(hidden)]
    pub fn queued_keys(&self) -> usize {
        self.inner.lines.len()
    }

    /// One round trip to Redis, bounded by the operation timeout.
    pub async fn ping(&self) -> Result<(), LockError> {
        self.inner.backend.ping(self.inner.op_timeout).await
    }
}

/// What one acquisition needs to know, worked out once.
struct Request<'k> {
    /// The key as the caller named it.
    key: &'k str,
    storage_key: Arc<str>,
    /// Where `key` starts in `storage_key`.
    key_at: usize,
    fence_key: Option<String>,
    ttl: Duration,
    renew: bool,
    holds: Holds,
    started: Instant,
    /// When the wait runs out: no attempt starts later.
    deadline: Instant,
    /// The deadline plus one call's bound: nothing waits on Redis past it.
    end: Instant,
}

impl Request<'_> {
    fn keys(&self) -> LockKeys<'_> {
        LockKeys {
            lock: &self.storage_key,
            fence: self.fence_key.as_deref(),
        }
    }

    /// The bound of one call: `call`, cut to what is left before `end`.
    fn limit(&self, call: Duration) -> Duration {
        call.min(self.end.saturating_duration_since(Instant::now()))
    }

    fn contended(&self) -> LockError {
        LockError::new(ErrorKind::Contended)
            .with_key(self.key)
            .with_waited(self.started.elapsed())
    }

    fn lease(&self, token: Token, fence: Option<u64>, valid_until: Instant) -> Lease {
        Lease::new(
            self.storage_key.clone(),
            self.key_at,
            token,
            fence,
            self.ttl,
            valid_until,
            self.holds,
        )
    }
}

/// A won attempt: the token now stored under the key, the fencing token,
/// and when the command was sent (where the lease's validity starts).
struct Won(Token, Option<u64>, Instant);

/// Why an attempt did not win.
enum Lost {
    /// Someone else holds the key.
    Busy,
    /// No answer, or a passing one (the server loading, busy, failing
    /// over): try again within the wait.
    Retry(LockError),
    /// An answer that waiting will not change.
    Fail(LockError),
}

/// A token that may be stored under a key while a call about it is in
/// flight. Dropped before [`keep`](Self::keep) (the caller's future dropped,
/// the call failed or timed out), it is released in the background, so a
/// cancelled acquisition never leaves the key held by nobody until its ttl.
struct MayHold<'a> {
    inner: &'a Arc<ClientInner>,
    key: &'a Arc<str>,
    token: Token,
    armed: bool,
}

impl<'a> MayHold<'a> {
    fn new(inner: &'a Arc<ClientInner>, key: &'a Arc<str>, token: Token) -> MayHold<'a> {
        MayHold {
            inner,
            key,
            token,
            armed: true,
        }
    }

    fn token(&self) -> &Token {
        &self.token
    }

    /// The outcome is known: nothing to release (the lock is ours, or was
    /// never taken).
    fn keep(mut self) -> Token {
        self.armed = false;
        self.token.clone()
    }
}

impl Drop for MayHold<'_> {
    fn drop(&mut self) {
        if self.armed {
            let token = self.token.clone();
            spawn_release(self.inner.clone(), self.key.clone(), token, None);
        }
    }
}

/// How a wait in the queue ended.
enum InLine {
    /// The wait ran out.
    TimedOut,
    /// First in line now, with the baton when one was handed over.
    Front(Owner, Option<Baton>),
    /// The line moved under us; join again.
    Again,
}

/// A waiter's place in the queue: the receiver of its baton.
///
/// Dropped before the baton was taken out (the wait ran out just as it came,
/// or the caller's future was dropped), it closes the channel and passes on
/// whatever was handed to it already: the turn to the next waiter, the
/// lease to the next waiter or back to Redis. A key is never left with a
/// waiter that is gone.
struct BatonSlot<'a> {
    inner: &'a Arc<ClientInner>,
    key: &'a Arc<str>,
    baton: oneshot::Receiver<Baton>,
}

impl BatonSlot<'_> {
    /// Waits behind the task ahead until it hands over, or until its lease
    /// is lost (then moves up front itself), or until `deadline`.
    async fn wait(mut self, holder: Option<Arc<Lease>>, ahead: Owner, deadline: Instant) -> InLine {
        let lines = &self.inner.lines;
        let key = self.key;
        let baton = &mut self.baton;
        let waited = async {
            if let Some(holder) = holder {
                tokio::select! {
                    received = &mut *baton => return received.ok(),
                    () = holder.lost() => {
                        if let Some(owner) = lines.overtake(key, ahead) {
                            return Some(Baton::Turn { after: Duration::ZERO, owner });
                        }
                    }
                }
            }
            baton.await.ok()
        };
        match tokio::time::timeout_at(deadline, waited).await {
            Err(_) => InLine::TimedOut,
            Ok(None) => InLine::Again,
            Ok(Some(baton)) => {
                let owner = match &baton {
                    Baton::Lease(_, owner) | Baton::Turn { owner, .. } => *owner,
                };
                InLine::Front(owner, Some(baton))
            }
        }
    }
}

impl Drop for BatonSlot<'_> {
    fn drop(&mut self) {
        self.baton.close();
        if let Ok(baton) = self.baton.try_recv() {
            pass_on(self.inner, self.key, baton);
        }
    }
}

/// Passes on a baton its receiver will never use.
fn pass_on(inner: &Arc<ClientInner>, key: &Arc<str>, baton: Baton) {
    let (handed, owner) = match baton {
        Baton::Turn { after, owner } => return inner.lines.pass(key, owner, after),
        Baton::Lease(handed, owner) => (handed, owner),
    };
    let token = handed.token.clone();
    let usable = Instant::now() + MIN_TTL < handed.valid_until;
    let spent =
        match inner
            .lines
            .let_go(key, owner, move || usable.then_some(handed), inner.handoff)
        {
            LetGo::HandedOff => return,
            LetGo::Ended => return spawn_release(inner.clone(), key.clone(), token, None),
            LetGo::Release { spent } => spent,
        };
    spawn_release(inner.clone(), key.clone(), token, None);
    inner
        .lines
        .pass(key, owner, if spent { YIELD } else { Duration::ZERO });
}

/// Releases a lock in the background, bounded by the operation timeout; does
/// nothing outside a tokio runtime (the lease then simply expires). With
/// `keep_for` (a `min_hold` not yet over) the lease is shortened to that
/// instead.
pub(crate) fn spawn_release(
    inner: Arc<ClientInner>,
    storage_key: Arc<str>,
    token: Token,
    keep_for: Option<Duration>,
) {
    if let Ok(handle) = tokio::runtime::Handle::try_current() {
        handle.spawn(async move {
            let limit = inner.op_timeout;
            let _ = match keep_for {
                Some(keep_for) => {
                    inner
                        .backend
                        .set_ttl(&storage_key, &token, keep_for, limit)
                        .await
                }
                None => inner.backend.release(&storage_key, &token, limit).await,
            };
        });
    }
}

/// The fencing counter of a lock; shares its hash slot.
fn fence_key(storage_key: &str) -> String {
    let mut out = String::with_capacity(storage_key.len() + 6);
    out.push_str(storage_key);
    out.push_str(":fence");
    out
}

fn check_duration(what: &str, value: Duration, min: Duration) -> Result<(), LockError> {
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

/// Configures a [`LockClient`]. Every setting but the URL has a default.
///
/// | setting | default |
/// | --- | --- |
/// | [`key_prefix`](Self::key_prefix) | `"lock:"` |
/// | [`default_ttl`](Self::default_ttl) | 30 s |
/// | [`default_wait`](Self::default_wait) | 10 s |
/// | [`operation_timeout`](Self::operation_timeout) | 2 s |
/// | [`connect_timeout`](Self::connect_timeout) | 5 s |
/// | [`backoff`](Self::backoff) | 10 ms doubling to 200 ms, full jitter |
/// | [`handoff_budget`](Self::handoff_budget) | 250 hand-offs within 10 ms |
/// | [`min_replicas`](Self::min_replicas) | off |
///
/// Where the locks live is chosen by exactly one of: [`url`](Self::url)
/// once (one server), [`url`](Self::url)/[`urls`](Self::urls) for three or
/// more servers (Redlock), [`sentinel`](Self::sentinel) (the primary that
/// Redis Sentinel names, followed across failovers),
/// [`cluster`](Self::cluster) (a Redis Cluster), or
/// [`in_memory`](Self::in_memory).
#[derive(Clone, Debug)]
#[must_use = "a builder does nothing until .build().await"]
pub struct LockClientBuilder {
    urls: Vec<String>,
    sentinel: Option<SentinelSettings>,
    sentinel_primary: Option<String>,
    cluster: Option<Vec<String>>,
    min_replicas: Option<MinReplicas>,
    prefix: String,
    default_ttl: Duration,
    default_wait: Duration,
    op_timeout: Duration,
    connect_timeout: Duration,
    node_timeout: Option<Duration>,
    backoff: Backoff,
    handoff: HandoffBudget,
    memory: Option<MemoryStore>,
    #[cfg(feature = "tls")]
    tls: Option<redis::TlsCertificates>,
}

impl Default for LockClientBuilder {
    fn default() -> Self {
        LockClientBuilder {
            urls: Vec::new(),
            sentinel: None,
            sentinel_primary: None,
            cluster: None,
            min_replicas: None,
            prefix: "lock:".to_owned(),
            default_ttl: Duration::from_secs(30),
            default_wait: Duration::from_secs(10),
            op_timeout: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(5),
            node_timeout: None,
            backoff: Backoff::default(),
            handoff: HandoffBudget::default(),
            memory: None,
            #[cfg(feature = "tls")]
            tls: None,
        }
    }
}

impl LockClientBuilder {
    /// A Redis server, as a `redis://` (or, with the `tls` feature,
    /// `rediss://`) URL; credentials go in it as
    /// `redis://user:password@host:port/db`.
    ///
    /// Called once: locks live on that server. Called for three or more
    /// independent primaries (or use [`urls`](Self::urls)): Redlock, where a
    /// lock is held on a majority of them.
    pub fn url(mut self, url: impl Into<String>) -> Self {
        self.urls.push(url.into());
        self
    }

    /// Redis Sentinel: locks live on the primary that the Sentinels at
    /// `sentinel_urls` (`redis://[user:password@]host:port`, the Sentinels'
    /// own credentials) name for `service_name` (the name in their
    /// `sentinel monitor <name> ...`).
    ///
    /// The client asks the Sentinels for the primary, checks that it answers
    /// `ROLE` as a primary, and keeps one connection to it. Whenever that
    /// connection is replaced (it broke, timed out, or its runtime ended) the
    /// Sentinels are asked again, all within the
    /// [`connect_timeout`](Self::connect_timeout). After a failover the old
    /// primary, if it still answers, answers writes with `READONLY`: the
    /// client then drops the connection and the call fails as
    /// [`ErrorKind::Unavailable`], which an acquisition retries within its
    /// wait, on the new primary. Renewals and releases are retried once at
    /// once on the new primary.
    ///
    /// The primary's user, password and database are not those of the
    /// Sentinel URLs: give them with
    /// [`sentinel_primary_credentials`](Self::sentinel_primary_credentials)
    /// (default: none, database 0). Plain TCP only (`redis://`).
    ///
    /// Release wake-ups (pub/sub) are not used with Sentinel: a waiter polls
    /// with its [`backoff`](Self::backoff), so it notices a release within
    /// one backoff step instead of at once.
    ///
    /// Replication is asynchronous: a lock acquired just before a failover
    /// may be missing on the new primary. See
    /// [`min_replicas`](Self::min_replicas) for what can be done about it.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_core::LockError> {
    /// use std::time::Duration;
    ///
    /// let client = lock_core::LockClient::builder()
    ///     .sentinel(
    ///         ["redis://10.0.0.1:26379", "redis://10.0.0.2:26379", "redis://10.0.0.3:26379"],
    ///         "mymaster",
    ///     )
    ///     .sentinel_primary_credentials("redis://:primary-password@primary/0")
    ///     .min_replicas(1, Duration::from_millis(100))
    ///     .build()
    ///     .await?;
    /// # drop(client); Ok(()) }
    /// ```
    pub fn sentinel<I, S>(mut self, sentinel_urls: I, service_name: impl Into<String>) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.sentinel = Some(SentinelSettings {
            urls: sentinel_urls.into_iter().map(Into::into).collect(),
            service: service_name.into(),
        });
        self
    }

    /// With [`sentinel`](Self::sentinel): the user, password and database
    /// for the primary (the same for whichever server is primary), as a URL
    /// `redis://[user:]password@host[/db]` whose host and port are ignored
    /// (the Sentinels name the server). Without it: no login, database 0.
    pub fn sentinel_primary_credentials(mut self, url: impl Into<String>) -> Self {
        self.sentinel_primary = Some(url.into());
        self
    }

    /// After each successful acquisition, waits for `replicas` replicas to
    /// acknowledge the lock's write (`WAIT replicas timeout` on the same
    /// connection, right after the `SET`), for at most `timeout`; with fewer
    /// acknowledgements the lock is deleted again (compare-and-delete) and
    /// the attempt counts as failed with [`ErrorKind::Unavailable`] ("the
    /// lock was not replicated to N replicas"): it is retried within the
    /// acquisition's wait, and the error is returned when the wait runs out.
    /// Default: off. One server or Sentinel only, not Redlock.
    ///
    /// What it guarantees: a lock handed to the caller had reached at least
    /// `replicas` replicas' memory, so a failover that promotes one of them
    /// keeps it. What it does not: replication stays asynchronous, and
    /// `WAIT` does not make the lock strongly consistent. A failover can
    /// still lose the lock when the promoted replica is not one that
    /// acknowledged (with more replicas than `replicas`), or when a replica
    /// that acknowledged restarts without persistence; renewals are not
    /// waited for (a promoted replica may have an older expiry, so the lock
    /// can expire there sooner than the holder thinks, by up to the part of
    /// the ttl renewed since); nor are the lease take-overs between tasks of
    /// one process. Fencing tokens remain the way to make the protected
    /// resource safe against two holders.
    ///
    /// Costs: a round trip per acquisition, and `WAIT` blocks the client's
    /// one shared connection until the replicas answer (normally well under
    /// a millisecond on a local network; up to `timeout` when they are
    /// missing), delaying other calls of the client meanwhile. `timeout`
    /// must be shorter than the [`operation_timeout`](Self::operation_timeout),
    /// which bounds the acquisition call and its `WAIT` together. An ACL
    /// user needs `+wait` too.
    pub fn min_replicas(mut self, replicas: u32, timeout: Duration) -> Self {
        self.min_replicas = Some(MinReplicas { replicas, timeout });
        self
    }

    /// Keeps the locks in this process's memory, in `store`, instead of
    /// Redis: for unit tests. Clients built on one store see the same locks.
    /// See [`LockClient::in_memory`].
    pub fn in_memory(mut self, store: &MemoryStore) -> Self {
        self.memory = Some(store.clone());
        self
    }

    /// A Redis Cluster, reached first through `urls`
    /// (`redis://[user:password@]host:port`; one node is enough, more help
    /// when some are down; the rest of the cluster is discovered).
    ///
    /// Each lock lives in the hash slot of its key: the key is stored as
    /// `<prefix>{<key>}` (and its fence counter as `<prefix>{<key>}:fence`),
    /// so every command of a lock goes to one primary, and locks spread over
    /// the primaries. Commands follow `MOVED`/`ASK` redirections and
    /// failovers. Release wake-ups subscribe on each given node (a
    /// `PUBLISH` reaches every node of a cluster).
    ///
    /// Plain TCP only (no TLS); [`min_replicas`](Self::min_replicas) is not
    /// available. Replication in a cluster is asynchronous: a failover
    /// right after an acquisition can lose the fresh lock.
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), lock_core::LockError> {
    /// let client = lock_core::LockClient::builder()
    ///     .cluster(["redis://10.0.0.1:7000", "redis://10.0.0.2:7000"])
    ///     .build()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn cluster<I, S>(mut self, urls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.cluster
            .get_or_insert_with(Vec::new)
            .extend(urls.into_iter().map(Into::into));
        self
    }

    /// Several independent Redis primaries (at least 3, not replicas of one
    /// another): selects Redlock. Adds to any URL given before.
    pub fn urls<I, S>(mut self, urls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.urls.extend(urls.into_iter().map(Into::into));
        self
    }

    /// Redlock only: the bound on each server's answer. Default: 5 % of the
    /// lock's ttl, at least 50 ms, at most the operation timeout. A server
    /// that is down or slow costs at most this, never the whole wait.
    pub fn node_timeout(mut self, timeout: Duration) -> Self {
        self.node_timeout = Some(timeout);
        self
    }

    /// The prefix of every key the client writes (default `"lock:"`).
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The ttl used when a caller gives none (the attribute without `ttl`).
    pub fn default_ttl(mut self, ttl: Duration) -> Self {
        self.default_ttl = ttl;
        self
    }

    /// How long an acquisition waits when the caller gives no wait.
    /// It is always bounded.
    pub fn default_wait(mut self, wait: Duration) -> Self {
        self.default_wait = wait;
        self
    }

    /// The bound on every Redis call (acquire attempt, renewal, release).
    pub fn operation_timeout(mut self, timeout: Duration) -> Self {
        self.op_timeout = timeout;
        self
    }

    /// The bound on opening a connection.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long the tasks of this process may pass a lease among themselves
    /// before it is released to other processes (default: 250 hand-offs
    /// within 10 ms). [`HandoffBudget::NONE`] turns hand-off off; the tasks
    /// of a process still queue in order.
    pub fn handoff_budget(mut self, budget: HandoffBudget) -> Self {
        self.handoff = budget;
        self
    }

    /// The delay between acquisition attempts.
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// Trusts the CA certificate(s) in `pem` (PEM text, one or more
    /// `-----BEGIN CERTIFICATE-----` blocks) for `rediss://` servers,
    /// instead of the system's trust store: for a server whose certificate
    /// a private CA issued. Called again, trusts those as well.
    ///
    /// Needs the `tls` feature.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let client = lock_core::LockClient::builder()
    ///     .url("rediss://redis.internal:6380")
    ///     .tls_root_certificate(std::fs::read("/etc/redis/ca.crt")?)
    ///     .build()
    ///     .await?;
    /// # drop(client); Ok(()) }
    /// ```
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub fn tls_root_certificate(mut self, pem: impl Into<Vec<u8>>) -> Self {
        let mut pem = pem.into();
        let tls = self.tls.get_or_insert(redis::TlsCertificates {
            client_tls: None,
            root_cert: None,
        });
        match &mut tls.root_cert {
            Some(roots) => {
                roots.push(b'\n');
                roots.append(&mut pem);
            }
            None => tls.root_cert = Some(pem),
        }
        self
    }

    /// Presents this client certificate (PEM chain) and private key (PEM,
    /// PKCS#8, PKCS#1 or SEC1) to `rediss://` servers that require one
    /// (mutual TLS, `tls-auth-clients yes`).
    ///
    /// Needs the `tls` feature.
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub fn tls_client_certificate(
        mut self,
        cert_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        let tls = self.tls.get_or_insert(redis::TlsCertificates {
            client_tls: None,
            root_cert: None,
        });
        tls.client_tls = Some(redis::ClientTlsConfig {
            client_cert: cert_pem.into(),
            client_key: key_pem.into(),
        });
        self
    }

    /// One server, with the TLS certificates when some were given.
    #[cfg(feature = "tls")]
    fn node(&self, url: &str) -> Result<Node, LockError> {
        match &self.tls {
            Some(tls) => Node::with_tls(url, self.connect_timeout, tls),
            None => Node::new(url, self.connect_timeout),
        }
    }

    /// One server.
    #[cfg(not(feature = "tls"))]
    fn node(&self, url: &str) -> Result<Node, LockError> {
        Node::new(url, self.connect_timeout)
    }

    /// The node that follows the primary the Sentinels name.
    fn sentinel_node(&self, sentinel: &SentinelSettings) -> Result<Node, LockError> {
        #[cfg(feature = "tls")]
        if self.tls.is_some() {
            return Err(LockError::config(
                "TLS certificates were configured, but TLS is not supported with Sentinel",
            ));
        }
        let primary = match &self.sentinel_primary {
            Some(url) => redis::IntoConnectionInfo::into_connection_info(url.as_str())
                .map_err(|e| {
                    LockError::config(format!(
                        "cannot use {:?} for the primary's credentials; write it as \
                         redis://[user:]password@host[/db]",
                        redact(url)
                    ))
                    .with_source(e)
                })?
                .redis_settings()
                .clone(),
            None => redis::RedisConnectionInfo::default(),
        };
        Node::sentinel(
            &sentinel.urls,
            &sentinel.service,
            primary,
            self.connect_timeout,
        )
    }

    /// The checks every kind of deployment shares: durations in range and
    /// a prefix that leaves room for keys.
    fn check_common(&self) -> Result<(), LockError> {
        check_duration("default_ttl", self.default_ttl, MIN_TTL)?;
        check_duration("default_wait", self.default_wait, Duration::ZERO)?;
        check_duration(
            "operation_timeout",
            self.op_timeout,
            Duration::from_millis(1),
        )?;
        check_duration(
            "connect_timeout",
            self.connect_timeout,
            Duration::from_millis(1),
        )?;
        if self.prefix.len() > MAX_KEY_LEN / 2 {
            return Err(LockError::config(format!(
                "key prefix is {} bytes; keep it under {}",
                self.prefix.len(),
                MAX_KEY_LEN / 2
            )));
        }
        Ok(())
    }

    /// Checks the configuration, connects and proves the server answers.
    ///
    /// Errors: [`ErrorKind::Config`] for invalid settings or URL,
    /// [`ErrorKind::Unavailable`] when the server cannot be reached within
    /// the connect timeout, [`ErrorKind::Server`] when it refuses (wrong
    /// password, an ACL without `PING`); [`ErrorKind::Config`] also for a
    /// `rediss://` URL without the `tls` feature and for a failed TLS
    /// handshake (a server certificate no trusted CA issued).
    pub async fn build(self) -> Result<LockClient, LockError> {
        if self.cluster.is_some() {
            return self.build_cluster().await;
        }
        match (self.urls.len(), &self.memory, &self.sentinel) {
            (0, Some(_), None) | (0, None, Some(_)) => {}
            (_, Some(_), _) => {
                return Err(LockError::config(
                    "both Redis URLs or Sentinels and an in-memory store given; choose one",
                ));
            }
            (_, None, Some(_)) => {
                return Err(LockError::config(
                    "both Redis URLs and Sentinels given; choose one (with Sentinel, give the \
                     primary's credentials with .sentinel_primary_credentials(...))",
                ));
            }
            (0, None, None) => {
                return Err(LockError::config(
                    "no Redis URL: call .url(\"redis://host:6379\") on the builder",
                ));
            }
            (2, None, None) => {
                return Err(LockError::config(
                    "2 Redis URLs: Redlock needs at least 3 independent servers \
                     (2 cannot outvote one failure); give 1, or 3 or more",
                ));
            }
            _ => {}
        }
        if self.sentinel_primary.is_some() && self.sentinel.is_none() {
            return Err(LockError::config(
                "sentinel_primary_credentials is only used with .sentinel(...)",
            ));
        }
        if let Some(min) = self.min_replicas {
            if self.memory.is_some() || self.urls.len() > 1 {
                return Err(LockError::config(
                    "min_replicas needs one Redis server or Sentinel, not Redlock or in-memory",
                ));
            }
            if min.replicas == 0 {
                return Err(LockError::config(
                    "min_replicas(0, ..) waits for nothing: give at least 1, or leave it off",
                ));
            }
            check_duration(
                "min_replicas timeout",
                min.timeout,
                Duration::from_millis(1),
            )?;
            if min.timeout >= self.op_timeout {
                return Err(LockError::config(format!(
                    "min_replicas timeout {:?} must be shorter than operation_timeout {:?}, \
                     which bounds the acquisition and its WAIT together",
                    min.timeout, self.op_timeout
                )));
            }
        }
        self.check_common()?;
        if let Some(timeout) = self.node_timeout {
            check_duration("node_timeout", timeout, Duration::from_millis(1))?;
        }
        if let Some(store) = &self.memory {
            let backend = Backend::Memory(store.clone());
            return Ok(LockClient::assemble(self, backend));
        }
        let mut nodes = match &self.sentinel {
            Some(sentinel) => vec![self.sentinel_node(sentinel)?],
            None => self
                .urls
                .iter()
                .map(|url| self.node(url))
                .collect::<Result<Vec<_>, _>>()?,
        };
        let backend = if nodes.len() == 1 {
            if let Some(node) = nodes.first_mut() {
                node.min_replicas = self.min_replicas;
            }
            nodes.into_iter().next().map(Backend::Single)
        } else {
            Some(Backend::Redlock(Quorum::new(nodes, self.node_timeout)))
        };
        let Some(backend) = backend else {
            return Err(LockError::config("no Redis URL"));
        };
        let shown: Vec<String> = match &self.sentinel {
            Some(sentinel) => vec![format!(
                "the primary of {:?} named by sentinels {}",
                sentinel.service,
                sentinel
                    .urls
                    .iter()
                    .map(|u| redact(u))
                    .collect::<Vec<_>>()
                    .join(", ")
            )],
            None => self.urls.iter().map(|u| redact(u)).collect(),
        };
        let ping_limit = self.connect_timeout.max(self.op_timeout);
        let client = LockClient::assemble(self, backend);
        client.inner.backend.ping(ping_limit).await.map_err(|e| {
            // A refusal (credentials, ACL, TLS certificate) keeps its
            // own explanation.
            if e.kind() != ErrorKind::Unavailable {
                return e;
            }
            e.with_message(format!(
                "cannot reach Redis at {}; check the URL and that the server runs",
                shown.join(", ")
            ))
        })?;
        Ok(client)
    }
}

impl LockClientBuilder {
    /// [`build`](Self::build) for a Redis Cluster.
    async fn build_cluster(self) -> Result<LockClient, LockError> {
        let urls = self.cluster.clone().unwrap_or_default();
        if !self.urls.is_empty() || self.sentinel.is_some() || self.memory.is_some() {
            return Err(LockError::config(
                "a Redis Cluster and Redis URLs, Sentinels or an in-memory store given; \
                 choose one",
            ));
        }
        if self.sentinel_primary.is_some() {
            return Err(LockError::config(
                "sentinel_primary_credentials is only used with .sentinel(...)",
            ));
        }
        if self.min_replicas.is_some() {
            return Err(LockError::config(
                "min_replicas is not available with a Redis Cluster",
            ));
        }
        #[cfg(feature = "tls")]
        if self.tls.is_some() {
            return Err(LockError::config(
                "TLS certificates were configured, but TLS is not supported with a Redis Cluster",
            ));
        }
        self.check_common()?;
        let node = ClusterNode::new(&urls, self.connect_timeout, self.op_timeout)?;
        let shown = node.addr().to_owned();
        let ping_limit = self.connect_timeout.max(self.op_timeout);
        let client = LockClient::assemble(self, Backend::Cluster(node));
        client.inner.backend.ping(ping_limit).await.map_err(|e| {
            if e.kind() != ErrorKind::Unavailable {
                return e;
            }
            e.with_message(format!(
                "cannot reach the Redis Cluster at {shown}; check the URLs and that it runs"
            ))
        })?;
        Ok(client)
    }
}

/// The Sentinels and the service name given to
/// [`LockClientBuilder::sentinel`].
#[derive(Clone, Debug)]
struct SentinelSettings {
    urls: Vec<String>,
    service: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn client_and_guard_are_send_sync() {
        assert_send_sync::<LockClient>();
        assert_send_sync::<LockGuard>();
    }

    #[tokio::test]
    async fn builder_without_url_is_a_config_error() {
        let err = LockClient::builder().build().await.err();
        assert_eq!(err.map(|e| e.kind()), Some(ErrorKind::Config));
    }

    #[tokio::test]
    async fn bad_url_is_a_config_error() {
        let err = LockClient::builder().url("http://nope").build().await.err();
        assert_eq!(err.map(|e| e.kind()), Some(ErrorKind::Config));
    }

    #[tokio::test]
    async fn zero_ttl_is_a_config_error() {
        let err = LockClient::builder()
            .url("redis://127.0.0.1:16999")
            .default_ttl(Duration::ZERO)
            .build()
            .await
            .err();
        assert_eq!(err.map(|e| e.kind()), Some(ErrorKind::Config));
    }

    #[test]
    fn durations_out_of_range_are_rejected() {
        assert!(check_duration("ttl", Duration::from_millis(9), MIN_TTL).is_err());
        assert!(check_duration("ttl", Duration::from_secs(25 * 3600), MIN_TTL).is_err());
        assert!(check_duration("ttl", Duration::from_secs(30), MIN_TTL).is_ok());
        assert!(check_duration("wait", Duration::ZERO, Duration::ZERO).is_ok());
    }
}
