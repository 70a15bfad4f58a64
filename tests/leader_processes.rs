//! Leader election across processes: five workers
//! (`src/bin/leader-worker.rs`), each with its own `LockClient`, campaign
//! for one election and, while they lead, increment a counter held by a
//! fenced register (`lock_testkit::jepsen::FencedRegister`) with their term
//! as the fencing token. A nemesis here waits for each new leader to write,
//! then tells it to resign, kills it (`SIGKILL`, and starts a replacement),
//! or freezes it (`SIGSTOP`) in the middle of an increment for twice its
//! ttl. From the workers' events and the register's own log the test
//! checks what a user of an election relies on:
//!
//! - terms strictly increase from one leader to the next;
//! - no operation with a stale term is accepted by the register (the
//!   frozen leader's late write is refused), and no increment is lost;
//! - after a crash, the next leader is elected within the ttl and 100 ms
//!   of the crash; within 100 ms (plus a margin for this loaded machine) of
//!   the crashed leader's lease expiry, read from the servers (`PTTL`)
//!   right after the crash, and never before it;
//! - after a resignation, the next leader is elected within 20 ms (median,
//!   from the moment the leader called `resign`).
//!
//! On Redlock with one server frozen, split votes make crash takeovers
//! slower at times, and the bound on the slowest there is looser: see
//! [`REDLOCK`].
//!
//! Each run prints its figures straight to stderr (shown without
//! `--nocapture`).
//!
//! - `LEADER_SECONDS`: the length of each run (at least 5 s; by default
//!   60 s).
//! - `LEADER_SEED`: the seed of the nemesis's choices (default: the
//!   clock); printed, to strike the same way again.
//! - `LEADER_HISTORY`: a directory to keep each run's events in, one
//!   `<run>.jsonl` file per run, and the faults in `<run>.faults`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use lock_testkit::jepsen::{self, Acquired, Event, OpKind, OpOutcome, Released, Workers, now_us};
use lock_testkit::{RedisServer, start_servers};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use std::io::Write;
use std::process::Command;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

const WORKER_BIN: &str = env!("CARGO_BIN_EXE_leader-worker");
/// Where the workers' election is stored: their key prefix `leader:` and
/// the election `election`.
const STORAGE_KEY: &str = "leader:{election}";
/// Campaigners at any time (a killed one is replaced).
const WORKERS: u32 = 5;
/// The leaders' lease: short, so that crashes are taken over quickly.
const TTL: Duration = Duration::from_millis(500);
/// How long a frozen leader stays frozen: well past its ttl.
const FREEZE: Duration = Duration::from_millis(1000);
/// What an election promises after a crash: the next leader within this
/// of the crashed lease's expiry.
const CRASH_BOUND: Duration = Duration::from_millis(100);
/// What a loaded 2-core machine may add to it. On one server the
/// campaigners' timers fire at the expiry and the takeover is measured at
/// a few milliseconds over it (21 ms at worst in five runs), but a process
/// woken then shares two cores with four other workers, two servers and
/// whatever else builds: it may wait tens of milliseconds for one.
const LOAD_MARGIN: Duration = Duration::from_millis(50);
/// What an election promises after a resignation: the next leader within
/// this (the median).
const RESIGN_MEDIAN: Duration = Duration::from_millis(20);
/// How soon the next leader must come: after a resignation (the median,
/// from the call), and past a crashed lease's expiry (the median, and the
/// slowest).
#[derive(Clone, Copy, Debug)]
struct Bounds {
    resign_median: Duration,
    crash_median: Duration,
    crash_max: Duration,
}

/// One server: the promised bounds, every crash takeover within 100 ms of
/// the expiry and the margin.
const ONE_SERVER: Bounds = Bounds {
    resign_median: RESIGN_MEDIAN,
    crash_median: CRASH_BOUND.saturating_add(LOAD_MARGIN),
    crash_max: CRASH_BOUND.saturating_add(LOAD_MARGIN),
};

