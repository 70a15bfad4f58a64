//! The workloads of the table, and the loops they share.
//!
//! | id | what |
//! | --- | --- |
//! | W1 | one task, one key, lock + release in a loop, ttl 10 s |
//! | W2 | 64 tasks, each its own key |
//! | W3 | 8 tasks, one key, lock (wait) + tiny critical section + release |
//! | W3p | W3 with 4 processes × 2 tasks |
//! | W4 | W1 against 5-node Redlock |
//! | W5 | hold 10,000 locks with renewal (ttl 3 s) for 30 s |
//! | W6 | annotated function vs the same body with the guard API |
//! | W7 | takeover after a holder process is killed; releases nobody announces |
//! | W8 | 64 tasks, each locking 2 random accounts of 1,000 at once (`lock_all`) |
//! | W9 | 8 shared readers and 1 exclusive writer on one key |
//! | W10 | failover: the next leader's first write after a resignation or a crash |
//! | W11 | deadlock: two owners in a cycle of waits, until the victim's `WouldDeadlock` |

mod campaign;
mod killable;
pub mod w1;
pub mod w10;
pub mod w11;
pub mod w2;
pub mod w3;
pub mod w3p;
pub mod w4;
pub mod w5;
pub mod w6;
pub mod w7;
pub mod w8;
pub mod w9;

use crate::contenders::{Cycle, Impl, Locker, Section, Xorshift};
use crate::error::{BenchError, BenchResult, fail};
use crate::servers::{connect, info};
use crate::stats::{Contention, Record, Spread, nanos, wall_ns};
use crate::sysinfo::cpu_time;
use crate::table::{Row, WorkloadId};
use crate::transport::{Endpoint, Transport};
use redis::aio::MultiplexedConnection;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What every workload needs to know.
#[derive(Clone, Debug)]
pub struct Context {
    /// Measured time of each row.
    pub seconds: Duration,
    /// Unmeasured time run before each throughput row.
    pub warmup: Duration,
    /// The single server (plain TCP), of every workload but W1 and W2 on
    /// another transport.
    pub url: String,
    /// What W1 and W2 run on.
    pub transport: Transport,
    /// Where W1 and W2 connect: the single server for plain TCP.
    pub endpoint: Endpoint,
    /// The Redlock primaries (W4).
    pub redlock_urls: Vec<String>,
    /// W5's own server.
    pub hold_url: Option<String>,
    /// How long W5 holds its locks.
    pub w5_seconds: Duration,
    /// How many locks W5 holds.
    pub w5_locks: usize,
    /// The ttl of W5's locks.
    pub w5_ttl: Duration,
    /// W5's runs past the renewal capacity instead (`--w5-capacity`).
    pub w5_capacity: bool,
    /// How long each of W5's acquisitions waits.
    pub w5_wait: Duration,
    /// The rows [`measure_rows`] runs (others are left out of the table).
    pub impls: Vec<Impl>,
    /// Takeovers per W7 row.
    pub w7_rounds: usize,
    /// Resignations per W10 resignation row.
    pub w10_resignations: usize,
    /// Crashes per W10 crash row.
    pub w10_crashes: usize,
    /// Deadlocks per W11 row.
    pub w11_cycles: usize,
    /// With `--rtt`: what the proxy W1 and W2 run through adds and
    /// measured, for their parameters.
    pub network: Option<String>,
}

impl Context {
    /// The parameter text every throughput workload ends with.
    fn timing(&self) -> String {
        let network = self
            .network
            .as_ref()
            .map_or(String::new(), |n| format!("; {n}"));
        format!(
            "{:.1} s per row after {:.1} s warm-up, in {ROUNDS} rounds interleaved with the \
             other rows{network}",
            self.seconds.as_secs_f64(),
            self.warmup.as_secs_f64()
        )
    }
}

