//! lock-core against one real `redis-server`, where only a single server
//! shows it: what Redis holds (keys, tokens, expiries, channels, script
//! calls), and what happens when the server stops, restarts, flushes its
//! scripts or refuses a password. What must hold on every backend lives in
//! `behaviour.rs`.

use crate::support::{
    client_with, eventually, slow_backoff, spawn_waiting, storage_key, subscribers,
};
use lock_core::{ErrorKind, LockClient, LockClientBuilder, LockGuard, LockOptions};
use lock_testkit::RedisServer;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

const PREFIX: &str = "test:lock:";

/// The clients of this file: a short operation timeout, so that calls to a
/// stopped server fail fast.
fn settings() -> LockClientBuilder {
    LockClient::builder()
        .key_prefix(PREFIX)
        .operation_timeout(Duration::from_millis(500))
}

/// After the guard is gone, a key holding our token is no longer renewed.
async fn assert_not_renewed(server: &RedisServer, client: &LockClient, token: &str, ttl: Duration) {
    let key = storage_key(PREFIX, "k");
    // The key as a stale renewal would find it: still ours.
    let _: () = server.cmd(&["SET", &key, token, "PX", &ttl.as_millis().to_string()]);
    eventually(ttl * 4, "the key expires (nobody renews it)", || {
        server.cmd::<Option<String>>(&["GET", &key]).is_none()
    })
    .await;
    assert_eq!(client.heartbeats_running(), 0);
}

