//! The minimum lock: the least work a correct Redis lock can do, as the
//! yardstick lock-core is measured against.
//!
//! Acquire is one `SET key token NX PX ttl`; release is one `EVALSHA` of a
//! compare-and-delete script loaded when connecting. Several keys at once
//! (W8, one server) are one `EVALSHA` that sets them all or none, and one
//! that compares and deletes each. One multiplexed
//! connection per server, shared by every task; no renewal, no retries, no
//! validity bookkeeping. Tokens are a process id and a counter: unique, but
//! (unlike a real lock's) guessable, which costs nothing here.
//!
//! On TLS the one connection is the same multiplexed connection over
//! `rediss://`; on a cluster it is the `redis` crate's cluster connection,
//! which routes each command by its key's slot (the scripts are loaded on
//! every primary). The commands are the same on every transport.
//!
//! With several servers (W4) every command goes to all of them at once and
//! the lock is held as soon as a majority said yes (as lock-core does; the
//! commands to the others are on their way, and the connections' driver
//! tasks carry them out); a failed majority releases whatever was taken.

use crate::endpoint::Endpoint;
use crate::error::{BenchResult, fail};
use crate::servers::{connect, connect_cluster, connect_tls};
use futures::future::join_all;
use redis::aio::MultiplexedConnection;
use redis::cluster_async::ClusterConnection;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Deletes the key only if it still holds the token (`KEYS[1]`, `ARGV[1]`).
const RELEASE_SCRIPT: &str = r#"if redis.call("GET", KEYS[1]) == ARGV[1] then
  return redis.call("DEL", KEYS[1])
end
return 0"#;

/// Sets every key (`KEYS`) to the token (`ARGV[1]`) with the ttl in
/// milliseconds (`ARGV[2]`) when none exists; otherwise sets none. 1 when
/// set.
const ACQUIRE_ALL_SCRIPT: &str = r#"for i = 1, #KEYS do
  if redis.call("EXISTS", KEYS[i]) == 1 then
    return 0
  end
end
for i = 1, #KEYS do
  redis.call("SET", KEYS[i], ARGV[1], "PX", ARGV[2])
end
return 1"#;

/// Deletes each key (`KEYS`) that still holds the token (`ARGV[1]`);
/// returns how many it deleted.
const RELEASE_ALL_SCRIPT: &str = r#"local n = 0
for i = 1, #KEYS do
  if redis.call("GET", KEYS[i]) == ARGV[1] then
    n = n + redis.call("DEL", KEYS[i])
  end
end
return n"#;

/// A connection of the `redis` crate that the minimum sends its commands on.
#[derive(Clone)]
pub enum Link {
    /// Multiplexed, to one server, over plain TCP or TLS.
    Server(MultiplexedConnection),
    /// The cluster connection.
    Cluster(ClusterConnection),
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Link::Server(_) => "Link::Server",
            Link::Cluster(_) => "Link::Cluster",
        })
    }
}

impl redis::aio::ConnectionLike for Link {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        match self {
            Link::Server(conn) => conn.req_packed_command(cmd),
            Link::Cluster(conn) => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        match self {
            Link::Server(conn) => conn.req_packed_commands(pipeline, offset, count),
            Link::Cluster(conn) => conn.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Link::Server(conn) => conn.get_db(),
            Link::Cluster(conn) => conn.get_db(),
        }
    }
}

/// A hand-written lock on one server, or on a majority of several.
#[derive(Debug)]
pub struct MinimumLock {
    nodes: Vec<Link>,
    release_sha: String,
    /// The scripts of several keys at once (W8; one server only).
    acquire_all_sha: String,
    release_all_sha: String,
    process: u32,
    counter: AtomicU64,
}

impl MinimumLock {
    /// Connects to `endpoint` (each server of a plain one) and loads the
    /// scripts (on a cluster, `SCRIPT LOAD` goes to every primary).
    pub async fn connect_to(endpoint: &Endpoint) -> BenchResult<MinimumLock> {
        let links = match endpoint {
            Endpoint::Plain(urls) => {
                let mut links = Vec::with_capacity(urls.len());
                for url in urls {
                    links.push(Link::Server(connect(url).await?));
                }
                links
            }
            Endpoint::Tls { url, ca_pem, .. } => {
                vec![Link::Server(connect_tls(url, ca_pem).await?)]
            }
            Endpoint::Cluster(urls) => vec![Link::Cluster(connect_cluster(urls).await?)],
        };
        if links.is_empty() {
            return Err(fail("the minimum lock needs at least one server"));
        }
        let mut nodes = Vec::with_capacity(links.len());
        let mut shas = [String::new(), String::new(), String::new()];
        for mut conn in links {
            let scripts = [RELEASE_SCRIPT, ACQUIRE_ALL_SCRIPT, RELEASE_ALL_SCRIPT];
            for (sha, script) in shas.iter_mut().zip(scripts) {
                *sha = redis::cmd("SCRIPT")
                    .arg("LOAD")
                    .arg(script)
                    .query_async(&mut conn)
                    .await?;
            }
            nodes.push(conn);
        }
        let [release_sha, acquire_all_sha, release_all_sha] = shas;
        Ok(MinimumLock {
            nodes,
            release_sha,
            acquire_all_sha,
            release_all_sha,
            process: std::process::id(),
            counter: AtomicU64::new(0),
        })
    }

    /// A token no other acquisition of this run uses.
    pub fn token(&self) -> String {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        format!("{}-{n}", self.process)
    }

