//! [`LockClient::run_locked`]: a future run while a lock is held, the one
//! implementation behind `#[distributed_lock]` and the tower layer.

use crate::client::{Leadership, LockClient};
use crate::current::{self, LockInfo};
use crate::error::{ErrorKind, LockError};
use crate::global::DefaultClient;
use crate::guard::LockGuard;
use crate::options::LockOptions;
use futures::FutureExt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

/// What [`run_locked`](LockClient::run_locked) does when the lock is lost
/// while its future runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum OnLost {
    /// Drop the future at once (at its next `.await`, where it is waiting)
    /// and return the [`ErrorKind::Lost`] error. The default: work the lock
    /// no longer protects stops.
    #[default]
    Abort,
    /// Let the future finish and return its output: for work that must not
    /// be cut in the middle and checks [`current_lock`](crate::current_lock)
    /// or a fencing token itself.
    Continue,
}

/// How [`run_locked`](LockClient::run_locked) takes its lock and what it
/// does on loss: the [`LockOptions`] of one acquisition, with the ttl
/// optional (the client's default ttl when not given), and [`OnLost`].
///
/// The attribute's arguments, as a value: `ttl`, `wait`, `renew`,
/// `fencing`, `min_hold`, `max_hold`, `mode = "shared"`, `permits` and
/// `on_lost` are the methods of the same names. New settings may be added;
/// build it with [`RunOptions::new`] (or from `LockOptions`) and its
/// methods.
///
/// ```
/// use lock_core::{LockOptions, OnLost, RunOptions};
/// use std::time::Duration;
///
/// let options = RunOptions::new()
///     .ttl(Duration::from_secs(30))
///     .wait(Duration::from_secs(2))
///     .on_lost(OnLost::Abort);
/// assert_eq!(options.ttl_time(), Some(Duration::from_secs(30)));
/// // A `LockOptions` converts, with its ttl and every setting it has.
/// let fenced: RunOptions = LockOptions::new(Duration::from_secs(10)).fencing(true).into();
/// assert!(fenced.lock_options(Duration::from_secs(60)).fences());
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunOptions {
    /// `None`: the client's default ttl.
    ttl: Option<Duration>,
    /// Everything else of the acquisition; its ttl is replaced by the
    /// resolved one.
    lock: LockOptions,
    on_lost: OnLost,
}

impl Default for RunOptions {
    fn default() -> RunOptions {
        RunOptions::new()
    }
}

impl From<LockOptions> for RunOptions {
    fn from(lock: LockOptions) -> RunOptions {
        RunOptions {
            ttl: Some(lock.ttl()),
            lock,
            on_lost: OnLost::Abort,
        }
    }
}

impl RunOptions {
    /// The client's default ttl and wait, renewed, no fencing, exclusive,
    /// [`OnLost::Abort`].
    pub fn new() -> RunOptions {
        RunOptions {
            ttl: None,
            // Replaced by the client's default ttl when run.
            lock: LockOptions::new(Duration::ZERO),
            on_lost: OnLost::Abort,
        }
    }

    /// The lease length (default: the client's
    /// [`default_ttl`](LockClient::default_ttl)).
    pub fn ttl(mut self, ttl: Duration) -> RunOptions {
        self.ttl = Some(ttl);
        self
    }

    /// How long to wait for the lock (default: the client's
    /// [`default_wait`](LockClient::default_wait)); `Duration::ZERO` makes
    /// one attempt. See [`LockOptions::wait`].
    pub fn wait(mut self, wait: Duration) -> RunOptions {
        self.lock = self.lock.wait(wait);
        self
    }

    /// See [`LockOptions::renew`].
    pub fn renew(mut self, renew: bool) -> RunOptions {
        self.lock = self.lock.renew(renew);
        self
    }

    /// See [`LockOptions::fencing`]; the token is
    /// [`current_lock`](crate::current_lock)`().fencing_token()` inside the
    /// future.
    pub fn fencing(mut self, fencing: bool) -> RunOptions {
        self.lock = self.lock.fencing(fencing);
        self
    }

