//! An HTTP service whose handler charges an order under a distributed lock.
//!
//! `POST /orders/{order_id}/charge` calls `charge`, a function annotated with
//! `#[distributed_lock]`: while one request (in this process or in any other
//! replica using the same Redis) charges order 42, a second request for
//! order 42 waits up to 2 s for the lock and then gets `409 Conflict`. Any
//! other lock error (Redis unreachable, the lock lost mid-charge) is
//! `503 Service Unavailable`. Different orders do not wait for each other.
//!
//! By default the example starts the service on a free loopback port, sends
//! it three requests at once (two for order 42, one for order 7), prints the
//! answers (one 200 and one 409 for order 42, a 200 for order 7) and shuts
//! down gracefully. With `--serve` it keeps serving until Ctrl-C.
//!
//! ```text
//! cargo run --example axum_service                   # starts a throwaway redis-server
//! cargo run --example axum_service -- --serve        # serves until Ctrl-C
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --example axum_service
//! ```

use axum::Router;
use axum::extract::Path;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use lock_core::{ErrorKind, LockClient, LockError};
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

/// How long the payment gateway takes: longer than the 2 s `wait`, so a
/// second request for the same order gives up while the first still runs.
const GATEWAY_TIME: Duration = Duration::from_secs(3);

/// Charges an order. Only one request at a time, across every replica,
/// charges a given order; the others wait up to 2 s, then get `Contended`.
#[lock_core::distributed_lock(key = "order:{order_id}", ttl = "30s", wait = "2s")]
async fn charge(order_id: u64) -> Result<String, ApiError> {
    // The work: a payment gateway call, say.
    tokio::time::sleep(GATEWAY_TIME).await;
    Ok(format!("charged order {order_id}\n"))
}

/// `POST /orders/{order_id}/charge`.
async fn charge_handler(Path(order_id): Path<u64>) -> Result<String, ApiError> {
    charge(order_id).await
}

/// A failed request, as an HTTP answer. A real service has more variants
/// (a declined card, a gateway error); each maps to its own status.
#[derive(Debug)]
struct ApiError(LockError);

/// What `#[distributed_lock]` needs to return its errors through `ApiError`.
impl From<LockError> for ApiError {
    fn from(error: LockError) -> Self {
        ApiError(error)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = match self.0.kind() {
            // Another request holds this order for the whole wait: the
            // client may retry later.
            ErrorKind::Contended => StatusCode::CONFLICT,
            // Redis unreachable or timing out, the lock lost mid-charge, a
            // misconfiguration: not the client's fault.
            _ => StatusCode::SERVICE_UNAVAILABLE,
        };
        (status, format!("{}\n", self.0)).into_response()
    }
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
    lock_core::set_global_client(client)?;

    let app = Router::new().route("/orders/{order_id}/charge", post(charge_handler));
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

    // Graceful: the server stops accepting, finishes the connections it has
    // (none: each request closed its own) and returns.
    let _ = stop.send(());
    server.await??;
    println!("shut down gracefully");

    if order_42 != [200, 409] || other != 200 {
        println!(
            "expected 200 and 409 for order 42 and 200 for order 7, \
             got {order_42:?} and {other}"
        );
        std::process::exit(1);
    }
    println!("order 42: one request charged it, the concurrent one got 409; order 7 did not wait");
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
