//! W5: hold many locks at once with renewal (by default 10,000 with a 3 s
//! ttl for 30 s; `--w5-locks`, `--w5-ttl`, `--w5-seconds`), each
//! acquisition waiting up to `--w5-wait` (30 s by default).
//!
//! Figures: locks lost (must be 0); renewal script calls per second, from
//! the deltas of `INFO commandstats` over the hold (the bench sends nothing
//! else then, so every `EVALSHA` is the heartbeat's; the `GET`/`PTTL`/`PEXPIRE`
//! calls that commandstats also counts ran inside those scripts and are
//! listed apart; `MONITOR`, used before, made the server echo every one of
//! them and was a load of its own); socket reads per second from
//! `INFO stats` (`total_reads_processed`, about the round trips); client CPU
//! over the hold, from `/proc/self/stat`; resident memory per held lock,
//! from `VmRSS` before taking the locks and while holding them.
//!
//! With `--w5-capacity` it runs past the client's renewal capacity instead,
//! one row per run ([`CAPACITY_RUNS`]), each lock taken without waiting:
//! how many locks were asked, granted, refused (`AtCapacity`) and lost.
//! A client at its capacity refuses new locks to keep the ones it holds, so
//! `lost` stays near zero however many are asked.

use super::{Context, progress};
use crate::contenders::{Impl, LOCK_CORE_PREFIX, lock_core_client_to};
use crate::endpoint::Endpoint;
use crate::error::{BenchResult, fail};
use crate::servers::{command_calls, connect, info};
use crate::sysinfo::{cpu_time, rss_bytes};
use crate::table::{Row, WorkloadId, WorkloadResult};
use crate::transport::Transport;
use futures::StreamExt;
use lock_core::{LockClient, LockGuard, LockOptions};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Acquisitions and releases in flight at once.
const IN_FLIGHT: usize = 256;

/// `--w5-capacity`: locks asked and their ttl, past what one client renews
/// on a 2-core machine at a 3 s ttl (about 500,000), and a load it renews
/// at a 30 s ttl.
const CAPACITY_RUNS: [(usize, Duration); 3] = [
    (800_000, Duration::from_secs(3)),
    (1_200_000, Duration::from_secs(3)),
    (1_000_000, Duration::from_secs(30)),
];

/// One run of W5: how many locks, their ttl, and how long each
/// acquisition waits.
struct Run {
    locks: usize,
    ttl: Duration,
    wait: Duration,
}

/// Where W5 holds its locks: its own server, or (`--transport cluster`)
/// the cluster's primaries, each of which its figures add up.
struct Place {
    endpoint: Endpoint,
    admin_urls: Vec<String>,
}

/// Runs W5 on its own server, or on a cluster.
pub async fn run(ctx: &Context) -> BenchResult<WorkloadResult> {
    let place = match &ctx.endpoint {
        Endpoint::Cluster(urls) if ctx.transport == Transport::Cluster => Place {
            endpoint: Endpoint::Cluster(urls.clone()),
            admin_urls: urls.clone(),
        },
        _ => {
            let Some(url) = ctx.hold_url.clone() else {
                return Err(fail("W5 needs its server"));
            };
            Place {
                endpoint: Endpoint::Plain(vec![url.clone()]),
                admin_urls: vec![url],
            }
        }
    };
    let runs: Vec<Run> = if ctx.w5_capacity {
        // Past capacity a waiting acquisition would wait its whole wait:
        // refused at once, as a try-lock is.
        CAPACITY_RUNS
            .iter()
            .map(|&(locks, ttl)| Run {
                locks,
                ttl,
                wait: Duration::ZERO,
            })
            .collect()
    } else {
        vec![Run {
            locks: ctx.w5_locks,
            ttl: ctx.w5_ttl,
            wait: ctx.w5_wait,
        }]
    };
    let mut rows = Vec::with_capacity(runs.len());
    for run in &runs {
        progress(WorkloadId::W5, Impl::Guard);
        rows.push(hold(ctx, &place, run).await?);
    }
    let asked: Vec<String> = runs
        .iter()
        .map(|run| format!("{} locks at ttl {} s", run.locks, run.ttl.as_secs_f64()))
        .collect();
    Ok(WorkloadResult {
        id: WorkloadId::W5,
        transport: ctx.transport,
        title: "hold many locks at once with renewal",
        params: format!(
            "{}, renewal on, held {:.1} s, taken {IN_FLIGHT} at a time, waiting {}; \
             rate = server commands/s during the hold (a heartbeat per lock would send \
             three per ttl each), from INFO commandstats; cpu = client CPU time / hold time; \
             B/lock = VmRSS growth / locks",
            asked.join("; "),
            ctx.w5_seconds.as_secs_f64(),
            if ctx.w5_capacity {
                "not at all".to_owned()
            } else {
                format!("up to {} s", ctx.w5_wait.as_secs_f64())
            },
        ),
        rows,
    })
}