#[tokio::test]
async fn renewal_keeps_the_same_key_in_redis_until_release_and_then_stops() {
    let server = RedisServer::start();
    let client = client_with(&server, settings()).await;
    let ttl = Duration::from_millis(300);
    let guard = client.lock("k", ttl).await.unwrap();
    assert_eq!(client.heartbeats_running(), 1);
    let token: String = server.cmd(&["GET", &storage_key(PREFIX, "k")]);
    // Five ttls: without renewal the key would be long gone. Renewal moves
    // its expiry and leaves its token alone.
    let until = Instant::now() + ttl * 5;
    while Instant::now() < until {
        let value: Option<String> = server.cmd(&["GET", &storage_key(PREFIX, "k")]);
        assert_eq!(value.as_deref(), Some(token.as_str()), "lease expired");
        assert!(!guard.is_lost());
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(guard.release().await.unwrap());
    eventually(Duration::from_secs(2), "heartbeat ends", || {
        client.heartbeats_running() == 0
    })
    .await;
    assert_not_renewed(&server, &client, &token, ttl).await;
}

#[tokio::test]
async fn drop_releases_and_stops_renewal() {
    let server = RedisServer::start();
    let client = client_with(&server, settings()).await;
    let ttl = Duration::from_secs(10);
    let guard = client.lock("k", ttl).await.unwrap();
    let token: String = server.cmd(&["GET", &storage_key(PREFIX, "k")]);
    drop(guard);
    // Released in the background long before the 10 s ttl.
    eventually(
        Duration::from_secs(2),
        "the dropped guard's key is deleted",
        || {
            server
                .cmd::<Option<String>>(&["GET", &storage_key(PREFIX, "k")])
                .is_none()
        },
    )
    .await;
    assert!(
        client.try_lock("k", ttl).await.unwrap().is_some(),
        "free after drop"
    );
    eventually(Duration::from_secs(2), "heartbeats end", || {
        client.heartbeats_running() == 0
    })
    .await;
    assert_not_renewed(&server, &client, &token, Duration::from_millis(300)).await;
}

#[tokio::test]
async fn a_lock_taken_over_is_detected_as_lost_within_a_renewal_interval() {
    let server = RedisServer::start();
    let client = client_with(&server, settings()).await;
    let ttl = Duration::from_millis(1500);
    let guard = client.lock("k", ttl).await.unwrap();
    let _: () = server.cmd(&[
        "SET",
        &storage_key(PREFIX, "k"),
        "someone-else",
        "PX",
        "60000",
    ]);
    let started = Instant::now();
    tokio::time::timeout(ttl, guard.lost())
        .await
        .expect("loss not detected");
    let took = started.elapsed();
    // The next renewal (every ttl/3 = 500 ms) notices; the validity deadline
    // (about 1.5 s) is not what fired.
    assert!(took < ttl / 3 + Duration::from_millis(400), "took {took:?}");
    assert!(guard.is_lost());
    assert!(
        !guard.release().await.unwrap(),
        "release must say it was not ours"
    );
    let value: String = server.cmd(&["GET", &storage_key(PREFIX, "k")]);
    assert_eq!(value, "someone-else", "the new owner's key was touched");
}

#[tokio::test]
async fn extend_sets_the_expiry_in_redis_longer_or_shorter() {
    let server = RedisServer::start();
    let client = client_with(&server, settings()).await;
    let guard = client
        .lock_with("k", LockOptions::new(Duration::from_secs(3)).renew(false))
        .await
        .unwrap();
    let pttl = || server.cmd::<i64>(&["PTTL", &storage_key(PREFIX, "k")]);
    guard.extend(Duration::from_secs(60)).await.unwrap();
    assert!(pttl() > 50_000, "pttl {}", pttl());
    assert_eq!(guard.ttl(), Duration::from_secs(60));
    guard.extend(Duration::from_millis(300)).await.unwrap();
    assert!((1..=300).contains(&pttl()), "pttl {}", pttl());
    assert_eq!(guard.ttl(), Duration::from_millis(300));
    guard.extend(Duration::from_secs(3)).await.unwrap();
    assert!(pttl() > 2000, "pttl {}", pttl());
    assert!(guard.release().await.unwrap());
}

#[tokio::test]
async fn extend_after_the_key_was_deleted_in_redis_reports_the_lock_lost() {
    let server = RedisServer::start();
    let client = client_with(&server, settings()).await;
    let guard = client
        .lock_with("k", LockOptions::new(Duration::from_secs(2)).renew(false))
        .await
        .unwrap();
    let _: () = server.cmd(&["DEL", &storage_key(PREFIX, "k")]);
    let err = guard.extend(Duration::from_secs(60)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Lost);
    assert!(guard.is_lost());
}

#[tokio::test]
async fn scripts_survive_script_flush() {
    let server = RedisServer::start();
    let client = client_with(&server, settings()).await;
    let opts = LockOptions::new(Duration::from_secs(5)).fencing(true);
    let guard = client.lock_with("k", opts.clone()).await.unwrap();
    let first = guard.fencing_token().unwrap();
    guard.extend(Duration::from_secs(5)).await.unwrap();
    assert!(guard.release().await.unwrap());

    let _: () = server.cmd(&["SCRIPT", "FLUSH"]);
    let guard = client.lock_with("k", opts).await.unwrap();
    assert!(guard.fencing_token().unwrap() > first);
    let _: () = server.cmd(&["SCRIPT", "FLUSH"]);
    guard.extend(Duration::from_secs(5)).await.unwrap();
    let _: () = server.cmd(&["SCRIPT", "FLUSH"]);
    assert!(guard.release().await.unwrap());
    let value: Option<String> = server.cmd(&["GET", &storage_key(PREFIX, "k")]);
    assert_eq!(value, None);
}

#[tokio::test]
async fn tokens_are_long_random_and_new_for_every_acquisition() {
    let server = RedisServer::start();
    let client = client_with(&server, settings()).await;
    let mut seen = std::collections::HashSet::new();
    for _ in 0..50 {
        let guard = client.lock("k", Duration::from_secs(5)).await.unwrap();
        let value: String = server.cmd(&["GET", &storage_key(PREFIX, "k")]);
        // The value is `<token>|<acquired ms>|<fence>|<holder>`
        // (docs/format.md); the token is what decides ownership.
        let token = value.split('|').next().unwrap_or_default().to_owned();
        assert!(
            token.len() >= 32,
            "token {token:?} shorter than 16 bytes hex"
        );
        assert!(token.bytes().all(|b| b.is_ascii_hexdigit()), "{token:?}");
        assert!(seen.insert(token), "a token was reused");
        guard.release().await.unwrap();
    }
}

#[tokio::test]
async fn keys_carry_the_prefix_and_ttl_is_in_milliseconds() {
    let server = RedisServer::start();
    let client = client_with(&server, settings()).await;
    let guard = client
        .lock("order:42", Duration::from_millis(1500))
        .await
        .unwrap();
    let keys: Vec<String> = server.cmd(&["KEYS", "*"]);
    assert_eq!(keys, vec![format!("{PREFIX}{{order:42}}")]);
    assert_eq!(guard.key(), "order:42");
    let pttl: i64 = server.cmd(&["PTTL", &keys[0]]);
    assert!(pttl > 1000 && pttl <= 1500, "pttl {pttl}");
    guard.release().await.unwrap();
}

#[tokio::test]
async fn redis_stopped_mid_hold_is_lost_and_release_is_bounded() {
    let mut server = RedisServer::start();
    let client = client_with(&server, settings()).await;
    let ttl = Duration::from_millis(600);
    let guard = client.lock("k", ttl).await.unwrap();
    server.stop();
    let started = Instant::now();
    tokio::time::timeout(ttl + Duration::from_secs(1), guard.lost())
        .await
        .expect("loss not detected with Redis down");
    assert!(started.elapsed() <= ttl + Duration::from_millis(300));
    let started = Instant::now();
    let err = guard.release().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(
        started.elapsed() < client.operation_timeout() + Duration::from_millis(500),
        "release took {:?}",
        started.elapsed()
    );
    let started = Instant::now();
    let err = client
        .lock_with("k", LockOptions::new(ttl).wait(Duration::from_millis(300)))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(
        started.elapsed() < Duration::from_millis(300) + client.operation_timeout() * 2,
        "lock took {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn the_client_reconnects_after_a_restart() {
    let mut server = RedisServer::start();
    let client = client_with(&server, settings()).await;
    client
        .lock("k", Duration::from_secs(5))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    server.restart();
    // The first call may see the dead connection; within a couple of tries
    // the client is back without being rebuilt.
    let opts = LockOptions::new(Duration::from_secs(5)).wait(Duration::from_secs(3));
    let guard = client.lock_with("k", opts).await.unwrap();
    assert!(guard.release().await.unwrap());
}

#[tokio::test]
async fn nothing_listening_fails_fast_with_a_clear_error() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let started = Instant::now();
    let err = LockClient::builder()
        .url(format!("redis://127.0.0.1:{port}"))
        .build()
        .await
        .unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    let text = err.to_string();
    assert!(text.contains(&port.to_string()), "{text}");
    assert!(std::error::Error::source(&err).is_some());
}

#[tokio::test]
async fn wrong_password_is_a_clear_error() {
    let server = RedisServer::builder().password("right").start();
    let url = server.url().replace(":right@", ":wrong@");
    let err = LockClient::builder().url(url).build().await.unwrap_err();
    // A refused login is the server's answer: `Server`, as documented.
    assert_eq!(err.kind(), ErrorKind::Server, "{err}");
    assert!(
        err.to_string()
            .contains("the server refused the credentials: check the user name and password"),
        "{err}"
    );
    assert!(
        !err.chain().to_string().contains("wrong"),
        "password leaked: {}",
        err.chain()
    );
    let ok = LockClient::builder().url(server.url()).build().await;
    assert!(ok.is_ok(), "{:?}", ok.err());
}

/// A refused login reported whole: the error says what happened and what
/// to check, and the server's own words follow once, as its source,
/// however the chain is printed.
#[tokio::test]
async fn a_refused_login_is_told_once_in_a_whole_chain() {
    const REFUSAL: &str = "invalid username-password pair";
    let server = RedisServer::builder().password("right").start();
    let url = server.url().replace(":right@", ":wrong@");
    let err = LockClient::builder().url(url).build().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Server, "{}", err.chain());
    // The error itself says what happened, without the source's text.
    let said = err.to_string();
    assert!(said.contains("refused the credentials"), "{said}");
    assert!(!said.contains(REFUSAL), "{said}");
    let source = std::error::Error::source(&err).expect("the server's answer as the source");
    assert!(source.to_string().contains(REFUSAL), "{source}");
    assert!(source.source().is_none(), "{source:?}");
    // anyhow walks the sources itself; chain() does the same.
    let reported = format!("{:#}", anyhow::Error::from(err));
    assert_eq!(reported.matches(REFUSAL).count(), 1, "{reported}");
    assert!(reported.starts_with(&said), "{reported}");
    let url = server.url().replace(":right@", ":wrong@");
    let err = LockClient::builder().url(url).build().await.unwrap_err();
    assert_eq!(err.chain().to_string(), reported);
}

