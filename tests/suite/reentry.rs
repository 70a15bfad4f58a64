//! Re-entry: a task that holds a lock through an annotated body and asks for
//! the same key again, through the same client, gets it at once instead of
//! waiting behind itself; only the outermost body releases. A task it
//! spawns and another client are other owners and wait.
//!
//! Each case runs on the in-memory store and on a `redis-server` of its own;
//! ordering comes from the bodies themselves, time only as upper bounds.

use crate::support::{Backend, Store, client_with, eventually, eventually_async, storage_key};
use lock_core::{
    ErrorKind, LockClient, LockError, LockGuard, LockInfo, LockOptions, current_lock,
    distributed_lock,
};
use lock_testkit::RedisServer;
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio::time::{Instant, timeout};

const PREFIX: &str = "reentry:";

/// The ttl of the guards taken inside bodies: long enough that no renewal
/// falls inside a test.
const TTL: Duration = Duration::from_secs(30);

/// Far under every wait below (3 s, and the clients' 2 s default): a
/// re-entry that queued behind its own lock would take the whole wait.
const AT_ONCE: Duration = Duration::from_secs(1);

/// A generous bound for a loss to be noticed, on a loaded two-core machine.
const BOUND: Duration = Duration::from_secs(5);

/// The stores every case runs on.
fn backends() -> [Backend; 2] {
    [Backend::memory(), Backend::server()]
}

/// A client of `backend` that waits 2 s unless told otherwise.
async fn client(backend: &Backend) -> LockClient {
    let builder = LockClient::builder()
        .key_prefix(PREFIX)
        .default_wait(Duration::from_secs(2));
    client_with(backend, builder).await
}

/// Waits up to a second for `key` to be free: an annotated call sends its
/// release without waiting for the reply, so the key may still be held for
/// a moment after the call returns.
async fn becomes_free(observer: &LockClient, key: &str) {
    let what = format!("{key} free after the calls");
    eventually_async(RELEASED_WITHIN, &what, || is_free(observer, key)).await;
}

/// How long a release sent without waiting for its reply may take to land.
const RELEASED_WITHIN: Duration = Duration::from_secs(1);

/// Whether `key` is free right now: one attempt from another owner.
async fn is_free(observer: &LockClient, key: &str) -> bool {
    match observer.try_lock(key, TTL).await.unwrap() {
        Some(guard) => {
            assert!(guard.release().await.unwrap());
            true
        }
        None => false,
    }
}

/// The lock's commands the server has run: (all, `SET`). Not counted:
/// `INFO` and `PING`, and `CLIENT` subcommands, which every new connection
/// sends (redis-rs names itself with `CLIENT SETINFO`, which Redis 7.2+
/// and Valkey count), the connection that reads this count included.
/// `None` on the in-memory store, which has no such count.
fn commands(backend: &Backend) -> Option<(i64, i64)> {
    let Backend::Server(server) = backend else {
        return None;
    };
    let info: String = server.cmd(&["INFO", "commandstats"]);
    let calls = |line: &str| -> i64 {
        let (_, rest) = line.split_once("calls=").unwrap();
        rest.split(',').next().unwrap().parse().unwrap()
    };
    let (mut all, mut set) = (0, 0);
    for line in info.lines().filter(|line| line.starts_with("cmdstat_")) {
        if ["cmdstat_info:", "cmdstat_ping:", "cmdstat_client|"]
            .iter()
            .any(|housekeeping| line.starts_with(housekeeping))
        {
            continue;
        }
        all += calls(line);
        if line.starts_with("cmdstat_set:") {
            set = calls(line);
        }
    }
    Some((all, set))
}

// ---------------------------------------------------------------------------
// Three annotated calls deep.

#[distributed_lock(key = "account:{id}", client = client, wait = "3s")]
async fn outermost(client: &LockClient, observer: &LockClient, id: u32) -> Result<(), LockError> {
    middle(client, observer, id).await?;
    assert!(
        !is_free(observer, &format!("account:{id}")).await,
        "held after the nested calls returned"
    );
    Ok(())
}

#[distributed_lock(key = "account:{id}", client = client, wait = "3s")]
async fn middle(client: &LockClient, observer: &LockClient, id: u32) -> Result<(), LockError> {
    innermost(client, observer, id).await?;
    assert!(
        !is_free(observer, &format!("account:{id}")).await,
        "held after the innermost call returned"
    );
    Ok(())
}

