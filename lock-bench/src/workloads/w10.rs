//! W10: failover. How long after a leader steps down, or dies, the next
//! leader makes its first (fenced) write; lock-core's `campaign` against
//! the campaign loop a user writes over rslock (see [`super::campaign`]).
//!
//! Each implementation has [`CAMPAIGNERS`] campaigners in this process,
//! each with its own client, on one election key with a lease of
//! [`LEASE`]; a leader's first act is one write to a register key
//! (lock-core: a compare-and-set on its term; rslock: a plain `SET`).
//!
//! Resignation rounds (`--w10-resignations`, after one unmeasured): the
//! other campaigners campaign while the leader leads for [`HOLD`]; then
//! the leader resigns; the figure is from just before its resignation
//! call to the reply to the next leader's write. That leader leads the
//! next round.
//!
//! Crash rounds (`--w10-crashes`): the bench starts itself again as a
//! leader process (`lock-bench --w10-leader IMPL URL KEY REGISTER
//! TTL_MS`), which campaigns alone, writes, prints `leader` and keeps
//! leading (lock-core renews its lease) until it is killed; the other
//! campaigners of this process (all but one, in turn) campaign for
//! [`HOLD`]; then the bench reads the key's `PTTL` and kills the leader
//! with `SIGKILL`. Two figures: from the kill, and from the lease's
//! expiry (the middle of the `PTTL` round trip plus the `PTTL`), to the
//! reply to the next leader's write. That leader resigns before the next
//! round.

use super::campaign::{Campaigner, Elected};
use super::killable::Killable;
use super::{CALL_BOUND, Context, bounded, millis_ns, progress};
use crate::args::{LEADER_FLAG, LeaderArgs};
use crate::contenders::Impl;
use crate::error::{BenchResult, fail};
use crate::servers::connect;
use crate::stats::{Spread, wall_ns};
use crate::table::{
    CAMPAIGN_EXPIRED, CAMPAIGN_KILLED, CAMPAIGN_RESIGNED, RSLOCK_EXPIRED, RSLOCK_KILLED,
    RSLOCK_RESIGNED, Row, WorkloadId, WorkloadResult,
};
use crate::transport::Transport;
use redis::aio::MultiplexedConnection;
use std::io::{BufRead, Write};
use std::time::Duration;
use tokio::task::JoinSet;

/// The leaders' lease.
pub const LEASE: Duration = Duration::from_millis(500);

/// How long a leader leads, while the other campaigners wait, before it
/// resigns or is killed.
const HOLD: Duration = Duration::from_millis(100);

/// Campaigners of each implementation in this process.
pub const CAMPAIGNERS: usize = 3;

/// The implementations, in table order.
const ROWS: [Impl; 2] = [Impl::Guard, Impl::Rslock];

/// Crash rounds skipped, at most, per measured round: a round is skipped
/// when the leader's lease had expired before the kill (a busy machine
/// slowed the round past the lease), since its expiry is then unknown.
const SKIPS_PER_ROUND: usize = 1;

/// The bound of a failover, far above any.
const FAILOVER_BOUND: Duration = Duration::from_secs(60);

/// The election's name; each implementation campaigns on its own key.
const ELECTION: &str = "w10";

/// Runs W10 on the single server.
pub async fn run(ctx: &Context) -> BenchResult<WorkloadResult> {
    let mut admin = connect(&ctx.url).await?;
    let mut rows = Vec::new();
    for imp in ROWS {
        progress(WorkloadId::W10, imp);
        let register = format!("bench:w10:register:{}", imp.id());
        let mut pool = Vec::with_capacity(CAMPAIGNERS);
        for _ in 0..CAMPAIGNERS {
            pool.push(bounded(Campaigner::connect(imp, &ctx.url, &register)).await?);
        }
        rows.push(resignation_row(ctx, imp, &pool).await?);
        rows.extend(crash_rows(ctx, imp, &pool, &register, &mut admin).await?);
    }
    Ok(WorkloadResult {
        id: WorkloadId::W10,
        transport: Transport::Plain,
        title: "failover: the next leader's first write after a resignation or a crash",
        params: format!(
            "{CAMPAIGNERS} campaigners, each its own client, on one key, lease {} ms; lock-core: \
             campaign (renewed while leading), the leader's write a Lua compare-and-set on its \
             term (the fenced write); rslock: acquire_no_guard (lock() with its default retries, \
             called again until it succeeds; not renewed: no leader leads as long as its lease), \
             the leader's write a plain SET (rslock has no fencing tokens); each leader writes \
             once, then leads {} ms while the others campaign; resignation: {} rounds after one \
             unmeasured, from the resign call (rslock: unlock); crash: {} rounds, the leader a \
             process of its own (the bench re-executed) killed with SIGKILL, from the kill and \
             from its lease's expiry (PTTL read just before the kill); to the reply to the next \
             leader's write; overlaps = next write before the resignation or kill; µs columns = \
             failover time",
            LEASE.as_millis(),
            HOLD.as_millis(),
            ctx.w10_resignations,
            ctx.w10_crashes,
        ),
        rows,
    })
}

