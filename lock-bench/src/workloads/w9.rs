//! W9: shared holds. 8 reader tasks take one key shared
//! (`LockOptions::shared(true)`) and 1 writer task takes it exclusively,
//! all in a tight loop of lock (waiting) + tiny section + release, for a
//! fixed time: reader and writer acquisitions/s, and the writer's wait
//! (a waiting writer keeps new readers out, so it must not starve).
//!
//! rslock has no shared locks, so the baseline is lock-core with the same
//! 9 tasks and every hold exclusive: what sharing buys the readers, and
//! what it costs the writer. An in-process counter checks that no reader
//! is ever inside beside the writer (nor anyone beside an exclusive
//! reader in the baseline).

use super::{ContendedRun, Context, note_error, progress};
use crate::contenders::{Impl, TTL, WAIT, lock_core_client};
use crate::error::{BenchResult, fail};
use crate::stats::{Contention, Record, nanos, wall_ns};
use crate::table::{
    EXCLUSIVE_READERS, EXCLUSIVE_WRITER, Row, SHARED_READERS, SHARED_WRITER, WorkloadId,
    WorkloadResult,
};
use crate::transport::Transport;
use lock_core::{LockClient, LockOptions};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

/// Reader tasks; one writer task beside them.
pub const READERS: u32 = 8;

/// How long after the tasks are spawned they start, so they start together.
const START_DELAY: Duration = Duration::from_millis(20);

/// Runs W9 on the single server: readers shared, then the baseline.
pub async fn run(ctx: &Context) -> BenchResult<WorkloadResult> {
    let mut rows = Vec::new();
    for shared in [true, false] {
        progress(WorkloadId::W9, Impl::Guard);
        let client = lock_core_client(std::slice::from_ref(&ctx.url)).await?;
        // A key per mode: nothing one leaves behind reaches the other.
        let key = if shared { "w9:shared" } else { "w9:exclusive" };
        for _ in 0..20 {
            client
                .lock_with(key, options(shared))
                .await?
                .release()
                .await?;
        }
        let start = wall_ns() + nanos(START_DELAY);
        let end = start + nanos(ctx.seconds);
        let inside = Arc::new(Inside::default());
        let mut tasks = Vec::new();
        for task in 0..=READERS {
            let holder = Holder {
                client: client.clone(),
                key,
                task,
                options: options(shared && task < READERS),
                inside: inside.clone(),
            };
            tasks.push(tokio::spawn(holder.run(start, end)));
        }
        let mut runs = Vec::new();
        for task in tasks {
            runs.push(
                task.await
                    .map_err(|e| fail(format!("a W9 task died: {e}")))?,
            );
        }
        rows.extend(rows_of(shared, runs, &inside, start, end));
    }
    Ok(WorkloadResult {
        id: WorkloadId::W9,
        transport: Transport::Plain,
        title: "shared: 8 readers and 1 writer on one key",
        params: format!(
            "{READERS} reader tasks + 1 writer task, one client, one key; ttl 10s, waits up to \
             {}s; section = stamp, yield once, stamp; shared = readers take shared holds, the \
             writer exclusive ones; exclusive = every hold exclusive (the baseline: rslock has \
             no shared locks); µs columns are the wait for the lock; per task = readers' \
             fewest..most; {:.1} s per mode",
            WAIT.as_secs(),
            ctx.seconds.as_secs_f64()
        ),
        rows,
    })
}

/// The options of a holder: shared or exclusive.
fn options(shared: bool) -> LockOptions {
    LockOptions::new(TTL).wait(WAIT).shared(shared)
}

/// Who is inside the key in this process, to check the lock's promise.
#[derive(Debug, Default)]
struct Inside {
    /// Every holder inside.
    holders: AtomicUsize,
    /// The exclusive holders inside.
    exclusive: AtomicUsize,
    /// Readers inside now, and the most at once.
    readers: AtomicUsize,
    most_readers: AtomicUsize,
    /// Holders that entered beside one they must exclude.
    overlaps: AtomicU64,
}

impl Inside {
    /// The tiny section of one holder: stamp, enter, yield once, leave,
    /// stamp. An exclusive holder must find nobody inside; a shared one no
    /// exclusive holder. Counting in first and looking second, two holders
    /// that clash always see each other.
    async fn section(&self, exclusive: bool, reader: bool) -> (u64, u64) {
        let acquired = wall_ns();
        if exclusive {
            self.exclusive.fetch_add(1, Ordering::SeqCst);
        }
        let before = self.holders.fetch_add(1, Ordering::SeqCst);
        let clash = if exclusive {
            before > 0
        } else {
            self.exclusive.load(Ordering::SeqCst) > 0
        };
        if clash {
            self.overlaps.fetch_add(1, Ordering::SeqCst);
        }
        if reader {
            let readers = self.readers.fetch_add(1, Ordering::SeqCst) + 1;
            self.most_readers.fetch_max(readers, Ordering::SeqCst);
        }
        tokio::task::yield_now().await;
        if reader {
            self.readers.fetch_sub(1, Ordering::SeqCst);
        }
        self.holders.fetch_sub(1, Ordering::SeqCst);
        if exclusive {
            self.exclusive.fetch_sub(1, Ordering::SeqCst);
        }
        (acquired, wall_ns())
    }
}

