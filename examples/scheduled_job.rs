//! Several replicas of a service run the same scheduled job; each tick,
//! exactly one of them does the work and the others skip it.
//!
//! Each replica has its own `LockClient` (its own connection), as separate
//! processes would. On every tick they all call `nightly_report`; the
//! attribute's `wait = "0s"` makes one attempt, so the replica that gets the
//! lock runs the report and the others get a `Contended` error at once and
//! log that they skipped.
//!
//! ```text
//! cargo run --example scheduled_job                  # starts a throwaway redis-server
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --example scheduled_job
//! ```

use lock_core::{LockClient, LockError, distributed_lock};
use std::error::Error;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::{Instant, interval_at};

const REPLICAS: usize = 3;
const TICKS: u32 = 4;
const PERIOD: Duration = Duration::from_millis(500);

/// One replica of the service.
struct Replica {
    name: String,
    locks: LockClient,
}

impl Replica {
    async fn connect(url: &str, name: String) -> Result<Replica, LockError> {
        let locks = LockClient::builder()
            .url(url)
            .key_prefix("scheduled-job-example:")
            .build()
            .await?;
        Ok(Replica { name, locks })
    }

    /// The job. The key names the tick, so each tick is its own lock; the
    /// work takes well under a period, and the renewal keeps the lock while
    /// it runs however long it takes.
    ///
    /// All replicas fire at the same instant here. A replica that came late,
    /// after the winner had finished and released the tick, would run it
    /// again: a real job records that a tick is done (or names a time
    /// window in the key and checks for its output) when that matters.
    #[distributed_lock(key = "nightly-report:{tick}", client = self.locks, wait = "0s", ttl = "10s")]
    async fn nightly_report(&self, tick: u32) -> Result<usize, JobError> {
        if let Some(lock) = lock_core::current_lock() {
            println!(
                "[{}] tick {tick}: running the report under {:?}",
                self.name,
                lock.key()
            );
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
        Ok(42 + tick as usize)
    }

    /// Runs the schedule; returns the ticks this replica ran.
    async fn run_schedule(self: Arc<Self>, start: Instant) -> Result<Vec<u32>, JobError> {
        let mut ticker = interval_at(start, PERIOD);
        let mut ran = Vec::new();
        for tick in 1..=TICKS {
            ticker.tick().await;
            match self.nightly_report(tick).await {
                Ok(rows) => {
                    println!("[{}] tick {tick}: report done, {rows} rows", self.name);
                    ran.push(tick);
                }
                Err(JobError::Lock(e)) if e.is_contended() => {
                    println!(
                        "[{}] tick {tick}: skipped, another replica runs it",
                        self.name
                    );
                }
                Err(e) => return Err(e),
            }
        }
        Ok(ran)
    }
}

/// The job's error type: a lock error converts into it, so the attribute
/// can return one.
#[derive(Debug)]
enum JobError {
    Lock(LockError),
}

impl From<LockError> for JobError {
    fn from(e: LockError) -> Self {
        JobError::Lock(e)
    }
}

impl fmt::Display for JobError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JobError::Lock(e) => write!(f, "nightly report: {e}"),
        }
    }
}

impl Error for JobError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            JobError::Lock(e) => Some(e),
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    // Without REDIS_URL, a private redis-server for the length of the run.
    let (url, _server) = match std::env::var("REDIS_URL") {
        Ok(url) => (url, None),
        Err(_) => {
            let server = lock_testkit::RedisServer::try_start()?;
            (server.url(), Some(server))
        }
    };

    let mut replicas = Vec::with_capacity(REPLICAS);
    for i in 1..=REPLICAS {
        replicas.push(Arc::new(
            Replica::connect(&url, format!("replica-{i}")).await?,
        ));
    }

    // Every replica ticks on the same schedule, like cron on each host.
    let start = Instant::now() + Duration::from_millis(100);
    let tasks: Vec<_> = replicas
        .into_iter()
        .map(|replica| tokio::spawn(replica.run_schedule(start)))
        .collect();
    let mut runs_per_tick = vec![0; TICKS as usize];
    for task in tasks {
        for tick in task.await?? {
            runs_per_tick[tick as usize - 1] += 1;
        }
    }

    println!("runs per tick: {runs_per_tick:?}");
    if runs_per_tick.iter().all(|&runs| runs == 1) {
        println!("every tick ran exactly once");
        Ok(())
    } else {
        Err("a tick did not run exactly once".into())
    }
}
