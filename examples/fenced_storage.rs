//! Fencing tokens end to end: a service takes a fenced lock with
//! `#[distributed_lock(.., fencing = true)]` and passes the token from
//! `lock_core::current_lock()` to its storage, and the storage refuses a
//! read or a write whose token is below the highest it has seen.
//!
//! Two replicas of the service deposit into one account. In the first run
//! they do it at once and the lock puts them one after the other. In the
//! second, replica A stops dead between reading the balance and writing it
//! back (its whole runtime frozen, as in a long GC pause or a suspended
//! VM) for longer than the lock's ttl. Replica B gets the lock meanwhile
//! and deposits. When A wakes up it writes the balance it computed from
//! its stale read, and the storage refuses it: B's token is higher.
//!
//! ```text
//! cargo run --example fenced_storage                                   # starts a throwaway redis-server
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --example fenced_storage  # or uses yours
//! ```
//!
//! With neither `REDIS_URL` nor a `redis-server` on PATH it runs on the
//! in-memory backend, with an in-memory storage that keeps the same rule.

use lock_core::{LockClient, LockClientBuilder, LockError, current_lock, distributed_lock};
use redis::Script;
use std::collections::HashMap;
use std::fmt;
use std::sync::mpsc;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::Duration;

#[path = "support/redis.rs"]
mod redis_for_example;

const ACCOUNT: &str = "alice";

type BoxError = Box<dyn std::error::Error + Send + Sync>;

// ---------------------------------------------------------------------------
// The storage: a balance per account, and the highest fencing token it has
// seen for that account (its fence).
// ---------------------------------------------------------------------------

/// Lua, the check both scripts start with: refuse a token below the fence,
/// otherwise raise the fence to it. `KEYS[1]` is the account's hash,
/// `ARGV[1]` the caller's token. The fence is stored and returned as the
/// caller's string: Lua would print a large number as `1.7e+15`.
macro_rules! fence_check {
    () => {
        r#"local fence = redis.call("HGET", KEYS[1], "fence")
if fence and tonumber(ARGV[1]) < tonumber(fence) then
  return {0, fence}
end
redis.call("HSET", KEYS[1], "fence", ARGV[1])
"#
    };
}

/// A fenced read. Reads are fenced too: with writes alone checked, the
/// holders of tokens 1 and 2 could both read the same balance, then write
/// with 1 and with 2 in that order; both writes would pass, and the deposit
/// made with 1 would be lost.
static READ: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        fence_check!(),
        r#"return {1, redis.call("HGET", KEYS[1], "balance") or "0"}"#
    ))
});

/// A fenced conditional update: `ARGV[2]` is the new balance.
static WRITE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        fence_check!(),
        r#"redis.call("HSET", KEYS[1], "balance", ARGV[2])
return {1, ARGV[2]}"#
    ))
});

/// An account in the in-memory storage.
#[derive(Clone, Copy, Debug, Default)]
struct Account {
    balance: i64,
    fence: u64,
}

/// Where the storage lives; each replica opens its own connection.
#[derive(Clone)]
enum StorageAt {
    Redis(String),
    Memory(Arc<Mutex<HashMap<String, Account>>>),
}

impl StorageAt {
    async fn open(&self) -> Result<Storage, StorageError> {
        Ok(match self {
            StorageAt::Redis(url) => {
                let client = redis::Client::open(url.as_str())?;
                Storage::Redis(client.get_multiplexed_async_connection().await?)
            }
            StorageAt::Memory(accounts) => Storage::Memory(accounts.clone()),
        })
    }
}

/// A replica's handle on the storage.
enum Storage {
    /// A hash per account: `balance` and `fence`.
    Redis(redis::aio::MultiplexedConnection),
    /// The same rule, in this process.
    Memory(Arc<Mutex<HashMap<String, Account>>>),
}

#[derive(Debug)]
enum StorageError {
    /// The caller's token is below the storage's fence: a newer holder has
    /// been here, so this caller's lock is gone.
    Stale {
        token: u64,
        fence: u64,
    },
    Redis(redis::RedisError),
}

impl From<redis::RedisError> for StorageError {
    fn from(e: redis::RedisError) -> Self {
        StorageError::Redis(e)
    }
}

impl Storage {
    /// The balance, if `token` is not below the fence (which it raises).
    async fn read(&self, account: &str, token: u64) -> Result<i64, StorageError> {
        self.fenced(&READ, account, token, None).await
    }

    /// Sets the balance, if `token` is not below the fence (which it raises).
    async fn write(&self, account: &str, token: u64, balance: i64) -> Result<(), StorageError> {
        self.fenced(&WRITE, account, token, Some(balance))
            .await
            .map(drop)
    }

