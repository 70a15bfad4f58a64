//! Who waits for whom, in one process: clients that stand for replicas
//! of a service (each its own holder name) run annotated functions that
//! call each other and wait for each other's keys. What a user notices: a
//! cycle of waits fails exactly one of them with `WouldDeadlock` within a
//! second (naming the cycle) while the others complete; a chain without a
//! cycle never fails; operators see the waiters of a key; nothing of a
//! wait stays in Redis once it ended. deadlock_processes.rs runs
//! the same across processes and kills a waiter.
//!
//! The steps are ordered by barriers: every owner holds its first key
//! before any asks for its second, so the cycle closes when the last one
//! starts waiting. Time enters only as upper bounds.

use crate::support::{Backend, Store, client_with, eventually_async, storage_key};
use lock_core::{ErrorKind, LockClient, LockError, LockOptions, distributed_lock};
use lock_testkit::RedisServer;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Barrier;
use tokio::time::Instant;

const PREFIX: &str = "deadlock:";

/// The promised bound: the victim fails within a second of the cycle
/// closing (the detection itself takes 50 to 300 ms).
const DETECTED: Duration = Duration::from_secs(1);

/// Far longer than any test: only a detected cycle ends these waits early.
const LONG_WAIT: Duration = Duration::from_secs(30);

/// How long a finished wait's records may take to go, on a machine that may
/// be busy: half a record's own life (2 s), so a record that only expired
/// could outlast it. They are removed in the background when the wait ends
/// (a few milliseconds), however it ends.
const FORGOTTEN: Duration = Duration::from_secs(1);

/// A replica named `name` on `backend`, waiting up to 30 s by default.
async fn replica(backend: &(impl Store + ?Sized), name: &str) -> LockClient {
    let builder = LockClient::builder()
        .key_prefix(PREFIX)
        .holder_name(name)
        .default_wait(LONG_WAIT)
        .node_timeout(Duration::from_millis(200));
    client_with(backend, builder).await
}

/// Holds `first` (as an annotated body), waits at `barrier` until every
/// owner holds its own first key, then asks for `second` (a nested
/// annotated call) and holds it for `work`.
#[distributed_lock(key = "{first}", client = client)]
async fn hold_then_take(
    client: &LockClient,
    first: &str,
    second: &str,
    barrier: &Barrier,
    work: Duration,
) -> Result<(), LockError> {
    barrier.wait().await;
    take(client, second, work).await
}

#[distributed_lock(key = "{key}", client = client)]
async fn take(client: &LockClient, key: &str, work: Duration) -> Result<(), LockError> {
    tokio::time::sleep(work).await;
    Ok(())
}

/// How one owner's call ended, and when.
struct Outcome {
    name: String,
    result: Result<(), LockError>,
    at: Instant,
}

/// Runs one owner per `(name, first, second)` on `backend`, each holding
/// `first` and then asking for `second`; returns when all ended, with the
/// moment the last of them started waiting (all passed the barrier).
async fn run_owners(
    backend: &(impl Store + Sync + ?Sized),
    owners: &[(&str, &str, &str)],
    work: Duration,
) -> (Vec<Outcome>, Instant) {
    let barrier = Arc::new(Barrier::new(owners.len() + 1));
    let mut tasks = Vec::new();
    for &(name, first, second) in owners {
        let client = replica(backend, name).await;
        let barrier = barrier.clone();
        let (name, first, second) = (name.to_owned(), first.to_owned(), second.to_owned());
        tasks.push(tokio::spawn(async move {
            let result = hold_then_take(&client, &first, &second, &barrier, work).await;
            Outcome {
                name,
                result,
                at: Instant::now(),
            }
        }));
    }
    barrier.wait().await;
    let closed = Instant::now();
    let mut outcomes = Vec::new();
    for task in tasks {
        let outcome = tokio::time::timeout(LONG_WAIT, task)
            .await
            .expect("every owner ends well within its wait")
            .unwrap();
        outcomes.push(outcome);
    }
    (outcomes, closed)
}