/// Redlock with one of three servers frozen. Campaigners try at the same
/// moment, at the expiry (each was timed by the same remaining lease) or on
/// the release message, and two of them often each win one of the two live
/// servers. Both undo without waking anyone (`Wait::Undo` in lock-core's
/// `backend/quorum.rs`); the one that won the first server to answer comes
/// back at once and the other on its backoff (`Lost::Ahead` in
/// `acquire/mod.rs`), so a split costs a round trip, not a backoff. When
/// every contender came back on its jittered backoff instead, the slowest
/// crash takeovers came 49-146 ms past the expiry (seven runs); with the
/// one ahead coming back at once, 13-28 ms in seven runs and 83 ms in an
/// eighth. The bound on the slowest leaves room for one more split than
/// one server's: 50 ms.
const REDLOCK: Bounds = Bounds {
    resign_median: RESIGN_MEDIAN,
    crash_median: CRASH_BOUND.saturating_add(LOAD_MARGIN),
    crash_max: CRASH_BOUND
        .saturating_add(LOAD_MARGIN)
        .saturating_add(Duration::from_millis(50)),
};

/// Bound on the election of a leader when the nemesis waits for one.
const LEADER_BOUND: Duration = Duration::from_secs(5);
/// Bound on a leader's next write when the nemesis waits for it.
const WRITE_BOUND: Duration = Duration::from_secs(2);
/// Bound on the workers' exit once asked to stop.
const STOP_BOUND: Duration = Duration::from_secs(10);
/// Enough leaders frozen between their read and their write that one at
/// least must have written late (most do: the nemesis strikes right after
/// the read, in the 30 ms the worker computes).
const MIN_FREEZES: usize = 5;
/// Grants before a crashed lease's expiry by the servers' `PTTL`, read
/// with millisecond precision: this much earlier is rounding, not a
/// second leader.
const ROUNDING: u64 = 2_000;

/// The runs are long: `scripts/test --quick` leaves them out (`long::`).
mod long {
    use super::*;

    /// One run at a time: each keeps both cores busy, and the timings are the
    /// point.
    static SERIAL: Mutex<()> = Mutex::new(());

    #[test]
    fn one_server_for_a_minute() {
        let _one = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
        let servers = vec![RedisServer::start()];
        let length = run_length(Duration::from_secs(60));
        let run = Run::start("1 server", &servers, None, ONE_SERVER);
        run.go(length).verdict();
    }

    /// Redlock over three servers, one frozen (`SIGSTOP`) for the whole run:
    /// every call must do with the other two, for a minute as on one server.
    ///
    /// Split votes make the slowest takeovers slower here: see [`REDLOCK`].
    #[test]
    fn redlock_with_a_frozen_server_for_a_minute() {
        let _one = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
        let servers = start_servers(3);
        let length = run_length(Duration::from_secs(60));
        let frozen = servers[2].pause();
        let run = Run::start("Redlock, 1 of 3 frozen", &servers, Some(2), REDLOCK);
        let outcome = run.go(length);
        drop(frozen);
        outcome.verdict();
    }
}

fn run_length(default: Duration) -> Duration {
    let Ok(value) = std::env::var("LEADER_SECONDS") else {
        return default;
    };
    let seconds: f64 = value
        .parse()
        .unwrap_or_else(|e| panic!("LEADER_SECONDS={value}: {e}"));
    assert!(seconds >= 5.0, "LEADER_SECONDS: at least 5");
    Duration::from_secs_f64(seconds)
}

/// Writes straight to stderr: the test harness captures `eprint!`, and
/// the figures are the point of the run.
fn say(text: &str) {
    let mut stderr = std::io::stderr().lock();
    let _ = writeln!(stderr, "{text}");
    let _ = stderr.flush();
}

/// What the nemesis does to a leader.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    /// Tell it to resign.
    Resign,
    /// `SIGKILL` it, and start a replacement.
    Kill,
    /// `SIGSTOP` it between reading and writing the register, for
    /// [`FREEZE`].
    Freeze,
}

/// One fault, as struck.
#[derive(Clone, Copy, Debug)]
struct Strike {
    fault: Fault,
    worker: u32,
    /// The worker's number for that leadership (the events' `lease`).
    lease: u32,
    term: u64,
    /// When it was struck ([`now_us`]).
    at: u64,
    /// For a crash, when its lease expired: by the servers' `PTTL`, read
    /// once the process was dead or frozen.
    expiry: Option<u64>,
}

