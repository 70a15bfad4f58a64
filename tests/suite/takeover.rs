//! A holder that stops (crashed: no renewal, no release, nobody publishes)
//! frees its key at its expiry, and a waiter takes it over then, not a
//! backoff later: an attempt that finds the key held learns the holder's
//! remaining time and comes back at that moment at the latest.
//!
//! A holder of another library releases with a compare-and-delete that
//! publishes nothing: a waiter that saw its value (not a lock-core token)
//! polls on a short cap, and takes over soon after, whatever its backoff.

use crate::support::{Backend, client_with, slow_backoff, spawn_waiting, storage_key};
use lock_core::{LockClient, LockOptions};
use lock_testkit::RedisServer;
use std::time::Duration;
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

/// A holder of another library: its own connection, `SET NX PX`, and a
/// compare-and-delete without `PUBLISH`.
async fn foreign_call<T: redis::FromRedisValue>(
    conn: &mut redis::aio::MultiplexedConnection,
    cmd: &redis::Cmd,
) -> T {
    tokio::time::timeout(Duration::from_secs(5), cmd.query_async(conn))
        .await
        .expect("Redis answers within 5 s")
        .unwrap()
}

/// Rounds of a foreign holder releasing while a waiter (5 s backoff) waits:
/// by polling alone, each round would pass with a chance of about 1 in 5.
const FOREIGN_ROUNDS: usize = 4;

#[tokio::test]
async fn after_a_foreign_release() {
    let server = RedisServer::start();
    let settings = LockClient::builder()
        .key_prefix("takeover:")
        .backoff(slow_backoff());
    let waiter = client_with(&server, settings).await;
    let key = storage_key("takeover:", "job");
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = tokio::time::timeout(
        Duration::from_secs(5),
        client.get_multiplexed_async_connection(),
    )
    .await
    .unwrap()
    .unwrap();
    let cad = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";
    for round in 0..FOREIGN_ROUNDS {
        let value = format!("other-library-{round}");
        let mut set = redis::cmd("SET");
        set.arg(&key).arg(&value).arg("NX").arg("PX").arg(30_000);
        let taken: Option<String> = foreign_call(&mut conn, &set).await;
        assert!(taken.is_some(), "the key was free");
        let waiting = waiter.clone();
        let wait = LockOptions::new(Duration::from_secs(10)).wait(Duration::from_secs(10));
        let task = spawn_waiting(async move { waiting.lock_with("job", wait).await }).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mut release = redis::cmd("EVAL");
        release.arg(cad).arg(1).arg(&key).arg(&value);
        let deleted: i64 = foreign_call(&mut conn, &release).await;
        assert_eq!(deleted, 1);
        let released = Instant::now();
        let guard = task.await.unwrap().unwrap();
        let lag = released.elapsed();
        assert!(
            lag < Duration::from_secs(1),
            "round {round}: taken {lag:?} after the release"
        );
        guard.release().await.unwrap();
    }
}
