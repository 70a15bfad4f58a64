//! Command-line options.

use crate::contenders::Impl;
use crate::error::{BenchResult, fail};
use crate::table::WorkloadId;
use crate::transport::Transport;
use std::path::PathBuf;
use std::time::Duration;

/// What `--help` prints.
pub const USAGE: &str = "\
lock-bench: lock-core side by side with the floor, the minimum lock and rslock

USAGE:
    cargo run --release -p lock-bench -- [OPTIONS]

OPTIONS:
    --seconds N       measured time per row, in seconds (default 5)
    --only LIST       workloads to run, comma-separated:
                      W1,W2,W3,W3p,W4,W5,W6,W7,W8,W9,W10,W11 (default: all)
    --out DIR         where the CSV, JSON and text copies of the table go
                      (default: target/lock-bench)
    --w5-seconds N    how long W5 holds its locks (default 30)
    --w5-locks N      how many locks W5 holds (default 10000)
    --w5-ttl N        the ttl of W5's locks, in seconds (default 3)
    --w5-wait N       how long each W5 acquisition waits, in seconds (default
                      30), and none past N s after the first began, so that a
                      run past the capacity takes its locks within N s
    --w5-capacity     instead, W5 runs past the client's renewal capacity:
                      800,000 and 1,200,000 locks at a 3 s ttl and 1,000,000
                      at 30 s, each taken without waiting; a row says how
                      many were asked, granted, refused and lost
    --soak N          instead of the table, run a mix of W1-W3 and the attribute
                      for N seconds and print what would grow with a leak
                      (RSS, connections, tasks, subscriptions, queued keys)
    --w7-rounds N     takeovers per W7 row (default 30)
    --w10-resignations N
                      leaders resigning per W10 resignation row (default 200)
    --w10-crashes N   leaders killed per W10 crash row (default 30)
    --w11-cycles N    deadlocks (cycles of two owners) per W11 row (default 30)
    --impls LIST      rows of W1, W2, W4 and W8 to run, comma-separated: floor,
                      raw-floor,minimum,guard,attribute,rslock (default: all;
                      for profiling one implementation at a time; raw-floor
                      is a W1 row)
    --transport LIST  what W1 and W2 run on, comma-separated: plain (one
                      server over TCP), tls (one server over rediss://, the
                      test CA as the only root), cluster (3 primaries)
                      (default: plain). Each transport gets its rows and
                      its block of ratios; rows that need plain TCP (raw
                      floor, rslock) are left out of tls and cluster. W5
                      also runs on cluster; the other workloads run on
                      plain only.
    --rtt MS          W1 and W2 through a proxy that adds this round-trip
                      time, in milliseconds (fractions allowed, 0 to 1000;
                      half of it each way), on plain and tls; the round
                      trip measured through it is printed. Only W1 and W2
                      run.
    -h, --help        this text

The bench starts its own redis-server processes on free ports (found through
REDIS_SERVER_BIN or PATH) and stops them when it ends. On a server with a
native compare-and-delete (Valkey 9), LOCK_BENCH_RELEASE=script has lock-core
release with its script instead, for the comparison.";

/// Options of a benchmark run.
#[derive(Clone, Debug)]
pub struct Options {
    /// Measured time of each row (each implementation in each workload).
    pub seconds: Duration,
    /// The workloads to run, in the order of the table.
    pub only: Vec<WorkloadId>,
    /// Where the CSV, JSON and text outputs go.
    pub out: PathBuf,
    /// How long W5 holds its locks.
    pub w5_seconds: Duration,
    /// How many locks W5 holds at once.
    pub w5_locks: usize,
    /// The ttl of W5's locks.
    pub w5_ttl: Duration,
    /// How long each of W5's acquisitions waits (`--w5-wait`).
    pub w5_wait: Duration,
    /// `--w5-capacity`: W5's runs past the renewal capacity instead.
    pub w5_capacity: bool,
    /// The rows the throughput workloads (W1, W2, W4, W8) run.
    pub impls: Vec<Impl>,
    /// What W1 and W2 run on, in this order.
    pub transports: Vec<Transport>,
    /// `--rtt`: the round-trip time a proxy adds to W1 and W2 (`None`:
    /// straight to the server).
    pub rtt: Option<Duration>,
    /// `--soak`: run the leak soak this long instead of the table.
    pub soak: Option<Duration>,
    /// Takeovers per W7 row.
    pub w7_rounds: usize,
    /// Resignations per W10 resignation row.
    pub w10_resignations: usize,
    /// Crashes per W10 crash row.
    pub w10_crashes: usize,
    /// Deadlocks (cycles of two owners) per W11 row.
    pub w11_cycles: usize,
}