/// Takes the locks, holds them, measures, releases them.
async fn hold(ctx: &Context, place: &Place, run: &Run) -> BenchResult<Row> {
    let client = lock_core_client_to(&place.endpoint).await?;
    let mut admin = Admins::connect(&place.admin_urls).await?;
    // What an earlier run left (the keys of leases it lost) is not ours.
    admin.flush().await?;
    let options = LockOptions::new(run.ttl).wait(run.wait);

    // Warm up the client so the baseline includes its fixed costs.
    for i in 0..100 {
        let guard = client
            .lock_with(&format!("w5-warm:{i}"), options.clone())
            .await?;
        guard.release().await?;
    }
    let rss_before = rss_bytes().ok_or_else(|| fail("cannot read VmRSS"))?;

    let Taken {
        guards,
        failed,
        refused,
        first_error,
        took,
    } = take(&client, &options, run.locks).await;
    let capacity_taken = client.renewal_capacity();
    let rss_held = rss_bytes().ok_or_else(|| fail("cannot read VmRSS"))?;

    let reads_before = admin.reads_processed().await?;
    let calls_before = admin.command_calls().await?;
    let cpu_start = cpu_time().ok_or_else(|| fail("cannot read /proc/self/stat"))?;
    let held_since = Instant::now();
    tokio::time::sleep(ctx.w5_seconds).await;
    let held_for = held_since.elapsed();
    let cpu = cpu_time()
        .ok_or_else(|| fail("cannot read /proc/self/stat"))?
        .saturating_sub(cpu_start);
    let calls = calls_since(&calls_before, admin.command_calls().await?);
    let reads = admin.reads_processed().await?.saturating_sub(reads_before);
    let lost = guards.iter().filter(|g| g.is_lost()).count();
    let heartbeats = client.heartbeats_running();
    let capacity = client.renewal_capacity();
    let stored = admin.keys().await?;
    let held = u64::try_from(guards.len()).unwrap_or(u64::MAX);

    let released: Vec<_> = futures::stream::iter(guards)
        .map(LockGuard::release)
        .buffer_unordered(IN_FLIGHT)
        .collect()
        .await;
    let not_ours = released.iter().filter(|r| !matches!(r, Ok(true))).count();

    let (sent, in_scripts): (Vec<Calls<'_>>, Vec<Calls<'_>>) = calls
        .iter()
        .filter(|(command, _)| !is_admin(command))
        .partition(|(command, _)| is_script_call(command));
    let renewal_calls: u64 = sent.iter().map(|(_, n)| **n).sum();
    let seconds = held_for.as_secs_f64();
    let mut row = Row::new(Impl::Guard, "renewal cmds");
    row.rate = Some(renewal_calls as f64 / seconds);
    row.locks_lost = Some(u64::try_from(lost.max(not_ours)).unwrap_or(u64::MAX));
    row.cpu_percent = Some(cpu.as_secs_f64() / seconds * 100.0);
    row.rss_per_lock = (held > 0).then(|| rss_held.saturating_sub(rss_before) as f64 / held as f64);
    row.failed = Some(failed);
    row.samples = held;
    let list = |counts: &mut dyn Iterator<Item = (&String, &u64)>| {
        let items: Vec<String> = counts
            .map(|(command, n)| format!("{command} {n}"))
            .collect();
        if items.is_empty() {
            "nothing".to_owned()
        } else {
            items.join(", ")
        }
    };
    row.note = format!(
        "asked {}, granted {held}, refused {refused}, lost {}; ttl {} s; \
         renewal capacity measured {} once taken, {} after the hold; \
         sent {}; run inside scripts {}; {:.1} socket reads/s; {heartbeats} heartbeats; \
         {stored} keys under {}; taken in {:.2} s; {not_ours} releases found the lock gone{}",
        run.locks,
        lost.max(not_ours),
        run.ttl.as_secs_f64(),
        leases_per_second(capacity_taken),
        leases_per_second(capacity),
        list(&mut sent.iter().copied()),
        list(&mut in_scripts.iter().copied()),
        reads as f64 / seconds,
        LOCK_CORE_PREFIX,
        took.as_secs_f64(),
        first_error.map_or(String::new(), |e| format!("; first error: {e}"))
    );
    Ok(row)
}

/// A renewal capacity, as the note shows it.
fn leases_per_second(capacity: Option<f64>) -> String {
    capacity.map_or("nothing".to_owned(), |c| format!("{c:.0} leases/s"))
}

/// A command's name and how many times it ran.
type Calls<'a> = (&'a String, &'a u64);

/// What taking W5's locks gave.
struct Taken {
    guards: Vec<LockGuard>,
    /// Acquisitions that failed, and the first one's error.
    failed: u64,
    /// Of those, the ones refused because the client was at its renewal
    /// capacity.
    refused: u64,
    first_error: Option<String>,
    /// How long taking them all took.
    took: Duration,
}

