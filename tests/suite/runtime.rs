//! A runtime given to the builder (`LockClientBuilder::runtime`): the
//! client's background work runs there as tasks, not on threads of
//! lock-core's; a blocked worker of it holds up no renewal while another is
//! free, every blocked worker loses the lock at its deadline; and when it
//! shuts down, the locks it renewed are lost at once, the releases it
//! dropped still happen, and nothing hangs. docs/runtime.md says the same.

use crate::support::{Backend, client_with, eventually, eventually_async, storage_key};
use lock_core::{LockClient, LockClientBuilder, LockGuard, LockOptions, LossReason};
use lock_testkit::RedisServer;
use std::future::Future;
use std::process::{Command, Stdio};
use std::task::Poll;
use std::time::Duration;
use tokio::runtime::{Handle, Runtime};
use tokio::time::Instant;

const PREFIX: &str = "rt:";
/// The ttl of a lock that must be renewed: every third of it.
const TTL: Duration = Duration::from_secs(1);
/// Set in the process [`alone`] starts.
const ALONE: &str = "LOCK_SUITE_RUNTIME_ALONE";
/// The heartbeat thread's name as `/proc` shows it: `lock-core-heartbeat`
/// cut to the 15 bytes Linux keeps.
const HEARTBEAT_THREAD: &str = "lock-core-heart";

fn user_runtime(workers: usize, name: &str) -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .thread_name(name)
        .enable_all()
        .build()
        .unwrap()
}

fn builder() -> LockClientBuilder {
    LockClient::builder().key_prefix(PREFIX)
}

/// The names of this process's threads, from `/proc/self/task/*/comm`.
fn thread_names() -> Vec<String> {
    let tasks = std::fs::read_dir("/proc/self/task").unwrap();
    tasks
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .map(|name| name.trim_end().to_owned())
        .collect()
}

fn heartbeat_threads() -> usize {
    thread_names()
        .iter()
        .filter(|name| name.as_str() == HEARTBEAT_THREAD)
        .count()
}

/// Runs the test `name` of this binary in a process of its own, alone, so
/// that the threads it reads are its own and no other test's; fails unless
/// it ran there and passed, within a minute.
fn alone(name: &str) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(ALONE, "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{name}, alone, did not end within 60 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    println!("{stdout}");
    assert!(
        out.status.success() && stdout.contains("test result: ok. 1 passed"),
        "{name}, alone: {}\n{stdout}\n{stderr}",
        out.status
    );
}

