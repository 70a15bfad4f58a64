//! A Jepsen-style suite: worker processes (`src/bin/jepsen-worker.rs`),
//! each with its own `LockClient`, increment a counter held by a fenced
//! register on a `redis-server` of its own, under the lock, while a nemesis
//! injects one class of fault per run. The workers report every operation;
//! the checker (`lock_testkit::jepsen::check`) holds the history against
//! the register's own log. docs/jepsen.md explains the model and shows a
//! long run.
//!
//! Each run prints one row of a Markdown table as it finishes (straight to
//! stderr, so the table shows without `--nocapture`).
//!
//! - `JEPSEN_SECONDS`: how long each run lasts, at least 3 (default: 60 s
//!   for all the runs together).
//! - `JEPSEN_ONLY`: a comma-separated list of fault classes to run
//!   (`pause-holder,kill-holder`).
//! - `JEPSEN_SEED`: the seed of the nemesis's and the workers' choices
//!   (default: the clock); printed, to run the same schedule again.
//! - `JEPSEN_HISTORY`: a directory to keep each run's history in, one
//!   `<fault>-<fenced|unfenced>.jsonl` file of events per run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use lock_testkit::jepsen::{
    self, Acquired, Event, OpKind, OpOutcome, RegisterState, Report, Workers, now_us, table,
};
use lock_testkit::{Proxy, ProxyMode, RedisServer};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use std::io::Write;
use std::process::Command;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

const WORKER_BIN: &str = env!("CARGO_BIN_EXE_jepsen-worker");
/// What all the runs together last by default.
const DEFAULT_TOTAL: Duration = Duration::from_secs(60);
/// The shortest run that has room for a fault.
const MIN_RUN: Duration = Duration::from_secs(3);
/// Workers at any time (a killed one is replaced).
const WORKERS: u32 = 3;
/// Servers of the Redlock runs.
const REDLOCK_SERVERS: usize = 5;
/// Bound on the first increment of a run, and on the first after the
/// faults are healed.
const PROGRESS_BOUND: Duration = Duration::from_secs(10);
/// Bound on the workers' exit once asked to stop.
const STOP_BOUND: Duration = Duration::from_secs(10);
/// The longest the nemesis waits for a holder in the middle of an
/// increment before it looks at the clock again.
const TRIGGER_BOUND: Duration = Duration::from_secs(2);

/// One class of fault, injected over and over during a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    /// Nothing: the baseline.
    None,
    /// `SIGSTOP` the holder in the middle of an increment for 2.5 ttls.
    PauseHolder,
    /// `SIGKILL` the holder in the middle of an increment; start another.
    KillHolder,
    /// Cut the holder off the lock server (the register stays reachable).
    PartitionHolder,
    /// `SIGSTOP` the lock server for 2.5 ttls.
    PauseServer,
    /// `SIGKILL` the lock server (AOF, `appendfsync always`) and restart it.
    CrashServer,
    /// Restart the lock server without its data.
    RestartEmpty,
    /// Redlock: pause two of five servers.
    MinorityPause,
    /// Redlock: crash two of five servers (AOF) and restart them.
    MinorityCrash,
    /// Redlock: restart two of five servers without their data.
    MinorityRestartEmpty,
    /// Redlock: crash three of five servers (AOF) for 2.5 ttls.
    MajorityOutage,
}

impl Fault {
    fn name(self) -> &'static str {
        match self {
            Fault::None => "none",
            Fault::PauseHolder => "pause-holder",
            Fault::KillHolder => "kill-holder",
            Fault::PartitionHolder => "partition-holder",
            Fault::PauseServer => "pause-server",
            Fault::CrashServer => "crash-server",
            Fault::RestartEmpty => "restart-empty",
            Fault::MinorityPause => "pause-minority",
            Fault::MinorityCrash => "crash-minority",
            Fault::MinorityRestartEmpty => "restart-empty-minority",
            Fault::MajorityOutage => "majority-outage",
        }
    }

    fn redlock(self) -> bool {
        matches!(
            self,
            Fault::MinorityPause
                | Fault::MinorityCrash
                | Fault::MinorityRestartEmpty
                | Fault::MajorityOutage
        )
    }

    /// Whether servers lose their data: what the lock's guarantees assume
    /// does not happen.
    fn forgets(self) -> bool {
        matches!(self, Fault::RestartEmpty | Fault::MinorityRestartEmpty)
    }

    /// Whether the lock servers persist every write (AOF, fsync always).
    fn persistent(self) -> bool {
        matches!(
            self,
            Fault::CrashServer | Fault::MinorityCrash | Fault::MajorityOutage
        )
    }
}