/// Exactly one owner failed with `WouldDeadlock`, within [`DETECTED`] of
/// `closed`, its message naming `keys` and every other owner; the others
/// completed. Returns the victim's name and how long detection took.
fn one_victim(outcomes: &[Outcome], closed: Instant, keys: &[&str]) -> (String, Duration) {
    let failed: Vec<&Outcome> = outcomes.iter().filter(|o| o.result.is_err()).collect();
    assert_eq!(
        failed.len(),
        1,
        "exactly one victim: {:?}",
        outcomes
            .iter()
            .map(|o| (&o.name, o.result.as_ref().map_err(ToString::to_string)))
            .collect::<Vec<_>>()
    );
    let victim = failed[0];
    let err = victim.result.as_ref().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::WouldDeadlock, "{err}");
    let message = err.to_string();
    for key in keys {
        assert!(message.contains(&format!("{key:?}")), "{key} in: {message}");
    }
    for other in outcomes {
        assert!(
            message.contains(&other.name),
            "{} in: {message}",
            other.name
        );
    }
    let took = victim.at.saturating_duration_since(closed);
    assert!(
        took < DETECTED,
        "the victim failed {took:?} after the cycle closed"
    );
    (victim.name.clone(), took)
}

/// Two replicas, each holding one key and asking for the other's: the
/// `charge(order 42)` → `debit(account 7)` against `refund(account
/// 7)` → `restore(order 42)`, on each backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_owners_in_a_cycle_one_gives_up_within_a_second() {
    for backend in [
        Backend::memory(),
        Backend::server(),
        Backend::cluster(),
        Backend::redlock(),
    ] {
        let owners = [
            ("replica-1", "order:42", "account:7"),
            ("replica-2", "account:7", "order:42"),
        ];
        let (outcomes, closed) = run_owners(&backend, &owners, Duration::ZERO).await;
        let (victim, took) = one_victim(&outcomes, closed, &["order:42", "account:7"]);
        println!(
            "{}: {victim} gave up {took:?} after the cycle closed",
            backend.name()
        );
        // Nothing of either wait is left: no waiters, no notes.
        for key in ["order:42", "account:7"] {
            no_records(&backend, key).await;
        }
    }
}

/// Three owners in a ring; on one server, on a cluster, where the keys are
/// in different slots, and on Redlock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_owners_in_a_cycle_one_gives_up_within_a_second() {
    for backend in [Backend::server(), Backend::cluster(), Backend::redlock()] {
        let owners = [
            ("replica-1", "a:1", "b:2"),
            ("replica-2", "b:2", "c:3"),
            ("replica-3", "c:3", "a:1"),
        ];
        let (outcomes, closed) = run_owners(&backend, &owners, Duration::ZERO).await;
        let (victim, took) = one_victim(&outcomes, closed, &["a:1", "b:2", "c:3"]);
        println!(
            "{}: {victim} gave up {took:?} after the cycle closed",
            backend.name()
        );
        for key in ["a:1", "b:2", "c:3"] {
            no_records(&backend, key).await;
        }
    }
}

/// A chain that does not come back: the last owner holds its key for a
/// while and asks for a free one; everyone waits and everyone completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_without_a_cycle_never_fails() {
    for backend in [Backend::memory(), Backend::server(), Backend::cluster()] {
        let owners = [
            ("replica-1", "a:1", "b:2"),
            ("replica-2", "b:2", "c:3"),
            ("replica-3", "c:3", "free:4"),
        ];
        // Long enough that the waiters record and walk several times.
        let work = Duration::from_millis(1500);
        let (outcomes, _) = run_owners(&backend, &owners, work).await;
        for outcome in &outcomes {
            assert!(
                outcome.result.is_ok(),
                "{}: {:?}",
                outcome.name,
                outcome.result
            );
        }
    }
}