    async fn fenced(
        &self,
        script: &Script,
        account: &str,
        token: u64,
        balance: Option<i64>,
    ) -> Result<i64, StorageError> {
        match self {
            Storage::Redis(connection) => {
                let mut connection = connection.clone();
                let (done, value): (i64, String) = script
                    .key(format!("fenced-storage:account:{account}"))
                    .arg(token)
                    .arg(balance.unwrap_or(0))
                    .invoke_async(&mut connection)
                    .await?;
                match done {
                    1 => Ok(value.parse().unwrap_or(0)),
                    _ => Err(StorageError::Stale {
                        token,
                        fence: value.parse().unwrap_or(0),
                    }),
                }
            }
            Storage::Memory(accounts) => {
                let mut accounts = accounts.lock().unwrap_or_else(PoisonError::into_inner);
                let entry = accounts.entry(account.to_owned()).or_default();
                if token < entry.fence {
                    return Err(StorageError::Stale {
                        token,
                        fence: entry.fence,
                    });
                }
                entry.fence = token;
                if let Some(balance) = balance {
                    entry.balance = balance;
                }
                Ok(entry.balance)
            }
        }
    }
}

// ---------------------------------------------------------------------------
// The service.
// ---------------------------------------------------------------------------

#[derive(Debug)]
enum ServiceError {
    Lock(LockError),
    Storage(StorageError),
    /// Taken with `fencing = true`, the lock always has a token.
    NoToken,
}

impl From<LockError> for ServiceError {
    fn from(e: LockError) -> Self {
        ServiceError::Lock(e)
    }
}

impl From<StorageError> for ServiceError {
    fn from(e: StorageError) -> Self {
        ServiceError::Storage(e)
    }
}

impl std::error::Error for ServiceError {}

impl fmt::Display for ServiceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ServiceError::Lock(e) => write!(f, "{e}"),
            ServiceError::Storage(StorageError::Stale { token, fence }) => write!(
                f,
                "refused by the storage: token {token} is below its fence {fence}"
            ),
            ServiceError::Storage(StorageError::Redis(e)) => write!(f, "storage: {e}"),
            ServiceError::NoToken => write!(f, "the lock has no fencing token"),
        }
    }
}

/// One replica of the service.
struct Replica {
    name: &'static str,
    locks: LockClient,
    storage: Storage,
    /// Only for this demonstration: where replica A stops dead.
    pause: Option<Pause>,
}

impl Replica {
    /// Adds `amount` to the account's balance: read, add, write, under the
    /// lock, with the lock's fencing token on both storage calls.
    ///
    /// `on_lost = "continue"`: whether a late write lands is for the
    /// storage's fence to decide. With the default, `"abort"`, the body is
    /// dropped at its next `.await` once the loss is known; that stops most
    /// late work, but not a write already on its way, nor one made by a
    /// process that has not yet noticed. The fence stops those.
    #[distributed_lock(
        key = "account:{account}",
        ttl = "1s",
        wait = "10s",
        fencing = true,
        on_lost = "continue",
        client = self.locks
    )]
    async fn deposit(&self, account: &str, amount: i64) -> Result<(i64, u64), ServiceError> {
        let token = current_lock()
            .and_then(|lock| lock.fencing_token())
            .ok_or(ServiceError::NoToken)?;
        let balance = self.storage.read(account, token).await?;
        if let Some(pause) = &self.pause {
            pause.stop_dead(self.name, balance, token);
        }
        self.storage.write(account, token, balance + amount).await?;
        Ok((balance + amount, token))
    }
}

/// A stop-the-world pause: blocks the replica's thread, and with it its
/// whole runtime (the lock's renewal included), until told to go on.
struct Pause {
    paused: mpsc::Sender<()>,
    go_on: Mutex<mpsc::Receiver<()>>,
}

impl Pause {
    /// The longest a pause lasts if nobody says go on.
    const BOUND: Duration = Duration::from_secs(20);

    fn stop_dead(&self, name: &str, balance: i64, token: u64) {
        println!("  replica {name}: read balance {balance} with token {token}, then stops dead");
        let _ = self.paused.send(());
        let go_on = self.go_on.lock().unwrap_or_else(PoisonError::into_inner);
        let _ = go_on.recv_timeout(Self::BOUND);
        println!("  replica {name}: wakes up and writes what it computed from {balance}");
    }
}

async fn replica(
    name: &'static str,
    locks: &LockClientBuilder,
    storage: &StorageAt,
    pause: Option<Pause>,
) -> Result<Replica, BoxError> {
    Ok(Replica {
        name,
        locks: locks.clone().key_prefix("fenced-storage:").build().await?,
        storage: storage.open().await.map_err(|e| format!("{e:?}"))?,
        pause,
    })
}

