//! What the workers report: one [`Event`] per line of their stdout, and the
//! [`History`] the test collects them into.

use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// Microseconds since the Unix epoch by the system clock. The workers and
/// the test run on one machine and share that clock, so times from
/// different processes compare.
pub fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| {
            u64::try_from(since.as_micros()).unwrap_or(u64::MAX)
        })
}

/// One thing a worker did, with the times (from [`now_us`]) it started and
/// ended. A worker numbers its leases (`lease`) from 1; `(worker, lease)`
/// names one holding of the lock.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// The worker is connected to the lock servers and the register.
    Started {
        /// The worker's number.
        worker: u32,
        /// Its process id.
        pid: u32,
        /// When it was ready.
        at: u64,
    },
    /// One call that asked for the lock.
    Acquire {
        /// The worker's number.
        worker: u32,
        /// The lease this call was for; it exists when `outcome` is `Ok`.
        lease: u32,
        /// When the call was made.
        start: u64,
        /// When it returned.
        end: u64,
        /// How it ended.
        outcome: Acquired,
        /// The fencing token granted, when fencing was asked for.
        token: Option<u64>,
    },
    /// One operation on the register, under a lease.
    Op {
        /// The worker's number.
        worker: u32,
        /// The lease it was made under.
        lease: u32,
        /// Read or write.
        op: OpKind,
        /// The name the register logs it under (unique in a run).
        tag: String,
        /// The fencing token it carried; `None` in a run without fencing.
        token: Option<u64>,
        /// When it was sent.
        start: u64,
        /// When the answer came (or the worker gave up on it).
        end: u64,
        /// For a write, the value written; for an accepted read, the
        /// value read.
        value: Option<i64>,
        /// The register's answer.
        outcome: OpOutcome,
    },
    /// Before an operation, the holder found its lease lost and stopped.
    Lost {
        /// The worker's number.
        worker: u32,
        /// The lease found lost.
        lease: u32,
        /// When.
        at: u64,
    },
    /// The release that ended a lease.
    Release {
        /// The worker's number.
        worker: u32,
        /// The lease released.
        lease: u32,
        /// When the release was called.
        start: u64,
        /// When it returned.
        end: u64,
        /// What it answered.
        outcome: Released,
    },
}

impl Event {
    /// The worker that reported it.
    pub fn worker(&self) -> u32 {
        match self {
            Event::Started { worker, .. }
            | Event::Acquire { worker, .. }
            | Event::Op { worker, .. }
            | Event::Lost { worker, .. }
            | Event::Release { worker, .. } => *worker,
        }
    }

    /// The event as one line of JSON, without the newline.
    pub fn to_line(&self) -> String {
        // A plain enum of numbers and strings always serializes.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Reads a line written by [`to_line`](Self::to_line).
    ///
    /// # Errors
    ///
    /// Fails on anything else, with the JSON error.
    pub fn parse(line: &str) -> Result<Event, serde_json::Error> {
        serde_json::from_str(line)
    }
}

/// How a call for the lock ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Acquired {
    /// Granted.
    Ok,
    /// Held by another owner for the whole wait.
    Contended,
    /// The lock servers could not be reached (or not enough of them).
    Unavailable,
    /// Any other error.
    Failed,
}

/// A register operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OpKind {
    /// Read the counter.
    Read,
    /// Write the counter.
    Write,
}

/// The register's answer to an operation, as the worker saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OpOutcome {
    /// Done.
    Accepted,
    /// Refused: the token was below one the register had seen.
    Rejected,
    /// No answer (timeout, broken connection): it may or may not have
    /// been applied; the register's log tells.
    Unknown,
}

/// What a release answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Released {
    /// The lock was still ours, and is released.
    Released,
    /// The lock was no longer ours (expired, taken over).
    NotOurs,
    /// The release failed (the lock servers did not answer).
    Failed,
}

/// Every event of a run, in the order the test received them, and the
/// lines that were not events. Shared between the threads that read the
/// workers' output and the test, which can wait for an event to arrive.
#[derive(Debug, Default)]
pub struct History {
    state: Mutex<Lines>,
    arrived: Condvar,
}

#[derive(Debug, Default)]
struct Lines {
    events: Vec<Event>,
    malformed: Vec<String>,
}

impl History {
    /// An empty history.
    pub fn new() -> History {
        History::default()
    }

    /// Adds a line a worker wrote: an event, or a malformed line kept for
    /// the checker to report.
    pub fn push_line(&self, line: &str) {
        let mut state = self.lock();
        match Event::parse(line) {
            Ok(event) => state.events.push(event),
            Err(e) => state.malformed.push(format!("{line:?}: {e}")),
        }
        drop(state);
        self.arrived.notify_all();
    }

    /// How many events have arrived.
    pub fn len(&self) -> usize {
        self.lock().events.len()
    }

    /// Whether none has.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every event so far.
    pub fn events(&self) -> Vec<Event> {
        self.lock().events.clone()
    }

    /// The lines that were not events.
    pub fn malformed(&self) -> Vec<String> {
        self.lock().malformed.clone()
    }

    /// Waits for the first event at index `from` or later for which `pick`
    /// gives something, for at most `bound`. Returns it with the index
    /// after that event (where to look next), or `None` after `bound`.
    pub fn wait_for<T>(
        &self,
        from: usize,
        bound: Duration,
        mut pick: impl FnMut(&Event) -> Option<T>,
    ) -> Option<(T, usize)> {
        let deadline = Instant::now() + bound;
        let mut state = self.lock();
        let mut next = from;
        loop {
            while let Some(event) = state.events.get(next) {
                next += 1;
                if let Some(found) = pick(event) {
                    return Some((found, next));
                }
            }
            let left = deadline.checked_duration_since(Instant::now())?;
            if left.is_zero() {
                return None;
            }
            state = self
                .arrived
                .wait_timeout(state, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    fn lock(&self) -> MutexGuard<'_, Lines> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_round_trip_through_a_line() {
        let event = Event::Op {
            worker: 2,
            lease: 7,
            op: OpKind::Write,
            tag: "w2.14".to_owned(),
            token: Some(1_700_000_000_000_001),
            start: 10,
            end: 12,
            value: Some(5),
            outcome: OpOutcome::Rejected,
        };
        let line = event.to_line();
        assert!(!line.contains('\n'));
        assert_eq!(Event::parse(&line).ok(), Some(event));
    }

    #[test]
    fn wait_for_finds_events_past_the_cursor_and_gives_up_after_the_bound() {
        let history = History::new();
        history.push_line(
            &Event::Lost {
                worker: 1,
                lease: 1,
                at: 5,
            }
            .to_line(),
        );
        history.push_line("not json");
        history.push_line(
            &Event::Lost {
                worker: 2,
                lease: 1,
                at: 6,
            }
            .to_line(),
        );
        let found = history.wait_for(0, Duration::ZERO, |e| (e.worker() == 2).then_some(()));
        assert_eq!(found, Some(((), 2)));
        let none = history.wait_for(2, Duration::from_millis(20), |_| Some(()));
        assert_eq!(none, None);
        assert_eq!(history.malformed().len(), 1);
    }
}