/// A leader, as its worker reported it.
#[derive(Clone, Copy, Debug)]
struct Grant {
    worker: u32,
    lease: u32,
    term: u64,
    /// When its campaign returned.
    at: u64,
}

/// The grant in `event`, if it is one.
fn grant(event: &Event) -> Option<Grant> {
    match *event {
        Event::Acquire {
            worker,
            lease,
            end,
            outcome: Acquired::Ok,
            token: Some(term),
            ..
        } => Some(Grant {
            worker,
            lease,
            term,
            at: end,
        }),
        _ => None,
    }
}

/// One run: the servers, the register, the workers and the nemesis.
struct Run<'a> {
    name: &'static str,
    locks: &'a [RedisServer],
    /// The lock server frozen for the whole run, if any.
    frozen: Option<usize>,
    /// How soon the next leader must come.
    bounds: Bounds,
    register: RedisServer,
    workers: Workers,
    next_worker: u32,
    rng: StdRng,
    strikes: Vec<Strike>,
    failures: Vec<String>,
    /// Where the nemesis looks for the next leader in the history.
    cursor: usize,
}

impl<'a> Run<'a> {
    fn start(
        name: &'static str,
        locks: &'a [RedisServer],
        frozen: Option<usize>,
        bounds: Bounds,
    ) -> Run<'a> {
        let seed = std::env::var("LEADER_SEED")
            .ok()
            .map_or_else(now_us, |s| s.parse().expect("LEADER_SEED"));
        say(&format!(
            "\nleader election, {name}: seed {seed} (LEADER_SEED)"
        ));
        let mut run = Run {
            name,
            locks,
            frozen,
            bounds,
            register: RedisServer::start(),
            workers: Workers::new(),
            next_worker: 1,
            rng: StdRng::seed_from_u64(seed),
            strikes: Vec::new(),
            failures: Vec::new(),
            cursor: 0,
        };
        for _ in 0..WORKERS {
            run.spawn_worker();
        }
        run
    }

    fn spawn_worker(&mut self) {
        let id = self.next_worker;
        self.next_worker += 1;
        let mut command = Command::new(WORKER_BIN);
        command.args(["--id", &id.to_string()]);
        for server in self.locks {
            command.args(["--lock", &server.url()]);
        }
        command
            .args(["--register", &self.register.url()])
            .args(["--ttl-ms", &TTL.as_millis().to_string()])
            .args(["--op-timeout-ms", "250", "--node-timeout-ms", "100"])
            .args(["--think-ms", "30", "--every-ms", "40", "--rest-ms", "50"]);
        if let Err(e) = self.workers.spawn(id, command) {
            panic!("{e}\n{}", self.logs());
        }
    }

    /// Strikes leader after leader for `length`, then stops the workers
    /// and checks what they did.
    fn go(mut self, length: Duration) -> Outcome {
        let until = Instant::now() + length;
        let started = Instant::now();
        while Instant::now() < until {
            let Some(leader) = self.next_leader() else {
                self.fail(format!("no leader elected within {LEADER_BOUND:?}"));
                break;
            };
            let fault = match self.rng.random_range(0..4) {
                0 | 1 => Fault::Resign,
                2 => Fault::Kill,
                _ => Fault::Freeze,
            };
            if let Some(strike) = self.strike(leader, fault) {
                self.strikes.push(strike);
                self.aftermath(strike);
            }
        }
        let ran = started.elapsed();
        self.finish(ran)
    }

    /// The latest leader elected since the last one the nemesis saw.
    fn next_leader(&mut self) -> Option<Grant> {
        let history = Arc::clone(self.workers.history());
        let (mut leader, mut next) = history.wait_for(self.cursor, LEADER_BOUND, grant)?;
        // Several may have come in the meantime: the last one leads.
        while let Some((later, after)) = history.wait_for(next, Duration::ZERO, grant) {
            (leader, next) = (later, after);
        }
        self.cursor = next;
        Some(leader)
    }

    /// Lets `leader` write once to three times, then strikes it. `None`
    /// when it stopped leading first (its lease lost on its own, a
    /// campaign that returned late): no fault then.
    fn strike(&mut self, leader: Grant, fault: Fault) -> Option<Strike> {
        let writes = self.rng.random_range(1..=3);
        let history = Arc::clone(self.workers.history());
        let mut seen = 0;
        // A frozen leader is frozen after a read it was answered, while it
        // computes the value to write.
        let reads = usize::from(fault == Fault::Freeze);
        let mut wanted = |event: &Event| {
            let Event::Op {
                worker,
                lease,
                op,
                outcome: OpOutcome::Accepted,
                ..
            } = event
            else {
                return None;
            };
            let counted = match op {
                OpKind::Write => seen < writes,
                OpKind::Read => seen == writes,
            };
            if *worker == leader.worker && *lease == leader.lease && counted {
                seen += 1;
            }
            (seen == writes + reads).then_some(())
        };
        history.wait_for(self.cursor, WRITE_BOUND, &mut wanted)?;
        if history
            .wait_for(self.cursor, Duration::ZERO, grant)
            .is_some()
        {
            return None;
        }
        let at = now_us();
        let expiry = match fault {
            Fault::Resign => {
                let order = format!("resign {}", leader.term);
                self.workers.tell(leader.worker, &order).ok()?;
                None
            }
            Fault::Kill => {
                self.workers.crash(leader.worker).ok()?;
                Some(self.expiry())
            }
            Fault::Freeze => {
                self.workers.pause(leader.worker).ok()?;
                Some(self.expiry())
            }
        };
        Some(Strike {
            fault,
            worker: leader.worker,
            lease: leader.lease,
            term: leader.term,
            at,
            expiry,
        })
    }

    /// When the election's lease expires, by the servers that answer: the
    /// latest of their expiries (a campaigner needs every one of them free
    /// when one of three is frozen).
    fn expiry(&self) -> u64 {
        self.locks
            .iter()
            .enumerate()
            .filter(|(i, _)| Some(*i) != self.frozen)
            .map(|(_, server)| {
                let asked = now_us();
                let pttl: i64 = server.cmd(&["PTTL", STORAGE_KEY]);
                asked + u64::try_from(pttl.max(0)).unwrap() * 1000
            })
            .max()
            .unwrap()
    }

    /// After a fault: waits for the next leader, then starts a replacement
    /// for a killed worker, or lets a frozen one run again once it has
    /// been frozen for [`FREEZE`].
    fn aftermath(&mut self, strike: Strike) {
        let history = Arc::clone(self.workers.history());
        let bound = TTL * 2 + LEADER_BOUND;
        let next = history.wait_for(self.cursor, bound, |event| {
            grant(event).filter(|g| g.term > strike.term)
        });
        if next.is_none() {
            self.fail(format!("{strike:?}: no next leader within {bound:?}"));
        }
        match strike.fault {
            Fault::Resign => {}
            Fault::Kill => self.spawn_worker(),
            Fault::Freeze => {
                let frozen_for = Duration::from_micros(now_us().saturating_sub(strike.at));
                thread::sleep(FREEZE.saturating_sub(frozen_for));
                self.workers.resume(strike.worker).unwrap();
            }
        }
    }

    fn fail(&mut self, failure: String) {
        self.failures.push(format!("{}: {failure}", self.name));
    }

    fn logs(&self) -> String {
        self.locks
            .iter()
            .enumerate()
            .filter(|(i, _)| Some(*i) != self.frozen)
            .map(|(_, s)| s)
            .chain([&self.register])
            .map(|s| format!("--- {} ---\n{}\n", s.url(), s.log()))
            .collect()
    }
}

