//! Fencing tokens end to end: a service takes a fenced lock with
//! `#[distributed_lock(.., fencing = true)]` and passes the token from
//! `lock_core::current_lock()` to its storage, and the storage refuses a
//! read or a write whose token is below the highest it has seen.
//!
//! Two replicas of the service deposit into one account. In the first run
//! they do it at once and the lock puts them one after the other. In the
//! second, replica A runs in a process of its own (this program again,
//! with the argument `replica-a`) and stops dead between reading the
//! balance and writing it back: it sends itself SIGSTOP, which freezes
//! every thread, the lock's renewal included, as a long GC pause or a
//! suspended VM would. Its lease runs out; replica B gets the lock
//! meanwhile and deposits. When A is let go on (SIGCONT) it writes the
//! balance it computed from its stale read, and the storage refuses it:
//! B's token is higher. The example exits non-zero if anything else
//! happens.
//!
//! ```text
//! cargo run --example fenced_storage                                   # starts a throwaway redis-server
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --example fenced_storage  # or uses yours
//! ```
//!
//! The storage is a Redis hash here, on the same server as the locks, and
//! the paused replica is another process: it needs Redis (`REDIS_URL`, or
//! a `redis-server` on PATH), and a Unix system with the `kill` command.

use lock_core::{LockClient, LockError, current_lock, distributed_lock};
use redis::Script;
use std::fmt;
use std::process::ExitCode;
use std::sync::LazyLock;

#[path = "support/pause.rs"]
mod pause;
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

/// A replica's handle on the storage: a hash per account, `balance` and
/// `fence`.
struct Storage {
    connection: redis::aio::MultiplexedConnection,
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
    async fn open(url: &str) -> Result<Storage, redis::RedisError> {
        let client = redis::Client::open(url)?;
        Ok(Storage {
            connection: client.get_multiplexed_async_connection().await?,
        })
    }

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
        let mut connection = self.connection.clone();
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
    /// Only for this demonstration: replica A stops dead after its read.
    stops_dead: bool,
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
        if self.stops_dead {
            stop_dead(self.name, balance, token);
        }
        self.storage.write(account, token, balance + amount).await?;
        Ok((balance + amount, token))
    }
}

/// A stop-the-world pause, real: the process stops itself (SIGSTOP), all
/// of its threads (the heartbeat's too), until the example sends SIGCONT.
fn stop_dead(name: &str, balance: i64, token: u64) {
    pause::stop_dead(&format!(
        "  replica {name}: read balance {balance} with token {token}"
    ));
    println!("  replica {name}: wakes up and writes what it computed from {balance}");
}

async fn replica(name: &'static str, url: &str, stops_dead: bool) -> Result<Replica, BoxError> {
    Ok(Replica {
        name,
        locks: LockClient::builder()
            .url(url)
            .key_prefix("fenced-storage:")
            .build()
            .await?,
        storage: Storage::open(url).await?,
        stops_dead,
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

/// The argument that makes this program replica A of run 2.
const REPLICA_A: &str = "replica-a";

#[tokio::main]
async fn main() -> Result<ExitCode, BoxError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [role, url] = &args[..]
        && role == REPLICA_A
    {
        return replica_a(url).await;
    }

    let redis = redis_for_example::redis_url()?;
    let url = redis.url();
    let mut connection = redis::Client::open(url.as_str())?.get_connection()?;
    redis::cmd("DEL")
        .arg(format!("fenced-storage:account:{ACCOUNT}"))
        .exec(&mut connection)?;

    println!("\nrun 1: replicas A and B deposit 100 and 50 at once; the lock orders them");
    let a = replica("A", &url, false).await?;
    let b = replica("B", &url, false).await?;
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

    println!(
        "\nrun 2: replica A, a process of its own, stops dead between its read and its write, past the ttl"
    );
    let refused = paused_run(&url, b).await?;

    let balance: Option<i64> = redis::cmd("HGET")
        .arg(format!("fenced-storage:account:{ACCOUNT}"))
        .arg("balance")
        .query(&mut connection)?;
    let balance = balance.unwrap_or(0);
    println!("\nbalance {balance} = 100 + 50 + 50: every deposit that succeeded, once");
    if !refused || balance != 200 {
        println!("unexpected: the stale write was not refused, or the balance is wrong");
        return Ok(ExitCode::FAILURE);
    }
    println!("the stale write was refused: its token was below the one B had used");
    Ok(ExitCode::SUCCESS)
}

/// Run 2's replica A, in the process started by [`paused_run`]: deposits
/// 100, stopping dead after its read. Exits 0 when the storage refused its
/// write, as it should.
async fn replica_a(url: &str) -> Result<ExitCode, BoxError> {
    let a = replica("A", url, true).await?;
    let result = a.deposit(ACCOUNT, 100).await;
    show("A", 100, &result);
    let refused = matches!(
        result,
        Err(ServiceError::Storage(StorageError::Stale { .. }))
    );
    Ok(if refused {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Starts replica A in a process of its own, which deposits 100 and stops
/// dead after its read; meanwhile B deposits 50; then A goes on. Returns
/// whether the storage refused A's write (A's exit code says).
async fn paused_run(url: &str, b: Replica) -> Result<bool, BoxError> {
    let mut a = pause::PausedReplica::start(&[REPLICA_A, url])?;
    a.stopped().await?;

    // Nobody renews A's lease now: it runs out within the ttl, and B gets
    // the lock with a higher token.
    let from_b = b.deposit(ACCOUNT, 50).await;
    show("B", 50, &from_b);
    from_b?;

    a.resume_and_wait().await
}
