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

/// Runs W2 on the context's transport.
pub async fn run(ctx: &Context) -> BenchResult<WorkloadResult> {
    let names: Vec<String> = (0..TASKS).map(|i| format!("w2:{i}")).collect();
    let rows = measure_rows(
        ctx,
        WorkloadId::W2,
        &ROWS,
        &ctx.endpoint,
        Tasks::OwnKey(&names),
    )
    .await?;
    Ok(WorkloadResult {
        id: WorkloadId::W2,
        transport: ctx.transport,
        title: "64 tasks, each its own key",
        params: format!(
            "{}; {TASKS} tasks sharing one client (one multiplexed connection; on a cluster, \
             one per primary), ttl 10s; floor = {TASKS} tasks SETting on one connection; {}",
            ctx.transport.describe(&ROWS),
            ctx.timing()
        ),
        rows,
    })
}
