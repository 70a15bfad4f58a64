//! Lock loss and bounded waits under injected faults: paused servers,
//! black-holed and cut connections, restarts, leaks, bad input.

use crate::support::{build, client_with, eventually, storage_key};
use lock_core::{ErrorKind, LockClient, LockClientBuilder, LockOptions};
use lock_testkit::{Proxy, ProxyMode, RedisServer};
use std::io::Write;
use std::time::Duration;
use tokio::time::Instant;

const PREFIX: &str = "fault:";

/// The clients of this file: every call, connecting included, bounded by
/// `op_timeout`.
fn settings(op_timeout: Duration) -> LockClientBuilder {
    LockClient::builder()
        .key_prefix(PREFIX)
        .operation_timeout(op_timeout)
        .connect_timeout(op_timeout)
}

#[tokio::test]
async fn a_server_paused_longer_than_the_ttl_makes_the_guard_lost_in_time() {
    let server = RedisServer::start();
    let client = client_with(&server, settings(Duration::from_millis(500))).await;
    let ttl = Duration::from_millis(600);
    let acquired = Instant::now();
    let guard = client.lock("k", ttl).await.unwrap();
    let pause = server.pause();
    tokio::time::timeout(ttl * 3, guard.lost())
        .await
        .expect("loss not reported while the server was frozen");
    let lost_after = acquired.elapsed();
    drop(pause);
    // Lost no later than its validity deadline plus one renewal interval.
    assert!(
        lost_after <= ttl + ttl / 3,
        "lost only after {lost_after:?} (ttl {ttl:?})"
    );
    assert!(guard.is_lost());
}

/// An attempt cut short by a server paused longer than the operation
/// timeout: its `SET` waits in the server's socket and is applied when the
/// server resumes, after the attempt gave up. The release sent for it in
/// the background is sent again until Redis answers, so the key does not
/// stay held by nobody for its whole ttl.
#[tokio::test]
async fn an_attempt_applied_after_a_long_pause_is_released_once_the_server_answers() {
    let server = RedisServer::start();
    let client = client_with(&server, settings(Duration::from_millis(300))).await;
    let key = storage_key(PREFIX, "late");
    let ttl = Duration::from_secs(20);
    let err = {
        let _pause = server.pause();
        let err = client.try_lock("late", ttl).await.unwrap_err();
        // The background release times out too while the server sleeps.
        tokio::time::sleep(Duration::from_millis(700)).await;
        err
    };
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    let resumed = Instant::now();
    eventually(Duration::from_secs(5), "the late SET released", || {
        !server.cmd::<bool>(&["EXISTS", &key])
    })
    .await;
    assert!(resumed.elapsed() < ttl / 4);
    let again = client.try_lock("late", ttl).await.unwrap();
    assert!(again.is_some(), "the key is not free after the pause");
}

#[tokio::test]
async fn a_black_holed_connection_bounds_lock_extend_and_release() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.addr());
    let op_timeout = Duration::from_millis(300);
    let client = build(settings(op_timeout).url(proxy.url()), &server).await;
    let guard = client.lock("held", Duration::from_secs(10)).await.unwrap();
    proxy.set_mode(ProxyMode::Blackhole);
    let bound = op_timeout + Duration::from_millis(250);

    let started = Instant::now();
    let err = guard.extend(Duration::from_secs(10)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(err.is_timeout(), "{err}");
    assert!(
        started.elapsed() < bound,
        "extend took {:?}",
        started.elapsed()
    );

    let wait = Duration::from_millis(200);
    let started = Instant::now();
    let err = client
        .lock_with(
            "other",
            LockOptions::new(Duration::from_secs(10)).wait(wait),
        )
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(
        started.elapsed() < wait + bound,
        "lock took {:?}",
        started.elapsed()
    );

    let started = Instant::now();
    let err = guard.release().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(
        started.elapsed() < bound,
        "release took {:?}",
        started.elapsed()
    );

    // Healed: the same client works again without being rebuilt.
    proxy.set_mode(ProxyMode::Pass);
    let opts = LockOptions::new(Duration::from_secs(10)).wait(Duration::from_secs(3));
    let guard = client.lock_with("third", opts).await.unwrap();
    assert!(guard.release().await.unwrap());
}

#[tokio::test]
async fn a_cut_connection_mid_hold_reconnects_and_never_stays_held_silently() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.addr());
    let client = build(
        settings(Duration::from_millis(500)).url(proxy.url()),
        &server,
    )
    .await;
    let ttl = Duration::from_millis(900);
    let guard = client.lock("k", ttl).await.unwrap();
    let token: String = server.cmd(&["GET", &storage_key(PREFIX, "k")]);
    proxy.cut();
    // Over two ttls, at every look: the guard is either reported lost, or
    // the key really is still ours on the server.
    let until = Instant::now() + ttl * 2;
    while Instant::now() < until {
        if !guard.is_lost() {
            let value: Option<String> = server.cmd(&["GET", &storage_key(PREFIX, "k")]);
            assert_eq!(value.as_deref(), Some(token.as_str()), "held but not ours");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        !guard.is_lost(),
        "renewal did not reconnect after the cut; it must renew, the server is fine"
    );
    let opts = LockOptions::new(ttl).wait(Duration::from_secs(2));
    let other = client.lock_with("other", opts).await.unwrap();
    assert!(other.release().await.unwrap());
    assert!(guard.release().await.unwrap());
}

