//! W7: takeover after a crash, and releases nobody announces.
//!
//! Crash rows (minimum, lock-core, rslock), each over `--w7-rounds`
//! rounds:
//!
//! 1. the bench starts itself again as a holder process
//!    (`lock-bench --w7-holder IMPL URL KEY TTL_MS`), which takes the lock
//!    with the implementation's own library, ttl [`CRASH_TTL`], no renewal,
//!    prints `held` and blocks;
//! 2. a waiter of the same implementation starts in this process (waiting,
//!    as in W3) and makes its first attempts;
//! 3. the bench reads the key's `PTTL` (its expiry on the wall clock is the
//!    middle of that round trip plus the `PTTL`), then kills the holder
//!    with `SIGKILL`: nothing is released, the key frees at its expiry;
//! 4. the lag is the waiter's acquisition (the start of its critical
//!    section) minus that expiry.
//!
//! Release rows (lock-core waiters only): a holder on a plain connection
//! of this process takes the key (`SET NX PX`, 10 s), the waiter starts,
//! and after [`RELEASE_HOLD`] the holder releases; the lag is from the
//! release's reply to the waiter's acquisition. One unmeasured round comes
//! first (connections, scripts). The holder is another library
//! (value not in lock-core's format, compare-and-delete without
//! `PUBLISH`), the same but with a value in lock-core's format (what
//! lock-core did for every unannounced release before it told foreign
//! values apart), or lock-core itself (its release publishes). The
//! commands the server ran per round (`INFO commandstats`, everyone's
//! included) show what polling a foreign holder costs.

use super::killable::Killable;
use super::{CALL_BOUND, Context, bounded, millis_ns, progress};
use crate::args::{HOLDER_FLAG, HolderArgs};
use crate::contenders::{Exclusion, Impl, Locker, Section, TTL, lock_core_client};
use crate::error::{BenchResult, fail};
use crate::servers::{connect, info};
use crate::stats::{Spread, wall_ns};
use crate::table::{FOREIGN, PUBLISHED, Row, UNANNOUNCED, WorkloadId, WorkloadResult};
use crate::transport::Transport;
use lock_core::LockOptions;
use redis::aio::MultiplexedConnection;
use std::io::{BufRead, Write};
use std::sync::Arc;
use std::time::Duration;

/// The crashed holder's lease.
pub const CRASH_TTL: Duration = Duration::from_millis(500);

/// How long after the waiter starts the crashed holder is killed.
const HOLD: Duration = Duration::from_millis(100);

/// Crash rounds skipped, at most, per measured round: a round is skipped
/// when the holder's key expired before the kill (a busy machine slowed
/// the round down past the ttl), since its expiry is then unknown.
const SKIPS_PER_ROUND: usize = 1;

/// How long after the waiter starts the holder of a release row releases:
/// long enough for the waiter's polling to reach its steady rate.
const RELEASE_HOLD: Duration = Duration::from_secs(1);

/// The crash rows, in table order.
const CRASH_ROWS: [Impl; 3] = [Impl::Minimum, Impl::Guard, Impl::Rslock];

/// Compare-and-delete without `PUBLISH`, as other libraries release.
const CAD: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
                   return redis.call('DEL', KEYS[1]) end return 0";

/// Runs W7 on the single server.
pub async fn run(ctx: &Context) -> BenchResult<WorkloadResult> {
    let mut admin = connect(&ctx.url).await?;
    let mut rows = Vec::new();
    for imp in CRASH_ROWS {
        progress(WorkloadId::W7, imp);
        rows.push(crash_row(ctx, imp, &mut admin).await?);
    }
    for (i, label) in [FOREIGN, UNANNOUNCED, PUBLISHED].into_iter().enumerate() {
        eprintln!("lock-bench: W7 {label}");
        let key = format!("w7:release:{i}");
        rows.push(release_row(ctx, label, &key, &mut admin).await?);
    }
    Ok(WorkloadResult {
        id: WorkloadId::W7,
        transport: Transport::Plain,
        title: "takeover after a crash; releases nobody announces",
        params: format!(
            "{} rounds per row; crash rows: a holder process takes the key (ttl {} ms, no \
             renewal) and is killed (SIGKILL) {} ms after the waiter (this process) started; \
             lag = acquisition - the key's expiry (PTTL read just before the kill); release \
             rows: a holder on a plain connection (SET NX PX 10 s) releases {} ms after the \
             waiter started, after one unmeasured round, lag = acquisition - the release's \
             reply; other = Redis commands per round (INFO commandstats: everyone's, those \
             run inside scripts included) and script calls (EVALSHA, EVAL) per round; µs \
             columns = lag",
            ctx.w7_rounds,
            CRASH_TTL.as_millis(),
            HOLD.as_millis(),
            RELEASE_HOLD.as_millis()
        ),
        rows,
    })
}