/// One run: a fault class, on one server or Redlock, fenced or not.
#[derive(Clone, Copy, Debug)]
struct Scenario {
    fault: Fault,
    fenced: bool,
}

const fn run(fault: Fault, fenced: bool) -> Scenario {
    Scenario { fault, fenced }
}

/// Every run, in order. Without fencing only where it shows something:
/// no faults (no overlap, no lost update), pauses (the documented limit:
/// lost updates) and a server that forgets (a lock granted twice).
const SCENARIOS: &[Scenario] = &[
    run(Fault::None, false),
    run(Fault::None, true),
    run(Fault::PauseHolder, false),
    run(Fault::PauseHolder, true),
    run(Fault::KillHolder, true),
    run(Fault::PartitionHolder, true),
    run(Fault::PauseServer, true),
    run(Fault::CrashServer, true),
    run(Fault::RestartEmpty, false),
    run(Fault::RestartEmpty, true),
    run(Fault::MinorityPause, true),
    run(Fault::MinorityCrash, true),
    run(Fault::MinorityRestartEmpty, true),
    run(Fault::MajorityOutage, true),
];

/// The lock settings of a run.
#[derive(Clone, Copy, Debug)]
struct Timing {
    ttl: Duration,
    /// How long a worker waits for the lock per call.
    wait: Duration,
    op_timeout: Duration,
    node_timeout: Duration,
    /// A worker's time between reading and writing the register.
    think: Duration,
}

impl Timing {
    fn of(fault: Fault) -> Timing {
        // Without faults a long ttl: a worker starved of CPU for a whole
        // ttl on a loaded machine would be a pause, and that run must show
        // none.
        let ttl = match fault {
            Fault::None => Duration::from_secs(2),
            _ => Duration::from_millis(500),
        };
        // Redlock: shorter than an outage, so calls made during one return
        // (Unavailable) before it ends.
        let wait = if fault.redlock() { ttl } else { ttl * 2 };
        Timing {
            ttl,
            wait,
            op_timeout: Duration::from_millis(250),
            node_timeout: Duration::from_millis(100),
            think: Duration::from_millis(20),
        }
    }

    /// How long a fault lasts: well past the ttl.
    fn fault(&self) -> Duration {
        self.ttl * 5 / 2
    }

    /// The quiet time after a fault is healed.
    fn quiet(&self) -> Duration {
        self.ttl
    }
}

/// Writes straight to stderr: the test harness captures `print!` and
/// `eprint!`, and the table is the point of the run.
fn say(text: &str) {
    let mut stderr = std::io::stderr().lock();
    let _ = writeln!(stderr, "{text}");
    let _ = stderr.flush();
}

fn env_seconds(name: &str) -> Option<Duration> {
    let value = std::env::var(name).ok()?;
    let seconds: f64 = value
        .parse()
        .unwrap_or_else(|e| panic!("{name}={value}: {e}"));
    Some(Duration::from_secs_f64(seconds))
}

/// The runs `JEPSEN_ONLY` selects (all by default).
fn selected() -> Vec<Scenario> {
    let only = std::env::var("JEPSEN_ONLY").unwrap_or_default();
    let names: Vec<&str> = only.split(',').filter(|n| !n.is_empty()).collect();
    for name in &names {
        assert!(
            SCENARIOS.iter().any(|s| s.fault.name() == *name),
            "JEPSEN_ONLY: no fault class {name:?}"
        );
    }
    SCENARIOS
        .iter()
        .filter(|s| names.is_empty() || names.contains(&s.fault.name()))
        .copied()
        .collect()
}

