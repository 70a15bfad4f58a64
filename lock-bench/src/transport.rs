//! The transports W1 and W2 run on: plain TCP to one server, TLS to one
//! server, or a cluster of three primaries.
//!
//! Every row of one transport talks to the same deployment the same way:
//! the minimum through the `redis` crate (a multiplexed connection, over
//! `rediss://` with the test CA for TLS; the crate's cluster connection for
//! a cluster), lock-core through its builder (`url` +
//! `tls_root_certificate`, or `cluster`). Rows that need something a
//! transport does not have are left out on it, never run on another one:
//! see [`Transport::runs`].

use crate::contenders::Impl;
pub use crate::endpoint::Endpoint;
use crate::error::{BenchResult, fail};
use lock_testkit::{RedisCluster, RedisServer, TestCertificates};

/// How the measured rows reach Redis.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// Plain TCP to one server.
    Plain,
    /// TLS (`rediss://`) to one server, trusting the test CA.
    Tls,
    /// A cluster of three primaries, no replicas.
    Cluster,
}

impl Transport {
    /// Every transport, in the order a run measures them.
    pub const ALL: [Transport; 3] = [Transport::Plain, Transport::Tls, Transport::Cluster];

    /// The name on the command line and in the output.
    pub fn name(self) -> &'static str {
        match self {
            Transport::Plain => "plain",
            Transport::Tls => "tls",
            Transport::Cluster => "cluster",
        }
    }

    /// The transport named `name` (any case).
    pub fn parse(name: &str) -> Option<Transport> {
        Transport::ALL
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(name))
    }

    /// Whether `imp` can run on this transport. The raw floor writes to a
    /// bare TCP socket, so it runs on plain TCP only; rslock is built from
    /// plain clients of single servers (no custom CA, no cluster), so it
    /// is left out of TLS and cluster rather than measured on something
    /// else.
    pub fn runs(self, imp: Impl) -> bool {
        match imp {
            Impl::RawFloor | Impl::Rslock => self == Transport::Plain,
            Impl::Floor | Impl::Minimum | Impl::Guard | Impl::Attribute => true,
        }
    }

    /// The heading text of a workload on this transport: what it talks
    /// over, and which of `rows` are left out and why.
    pub fn describe(self, rows: &[Impl]) -> String {
        let over = match self {
            Transport::Plain => "plain TCP, 1 server",
            Transport::Tls => "TLS (rediss://, the test CA as the only root), 1 server",
            Transport::Cluster => {
                "cluster of 3 primaries (the redis crate's cluster connection for the minimum \
                 and the floor)"
            }
        };
        let left_out: Vec<&str> = rows
            .iter()
            .filter(|imp| !self.runs(**imp))
            .map(|imp| imp.label())
            .collect();
        if left_out.is_empty() {
            format!("transport {}: {over}", self.name())
        } else {
            format!(
                "transport {}: {over}; left out: {} (plain TCP only)",
                self.name(),
                left_out.join(", ")
            )
        }
    }
}

/// The servers of one transport other than plain; dropping it stops them.
#[derive(Debug)]
pub enum TransportServers {
    /// A server with a TLS port, and the certificates it was given (boxed:
    /// the other variant is a few pointers).
    Tls(Box<(RedisServer, TestCertificates)>),
    /// A cluster.
    Cluster(RedisCluster),
}

impl TransportServers {
    /// Starts the servers of `transport` (`None` for plain: the run's
    /// single server is used).
    pub fn start(transport: Transport) -> BenchResult<Option<TransportServers>> {
        match transport {
            Transport::Plain => Ok(None),
            Transport::Tls => {
                let certs = TestCertificates::try_generate()?;
                match RedisServer::builder().tls(&certs).try_start() {
                    Ok(server) => Ok(Some(TransportServers::Tls(Box::new((server, certs))))),
                    Err(e) if e.log_tail().is_some_and(|log| log.contains("TLS support")) => {
                        Err(fail(format!(
                            "--transport tls: this redis-server was built without TLS support \
                             (build it with BUILD_TLS=yes, or point REDIS_SERVER_BIN at one \
                             that has it)\n{e}"
                        )))
                    }
                    Err(e) => Err(e.into()),
                }
            }
            Transport::Cluster => Ok(Some(TransportServers::Cluster(RedisCluster::try_start(
                3, 0,
            )?))),
        }
    }

    /// Where the rows connect.
    pub fn endpoint(&self) -> Endpoint {
        match self {
            TransportServers::Tls(tls) => Endpoint::Tls {
                url: tls.0.tls_url(),
                ca_pem: tls.1.ca_pem().to_owned(),
                admin_url: tls.0.url(),
            },
            TransportServers::Cluster(cluster) => Endpoint::Cluster(cluster.urls()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_in_any_case() {
        for t in Transport::ALL {
            assert_eq!(Transport::parse(t.name()), Some(t));
            assert_eq!(Transport::parse(&t.name().to_uppercase()), Some(t));
        }
        assert_eq!(Transport::parse("unix"), None);
    }

    #[test]
    fn raw_floor_and_rslock_run_on_plain_tcp_only() {
        for t in [Transport::Tls, Transport::Cluster] {
            assert!(!t.runs(Impl::RawFloor));
            assert!(!t.runs(Impl::Rslock));
            assert!(t.runs(Impl::Minimum) && t.runs(Impl::Attribute));
            assert!(
                t.describe(&Impl::ALL)
                    .contains("left out: floor (raw socket), rslock")
            );
        }
        assert!(Impl::ALL.into_iter().all(|imp| Transport::Plain.runs(imp)));
        assert!(!Transport::Plain.describe(&Impl::ALL).contains("left out"));
    }
}
