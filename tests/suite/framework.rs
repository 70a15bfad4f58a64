//! `LockClient::run_locked` and the tower `LockLayer` against a real
//! `redis-server`: the future runs while the lock is held, the lock is let
//! go of on every exit path (another client takes it at once), a loss stops
//! the future within a renewal interval, and a nested acquisition re-enters.
//! The layer is tested on a real axum server, over HTTP from a real socket.
//!
//! Ordering comes from channels; time appears only as upper bounds with
//! margins for a loaded two-core machine.

use crate::support::{client_for, storage_key};
use axum::Router;
use axum::routing::post;
use futures::FutureExt;
use lock_core::tower::LockLayer;
use lock_core::{ErrorKind, LockClient, LockOptions, LossReason, OnLost, RunOptions, current_lock};
use lock_testkit::RedisServer;
use std::net::SocketAddr;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};
use tokio::time::{Instant, timeout};

const PREFIX: &str = "framework:";

/// A generous bound for anything that should take milliseconds.
const PROMPTLY: Duration = Duration::from_secs(2);

/// The ttl of the loss tests: renewed every second, so a loss is noticed
/// within a second of it, long before the three seconds it takes a lease
/// that is no longer renewed to run out.
const LOSS_TTL: Duration = Duration::from_secs(3);

/// Whether `key` is free right now: one attempt from another owner.
async fn is_free(observer: &LockClient, key: &str) -> bool {
    match observer
        .try_lock(key, Duration::from_secs(5))
        .await
        .unwrap()
    {
        Some(guard) => {
            assert!(guard.release().await.unwrap());
            true
        }
        None => false,
    }
}

/// Waits (up to [`PROMPTLY`]) for another owner to get `key`: proves it was
/// let go of, long before its 30 s ttl would have freed it.
async fn acquired_promptly(observer: &LockClient, key: &str) {
    let options = LockOptions::new(Duration::from_secs(5)).wait(PROMPTLY);
    let guard = observer
        .lock_with(key, options)
        .await
        .unwrap_or_else(|e| panic!("`{key}` was not let go of within {PROMPTLY:?}: {e}"));
    guard.release().await.unwrap();
}

fn thirty_seconds() -> RunOptions {
    RunOptions::new().ttl(Duration::from_secs(30))
}