/// A long run: a minute of faults by default. `scripts/test --quick` leaves it out.
mod long {
    use super::*;

    #[test]
    fn faults_against_a_fenced_register() {
        let scenarios = selected();
        let per_run = env_seconds("JEPSEN_SECONDS")
            .unwrap_or(DEFAULT_TOTAL / u32::try_from(scenarios.len()).unwrap());
        // Room for one fault (2.5 ttls) and its quiet time after the first
        // increment.
        assert!(
            per_run >= MIN_RUN,
            "runs of {per_run:?} are too short for a fault: at least {MIN_RUN:?} each"
        );
        let seed = std::env::var("JEPSEN_SEED")
            .ok()
            .map_or_else(now_us, |s| s.parse().expect("JEPSEN_SEED"));
        say(&format!(
            "\njepsen: {} runs of {per_run:.1?}, {WORKERS} workers, seed {seed} (JEPSEN_SEED)\n",
            scenarios.len()
        ));
        say(&table::header());
        let started = Instant::now();
        let mut failures = Vec::new();
        let mut notes = Vec::new();
        for (i, scenario) in scenarios.iter().enumerate() {
            let outcome = Run::start(*scenario, seed.wrapping_add(i as u64)).go(per_run);
            say(&outcome.row);
            notes.extend(outcome.notes);
            failures.extend(outcome.failures);
        }
        say("");
        for note in &notes {
            say(&format!("- {note}"));
        }
        say(&format!("\njepsen: done in {:.1?}\n", started.elapsed()));
        assert!(
            failures.is_empty(),
            "{} failures:\n{}",
            failures.len(),
            failures.join("\n")
        );
    }
}

/// What one run printed and found.
struct Outcome {
    row: String,
    notes: Vec<String>,
    failures: Vec<String>,
}

/// One run's servers, proxies and workers.
struct Run {
    scenario: Scenario,
    timing: Timing,
    locks: Vec<RedisServer>,
    register: RedisServer,
    /// One per worker, between it and the lock server: only when the
    /// nemesis cuts workers off.
    proxies: Vec<(u32, Proxy)>,
    workers: Workers,
    next_worker: u32,
    seed: u64,
    rng: StdRng,
    /// Faults injected.
    faults: usize,
    /// Majority outages: from when the servers were down to when they
    /// were started again.
    outages: Vec<(u64, u64)>,
    failures: Vec<String>,
}

impl Run {
    /// Starts the servers and the workers.
    fn start(scenario: Scenario, seed: u64) -> Run {
        let fault = scenario.fault;
        let servers = if fault.redlock() { REDLOCK_SERVERS } else { 1 };
        let locks = thread::scope(|scope| {
            let starting: Vec<_> = (0..servers)
                .map(|_| scope.spawn(move || lock_server(fault)))
                .collect();
            starting.into_iter().map(|s| s.join().unwrap()).collect()
        });
        let mut run = Run {
            scenario,
            timing: Timing::of(fault),
            locks,
            register: RedisServer::start(),
            proxies: Vec::new(),
            workers: Workers::new(),
            next_worker: 1,
            seed,
            rng: StdRng::seed_from_u64(seed),
            faults: 0,
            outages: Vec::new(),
            failures: Vec::new(),
        };
        for _ in 0..WORKERS {
            run.spawn_worker();
        }
        run
    }

    /// Runs for `length`, then heals, checks and reports.
    fn go(mut self, length: Duration) -> Outcome {
        let until = Instant::now() + length;
        self.progress(PROGRESS_BOUND, "the first increment");
        self.nemesis(until);
        self.heal();
        self.progress(PROGRESS_BOUND, "an increment once the faults were healed");
        self.finish()
    }

