//! The kinds of lock `#[distributed_lock]` takes, at run time: several keys
//! at once (`keys = [..]`), shared locks (`mode = "shared"`) and permits
//! (`permits = N`), on the in-memory store.
//!
//! Each test has its own store; the clients on one store stand for
//! replicas of a service. Who is inside a body is told by channels and
//! counters, never by sleeping; time appears only as generous upper bounds.

use lock_core::{LockClient, LockError, MemoryStore, current_lock, distributed_lock};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::timeout;

/// A generous bound for anything that should take milliseconds, on a loaded
/// two-core machine.
const PROMPTLY: Duration = Duration::from_secs(5);

/// A bound for a test of many calls that queue for the same keys.
const MANY_CALLS: Duration = Duration::from_secs(60);

const TTL: Duration = Duration::from_secs(30);

/// `N` clients on one fresh store.
fn replicas<const N: usize>() -> [LockClient; N] {
    let store = MemoryStore::new();
    std::array::from_fn(|_| LockClient::in_memory_on(&store))
}

/// Whether another owner could take `key` exclusively right now.
async fn is_free(observer: &LockClient, key: &str) -> bool {
    match observer.try_lock(key, TTL).await.unwrap() {
        Some(guard) => {
            assert!(guard.release().await.unwrap());
            true
        }
        None => false,
    }
}

/// Waits for `count` bodies to say they are inside, all at the same time
/// (none leaves before the test lets them).
async fn all_inside(entered: &mut mpsc::UnboundedReceiver<()>, count: usize, what: &str) {
    for inside in 0..count {
        timeout(PROMPTLY, entered.recv())
            .await
            .unwrap_or_else(|_| panic!("{what}: only {inside} of {count} bodies ran at once"))
            .expect("a body ended before saying it was inside");
    }
}

/// Awaits every task, within `bound`; each must return `Ok`.
async fn join_all(bound: Duration, tasks: Vec<JoinHandle<Result<(), LockError>>>) {
    for task in tasks {
        timeout(bound, task)
            .await
            .unwrap_or_else(|_| panic!("a task did not finish within {bound:?}"))
            .unwrap()
            .unwrap();
    }
}

// ---------------------------------------------------------------------------
// `keys = [..]`