/// With a runtime given, a lock with a 1 s ttl is renewed for 3.5 s by a
/// task of that runtime: its alive tasks rise while the lock is held and
/// fall after the release (the heartbeat ends when idle), and lock-core
/// starts no thread meanwhile: no `lock-core-heartbeat`, nor the threads of
/// its process-wide runtime (the watch over kept acquisitions runs on the
/// given runtime too). The same hold without the
/// option starts one: what is looked for is there to be found. In a process
/// of its own: other tests' clients start heartbeat threads too.
#[test]
fn a_client_on_a_given_runtime_renews_there_and_starts_no_thread() {
    if std::env::var_os(ALONE).is_none() {
        return alone("runtime::a_client_on_a_given_runtime_renews_there_and_starts_no_thread");
    }
    let server = RedisServer::start();
    let user = user_runtime(2, "user-worker");
    let test = user_runtime(1, "test-worker");
    test.block_on(async {
        let idle_tasks = user.metrics().num_alive_tasks();
        let client = client_with(&server, builder().runtime(user.handle().clone())).await;
        let held = client.lock("renewed", TTL).await.unwrap();
        let started = Instant::now();
        let mut peak = 0;
        while started.elapsed() < TTL * 7 / 2 {
            peak = peak.max(user.metrics().num_alive_tasks());
            let threads = lock_core_threads();
            assert!(
                threads.is_empty(),
                "lock-core's threads while held: {threads:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(!held.is_lost(), "lost: {:?}", held.loss_reason());
        let pttl: i64 = server.cmd(&["PTTL", &storage_key(PREFIX, "renewed")]);
        assert!(pttl > 0, "the key's pttl is {pttl}");
        assert!(held.release().await.unwrap());
        println!(
            "alive tasks on the given runtime: {idle_tasks} before, {peak} while held; \
             lock-core's threads: {:?}",
            lock_core_threads()
        );
        assert!(
            peak > idle_tasks,
            "no task on the given runtime: {peak} alive"
        );
        eventually(Duration::from_secs(10), "the heartbeat task ends", || {
            user.metrics().num_alive_tasks() < peak
        })
        .await;
        assert_eq!(lock_core_threads(), Vec::<String>::new());

        // Without the option: the heartbeat's own thread.
        let client = client_with(&server, builder()).await;
        let held = client.lock("own-thread", TTL).await.unwrap();
        eventually(Duration::from_secs(5), "a heartbeat thread", || {
            heartbeat_threads() == 1
        })
        .await;
        assert!(held.release().await.unwrap());
    });
}

fn lock_core_threads() -> Vec<String> {
    let mut names: Vec<String> = thread_names()
        .into_iter()
        .filter(|name| name.starts_with("lock-core"))
        .collect();
    names.sort();
    names
}

/// Runs of the blocked-worker scenario, side by side.
const RUNS: usize = 8;

/// [`TTL`], except over TLS, where the heartbeat's first renewal opens a
/// TLS connection of its own on the given runtime, which in a debug build
/// takes more than a third of a second with [`RUNS`] clients at once on two
/// cores (as in `isolation.rs`).
fn held_ttl(backend: &Backend) -> Duration {
    match backend {
        Backend::Tls(..) => Duration::from_secs(3),
        _ => TTL,
    }
}

/// On Redlock each server may take 200 ms to answer (a 1 s ttl would
/// allow 50 ms), as in `isolation.rs`: the runs measure the blocked worker,
/// not the load of a shared 2-core machine.
fn settings() -> LockClientBuilder {
    builder().node_timeout(Duration::from_millis(200))
}

/// A task of the given runtime (two workers) blocks its worker for 3 s,
/// three ttls (one over TLS): the lock held meanwhile is renewed on the
/// other worker, and is still held and the holder's. [`RUNS`] runtimes side
/// by side, on every transport and deployment.
#[test]
fn a_blocked_worker_of_the_given_runtime_costs_no_held_lock() {
    for backend in Backend::every_transport() {
        std::thread::scope(|scope| {
            let runs: Vec<_> = (0..RUNS)
                .map(|run| {
                    let backend = &backend;
                    scope.spawn(move || {
                        let user = user_runtime(2, "user-worker");
                        let handle = user.handle().clone();
                        user.block_on(blocked_worker_run(backend, handle, run));
                    })
                })
                .collect();
            for run in runs {
                run.join().unwrap();
            }
        });
    }
}

async fn blocked_worker_run(backend: &Backend, user: tokio::runtime::Handle, run: usize) {
    let on = backend.name();
    let client = client_with(backend, settings().runtime(user.clone())).await;
    let key = format!("blocked:{run}");
    let held = client.lock(&key, held_ttl(backend)).await.unwrap();
    let (blocking, blocked) = tokio::sync::oneshot::channel();
    let blocker = user.spawn(async move {
        let _ = blocking.send(());
        std::thread::sleep(Duration::from_secs(3));
    });
    blocked.await.unwrap();
    blocker.await.unwrap();
    assert!(
        !held.is_lost(),
        "{on}, run {run}: lost {:?} while a worker was blocked",
        held.loss_reason()
    );
    assert!(
        backend.holds(&storage_key(PREFIX, &key)),
        "{on}, run {run}: the key is gone from Redis"
    );
    assert!(held.release().await.unwrap(), "{on}, run {run}: still ours");
}

/// What the option costs: when every worker of the given runtime is
/// blocked (here its one thread), no renewal runs, and the lock is lost at
/// its validity deadline, as its guard says to a task on another runtime
/// within a ttl; the runtime's thread free again, the lease stays lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_worker_of_the_given_runtime_blocked_loses_the_lock_at_its_deadline() {
    let server = RedisServer::start();
    let user = user_runtime(1, "user-worker");
    let client = client_with(&server, builder().runtime(user.handle().clone())).await;
    let held = client.lock("all-blocked", TTL).await.unwrap();
    let (blocking, blocked) = tokio::sync::oneshot::channel();
    user.spawn(async move {
        let _ = blocking.send(());
        std::thread::sleep(TTL * 3);
    });
    blocked.await.unwrap();
    let since = Instant::now();
    tokio::time::timeout(TTL * 2, held.lost())
        .await
        .expect("the loss is signalled within two ttls");
    let after = since.elapsed();
    println!("all workers blocked: lost after {after:?}");
    assert_eq!(held.loss_reason(), Some(LossReason::Expired));
    assert!(after < TTL * 3, "the blocked thread did not free first");
    tokio::time::sleep(TTL * 3).await;
    assert_eq!(held.loss_reason(), Some(LossReason::Expired));
    drop(held);
    tokio::task::spawn_blocking(move || drop(user))
        .await
        .unwrap();
}

/// The given runtime shuts down while the client holds locks: each is
/// lost at once (within 1 s, its ttl is 30 s), a guard dropped then still
/// lets its key go (on lock-core's runtime), a lock taken afterwards is
/// lost as soon as it is held, and a waiter whose wake-ups ran there gets
/// a released key on its timer. Nothing panics or hangs. On every
/// transport and deployment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_given_runtime_shutting_down_loses_its_locks_and_still_releases() {
    for backend in Backend::every_transport() {
        shutdown_run(&backend).await;
    }
}

