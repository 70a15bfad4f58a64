//! Redlock over independent `redis-server` processes, some of them stopped.

use crate::support::{client_with, eventually, storage_key};
use lock_core::{ErrorKind, LockClient, LockClientBuilder, LockOptions};
use lock_testkit::{RedisServer, start_servers};
use rand::RngExt;
use std::time::Duration;
use tokio::time::Instant;

const PREFIX: &str = "rl:";

/// The clients of this file: each server's answer bounded by
/// `node_timeout`.
fn settings(node_timeout: Duration) -> LockClientBuilder {
    LockClient::builder()
        .key_prefix(PREFIX)
        .node_timeout(node_timeout)
        .operation_timeout(Duration::from_millis(500))
}

/// The token of a lock value, `<token>|<acquired ms>|<fence>|<holder>`:
/// what is the same on every server (each dates the acquisition by the
/// client's estimate of its clock, and a late server's fence is its own).
fn token_in(value: &str) -> &str {
    value.split('|').next().unwrap_or(value)
}

/// How many servers hold `key` with a value of `token`.
fn holders(servers: &[RedisServer], key: &str, token: &str) -> usize {
    servers
        .iter()
        .filter(|s| s.is_running())
        .filter(|s| {
            s.cmd::<Option<String>>(&["GET", &storage_key(PREFIX, key)])
                .as_deref()
                .map(token_in)
                == Some(token)
        })
        .count()
}

