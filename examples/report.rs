//! A report that many readers read at once and one writer rebuilds now and
//! then. Readers take the key shared (`LockOptions::shared(true)`): any
//! number of them hold it together. The writer takes it exclusively: it
//! waits for the readers inside to finish, and once it waits, new readers
//! queue behind it, so a steady stream of readers cannot starve it.
//!
//! ```text
//! cargo run --example report                                  # starts a throwaway redis-server
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --example report # or uses yours
//! ```
//!
//! With neither `REDIS_URL` nor a `redis-server` on PATH it runs on the
//! in-memory backend and says so.

use lock_core::{LockClient, LockError, LockOptions};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::time::Instant;

#[path = "support/redis.rs"]
mod redis_for_example;

const READERS: usize = 5;
const KEY: &str = "report:daily";

/// What readers and the writer share in this process, to show what the
/// lock allowed.
#[derive(Default)]
struct Report {
    /// The report's version: what the writer rebuilds.
    version: AtomicU64,
    /// Readers inside now, and the most at once.
    readers: AtomicUsize,
    most_readers: AtomicUsize,
    /// Readers seen inside while the writer held the key (must stay 0).
    beside_writer: AtomicUsize,
}

static STARTED: OnceLock<Instant> = OnceLock::new();

fn ms() -> f64 {
    STARTED.get_or_init(Instant::now).elapsed().as_secs_f64() * 1e3
}

fn options() -> LockOptions {
    LockOptions::new(Duration::from_secs(5)).wait(Duration::from_secs(10))
}

/// One reader: reads the report over and over, each time under a shared hold.
async fn reader(id: usize, client: LockClient, report: Arc<Report>) -> Result<(), LockError> {
    for _ in 0..6 {
        let guard = client.lock_with(KEY, options().shared(true)).await?;
        let inside = report.readers.fetch_add(1, Ordering::SeqCst) + 1;
        report.most_readers.fetch_max(inside, Ordering::SeqCst);
        let version = report.version.load(Ordering::SeqCst);
        println!(
            "{:>6.1} ms  reader {id} reads version {version} ({inside} readers inside)",
            ms()
        );
        tokio::time::sleep(Duration::from_millis(40)).await;
        report.readers.fetch_sub(1, Ordering::SeqCst);
        guard.release().await?;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}

/// The writer: rebuilds the report twice, each time alone.
async fn writer(client: LockClient, report: Arc<Report>) -> Result<(), LockError> {
    for _ in 0..2 {
        tokio::time::sleep(Duration::from_millis(80)).await;
        let asked = Instant::now();
        let guard = client.lock_with(KEY, options()).await?;
        println!(
            "{:>6.1} ms  writer got the report after waiting {:.1} ms; rebuilding",
            ms(),
            asked.elapsed().as_secs_f64() * 1e3
        );
        for _ in 0..5 {
            // Readers must stay out the whole time.
            report
                .beside_writer
                .fetch_max(report.readers.load(Ordering::SeqCst), Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let version = report.version.fetch_add(1, Ordering::SeqCst) + 1;
        println!("{:>6.1} ms  writer published version {version}", ms());
        guard.release().await?;
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let backing = redis_for_example::redis_or_memory()?;
    let client = backing.builder().key_prefix("report:").build().await?;
    let report = Arc::new(Report::default());
    ms();

    let mut tasks = Vec::new();
    for id in 0..READERS {
        tasks.push(tokio::spawn(reader(id, client.clone(), report.clone())));
    }
    tasks.push(tokio::spawn(writer(client, report.clone())));
    for task in tasks {
        task.await??;
    }

    let most = report.most_readers.load(Ordering::SeqCst);
    let beside = report.beside_writer.load(Ordering::SeqCst);
    println!();
    println!(
        "at most {most} readers read at once; readers inside while the writer held it: {beside}"
    );
    if most < 2 || beside > 0 {
        std::process::exit(1);
    }
    Ok(())
}
