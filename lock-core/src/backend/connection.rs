//! One connection shared by every lock of a client (to a server, or to a
//! cluster), with a bound on every call.
//!
//! The connection is replaced when it breaks or a call times out, when the
//! tokio runtime that drives it has shut down, and when it takes no new
//! calls ([`TakesCalls`]). Where it is opened, and so which runtime drives
//! it, depends on its kind ([`Opens`]): lock-core's own connection (plain
//! TCP and TLS) is opened on the runtime of the call that needs it, whose
//! task then reads its replies without a hop to another thread, and whose
//! stalls its read-turn takeover and its readers' own reads keep from
//! other callers (`wire/`). A client kept in a global outlives the runtime
//! it was built on (every `#[tokio::test]` has its own), so the next call
//! notices and connects again on its own runtime. The `redis` crate's
//! connections (Unix sockets, RESP3, Sentinel, Cluster) have a driver task
//! that reads for every caller: they are opened on lock-core's runtime
//! (`background.rs`), which no caller's stall or shutdown reaches.
//!
//! Connecting runs in a task of its own, bounded by the connect timeout,
//! and every call that finds no connection waits for that one attempt, each
//! up to its own bound. Connecting can take longer than one call may (a
//! slow link, a login, a Sentinel lookup, Redlock's short per-server
//! bound): run inside the call, it would be abandoned with the call and
//! started from scratch by the next one, which would never connect.

use crate::background;
use crate::error::{ErrorKind, LockError, TimedOut, from_redis};
use arc_swap::ArcSwapOption;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

pub(crate) struct SharedConnection<C> {
    state: Arc<State<C>>,
    /// Where connections are opened.
    opens: Opens,
    /// The error for a connection that could not be opened, in the words
    /// of the caller's messages (a refused login, a failed TLS handshake,
    /// an unreachable server).
    refused: fn(&str, redis::RedisError) -> LockError,
}

/// Where a connection is opened, and so which runtime drives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Opens {
    /// On the runtime of the call that needs it (lock-core's own
    /// connection: its callers read their replies themselves).
    WhereCalled,
    /// On lock-core's runtime, its slow steps on a thread of its blocking
    /// pool (the `redis` crate's connections, whose driver task reads for
    /// every caller; a TLS connection loads certificates and runs its
    /// handshake synchronously).
    Apart,
}

/// What the callers and the connecting task share.
struct State<C> {
    connect_timeout: Duration,
    /// Read by every call of every task: lock-free, so busy clients do not
    /// contend for it.
    current: ArcSwapOption<Live<C>>,
    /// The connection attempt under way, if any.
    attempt: Mutex<Option<Attempt<C>>>,
    /// Numbers the attempts; a connection keeps its attempt's number.
    generation: AtomicU64,
}

pub(crate) struct Live<C> {
    pub(crate) conn: C,
    /// Cleared when the runtime driving `conn` shuts down.
    driver_alive: Arc<AtomicBool>,
    /// Dropping it ends the watch task spawned next to the driver.
    _retire: oneshot::Sender<()>,
    generation: u64,
}

/// Clears the flag when the watch task is dropped, which happens when its
/// runtime shuts down (or when the connection is retired).
struct RuntimeWatch(Arc<AtomicBool>);

