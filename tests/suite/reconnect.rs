//! Reconnecting after a lost connection over a slow link: connecting (with
//! a login) must not be cut short by each call's own, shorter bound.

use crate::support::{build, eventually_async};
use lock_core::{ErrorKind, LockClient, LockClientBuilder, LockOptions};
use lock_testkit::{Proxy, ProxyMode, RedisServer};
use std::cell::Cell;
use std::time::Duration;
use tokio::time::Instant;

const PREFIX: &str = "reconnect:";
const PASSWORD: &str = "reconnect-secret";

/// A server that requires [`PASSWORD`], behind a proxy in `mode`.
fn server_behind_proxy(mode: ProxyMode) -> (RedisServer, Proxy) {
    let server = RedisServer::builder().password(PASSWORD).start();
    let proxy = Proxy::start(server.addr());
    proxy.set_mode(mode);
    (server, proxy)
}

/// The URL of `proxy`, with the server's password.
fn url(proxy: &Proxy) -> String {
    format!("redis://:{PASSWORD}@127.0.0.1:{}", proxy.port())
}

/// The clients of this file: each call bounded by `op_timeout`, connecting
/// (with its login) by a longer bound of its own.
fn settings(op_timeout: Duration) -> LockClientBuilder {
    LockClient::builder()
        .key_prefix(PREFIX)
        .operation_timeout(op_timeout)
        .connect_timeout(Duration::from_secs(2))
}

#[tokio::test]
async fn a_slow_link_with_a_login_reconnects_after_a_cut() {
    // A round trip of 220 ms: connecting and logging in take 220 of the
    // 400 ms a call may take, and a ping on top of that does not fit. A
    // ping alone has 180 ms to spare, for a loaded machine.
    let (server, proxy) = server_behind_proxy(ProxyMode::Delay(Duration::from_millis(110)));
    let client = build(
        settings(Duration::from_millis(400)).url(url(&proxy)),
        &server,
    )
    .await;
    client.ping().await.unwrap();

    proxy.cut();
    let mut answered = Vec::new();
    for _ in 0..10 {
        answered.push(client.ping().await.is_ok());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The first one or two fail while the connection opens in the
    // background; a third on a loaded machine (seen once in CI, with a
    // round trip of 120 ms against a 200 ms bound). Then every ping is
    // answered: the connection is back for good.
    let failed_first = answered.iter().take_while(|ok| !**ok).count();
    assert!(
        failed_first <= 3 && answered[failed_first..].iter().all(|ok| *ok),
        "pings after the cut (true: answered): {answered:?}"
    );
}

#[tokio::test]
async fn a_call_keeps_its_bound_while_connecting_hangs_and_recovers_after() {
    let (server, proxy) = server_behind_proxy(ProxyMode::Pass);
    let op_timeout = Duration::from_millis(200);
    let client = build(settings(op_timeout).url(url(&proxy)), &server).await;
    client.ping().await.unwrap();

    // Connections are accepted but nothing gets through: the login of every
    // new connection hangs.
    proxy.set_mode(ProxyMode::Blackhole);
    proxy.cut();
    let bound = op_timeout + Duration::from_millis(250);
    for i in 0..5 {
        let started = Instant::now();
        let err = client.ping().await.unwrap_err();
        let took = started.elapsed();
        assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
        // The first call may instead find the cut connection closed.
        assert!(i == 0 || err.is_timeout(), "ping {i}: {err}");
        assert!(took < bound, "ping {i} took {took:?}: {err}");
    }

    proxy.set_mode(ProxyMode::Pass);
    eventually_async(
        Duration::from_secs(5),
        "a ping answered after healing",
        || async { client.ping().await.is_ok() },
    )
    .await;
}

/// A lock and release of a key not used before.
async fn cycle(client: &LockClient, round: &Cell<u32>) -> bool {
    round.set(round.get() + 1);
    let key = format!("k{}", round.get());
    let options = LockOptions::new(Duration::from_secs(10)).wait(Duration::from_millis(500));
    match client.lock_with(&key, options).await {
        Ok(guard) => guard.release().await.unwrap_or(false),
        Err(_) => false,
    }
}

#[tokio::test]
async fn redlock_reconnects_over_slow_links_within_its_node_timeout() {
    // A round trip of 80 ms against 140 ms per server: a call fits, but
    // not connecting and logging in before it.
    let delay = ProxyMode::Delay(Duration::from_millis(40));
    let (servers, proxies): (Vec<RedisServer>, Vec<Proxy>) =
        (0..3).map(|_| server_behind_proxy(delay)).unzip();
    let client = build(
        settings(Duration::from_millis(500))
            .urls(proxies.iter().map(url))
            .node_timeout(Duration::from_millis(140)),
        &servers,
    )
    .await;
    let round = Cell::new(0);
    // The first release on each server also loads the release script.
    eventually_async(Duration::from_secs(5), "a first lock and release", || {
        cycle(&client, &round)
    })
    .await;

    for proxy in &proxies {
        proxy.cut();
    }
    eventually_async(
        Duration::from_secs(5),
        "a lock and release after the cut",
        || cycle(&client, &round),
    )
    .await;
    for _ in 0..5 {
        assert!(cycle(&client, &round).await, "round {}", round.get());
    }
}
