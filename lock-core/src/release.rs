//! What is done in Redis to what a holder has ([`Held`]: one key, several
//! keys, a place among shared holders or permits): release it, or move its
//! expiry. The one release every path calls: the guard's `release`, its
//! `Drop`, an acquisition cut short, a hand-off nobody took (those three in
//! the background, through `ClientInner::release_in_background`).

use crate::backend::{Backend, SharedKeys, SharedLease};
use crate::error::LockError;
use crate::lease::{Held, HolderSet, Lease, LossReason, Scope};
use futures::FutureExt;
use futures::future::join_all;
use std::time::Duration;

/// The keys of a shared holder or a permit of the lock at `lock`.
pub(crate) fn shared_keys<'a>(lock: &'a str, holder_set: &'a HolderSet) -> SharedKeys<'a> {
    SharedKeys {
        lock,
        holders: &holder_set.holders,
        writer: &holder_set.writer,
        marker: &holder_set.marker,
        limit: holder_set.limit,
    }
}

/// How a lease's expiry is moved.
#[derive(Clone, Copy)]
pub(crate) enum Expiry {
    /// Raised to the ttl from now, never lowered.
    Renew,
    /// Set to exactly the ttl from now.
    Exact,
}

/// Moves the lease's expiry to `ttl` from now, if it is still ours, and
/// tells an operator's eviction from an expiry when it is not.
/// `Ok(false)`: some key of it is certainly not ours any more.
pub(crate) async fn expire(
    backend: &Backend,
    lease: &Lease,
    ttl: Duration,
    how: Expiry,
    limit: Duration,
) -> Result<bool, LockError> {
    let renewed = set_expiry(backend, &lease.held, ttl, how, limit).await;
    if matches!(renewed, Ok(false)) && evicted(backend, lease, limit).await {
        // Before the caller marks it lost as taken over: the first reason
        // given is the one kept.
        lease.mark_lost(LossReason::ForceReleased);
    }
    renewed
}

/// Moves the expiry of what `held` holds to `ttl` from now, if it is still
/// ours. `Ok(false)`: some key of it is certainly not ours any more.
pub(crate) async fn set_expiry(
    backend: &Backend,
    held: &Held,
    ttl: Duration,
    how: Expiry,
    limit: Duration,
) -> Result<bool, LockError> {
    let token = &held.token;
    let one = |key: &str| {
        let key = key.to_owned();
        async move {
            match how {
                Expiry::Renew => backend.renew(&key, token, ttl, limit).await,
                Expiry::Exact => backend.set_ttl(&key, token, ttl, limit).await,
            }
        }
    };
    match &held.scope {
        Scope::One => one(&held.storage_key).await,
        Scope::Several(parts) => every(join_all(parts.iter().map(|p| one(&p.storage_key))).await),
        Scope::Shared(holder_set) => {
            let holder = SharedLease {
                keys: shared_keys(&held.storage_key, holder_set),
                token,
                ttl,
            };
            let exact = matches!(how, Expiry::Exact);
            let renewed = backend
                .shared()?
                .shared_renew(std::slice::from_ref(&holder), exact, limit)
                .await?;
            Ok(renewed.first() == Some(&true))
        }
    }
}

/// Whether an operator broke the lease: a tombstone of one of its keys
/// names its token (see `LockClient::force_release`). Asked only once the
/// lease is found not ours.
async fn evicted(backend: &Backend, lease: &Lease, limit: Duration) -> bool {
    let token = &lease.held.token;
    match &lease.held.scope {
        Scope::One | Scope::Shared(_) => {
            backend
                .was_evicted(&lease.held.storage_key, token, limit)
                .await
        }
        Scope::Several(parts) => join_all(
            parts
                .iter()
                .map(|p| backend.was_evicted(&p.storage_key, token, limit)),
        )
        .await
        .into_iter()
        .any(|evicted| evicted),
    }
}

/// Releases what `held` holds (compare-and-delete, or leaving the holder
/// set). `Ok(false)`: some key of it was no longer ours.
pub(crate) async fn release(
    backend: &Backend,
    held: &Held,
    limit: Duration,
) -> Result<bool, LockError> {
    let token = &held.token;
    match &held.scope {
        Scope::One => backend.release(&held.storage_key, token, limit).await,
        Scope::Several(parts) => every(
            join_all(
                parts
                    .iter()
                    .map(|p| backend.release(&p.storage_key, token, limit)),
            )
            .await,
        ),
        Scope::Shared(holder_set) => {
            backend
                .shared()?
                .shared_release(&shared_keys(&held.storage_key, holder_set), token, limit)
                .await
        }
    }
}

/// Releases what `held` holds without waiting for anything, where the
/// backend can ([`Backend::release_now`]): a lease on one key or on
/// several, over lock-core's own connections or in memory. Whether it is
/// done (written to the servers); otherwise nothing or part of it was, and
/// the caller sends [`release`], which is safe to repeat.
pub(crate) fn release_now(backend: &Backend, held: &Held) -> bool {
    if !backend.is_remote() {
        // In memory a release needs no I/O: it is done at its first poll.
        return release(backend, held, Duration::ZERO)
            .now_or_never()
            .is_some();
    }
    let token = &held.token;
    match &held.scope {
        Scope::One => backend.release_now(&held.storage_key, token),
        Scope::Several(parts) => {
            // Every key is tried, whatever the others did.
            let unsent = parts
                .iter()
                .filter(|p| !backend.release_now(&p.storage_key, token));
            unsent.count() == 0
        }
        Scope::Shared(_) => false,
    }
}

/// How a holder lets go: released, or, while its `min_hold` is not over,
/// shortened to what is left of it (the key kept until then).
#[derive(Clone, Copy)]
pub(crate) enum LetGo {
    Release,
    ShortenTo(Duration),
}

impl LetGo {
    /// Letting go of a lease whose `min_hold` has `keep_for` left, if any.
    pub(crate) fn keeping(keep_for: Option<Duration>) -> LetGo {
        keep_for.map_or(LetGo::Release, LetGo::ShortenTo)
    }

    /// Sends it: [`release`], or [`set_expiry`] to exactly what is left.
    pub(crate) async fn send(
        self,
        backend: &Backend,
        held: &Held,
        limit: Duration,
    ) -> Result<bool, LockError> {
        match self {
            LetGo::Release => release(backend, held, limit).await,
            LetGo::ShortenTo(left) => set_expiry(backend, held, left, Expiry::Exact, limit).await,
        }
    }
}

/// The answers for every key of a lease, as one: not ours when any key is
/// certainly not ours; otherwise an error when any call failed.
fn every(answers: Vec<Result<bool, LockError>>) -> Result<bool, LockError> {
    if answers.iter().any(|a| matches!(a, Ok(false))) {
        return Ok(false);
    }
    answers.into_iter().try_fold(true, |all, a| Ok(all && a?))
}
