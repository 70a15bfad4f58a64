//! W6: the cost of the attribute over the guard API: the same body (empty),
//! the same client, one task, one key, alternating between the two in short
//! rounds (guard first in even rounds, attribute first in odd ones) so that
//! a machine that speeds up or slows down during the run affects both alike.

use super::{Context, CycleRun, WorkloadId, progress, run_cycles};
use crate::contenders::{Impl, Locker, lock_core_client};
use crate::error::BenchResult;
use crate::report::WorkloadResult;
use std::sync::Arc;

/// Rounds per implementation.
const ROUNDS: u32 = 10;

/// Runs W6 on the single server.
pub async fn run(ctx: &Context) -> BenchResult<WorkloadResult> {
    progress(WorkloadId::W6, Impl::Attribute);
    let client = lock_core_client(std::slice::from_ref(&ctx.url)).await?;
    let guard = Arc::new(Locker::Guard(client.clone()));
    let attribute = Arc::new(Locker::Attribute(client));
    let keys = ["w6".to_owned()];
    run_cycles(&guard, &keys, ctx.warmup / 2).await?;
    run_cycles(&attribute, &keys, ctx.warmup / 2).await?;

    let round = ctx.seconds / ROUNDS;
    let mut guard_total = CycleRun::default();
    let mut attribute_total = CycleRun::default();
    for i in 0..ROUNDS {
        if i % 2 == 0 {
            guard_total.absorb(run_cycles(&guard, &keys, round).await?);
            attribute_total.absorb(run_cycles(&attribute, &keys, round).await?);
        } else {
            attribute_total.absorb(run_cycles(&attribute, &keys, round).await?);
            guard_total.absorb(run_cycles(&guard, &keys, round).await?);
        }
    }
    let guard_row = guard_total.into_row(Impl::Guard, "cycles");
    let mut attribute_row = attribute_total.into_row(Impl::Attribute, "cycles");
    if let (Some(g), Some(a)) = (guard_row.rate, attribute_row.rate)
        && a > 0.0
    {
        // Time per call of the attribute over that of the guard API.
        attribute_row.overhead_percent = Some((g / a - 1.0) * 100.0);
    }
    Ok(WorkloadResult {
        id: WorkloadId::W6,
        title: "annotated function vs the same body with the guard API",
        params: format!(
            "1 task, one key, empty body, ttl 10s, one shared client; {ROUNDS} alternating \
             rounds of {:.2} s each; overhead = time per call, attribute over guard",
            round.as_secs_f64()
        ),
        rows: vec![guard_row, attribute_row],
    })
}