/// One task of W9: readers are tasks `0..READERS`, the writer `READERS`.
struct Holder {
    client: LockClient,
    key: &'static str,
    task: u32,
    options: LockOptions,
    inside: Arc<Inside>,
}

impl Holder {
    /// Locks, runs the section and releases, again and again from `start`
    /// until `end` (wall clock).
    async fn run(self, start: u64, end: u64) -> ContendedRun {
        tokio::time::sleep(Duration::from_nanos(start.saturating_sub(wall_ns()))).await;
        let exclusive = !self.options.is_shared();
        let reader = self.task < READERS;
        let mut run = ContendedRun::default();
        while wall_ns() < end {
            let wait_start = wall_ns();
            let guard = match self.client.lock_with(self.key, self.options.clone()).await {
                Ok(guard) => guard,
                Err(e) => {
                    note_error(&mut run.failed, &mut run.first_error, &e.into());
                    continue;
                }
            };
            let (acquired, released) = self.inside.section(exclusive, reader).await;
            match guard.release().await {
                Ok(true) => run.records.push(Record {
                    task: self.task,
                    wait_start,
                    acquired,
                    released,
                }),
                Ok(false) => {
                    let lost = fail("the lock was lost before its release");
                    note_error(&mut run.failed, &mut run.first_error, &lost);
                }
                Err(e) => note_error(&mut run.failed, &mut run.first_error, &e.into()),
            }
        }
        run
    }
}

/// The readers' row and the writer's row of one mode.
fn rows_of(
    shared: bool,
    runs: Vec<ContendedRun>,
    inside: &Inside,
    start: u64,
    end: u64,
) -> [Row; 2] {
    let mut readers = ContendedRun::default();
    let mut writer = ContendedRun::default();
    for (task, run) in (0..).zip(runs) {
        let side = if task < READERS {
            &mut readers
        } else {
            &mut writer
        };
        side.records.extend(run.records);
        side.failed += run.failed;
        if side.first_error.is_none() {
            side.first_error = run.first_error;
        }
    }
    // The writer is task 0 of its own row.
    for record in &mut writer.records {
        record.task = 0;
    }
    let overlaps = inside.overlaps.load(Ordering::SeqCst);
    let (reader_label, writer_label) = if shared {
        (SHARED_READERS, SHARED_WRITER)
    } else {
        (EXCLUSIVE_READERS, EXCLUSIVE_WRITER)
    };
    let mut reader_row = row(reader_label, readers, READERS, overlaps, start, end);
    let most = inside.most_readers.load(Ordering::SeqCst);
    let note = format!("most readers inside at once: {most}");
    reader_row.note = [note, reader_row.note]
        .join("; ")
        .trim_end_matches("; ")
        .to_owned();
    let mut writer_row = row(writer_label, writer, 1, overlaps, start, end);
    writer_row.per_task = None;
    [reader_row, writer_row]
}

/// One row: acquisitions/s in the window, the wait, the fewest and most
/// acquisitions of one task.
fn row(
    label: &'static str,
    mut run: ContendedRun,
    tasks: u32,
    overlaps: u64,
    start: u64,
    end: u64,
) -> Row {
    let c = Contention::from_records(&mut run.records, tasks, start, end);
    let mut row = Row::new(Impl::Guard, "acquisitions");
    row.label = Some(label);
    row.rate = Some(c.acquisitions_per_s);
    row.p50_us = Some(c.wait.p50_us);
    row.p99_us = Some(c.wait.p99_us);
    row.max_us = Some(c.wait.max_us);
    row.per_task = Some((c.per_task_min, c.per_task_max));
    row.overlaps = Some(overlaps);
    row.failed = Some(run.failed);
    row.samples = c.acquisitions;
    row.note = run.first_error.unwrap_or_default();
    row
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn readers_share_and_the_writer_excludes_them() {
        let inside = Inside::default();
        // Both sections run in this task: each yields inside, so the other
        // enters meanwhile.
        tokio::join!(inside.section(false, true), inside.section(false, true));
        assert_eq!(inside.overlaps.load(Ordering::SeqCst), 0);
        assert_eq!(inside.most_readers.load(Ordering::SeqCst), 2);
        tokio::join!(inside.section(false, true), inside.section(true, false));
        assert_eq!(inside.overlaps.load(Ordering::SeqCst), 1);
        tokio::join!(inside.section(true, true), inside.section(true, false));
        assert_eq!(inside.overlaps.load(Ordering::SeqCst), 2);
    }
}
