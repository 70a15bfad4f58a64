//! A worker of the Jepsen-style suite (`tests/jepsen.rs`): one process, with
//! its own `LockClient`, that takes the lock `counter` again and again and,
//! while holding it, increments the counter held by a fenced register
//! (`lock_testkit::jepsen::FencedRegister`): read, compute, write. Every
//! step is reported on stdout as one JSON event per line
//! (`lock_testkit::jepsen::Event`). It stops, releasing what it holds, when
//! its stdin closes.
//!
//! ```text
//! jepsen-worker --id 3 --lock redis://127.0.0.1:7001 [--lock ...] \
//!     --register redis://127.0.0.1:7009 --ttl-ms 500 --wait-ms 2000 \
//!     --op-timeout-ms 250 --node-timeout-ms 100 --think-ms 20 \
//!     --max-seconds 120 --seed 42 [--fencing]
//! ```
//!
//! One `--lock` is one server; three or more are Redlock. With `--fencing`
//! the lock is taken with a fencing token, and every register operation
//! carries it.

use lock_core::{ErrorKind, LockClient, LockError, LockGuard, LockOptions};
use lock_testkit::jepsen::{Acquired, Answer, Event, OpKind, Released, Reporter, emit, now_us};
use lock_testkit::{Flags, TestkitError};
use std::io::Read;
use std::process::ExitCode;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// The lock every worker takes.
const KEY: &str = "counter";
/// How long building the lock client may keep failing before the worker
/// gives up (a replacement worker may start while a server restarts).
const CONNECT_BOUND: Duration = Duration::from_secs(10);
/// The most increments made under one lease.
const MAX_INCREMENTS: u64 = 4;

/// The command line.
struct Args {
    id: u32,
    locks: Vec<String>,
    register: String,
    ttl: Duration,
    wait: Duration,
    op_timeout: Duration,
    node_timeout: Duration,
    think: Duration,
    max_run: Duration,
    seed: u64,
    fencing: bool,
}

