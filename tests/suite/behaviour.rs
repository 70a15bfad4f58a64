//! The behaviour users rely on, defined once and run on every backend: a
//! real `redis-server`, a 3-primary Redis Cluster, Redlock over three
//! independent servers, and the in-memory store, so they cannot drift apart.
//!
//! Each case gets two clients on one backend (`a` and `b`), like two
//! processes of a service.

use crate::support::{Backend, client_with, slow_backoff, spawn_waiting};
use lock_core::{ErrorKind, LockClient, LockError, LockOptions};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;
use tokio::time::Instant;

struct Fixture {
    a: LockClient,
    b: LockClient,
    backend: Backend,
}

impl Fixture {
    async fn on(backend: Backend) -> Fixture {
        let settings = || LockClient::builder().key_prefix("behaviour:");
        Fixture {
            a: client_with(&backend, settings()).await,
            // Another process, whose slow backoff shows whether it hears a
            // release.
            b: client_with(&backend, settings().backoff(slow_backoff())).await,
            backend,
        }
    }
}

/// `mod $backend` with one test per case, each on a fresh
/// `Backend::$backend()`.
macro_rules! on_backend {
    ($backend:ident: $($case:ident),*) => {
        mod $backend {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let fixture = super::Fixture::on(super::Backend::$backend()).await;
                    super::cases::$case(fixture).await;
                }
            )*
        }
    };
}

macro_rules! on_every_backend {
    ($($case:ident),* $(,)?) => {
        on_backend!(server: $($case),*);
        on_backend!(cluster: $($case),*);
        on_backend!(redlock: $($case),*);
        on_backend!(memory: $($case),*);
    };
}

on_every_backend!(
    only_one_holder_at_a_time,
    try_lock_on_a_held_key_returns_none,
    the_wait_deadline_is_honoured,
    tasks_of_one_process_get_the_lock_in_arrival_order,
    renewal_keeps_the_lock_for_several_ttls,
    without_renewal_the_lease_expires_and_is_lost,
    release_after_expiry_leaves_the_new_owner_alone,
    fencing_tokens_increase_across_holders,
    extend_sets_a_new_ttl_and_fails_once_lost,
    extend_to_a_shorter_ttl_shortens_the_lease,
    drop_releases_at_once,
    a_waiter_hears_the_release,
    invalid_keys_are_rejected_before_anything_is_stored,
    an_annotated_function_runs_under_the_lock,
    min_hold_keeps_the_lock_after_an_early_release,
    max_hold_ends_the_hold_of_a_runaway_holder,
    holds_out_of_order_are_config_errors,
    a_scheduled_job_runs_once_per_min_hold,
);

#[lock_core::distributed_lock(
    key = "tick:{n}",
    ttl = "5s",
    wait = "0s",
    min_hold = "500ms",
    client = client
)]
async fn scheduled(client: &LockClient, n: u32) -> Result<u32, LockError> {
    Ok(n)
}

#[lock_core::distributed_lock(key = "job:{id}", ttl = "5s", wait = "0s", client = client)]
async fn job(client: &LockClient, id: u32) -> Result<u32, LockError> {
    assert_eq!(
        lock_core::current_lock().unwrap().key(),
        format!("job:{id}")
    );
    Ok(id)
}

mod cases {
    use super::*;

    fn opts(ttl_ms: u64) -> LockOptions {
        LockOptions::new(Duration::from_millis(ttl_ms)).wait(Duration::from_secs(30))
    }