/// The keys the body runs under, as `current_lock()` gives them; checks
/// from inside that another owner can take none of them. The templates are
/// written `to` first, so the sorted order differs from the written one.
#[distributed_lock(keys = ["account:{to}", "account:{from}"], client = client)]
async fn transfer(
    client: &LockClient,
    observer: &LockClient,
    from: u32,
    to: u32,
) -> Result<Vec<String>, LockError> {
    let lock = current_lock().expect("the body runs under its lock");
    let keys: Vec<String> = lock.keys().map(str::to_owned).collect();
    assert_eq!(lock.key(), keys[0], "`key()` is the first key in order");
    for key in &keys {
        assert!(!is_free(observer, key).await, "`{key}` is held in the body");
    }
    Ok(keys)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_are_held_together_and_seen_sorted() {
    let [client, observer] = replicas();

    let keys = transfer(&client, &observer, 2, 1).await.unwrap();
    assert_eq!(keys, ["account:1", "account:2"]);
    assert!(is_free(&observer, "account:1").await);
    assert!(is_free(&observer, "account:2").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_rendered_twice_are_held_once() {
    let [client, observer] = replicas();

    let keys = transfer(&client, &observer, 7, 7).await.unwrap();
    assert_eq!(keys, ["account:7"]);
    assert!(is_free(&observer, "account:7").await);
}

/// Runs only when it gets both keys at once: the body fails when
/// another body holds either of them meanwhile.
#[distributed_lock(keys = ["pair:{first}", "pair:{second}"], client = client)]
async fn touch_pair(
    client: &LockClient,
    first: u32,
    second: u32,
    inside: &AtomicUsize,
) -> Result<(), LockError> {
    assert_eq!(
        inside.fetch_add(1, Ordering::SeqCst),
        0,
        "two bodies held the same keys at once"
    );
    tokio::task::yield_now().await;
    inside.fetch_sub(1, Ordering::SeqCst);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_named_in_opposite_orders_never_deadlock() {
    let [a, b] = replicas();
    let inside = Arc::new(AtomicUsize::new(0));
    let run = |client: LockClient, first: u32, second: u32| {
        let inside = inside.clone();
        tokio::spawn(async move {
            for _ in 0..50 {
                touch_pair(&client, first, second, &inside).await?;
            }
            Ok(())
        })
    };
    let tasks = vec![run(a, 1, 2), run(b, 2, 1)];
    join_all(MANY_CALLS, tasks).await;
}

/// Each key's fencing token, and the one `fencing_token()` gives.
#[distributed_lock(keys = ["ledger:{b}", "ledger:{a}"], fencing = true, client = client)]
async fn fenced_pair(
    client: &LockClient,
    a: u32,
    b: u32,
) -> Result<(Vec<u64>, Option<u64>), LockError> {
    let lock = current_lock().expect("the body runs under its lock");
    let tokens = lock
        .keys()
        .map(|key| lock.fencing_token_of(key).expect("each key has a token"))
        .collect();
    assert_eq!(lock.fencing_token(), lock.fencing_token_of(lock.key()));
    Ok((tokens, lock.fencing_token()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_with_fencing_give_each_key_its_own_growing_token() {
    let [client] = replicas();

    let (first, first_token) = fenced_pair(&client, 1, 2).await.unwrap();
    let (second, second_token) = fenced_pair(&client, 1, 2).await.unwrap();
    assert_eq!(first.len(), 2);
    assert_eq!(first_token, Some(first[0]));
    assert_eq!(second_token, Some(second[0]));
    for (before, after) in first.iter().zip(&second) {
        assert!(after > before, "tokens grow: {first:?} then {second:?}");
    }
}

// ---------------------------------------------------------------------------
// `mode = "shared"`

/// Says it is inside, then stays until the test lets it go.
#[distributed_lock(key = "catalog", mode = "shared", client = client)]
async fn read_catalog(
    client: &LockClient,
    entered: mpsc::UnboundedSender<()>,
    mut leave: watch::Receiver<bool>,
) -> Result<(), LockError> {
    entered.send(()).unwrap();
    leave.wait_for(|go| *go).await.unwrap();
    Ok(())
}

/// One attempt at a shared lock on the same key.
#[distributed_lock(key = "catalog", mode = "shared", wait = "0s", client = client)]
async fn read_catalog_now(client: &LockClient) -> Result<(), LockError> {
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_calls_run_at_once_and_keep_exclusive_ones_out() {
    let [a, b, observer] = replicas();
    let (entered_tx, mut entered) = mpsc::unbounded_channel();
    let (leave_tx, leave) = watch::channel(false);
    // Two readers through one client and one through another replica.
    let tasks: Vec<_> = [a.clone(), a, b]
        .into_iter()
        .map(|client| {
            let (entered, leave) = (entered_tx.clone(), leave.clone());
            tokio::spawn(async move { read_catalog(&client, entered, leave).await })
        })
        .collect();

    all_inside(&mut entered, 3, "shared locks on one key").await;
    assert!(
        !is_free(&observer, "catalog").await,
        "an exclusive lock waits while shared holders hold the key"
    );
    leave_tx.send(true).unwrap();
    join_all(PROMPTLY, tasks).await;
    assert!(is_free(&observer, "catalog").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_call_is_refused_while_an_exclusive_holder_holds_the_key() {
    let [client, writer] = replicas();

    let guard = writer.lock("catalog", TTL).await.unwrap();
    let err = read_catalog_now(&client).await.unwrap_err();
    assert!(err.is_contended(), "{err:?}");
    guard.release().await.unwrap();
    read_catalog_now(&client).await.unwrap();
}

// ---------------------------------------------------------------------------
// `permits = N`

/// Who is inside a `permits = 2` body, and the most ever at once.
#[derive(Default)]
struct Occupancy {
    inside: AtomicUsize,
    most: AtomicUsize,
}

impl Occupancy {
    fn enter(&self) {
        let now = self.inside.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        assert!(now <= 2, "{now} bodies inside a `permits = 2` lock");
    }

    fn leave(&self) {
        self.inside.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Says it is inside, then stays until the test lets it go.
#[distributed_lock(key = "exports", permits = 2, client = client)]
async fn hold_export(
    client: &LockClient,
    occupancy: &Occupancy,
    entered: mpsc::UnboundedSender<()>,
    mut leave: watch::Receiver<bool>,
) -> Result<(), LockError> {
    occupancy.enter();
    entered.send(()).unwrap();
    leave.wait_for(|go| *go).await.unwrap();
    occupancy.leave();
    Ok(())
}

/// One attempt at a permit of the same key.
#[distributed_lock(key = "exports", permits = 2, wait = "0s", client = client)]
async fn export_now(client: &LockClient, occupancy: &Occupancy) -> Result<(), LockError> {
    occupancy.enter();
    occupancy.leave();
    Ok(())
}

/// A short body that gives the others a chance to run meanwhile.
#[distributed_lock(key = "exports", permits = 2, client = client)]
async fn export(client: &LockClient, occupancy: &Occupancy) -> Result<(), LockError> {
    occupancy.enter();
    for _ in 0..3 {
        tokio::task::yield_now().await;
    }
    occupancy.leave();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_admit_that_many_bodies_and_no_more() {
    let [a, b, c] = replicas();
    let occupancy = Arc::new(Occupancy::default());
    let (entered_tx, mut entered) = mpsc::unbounded_channel();
    let (leave_tx, leave) = watch::channel(false);
    let tasks: Vec<_> = [a, b]
        .into_iter()
        .map(|client| {
            let (occupancy, entered, leave) =
                (occupancy.clone(), entered_tx.clone(), leave.clone());
            tokio::spawn(async move { hold_export(&client, &occupancy, entered, leave).await })
        })
        .collect();

    all_inside(&mut entered, 2, "`permits = 2`").await;
    let err = export_now(&c, &occupancy).await.unwrap_err();
    assert!(err.is_contended(), "a third holder is refused: {err:?}");
    leave_tx.send(true).unwrap();
    join_all(PROMPTLY, tasks).await;
    export_now(&c, &occupancy).await.unwrap();
    assert_eq!(occupancy.most.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_hold_under_many_callers() {
    let clients: [LockClient; 3] = replicas();
    let occupancy = Arc::new(Occupancy::default());
    // Two tasks per client: callers of one process compete too.
    let tasks: Vec<_> = clients
        .iter()
        .chain(&clients)
        .map(|client| {
            let (client, occupancy) = (client.clone(), occupancy.clone());
            tokio::spawn(async move {
                for _ in 0..20 {
                    export(&client, &occupancy).await?;
                }
                Ok(())
            })
        })
        .collect();

    join_all(MANY_CALLS, tasks).await;
    assert!(occupancy.most.load(Ordering::SeqCst) <= 2);
    assert_eq!(occupancy.inside.load(Ordering::SeqCst), 0);
}
