//! A worker process's side of the history: its events, one JSON line each
//! on stdout, and its register operations, each reported as it ends.

use std::io::Write;
use std::time::Duration;

use super::history::{Event, OpKind, OpOutcome, Released, now_us};
use super::register::{Answer, FencedRegister};
use crate::TestkitError;

/// Writes `event` as one line on stdout, where [`Workers`](super::Workers)
/// reads it into the [`History`](super::History): a single write, so a
/// killed worker never leaves half a line. Nobody to tell if it fails.
pub fn emit(event: &Event) {
    let mut line = event.to_line();
    line.push('\n');
    let _ = std::io::stdout().lock().write_all(line.as_bytes());
}

/// What a worker reports: its register operations and the ends of its
/// leases, as [`Event`]s on stdout.
pub struct Reporter {
    worker: u32,
    register: FencedRegister,
    /// Register operations sent, for their tags.
    ops: u64,
}

impl Reporter {
    /// Connects worker `worker` to the register at `register` (each call
    /// bounded by `timeout`) and reports that it started.
    pub async fn start(
        worker: u32,
        register: &str,
        timeout: Duration,
    ) -> Result<Reporter, TestkitError> {
        let register = FencedRegister::connect(register, timeout).await?;
        emit(&Event::Started {
            worker,
            pid: std::process::id(),
            at: now_us(),
        });
        Ok(Reporter {
            worker,
            register,
            ops: 0,
        })
    }

    /// The worker's number.
    pub fn worker(&self) -> u32 {
        self.worker
    }

    /// One register operation under `lease`, carrying `token`, reported
    /// with its tag, its times and its outcome.
    pub async fn operate(
        &mut self,
        lease: u32,
        op: OpKind,
        token: Option<u64>,
        value: i64,
    ) -> Answer {
        self.ops += 1;
        let tag = format!("w{}.{}", self.worker, self.ops);
        let start = now_us();
        let answer = match op {
            OpKind::Read => self.register.read(token, &tag).await,
            OpKind::Write => self.register.write(token, value, &tag).await,
        };
        let end = now_us();
        let written = (op == OpKind::Write).then_some(value);
        let (outcome, value) = match &answer {
            Answer::Accepted(read) => (OpOutcome::Accepted, written.or(Some(*read))),
            Answer::Rejected { .. } => (OpOutcome::Rejected, written),
            Answer::Unknown(_) => (OpOutcome::Unknown, written),
        };
        emit(&Event::Op {
            worker: self.worker,
            lease,
            op,
            tag,
            token,
            start,
            end,
            value,
            outcome,
        });
        answer
    }

    /// Reports that `lease` was found lost.
    pub fn lost(&self, lease: u32) {
        emit(&Event::Lost {
            worker: self.worker,
            lease,
            at: now_us(),
        });
    }

    /// Reports the release of `lease`, asked for at `start`.
    pub fn released(&self, lease: u32, start: u64, outcome: Released) {
        emit(&Event::Release {
            worker: self.worker,
            lease,
            start,
            end: now_us(),
            outcome,
        });
    }
}