    fn spawn_worker(&mut self) {
        let id = self.next_worker;
        self.next_worker += 1;
        let locks: Vec<String> = if self.scenario.fault == Fault::PartitionHolder {
            let proxy = Proxy::start(self.locks[0].addr());
            let url = proxy.url();
            self.proxies.push((id, proxy));
            vec![url]
        } else {
            self.locks.iter().map(RedisServer::url).collect()
        };
        let command = self.worker_command(id, &locks);
        if let Err(e) = self.workers.spawn(id, command) {
            panic!("{e}\n{}", self.logs());
        }
    }

    fn worker_command(&self, id: u32, locks: &[String]) -> Command {
        let t = &self.timing;
        let ms = |d: Duration| d.as_millis().to_string();
        let mut command = Command::new(WORKER_BIN);
        command.args(["--id", &id.to_string()]);
        for url in locks {
            command.args(["--lock", url]);
        }
        command
            .args(["--register", &self.register.url()])
            .args(["--ttl-ms", &ms(t.ttl), "--wait-ms", &ms(t.wait)])
            .args(["--op-timeout-ms", &ms(t.op_timeout)])
            .args(["--node-timeout-ms", &ms(t.node_timeout)])
            .args(["--think-ms", &ms(t.think)])
            .args(["--max-seconds", "3600"])
            .args(["--seed", &self.seed.to_string()]);
        if self.scenario.fenced {
            command.arg("--fencing");
        }
        command
    }

    /// Waits for the next accepted write, for at most `bound`; a run that
    /// makes none fails.
    fn progress(&mut self, bound: Duration, what: &str) {
        let history = Arc::clone(self.workers.history());
        let written = history.wait_for(history.len(), bound, |event| {
            matches!(
                event,
                Event::Op {
                    op: OpKind::Write,
                    outcome: OpOutcome::Accepted,
                    ..
                }
            )
            .then_some(())
        });
        if written.is_none() {
            self.fail(format!("no progress within {bound:?}: {what}"));
        }
    }

    /// A worker that has just read the register under the lock and is
    /// about to write it, alive and not paused; `None` after `bound`.
    fn holder_mid_increment(&self, bound: Duration) -> Option<u32> {
        let history = Arc::clone(self.workers.history());
        let found = history.wait_for(history.len(), bound, |event| match event {
            Event::Op {
                worker,
                op: OpKind::Read,
                outcome: OpOutcome::Accepted,
                ..
            } if self.workers.is_running(*worker) => Some(*worker),
            _ => None,
        });
        found.map(|(worker, _)| worker)
    }

