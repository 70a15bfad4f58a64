//! The lock kinds beyond one exclusive key, on every backend that offers
//! them: several keys at once (`lock_all`), shared locks and permits.
//!
//! Each case gets two clients on one backend (`a` and `b`), like two
//! processes of a service. Redlock offers `lock_all` but refuses shared
//! locks and permits, and that refusal is a case of its own.

use crate::support::{Backend, client_with, slow_backoff, spawn_waiting, storage_key};
use lock_core::{ErrorKind, LockClient, LockGuard, LockOptions};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::time::Instant;

const PREFIX: &str = "kinds:";

struct Fixture {
    a: LockClient,
    b: LockClient,
    backend: Backend,
}

impl Fixture {
    async fn on(backend: Backend) -> Fixture {
        let settings = || LockClient::builder().key_prefix(PREFIX);
        Fixture {
            a: client_with(&backend, settings()).await,
            // Another process, whose slow backoff shows whether it hears a
            // release.
            b: client_with(&backend, settings().backoff(slow_backoff())).await,
            backend,
        }
    }
}

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

on_backend!(server:
    lock_all_takes_every_key_or_none,
    opposite_orders_never_deadlock,
    losing_any_key_loses_the_lock,
    each_key_has_its_own_fencing_token,
    a_lock_all_waiter_hears_the_busy_key_released,
    shared_holders_share_and_exclude_exclusive_ones,
    a_waiting_writer_holds_new_readers_back,
    a_crashed_shared_holder_expires_by_itself,
    kinds_that_disagree_are_config_errors,
    at_most_n_permits_are_held_at_once,
    a_crashed_permit_comes_back_at_its_expiry,
    shared_holds_renew_and_report_loss
);
on_backend!(cluster:
    lock_all_takes_every_key_or_none,
    opposite_orders_never_deadlock,
    losing_any_key_loses_the_lock,
    each_key_has_its_own_fencing_token,
    a_lock_all_waiter_hears_the_busy_key_released,
    shared_holders_share_and_exclude_exclusive_ones,
    a_waiting_writer_holds_new_readers_back,
    kinds_that_disagree_are_config_errors,
    at_most_n_permits_are_held_at_once,
    shared_holds_renew_and_report_loss
);
on_backend!(redlock:
    lock_all_takes_every_key_or_none,
    opposite_orders_never_deadlock,
    losing_any_key_loses_the_lock,
    each_key_has_its_own_fencing_token,
    shared_locks_and_permits_are_refused
);
on_backend!(memory:
    lock_all_takes_every_key_or_none,
    opposite_orders_never_deadlock,
    each_key_has_its_own_fencing_token,
    a_lock_all_waiter_hears_the_busy_key_released,
    shared_holders_share_and_exclude_exclusive_ones,
    a_waiting_writer_holds_new_readers_back,
    a_crashed_shared_holder_expires_by_itself,
    kinds_that_disagree_are_config_errors,
    at_most_n_permits_are_held_at_once,
    a_crashed_permit_comes_back_at_its_expiry,
    shared_holds_renew_and_report_loss
);

/// Whether `client` can take `key` exclusively at once (and lets it go).
async fn free(client: &LockClient, key: &str) -> bool {
    match client.try_lock(key, Duration::from_secs(5)).await.unwrap() {
        Some(guard) => {
            guard.release().await.unwrap();
            true
        }
        None => false,
    }
}

/// One attempt with `options`, no wait.
async fn try_with(client: &LockClient, key: &str, options: LockOptions) -> Option<LockGuard> {
    match client.lock_with(key, options.wait(Duration::ZERO)).await {
        Ok(guard) => Some(guard),
        Err(e) if e.kind() == ErrorKind::Contended => None,
        Err(e) => panic!("{e}"),
    }
}

fn shared(ttl_ms: u64) -> LockOptions {
    LockOptions::new(Duration::from_millis(ttl_ms)).shared(true)
}

fn permits(n: u32, ttl_ms: u64) -> LockOptions {
    LockOptions::new(Duration::from_millis(ttl_ms)).permits(n)
}

mod cases {
    use super::*;

    fn opts(ttl_ms: u64) -> LockOptions {
        LockOptions::new(Duration::from_millis(ttl_ms)).wait(Duration::from_secs(30))
    }

