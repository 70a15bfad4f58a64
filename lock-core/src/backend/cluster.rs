//! A Redis Cluster: one cluster connection that sends each command to the
//! primary of its key's hash slot, with a bound on every call.

use super::MinReplicas;
use super::node::redact;
use crate::error::{ErrorKind, LockError, TimedOut, from_redis};
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::oneshot;

/// A Redis Cluster and the one cluster connection all locks share to it.
///
/// Every lock command touches keys of one hash slot (`<prefix>{<key>}` and
/// `<prefix>{<key>}:fence`), so the `redis` crate routes it to that slot's
/// primary and follows `MOVED`/`ASK` redirections and topology changes
/// (a failover) by itself. As with [`Node`](super::Node), the connection is
/// replaced when a call times out and when the runtime that drives it has
/// shut down.
pub(crate) struct ClusterNode {
    client: ClusterClient,
    /// A plain client per seed URL, for the release wake-ups (`PUBLISH` is
    /// broadcast to every node of a cluster).
    seeds: Vec<redis::Client>,
    addr: String,
    connect_timeout: Duration,
    /// Never set: `WAIT` is refused for a cluster by the builder.
    pub(crate) min_replicas: Option<MinReplicas>,
    current: Mutex<Option<Live>>,
    connecting: tokio::sync::Mutex<()>,
    generation: AtomicU64,
}

#[derive(Clone)]
struct Live {
    conn: ClusterConnection,
    /// Cleared when the runtime driving `conn` shuts down.
    driver_alive: Arc<AtomicBool>,
    /// Dropping the last clone ends the watch task spawned next to the driver.
    _retire: Arc<oneshot::Sender<()>>,
    generation: u64,
}

/// Clears the flag when the watch task is dropped (its runtime shut down, or
/// the connection was retired).
struct RuntimeWatch(Arc<AtomicBool>);

impl Drop for RuntimeWatch {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl ClusterNode {
    /// A cluster reached first through `urls` (`redis://[user:password@]host:port`,
    /// any of its nodes; the others are discovered). Plain TCP only.
    pub(crate) fn new(
        urls: &[String],
        connect_timeout: Duration,
        op_timeout: Duration,
    ) -> Result<ClusterNode, LockError> {
        if urls.is_empty() {
            return Err(LockError::config(
                "Redis Cluster needs at least one node URL",
            ));
        }
        let shown: Vec<String> = urls.iter().map(|u| redact(u)).collect();
        if let Some(url) = urls.iter().find(|url| {
            url.split_once("://")
                .is_some_and(|(scheme, _)| !scheme.eq_ignore_ascii_case("redis"))
        }) {
            return Err(LockError::config(format!(
                "{:?}: Redis Cluster is supported over redis:// URLs only",
                redact(url)
            )));
        }
        let seeds = urls
            .iter()
            .map(|url| {
                redis::Client::open(url.as_str()).map_err(|e| {
                    LockError::config(format!("cannot use Redis URL {:?}", redact(url)))
                        .with_source(e)
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        // The cluster connection retries a command itself (after a
        // redirection, a refused connection, `TRYAGAIN`, `CLUSTERDOWN`
        // during a failover). Its default waits between retries start at
        // 1.28 s, longer than a whole operation may take: keep them short,
        // so a retry fits in the caller's bound. Connecting to one node
        // (a reconnection mid-operation) is bounded by the operation timeout.
        let op_ms = u64::try_from(op_timeout.as_millis()).unwrap_or(u64::MAX);
        let client = ClusterClientBuilder::new(urls.iter().map(String::as_str))
            .connection_timeout(connect_timeout.min(op_timeout))
            .response_timeout(op_timeout)
            .min_retry_wait(5)
            .max_retry_wait((op_ms / 4).max(10))
            .build()
            .map_err(|e| {
                LockError::config(format!("cannot use cluster URLs {}", shown.join(", ")))
                    .with_source(e)
            })?;
        let hosts: Vec<String> = seeds
            .iter()
            .map(|c| c.get_connection_info().addr().to_string())
            .collect();
        Ok(ClusterNode {
            client,
            seeds,
            addr: format!("cluster[{}]", hosts.join(", ")),
            connect_timeout,
            min_replicas: None,
            current: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
            generation: AtomicU64::new(0),
        })
    }

    /// Plain clients for the seed nodes, for the wake-up subscriptions.
    pub(crate) fn seed_clients(&self) -> Vec<redis::Client> {
        self.seeds.clone()
    }

    /// The seed nodes' addresses, for messages.
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
        let _one = self.connecting.lock().await;
        if let Some(live) = self.cached() {
            return Ok(live);
        }
        let conn =
            match tokio::time::timeout(self.connect_timeout, self.client.get_async_connection())
                .await
            {
                Ok(Ok(conn)) => conn,
                Ok(Err(e)) => {
                    let err = from_redis(e);
                    return Err(if err.kind() == ErrorKind::Unavailable {
                        err.with_message(format!("cannot connect to {}", self.addr))
                    } else {
                        err
                    });
                }
                Err(_) => {
                    return Err(LockError::new(ErrorKind::Unavailable)
                        .with_message(format!("cannot connect to {}", self.addr))
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
        let live = Live {
            conn,
            driver_alive,
            _retire: Arc::new(retire_tx),
            generation: self.generation.fetch_add(1, Ordering::Relaxed) + 1,
        };
        *self.current.lock().unwrap_or_else(|p| p.into_inner()) = Some(live.clone());
        Ok(live)
    }

    /// Runs one call with the shared cluster connection, bounded by `limit`
    /// in all (connecting included). Redirections and reconnections to
    /// single nodes are the cluster connection's own business; a broken
    /// cluster connection is replaced, and with `retry_on_drop` the call is
    /// sent once more on the new one (only for calls safe to repeat).
    pub(crate) async fn call<T, F, Fut>(
        &self,
        limit: Duration,
        retry_on_drop: bool,
        f: F,
    ) -> Result<T, LockError>
    where
        F: Fn(ClusterConnection) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        let attempt = async {
            let mut retried = false;
            loop {
                let live = self.connection().await?;
                match f(live.conn.clone()).await {
                    Ok(value) => return Ok(value),
                    Err(e) if e.is_unrecoverable_error() => {
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
                self.retire(generation);
                Err(LockError::new(ErrorKind::Unavailable)
                    .with_message(format!("{} did not answer", self.addr))
                    .with_source(TimedOut { after: limit }))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_settings_are_checked() {
        let limit = Duration::from_secs(1);
        assert!(ClusterNode::new(&[], limit, limit).is_err());
        let tls = ["rediss://127.0.0.1:7000".to_owned()];
        assert!(ClusterNode::new(&tls, limit, limit).is_err());
        let urls = [
            "redis://127.0.0.1:7000".to_owned(),
            "redis://:pw@127.0.0.1:7001".to_owned(),
        ];
        let node = ClusterNode::new(&urls, limit, limit);
        assert!(
            node.as_ref()
                .is_ok_and(|n| n.addr() == "cluster[127.0.0.1:7000, 127.0.0.1:7001]")
        );
        assert!(node.is_ok_and(|n| n.seed_clients().len() == 2));
    }
}
