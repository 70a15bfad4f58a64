//! W6: the cost of the attribute over the guard API: the same body (empty),
//! the same client, one task, one key, the two called alternately, one call
//! each per pair (guard first in even pairs, attribute first in odd ones).
//! Neighbouring calls see the same machine, so the median over pairs of the
//! difference between the two is the attribute's cost, and a pause of the
//! machine or a slow round trip moves one pair, not the figure.

use super::{Context, CycleRun, progress, timed_cycle};
use crate::contenders::{Impl, Locker, Section, lock_core_client};
use crate::error::BenchResult;
use crate::table::{Row, WorkloadId, WorkloadResult};
use crate::transport::Transport;
use lock_core::{LockClient, MemoryStore};
use std::time::{Duration, Instant};

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
        transport: Transport::Plain,
        title: "annotated function vs the same body with the guard API",
        params: format!(
            "1 task, one key, empty body, ttl 10s, one shared client; {:.1} s of calls \
             alternating one by one (guard first in even pairs, attribute first in odd ones); \
             overhead = median over pairs of (attribute time - guard time) / median guard \
             time",
            ctx.seconds.as_secs_f64()
        ),
        rows: vec![guard_row, attribute_row],
    })
}

/// Alternates the guard API and the attribute on `client`, call by call,
/// for `seconds`; the two rows and the attribute's overhead in percent: the
/// median over pairs of the difference of the two calls' times, over the
/// guard's median time.
async fn compare(
    client: LockClient,
    ctx: &Context,
    seconds: Duration,
) -> BenchResult<(Row, Row, Option<f64>)> {
    let guard = Locker::Guard(client.clone());
    let attribute = Locker::Attribute(client);
    let section = Section::empty();
    let key = "w6";
    let mut guard_run = CycleRun::default();
    let mut attribute_run = CycleRun::default();
    let mut differences: Vec<i64> = Vec::new();
    let warm_until = Instant::now() + ctx.warmup;
    while Instant::now() < warm_until {
        timed_cycle(&guard, key, &section, &mut CycleRun::default()).await;
        timed_cycle(&attribute, key, &section, &mut CycleRun::default()).await;
    }
    let start = Instant::now();
    let deadline = start + seconds;
    let mut pair = 0_u64;
    while Instant::now() < deadline {
        let (g, a) = if pair.is_multiple_of(2) {
            let g = timed_cycle(&guard, key, &section, &mut guard_run).await;
            (
                g,
                timed_cycle(&attribute, key, &section, &mut attribute_run).await,
            )
        } else {
            let a = timed_cycle(&attribute, key, &section, &mut attribute_run).await;
            (timed_cycle(&guard, key, &section, &mut guard_run).await, a)
        };
        if let (Some(g), Some(a)) = (g, a) {
            differences.push(signed(a) - signed(g));
        }
        pair += 1;
    }
    // Each row's rate is over the time its own calls took.
    for run in [&mut guard_run, &mut attribute_run] {
        run.elapsed = Duration::from_nanos(run.latencies_ns.iter().sum());
    }
    let guard_row = guard_run.into_row(Impl::Guard, "cycles");
    differences.sort_unstable();
    let overhead = differences
        .get(differences.len() / 2)
        .zip(guard_row.p50_us.filter(|&p50| p50 > 0.0))
        .map(|(&d, p50_us)| d as f64 / (p50_us * 1_000.0) * 100.0);
    Ok((
        guard_row,
        attribute_run.into_row(Impl::Attribute, "cycles"),
        overhead,
    ))
}

/// Nanoseconds as a signed number, saturating.
fn signed(ns: u64) -> i64 {
    i64::try_from(ns).unwrap_or(i64::MAX)
}