    pub async fn lock_all_takes_every_key_or_none(fx: Fixture) {
        let held = fx.b.lock("acct:2", Duration::from_secs(10)).await.unwrap();
        let refused =
            fx.a.lock_all(&["acct:2", "acct:1"], opts(10_000).wait(Duration::ZERO))
                .await
                .unwrap_err();
        assert_eq!(refused.kind(), ErrorKind::Contended, "{refused}");
        // Nothing was left behind on the free key.
        assert!(free(&fx.b, "acct:1").await, "a failed attempt kept acct:1");

        held.release().await.unwrap();
        let both =
            fx.a.lock_all(&["acct:2", "acct:1", "acct:2"], opts(10_000))
                .await
                .unwrap();
        assert_eq!(
            both.keys(),
            ["acct:1", "acct:2"],
            "canonical order, once each"
        );
        for key in ["acct:1", "acct:2"] {
            assert!(!free(&fx.b, key).await, "{key} not held");
        }
        assert!(both.release().await.unwrap());
        for key in ["acct:1", "acct:2"] {
            assert!(free(&fx.b, key).await, "{key} still held after the release");
        }
    }

    pub async fn opposite_orders_never_deadlock(fx: Fixture) {
        let clients = [Arc::new(fx.a), Arc::new(fx.b)];
        let inside = Arc::new([AtomicUsize::new(0), AtomicUsize::new(0)]);
        let most = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for worker in 0..8 {
            let client = clients[worker % 2].clone();
            let (inside, most) = (inside.clone(), most.clone());
            let keys: [&str; 2] = if worker % 4 < 2 {
                ["x", "y"]
            } else {
                ["y", "x"]
            };
            tasks.push(tokio::spawn(async move {
                for _ in 0..10 {
                    let guard = client.lock_all(&keys, opts(5000)).await.unwrap();
                    for count in inside.iter() {
                        most.fetch_max(count.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
                    }
                    tokio::task::yield_now().await;
                    for count in inside.iter() {
                        count.fetch_sub(1, Ordering::SeqCst);
                    }
                    assert!(guard.release().await.unwrap(), "lock expired mid-section");
                }
            }));
        }
        let all = futures::future::join_all(tasks);
        let done = tokio::time::timeout(Duration::from_secs(60), all).await;
        for task in done.expect("opposite orders deadlocked") {
            task.unwrap();
        }
        assert_eq!(
            most.load(Ordering::SeqCst),
            1,
            "two holders of one key at once"
        );
    }

    pub async fn losing_any_key_loses_the_lock(fx: Fixture) {
        let guard = fx.a.lock_all(&["p", "q", "r"], opts(900)).await.unwrap();
        assert!(fx.backend.delete(&storage_key(PREFIX, "q")));
        // Noticed at the next renewal, a third of the ttl on.
        tokio::time::timeout(Duration::from_secs(3), guard.lost())
            .await
            .expect("the loss of one key went unnoticed");
        assert!(guard.is_lost());
        // The keys still ours are released; the lost one is somebody's
        // now, and left alone.
        let taker = fx.b.lock("q", Duration::from_secs(10)).await.unwrap();
        assert!(!guard.release().await.unwrap());
        assert!(free(&fx.a, "p").await && free(&fx.a, "r").await);
        assert!(taker.release().await.unwrap());
    }

    pub async fn each_key_has_its_own_fencing_token(fx: Fixture) {
        let fenced = opts(10_000).fencing(true);
        let first =
            fx.a.lock_all(&["f:1", "f:2"], fenced.clone())
                .await
                .unwrap();
        let one = first.fencing_token_of("f:1").expect("a token for f:1");
        let two = first.fencing_token_of("f:2").expect("a token for f:2");
        assert_eq!(first.fencing_token(), Some(one), "the first key's");
        assert_eq!(first.fencing_token_of("f:3"), None);
        first.release().await.unwrap();
        let next = fx.b.lock_with("f:2", fenced.clone()).await.unwrap();
        assert!(next.fencing_token().unwrap() > two, "tokens grow per key");
        next.release().await.unwrap();
        let again = fx.b.lock_all(&["f:1", "f:2"], fenced).await.unwrap();
        assert!(again.fencing_token_of("f:1").unwrap() > one);
        again.release().await.unwrap();
    }

    pub async fn a_lock_all_waiter_hears_the_busy_key_released(fx: Fixture) {
        let held = fx.a.lock("w:2", Duration::from_secs(10)).await.unwrap();
        let b = fx.b.clone();
        let waiter = spawn_waiting(async move {
            let guard = b.lock_all(&["w:1", "w:2"], opts(10_000)).await.unwrap();
            let got = Instant::now();
            guard.release().await.unwrap();
            got
        })
        .await;
        // The waiter listens for w:2, the key it found held.
        let released = Instant::now();
        held.release().await.unwrap();
        let got = waiter.await.unwrap();
        let lag = got.saturating_duration_since(released);
        assert!(
            lag < slow_backoff().base(),
            "the waiter took {lag:?}: it did not hear the release"
        );
    }

    pub async fn shared_holders_share_and_exclude_exclusive_ones(fx: Fixture) {
        let one = try_with(&fx.a, "doc", shared(10_000))
            .await
            .expect("first reader");
        let two = try_with(&fx.b, "doc", shared(10_000))
            .await
            .expect("second reader");
        assert!(one.is_shared() && two.is_shared());
        assert!(!free(&fx.b, "doc").await, "a writer got in beside readers");
        assert!(one.release().await.unwrap());
        assert!(!free(&fx.b, "doc").await, "a writer got in beside a reader");
        assert!(two.release().await.unwrap());
        let writer = fx.a.lock("doc", Duration::from_secs(10)).await.unwrap();
        assert!(
            try_with(&fx.b, "doc", shared(10_000)).await.is_none(),
            "a reader beside a writer"
        );
        writer.release().await.unwrap();
        assert!(try_with(&fx.b, "doc", shared(10_000)).await.is_some());
    }

    pub async fn a_waiting_writer_holds_new_readers_back(fx: Fixture) {
        let reader = try_with(&fx.a, "log", shared(10_000)).await.unwrap();
        let b = fx.b.clone();
        let writer = spawn_waiting(async move {
            let guard = b.lock_with("log", opts(10_000)).await.unwrap();
            guard.release().await.unwrap();
        })
        .await;
        // Once the writer has tried, new readers wait behind it.
        let mut refused = false;
        let started = Instant::now();
        while !refused {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "readers kept getting in"
            );
            match try_with(&fx.a, "log", shared(10_000)).await {
                Some(guard) => guard.release().await.map(drop).unwrap(),
                None => refused = true,
            }
            tokio::task::yield_now().await;
        }
        reader.release().await.unwrap();
        tokio::time::timeout(Duration::from_secs(10), writer)
            .await
            .expect("the writer never got the lock")
            .unwrap();
        // With no writer waiting any more, readers get in at once.
        let next = try_with(&fx.a, "log", shared(10_000)).await;
        assert!(next.is_some(), "the writer's mark outlived its wait");
    }