    /// See [`LockOptions::min_hold`].
    pub fn min_hold(mut self, min_hold: Duration) -> RunOptions {
        self.lock = self.lock.min_hold(min_hold);
        self
    }

    /// See [`LockOptions::max_hold`].
    pub fn max_hold(mut self, max_hold: Duration) -> RunOptions {
        self.lock = self.lock.max_hold(max_hold);
        self
    }

    /// See [`LockOptions::shared`].
    pub fn shared(mut self, shared: bool) -> RunOptions {
        self.lock = self.lock.shared(shared);
        self
    }

    /// See [`LockOptions::permits`].
    pub fn permits(mut self, permits: u32) -> RunOptions {
        self.lock = self.lock.permits(permits);
        self
    }

    /// See [`LockOptions::label`].
    pub fn label(mut self, label: &'static str) -> RunOptions {
        self.lock = self.lock.label(label);
        self
    }

    /// What to do when the lock is lost while the future runs (default
    /// [`OnLost::Abort`]).
    pub fn on_lost(mut self, on_lost: OnLost) -> RunOptions {
        self.on_lost = on_lost;
        self
    }

    /// The ttl, when set; otherwise the client's default applies.
    pub fn ttl_time(&self) -> Option<Duration> {
        self.ttl
    }

    /// What is done on loss.
    pub fn loss_mode(&self) -> OnLost {
        self.on_lost
    }

    /// The options of the acquisition, with `default_ttl` when no ttl was
    /// set.
    pub fn lock_options(&self, default_ttl: Duration) -> LockOptions {
        let mut lock = self.lock.clone();
        lock.ttl = self.ttl.unwrap_or(default_ttl);
        lock
    }
}

impl LockClient {
    /// Runs `future` while holding the lock `key`, and returns its output:
    /// what `#[distributed_lock]` does, for code that is not a function of
    /// its own (a closure's work, a framework's handler: see the `tower`
    /// feature's `tower::LockLayer`).
    ///
    /// It takes the lock as `options` say (waiting, then
    /// [`ErrorKind::Contended`] and the future is never polled), renews it
    /// while the future runs, and lets go of it on every exit path:
    ///
    /// - The future completes, whatever its output (an `Err` included): the
    ///   release is sent before `run_locked` returns (written to the
    ///   connection; its reply is not awaited, see
    ///   [`LockGuard::send_release`]).
    /// - It panics: released, then the panic resumes in the caller.
    /// - The `run_locked` future is dropped (a timeout, `select!`, an
    ///   aborted task, a client that hung up): the future is dropped and
    ///   the lock released in the background at once.
    /// - The lock is lost while it runs (an expiry, another owner, an
    ///   operator's [`force_release`](LockClient::force_release)): with
    ///   [`OnLost::Abort`] (the default) the future is dropped as soon as
    ///   the loss is noticed (at the latest at the next renewal, every
    ///   ttl/3) and the result is the [`ErrorKind::Lost`] error, whose
    ///   [`loss_reason`](LockError::loss_reason) says why; with
    ///   [`OnLost::Continue`] it finishes and its output is returned.
    ///
    /// Inside the future, [`current_lock`](crate::current_lock) describes
    /// the lock, and asking again for `key` through this client (a nested
    /// `run_locked`, `lock_with`, an annotated function) **re-enters**: it
    /// is granted at once under the same lease and leaves it held (see
    /// [`lock_with`](LockClient::lock_with)). Only the future's own task
    /// re-enters; a task it spawns waits like any other owner.
    ///
    /// `options` is a [`RunOptions`] or a [`LockOptions`].
    ///
    /// ```
    /// use lock_core::{LockClient, MemoryStore, RunOptions};
    /// use std::time::Duration;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), lock_core::LockError> {
    /// let store = MemoryStore::new();
    /// let client = LockClient::in_memory_on(&store);
    /// let options = RunOptions::new().ttl(Duration::from_secs(30)).wait(Duration::from_secs(2));
    ///
    /// let charged = client
    ///     .run_locked("order:42", options, async {
    ///         let lock = lock_core::current_lock().expect("inside");
    ///         assert_eq!(lock.key(), "order:42");
    ///         // ... charge the order: only one holder across the fleet ...
    ///         42_u64
    ///     })
    ///     .await?;
    /// assert_eq!(charged, 42);
    /// // Released on return: another replica takes it at once.
    /// let replica = LockClient::in_memory_on(&store);
    /// assert!(replica.try_lock("order:42", Duration::from_secs(30)).await?.is_some());
    /// # Ok(()) }
    /// ```
    pub async fn run_locked<F>(
        &self,
        key: &str,
        options: impl Into<RunOptions>,
        future: F,
    ) -> Result<F::Output, LockError>
    where
        F: Future,
    {
        let options = options.into();
        let guard = self
            .lock_with(key, options.lock_options(self.default_ttl()))
            .await?;
        let info = LockInfo::new(key.to_owned(), guard.fencing_token());
        run_held(guard, info, options.on_lost, future).await
    }
}