/// What a run found.
struct Outcome {
    failures: Vec<String>,
}

impl Outcome {
    fn verdict(self) {
        assert!(
            self.failures.is_empty(),
            "{} failures:\n{}",
            self.failures.len(),
            self.failures.join("\n")
        );
    }
}

impl Run<'_> {
    /// Stops the workers and checks their history against the register.
    fn finish(mut self, ran: Duration) -> Outcome {
        let killed = self.workers.stop_all(STOP_BOUND);
        if !killed.is_empty() {
            self.fail(format!(
                "workers {killed:?} did not exit within {STOP_BOUND:?} of being asked"
            ));
        }
        let register = jepsen::RegisterState::read(&self.register).unwrap();
        let history = self.workers.history();
        let events = history.events();
        keep_history(self.name, &events, &self.strikes);
        let report = jepsen::check(&events, &history.malformed(), &register, true);
        for violation in &report.violations {
            self.fail(violation.clone());
        }
        let grants = self.check_terms(&events);
        let strikes = self.strikes.clone();
        let counts = |fault| strikes.iter().filter(|s| s.fault == fault).count();
        say(&format!(
            "{}: {ran:.1?}, {} leaders, {} resigned, {} killed, {} frozen; register: {} \
             writes accepted, {} stale operations refused, counter {}",
            self.name,
            grants.len(),
            counts(Fault::Resign),
            counts(Fault::Kill),
            counts(Fault::Freeze),
            report.accepted_writes,
            report.stale_rejected,
            report.counter,
        ));
        self.check_resignations(&events, &grants);
        self.check_crashes(&grants);
        // Without a late write refused, the run would not have shown that
        // the term protects anything.
        if counts(Fault::Freeze) >= MIN_FREEZES && report.stale_rejected == 0 {
            self.fail(format!(
                "{} leaders frozen mid-increment, and none made a late write to refuse",
                counts(Fault::Freeze)
            ));
        }
        Outcome {
            failures: self.failures,
        }
    }

    /// Every term is above the one before, in the order the leaders were
    /// elected. Returns the grants in that order.
    fn check_terms(&mut self, events: &[Event]) -> Vec<Grant> {
        let mut grants: Vec<Grant> = events.iter().filter_map(grant).collect();
        grants.sort_by_key(|g| g.at);
        let regressions: Vec<String> = grants
            .windows(2)
            .filter(|pair| pair[1].term <= pair[0].term)
            .map(|pair| {
                format!(
                    "w{} term {} after {:?}",
                    pair[1].worker, pair[1].term, pair[0]
                )
            })
            .collect();
        if !regressions.is_empty() {
            self.fail(format!(
                "{} leaders elected with a term not above the previous leader's: {}",
                regressions.len(),
                regressions
                    .iter()
                    .take(5)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join("; ")
            ));
        }
        grants
    }

    /// The next leader after the leader of `term`.
    fn successor(grants: &[Grant], term: u64) -> Option<Grant> {
        grants
            .iter()
            .filter(|g| g.term > term)
            .min_by_key(|g| g.term)
            .copied()
    }

    /// From each resignation asked for (from when the leader called
    /// `resign`) to the next leader's election: median within the run's
    /// [`Bounds`].
    fn check_resignations(&mut self, events: &[Event], grants: &[Grant]) {
        let mut from_call = Vec::new();
        let mut from_return = Vec::new();
        let mut alone = 0;
        for strike in self.strikes.iter().filter(|s| s.fault == Fault::Resign) {
            let released = events.iter().find_map(|event| match *event {
                Event::Release {
                    worker,
                    lease,
                    start,
                    end,
                    outcome: Released::Released,
                } if worker == strike.worker && lease == strike.lease => Some((start, end)),
                _ => None,
            });
            // A leader that lost its lease before it could resign is not
            // followed by a resignation's wake-up.
            let (Some((called, returned)), Some(next)) =
                (released, Run::successor(grants, strike.term))
            else {
                continue;
            };
            // Nobody else was campaigning (the others just killed, their
            // replacements still starting): the resigner itself comes back
            // after its rest (`--rest-ms`), which is no takeover.
            if next.worker == strike.worker {
                alone += 1;
                continue;
            }
            from_call.push(micros_between(called, next.at));
            from_return.push(micros_between(returned, next.at));
        }
        let call = Figures::of(&mut from_call);
        let ret = Figures::of(&mut from_return);
        say(&format!(
            "{}: resignation to next leader, from the call: {call}; from its return: {ret}; \
             {alone} resigned with nobody else campaigning",
            self.name
        ));
        if from_call.is_empty() {
            self.fail("no resignation was followed by a leader".to_owned());
        } else if call.median > self.bounds.resign_median {
            self.fail(format!(
                "the next leader came {:?} (median) after a resignation, over {:?}",
                call.median, self.bounds.resign_median
            ));
        }
    }

    /// From each crashed (killed or frozen) leader's lease expiry to the
    /// next leader's election: within the run's [`Bounds`], and never
    /// before it.
    fn check_crashes(&mut self, grants: &[Grant]) {
        let mut over_expiry = Vec::new();
        let mut from_crash = Vec::new();
        let crashes: Vec<Strike> = self
            .strikes
            .iter()
            .filter(|s| s.fault != Fault::Resign)
            .copied()
            .collect();
        for strike in &crashes {
            let (Some(expiry), Some(next)) = (strike.expiry, Run::successor(grants, strike.term))
            else {
                continue;
            };
            if next.at + ROUNDING < expiry {
                self.fail(format!(
                    "{strike:?}: the next leader {next:?} was elected {} µs before the lease \
                     expired",
                    expiry - next.at
                ));
            }
            over_expiry.push(micros_between(expiry, next.at));
            from_crash.push(micros_between(strike.at, next.at));
        }
        let over = Figures::of(&mut over_expiry);
        let gap = Figures::of(&mut from_crash);
        say(&format!(
            "{}: crash to next leader, over the lease's expiry: {over}; from the crash \
             (ttl {TTL:?}): {gap}",
            self.name
        ));
        if crashes.is_empty() {
            self.fail("the nemesis crashed no leader".to_owned());
        }
        let bounds = self.bounds;
        if over.median > bounds.crash_median || over.max > bounds.crash_max {
            self.fail(format!(
                "crashed leaders were followed {:?} (median) and {:?} (at most) after their \
                 leases expired: over {bounds:?}",
                over.median, over.max
            ));
        }
        // The promise in the words a user of the election reads: never
        // longer than the ttl and 100 ms without a leader after a crash, on
        // one server and on Redlock alike. The lease expires at most a ttl
        // after the crash (its last renewal came before), so this holds when
        // the takeover comes within 100 ms of the expiry; it leaves the
        // margin above only to a crash that came just after a renewal.
        if gap.max > TTL + CRASH_BOUND {
            self.fail(format!(
                "no leader for {:?} after a crash, over the ttl and {CRASH_BOUND:?}",
                gap.max
            ));
        }
    }
}