/// Sets its flag when dropped: tells whether a future was dropped mid-way.
struct SetOnDrop(Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

// ---------------------------------------------------------------------------
// run_locked: exit paths.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_locked_returns_the_output_and_releases_before_returning() {
    let server = RedisServer::start();
    let (client, observer) = (
        client_for(&server, PREFIX).await,
        client_for(&server, PREFIX).await,
    );
    let output = client
        .run_locked("order:1", thirty_seconds(), async {
            assert!(!is_free(&observer, "order:1").await, "held while it runs");
            assert_eq!(current_lock().unwrap().key(), "order:1");
            250_u32
        })
        .await
        .unwrap();
    assert_eq!(output, 250);
    // The release went out before the return: this client's next command
    // comes after it on the same connection.
    assert!(is_free(&client, "order:1").await);
    assert_eq!(
        server.cmd::<i64>(&["EXISTS", &storage_key(PREFIX, "order:1")]),
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_output_comes_back_as_it_is_and_the_lock_is_released() {
    let server = RedisServer::start();
    let client = client_for(&server, PREFIX).await;
    let output = client
        .run_locked("order:2", thirty_seconds(), async {
            Err::<u32, &str>("card declined")
        })
        .await;
    assert_eq!(output.unwrap(), Err("card declined"));
    assert!(is_free(&client, "order:2").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_releases_and_reaches_the_caller() {
    let server = RedisServer::start();
    let client = client_for(&server, PREFIX).await;
    let running = client.run_locked("order:3", thirty_seconds(), async {
        panic!("boom");
    });
    let payload = AssertUnwindSafe(running)
        .catch_unwind()
        .await
        .expect_err("the panic reaches the caller");
    assert_eq!(payload.downcast_ref::<&str>(), Some(&"boom"));
    assert!(is_free(&client, "order:3").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_caller_drops_the_future_and_releases_promptly() {
    let server = RedisServer::start();
    let (client, observer) = (
        client_for(&server, PREFIX).await,
        client_for(&server, PREFIX).await,
    );
    let dropped = Arc::new(AtomicBool::new(false));
    let (started, running) = oneshot::channel();
    let flag = dropped.clone();
    let task = tokio::spawn(async move {
        client
            .run_locked("order:4", thirty_seconds(), async move {
                let _dropped = SetOnDrop(flag);
                let _ = started.send(());
                std::future::pending::<()>().await;
            })
            .await
    });
    running.await.unwrap();
    assert!(!is_free(&observer, "order:4").await);
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    assert!(dropped.load(Ordering::SeqCst));
    acquired_promptly(&observer, "order:4").await;

    // Dropped by a timeout, the same.
    let client = client_for(&server, PREFIX).await;
    let pending = client.run_locked("order:5", thirty_seconds(), std::future::pending::<()>());
    assert!(timeout(Duration::from_millis(500), pending).await.is_err());
    acquired_promptly(&observer, "order:5").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_held_elsewhere_is_contended_and_the_future_never_runs() {
    let server = RedisServer::start();
    let (client, other) = (
        client_for(&server, PREFIX).await,
        client_for(&server, PREFIX).await,
    );
    let held = other
        .lock("order:6", Duration::from_secs(30))
        .await
        .unwrap();
    let ran = AtomicBool::new(false);
    let options = thirty_seconds().wait(Duration::ZERO);
    let err = client
        .run_locked("order:6", options, async {
            ran.store(true, Ordering::SeqCst)
        })
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Contended, "{err}");
    assert_eq!(err.key(), Some("order:6"));
    assert!(!ran.load(Ordering::SeqCst));
    held.release().await.unwrap();
}

// ---------------------------------------------------------------------------
// run_locked: loss.

/// Runs a future that never ends under `key` (ttl [`LOSS_TTL`]), takes the
/// lock away with `steal` once it runs, and returns the error, how long
/// after the theft it came, and whether the future was dropped.
async fn steal_while_running(
    server: &RedisServer,
    key: &'static str,
    steal: impl AsyncFnOnce(),
) -> (lock_core::LockError, Duration, bool) {
    let client = client_for(server, PREFIX).await;
    let dropped = Arc::new(AtomicBool::new(false));
    let (started, running) = oneshot::channel();
    let flag = dropped.clone();
    let task = tokio::spawn(async move {
        let options = RunOptions::new().ttl(LOSS_TTL);
        client
            .run_locked(key, options, async move {
                let _dropped = SetOnDrop(flag);
                let _ = started.send(());
                std::future::pending::<u32>().await
            })
            .await
    });
    running.await.unwrap();
    steal().await;
    let stolen_at = Instant::now();
    let result = timeout(LOSS_TTL * 2, task)
        .await
        .expect("the future is stopped once the loss is noticed")
        .unwrap();
    let err = result.expect_err("a future that never ends");
    (err, stolen_at.elapsed(), dropped.load(Ordering::SeqCst))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_key_stops_the_future_within_a_renewal_interval() {
    let server = RedisServer::start();
    let stored = storage_key(PREFIX, "job:deleted");
    let (err, after, dropped) = steal_while_running(&server, "job:deleted", async || {
        let _: i64 = server.cmd(&["DEL", &stored]);
    })
    .await;
    assert!(err.is_lost(), "{err}");
    assert_eq!(err.key(), Some("job:deleted"));
    assert_eq!(err.loss_reason(), Some(LossReason::TakenOver), "{err}");
    assert!(dropped, "the future was dropped, not left running");
    // Noticed at the next renewal (every ttl/3 = 1 s), with a second's
    // margin: before the 3 s lease would have run out unrenewed.
    let bound = LOSS_TTL / 3 + Duration::from_secs(1);
    assert!(after < bound, "stopped {after:?} after the loss");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operators_force_release_stops_the_future_saying_so() {
    let server = RedisServer::start();
    let operator = client_for(&server, PREFIX).await;
    let (err, after, dropped) = steal_while_running(&server, "job:forced", async || {
        assert!(operator.force_release("job:forced").await.unwrap());
    })
    .await;
    assert!(err.is_lost(), "{err}");
    assert_eq!(err.loss_reason(), Some(LossReason::ForceReleased), "{err}");
    assert!(dropped);
    assert!(after < LOSS_TTL / 3 + Duration::from_secs(1), "{after:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_lost_continue_lets_the_future_finish() {
    let server = RedisServer::start();
    let client = client_for(&server, PREFIX).await;
    let (started, running) = oneshot::channel();
    let (go_on, go_on_rx) = oneshot::channel::<()>();
    let task = tokio::spawn({
        let client = client.clone();
        async move {
            let options = RunOptions::new().ttl(LOSS_TTL).on_lost(OnLost::Continue);
            client
                .run_locked("job:sturdy", options, async move {
                    let _ = started.send(());
                    go_on_rx.await.unwrap();
                    70
                })
                .await
        }
    });
    running.await.unwrap();
    let _: i64 = server.cmd(&["DEL", &storage_key(PREFIX, "job:sturdy")]);
    // The heartbeat ends when it finds the lock gone: the loss is noticed.
    crate::support::eventually(LOSS_TTL, "the loss noticed", || {
        client.heartbeats_running() == 0
    })
    .await;
    assert!(
        !task.is_finished(),
        "the future keeps running after the loss"
    );
    go_on.send(()).unwrap();
    assert_eq!(task.await.unwrap().unwrap(), 70);
}

// ---------------------------------------------------------------------------
// run_locked: re-entry, options, the default client.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nested_run_locked_re_enters_and_leaves_the_lock_held() {
    let server = RedisServer::start();
    let (client, observer) = (
        client_for(&server, PREFIX).await,
        client_for(&server, PREFIX).await,
    );
    let outer = client.run_locked("ledger", thirty_seconds().fencing(true), async {
        let token = current_lock().unwrap().fencing_token().unwrap();
        // No wait: a nested run that waited behind its own task would be
        // refused as contended at once.
        let nested = client
            .run_locked("ledger", RunOptions::new().wait(Duration::ZERO), async {
                current_lock().unwrap().fencing_token()
            })
            .await
            .unwrap();
        assert_eq!(nested, Some(token), "the outer lease, its token");
        assert!(
            !is_free(&observer, "ledger").await,
            "still held after the nested run"
        );
        // The guard API re-enters too.
        let guard = client
            .lock_with(
                "ledger",
                LockOptions::new(Duration::from_secs(5)).wait(Duration::ZERO),
            )
            .await
            .unwrap();
        drop(guard);
        assert!(!is_free(&observer, "ledger").await);
        token
    });
    let token = outer.await.unwrap();
    assert!(token > 0);
    acquired_promptly(&observer, "ledger").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_options_admit_two_runs_at_once() {
    let server = RedisServer::start();
    let (a, b) = (
        client_for(&server, PREFIX).await,
        client_for(&server, PREFIX).await,
    );
    let shared = || thirty_seconds().shared(true).wait(Duration::ZERO);
    let (inside, entered) = oneshot::channel();
    let (leave, left) = oneshot::channel::<()>();
    let first = tokio::spawn(async move {
        a.run_locked("catalog", shared(), async move {
            let _ = inside.send(());
            left.await.unwrap();
        })
        .await
    });
    entered.await.unwrap();
    let second = b.run_locked("catalog", shared(), async { 2 }).await;
    assert_eq!(second.unwrap(), 2, "a second shared holder, at once");
    leave.send(()).unwrap();
    first.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_free_function_uses_the_default_client_in_effect() {
    let server = RedisServer::start();
    let client = client_for(&server, PREFIX).await;
    let inside = lock_core::with_default_client(client.clone(), async {
        lock_core::run_locked("nightly", thirty_seconds(), async {
            current_lock().unwrap().key().to_owned()
        })
        .await
    });
    assert_eq!(inside.await.unwrap(), "nightly");
    // This test binary installs no process-wide client.
    let err = lock_core::run_locked("nightly", thirty_seconds(), async {})
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotInitialized, "{err}");
    assert_eq!(err.key(), Some("nightly"));
}

// ---------------------------------------------------------------------------
// The tower layer, on an axum server.

/// `order:{id}` for `/orders/{id}/...`; no lock for other paths.
fn order_key(request: &axum::http::request::Parts) -> Option<String> {
    let rest = request.uri.path().strip_prefix("/orders/")?;
    Some(format!("order:{}", rest.split('/').next()?))
}

/// Serves `app` on a free loopback port until the test's runtime ends.
async fn serve(app: Router) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(axum::serve(listener, app).into_future());
    addr
}

/// `POST path` over a fresh connection: the status code.
async fn post_status(addr: SocketAddr, path: &str) -> u16 {
    let exchange = async {
        let mut stream = TcpStream::connect(addr).await?;
        let request = format!(
            "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
        stream.write_all(request.as_bytes()).await?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await?;
        std::io::Result::Ok(String::from_utf8_lossy(&response).into_owned())
    };
    let response = timeout(Duration::from_secs(20), exchange)
        .await
        .expect("an answer within 20 s")
        .unwrap();
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok());
    status.unwrap_or_else(|| panic!("not an HTTP response: {response:?}"))
}

use std::future::IntoFuture;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_layer_refuses_a_key_held_elsewhere_and_lets_other_keys_through() {
    let server = RedisServer::start();
    let (client, other) = (
        client_for(&server, PREFIX).await,
        client_for(&server, PREFIX).await,
    );
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let handler = move || {
        counted.fetch_add(1, Ordering::SeqCst);
        async {
            current_lock()
                .map(|lock| lock.key().to_owned())
                .unwrap_or_default()
        }
    };
    let layer =
        LockLayer::new(client.clone(), order_key).options(thirty_seconds().wait(Duration::ZERO));
    let app = Router::new()
        .route("/orders/{id}/charge", post(handler.clone()))
        .route("/health", post(handler))
        .route_layer(layer.clone());
    let addr = serve(app).await;
    let held = other
        .lock("order:1", Duration::from_secs(30))
        .await
        .unwrap();

    assert_eq!(post_status(addr, "/orders/1/charge").await, 409);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        0,
        "refused without calling the handler"
    );
    assert_eq!(post_status(addr, "/orders/2/charge").await, 200);
    assert_eq!(post_status(addr, "/health").await, 200, "no key, no lock");
    assert_eq!(calls.load(Ordering::SeqCst), 2);

    // The status is configurable.
    let app = Router::new()
        .route("/orders/{id}/charge", post(|| async { "" }))
        .route_layer(layer.when_held(axum::http::StatusCode::LOCKED));
    let addr = serve(app).await;
    assert_eq!(post_status(addr, "/orders/1/charge").await, 423);
    held.release().await.unwrap();
    assert_eq!(post_status(addr, "/orders/1/charge").await, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_layer_holds_the_lock_while_the_handler_runs_and_lets_go_after_the_response() {
    let server = RedisServer::start();
    let (client, observer) = (
        client_for(&server, PREFIX).await,
        client_for(&server, PREFIX).await,
    );
    let watcher = observer.clone();
    let handler = move || {
        let watcher = watcher.clone();
        async move {
            // Answers 200 only when another owner finds the order held.
            if is_free(&watcher, "order:9").await {
                (axum::http::StatusCode::IM_A_TEAPOT, "not held")
            } else {
                (axum::http::StatusCode::OK, "held")
            }
        }
    };
    let layer = LockLayer::new(client, order_key).options(thirty_seconds());
    let app = Router::new()
        .route("/orders/{id}/charge", post(handler))
        .route_layer(layer);
    let addr = serve(app).await;
    assert_eq!(post_status(addr, "/orders/9/charge").await, 200);
    // Let go of once answered: the 30 s ttl did not have to run out.
    acquired_promptly(&observer, "order:9").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_layer_stops_the_handler_when_the_lock_is_lost_and_answers_503() {
    let server = RedisServer::start();
    let client = client_for(&server, PREFIX).await;
    let (started_tx, mut started) = mpsc::unbounded_channel();
    let dropped = Arc::new(AtomicBool::new(false));
    let flag = dropped.clone();
    let handler = move || {
        let (started_tx, flag) = (started_tx.clone(), flag.clone());
        async move {
            let _dropped = SetOnDrop(flag);
            let _ = started_tx.send(());
            std::future::pending::<&'static str>().await
        }
    };
    let layer = LockLayer::new(client, order_key).options(RunOptions::new().ttl(LOSS_TTL));
    let app = Router::new()
        .route("/orders/{id}/charge", post(handler))
        .route_layer(layer);
    let addr = serve(app).await;
    let answer = tokio::spawn(async move { post_status(addr, "/orders/5/charge").await });
    started.recv().await.unwrap();

    let _: i64 = server.cmd(&["DEL", &storage_key(PREFIX, "order:5")]);
    let stolen_at = Instant::now();
    assert_eq!(answer.await.unwrap(), 503);
    let after = stolen_at.elapsed();
    assert!(
        dropped.load(Ordering::SeqCst),
        "the handler's future was dropped"
    );
    assert!(
        after < LOSS_TTL / 3 + Duration::from_secs(1),
        "answered {after:?} after the loss"
    );
}
