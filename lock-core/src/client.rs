//! [`LockClient`]: the one way in.

mod builder;
mod leader;
mod operators;

pub use builder::LockClientBuilder;
pub use leader::Leadership;
pub use operators::{LockCursor, LockKind, LockPage, LockState, LockWaiter};

use crate::acquire;
use crate::backend::{Backend, MemoryStore};
use crate::client_state::{ClientInner, Settings};
use crate::current;
use crate::error::{ErrorKind, LockError};
use crate::guard::LockGuard;
use crate::kept;
use crate::lease::{Lease, Scope};
use crate::observe;
use crate::options::{LockOptions, Mode};
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::AtomicU32;
use std::time::Duration;
use tokio::time::Instant;
use tracing::Instrument;

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
    /// The client for checked settings and a backend.
    pub(crate) fn assemble(settings: Settings, backend: Backend) -> LockClient {
        LockClient {
            inner: ClientInner::assemble(settings, backend),
        }
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
        LockClient::assemble(
            LockClientBuilder::default().settings(),
            Backend::Memory(store.clone()),
        )
    }

    /// Takes the lock `key` for `ttl`, waiting up to the client's default
    /// wait. The lease is renewed until the guard is released or dropped.
    ///
    /// Errors: [`ErrorKind::Contended`] when the wait ran out,
    /// [`ErrorKind::Unavailable`] when Redis did not answer,
    /// [`ErrorKind::InvalidKey`], [`ErrorKind::Config`] for a ttl out of range.
    ///
    /// ```
    /// use lock_core::LockClient;
    /// use std::time::Duration;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), lock_core::LockError> {
    /// let client = LockClient::in_memory();
    /// let guard = client.lock("order:42", Duration::from_secs(30)).await?;
    /// // ... the work the lock protects ...
    /// assert!(guard.release().await?, "it was still ours");
    /// # Ok(()) }
    /// ```
    pub async fn lock(&self, key: &str, ttl: Duration) -> Result<LockGuard, LockError> {
        self.lock_with(key, LockOptions::new(ttl)).await
    }

    /// One attempt: `Ok(None)` when someone else holds the lock.
    ///
    /// ```
    /// use lock_core::{LockClient, MemoryStore};
    /// use std::time::Duration;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), lock_core::LockError> {
    /// let store = MemoryStore::new();
    /// let (replica_a, replica_b) = (LockClient::in_memory_on(&store), LockClient::in_memory_on(&store));
    /// let ttl = Duration::from_secs(60);
    /// let running = replica_a.try_lock("nightly-report", ttl).await?.expect("free");
    /// // Replica b skips the job at once instead of waiting.
    /// assert!(replica_b.try_lock("nightly-report", ttl).await?.is_none());
    /// running.release().await?;
    /// # Ok(()) }
    /// ```
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
    /// ```
    /// use lock_core::{LockClient, LockOptions};
    /// use std::time::Duration;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), lock_core::LockError> {
    /// let client = LockClient::in_memory();
    /// let options = LockOptions::new(Duration::from_secs(10))
    ///     .wait(Duration::from_secs(2))
    ///     .fencing(true);
    /// let guard = client.lock_with("ledger", options).await?;
    /// let token = guard.fencing_token().expect("asked for one");
    /// // Give `token` to the storage; it refuses any lower one from now on.
    /// # let _ = token;
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// Tasks of this process that ask for the same key queue in arrival
    /// order, and only the first talks to Redis (see
    /// [`HandoffBudget`](crate::HandoffBudget)); across processes, a waiter
    /// hears a release at once through Redis pub/sub, with its backoff timer
    /// as the fallback.
    ///
    /// # Dropped or kept
    ///
    /// Dropped before it completes, the future leaves nothing behind: a
    /// lock its `SET` may have taken is released, and the next task of the
    /// queue moves up. Kept without being polled again, it does the same on
    /// its own once it has been woken (by its answer, the key's release or
    /// its backoff timer) and left unpolled for 30-40 ms: it holds no other
    /// task up and leaves no key held. Polled again after that, it starts
    /// over within what is left of its wait, and is given twice as long the
    /// next time: a task that is only polled late still gets through.
    ///
    /// # Re-entry
    ///
    /// Inside a `#[distributed_lock]` body, asking for a key that body (or
    /// an enclosing one of the same task) holds through this client (or a
    /// clone of it) **re-enters**: the guard comes at once, with no Redis
    /// command and no queueing, and stands for the held lease (see
    /// [`LockGuard`]). Releasing or dropping it leaves the lock held; only
    /// the outermost body releases. A re-entry keeps the outer lease as it
    /// is:
    ///
    /// - `ttl`, `wait`, `renew`, `min_hold` and `max_hold` are checked as
    ///   usual but not applied: the lease keeps the outer ttl, renewal and
    ///   hold limits, and nothing is waited for.
    /// - The fencing token is the outer one. Asking for fencing when the
    ///   outer lock was taken without it is an [`ErrorKind::Config`] error:
    ///   there is no token to give, and taking one now would not fence the
    ///   writes made before.
    /// - When the outer lease is already known lost, the error is
    ///   [`ErrorKind::Lost`] at once.
    ///
    /// What does not re-enter, and waits like any other owner:
    ///
    /// - a task spawned inside the body: it is another task, and gets the
    ///   lock once the body releases it;
    /// - another client (not a clone of this one), even on the same servers;
    /// - a lock taken with the guard API outside any annotated body: a task
    ///   holding a guard that asks again for the same key waits for that
    ///   guard, up to the wait, and gets [`ErrorKind::Contended`].
    ///
    /// Futures the body awaits, joins or selects on run in its task and do
    /// re-enter.
    pub async fn lock_with(&self, key: &str, options: LockOptions) -> Result<LockGuard, LockError> {
        // Outside annotated bodies, the one cost here is a failed
        // task-local lookup.
        if let Some(lease) = current::held(&self.inner, key) {
            return self.reenter(key, &options, lease);
        }
        let span = tracing::debug_span!(
            "lock",
            key,
            attempts = tracing::field::Empty,
            waited_ms = tracing::field::Empty,
            outcome = tracing::field::Empty,
        );
        let key: Arc<str> = key.into();
        let inner = self.inner.clone();
        acquire_watched(
            key.clone(),
            (options, inner.default_wait, &self.inner.kept),
            span,
            move |options| {
                let (inner, key) = (inner.clone(), key.clone());
                async move {
                    let attempts = AtomicU32::new(0);
                    let acquired = inner.acquire_key(&key, options, &attempts).await;
                    (acquired, attempts.into_inner())
                }
            },
        )
        .await
    }

    /// Locks several keys at once, all or nothing, and returns one guard for
    /// them all.
    ///
    /// The keys are taken in one canonical order (sorted, duplicates
    /// collapsed to one), in Redis and in this process's queues, so two
    /// callers naming the same keys in opposite orders never deadlock. Each
    /// attempt takes every key or none: on one server (and on Redlock, on
    /// each server) one script sets them all or, when any is held, none; on
    /// Redis Cluster the keys of one hash slot go in one script and the
    /// slots are taken in order, undoing what was taken when one is held.
    /// The guard renews every key, and the lock counts as lost when any key
    /// is lost. With fencing each key has its own token
    /// ([`LockGuard::fencing_token_of`]).
    ///
    /// Only exclusive locks: [`LockOptions::shared`] and
    /// [`LockOptions::permits`] are refused with
    /// [`ErrorKind::Config`].
    ///
    /// ```
    /// use lock_core::{LockClient, LockOptions};
    /// use std::time::Duration;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), lock_core::LockError> {
    /// let client = LockClient::in_memory();
    /// let options = LockOptions::new(Duration::from_secs(30));
    /// // A transfer holds both accounts; another one from 3 to 7 waits for it.
    /// let both = client.lock_all(&["account:7", "account:3"], options).await?;
    /// assert!(client.try_lock("account:3", Duration::from_secs(30)).await?.is_none());
    /// both.release().await?;
    /// # Ok(()) }
    /// ```
    pub async fn lock_all(
        &self,
        keys: &[&str],
        options: LockOptions,
    ) -> Result<LockGuard, LockError> {
        if options.mode != Mode::Exclusive {
            return Err(LockError::options(
                "lock_all takes exclusive locks only: shared locks and permits are one key each",
            ));
        }
        let keys = acquire::canonical(keys);
        let Some(&first) = keys.first() else {
            return Err(LockError::new(ErrorKind::InvalidKey)
                .with_message("lock_all needs at least one key"));
        };
        if keys.len() == 1 {
            return self.lock_with(first, options).await;
        }
        if let Some(guard) = self.reenter_all(&keys, &options)? {
            return Ok(guard);
        }
        let span = tracing::debug_span!(
            "lock",
            key = first,
            keys = keys.len(),
            attempts = tracing::field::Empty,
            waited_ms = tracing::field::Empty,
            outcome = tracing::field::Empty,
        );
        let keys: Arc<[Arc<str>]> = keys.iter().map(|&key| Arc::from(key)).collect();
        let inner = self.inner.clone();
        acquire_watched(
            keys[0].clone(),
            (options, inner.default_wait, &self.inner.kept),
            span,
            move |options| {
                let (inner, keys) = (inner.clone(), keys.clone());
                async move {
                    let attempts = AtomicU32::new(0);
                    let acquired = inner.acquire_keys(&keys, options, &attempts).await;
                    (acquired, attempts.into_inner())
                }
            },
        )
        .await
    }

    /// A re-entry of several keys, when one lock an enclosing annotated
    /// body of this task holds covers them all; an error when such bodies
    /// hold only some of them (waiting for the rest would wait on this task
    /// itself, or take the keys out of canonical order).
    fn reenter_all(
        &self,
        keys: &[&str],
        options: &LockOptions,
    ) -> Result<Option<LockGuard>, LockError> {
        let held: Vec<Option<Arc<Lease>>> = keys
            .iter()
            .map(|key| current::held(&self.inner, key))
            .collect();
        if held.iter().all(Option::is_none) {
            return Ok(None);
        }
        let one = held[0].as_ref().filter(|first| {
            held.iter()
                .all(|h| h.as_ref().is_some_and(|h| Arc::ptr_eq(h, first)))
        });
        match one {
            Some(lease) => self.reenter(keys[0], options, lease.clone()).map(Some),
            None => Err(LockError::new(ErrorKind::WouldDeadlock)
                .with_key(keys[0])
                .with_message(
                    "this task already holds some of these keys (in an enclosing annotated \
                     body) but not all of them under one lock: take every key it needs in \
                     one lock_all, outermost",
                )),
        }
    }

    /// A re-entry of `lease`, which an enclosing annotated body of this task
    /// holds on `key`; the rules are in [`lock_with`](Self::lock_with).
    fn reenter(
        &self,
        key: &str,
        options: &LockOptions,
        lease: Arc<Lease>,
    ) -> Result<LockGuard, LockError> {
        // Bad options are a bug wherever the call is made: reported the same
        // inside a body as outside.
        options
            .check(self.inner.default_wait)
            .map_err(|e| e.with_key(key))?;
        if options.fences() && lease.fence_of(key).is_none() {
            return Err(LockError::options(
                "fencing asked for on a lock this task already holds without a fencing token; \
                 take the outermost lock with fencing",
            )
            .with_key(key));
        }
        if lease.is_shared() && options.mode == Mode::Exclusive {
            return Err(LockError::new(ErrorKind::WouldDeadlock)
                .with_key(key)
                .with_message(
                    "this task holds the key shared (or with a permit) in an enclosing \
                     annotated body, and an exclusive lock waits until every shared \
                     holder lets go: it would wait for itself; take the outermost lock \
                     exclusive",
                ));
        }
        if let (Scope::Shared(held), Mode::Shared | Mode::Permits(_)) =
            (&lease.held.scope, options.mode)
        {
            let asked = acquire::shared_marker(options.mode);
            if held.marker != asked {
                return Err(acquire::mismatch(&held.marker, &asked).with_key(key));
            }
        }
        if lease.is_lost() {
            return Err(LockError::lost(key, lease.loss_reason()));
        }
        observe::reentered(key);
        Ok(LockGuard::reentry(self.inner.clone(), lease, key))
    }

    /// The Redis key a lock named `key` is stored under: the prefix, then the
    /// key inside braces (a hash tag, so the lock and its fence counter share
    /// a Redis Cluster slot).
    pub fn storage_key(&self, key: &str) -> Result<String, LockError> {
        self.inner.storage_key(key)
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

    /// One round trip to Redis, bounded by the operation timeout.
    pub async fn ping(&self) -> Result<(), LockError> {
        self.inner.backend.ping(self.inner.op_timeout).await
    }
}

