//! Releases by the server's own compare-and-delete (`DELIFEQ`, Valkey 9.0
//! and later) where the server has it, and by the release script where it
//! has not, where the user may not run it, and for the locks whose value a
//! client cannot name to the byte (fenced, shared, several keys). On every
//! server the tests check what Redis holds and how many of each command it
//! ran (`INFO commandstats`): `scripts/test` runs this file on Redis 7.0
//! and 8.2 and on Valkey 8.1 (the script) and on Valkey 9.1 (native).

use crate::acl::{create_user, denials, documented_rules, server as acl_server, user_url};
use crate::support::{client_with, eventually, slow_backoff, spawn_waiting, storage_key};
use lock_core::{LockClient, LockClientBuilder, LockOptions};
use lock_testkit::RedisServer;
use std::time::Duration;
use tokio::time::Instant;

const PREFIX: &str = "native:lock:";
const TTL: Duration = Duration::from_secs(10);
/// Bound on anything expected to finish.
const BOUND: Duration = Duration::from_secs(10);
/// A waiter hears a release within this (its backoff is 5 s).
const WOKEN_WITHIN: Duration = Duration::from_secs(1);

/// A lock the heartbeat leaves alone: its renewals would run scripts the
/// counts below would take for releases.
fn unrenewed() -> LockOptions {
    LockOptions::new(TTL).renew(false)
}

fn settings() -> LockClientBuilder {
    LockClient::builder()
        .key_prefix(PREFIX)
        .operation_timeout(Duration::from_secs(2))
}

/// Whether the server has `DELIFEQ`.
fn has_delifeq(server: &RedisServer) -> bool {
    let info: Vec<redis::Value> = server.cmd(&["COMMAND", "INFO", "DELIFEQ"]);
    matches!(info.first(), Some(redis::Value::Array(entry)) if !entry.is_empty())
}

/// How many times the server ran `command` (lower case), scripts' calls
/// included (`INFO commandstats`).
fn calls(server: &RedisServer, command: &str) -> u64 {
    let info: String = server.cmd(&["INFO", "commandstats"]);
    let head = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|line| line.strip_prefix(&head))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

/// The release commands the server ran since `before`: `(delifeq, evalsha)`.
fn releases_since(server: &RedisServer, before: (u64, u64)) -> (u64, u64) {
    (
        calls(server, "delifeq") - before.0,
        calls(server, "evalsha") - before.1,
    )
}

fn counters(server: &RedisServer) -> (u64, u64) {
    releases_since(server, (0, 0))
}

fn holds(server: &RedisServer, key: &str) -> bool {
    server
        .cmd::<Option<String>>(&["GET", &storage_key(PREFIX, key)])
        .is_some()
}

/// Releases awaited and releases nobody awaits (a guard dropped, `send_release`)
/// after the connection's first: each deletes its key, by `DELIFEQ` where
/// the server has it and by the script elsewhere.
#[tokio::test]
async fn releases_go_by_delifeq_where_the_server_has_it() {
    let server = RedisServer::start();
    let native = has_delifeq(&server);
    let client = client_with(&server, settings()).await;
    // The connection's first release asks, by the script, whether the
    // command may be used.
    let first = client.lock_with("first", unrenewed()).await.unwrap();
    assert!(first.release().await.unwrap());
    assert!(!holds(&server, "first"));

    let before = counters(&server);
    for round in 0..5 {
        let key = format!("awaited-{round}");
        let guard = client.lock_with(&key, unrenewed()).await.unwrap();
        assert!(guard.release().await.unwrap());
        assert!(!holds(&server, &key), "{key} still held");
    }
    for round in 0..5 {
        let key = format!("dropped-{round}");
        drop(client.lock_with(&key, unrenewed()).await.unwrap());
        eventually(BOUND, "a dropped guard's key is deleted", || {
            !holds(&server, &key)
        })
        .await;
        let key = format!("sent-{round}");
        let guard = client.lock_with(&key, unrenewed()).await.unwrap();
        guard.send_release().await.unwrap();
        eventually(BOUND, "a sent release deletes its key", || {
            !holds(&server, &key)
        })
        .await;
    }
    // A dropped guard's release is written at once and sent again,
    // awaited, on lock-core's runtime: 5 + 2 * 5 + 5 releases.
    let (delifeq, evalsha) = releases_since(&server, before);
    if native {
        assert_eq!(delifeq, 20, "every release by DELIFEQ");
        assert_eq!(evalsha, 0, "no release script once the server said yes");
    } else {
        assert_eq!(delifeq, 0);
        assert_eq!(evalsha, 20, "every release by the script");
    }
}