async fn shutdown_run(backend: &Backend) {
    let on = backend.name();
    let user = user_runtime(1, "user-worker");
    let client = client_with(backend, settings().runtime(user.handle().clone())).await;
    let other = client_with(backend, settings()).await;
    let long = Duration::from_secs(30);
    let kept = client.lock("kept", long).await.unwrap();
    let dropped = client.lock("dropped", long).await.unwrap();
    // A shared lock's release is only ever sent in the background (there
    // are none on Redlock).
    let shared = match backend {
        Backend::Redlock(_) => None,
        _ => Some(
            (client.lock_with("shared", LockOptions::new(long).shared(true)))
                .await
                .unwrap(),
        ),
    };
    let busy = other.lock("busy", long).await.unwrap();
    eventually(Duration::from_secs(5), "the heartbeat task runs", || {
        user.metrics().num_alive_tasks() > 0
    })
    .await;

    let shut = Instant::now();
    tokio::task::spawn_blocking(move || drop(user))
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(1), kept.lost())
        .await
        .unwrap_or_else(|_| panic!("{on}: the loss is not signalled within 1 s"));
    let signalled = shut.elapsed();
    assert_eq!(
        kept.loss_reason(),
        Some(LossReason::RuntimeShutDown),
        "{on}"
    );
    assert_eq!(
        dropped.loss_reason(),
        Some(LossReason::RuntimeShutDown),
        "{on}"
    );

    let (dropped_after, every_after) = let_go(backend, &other, dropped, shared).await;
    println!(
        "{on}: loss signalled {signalled:?} after the shutdown; dropped guard let go after \
         {dropped_after:?}, every dropped guard (a shared one too, but on Redlock) after \
         {every_after:?}"
    );

    let after = client.lock("after", long).await.unwrap();
    let what = format!("{on}: a lock taken afterwards is lost");
    eventually(Duration::from_secs(1), &what, || after.is_lost()).await;
    assert_eq!(
        after.loss_reason(),
        Some(LossReason::RuntimeShutDown),
        "{on}"
    );
    drop(after);

    // The waiter's wake-up hub cannot run: its backoff timer finds the key.
    let options = LockOptions::new(long).wait(Duration::from_secs(10));
    let waiter = tokio::spawn({
        let client = client.clone();
        async move { client.lock_with("busy", options).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(busy.release().await.unwrap());
    let taken = tokio::time::timeout(Duration::from_secs(3), waiter)
        .await
        .unwrap_or_else(|_| panic!("{on}: the waiter never ended"))
        .unwrap()
        .unwrap_or_else(|e| panic!("{on}: the waiter failed: {e}"));
    drop(taken);
    drop(kept);
}

/// Drops `dropped` and `shared`, guards of a client whose runtime shut
/// down, and waits until their keys are let go: how long each took.
async fn let_go(
    backend: &Backend,
    other: &LockClient,
    dropped: LockGuard,
    shared: Option<LockGuard>,
) -> (Duration, Duration) {
    let on = backend.name();
    let released = Instant::now();
    drop(dropped);
    let key = storage_key(PREFIX, "dropped");
    let what = format!("{on}: the dropped guard's key is let go");
    eventually(Duration::from_secs(2), &what, || !backend.holds(&key)).await;
    let dropped_after = released.elapsed();
    if let Some(shared) = shared {
        drop(shared);
        let what = format!("{on}: the dropped shared lock is let go");
        eventually_async(Duration::from_secs(2), &what, || async {
            match other.try_lock("shared", Duration::from_secs(30)).await {
                Ok(Some(guard)) => guard.release().await.unwrap(),
                _ => false,
            }
        })
        .await;
    }
    (dropped_after, released.elapsed())
}

/// Bad input the types let through: a runtime built without its drivers
/// (no `enable_all`). Without a time driver the heartbeat task panics as it
/// starts, and the lock is lost at once, as when the runtime shuts down;
/// with time but no I/O driver, the renewals' connection cannot open (each
/// attempt's task panics), and the lock is lost at its deadline. Neither
/// panic reaches the caller, and neither loss waits past the deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_without_its_drivers_loses_the_locks_it_cannot_renew() {
    let server = RedisServer::start();
    let cases = [
        ("no drivers", false, LossReason::RuntimeShutDown),
        ("time only", true, LossReason::Expired),
    ];
    for (case, time, reason) in cases {
        let mut user = tokio::runtime::Builder::new_multi_thread();
        user.worker_threads(1);
        if time {
            user.enable_time();
        }
        let user = user.build().unwrap();
        let client = client_with(&server, builder().runtime(user.handle().clone())).await;
        let held = client.lock(&format!("drivers:{time}"), TTL).await.unwrap();
        let since = Instant::now();
        let lost = tokio::time::timeout(TTL * 2, held.lost()).await;
        let after = since.elapsed();
        println!("{case}: lost {:?} after {after:?}", held.loss_reason());
        assert!(lost.is_ok(), "{case}: not lost within two ttls");
        assert_eq!(held.loss_reason(), Some(reason), "{case}");
        drop(held);
        tokio::task::spawn_blocking(move || drop(user))
            .await
            .unwrap();
    }
}

/// A lock call of a client on a given runtime, polled once (its `SET` in
/// flight) and kept: the watch over kept acquisitions, which runs on that
/// runtime for this client, gives it up, so that another client has the
/// key well before the kept call's 30 s ttl, and nothing is left held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_call_of_a_client_on_a_given_runtime_leaves_the_key_to_others() {
    let server = RedisServer::start();
    let client = client_with(&server, builder().runtime(Handle::current())).await;
    let other = client_with(&server, builder()).await;
    let sent = Instant::now();
    let mut kept = None;
    for _ in 0..50 {
        let mut call = Box::pin(client.lock("kept-call", Duration::from_secs(30)));
        let pending = std::future::poll_fn(|cx| Poll::Ready(call.as_mut().poll(cx).is_pending()));
        if pending.await {
            kept = Some(call);
            break;
        }
    }
    let kept = kept.expect("the call never stayed in flight");
    let key = storage_key(PREFIX, "kept-call");
    // Its `SET` first: else the other client's may take the key before it.
    eventually(
        Duration::from_secs(1),
        "the kept call takes the key",
        || server.cmd::<i64>(&["EXISTS", &key]) == 1,
    )
    .await;
    let options = LockOptions::new(TTL).wait(Duration::from_secs(5));
    let taken = other
        .lock_with("kept-call", options)
        .await
        .unwrap_or_else(|e| panic!("the kept call kept the key: {e}"));
    let cost = sent.elapsed();
    println!("another client had the key {cost:?} after the kept call");
    assert!(cost < Duration::from_millis(600), "held up for {cost:?}");
    assert!(taken.release().await.unwrap());
    drop(kept);
    eventually(Duration::from_secs(1), "nothing is left held", || {
        server.cmd::<i64>(&["EXISTS", &key]) == 0
    })
    .await;
}
