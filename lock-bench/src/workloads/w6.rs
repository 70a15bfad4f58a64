//! W6: the cost of the attribute over the guard API: the same body (empty),
//! the same client, one task, one key, alternating between the two in short
//! rounds (guard first in even rounds, attribute first in odd ones) so that
//! a machine that speeds up or slows down during the run affects both alike.

use super::{Context, CycleRun, WorkloadId, progress, run_cycles};
use crate::contenders::{Impl, Locker, lock_core_client};
use crate::error::BenchResult;
use crate::report::WorkloadResult;
use lock_core::{LockClient, MemoryStore};
use std::sync::Arc;

/// Rounds per implementation.
const ROUNDS: u32 = 20;

/// Runs W6 on the single server, and again on lock-core's in-memory
/// backend, where no network noise hides the client's own cost.
pub async fn run(ctx: &Context) -> BenchResult<WorkloadResult> {
    progress(WorkloadId::W6, Impl::Attribute);
    let client = lock_core_client(std::slice::from_ref(&ctx.url)).await?;
    let (guard_row, mut attribute_row, median) = compare(client, ctx, ctx.seconds).await?;
    attribute_row.overhead_percent = median;
    // The in-memory backend: the same two paths with no round trip, so the
    // difference is the attribute's own CPU cost, measured as precisely as
    // this machine allows.
    let memory = LockClient::builder()
        .in_memory(&MemoryStore::new())
        .key_prefix("bench:memory:")
        .build()
        .await?;
    let (memory_guard, memory_attribute, memory_median) =
        compare(memory, ctx, ctx.seconds / 2).await?;
    if let (Some(g), Some(a), Some(pct)) = (memory_guard.rate, memory_attribute.rate, memory_median)
    {
        attribute_row.note = format!(
            "in-memory backend: guard {g:.0}/s, attribute {a:.0}/s, overhead {pct:+.2}% \
             (the attribute's CPU cost with no round trip)"
        );
    }
    Ok(WorkloadResult {
        id: WorkloadId::W6,
        title: "annotated function vs the same body with the guard API",
        params: format!(
            "1 task, one key, empty body, ttl 10s, one shared client; {ROUNDS} alternating \
             rounds of {:.2} s each; overhead = median over round pairs of the time per \
             call, attribute over guard",
            (ctx.seconds / ROUNDS).as_secs_f64()
        ),
        rows: vec![guard_row, attribute_row],
    })
}

/// Alternates the guard API and the attribute on `client` for `seconds`;
/// the two rows and the median over round pairs of the attribute's time
/// per call over the guard's, in percent.
async fn compare(
    client: LockClient,
    ctx: &Context,
    seconds: std::time::Duration,
) -> BenchResult<(crate::report::Row, crate::report::Row, Option<f64>)> {
    let guard = Arc::new(Locker::Guard(client.clone()));
    let attribute = Arc::new(Locker::Attribute(client));
    let keys = ["w6".to_owned()];
    run_cycles(&guard, &keys, ctx.warmup / 2).await?;
    run_cycles(&attribute, &keys, ctx.warmup / 2).await?;

    let round = seconds / ROUNDS;
    let mut guard_total = CycleRun::default();
    let mut attribute_total = CycleRun::default();
    // Per pair of neighbouring rounds: attribute time per call / guard's.
    let mut ratios = Vec::with_capacity(ROUNDS as usize);
    for i in 0..ROUNDS {
        let (g, a) = if i % 2 == 0 {
            let g = run_cycles(&guard, &keys, round).await?;
            (g, run_cycles(&attribute, &keys, round).await?)
        } else {
            let a = run_cycles(&attribute, &keys, round).await?;
            (run_cycles(&guard, &keys, round).await?, a)
        };
        if g.cycles > 0 && a.cycles > 0 {
            let per_call = |run: &CycleRun| run.elapsed.as_secs_f64() / run.cycles as f64;
            ratios.push(per_call(&a) / per_call(&g));
        }
        guard_total.absorb(g);
        attribute_total.absorb(a);
    }
    // The median pair: a burst of load from elsewhere on a shared machine
    // moves one pair, not the figure.
    ratios.sort_by(f64::total_cmp);
    let median = ratios.get(ratios.len() / 2).map(|m| (m - 1.0) * 100.0);
    Ok((
        guard_total.into_row(Impl::Guard, "cycles"),
        attribute_total.into_row(Impl::Attribute, "cycles"),
        median,
    ))
}
