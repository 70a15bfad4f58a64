//! `--soak SECONDS`: a long run that shows lock-core leaks nothing.
//!
//! One lock-core client runs a mix of the table's workloads for the given
//! time: a W1 loop, W2's tasks on keys of their own, W3's tasks contending
//! for one key, the attribute on own and contended keys, and waiters whose
//! acquisitions are cancelled after a random moment (the path where leaks
//! hide). Every few seconds it samples what would grow if something leaked:
//! the process's resident memory, the server's client connections and
//! pub/sub channels, the runtime's live tasks, and the client's queued keys
//! and heartbeats. The first tenth of the run (at most 30 s) is warm-up; at
//! the end each figure is compared with the highest seen during warm-up, and
//! again once the mix has stopped (then the queued keys and heartbeats must
//! be back to none, and the tasks down to the client's own). The soak is not part of the table.

use crate::contenders::{Locker, Section, Xorshift, lock_core_client};
use crate::error::{BenchResult, fail};
use crate::servers::{connect, info};
use crate::sysinfo::rss_bytes;
use lock_core::{LockClient, LockOptions};
use redis::aio::MultiplexedConnection;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// W2's tasks, each on a key of its own.
const OWN_KEY_TASKS: usize = 16;
/// W3's tasks, contending for one key.
const CONTENDING_TASKS: usize = 8;
/// Attribute tasks: half on keys of their own, half on one contended key.
const ATTRIBUTE_TASKS: usize = 4;
/// Tasks whose waits are cancelled.
const CANCELLING_TASKS: usize = 2;

/// What is sampled, at one moment.
#[derive(Clone, Copy, Debug, Default)]
struct Sample {
    rss: u64,
    connections: u64,
    channels: u64,
    tasks: u64,
    queued_keys: u64,
    heartbeats: u64,
    cycles: u64,
}