/// Takes `locks` locks, [`IN_FLIGHT`] at a time. Each waits up to the
/// options' wait, and none past that wait after the take began: past the
/// capacity most acquisitions are refused after waiting, and at a wait each
/// the take would last `locks / IN_FLIGHT` waits.
async fn take(client: &LockClient, options: &LockOptions, locks: usize) -> Taken {
    let taking = Instant::now();
    let wait = options.wait_time();
    let results: Vec<_> = futures::stream::iter(0..locks)
        .map(|i| {
            let client = client.clone();
            let options = match wait {
                Some(wait) => options.clone().wait(wait.saturating_sub(taking.elapsed())),
                None => options.clone(),
            };
            async move { client.lock_with(&format!("w5:{i}"), options).await }
        })
        .buffer_unordered(IN_FLIGHT)
        .collect()
        .await;
    let took = taking.elapsed();
    let mut taken = Taken {
        guards: Vec::with_capacity(results.len()),
        failed: 0,
        refused: 0,
        first_error: None,
        took,
    };
    for result in results {
        match result {
            Ok(guard) => taken.guards.push(guard),
            Err(e) => {
                taken.failed += 1;
                taken.refused += u64::from(e.is_at_capacity());
                taken
                    .first_error
                    .get_or_insert_with(|| e.chain().to_string());
            }
        }
    }
    taken
}

/// The bench's own connections to where W5's locks live, one a server:
/// each figure is the sum over them.
struct Admins(Vec<redis::aio::MultiplexedConnection>);

impl Admins {
    async fn connect(urls: &[String]) -> BenchResult<Admins> {
        let mut conns = Vec::with_capacity(urls.len());
        for url in urls {
            conns.push(connect(url).await?);
        }
        Ok(Admins(conns))
    }

    async fn flush(&mut self) -> BenchResult<()> {
        for conn in &mut self.0 {
            redis::cmd("FLUSHALL").query_async::<()>(conn).await?;
        }
        Ok(())
    }

    /// `total_reads_processed` of `INFO stats`: socket reads, about one
    /// per round trip of any client.
    async fn reads_processed(&mut self) -> BenchResult<u64> {
        let mut total = 0;
        for conn in &mut self.0 {
            let stats = info(conn, "stats").await?;
            total += stats
                .get("total_reads_processed")
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0);
        }
        Ok(total)
    }

    async fn command_calls(&mut self) -> BenchResult<BTreeMap<String, u64>> {
        let mut total = BTreeMap::new();
        for conn in &mut self.0 {
            for (command, n) in command_calls(conn).await? {
                *total.entry(command).or_insert(0) += n;
            }
        }
        Ok(total)
    }

    async fn keys(&mut self) -> BenchResult<u64> {
        let mut total = 0;
        for conn in &mut self.0 {
            total += redis::cmd("DBSIZE").query_async::<u64>(conn).await?;
        }
        Ok(total)
    }
}

/// How many more times each command ran in `after` than in `before`; the
/// commands that did not run are left out.
fn calls_since(
    before: &BTreeMap<String, u64>,
    after: BTreeMap<String, u64>,
) -> BTreeMap<String, u64> {
    after
        .into_iter()
        .map(|(command, n)| {
            let more = n.saturating_sub(before.get(&command).copied().unwrap_or(0));
            (command, more)
        })
        .filter(|(_, more)| *more > 0)
        .collect()
}

/// A command a client sends: a script call, as the heartbeat sends them, or
/// one of a connection's own (loading the scripts, a reconnect's handshake).
/// The others are those run inside scripts, which commandstats counts too,
/// under their own names.
fn is_script_call(command: &str) -> bool {
    [
        "eval", "script|", "client|", "hello", "auth", "select", "ping",
    ]
    .iter()
    .any(|sent| command.starts_with(sent))
}

/// The bench's own commands to the server, not renewal traffic.
fn is_admin(command: &str) -> bool {
    ["info", "config", "dbsize", "monitor", "flushall"]
        .iter()
        .any(|admin| command == *admin || command.starts_with(&format!("{admin}|")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admin_commands_are_not_renewals() {
        assert!(is_admin("info"));
        assert!(is_admin("config|resetstat"));
        assert!(!is_admin("evalsha"));
        assert!(!is_admin("pexpire"));
    }

    #[test]
    fn calls_since_counts_only_what_ran_meanwhile() {
        let before = BTreeMap::from([("evalsha".to_owned(), 10), ("get".to_owned(), 4)]);
        let after = BTreeMap::from([
            ("evalsha".to_owned(), 25),
            ("get".to_owned(), 4),
            ("pexpire".to_owned(), 3),
        ]);
        let since = calls_since(&before, after);
        assert_eq!(since.get("evalsha"), Some(&15));
        assert_eq!(since.get("pexpire"), Some(&3));
        assert!(!since.contains_key("get"));
        assert!(is_script_call("evalsha") && is_script_call("script|load"));
        assert!(!is_script_call("pexpire") && !is_script_call("get"));
    }
}
