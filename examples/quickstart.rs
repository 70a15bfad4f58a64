//! Several workers charge a few orders at once; `#[distributed_lock]` lets
//! only one of them work on a given order at a time. The table at the end
//! shows every critical section per order and checks that none overlapped.
//!
//! ```text
//! cargo run --example quickstart                                   # starts a throwaway redis-server
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --example quickstart  # or uses yours
//! ```
//!
//! With neither `REDIS_URL` nor a `redis-server` on PATH it runs on the
//! in-memory backend and says so.
//!
//! ```text
//! ```

use lock_core::{LockError, distributed_lock};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;
use tokio::time::Instant;

#[path = "support/redis.rs"]
mod redis_for_example;

const WORKERS: usize = 6;
const ORDERS: u64 = 3;
const ROUNDS: usize = 2;

/// One critical section, as the worker saw it.
struct Section {
    order_id: u64,
    worker: usize,
    start: Duration,
    end: Duration,
}

static SECTIONS: Mutex<Vec<Section>> = Mutex::new(Vec::new());
static STARTED: OnceLock<Instant> = OnceLock::new();

fn since_start() -> Duration {
    STARTED.get_or_init(Instant::now).elapsed()
}

/// Only one worker, in any process, charges a given order at a time.
#[distributed_lock(key = "order:{order_id}", ttl = "5s", wait = "30s")]
async fn charge(order_id: u64, worker: usize) -> Result<(), LockError> {
    let start = since_start();
    // The work: a payment gateway call, say.
    tokio::time::sleep(Duration::from_millis(40)).await;
    let end = since_start();
    SECTIONS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(Section {
            order_id,
            worker,
            start,
            end,
        });
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // REDIS_URL, or a throwaway redis-server, or (with neither) in memory.
    let backing = redis_for_example::redis_or_memory()?;
    let client = backing.builder().key_prefix("quickstart:").build().await?;
    lock_core::set_global_client(client)?;
    since_start();

    let mut workers = Vec::new();
    for worker in 0..WORKERS {
        workers.push(tokio::spawn(async move {
            for round in 0..ROUNDS {
                for i in 0..ORDERS {
                    // Workers start on different orders, so they collide.
                    let order_id = 1 + (i + (worker + round) as u64) % ORDERS;
                    charge(order_id, worker).await?;
                }
            }
            Ok::<(), LockError>(())
        }));
    }
    for worker in workers {
        worker.await??;
    }

    let mut sections = std::mem::take(&mut *SECTIONS.lock().unwrap_or_else(|p| p.into_inner()));
    sections.sort_by_key(|s| (s.order_id, s.start));
    println!();
    println!(
        "{:>6}  {:>6}  {:>9}  {:>9}",
        "order", "worker", "start ms", "end ms"
    );
    let mut overlaps = 0;
    for (i, s) in sections.iter().enumerate() {
        let overlapped =
            i > 0 && sections[i - 1].order_id == s.order_id && sections[i - 1].end > s.start;
        if overlapped {
            overlaps += 1;
        }
        println!(
            "{:>6}  {:>6}  {:>9.1}  {:>9.1}{}",
            s.order_id,
            s.worker,
            s.start.as_secs_f64() * 1e3,
            s.end.as_secs_f64() * 1e3,
            if overlapped { "  <- OVERLAP" } else { "" }
        );
    }
    println!();
    if overlaps > 0 {
        println!("{overlaps} critical sections overlapped on the same order");
        std::process::exit(1);
    }
    println!(
        "{} critical sections by {WORKERS} workers on {ORDERS} orders: \
         no two workers ever held the same order at once",
        sections.len()
    );
    Ok(())
}