/// Starts this executable again with `args` (a W3p worker, a W7 holder),
/// its stdin and stdout piped to the caller and its stderr shared; `what`
/// names it in the error when a pipe is missing.
pub fn spawn_self(
    args: &[&str],
    what: &str,
) -> BenchResult<(
    std::process::Child,
    std::process::ChildStdin,
    std::process::ChildStdout,
)> {
    use std::process::{Command, Stdio};
    let exe = std::env::current_exe()?;
    let mut child = Command::new(exe)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?;
    let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
        let _ = child.kill();
        let _ = child.wait();
        return Err(fail(format!("{what} has no stdin or stdout")));
    };
    Ok((child, stdin, stdout))
}

/// The bound of every call the bench makes itself in W7 and W10.
pub const CALL_BOUND: Duration = Duration::from_secs(5);

/// `call`, failed after [`CALL_BOUND`].
pub async fn bounded<T, E>(call: impl Future<Output = Result<T, E>>) -> BenchResult<T>
where
    BenchError: From<E>,
{
    match tokio::time::timeout(CALL_BOUND, call).await {
        Ok(answer) => Ok(answer?),
        Err(_) => Err(fail(format!("Redis did not answer within {CALL_BOUND:?}"))),
    }
}

/// Milliseconds (positive) in nanoseconds.
pub fn millis_ns(ms: i64) -> u64 {
    u64::try_from(ms).unwrap_or(0).saturating_mul(1_000_000)
}

/// Says on stderr what is being measured (stdout is for the table).
pub fn progress(workload: WorkloadId, imp: Impl) {
    eprintln!("lock-bench: {} {}", workload.name(), imp.label());
}

/// What [`run_cycles`] measured.
#[derive(Debug, Default)]
pub struct CycleRun {
    /// Completed cycles.
    pub cycles: u64,
    /// Cycles that did not get the lock, or failed.
    pub failed: u64,
    /// From the start to the end of the last task's last cycle.
    pub elapsed: Duration,
    /// The time of each completed cycle, ns.
    pub latencies_ns: Vec<u64>,
    /// The first error, if any.
    pub first_error: Option<String>,
    /// CPU time of this process meanwhile.
    pub client_cpu: Duration,
    /// CPU time of the redis-server processes meanwhile.
    pub server_cpu: Duration,
    /// The rate of each round [`measure_rows`] ran, per second, in order.
    pub round_rates: Vec<f64>,
}

impl CycleRun {
    /// Adds another run's figures to this one (time adds up too).
    pub fn absorb(&mut self, other: CycleRun) {
        self.cycles += other.cycles;
        self.failed += other.failed;
        self.elapsed += other.elapsed;
        self.client_cpu += other.client_cpu;
        self.server_cpu += other.server_cpu;
        self.latencies_ns.extend(other.latencies_ns);
        self.round_rates.extend(other.round_rates);
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
    }

    /// The row of a throughput workload.
    pub fn into_row(mut self, imp: Impl, unit: &'static str) -> Row {
        let spread = Spread::of(&mut self.latencies_ns);
        let mut row = Row::new(imp, unit);
        let seconds = self.elapsed.as_secs_f64();
        row.rate = (seconds > 0.0).then(|| self.cycles as f64 / seconds);
        row.p50_us = Some(spread.p50_us);
        row.p99_us = Some(spread.p99_us);
        row.max_us = Some(spread.max_us);
        row.failed = Some(self.failed);
        row.samples = self.cycles;
        row.round_rates = self.round_rates;
        // Only rows measured by `measure_rows` have CPU figures.
        if self.cycles > 0 && !(self.client_cpu.is_zero() && self.server_cpu.is_zero()) {
            let per_cycle = |cpu: Duration| cpu.as_secs_f64() * 1e6 / self.cycles as f64;
            row.client_cpu_us = Some(per_cycle(self.client_cpu));
            row.server_cpu_us = Some(per_cycle(self.server_cpu));
        }
        row.note = self.first_error.unwrap_or_default();
        row
    }
}