/// Arguments of the hidden holder mode (a W7 child process, killed while
/// it holds the lock).
#[derive(Clone, Debug)]
pub struct HolderArgs {
    /// Which implementation takes the lock (`minimum`, `guard`, `rslock`).
    pub implementation: String,
    /// The Redis server.
    pub url: String,
    /// The lock's key, as the implementation names it.
    pub key: String,
    /// The lease.
    pub ttl: Duration,
}

/// Arguments of the hidden leader mode (a W10 child process, killed while
/// it leads).
#[derive(Clone, Debug)]
pub struct LeaderArgs {
    /// Which implementation campaigns (`guard`, `rslock`).
    pub implementation: String,
    /// The Redis server.
    pub url: String,
    /// The election's key, as the implementation names it.
    pub key: String,
    /// The register the leader writes.
    pub register: String,
    /// The lease.
    pub ttl: Duration,
}

/// Arguments of the hidden worker mode (a W3p child process).
#[derive(Clone, Debug)]
pub struct WorkerArgs {
    /// Which implementation to run (`minimum`, `guard`, `attribute`, `rslock`).
    pub implementation: String,
    /// The Redis server.
    pub url: String,
    /// The one contended key.
    pub key: String,
    /// Tasks in this process.
    pub tasks: u32,
    /// The task id of this process's first task; ids are global across
    /// processes.
    pub task_base: u32,
}

/// What the command line asks for.
#[derive(Clone, Debug)]
pub enum Command {
    /// A benchmark run.
    Run(Options),
    /// A W3p child process, started by the bench itself.
    Worker(WorkerArgs),
    /// A W7 holder process, started (and killed) by the bench itself.
    Holder(HolderArgs),
    /// A W10 leader process, started (and killed) by the bench itself.
    Leader(LeaderArgs),
    /// Print [`USAGE`].
    Help,
}

/// The flag that selects worker mode; not in [`USAGE`].
pub const WORKER_FLAG: &str = "--worker";

/// The flag of the hidden holder mode; not in [`USAGE`].
pub const HOLDER_FLAG: &str = "--w7-holder";

/// The flag of the hidden leader mode; not in [`USAGE`].
pub const LEADER_FLAG: &str = "--w10-leader";