/// Hooks for the workspace's tests and benchmarks, with the `testing`
/// feature. **Not a stable API**: they may change or go in any release.
#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
impl LockClient {
    /// The renewal capacity the heartbeat measured, in leases renewed a
    /// second of its busy time (`None` before its first round). New leases
    /// are refused past a share of it ([`ErrorKind::AtCapacity`](crate::ErrorKind::AtCapacity)).
    pub fn renewal_capacity(&self) -> Option<f64> {
        self.inner.heartbeat.capacity()
    }

    /// Caps the renewal capacity at `renewals_per_second`, whatever the
    /// heartbeat measures, so that a test reaches it with a few locks (a
    /// lease asks three renewals per ttl).
    pub fn limit_renewal_capacity(&self, renewals_per_second: f64) {
        self.inner
            .heartbeat
            .set_capacity_ceiling(renewals_per_second);
    }

    /// How many keys some task of this client holds, or waits for or is
    /// acquiring, in its in-process queue: back to zero once every guard is
    /// released or dropped and no acquisition is under way. For tests that
    /// check nothing is left behind.
    pub fn queued_keys(&self) -> usize {
        self.inner.queues.len()
    }
}

/// Runs the acquisition `start` makes, with `options` (waiting
/// `default_wait` unless they say), recorded in `span`
/// and the metrics. Should it be kept unpolled after a wake-up, it is
/// dropped, and started again (with what is left of the wait) if polled
/// again: see `kept.rs`. `start`'s future gives the result and the number
/// of attempts made.
async fn acquire_watched<S, F>(
    first: Arc<str>,
    (options, default_wait, watcher): (LockOptions, Duration, &Arc<kept::Watcher>),
    span: tracing::Span,
    start: S,
) -> Result<LockGuard, LockError>
where
    S: Fn(LockOptions) -> F + Unpin,
    F: Future<Output = (Result<LockGuard, LockError>, u32)> + Send + 'static,
{
    let started = Instant::now();
    let label = options.label;
    // Counted while the acquisition is under way; dropped with it, even
    // when the caller drops this future while it waits.
    let _waiting = observe::Waiting::start(label);
    let wait = options.wait.unwrap_or(default_wait);
    let acquired = kept::watched(watcher, first, started.into_std(), wait, move |left| {
        start(options.clone().wait(left))
    });
    // (The attempts of its last start, should a kept acquisition have
    // started over.)
    let (result, attempts) = acquired.instrument(span.clone()).await;
    observe::acquisition(&span, result.as_ref().map(drop), attempts, started, label);
    result
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
}
