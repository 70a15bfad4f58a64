//! Every public async operation, polled N times and dropped, for every N
//! until it completes: after each drop, what a user relies on still holds.
//!
//! - The key can be taken again in this process within a short wait.
//! - Once nothing holds it, the key is gone from the servers (no lock is
//!   left held by nobody until its ttl).
//! - No heartbeat enrolment and no in-process queue entry is left behind.
//! - No wait record is left in Redis (see `docs/deadlocks.md`).
//!
//! Each operation runs in a few situations (free key; behind a holder of
//! this process that lets go mid-way, handing over its lease or its turn;
//! behind a holder in another process), on the in-memory backend, one
//! Redis server over plain TCP and over TLS, a cluster, and Redlock over
//! three servers.
//!
//! The *kept* variant polls each operation N times and then keeps it,
//! unpolled, for longer than a ttl before dropping it. Meanwhile a lock of
//! the same client with a 1 s ttl must stay held (renewed), other calls of
//! the client must be answered promptly, and another task of the client
//! must get the key within its wait: a future nobody polls holds nothing
//! up.

use crate::support::{Backend, Given, client_with, storage_key};
use lock_core::{HandoffBudget, LockClient, LockError, LockOptions, distributed_lock};
use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

const PREFIX: &str = "cancel:";
const KEY: &str = "k";
/// The other key of `lock_all`.
const KEY2: &str = "k2";
const TTL: Duration = Duration::from_secs(30);
/// The ttl of every lock of the kept variant, and how long it keeps an
/// operation unpolled.
const KEPT_TTL: Duration = Duration::from_secs(1);
const KEPT_FOR: Duration = Duration::from_millis(1500);

struct Fixture {
    /// The client whose operations are cancelled.
    a: LockClient,
    /// The same client's settings without hand-offs (each release goes to
    /// Redis and passes the turn).
    turns: LockClient,
    /// Another process.
    b: LockClient,
    backend: Backend,
    /// The ttl of the operations' locks.
    ttl: Duration,
    /// In the kept variant: a lock of `a` (1 s ttl) held all along.
    held: Option<lock_core::LockGuard>,
}

impl Fixture {
    async fn on(backend: Backend) -> Fixture {
        let settings = |budget| {
            LockClient::builder()
                .key_prefix(PREFIX)
                .handoff_budget(budget)
        };
        Fixture {
            a: client_with(&backend, settings(HandoffBudget::default())).await,
            turns: client_with(&backend, settings(HandoffBudget::NONE)).await,
            b: client_with(&backend, settings(HandoffBudget::default())).await,
            backend,
            ttl: TTL,
            held: None,
        }
    }

    /// The fixture of the kept variant.
    async fn kept(backend: Backend) -> Fixture {
        let mut fx = Fixture::on(backend).await;
        fx.ttl = KEPT_TTL;
        fx.held = Some(fx.a.lock("held", KEPT_TTL).await.unwrap());
        fx
    }

