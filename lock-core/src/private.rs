//! What `#[distributed_lock]` expands to. **Not a stable API**: only the
//! code the attribute generates may call it, and it changes without notice.

//!
//! The work itself is [`LockClient::run_locked`]'s: `run`
//! turns the attribute's arguments into its [`RunOptions`] and its error
//! into the function's error type; `run_all` and `lead` take their locks
//! otherwise and run the body through the same `run_held`.

use crate::client::LockClient;
use crate::error::LockError;
use crate::global::DefaultClient;
use crate::options::LockOptions;
use crate::run::{RunOptions, run_held};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

pub use crate::current::LockInfo;
pub use crate::run::OnLost;

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

    /// The same arguments as [`run_locked`](LockClient::run_locked)'s
    /// options.
    pub fn run_options(&self) -> RunOptions {
        let mut options = RunOptions::new()
            .renew(self.renew)
            .fencing(self.fencing)
            .label(self.label)
            .on_lost(self.on_lost);
        if let Some(ttl) = self.ttl {
            options = options.ttl(ttl);
        }
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

    fn options(&self, client: &LockClient) -> LockOptions {
        self.run_options().lock_options(client.default_ttl())
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

/// [`LockClient::run_locked`] for an annotated function: `key` under the
/// client `client` names, with `attr`'s arguments; every [`LockError`]
/// comes back through `into_error` (the error type's [`FromLockError`]
/// conversion), the body's own `Result` as it is.
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
    flatten(
        client.run_locked(&key, attr.run_options(), body).await,
        into_error,
    )
}

/// The body's result, or the lock's error in the body's error type.
fn flatten<T, E>(
    outcome: Result<Result<T, E>, LockError>,
    into_error: fn(LockError) -> E,
) -> Result<T, E> {
    outcome.unwrap_or_else(|e| Err(into_error(e)))
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
    flatten(run_held(guard, info, attr.on_lost, body).await, into_error)
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
    flatten(
        run_held(leadership, info, attr.on_lost, body).await,
        into_error,
    )
}
