//! What `#[distributed_lock]` expands to. **Not a stable API**: only the
//! code the attribute generates may call it, and it changes without notice.

use crate::client::{Leadership, LockClient};
use crate::error::LockError;
use crate::global::DefaultClient;
use crate::guard::LockGuard;
use crate::options::LockOptions;
use futures::FutureExt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

pub use crate::current::LockInfo;

/// What to do when the lock is lost while the body runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnLost {
    /// Drop the body at its next await and return a `Lost` error.
    Abort,
    /// Let the body finish and return its result.
    Continue,
}

/// `mode = ".."`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// `mode = "exclusive"`, the default.
    Exclusive,
    /// `mode = "shared"`.
    Shared,
}

/// The attribute's arguments, checked at compile time.
#[derive(Clone, Copy, Debug)]
pub struct Attr {
    /// `ttl = ".."`; `None`: the client's default.
    pub ttl: Option<Duration>,
    /// `wait = ".."`; `None`: the client's default.
    pub wait: Option<Duration>,
    /// `renew = ..`.
    pub renew: bool,
    /// `on_lost = ".."`.
    pub on_lost: OnLost,
    /// `fencing = ..`.
    pub fencing: bool,
    /// `min_hold = ".."`.
    pub min_hold: Option<Duration>,
    /// `max_hold = ".."`.
    pub max_hold: Option<Duration>,
    /// `mode = ".."`.
    pub mode: Mode,
    /// `permits = N` (never with `Mode::Shared`).
    pub permits: Option<u32>,
    /// The key template as written (`keys = [..]`: the templates joined by
    /// `,`), the `template` label of the lock's metrics.
    pub label: &'static str,
}

impl Attr {
    /// The defaults of every optional argument.
    pub const DEFAULT: Attr = Attr {
        ttl: None,
        wait: None,
        renew: true,
        on_lost: OnLost::Abort,
        fencing: false,
        min_hold: None,
        max_hold: None,
        mode: Mode::Exclusive,
        permits: None,
        label: LockOptions::UNLABELLED,
    };

    fn options(&self, client: &LockClient) -> LockOptions {
        let mut options = LockOptions::new(self.ttl.unwrap_or_else(|| client.default_ttl()))
            .renew(self.renew)
            .fencing(self.fencing)
            .label(self.label);
        if let Some(wait) = self.wait {
            options = options.wait(wait);
        }
        if let Some(min_hold) = self.min_hold {
            options = options.min_hold(min_hold);
        }
        if let Some(max_hold) = self.max_hold {
            options = options.max_hold(max_hold);
        }
        if self.mode == Mode::Shared {
            options = options.shared(true);
        }
        if let Some(permits) = self.permits {
            options = options.permits(permits);
        }
        options
    }
}

/// Anything the attribute's `client = ..` may name: a `LockClient`, a
/// reference to one, or an `Arc`/`Box` of one.
pub trait AsLockClient {
    /// The client.
    fn as_lock_client(&self) -> &LockClient;
}

impl AsLockClient for LockClient {
    fn as_lock_client(&self) -> &LockClient {
        self
    }
}

impl<T: AsLockClient + ?Sized> AsLockClient for &T {
    fn as_lock_client(&self) -> &LockClient {
        (**self).as_lock_client()
    }
}

impl<T: AsLockClient + ?Sized> AsLockClient for &mut T {
    fn as_lock_client(&self) -> &LockClient {
        (**self).as_lock_client()
    }
}

impl<T: AsLockClient + ?Sized> AsLockClient for Arc<T> {
    fn as_lock_client(&self) -> &LockClient {
        (**self).as_lock_client()
    }
}

impl<T: AsLockClient + ?Sized> AsLockClient for Box<T> {
    fn as_lock_client(&self) -> &LockClient {
        (**self).as_lock_client()
    }
}

/// The client named by `client = ..`.
pub fn client<C: AsLockClient + ?Sized>(client: &C) -> Result<&LockClient, LockError> {
    Ok(client.as_lock_client())
}

/// Where [`run`] gets its client: `client = ..` (a reference), or the
/// default in effect ([`global`]). Apart from [`AsLockClient`] so that a
/// wrong `client = ..` type is told only what it may be.
pub trait ClientSource {
    /// The client.
    fn lock_client(&self) -> &LockClient;
}

