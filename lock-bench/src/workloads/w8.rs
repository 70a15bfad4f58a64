//! W8: several keys at once: 64 tasks, each cycle locking two random
//! distinct accounts out of 1,000 at once, doing nothing, and releasing
//! them. lock-core takes the pair with `lock_all`; the minimum with one
//! script that sets both keys (`NX`-style: all or none) and one that
//! compares and deletes both.

use super::{Context, Tasks, measure_rows};
use crate::contenders::{Impl, PAIR_POLL_MAX, WAIT};
use crate::error::BenchResult;
use crate::table::{LOCK_ALL_LABEL, WorkloadId, WorkloadResult};
use crate::transport::{Endpoint, Transport};

/// Concurrent tasks.
const TASKS: usize = 64;

/// The accounts the pairs are drawn from.
const ACCOUNTS: usize = 1_000;

/// The implementations of W8, in table order: the two with a lock on
/// several keys.
const ROWS: [Impl; 2] = [Impl::Minimum, Impl::Guard];

/// Runs W8 on the single server.
pub async fn run(ctx: &Context) -> BenchResult<WorkloadResult> {
    let endpoint = Endpoint::Plain(vec![ctx.url.clone()]);
    let names: Vec<String> = (0..ACCOUNTS).map(|i| format!("w8:{i}")).collect();
    let tasks = Tasks::RandomPairs {
        tasks: TASKS,
        names: &names,
    };
    let mut rows = measure_rows(ctx, WorkloadId::W8, &ROWS, &endpoint, tasks).await?;
    for row in &mut rows {
        if row.implementation == Impl::Guard {
            row.label = Some(LOCK_ALL_LABEL);
        }
    }
    Ok(WorkloadResult {
        id: WorkloadId::W8,
        transport: Transport::Plain,
        title: "several keys: lock 2 random accounts of 1,000 at once",
        params: format!(
            "{TASKS} tasks sharing one client, each cycle locks 2 distinct accounts drawn at \
             random from {ACCOUNTS} (all or none), empty section, releases both; ttl 10s; \
             lock-core: lock_all, waiting up to {}s; minimum: one EVALSHA setting both keys or \
             neither, one compare-and-delete of both, polling a busy pair with a random \
             0-{}ms sleep; cycle time includes waiting for a busy pair; {}",
            WAIT.as_secs(),
            PAIR_POLL_MAX.as_millis(),
            ctx.timing()
        ),
        rows,
    })
}
