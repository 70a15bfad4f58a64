//! A holder that stops (crashed: no renewal, no release, nobody publishes)
//! frees its key at its expiry, and a waiter takes it over then, not a
//! backoff later: an attempt that finds the key held learns the holder's
//! remaining time and comes back at that moment at the latest.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use lock_core::{LockClient, LockOptions};
use std::time::Duration;
use support::{Backend, client_with, slow_backoff};
use tokio::time::Instant;

/// The crashed holder's lease.
const TTL: Duration = Duration::from_millis(400);

/// Far under the waiter's backoff (5 s), generous for a loaded machine.
const BOUND: Duration = Duration::from_millis(1500);

async fn taken_over_at_expiry(backend: Backend, options: impl Fn(LockOptions) -> LockOptions) {
    let settings = || LockClient::builder().key_prefix("takeover:");
    let holder = client_with(&backend, settings()).await;
    // The waiter backs off 5 s between attempts: only the holder's
    // remaining time can bring it back sooner.
    let waiter = client_with(&backend, settings().backoff(slow_backoff())).await;
    let crashed = holder
        .lock_with("job", options(LockOptions::new(TTL).renew(false)))
        .await
        .unwrap();
    let expires = Instant::now() + TTL;
    std::mem::forget(crashed);
    let wait = options(LockOptions::new(Duration::from_secs(10)).wait(Duration::from_secs(10)));
    let guard = waiter.lock_with("job", wait).await.unwrap();
    let lag = Instant::now().saturating_duration_since(expires);
    assert!(lag < BOUND, "taken over {lag:?} after the expiry");
    guard.release().await.unwrap();
}

fn exclusive(options: LockOptions) -> LockOptions {
    options
}

fn fenced(options: LockOptions) -> LockOptions {
    options.fencing(true)
}

fn one_permit(options: LockOptions) -> LockOptions {
    options.permits(1)
}

#[tokio::test]
async fn on_a_server() {
    taken_over_at_expiry(Backend::server(), exclusive).await;
    taken_over_at_expiry(Backend::server(), fenced).await;
    taken_over_at_expiry(Backend::server(), one_permit).await;
}

#[tokio::test]
async fn on_a_cluster() {
    taken_over_at_expiry(Backend::cluster(), exclusive).await;
}

#[tokio::test]
async fn on_redlock_when_a_majority_frees() {
    taken_over_at_expiry(Backend::redlock(), exclusive).await;
}

#[tokio::test]
async fn in_memory() {
    taken_over_at_expiry(Backend::memory(), exclusive).await;
    taken_over_at_expiry(Backend::memory(), one_permit).await;
}
