//! `lockctl`: who holds a lock, which locks are held, and breaking a stuck
//! one, from a shell. See `docs/operating.md`.

mod output;

use clap::{Parser, Subcommand};
use futures::StreamExt;
use lock_core::{LockClient, LockError, LockState};
use std::io::{BufRead, IsTerminal, Write};
use std::process::ExitCode;
use std::time::Duration;

/// See and break the locks lock-core keeps in Redis.
#[derive(Parser, Debug)]
#[command(name = "lockctl", version)]
struct Cli {
    /// The Redis server, e.g. redis://user:password@host:6379/0 (with
    /// --cluster, any node of the cluster).
    #[arg(long, env = "LOCKCTL_URL")]
    url: String,
    /// The services' key prefix.
    #[arg(long, default_value = "lock:")]
    prefix: String,
    /// The server is a node of a Redis Cluster.
    #[arg(long)]
    cluster: bool,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
    /// Bound on each Redis call, in milliseconds.
    #[arg(long, default_value_t = 2000)]
    timeout_ms: u64,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// The held locks whose names match PATTERN (a Redis glob; all when
    /// omitted).
    List { pattern: Option<String> },
    /// Who holds KEY (for an election: the leader, and its term as the
    /// fencing token); exits with 1 when it is free.
    Show { key: String },
    /// Breaks the lock KEY, whoever holds it; asks first unless --force.
    Release {
        key: String,
        /// Do not ask; required when stdin is not a terminal.
        #[arg(long)]
        force: bool,
    },
    /// Prints who holds KEY, then one line per change of holder, until
    /// Ctrl-C (or --changes).
    ///
    /// For an election (LockClient::campaign, `wait = "forever"`) that is
    /// each change of leader: holder, term (its fencing token) and since
    /// when (UTC, by this machine's clock). A new leader is seen as it
    /// takes over: a resignation at once, a crashed leader at its lease's
    /// expiry.
    Watch {
        key: String,
        /// While KEY is held shared or with permits, how often to look at
        /// its holders, in milliseconds (they come and go without a change
        /// of leader).
        #[arg(long, default_value_t = 500)]
        interval_ms: u64,
        /// Stop after printing this many lines, the first one (who holds
        /// KEY when the watch starts) included; for scripts and tests.
        #[arg(long, value_name = "N")]
        changes: Option<u64>,
    },
}

/// Why lockctl stopped, as the exit code says.
enum Failure {
    /// A lock error: one line, exit code 2.
    Lock(LockError),
    /// Another error, already worded: exit code 2.
    Message(String),
}

impl From<LockError> for Failure {
    fn from(e: LockError) -> Failure {
        Failure::Lock(e)
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => return fail(&Failure::Message(format!("cannot start: {e}"))),
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(failure) => fail(&failure),
    }
}

/// Prints the failure on one line and answers exit code 2.
fn fail(failure: &Failure) -> ExitCode {
    let text = match failure {
        Failure::Lock(e) => e.chain().to_string(),
        Failure::Message(m) => m.clone(),
    };
    let line: Vec<&str> = text.lines().map(str::trim).collect();
    eprintln!("lockctl: error: {}", line.join(" "));
    ExitCode::from(2)
}

async fn run(cli: Cli) -> Result<ExitCode, Failure> {
    let client = connect(&cli).await?;
    match &cli.command {
        Command::List { pattern } => {
            let locks = client.list_all(pattern.as_deref()).await?;
            output::list(&locks, cli.json, &cli.prefix, pattern.as_deref());
            Ok(ExitCode::SUCCESS)
        }
        Command::Show { key } => match client.inspect(key).await? {
            Some(state) => {
                output::show(&state, cli.json);
                Ok(ExitCode::SUCCESS)
            }
            None => {
                output::free(key, cli.json);
                Ok(ExitCode::from(1))
            }
        },
        Command::Release { key, force } => release(&client, key, *force, cli.json).await,
        Command::Watch {
            key,
            interval_ms,
            changes,
        } => {
            let interval = Duration::from_millis((*interval_ms).max(10));
            watch(&client, key, interval, *changes, cli.json).await
        }
    }
}

async fn connect(cli: &Cli) -> Result<LockClient, Failure> {
    let timeout = Duration::from_millis(cli.timeout_ms.max(1));
    let builder = LockClient::builder()
        .key_prefix(cli.prefix.as_str())
        .operation_timeout(timeout)
        .connect_timeout(timeout)
        .holder_name("lockctl");
    let builder = if cli.cluster {
        builder.cluster([cli.url.as_str()])
    } else {
        builder.url(cli.url.as_str())
    };
    Ok(builder.build().await?)
}

/// `release KEY`: asks on a terminal, refuses without one unless forced.
async fn release(
    client: &LockClient,
    key: &str,
    force: bool,
    json: bool,
) -> Result<ExitCode, Failure> {
    if !force {
        if !std::io::stdin().is_terminal() {
            return Err(Failure::Message(format!(
                "refusing to release {key:?} without --force: stdin is not a terminal to \
                 confirm on"
            )));
        }
        let Some(state) = client.inspect(key).await? else {
            output::released(key, None, json);
            return Ok(ExitCode::SUCCESS);
        };
        if !confirm(&state)? {
            eprintln!("lockctl: nothing released");
            return Ok(ExitCode::from(1));
        }
    }
    let evicted = client.evict(key).await?;
    output::released(key, evicted.as_ref(), json);
    Ok(ExitCode::SUCCESS)
}

/// Asks on the terminal whether to break the lock `state` describes.
fn confirm(state: &LockState) -> Result<bool, Failure> {
    eprint!(
        "Release {:?}, held by {} for {}? It loses the lock at its next renewal. [y/N] ",
        state.key(),
        state.holder().unwrap_or("an unnamed holder"),
        output::duration_or(state.held_for(), "an unknown time"),
    );
    std::io::stderr().flush().ok();
    let mut answer = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut answer)
        .map_err(|e| Failure::Message(format!("cannot read the answer: {e}")))?;
    Ok(matches!(answer.trim(), "y" | "Y" | "yes" | "YES" | "Yes"))
}

/// `watch KEY`: one line per change of holder, until Ctrl-C (or
/// `changes` lines).
///
/// Changes of leader come from `watch_leader`, woken by releases and
/// timed by the leases' expiry. Shared holders and permits come and go
/// without changing what it reports, so while KEY is held that way it is
/// also looked at every `interval`.
async fn watch(
    client: &LockClient,
    key: &str,
    interval: Duration,
    changes: Option<u64>,
    json: bool,
) -> Result<ExitCode, Failure> {
    let mut leaders = std::pin::pin!(client.watch_leader(key));
    let mut last: Option<Option<output::Holding>> = None;
    let mut printed = 0;
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    loop {
        let counted = matches!(&last, Some(Some(holding)) if holding.is_counted());
        let state = tokio::select! {
            _ = &mut ctrl_c => return Ok(ExitCode::SUCCESS),
            // The stream never ends: `None` is not reached.
            seen = leaders.next() => seen.flatten(),
            () = tokio::time::sleep(interval), if counted => client.inspect(key).await?,
        };
        let now = state.as_ref().map(output::Holding::of);
        let changed = match &last {
            None => true,
            Some(before) => !output::Holding::same(before.as_ref(), now.as_ref()),
        };
        if changed {
            output::change(key, state.as_ref(), json);
            printed += 1;
            last = Some(now);
            if changes.is_some_and(|n| printed >= n) {
                return Ok(ExitCode::SUCCESS);
            }
        }
    }
}
