//! Past its renewal capacity a client keeps what it holds and refuses what
//! is new: an acquisition that would make the heartbeat fall behind sends
//! nothing, waits within its wait, and fails with `AtCapacity`.
//!
//! The capacity is made small with the client's test knob, so a handful of
//! locks reach it on any machine; the heartbeat's own measure (renewals per
//! second of its busy time) only lowers it further.

use crate::support::{client_for, spawn_waiting, storage_key};
use lock_core::{ErrorKind, LockClient, LockGuard, LockOptions};
use lock_testkit::RedisServer;
use std::time::Duration;

const PREFIX: &str = "capacity:";

/// A lease of this ttl asks two renewals a second, one at the late pace
/// the heartbeat takes near its capacity; the client's capacity is set to
/// ten, of which new leases may ask 80 % at that pace: eight leases.
const TTL: Duration = Duration::from_millis(1500);
const CAPACITY: f64 = 10.0;
const ADMITTED: usize = 8;
const ASKED: usize = 20;

/// Takes locks `k0`, `k1`, ... without waiting until `n` were asked:
/// the guards, and the errors of those refused, by number.
async fn take(
    client: &LockClient,
    n: usize,
) -> (Vec<LockGuard>, Vec<(usize, lock_core::LockError)>) {
    let mut held = Vec::new();
    let mut refused = Vec::new();
    for i in 0..n {
        let options = LockOptions::new(TTL).wait(Duration::ZERO);
        match client.lock_with(&format!("k{i}"), options).await {
            Ok(guard) => held.push(guard),
            Err(e) => refused.push((i, e)),
        }
    }
    (held, refused)
}

#[tokio::test]
async fn past_its_renewal_capacity_a_client_keeps_held_locks_and_refuses_new_ones() {
    let server = RedisServer::start();
    let client = client_for(&server, PREFIX).await;
    client.limit_renewal_capacity(CAPACITY);

    let (held, refused) = take(&client, ASKED).await;
    // A heartbeat round found late (a loaded machine) refuses earlier, never
    // later.
    assert!(
        !held.is_empty() && held.len() <= ADMITTED,
        "{} of {ASKED} taken, {ADMITTED} fit",
        held.len()
    );
    assert_eq!(held.len() + refused.len(), ASKED);
    for (i, e) in &refused {
        assert_eq!(e.kind(), ErrorKind::AtCapacity, "{e}");
        assert!(e.is_at_capacity());
        let message = e.to_string();
        assert!(message.contains("renewal capacity"), "{message}");
        assert!(message.contains("longer ttl"), "{message}");
        assert!(message.contains("fewer locks"), "{message}");
        // Refused before anything was sent: the key was never taken.
        let key = storage_key(PREFIX, &format!("k{i}"));
        assert!(!server.cmd::<bool>(&["EXISTS", &key]), "{key} was taken");
    }

    // Three ttls: every held lease needed renewals to live through them.
    tokio::time::sleep(TTL * 3).await;
    for guard in &held {
        assert!(!guard.is_lost(), "{} was lost", guard.key());
        let key = storage_key(PREFIX, guard.key());
        let left: i64 = server.cmd(&["PTTL", &key]);
        assert!(left > 0, "{key} is gone from Redis ({left})");
    }
    assert_eq!(client.heartbeats_running(), held.len());

    // A wait that runs out at capacity fails with AtCapacity after it.
    let wait = Duration::from_millis(200);
    let options = LockOptions::new(TTL).wait(wait);
    let err = client.lock_with("late", options).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::AtCapacity, "{err}");
    assert!(err.waited().is_some_and(|w| w >= wait), "{err:?}");

    // An acquisition waiting for capacity gets it when a held lock is let go.
    let waiting = client.clone();
    let next = spawn_waiting(async move {
        let options = LockOptions::new(TTL).wait(Duration::from_secs(30));
        waiting.lock_with("next", options).await
    })
    .await;
    assert!(!server.cmd::<bool>(&["EXISTS", &storage_key(PREFIX, "next")]));
    let mut held = held;
    let first = held.remove(0);
    assert!(first.release().await.unwrap());
    let next = next
        .await
        .unwrap()
        .expect("the waiter takes the freed capacity");
    assert!(server.cmd::<bool>(&["EXISTS", &storage_key(PREFIX, "next")]));
    assert!(next.release().await.unwrap());
    for guard in held {
        assert!(guard.release().await.unwrap(), "a held lock was lost");
    }
}

#[tokio::test]
async fn locks_without_renewal_are_not_counted_against_the_capacity() {
    let server = RedisServer::start();
    let client = client_for(&server, PREFIX).await;
    client.limit_renewal_capacity(CAPACITY);
    let (held, refused) = take(&client, ASKED).await;
    assert!(!refused.is_empty(), "the client is at its capacity");
    // No heartbeat renews these: they cost it nothing.
    let options = LockOptions::new(TTL).renew(false).wait(Duration::ZERO);
    let unrenewed = client.lock_with("unrenewed", options).await.unwrap();
    assert!(unrenewed.release().await.unwrap());
    for guard in held {
        assert!(guard.release().await.unwrap());
    }
}

/// Acquisitions in flight at once, and waiters woken together, take only
/// what fits: each admission is reserved until its lease joins the
/// heartbeat, so forty callers that ask at the same moment do not all read
/// the same room. Those past the capacity wait within their wait, then
/// fail with `AtCapacity`, having sent nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquisitions_asking_at_once_take_only_what_fits() {
    let server = RedisServer::start();
    let client = client_for(&server, PREFIX).await;
    client.limit_renewal_capacity(CAPACITY);
    let wait = Duration::from_secs(1);
    let asking: Vec<_> = (0..40)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move {
                let options = LockOptions::new(TTL).wait(wait);
                (i, client.lock_with(&format!("burst{i}"), options).await)
            })
        })
        .collect();
    let mut held = Vec::new();
    for task in asking {
        let (i, result) = task.await.unwrap();
        match result {
            Ok(guard) => held.push(guard),
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::AtCapacity, "{e}");
                let waited = e.waited().unwrap();
                // Within its wait, and a margin for a loaded machine.
                assert!(
                    waited >= wait && waited < wait + Duration::from_millis(700),
                    "burst{i} waited {waited:?}"
                );
                let key = storage_key(PREFIX, &format!("burst{i}"));
                assert!(!server.cmd::<bool>(&["EXISTS", &key]), "{key} was taken");
            }
        }
    }
    assert!(
        !held.is_empty() && held.len() <= ADMITTED,
        "{} of 40 asking at once were taken, {ADMITTED} fit",
        held.len()
    );
    assert_eq!(client.heartbeats_running(), held.len());
    for guard in held {
        assert!(!guard.is_lost(), "{} was lost", guard.key());
        assert!(guard.release().await.unwrap());
    }
}