/// What the tasks of a throughput row lock, by lock name.
#[derive(Clone, Copy, Debug)]
pub enum Tasks<'a> {
    /// One task per name, each cycling on its own key (W1, W2, W4).
    OwnKey(&'a [String]),
    /// `tasks` tasks, each cycle on two distinct keys drawn at random from
    /// `names` (W8).
    RandomPairs {
        /// Concurrent tasks.
        tasks: usize,
        /// The keys to draw from.
        names: &'a [String],
    },
}

/// [`Tasks`] with each lock name turned into the key one implementation
/// locks.
#[derive(Clone, Debug)]
enum TaskKeys {
    OwnKey(Vec<String>),
    RandomPairs { tasks: usize, keys: Arc<[String]> },
}

impl TaskKeys {
    fn of(locker: &Locker, tasks: Tasks<'_>) -> TaskKeys {
        let keys = |names: &[String]| -> Vec<String> {
            names.iter().map(|name| locker.key(name)).collect()
        };
        match tasks {
            Tasks::OwnKey(names) => TaskKeys::OwnKey(keys(names)),
            Tasks::RandomPairs { tasks, names } => TaskKeys::RandomPairs {
                tasks,
                keys: keys(names).into(),
            },
        }
    }
}

/// The row's tasks, each cycling (lock, empty section, release) until
/// `duration` has passed.
async fn run_cycles(
    locker: &Arc<Locker>,
    keys: &TaskKeys,
    duration: Duration,
) -> BenchResult<CycleRun> {
    let start = Instant::now();
    let deadline = start + duration;
    let tasks: Vec<_> = match keys {
        TaskKeys::OwnKey(keys) => keys
            .iter()
            .map(|key| {
                let locker = locker.clone();
                let key = key.clone();
                tokio::spawn(async move { cycle_task(&locker, &key, deadline).await })
            })
            .collect(),
        TaskKeys::RandomPairs { tasks, keys } => (0..*tasks)
            .map(|_| {
                let locker = locker.clone();
                let keys = keys.clone();
                tokio::spawn(async move { pair_task(&locker, &keys, deadline).await })
            })
            .collect(),
    };
    let mut total = CycleRun::default();
    for task in tasks {
        total.absorb(
            task.await
                .map_err(|e| fail(format!("a cycle task died: {e}")))?,
        );
    }
    total.elapsed = start.elapsed();
    Ok(total)
}

/// The loop of one [`run_cycles`] task on its own key.
async fn cycle_task(locker: &Locker, key: &str, deadline: Instant) -> CycleRun {
    let section = Section::empty();
    let mut run = CycleRun::default();
    while Instant::now() < deadline {
        timed_cycle(locker, key, &section, &mut run).await;
    }
    run
}

/// The loop of one [`run_cycles`] task on random pairs of `keys` (at
/// least two): each cycle locks two distinct keys at once.
async fn pair_task(locker: &Locker, keys: &[String], deadline: Instant) -> CycleRun {
    let section = Section::empty();
    let mut run = CycleRun::default();
    let mut draw = Xorshift::new();
    while Instant::now() < deadline {
        let first = draw.below(keys.len());
        let mut second = draw.below(keys.len() - 1);
        if second >= first {
            second += 1;
        }
        let pair = [keys[first].as_str(), keys[second].as_str()];
        let started = Instant::now();
        let outcome = locker.cycle_all(&pair, &section).await;
        tally(outcome, started, &mut run);
    }
    run
}

/// One uncontended cycle of `locker` on `key`, counted in `run`: its time
/// (ns) when it completed, `None` when it did not get the lock or failed.
pub async fn timed_cycle(
    locker: &Locker,
    key: &str,
    section: &Section,
    run: &mut CycleRun,
) -> Option<u64> {
    let started = Instant::now();
    let outcome = locker.cycle(key, section, false).await;
    tally(outcome, started, run)
}