/// One crash row: `ctx.w7_rounds` rounds of [`crash_round`].
async fn crash_row(
    ctx: &Context,
    imp: Impl,
    admin: &mut MultiplexedConnection,
) -> BenchResult<Row> {
    let urls = std::slice::from_ref(&ctx.url);
    let locker = Arc::new(Locker::connect(imp, urls).await?);
    let key = locker.key("w7");
    let storage_key = match locker.lock_core() {
        Some(client) => client.storage_key(&key)?,
        None => key.clone(),
    };
    let mut lags = Vec::with_capacity(ctx.w7_rounds);
    let commands_before = Commands::read(admin).await?;
    let mut skipped = 0;
    while lags.len() < ctx.w7_rounds {
        match crash_round(&locker, imp, &ctx.url, &key, &storage_key, admin).await? {
            Some(lag) => lags.push(lag),
            None if skipped < ctx.w7_rounds * SKIPS_PER_ROUND => skipped += 1,
            None => return Err(fail("the W7 holders' keys kept expiring before the kill")),
        }
    }
    let rounds = lags.len() + skipped;
    let per_round = Commands::read(admin)
        .await?
        .per_round(commands_before, rounds);
    let mut row = lag_row(imp, None, lags, per_round);
    if skipped > 0 {
        row.note.push_str(&format!(
            "; {skipped} rounds skipped (key expired before the kill)"
        ));
    }
    Ok(row)
}

/// One takeover: the holder process takes the key, the waiter starts, the
/// holder is killed; the lag from the key's expiry to the acquisition, ns.
/// `None` when the key had expired before the kill.
async fn crash_round(
    locker: &Arc<Locker>,
    imp: Impl,
    url: &str,
    key: &str,
    storage_key: &str,
    admin: &mut MultiplexedConnection,
) -> BenchResult<Option<u64>> {
    let args = [imp.id(), url, key, &CRASH_TTL.as_millis().to_string()].map(str::to_owned);
    let mut holder = tokio::task::spawn_blocking(move || start_holder(&args))
        .await
        .map_err(|e| fail(format!("the W7 holder starter died: {e}")))??;
    let waiter = spawn_waiter(locker.clone(), key.to_owned());
    tokio::time::sleep(HOLD).await;
    let asked = wall_ns();
    let pttl: i64 = bounded(redis::cmd("PTTL").arg(storage_key).query_async(admin)).await?;
    let answered = wall_ns();
    holder.kill();
    let acquired = waited(waiter).await?;
    if pttl <= 0 {
        return Ok(None);
    }
    let expiry = asked / 2 + answered / 2 + millis_ns(pttl);
    Ok(Some(acquired.saturating_sub(expiry)))
}

/// A waiter of `locker` on `key` in a task of its own: one contended
/// cycle; the wall-clock time its critical section started.
fn spawn_waiter(locker: Arc<Locker>, key: String) -> tokio::task::JoinHandle<BenchResult<u64>> {
    tokio::spawn(async move {
        let section = Section::exclusive(Arc::new(Exclusion::default()));
        let cycle = locker.cycle(&key, &section, true).await?;
        if !cycle.done {
            return Err(fail("the W7 waiter gave up"));
        }
        Ok(section.stamps().0)
    })
}

/// The waiter's acquisition time, within a bound far above any lag.
async fn waited(waiter: tokio::task::JoinHandle<BenchResult<u64>>) -> BenchResult<u64> {
    match tokio::time::timeout(Duration::from_secs(60), waiter).await {
        Ok(joined) => joined.map_err(|e| fail(format!("the W7 waiter died: {e}")))?,
        Err(_) => Err(fail("the W7 waiter did not acquire within 60 s")),
    }
}

/// One release row: `ctx.w7_rounds` rounds (after one unmeasured) of a holder on a
/// plain connection that releases while a lock-core waiter waits.
async fn release_row(
    ctx: &Context,
    label: &'static str,
    key: &str,
    admin: &mut MultiplexedConnection,
) -> BenchResult<Row> {
    let urls = std::slice::from_ref(&ctx.url);
    let locker = Arc::new(Locker::connect(Impl::Guard, urls).await?);
    let holder = lock_core_client(urls).await?;
    let mut plain = connect(&ctx.url).await?;
    let storage_key = holder.storage_key(key)?;
    let mut lags = Vec::with_capacity(ctx.w7_rounds);
    let mut commands_before = Commands::default();
    for round in 0..=ctx.w7_rounds {
        if round == 1 {
            lags.clear();
            commands_before = Commands::read(admin).await?;
        }
        let value = match label {
            FOREIGN => format!("other-library-{round}"),
            _ => format!("{:032x}", 0xfeed_0000_u128 + round as u128),
        };
        let guard = if label == PUBLISHED {
            Some(bounded(holder.lock_with(key, LockOptions::new(TTL))).await?)
        } else {
            let mut set = redis::cmd("SET");
            set.arg(&storage_key)
                .arg(&value)
                .arg("NX")
                .arg("PX")
                .arg(10_000);
            let set: Option<String> = bounded(set.query_async(&mut plain)).await?;
            set.ok_or_else(|| fail("the W7 key was not free"))?;
            None
        };
        let waiter = spawn_waiter(locker.clone(), key.to_owned());
        tokio::time::sleep(RELEASE_HOLD).await;
        match guard {
            Some(guard) => {
                bounded(guard.release()).await?;
            }
            None => {
                let mut cad = redis::cmd("EVAL");
                cad.arg(CAD).arg(1).arg(&storage_key).arg(&value);
                let _: i64 = bounded(cad.query_async(&mut plain)).await?;
            }
        }
        let released = wall_ns();
        lags.push(waited(waiter).await?.saturating_sub(released));
    }
    let per_round = Commands::read(admin)
        .await?
        .per_round(commands_before, ctx.w7_rounds);
    Ok(lag_row(Impl::Guard, Some(label), lags, per_round))
}

