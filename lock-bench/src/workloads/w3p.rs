//! W3p: W3 spread over 4 processes × 2 tasks.
//!
//! The bench re-executes itself in a hidden worker mode for each process:
//!
//! 1. the parent spawns `lock-bench --worker w3p --impl I --url U --key K
//!    --tasks 2 --task-base B` four times;
//! 2. each worker connects, warms up, and prints `ready`;
//! 3. once all are ready the parent writes `go START END` (wall-clock ns) to
//!    every worker's stdin; they contend from START to END;
//! 4. each worker prints one `rec TASK WAIT_START ACQUIRED RELEASED` line
//!    per acquisition, then `failed N`, `overlaps N`, maybe `error TEXT`,
//!    and `done`, and exits.
//!
//! The parent merges the records by acquisition time: owner switches and
//! overlapping critical sections are found across processes on the shared
//! wall clock. A worker whose stdin closes (the parent died) exits; the
//! parent kills and reaps any worker still running when it gives up.

use super::w3::{ROWS, contended_params};
use super::{ContendedRun, Context, contended_row, progress, run_contended, spawn_self, warm_up};
use crate::args::{WORKER_FLAG, WorkerArgs};
use crate::contenders::{Impl, Locker};
use crate::error::{BenchResult, fail};
use crate::stats::{Record, nanos, wall_ns};
use crate::table::{Row, WorkloadId, WorkloadResult};
use crate::transport::Transport;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout};
use std::sync::Arc;
use std::time::Duration;

/// Worker processes.
const PROCESSES: u32 = 4;

/// Contending tasks in each worker.
const TASKS_PER_PROCESS: u32 = 2;

/// How far ahead of `go` the common start is, so every worker has read it.
const START_DELAY: Duration = Duration::from_millis(100);

/// Runs W3p against the single server.
pub async fn run(ctx: &Context) -> BenchResult<WorkloadResult> {
    let mut rows = Vec::new();
    for imp in ROWS {
        progress(WorkloadId::W3p, imp);
        let url = ctx.url.clone();
        let seconds = ctx.seconds;
        let row = tokio::task::spawn_blocking(move || measure(imp, &url, seconds))
            .await
            .map_err(|e| fail(format!("the W3p coordinator died: {e}")))??;
        rows.push(row);
    }
    Ok(WorkloadResult {
        id: WorkloadId::W3p,
        transport: Transport::Plain,
        title: "W3 with 4 processes × 2 tasks",
        params: format!(
            "{PROCESSES} processes × {TASKS_PER_PROCESS} tasks, one client per process; {}",
            contended_params(ctx)
        ),
        rows,
    })
}

/// One row: starts the workers, runs them, merges their records.
fn measure(imp: Impl, url: &str, seconds: Duration) -> BenchResult<Row> {
    let mut workers = (0..PROCESSES)
        .map(|p| Worker::spawn(imp, url, p * TASKS_PER_PROCESS))
        .collect::<BenchResult<Vec<_>>>()?;
    for worker in &mut workers {
        let line = worker.read_line()?;
        if line != "ready" {
            return Err(fail(format!("a W3p worker said {line:?} instead of ready")));
        }
    }
    let start = wall_ns() + nanos(START_DELAY);
    let end = start + nanos(seconds);
    for worker in &mut workers {
        writeln!(worker.stdin, "go {start} {end}")?;
        worker.stdin.flush()?;
    }
    let mut merged = ContendedRun::default();
    for worker in &mut workers {
        worker.collect(&mut merged)?;
    }
    for worker in &mut workers {
        let status = worker.child.wait()?;
        if !status.success() {
            return Err(fail(format!("a W3p worker exited with {status}")));
        }
    }
    Ok(contended_row(
        imp,
        merged,
        PROCESSES * TASKS_PER_PROCESS,
        start,
        end,
    ))
}

/// A worker process; killed and reaped if dropped while still running.
struct Worker {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Worker {
    /// Starts this executable in worker mode.
    fn spawn(imp: Impl, url: &str, task_base: u32) -> BenchResult<Worker> {
        let (tasks, base) = (TASKS_PER_PROCESS.to_string(), task_base.to_string());
        let args = [
            WORKER_FLAG,
            "w3p",
            "--impl",
            imp.id(),
            "--url",
            url,
            "--key",
            "w3p",
            "--tasks",
            &tasks,
            "--task-base",
            &base,
        ];
        let (child, stdin, stdout) = spawn_self(&args, "a W3p worker")?;
        Ok(Worker {
            child,
            stdin,
            stdout: BufReader::new(stdout),
        })
    }

    /// The next line the worker printed, without its newline.
    fn read_line(&mut self) -> BenchResult<String> {
        let mut line = String::new();
        if self.stdout.read_line(&mut line)? == 0 {
            return Err(fail("a W3p worker ended early (see its error above)"));
        }
        Ok(line.trim_end().to_owned())
    }

    /// Reads the worker's report into `merged`, up to its `done`.
    fn collect(&mut self, merged: &mut ContendedRun) -> BenchResult<()> {
        loop {
            let line = self.read_line()?;
            if let Some(record) = Record::from_line(&line) {
                merged.records.push(record);
            } else if let Some(n) = line.strip_prefix("failed ") {
                merged.failed += n.parse::<u64>()?;
            } else if let Some(n) = line.strip_prefix("overlaps ") {
                merged.overlaps += n.parse::<u64>()?;
            } else if let Some(text) = line.strip_prefix("error ") {
                merged.first_error.get_or_insert_with(|| text.to_owned());
            } else if line == "done" {
                return Ok(());
            } else {
                return Err(fail(format!("a W3p worker printed {line:?}")));
            }
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// The worker side: runs in a child process started by [`run`].
pub fn worker(args: &WorkerArgs) -> BenchResult<()> {
    let imp = Impl::from_id(&args.implementation)
        .filter(|imp| !imp.is_floor())
        .ok_or_else(|| fail(format!("unknown implementation {:?}", args.implementation)))?;
    if args.tasks == 0 || args.url.is_empty() || args.key.is_empty() {
        return Err(fail("worker mode needs --impl, --url, --key and --tasks"));
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let locker = runtime.block_on(Locker::connect(imp, std::slice::from_ref(&args.url)))?;
    let locker = Arc::new(locker);
    let key = locker.key(&args.key);
    runtime.block_on(warm_up(&locker, &key));

    let mut out = std::io::stdout().lock();
    writeln!(out, "ready")?;
    out.flush()?;
    let mut go = String::new();
    std::io::stdin().lock().read_line(&mut go)?;
    let mut parts = go.split_whitespace();
    let (Some("go"), Some(start), Some(end)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(fail(format!("expected `go START END`, got {go:?}")));
    };
    let (start, end): (u64, u64) = (start.parse()?, end.parse()?);

    let run = runtime.block_on(run_contended(
        locker,
        key,
        args.tasks,
        args.task_base,
        start,
        end,
    ))?;
    let mut text = String::with_capacity(run.records.len() * 64);
    for record in &run.records {
        text.push_str(&record.to_line());
        text.push('\n');
    }
    out.write_all(text.as_bytes())?;
    writeln!(out, "failed {}", run.failed)?;
    writeln!(out, "overlaps {}", run.overlaps)?;
    if let Some(error) = &run.first_error {
        writeln!(out, "error {}", error.replace('\n', " "))?;
    }
    writeln!(out, "done")?;
    out.flush()?;
    Ok(())
}
