//! Liveness: no key jams in the in-process queue, every call stays within
//! its bound with a server frozen, and nothing an acquisition or a release
//! took is left behind when its future is dropped.

use crate::support::{build, client_for, client_with, eventually, storage_key, subscribers};
use lock_core::{ErrorKind, HandoffBudget, LockClient, LockOptions, MemoryStore};
use lock_testkit::{Proxy, ProxyMode, RedisServer, start_servers};
use std::future::Future;
use std::pin::pin;
use std::task::Poll;
use std::time::Duration;
use tokio::time::Instant;

const PREFIX: &str = "live:";

/// Polls `future` once: `true` when it is still pending.
async fn poll_once<F: Future>(future: std::pin::Pin<&mut F>) -> bool {
    let mut future = future;
    std::future::poll_fn(|cx| Poll::Ready(future.as_mut().poll(cx).is_pending())).await
}

/// A holder in this process, a waiter queued behind it, the holder lets go
/// (handing the lease or the turn to the waiter), and the waiter's future
/// is dropped before it runs again: the key must not stay with it.
async fn a_waiter_gone_after_the_hand_off_does_not_jam(client: &LockClient, fencing: bool) {
    let ttl = Duration::from_secs(30);
    let options = || LockOptions::new(ttl).fencing(fencing);
    let holder = client.lock_with("k", options()).await.unwrap();
    let mut waiter = Box::pin(client.lock_with("k", options().wait(Duration::from_secs(30))));
    assert!(poll_once(waiter.as_mut()).await, "the waiter is queued");
    assert!(holder.release().await.unwrap());
    drop(waiter);
    // Another task of this process takes the key within its wait, long
    // before the 30 s ttl of whatever the waiter was handed.
    let started = Instant::now();
    let again = client
        .lock_with("k", options().wait(Duration::from_secs(5)))
        .await
        .unwrap_or_else(|e| panic!("the key jammed in the local queue: {e}"));
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(again.release().await.unwrap());
    eventually(Duration::from_secs(5), "the local queue empties", || {
        client.queued_keys() == 0
    })
    .await;
}

#[tokio::test]
async fn a_handed_lease_whose_waiter_is_gone_is_passed_on_in_memory() {
    let client = LockClient::in_memory();
    a_waiter_gone_after_the_hand_off_does_not_jam(&client, false).await;
    a_waiter_gone_after_the_hand_off_does_not_jam(&client, true).await;
}

#[tokio::test]
async fn a_handed_turn_whose_waiter_is_gone_is_passed_on_in_memory() {
    let client = LockClient::builder()
        .in_memory(&MemoryStore::new())
        .handoff_budget(HandoffBudget::NONE)
        .build()
        .await
        .unwrap();
    a_waiter_gone_after_the_hand_off_does_not_jam(&client, false).await;
}

#[tokio::test]
async fn a_handed_lease_or_turn_whose_waiter_is_gone_is_passed_on_redis() {
    let server = RedisServer::start();
    let client = client_for(&server, PREFIX).await;
    a_waiter_gone_after_the_hand_off_does_not_jam(&client, false).await;
    a_waiter_gone_after_the_hand_off_does_not_jam(&client, true).await;
    let turns = client_with(
        &server,
        LockClient::builder()
            .key_prefix(PREFIX)
            .handoff_budget(HandoffBudget::NONE),
    )
    .await;
    a_waiter_gone_after_the_hand_off_does_not_jam(&turns, false).await;
    assert!(!server.cmd::<bool>(&["EXISTS", &storage_key(PREFIX, "k")]));
}

#[tokio::test]
async fn lock_futures_dropped_after_one_poll_leave_no_key_held() {
    let server = RedisServer::start();
    let client = client_for(&server, PREFIX).await;
    let ttl = Duration::from_secs(30);
    let sets_before = set_calls(&server);
    for i in 0..20 {
        let key = format!("k{i}");
        // A reply can come in within the first poll (the guard it gives is
        // dropped, and released): then try again.
        let mut tries = 0;
        loop {
            let mut lock = pin!(client.lock(&key, ttl));
            if poll_once(lock.as_mut()).await {
                break;
            }
            tries += 1;
            assert!(tries < 50, "a SET never stayed in flight");
        }
    }
    eventually(
        Duration::from_secs(5),
        "the 20 SETs reach the server",
        || set_calls(&server) >= sets_before + 20,
    )
    .await;
    eventually(Duration::from_secs(5), "every key is released", || {
        (0..20).all(|i| !server.cmd::<bool>(&["EXISTS", &storage_key(PREFIX, &format!("k{i}"))]))
    })
    .await;
    assert_eq!(client.queued_keys(), 0);
    assert_eq!(client.heartbeats_running(), 0);
}