#[distributed_lock(keys = ["{a}", "{b}"], client = client)]
async fn hold_both_then_take(
    client: &LockClient,
    a: &str,
    b: &str,
    third: &str,
    barrier: &Barrier,
) -> Result<(), LockError> {
    barrier.wait().await;
    take(client, third, Duration::ZERO).await
}

/// A cycle through a holder of several keys (`keys = [..]`): it holds
/// `x:1` and `x:2` and waits for `y:3`, whose holder waits for `x:2`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cycle_through_a_lock_all_holder_is_broken() {
    for backend in [Backend::server(), Backend::memory()] {
        let both = replica(&backend, "replica-all").await;
        let one = replica(&backend, "replica-one").await;
        let barrier = Arc::new(Barrier::new(3));
        let (b1, b2) = (barrier.clone(), barrier.clone());
        let all = tokio::spawn(async move {
            let r = hold_both_then_take(&both, "x:1", "x:2", "y:3", &b1).await;
            (r, Instant::now())
        });
        let single = tokio::spawn(async move {
            let r = hold_then_take(&one, "y:3", "x:2", &b2, Duration::ZERO).await;
            (r, Instant::now())
        });
        barrier.wait().await;
        let closed = Instant::now();
        let (all, single) = (all.await.unwrap(), single.await.unwrap());
        let outcomes = [
            Outcome {
                name: "replica-all".into(),
                result: all.0,
                at: all.1,
            },
            Outcome {
                name: "replica-one".into(),
                result: single.0,
                at: single.1,
            },
        ];
        let (victim, took) = one_victim(&outcomes, closed, &["x:2", "y:3"]);
        println!(
            "{}: {victim} gave up {took:?} after the cycle closed",
            backend.name()
        );
    }
}

/// Operators see who waits: two replicas wait for a key a third holds;
/// `inspect` counts them, names them and says how long each waited; once
/// the waits ended nothing is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_counts_and_names_the_waiters() {
    for backend in [Backend::memory(), Backend::server(), Backend::redlock()] {
        let holder = replica(&backend, "holder").await;
        let guard = holder
            .lock("report", Duration::from_secs(30))
            .await
            .unwrap();
        let mut waits = Vec::new();
        for name in ["waiter-1", "waiter-2"] {
            let client = replica(&backend, name).await;
            waits.push(tokio::spawn(async move {
                client
                    .lock("report", Duration::from_secs(30))
                    .await
                    .map(drop)
            }));
        }
        let what = "two waiters recorded";
        eventually_async(Duration::from_secs(5), what, || async {
            let state = holder.inspect("report").await.unwrap().unwrap();
            state.waiting() == 2
        })
        .await;
        let state = holder.inspect("report").await.unwrap().unwrap();
        let mut names: Vec<&str> = state.waiters().iter().map(|w| w.holder()).collect();
        names.sort_unstable();
        assert_eq!(names, ["waiter-1", "waiter-2"]);
        for waiter in state.waiters() {
            assert!(
                waiter.waited() >= Duration::from_millis(50) && waiter.waited() < LONG_WAIT,
                "{waiter:?}"
            );
        }
        guard.release().await.unwrap();
        for wait in waits {
            wait.await.unwrap().unwrap();
        }
        // Removed in the background, or expired by themselves (records
        // last 2 s): on a loaded machine, or on a Redlock server whose
        // removal came after the majority's, the removal can come later
        // than `FORGOTTEN`. Either way nothing is left.
        no_records_within(&backend, "report", Duration::from_secs(3)).await;
    }
}