    /// One attempt: `SET key token NX PX ttl` (on every server, majority
    /// counted). `Ok(false)` when the lock is held elsewhere.
    pub async fn try_acquire(&self, key: &str, token: &str, ttl: Duration) -> BenchResult<bool> {
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        let set = |node: &Link| {
            let mut conn = node.clone();
            let mut cmd = redis::cmd("SET");
            cmd.arg(key).arg(token).arg("NX").arg("PX").arg(ttl_ms);
            async move { cmd.query_async::<Option<redis::Value>>(&mut conn).await }
        };
        if let [node] = self.nodes.as_slice() {
            return Ok(set(node).await?.is_some());
        }
        if majority_yes(self.nodes.iter().map(set), |reply| {
            matches!(reply, Ok(Some(_)))
        })
        .await
        {
            return Ok(true);
        }
        // Give back the minority we may hold.
        self.release(key, token).await?;
        Ok(false)
    }

    /// Compare-and-delete with `EVALSHA` (on every server). `Ok(true)` when
    /// the lock was ours (on a majority).
    pub async fn release(&self, key: &str, token: &str) -> BenchResult<bool> {
        let del = |node: &Link| {
            let mut conn = node.clone();
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(&self.release_sha).arg(1).arg(key).arg(token);
            async move { cmd.query_async::<i64>(&mut conn).await }
        };
        if let [node] = self.nodes.as_slice() {
            return Ok(del(node).await? == 1);
        }
        Ok(majority_yes(self.nodes.iter().map(del), |reply| matches!(reply, Ok(1))).await)
    }

    /// One attempt on several keys at once, all or none, with one
    /// `EVALSHA` (one server only). `Ok(false)` when any key is held.
    pub async fn try_acquire_all(
        &self,
        keys: &[&str],
        token: &str,
        ttl: Duration,
    ) -> BenchResult<bool> {
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(&self.acquire_all_sha).arg(keys.len()).arg(keys);
        cmd.arg(token).arg(ttl_ms);
        Ok(cmd.query_async::<i64>(&mut self.single()?).await? == 1)
    }

    /// Compare-and-delete of several keys with one `EVALSHA` (one server
    /// only). `Ok(true)` when every key was still ours.
    pub async fn release_all(&self, keys: &[&str], token: &str) -> BenchResult<bool> {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(&self.release_all_sha).arg(keys.len()).arg(keys);
        cmd.arg(token);
        let deleted = cmd.query_async::<usize>(&mut self.single()?).await?;
        Ok(deleted == keys.len())
    }

    /// The connection of the one server, for the scripts of several keys.
    fn single(&self) -> BenchResult<Link> {
        match self.nodes.as_slice() {
            [node] => Ok(node.clone()),
            _ => Err(fail("the minimum locks several keys on one server only")),
        }
    }

    /// Sequential plain `SET`s as a floor (the cheapest write, one round
    /// trip): to the one server, or to every server at once (one fan-out
    /// counts as one round trip).
    pub async fn floor(&self) -> BenchResult<()> {
        let ping = |node: &Link| {
            let mut conn = node.clone();
            async move {
                redis::cmd("SET")
                    .arg("bench:floor")
                    .arg("1")
                    .query_async::<()>(&mut conn)
                    .await
            }
        };
        if let [node] = self.nodes.as_slice() {
            ping(node).await?;
            return Ok(());
        }
        for reply in join_all(self.nodes.iter().map(ping)).await {
            reply?;
        }
        Ok(())
    }
}

/// The floor without a client library: plain `SET`s written to and read
/// from a bare socket by the calling task, one at a time. What a round trip
/// costs when nothing but the kernel and the server sit between the
/// command and its reply; lock-core's own connection does the same steps.
#[derive(Debug)]
pub struct RawFloor {
    stream: tokio::sync::Mutex<tokio::net::TcpStream>,
}

impl RawFloor {
    /// Connects to the server of `url` (plain TCP, no password).
    pub async fn connect(url: &str) -> BenchResult<RawFloor> {
        let info = redis::IntoConnectionInfo::into_connection_info(url)?;
        let redis::ConnectionAddr::Tcp(host, port) = info.addr() else {
            return Err(fail("the raw floor needs a redis://host:port URL"));
        };
        let stream = tokio::net::TcpStream::connect((host.as_str(), *port)).await?;
        stream.set_nodelay(true)?;
        Ok(RawFloor {
            stream: tokio::sync::Mutex::new(stream),
        })
    }

    /// One `SET bench:floor 1` round trip.
    pub async fn round_trip(&self) -> BenchResult<()> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        const SET: &[u8] = b"*3\r\n$3\r\nSET\r\n$11\r\nbench:floor\r\n$1\r\n1\r\n";
        const OK: &[u8] = b"+OK\r\n";
        let mut stream = self.stream.lock().await;
        stream.write_all(SET).await?;
        let mut reply = [0u8; 5];
        stream.read_exact(&mut reply).await?;
        if reply != OK {
            return Err(fail(format!("the raw floor's SET was answered {reply:?}")));
        }
        Ok(())
    }
}

/// Whether a majority of `calls` answered yes: `true` as soon as one has,
/// `false` once every call has answered without one. Calls still running
/// are dropped: their commands are already with the connections' drivers.
async fn majority_yes<T>(
    calls: impl IntoIterator<Item = impl std::future::Future<Output = T>>,
    yes: impl Fn(&T) -> bool,
) -> bool {
    use futures::StreamExt;
    let mut pending: futures::stream::FuturesUnordered<_> = calls.into_iter().collect();
    let needed = pending.len() / 2 + 1;
    let mut yeses = 0;
    while let Some(answer) = pending.next().await {
        yeses += usize::from(yes(&answer));
        if yeses >= needed {
            return true;
        }
    }
    false
}