/// Parses the arguments after the program name.
pub fn parse(args: impl IntoIterator<Item = String>) -> BenchResult<Command> {
    let mut args = args.into_iter();
    let mut options = Options {
        seconds: Duration::from_secs(5),
        only: WorkloadId::ALL.to_vec(),
        out: default_out_dir(),
        w5_seconds: Duration::from_secs(30),
        w5_locks: 10_000,
        w5_ttl: Duration::from_secs(3),
        w5_wait: Duration::from_secs(30),
        w5_capacity: false,
        impls: Impl::ALL.to_vec(),
        transports: vec![Transport::Plain],
        soak: None,
        rtt: None,
        w7_rounds: 30,
        w10_resignations: 200,
        w10_crashes: 30,
        w11_cycles: 30,
    };
    let mut worker: Option<WorkerArgs> = None;
    while let Some(arg) = args.next() {
        let mut value = |name: &str| {
            args.next()
                .ok_or_else(|| fail(format!("{name} needs a value")))
        };
        match arg.as_str() {
            "-h" | "--help" => return Ok(Command::Help),
            "--seconds" => options.seconds = seconds(&value("--seconds")?)?,
            "--w5-seconds" => options.w5_seconds = seconds(&value("--w5-seconds")?)?,
            "--w5-locks" => options.w5_locks = count(&value("--w5-locks")?)?,
            "--w5-ttl" => options.w5_ttl = seconds(&value("--w5-ttl")?)?,
            "--w5-wait" => options.w5_wait = seconds(&value("--w5-wait")?)?,
            "--w5-capacity" => options.w5_capacity = true,
            "--soak" => options.soak = Some(seconds(&value("--soak")?)?),
            "--rtt" => options.rtt = Some(rtt(&value("--rtt")?)?),
            "--w7-rounds" => options.w7_rounds = count(&value("--w7-rounds")?)?,
            "--w10-resignations" => {
                options.w10_resignations = count(&value("--w10-resignations")?)?;
            }
            "--w10-crashes" => options.w10_crashes = count(&value("--w10-crashes")?)?,
            "--w11-cycles" => options.w11_cycles = count(&value("--w11-cycles")?)?,
            HOLDER_FLAG | LEADER_FLAG => return hidden(&arg, &mut args),
            "--out" => options.out = PathBuf::from(value("--out")?),
            "--only" => options.only = workloads(&value("--only")?)?,
            "--impls" => options.impls = impls(&value("--impls")?)?,
            "--transport" => options.transports = transports(&value("--transport")?)?,
            WORKER_FLAG => {
                let mode = value(WORKER_FLAG)?;
                if mode != "w3p" {
                    return Err(fail(format!("unknown worker mode {mode:?}")));
                }
                worker = Some(WorkerArgs {
                    implementation: String::new(),
                    url: String::new(),
                    key: String::new(),
                    tasks: 0,
                    task_base: 0,
                });
            }
            "--impl" | "--url" | "--key" | "--tasks" | "--task-base" => {
                let Some(w) = worker.as_mut() else {
                    return Err(fail(format!("{arg} is only for worker mode")));
                };
                let v = value(&arg)?;
                match arg.as_str() {
                    "--impl" => w.implementation = v,
                    "--url" => w.url = v,
                    "--key" => w.key = v,
                    "--tasks" => w.tasks = u32::try_from(count(&v)?)?,
                    _ => w.task_base = v.parse()?,
                }
            }
            other => return Err(fail(format!("unknown argument {other:?}"))),
        }
    }
    check_rtt(&options)?;
    Ok(match worker {
        Some(w) => Command::Worker(w),
        None => Command::Run(options),
    })
}

/// The hidden modes of a process the bench kills: `flag` ([`HOLDER_FLAG`]
/// or [`LEADER_FLAG`]) and the values after it.
fn hidden(flag: &str, args: &mut impl Iterator<Item = String>) -> BenchResult<Command> {
    let mut next = || {
        args.next()
            .ok_or_else(|| fail(format!("{flag} needs a value")))
    };
    let millis = |text: String| -> BenchResult<Duration> {
        Ok(Duration::from_millis(u64::try_from(count(&text)?)?))
    };
    let (implementation, url, key) = (next()?, next()?, next()?);
    if flag == HOLDER_FLAG {
        let ttl = millis(next()?)?;
        return Ok(Command::Holder(HolderArgs {
            implementation,
            url,
            key,
            ttl,
        }));
    }
    let register = next()?;
    let ttl = millis(next()?)?;
    Ok(Command::Leader(LeaderArgs {
        implementation,
        url,
        key,
        register,
        ttl,
    }))
}

/// A positive number of seconds, fractions allowed.
fn seconds(text: &str) -> BenchResult<Duration> {
    let value: f64 = text
        .parse()
        .map_err(|_| fail(format!("{text:?} is not a number of seconds")))?;
    if !(value > 0.0 && value <= 86_400.0) {
        return Err(fail(format!("{text} seconds is out of range (0, 86400]")));
    }
    Ok(Duration::from_secs_f64(value))
}

/// The longest round trip `--rtt` adds, in milliseconds.
const RTT_MAX_MS: f64 = 1_000.0;

