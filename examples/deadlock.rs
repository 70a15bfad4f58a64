//! A deadlock between two replicas of a service, found and broken. Replica 1
//! runs `charge(order 42)`, which calls `debit(account 7)`; replica 2 runs
//! `refund(account 7)`, which calls `restore(order 42)`. Each holds one key
//! and asks for the other's, both willing to wait 30 s: a cycle. Within a
//! second one of them fails with `WouldDeadlock`, naming the cycle, and
//! releases its key; the other completes. While replica 1 waits, a third
//! client asks Redis who holds each key and who waits for it.
//!
//! ```text
//! cargo run --example deadlock                                   # starts a throwaway redis-server
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --example deadlock  # or uses yours
//! ```
//!
//! Each replica is a process of its own (this example started again with
//! `--replica N URL`). They say on stdout what they hold and wait for, and
//! ask for their second key only when told to on stdin, so that the steps
//! happen in the same order on every run.

use lock_core::{ErrorKind, LockClient, LockError, distributed_lock};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

#[path = "support/redis.rs"]
mod redis_for_example;

/// Where the replicas' locks live.
const PREFIX: &str = "deadlock-example:";
/// What lock-core promises: the victim fails within a second of the cycle closing.
const PROMISED: Duration = Duration::from_secs(1);
/// How long the example waits for any one step before it calls it broken.
const STEP: Duration = Duration::from_secs(5);

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().collect();
    if let [_, flag, n, url] = &args[..]
        && flag == "--replica"
    {
        return replica(n, url);
    }
    let redis = redis_for_example::redis_url()?;
    run(&redis.url())
}

/// Charges an order, debiting the account that pays for it.
#[distributed_lock(key = "order:{order}", ttl = "10s", wait = "30s")]
async fn charge(order: u64, account: u64) -> Result<(), LockError> {
    told_to_go_on(format!("order:{order}"), format!("account:{account}")).await;
    debit(account).await
}

#[distributed_lock(key = "account:{account}", ttl = "10s", wait = "30s")]
async fn debit(account: u64) -> Result<(), LockError> {
    Ok(())
}

/// Refunds an account, restoring the order the money came from.
#[distributed_lock(key = "account:{account}", ttl = "10s", wait = "30s")]
async fn refund(account: u64, order: u64) -> Result<(), LockError> {
    told_to_go_on(format!("account:{account}"), format!("order:{order}")).await;
    restore(order).await
}

#[distributed_lock(key = "order:{order}", ttl = "10s", wait = "30s")]
async fn restore(order: u64) -> Result<(), LockError> {
    Ok(())
}

/// Says what the replica holds, waits for a line on stdin (read on a
/// thread of its own, so the lease is renewed meanwhile), then says what
/// it asks for next.
async fn told_to_go_on(holding: String, next: String) {
    println!("holding {holding}");
    let _ = tokio::task::spawn_blocking(|| std::io::stdin().read_line(&mut String::new())).await;
    println!("waiting {next}");
}

/// Replica `n`: its half of the story, and one last line on how it ended
/// (stdout is flushed at every line, also into a pipe).
fn replica(n: &str, url: &str) -> Result<(), BoxError> {
    tokio::runtime::Runtime::new()?.block_on(async {
        let client = LockClient::builder()
            .url(url)
            .key_prefix(PREFIX)
            .holder_name(format!("replica-{n}"))
            .build()
            .await?;
        lock_core::set_global_client(client)?;
        let ended = match n {
            "1" => charge(42, 7).await,
            _ => refund(7, 42).await,
        };
        match ended {
            Ok(()) => println!("completed"),
            Err(e) if e.kind() == ErrorKind::WouldDeadlock => println!("deadlock {e}"),
            Err(e) => println!("failed {}", e.chain()),
        }
        Ok(())
    })
}

