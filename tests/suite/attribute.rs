//! `#[distributed_lock]` against a real `redis-server`: the lock is held
//! while the body runs and released on every exit path, contention and loss
//! behave as documented, and the body sees its lock through
//! `current_lock()`.
//!
//! Every test uses its own server and explicit clients (`client = ..`), so
//! tests never share state; the global client has its own test binary
//! (`tests/attribute_global.rs`). Ordering comes from channels; time appears only
//! as generous upper bounds.

use crate::support::{client_for, storage_key};
use futures::FutureExt;
use lock_core::{
    LockClient, LockError, LockInfo, LockOptions, LossReason, current_lock, distributed_lock,
};
use lock_testkit::RedisServer;
use std::num::ParseIntError;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::time::{Instant, timeout};

const PREFIX: &str = "attr:";

/// A generous bound for anything that should take milliseconds, on a loaded
/// two-core machine.
const PROMPTLY: Duration = Duration::from_secs(2);

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

/// Whether the release of `key` went out before the annotated call on
/// `client` returned: the client's next command, on the same connection,
/// comes after it and finds the key free. (Another client can still find
/// it held for the few milliseconds until the server has read the release:
/// its reply is not awaited.)
async fn released_by_return(client: &LockClient, key: &str) -> bool {
    is_free(client, key).await
}

/// Waits (up to [`PROMPTLY`]) for another owner to get `key`: proves it was
/// released, long before its ttl would have freed it.
async fn acquired_promptly(observer: &LockClient, key: &str) -> Duration {
    let started = Instant::now();
    let guard = observer
        .lock_with(key, LockOptions::new(Duration::from_secs(5)).wait(PROMPTLY))
        .await
        .unwrap_or_else(|e| panic!("`{key}` was not released within {PROMPTLY:?}: {e}"));
    guard.release().await.unwrap();
    started.elapsed()
}

/// The error type of the annotated functions: lock errors and the body's
/// own errors both convert into it.
#[derive(Debug)]
enum AppError {
    Lock(LockError),
    Parse(ParseIntError),
    Rejected(u32),
}

impl From<LockError> for AppError {
    fn from(e: LockError) -> Self {
        AppError::Lock(e)
    }
}

impl From<ParseIntError> for AppError {
    fn from(e: ParseIntError) -> Self {
        AppError::Parse(e)
    }
}