/// Counts in `run` a cycle started at `started`: its time (ns) when it
/// completed, `None` when it did not get the lock or failed.
fn tally(outcome: BenchResult<Cycle>, started: Instant, run: &mut CycleRun) -> Option<u64> {
    match outcome {
        Ok(cycle) if cycle.done => {
            let ns = nanos(started.elapsed());
            run.cycles += 1;
            run.latencies_ns.push(ns);
            Some(ns)
        }
        Ok(cycle) => {
            run.failed += u64::from(cycle.gave_up.max(1));
            None
        }
        Err(e) => {
            note_error(&mut run.failed, &mut run.first_error, &e);
            None
        }
    }
}

/// Rounds each throughput row is split into; see [`measure_rows`]. Many
/// short rounds: this machine's speed drifts over seconds, and the finer the
/// interleaving, the less of that drift lands on one row.
pub const ROUNDS: u32 = 20;

/// Measures one throughput row per implementation of `imps` that the
/// context's transport runs, connected to `endpoint`, with the tasks
/// `tasks` describes.
///
/// Every implementation is connected and warmed up first; then the measured
/// time of each row is split into [`ROUNDS`] rounds, and each round runs
/// every implementation in turn (starting one further along each round), so
/// that a shared machine that gets busier or quieter during the run weighs
/// on every row alike and the ratios stay meaningful.
pub async fn measure_rows(
    ctx: &Context,
    workload: WorkloadId,
    imps: &[Impl],
    endpoint: &Endpoint,
    tasks: Tasks<'_>,
) -> BenchResult<Vec<Row>> {
    let imps: Vec<Impl> = imps
        .iter()
        .copied()
        .filter(|imp| ctx.impls.contains(imp) && ctx.transport.runs(*imp))
        .collect();
    let mut contenders = Vec::with_capacity(imps.len());
    for &imp in &imps {
        progress(workload, imp);
        let locker = Arc::new(Locker::connect_to(imp, endpoint).await?);
        let keys = TaskKeys::of(&locker, tasks);
        run_cycles(&locker, &keys, ctx.warmup).await?;
        contenders.push((locker, keys, CycleRun::default()));
    }
    let admin_urls = endpoint.admin_urls();
    let mut info_conns = Vec::with_capacity(admin_urls.len());
    for url in &admin_urls {
        info_conns.push(connect(url).await?);
    }
    let round = ctx.seconds / ROUNDS;
    let count = contenders.len();
    for r in 0..ROUNDS as usize {
        for i in 0..count {
            let (locker, keys, total) = &mut contenders[(r + i) % count];
            let client_before = cpu_time();
            let server_before = servers_cpu(&mut info_conns).await;
            let mut run = run_cycles(locker, keys, round).await?;
            let seconds = run.elapsed.as_secs_f64();
            if seconds > 0.0 {
                run.round_rates.push(run.cycles as f64 / seconds);
            }
            run.client_cpu = spent(client_before, cpu_time());
            run.server_cpu = spent(server_before, servers_cpu(&mut info_conns).await);
            total.absorb(run);
        }
    }
    Ok(contenders
        .into_iter()
        .zip(imps)
        .map(|((_, _, total), imp)| {
            let unit = if imp.is_floor() {
                "round trips"
            } else {
                "cycles"
            };
            total.into_row(imp, unit)
        })
        .collect())
}

/// The CPU time used between two readings; zero when either is missing.
fn spent(before: Option<Duration>, after: Option<Duration>) -> Duration {
    after.zip(before).map_or(Duration::ZERO, |(after, before)| {
        after.saturating_sub(before)
    })
}

/// The CPU time (user + system) the servers behind `conns` have used so
/// far, from `INFO cpu`; `None` if one did not say.
async fn servers_cpu(conns: &mut [MultiplexedConnection]) -> Option<Duration> {
    let mut total = 0.0;
    for conn in conns {
        let fields = info(conn, "cpu").await.ok()?;
        for name in ["used_cpu_user", "used_cpu_sys"] {
            total += fields.get(name)?.parse::<f64>().ok()?;
        }
    }
    Some(Duration::from_secs_f64(total))
}

