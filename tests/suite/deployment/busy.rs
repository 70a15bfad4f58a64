//! See `deployment/mod.rs`. The machine is busy: the heartbeat's renewals
//! get through at a fraction of their usual speed while acquisitions run
//! as fast as ever, as when a loaded CPU starves the heartbeat's thread.
//! Here the load is made reproducible and small: the heartbeat's own
//! connection (opened at its first round) passes a link that carries so
//! many bytes a second, so that it renews some hundreds of leases a second
//! instead of some hundreds of thousands.

use crate::support::{build, storage_key};
use futures::StreamExt;
use lock_core::{ErrorKind, LockClient, LockOptions};
use lock_testkit::RedisServer;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const PREFIX: &str = "busy:";

/// What the slow link carries, client to server: about 800 renewals a
/// second of the leases below (some 150 bytes each on the wire).
const BYTES_PER_SECOND: f64 = 120_000.0;

/// A link in front of `upstream`: connections accepted once `slow` is set
/// send at [`BYTES_PER_SECOND`] between them all; earlier ones as fast as
/// they can. Runs on a thread of its own for the rest of the test binary.
fn slow_link(upstream: SocketAddr, slow: Arc<AtomicBool>) -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let listener = TcpListener::from_std(listener).unwrap();
            // When the shared link is free again.
            let free_at = Arc::new(Mutex::new(tokio::time::Instant::now()));
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(upstream).await else {
                    continue;
                };
                let throttled = slow.load(Ordering::SeqCst).then(|| free_at.clone());
                tokio::spawn(relay(client, server, throttled));
            }
        });
    });
    addr
}

async fn relay(
    client: TcpStream,
    server: TcpStream,
    link: Option<Arc<Mutex<tokio::time::Instant>>>,
) {
    let _ = (client.set_nodelay(true), server.set_nodelay(true));
    let (mut from_client, mut to_client) = client.into_split();
    let (mut from_server, mut to_server) = server.into_split();
    let up = async move {
        let mut buf = vec![0; 4096];
        loop {
            let n = match from_client.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if let Some(link) = &link {
                let sent_at = {
                    let mut free_at = link.lock().unwrap();
                    let start = (*free_at).max(tokio::time::Instant::now());
                    *free_at = start + Duration::from_secs_f64(n as f64 / BYTES_PER_SECOND);
                    *free_at
                };
                tokio::time::sleep_until(sent_at).await;
            }
            if to_server.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    let down = async move {
        let _ = tokio::io::copy(&mut from_server, &mut to_client).await;
    };
    tokio::select! {
        () = up => {}
        () = down => {}
    }
}

/// W5 with waiting acquisitions on a loaded machine: far more locks asked
/// than the starved heartbeat renews, each waiting up to `WAIT`. The
/// documented outcome: no lease lost; the acquisitions past the capacity
/// wait and then fail `AtCapacity` within their wait, having sent nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn w5_with_waiting_acquisitions_on_a_loaded_machine() {
    const ASKED: usize = 2000;
    const TTL: Duration = Duration::from_secs(3);
    const WAIT: Duration = Duration::from_secs(3);
    let server = RedisServer::start();
    let slow = Arc::new(AtomicBool::new(false));
    let link = slow_link(
        format!("127.0.0.1:{}", server.port()).parse().unwrap(),
        slow.clone(),
    );
    let client = build(
        LockClient::builder()
            .url(format!("redis://{link}"))
            .key_prefix(PREFIX),
        &server,
    )
    .await;
    // The client's own connection is open (and fast); the heartbeat's,
    // opened at its first round, will be slow.
    let warm = client.lock("warm", TTL).await.unwrap();
    assert!(warm.release().await.unwrap());
    slow.store(true, Ordering::SeqCst);

    let name = |i: usize| format!("w5:{i:0>80}");
    let results: Vec<_> = futures::stream::iter(0..ASKED)
        .map(|i| {
            let client = client.clone();
            async move {
                let options = LockOptions::new(TTL).wait(WAIT);
                (i, client.lock_with(&name(i), options).await)
            }
        })
        .buffer_unordered(500)
        .collect()
        .await;
    let mut held = Vec::new();
    let mut refused = 0;
    for (i, result) in results {
        match result {
            Ok(guard) => held.push(guard),
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::AtCapacity, "lock {i}: {e}");
                let waited = e.waited().unwrap();
                assert!(
                    waited >= WAIT && waited < WAIT + Duration::from_secs(1),
                    "lock {i} waited {waited:?} for a wait of {WAIT:?}"
                );
                let key = storage_key(PREFIX, &name(i));
                assert!(!server.cmd::<bool>(&["EXISTS", &key]), "{key} was taken");
                refused += 1;
            }
        }
    }
    assert!(
        refused > 0,
        "all {ASKED} taken: the heartbeat was not past its capacity"
    );
    // Two ttls: every held lease lived through renewals on the slow link.
    tokio::time::sleep(TTL * 2).await;
    let lost = held.iter().filter(|g| g.is_lost()).count();
    eprintln!(
        "asked {ASKED}, granted {}, refused {refused}, lost {lost}; capacity {:?}",
        held.len(),
        client.renewal_capacity()
    );
    assert_eq!(lost, 0, "{lost} of {} held leases were lost", held.len());
    for guard in &held {
        let key = storage_key(PREFIX, guard.key());
        let left: i64 = server.cmd(&["PTTL", &key]);
        assert!(left > 0, "{key} is gone from Redis ({left})");
    }
    drop(held);
}
