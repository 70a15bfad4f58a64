//! Whether the servers may evict lock keys, read when a client is built.
//!
//! With `maxmemory` set, every policy but `noeviction` evicts keys when
//! memory runs out: `allkeys-*` any key, `volatile-*` keys with an expiry,
//! which every lock key has. An evicted lock is free at once, and its
//! holder learns of it at its next renewal: for up to one renewal interval
//! (a third of the ttl) two holders believe they hold it. `INFO memory`
//! says (`maxmemory`, `maxmemory_policy`), also where `CONFIG GET` is
//! refused, as managed services do.

use crate::backend::{Backend, Server};
use crate::error::{ErrorKind, LockError};
use futures::future::join_all;
use std::fmt;
use std::time::Duration;

/// A server's memory settings, as `INFO memory` gives them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MemoryPolicy {
    /// `maxmemory`, in bytes; 0 is no limit.
    pub(crate) maxmemory: u64,
    /// `maxmemory_policy`: `noeviction`, `allkeys-lru`, `volatile-ttl`, ...
    pub(crate) policy: String,
}

impl MemoryPolicy {
    /// The settings in the text of an `INFO memory` answer; `None` when
    /// it names neither.
    pub(crate) fn parse(info: &str) -> Option<MemoryPolicy> {
        let field = |name: &str| {
            info.lines()
                .filter_map(|line| line.trim_end().split_once(':'))
                .find(|(key, _)| *key == name)
                .map(|(_, value)| value.to_owned())
        };
        Some(MemoryPolicy {
            maxmemory: field("maxmemory")?.parse().ok()?,
            policy: field("maxmemory_policy")?,
        })
    }

    /// Whether the server evicts keys when memory runs out: a limit, and a
    /// policy other than `noeviction` (every `allkeys-*` and `volatile-*`
    /// one, and any policy lock-core does not know of).
    pub(crate) fn evicts(&self) -> bool {
        self.maxmemory > 0 && self.policy != "noeviction"
    }
}

impl fmt::Display for MemoryPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "maxmemory-policy {} with maxmemory {} bytes",
            self.policy, self.maxmemory
        )
    }
}

/// `INFO memory` on one server.
async fn read<S: Server>(server: &S, limit: Duration) -> Result<MemoryPolicy, LockError> {
    let info: String = server
        .call(limit, true, |mut conn| async move {
            redis::cmd("INFO")
                .arg("memory")
                .query_async(&mut conn)
                .await
        })
        .await?;
    MemoryPolicy::parse(&info).ok_or_else(|| {
        LockError::new(ErrorKind::Server)
            .with_message("INFO memory named no maxmemory and maxmemory_policy")
    })
}

/// What each server answered, with its address: the one server (Sentinel's
/// primary for Sentinel), each Redlock server, each primary of a Cluster.
async fn read_all(
    backend: &Backend,
    limit: Duration,
) -> Vec<(String, Result<MemoryPolicy, LockError>)> {
    match backend {
        Backend::Single(node) => vec![(node.addr().to_owned(), read(node, limit).await)],
        Backend::Redlock(quorum) => {
            let reads = quorum.nodes().iter().map(|node| read(node, limit));
            let addrs = quorum.nodes().iter().map(|node| node.addr().to_owned());
            addrs.zip(join_all(reads).await).collect()
        }
        Backend::Cluster(cluster) => match cluster.primaries(limit).await {
            Ok(primaries) => {
                let reads = primaries.iter().map(|node| read(node.as_ref(), limit));
                let addrs = primaries.iter().map(|node| node.addr().to_owned());
                addrs.zip(join_all(reads).await).collect()
            }
            Err(e) => vec![(cluster.addr().to_owned(), Err(e))],
        },
        Backend::Memory(_) => Vec::new(),
    }
}

/// What an evicted lock costs, and what to change: the text of both the
/// warning and the refusal.
const WINDOW: &str = "an evicted lock is free at once and its holder learns of it at its \
                      next renewal, up to one renewal interval (a third of the ttl) later: \
                      two holders meanwhile; set maxmemory-policy noeviction (or no \
                      maxmemory) on these servers";

/// Reads the memory settings of `backend`'s servers. A server that may
/// evict gets one warning for all of them, or, with `refuse`, fails the
/// build with [`ErrorKind::Config`] naming its policy. A server that does
/// not answer `INFO` (an ACL without `+info`) is passed over with a debug
/// log, unless `refuse` asked for the check: then the build fails with
/// that error, saying so.
pub(crate) async fn check(
    backend: &Backend,
    limit: Duration,
    refuse: bool,
) -> Result<(), LockError> {
    let answers = read_all(backend, limit).await;
    let mut evicting = Vec::new();
    for (addr, answer) in answers {
        match answer {
            Ok(policy) if policy.evicts() => evicting.push(format!("{addr} ({policy})")),
            Ok(_) => {}
            Err(e) if refuse => {
                let reason = e.to_string();
                return Err(e.with_message(format!(
                    "refuse_evicting_servers(true) needs each server's INFO memory, and \
                     {addr} did not answer it: grant the user +info (ACL SETUSER <user> \
                     +info), or leave refuse_evicting_servers off; {reason}"
                )));
            }
            Err(e) => {
                tracing::debug!(server = %addr, error = %e.chain(), "cannot read INFO memory, eviction not checked");
            }
        }
    }
    if evicting.is_empty() {
        return Ok(());
    }
    let servers = evicting.join(", ");
    if refuse {
        return Err(LockError::config(format!(
            "the server may evict lock keys: {servers}; {WINDOW} \
             (refused by refuse_evicting_servers(true))"
        )));
    }
    tracing::warn!(
        servers = %servers,
        "the server may evict lock keys; {WINDOW}, or refuse such servers with \
         LockClientBuilder::refuse_evicting_servers(true)"
    );
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn info_memory_is_read_and_judged() {
        let info = "# Memory\r\nused_memory:1000\r\nmaxmemory:10485760\r\n\
                    maxmemory_human:10.00M\r\nmaxmemory_policy:volatile-lru\r\n";
        let policy = MemoryPolicy::parse(info).unwrap();
        assert_eq!(policy.maxmemory, 10_485_760);
        assert_eq!(policy.policy, "volatile-lru");
        assert!(policy.evicts());
        let unlimited = MemoryPolicy {
            maxmemory: 0,
            policy: "allkeys-lru".to_owned(),
        };
        assert!(!unlimited.evicts());
        let refusing = MemoryPolicy {
            maxmemory: 1,
            policy: "noeviction".to_owned(),
        };
        assert!(!refusing.evicts());
        assert_eq!(MemoryPolicy::parse("# Memory\r\nused_memory:1\r\n"), None);
    }
}