/// What [`run_contended`] recorded in one process.
#[derive(Debug, Default)]
pub struct ContendedRun {
    /// One record per acquisition.
    pub records: Vec<Record>,
    /// Calls that gave up or failed.
    pub failed: u64,
    /// Times the in-process exclusion counter saw two holders.
    pub overlaps: u64,
    /// The first error, if any.
    pub first_error: Option<String>,
}

/// `tasks` tasks (ids `task_base..`) contending for `key` from `start_ns`
/// until `end_ns` (wall clock): each asks for the lock, runs the exclusive
/// section, releases, and asks again at once.
pub async fn run_contended(
    locker: Arc<Locker>,
    key: String,
    tasks: u32,
    task_base: u32,
    start_ns: u64,
    end_ns: u64,
) -> BenchResult<ContendedRun> {
    let exclusion = Arc::new(crate::contenders::Exclusion::default());
    let key = Arc::new(key);
    let handles: Vec<_> = (0..tasks)
        .map(|i| {
            let locker = locker.clone();
            let key = key.clone();
            let section = Section::exclusive(exclusion.clone());
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_nanos(start_ns.saturating_sub(wall_ns()))).await;
                let mut run = ContendedRun::default();
                while wall_ns() < end_ns {
                    let wait_start = wall_ns();
                    match locker.cycle(&key, &section, true).await {
                        Ok(cycle) => {
                            run.failed += u64::from(cycle.gave_up);
                            if cycle.done {
                                let (acquired, released) = section.stamps();
                                run.records.push(Record {
                                    task: task_base + i,
                                    wait_start,
                                    acquired,
                                    released,
                                });
                            }
                        }
                        Err(e) => note_error(&mut run.failed, &mut run.first_error, &e),
                    }
                }
                run
            })
        })
        .collect();
    let mut total = ContendedRun::default();
    for handle in handles {
        let run = handle
            .await
            .map_err(|e| fail(format!("a contending task died: {e}")))?;
        total.records.extend(run.records);
        total.failed += run.failed;
        if total.first_error.is_none() {
            total.first_error = run.first_error;
        }
    }
    total.overlaps = exclusion.overlaps();
    Ok(total)
}

/// The row of a contended workload: `tasks` tasks over `[start_ns, end_ns]`.
/// Overlaps are the larger of the in-process counter and the intersecting
/// intervals found among the records.
pub fn contended_row(
    imp: Impl,
    mut run: ContendedRun,
    tasks: u32,
    start_ns: u64,
    end_ns: u64,
) -> Row {
    let c = Contention::from_records(&mut run.records, tasks, start_ns, end_ns);
    let mut row = Row::new(imp, "acquisitions");
    row.rate = Some(c.acquisitions_per_s);
    row.p50_us = Some(c.wait.p50_us);
    row.p99_us = Some(c.wait.p99_us);
    row.max_us = Some(c.wait.max_us);
    row.switches_per_s = Some(c.switches_per_s);
    row.per_task = Some((c.per_task_min, c.per_task_max));
    row.overlaps = Some(c.overlaps.max(run.overlaps));
    row.failed = Some(run.failed);
    row.samples = c.acquisitions;
    row.note = run.first_error.unwrap_or_default();
    row
}

/// A few uncontended cycles, so connections are open and scripts loaded
/// before anything is measured. Failures here are ignored.
pub async fn warm_up(locker: &Locker, key: &str) {
    let section = Section::empty();
    for _ in 0..20 {
        let _ = locker.cycle(key, &section, false).await;
    }
}

/// Counts a failure and keeps the first error's text.
fn note_error(failed: &mut u64, first_error: &mut Option<String>, error: &BenchError) {
    *failed += 1;
    if first_error.is_none() {
        *first_error = Some(error.to_string());
    }
}
