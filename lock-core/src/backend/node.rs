//! One Redis server: a shared multiplexed connection that reconnects, with a
//! bound on every call.

use crate::error::{ErrorKind, LockError, TimedOut, from_redis};
use futures::future::join_all;
use redis::aio::MultiplexedConnection;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::oneshot;

/// A Redis server and the one connection all locks share to it.
///
/// The connection is a `MultiplexedConnection`: many concurrent commands are
/// pipelined over one socket. It is replaced when it breaks or times out, and
/// also when the tokio runtime that drives it has shut down: a client kept in
/// a global outlives the runtime it was built on (every `#[tokio::test]` has
/// its own), so the next call notices and connects again on the caller's
/// runtime instead of failing.
pub(crate) struct Node {
    client: redis::Client,
    addr: String,
    connect_timeout: Duration,
    current: Mutex<Option<Live>>,
    connecting: tokio::sync::Mutex<()>,
    generation: AtomicU64,
}

#[derive(Clone)]
struct Live {
    conn: MultiplexedConnection,
    /// Cleared when the runtime driving `conn` shuts down.
    driver_alive: Arc<AtomicBool>,
    /// Dropping the last clone ends the watch task spawned next to the driver.
    _retire: Arc<oneshot::Sender<()>>,
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

impl Node {
    pub(crate) fn new(url: &str, connect_timeout: Duration) -> Result<Node, LockError> {
        let client = redis::Client::open(url).map_err(|e| {
            LockError::config(format!("cannot use Redis URL {:?}", redact(url))).with_source(e)
        })?;
        let info = client.get_connection_info();
        let addr = info.addr().to_string();
        Ok(Node {
            client,
            addr,
            connect_timeout,
            current: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
            generation: AtomicU64::new(0),
        })
    }

    /// A client for further connections to the same server.
    pub(crate) fn redis_client(&self) -> redis::Client {
        self.client.clone()
    }

    /// The server's address, without credentials.
    pub(crate) fn addr(&self) -> &str {
        &self.addr
    }

    fn cached(&self) -> Option<Live> {
        let guard = self.current.lock().unwrap_or_else(|p| p.into_inner());
        guard
            .as_ref()
            .filter(|live| live.driver_alive.load(Ordering::Acquire))
            .cloned()
    }

    /// Forgets the connection of `generation` so the next call reconnects.
    fn retire(&self, generation: u64) {
        let mut guard = self.current.lock().unwrap_or_else(|p| p.into_inner());
        if guard.as_ref().is_some_and(|l| l.generation == generation) {
            *guard = None;
        }
    }

    async fn connection(&self) -> Result<Live, LockError> {
        if let Some(live) = self.cached() {
            return Ok(live);
        }
        // One reconnect at a time; the others wait for it and reuse it.
        let _one = self.connecting.lock().await;
        if let Some(live) = self.cached() {
            return Ok(live);
        }
        let conn = match tokio::time::timeout(
            self.connect_timeout,
            self.client.get_multiplexed_async_connection(),
        )
        .await
        {
            Ok(Ok(conn)) => conn,
            Ok(Err(e)) => {
                return Err(from_redis(e).with_message(format!("cannot connect to {}", self.addr)));
            }
            Err(_) => {
                return Err(LockError::new(ErrorKind::Unavailable)
                    .with_message(format!("cannot connect to {}", self.addr))
                    .with_source(TimedOut {
                        after: self.connect_timeout,
                    }));
            }
        };
        // Load the scripts up front, so the first calls after connecting do
        // not each pay a NOSCRIPT round trip. Best effort: a failure here
        // only means they load on first use.
        let loads = crate::scripts::all().map(|script| {
            let mut conn = conn.clone();
            async move { script.load_async(&mut conn).await }
        });
        let _ = tokio::time::timeout(self.connect_timeout, join_all(loads)).await;
        let driver_alive = Arc::new(AtomicBool::new(true));
        let (retire_tx, retire_rx) = oneshot::channel::<()>();
        let watch = RuntimeWatch(driver_alive.clone());
        tokio::spawn(async move {
            let _watch = watch;
            let _ = retire_rx.await;
        });
        let live = Live {
            conn,
            driver_alive,
            _retire: Arc::new(retire_tx),
            generation: self.generation.fetch_add(1, Ordering::Relaxed) + 1,
        };
        *self.current.lock().unwrap_or_else(|p| p.into_inner()) = Some(live.clone());
        Ok(live)
    }

    /// Runs one call with the shared connection, bounded by `limit` in all
    /// (connecting included).
    ///
    /// A broken connection is replaced. When `retry_on_drop` is set the call
    /// is sent once more on the new connection: only for calls that are safe
    /// to repeat (the compare-and-delete and compare-and-pexpire scripts).
    pub(crate) async fn call<T, F, Fut>(
        &self,
        limit: Duration,
        retry_on_drop: bool,
        f: F,
    ) -> Result<T, LockError>
    where
        F: Fn(MultiplexedConnection) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        let attempt = async {
            let mut retried = false;
            loop {
                let live = self.connection().await?;
                match f(live.conn.clone()).await {
                    Ok(value) => return Ok(value),
                    Err(e) if e.is_connection_dropped() || e.is_unrecoverable_error() => {
                        self.retire(live.generation);
                        if retry_on_drop && !retried {
                            retried = true;
                            continue;
                        }
                        return Err(from_redis(e)
                            .with_message(format!("connection to {} was lost", self.addr)));
                    }
                    Err(e) => return Err(from_redis(e)),
                }
            }
        };
        let generation = self.generation.load(Ordering::Relaxed);
        match tokio::time::timeout(limit, attempt).await {
            Ok(result) => result,
            Err(_) => {
                // A connection that stopped answering may never answer again
                // (a dead peer, a black-holed route); start afresh next time.
                self.retire(generation);
                Err(LockError::new(ErrorKind::Unavailable)
                    .with_message(format!("{} did not answer", self.addr))
                    .with_source(TimedOut { after: limit }))
            }
        }
    }
}

/// A URL with its password replaced, for messages.
pub(crate) fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            format!("{}://***@{}", &url[..scheme_end], &url[at + 1..])
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redact_hides_credentials() {
        assert_eq!(redact("redis://:pw@host:1/0"), "redis://***@host:1/0");
        assert_eq!(redact("redis://u:pw@host"), "redis://***@host");
        assert_eq!(redact("redis://host:6379"), "redis://host:6379");
    }
}
