//! W2: 64 tasks, each cycling on its own key, sharing one client: total
//! cycles/s.

use super::{Context, Tasks, measure_rows};
use crate::contenders::Impl;
use crate::error::BenchResult;
use crate::table::{WorkloadId, WorkloadResult};

/// Concurrent tasks, one key each.
const TASKS: usize = 64;

/// The implementations of W2, in table order.
const ROWS: [Impl; 5] = [
    Impl::Floor,
    Impl::Minimum,
    Impl::Guard,
    Impl::Attribute,
    Impl::Rslock,
];

/// Runs W2 on the single server.
pub async fn run(ctx: &Context) -> BenchResult<WorkloadResult> {
    let urls = [ctx.url.clone()];
    let names: Vec<String> = (0..TASKS).map(|i| format!("w2:{i}")).collect();
    let rows = measure_rows(ctx, WorkloadId::W2, &ROWS, &urls, Tasks::OwnKey(&names)).await?;
    Ok(WorkloadResult {
        id: WorkloadId::W2,
        title: "64 tasks, each its own key",
        params: format!(
            "{TASKS} tasks sharing one client (one multiplexed connection), ttl 10s; \
             floor = {TASKS} tasks SETting on one connection; {}",
            ctx.timing()
        ),
        rows,
    })
}
