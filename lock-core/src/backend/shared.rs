//! One connection shared by every lock of a client (to a server, or to a
//! cluster), with a bound on every call.
//!
//! The connection is replaced when it breaks or a call times out, and also
//! when the tokio runtime that drives it has shut down: a client kept in a
//! global outlives the runtime it was built on (every `#[tokio::test]` has
//! its own), so the next call notices and connects again on the caller's
//! runtime instead of failing.

use crate::error::{ErrorKind, LockError, TimedOut, from_redis};
use arc_swap::ArcSwapOption;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::oneshot;

pub(crate) struct Shared<C> {
    connect_timeout: Duration,
    /// Read by every call of every task: lock-free, so busy clients do not
    /// contend for it.
    current: ArcSwapOption<Live<C>>,
    connecting: tokio::sync::Mutex<()>,
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

/// What a failed call means for the connection.
pub(crate) enum Failure {
    /// The connection is broken (or talks to the wrong server): replace it,
    /// and report this error unless the call may be sent again.
    Replace(LockError),
    /// An answer, not a broken connection: report it.
    Answer(LockError),
}

impl<C: Clone> Shared<C> {
    pub(crate) fn new(connect_timeout: Duration) -> Shared<C> {
        Shared {
            connect_timeout,
            current: ArcSwapOption::empty(),
            connecting: tokio::sync::Mutex::new(()),
            generation: AtomicU64::new(0),
        }
    }

    /// The connection (a clone, for one call) and its generation, unless
    /// there is none or its runtime has shut down.
    fn cached(&self) -> Option<(C, u64)> {
        let guard = self.current.load();
        guard
            .as_ref()
            .filter(|live| live.driver_alive.load(Ordering::Acquire))
            .map(|live| (live.conn.clone(), live.generation))
    }

    /// Forgets the connection of `generation` so the next call reconnects.
    fn retire(&self, generation: u64) {
        self.current.rcu(|current| match current {
            Some(live) if live.generation == generation => None,
            other => other.clone(),
        });
    }

    /// Opens the shared connection with `open` (bounded by the connect
    /// timeout), unless another call has just done so.
    ///
    /// Only [`call`](Self::call)'s slow path, which boxes it: a connection
    /// setup future is several kilobytes, and inline it would make every
    /// call's future (and the acquire and release futures around it) that
    /// large, and copied at every await.
    async fn reconnect<O, OFut>(&self, addr: &str, open: &O) -> Result<(C, u64), LockError>
    where
        O: Fn() -> OFut,
        OFut: Future<Output = Result<C, LockError>>,
    {
        // One reconnect at a time; the others wait for it and reuse it.
        let _one = self.connecting.lock().await;
        if let Some(live) = self.cached() {
            return Ok(live);
        }
        let conn = match tokio::time::timeout(self.connect_timeout, open()).await {
            Ok(conn) => conn?,
            Err(_) => {
                return Err(LockError::new(ErrorKind::Unavailable)
                    .with_message(format!("cannot connect to {addr}"))
                    .with_source(TimedOut {
                        after: self.connect_timeout,
                    }));
            }
        };
        let driver_alive = Arc::new(AtomicBool::new(true));
        let (retire_tx, retire_rx) = oneshot::channel::<()>();
        let watch = RuntimeWatch(driver_alive.clone());
        tokio::spawn(async move {
            let _watch = watch;
            let _ = retire_rx.await;
        });
        let generation = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
        self.current.store(Some(Arc::new(Live {
            conn: conn.clone(),
            driver_alive,
            _retire: retire_tx,
            generation,
        })));
        Ok((conn, generation))
    }

    /// Runs one call `f` on the shared connection, bounded by `limit` in all
    /// (connecting included).
    ///
    /// `failure` says whether an error means a broken connection; such a
    /// connection is replaced, and when `retry_on_drop` is set the call is
    /// sent once more on the new one: only for calls that are safe to repeat
    /// (the compare-and-delete and compare-and-pexpire scripts). A call that
    /// times out also retires the connection: one that stopped answering may
    /// never answer again (a dead peer, a black-holed route).
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
        OFut: Future<Output = Result<C, LockError>>,
    {
        let attempt = async {
            let mut retried = false;
            loop {
                let (conn, generation) = match self.cached() {
                    Some(live) => live,
                    None => Box::pin(self.reconnect(addr, &open)).await?,
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
        let generation = self.generation.load(Ordering::Relaxed);
        match tokio::time::timeout(limit, attempt).await {
            Ok(result) => result,
            Err(_) => {
                self.retire(generation);
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