/// A round-trip time in milliseconds, fractions allowed, in
/// `[0, RTT_MAX_MS]`.
fn rtt(text: &str) -> BenchResult<Duration> {
    let value: f64 = text
        .trim()
        .parse()
        .map_err(|_| fail(format!("--rtt {text:?} is not a number of milliseconds")))?;
    if !(0.0..=RTT_MAX_MS).contains(&value) {
        return Err(fail(format!(
            "--rtt {text} ms is out of range: a round trip of 0 to {RTT_MAX_MS} ms"
        )));
    }
    Ok(Duration::from_secs_f64(value / 1_000.0))
}

/// `--rtt` goes with W1 and W2 on plain and tls only: a cluster's nodes
/// announce their own addresses, which a proxy in front of one would not
/// cover, and the soak has no proxy.
fn check_rtt(options: &Options) -> BenchResult<()> {
    if options.rtt.is_none() {
        return Ok(());
    }
    if options.transports.contains(&Transport::Cluster) {
        return Err(fail(
            "--rtt runs on plain and tls only: a cluster's nodes announce their own \
             addresses, which bypass the proxy",
        ));
    }
    if options.soak.is_some() {
        return Err(fail("--rtt does not apply to --soak"));
    }
    if !options
        .only
        .iter()
        .any(|id| matches!(id, WorkloadId::W1 | WorkloadId::W2))
    {
        return Err(fail("--rtt runs W1 and W2 only, and --only names neither"));
    }
    Ok(())
}

/// A positive count.
fn count(text: &str) -> BenchResult<usize> {
    match text.parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(fail(format!("{text:?} is not a positive count"))),
    }
}

/// A comma-separated list of workload ids, kept in table order.
fn workloads(text: &str) -> BenchResult<Vec<WorkloadId>> {
    pick(
        text,
        &WorkloadId::ALL,
        WorkloadId::parse,
        "--only",
        "workload",
        "W1, W2, W3, W3p, W4, W5, W6, W7, W8, W9, W10 or W11",
    )
}

/// A comma-separated list of implementation ids, kept in table order.
fn impls(text: &str) -> BenchResult<Vec<Impl>> {
    pick(
        text,
        &Impl::ALL,
        |id| Impl::from_id(&id.to_ascii_lowercase()),
        "--impls",
        "implementation",
        "floor, raw-floor, minimum, guard, attribute or rslock",
    )
}

/// A comma-separated list of transports, kept in the order of
/// [`Transport::ALL`].
fn transports(text: &str) -> BenchResult<Vec<Transport>> {
    pick(
        text,
        &Transport::ALL,
        Transport::parse,
        "--transport",
        "transport",
        "plain, tls or cluster",
    )
}

/// The items of `all` named in the comma-separated `text`, in the order of
/// `all`; an unknown name or an empty list is an error naming `flag`.
fn pick<T: Copy + PartialEq>(
    text: &str,
    all: &[T],
    parse: impl Fn(&str) -> Option<T>,
    flag: &str,
    what: &str,
    expected: &str,
) -> BenchResult<Vec<T>> {
    let mut chosen = Vec::new();
    for name in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let item = parse(name)
            .ok_or_else(|| fail(format!("unknown {what} {name:?}; expected {expected}")))?;
        chosen.push(item);
    }
    if chosen.is_empty() {
        return Err(fail(format!("{flag} needs at least one {what}")));
    }
    Ok(all.iter().copied().filter(|x| chosen.contains(x)).collect())
}