/// Sets its flag when dropped: tells whether a body was dropped mid-way.
struct SetOnDrop(Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

// ---------------------------------------------------------------------------
// Returns: Ok, Err, `?`.

/// `Ok` for a positive amount, `Err` by `return` for zero, `Err` by `?` for
/// text that is not a number. Checks from inside that the lock is held.
#[distributed_lock(key = "order:{order_id}", client = client)]
async fn charge(
    client: &LockClient,
    observer: &LockClient,
    order_id: u32,
    input: &str,
) -> Result<u32, AppError> {
    assert!(
        !is_free(observer, &format!("order:{order_id}")).await,
        "the body runs while the lock is held"
    );
    let amount: u32 = input.parse()?;
    if amount == 0 {
        return Err(AppError::Rejected(order_id));
    }
    Ok(amount)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ok_return_sends_the_release_before_returning() {
    let server = RedisServer::start();
    let (client, observer) = (
        client_for(&server, PREFIX).await,
        client_for(&server, PREFIX).await,
    );

    assert_eq!(charge(&client, &observer, 1, "250").await.unwrap(), 250);
    assert!(released_by_return(&client, "order:1").await);
    assert_eq!(
        server.cmd::<i64>(&["EXISTS", &storage_key(PREFIX, "order:1")]),
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn err_return_sends_the_release_before_returning() {
    let server = RedisServer::start();
    let (client, observer) = (
        client_for(&server, PREFIX).await,
        client_for(&server, PREFIX).await,
    );

    let err = charge(&client, &observer, 2, "0").await.unwrap_err();
    assert!(matches!(err, AppError::Rejected(2)), "{err:?}");
    assert!(released_by_return(&client, "order:2").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn question_mark_converts_and_sends_the_release_before_returning() {
    let server = RedisServer::start();
    let (client, observer) = (
        client_for(&server, PREFIX).await,
        client_for(&server, PREFIX).await,
    );

    let err = charge(&client, &observer, 3, "not a number")
        .await
        .unwrap_err();
    match err {
        AppError::Parse(e) => assert_eq!(e.to_string(), "invalid digit found in string"),
        other => panic!("expected the body's parse error, converted by `?`: {other:?}"),
    }
    assert!(released_by_return(&client, "order:3").await);
}

// ---------------------------------------------------------------------------
// Panics.

#[distributed_lock(key = "panics:{id}", client = client)]
async fn panics(client: &LockClient, observer: &LockClient, id: u32) -> Result<(), LockError> {
    assert!(!is_free(observer, &format!("panics:{id}")).await);
    panic!("boom {id}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn panic_releases_and_continues_to_the_caller() {
    let server = RedisServer::start();
    let (client, observer) = (
        client_for(&server, PREFIX).await,
        client_for(&server, PREFIX).await,
    );

    let payload = AssertUnwindSafe(panics(&client, &observer, 1))
        .catch_unwind()
        .await
        .expect_err("the panic reaches the caller");
    let message = payload
        .downcast_ref::<String>()
        .map(String::as_str)
        .unwrap_or_default();
    assert_eq!(message, "boom 1");
    // Released before the panic resumed: the client's next command finds
    // the key free.
    assert!(released_by_return(&client, "panics:1").await);
}

// ---------------------------------------------------------------------------
// The caller's future dropped mid-body.

/// Takes the lock for 30s, says it started, and never finishes.
#[distributed_lock(key = "hold:{name}", client = client, ttl = "30s")]
async fn hold_forever(
    client: LockClient,
    name: &'static str,
    started: oneshot::Sender<()>,
) -> Result<(), LockError> {
    let _ = started.send(());
    std::future::pending::<()>().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_by_timeout_releases_promptly() {
    let server = RedisServer::start();
    let (client, observer) = (
        client_for(&server, PREFIX).await,
        client_for(&server, PREFIX).await,
    );

    let (started, body_started) = oneshot::channel();
    let outcome = timeout(
        Duration::from_secs(1),
        hold_forever(client, "timeout", started),
    )
    .await;
    assert!(outcome.is_err(), "the body never finishes");
    body_started
        .await
        .expect("the body was running when the timeout dropped it");
    let waited = acquired_promptly(&observer, "hold:timeout").await;
    assert!(
        waited < PROMPTLY,
        "released after {waited:?}; the ttl is 30s"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_by_select_releases_promptly() {
    let server = RedisServer::start();
    let (client, observer) = (
        client_for(&server, PREFIX).await,
        client_for(&server, PREFIX).await,
    );

    let (started, body_started) = oneshot::channel();
    tokio::select! {
        _ = hold_forever(client, "select", started) => unreachable!("the body never finishes"),
        started = body_started => started.unwrap(),
    }
    // The `select!` dropped the losing branch: the annotated call.
    acquired_promptly(&observer, "hold:select").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aborted_task_releases_promptly() {
    let server = RedisServer::start();
    let (client, observer) = (
        client_for(&server, PREFIX).await,
        client_for(&server, PREFIX).await,
    );

    let (started, body_started) = oneshot::channel();
    let task = tokio::spawn(hold_forever(client, "abort", started));
    body_started.await.unwrap();
    assert!(!is_free(&observer, "hold:abort").await);
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    acquired_promptly(&observer, "hold:abort").await;
}

// ---------------------------------------------------------------------------
// Contention.

/// Holds `job:{id}` until told to finish; notes when its body ends.
#[distributed_lock(key = "job:{id}", client = client)]
async fn hold_until(
    client: LockClient,
    id: u32,
    started: oneshot::Sender<()>,
    finish: oneshot::Receiver<()>,
    log: Arc<Mutex<Vec<&'static str>>>,
) -> Result<(), LockError> {
    let _ = started.send(());
    let _ = finish.await;
    log.lock().unwrap().push("first body ended");
    Ok(())
}

#[distributed_lock(key = "job:{id}", client = client, wait = "0s")]
async fn run_once(client: &LockClient, id: u32, ran: &AtomicBool) -> Result<(), AppError> {
    ran.store(true, Ordering::SeqCst);
    Ok(())
}

#[distributed_lock(key = "job:{id}", client = client, wait = "5s")]
async fn run_after(
    client: LockClient,
    id: u32,
    log: Arc<Mutex<Vec<&'static str>>>,
) -> Result<(), AppError> {
    log.lock().unwrap().push("second body ran");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_wait_gives_contended_at_once_in_the_functions_error_type() {
    let server = RedisServer::start();
    let (first, second) = (
        client_for(&server, PREFIX).await,
        client_for(&server, PREFIX).await,
    );
    let log = Arc::new(Mutex::new(Vec::new()));

    let (started, body_started) = oneshot::channel();
    let (finish, finish_rx) = oneshot::channel();
    let holder = tokio::spawn(hold_until(first, 1, started, finish_rx, log.clone()));
    body_started.await.unwrap();

    let ran = AtomicBool::new(false);
    let asked = Instant::now();
    let err = run_once(&second, 1, &ran).await.unwrap_err();
    let waited = asked.elapsed();
    match &err {
        AppError::Lock(e) => {
            assert!(e.is_contended(), "{e}");
            assert_eq!(e.key(), Some("job:1"));
        }
        other => panic!("expected a contended lock error, got {other:?}"),
    }
    assert!(!ran.load(Ordering::SeqCst), "the body must not run");
    assert!(
        waited < Duration::from_secs(1),
        "one attempt took {waited:?}"
    );

    finish.send(()).unwrap();
    holder.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_wait_the_second_caller_runs_after_the_first_returns() {
    let server = RedisServer::start();
    let (first, second) = (
        client_for(&server, PREFIX).await,
        client_for(&server, PREFIX).await,
    );
    let log = Arc::new(Mutex::new(Vec::new()));

    let (started, body_started) = oneshot::channel();
    let (finish, finish_rx) = oneshot::channel();
    let holder = tokio::spawn(hold_until(first, 2, started, finish_rx, log.clone()));
    body_started.await.unwrap();

    let mut waiter = tokio::spawn(run_after(second, 2, log.clone()));
    // While the first holds the lock, the second keeps waiting.
    assert!(
        timeout(Duration::from_millis(300), &mut waiter)
            .await
            .is_err(),
        "the second caller must wait for the first"
    );
    assert!(log.lock().unwrap().is_empty());

    finish.send(()).unwrap();
    holder.await.unwrap().unwrap();
    timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the second caller runs once the first returned")
        .unwrap()
        .unwrap();
    assert_eq!(
        *log.lock().unwrap(),
        ["first body ended", "second body ran"]
    );
}

// ---------------------------------------------------------------------------
// Renewal.

/// Runs for about four ttls, checking all along that the lock stays held.
#[distributed_lock(key = "long:{id}", client = client, ttl = "300ms")]
async fn long_job(client: &LockClient, observer: &LockClient, id: u32) -> Result<u32, LockError> {
    let key = format!("long:{id}");
    let until = Instant::now() + Duration::from_millis(1200);
    let mut checks = 0;
    while Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!is_free(observer, &key).await, "free after {checks} checks");
        checks += 1;
    }
    Ok(checks)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_keeps_the_lock_for_a_body_longer_than_the_ttl() {
    let server = RedisServer::start();
    let (client, observer) = (
        client_for(&server, PREFIX).await,
        client_for(&server, PREFIX).await,
    );

    let started = Instant::now();
    let checks = long_job(&client, &observer, 1).await.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(1200));
    assert!(checks >= 4, "only {checks} checks");
    // Released on return: the client's next command finds it free (another
    // client may still see it held for the milliseconds until the server
    // reads the release, whose reply the attribute does not await).
    assert!(released_by_return(&client, "long:1").await);
}

// ---------------------------------------------------------------------------
// Loss.

/// Says it started, then waits forever; notes when it is dropped.
#[distributed_lock(key = "fragile:{name}", client = client, ttl = "300ms")]
async fn fragile(
    client: LockClient,
    name: &'static str,
    started: oneshot::Sender<()>,
    dropped: Arc<AtomicBool>,
) -> Result<u32, AppError> {
    let _dropped = SetOnDrop(dropped);
    let _ = started.send(());
    std::future::pending::<()>().await;
    Ok(1)
}

/// Runs `fragile`, takes its lock away with `steal`, and returns what the
/// function returned, how long after the theft, and whether the body was
/// dropped.
async fn steal_from_fragile(
    server: &RedisServer,
    name: &'static str,
    steal: &[&str],
) -> (Result<u32, AppError>, Duration, bool) {
    let client = client_for(server, PREFIX).await;
    let dropped = Arc::new(AtomicBool::new(false));
    let (started, body_started) = oneshot::channel();
    let task = tokio::spawn(fragile(client, name, started, dropped.clone()));
    body_started.await.unwrap();

    let _: () = server.cmd(steal);
    let stolen_at = Instant::now();
    let result = timeout(Duration::from_secs(5), task)
        .await
        .expect("the body is stopped once the loss is noticed")
        .unwrap();
    (result, stolen_at.elapsed(), dropped.load(Ordering::SeqCst))
}

/// The function returned the `Lost` error of `key`, saying why.
fn assert_lost(result: &Result<u32, AppError>, key: &str, reason: LossReason, says: &str) {
    match result {
        Err(AppError::Lock(e)) => {
            assert!(e.is_lost(), "{e}");
            assert_eq!(e.key(), Some(key));
            assert_eq!(e.loss_reason(), Some(reason), "{e}");
            assert!(e.to_string().contains(says), "{e}");
        }
        other => panic!("expected the Lost error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abort_on_lost_stops_the_body_when_the_key_is_deleted() {
    let server = RedisServer::start();
    let key = storage_key(PREFIX, "fragile:deleted");

    let (result, after, dropped) = steal_from_fragile(&server, "deleted", &["DEL", &key]).await;
    assert_lost(
        &result,
        "fragile:deleted",
        LossReason::TakenOver,
        "found the key gone or held by another owner",
    );
    assert!(dropped, "the body was dropped, not left running");
    assert!(after < PROMPTLY, "stopped {after:?} after the loss");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abort_on_lost_stops_the_body_when_the_key_is_overwritten() {
    let server = RedisServer::start();
    let key = storage_key(PREFIX, "fragile:overwritten");

    let steal = ["SET", &key, "another-owner", "PX", "60000"];
    let (result, after, dropped) = steal_from_fragile(&server, "overwritten", &steal).await;
    assert_lost(
        &result,
        "fragile:overwritten",
        LossReason::TakenOver,
        "found the key gone or held by another owner",
    );
    assert!(dropped);
    assert!(after < PROMPTLY, "stopped {after:?} after the loss");
    // The release that followed left the new owner's lock alone.
    let owner: Option<String> = server.cmd(&["GET", &key]);
    assert_eq!(owner.as_deref(), Some("another-owner"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_an_operator_breaks_returns_lost_saying_so() {
    let server = RedisServer::start();
    let client = client_for(&server, PREFIX).await;
    let operator = client_for(&server, PREFIX).await;
    let dropped = Arc::new(AtomicBool::new(false));
    let (started, body_started) = oneshot::channel();
    let task = tokio::spawn(fragile(client, "forced", started, dropped.clone()));
    body_started.await.unwrap();

    assert!(operator.force_release("fragile:forced").await.unwrap());
    let result = timeout(Duration::from_secs(5), task)
        .await
        .expect("the body is stopped once the loss is noticed")
        .unwrap();
    assert_lost(
        &result,
        "fragile:forced",
        LossReason::ForceReleased,
        "an operator force-released it",
    );
    assert!(dropped.load(Ordering::SeqCst));
}

#[distributed_lock(key = "sturdy:{id}", client = client, ttl = "300ms", on_lost = "continue")]
async fn sturdy(
    client: LockClient,
    id: u32,
    started: oneshot::Sender<()>,
    go_on: oneshot::Receiver<()>,
) -> Result<u32, AppError> {
    let _ = started.send(());
    go_on.await.unwrap();
    Ok(id * 10)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn continue_on_lost_lets_the_body_finish() {
    let server = RedisServer::start();
    let client = client_for(&server, PREFIX).await;

    let (started, body_started) = oneshot::channel();
    let (go_on, go_on_rx) = oneshot::channel();
    let task = tokio::spawn(sturdy(client.clone(), 7, started, go_on_rx));
    body_started.await.unwrap();
    assert_eq!(client.heartbeats_running(), 1);

    let _: () = server.cmd(&["DEL", &storage_key(PREFIX, "sturdy:7")]);
    // The heartbeat ends when it finds the lock gone: the loss is noticed.
    let deadline = Instant::now() + PROMPTLY;
    while client.heartbeats_running() > 0 {
        assert!(Instant::now() < deadline, "the loss was not noticed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!task.is_finished(), "the body keeps running after the loss");

    go_on.send(()).unwrap();
    assert_eq!(task.await.unwrap().unwrap(), 70);
}

// ---------------------------------------------------------------------------
// `current_lock()`.

#[distributed_lock(key = "fenced:{id}", client = client, fencing = true)]
async fn fenced(client: &LockClient, id: u32) -> Result<LockInfo, LockError> {
    Ok(current_lock().expect("inside an annotated body"))
}

#[distributed_lock(key = "plain:{id}", client = client)]
async fn plain(client: &LockClient, id: u32) -> Result<LockInfo, LockError> {
    Ok(current_lock().expect("inside an annotated body"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn current_lock_describes_the_lock_the_body_runs_under() {
    let server = RedisServer::start();
    let client = client_for(&server, PREFIX).await;

    assert_eq!(current_lock(), None);
    let first = fenced(&client, 4).await.unwrap();
    assert_eq!(first.key(), "fenced:4");
    let first_token = first.fencing_token().expect("fencing = true gives a token");
    let second = fenced(&client, 4).await.unwrap();
    assert!(second.fencing_token().unwrap() > first_token);

    let unfenced = plain(&client, 4).await.unwrap();
    assert_eq!(unfenced.key(), "plain:4");
    assert_eq!(unfenced.fencing_token(), None);
    assert_eq!(current_lock(), None, "nothing outside an annotated body");
}

#[distributed_lock(key = "outer:{id}", client = client)]
async fn outer(client: &LockClient, id: u32) -> Result<[String; 3], LockError> {
    let key = || current_lock().unwrap().key().to_owned();
    let before = key();
    let nested = inner(client, id).await?;
    Ok([before, nested, key()])
}

#[distributed_lock(key = "inner:{id}", client = client)]
async fn inner(client: &LockClient, id: u32) -> Result<String, LockError> {
    Ok(current_lock().unwrap().key().to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_calls_see_their_own_lock() {
    let server = RedisServer::start();
    let client = client_for(&server, PREFIX).await;

    let seen = outer(&client, 9).await.unwrap();
    assert_eq!(seen, ["outer:9", "inner:9", "outer:9"]);
}

// ---------------------------------------------------------------------------
// Key templates and methods.

struct Customer {
    id: u64,
    region: &'static str,
}

struct Tenant {
    id: u32,
    locks: LockClient,
    reindexed: u32,
}

impl Tenant {
    #[distributed_lock(key = "tenant:{self.id}:reindex", client = self.locks)]
    async fn reindex(&mut self, server: &RedisServer) -> Result<String, LockError> {
        self.reindexed += 1;
        let held: i64 = server.cmd(&["EXISTS", &storage_key(PREFIX, "tenant:7:reindex")]);
        assert_eq!(held, 1, "the rendered key is what Redis holds");
        Ok(current_lock().unwrap().key().to_owned())
    }

    #[distributed_lock(key = "tenant:{self.id}:shared", client = self.locks)]
    async fn shared(self: Arc<Self>) -> Result<String, LockError> {
        let this = self;
        Ok(format!(
            "{}:{}",
            current_lock().unwrap().key(),
            this.reindexed
        ))
    }
}

#[distributed_lock(key = "invoice:{customer.id}:{customer.region}:{{{month}}}", client = client)]
async fn bill(client: &LockClient, customer: &Customer, month: u8) -> Result<String, LockError> {
    Ok(current_lock().unwrap().key().to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_render_from_parameters_fields_and_self() {
    let server = RedisServer::start();
    let client = client_for(&server, PREFIX).await;

    let customer = Customer {
        id: 5,
        region: "eu",
    };
    assert_eq!(
        bill(&client, &customer, 11).await.unwrap(),
        "invoice:5:eu:{11}"
    );

    let mut tenant = Tenant {
        id: 7,
        locks: client.clone(),
        reindexed: 0,
    };
    assert_eq!(tenant.reindex(&server).await.unwrap(), "tenant:7:reindex");
    assert_eq!(tenant.reindexed, 1);
    let tenant = Arc::new(tenant);
    assert_eq!(tenant.shared().await.unwrap(), "tenant:7:shared:1");
    assert_eq!(client.heartbeats_running(), 0, "every lock was released");
}

// ---------------------------------------------------------------------------
// `crate = ".."`: generated code reaches lock-core only through the path.

mod shim {
    //! lock-core's generated-code API, with `run` counted.
    pub mod __private {
        pub use lock_core::__private::*;
        use std::sync::atomic::{AtomicUsize, Ordering};

        pub static RUNS: AtomicUsize = AtomicUsize::new(0);

        pub async fn run<T, E, F>(
            client: Result<&lock_core::LockClient, lock_core::LockError>,
            key: String,
            attr: Attr,
            into_error: fn(lock_core::LockError) -> E,
            body: F,
        ) -> Result<T, E>
        where
            F: Future<Output = Result<T, E>>,
        {
            RUNS.fetch_add(1, Ordering::SeqCst);
            lock_core::__private::run(client, key, attr, into_error, body).await
        }
    }
}

#[distributed_lock(key = "shimmed:{id}", client = client, crate = "crate::attribute::shim")]
async fn shimmed(client: &LockClient, id: u32) -> Result<String, LockError> {
    Ok(current_lock().unwrap().key().to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crate_argument_routes_generated_code_through_the_given_path() {
    let server = RedisServer::start();
    let client = client_for(&server, PREFIX).await;

    assert_eq!(shim::__private::RUNS.load(Ordering::SeqCst), 0);
    assert_eq!(shimmed(&client, 1).await.unwrap(), "shimmed:1");
    assert_eq!(shim::__private::RUNS.load(Ordering::SeqCst), 1);
}

// ---------------------------------------------------------------------------
// Nesting depth: each annotated call boxes its body, so nested calls keep
// small stack frames, also in unoptimised builds (where the frames around
// an inline body would each reserve its whole size again).

#[distributed_lock(key = "depth:1", client = client, wait = "2s")]
async fn depth_1(client: &LockClient) -> Result<u32, LockError> {
    Ok(depth_2(client).await? + 1)
}

#[distributed_lock(key = "depth:2", client = client, wait = "2s")]
async fn depth_2(client: &LockClient) -> Result<u32, LockError> {
    Ok(depth_3(client).await? + 1)
}

#[distributed_lock(key = "depth:3", client = client, wait = "2s")]
async fn depth_3(client: &LockClient) -> Result<u32, LockError> {
    Ok(depth_4(client).await? + 1)
}

#[distributed_lock(key = "depth:4", client = client, wait = "2s")]
async fn depth_4(client: &LockClient) -> Result<u32, LockError> {
    // The deepest body also takes a lock through the guard API.
    let guard = client.lock("depth:leaf", Duration::from_secs(5)).await?;
    guard.release().await?;
    Ok(1)
}

/// Four annotated calls, each nested in the one before, fit on a thread
/// of 1 MiB (half of tokio's and the test harness's 2 MiB default) in an
/// unoptimised build: with the bodies inline, three took 1.4 MiB.
#[test]
fn four_nested_annotated_calls_fit_in_a_small_stack() {
    let depth = std::thread::Builder::new()
        .stack_size(1 << 20)
        .spawn(|| {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async {
                let client = LockClient::in_memory();
                depth_1(&client).await.unwrap()
            })
        })
        .unwrap()
        .join()
        .expect("no stack overflow");
    assert_eq!(depth, 4);
}
