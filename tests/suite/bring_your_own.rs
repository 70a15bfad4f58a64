//! A client over a connection the service already has
//! (`LockClientBuilder::connection`, docs/connection.md), of each kind the
//! `redis` crate offers, or a pool (`LockClientBuilder::pool`) ([`Given`]): every lock kind, renewal, fencing, a
//! waiter, the operators' calls, the bound on a call when the server stops
//! answering, and what each kind does when its server restarts.

use crate::support::{Given, eventually_async, storage_key};
use lock_core::{ErrorKind, LockClient, LockOptions};
use lock_testkit::RedisServer;
use std::time::{Duration, Instant};

const PREFIX: &str = "byo:";
/// The bound on each call of this file's clients.
const OPERATION_TIMEOUT: Duration = Duration::from_millis(500);

async fn multiplexed(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// A client over a new connection of kind `given` to `server`.
async fn client_over(given: Given, server: &RedisServer) -> LockClient {
    let builder = LockClient::builder()
        .key_prefix(PREFIX)
        .operation_timeout(OPERATION_TIMEOUT);
    given
        .point(server, builder)
        .await
        .build()
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", given.name()))
}

fn held(server: &RedisServer, key: &str) -> bool {
    server.cmd::<i64>(&["EXISTS", &storage_key(PREFIX, key)]) == 1
}

/// Exclusive, shared and permit locks, several keys at once and a fenced
/// lock, each taken, seen on the server, refused to a second holder where
/// the kind says so, and released.
#[tokio::test]
async fn every_lock_kind_works_over_a_given_connection() {
    for given in Given::ALL {
        every_lock_kind(given).await;
    }
}

async fn every_lock_kind(given: Given) {
    let server = RedisServer::start();
    let client = client_over(given, &server).await;
    let other = client_over(given, &server).await;
    let ttl = Duration::from_secs(5);
    let now = |options: LockOptions| options.wait(Duration::ZERO);

    let exclusive = client.lock("one", ttl).await.unwrap();
    assert!(held(&server, "one"));
    assert!(other.try_lock("one", ttl).await.unwrap().is_none());
    assert!(exclusive.release().await.unwrap());
    assert!(!held(&server, "one"));

    let shared = LockOptions::new(ttl).shared(true);
    let first = client.lock_with("shared", shared.clone()).await.unwrap();
    let second = other.lock_with("shared", now(shared)).await.unwrap();
    let writer = other.lock_with("shared", now(LockOptions::new(ttl))).await;
    assert_eq!(writer.unwrap_err().kind(), ErrorKind::Contended);
    assert!(first.release().await.unwrap());
    assert!(second.release().await.unwrap());

    let permits = LockOptions::new(ttl).permits(2);
    let a = client.lock_with("pool", permits.clone()).await.unwrap();
    let b = other.lock_with("pool", now(permits.clone())).await.unwrap();
    let c = other.lock_with("pool", now(permits)).await;
    assert_eq!(c.unwrap_err().kind(), ErrorKind::Contended);
    assert!(a.release().await.unwrap() && b.release().await.unwrap());

    let both = client
        .lock_all(&["x", "y"], LockOptions::new(ttl))
        .await
        .unwrap();
    assert!(held(&server, "x") && held(&server, "y"));
    assert!(both.release().await.unwrap());

    let fenced = LockOptions::new(ttl).fencing(true);
    let first = client.lock_with("fenced", fenced.clone()).await.unwrap();
    let token = first.fencing_token().unwrap();
    assert!(first.release().await.unwrap());
    let next = other.lock_with("fenced", fenced).await.unwrap();
    assert!(
        next.fencing_token().unwrap() > token,
        "fencing tokens went backwards"
    );
    assert!(next.release().await.unwrap());
}

/// A lease held three times its ttl is renewed over the given connection,
/// the operators see it, and a waiter gets it soon after its release (on
/// its backoff timer: a connection that carries calls cannot subscribe).
#[tokio::test]
async fn renewal_waiters_and_operators_work_over_a_given_connection() {
    for given in Given::ALL {
        renewal_waiters_and_operators(given).await;
    }
}

async fn renewal_waiters_and_operators(given: Given) {
    let server = RedisServer::start();
    let client = client_over(given, &server).await;
    let waiter = client_over(given, &server).await;
    let ttl = Duration::from_millis(600);
    let guard = client.lock("renewed", ttl).await.unwrap();
    let waiting = tokio::spawn(async move {
        let options = LockOptions::new(ttl).wait(Duration::from_secs(10));
        let guard = waiter.lock_with("renewed", options).await.unwrap();
        let at = Instant::now();
        assert!(guard.release().await.unwrap());
        at
    });
    tokio::time::sleep(ttl * 3).await;
    assert!(
        !guard.is_lost(),
        "{}: {:?}",
        given.name(),
        guard.loss_reason()
    );
    assert!(held(&server, "renewed"));
    let state = client.inspect("renewed").await.unwrap().expect("held");
    assert!(state.holder().is_some());
    assert_eq!(client.list_all(None).await.unwrap().len(), 1);

    let released = Instant::now();
    assert!(guard.release().await.unwrap());
    let got = waiting.await.unwrap();
    // The default backoff tops out at 200 ms.
    assert!(
        got.saturating_duration_since(released) < Duration::from_secs(1),
        "{}: the waiter got the key {:?} after its release",
        given.name(),
        got - released
    );
}

/// A server that stops answering: each call over the given connection
/// still ends within the operation timeout.
#[tokio::test]
async fn a_call_over_a_given_connection_ends_within_its_timeout_when_the_server_freezes() {
    for given in Given::ALL {
        a_call_ends_within_its_timeout_when_the_server_freezes(given).await;
    }
}

async fn a_call_ends_within_its_timeout_when_the_server_freezes(given: Given) {
    let server = RedisServer::start();
    let client = client_over(given, &server).await;
    assert!(client.lock("before", Duration::from_secs(5)).await.is_ok());
    let frozen = server.pause();
    let started = Instant::now();
    let attempt = client
        .lock_with(
            "frozen",
            LockOptions::new(Duration::from_secs(5)).wait(Duration::ZERO),
        )
        .await;
    let took = started.elapsed();
    drop(frozen);
    assert_eq!(attempt.unwrap_err().kind(), ErrorKind::Unavailable);
    assert!(
        took < Duration::from_secs(2),
        "{}: took {took:?}",
        given.name()
    );
}

/// Building on a connection together with a URL is refused, and says why.
#[tokio::test]
async fn a_connection_and_a_url_together_are_a_config_error() {
    let server = RedisServer::start();
    let built = LockClient::builder()
        .connection(multiplexed(&server).await)
        .url(server.url())
        .build()
        .await;
    let Err(error) = built else {
        panic!("built with both a connection and a URL");
    };
    assert_eq!(error.kind(), ErrorKind::Config);
    assert!(error.to_string().contains("connection"), "{error}");
}

/// How much later than [`OPERATION_TIMEOUT`] a failed call may end on a
/// loaded 2-core machine.
const MARGIN: Duration = Duration::from_millis(500);

/// A lock taken at once and released, over `client`.
async fn cycle(client: &LockClient, key: &str) -> Result<(), lock_core::LockError> {
    let now = LockOptions::new(Duration::from_secs(5)).wait(Duration::ZERO);
    client.lock_with(key, now).await?.release().await.map(drop)
}

/// The server is stopped and started again on its port. While it is down,
/// each call over every kind fails `Unavailable` within the operation
/// timeout. Once it is back, a `ConnectionManager` reconnects by itself,
/// and the pools replace their broken connections, so calls work again; a
/// `MultiplexedConnection` stays broken, each call failing `Unavailable`,
/// until the service replaces the client.
#[tokio::test]
async fn a_given_connection_manager_or_pool_recovers_after_its_server_restarts() {
    for given in Given::ALL {
        through_a_restart(given).await;
    }
}

async fn through_a_restart(given: Given) {
    let on = given.name();
    let mut server = RedisServer::start();
    let client = client_over(given, &server).await;
    cycle(&client, "before").await.unwrap();
    server.stop();
    let mut down = Vec::new();
    for i in 0..5 {
        let started = Instant::now();
        let err = cycle(&client, &format!("down:{i}")).await.unwrap_err();
        let took = started.elapsed();
        assert_eq!(err.kind(), ErrorKind::Unavailable, "{on}, call {i}: {err}");
        assert!(
            took < OPERATION_TIMEOUT + MARGIN,
            "{on}, call {i} with the server down took {took:?}: {err}"
        );
        down.push(took);
    }
    println!("{on}: the calls with the server down failed after {down:?}");
    server.restart();
    let back = Instant::now();
    if given.reconnects() {
        let round = std::cell::Cell::new(0);
        // Five in a row: on a loaded machine, one of the first calls after
        // the restart over a pool has been seen to time out.
        eventually_async(Duration::from_secs(10), on, || async {
            for _ in 0..5 {
                round.set(round.get() + 1);
                if cycle(&client, &format!("again:{}", round.get()))
                    .await
                    .is_err()
                {
                    return false;
                }
            }
            true
        })
        .await;
        println!(
            "{on}: calls work again {:?} after the restart",
            back.elapsed()
        );
    } else {
        let mut calls = 0;
        while back.elapsed() < Duration::from_secs(1) {
            let err = cycle(&client, &format!("broken:{calls}"))
                .await
                .unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Unavailable, "{on}: {err}");
            calls += 1;
        }
        assert!(calls > 0, "{on}: no call made after the restart");
    }
}