/// `ctx.w10_resignations` resignations (after one unmeasured) among the
/// campaigners of `pool`.
async fn resignation_row(ctx: &Context, imp: Impl, pool: &[Campaigner]) -> BenchResult<Row> {
    let (key, _) = pool[0].keys(ELECTION)?;
    let mut leader = bounded(pool[0].clone().lead(0, &key, LEASE)).await?;
    let mut tally = Tally::default();
    for round in 0..=ctx.w10_resignations {
        let race = Race::start(pool, leader.index, &key);
        tokio::time::sleep(HOLD).await;
        let resigned = wall_ns();
        bounded(leader.lead.resign()).await?;
        leader = race.winner().await?;
        if round > 0 {
            tally.count(&leader, resigned);
        }
    }
    bounded(leader.lead.resign()).await?;
    Ok(tally.row(imp, label(imp, Case::Resigned)))
}

/// `ctx.w10_crashes` crashes of a leader process, each followed by one of
/// the campaigners of `pool`: the rows from the kill and from the expiry.
async fn crash_rows(
    ctx: &Context,
    imp: Impl,
    pool: &[Campaigner],
    register: &str,
    admin: &mut MultiplexedConnection,
) -> BenchResult<[Row; 2]> {
    let (key, storage_key) = pool[0].keys(ELECTION)?;
    let leader_args = [
        imp.id().to_owned(),
        ctx.url.clone(),
        key.clone(),
        register.to_owned(),
        LEASE.as_millis().to_string(),
    ];
    let (mut from_kill, mut from_expiry) = (Tally::default(), Tally::default());
    let mut skipped = 0;
    let mut round = 0;
    while from_kill.lags.len() < ctx.w10_crashes {
        let args = leader_args.clone();
        let mut process = tokio::task::spawn_blocking(move || start_leader(&args))
            .await
            .map_err(|e| fail(format!("the W10 leader starter died: {e}")))??;
        let race = Race::start(pool, round % CAMPAIGNERS, &key);
        round += 1;
        tokio::time::sleep(HOLD).await;
        let asked = wall_ns();
        let pttl: i64 = bounded(redis::cmd("PTTL").arg(&storage_key).query_async(admin)).await?;
        let answered = wall_ns();
        let killed = wall_ns();
        process.kill();
        let next = race.winner().await?;
        if pttl > 0 {
            from_kill.count(&next, killed);
            let expiry = asked / 2 + answered / 2 + millis_ns(pttl);
            from_expiry.count(&next, expiry);
        } else if skipped < ctx.w10_crashes * SKIPS_PER_ROUND {
            skipped += 1;
        } else {
            return Err(fail(
                "the W10 leaders' leases kept expiring before the kill",
            ));
        }
        bounded(next.lead.resign()).await?;
    }
    let mut rows = [
        from_kill.row(imp, label(imp, Case::Killed)),
        from_expiry.row(imp, label(imp, Case::Expired)),
    ];
    // A write before the expiry is no overlap: lock-core's campaigners
    // may take over a few µs before the estimated expiry.
    rows[1].overlaps = None;
    if skipped > 0 {
        for row in &mut rows {
            row.note.push_str(&format!(
                "; {skipped} rounds skipped (lease expired before the kill)"
            ));
        }
    }
    Ok(rows)
}

/// Which figure a row holds.
#[derive(Clone, Copy)]
enum Case {
    Resigned,
    Killed,
    Expired,
}

/// The label of `imp`'s row of `case`.
fn label(imp: Impl, case: Case) -> &'static str {
    match (imp, case) {
        (Impl::Rslock, Case::Resigned) => RSLOCK_RESIGNED,
        (Impl::Rslock, Case::Killed) => RSLOCK_KILLED,
        (Impl::Rslock, Case::Expired) => RSLOCK_EXPIRED,
        (_, Case::Resigned) => CAMPAIGN_RESIGNED,
        (_, Case::Killed) => CAMPAIGN_KILLED,
        (_, Case::Expired) => CAMPAIGN_EXPIRED,
    }
}