/// `target/lock-bench` of the target directory the binary was built into
/// (so it works from any directory and with `CARGO_TARGET_DIR`), or
/// `target/lock-bench` under the current directory.
fn default_out_dir() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.parent()?.join("lock-bench")))
        .unwrap_or_else(|| PathBuf::from("target/lock-bench"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_strs(args: &[&str]) -> BenchResult<Command> {
        parse(args.iter().map(|s| (*s).to_owned()))
    }

    #[test]
    fn defaults_run_everything_for_five_seconds() {
        let Ok(Command::Run(options)) = parse_strs(&[]) else {
            panic!("no arguments is a run");
        };
        assert_eq!(options.seconds, Duration::from_secs(5));
        assert_eq!(options.only, WorkloadId::ALL.to_vec());
        assert_eq!(options.w5_seconds, Duration::from_secs(30));
        assert_eq!(options.w5_wait, Duration::from_secs(30));
        assert_eq!(options.transports, vec![Transport::Plain]);
    }

    #[test]
    fn transport_takes_one_value_or_a_list_in_run_order() {
        let transports = |value: &str| match parse_strs(&["--transport", value]) {
            Ok(Command::Run(options)) => Ok(options.transports),
            Ok(other) => panic!("--transport is a run, not {other:?}"),
            Err(e) => Err(e.to_string()),
        };
        assert_eq!(transports("tls"), Ok(vec![Transport::Tls]));
        assert_eq!(
            transports("cluster, TLS,plain"),
            Ok(vec![Transport::Plain, Transport::Tls, Transport::Cluster])
        );
        let Err(unknown) = transports("plain,unix") else {
            panic!("an unknown transport is refused");
        };
        assert!(
            unknown.contains("unknown transport \"unix\"")
                && unknown.contains("plain, tls or cluster"),
            "{unknown}"
        );
        let Err(empty) = transports(",") else {
            panic!("an empty list is refused");
        };
        assert!(empty.contains("--transport needs at least one"), "{empty}");
        assert!(parse_strs(&["--transport"]).is_err());
    }

    #[test]
    fn only_keeps_table_order_and_ignores_case() {
        let Ok(Command::Run(options)) = parse_strs(&["--only", "w9,w3p,W1,W8", "--seconds", "0.5"])
        else {
            panic!("valid arguments");
        };
        assert_eq!(
            options.only,
            vec![
                WorkloadId::W1,
                WorkloadId::W3p,
                WorkloadId::W8,
                WorkloadId::W9
            ]
        );
        assert_eq!(options.seconds, Duration::from_millis(500));
    }

    #[test]
    fn impls_keep_table_order() {
        let Ok(Command::Run(options)) = parse_strs(&["--impls", "guard,Minimum"]) else {
            panic!("valid arguments");
        };
        assert_eq!(options.impls, vec![Impl::Minimum, Impl::Guard]);
    }

    #[test]
    fn bad_arguments_are_errors() {
        assert!(parse_strs(&["--only", "W12"]).is_err());
        assert!(parse_strs(&["--w10-crashes", "0"]).is_err());
        assert!(parse_strs(&["--w11-cycles", "0"]).is_err());
        assert!(parse_strs(&["--w11-cycles"]).is_err());
        assert!(parse_strs(&["--w10-leader", "guard", "redis://x", "k", "r"]).is_err());
        assert!(parse_strs(&["--w7-rounds", "0"]).is_err());
        assert!(parse_strs(&["--w7-holder", "guard", "redis://x"]).is_err());
        assert!(parse_strs(&["--seconds", "0"]).is_err());
        assert!(parse_strs(&["--seconds"]).is_err());
        assert!(parse_strs(&["--url", "x"]).is_err());
        assert!(parse_strs(&["--frobnicate"]).is_err());
        assert!(parse_strs(&["--impls", "redlock"]).is_err());
        assert!(parse_strs(&["--impls", ","]).is_err());
    }

    #[test]
    fn rtt_takes_fractional_milliseconds_in_range() {
        let rtt_of = |args: &[&str]| match parse_strs(args) {
            Ok(Command::Run(options)) => Ok(options.rtt),
            Ok(other) => panic!("--rtt is a run, not {other:?}"),
            Err(e) => Err(e.to_string()),
        };
        assert_eq!(rtt_of(&[]), Ok(None));
        assert_eq!(
            rtt_of(&["--rtt", "0.5"]),
            Ok(Some(Duration::from_micros(500)))
        );
        assert_eq!(rtt_of(&["--rtt", "0"]), Ok(Some(Duration::ZERO)));
        assert_eq!(
            rtt_of(&["--rtt", "2", "--transport", "plain,tls"]),
            Ok(Some(Duration::from_millis(2)))
        );
        for bad in ["-0.5", "1001", "NaN", "inf", "fast"] {
            let Err(e) = rtt_of(&["--rtt", bad]) else {
                panic!("--rtt {bad} is refused");
            };
            assert!(e.contains("--rtt"), "{e}");
        }
        assert!(rtt_of(&["--rtt"]).is_err());
        let Err(cluster) = rtt_of(&["--rtt", "0.5", "--transport", "plain,cluster"]) else {
            panic!("--rtt on a cluster is refused");
        };
        assert!(cluster.contains("plain and tls only"), "{cluster}");
        assert!(rtt_of(&["--rtt", "0.5", "--only", "W3"]).is_err());
        assert!(rtt_of(&["--rtt", "0.5", "--soak", "10"]).is_err());
    }

    #[test]
    fn w7_is_a_workload_with_rounds() {
        let Ok(Command::Run(options)) = parse_strs(&["--only", "w7,W1", "--w7-rounds", "5"]) else {
            panic!("valid arguments");
        };
        assert_eq!(options.only, vec![WorkloadId::W1, WorkloadId::W7]);
        assert_eq!(options.w7_rounds, 5);
    }

    #[test]
    fn w10_is_a_workload_with_its_rounds() {
        let Ok(Command::Run(options)) = parse_strs(&[
            "--only",
            "w10,W7",
            "--w10-resignations",
            "50",
            "--w10-crashes",
            "5",
        ]) else {
            panic!("valid arguments");
        };
        assert_eq!(options.only, vec![WorkloadId::W7, WorkloadId::W10]);
        assert_eq!((options.w10_resignations, options.w10_crashes), (50, 5));
        let Ok(Command::Run(defaults)) = parse_strs(&[]) else {
            panic!("no arguments is a run");
        };
        assert_eq!((defaults.w10_resignations, defaults.w10_crashes), (200, 30));
    }

    #[test]
    fn w11_is_a_workload_with_its_cycles() {
        let Ok(Command::Run(options)) = parse_strs(&["--only", "w11,W3", "--w11-cycles", "7"])
        else {
            panic!("valid arguments");
        };
        assert_eq!(options.only, vec![WorkloadId::W3, WorkloadId::W11]);
        assert_eq!(options.w11_cycles, 7);
        let Ok(Command::Run(defaults)) = parse_strs(&[]) else {
            panic!("no arguments is a run");
        };
        assert_eq!(defaults.w11_cycles, 30);
        assert_eq!(defaults.only.last(), Some(&WorkloadId::W11));
    }

    #[test]
    fn leader_mode_is_parsed() {
        let Ok(Command::Leader(l)) = parse_strs(&[
            "--w10-leader",
            "rslock",
            "redis://127.0.0.1:1",
            "k",
            "reg",
            "500",
        ]) else {
            panic!("leader arguments");
        };
        assert_eq!(
            (
                l.implementation.as_str(),
                l.key.as_str(),
                l.register.as_str()
            ),
            ("rslock", "k", "reg")
        );
        assert_eq!(l.ttl, Duration::from_millis(500));
    }

    #[test]
    fn holder_mode_is_parsed() {
        let Ok(Command::Holder(h)) =
            parse_strs(&["--w7-holder", "rslock", "redis://127.0.0.1:1", "k", "400"])
        else {
            panic!("holder arguments");
        };
        assert_eq!(
            (h.implementation.as_str(), h.key.as_str(), h.ttl),
            ("rslock", "k", Duration::from_millis(400))
        );
    }

    #[test]
    fn worker_mode_is_parsed() {
        let Ok(Command::Worker(w)) = parse_strs(&[
            "--worker",
            "w3p",
            "--impl",
            "guard",
            "--url",
            "redis://127.0.0.1:1",
            "--key",
            "k",
            "--tasks",
            "2",
            "--task-base",
            "4",
        ]) else {
            panic!("worker arguments");
        };
        assert_eq!(
            (w.implementation.as_str(), w.tasks, w.task_base),
            ("guard", 2, 4)
        );
    }
}