#[tokio::test]
async fn a_url_without_a_scheme_says_to_write_redis_scheme() {
    let err = LockClient::builder()
        .url("127.0.0.1:7600")
        .build()
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    assert_eq!(
        err.to_string(),
        "invalid lock client configuration: Redis URL \"127.0.0.1:7600\" has no scheme: \
         write it as redis://127.0.0.1:7600 (rediss:// for TLS)"
    );
    let err = LockClient::builder()
        .url("app:s3cret@10.0.0.5:6379")
        .build()
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("write it as redis://user:password@10.0.0.5:6379"),
        "{text}"
    );
    assert!(!text.contains("s3cret"), "password leaked: {text}");
    let err = LockClient::builder()
        .cluster(["127.0.0.1:7000"])
        .build()
        .await
        .unwrap_err();
    assert!(err.to_string().contains("redis://127.0.0.1:7000"), "{err}");
    // A URL with a scheme that still does not parse says what the form is.
    let err = LockClient::builder()
        .url("redis://127.0.0.1:port")
        .build()
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("write it as redis://[user:password@]host:port[/db]"),
        "{err}"
    );
}

#[tokio::test]
async fn a_ttl_out_of_range_in_a_call_is_the_locks_options_not_the_clients() {
    let server = RedisServer::start();
    let client = client_with(&server, settings()).await;
    let err = client
        .lock("order:1", Duration::from_millis(1))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    assert_eq!(
        err.to_string(),
        "invalid lock options (key \"order:1\"): ttl 1ms is shorter than the minimum 10ms"
    );
    let err = client
        .lock_with(
            "order:1",
            LockOptions::new(Duration::from_secs(1)).wait(Duration::from_secs(90_000)),
        )
        .await
        .unwrap_err();
    assert!(err.to_string().starts_with("invalid lock options"), "{err}");
    // The same ttl as the client's default is the client's configuration.
    let err = settings()
        .url(server.url())
        .default_ttl(Duration::from_millis(1))
        .build()
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .starts_with("invalid lock client configuration: default_ttl 1ms"),
        "{err}"
    );
}

