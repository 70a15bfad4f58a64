//! W4: W1 against 5 independent primaries (Redlock): cycles/s and cycle
//! time. The minimum sends each command to all five at once and counts a
//! majority.

use super::{Context, Tasks, measure_rows};
use crate::contenders::Impl;
use crate::error::{BenchResult, fail};
use crate::table::{WorkloadId, WorkloadResult};
use crate::transport::{Endpoint, Transport};

/// The implementations of W4, in table order.
const ROWS: [Impl; 5] = [
    Impl::Floor,
    Impl::Minimum,
    Impl::Guard,
    Impl::Attribute,
    Impl::Rslock,
];

/// Runs W4 on the Redlock servers.
pub async fn run(ctx: &Context) -> BenchResult<WorkloadResult> {
    if ctx.redlock_urls.len() < 3 {
        return Err(fail("W4 needs the Redlock servers"));
    }
    let names = ["w4".to_owned()];
    let rows = measure_rows(
        ctx,
        WorkloadId::W4,
        &ROWS,
        &Endpoint::Plain(ctx.redlock_urls.clone()),
        Tasks::OwnKey(&names),
    )
    .await?;
    Ok(WorkloadResult {
        id: WorkloadId::W4,
        transport: Transport::Plain,
        title: "W1 against 5-node Redlock",
        params: format!(
            "1 task, ttl 10s, {} primaries, quorum {}; floor = SET to all at once, \
             sequentially; {}",
            ctx.redlock_urls.len(),
            ctx.redlock_urls.len() / 2 + 1,
            ctx.timing()
        ),
        rows,
    })
}
