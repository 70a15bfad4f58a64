//! A Redis Cluster: one cluster connection that sends each command to the
//! primary of its key's hash slot, with a bound on every call.

use super::connection::{self, Failure, Opens, SharedConnection, TakesCalls};
use super::node::redact;
use super::{LockCommands, Server};
use super::{LockKeys, MinReplicas, Several};
use crate::error::{ErrorKind, LockError, from_redis};
use crate::token::Token;
use futures::future::BoxFuture;
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::Slot;
use std::future::Future;
use std::time::Duration;

/// A Redis Cluster and the one cluster connection all locks share to it.
///
/// Every lock command touches keys of one hash slot (`<prefix>{<key>}` and
/// `<prefix>{<key>}:fence`), so the `redis` crate routes it to that slot's
/// primary and follows `MOVED`/`ASK` redirections and topology changes
/// (a failover) by itself. As with [`Node`](super::Node), the connection is
/// replaced as [`SharedConnection`] says: when a call times out and when the runtime
/// that drives it has shut down.
pub(crate) struct ClusterNode {
    client: ClusterClient,
    /// A plain client per seed URL, for the release wake-ups (`PUBLISH` is
    /// broadcast to every node of a cluster).
    seeds: Vec<redis::Client>,
    addr: String,
    /// Never set: `WAIT` is refused for a cluster by the builder.
    pub(crate) min_replicas: Option<MinReplicas>,
    connection: SharedConnection<ClusterConnection>,
}

/// The `redis` crate's cluster connection is driven on lock-core's own
/// runtime, so it takes calls as long as it is open.
impl TakesCalls for ClusterConnection {}

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
                    LockError::config(format!(
                "cannot use Redis URL {:?}: write it as redis://[user:password@]host:port[/db]",
                redact(url)
            ))
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
            min_replicas: None,
            connection: SharedConnection::new(connect_timeout, connect_error, Opens::Apart),
        })
    }

    /// The same cluster through a connection of its own (see
    /// [`Backend::twin`](super::Backend::twin)).
    pub(crate) fn twin(&self) -> ClusterNode {
        ClusterNode {
            client: self.client.clone(),
            seeds: self.seeds.clone(),
            addr: self.addr.clone(),
            min_replicas: self.min_replicas,
            connection: self.connection.twin(),
        }
    }

    /// Plain clients for the seed nodes, for the wake-up subscriptions.
    pub(crate) fn seed_clients(&self) -> Vec<redis::Client> {
        self.seeds.clone()
    }

    /// The seed nodes' addresses, for messages.
    pub(crate) fn addr(&self) -> &str {
        &self.addr
    }
}

impl Server for ClusterNode {
    type Conn = ClusterConnection;

    fn addr(&self) -> &str {
        &self.addr
    }

    fn min_replicas(&self) -> Option<MinReplicas> {
        self.min_replicas
    }

    fn call<'a, T, F, Fut>(
        &'a self,
        limit: Duration,
        retry_on_drop: bool,
        f: F,
    ) -> BoxFuture<'a, Result<T, LockError>>
    where
        T: Send + 'a,
        F: Fn(ClusterConnection) -> Fut + Send + Sync + 'a,
        Fut: Future<Output = redis::RedisResult<T>> + Send + 'a,
    {
        Box::pin(async move {
            let failure = |e: redis::RedisError| {
                if e.is_unrecoverable_error() {
                    connection::lost(&self.addr, e)
                } else {
                    Failure::Answer(from_redis(e))
                }
            };
            let open = || {
                let client = self.client.clone();
                async move { client.get_async_connection().await }
            };
            self.connection
                .call(&self.addr, limit, retry_on_drop, open, failure, f)
                .await
        })
    }
}

/// Several keys on a cluster, all or none: the keys of one hash slot in one
/// script, the slots one after another in the keys' canonical order (the
/// order of each slot's first key). When a slot's keys are held, the slots
/// already taken are released again (compare-and-delete, so nobody else's
/// key is touched) and the attempt is busy; so is a failure, which
/// releases in the same way.
pub(crate) async fn acquire_all(
    node: &ClusterNode,
    keys: &[LockKeys<'_>],
    token: &Token,
    ttl: Duration,
    writer_for: Duration,
    limit: Duration,
) -> Result<Several, LockError> {
    let started = tokio::time::Instant::now();
    let groups = by_slot(keys);
    let fenced = keys.iter().all(|k| k.fence.is_some());
    let mut fences = vec![0u64; if fenced { keys.len() } else { 0 }];
    let mut taken: Vec<&str> = Vec::with_capacity(keys.len());
    for group in &groups {
        let slot_keys: Vec<LockKeys<'_>> = group.iter().map(|&i| keys[i].reborrow()).collect();
        let left = limit.saturating_sub(started.elapsed());
        let answer = node
            .acquire_all(&slot_keys, token, ttl, writer_for, left)
            .await;
        match answer {
            Ok(Several::Granted(got)) => {
                for (&i, fence) in group.iter().zip(got) {
                    if let Some(slot) = fences.get_mut(i) {
                        *slot = fence;
                    }
                }
                taken.extend(group.iter().map(|&i| keys[i].lock));
            }
            other => {
                // Undo within the same bound as a release; the keys taken
                // expire by themselves should this fail too.
                let undo = taken
                    .iter()
                    .map(|key| node.release(key, token, limit.max(Duration::from_millis(1))));
                futures::future::join_all(undo).await;
                return match other {
                    Ok(Several::Busy { at }) => Ok(Several::Busy {
                        at: group[at.min(group.len() - 1)],
                    }),
                    Ok(Several::Granted(_)) => Ok(Several::Busy { at: group[0] }),
                    Err(e) => Err(e),
                };
            }
        }
    }
    Ok(Several::Granted(fences))
}

/// The indexes of `keys` grouped by hash slot, each group in canonical
/// order, the groups in the order of their first key.
fn by_slot(keys: &[LockKeys<'_>]) -> Vec<Vec<usize>> {
    let mut groups: Vec<(Slot, Vec<usize>)> = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        let slot = Slot::for_key(key.lock);
        match groups.iter_mut().find(|(s, _)| *s == slot) {
            Some((_, group)) => group.push(i),
            None => groups.push((slot, vec![i])),
        }
    }
    groups.into_iter().map(|(_, group)| group).collect()
}

/// The error for a cluster connection that could not be opened: a refusal
/// (a wrong password) keeps its own explanation.
fn connect_error(addr: &str, err: redis::RedisError) -> LockError {
    let err = from_redis(err);
    if err.kind() == ErrorKind::Unavailable {
        err.with_message(format!("cannot connect to {addr}"))
    } else {
        err
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