/// How many `SET` commands `server` has run.
fn set_calls(server: &RedisServer) -> u64 {
    let stats: String = server.cmd(&["INFO", "commandstats"]);
    stats
        .lines()
        .find_map(|line| line.strip_prefix("cmdstat_set:calls="))
        .and_then(|rest| rest.split(',').next())
        .and_then(|calls| calls.parse().ok())
        .unwrap_or(0)
}

#[tokio::test]
async fn extend_to_a_shorter_ttl_moves_the_next_renewal() {
    let server = RedisServer::start();
    let client = client_for(&server, PREFIX).await;
    let other = client_for(&server, PREFIX).await;
    let guard = client.lock("k", Duration::from_secs(3)).await.unwrap();
    guard.extend(Duration::from_millis(300)).await.unwrap();
    let pttl: i64 = server.cmd(&["PTTL", &storage_key(PREFIX, "k")]);
    assert!(
        (0..=300).contains(&pttl),
        "extend set the new ttl: {pttl} ms"
    );
    // Five times the new ttl: renewed every 100 ms, never lost.
    let until = Instant::now() + Duration::from_millis(1500);
    while Instant::now() < until {
        assert!(!guard.is_lost(), "lost after extending to a shorter ttl");
        assert!(
            other
                .try_lock("k", Duration::from_secs(1))
                .await
                .unwrap()
                .is_none(),
            "another client took the lock"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(guard.release().await.unwrap());
}

#[tokio::test]
async fn a_release_dropped_while_reconnecting_is_still_sent() {
    let server = RedisServer::builder().password("pw").start();
    let proxy = Proxy::start(server.addr());
    let client = build(
        LockClient::builder()
            .url(format!("redis://:pw@{}", proxy.addr()))
            .key_prefix(PREFIX)
            .operation_timeout(Duration::from_secs(2)),
        &server,
    )
    .await;
    let guard = client.lock("k", Duration::from_secs(30)).await.unwrap();
    // The next connection hangs in its AUTH: the release waits for it.
    proxy.set_mode(ProxyMode::Blackhole);
    proxy.cut();
    let mut release = Box::pin(guard.release());
    let gave_up = tokio::time::timeout(Duration::from_millis(200), &mut release).await;
    assert!(gave_up.is_err(), "the release could not finish");
    drop(release);
    // The connection under way completes once the link passes again.
    proxy.set_mode(ProxyMode::Pass);
    eventually(Duration::from_secs(10), "the release reaches Redis", || {
        !server.cmd::<bool>(&["EXISTS", &storage_key(PREFIX, "k")])
    })
    .await;
}

#[tokio::test]
async fn a_server_busy_with_a_script_is_waited_out_within_the_wait() {
    let server = RedisServer::builder()
        .args(["--busy-reply-threshold", "50"])
        .start();
    let client = client_for(&server, PREFIX).await;
    // Another program runs a script for about 700 ms; past 50 ms the server
    // answers BUSY to everyone else.
    let url = server.url();
    let script = std::thread::spawn(move || {
        let mut conn = redis::Client::open(url).unwrap().get_connection().unwrap();
        let _: redis::RedisResult<()> = redis::cmd("EVAL")
            .arg(
                "local t = redis.call('TIME') local start = t[1] * 1000000 + t[2] \
                 while true do local n = redis.call('TIME') \
                 if n[1] * 1000000 + n[2] - start > 700000 then break end end",
            )
            .arg(0)
            .query(&mut conn);
    });
    let mut probe = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let busy = async {
        loop {
            let answer: redis::RedisResult<String> =
                redis::cmd("PING").query_async(&mut probe).await;
            if answer.is_err_and(|e| e.code() == Some("BUSY")) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(5), busy)
        .await
        .expect("the server never got busy");
    let guard = client
        .lock_with(
            "k",
            LockOptions::new(Duration::from_secs(10)).wait(Duration::from_secs(5)),
        )
        .await
        .unwrap_or_else(|e| panic!("a busy server ended the wait: {e}"));
    assert!(guard.release().await.unwrap());
    script.join().unwrap();
}

#[tokio::test]
async fn a_contended_wait_over_a_slow_link_ends_within_wait_plus_one_timeout() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.addr());
    let holder = client_for(&server, PREFIX).await;
    let _held = holder.lock("k", Duration::from_secs(30)).await.unwrap();
    let op_timeout = Duration::from_millis(1000);
    let client = build(
        LockClient::builder()
            .url(proxy.url())
            .key_prefix(PREFIX)
            .operation_timeout(op_timeout),
        &server,
    )
    .await;
    client.ping().await.unwrap();
    // Each round trip takes about 900 ms: the last attempt, and then the
    // check of the key's type, would each take most of a timeout.
    proxy.set_mode(ProxyMode::Delay(Duration::from_millis(450)));
    let wait = Duration::from_millis(100);
    let started = Instant::now();
    let err = client
        .lock_with("k", LockOptions::new(Duration::from_secs(5)).wait(wait))
        .await
        .unwrap_err();
    let took = started.elapsed();
    assert!(
        matches!(err.kind(), ErrorKind::Contended | ErrorKind::Unavailable),
        "{err}"
    );
    assert!(
        took < wait + op_timeout + Duration::from_millis(250),
        "took {took:?}, more than the wait {wait:?} plus one timeout {op_timeout:?}"
    );
}

#[tokio::test]
async fn a_frozen_redlock_server_costs_a_contended_wait_at_most_its_node_timeout() {
    let servers = start_servers(3);
    let node_timeout = Duration::from_millis(100);
    let settings = || {
        LockClient::builder()
            .key_prefix(PREFIX)
            .operation_timeout(Duration::from_secs(2))
            .node_timeout(node_timeout)
    };
    // The holder's calls get a bound a loaded machine cannot miss: what is
    // measured here is the waiter's, and the test needs the lease on all
    // three servers before one freezes. With 100 ms, a holder's first call
    // (which connects) can time out on one server and win on the other
    // two; freezing one of those leaves the lease on one live server, and
    // the release rightly finds it no longer held on a majority.
    let holder = client_with(&servers, settings().node_timeout(Duration::from_secs(2))).await;
    let waiter = client_with(&servers, settings()).await;
    holder.ping().await.unwrap();
    waiter.ping().await.unwrap();
    let ttl = Duration::from_secs(10);
    let held = holder.lock("k", ttl).await.unwrap();
    let key = storage_key(PREFIX, "k");
    eventually(
        Duration::from_secs(5),
        "the lease is on every server",
        || {
            servers
                .iter()
                .all(|s| s.cmd::<Option<String>>(&["GET", &key]).is_some())
        },
    )
    .await;
    let _frozen = servers[2].pause();
    let margin = Duration::from_millis(300);

    let started = Instant::now();
    assert!(waiter.try_lock("k", ttl).await.unwrap().is_none());
    let took = started.elapsed();
    assert!(took < node_timeout + margin, "try_lock took {took:?}");

    let wait = Duration::from_millis(300);
    let started = Instant::now();
    let err = waiter
        .lock_with("k", LockOptions::new(ttl).wait(wait))
        .await
        .unwrap_err();
    let took = started.elapsed();
    assert_eq!(err.kind(), ErrorKind::Contended, "{err}");
    assert!(
        took < wait + node_timeout + margin,
        "lock_with took {took:?}"
    );

    // A waiter hears the release from the servers that answer.
    let waiting = tokio::spawn(async move {
        let started = Instant::now();
        let guard = waiter
            .lock_with("k", LockOptions::new(ttl).wait(Duration::from_secs(20)))
            .await
            .unwrap();
        (guard, started.elapsed())
    });
    // The waiter listens for the release once it found the key held.
    eventually(Duration::from_secs(5), "the waiter subscribes", || {
        subscribers(&servers[0], &key) > 0
    })
    .await;
    let released = Instant::now();
    assert!(held.release().await.unwrap());
    let (guard, _) = waiting.await.unwrap();
    let heard = released.elapsed();
    assert!(
        heard < node_timeout + margin + Duration::from_millis(200),
        "the waiter got the lock {heard:?} after the release"
    );
    drop(guard);
}

/// The tokens of the acquisition attempts on `key` that `server` runs
/// while `during` runs, seen through `MONITOR`.
async fn tokens_sent<F: Future>(server: &RedisServer, key: &str, during: F) -> Vec<String> {
    const MARKER: &str = "end-of-tokens-sent";
    let mut conn = redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    conn.send_packed_command(&redis::cmd("MONITOR").get_packed_command())
        .unwrap();
    let _ok: redis::Value = conn.recv_response().unwrap();
    let quoted = format!("\"{key}\"");
    let watcher = std::thread::spawn(move || {
        let mut tokens = Vec::new();
        let (mut last, mut reloaded): (Option<String>, bool) = (None, false);
        // Until the marker the test sends last: every command sent before
        // it is in the stream by then.
        loop {
            let Ok(redis::Value::SimpleString(line)) = conn.recv_response() else {
                panic!("MONITOR stopped before the marker");
            };
            if line.contains(MARKER) {
                return tokens;
            }
            // An attempt is the first `SET NX`, or a script call (a retry
            // reads the key first and sets nothing while it is held) whose
            // arguments carry the attempt's value: its token, then `|`.
            let words: Vec<&str> = line.split_whitespace().skip(3).collect();
            if words.first() == Some(&"\"SCRIPT\"") {
                reloaded = true;
            }
            let sent = matches!(
                words.first(),
                Some(&"\"SET\"" | &"\"EVALSHA\"" | &"\"EVAL\"")
            );
            if sent && words.contains(&quoted.as_str()) {
                let token = words.iter().map(|w| w.trim_matches('"')).find(|w| {
                    w.len() > 32
                        && w.as_bytes()[32] == b'|'
                        && w[..32].bytes().all(|b| b.is_ascii_hexdigit())
                });
                // The same value again right after a `SCRIPT LOAD` is that
                // call sent again after `NOSCRIPT`: one attempt.
                let resent = reloaded && token.is_some_and(|t| last.as_deref() == Some(&t[..32]));
                reloaded = false;
                last = token.map(|t| t[..32].to_owned());
                if let (Some(token), false) = (token, resent) {
                    tokens.push(token[..32].to_owned());
                }
            }
        }
    });
    during.await;
    let _: String = server.cmd(&["ECHO", MARKER]);
    watcher.join().unwrap()
}

#[tokio::test]
async fn every_attempt_sends_a_token_of_its_own() {
    let server = RedisServer::start();
    let holder = client_for(&server, PREFIX).await;
    let waiter = client_for(&server, PREFIX).await;
    waiter.ping().await.unwrap();
    let _held = holder.lock("k", Duration::from_secs(30)).await.unwrap();
    let wait = LockOptions::new(Duration::from_secs(30)).wait(Duration::from_millis(300));
    let tokens = tokens_sent(&server, &storage_key(PREFIX, "k"), async {
        let err = waiter.lock_with("k", wait).await.unwrap_err();
        assert!(err.is_contended(), "{err}");
    })
    .await;
    assert!(tokens.len() >= 2, "several attempts were made: {tokens:?}");
    let distinct: std::collections::HashSet<&String> = tokens.iter().collect();
    assert_eq!(
        distinct.len(),
        tokens.len(),
        "a token was sent twice: {tokens:?}"
    );
}

#[tokio::test]
async fn a_frozen_redlock_server_does_not_slow_many_cycles_down() {
    let servers = start_servers(3);
    // Long enough that the calls to the frozen server pile up in the
    // background faster than they time out.
    let node_timeout = Duration::from_millis(500);
    let settings = LockClient::builder()
        .key_prefix(PREFIX)
        .node_timeout(node_timeout);
    let client = client_with(&servers, settings).await;
    client.ping().await.unwrap();
    let _frozen = servers[2].pause();
    let started = Instant::now();
    for i in 0..400 {
        let cycle = Instant::now();
        let guard = client
            .lock(&format!("k{i}"), Duration::from_secs(10))
            .await
            .unwrap();
        assert!(guard.release().await.unwrap());
        let took = cycle.elapsed();
        assert!(
            took < node_timeout,
            "cycle {i} waited for the frozen server: {took:?}"
        );
    }
    println!("400 cycles with one server frozen: {:?}", started.elapsed());
}
