//! An HTTP service whose charge route runs under a distributed lock per
//! order, through lock-core's tower layer (feature `tower`).
//!
//! `POST /orders/{order_id}/charge` is wrapped in a `LockLayer` whose key
//! function reads the order from the path and locks `order:{order_id}`:
//! while one request (in this process or in any other replica using the
//! same Redis) charges order 42, a second request for order 42 waits up to
//! 2 s for the lock and then gets the layer's `409 Conflict`, without the
//! handler running. Redis unreachable, or the lock lost mid-charge (the
//! handler is then stopped), is `503 Service Unavailable`. Different
//! orders do not wait for each other.
//!
//! By default the example starts the service on a free loopback port, sends
//! it three requests at once (two for order 42, one for order 7), prints the
//! answers (one 200 and one 409 for order 42, a 200 for order 7), checks
//! that order 42's lock was let go of once its response was sent, and shuts
//! down gracefully; it exits non-zero when any of that does not hold. With
//! `--serve` it keeps serving until Ctrl-C.
//!
//! ```text
//! cargo run --example axum_service                   # starts a throwaway redis-server
//! cargo run --example axum_service -- --serve        # serves until Ctrl-C
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --example axum_service
//! ```

use axum::Router;
use axum::extract::Path;
use axum::http::request::Parts;
use axum::routing::post;
use lock_core::tower::LockLayer;
use lock_core::{LockClient, RunOptions};
use std::error::Error;
use std::future::IntoFuture;
use std::io;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

#[path = "support/redis.rs"]
mod redis_for_example;

/// How long the payment gateway takes: longer than the 2 s wait, so a
/// second request for the same order gives up while the first still runs.
const GATEWAY_TIME: Duration = Duration::from_secs(3);

/// `POST /orders/{order_id}/charge`. The layer holds `order:{order_id}`
/// while it runs: only one request at a time, across every replica,
/// charges a given order.
async fn charge(Path(order_id): Path<u64>) -> String {
    // The lock the layer runs the handler under.
    let key = lock_core::current_lock().map(|lock| lock.key().to_owned());
    // The work: a payment gateway call, say.
    tokio::time::sleep(GATEWAY_TIME).await;
    format!(
        "charged order {order_id} under {}\n",
        key.unwrap_or_default()
    )
}

/// The lock a request takes: `order:{order_id}` for the charge route.
/// (The layer sees the request before axum's extractors do, so it reads the
/// path itself; `None` would let a request through unlocked.)
fn order_key(request: &Parts) -> Option<String> {
    let rest = request.uri.path().strip_prefix("/orders/")?;
    let (order_id, _) = rest.split_once('/')?;
    Some(format!("order:{order_id}"))
}

/// The service: the charge route, each request under its order's lock,
/// waiting up to 2 s for it.
fn app(client: LockClient) -> Router {
    let options = RunOptions::new()
        .ttl(Duration::from_secs(30))
        .wait(Duration::from_secs(2));
    let locked = LockLayer::new(client, order_key).options(options);
    Router::new()
        .route("/orders/{order_id}/charge", post(charge))
        .route_layer(locked)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let serve = match std::env::args().nth(1).as_deref() {
        None => false,
        Some("--serve") => true,
        Some(other) => {
            return Err(format!("unknown argument {other:?}; the only one is --serve").into());
        }
    };

    let redis = redis_for_example::redis_url()?;
    let client = LockClient::builder()
        .url(redis.url())
        .key_prefix("axum-example:")
        .build()
        .await?;
    let app = app(client.clone());
    // Loopback only, on a port the OS picks.
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;

    if serve {
        println!("listening on http://{addr}; Ctrl-C stops it. Try, twice at once:");
        println!("  curl -i -X POST http://{addr}/orders/42/charge");
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                // An error here means no Ctrl-C handler could be installed;
                // stop rather than serve with no way to stop.
                let _ = tokio::signal::ctrl_c().await;
            })
            .await?;
        println!("shut down");
        return Ok(());
    }

    println!("serving on http://{addr}");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = stopped.await;
            })
            .into_future(),
    );

    let started = Instant::now();
    let (first, second, other) = tokio::join!(
        request(addr, "/orders/42/charge", started),
        request(addr, "/orders/42/charge", started),
        request(addr, "/orders/7/charge", started),
    );
    let mut order_42 = [first?, second?];
    order_42.sort_unstable();
    let other = other?;
    // The answers are in: the layer let go of order 42's lock, so another
    // owner takes it at once (its ttl is 30 s).
    let released = match client.try_lock("order:42", Duration::from_secs(5)).await? {
        Some(guard) => guard.release().await?,
        None => false,
    };

    // Graceful: the server stops accepting, finishes the connections it has
    // (none: each request closed its own) and returns.
    let _ = stop.send(());
    server.await??;
    println!("shut down gracefully");

    if order_42 != [200, 409] || other != 200 || !released {
        println!(
            "expected 200 and 409 for order 42, 200 for order 7 and order 42's lock free \
             afterwards; got {order_42:?}, {other} and free: {released}"
        );
        std::process::exit(1);
    }
    println!(
        "order 42: one request charged it, the concurrent one got 409, and the lock was let go; \
         order 7 did not wait"
    );
    Ok(())
}

/// Sends `POST path` over a fresh connection, prints the answer and returns
/// its status code. The request is written by hand so that the example needs
/// no HTTP client crate.
async fn request(addr: SocketAddr, path: &str, started: Instant) -> io::Result<u16> {
    let mut stream = TcpStream::connect(addr).await?;
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await?;
    let response = String::from_utf8_lossy(&response);

    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let status_line = head.lines().next().unwrap_or_default();
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse::<u16>().ok())
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("not an HTTP response: {status_line:?}"),
            )
        })?;
    println!(
        "[{:>4.1} s] POST {path} -> {status_line}: {}",
        started.elapsed().as_secs_f64(),
        body.trim_end()
    );
    Ok(status)
}
