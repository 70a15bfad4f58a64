//! Sending job-control signals to a server process with the `kill` command.

use std::fs;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use crate::TestkitError;

/// How long to wait for a stopped process to show up as stopped.
const STOP_SETTLE_TIMEOUT: Duration = Duration::from_secs(1);

/// A signal this kit sends.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Signal {
    /// `SIGSTOP`: freeze the process.
    Stop,
    /// `SIGCONT`: let a frozen process run again.
    Cont,
    /// `SIGKILL`: end the process at once.
    Kill,
}

impl Signal {
    fn name(self) -> &'static str {
        match self {
            Self::Stop => "STOP",
            Self::Cont => "CONT",
            Self::Kill => "KILL",
        }
    }
}

/// Sends `signal` to `pid` by running `kill -<SIG> <pid>`.
pub(crate) fn send(signal: Signal, pid: u32) -> Result<(), TestkitError> {
    let output = Command::new("kill")
        .arg(format!("-{}", signal.name()))
        .arg(pid.to_string())
        .stdin(Stdio::null())
        .output()
        .map_err(|e| TestkitError::with_source("could not run the `kill` command", e))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(TestkitError::new(format!(
            "`kill -{} {pid}` failed ({}): {}",
            signal.name(),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )))
    }
}

/// Waits (bounded) until `/proc` reports `pid` as stopped, so that a paused
/// server is really frozen when `pause` returns. Without `/proc` it returns
/// at once.
pub(crate) fn wait_until_stopped(pid: u32) {
    let deadline = Instant::now() + STOP_SETTLE_TIMEOUT;
    while Instant::now() < deadline {
        match process_state(pid) {
            Some('T' | 't') | None => return,
            Some(_) => thread::sleep(Duration::from_millis(1)),
        }
    }
}

/// The one-letter state of `pid` from `/proc/<pid>/stat`.
fn process_state(pid: u32) -> Option<char> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "<pid> (<comm>) <state> ..."; comm may contain spaces and parentheses.
    let (_, rest) = stat.rsplit_once(')')?;
    rest.trim_start().chars().next()
}