/// The row of lags (ns) and the server's commands per round.
fn lag_row(
    imp: Impl,
    label: Option<&'static str>,
    mut lags: Vec<u64>,
    (per_round, scripts): (f64, f64),
) -> Row {
    let spread = Spread::of(&mut lags);
    let mut row = Row::new(imp, "takeovers");
    row.label = label;
    row.p50_us = Some(spread.p50_us);
    row.p99_us = Some(spread.p99_us);
    row.max_us = Some(spread.max_us);
    row.samples = lags.len() as u64;
    row.commands_per_round = Some(per_round);
    row.note = format!("{scripts:.1} script calls/round");
    row
}

/// What the server has run so far (`INFO commandstats`).
#[derive(Clone, Copy, Debug, Default)]
struct Commands {
    /// Every command, those run inside scripts included, less the `INFO`
    /// calls themselves.
    all: u64,
    /// Script calls (`EVALSHA`, `EVAL`): lock-core's attempts after the
    /// first, and the releases.
    scripts: u64,
}

impl Commands {
    async fn read(admin: &mut MultiplexedConnection) -> BenchResult<Commands> {
        let stats = bounded(info(admin, "commandstats")).await?;
        let mut total = Commands::default();
        for (name, value) in &stats {
            let calls = value
                .split(',')
                .find_map(|field| field.strip_prefix("calls="))
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or(0);
            match name.as_str() {
                "cmdstat_info" => continue,
                "cmdstat_evalsha" | "cmdstat_eval" => total.scripts += calls,
                _ => {}
            }
            total.all += calls;
        }
        Ok(total)
    }

    /// Commands and script calls per round since `before`.
    fn per_round(self, before: Commands, rounds: usize) -> (f64, f64) {
        let per = |now: u64, then: u64| now.saturating_sub(then) as f64 / rounds as f64;
        (per(self.all, before.all), per(self.scripts, before.scripts))
    }
}

/// Starts this executable as a holder of `IMPL URL KEY TTL_MS` and waits
/// (up to twice [`CALL_BOUND`]) for its `held`.
fn start_holder(args: &[String; 4]) -> BenchResult<Killable> {
    let mut argv = vec![HOLDER_FLAG];
    argv.extend(args.iter().map(String::as_str));
    let (holder, line) = Killable::start(&argv, "a W7 holder", CALL_BOUND * 2)?;
    if line != "held" {
        return Err(fail(format!("a W7 holder said {line:?} instead of held")));
    }
    Ok(holder)
}

/// The holder side: takes the lock as the implementation does, says
/// `held`, and blocks until it is killed (or its stdin closes).
pub fn holder(args: &HolderArgs) -> BenchResult<()> {
    let imp = Impl::from_id(&args.implementation)
        .filter(|imp| CRASH_ROWS.contains(imp))
        .ok_or_else(|| fail(format!("unknown implementation {:?}", args.implementation)))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let ttl = args.ttl;
    let held = runtime.block_on(async {
        let urls = std::slice::from_ref(&args.url);
        let locker = bounded(Locker::connect(imp, urls)).await?;
        let key = args.key.as_str();
        let taken = match &locker {
            Locker::Minimum(lock) => bounded(lock.try_acquire(key, &lock.token(), ttl)).await?,
            Locker::Guard(client) => {
                let options = LockOptions::new(ttl).renew(false);
                let guard = bounded(client.lock_with(key, options)).await?;
                // Never released: it is killed holding the lock.
                std::mem::forget(guard);
                true
            }
            Locker::Rslock(manager) => {
                let lock = tokio::time::timeout(CALL_BOUND, manager.lock(key.as_bytes(), ttl))
                    .await
                    .map_err(|_| fail("rslock did not lock in time"))?
                    .map_err(|e| fail(format!("rslock: {e}")))?;
                std::mem::forget(lock);
                true
            }
            _ => false,
        };
        BenchResult::Ok((locker, taken))
    })?;
    if !held.1 {
        return Err(fail("the W7 key was held already"));
    }
    let mut out = std::io::stdout().lock();
    writeln!(out, "held")?;
    out.flush()?;
    // Blocks until the parent kills this process; returns if it died.
    let mut rest = String::new();
    std::io::stdin().lock().read_line(&mut rest)?;
    drop(held);
    Ok(())
}