impl ClientSource for &LockClient {
    fn lock_client(&self) -> &LockClient {
        self
    }
}

impl ClientSource for DefaultClient {
    fn lock_client(&self) -> &LockClient {
        self.get()
    }
}

/// The client for an attribute without `client = ..`: the innermost
/// [`with_default_client`](crate::with_default_client) scope's, this
/// thread's [`set_default_client`](crate::set_default_client)'s, or the
/// process-wide one.
pub fn global() -> Result<DefaultClient, LockError> {
    DefaultClient::in_effect()
}

/// The error conversion every annotated function's error type must offer.
///
/// Generated code names it as `<E as FromLockError>::from_lock_error`,
/// spanned on the declared error type, and hands that to [`run`]: the one
/// place the bound is checked, so a missing conversion is one error, on the
/// error type. (A bound on `run` itself was reported twice under
/// incremental builds, on `Result`, the second time without this message.)
#[diagnostic::on_unimplemented(
    message = "`#[distributed_lock]` needs an error type that converts from `lock_core::LockError`, and `{Self}` does not",
    label = "`{Self}` cannot hold a lock error",
    note = "add `impl From<lock_core::LockError> for {Self}` (or use a `#[from] LockError` variant), or return `Result<T, lock_core::LockError>`"
)]
pub trait FromLockError {
    /// Converts.
    fn from_lock_error(err: LockError) -> Self;
}

impl<E: From<LockError>> FromLockError for E {
    fn from_lock_error(err: LockError) -> Self {
        E::from(err)
    }
}

/// Pins an annotated function's return type to `Result<T, E>`, for a clear
/// message when it is not. The error conversion is checked separately, by
/// [`FromLockError`], so that each mistake gets its own message.
///
/// Generated code passes the body's value and `run`'s result through the
/// two (identity) conversions, so a return type that is not a `Result`
/// fails here alone rather than in every expression that follows.
#[diagnostic::on_unimplemented(
    message = "`#[distributed_lock]` needs a return type `Result<T, E>` where `E: From<lock_core::LockError>`, found `{Self}`",
    label = "not a `Result` whose error converts from `lock_core::LockError`"
)]
pub trait LockResult: Sized {
    /// The success type.
    type Ok;
    /// The error type.
    type Err;
    /// `self` as the `Result` it is.
    fn into_result(self) -> Result<Self::Ok, Self::Err>;
    /// The `Result` as `Self`.
    fn from_result(result: Result<Self::Ok, Self::Err>) -> Self;
}

impl<T, E> LockResult for Result<T, E> {
    type Ok = T;
    type Err = E;
    fn into_result(self) -> Result<T, E> {
        self
    }
    fn from_result(result: Result<T, E>) -> Self {
        result
    }
}

/// Runs `body` while holding the lock `key`: acquires (waiting as `attr`
/// says), renews while the body runs, and releases on every exit path.
///
/// - Return (`Ok`, `Err`, `?`): the release is sent before returning (written
///   to the connection; its reply is not awaited: see
///   [`LockGuard::send_release`]).
/// - Panic: released, then the panic resumes.
/// - The returned future dropped (timeout, `select!`, abort): the guard's
///   `Drop` stops the heartbeat and releases in the background at once.
/// - Lock lost while running: with [`OnLost::Abort`] the body is dropped at
///   its next await and a `Lost` error is returned; with
///   [`OnLost::Continue`] the body finishes and its result is returned.
///
/// Inside the body [`current_lock`](crate::current_lock) describes this lock.
/// Every [`LockError`] is returned through `into_error` (the error type's
/// [`FromLockError`] conversion).
///
/// Nested in a body of this task that holds `key` through the same client,
/// `lock_with` re-enters: the body runs under the outer lease, is aborted
/// when that lease is lost, and the release at its end sends nothing.
pub async fn run<C, T, E, F>(
    client: Result<C, LockError>,
    key: String,
    attr: Attr,
    into_error: fn(LockError) -> E,
    body: F,
) -> Result<T, E>
where
    C: ClientSource,
    F: Future<Output = Result<T, E>>,
{
    let client = match client {
        Ok(ref client) => client.lock_client(),
        Err(e) => return Err(into_error(e.with_key(key))),
    };
    let guard = match client.lock_with(&key, attr.options(client)).await {
        Ok(guard) => guard,
        Err(e) => return Err(into_error(e)),
    };
    let info = LockInfo::new(key, guard.fencing_token());
    run_held(guard, info, attr.on_lost, into_error, body).await
}

