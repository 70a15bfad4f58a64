//! Money transfers between accounts. A transfer reads two balances and
//! writes them back, so it must hold both accounts at once: `lock_all`
//! takes every key or none, in one sorted order whatever order the caller
//! names them in. Two replicas moving money in opposite directions between
//! the same two accounts therefore never deadlock (each waits for the whole
//! pair, never holding one account while waiting for the other), and a
//! transfer between two other accounts runs beside them.
//!
//! ```text
//! cargo run --example transfer                                  # starts a throwaway redis-server
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --example transfer # or uses yours
//! ```
//!
//! With neither `REDIS_URL` nor a `redis-server` on PATH it runs on the
//! in-memory backend and says so.

use lock_core::{LockClient, LockError, LockOptions};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;
use tokio::time::Instant;

#[path = "support/redis.rs"]
mod redis_for_example;

/// The balances, as a database beside Redis keeps them: read and written
/// separately, so two transfers on one account at once would lose money.
type Ledger = Arc<Mutex<HashMap<&'static str, i64>>>;

/// The balances now (a poisoned mutex only means a panic elsewhere).
fn book(ledger: &Ledger) -> MutexGuard<'_, HashMap<&'static str, i64>> {
    ledger.lock().unwrap_or_else(|p| p.into_inner())
}

static STARTED: OnceLock<Instant> = OnceLock::new();

fn ms() -> f64 {
    STARTED.get_or_init(Instant::now).elapsed().as_secs_f64() * 1e3
}

/// Moves `amount` from one account to another, holding both.
async fn transfer(
    who: &str,
    client: &LockClient,
    ledger: &Ledger,
    (from, to): (&'static str, &'static str),
    amount: i64,
) -> Result<(), LockError> {
    let (from_key, to_key) = (format!("account:{from}"), format!("account:{to}"));
    let options = LockOptions::new(Duration::from_secs(5))
        .wait(Duration::from_secs(10))
        .fencing(true);
    // Both accounts, or (until one is free to take with the other) neither.
    let guard = client.lock_all(&[&from_key, &to_key], options).await?;
    let start = ms();
    let (from_balance, to_balance) = {
        let balances = book(ledger);
        (balances[from], balances[to])
    };
    // The work between the read and the write: a call to a fraud check, say.
    tokio::time::sleep(Duration::from_millis(30)).await;
    book(ledger).insert(from, from_balance - amount);
    book(ledger).insert(to, to_balance + amount);
    // Each account has its own fencing token, for the database to check.
    println!(
        "{start:>6.1}-{:>6.1} ms  {who}: {from:>5} -> {to:<5} {amount:>3}  held {:?}, tokens {:?} / {:?}",
        ms(),
        guard.keys(),
        guard.fencing_token_of(&from_key),
        guard.fencing_token_of(&to_key),
    );
    guard.release().await?;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let backing = redis_for_example::redis_or_memory()?;
    // Two replicas of the payment service, each with its own client.
    let east = backing.builder().key_prefix("transfer:").build().await?;
    let west = backing.builder().key_prefix("transfer:").build().await?;
    let ledger: Ledger = Arc::new(Mutex::new(HashMap::from([
        ("alice", 100),
        ("bob", 100),
        ("carol", 100),
        ("dave", 100),
    ])));
    ms();

    // East pays alice -> bob while west pays bob -> alice: opposite orders
    // on the same two accounts. A third flow, carol -> dave, shares no
    // account with them and overlaps them in time.
    let flows = [
        ("east", east.clone(), ("alice", "bob"), 10),
        ("west", west, ("bob", "alice"), 7),
        ("east", east, ("carol", "dave"), 5),
    ];
    let mut tasks = Vec::new();
    for (who, client, accounts, amount) in flows {
        let ledger = ledger.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..4 {
                transfer(who, &client, &ledger, accounts, amount).await?;
            }
            Ok::<(), LockError>(())
        }));
    }
    // A deadlock would hang here; the timeout turns it into an error.
    let all = futures::future::try_join_all(tasks);
    for result in tokio::time::timeout(Duration::from_secs(30), all).await?? {
        result?;
    }

    let balances = book(&ledger).clone();
    let mut names: Vec<_> = balances.keys().copied().collect();
    names.sort_unstable();
    println!();
    for name in names {
        println!("{name:>6}: {}", balances[name]);
    }
    // 4 × 10 out and 4 × 7 in for alice; 4 × 5 from carol to dave.
    let expected = [("alice", 88), ("bob", 112), ("carol", 80), ("dave", 120)];
    if expected.iter().any(|&(name, want)| balances[name] != want) {
        println!("a transfer was lost: expected {expected:?}");
        std::process::exit(1);
    }
    println!("every transfer counted once, and opposite orders did not deadlock");
    Ok(())
}
