//! Test support for the distributed-lock crates: throwaway `redis-server`
//! processes and a fault-injecting TCP proxy.
//!
//! # Servers
//!
//! [`RedisServer::start`] spawns a private `redis-server` (found through
//! [`redis_server_binary`]) on a free port of `127.0.0.1`, in a temporary
//! directory of its own, and returns once it answers. Tests never touch a
//! shared server on 6379. The handle can then:
//!
//! - hand out its [`url`](RedisServer::url), a synchronous
//!   [`connection`](RedisServer::connection), or run a one-shot
//!   [`cmd`](RedisServer::cmd) for assertions;
//! - crash it ([`stop`](RedisServer::stop): `SIGKILL`, data lost), or
//!   snapshot and crash it ([`save_and_stop`](RedisServer::save_and_stop)),
//!   then bring it back on the same port ([`restart`](RedisServer::restart),
//!   [`restart_empty`](RedisServer::restart_empty));
//! - freeze it ([`pause`](RedisServer::pause): `SIGSTOP`, undone with
//!   `SIGCONT` when the returned [`PauseGuard`] drops, even on panic).
//!
//! Dropping a [`RedisServer`] kills and reaps its process and deletes its
//! directory, so no process outlives the test. [`start_servers`] starts
//! several at once, for Redlock tests. Failures carry the server log.
//!
//! # Replication and Sentinel
//!
//! [`ServerBuilder::replica_of`] starts a replica of another server
//! ([`RedisServer::wait_replica_synced`] waits for its initial sync), and
//! [`SentinelServer::start`] a Redis Sentinel monitoring a primary, with
//! short failure-detection times for tests; it can be asked which server is
//! primary ([`SentinelServer::wait_for_primary`]).
//!
//! # Cluster
//!
//! [`RedisCluster::start`] starts `redis-server`s in cluster mode, joins
//! them with `redis-cli --cluster create` (found through
//! [`redis_cli_binary`]) and waits until every node reports
//! `cluster_state:ok`; it tells which node serves a key
//! ([`RedisCluster::primary_of_key`]), and its nodes can be stopped to force
//! a failover ([`RedisCluster::wait_ready`] waits for it).
//!
//! # TLS
//!
//! [`TestCertificates::generate`] makes a private CA, a server certificate
//! for `127.0.0.1`/`localhost`, a client certificate and an unrelated CA
//! with the `openssl` command; [`ServerBuilder::tls`] starts a server that
//! also serves TLS on [`RedisServer::tls_port`] (`rediss://` at
//! [`RedisServer::tls_url`]), optionally requiring client certificates.
//!
//! # Network faults
//!
//! A [`Proxy`] sits between a client and a server and can pass traffic,
//! delay it, blackhole it (connections hang) or [`cut`](Proxy::cut) every
//! connection. It runs on its own thread and runtime, independent of the
//! test's runtime.
//!
//! # Jepsen-style runs
//!
//! [`jepsen`] has what a multi-process test of a lock needs: worker
//! processes and their history, a register that checks fencing tokens, and
//! a checker of the history against the register.
//!
//! # Worker processes
//!
//! [`Flags`] reads a worker binary's command line (`--name value` pairs and
//! bare switches) and rejects a flag nobody asked for.
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//! use lock_testkit::{Proxy, ProxyMode, RedisServer};
//!
//! let mut server = RedisServer::start();
//! let _: () = server.cmd(&["SET", "k", "v", "PX", "60000"]);
//! assert!(server.cmd::<i64>(&["PTTL", "k"]) > 0);
//!
//! server.save_and_stop();
//! server.restart();
//! assert_eq!(server.cmd::<Option<String>>(&["GET", "k"]).as_deref(), Some("v"));
//!
//! let proxy = Proxy::start(server.addr());
//! proxy.set_mode(ProxyMode::Delay(Duration::from_millis(50)));
//! // ... point the code under test at proxy.url() ...
//! proxy.set_mode(ProxyMode::Blackhole);
//! proxy.cut();
//! ```
//!
//! # Requirements
//!
//! A `redis-server` binary (set `REDIS_SERVER_BIN` or put it on `PATH`) and
//! the `kill` command, on a Unix system. For TLS, a `redis-server` built with
//! TLS (Debian's is) and the `openssl` command (or `OPENSSL_BIN`).

mod binary;
mod cluster;
mod error;
mod flags;
pub mod jepsen;
mod probe;
mod proxy;
mod sentinel;
mod server;
mod signal;
mod tls;

pub use binary::{REDIS_CLI_BIN_ENV, REDIS_SERVER_BIN_ENV, redis_cli_binary, redis_server_binary};
pub use cluster::RedisCluster;
pub use error::TestkitError;
pub use flags::Flags;
pub use proxy::{Proxy, ProxyMode};
pub use sentinel::SentinelServer;
pub use server::{PauseGuard, RedisServer, ServerBuilder, start_servers, try_start_servers};
pub use tls::{OPENSSL_BIN_ENV, TestCertificates};
