//! The guard API, for code that cannot use the attribute: take a lock with a
//! fencing token, stop the work if the lock is lost, extend it, release it.
//!
//! Run: `cargo run --example manual_guard` (uses `REDIS_URL`, or starts a
//! throwaway `redis-server`).

use lock_core::{LockClient, LockOptions};
use std::time::Duration;

#[path = "support/redis.rs"]
mod redis_for_example;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let redis = redis_for_example::redis_url()?;
    let client = LockClient::builder()
        .url(redis.url())
        .key_prefix("example:")
        .build()
        .await?;

    let options = LockOptions::new(Duration::from_secs(2))
        .wait(Duration::from_secs(5))
        .fencing(true);
    let guard = client.lock_with("report:monthly", options).await?;
    println!(
        "holding {:?} with fencing token {:?}; pass the token to the store you write to",
        guard.key(),
        guard.fencing_token()
    );

    // Work that takes longer than the ttl: the heartbeat renews the lease
    // every ttl/3, and `lost()` ends the work if the lease cannot be kept.
    let work = async {
        for step in 1..=3 {
            tokio::time::sleep(Duration::from_millis(900)).await;
            println!("step {step} done");
        }
    };
    tokio::select! {
        () = work => println!("work finished while the lock was held"),
        () = guard.lost() => println!("lock lost: work abandoned"),
    }

    // A second owner cannot get in while we hold it.
    let other = client
        .try_lock("report:monthly", Duration::from_secs(2))
        .await?;
    println!(
        "a second try_lock while held: {}",
        if other.is_some() {
            "granted (bug!)"
        } else {
            "refused"
        }
    );

    guard.extend(Duration::from_secs(10)).await?;
    println!("extended to {:?}", guard.ttl());
    let still_ours = guard.release().await?;
    println!("released; it was still ours: {still_ours}");
    Ok(())
}