    /// Injects the run's fault, round after round, until `until`: each
    /// round waits for a holder in the middle of an increment, strikes,
    /// heals after the fault's length, and leaves a quiet time.
    fn nemesis(&mut self, until: Instant) {
        let timing = self.timing;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            if self.scenario.fault == Fault::None || left < timing.fault() + timing.quiet() {
                thread::sleep(left);
                return;
            }
            let Some(holder) = self.holder_mid_increment(left.min(TRIGGER_BOUND)) else {
                continue;
            };
            self.strike(holder);
            self.faults += 1;
            thread::sleep(timing.quiet());
        }
    }

    /// One fault, healed before it returns.
    fn strike(&mut self, holder: u32) {
        let length = self.timing.fault();
        match self.scenario.fault {
            Fault::None => {}
            Fault::PauseHolder => {
                self.workers.pause(holder).unwrap();
                thread::sleep(length);
                self.workers.resume(holder).unwrap();
            }
            Fault::KillHolder => {
                self.workers.kill(holder);
                self.spawn_worker();
            }
            Fault::PartitionHolder => self.partition(holder, length),
            Fault::PauseServer => {
                let paused = self.locks[0].pause();
                thread::sleep(length);
                paused.resume();
            }
            Fault::CrashServer => self.crash(&[0]),
            Fault::RestartEmpty => self.locks[0].restart_empty(),
            Fault::MinorityPause => {
                let picked = self.pick(2);
                let paused: Vec<_> = picked.iter().map(|&i| self.locks[i].pause()).collect();
                thread::sleep(length);
                drop(paused);
            }
            Fault::MinorityCrash => {
                let picked = self.pick(2);
                self.crash(&picked);
            }
            Fault::MinorityRestartEmpty => {
                for i in self.pick(2) {
                    self.locks[i].restart_empty();
                }
            }
            Fault::MajorityOutage => self.outage(length),
        }
    }

    /// Cuts `worker` off the lock server for `length`: its proxy drops
    /// everything, then its connections are closed and traffic passes
    /// again.
    fn partition(&self, worker: u32, length: Duration) {
        let proxy = self
            .proxies
            .iter()
            .find(|(id, _)| *id == worker)
            .map(|(_, proxy)| proxy)
            .expect("every worker has a proxy in this run");
        proxy.set_mode(ProxyMode::Blackhole);
        thread::sleep(length);
        proxy.cut();
        proxy.set_mode(ProxyMode::Pass);
    }

    /// Kills the servers `which` and starts them again, half the time at
    /// once (within the ttl: the holder's lease is still in the AOF) and
    /// half the time after the fault's length.
    fn crash(&mut self, which: &[usize]) {
        let down = if self.rng.random_bool(0.5) {
            self.timing.ttl / 5
        } else {
            self.timing.fault()
        };
        for &i in which {
            self.locks[i].crash();
        }
        thread::sleep(down);
        for &i in which {
            self.locks[i].restart();
        }
    }

    /// Kills a majority of the servers for `length`, noting when they were
    /// down, then starts them again (with their data).
    fn outage(&mut self, length: Duration) {
        let picked = self.pick(REDLOCK_SERVERS / 2 + 1);
        for &i in &picked {
            self.locks[i].crash();
        }
        let down = now_us();
        thread::sleep(length);
        self.outages.push((down, now_us()));
        for &i in &picked {
            self.locks[i].restart();
        }
    }

    /// `n` distinct lock servers, at random.
    fn pick(&mut self, n: usize) -> Vec<usize> {
        rand::seq::index::sample(&mut self.rng, self.locks.len(), n).into_vec()
    }

    /// Undoes whatever a fault could have left behind.
    fn heal(&mut self) {
        for (_, proxy) in &self.proxies {
            proxy.set_mode(ProxyMode::Pass);
        }
        for server in &mut self.locks {
            if !server.is_running() {
                server.restart();
            }
        }
    }

    fn fail(&mut self, failure: String) {
        let label = label(self.scenario);
        self.failures.push(format!("{label}: {failure}"));
    }

    /// Stops the workers, checks the history and builds the row.
    fn finish(mut self) -> Outcome {
        let killed = self.workers.stop_all(STOP_BOUND);
        if !killed.is_empty() {
            self.fail(format!(
                "workers {killed:?} did not exit within {STOP_BOUND:?} of being asked"
            ));
        }
        let register = RegisterState::read(&self.register).unwrap();
        let history = self.workers.history();
        let events = history.events();
        keep_history(self.scenario, &events);
        let report = jepsen::check(
            &events,
            &history.malformed(),
            &register,
            self.scenario.fenced,
        );
        for violation in &report.violations {
            self.fail(violation.clone());
        }
        self.expectations(&events, &report);
        let notes = self.notes(&report);
        let fault = self.scenario.fault;
        let backend = if fault.redlock() {
            "Redlock, 5 servers"
        } else {
            "1 server"
        };
        Outcome {
            row: table::row(
                fault.name(),
                backend,
                self.scenario.fenced,
                self.faults,
                &report,
            ),
            notes,
            failures: self.failures,
        }
    }

    /// What this fault class must show beyond the checker's invariants.
    fn expectations(&mut self, events: &[Event], report: &Report) {
        let fault = self.scenario.fault;
        if fault == Fault::None && (report.overlaps > 0 || report.lost_updates > 0) {
            self.fail(format!(
                "without faults: {} overlapping leases, {} lost updates",
                report.overlaps, report.lost_updates
            ));
        }
        if fault != Fault::None && self.faults == 0 {
            self.fail("the nemesis found no holder to strike".to_owned());
        }
        // Successive holders get larger tokens while the servers keep their
        // data; after a restart without it, see the notes.
        if self.scenario.fenced && !fault.forgets() && report.token_regressions > 0 {
            self.fail(format!(
                "{} grants with a fencing token not above the previous grant's",
                report.token_regressions
            ));
        }
        // A grant that the servers decided just before they went down may
        // return a moment later.
        let margin = u64::try_from(self.timing.op_timeout.as_micros()).unwrap();
        let mut unavailable = 0;
        for &(down, up) in &self.outages.clone() {
            let calls = jepsen::calls_ended_within(events, down + margin, up);
            if let Some(granted) = calls.get(&Acquired::Ok) {
                self.fail(format!(
                    "{granted} locks granted with a majority of the servers down"
                ));
            }
            unavailable += calls.get(&Acquired::Unavailable).copied().unwrap_or(0);
        }
        if !self.outages.is_empty() && unavailable == 0 {
            self.fail("no call for the lock ended Unavailable during the outages".to_owned());
        }
    }

    /// What the run shows, in a sentence or two, under the table.
    fn notes(&self, report: &Report) -> Vec<String> {
        let label = label(self.scenario);
        let mut notes = Vec::new();
        if report.lost_updates > 0 {
            notes.push(format!(
                "{label}: {} of {} lost (counter {}): a holder that lost the lock wrote a \
                 value read before the next holder's writes",
                count(report.lost_updates, "increment"),
                report.accepted_writes,
                report.counter
            ));
        }
        if report.stale_rejected > 0 {
            notes.push(format!(
                "{label}: the register refused {} from holders that had lost the lock; \
                 counter {} = accepted writes",
                count(report.stale_rejected, "operation"),
                report.counter
            ));
        }
        if self.scenario.fault.forgets() {
            let tokens = if self.scenario.fenced {
                format!(
                    "; {} with a token not above the previous one",
                    count(report.token_regressions, "grant")
                )
            } else {
                String::new()
            };
            notes.push(format!(
                "{label}: {} without data; {} still in use after the next grant{tokens}",
                count(self.faults, "restart"),
                count(report.overlaps, "lease")
            ));
        } else if report.overlaps > 0 && report.stale_rejected == 0 && report.lost_updates == 0 {
            notes.push(format!(
                "{label}: {} still in use after the next grant, with no harm",
                count(report.overlaps, "lease")
            ));
        }
        notes
    }

    fn logs(&self) -> String {
        self.locks
            .iter()
            .chain([&self.register])
            .map(|s| format!("--- {} ---\n{}\n", s.url(), s.log()))
            .collect()
    }
}

