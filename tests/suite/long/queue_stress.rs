//! Randomised interleavings of the in-process queue and its hand-offs: many
//! tasks on a multi-threaded runtime with random short waits, some aborted
//! at random moments, on one key. Fails on any overlap of two holders, and
//! on a key that jams (cannot be taken again once the storm is over).
//!
//! Runs for `QUEUE_STRESS_SECONDS` per backend (default 3).

use crate::support::{Backend, client_with, eventually, storage_key};
use lock_core::{HandoffBudget, LockClient, LockOptions};
use rand::RngExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;
use tokio::time::Instant;

const TASKS: usize = 8;

fn seconds() -> Duration {
    let secs = std::env::var("QUEUE_STRESS_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3.0);
    Duration::from_secs_f64(secs)
}

/// Counts holders inside the critical section; leaves on drop, also when
/// the task is aborted inside it.
struct Inside<'a>(&'a AtomicUsize);

impl<'a> Inside<'a> {
    fn enter(count: &'a AtomicUsize, overlaps: &AtomicU64) -> Inside<'a> {
        if count.fetch_add(1, Ordering::SeqCst) != 0 {
            overlaps.fetch_add(1, Ordering::SeqCst);
        }
        Inside(count)
    }
}

impl Drop for Inside<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

#[derive(Default)]
struct Tally {
    inside: AtomicUsize,
    overlaps: AtomicU64,
    held: AtomicU64,
    contended: AtomicU64,
}

/// One worker: lock with a random short wait, hold for a few yields,
/// release or drop the guard.
async fn worker(client: LockClient, tally: Arc<Tally>, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::Relaxed) {
        let (wait_us, fencing, drop_it, yields) = {
            let mut rng = rand::rng();
            (
                rng.random_range(0..300u64),
                rng.random_bool(0.2),
                rng.random_bool(0.3),
                rng.random_range(0..3),
            )
        };
        let options = LockOptions::new(Duration::from_secs(10))
            .wait(Duration::from_micros(wait_us))
            .fencing(fencing);
        match client.lock_with("k", options).await {
            Ok(guard) => {
                let inside = Inside::enter(&tally.inside, &tally.overlaps);
                for _ in 0..yields {
                    tokio::task::yield_now().await;
                }
                drop(inside);
                tally.held.fetch_add(1, Ordering::Relaxed);
                if drop_it {
                    drop(guard);
                } else {
                    let _ = guard.release().await;
                }
            }
            Err(e) if e.is_contended() => {
                tally.contended.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => panic!("unexpected error: {e}"),
        }
    }
}

async fn storm(client: &LockClient, what: &str) {
    let tally = Arc::new(Tally::default());
    let stop = Arc::new(AtomicBool::new(false));
    let mut workers: Vec<_> = (0..TASKS)
        .map(|_| tokio::spawn(worker(client.clone(), tally.clone(), stop.clone())))
        .collect();
    let until = Instant::now() + seconds();
    let mut aborted = 0;
    while Instant::now() < until {
        let (pause, victim) = {
            let mut rng = rand::rng();
            (rng.random_range(0..2000u64), rng.random_range(0..TASKS))
        };
        tokio::time::sleep(Duration::from_micros(pause)).await;
        // Abort a worker at a random moment and start another in its place.
        workers[victim].abort();
        aborted += 1;
        workers[victim] = tokio::spawn(worker(client.clone(), tally.clone(), stop.clone()));
    }
    stop.store(true, Ordering::Relaxed);
    for worker in workers {
        let _ = tokio::time::timeout(Duration::from_secs(30), worker)
            .await
            .expect("a worker hung");
    }
    let held = tally.held.load(Ordering::Relaxed);
    println!(
        "{what}: {held} holds, {} contended, {aborted} aborted",
        tally.contended.load(Ordering::Relaxed)
    );
    assert_eq!(
        tally.overlaps.load(Ordering::SeqCst),
        0,
        "{what}: holders overlapped"
    );
    assert!(held > 0, "{what}: nobody ever got the lock");
    // No jam: the key can be taken again, and nothing is left in the queue.
    let again = client
        .lock_with(
            "k",
            LockOptions::new(Duration::from_secs(10)).wait(Duration::from_secs(5)),
        )
        .await
        .unwrap_or_else(|e| panic!("{what}: the key jammed: {e}"));
    assert!(again.release().await.unwrap());
    let started = Instant::now();
    while client.queued_keys() != 0 || client.heartbeats_running() != 0 {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{what}: left behind: {} queued keys, {} heartbeats",
            client.queued_keys(),
            client.heartbeats_running()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A client with hand-offs and one without, on the same backend.
async fn storms(backend: &Backend, name: &str) {
    for (budget, what) in [
        (HandoffBudget::default(), "hand-offs"),
        (HandoffBudget::NONE, "turns"),
    ] {
        let client = client_with(backend, LockClient::builder().handoff_budget(budget)).await;
        storm(&client, &format!("{name}, {what}")).await;
    }
}

/// The key of the storms' lock, under the default key prefix.
fn stormed_key() -> String {
    storage_key("lock:", "k")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_never_jams_or_overlaps_in_memory() {
    let backend = Backend::memory();
    storms(&backend, "in-memory").await;
    assert!(!backend.holds(&stormed_key()), "the key is left held");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_never_jams_or_overlaps_on_redis() {
    let backend = Backend::server();
    storms(&backend, "redis").await;
    eventually(Duration::from_secs(5), "the key is let go", || {
        !backend.holds(&stormed_key())
    })
    .await;
}