/// [`holders`] once it is `n`, or after 2 s. An acquisition or release
/// returns as soon as a majority has answered; the calls to the other
/// servers finish in the background a round trip or so later.
async fn settled_holders(servers: &[RedisServer], key: &str, token: &str, n: usize) -> usize {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let now = holders(servers, key, token);
        if now == n || Instant::now() >= deadline {
            return now;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The token held at `key` on the first running server that has one.
fn token_of(servers: &[RedisServer], key: &str) -> String {
    servers
        .iter()
        .filter(|s| s.is_running())
        .find_map(|s| s.cmd::<Option<String>>(&["GET", &storage_key(PREFIX, key)]))
        .map(|value| token_in(&value).to_owned())
        .expect("no server holds the key")
}

#[tokio::test]
async fn two_urls_are_refused_at_build() {
    let servers = start_servers(2);
    let err = LockClient::builder()
        .urls(servers.iter().map(RedisServer::url))
        .build()
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config);
    assert!(err.to_string().contains("at least 3"), "{err}");
}

#[tokio::test]
async fn a_lock_is_written_to_every_server_and_released_from_all() {
    let servers = start_servers(5);
    // Generous: on a loaded machine a call to the fourth or fifth server
    // could time out, and that server would then never hold the key.
    let client = client_with(&servers, settings(Duration::from_secs(2))).await;
    let guard = client.lock("k", Duration::from_secs(5)).await.unwrap();
    let token = token_of(&servers, "k");
    // A majority when `lock` returns, and every server soon after.
    assert!(holders(&servers, "k", &token) >= 3);
    assert_eq!(settled_holders(&servers, "k", &token, 5).await, 5);
    assert!(
        client
            .try_lock("k", Duration::from_secs(5))
            .await
            .unwrap()
            .is_none()
    );
    assert!(guard.release().await.unwrap());
    assert!(holders(&servers, "k", &token) <= 2);
    assert_eq!(settled_holders(&servers, "k", &token, 0).await, 0);
}

#[tokio::test]
async fn extend_to_a_shorter_ttl_shortens_the_lease_on_every_server() {
    let servers = start_servers(3);
    let client = client_with(&servers, settings(Duration::from_millis(200))).await;
    let guard = client
        .lock_with("k", LockOptions::new(Duration::from_secs(3)).renew(false))
        .await
        .unwrap();
    guard.extend(Duration::from_millis(300)).await.unwrap();
    let shortened = |server: &RedisServer| {
        let pttl: i64 = server.cmd(&["PTTL", &storage_key(PREFIX, "k")]);
        // -2: already expired.
        pttl == -2 || (1..=300).contains(&pttl)
    };
    // A majority answered before `extend` returned; the rest follow.
    assert!(servers.iter().filter(|s| shortened(s)).count() >= 2);
    eventually(Duration::from_secs(2), "every server shortened", || {
        servers.iter().all(shortened)
    })
    .await;
    assert_eq!(guard.ttl(), Duration::from_millis(300));
}

// Two worker threads: the heartbeat renews while the test blocks on its own
// connections to the servers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_two_of_five_stopped_locks_are_granted_renewed_and_released() {
    let mut servers = start_servers(5);
    servers[0].stop();
    servers[3].stop();
    let client = client_with(&servers, settings(Duration::from_millis(200))).await;
    let ttl = Duration::from_millis(600);
    let guard = client.lock("k", ttl).await.unwrap();
    let token = token_of(&servers, "k");
    assert_eq!(holders(&servers, "k", &token), 3);
    // Held across several ttls: renewal reaches the three live servers.
    let until = Instant::now() + ttl * 4;
    while Instant::now() < until {
        assert!(!guard.is_lost(), "lost with a majority up");
        assert_eq!(holders(&servers, "k", &token), 3, "lease expired somewhere");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A second owner is refused while it is held.
    let other = client
        .lock_with("k", LockOptions::new(ttl).wait(Duration::ZERO))
        .await
        .unwrap_err();
    assert_eq!(other.kind(), ErrorKind::Contended, "{other}");
    assert!(guard.release().await.unwrap());
    assert_eq!(holders(&servers, "k", &token), 0);
    let again = client.try_lock("k", ttl).await.unwrap();
    assert!(again.is_some(), "free again after release");
}

#[tokio::test]
async fn with_three_of_five_stopped_lock_is_unavailable_not_contended() {
    let mut servers = start_servers(5);
    let stopped: Vec<String> = [1, 2, 4]
        .iter()
        .map(|&i| {
            servers[i].stop();
            format!("127.0.0.1:{}", servers[i].port())
        })
        .collect();
    // Building needs a majority too.
    let err = LockClient::builder()
        .urls(servers.iter().map(RedisServer::url))
        .build()
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");

    // A client built while they were up, then three of them go down.
    for i in [1, 2, 4] {
        servers[i].restart();
    }
    let node_timeout = Duration::from_millis(200);
    let client = client_with(&servers, settings(node_timeout)).await;
    for i in [1, 2, 4] {
        servers[i].stop();
    }
    let wait = Duration::from_millis(500);
    let started = Instant::now();
    let err = client
        .lock_with("k", LockOptions::new(Duration::from_secs(5)).wait(wait))
        .await
        .unwrap_err();
    let took = started.elapsed();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(
        took <= wait + node_timeout + Duration::from_millis(150),
        "took {took:?}"
    );
    let failed: Vec<&str> = err.node_errors().iter().map(|n| n.addr()).collect();
    assert_eq!(failed.len(), 3, "{err}");
    for addr in &stopped {
        assert!(failed.contains(&addr.as_str()), "{addr} missing from {err}");
    }
    let tally = err.quorum_failure().unwrap();
    assert_eq!((tally.granted(), tally.needed()), (2, 3));
    // Nothing is left behind on the two live servers (the undo of a failed
    // attempt runs in the background).
    nothing_left(&servers, "k").await;
}

/// Waits until no running server holds `key`, failing after a bound.
async fn nothing_left(servers: &[RedisServer], key: &str) {
    let key = storage_key(PREFIX, key);
    eventually(
        Duration::from_secs(5),
        "a failed attempt left its key behind",
        || {
            !servers
                .iter()
                .filter(|s| s.is_running())
                .any(|s| s.cmd::<Option<String>>(&["GET", &key]).is_some())
        },
    )
    .await;
}

#[tokio::test]
async fn a_majority_held_elsewhere_is_contended() {
    let servers = start_servers(5);
    for server in &servers[..3] {
        let _: () = server.cmd(&[
            "SET",
            &storage_key(PREFIX, "k"),
            "other-owner",
            "PX",
            "60000",
        ]);
    }
    let client = client_with(&servers, settings(Duration::from_millis(200))).await;
    let err = client
        .lock_with(
            "k",
            LockOptions::new(Duration::from_secs(5)).wait(Duration::ZERO),
        )
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Contended, "{err}");
    // The two servers it did get are given back.
    nothing_left(&servers[3..], "k").await;
}

