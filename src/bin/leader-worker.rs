//! A worker of the leader-election suite (`tests/leader_processes.rs`):
//! one process, with its own `LockClient`, that campaigns for the election
//! `election` again and again and, while it leads, increments the counter
//! held by a fenced register (`lock_testkit::jepsen::FencedRegister`) with
//! its term as the fencing token: read, compute, write. Every step is
//! reported on stdout as one JSON event per line
//! (`lock_testkit::jepsen::Event`): a campaign is an `acquire` (its token
//! is the term), a resignation a `release`.
//!
//! ```text
//! leader-worker --id 3 --lock redis://127.0.0.1:7001 [--lock ...] \
//!     --register redis://127.0.0.1:7009 --ttl-ms 500 --op-timeout-ms 250 \
//!     --node-timeout-ms 100 --think-ms 30 --every-ms 40 --rest-ms 50
//! ```
//!
//! One `--lock` is one server; three or more are Redlock. It reads commands
//! on stdin, one a line: `resign <term>` resigns if it leads with that term
//! (an order meant for an earlier term is ignored). It stops, resigning if
//! it leads, when its stdin closes.

use lock_core::{ErrorKind, Leadership, LockClient, LockError};
use lock_testkit::jepsen::{Acquired, Answer, Event, OpKind, Released, Reporter, emit, now_us};
use lock_testkit::{Flags, TestkitError};
use std::io::BufRead;
use std::process::ExitCode;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// The election every worker campaigns in.
const KEY: &str = "election";
/// The key prefix of the workers' clients: the election's lock is stored
/// at `leader:{election}`.
const PREFIX: &str = "leader:";
/// How long building the lock client may keep failing before the worker
/// gives up.
const CONNECT_BOUND: Duration = Duration::from_secs(10);

/// The command line.
struct Args {
    id: u32,
    locks: Vec<String>,
    register: String,
    ttl: Duration,
    op_timeout: Duration,
    node_timeout: Duration,
    /// Between reading the register and writing it.
    think: Duration,
    /// Between two increments while leading.
    every: Duration,
    /// After resigning, before campaigning again: the others get in first.
    rest: Duration,
}

impl Args {
    fn parse(words: impl Iterator<Item = String>) -> Result<Args, TestkitError> {
        let mut flags = Flags::parse(words, &[])?;
        let args = Args {
            id: flags.number("--id", 0)?,
            locks: flags.one_or_more("--lock")?,
            register: flags.required("--register")?,
            ttl: flags.millis("--ttl-ms", 500)?,
            op_timeout: flags.millis("--op-timeout-ms", 250)?,
            node_timeout: flags.millis("--node-timeout-ms", 100)?,
            think: flags.millis("--think-ms", 30)?,
            every: flags.millis("--every-ms", 40)?,
            rest: flags.millis("--rest-ms", 50)?,
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
            eprintln!("leader-worker: {e}");
            return ExitCode::from(2);
        }
    };
    let id = args.id;
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("leader-worker {id}: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), String> {
    let orders = read_orders();
    let client = connect(&args).await?;
    let reporter = Reporter::start(args.id, &args.register, args.op_timeout * 4)
        .await
        .map_err(|e| e.to_string())?;
    let mut worker = Worker {
        args,
        client,
        reporter,
        orders,
        lease: 0,
    };
    while !worker.stopped() {
        worker.round().await;
    }
    Ok(())
}

/// What the test asks of the worker on its stdin.
struct Orders {
    /// The last term it was told to resign (0: none yet).
    resign: watch::Receiver<u64>,
    /// True once stdin has closed: the test is done, or gone.
    stop: watch::Receiver<bool>,
}

/// Reads stdin on a thread of its own: `resign <term>` lines, and its end.
fn read_orders() -> Orders {
    let (resign_tx, resign) = watch::channel(0);
    let (stop_tx, stop) = watch::channel(false);
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            let term = line
                .strip_prefix("resign ")
                .and_then(|term| term.trim().parse::<u64>().ok());
            match term {
                Some(term) => resign_tx.send_replace(term),
                None => {
                    eprintln!("leader-worker: an order it does not know: {line:?}");
                    continue;
                }
            };
        }
        stop_tx.send_replace(true);
    });
    Orders { resign, stop }
}