impl Drop for RuntimeWatch {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// A connection that may stop taking new calls while it still answers the
/// ones in flight (lock-core's own, once the runtime that opened it stops
/// telling its socket's readiness): a call that finds it so opens another.
pub(crate) trait TakesCalls {
    /// Whether a new call may use this connection.
    fn takes_calls(&self) -> bool {
        true
    }
}

/// What a failed call means for the connection.
pub(crate) enum Failure {
    /// The connection is broken (or talks to the wrong server): replace it,
    /// and report this error unless the call may be sent again.
    Replace(LockError),
    /// An answer, not a broken connection: report it.
    Answer(LockError),
}

/// A connection attempt, as the callers waiting for it see it.
struct Attempt<C> {
    generation: u64,
    started: Instant,
    outcome: watch::Receiver<Option<Outcome<C>>>,
}

/// How an attempt ended: the connection and its generation, or why not.
/// Every caller waiting for the attempt gets a copy.
type Outcome<C> = Result<(C, u64), Failed>;

/// Why an attempt failed, kept so that every caller that waited for it
/// gets its own error (`LockError` is not `Clone`).
#[derive(Clone)]
enum Failed {
    Refused(redis::RedisError),
    TimedOut,
}

/// What a caller without a connection finds.
enum Found<C> {
    Live((C, u64)),
    Pending(watch::Receiver<Option<Outcome<C>>>),
}

/// The sending side of an attempt, owned by its task. However the task
/// ends (with an outcome, or dropped by its runtime shutting down), the
/// attempt stops being the one under way before its waiters hear of it, so
/// whoever calls next starts a new one.
struct Reporter<C> {
    state: Arc<State<C>>,
    generation: u64,
    outcome: watch::Sender<Option<Outcome<C>>>,
}

impl<C> Reporter<C> {
    fn report(self, outcome: Outcome<C>) {
        self.state.end_attempt(self.generation);
        self.outcome.send_replace(Some(outcome));
    }
}

impl<C> Drop for Reporter<C> {
    fn drop(&mut self) {
        // The sender is dropped after this, waking the waiters.
        self.state.end_attempt(self.generation);
    }
}

impl<C> State<C> {
    /// Forgets the attempt of `generation`, if it is still the one under way.
    fn end_attempt(&self, generation: u64) {
        let mut attempt = self.attempt.lock().unwrap_or_else(PoisonError::into_inner);
        if attempt.as_ref().is_some_and(|a| a.generation == generation) {
            *attempt = None;
        }
    }
}

impl<C: Clone + TakesCalls> State<C> {
    /// The connection (a clone, for one call) and its generation, unless
    /// there is none, its runtime has shut down, or it takes no new calls.
    fn cached(&self) -> Option<(C, u64)> {
        let guard = self.current.load();
        guard
            .as_ref()
            .filter(|live| live.driver_alive.load(Ordering::Acquire) && live.conn.takes_calls())
            .map(|live| (live.conn.clone(), live.generation))
    }
}

impl<C: Clone + Send + Sync + 'static> State<C> {
    /// Makes `conn` the shared connection. Runs on the runtime that opened
    /// it (and drives it), so the watch task notices that runtime end.
    fn install(&self, conn: C, generation: u64) {
        let driver_alive = Arc::new(AtomicBool::new(true));
        let (retire_tx, retire_rx) = oneshot::channel::<()>();
        let watch = RuntimeWatch(driver_alive.clone());
        tokio::spawn(async move {
            let _watch = watch;
            let _ = retire_rx.await;
        });
        self.current.store(Some(Arc::new(Live {
            conn,
            driver_alive,
            _retire: retire_tx,
            generation,
        })));
    }
}

/// Opens a connection with `open`, bounded by `limit`, and tells the
/// callers waiting for it.
async fn connect<C, F>(reporter: Reporter<C>, limit: Duration, open: F, opens: Opens)
where
    C: Clone + Send + Sync + 'static,
    F: Future<Output = redis::RedisResult<C>> + Send + 'static,
{
    let opening = tokio::time::timeout(limit, open);
    let opened = match opens {
        Opens::WhereCalled => Some(opening.await),
        Opens::Apart => background::off_thread(opening).await,
    };
    let outcome = match opened {
        Some(Ok(Ok(conn))) => {
            reporter.state.install(conn.clone(), reporter.generation);
            Ok((conn, reporter.generation))
        }
        Some(Ok(Err(e))) => Err(Failed::Refused(e)),
        Some(Err(_)) | None => Err(Failed::TimedOut),
    };
    reporter.report(outcome);
}

