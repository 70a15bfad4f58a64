//! W3: 8 tasks of one process contend for one key, each in a tight loop of
//! lock (waiting) + tiny critical section + release.

use super::{Context, contended_row, progress, run_contended, warm_up};
use crate::contenders::{Impl, Locker, POLL_MAX, WAIT};
use crate::error::BenchResult;
use crate::stats::{nanos, wall_ns};
use crate::table::{WorkloadId, WorkloadResult};
use crate::transport::Transport;
use std::sync::Arc;
use std::time::Duration;

/// Contending tasks.
pub const TASKS: u32 = 8;

/// The implementations of the contended workloads, in table order.
pub const ROWS: [Impl; 4] = [Impl::Minimum, Impl::Guard, Impl::Attribute, Impl::Rslock];

/// How long after the tasks are spawned they start, so they start together.
const START_DELAY: Duration = Duration::from_millis(20);

/// Runs W3 on the single server.
pub async fn run(ctx: &Context) -> BenchResult<WorkloadResult> {
    let mut rows = Vec::new();
    for imp in ROWS {
        progress(WorkloadId::W3, imp);
        let locker = Arc::new(Locker::connect(imp, std::slice::from_ref(&ctx.url)).await?);
        let key = locker.key("w3");
        warm_up(&locker, &key).await;
        let start = wall_ns() + nanos(START_DELAY);
        let end = start + nanos(ctx.seconds);
        let run = run_contended(locker, key, TASKS, 0, start, end).await?;
        rows.push(contended_row(imp, run, TASKS, start, end));
    }
    Ok(WorkloadResult {
        id: WorkloadId::W3,
        transport: Transport::Plain,
        title: "8 tasks, one key, lock (wait) + tiny critical section + release",
        params: format!(
            "{TASKS} tasks in 1 process, one client; {}",
            contended_params(ctx)
        ),
        rows,
    })
}

/// The parameters W3 and W3p share.
pub fn contended_params(ctx: &Context) -> String {
    format!(
        "ttl 10s; section = stamp, yield once, stamp; lock-core waits up to {}s; \
         minimum polls with a random 0-{}ms sleep; rslock: default retries (3 tries, \
         random 0-200ms apart), lock() called again when it gives up (counted in failed); \
         switches = acquisitions by another task than the previous holder; {:.1} s per row",
        WAIT.as_secs(),
        POLL_MAX.as_millis(),
        ctx.seconds.as_secs_f64()
    )
}
