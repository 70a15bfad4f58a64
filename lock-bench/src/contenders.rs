//! The implementations measured side by side, behind one interface.
//!
//! | [`Impl`] | what one cycle is |
//! | --- | --- |
//! | `Floor` | one plain `SET` round trip (to every server at once for W4) |
//! | `RawFloor` | [`RawFloor`]: one plain `SET` on a bare socket (W1 only) |
//! | `Minimum` | [`MinimumLock`]: `SET NX PX`, then `EVALSHA` compare-and-delete |
//! | `Guard` | `LockClient::lock_with` then `LockGuard::release` |
//! | `Attribute` | a call of an `#[distributed_lock]` function |
//! | `Rslock` | `rslock::LockManager::lock` then `unlock` |
//!
//! W8 locks two keys per cycle ([`Locker::cycle_all`]): the minimum with one
//! all-or-none script, lock-core with `LockClient::lock_all`.
//!
//! The body run while the lock is held is a [`Section`]: empty for the
//! throughput workloads; for the contended ones it stamps the acquisition and
//! release times and checks, with an in-process counter, that nobody else is
//! inside.

use crate::endpoint::Endpoint;
use crate::error::{BenchResult, fail};
use crate::minimum::{MinimumLock, RawFloor};
use crate::stats::wall_ns;
use lock_core::{ErrorKind, LockClient, LockError, LockOptions};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

/// The lease length of every workload but W5.
pub const TTL: Duration = Duration::from_secs(10);

/// How long lock-core may wait in the contended workloads: long enough that
/// no acquisition fails.
pub const WAIT: Duration = Duration::from_secs(30);

/// lock-core's key prefix in the bench (the minimum and rslock get theirs
/// from [`Locker::key`]).
pub const LOCK_CORE_PREFIX: &str = "bench:lock-core:";

/// The longest sleep of the minimum lock's polling loop in the contended
/// workloads (a random sleep in `[0, POLL_MAX]` after each busy attempt).
pub const POLL_MAX: Duration = Duration::from_millis(10);

/// The longest sleep of the minimum lock's polling in W8, where a pair is
/// held for about one round trip: a random sleep in `[0, PAIR_POLL_MAX]`
/// after each attempt that found a key held.
pub const PAIR_POLL_MAX: Duration = Duration::from_millis(1);

/// An implementation, as named in the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Impl {
    /// Round trips: plain `SET`s, through the connection the minimum uses.
    Floor,
    /// Round trips: plain `SET`s on a bare socket.
    RawFloor,
    /// The hand-written minimum lock.
    Minimum,
    /// lock-core through `lock_with` and the guard.
    Guard,
    /// lock-core through `#[distributed_lock]`.
    Attribute,
    /// The `rslock` crate.
    Rslock,
}

impl Impl {
    /// The short name used in CSV, JSON and worker arguments.
    pub fn id(self) -> &'static str {
        match self {
            Impl::Floor => "floor",
            Impl::RawFloor => "raw-floor",
            Impl::Minimum => "minimum",
            Impl::Guard => "guard",
            Impl::Attribute => "attribute",
            Impl::Rslock => "rslock",
        }
    }

    /// The name shown in the table.
    pub fn label(self) -> &'static str {
        match self {
            Impl::Floor => "floor (SET)",
            Impl::RawFloor => "floor (raw socket)",
            Impl::Minimum => "minimum",
            Impl::Guard => "lock-core guard",
            Impl::Attribute => "lock-core attribute",
            Impl::Rslock => "rslock 0.10",
        }
    }

    /// Every implementation, in table order.
    pub const ALL: [Impl; 6] = [
        Impl::Floor,
        Impl::RawFloor,
        Impl::Minimum,
        Impl::Guard,
        Impl::Attribute,
        Impl::Rslock,
    ];

    /// Whether this row counts plain round trips, not lock cycles.
    pub fn is_floor(self) -> bool {
        matches!(self, Impl::Floor | Impl::RawFloor)
    }

    /// The implementation whose [`id`](Self::id) is `id`.
    pub fn from_id(id: &str) -> Option<Impl> {
        Impl::ALL.into_iter().find(|imp| imp.id() == id)
    }
}

/// What one [`Locker::cycle`] achieved.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cycle {
    /// Whether the lock was taken (and the section run and the lock released).
    pub done: bool,
    /// Calls that gave up before this one succeeded or gave up: rslock
    /// `lock()` calls that ran out of retries, lock-core waits that ran out.
    pub gave_up: u32,
}

/// Detects two holders at once inside one process.
#[derive(Debug, Default)]
pub struct Exclusion {
    inside: AtomicUsize,
    overlaps: AtomicU64,
}

impl Exclusion {
    /// Times a holder entered while another was inside.
    pub fn overlaps(&self) -> u64 {
        self.overlaps.load(Ordering::Acquire)
    }