impl Sample {
    /// The figures compared for growth, with their names and how much
    /// growth over warm-up is noise (RSS: the allocator's pages, 10 %).
    fn figures(&self) -> [(&'static str, u64); 6] {
        [
            ("RSS, KiB", self.rss / 1024),
            ("server client connections", self.connections),
            ("pub/sub channels", self.channels),
            ("tokio tasks alive", self.tasks),
            ("queued keys", self.queued_keys),
            ("heartbeats running", self.heartbeats),
        ]
    }

    /// The highest of each figure of `self` and `other`.
    fn max(self, other: Sample) -> Sample {
        Sample {
            rss: self.rss.max(other.rss),
            connections: self.connections.max(other.connections),
            channels: self.channels.max(other.channels),
            tasks: self.tasks.max(other.tasks),
            queued_keys: self.queued_keys.max(other.queued_keys),
            heartbeats: self.heartbeats.max(other.heartbeats),
            cycles: self.cycles.max(other.cycles),
        }
    }
}

/// Runs the soak against `url` for `length` and prints its table.
pub async fn run(url: &str, length: Duration) -> BenchResult<()> {
    let client = lock_core_client(&[url.to_owned()]).await?;
    let mut admin = connect(url).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let cycles = Arc::new(AtomicU64::new(0));
    let workers = spawn_mix(&client, &stop, &cycles);
    let warm_up = (length / 10).min(Duration::from_secs(30));
    // At least six samples in the warm-up, whose highest is the baseline.
    let every = (warm_up / 6).clamp(Duration::from_millis(500), Duration::from_secs(10));
    let warm_samples = (warm_up.as_secs_f64() / every.as_secs_f64())
        .round()
        .max(1.0) as usize;
    let started = Instant::now();
    let mut warm = Sample::default();
    let mut samples = Vec::new();
    eprintln!("lock-bench: soak for {:.0} s", length.as_secs_f64());
    while started.elapsed() < length {
        tokio::time::sleep(every.min(length.saturating_sub(started.elapsed()))).await;
        let sample = sample(&client, &mut admin, &cycles).await?;
        if samples.len() < warm_samples {
            warm = warm.max(sample);
        }
        samples.push((started.elapsed(), sample));
    }
    stop.store(true, Ordering::Relaxed);
    for worker in workers {
        worker
            .await
            .map_err(|e| fail(format!("a soak task failed: {e}")))??;
    }
    let end = samples.last().map_or(Sample::default(), |(_, s)| *s);
    let settled = settle(&client, &mut admin, &cycles).await?;
    print!("{}", render(length, warm_up, &samples, warm, end, settled));
    Ok(())
}

/// Spawns the mix; each task runs until `stop` and counts its cycles.
fn spawn_mix(
    client: &LockClient,
    stop: &Arc<AtomicBool>,
    cycles: &Arc<AtomicU64>,
) -> Vec<tokio::task::JoinHandle<BenchResult<()>>> {
    let guard = Arc::new(Locker::Guard(client.clone()));
    let attribute = Arc::new(Locker::Attribute(client.clone()));
    let mut plan: Vec<(Arc<Locker>, String, bool)> = vec![(guard.clone(), "soak:w1".into(), false)];
    plan.extend((0..OWN_KEY_TASKS).map(|i| (guard.clone(), format!("soak:w2:{i}"), false)));
    plan.extend((0..CONTENDING_TASKS).map(|_| (guard.clone(), "soak:w3".to_owned(), true)));
    plan.extend((0..ATTRIBUTE_TASKS).map(|i| {
        let key = if i % 2 == 0 {
            format!("soak:attr:{i}")
        } else {
            "soak:attr".to_owned()
        };
        (attribute.clone(), key, i % 2 == 1)
    }));
    let mut workers: Vec<_> = plan
        .into_iter()
        .map(|(locker, key, contended)| {
            let (stop, cycles) = (stop.clone(), cycles.clone());
            tokio::spawn(async move {
                let section = Section::empty();
                while !stop.load(Ordering::Relaxed) {
                    locker.cycle(&key, &section, contended).await?;
                    cycles.fetch_add(1, Ordering::Relaxed);
                }
                Ok(())
            })
        })
        .collect();
    workers.extend((0..CANCELLING_TASKS).map(|_| {
        let (client, stop, cycles) = (client.clone(), stop.clone(), cycles.clone());
        tokio::spawn(async move {
            let mut random = Xorshift::new();
            let options = LockOptions::new(Duration::from_secs(10)).wait(Duration::from_secs(5));
            while !stop.load(Ordering::Relaxed) {
                let patience = random.up_to(Duration::from_millis(3));
                let attempt = client.lock_with("soak:w3", options.clone());
                if let Ok(Ok(guard)) = tokio::time::timeout(patience, attempt).await {
                    guard.release().await?;
                }
                cycles.fetch_add(1, Ordering::Relaxed);
            }
            Ok(())
        })
    }));
    workers
}

/// Samples every figure now.
async fn sample(
    client: &LockClient,
    admin: &mut MultiplexedConnection,
    cycles: &AtomicU64,
) -> BenchResult<Sample> {
    let clients = info(admin, "clients").await?;
    let channels: Vec<String> = redis::cmd("PUBSUB")
        .arg("CHANNELS")
        .query_async(admin)
        .await?;
    let count = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
    Ok(Sample {
        rss: rss_bytes().ok_or_else(|| fail("cannot read VmRSS"))?,
        // Less the bench's own admin connection.
        connections: clients
            .get("connected_clients")
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
            .saturating_sub(1),
        channels: count(channels.len()),
        tasks: count(
            tokio::runtime::Handle::current()
                .metrics()
                .num_alive_tasks(),
        ),
        queued_keys: count(client.queued_keys()),
        heartbeats: count(client.heartbeats_running()),
        cycles: cycles.load(Ordering::Relaxed),
    })
}

/// Once the mix has stopped: samples until the client is idle (its
/// heartbeat ends a few seconds after its last lease), at most 10 s.
async fn settle(
    client: &LockClient,
    admin: &mut MultiplexedConnection,
    cycles: &AtomicU64,
) -> BenchResult<Sample> {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let now = sample(client, admin, cycles).await?;
        let idle = now.queued_keys == 0 && now.heartbeats == 0;
        if idle || Instant::now() >= until {
            return Ok(now);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The soak's table: the samples, then each figure at its warm-up high, at
/// the end and after the stop, with a verdict.
fn render(
    length: Duration,
    warm_up: Duration,
    samples: &[(Duration, Sample)],
    warm: Sample,
    end: Sample,
    settled: Sample,
) -> String {
    let mut out = format!(
        "lock-bench soak: {:.0} s of W1 + W2 ({OWN_KEY_TASKS} tasks) + W3 ({CONTENDING_TASKS} \
         tasks) + attribute ({ATTRIBUTE_TASKS} tasks) + {CANCELLING_TASKS} cancelling waiters, \
         one lock-core client; warm-up {:.0} s\n\n",
        length.as_secs_f64(),
        warm_up.as_secs_f64()
    );
    out.push_str("   time s   cycles      RSS KiB  conns  channels  tasks  queued  heartbeats\n");
    // About twenty rows, the last one included.
    let step = samples.len().div_ceil(20).max(1);
    let shown = samples
        .iter()
        .enumerate()
        .filter(|(i, _)| (i + 1) % step == 0 || i + 1 == samples.len())
        .map(|(_, sample)| sample);
    for (at, s) in shown {
        out.push_str(&format!(
            "{:>9.0} {:>8} {:>12} {:>6} {:>9} {:>6} {:>7} {:>11}\n",
            at.as_secs_f64(),
            s.cycles,
            s.rss / 1024,
            s.connections,
            s.channels,
            s.tasks,
            s.queued_keys,
            s.heartbeats
        ));
    }
    out.push_str(&format!(
        "\n{:<28} {:>12} {:>12} {:>12}  verdict\n",
        "figure", "warm-up max", "end", "after stop"
    ));
    let rows = warm
        .figures()
        .into_iter()
        .zip(end.figures())
        .zip(settled.figures());
    for (i, (((name, warm), (_, end)), (_, after))) in rows.enumerate() {
        // RSS gets 10 % for the allocator; counts get nothing.
        let allowed = if i == 0 { warm + warm / 10 } else { warm };
        let verdict = if end <= allowed { "no growth" } else { "GREW" };
        out.push_str(&format!(
            "{name:<28} {warm:>12} {end:>12} {after:>12}  {verdict}\n"
        ));
    }
    let idle = settled.queued_keys == 0 && settled.heartbeats == 0;
    out.push_str(&format!(
        "after the stop: {} ({} tasks alive: the client's own)\n",
        if idle {
            "no queued key or heartbeat left"
        } else {
            "SOMETHING LEFT RUNNING"
        },
        settled.tasks
    ));
    out
}