/// `native_commands(false)`: the script everywhere, also on Valkey 9.1.
#[tokio::test]
async fn native_commands_off_keeps_the_script() {
    let server = RedisServer::start();
    let client = client_with(&server, settings().native_commands(false)).await;
    let before = counters(&server);
    for round in 0..3 {
        let guard = client
            .lock_with(&format!("k{round}"), unrenewed())
            .await
            .unwrap();
        assert!(guard.release().await.unwrap());
        drop(
            client
                .lock_with(&format!("d{round}"), unrenewed())
                .await
                .unwrap(),
        );
    }
    eventually(BOUND, "every dropped guard's key is deleted", || {
        (0..3).all(|round| !holds(&server, &format!("d{round}")))
    })
    .await;
    // A dropped guard's release goes twice (see above): 3 + 2 * 3.
    assert_eq!(releases_since(&server, before), (0, 9));
}

/// A waiter in another client hears a native release as it hears the
/// script's: within a round trip, not at its 5 s backoff.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_hear_a_native_release() {
    let server = RedisServer::start();
    let holder = client_with(&server, settings()).await;
    let waiter = client_with(&server, settings().backoff(slow_backoff())).await;
    // Past the connection's first release, which asks.
    holder
        .lock("warm", TTL)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    for round in 0..3 {
        let key = format!("w{round}");
        let guard = holder.lock(&key, TTL).await.unwrap();
        let waiting = {
            let (waiter, key) = (waiter.clone(), key.clone());
            spawn_waiting(async move {
                let options = LockOptions::new(TTL).wait(BOUND);
                let guard = waiter.lock_with(&key, options).await.unwrap();
                (Instant::now(), guard)
            })
            .await
        };
        // The waiter subscribed before the release.
        eventually(BOUND, "the waiter listens", || {
            crate::support::subscribers(&server, &storage_key(PREFIX, &key)) > 0
        })
        .await;
        let released = Instant::now();
        assert!(guard.release().await.unwrap());
        let (woke, guard) = waiting.await.unwrap();
        let after = woke.duration_since(released);
        assert!(after < WOKEN_WITHIN, "round {round}: woken {after:?} after");
        guard.release().await.unwrap();
    }
}

/// A lock that is no longer ours (it expired and another took it) is left
/// to its new holder, by the connection's first release and by the later
/// ones: `DELIFEQ` compares the whole value.
#[tokio::test]
async fn a_lock_taken_by_another_is_left_alone() {
    let server = RedisServer::start();
    let client = client_with(&server, settings().native_commands(true)).await;
    for round in 0..3 {
        let key = format!("k{round}");
        let guard = client
            .lock_with(&key, LockOptions::new(TTL).renew(false))
            .await
            .unwrap();
        let stored = storage_key(PREFIX, &key);
        // Another client's lock under the key, and another library's.
        let other = if round == 0 {
            "0123456789abcdef0123456789abcdef|1|".to_owned()
        } else {
            format!("someone-else-{round}")
        };
        let _: () = server.cmd(&["SET", &stored, &other, "PX", "10000"]);
        assert!(!guard.release().await.unwrap(), "round {round}");
        let left: Option<String> = server.cmd(&["GET", &stored]);
        assert_eq!(left.as_deref(), Some(other.as_str()), "round {round}");
    }
}