impl Args {
    fn parse(words: impl Iterator<Item = String>) -> Result<Args, TestkitError> {
        let mut flags = Flags::parse(words, &["--fencing"])?;
        let args = Args {
            id: flags.number("--id", 0)?,
            locks: flags.one_or_more("--lock")?,
            register: flags.required("--register")?,
            ttl: flags.millis("--ttl-ms", 500)?,
            wait: flags.millis("--wait-ms", 2000)?,
            op_timeout: flags.millis("--op-timeout-ms", 250)?,
            node_timeout: flags.millis("--node-timeout-ms", 100)?,
            think: flags.millis("--think-ms", 20)?,
            max_run: Duration::from_secs(flags.number("--max-seconds", 120)?),
            seed: flags.number("--seed", 1)?,
            fencing: flags.switch("--fencing"),
        };
        flags.finish()?;
        Ok(args)
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = match Args::parse(std::env::args().skip(1)) {
        Ok(args) => args,
        Err(e) => {
            eprintln!("jepsen-worker: {e}");
            return ExitCode::from(2);
        }
    };
    let id = args.id;
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("jepsen-worker {id}: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), String> {
    let mut stop = stop_when_stdin_closes();
    let client = connect(&args).await?;
    let reporter = Reporter::start(args.id, &args.register, args.op_timeout * 4)
        .await
        .map_err(|e| e.to_string())?;
    let deadline = Instant::now() + args.max_run;
    let mut worker = Worker {
        rng: Rng::new(args.seed ^ u64::from(args.id).wrapping_mul(0x9e37_79b9_7f4a_7c15)),
        args,
        client,
        reporter,
        lease: 0,
    };
    while !*stop.borrow() && Instant::now() < deadline {
        worker.round(&mut stop).await;
    }
    Ok(())
}

/// A flag that turns true when stdin reaches its end: the test closed it,
/// or the test process is gone.
fn stop_when_stdin_closes() -> watch::Receiver<bool> {
    let (stop_tx, stop_rx) = watch::channel(false);
    std::thread::spawn(move || {
        let mut sink = [0; 64];
        while matches!(std::io::stdin().read(&mut sink), Ok(n) if n > 0) {}
        stop_tx.send_replace(true);
    });
    stop_rx
}

/// The lock client, retried for a while when the servers do not answer.
async fn connect(args: &Args) -> Result<LockClient, String> {
    let started = Instant::now();
    loop {
        let mut builder = LockClient::builder()
            .key_prefix("jepsen:")
            .operation_timeout(args.op_timeout)
            .connect_timeout(args.op_timeout)
            .urls(args.locks.iter().cloned());
        if args.locks.len() > 1 {
            builder = builder.node_timeout(args.node_timeout);
        }
        match builder.build().await {
            Ok(client) => return Ok(client),
            Err(e) if started.elapsed() >= CONNECT_BOUND => return Err(e.chain().to_string()),
            Err(_) => tokio::time::sleep(args.op_timeout).await,
        }
    }
}

struct Worker {
    args: Args,
    client: LockClient,
    reporter: Reporter,
    /// The number of the last lease asked for.
    lease: u32,
    rng: Rng,
}

impl Worker {
    /// Asks for the lock once; when granted, increments and releases.
    async fn round(&mut self, stop: &mut watch::Receiver<bool>) {
        self.lease += 1;
        let lease = self.lease;
        let options = LockOptions::new(self.args.ttl)
            .wait(self.args.wait)
            .fencing(self.args.fencing);
        let start = now_us();
        let result = tokio::select! {
            result = self.client.lock_with(KEY, options) => result,
            _ = stop.wait_for(|stopped| *stopped) => return,
        };
        let end = now_us();
        let outcome = match &result {
            Ok(_) => Acquired::Ok,
            Err(e) => acquire_error(e),
        };
        let token = result.as_ref().ok().and_then(LockGuard::fencing_token);
        emit(&Event::Acquire {
            worker: self.args.id,
            lease,
            start,
            end,
            outcome,
            token,
        });
        match result {
            Ok(guard) => {
                self.hold(&guard, lease).await;
                self.release(guard, lease).await;
                // Let the workers that heard the release get in first now
                // and then.
                let breath = self.rng.below(self.args.think.as_millis() as u64 / 2 + 1);
                tokio::time::sleep(Duration::from_millis(breath)).await;
            }
            // A call that failed at once must not spin.
            Err(_) => tokio::time::sleep(self.args.think).await,
        }
    }

    /// Up to [`MAX_INCREMENTS`] increments under the lease, each a read and
    /// a write of the register. The holder checks its lease before each
    /// increment, as a careful one would, and stops at the first refusal.
    async fn hold(&mut self, guard: &LockGuard, lease: u32) {
        let token = guard.fencing_token();
        for _ in 0..=self.rng.below(MAX_INCREMENTS) {
            if self.noticed_loss(guard, lease) {
                return;
            }
            let Answer::Accepted(value) =
                self.reporter.operate(lease, OpKind::Read, token, 0).await
            else {
                return;
            };
            // Computing the new value. A pause that lands between the check
            // and the write is the one no check can catch: the write goes
            // out when the process runs again, whatever happened meanwhile.
            tokio::time::sleep(self.args.think).await;
            let written = self
                .reporter
                .operate(lease, OpKind::Write, token, value + 1)
                .await;
            if !matches!(written, Answer::Accepted(_)) {
                return;
            }
        }
    }

    /// Whether the lease is known lost (reported when it is).
    fn noticed_loss(&self, guard: &LockGuard, lease: u32) -> bool {
        let lost = guard.is_lost();
        if lost {
            self.reporter.lost(lease);
        }
        lost
    }

    /// Releases the lease, reported.
    async fn release(&self, guard: LockGuard, lease: u32) {
        let start = now_us();
        let outcome = match guard.release().await {
            Ok(true) => Released::Released,
            Ok(false) => Released::NotOurs,
            Err(e) if e.kind() == ErrorKind::Lost => Released::NotOurs,
            Err(_) => Released::Failed,
        };
        self.reporter.released(lease, start, outcome);
    }
}

fn acquire_error(error: &LockError) -> Acquired {
    match error.kind() {
        ErrorKind::Contended => Acquired::Contended,
        ErrorKind::Unavailable => Acquired::Unavailable,
        _ => Acquired::Failed,
    }
}

/// xorshift64*: the worker's choices (increments per lease, pauses between
/// leases), reproducible from the seed.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed | 1)
    }

    /// A number in `0..n` (`n` at least 1).
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n.max(1)
    }
}