/// A ttl of its own, which a re-entry does not apply.
#[distributed_lock(key = "account:{id}", client = client, wait = "3s", ttl = "5s")]
async fn innermost(client: &LockClient, observer: &LockClient, id: u32) -> Result<(), LockError> {
    assert!(!is_free(observer, &format!("account:{id}")).await);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nested_calls_re_enter_at_once_and_the_outermost_releases() {
    for backend in backends() {
        let (client, observer) = (client(&backend).await, client(&backend).await);

        let started = Instant::now();
        outermost(&client, &observer, 1)
            .await
            .unwrap_or_else(|e| panic!("{e}\n{}", backend.logs()));
        let took = started.elapsed();
        assert!(took < AT_ONCE, "took {took:?}: a nested call queued");

        let stored = storage_key(PREFIX, "account:1");
        eventually(RELEASED_WITHIN, "account:1 deleted from the store", || {
            !backend.holds(&stored)
        })
        .await;
        becomes_free(&observer, "account:1").await;
        assert_eq!(client.queued_keys(), 0);
        assert_eq!(client.heartbeats_running(), 0);
    }
}

// ---------------------------------------------------------------------------
// current_lock() and fencing in a re-entered body.

#[distributed_lock(key = "ledger:{id}", client = client, fencing = true)]
async fn fenced(client: &LockClient, id: u32) -> Result<(LockInfo, LockInfo), LockError> {
    let outer = current_lock().expect("inside an annotated body");
    assert!(outer.fencing_token().is_some());
    let inner = unfenced(client, id).await?;
    // The inner body's level is gone; the outer one is back.
    assert_eq!(current_lock().as_ref(), Some(&outer));
    Ok((outer, inner))
}

#[distributed_lock(key = "ledger:{id}", client = client)]
async fn unfenced(client: &LockClient, id: u32) -> Result<LockInfo, LockError> {
    Ok(current_lock().expect("inside an annotated body"))
}

#[distributed_lock(key = "ledger:{id}", client = client)]
async fn unfenced_then_fenced(client: &LockClient, id: u32) -> Result<(), LockError> {
    let err = fenced(client, id).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    assert!(err.to_string().contains("fencing"), "{err}");
    let options = LockOptions::new(TTL).fencing(true);
    let err = client.lock_with(&format!("ledger:{id}"), options).await;
    assert_eq!(err.unwrap_err().kind(), ErrorKind::Config);
    // Without fencing asked for, the same body re-enters.
    assert_eq!(unfenced(client, id).await?.fencing_token(), None);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn current_lock_in_a_re_entered_body_describes_the_held_lock() {
    for backend in backends() {
        let client = client(&backend).await;

        let (outer, inner) = fenced(&client, 1).await.unwrap();
        assert_eq!(inner, outer, "same key, same fencing token");
        assert_eq!(inner.key(), "ledger:1");

        // Fencing asked for inside a body that took no token: refused,
        // not a silent `None`.
        let started = Instant::now();
        unfenced_then_fenced(&client, 2).await.unwrap();
        assert!(started.elapsed() < AT_ONCE);
    }
}

// ---------------------------------------------------------------------------
// The guard API inside an annotated body.

#[distributed_lock(key = "cart:{id}", client = client, fencing = true)]
async fn guards_inside(
    client: &LockClient,
    observer: &LockClient,
    backend: &Backend,
    id: u32,
) -> Result<(), LockError> {
    let key = format!("cart:{id}");
    let held = current_lock().expect("inside an annotated body");
    let before = commands(backend);
    if let Some((all, _)) = before {
        assert!(all > 0, "the count saw no command: {before:?}");
    }

    let locked = client.lock(&key, TTL).await?;
    let tried = client.try_lock(&key, TTL).await?.expect("re-entered");
    // A clone is the same client.
    let options = LockOptions::new(Duration::from_secs(1)).fencing(true);
    let with = client.clone().lock_with(&key, options).await?;
    for guard in [&locked, &tried, &with] {
        assert_eq!(guard.key(), key);
        assert_eq!(guard.fencing_token(), held.fencing_token());
        assert!(!guard.is_lost());
        assert!(guard.remaining() > Duration::ZERO);
    }
    let err = with.extend(Duration::from_secs(60)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");

    assert!(locked.release().await?, "still ours");
    drop(tried);
    assert!(with.release().await?);
    // Room for a background release, had the drop spawned one.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let after = commands(backend);
    assert_eq!(
        after, before,
        "(all commands, SET) moved: a re-entry went to Redis"
    );

    assert!(
        !is_free(observer, &key).await,
        "a re-entry's release let go"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guard_api_inside_a_body_re_enters_without_a_command() {
    for backend in backends() {
        let (client, observer) = (client(&backend).await, client(&backend).await);

        let started = Instant::now();
        guards_inside(&client, &observer, &backend, 1)
            .await
            .unwrap_or_else(|e| panic!("{e}\n{}", backend.logs()));
        assert!(started.elapsed() < AT_ONCE + Duration::from_millis(100));
        becomes_free(&observer, "cart:1").await;
    }
}

// ---------------------------------------------------------------------------
// Other owners: a spawned task, another client.

#[distributed_lock(key = "item:{id}", client = client, wait = "300ms")]
async fn briefly(client: LockClient, id: u32) -> Result<(), LockError> {
    Ok(())
}

type Later = JoinHandle<Result<(LockGuard, Instant), LockError>>;

#[distributed_lock(key = "item:{id}", client = client)]
async fn spawns(client: &LockClient, id: u32) -> Result<(Later, Instant), LockError> {
    // This task re-enters within the 300ms wait...
    briefly(client.clone(), id).await?;
    // ...a task it spawns is another owner, and waits all of it.
    let err = tokio::spawn(briefly(client.clone(), id)).await.unwrap();
    assert_eq!(err.unwrap_err().kind(), ErrorKind::Contended);

    let (waiter, key) = (client.clone(), format!("item:{id}"));
    let later = tokio::spawn(async move {
        let options = LockOptions::new(TTL).wait(Duration::from_secs(10));
        let guard = waiter.lock_with(&key, options).await?;
        Ok((guard, Instant::now()))
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!later.is_finished(), "the spawned task got the lock");
    Ok((later, Instant::now()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_spawned_inside_the_body_waits_for_the_outer_release() {
    for backend in backends() {
        let client = client(&backend).await;

        let (later, body_done) = spawns(&client, 1).await.unwrap();
        let (guard, got) = timeout(BOUND, later).await.unwrap().unwrap().unwrap();
        assert!(got >= body_done, "taken before the body returned");
        assert!(guard.release().await.unwrap());
    }
}

#[distributed_lock(key = "item:{id}", client = client)]
async fn with_another_client(
    client: &LockClient,
    other: &LockClient,
    id: u32,
) -> Result<(), LockError> {
    briefly(client.clone(), id).await?;
    let err = briefly(other.clone(), id).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Contended, "{err}");
    assert!(other.try_lock(&format!("item:{id}"), TTL).await?.is_none());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_client_inside_the_body_does_not_re_enter() {
    for backend in backends() {
        let (client, other) = (client(&backend).await, client(&backend).await);

        with_another_client(&client, &other, 2).await.unwrap();
        becomes_free(&other, "item:2").await;
    }
}

// ---------------------------------------------------------------------------
// Loss of the outer lease.

/// Inside a body holding `lease:{id}`: re-enters with a guard and a nested
/// call, takes the lease away, and checks that both see the loss.
async fn watch_loss(client: &LockClient, id: u32, take_away: impl FnOnce()) {
    let key = format!("lease:{id}");
    let guard = client.lock(&key, TTL).await.expect("re-entered");
    assert!(!guard.is_lost());
    take_away();

    // The nested call (on_lost = "abort") is stopped by the shared lease.
    let aborted = timeout(BOUND, waits_forever(client, id)).await;
    let err = aborted
        .expect("the nested body was not aborted")
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Lost, "{err}");
    assert!(guard.is_lost());
    assert_eq!(guard.remaining(), Duration::ZERO);
    timeout(BOUND, guard.lost()).await.unwrap();
    assert!(
        !guard.release().await.unwrap(),
        "a re-entry of a lost lease"
    );

    // Asking again neither waits behind the lost lease nor pretends.
    let started = Instant::now();
    let err = client.lock(&key, TTL).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Lost, "{err}");
    assert!(started.elapsed() < AT_ONCE);
}

#[distributed_lock(key = "lease:{id}", client = client)]
async fn waits_forever(client: &LockClient, id: u32) -> Result<(), LockError> {
    std::future::pending().await
}

#[distributed_lock(key = "lease:{id}", client = client, ttl = "300ms", renew = false, on_lost = "continue")]
async fn left_to_expire(client: &LockClient, id: u32) -> Result<(), LockError> {
    watch_loss(client, id, || {}).await;
    Ok(())
}

#[distributed_lock(key = "lease:{id}", client = client, ttl = "300ms", on_lost = "continue")]
async fn deleted_behind_its_back(
    client: &LockClient,
    server: &RedisServer,
    id: u32,
) -> Result<(), LockError> {
    let storage = storage_key(PREFIX, &format!("lease:{id}"));
    watch_loss(client, id, || {
        assert_eq!(server.cmd::<i64>(&["DEL", &storage]), 1);
    })
    .await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_outer_lease_is_lost_for_the_inner_too() {
    for backend in backends() {
        let client = client(&backend).await;
        left_to_expire(&client, 1).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_deleted_behind_the_holder_is_lost_for_the_inner_too() {
    let backend = Backend::server();
    let client = client(&backend).await;
    let Backend::Server(server) = &backend else {
        unreachable!("a server was started");
    };
    deleted_behind_its_back(&client, server, 1).await.unwrap();
}

// ---------------------------------------------------------------------------
// Lock kinds: exclusive inside shared cannot be granted; several keys
// re-enter when one lock covers them all.

#[distributed_lock(key = "report:{id}", client = client, mode = "shared", wait = "3s")]
async fn read_report(client: &LockClient, id: u32) -> Result<(), LockError> {
    // A nested shared call re-enters; the guard API too.
    read_again(client, id).await?;
    let again = client
        .lock_with(&format!("report:{id}"), LockOptions::new(TTL).shared(true))
        .await?;
    again.release().await?;
    // Exclusive would wait for this very hold to end.
    let started = Instant::now();
    let err = rebuild_report(client, id).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::WouldDeadlock, "{err}");
    assert!(err.to_string().contains("shared"), "{err}");
    let err = client
        .lock_with(&format!("report:{id}"), LockOptions::new(TTL))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::WouldDeadlock, "{err}");
    assert!(started.elapsed() < AT_ONCE, "refused only after waiting");
    Ok(())
}

#[distributed_lock(key = "report:{id}", client = client, mode = "shared", wait = "3s")]
async fn read_again(client: &LockClient, id: u32) -> Result<(), LockError> {
    let _ = client;
    assert_eq!(current_lock().unwrap().key(), format!("report:{id}"));
    Ok(())
}

#[distributed_lock(key = "report:{id}", client = client, wait = "3s")]
async fn rebuild_report(client: &LockClient, id: u32) -> Result<(), LockError> {
    let _ = (client, id);
    Ok(())
}

#[distributed_lock(keys = ["acct:{a}", "acct:{b}"], client = client, wait = "3s")]
async fn transfer(client: &LockClient, a: u32, b: u32) -> Result<(), LockError> {
    // Each key alone, and both again in the other order, re-enter.
    debit(client, b).await?;
    let both = client
        .lock_all(
            &[&format!("acct:{b}"), &format!("acct:{a}")],
            LockOptions::new(TTL),
        )
        .await?;
    both.release().await?;
    // A key this body does not hold, with one it does: some, not all.
    let err = client
        .lock_all(&[&format!("acct:{a}"), "acct:other"], LockOptions::new(TTL))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::WouldDeadlock, "{err}");
    Ok(())
}

#[distributed_lock(key = "acct:{id}", client = client, wait = "3s")]
async fn debit(client: &LockClient, id: u32) -> Result<(), LockError> {
    let _ = client;
    assert_eq!(current_lock().unwrap().key(), format!("acct:{id}"));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_kinds_re_enter_and_exclusive_inside_shared_would_deadlock() {
    for backend in backends() {
        let (client, observer) = (client(&backend).await, client(&backend).await);
        let started = Instant::now();
        read_report(&client, 1)
            .await
            .unwrap_or_else(|e| panic!("{e}\n{}", backend.logs()));
        transfer(&client, 1, 2)
            .await
            .unwrap_or_else(|e| panic!("{e}\n{}", backend.logs()));
        assert!(started.elapsed() < 2 * AT_ONCE, "a nested call queued");
        for key in ["report:1", "acct:1", "acct:2"] {
            becomes_free(&observer, key).await;
        }
    }
}