/// A server that stops answering does not slow locks down: `lock` and
/// `release` return once a majority has answered, instead of waiting out the
/// silent server's timeout each time.
#[tokio::test]
async fn a_frozen_server_does_not_slow_a_lock_cycle() {
    let servers = start_servers(5);
    let node_timeout = Duration::from_millis(500);
    let client = client_with(&servers, settings(node_timeout)).await;
    let other = client_with(&servers, settings(node_timeout)).await;
    let pause = servers[2].pause();
    for i in 0..5 {
        let started = Instant::now();
        let guard = client.lock("k", Duration::from_secs(5)).await.unwrap();
        assert!(guard.release().await.unwrap());
        let took = started.elapsed();
        // Waiting for the frozen server would take its timeout, twice.
        assert!(took < node_timeout, "cycle {i} took {took:?}");
        // Released on a majority: free for another client at once.
        let taken = other.try_lock("k", Duration::from_secs(5)).await.unwrap();
        assert!(taken.is_some(), "cycle {i}: not free after its release");
        assert!(taken.unwrap().release().await.unwrap());
    }
    drop(pause);
}

/// Where every server's answer is needed (a fenced lock), a frozen server
/// costs at most its per-server timeout.
#[tokio::test]
async fn a_frozen_server_costs_a_fenced_lock_at_most_its_node_timeout() {
    let servers = start_servers(5);
    let node_timeout = Duration::from_millis(150);
    let client = client_with(&servers, settings(node_timeout)).await;
    let _paused = servers[2].pause();
    for _ in 0..3 {
        let started = Instant::now();
        let options = LockOptions::new(Duration::from_secs(5)).fencing(true);
        let guard = client.lock_with("k", options).await.unwrap();
        assert!(guard.fencing_token().is_some());
        assert!(guard.release().await.unwrap());
        let took = started.elapsed();
        assert!(
            took < node_timeout * 2 + Duration::from_millis(200),
            "lock + release took {took:?}"
        );
    }
}

/// Redlock fencing: successive holders get strictly increasing tokens while
/// servers stop (keeping their data) and come back, and others pause.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_increase_across_holders_through_node_stops_and_restarts() {
    let mut servers = start_servers(5);
    let client = client_with(&servers, settings(Duration::from_millis(150))).await;
    let mut rng = rand::rng();
    let mut last: Option<u64> = None;
    let mut down: Vec<usize> = Vec::new();
    let mut granted = 0;
    const ROUNDS: usize = 100;
    for round in 0..ROUNDS {
        // Change the fleet: keep at most two servers down, and never lose
        // data (a stopped server is saved first and comes back with it).
        match rng.random_range(0..4) {
            0 if down.len() < 2 => {
                let i = rng.random_range(0..5);
                if !down.contains(&i) {
                    servers[i].save_and_stop();
                    down.push(i);
                }
            }
            1 if !down.is_empty() => {
                let i = down.swap_remove(rng.random_range(0..down.len()));
                servers[i].restart();
            }
            _ => {}
        }
        // A server that answers late: its grants may miss the window.
        let paused = (round % 7 == 3).then(|| (0..5).find(|i| !down.contains(i)).unwrap_or(0));
        let pause = paused.map(|i| servers[i].pause());
        // Some holders let the lease run out instead of releasing it.
        let let_expire = rng.random_range(0..4) == 0;
        let opts = LockOptions::new(Duration::from_millis(if let_expire { 200 } else { 800 }))
            .wait(Duration::from_secs(3))
            .renew(!let_expire)
            .fencing(true);
        match client.lock_with("fenced", opts).await {
            Ok(guard) => {
                let token = guard.fencing_token().expect("fencing asked for");
                if let Some(previous) = last {
                    assert!(
                        token > previous,
                        "round {round}: token {token} after {previous} (down {down:?})"
                    );
                }
                last = Some(token);
                granted += 1;
                if let_expire {
                    drop(pause);
                    guard.lost().await;
                    continue;
                }
                guard.release().await.unwrap_or_default();
            }
            Err(e) => assert_eq!(e.kind(), ErrorKind::Unavailable, "round {round}: {e}"),
        }
        drop(pause);
    }
    assert!(
        granted > ROUNDS * 2 / 3,
        "only {granted} of {ROUNDS} acquisitions succeeded"
    );
}