    pub async fn a_crashed_shared_holder_expires_by_itself(fx: Fixture) {
        // A reader that stops (no renewal, no release) and one that lives.
        let crashed = try_with(&fx.a, "cfg", shared(400).renew(false))
            .await
            .unwrap();
        std::mem::forget(crashed);
        let live = try_with(&fx.b, "cfg", shared(30_000)).await.unwrap();
        assert!(live.release().await.unwrap());
        // The crashed reader's hold ends at its own expiry, not the live
        // one's (30 s).
        let writer =
            fx.b.lock_with("cfg", opts(10_000).wait(Duration::from_secs(5)))
                .await
                .expect("the crashed reader's hold did not expire");
        writer.release().await.unwrap();
    }

    pub async fn kinds_that_disagree_are_config_errors(fx: Fixture) {
        let reader = try_with(&fx.a, "mix", shared(10_000)).await.unwrap();
        let err = fx.b.lock_with("mix", permits(2, 10_000)).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config, "{err}");
        assert!(err.to_string().contains("shared"), "{err}");
        reader.release().await.unwrap();

        let permit = try_with(&fx.a, "sem", permits(2, 10_000)).await.unwrap();
        let err = fx.b.lock_with("sem", permits(3, 10_000)).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config, "{err}");
        assert!(err.to_string().contains("2 permits"), "{err}");
        permit.release().await.unwrap();

        let err = fx.a.lock_with("sem", permits(0, 10_000)).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config, "{err}");
        let err =
            fx.a.lock_with("sem", shared(10_000).fencing(true))
                .await
                .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config, "{err}");
        let err =
            fx.a.lock_all(&["x", "y"], shared(10_000))
                .await
                .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    }

    pub async fn at_most_n_permits_are_held_at_once(fx: Fixture) {
        let one = try_with(&fx.a, "pool", permits(2, 10_000)).await.unwrap();
        let two = try_with(&fx.b, "pool", permits(2, 10_000)).await.unwrap();
        assert!(
            try_with(&fx.a, "pool", permits(2, 10_000)).await.is_none(),
            "a third permit"
        );
        assert!(
            !free(&fx.a, "pool").await,
            "an exclusive holder beside permits"
        );
        // A waiter gets the permit that frees, and hears of it.
        let b = fx.b.clone();
        let waiter = spawn_waiting(async move {
            let guard = b
                .lock_with("pool", permits(2, 10_000).wait(Duration::from_secs(30)))
                .await
                .unwrap();
            let got = Instant::now();
            guard.release().await.unwrap();
            got
        })
        .await;
        let released = Instant::now();
        assert!(one.release().await.unwrap());
        let lag = waiter.await.unwrap().saturating_duration_since(released);
        assert!(lag < slow_backoff().base(), "the waiter took {lag:?}");
        two.release().await.unwrap();

        // Many holders over time: never more than N at once.
        let clients = [Arc::new(fx.a), Arc::new(fx.b)];
        let inside = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for worker in 0..6 {
            let client = clients[worker % 2].clone();
            let (inside, most) = (inside.clone(), most.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..10 {
                    let opts = permits(3, 5000).wait(Duration::from_secs(30));
                    let guard = client.lock_with("pool3", opts).await.unwrap();
                    most.fetch_max(inside.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    assert!(guard.release().await.unwrap());
                }
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
        let most = most.load(Ordering::SeqCst);
        assert!(
            (1..=3).contains(&most),
            "{most} holders of 3 permits at once"
        );
    }

    pub async fn a_crashed_permit_comes_back_at_its_expiry(fx: Fixture) {
        let crashed = try_with(&fx.a, "one", permits(1, 400).renew(false))
            .await
            .unwrap();
        std::mem::forget(crashed);
        assert!(try_with(&fx.b, "one", permits(1, 10_000)).await.is_none());
        let started = Instant::now();
        let back =
            fx.b.lock_with("one", permits(1, 10_000).wait(Duration::from_secs(5)))
                .await
                .expect("the crashed holder's permit never came back");
        assert!(started.elapsed() < Duration::from_secs(5));
        back.release().await.unwrap();
    }

    pub async fn shared_holds_renew_and_report_loss(fx: Fixture) {
        let reader = try_with(&fx.a, "long", shared(300)).await.unwrap();
        let permit = try_with(&fx.a, "lot", permits(2, 300)).await.unwrap();
        // Renewed past several ttls.
        tokio::time::sleep(Duration::from_millis(1000)).await;
        assert!(!reader.is_lost() && !permit.is_lost(), "not renewed");
        assert!(
            try_with(&fx.b, "lot", permits(2, 300))
                .await
                .is_some_and(|g| {
                    drop(g);
                    true
                })
        );
        // An operator deletes the holder set: the next renewal says so.
        if fx.backend.delete(&storage_key(PREFIX, "long")) {
            tokio::time::timeout(Duration::from_secs(3), reader.lost())
                .await
                .expect("the loss went unnoticed");
        }
        permit.release().await.unwrap();
    }

    pub async fn shared_locks_and_permits_are_refused(fx: Fixture) {
        for options in [shared(10_000), permits(2, 10_000)] {
            let err = fx.a.lock_with("no", options).await.unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Config, "{err}");
            assert!(err.to_string().contains("Redlock"), "{err}");
        }
        assert!(fx.backend.is_empty(), "a refused lock left keys behind");
    }
}

#[tokio::test]
async fn several_keys_collapse_to_one_and_need_at_least_one() {
    let client = LockClient::in_memory();
    let guard = client
        .lock_all(&["same", "same"], LockOptions::new(Duration::from_secs(5)))
        .await
        .unwrap();
    assert_eq!(guard.keys(), ["same"]);
    guard.release().await.unwrap();
    let err = client
        .lock_all(&[], LockOptions::new(Duration::from_secs(5)))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidKey);
}
