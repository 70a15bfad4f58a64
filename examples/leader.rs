//! Leader election: three replicas of a service campaign to run its
//! scheduler; one leads at a time, with a term that grows with every new
//! leader. The leader is then killed (SIGKILL: no release, no goodbye), and
//! a survivor takes over once its lease expires, with a larger term. A
//! follower watches who leads the whole time.
//!
//! ```text
//! cargo run --example leader                                   # starts a throwaway redis-server
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --example leader  # or uses yours
//! ```
//!
//! Each replica is a process of its own (this example started again with
//! `--replica N URL`), so that killing one is a real crash.

use futures::StreamExt;
use lock_core::{LockClient, LockError};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

#[path = "support/redis.rs"]
mod redis_for_example;

/// The election every replica campaigns in.
const ELECTION: &str = "nightly-scheduler";
/// The leader's lease: a crashed leader is followed within this.
const TTL: Duration = Duration::from_secs(1);

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

/// One replica: leads whenever it can, saying so on stdout.
fn replica(n: &str, url: &str) -> Result<(), BoxError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let client = LockClient::builder()
            .url(url)
            .holder_name(format!("replica-{n}"))
            .build()
            .await?;
        client
            .lead(ELECTION, TTL, |term| async move {
                // The scheduler's work would go here, every write carrying
                // `term` so that a stale leader's writes are refused.
                println!("LEADS {term}");
                std::future::pending::<Result<(), LockError>>().await
            })
            .await?;
        Ok(())
    })
}

/// Starts three replicas, kills the first leader, and shows the takeover.
fn run(url: &str) -> Result<(), BoxError> {
    let (events, heard) = mpsc::channel();
    let mut replicas = Replicas(
        (1..=3)
            .map(|n| start_replica(n, url, events.clone()))
            .collect::<Result<_, _>>()?,
    );
    // A worker thread of its own, so the follower prints as things happen.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let follower = runtime.block_on(LockClient::builder().url(url).build())?;
    let watcher = runtime.spawn(async move {
        let mut leaders = std::pin::pin!(follower.watch_leader(ELECTION));
        while let Some(leader) = leaders.next().await {
            match leader {
                Some(state) => println!(
                    "  follower sees: {} leads, term {}",
                    state.holder().unwrap_or("?"),
                    state.fencing_token().unwrap_or(0),
                ),
                None => println!("  follower sees: nobody leads"),
            }
        }
    });

    let (first, first_term) = heard.recv_timeout(Duration::from_secs(20))?;
    println!("replica-{first} leads with term {first_term}; killing it (SIGKILL)");
    let killed_at = Instant::now();
    replicas.0[first - 1].kill()?;
    replicas.0[first - 1].wait()?;
    let (next, next_term) = heard.recv_timeout(TTL + Duration::from_secs(10))?;
    println!(
        "replica-{next} leads with term {next_term}, {:?} after the crash (the lease was {TTL:?})",
        killed_at.elapsed(),
    );
    assert!(next_term > first_term, "terms grow with every leader");
    // Give the follower a moment to print the takeover, then stop.
    std::thread::sleep(Duration::from_millis(300));
    watcher.abort();
    drop(replicas);
    println!("surviving terms: first {first_term}, then {next_term}");
    Ok(())
}

/// The replicas' processes, killed when this goes (also on an early error).
struct Replicas(Vec<Child>);

impl Drop for Replicas {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Starts replica `n`; its "LEADS term" lines come back on `events`.
fn start_replica(
    n: usize,
    url: &str,
    events: mpsc::Sender<(usize, u64)>,
) -> Result<Child, BoxError> {
    let mut child = Command::new(std::env::current_exe()?)
        .args(["--replica", &n.to_string(), url])
        .stdout(Stdio::piped())
        .spawn()?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(term) = line.strip_prefix("LEADS ")
                && let Ok(term) = term.parse()
            {
                let _ = events.send((n, term));
            }
        }
    });
    Ok(child)
}
