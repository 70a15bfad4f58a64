//! A real pause for the fencing examples: a replica in a process of its own
//! (the example started again with other arguments) stops itself with
//! SIGSTOP at a chosen point. Every thread stops, the lock's renewal
//! included, as in a long GC pause or a suspended VM, until the example
//! sends SIGCONT. Needs a Unix system with the `kill` command.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How every line that [`stop_dead`] prints ends.
const STOPS_DEAD: &str = ", then stops dead";

/// The longest any step of a paused replica may take.
const BOUND: Duration = Duration::from_secs(20);

/// Prints `what` (with ", then stops dead") and stops this process until
/// someone sends it SIGCONT.
pub fn stop_dead(what: &str) {
    println!("{what}{STOPS_DEAD}");
    let _ = std::io::stdout().flush();
    let pid = std::process::id().to_string();
    if let Err(e) = Command::new("kill").args(["-STOP", &pid]).status() {
        eprintln!("cannot stop with `kill -STOP {pid}`: {e}");
    }
}

/// A replica in a child process: its lines are printed as they come; it is
/// killed if still there when this drops.
pub struct PausedReplica {
    child: Child,
    lines: mpsc::Receiver<String>,
    relay: Option<JoinHandle<()>>,
}

impl PausedReplica {
    /// Starts this program again with `args`.
    pub fn start(args: &[&str]) -> Result<PausedReplica, BoxError> {
        let mut child = Command::new(std::env::current_exe()?)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()?;
        let stdout = child.stdout.take().ok_or("the replica has no stdout")?;
        let (tx, lines) = mpsc::channel();
        let relay = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                println!("{line}");
                let _ = tx.send(line);
            }
        });
        Ok(PausedReplica {
            child,
            lines,
            relay: Some(relay),
        })
    }

    /// Waits until the replica has stopped itself in [`stop_dead`].
    pub async fn stopped(&mut self) -> Result<(), BoxError> {
        let deadline = Instant::now() + BOUND;
        loop {
            match self.lines.try_recv() {
                Ok(line) if line.ends_with(STOPS_DEAD) => break,
                Ok(_) => {}
                Err(mpsc::TryRecvError::Empty) => {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Err(mpsc::TryRecvError::Disconnected) => {
                    return Err("the replica ended before it stopped".into());
                }
            }
            if Instant::now() > deadline {
                return Err("the replica did not reach its pause".into());
            }
        }
        while !self.is_stopped() {
            if Instant::now() > deadline {
                return Err("the replica did not stop".into());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(())
    }

    /// Lets the replica go on (SIGCONT) and waits for it to end: whether
    /// it exited with success.
    pub async fn resume_and_wait(&mut self) -> Result<bool, BoxError> {
        self.signal("-CONT")?;
        let deadline = Instant::now() + BOUND;
        let status = loop {
            if let Some(status) = self.child.try_wait()? {
                break status;
            }
            if Instant::now() > deadline {
                return Err("the replica did not end after it went on".into());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        if let Some(relay) = self.relay.take() {
            let _ = relay.join();
        }
        Ok(status.success())
    }

    fn signal(&self, signal: &str) -> Result<(), BoxError> {
        let pid = self.child.id().to_string();
        let status = Command::new("kill").args([signal, &pid]).status()?;
        if !status.success() {
            return Err(format!("kill {signal} {pid}: {status}").into());
        }
        Ok(())
    }

    /// Whether the process is stopped, as /proc tells (true without /proc).
    fn is_stopped(&self) -> bool {
        match std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())) {
            // The state follows the command name's closing parenthesis.
            Ok(stat) => stat
                .rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with('T')),
            Err(_) => true,
        }
    }
}

impl Drop for PausedReplica {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.signal("-CONT");
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
