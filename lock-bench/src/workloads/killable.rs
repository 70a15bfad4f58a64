//! A child process of the bench that the bench kills while it holds a
//! lock: W7's holders and W10's leaders. It is killed (`SIGKILL`) and
//! reaped when dropped, so no path out of a round leaves one running.

use super::spawn_self;
use crate::error::{BenchResult, fail};
use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdin, ChildStdout};
use std::time::Duration;

/// A child process; killed (`SIGKILL`) and reaped when dropped.
pub struct Killable {
    child: Child,
    /// Kept open: the child exits when it closes (the bench died).
    _stdin: ChildStdin,
}

impl Killable {
    /// Starts this executable with `args` and reads its first line (what
    /// it holds), waiting up to `bound`; `what` names it in errors.
    pub fn start(args: &[&str], what: &str, bound: Duration) -> BenchResult<(Killable, String)> {
        let (child, stdin, stdout) = spawn_self(args, what)?;
        let process = Killable {
            child,
            _stdin: stdin,
        };
        let line = first_line(stdout, what, bound)?;
        Ok((process, line))
    }

    /// `SIGKILL`, and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Killable {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The child's first line, read on a thread so that a silent child fails
/// the round after `bound` rather than hanging it.
fn first_line(stdout: ChildStdout, what: &str, bound: Duration) -> BenchResult<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let read = BufReader::new(stdout).read_line(&mut line).map(|_| line);
        let _ = tx.send(read);
    });
    match rx.recv_timeout(bound) {
        Ok(read) => Ok(read?.trim_end().to_owned()),
        Err(_) => Err(fail(format!("{what} did not take the lock in time"))),
    }
}
