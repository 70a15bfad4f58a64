//! W1: one task, one key, lock + release in a loop (ttl 10 s): cycles/s and
//! cycle time, next to the floor (sequential plain `SET` on one connection).

use super::{Context, Tasks, measure_rows};
use crate::contenders::Impl;
use crate::error::BenchResult;
use crate::table::{WorkloadId, WorkloadResult};

/// The implementations of W1, in table order: all of them.
const ROWS: [Impl; 6] = Impl::ALL;

/// Runs W1 on the context's transport.
pub async fn run(ctx: &Context) -> BenchResult<WorkloadResult> {
    let names = ["w1".to_owned()];
    let rows = measure_rows(
        ctx,
        WorkloadId::W1,
        &ROWS,
        &ctx.endpoint,
        Tasks::OwnKey(&names),
    )
    .await?;
    Ok(WorkloadResult {
        id: WorkloadId::W1,
        transport: ctx.transport,
        title: "one task, one key, lock + release in a loop",
        params: format!(
            "{}; 1 task, ttl 10s; floor = sequential plain SET on one connection of the \
             redis crate (as the minimum's), raw = the same on a bare socket; {}",
            ctx.transport.describe(&ROWS),
            ctx.timing()
        ),
        rows,
    })
}