    fn enter(&self) {
        if self.inside.fetch_add(1, Ordering::AcqRel) != 0 {
            self.overlaps.fetch_add(1, Ordering::AcqRel);
        }
    }

    fn exit(&self) {
        self.inside.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The body run while a lock is held.
#[derive(Debug, Default)]
pub struct Section {
    exclusion: Option<Arc<Exclusion>>,
    acquired_ns: AtomicU64,
    released_ns: AtomicU64,
}

impl Section {
    /// A body that does nothing (the throughput workloads).
    pub fn empty() -> Section {
        Section::default()
    }

    /// The contended workloads' tiny critical section: stamp the wall clock,
    /// enter `exclusion`, yield once to the scheduler (so another task of the
    /// process would run inside if the lock let it), leave, stamp again.
    pub fn exclusive(exclusion: Arc<Exclusion>) -> Section {
        Section {
            exclusion: Some(exclusion),
            ..Section::default()
        }
    }

    /// Runs the body.
    pub async fn run(&self) {
        if let Some(exclusion) = &self.exclusion {
            self.acquired_ns.store(wall_ns(), Ordering::Relaxed);
            exclusion.enter();
            tokio::task::yield_now().await;
            exclusion.exit();
            self.released_ns.store(wall_ns(), Ordering::Relaxed);
        }
    }

    /// The wall-clock nanoseconds at which the last run started and ended.
    pub fn stamps(&self) -> (u64, u64) {
        (
            self.acquired_ns.load(Ordering::Relaxed),
            self.released_ns.load(Ordering::Relaxed),
        )
    }
}

/// A connected implementation.
#[derive(Debug)]
pub enum Locker {
    /// Plain `SET` round trips on a connection of its own.
    Floor(MinimumLock),
    /// Plain `SET` round trips on a bare socket.
    RawFloor(RawFloor),
    /// The minimum lock.
    Minimum(MinimumLock),
    /// lock-core, guard API.
    Guard(LockClient),
    /// lock-core, attribute.
    Attribute(LockClient),
    /// rslock.
    Rslock(rslock::LockManager),
}

impl Locker {
    /// Connects `imp` to `urls` (one server, or several for Redlock) over
    /// plain TCP.
    pub async fn connect(imp: Impl, urls: &[String]) -> BenchResult<Locker> {
        Locker::connect_to(imp, &Endpoint::Plain(urls.to_vec())).await
    }

    /// Connects `imp` to `endpoint`. The raw floor and rslock connect over
    /// plain TCP only (see `Transport::runs` in `transport.rs`).
    pub async fn connect_to(imp: Impl, endpoint: &Endpoint) -> BenchResult<Locker> {
        let plain = |what: &str| match endpoint {
            Endpoint::Plain(urls) => Ok(urls.clone()),
            _ => Err(fail(format!("{what} runs over plain TCP only"))),
        };
        Ok(match imp {
            Impl::Floor => Locker::Floor(MinimumLock::connect_to(endpoint).await?),
            Impl::RawFloor => match plain("the raw floor")?.as_slice() {
                [url] => Locker::RawFloor(RawFloor::connect(url).await?),
                _ => return Err(fail("the raw floor runs against one server")),
            },
            Impl::Minimum => Locker::Minimum(MinimumLock::connect_to(endpoint).await?),
            Impl::Guard | Impl::Attribute => {
                let client = lock_core_client_to(endpoint).await?;
                if imp == Impl::Guard {
                    Locker::Guard(client)
                } else {
                    Locker::Attribute(client)
                }
            }
            Impl::Rslock => {
                let clients = plain("rslock")?
                    .iter()
                    .map(|url| redis::Client::open(url.as_str()))
                    .collect::<Result<Vec<_>, _>>()?;
                Locker::Rslock(rslock::LockManager::from_clients(clients))
            }
        })
    }

    /// The implementation.
    pub fn implementation(&self) -> Impl {
        match self {
            Locker::Floor(_) => Impl::Floor,
            Locker::RawFloor(_) => Impl::RawFloor,
            Locker::Minimum(_) => Impl::Minimum,
            Locker::Guard(_) => Impl::Guard,
            Locker::Attribute(_) => Impl::Attribute,
            Locker::Rslock(_) => Impl::Rslock,
        }
    }

    /// The key this implementation locks for the lock named `name`: lock-core
    /// adds its own prefix, the others get one here, so implementations never
    /// share a Redis key. Computed once per task, outside the timed loop.
    pub fn key(&self, name: &str) -> String {
        match self {
            Locker::Guard(_) | Locker::Attribute(_) => name.to_owned(),
            other => format!("bench:{}:{name}", other.implementation().id()),
        }
    }

    /// The lock-core client, for the implementations that have one.
    pub fn lock_core(&self) -> Option<&LockClient> {
        match self {
            Locker::Guard(client) | Locker::Attribute(client) => Some(client),
            _ => None,
        }
    }

    /// Takes the lock `key`, runs `section`, releases.
    ///
    /// Uncontended (`contended == false`): one acquisition as the
    /// implementation does it by default (for the minimum, one attempt).
    /// Contended: the minimum polls (a random sleep of up to [`POLL_MAX`]
    /// after each busy attempt), rslock calls `lock()` again whenever it gives
    /// up, lock-core waits up to [`WAIT`].
    pub async fn cycle(&self, key: &str, section: &Section, contended: bool) -> BenchResult<Cycle> {
        match self {
            Locker::Floor(floor) => {
                floor.floor().await?;
                Ok(Cycle {
                    done: true,
                    gave_up: 0,
                })
            }
            Locker::RawFloor(floor) => {
                floor.round_trip().await?;
                Ok(Cycle {
                    done: true,
                    gave_up: 0,
                })
            }
            Locker::Minimum(lock) => minimum_cycle(lock, key, section, contended).await,
            Locker::Guard(client) => lock_core_outcome(guard_cycle(client, key, section).await),
            Locker::Attribute(client) => {
                lock_core_outcome(attribute_cycle(client, key, section).await.map(|()| true))
            }
            Locker::Rslock(manager) => rslock_cycle(manager, key, section, contended).await,
        }
    }

    /// Takes every key of `keys` at once (all or none), runs `section`,
    /// releases them (W8). lock-core waits up to [`WAIT`] through
    /// `lock_all`; the minimum tries its all-or-none script and, while a key
    /// is held, polls with a random sleep of up to [`PAIR_POLL_MAX`]. The
    /// other implementations have no lock on several keys.
    pub async fn cycle_all(&self, keys: &[&str], section: &Section) -> BenchResult<Cycle> {
        match self {
            Locker::Minimum(lock) => {
                let mut jitter = Xorshift::new();
                loop {
                    let token = lock.token();
                    if lock.try_acquire_all(keys, &token, TTL).await? {
                        section.run().await;
                        lock.release_all(keys, &token).await?;
                        return Ok(Cycle {
                            done: true,
                            gave_up: 0,
                        });
                    }
                    tokio::time::sleep(jitter.up_to(PAIR_POLL_MAX)).await;
                }
            }
            Locker::Guard(client) => {
                let guard = client
                    .lock_all(keys, LockOptions::new(TTL).wait(WAIT))
                    .await;
                let held = async {
                    let guard = guard?;
                    section.run().await;
                    guard.release().await
                };
                lock_core_outcome(held.await)
            }
            other => Err(fail(format!(
                "{} has no lock on several keys",
                other.implementation().label()
            ))),
        }
    }
}

/// A lock-core client as the bench uses it: the bench's prefix, ttl 10 s,
/// wait 30 s, everything else default.
pub async fn lock_core_client(urls: &[String]) -> Result<LockClient, LockError> {
    lock_core_client_to(&Endpoint::Plain(urls.to_vec())).await
}

/// [`lock_core_client`] on any transport: `urls` for plain TCP, `url` with
/// the test CA as `tls_root_certificate` for TLS, `cluster` for a cluster.
pub async fn lock_core_client_to(endpoint: &Endpoint) -> Result<LockClient, LockError> {
    let builder = LockClient::builder();
    let builder = match endpoint {
        Endpoint::Plain(urls) => builder.urls(urls.iter().cloned()),
        Endpoint::Tls { url, ca_pem, .. } => builder
            .url(url.clone())
            .tls_root_certificate(ca_pem.as_bytes()),
        Endpoint::Cluster(urls) => builder.cluster(urls.iter().cloned()),
    };
    builder
        .key_prefix(LOCK_CORE_PREFIX)
        .default_ttl(TTL)
        .default_wait(WAIT)
        .native_commands(native_release())
        .build()
        .await
}

/// Whether lock-core releases by the server's own compare-and-delete where
/// it has one (its default): `LOCK_BENCH_RELEASE=script` measures it with
/// the release script instead, to compare the two on one server. Read in
/// every process of a run, workers too.
pub fn native_release() -> bool {
    std::env::var("LOCK_BENCH_RELEASE").map_or(true, |release| release != "script")
}

/// The minimum lock's cycle.
async fn minimum_cycle(
    lock: &MinimumLock,
    key: &str,
    section: &Section,
    contended: bool,
) -> BenchResult<Cycle> {
    let mut jitter = Xorshift::new();
    loop {
        let token = lock.token();
        if lock.try_acquire(key, &token, TTL).await? {
            section.run().await;
            lock.release(key, &token).await?;
            return Ok(Cycle {
                done: true,
                gave_up: 0,
            });
        }
        if !contended {
            return Ok(Cycle::default());
        }
        tokio::time::sleep(jitter.up_to(POLL_MAX)).await;
    }
}

/// lock-core through the guard API: the same body as [`attribute_cycle`].
/// `Ok(false)` when the release found the lock no longer ours.
async fn guard_cycle(client: &LockClient, key: &str, section: &Section) -> Result<bool, LockError> {
    let guard = client
        .lock_with(key, LockOptions::new(TTL).wait(WAIT))
        .await?;
    section.run().await;
    guard.release().await
}

/// lock-core through the attribute: takes `key` for 10 s (waiting up to
/// 30 s), runs the section, releases.
#[lock_core::distributed_lock(key = "{key}", ttl = "10s", wait = "30s", client = client)]
async fn attribute_cycle(
    client: &LockClient,
    key: &str,
    section: &Section,
) -> Result<(), LockError> {
    section.run().await;
    Ok(())
}

/// Turns lock-core's answer (`Ok(still_ours)`) into a [`Cycle`]: a wait that
/// ran out counts as given up; a lock lost before its release and anything
/// else are errors.
fn lock_core_outcome(result: Result<bool, LockError>) -> BenchResult<Cycle> {
    match result {
        Ok(true) => Ok(Cycle {
            done: true,
            gave_up: 0,
        }),
        Ok(false) => Err(fail("the lock was lost before its release")),
        Err(e) if e.kind() == ErrorKind::Contended => Ok(Cycle {
            done: false,
            gave_up: 1,
        }),
        Err(e) => Err(e.into()),
    }
}

/// rslock's cycle, with its default retries (3 attempts, a random delay of up
/// to 200 ms between them); contended, `lock()` is called again until it
/// succeeds.
async fn rslock_cycle(
    manager: &rslock::LockManager,
    key: &str,
    section: &Section,
    contended: bool,
) -> BenchResult<Cycle> {
    let mut gave_up = 0u32;
    loop {
        match manager.lock(key.as_bytes(), TTL).await {
            Ok(lock) => {
                section.run().await;
                manager.unlock(&lock).await;
                return Ok(Cycle {
                    done: true,
                    gave_up,
                });
            }
            Err(rslock::LockError::Unavailable) => {
                gave_up = gave_up.saturating_add(1);
                if !contended {
                    return Ok(Cycle {
                        done: false,
                        gave_up,
                    });
                }
            }
            Err(e) => return Err(fail(format!("rslock: {e}"))),
        }
    }
}

/// A tiny xorshift generator for polling jitter and W8's random keys (not
/// for tokens).
#[derive(Debug)]
pub struct Xorshift(u64);

impl Xorshift {
    /// A generator seeded from the clock and a process-wide counter, so
    /// tasks started in the same nanosecond still draw apart.
    pub fn new() -> Xorshift {
        static STREAMS: AtomicU64 = AtomicU64::new(0);
        let stream = STREAMS.fetch_add(1, Ordering::Relaxed);
        // splitmix64 of the two, so neighbouring seeds give unrelated
        // sequences.
        let mut z = (wall_ns() ^ stream.rotate_left(32)).wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        Xorshift((z ^ (z >> 31)) | 1)
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// A uniformly random duration in `[0, max]`, to the microsecond.
    pub fn up_to(&mut self, max: Duration) -> Duration {
        let span = u64::try_from(max.as_micros()).unwrap_or(u64::MAX).max(1);
        Duration::from_micros(self.next() % (span + 1))
    }

    /// A random number in `[0, n)` (`n` > 0); the modulo bias is far below
    /// what the bench can see.
    pub fn below(&mut self, n: usize) -> usize {
        let n64 = u64::try_from(n).unwrap_or(u64::MAX).max(1);
        usize::try_from(self.next() % n64).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn implementation_ids_round_trip() {
        for imp in Impl::ALL {
            assert_eq!(Impl::from_id(imp.id()), Some(imp));
        }
        assert_eq!(Impl::from_id("nope"), None);
    }

    #[test]
    fn jitter_stays_in_range() {
        let mut jitter = Xorshift::new();
        for _ in 0..1000 {
            assert!(jitter.up_to(POLL_MAX) <= POLL_MAX);
        }
    }

    #[tokio::test]
    async fn exclusion_counts_a_second_holder() {
        let exclusion = Arc::new(Exclusion::default());
        exclusion.enter();
        Section::exclusive(exclusion.clone()).run().await;
        exclusion.exit();
        assert_eq!(exclusion.overlaps(), 1);
        Section::exclusive(exclusion.clone()).run().await;
        assert_eq!(exclusion.overlaps(), 1);
    }
}
