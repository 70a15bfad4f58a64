//! Worker processes: started from a command the test builds, their stdout
//! read line by line into a [`History`], and faults applied to them.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use super::history::{Event, History};
use crate::TestkitError;
use crate::server::reap;
use crate::signal::{self, Signal};

/// How long a new worker has to report [`Event::Started`].
const START_BOUND: Duration = Duration::from_secs(15);
/// How often a worker that has not started yet is checked for an early
/// exit.
const START_SLICE: Duration = Duration::from_millis(50);
/// Pause between looks at workers that are asked to exit.
const EXIT_POLL: Duration = Duration::from_millis(5);

/// The worker processes of a run and the history they write.
///
/// Each worker is told to stop by closing its stdin, so it also stops when
/// the test process dies. Dropping `Workers` resumes and kills whatever is
/// still running.
#[derive(Debug, Default)]
pub struct Workers {
    history: Arc<History>,
    workers: Vec<Worker>,
}

#[derive(Debug)]
struct Worker {
    id: u32,
    child: Option<Child>,
    stdin: Option<ChildStdin>,
    reader: Option<JoinHandle<()>>,
    paused: bool,
}

impl Workers {
    /// No workers yet, an empty history.
    pub fn new() -> Workers {
        Workers::default()
    }

    /// The history every worker writes to.
    pub fn history(&self) -> &Arc<History> {
        &self.history
    }