impl<C: Clone + Send + Sync + TakesCalls + 'static> SharedConnection<C> {
    /// A connection of its own to the same place, with the same settings:
    /// nothing is shared with `self`, the connection included (opened on
    /// its first call, where [`Opens`] says).
    pub(crate) fn twin(&self) -> SharedConnection<C> {
        SharedConnection::new(self.state.connect_timeout, self.refused, self.opens)
    }

    pub(crate) fn new(
        connect_timeout: Duration,
        refused: fn(&str, redis::RedisError) -> LockError,
        opens: Opens,
    ) -> SharedConnection<C> {
        SharedConnection {
            opens,
            state: Arc::new(State {
                connect_timeout,
                current: ArcSwapOption::empty(),
                attempt: Mutex::new(None),
                generation: AtomicU64::new(0),
            }),
            refused,
        }
    }

    /// The connection, when one is open, without waiting for anything:
    /// also one whose runtime is shutting down (its tasks are dropped
    /// before its sockets stop), for a write that must go out now.
    pub(crate) fn current(&self) -> Option<C> {
        self.state
            .current
            .load()
            .as_ref()
            .map(|live| live.conn.clone())
    }

    /// Forgets the connection when `stale` says so of it, so the next call
    /// opens another (one to a server the connection no longer belongs to).
    /// Calls under way on it finish there.
    pub(crate) fn retire_if(&self, stale: impl Fn(&C) -> bool) {
        let current = self.state.current.load();
        if current.as_ref().is_some_and(|live| stale(&live.conn)) {
            self.state.current.rcu(|current| match current {
                Some(live) if stale(&live.conn) => None,
                other => other.clone(),
            });
        }
    }

    /// Forgets the connection of `generation` so the next call reconnects.
    fn retire(&self, generation: u64) {
        self.state.current.rcu(|current| match current {
            Some(live) if live.generation == generation => None,
            other => other.clone(),
        });
    }

    /// The connection, or the attempt under way to open one: joined, or
    /// started now (in a task of its own) when there is none.
    fn connection_or_attempt<O, OFut>(&self, open: &O) -> Found<C>
    where
        O: Fn() -> OFut,
        OFut: Future<Output = redis::RedisResult<C>> + Send + 'static,
    {
        let state = &self.state;
        let mut attempt = state.attempt.lock().unwrap_or_else(PoisonError::into_inner);
        // Checked under the lock: an attempt installs its connection before
        // it stops being the one under way.
        if let Some(live) = state.cached() {
            return Found::Live(live);
        }
        // An attempt reports within the connect timeout, unless its runtime
        // stopped running tasks without shutting down; then a new one runs
        // on this caller's runtime.
        let stale_after = state.connect_timeout.saturating_mul(2);
        if let Some(pending) = attempt
            .as_ref()
            .filter(|a| a.started.elapsed() < stale_after)
        {
            return Found::Pending(pending.outcome.clone());
        }
        let generation = state.generation.fetch_add(1, Ordering::Relaxed) + 1;
        let (tx, rx) = watch::channel(None);
        *attempt = Some(Attempt {
            generation,
            started: Instant::now(),
            outcome: rx.clone(),
        });
        // Spawned without the lock held: a runtime shutting down drops the
        // task at once, and its `Reporter` takes the lock.
        drop(attempt);
        let reporter = Reporter {
            state: state.clone(),
            generation,
            outcome: tx,
        };
        let connecting = connect(reporter, state.connect_timeout, open(), self.opens);
        match self.opens {
            Opens::Apart => background::spawn(connecting),
            Opens::WhereCalled => match tokio::runtime::Handle::try_current() {
                Ok(runtime) => drop(runtime.spawn(connecting)),
                Err(_) => background::spawn(connecting),
            },
        }
        Found::Pending(rx)
    }

    /// The shared connection: the cached one, or the one the attempt under
    /// way (started if need be) opens. Waits as long as the caller awaits
    /// it; a caller that gives up leaves the attempt running for the others.
    ///
    /// Only [`call`](Self::call)'s slow path, which boxes it, so the future
    /// of every call stays small.
    async fn connection<O, OFut>(&self, addr: &str, open: &O) -> Result<(C, u64), LockError>
    where
        O: Fn() -> OFut,
        OFut: Future<Output = redis::RedisResult<C>> + Send + 'static,
    {
        // An attempt ends without an outcome when the runtime it ran on
        // shuts down; a caller on another runtime then starts one on its
        // own, once.
        let mut vanished = false;
        loop {
            let mut outcome = match self.connection_or_attempt(open) {
                Found::Live(live) => return Ok(live),
                Found::Pending(outcome) => outcome,
            };
            let ended = outcome
                .wait_for(Option::is_some)
                .await
                .map(|outcome| outcome.clone());
            match ended {
                Ok(Some(outcome)) => return outcome.map_err(|failed| self.error(addr, failed)),
                _ if !vanished => vanished = true,
                _ => {
                    return Err(LockError::new(ErrorKind::Unavailable).with_message(format!(
                        "cannot connect to {addr}: the runtime connecting to it shut down"
                    )));
                }
            }
        }
    }

    /// The error a caller reports for a failed attempt.
    fn error(&self, addr: &str, failed: Failed) -> LockError {
        match failed {
            Failed::Refused(e) => (self.refused)(addr, e),
            Failed::TimedOut => LockError::new(ErrorKind::Unavailable)
                .with_message(format!("cannot connect to {addr}"))
                .with_source(TimedOut {
                    after: self.state.connect_timeout,
                }),
        }
    }

    /// Runs one call `f` on the shared connection, bounded by `limit` in all
    /// (waiting for a connection included).
    ///
    /// `failure` says whether an error means a broken connection; such a
    /// connection is replaced, and when `retry_on_drop` is set the call is
    /// sent once more on the new one: only for calls that are safe to repeat
    /// (the compare-and-delete and compare-and-pexpire scripts). A call that
    /// times out on the connection it found also retires it: one that
    /// stopped answering may never answer again (a dead peer, a black-holed
    /// route). A connection opened while the call waited is kept: the call
    /// may simply have had too little of its bound left for its answer.
    pub(crate) async fn call<T, F, Fut, O, OFut>(
        &self,
        addr: &str,
        limit: Duration,
        retry_on_drop: bool,
        open: O,
        failure: impl Fn(redis::RedisError) -> Failure,
        f: F,
    ) -> Result<T, LockError>
    where
        F: Fn(C) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
        O: Fn() -> OFut,
        OFut: Future<Output = redis::RedisResult<C>> + Send + 'static,
    {
        // The generation of the connection the call found, or 0.
        let found = AtomicU64::new(0);
        let attempt = async {
            let mut retried = false;
            loop {
                let (conn, generation) = match self.state.cached() {
                    Some(live) => {
                        found.store(live.1, Ordering::Relaxed);
                        live
                    }
                    None => {
                        found.store(0, Ordering::Relaxed);
                        Box::pin(self.connection(addr, &open)).await?
                    }
                };
                match f(conn).await {
                    Ok(value) => return Ok(value),
                    Err(e) => match failure(e) {
                        Failure::Answer(err) => return Err(err),
                        Failure::Replace(err) => {
                            self.retire(generation);
                            if retry_on_drop && !retried {
                                retried = true;
                                continue;
                            }
                            return Err(err);
                        }
                    },
                }
            }
        };
        match tokio::time::timeout(limit, attempt).await {
            Ok(result) => result,
            Err(_) => {
                let generation = found.load(Ordering::Relaxed);
                if generation != 0 {
                    self.retire(generation);
                }
                Err(LockError::new(ErrorKind::Unavailable)
                    .with_message(format!("{addr} did not answer"))
                    .with_source(TimedOut { after: limit }))
            }
        }
    }
}