#[tokio::test]
async fn fence_counters_expire_on_every_server_and_tokens_grow_after_they_are_gone() {
    let servers = start_servers(3);
    // Generous: this is not about timeouts, and a server whose call timed
    // out on a loaded machine would simply have no counter.
    let client = client_with(&servers, settings(Duration::from_secs(2))).await;
    let fence_key = format!("{}:fence", storage_key(PREFIX, "k"));
    let fenced = LockOptions::new(Duration::from_secs(5)).fencing(true);
    let mut last = 0;
    for holder in 0..6 {
        if holder % 2 == 1 {
            // As after the counters' retention: gone everywhere.
            for server in &servers {
                let _: () = server.cmd(&["DEL", &fence_key]);
            }
        }
        let guard = client.lock_with("k", fenced.clone()).await.unwrap();
        let token = guard.fencing_token().unwrap();
        assert!(token > last, "holder {holder}: {token} after {last}");
        last = token;
        assert!(guard.release().await.unwrap());
    }
    // Each counter was given (or lifted with) an expiry of about a day. The
    // last acquisition needed only a majority: a server whose call was still
    // running may get its counter a moment later, or (its call failed) none,
    // but never one without an expiry.
    eventually(
        Duration::from_secs(5),
        "a majority of counters, each with an expiry",
        || {
            let pttls: Vec<i64> = servers
                .iter()
                .map(|server| server.cmd(&["PTTL", &fence_key]))
                .collect();
            let day_or_so = |pttl: i64| pttl > 23 * 60 * 60 * 1000;
            pttls.iter().all(|&pttl| pttl == -2 || day_or_so(pttl))
                && pttls.iter().filter(|&&pttl| day_or_so(pttl)).count() >= 2
        },
    )
    .await;
}

/// With a minority frozen, clients contending for one key keep getting it:
/// the servers that answer may split their grants between the clients
/// (none with a majority), and every such attempt waits out the frozen
/// servers' timeout. Its undo must not wake the others all at once, or they
/// split again the same way; their jittered backoff desynchronises them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_frozen_minority_contending_clients_keep_getting_the_lock() {
    let servers = start_servers(5);
    // Long: every split vote that waited out the frozen servers would cost
    // this much, and the cycles below would not fit in their bound.
    let node_timeout = Duration::from_millis(1000);
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(client_with(&servers, settings(node_timeout)).await);
    }
    let _frozen = [servers[3].pause(), servers[4].pause()];
    let started = Instant::now();
    let tasks: Vec<_> = clients
        .into_iter()
        .map(|client| {
            tokio::spawn(async move {
                let options = LockOptions::new(Duration::from_secs(2)).wait(Duration::from_secs(3));
                for _ in 0..8 {
                    let guard = client.lock_with("hot", options.clone()).await?;
                    guard.release().await?;
                }
                Ok::<(), lock_core::LockError>(())
            })
        })
        .collect();
    for task in tasks {
        task.await
            .unwrap()
            .unwrap_or_else(|e| panic!("after {:?}: {e}", started.elapsed()));
    }
    let took = started.elapsed();
    assert!(took < Duration::from_secs(3), "24 cycles took {took:?}");
}