    /// Starts worker `id` with `command` (its stdin and stdout are taken
    /// over here; stderr is left as the command says) and returns once it
    /// has reported [`Event::Started`].
    ///
    /// # Errors
    ///
    /// Fails when it cannot be spawned or does not report in time; it is
    /// then killed.
    pub fn spawn(&mut self, id: u32, mut command: Command) -> Result<(), TestkitError> {
        let from = self.history.len();
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| TestkitError::with_source(format!("could not spawn worker {id}"), e))?;
        let stdin = child.stdin.take();
        let reader = child.stdout.take().map(|stdout| {
            let history = Arc::clone(&self.history);
            thread::spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    history.push_line(&line);
                }
            })
        });
        self.workers.push(Worker {
            id,
            child: Some(child),
            stdin,
            reader,
            paused: false,
        });
        let failure = self.await_start(id, from);
        if let Some(failure) = failure {
            self.kill(id);
            return Err(TestkitError::new(failure));
        }
        Ok(())
    }

    /// Waits for worker `id` to report [`Event::Started`] in events from
    /// index `from` on; why it did not, if it did not.
    fn await_start(&mut self, id: u32, from: usize) -> Option<String> {
        let deadline = Instant::now() + START_BOUND;
        let history = Arc::clone(&self.history);
        loop {
            let started = history.wait_for(from, START_SLICE, |event| {
                matches!(event, Event::Started { worker, .. } if *worker == id).then_some(())
            });
            if started.is_some() {
                return None;
            }
            let worker = self.find(id).ok()?;
            if let Some(Ok(Some(status))) = worker.child.as_mut().map(Child::try_wait) {
                return Some(format!("worker {id} exited before it started ({status})"));
            }
            if Instant::now() >= deadline {
                return Some(format!("worker {id} did not start within {START_BOUND:?}"));
            }
        }
    }

    /// The workers alive and not paused.
    pub fn running(&self) -> Vec<u32> {
        self.workers
            .iter()
            .filter(|w| w.child.is_some() && !w.paused)
            .map(|w| w.id)
            .collect()
    }

    /// Whether worker `id` is alive and not paused.
    pub fn is_running(&self, id: u32) -> bool {
        self.running().contains(&id)
    }

    /// Freezes worker `id` (`SIGSTOP`) and returns once it is stopped.
    ///
    /// # Errors
    ///
    /// Fails when it is not running or the signal cannot be sent.
    pub fn pause(&mut self, id: u32) -> Result<(), TestkitError> {
        let worker = self.find(id)?;
        let pid = worker.pid()?;
        signal::send(Signal::Stop, pid)?;
        worker.paused = true;
        signal::wait_until_stopped(pid);
        Ok(())
    }

    /// Lets a paused worker run again (`SIGCONT`).
    ///
    /// # Errors
    ///
    /// Fails when it is not alive or the signal cannot be sent.
    pub fn resume(&mut self, id: u32) -> Result<(), TestkitError> {
        let worker = self.find(id)?;
        let pid = worker.pid()?;
        signal::send(Signal::Cont, pid)?;
        worker.paused = false;
        Ok(())
    }

    /// Writes `line` and a newline to worker `id`'s stdin: a command, in
    /// whatever words its program reads there.
    ///
    /// # Errors
    ///
    /// Fails when it is not running or its stdin cannot be written (it
    /// exited).
    pub fn tell(&mut self, id: u32, line: &str) -> Result<(), TestkitError> {
        let worker = self.find(id)?;
        let stdin = worker
            .stdin
            .as_mut()
            .ok_or_else(|| TestkitError::new(format!("worker {id} is not running")))?;
        stdin
            .write_all(format!("{line}\n").as_bytes())
            .and_then(|()| stdin.flush())
            .map_err(|e| TestkitError::with_source(format!("could not tell worker {id}"), e))
    }

    /// Kills worker `id` (`SIGKILL`) and reaps it; what it had written
    /// stays in the history. Does nothing if it is gone already.
    pub fn kill(&mut self, id: u32) {
        if let Ok(worker) = self.find(id) {
            worker.kill();
        }
    }

    /// Kills worker `id` with `SIGKILL` while its stdin is still open, then
    /// reaps it as [`kill`](Self::kill) does: a crash, which the worker
    /// cannot see coming. ([`kill`](Self::kill) closes stdin before it
    /// kills, and a worker that stops when its stdin closes may get some
    /// way into stopping, a release sent, before the signal lands.)
    ///
    /// # Errors
    ///
    /// Fails when it is not running or the signal cannot be sent.
    pub fn crash(&mut self, id: u32) -> Result<(), TestkitError> {
        let worker = self.find(id)?;
        let pid = worker.pid()?;
        signal::send(Signal::Kill, pid)?;
        worker.kill();
        Ok(())
    }

    /// Stops every worker: resumes the paused ones, closes every stdin
    /// (the signal to finish the lease at hand and exit), waits up to
    /// `bound` for them to exit, kills those still running, and waits for
    /// their output to be read. Returns the ids of the killed ones.
    pub fn stop_all(&mut self, bound: Duration) -> Vec<u32> {
        for worker in &mut self.workers {
            if worker.paused
                && let Ok(pid) = worker.pid()
            {
                let _ = signal::send(Signal::Cont, pid);
                worker.paused = false;
            }
            worker.stdin = None;
        }
        let deadline = Instant::now() + bound;
        while self.workers.iter_mut().any(Worker::still_running) && Instant::now() < deadline {
            thread::sleep(EXIT_POLL);
        }
        let mut killed = Vec::new();
        for worker in &mut self.workers {
            if worker.still_running() {
                killed.push(worker.id);
            }
            worker.kill();
        }
        killed
    }

    fn find(&mut self, id: u32) -> Result<&mut Worker, TestkitError> {
        self.workers
            .iter_mut()
            .find(|w| w.id == id)
            .ok_or_else(|| TestkitError::new(format!("no worker {id}")))
    }
}

impl Worker {
    fn pid(&self) -> Result<u32, TestkitError> {
        self.child
            .as_ref()
            .map(Child::id)
            .ok_or_else(|| TestkitError::new(format!("worker {} is not running", self.id)))
    }

    /// Whether the process has not exited yet (reaping it if it has).
    fn still_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|child| matches!(child.try_wait(), Ok(None)))
    }

    /// Kills and reaps the process, then waits for the end of its output.
    fn kill(&mut self) {
        self.stdin = None;
        if let Some(mut child) = self.child.take() {
            if self.paused {
                let _ = signal::send(Signal::Cont, child.id());
            }
            reap(&mut child);
        }
        self.paused = false;
        if let Some(reader) = self.reader.take() {
            // The pipe closes with the process, so the reader ends.
            let _ = reader.join();
        }
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        for worker in &mut self.workers {
            worker.kill();
        }
    }
}
