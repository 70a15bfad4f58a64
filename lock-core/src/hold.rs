//! What is done in Redis to a lease that is held, whatever it holds (one
//! key, several keys, a place among shared holders or permits): renew it,
//! set its ttl, release it.

use crate::backend::{Backend, SharedKeys, SharedLease};
use crate::error::LockError;
use crate::lease::{HolderSet, Lease, LossReason, Scope};
use crate::token::Token;
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

/// Moves the lease's expiry to `ttl` from now, if it is still ours.
/// `Ok(false)`: some key of it is certainly not ours any more.
pub(crate) async fn expire(
    backend: &Backend,
    lease: &Lease,
    ttl: Duration,
    how: Expiry,
    limit: Duration,
) -> Result<bool, LockError> {
    let token = &lease.token;
    let one = |key: &str| {
        let key = key.to_owned();
        async move {
            match how {
                Expiry::Renew => backend.renew(&key, token, ttl, limit).await,
                Expiry::Exact => backend.set_ttl(&key, token, ttl, limit).await,
            }
        }
    };
    let renewed = match &lease.scope {
        Scope::One => one(&lease.storage_key).await,
        Scope::Several(parts) => every(join_all(parts.iter().map(|p| one(&p.storage_key))).await),
        Scope::Shared(holder_set) => {
            let holder = SharedLease {
                keys: shared_keys(&lease.storage_key, holder_set),
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
    };
    if matches!(renewed, Ok(false)) && evicted(backend, lease, limit).await {
        // Before the caller marks it lost as taken over: the first reason
        // given is the one kept.
        lease.mark_lost(LossReason::ForceReleased);
    }
    renewed
}

/// Whether an operator broke the lease: a tombstone of one of its keys
/// names its token (see `LockClient::force_release`). Asked only once the
/// lease is found not ours.
async fn evicted(backend: &Backend, lease: &Lease, limit: Duration) -> bool {
    let token = &lease.token;
    match &lease.scope {
        Scope::One | Scope::Shared(_) => {
            backend.was_evicted(&lease.storage_key, token, limit).await
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

/// Releases the lease. `Ok(false)`: some key of it was no longer ours.
pub(crate) async fn release(
    backend: &Backend,
    lease: &Lease,
    limit: Duration,
) -> Result<bool, LockError> {
    release_keys(
        backend,
        &lease.storage_key,
        &lease.scope,
        &lease.token,
        limit,
    )
    .await
}

/// [`release`] of what `token` holds under `scope`.
pub(crate) async fn release_keys(
    backend: &Backend,
    storage_key: &str,
    scope: &Scope,
    token: &Token,
    limit: Duration,
) -> Result<bool, LockError> {
    match scope {
        Scope::One => backend.release(storage_key, token, limit).await,
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
                .shared_release(&shared_keys(storage_key, holder_set), token, limit)
                .await
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