/// A wait cut short by its caller (its future dropped) leaves nothing: its
/// record is removed at once, well before it would have expired by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_wait_leaves_no_record() {
    let server = RedisServer::start();
    let holder = replica(&server, "holder").await;
    let waiter = replica(&server, "waiter").await;
    let _guard = holder.lock("job", Duration::from_secs(30)).await.unwrap();
    let wait = tokio::spawn(async move { waiter.lock("job", Duration::from_secs(30)).await });
    let what = "the waiter's wait recorded";
    eventually_async(Duration::from_secs(5), what, || async {
        holder.inspect("job").await.unwrap().unwrap().waiting() == 1
    })
    .await;
    let set = format!("{}:waiters", storage_key(PREFIX, "job"));
    // What the record has left: it is refreshed every second to 2 s, so
    // at least about a second. Gone sooner, it was removed, not expired.
    let left: i64 = server.cmd(&["PTTL", &set]);
    assert!(left > 500, "the record lasts {left} ms");
    let dropped = tokio::time::Instant::now();
    wait.abort();
    assert!(wait.await.unwrap_err().is_cancelled());
    let bound = Duration::from_millis(u64::try_from(left).unwrap() - 200);
    let what = "the dropped waiter's record removed before its expiry";
    eventually_async(bound, what, || async {
        server.cmd::<i64>(&["EXISTS", &set]) == 0
    })
    .await;
    println!(
        "removed {:?} after the drop ({left} ms were left)",
        dropped.elapsed()
    );
    assert_eq!(holder.inspect("job").await.unwrap().unwrap().waiting(), 0);
}

/// A wait that runs out (`Contended`) leaves nothing behind: no waiters
/// set, no wait note beside the key its task holds, and no waiter counted,
/// on each server backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_wait_leaves_no_record() {
    for backend in [Backend::server(), Backend::cluster(), Backend::redlock()] {
        let holder = replica(&backend, "holder").await;
        let waiter = replica(&backend, "waiter").await;
        let held = holder.lock("job", Duration::from_secs(30)).await.unwrap();
        let ran_out = tokio::spawn(async move { gives_up_on(&waiter, "other", "job").await });
        let what = "the waiter's wait recorded";
        eventually_async(Duration::from_secs(5), what, || async {
            holder.inspect("job").await.unwrap().unwrap().waiting() == 1
        })
        .await;
        let err = ran_out.await.unwrap().unwrap_err();
        assert_eq!(
            err.kind(),
            ErrorKind::Contended,
            "{}: {err}",
            backend.name()
        );
        no_records(&backend, "job").await;
        no_records(&backend, "other").await;
        assert_eq!(holder.inspect("job").await.unwrap().unwrap().waiting(), 0);
        held.release().await.unwrap();
    }
}

/// Holds `first` (as an annotated body, so its wait leaves a note beside
/// it) and asks for `second` with a wait of 700 ms.
#[distributed_lock(key = "{first}", client = client)]
async fn gives_up_on(client: &LockClient, first: &str, second: &str) -> Result<(), LockError> {
    let options = LockOptions::new(Duration::from_secs(30)).wait(Duration::from_millis(700));
    client.lock_with(second, options).await?.release().await?;
    Ok(())
}

/// No waiters set and no wait note of `key` is left (eventually: the
/// removal runs in the background).
async fn no_records(backend: &Backend, key: &str) {
    no_records_within(backend, key, FORGOTTEN).await;
}

/// [`no_records`], within `bound`.
async fn no_records_within(backend: &Backend, key: &str, bound: Duration) {
    let storage = storage_key(PREFIX, key);
    let what = format!("no wait records of {key}");
    eventually_async(bound, &what, || async {
        let keys = [format!("{storage}:waiters"), format!("{storage}:waiting")];
        keys.iter().all(|k| !backend.holds(k)) || matches!(backend, Backend::Memory(_))
    })
    .await;
}

/// Holds `first` (as an annotated body), waits at `barrier`, then asks for
/// `x` and `y` at once (`join!`, one task). How the wait for `x` ended,
/// and when, goes to `x_ended` as soon as it ends.
#[distributed_lock(key = "{first}", client = client)]
async fn hold_then_take_both(
    client: &LockClient,
    first: &str,
    x: &str,
    y: &str,
    barrier: &Barrier,
    x_ended: tokio::sync::oneshot::Sender<(Result<(), LockError>, Instant)>,
) -> Result<(), LockError> {
    barrier.wait().await;
    let take_x = async {
        let result = take(client, x, Duration::ZERO).await;
        let _ = x_ended.send((result, Instant::now()));
    };
    // The wait for `y` begins, and is recorded, after the one for `x`
    // (see the test).
    let take_y = async {
        tokio::time::sleep(STAGGER / 4).await;
        take(client, y, Duration::ZERO).await
    };
    let ((), y) = tokio::join!(take_x, take_y);
    y
}