/// [`LockClient::run_locked`] through the client a `#[distributed_lock]`
/// function without `client = ..` would use here: the innermost
/// [`with_default_client`](crate::with_default_client) scope's, this
/// thread's [`set_default_client`](crate::set_default_client)'s, or the
/// process-wide one ([`set_global_client`](crate::set_global_client)).
///
/// Errors with [`ErrorKind::NotInitialized`] when there is none; otherwise
/// as [`LockClient::run_locked`].
///
/// ```
/// use lock_core::{LockClient, RunOptions};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), lock_core::LockError> {
/// let total = lock_core::with_default_client(LockClient::in_memory(), async {
///     lock_core::run_locked("ledger", RunOptions::new(), async { 2 + 2 }).await
/// })
/// .await?;
/// assert_eq!(total, 4);
/// # Ok(()) }
/// ```
pub async fn run_locked<F>(
    key: &str,
    options: impl Into<RunOptions>,
    future: F,
) -> Result<F::Output, LockError>
where
    F: Future,
{
    let client = DefaultClient::in_effect().map_err(|e| e.with_key(key))?;
    client.get().run_locked(key, options, future).await
}

/// What a future runs under, and how it is let go when the future ends.
pub(crate) trait Held {
    /// The lease.
    fn guard(&self) -> &LockGuard;

    /// Lets go. Whatever the release says, the future's outcome stands: a
    /// failed release leaves the lease to expire by itself.
    async fn let_go(self);
}

/// A lock: released without waiting for the reply.
impl Held for LockGuard {
    fn guard(&self) -> &LockGuard {
        self
    }

    async fn let_go(self) {
        let _ = self.send_release().await;
    }
}

/// A leader: resigns, which wakes the campaigners.
impl Held for Leadership {
    fn guard(&self) -> &LockGuard {
        Leadership::guard(self)
    }

    async fn let_go(self) {
        let _ = self.resign().await;
    }
}

/// Runs `future` under `held`, described to it by `info`, and lets go on
/// every exit path: the one body of `run_locked`, the attribute's `run`,
/// `run_all` and `lead`, and the tower layer. Dropped, it drops `held`,
/// whose `Drop` releases in the background.
pub(crate) async fn run_held<H, F>(
    held: H,
    info: LockInfo,
    on_lost: OnLost,
    future: F,
) -> Result<F::Output, LockError>
where
    H: Held,
    F: Future,
{
    let guard = held.guard();
    let (held_by, lease) = guard.holding();
    let future = AssertUnwindSafe(future).catch_unwind();
    let future = current::scope(info, held_by.clone(), lease.clone(), future);
    let outcome = match on_lost {
        OnLost::Abort => {
            tokio::select! {
                biased;
                outcome = future => Some(outcome),
                () = guard.lost() => None,
            }
        }
        OnLost::Continue => Some(future.await),
    };
    let lost = outcome
        .is_none()
        .then(|| LockError::lost(guard.key(), guard.loss_reason()));
    held.let_go().await;
    match (outcome, lost) {
        (Some(Ok(output)), _) => Ok(output),
        (Some(Err(panic)), _) => std::panic::resume_unwind(panic),
        (None, lost) => Err(lost.unwrap_or_else(|| LockError::new(ErrorKind::Lost))),
    }
}