    /// After an operation was polled: in the kept variant, when it did not
    /// complete, keep it unpolled for [`KEPT_FOR`] (the caller drops it
    /// after this returns) and check that it holds nothing up.
    async fn after_polls(&self, done: bool, case: Case, polls: usize) -> bool {
        if done || self.held.is_none() {
            return done;
        }
        let what = format!("{case:?} kept after {polls} polls");
        let started = Instant::now();
        let mut probes = 0;
        while started.elapsed() < KEPT_FOR {
            let asked = Instant::now();
            let probe = self.a.try_lock("probe", KEPT_TTL).await.unwrap();
            assert!(probe.unwrap().release().await.unwrap(), "{what}");
            assert!(
                asked.elapsed() < Duration::from_millis(200),
                "{what}: a lock and release took {:?}",
                asked.elapsed()
            );
            probes += 1;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(probes > 3, "{what}");
        // The extend case holds its guard itself, an annotated body that
        // runs holds its lock (renewed), and a release never polled still
        // holds its guard: their key is not free.
        let holds = matches!(case, Case::Extend | Case::Attribute)
            || (polls == 0 && matches!(case, Case::Release | Case::ReleaseWithWaiter));
        if !holds {
            for client in [&self.a, &self.turns] {
                let options = LockOptions::new(KEPT_TTL).wait(Duration::from_secs(3));
                let again = client
                    .lock_with(KEY, options)
                    .await
                    .unwrap_or_else(|e| panic!("{what}: the key jammed: {e}"));
                assert!(again.release().await.unwrap(), "{what}");
            }
        }
        self.assert_held(&what);
        false
    }

    /// In the kept variant, the lock held all along is still held.
    fn assert_held(&self, what: &str) {
        if let Some(held) = &self.held {
            assert!(
                !held.is_lost(),
                "{what}: a lock of the same client was lost: {:?}",
                held.loss_reason()
            );
        }
    }

    /// Whether the key (or the second key of `lock_all`) is held anywhere.
    fn key_held(&self) -> bool {
        // The in-memory store tells only how many locks it holds.
        if let Backend::Memory(store) = &self.backend {
            return store.held() > self.own(&self.a);
        }
        // On Redlock a lock stands on a majority. A minority's key (a
        // release that reached a slow server after its bound, on a loaded
        // machine) holds nobody up and expires with its ttl, as
        // `backend/quorum.rs` says: only a majority counts here.
        if let Backend::Redlock(servers) = &self.backend {
            return [KEY, KEY2].iter().any(|key| {
                let storage = storage_key(PREFIX, key);
                let holding = servers
                    .iter()
                    .filter(|server| server.cmd::<bool>(&["EXISTS", &storage]))
                    .count();
                if holding > 0 && holding <= servers.len() / 2 {
                    eprintln!("{key}: held on {holding} of {} servers", servers.len());
                }
                holding > servers.len() / 2
            });
        }
        [KEY, KEY2]
            .iter()
            .any(|key| self.backend.holds(&storage_key(PREFIX, key)))
    }

    /// Whether a wait record of either key is left in Redis: a waiters set
    /// or a wait note (the in-memory store does not show its records).
    fn wait_recorded(&self) -> bool {
        [KEY, KEY2].iter().any(|key| {
            let storage = storage_key(PREFIX, key);
            [format!("{storage}:waiters"), format!("{storage}:waiting")]
                .iter()
                .any(|record| {
                    !matches!(self.backend, Backend::Memory(_)) && self.backend.holds(record)
                })
        })
    }

    /// What `client` itself holds all along: the kept variant's lock.
    fn own(&self, client: &LockClient) -> usize {
        usize::from(self.held.is_some() && std::ptr::eq(client, &self.a))
    }

    /// What a user relies on after a cancelled operation, with every guard
    /// of the scenario let go.
    async fn check(&self, what: &str) {
        for client in [&self.a, &self.turns] {
            let again = client
                .lock_with(KEY, LockOptions::new(self.ttl).wait(Duration::from_secs(5)))
                .await
                .unwrap_or_else(|e| panic!("{what}: the key cannot be taken again: {e}"));
            assert!(again.release().await.unwrap(), "{what}: released");
        }
        let started = Instant::now();
        loop {
            let clean = !self.key_held()
                && !self.wait_recorded()
                && [&self.a, &self.turns, &self.b].iter().all(|c| {
                    c.queued_keys() == self.own(c) && c.heartbeats_running() == self.own(c)
                });
            if clean {
                return;
            }
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "{what}: left behind: key held {}, wait recorded {}, queued {}/{}, heartbeats {}/{}",
                self.key_held(),
                self.wait_recorded(),
                self.a.queued_keys(),
                self.turns.queued_keys(),
                self.a.heartbeats_running(),
                self.turns.heartbeats_running(),
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// A waker that wakes the harness's wait.
struct Signal(Notify);

impl Wake for Signal {
    fn wake(self: Arc<Self>) {
        self.0.notify_one();
    }
}

/// Polls one future at a time, each poll after its waker fired.
struct Poller {
    signal: Arc<Signal>,
    waker: Waker,
    /// Polls made so far.
    polls: usize,
}

impl Poller {
    fn new() -> Poller {
        let signal = Arc::new(Signal(Notify::new()));
        Poller {
            waker: Waker::from(signal.clone()),
            signal,
            polls: 0,
        }
    }

    /// Polls `future` until it completes or `budget` polls in all were
    /// made; `Some` with its output when it completed.
    async fn poll<F: Future + ?Sized>(
        &mut self,
        mut future: Pin<&mut F>,
        budget: usize,
    ) -> Option<F::Output> {
        while self.polls < budget {
            if self.polls > 0 {
                tokio::time::timeout(Duration::from_secs(10), self.signal.0.notified())
                    .await
                    .expect("a pending future was never woken");
            }
            self.polls += 1;
            if let Poll::Ready(out) = future.as_mut().poll(&mut Context::from_waker(&self.waker)) {
                return Some(out);
            }
        }
        None
    }
}

/// The operations and situations under test.
#[derive(Clone, Copy, Debug)]
enum Case {
    Lock,
    TryLock,
    LockFenced,
    /// `lock` behind a holder of this process that releases after the
    /// first poll (the lease is handed over).
    LockBehindHandOff,
    /// The same with fencing: the takeover is a round trip.
    LockBehindFencedHandOff,
    /// The same without hand-offs: the turn is handed over.
    LockBehindTurn,
    /// `lock` behind a holder in another process that releases after the
    /// first poll.
    LockBehindOtherProcess,
    Release,
    /// `release` with a task of this process waiting for the key.
    ReleaseWithWaiter,
    Extend,
    Attribute,
    /// `lock_all` on two keys.
    LockAll,
    /// `lock_all` behind a holder of one key in another process.
    LockAllBehindOtherProcess,
    /// `lock` inside an annotated body that holds the other key, behind a
    /// holder in another process that lets go after 300 ms: long enough
    /// for the wait to be recorded, and followed for cycles, before it ends.
    LockRecorded,
    /// A shared hold, and a permit.
    Shared,
    Permit,
    /// A shared hold behind an exclusive holder in another process.
    SharedBehindOtherProcess,
}

const CASES: [Case; 17] = [
    Case::Lock,
    Case::TryLock,
    Case::LockFenced,
    Case::LockBehindHandOff,
    Case::LockBehindFencedHandOff,
    Case::LockBehindTurn,
    Case::LockBehindOtherProcess,
    Case::Release,
    Case::ReleaseWithWaiter,
    Case::Extend,
    Case::Attribute,
    Case::LockAll,
    Case::LockAllBehindOtherProcess,
    Case::LockRecorded,
    Case::Shared,
    Case::Permit,
    Case::SharedBehindOtherProcess,
];

#[distributed_lock(key = "k", client = client, ttl = "30s", wait = "10s")]
async fn annotated(client: &LockClient) -> Result<(), LockError> {
    tokio::task::yield_now().await;
    Ok(())
}

/// Holds the other key and waits for [`KEY`] inside the body.
#[distributed_lock(key = "k2", client = client, ttl = "30s", wait = "10s")]
async fn annotated_waiting(client: &LockClient, ttl: Duration) -> Result<(), LockError> {
    let options = LockOptions::new(ttl).wait(Duration::from_secs(10));
    client.lock_with(KEY, options).await?.release().await?;
    Ok(())
}

/// Runs `case` with a budget of `polls` polls; `true` when the operation
/// completed within it (larger budgets test nothing new).
async fn run(fx: &Fixture, case: Case, polls: usize) -> bool {
    let ttl = fx.ttl;
    let mut poller = Poller::new();
    let opts = LockOptions::new(ttl).wait(Duration::from_secs(10));
    match case {
        Case::Lock => {
            let op = pin!(fx.a.lock(KEY, ttl));
            fx.after_polls(poller.poll(op, polls).await.is_some(), case, polls)
                .await
        }
        Case::TryLock => {
            let op = pin!(fx.a.try_lock(KEY, ttl));
            fx.after_polls(poller.poll(op, polls).await.is_some(), case, polls)
                .await
        }
        Case::LockFenced => {
            let op = pin!(fx.a.lock_with(KEY, opts.fencing(true)));
            fx.after_polls(poller.poll(op, polls).await.is_some(), case, polls)
                .await
        }
        Case::LockBehindHandOff | Case::LockBehindFencedHandOff | Case::LockBehindTurn => {
            let fenced = matches!(case, Case::LockBehindFencedHandOff);
            let client = match case {
                Case::LockBehindTurn => &fx.turns,
                _ => &fx.a,
            };
            let holder = client
                .lock_with(KEY, LockOptions::new(ttl).fencing(fenced))
                .await
                .unwrap();
            let mut op = pin!(client.lock_with(KEY, opts.fencing(fenced)));
            let done = poller.poll(op.as_mut(), polls.min(1)).await.is_some();
            assert!(!done, "a waiter cannot finish while the key is held");
            holder.release().await.unwrap();
            fx.after_polls(poller.poll(op, polls).await.is_some(), case, polls)
                .await
        }
        Case::LockBehindOtherProcess => {
            let holder = fx.b.lock(KEY, ttl).await.unwrap();
            let mut op = pin!(fx.a.lock_with(KEY, opts));
            let done = poller.poll(op.as_mut(), polls.min(1)).await.is_some();
            assert!(!done, "a waiter cannot finish while the key is held");
            holder.release().await.unwrap();
            fx.after_polls(poller.poll(op, polls).await.is_some(), case, polls)
                .await
        }
        Case::Release => {
            let guard = fx.a.lock(KEY, ttl).await.unwrap();
            let op = pin!(guard.release());
            fx.after_polls(poller.poll(op, polls).await.is_some(), case, polls)
                .await
        }
        Case::ReleaseWithWaiter => {
            let guard = fx.a.lock(KEY, ttl).await.unwrap();
            let client = fx.a.clone();
            let waiter = tokio::spawn(async move {
                let next = client
                    .lock_with(KEY, LockOptions::new(ttl).wait(Duration::from_secs(10)))
                    .await;
                next.unwrap().release().await.unwrap();
            });
            // On this single-threaded runtime, yielding runs the waiter's
            // first poll, which queues it behind the guard.
            tokio::task::yield_now().await;
            let done = {
                let op = pin!(guard.release());
                fx.after_polls(poller.poll(op, polls).await.is_some(), case, polls)
                    .await
            };
            tokio::time::timeout(Duration::from_secs(10), waiter)
                .await
                .expect("the waiter never got the key")
                .unwrap();
            done
        }
        Case::Extend => {
            let guard = fx.a.lock(KEY, ttl).await.unwrap();
            let done = {
                let op = pin!(guard.extend(Duration::from_secs(20)));
                fx.after_polls(poller.poll(op, polls).await.is_some(), case, polls)
                    .await
            };
            assert!(!guard.is_lost(), "a cancelled extend lost the lock");
            // Once polled, the extension to a shorter ttl may have reached
            // the server: the guard no longer vouches for more than that.
            assert!(
                polls == 0 || guard.remaining() <= Duration::from_secs(20),
                "a cancelled shortening left the guard trusting {:?}",
                guard.remaining()
            );
            assert!(
                guard.release().await.unwrap(),
                "still ours after a cancelled extend"
            );
            done
        }
        Case::Attribute => {
            let op = pin!(annotated(&fx.a));
            fx.after_polls(poller.poll(op, polls).await.is_some(), case, polls)
                .await
        }
        Case::LockAll => {
            let op = pin!(fx.a.lock_all(&[KEY2, KEY], opts));
            fx.after_polls(poller.poll(op, polls).await.is_some(), case, polls)
                .await
        }
        Case::LockRecorded => {
            let holder = fx.b.lock(KEY, ttl).await.unwrap();
            let letting_go = tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(300)).await;
                holder.release().await.unwrap();
            });
            let op = pin!(annotated_waiting(&fx.a, ttl));
            let done = fx
                .after_polls(poller.poll(op, polls).await.is_some(), case, polls)
                .await;
            letting_go.await.unwrap();
            done
        }
        Case::Shared | Case::Permit => {
            let opts = match case {
                Case::Shared => opts.shared(true),
                _ => opts.permits(2),
            };
            let op = pin!(fx.a.lock_with(KEY, opts));
            fx.after_polls(poller.poll(op, polls).await.is_some(), case, polls)
                .await
        }
        Case::LockAllBehindOtherProcess | Case::SharedBehindOtherProcess => {
            let holder = fx.b.lock(KEY, ttl).await.unwrap();
            let mut op = match case {
                Case::LockAllBehindOtherProcess => {
                    Box::pin(fx.a.lock_all(&[KEY, KEY2], opts.clone()))
                        as Pin<Box<dyn Future<Output = _>>>
                }
                _ => Box::pin(fx.a.lock_with(KEY, opts.shared(true))),
            };
            let done = poller.poll(op.as_mut(), polls.min(1)).await.is_some();
            // Redlock refuses shared locks at once.
            let refused = matches!(fx.backend, Backend::Redlock(_))
                && matches!(case, Case::SharedBehindOtherProcess);
            assert!(
                !done || refused,
                "a waiter cannot finish while the key is held"
            );
            holder.release().await.unwrap();
            done || fx
                .after_polls(poller.poll(op.as_mut(), polls).await.is_some(), case, polls)
                .await
        }
    }
}

/// Every case, for every number of polls until it completes.
async fn every_case(fx: &Fixture, backend: &str) {
    for case in CASES {
        // Its wait takes dozens of polls (each record and walk is a round
        // trip), each of which the kept variant would keep for 1.5 s; what
        // it adds, records of a wait nobody polls, expire by themselves
        // within 2 s and hold no one up.
        if fx.held.is_some() && matches!(case, Case::LockRecorded) {
            continue;
        }
        for polls in 0.. {
            let done = run(fx, case, polls).await;
            fx.check(&format!("{backend}: {case:?} dropped after {polls} polls"))
                .await;
            if done {
                println!("{backend}: {case:?} completes at poll {polls}");
                break;
            }
            assert!(polls < 200, "{backend}: {case:?} never completes");
        }
    }
    fx.assert_held(backend);
}

#[tokio::test]
async fn operations_dropped_at_any_poll_leave_nothing_behind_in_memory() {
    every_case(&Fixture::on(Backend::memory()).await, "in-memory").await;
}

#[tokio::test]
async fn operations_dropped_at_any_poll_leave_nothing_behind_on_redis() {
    every_case(&Fixture::on(Backend::server()).await, "redis").await;
}

#[tokio::test]
async fn operations_dropped_at_any_poll_leave_nothing_behind_on_redlock() {
    every_case(&Fixture::on(Backend::redlock()).await, "redlock").await;
}

#[tokio::test]
async fn operations_dropped_at_any_poll_leave_nothing_behind_over_tls() {
    // Skipped (said on stderr) where redis-server was built without TLS.
    if let Some(tls) = Backend::tls() {
        every_case(&Fixture::on(tls).await, "redis over TLS").await;
    }
}

#[tokio::test]
async fn operations_dropped_at_any_poll_leave_nothing_behind_on_a_cluster() {
    every_case(&Fixture::on(Backend::cluster()).await, "cluster").await;
}

/// Over a connection the service gave, of each kind: each client (the one
/// whose operations are cancelled, the same without hand-offs, another
/// process) over a connection of its own.
#[tokio::test]
async fn operations_dropped_at_any_poll_leave_nothing_behind_over_a_given_connection() {
    for backend in Backend::every_given() {
        let on = backend.name();
        every_case(&Fixture::on(backend).await, on).await;
    }
}

/// The kept variant: every case, at every number of polls, kept unpolled
/// for [`KEPT_FOR`] before it is dropped, which adds up to about a minute a
/// backend. A long run: `scripts/test --quick` leaves it out.
mod long {
    use super::*;