#[tokio::test]
async fn redis_restarted_empty_under_a_held_lock_makes_it_lost() {
    let mut server = RedisServer::start();
    let client = client_with(&server, settings(Duration::from_millis(500))).await;
    let ttl = Duration::from_millis(1500);
    let acquired = Instant::now();
    let guard = client.lock("k", ttl).await.unwrap();
    server.restart_empty();
    tokio::time::timeout(ttl * 2, guard.lost())
        .await
        .expect("loss not detected after an empty restart");
    // The renewal (every 500 ms) answered "not ours": well before the
    // validity deadline would have fired.
    let lost_after = acquired.elapsed();
    assert!(lost_after < ttl - ttl / 5, "lost only after {lost_after:?}");
}

fn client_connections(server: &RedisServer) -> usize {
    // Includes the connection `cmd` itself opens, so counts compare.
    server.cmd::<String>(&["CLIENT", "LIST"]).lines().count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_heartbeat_or_connection_leaks_after_cycles_and_faults() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.addr());
    let client = build(
        settings(Duration::from_millis(500)).url(proxy.url()),
        &server,
    )
    .await;
    let baseline = client_connections(&server);
    for round in 0..200 {
        let key = format!("k{}", round % 7);
        let guard = client.lock(&key, Duration::from_secs(5)).await.unwrap();
        match round % 3 {
            0 => drop(guard),
            _ => {
                guard.release().await.ok();
            }
        }
        if round % 50 == 25 {
            proxy.cut();
        }
    }
    eventually(Duration::from_secs(5), "all heartbeats end", || {
        client.heartbeats_running() == 0
    })
    .await;
    let deadline = Instant::now() + Duration::from_secs(5);
    while client_connections(&server) > baseline {
        assert!(
            Instant::now() < deadline,
            "connections not back to {baseline} within 5 s:\n{}",
            server.cmd::<String>(&["CLIENT", "LIST"])
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        proxy.connection_count() <= 1,
        "{}",
        proxy.connection_count()
    );
}

#[tokio::test]
async fn a_key_of_another_type_is_a_clear_error() {
    let server = RedisServer::start();
    let client = client_with(&server, settings(Duration::from_millis(500))).await;
    let _: () = server.cmd(&["RPUSH", &storage_key(PREFIX, "jobs"), "x"]);
    let err = client
        .lock_with(
            "jobs",
            LockOptions::new(Duration::from_secs(5)).wait(Duration::from_millis(100)),
        )
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Server, "{err}");
    assert!(err.to_string().contains("list"), "{err}");

    // A lock whose key is replaced by something else is not ours any more:
    // released as such, and the other program's key is left alone.
    let guard = client.lock("k", Duration::from_secs(5)).await.unwrap();
    let _: () = server.cmd(&["DEL", &storage_key(PREFIX, "k")]);
    let _: () = server.cmd(&["RPUSH", &storage_key(PREFIX, "k"), "x"]);
    assert!(!guard.release().await.unwrap(), "released a key not ours");
    let kind: String = server.cmd(&["TYPE", &storage_key(PREFIX, "k")]);
    assert_eq!(kind, "list");
}

/// A listener that is not Redis: answers one line of HTTP, or nothing.
fn not_redis(answer: Option<&'static [u8]>) -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming().take(8) {
            let Ok(mut stream) = stream else { break };
            match answer {
                Some(bytes) => {
                    let _ = stream.write_all(bytes);
                }
                None => held.push(stream),
            }
        }
    });
    port
}

#[tokio::test]
async fn a_url_to_a_non_redis_port_fails_clearly_without_hanging() {
    let port = not_redis(Some(
        b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\n\r\n",
    ));
    let started = Instant::now();
    let err = LockClient::builder()
        .url(format!("redis://127.0.0.1:{port}"))
        .connect_timeout(Duration::from_millis(500))
        .operation_timeout(Duration::from_millis(500))
        .build()
        .await
        .unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(2));
    assert!(
        matches!(err.kind(), ErrorKind::Unavailable | ErrorKind::Server),
        "{err}"
    );
    assert!(err.to_string().contains(&port.to_string()), "{err}");

    let silent = not_redis(None);
    let started = Instant::now();
    let err = LockClient::builder()
        .url(format!("redis://127.0.0.1:{silent}"))
        .connect_timeout(Duration::from_millis(300))
        .operation_timeout(Duration::from_millis(300))
        .build()
        .await
        .unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
}

#[lock_core::distributed_lock(key = "paused-job", ttl = "600ms", client = client)]
async fn long_job(
    client: &LockClient,
    started: tokio::sync::oneshot::Sender<()>,
) -> Result<&'static str, lock_core::LockError> {
    let _ = started.send(());
    // Far longer than the pause: only loss of the lock ends it early.
    tokio::time::sleep(Duration::from_secs(30)).await;
    Ok("finished")
}

#[tokio::test]
async fn an_attribute_body_is_aborted_when_its_server_pauses_past_the_ttl() {
    let server = RedisServer::start();
    let client = client_with(&server, settings(Duration::from_millis(500))).await;
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let job = tokio::spawn({
        let client = client.clone();
        async move {
            let began = Instant::now();
            (long_job(&client, started_tx).await, began.elapsed())
        }
    });
    started_rx.await.unwrap();
    let pause = server.pause();
    let (result, took) = tokio::time::timeout(Duration::from_secs(5), job)
        .await
        .expect("the body was not aborted")
        .unwrap();
    drop(pause);
    let err = result.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Lost, "{err}");
    // Validity (600 ms) plus one renewal interval, with room for a loaded machine.
    assert!(
        took < Duration::from_millis(600 + 200 + 300),
        "took {took:?}"
    );
}