#[test]
fn a_client_outlives_the_runtime_that_built_it() {
    let server = RedisServer::start();
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    };
    let client = runtime().block_on(async {
        let client = client_with(&server, settings()).await;
        let guard: LockGuard = client.lock("k", Duration::from_secs(5)).await.unwrap();
        assert!(guard.release().await.unwrap());
        client
    });
    // The first runtime, and the connection task it drove, are gone. A single
    // attempt must still work: no error for the caller to retry.
    for _ in 0..3 {
        runtime().block_on(async {
            let guard = client
                .try_lock("k", Duration::from_secs(5))
                .await
                .unwrap()
                .expect("the key is free");
            assert!(!guard.is_lost());
            assert!(guard.release().await.unwrap());
        });
    }
}

/// Script calls so far, from `INFO commandstats`.
fn script_calls(server: &RedisServer) -> u64 {
    let info: String = server.cmd(&["INFO", "commandstats"]);
    info.lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .filter_map(|l| {
            l.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_held_locks_are_renewed_in_batches() {
    let server = RedisServer::start();
    let client = client_with(&server, settings()).await;
    let ttl = Duration::from_millis(600);
    let mut guards = Vec::new();
    for i in 0..500 {
        guards.push(client.lock(&format!("batch:{i}"), ttl).await.unwrap());
    }
    assert_eq!(client.heartbeats_running(), 500);
    let before = script_calls(&server);
    let held_for = ttl * 4;
    tokio::time::sleep(held_for).await;
    let calls = script_calls(&server) - before;
    assert!(guards.iter().all(|g| !g.is_lost()), "a lease was lost");
    let alive: i64 = server.cmd(&["EXISTS", &storage_key(PREFIX, "batch:0")]);
    assert_eq!(alive, 1);
    // One call per lock per renewal would be 500 * 4 * 3 = 6000.
    assert!(
        calls < 100,
        "{calls} script calls to renew 500 locks for {held_for:?}"
    );
    for guard in guards {
        guard.release().await.unwrap();
    }
    assert_eq!(client.heartbeats_running(), 0);
}

#[tokio::test]
async fn a_waiter_listens_for_the_release_only_while_it_waits() {
    let server = RedisServer::start();
    let holder = client_with(&server, settings()).await;
    // The other process polls only every 5 s: only a wake-up gets it in
    // quickly.
    let waiter = client_with(&server, settings().backoff(slow_backoff())).await;
    let channel = storage_key(PREFIX, "k");
    let held = holder.lock("k", Duration::from_secs(10)).await.unwrap();
    let waiting = tokio::spawn(async move {
        let opts = LockOptions::new(Duration::from_secs(10)).wait(Duration::from_secs(20));
        waiter.lock_with("k", opts).await
    });
    // Its first attempts are done once it subscribed: the channel has a
    // subscriber.
    eventually(Duration::from_secs(5), "the waiter subscribes", || {
        subscribers(&server, &channel) == 1
    })
    .await;
    assert!(held.release().await.unwrap());
    let guard = tokio::time::timeout(Duration::from_secs(3), waiting)
        .await
        .expect("the waiter slept through the release")
        .unwrap();
    guard.unwrap().release().await.unwrap();
    // Done waiting, it unsubscribes at once: Redis tells subscribers in the
    // order they subscribed, and a process that stayed subscribed would
    // hear every later release first and win the race for it.
    eventually(
        Duration::from_secs(2),
        "the waiter unsubscribes once it has the lock",
        || subscribers(&server, &channel) == 0,
    )
    .await;
}

#[tokio::test]
async fn a_hand_off_in_process_keeps_the_lease_and_renews_it_for_the_next_holder() {
    let server = RedisServer::start();
    let client = Arc::new(client_with(&server, settings()).await);
    let held = client
        .lock_with("k", LockOptions::new(Duration::from_secs(5)).fencing(true))
        .await
        .unwrap();
    let token: String = server.cmd(&["GET", &storage_key(PREFIX, "k")]);
    let waiter = {
        let client = client.clone();
        spawn_waiting(async move {
            let opts = LockOptions::new(Duration::from_secs(60))
                .wait(Duration::from_secs(20))
                .fencing(true);
            client.lock_with("k", opts).await
        })
        .await
    };
    let first_fence = held.fencing_token().unwrap();
    assert!(held.release().await.unwrap());
    let next = waiter.await.unwrap().unwrap();
    // Same lease in Redis (never given up), the new holder's ttl, a new fence
    // (written into the value's fence field; the token stays).
    let now_token: String = server.cmd(&["GET", &storage_key(PREFIX, "k")]);
    assert_eq!(now_token.split('|').next(), token.split('|').next());
    assert_ne!(now_token, token, "the new fence is in the value");
    let pttl: i64 = server.cmd(&["PTTL", &storage_key(PREFIX, "k")]);
    assert!(pttl > 50_000, "pttl {pttl}");
    assert!(next.fencing_token().unwrap() > first_fence);
    assert!(next.release().await.unwrap());
}

#[tokio::test]
async fn a_hand_off_without_fencing_costs_no_round_trip_and_is_renewed_for_the_new_ttl() {
    let server = RedisServer::start();
    let client = Arc::new(client_with(&server, settings()).await);
    let held = client.lock("k", Duration::from_secs(5)).await.unwrap();
    let token: String = server.cmd(&["GET", &storage_key(PREFIX, "k")]);
    let waiter = {
        let client = client.clone();
        spawn_waiting(async move {
            let opts = LockOptions::new(Duration::from_secs(60)).wait(Duration::from_secs(20));
            client.lock_with("k", opts).await
        })
        .await
    };
    assert!(held.release().await.unwrap());
    let next = waiter.await.unwrap().unwrap();
    let now_token: String = server.cmd(&["GET", &storage_key(PREFIX, "k")]);
    assert_eq!(now_token, token, "the lease never left Redis");
    // Its ttl (60 s) is longer than what the lease had left: the heartbeat
    // sets it at once.
    eventually(
        Duration::from_secs(2),
        "the lease is renewed for 60 s",
        || server.cmd::<i64>(&["PTTL", &storage_key(PREFIX, "k")]) > 50_000,
    )
    .await;
    assert!(!next.is_lost());
    assert!(next.release().await.unwrap());
    let gone: Option<String> = server.cmd(&["GET", &storage_key(PREFIX, "k")]);
    assert_eq!(gone, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_key_in_a_renewal_batch_loses_only_its_own_lock() {
    let server = RedisServer::start();
    let client = client_with(&server, settings()).await;
    // Renewed every 150 ms; taken together, so both are due in the same
    // round and renewed by one script call. `b` first: should a failed
    // batch keep both from being renewed, `b`'s validity ends first (or
    // with `a`'s), so the test cannot pass by `b` outliving `a` and being
    // renewed alone.
    let ttl = Duration::from_millis(450);
    let guard_b = client.lock("b", ttl).await.unwrap();
    let guard_a = client.lock("a", ttl).await.unwrap();
    let key_a = client.storage_key("a").unwrap();
    let key_b = client.storage_key("b").unwrap();
    let token_b: String = server.cmd(&["GET", &key_b]);

    // Another program takes `a`'s key for a hash, in one step so that no
    // renewal finds the key simply gone.
    let mut conn = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let () = redis::pipe()
        .atomic()
        .del(&key_a)
        .ignore()
        .hset(&key_a, "field", "value")
        .ignore()
        .query_async(&mut conn)
        .await
        .unwrap();

    let started = Instant::now();
    let bound = Duration::from_secs(5);
    while !guard_a.is_lost() {
        assert!(started.elapsed() < bound, "`a` was not reported lost");
        assert!(!guard_b.is_lost(), "`b` was lost with `a`");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Several more renewal intervals: `b` stays renewed.
    let until = Instant::now() + ttl * 3;
    while Instant::now() < until {
        assert!(!guard_b.is_lost(), "`b` was lost with `a`");
        let value: Option<String> = server.cmd(&["GET", &key_b]);
        assert_eq!(value.as_deref(), Some(token_b.as_str()), "`b` expired");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(guard_b.release().await.unwrap());
    assert!(
        !guard_a.release().await.unwrap(),
        "`a` was not ours any more"
    );
    let kind: String = server.cmd(&["TYPE", &key_a]);
    assert_eq!(kind, "hash", "the other program's key was touched");
}

/// The fence counter of lock `key`.
fn fence_key(key: &str) -> String {
    format!("{}:fence", storage_key(PREFIX, key))
}

#[tokio::test]
async fn fence_counters_expire_and_tokens_still_grow_after_one_expired() {
    let server = RedisServer::start();
    let client = client_with(&server, settings()).await;
    let day_ms: i64 = 24 * 60 * 60 * 1000;
    let fenced = |ttl| LockOptions::new(ttl).fencing(true);

    let guard = client
        .lock_with("k", fenced(Duration::from_secs(5)))
        .await
        .unwrap();
    let first = guard.fencing_token().unwrap();
    assert!(guard.release().await.unwrap());
    // Kept a day after the last fenced acquisition: it does not pile up.
    let pttl: i64 = server.cmd(&["PTTL", &fence_key("k")]);
    assert!((day_ms - 60_000..=day_ms).contains(&pttl), "pttl {pttl}");

    // Gone (as after its retention): the next token is still larger.
    let _: () = server.cmd(&["DEL", &fence_key("k")]);
    let guard = client
        .lock_with("k", fenced(Duration::from_secs(5)))
        .await
        .unwrap();
    let second = guard.fencing_token().unwrap();
    assert!(second > first, "{second} after {first}");
    assert!(guard.release().await.unwrap());

    // Twenty holders, the counter deleted now and then: strictly growing.
    let mut last = second;
    for i in 0..20 {
        if i % 3 == 0 {
            let _: () = server.cmd(&["DEL", &fence_key("k")]);
        }
        let guard = client
            .lock_with("k", fenced(Duration::from_secs(5)))
            .await
            .unwrap();
        let token = guard.fencing_token().unwrap();
        assert!(token > last, "holder {i}: {token} after {last}");
        last = token;
        assert!(guard.release().await.unwrap());
    }

    // A ttl longer than a tenth of a day keeps its counter ten ttls.
    let long = Duration::from_secs(3 * 60 * 60);
    let guard = client.lock_with("long", fenced(long)).await.unwrap();
    let pttl: i64 = server.cmd(&["PTTL", &fence_key("long")]);
    assert!(pttl > 10 * 3 * 60 * 60 * 1000 - 60_000, "pttl {pttl}");
    assert!(guard.release().await.unwrap());
}

/// `send_release` returns once the release is written, before its reply:
/// the next acquisition of the key on the same connection comes after it,
/// so it finds the key free without waiting, every time; and a waiter of
/// another process hears it.
#[tokio::test]
async fn send_release_is_ordered_before_the_next_command_and_wakes_waiters() {
    let server = RedisServer::start();
    let client = client_with(&server, LockClient::builder().key_prefix(PREFIX)).await;
    let ttl = Duration::from_secs(30);
    for i in 0..200 {
        let guard = client
            .try_lock("sent", ttl)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("cycle {i}: the key was still held"));
        guard.send_release().await.unwrap();
    }
    eventually(Duration::from_secs(5), "the last release applied", || {
        !server.cmd::<bool>(&["EXISTS", &storage_key(PREFIX, "sent")])
    })
    .await;

    // Another process's waiter, backing off 5 s, wakes on the message the
    // unconfirmed release publishes.
    let other = client_with(
        &server,
        LockClient::builder()
            .key_prefix(PREFIX)
            .backoff(slow_backoff()),
    )
    .await;
    let guard = client.lock("sent", ttl).await.unwrap();
    let waiter = spawn_waiting(async move {
        let got = other.lock("sent", ttl).await.unwrap();
        got.release().await.unwrap();
        Instant::now()
    })
    .await;
    let released = Instant::now();
    guard.send_release().await.unwrap();
    let lag = waiter.await.unwrap().saturating_duration_since(released);
    assert!(lag < slow_backoff().base(), "the waiter took {lag:?}");
}

/// What the caller of a release sent without its reply notices: it returns
/// while the server cannot answer, and the release applies once it can.
#[tokio::test]
async fn send_release_does_not_wait_for_a_frozen_server() {
    let server = RedisServer::start();
    let client = client_with(
        &server,
        LockClient::builder()
            .key_prefix(PREFIX)
            .operation_timeout(Duration::from_secs(3)),
    )
    .await;
    let ttl = Duration::from_secs(30);
    // The first release on a connection waits (it loads the script).
    let first = client.lock("frozen", ttl).await.unwrap();
    first.send_release().await.unwrap();
    let guard = client.lock("frozen", ttl).await.unwrap();
    let paused = server.pause();
    let started = Instant::now();
    guard.send_release().await.unwrap();
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(1),
        "send_release waited {took:?} for a server that cannot answer"
    );
    paused.resume();
    eventually(Duration::from_secs(5), "the release applied", || {
        !server.cmd::<bool>(&["EXISTS", &storage_key(PREFIX, "frozen")])
    })
    .await;
}