/// A lock server for `fault`: with every write on disk before it is
/// answered when the fault crashes servers.
fn lock_server(fault: Fault) -> RedisServer {
    let builder = RedisServer::builder();
    let builder = if fault.persistent() {
        builder.args(["--appendonly", "yes", "--appendfsync", "always"])
    } else {
        builder
    };
    builder.start()
}

/// Writes the events to `JEPSEN_HISTORY`, when set.
fn keep_history(scenario: Scenario, events: &[Event]) {
    let Some(dir) = std::env::var_os("JEPSEN_HISTORY") else {
        return;
    };
    let dir = std::path::PathBuf::from(dir);
    std::fs::create_dir_all(&dir).unwrap();
    let fencing = if scenario.fenced {
        "fenced"
    } else {
        "unfenced"
    };
    let path = dir.join(format!("{}-{fencing}.jsonl", scenario.fault.name()));
    let lines: String = events.iter().map(|e| e.to_line() + "\n").collect();
    std::fs::write(&path, lines).unwrap();
}

/// `n` things, in words: "1 lease", "3 leases".
fn count(n: impl TryInto<u64> + Copy, thing: &str) -> String {
    let n: u64 = n.try_into().unwrap_or(u64::MAX);
    format!("{n} {thing}{}", if n == 1 { "" } else { "s" })
}

fn label(scenario: Scenario) -> String {
    format!(
        "{}{}",
        scenario.fault.name(),
        if scenario.fenced { "" } else { " (no fencing)" }
    )
}