/// Fenced, shared, permit and several-key locks keep the script: their
/// values are not known to the byte (the fence is drawn by the server) or
/// are not a plain value at all.
#[tokio::test]
async fn fenced_shared_permits_and_several_keys_keep_the_script() {
    let server = RedisServer::start();
    let client = client_with(&server, settings()).await;
    client
        .lock("warm", TTL)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let before = calls(&server, "delifeq");
    let fenced = client
        .lock_with("fenced", LockOptions::new(TTL).fencing(true))
        .await
        .unwrap();
    assert!(fenced.release().await.unwrap());
    let shared = client
        .lock_with("shared", LockOptions::new(TTL).shared(true))
        .await
        .unwrap();
    assert!(shared.release().await.unwrap());
    let permit = client
        .lock_with("permits", LockOptions::new(TTL).permits(2))
        .await
        .unwrap();
    assert!(permit.release().await.unwrap());
    let both = client
        .lock_all(&["a", "b"], LockOptions::new(TTL))
        .await
        .unwrap();
    assert!(both.release().await.unwrap());
    // A lease handed in this process to a task that fences: the fence is
    // written into the value, and the release still deletes it.
    let plain = client.lock_with("handed", unrenewed()).await.unwrap();
    let waiting = {
        let client = client.clone();
        spawn_waiting(async move {
            let options = LockOptions::new(TTL).fencing(true).wait(BOUND);
            client.lock_with("handed", options).await.unwrap()
        })
        .await
    };
    assert!(plain.release().await.unwrap());
    let fenced = waiting.await.unwrap();
    assert!(fenced.fencing_token().is_some());
    assert!(fenced.release().await.unwrap());
    for key in ["fenced", "shared", "permits", "a", "b", "handed"] {
        assert!(!holds(&server, key), "{key} still held");
    }
    assert_eq!(calls(&server, "delifeq"), before);
}

/// The documented user, whose ACL names no `DELIFEQ`, keeps the script and
/// leaves no denial in `ACL LOG`: the first release asks with
/// `redis.acl_check_cmd`, which logs nothing. Given `+delifeq` as well
/// (where the server has it), the same user releases natively, again
/// without a denial.
#[tokio::test]
async fn the_documented_acl_keeps_the_script_without_a_denial() {
    let server = acl_server();
    let native = has_delifeq(&server);
    let mut rules = documented_rules("locker", PREFIX);
    create_user(&server, "locker", &rules);
    if native {
        rules.push("+delifeq".to_owned());
    }
    create_user(&server, "native", &rules);
    for (user, expect_native) in [("locker", false), ("native", native)] {
        let client = settings()
            .url(user_url(&server, user))
            .build()
            .await
            .unwrap();
        let _: () = server.cmd(&["ACL", "LOG", "RESET"]);
        let before = counters(&server);
        for round in 0..4 {
            let key = format!("{user}-{round}");
            let guard = client.lock_with(&key, unrenewed()).await.unwrap();
            assert!(guard.release().await.unwrap());
            assert!(!holds(&server, &key));
        }
        let (delifeq, _) = releases_since(&server, before);
        // The first release asks by the script; the other three follow
        // its answer.
        assert_eq!(delifeq, if expect_native { 3 } else { 0 }, "user {user}");
        let denied: Vec<_> = denials(&server)
            .into_iter()
            .filter(|d| format!("{d:?}").contains("delifeq"))
            .collect();
        assert!(denied.is_empty(), "user {user}: {denied:?}");
    }
}

/// The first release on a connection checks that the lock held the value
/// this client would name to `DELIFEQ`: a lock of ours in another form
/// (here its value rewritten behind the client's back, the token kept) is
/// still released, by the script, and the connection keeps the script.
#[tokio::test]
async fn a_value_not_as_foreseen_keeps_the_script() {
    let server = RedisServer::start();
    let client = client_with(&server, settings()).await;
    let guard = client.lock_with("k", unrenewed()).await.unwrap();
    let stored = storage_key(PREFIX, "k");
    let value: String = server.cmd(&["GET", &stored]);
    let token = value.split('|').next().unwrap().to_owned();
    let _: () = server.cmd(&["SET", &stored, &format!("{token}|1||elsewhere"), "KEEPTTL"]);
    assert!(guard.release().await.unwrap());
    assert!(!holds(&server, "k"));
    let before = counters(&server);
    for round in 0..3 {
        let guard = client
            .lock_with(&format!("k{round}"), unrenewed())
            .await
            .unwrap();
        assert!(guard.release().await.unwrap());
    }
    assert_eq!(releases_since(&server, before), (0, 3));
}