/// Writes the events and the faults to `LEADER_HISTORY`, when set.
fn keep_history(run: &str, events: &[Event], strikes: &[Strike]) {
    let Some(dir) = std::env::var_os("LEADER_HISTORY") else {
        return;
    };
    let dir = std::path::PathBuf::from(dir);
    std::fs::create_dir_all(&dir).unwrap();
    let name: String = run
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    let lines: String = events.iter().map(|e| e.to_line() + "\n").collect();
    std::fs::write(dir.join(format!("{name}.jsonl")), lines).unwrap();
    let faults: String = strikes.iter().map(|s| format!("{s:?}\n")).collect();
    std::fs::write(dir.join(format!("{name}.faults")), faults).unwrap();
}

/// `to - from`, both [`now_us`] times, as a duration (zero if `to` came
/// first).
fn micros_between(from: u64, to: u64) -> Duration {
    Duration::from_micros(to.saturating_sub(from))
}

/// The median, 99th percentile and maximum of some durations.
#[derive(Clone, Copy, Debug, Default)]
struct Figures {
    count: usize,
    median: Duration,
    p99: Duration,
    max: Duration,
}

impl Figures {
    fn of(samples: &mut [Duration]) -> Figures {
        samples.sort();
        let Some(&max) = samples.last() else {
            return Figures::default();
        };
        let at = |fraction: f64| samples[((samples.len() - 1) as f64 * fraction).round() as usize];
        Figures {
            count: samples.len(),
            median: at(0.5),
            p99: at(0.99),
            max,
        }
    }
}

impl std::fmt::Display for Figures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "median {:.1?}, p99 {:.1?}, max {:.1?} ({} samples)",
            self.median, self.p99, self.max, self.count
        )
    }
}