/// The lock client, retried for a while when the servers do not answer.
async fn connect(args: &Args) -> Result<LockClient, String> {
    let started = Instant::now();
    loop {
        let mut builder = LockClient::builder()
            .key_prefix(PREFIX)
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

/// How a leadership ended.
enum Ended {
    /// Resigned when told: rest, then campaign again.
    Resigned,
    /// Lost, or refused by the register: campaign again at once.
    Lost,
    /// Stdin closed: resigned, and the worker exits.
    Stopped,
}

struct Worker {
    args: Args,
    client: LockClient,
    reporter: Reporter,
    orders: Orders,
    /// The number of the last campaign, for the events' `lease`.
    lease: u32,
}

impl Worker {
    fn stopped(&self) -> bool {
        *self.orders.stop.borrow()
    }

    /// Campaigns once; when elected, leads until it resigns or loses.
    async fn round(&mut self) {
        self.lease += 1;
        let lease = self.lease;
        let start = now_us();
        let mut stop = self.orders.stop.clone();
        let result = tokio::select! {
            result = self.client.campaign(KEY, self.args.ttl) => result,
            _ = stop.wait_for(|stopped| *stopped) => return,
        };
        let end = now_us();
        emit(&Event::Acquire {
            worker: self.args.id,
            lease,
            start,
            end,
            outcome: result
                .as_ref()
                .map_or_else(campaign_error, |_| Acquired::Ok),
            token: result.as_ref().ok().map(Leadership::term),
        });
        let Ok(leadership) = result else {
            // A campaign that failed (Redis unreachable past the wait)
            // must not spin.
            tokio::time::sleep(self.args.think).await;
            return;
        };
        if let Ended::Resigned = self.lead(leadership, lease).await {
            tokio::time::sleep(self.args.rest).await;
        }
    }

    /// Increments the register every `every` while leading, until told to
    /// resign (or to stop), or until the lease is lost.
    async fn lead(&mut self, leadership: Leadership, lease: u32) -> Ended {
        let term = leadership.term();
        let mut resign = self.orders.resign.clone();
        let mut stop = self.orders.stop.clone();
        loop {
            if !self.increment(&leadership, lease).await {
                // Refused or lost: a later term leads. Dropping resigns in
                // the background, a no-op on a lease no longer ours.
                return Ended::Lost;
            }
            tokio::select! {
                biased;
                _ = stop.wait_for(|stopped| *stopped) => {
                    self.resign(leadership, lease).await;
                    return Ended::Stopped;
                }
                _ = resign.wait_for(|told| *told == term) => {
                    self.resign(leadership, lease).await;
                    return Ended::Resigned;
                }
                () = leadership.lost() => {
                    self.report_lost(lease);
                    return Ended::Lost;
                }
                () = tokio::time::sleep(self.args.every) => {}
            }
        }
    }

    /// One increment under the term: a careful leader checks its lease
    /// first, then reads, computes and writes, each carrying the term.
    /// `false` when it found the lease lost or the register refused.
    async fn increment(&mut self, leadership: &Leadership, lease: u32) -> bool {
        if leadership.is_lost() {
            self.report_lost(lease);
            return false;
        }
        let term = Some(leadership.term());
        let Answer::Accepted(value) = self.reporter.operate(lease, OpKind::Read, term, 0).await
        else {
            return false;
        };
        // Computing the new value. A pause that lands here is the one no
        // check can catch: the write goes out when the process runs again,
        // and only the term can get it refused.
        tokio::time::sleep(self.args.think).await;
        let written = self
            .reporter
            .operate(lease, OpKind::Write, term, value + 1)
            .await;
        !matches!(written, Answer::Rejected { .. })
    }

    fn report_lost(&self, lease: u32) {
        self.reporter.lost(lease);
    }

    /// Resigns, reported: `start` is when the resignation was called.
    async fn resign(&self, leadership: Leadership, lease: u32) {
        let start = now_us();
        let outcome = match leadership.resign().await {
            Ok(true) => Released::Released,
            Ok(false) => Released::NotOurs,
            Err(e) if e.kind() == ErrorKind::Lost => Released::NotOurs,
            Err(_) => Released::Failed,
        };
        self.reporter.released(lease, start, outcome);
    }
}

fn campaign_error(error: &LockError) -> Acquired {
    match error.kind() {
        ErrorKind::Contended => Acquired::Contended,
        ErrorKind::Unavailable => Acquired::Unavailable,
        _ => Acquired::Failed,
    }
}