    pub async fn only_one_holder_at_a_time(fx: Fixture) {
        let clients = [Arc::new(fx.a), Arc::new(fx.b)];
        let inside = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let counter = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        for worker in 0..8 {
            let client = clients[worker % 2].clone();
            let (inside, most, counter) = (inside.clone(), most.clone(), counter.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..20 {
                    let guard = client.lock_with("shared", opts(5000)).await.unwrap();
                    most.fetch_max(inside.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
                    // Read, pause, write: updates are lost unless exclusive.
                    // The pause, about a round trip to Redis, gives a second
                    // holder time to get in, should the lock let one in.
                    let value = counter.load(Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    counter.store(value + 1, Ordering::SeqCst);
                    inside.fetch_sub(1, Ordering::SeqCst);
                    assert!(guard.release().await.unwrap(), "lock expired mid-section");
                }
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
        assert_eq!(most.load(Ordering::SeqCst), 1, "two holders at once");
        assert_eq!(counter.load(Ordering::SeqCst), 160, "lost updates");
    }

    pub async fn try_lock_on_a_held_key_returns_none(fx: Fixture) {
        let held = fx.a.lock("k", Duration::from_secs(5)).await.unwrap();
        let ttl = Duration::from_secs(5);
        // Another process, then a task of the holder's own process.
        for client in [&fx.b, &fx.a] {
            let started = Instant::now();
            assert!(client.try_lock("k", ttl).await.unwrap().is_none());
            assert!(
                started.elapsed() < Duration::from_millis(500),
                "one attempt only"
            );
        }
        assert!(held.release().await.unwrap());
        let next = fx.b.try_lock("k", ttl).await.unwrap();
        assert!(next.is_some(), "free after release");
    }

    pub async fn the_wait_deadline_is_honoured(fx: Fixture) {
        let _held = fx.a.lock("k", Duration::from_secs(5)).await.unwrap();
        let wait = Duration::from_millis(300);
        // Another process, then a task of the holder's own process (which
        // waits in its process's line).
        for client in [&fx.b, &fx.a] {
            let started = Instant::now();
            let err = client
                .lock_with("k", LockOptions::new(Duration::from_secs(5)).wait(wait))
                .await
                .unwrap_err();
            let took = started.elapsed();
            assert_eq!(err.kind(), ErrorKind::Contended, "{err}");
            assert_eq!(err.key(), Some("k"));
            assert!(err.waited().unwrap() >= wait, "{err}");
            assert!(took >= wait, "gave up early after {took:?}");
            assert!(
                took < wait + Duration::from_millis(400),
                "overran: {took:?}"
            );
        }
    }

    pub async fn tasks_of_one_process_get_the_lock_in_arrival_order(fx: Fixture) {
        let client = Arc::new(fx.a);
        let held = client.lock("k", Duration::from_secs(10)).await.unwrap();
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for id in 0..5 {
            let client = client.clone();
            let order = order.clone();
            // Each joins the line before the next one is started.
            tasks.push(
                spawn_waiting(async move {
                    let guard = client.lock_with("k", opts(10_000)).await.unwrap();
                    order.lock().unwrap().push(id);
                    guard.release().await.unwrap();
                })
                .await,
            );
        }
        // The holder releases and immediately wants the key again: it goes
        // to the back of the line instead of barging in.
        assert!(held.release().await.unwrap());
        let again = client.lock_with("k", opts(10_000)).await.unwrap();
        assert_eq!(*order.lock().unwrap(), vec![0, 1, 2, 3, 4]);
        again.release().await.unwrap();
        for task in tasks {
            task.await.unwrap();
        }
    }

    pub async fn renewal_keeps_the_lock_for_several_ttls(fx: Fixture) {
        // Renewed every 200 ms: a stall of the loaded machine shorter than
        // 400 ms costs nothing.
        let ttl = Duration::from_millis(600);
        let guard = fx.a.lock("k", ttl).await.unwrap();
        let until = Instant::now() + ttl * 4;
        while Instant::now() < until {
            assert!(fx.b.try_lock("k", ttl).await.unwrap().is_none(), "expired");
            assert!(!guard.is_lost());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(guard.release().await.unwrap());
    }

    pub async fn without_renewal_the_lease_expires_and_is_lost(fx: Fixture) {
        let ttl = Duration::from_millis(400);
        let guard =
            fx.a.lock_with("k", LockOptions::new(ttl).renew(false))
                .await
                .unwrap();
        assert_eq!(fx.a.heartbeats_running(), 0, "nothing renews it");
        let started = Instant::now();
        tokio::time::timeout(ttl * 3, guard.lost())
            .await
            .expect("loss not signalled");
        assert!(guard.is_lost());
        assert_eq!(guard.remaining(), Duration::ZERO);
        // The holder stops trusting the lease a little before the store
        // expires it (the clock drift allowance): the next owner gets in
        // right after that (here a task of the same process, which the
        // lost guard no longer holds back).
        let next =
            fx.a.lock_with("k", LockOptions::new(ttl).wait(Duration::from_secs(2)))
                .await;
        assert!(next.is_ok(), "the key did not expire: {:?}", next.err());
        assert!(started.elapsed() < ttl * 2, "{:?}", started.elapsed());
    }

    pub async fn release_after_expiry_leaves_the_new_owner_alone(fx: Fixture) {
        let first =
            fx.a.lock_with(
                "k",
                LockOptions::new(Duration::from_millis(100)).renew(false),
            )
            .await
            .unwrap();
        first.lost().await;
        let second = fx.b.lock_with("k", opts(5000)).await.unwrap();
        assert!(!first.release().await.unwrap(), "it was no longer ours");
        assert!(
            fx.a.try_lock("k", Duration::from_secs(5))
                .await
                .unwrap()
                .is_none(),
            "the new owner's lock was released"
        );
        assert!(second.release().await.unwrap());
    }

    pub async fn fencing_tokens_increase_across_holders(fx: Fixture) {
        let clients = [Arc::new(fx.a), Arc::new(fx.b)];
        // In the order the holders got the lock: each pushes while it
        // holds it.
        let tokens = Arc::new(tokio::sync::Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for worker in 0..8 {
            let client = clients[worker % 2].clone();
            let tokens = tokens.clone();
            tasks.push(tokio::spawn(async move {
                for _ in 0..10 {
                    let guard = client
                        .lock_with("fenced", opts(5000).fencing(true))
                        .await
                        .unwrap();
                    tokens.lock().await.push(guard.fencing_token().unwrap());
                    guard.release().await.unwrap();
                }
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
        let tokens = tokens.lock().await;
        assert_eq!(tokens.len(), 80);
        let mut last = 0;
        for &token in tokens.iter() {
            assert!(token > last, "{token} after {last}: {tokens:?}");
            last = token;
        }
        let plain = clients[0]
            .lock("fenced", Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(plain.fencing_token(), None, "fencing was not asked for");
    }

    pub async fn extend_sets_a_new_ttl_and_fails_once_lost(fx: Fixture) {
        let guard =
            fx.a.lock_with(
                "k",
                LockOptions::new(Duration::from_millis(200)).renew(false),
            )
            .await
            .unwrap();
        guard.extend(Duration::from_secs(30)).await.unwrap();
        assert_eq!(guard.ttl(), Duration::from_secs(30));
        // Past the first ttl, still ours thanks to the extension.
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert!(!guard.is_lost());
        assert!(
            fx.b.try_lock("k", Duration::from_secs(1))
                .await
                .unwrap()
                .is_none()
        );
        assert!(guard.release().await.unwrap());

        let short =
            fx.a.lock_with(
                "k2",
                LockOptions::new(Duration::from_millis(100)).renew(false),
            )
            .await
            .unwrap();
        short.lost().await;
        let err = short.extend(Duration::from_secs(5)).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Lost);
    }

    pub async fn extend_to_a_shorter_ttl_shortens_the_lease(fx: Fixture) {
        let guard =
            fx.a.lock_with("k", LockOptions::new(Duration::from_secs(5)).renew(false))
                .await
                .unwrap();
        let started = Instant::now();
        guard.extend(Duration::from_millis(300)).await.unwrap();
        assert_eq!(guard.ttl(), Duration::from_millis(300));
        tokio::time::timeout(Duration::from_secs(2), guard.lost())
            .await
            .expect("the shortened lease was not lost after its ttl");
        // The store expired it too, long before the first 5 s: `a`, whose
        // backoff is short, gets in without a release message.
        let next =
            fx.a.lock_with("k", opts(5000).wait(Duration::from_secs(3)))
                .await;
        assert!(
            next.is_ok(),
            "the lease was not shortened: {:?}",
            next.err()
        );
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
    }

    pub async fn drop_releases_at_once(fx: Fixture) {
        let guard = fx.a.lock("k", Duration::from_secs(30)).await.unwrap();
        drop(guard);
        // Long before the 30 s ttl.
        let got =
            fx.b.lock_with(
                "k",
                LockOptions::new(Duration::from_secs(5)).wait(Duration::from_secs(3)),
            )
            .await;
        assert!(got.is_ok(), "{:?}", got.err());
    }

    pub async fn a_waiter_hears_the_release(fx: Fixture) {
        let held = fx.a.lock("k", Duration::from_secs(10)).await.unwrap();
        let b = fx.b.clone();
        // Its first attempts, up to where it waits.
        let waiter = spawn_waiting(async move {
            let got = b.lock_with("k", opts(10_000)).await;
            (got, Instant::now())
        })
        .await;
        // Its backoff is 5 s: only hearing the release gets it in quickly.
        let released_at = Instant::now();
        assert!(held.release().await.unwrap());
        let (got, at) = tokio::time::timeout(Duration::from_secs(4), waiter)
            .await
            .expect("the waiter slept through the release")
            .unwrap();
        got.unwrap().release().await.unwrap();
        assert!(
            at - released_at < Duration::from_millis(500),
            "{:?}",
            at - released_at
        );
    }

    pub async fn invalid_keys_are_rejected_before_anything_is_stored(fx: Fixture) {
        let err = fx.a.lock("", Duration::from_secs(1)).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidKey);
        let long = "x".repeat(2000);
        let err = fx.a.lock(&long, Duration::from_secs(1)).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidKey);
        let err = fx.a.lock("k", Duration::ZERO).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config);
        assert!(fx.backend.is_empty(), "a refused lock was stored");
    }

    pub async fn an_annotated_function_runs_under_the_lock(fx: Fixture) {
        assert_eq!(job(&fx.a, 7).await.unwrap(), 7);
        let held = fx.b.lock("job:7", Duration::from_secs(5)).await.unwrap();
        let err = job(&fx.a, 7).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Contended);
        held.release().await.unwrap();
        assert_eq!(job(&fx.a, 7).await.unwrap(), 7);
    }

    pub async fn min_hold_keeps_the_lock_after_an_early_release(fx: Fixture) {
        let min_hold = Duration::from_millis(600);
        let started = Instant::now();
        let guard =
            fx.a.lock_with("tick", opts(5000).min_hold(min_hold))
                .await
                .unwrap();
        assert!(guard.release().await.unwrap(), "it was ours");
        assert!(
            fx.b.try_lock("tick", Duration::from_secs(5))
                .await
                .unwrap()
                .is_none(),
            "released before its min_hold"
        );
        // `a`, whose backoff is short: the lease expires without a release
        // message.
        let next =
            fx.a.lock_with("tick", opts(5000).wait(Duration::from_secs(3)))
                .await
                .unwrap();
        let took = started.elapsed();
        assert!(took >= min_hold - Duration::from_millis(20), "{took:?}");
        assert!(took < min_hold + Duration::from_millis(700), "{took:?}");
        next.release().await.unwrap();
    }

    pub async fn max_hold_ends_the_hold_of_a_runaway_holder(fx: Fixture) {
        let max_hold = Duration::from_millis(600);
        let started = Instant::now();
        let guard =
            fx.a.lock_with("runaway", opts(400).max_hold(max_hold))
                .await
                .unwrap();
        tokio::time::timeout(Duration::from_secs(3), guard.lost())
            .await
            .expect("max_hold did not end the hold");
        let took = started.elapsed();
        assert!(took >= max_hold - Duration::from_millis(20), "{took:?}");
        assert!(took < max_hold + Duration::from_millis(300), "{took:?}");
        // Renewal stopped: the lease runs out within a ttl, although the
        // guard is still alive.
        let next =
            fx.b.lock_with("runaway", opts(400).wait(Duration::from_secs(3)))
                .await;
        assert!(next.is_ok(), "{:?}", next.err());
        drop(guard);
    }

    pub async fn holds_out_of_order_are_config_errors(fx: Fixture) {
        let ttl = Duration::from_secs(10);
        let err =
            fx.a.lock_with("k", LockOptions::new(ttl).max_hold(Duration::from_secs(5)))
                .await
                .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config, "{err}");
        let err =
            fx.a.lock_with(
                "k",
                LockOptions::new(ttl)
                    .min_hold(Duration::from_secs(60))
                    .max_hold(Duration::from_secs(30)),
            )
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    }

    pub async fn a_scheduled_job_runs_once_per_min_hold(fx: Fixture) {
        let started = Instant::now();
        assert_eq!(scheduled(&fx.a, 1).await.unwrap(), 1);
        // Another replica, the same tick, right after the first finished.
        let err = scheduled(&fx.b, 1).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Contended);
        // Once min_hold is over, the tick can run again.
        loop {
            match scheduled(&fx.b, 1).await {
                Ok(_) => break,
                Err(e) => assert_eq!(e.kind(), ErrorKind::Contended),
            }
            assert!(started.elapsed() < Duration::from_secs(3), "never freed");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(
            started.elapsed() >= Duration::from_millis(480),
            "{:?}",
            started.elapsed()
        );
    }
}