    #[tokio::test]
    async fn operations_kept_unpolled_hold_nothing_up_in_memory() {
        every_case(&Fixture::kept(Backend::memory()).await, "in-memory, kept").await;
    }

    #[tokio::test]
    async fn operations_kept_unpolled_hold_nothing_up_on_redis() {
        every_case(&Fixture::kept(Backend::server()).await, "redis, kept").await;
    }

    #[tokio::test]
    async fn operations_kept_unpolled_hold_nothing_up_on_redlock() {
        every_case(&Fixture::kept(Backend::redlock()).await, "redlock, kept").await;
    }

    #[tokio::test]
    async fn operations_kept_unpolled_hold_nothing_up_over_tls() {
        if let Some(tls) = Backend::tls() {
            every_case(&Fixture::kept(tls).await, "redis over TLS, kept").await;
        }
    }

    #[tokio::test]
    async fn operations_kept_unpolled_hold_nothing_up_on_a_cluster() {
        every_case(&Fixture::kept(Backend::cluster()).await, "cluster, kept").await;
    }

    /// Over one connection kind and one pool (each kind takes about 80 s
    /// here); the dropped variant above runs all four.
    #[tokio::test]
    async fn operations_kept_unpolled_hold_nothing_up_over_a_given_connection() {
        for backend in Backend::given_each(&[Given::Multiplexed, Given::Deadpool]) {
            let on = format!("{}, kept", backend.name());
            every_case(&Fixture::kept(backend).await, &on).await;
        }
    }
}
