//! `--rtt`: W1 and W2 through lock-testkit's proxy, which holds every chunk
//! for half the round trip in each direction, and the round trip measured
//! through it.

use crate::endpoint::Endpoint;
use crate::error::{BenchResult, fail};
use crate::servers::{connect, connect_tls};
use crate::transport::Transport;
use lock_testkit::{Proxy, ProxyMode};
use redis::aio::MultiplexedConnection;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// `PING`s timed through the proxy, and straight to the server, after a few
/// unmeasured ones.
pub const PINGS: usize = 200;

/// Bound on each `PING` of the measurement.
const PING_BOUND: Duration = Duration::from_secs(5);

/// What one transport's network measured.
#[derive(Clone, Debug)]
pub struct NetworkNote {
    /// The transport W1 and W2 ran on through the proxy.
    pub transport: Transport,
    /// The round trip asked for (`--rtt`).
    pub rtt: Duration,
    /// Median `PING` round trip through the proxy, on a connection of the
    /// `redis` crate (as the minimum's), µs.
    pub proxied_us: f64,
    /// The same straight to the server, µs.
    pub direct_us: f64,
}

impl NetworkNote {
    /// The line printed under the machine, and at the end of W1's and W2's
    /// parameters.
    pub fn describe(&self) -> String {
        format!(
            "rtt {} ms asked (lock-testkit's proxy holds each chunk {} ms each way); \
             PING through the proxy {:.3} ms, straight to the server {:.3} ms (medians of \
             {PINGS}, the redis crate)",
            millis(self.rtt),
            millis(self.rtt / 2),
            self.proxied_us / 1_000.0,
            self.direct_us / 1_000.0
        )
    }
}

/// The proxy of one transport: W1 and W2 connect to [`endpoint`](Self::endpoint)
/// while it lives.
#[derive(Debug)]
pub struct Network {
    /// Kept for its lifetime: dropping it closes every connection.
    _proxy: Proxy,
    /// Where the rows connect: the proxy.
    pub endpoint: Endpoint,
    /// The round trip measured.
    pub note: NetworkNote,
}

impl Network {
    /// Starts a proxy in front of the server `endpoint` names (plain or TLS;
    /// a cluster is refused by the arguments), delaying each direction by
    /// `rtt / 2`, and measures `PING` through it and around it.
    pub async fn start(
        rtt: Duration,
        transport: Transport,
        endpoint: &Endpoint,
    ) -> BenchResult<Network> {
        let (url, rewrite): (&str, fn(&Endpoint, String) -> Endpoint) = match endpoint {
            Endpoint::Plain(urls) => match urls.as_slice() {
                [url] => (url, |_, url| Endpoint::Plain(vec![url])),
                _ => return Err(fail("--rtt runs against one server")),
            },
            Endpoint::Tls { url, .. } => (url, |endpoint, proxied| match endpoint {
                Endpoint::Tls {
                    ca_pem, admin_url, ..
                } => Endpoint::Tls {
                    url: proxied,
                    ca_pem: ca_pem.clone(),
                    admin_url: admin_url.clone(),
                },
                other => other.clone(),
            }),
            Endpoint::Cluster(_) => return Err(fail("--rtt runs on plain and tls only")),
        };
        let (scheme, upstream) = split_url(url)?;
        let proxy = tokio::task::block_in_place(|| Proxy::try_start(upstream))?;
        proxy.set_mode(if rtt.is_zero() {
            ProxyMode::Pass
        } else {
            ProxyMode::Delay(rtt / 2)
        });
        let proxied = rewrite(endpoint, format!("{scheme}://{}", proxy.addr()));
        let note = NetworkNote {
            transport,
            rtt,
            proxied_us: median_ping_us(&proxied).await?,
            direct_us: median_ping_us(endpoint).await?,
        };
        eprintln!("lock-bench: {} {}", transport.name(), note.describe());
        Ok(Network {
            _proxy: proxy,
            endpoint: proxied,
            note,
        })
    }
}

/// `scheme` and `host:port` of a URL such as `redis://127.0.0.1:6400`.
fn split_url(url: &str) -> BenchResult<(&str, SocketAddr)> {
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| fail(format!("{url:?} has no scheme")))?;
    let authority = rest.split('/').next().unwrap_or(rest);
    let addr = authority
        .parse()
        .map_err(|_| fail(format!("--rtt needs a URL of host:port, not {url:?}")))?;
    Ok((scheme, addr))
}

/// The median of [`PINGS`] sequential `PING`s on one connection of the
/// `redis` crate to the server `endpoint` names (plain or TLS), µs.
async fn median_ping_us(endpoint: &Endpoint) -> BenchResult<f64> {
    let mut conn: MultiplexedConnection = match endpoint {
        Endpoint::Plain(urls) => connect(urls.first().map_or("", String::as_str)).await?,
        Endpoint::Tls { url, ca_pem, .. } => connect_tls(url, ca_pem).await?,
        Endpoint::Cluster(_) => return Err(fail("--rtt runs on plain and tls only")),
    };
    let mut times = Vec::with_capacity(PINGS);
    let command = redis::cmd("PING");
    for i in 0..PINGS + 20 {
        let started = Instant::now();
        let ping = command.query_async::<String>(&mut conn);
        match tokio::time::timeout(PING_BOUND, ping).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(e.into()),
            Err(_) => return Err(fail(format!("PING did not answer within {PING_BOUND:?}"))),
        }
        if i >= 20 {
            times.push(started.elapsed().as_secs_f64() * 1e6);
        }
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

/// A duration in milliseconds without trailing zeros.
fn millis(d: Duration) -> String {
    let text = format!("{:.3}", d.as_secs_f64() * 1_000.0);
    text.trim_end_matches('0').trim_end_matches('.').to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_split_into_scheme_and_address() {
        let Ok((scheme, addr)) = split_url("rediss://127.0.0.1:6400") else {
            panic!("a URL of host:port splits");
        };
        assert_eq!((scheme, addr.port()), ("rediss", 6400));
        assert!(split_url("redis://localhost").is_err());
        assert!(split_url("127.0.0.1:1").is_err());
        assert_eq!(millis(Duration::from_micros(250)), "0.25");
    }
}