/// [`run`] for `keys = [..]`: holds every key at once (see
/// [`LockClient::lock_all`]) while `body` runs.
pub async fn run_all<C, T, E, F>(
    client: Result<C, LockError>,
    keys: Vec<String>,
    attr: Attr,
    into_error: fn(LockError) -> E,
    body: F,
) -> Result<T, E>
where
    C: ClientSource,
    F: Future<Output = Result<T, E>>,
{
    let client = match client {
        Ok(ref client) => client.lock_client(),
        Err(e) => {
            let e = match keys.first() {
                Some(key) => e.with_key(key.clone()),
                None => e,
            };
            return Err(into_error(e));
        }
    };
    let names: Vec<&str> = keys.iter().map(String::as_str).collect();
    let guard = match client.lock_all(&names, attr.options(client)).await {
        Ok(guard) => guard,
        Err(e) => return Err(into_error(e)),
    };
    let info = guard.info();
    run_held(guard, info, attr.on_lost, into_error, body).await
}

/// [`run`] for `wait = "forever"`: campaigns for `key` as
/// [`LockClient::campaign`] does (waiting without bound; only `Unavailable`
/// past the client's default wait ends it, or an error that waiting will
/// not change), with a lease of `attr`'s ttl, then runs `body` once as the
/// leader. Inside the body [`current_lock`](crate::current_lock)'s fencing
/// token is the term. However the body ends the leader resigns, waking the
/// next campaigner at once; with [`OnLost::Abort`] a lost lease drops the
/// body and returns the `Lost` error, as [`run`] does.
pub async fn lead<C, T, E, F>(
    client: Result<C, LockError>,
    key: String,
    attr: Attr,
    into_error: fn(LockError) -> E,
    body: F,
) -> Result<T, E>
where
    C: ClientSource,
    F: Future<Output = Result<T, E>>,
{
    let client = match client {
        Ok(ref client) => client.lock_client(),
        Err(e) => return Err(into_error(e.with_key(key))),
    };
    let ttl = attr.ttl.unwrap_or_else(|| client.default_ttl());
    let leadership = match client.campaign(&key, ttl).await {
        Ok(leadership) => leadership,
        Err(e) => return Err(into_error(e)),
    };
    let info = LockInfo::new(key, Some(leadership.term()));
    run_held(leadership, info, attr.on_lost, into_error, body).await
}

/// What a body runs under, and how it is let go when the body ends.
trait Held {
    /// The lease.
    fn guard(&self) -> &LockGuard;

    /// Lets go. Whatever the release says, the body's outcome stands: a
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

/// Runs `body` under `held`, described to it by `info`, and lets go on
/// every exit path.
async fn run_held<H, T, E, F>(
    held: H,
    info: LockInfo,
    on_lost: OnLost,
    into_error: fn(LockError) -> E,
    body: F,
) -> Result<T, E>
where
    H: Held,
    F: Future<Output = Result<T, E>>,
{
    let guard = held.guard();
    let (held_by, lease) = guard.holding();
    let body = AssertUnwindSafe(body).catch_unwind();
    let body = crate::current::scope(info, held_by.clone(), lease.clone(), body);
    let outcome = match on_lost {
        OnLost::Abort => {
            tokio::select! {
                biased;
                outcome = body => Some(outcome),
                () = guard.lost() => None,
            }
        }
        OnLost::Continue => Some(body.await),
    };
    let lost = outcome
        .is_none()
        .then(|| LockError::lost(guard.key(), guard.loss_reason()));
    held.let_go().await;
    match (outcome, lost) {
        (Some(Ok(result)), _) => result,
        (Some(Err(panic)), _) => std::panic::resume_unwind(panic),
        (None, lost) => Err(into_error(
            lost.unwrap_or_else(|| LockError::new(crate::ErrorKind::Lost)),
        )),
    }
}