/// The campaigners of a pool but one (the leader, or the one left out)
/// campaigning, each in a task of its own.
struct Race(JoinSet<BenchResult<Elected>>);

impl Race {
    /// Starts every campaigner of `pool` but the one at `except`.
    fn start(pool: &[Campaigner], except: usize, key: &str) -> Race {
        let mut tasks = JoinSet::new();
        for (index, campaigner) in pool.iter().enumerate() {
            if index != except {
                let (campaigner, key) = (campaigner.clone(), key.to_owned());
                tasks.spawn(async move { campaigner.lead(index, &key, LEASE).await });
            }
        }
        Race(tasks)
    }

    /// The first campaigner to lead and write; the others stop
    /// campaigning before this returns.
    async fn winner(mut self) -> BenchResult<Elected> {
        let first = tokio::time::timeout(FAILOVER_BOUND, self.0.join_next()).await;
        self.0.shutdown().await;
        match first {
            Ok(Some(joined)) => joined.map_err(|e| fail(format!("a W10 campaigner died: {e}")))?,
            Ok(None) => Err(fail("W10 has no campaigner to follow the leader")),
            Err(_) => Err(fail(format!(
                "no W10 campaigner led within {FAILOVER_BOUND:?}"
            ))),
        }
    }
}

/// The failovers of one row.
#[derive(Default)]
struct Tally {
    /// From the resignation, kill or expiry to the next leader's write, ns.
    lags: Vec<u64>,
    /// Writes refused (a term not above the register's).
    refused: u64,
    /// Writes before the resignation or kill.
    early: u64,
}

impl Tally {
    /// Counts `next`'s write, after `since`.
    fn count(&mut self, next: &Elected, since: u64) {
        self.lags.push(next.written.saturating_sub(since));
        self.refused += u64::from(!next.accepted);
        self.early += u64::from(next.written < since);
    }

    /// The row labelled `label`.
    fn row(mut self, imp: Impl, label: &'static str) -> Row {
        let spread = Spread::of(&mut self.lags);
        let mut row = Row::new(imp, "failovers");
        row.label = Some(label);
        row.p50_us = Some(spread.p50_us);
        row.p99_us = Some(spread.p99_us);
        row.max_us = Some(spread.max_us);
        row.overlaps = Some(self.early);
        row.samples = self.lags.len() as u64;
        row.note = if imp == Impl::Rslock {
            "plain SET (no fencing token)".to_owned()
        } else {
            format!("fenced writes refused: {}", self.refused)
        };
        row
    }
}

/// Starts a leader process with `IMPL URL KEY REGISTER TTL_MS` and waits
/// (up to twice [`CALL_BOUND`]) for its `leader`.
fn start_leader(args: &[String; 5]) -> BenchResult<Killable> {
    let mut argv = vec![LEADER_FLAG];
    argv.extend(args.iter().map(String::as_str));
    let (leader, line) = Killable::start(&argv, "a W10 leader", CALL_BOUND * 2)?;
    if line != "leader" {
        return Err(fail(format!(
            "a W10 leader said {line:?} instead of leader"
        )));
    }
    Ok(leader)
}

/// The leader side: campaigns (alone), writes the register, says
/// `leader`, and keeps leading until it is killed (or its stdin closes).
pub fn leader(args: &LeaderArgs) -> BenchResult<()> {
    let imp = Impl::from_id(&args.implementation)
        .filter(|imp| ROWS.contains(imp))
        .ok_or_else(|| fail(format!("unknown implementation {:?}", args.implementation)))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let campaigner = bounded(Campaigner::connect(imp, &args.url, &args.register)).await?;
        let elected = bounded(campaigner.lead(0, &args.key, args.ttl)).await?;
        if !elected.accepted {
            return Err(fail("a W10 leader's write was refused"));
        }
        {
            let mut out = std::io::stdout().lock();
            writeln!(out, "leader")?;
            out.flush()?;
        }
        // Waits on the blocking pool, so that this runtime keeps renewing
        // the lease, until the parent kills this process; returns if it
        // died.
        let read = tokio::task::spawn_blocking(|| {
            let mut rest = String::new();
            std::io::stdin().lock().read_line(&mut rest).map(drop)
        });
        read.await
            .map_err(|e| fail(format!("the W10 leader's reader died: {e}")))??;
        drop(elected);
        Ok(())
    })
}