fn show(name: &str, amount: i64, result: &Result<(i64, u64), ServiceError>) {
    match result {
        Ok((balance, token)) => {
            println!("  replica {name}: deposit {amount} with token {token} -> balance {balance}")
        }
        Err(e) => println!("  replica {name}: deposit {amount}: {e}"),
    }
}

// ---------------------------------------------------------------------------
// The two runs.
// ---------------------------------------------------------------------------

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let backing = redis_for_example::redis_or_memory()?;
    let storage = match &backing {
        redis_for_example::Backing::Redis(redis) => {
            let url = redis.url();
            let mut connection = redis::Client::open(url.as_str())?.get_connection()?;
            redis::cmd("DEL")
                .arg(format!("fenced-storage:account:{ACCOUNT}"))
                .exec(&mut connection)?;
            StorageAt::Redis(url)
        }
        redis_for_example::Backing::Memory(_) => StorageAt::Memory(Arc::default()),
    };
    let locks = backing.builder();

    println!("\nrun 1: replicas A and B deposit 100 and 50 at once; the lock orders them");
    let a = replica("A", &locks, &storage, None).await?;
    let b = replica("B", &locks, &storage, None).await?;
    let (from_a, from_b) = tokio::join!(a.deposit(ACCOUNT, 100), b.deposit(ACCOUNT, 50));
    // In the order they held the lock, which is the order of their tokens.
    let mut results = [("A", 100, from_a), ("B", 50, from_b)];
    results.sort_by_key(|(_, _, result)| result.as_ref().map_or(0, |(_, token)| *token));
    for (name, amount, result) in &results {
        show(name, *amount, result);
    }
    for (_, _, result) in results {
        result?;
    }

    println!("\nrun 2: replica A stops dead between its read and its write, past the ttl");
    let refused = paused_run(&locks, &storage, b).await?;

    let balance = peek(&storage).await?;
    println!("\nbalance {balance} = 100 + 50 + 50: every deposit that succeeded, once");
    if !refused || balance != 200 {
        println!("unexpected: the stale write was not refused, or the balance is wrong");
        std::process::exit(1);
    }
    println!("the stale write was refused: its token was below the one B had used");
    Ok(())
}

/// Replica A deposits 100 on a thread and runtime of its own, and stops
/// dead after its read; meanwhile B deposits 50; then A goes on. Returns
/// whether the storage refused A's write.
async fn paused_run(
    locks: &LockClientBuilder,
    storage: &StorageAt,
    b: Replica,
) -> Result<bool, BoxError> {
    let (paused_tx, paused_rx) = mpsc::channel();
    let (go_on_tx, go_on_rx) = mpsc::channel();
    let pause = Pause {
        paused: paused_tx,
        go_on: Mutex::new(go_on_rx),
    };
    let (locks_a, storage_a) = (locks.clone(), storage.clone());
    let a = std::thread::spawn(move || {
        // A current-thread runtime: blocking its thread freezes all of it.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        runtime.block_on(async move {
            let a = replica("A", &locks_a, &storage_a, Some(pause)).await?;
            let result = a.deposit(ACCOUNT, 100).await;
            show("A", 100, &result);
            Ok::<_, BoxError>(matches!(
                result,
                Err(ServiceError::Storage(StorageError::Stale { .. }))
            ))
        })
    });
    // Wait until A holds the lock and is frozen, then B asks for it: A's
    // lease runs out (nobody renews it), and B gets the lock with a higher
    // token.
    tokio::task::spawn_blocking(move || paused_rx.recv_timeout(Pause::BOUND)).await??;
    let from_b = b.deposit(ACCOUNT, 50).await;
    show("B", 50, &from_b);
    from_b?;
    go_on_tx.send(())?;
    let refused = tokio::task::spawn_blocking(move || a.join())
        .await?
        .map_err(|_| "replica A panicked")?
        .map_err(|e| e.to_string())?;
    Ok(refused)
}

/// The balance as stored, without a token (for the summary only).
async fn peek(storage: &StorageAt) -> Result<i64, BoxError> {
    match storage {
        StorageAt::Redis(url) => {
            let mut connection = redis::Client::open(url.as_str())?
                .get_multiplexed_async_connection()
                .await?;
            let balance: Option<i64> = redis::cmd("HGET")
                .arg(format!("fenced-storage:account:{ACCOUNT}"))
                .arg("balance")
                .query_async(&mut connection)
                .await?;
            Ok(balance.unwrap_or(0))
        }
        StorageAt::Memory(accounts) => Ok(accounts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(ACCOUNT)
            .map_or(0, |a| a.balance)),
    }
}
