//! The bench's own `redis-server` processes, `INFO`, and the command counts
//! of `INFO commandstats`.
//!
//! Servers come from `lock-testkit`: each runs on a free port of
//! `127.0.0.1` in a temporary directory and is killed and reaped when its
//! [`RedisServer`] handle drops. [`Servers`] owns every handle for the whole
//! run, so they are dropped on every path out of it, errors included.

use crate::error::{BenchResult, fail};
use lock_testkit::{RedisServer, try_start_servers};
use redis::aio::MultiplexedConnection;
use redis::cluster_async::ClusterConnection;
use std::collections::BTreeMap;

/// How many primaries the Redlock workload (W4) uses.
pub const REDLOCK_NODES: usize = 5;

/// Every server of a run.
#[derive(Debug)]
pub struct Servers {
    /// The single server of W1, W2, W3, W3p and W6.
    pub single: RedisServer,
    /// The independent primaries of W4 (empty when W4 is not run).
    pub redlock: Vec<RedisServer>,
    /// W5's own server, so its keys and command counters start clean
    /// (`None` when W5 is not run).
    pub hold: Option<RedisServer>,
}

impl Servers {
    /// Starts one server, plus five for Redlock when `redlock`, plus one for
    /// W5 when `hold`, all in parallel.
    pub fn start(redlock: bool, hold: bool) -> BenchResult<Servers> {
        let wanted = 1 + if redlock { REDLOCK_NODES } else { 0 } + usize::from(hold);
        let mut started = try_start_servers(wanted)?.into_iter();
        let single = started
            .next()
            .ok_or_else(|| fail("no server was started"))?;
        let hold = if hold { started.next() } else { None };
        Ok(Servers {
            single,
            redlock: started.collect(),
            hold,
        })
    }

    /// The URLs of the Redlock primaries.
    pub fn redlock_urls(&self) -> Vec<String> {
        self.redlock.iter().map(RedisServer::url).collect()
    }
}

/// One multiplexed connection (the `redis` crate's shared, pipelining
/// connection) to `url`.
pub async fn connect(url: &str) -> BenchResult<MultiplexedConnection> {
    let client = redis::Client::open(url)?;
    Ok(client.get_multiplexed_async_connection().await?)
}

/// One multiplexed connection over TLS to the `rediss://` `url`, trusting
/// `ca_pem` (and nothing else).
pub async fn connect_tls(url: &str, ca_pem: &str) -> BenchResult<MultiplexedConnection> {
    let certificates = redis::TlsCertificates {
        client_tls: None,
        root_cert: Some(ca_pem.as_bytes().to_vec()),
    };
    let client = redis::Client::build_with_tls(url, certificates)?;
    Ok(client.get_multiplexed_async_connection().await?)
}

/// The `redis` crate's cluster connection (one multiplexed connection per
/// node, commands routed by key slot), seeded with `urls`.
pub async fn connect_cluster(urls: &[String]) -> BenchResult<ClusterConnection> {
    let client = redis::cluster::ClusterClient::new(urls.to_vec())?;
    Ok(client.get_async_connection().await?)
}

/// `INFO section`, as field → value.
pub async fn info(
    conn: &mut MultiplexedConnection,
    section: &str,
) -> BenchResult<BTreeMap<String, String>> {
    let text: String = redis::cmd("INFO").arg(section).query_async(conn).await?;
    Ok(parse_info(&text))
}

/// How many times the server has run each command, by lower-case name,
/// from `INFO commandstats`: the commands clients sent and those Lua scripts
/// ran (`redis.call`) alike. Deltas of two readings count a stretch of time.
pub async fn command_calls(conn: &mut MultiplexedConnection) -> BenchResult<BTreeMap<String, u64>> {
    Ok(calls_of(&info(conn, "commandstats").await?))
}

/// The `calls=` of each `cmdstat_<name>` field.
fn calls_of(stats: &BTreeMap<String, String>) -> BTreeMap<String, u64> {
    stats
        .iter()
        .filter_map(|(field, value)| {
            let name = field.strip_prefix("cmdstat_")?;
            let calls = value
                .split(',')
                .find_map(|part| part.strip_prefix("calls="))?
                .parse()
                .ok()?;
            Some((name.to_owned(), calls))
        })
        .collect()
}

/// The `field:value` lines of an `INFO` reply.
fn parse_info(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| line.split_once(':'))
        .map(|(field, value)| (field.to_owned(), value.trim().to_owned()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_lines_become_fields() {
        let info = parse_info(
            "# Commandstats\r\ncmdstat_evalsha:calls=12,usec=30,usec_per_call=2.50\r\n\
             cmdstat_set:calls=3,usec=1\r\n",
        );
        assert_eq!(
            info.get("cmdstat_evalsha").map(String::as_str),
            Some("calls=12,usec=30,usec_per_call=2.50")
        );
        assert_eq!(info.len(), 2);
    }

    #[test]
    fn commandstats_give_calls_by_command() {
        let info = parse_info(
            "# Commandstats\r\ncmdstat_evalsha:calls=12,usec=30,usec_per_call=2.50\r\n\
             cmdstat_config|resetstat:calls=1,usec=4\r\nused_memory:5\r\n",
        );
        let calls = calls_of(&info);
        assert_eq!(calls.get("evalsha"), Some(&12));
        assert_eq!(calls.get("config|resetstat"), Some(&1));
        assert_eq!(calls.len(), 2);
    }
}