/// Starts both replicas, closes the cycle, and checks how it ends.
fn run(url: &str) -> Result<(), BoxError> {
    let mut replicas = Replicas::start(url)?;
    // Replica 1 asks for account 7 and waits: no cycle yet, so this is the
    // moment to look (once the cycle closes, it is broken within ~50 ms).
    replicas.go(1)?;
    tokio::runtime::Runtime::new()?.block_on(who_waits_for_what(url))?;
    // Replica 2 asks for order 42: now each waits for the other.
    let closed = replicas.go(2)?;
    println!("  (the cycle is closed)");
    let mut victims = 0;
    for _ in 0..2 {
        let (name, line, at) = replicas
            .heard
            .recv_timeout(STEP)
            .map_err(|_| format!("a replica still waits after {STEP:?}: no deadlock broken"))?;
        let took = at.saturating_duration_since(closed);
        let after = format!("{} ms after the cycle closed", took.as_millis());
        if let Some(message) = line.strip_prefix("deadlock ") {
            println!("{name}: failed with WouldDeadlock, {after}:\n  {message}");
            if took >= PROMISED {
                return Err(format!("{name} gave up only after {took:?}").into());
            }
            if !message.contains("replica-1") || !message.contains("replica-2") {
                return Err(format!("{name}'s error does not name both replicas").into());
            }
            victims += 1;
        } else if line == "completed" {
            println!("{name}: completed, {after}");
        } else {
            return Err(format!("{name}: {line}").into());
        }
    }
    if victims != 1 {
        return Err(format!("{victims} replicas failed with WouldDeadlock, not one").into());
    }
    Ok(())
}

/// A third client's view: who holds each key, and who waits for it and
/// for how long. It asks again until replica 1's wait shows (a wait is
/// recorded once it has lasted 50 ms).
async fn who_waits_for_what(url: &str) -> Result<(), BoxError> {
    let observer = LockClient::builder()
        .url(url)
        .key_prefix(PREFIX)
        .build()
        .await?;
    let asked = Instant::now();
    while observer
        .inspect("account:7")
        .await?
        .is_none_or(|s| s.waiting() == 0)
    {
        if asked.elapsed() > STEP {
            return Err("replica-1's wait for account:7 never showed in Redis".into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for key in ["order:42", "account:7"] {
        let state = observer.inspect(key).await?.ok_or("a key went free")?;
        let (holder, waiting) = (state.holder().unwrap_or("?"), state.waiting());
        let waiters: Vec<String> = state
            .waiters()
            .iter()
            .map(|w| format!("{} for {} ms", w.holder(), w.waited().as_millis()))
            .collect();
        println!(
            "  inspect {key}: held by {holder}; {waiting} waiting [{}]",
            waiters.join(", ")
        );
    }
    Ok(())
}

/// The replicas' processes (killed when this goes, also on an early
/// error) and what they say, line by line, in the order they say it.
struct Replicas {
    children: Vec<(Child, ChildStdin)>,
    heard: mpsc::Receiver<(String, String, Instant)>,
}

impl Replicas {
    /// Starts replica 1, then, once it holds its first key, replica 2.
    fn start(url: &str) -> Result<Replicas, BoxError> {
        let (said, heard) = mpsc::channel();
        let children = Vec::new();
        let mut replicas = Replicas { children, heard };
        for n in 1..=2 {
            let mut child = Command::new(std::env::current_exe()?)
                .args(["--replica", &n.to_string(), url])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()?;
            let stdout = child.stdout.take().ok_or("no stdout")?;
            let stdin = child.stdin.take().ok_or("no stdin")?;
            replicas.children.push((child, stdin));
            let said = said.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                    let _ = said.send((format!("replica-{n}"), line, Instant::now()));
                }
            });
            replicas.expect("holding")?;
        }
        Ok(replicas)
    }

    /// The next line, which must start with `what`; printed, and when it came.
    fn expect(&self, what: &str) -> Result<Instant, BoxError> {
        let (name, line, at) = self
            .heard
            .recv_timeout(STEP)
            .map_err(|_| format!("no replica said {what:?} within {STEP:?}"))?;
        if !line.starts_with(what) {
            return Err(format!("{name}: {line:?}, not {what:?}").into());
        }
        println!("{name}: {line}");
        Ok(at)
    }

    /// Tells replica `n` to ask for its second key; returns once it says
    /// it does (the other replica is silent meanwhile).
    fn go(&mut self, n: usize) -> Result<Instant, BoxError> {
        writeln!(self.children[n - 1].1, "go")?;
        self.expect("waiting")
    }
}

impl Drop for Replicas {
    fn drop(&mut self) {
        for (child, _) in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