/// Holds `first`, waits at `barrier`, then [`STAGGER`] later asks for
/// `second`.
#[distributed_lock(key = "{first}", client = client)]
async fn hold_then_take_later(
    client: &LockClient,
    first: &str,
    second: &str,
    barrier: &Barrier,
) -> Result<(), LockError> {
    barrier.wait().await;
    tokio::time::sleep(STAGGER).await;
    take(client, second, Duration::ZERO).await
}

/// The gap between the waits of [`a_cycle_through_one_of_two_waits_of_a_task_is_found`].
const STAGGER: Duration = Duration::from_millis(20);

/// A task that waits for two keys at once records both waits. Owner A
/// holds `a` and waits for `x` and `y` together; a third owner holds `y`;
/// B holds `x` and waits for `a`. The cycle A → x → B → a → A goes through
/// one of A's two waits: it is found within [`DETECTED`] every time, and
/// its youngest wait fails. The waits begin in the order that once hid
/// the cycle for a second: A's for `x`, A's for `y`, whose record was
/// written last and replaced the one of A's wait for `x`, then B's (the
/// youngest of the cycle, the one to give up). B followed A to `y` and
/// found no cycle, until A's wait for `x` refreshed its record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cycle_through_one_of_two_waits_of_a_task_is_found() {
    let server = RedisServer::start();
    for round in 0..5 {
        let a = replica(&server, "a").await;
        let b = replica(&server, "b").await;
        let third = replica(&server, "c").await;
        let y_held = third.lock("y", LONG_WAIT).await.unwrap();
        let barrier = Arc::new(Barrier::new(3));
        let (x_ended, mut x_outcome) = tokio::sync::oneshot::channel();
        let owner_a = tokio::spawn({
            let barrier = barrier.clone();
            async move { hold_then_take_both(&a, "a", "x", "y", &barrier, x_ended).await }
        });
        let mut owner_b = tokio::spawn({
            let barrier = barrier.clone();
            async move {
                let result = hold_then_take_later(&b, "x", "a", &barrier).await;
                (result, Instant::now())
            }
        });
        barrier.wait().await;
        let closed = Instant::now();
        // The first wait to end is the victim's: nothing else can end one.
        let first = tokio::time::timeout(LONG_WAIT, async {
            tokio::select! {
                biased;
                ended = &mut owner_b => ("b", ended.unwrap()),
                ended = &mut x_outcome => ("a's wait for x", ended.unwrap()),
            }
        })
        .await
        .expect("the cycle was never broken");
        let (victim, (result, at)) = match first {
            // B giving up frees `x`: A's wait for it can then end, with the
            // key, before B's task has ended. B's outcome is the victim's.
            ("a's wait for x", (Ok(()), _)) => {
                let b = tokio::time::timeout(LONG_WAIT, &mut owner_b).await;
                ("b", b.expect("b never ended").unwrap())
            }
            first => first,
        };
        let took = at - closed;
        eprintln!("round {round}: {victim} gave up {took:?} after the cycle closed");
        let err = result.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::WouldDeadlock, "{victim}: {err}");
        assert!(
            took < DETECTED,
            "round {round}: the cycle was broken {took:?} after it closed"
        );
        y_held.release().await.unwrap();
        // Everyone else ends once the victim gave up.
        let a_result = tokio::time::timeout(LONG_WAIT, owner_a)
            .await
            .unwrap()
            .unwrap();
        if victim == "b" {
            a_result.unwrap();
        } else {
            owner_b.await.unwrap().0.unwrap();
        }
    }
}