/// A broken connection, in the words of the caller's messages.
pub(crate) fn lost(addr: &str, err: redis::RedisError) -> Failure {
    Failure::Replace(from_redis(err).with_message(format!("connection to {addr} was lost")))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use futures::future::{BoxFuture, FutureExt, join_all};
    use std::sync::atomic::AtomicUsize;

    const ADDR: &str = "test:1";

    impl TakesCalls for u32 {}

    /// A connection is a number here; `opens` counts the attempts.
    struct Fixture {
        connection: SharedConnection<u32>,
        opens: Arc<AtomicUsize>,
    }

    impl Fixture {
        fn new(connect_timeout: Duration) -> Fixture {
            Fixture::opening(connect_timeout, Opens::WhereCalled)
        }

        fn opening(connect_timeout: Duration, opens: Opens) -> Fixture {
            let refused = |addr: &str, e: redis::RedisError| {
                from_redis(e).with_message(format!("refused by {addr}"))
            };
            Fixture {
                connection: SharedConnection::new(connect_timeout, refused, opens),
                opens: Arc::default(),
            }
        }

        /// One call within `limit`, with `open(n)` as the way to open the
        /// `n`-th connection (from 0); answers with the connection.
        async fn call<O>(&self, limit: Duration, open: O) -> Result<u32, LockError>
        where
            O: Fn(usize) -> BoxFuture<'static, redis::RedisResult<u32>>,
        {
            let opens = &self.opens;
            let open = || open(opens.fetch_add(1, Ordering::Relaxed));
            let failure = |e| Failure::Answer(from_redis(e));
            let f = |conn: u32| async move { Ok(conn) };
            self.connection
                .call(ADDR, limit, false, open, failure, f)
                .await
        }

        fn opens(&self) -> usize {
            self.opens.load(Ordering::Relaxed)
        }
    }

    /// Opens connection `n` after `delay`.
    fn after(delay: Duration) -> impl Fn(usize) -> BoxFuture<'static, redis::RedisResult<u32>> {
        move |n| {
            async move {
                tokio::time::sleep(delay).await;
                Ok(u32::try_from(n).unwrap_or(u32::MAX))
            }
            .boxed()
        }
    }

    #[tokio::test]
    async fn callers_share_one_attempt_that_outlives_those_giving_up() {
        let fixture = Fixture::new(Duration::from_secs(5));
        let open = after(Duration::from_millis(300));
        let short = Duration::from_millis(50);
        let started = Instant::now();
        let answers = join_all((0..5).map(|_| fixture.call(short, &open))).await;
        assert!(started.elapsed() < Duration::from_millis(250));
        for answer in answers {
            let err = answer.unwrap_err();
            assert!(err.is_unavailable() && err.is_timeout(), "{err}");
        }
        // The attempt went on without them: the next call gets its
        // connection, not a new attempt.
        let conn = fixture.call(Duration::from_secs(5), &open).await.unwrap();
        assert_eq!((conn, fixture.opens()), (0, 1));
        let conn = fixture.call(Duration::from_secs(5), &open).await.unwrap();
        assert_eq!((conn, fixture.opens()), (0, 1));
    }

    #[tokio::test]
    async fn every_waiter_gets_the_refusal_and_the_next_call_tries_again() {
        let fixture = Fixture::new(Duration::from_secs(5));
        let open = |n: usize| {
            async move {
                tokio::time::sleep(Duration::from_millis(20)).await;
                match n {
                    0 => Err(redis::RedisError::from((
                        redis::ErrorKind::AuthenticationFailed,
                        "WRONGPASS",
                    ))),
                    _ => Ok(7),
                }
            }
            .boxed()
        };
        let limit = Duration::from_secs(5);
        let answers = join_all((0..3).map(|_| fixture.call(limit, &open))).await;
        for answer in answers {
            let err = answer.unwrap_err();
            let whole = err.chain().to_string();
            assert_eq!(err.kind(), ErrorKind::Server, "{whole}");
            assert!(err.to_string().contains("refused by test:1"), "{whole}");
            assert!(whole.contains("WRONGPASS"), "{whole}");
        }
        assert_eq!(fixture.call(limit, &open).await.unwrap(), 7);
        assert_eq!(fixture.opens(), 2);
    }

    #[tokio::test]
    async fn an_attempt_is_bounded_by_the_connect_timeout() {
        let fixture = Fixture::new(Duration::from_millis(50));
        let open = |n: usize| match n {
            0 => futures::future::pending().boxed(),
            _ => futures::future::ready(Ok(7)).boxed(),
        };
        let err = fixture
            .call(Duration::from_secs(5), &open)
            .await
            .unwrap_err();
        assert!(err.is_unavailable() && err.is_timeout(), "{err}");
        assert!(
            err.to_string().contains("cannot connect to test:1"),
            "{err}"
        );
        assert_eq!(
            fixture.call(Duration::from_secs(5), &open).await.unwrap(),
            7
        );
    }

    /// An attempt of a connection opened apart, started by a caller whose
    /// runtime shuts down, goes on, on lock-core's runtime: a caller on
    /// another runtime gets its connection, and nothing connects twice.
    #[test]
    fn an_attempt_opened_apart_outlives_the_runtime_that_started_it() {
        let runtime = || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
        };
        let fixture = Fixture::opening(Duration::from_secs(5), Opens::Apart);
        // The first attempt takes a while; a second one would be refused.
        let open = |n: usize| match n {
            // Lazy, as a real attempt: its timer is made where it runs.
            0 => async {
                tokio::time::sleep(Duration::from_millis(100)).await;
                Ok(7)
            }
            .boxed(),
            _ => futures::future::ready(Err(redis::RedisError::from((
                redis::ErrorKind::Io,
                "connected twice",
            ))))
            .boxed(),
        };
        let first = runtime();
        let err = first
            .block_on(fixture.call(Duration::from_millis(20), &open))
            .unwrap_err();
        assert!(err.is_timeout(), "{err}");
        drop(first);
        let answer = runtime().block_on(fixture.call(Duration::from_secs(5), &open));
        assert_eq!(answer.unwrap(), 7);
        assert_eq!(fixture.opens(), 1);
    }

    /// The attempt runs on a runtime that shuts down while a caller on
    /// another runtime waits for it: the caller connects on its own.
    #[test]
    fn an_attempt_whose_runtime_shuts_down_is_started_again() {
        let runtime = || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
        };
        let fixture = Fixture::new(Duration::from_secs(5));
        // The first attempt never ends by itself; later ones do at once.
        let open = |n: usize| match n {
            0 => futures::future::pending().boxed(),
            _ => futures::future::ready(Ok(7)).boxed(),
        };
        let first = runtime();
        let err = first
            .block_on(fixture.call(Duration::from_millis(20), &open))
            .unwrap_err();
        assert!(err.is_timeout(), "{err}");

        let answer = runtime().block_on(async {
            let shut_down = tokio::task::spawn_blocking(move || drop(first));
            // Polled first: it waits for the first attempt before the
            // first runtime goes.
            let (answer, shut_down) =
                tokio::join!(fixture.call(Duration::from_secs(5), &open), shut_down);
            shut_down.unwrap();
            answer
        });
        assert_eq!(answer.unwrap(), 7);
        assert_eq!(fixture.opens(), 2);
    }
}
