//! An export job that the database can afford to run three at a time,
//! whichever replicas start it. `LockOptions::permits(3)` makes the key a
//! semaphore: at most three holders at once, across every client; the
//! others wait for a permit to come free (and hear when one does). A
//! crashed holder's permit comes back when its lease runs out.
//!
//! ```text
//! cargo run --example export                                  # starts a throwaway redis-server
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --example export # or uses yours
//! ```
//!
//! With neither `REDIS_URL` nor a `redis-server` on PATH it runs on the
//! in-memory backend and says so.

use lock_core::{LockClient, LockError, LockOptions};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::time::Instant;

#[path = "support/redis.rs"]
mod redis_for_example;

const PERMITS: u32 = 3;
const JOBS: usize = 8;

static STARTED: OnceLock<Instant> = OnceLock::new();

fn ms() -> f64 {
    STARTED.get_or_init(Instant::now).elapsed().as_secs_f64() * 1e3
}

/// Exports running now in this process, and the most at once.
#[derive(Default)]
struct Running {
    now: AtomicUsize,
    most: AtomicUsize,
}

/// One export: waits for a permit, works, gives the permit back.
async fn export(job: usize, client: LockClient, running: Arc<Running>) -> Result<(), LockError> {
    // Every holder of the key must ask for the same number of permits.
    let options = LockOptions::new(Duration::from_secs(5))
        .wait(Duration::from_secs(30))
        .permits(PERMITS);
    let asked = Instant::now();
    let permit = client.lock_with("export:nightly", options).await?;
    let now = running.now.fetch_add(1, Ordering::SeqCst) + 1;
    running.most.fetch_max(now, Ordering::SeqCst);
    println!(
        "{:>6.1} ms  export {job} starts after waiting {:>5.1} ms ({now} running)",
        ms(),
        asked.elapsed().as_secs_f64() * 1e3
    );
    // The export itself: jobs take different times.
    tokio::time::sleep(Duration::from_millis(60 + 20 * (job as u64 % 3))).await;
    running.now.fetch_sub(1, Ordering::SeqCst);
    println!("{:>6.1} ms  export {job} done", ms());
    permit.release().await?;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let backing = redis_for_example::redis_or_memory()?;
    // Two replicas, each with its own client: the limit holds across both.
    let replicas = [
        backing.builder().key_prefix("export:").build().await?,
        backing.builder().key_prefix("export:").build().await?,
    ];
    let running = Arc::new(Running::default());
    ms();

    let tasks: Vec<_> = (0..JOBS)
        .map(|job| {
            let client = replicas[job % replicas.len()].clone();
            tokio::spawn(export(job, client, running.clone()))
        })
        .collect();
    for task in tasks {
        task.await??;
    }

    let most = running.most.load(Ordering::SeqCst);
    println!();
    println!("{JOBS} exports, at most {most} at once (limit {PERMITS})");
    if most > PERMITS as usize {
        std::process::exit(1);
    }
    Ok(())
}
