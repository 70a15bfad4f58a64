//! What the integration tests share: the backends a lock runs on, clients
//! whose failure to connect shows the servers' logs, where a lock's key is
//! stored, and bounded polling.
//!
//! The suite (`tests/suite/main.rs`) and each test binary of its own that
//! needs it say `mod support;`. None of them uses every item, hence
//! `dead_code` allowed for the whole module.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use lock_core::{Backoff, LockClient, LockClientBuilder, MemoryStore};
use lock_testkit::{RedisCluster, RedisServer, SentinelServer, TestCertificates, start_servers};
use std::future::Future;
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// The Redis key that holds lock `key` of a client with key prefix `prefix`
/// (what `LockClient::storage_key` returns). The braces make `key` the hash
/// tag, so a lock and its fence counter share a cluster slot.
pub fn storage_key(prefix: &str, key: &str) -> String {
    format!("{prefix}{{{key}}}")
}

/// The Redis Cluster hash slot of a key whose hash tag is `tag` (so of
/// every lock named `tag`): CRC16 (XMODEM) modulo 16384.
pub fn hash_slot(tag: &str) -> u16 {
    let crc = tag.bytes().fold(0u16, |crc, byte| {
        (0..8).fold(crc ^ (u16::from(byte) << 8), |crc, _| {
            if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            }
        })
    });
    crc % 16384
}

/// How long [`eventually`] waits between two looks.
const POLL_INTERVAL: Duration = Duration::from_millis(10);

/// Polls `check` until it holds; fails the test, naming `what`, once `bound`
/// has passed.
pub async fn eventually(bound: Duration, what: &str, mut check: impl FnMut() -> bool) {
    eventually_async(bound, what, || std::future::ready(check())).await;
}

/// [`eventually`] for a check that awaits (a ping, a lock and release).
pub async fn eventually_async<F, Fut>(bound: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    while !check().await {
        assert!(start.elapsed() < bound, "not within {bound:?}: {what}");
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// Spawns `acquiring` and returns once it has made its first attempt and
/// waits: it has been polled once and is still pending. The task panics if
/// that first poll already completes it.
pub async fn spawn_waiting<T: Send + 'static>(
    acquiring: impl Future<Output = T> + Send + 'static,
) -> JoinHandle<T> {
    let (queued_tx, queued_rx) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        let mut acquiring = std::pin::pin!(acquiring);
        tokio::select! {
            biased;
            _ = &mut acquiring => panic!("acquired while held"),
            () = std::future::ready(()) => {}
        }
        let _ = queued_tx.send(());
        acquiring.await
    });
    queued_rx.await.expect("the waiting task ended early");
    task
}

/// A backoff so slow (5 s between attempts) that only hearing the release
/// gets a waiter in quickly.
pub fn slow_backoff() -> Backoff {
    Backoff::new(Duration::from_secs(5), Duration::from_secs(5))
}

/// How many connections to `server` listen on `channel` (`PUBSUB NUMSUB`).
/// A waiter listens on its lock's storage key for the release.
pub fn subscribers(server: &RedisServer, channel: &str) -> i64 {
    let (_, count): (String, i64) = server.cmd(&["PUBSUB", "NUMSUB", channel]);
    count
}

/// Where a test's locks are stored: what a client builder is pointed at,
/// and the logs that explain a failure to get there.
pub trait Store {
    /// `builder`, pointed at this store.
    fn point(&self, builder: LockClientBuilder) -> LockClientBuilder;

    /// [`point`](Self::point), opening first whatever connection the
    /// builder is to be given: on the current runtime, which drives it.
    async fn connect(&self, builder: LockClientBuilder) -> LockClientBuilder {
        self.point(builder)
    }

    /// The servers' logs, for the message of a failed test.
    fn logs(&self) -> String;
}

impl Store for RedisServer {
    fn point(&self, builder: LockClientBuilder) -> LockClientBuilder {
        builder.url(self.url())
    }

    fn logs(&self) -> String {
        self.log()
    }
}

impl Store for RedisCluster {
    fn point(&self, builder: LockClientBuilder) -> LockClientBuilder {
        builder.cluster(self.urls())
    }

    fn logs(&self) -> String {
        self.nodes().logs()
    }
}

/// Independent servers: Redlock.
impl Store for [RedisServer] {
    fn point(&self, builder: LockClientBuilder) -> LockClientBuilder {
        builder.urls(self.iter().map(RedisServer::url))
    }

    fn logs(&self) -> String {
        self.iter()
            .map(|server| format!("--- {} ---\n{}\n", server.url(), server.log()))
            .collect()
    }
}

impl Store for Vec<RedisServer> {
    fn point(&self, builder: LockClientBuilder) -> LockClientBuilder {
        self.as_slice().point(builder)
    }

    fn logs(&self) -> String {
        self.as_slice().logs()
    }
}

/// A client of `store` whose keys start with `prefix`, with the builder's
/// defaults for everything else.
pub async fn client_for(store: &(impl Store + ?Sized), prefix: &str) -> LockClient {
    client_with(store, LockClient::builder().key_prefix(prefix)).await
}

/// `builder` (the test's key prefix, timeouts and so on) pointed at `store`
/// and built.
pub async fn client_with(store: &(impl Store + ?Sized), builder: LockClientBuilder) -> LockClient {
    build(store.connect(builder).await, store).await
}

/// Builds `builder`, already pointed where it should go (a proxy in front
/// of `store`, say); a failure fails the test with `store`'s logs.
pub async fn build(builder: LockClientBuilder, store: &(impl Store + ?Sized)) -> LockClient {
    builder
        .build()
        .await
        .unwrap_or_else(|e| panic!("building a client failed: {e}\n{}", store.logs()))
}

/// A connection the service already has, of a kind the `redis` crate
/// offers or a pool, given to the builder (`LockClientBuilder::connection`,
/// `LockClientBuilder::pool`, docs/connection.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Given {
    /// `MultiplexedConnection`: broken for good when its socket is.
    Multiplexed,
    /// `ConnectionManager`: reconnects by itself.
    Manager,
    /// A `deadpool_redis::Pool`.
    Deadpool,
    /// A `bb8::Pool` of `bb8_redis`'s connections.
    Bb8,
}

impl Given {
    /// Every kind the tests give.
    pub const ALL: [Given; 4] = [
        Given::Multiplexed,
        Given::Manager,
        Given::Deadpool,
        Given::Bb8,
    ];

    /// What the kind is, in a test's messages.
    pub fn name(self) -> &'static str {
        match self {
            Given::Multiplexed => "a given MultiplexedConnection",
            Given::Manager => "a given ConnectionManager",
            Given::Deadpool => "a given deadpool-redis pool",
            Given::Bb8 => "a given bb8-redis pool",
        }
    }

    /// The connections the `redis` crate offers: driven by a task of the
    /// runtime that opened them.
    pub const CONNECTIONS: [Given; 2] = [Given::Multiplexed, Given::Manager];

    /// The pools: each call checks a connection out, and the pool opens
    /// new ones where it is called.
    pub const POOLS: [Given; 2] = [Given::Deadpool, Given::Bb8];

    /// Whether calls work again by themselves after the connection broke
    /// (its server restarted).
    pub fn reconnects(self) -> bool {
        self != Given::Multiplexed
    }

    /// `builder` over a new connection (or pool) of this kind to `server`,
    /// opened on the current runtime (whose tasks drive it).
    pub async fn point(
        self,
        server: &RedisServer,
        builder: LockClientBuilder,
    ) -> LockClientBuilder {
        let fail =
            |e: &dyn std::fmt::Display| -> ! { panic!("{}: {e}\n{}", self.name(), server.log()) };
        let redis = redis::Client::open(server.url()).unwrap();
        match self {
            Given::Multiplexed => match redis.get_multiplexed_async_connection().await {
                Ok(conn) => builder.connection(conn),
                Err(e) => fail(&e),
            },
            Given::Manager => match redis::aio::ConnectionManager::new(redis).await {
                Ok(conn) => builder.connection(conn),
                Err(e) => fail(&e),
            },
            Given::Deadpool => {
                let config = deadpool_redis::Config::from_url(server.url());
                match config.create_pool(Some(deadpool_redis::Runtime::Tokio1)) {
                    Ok(pool) => builder.pool(pool),
                    Err(e) => fail(&e),
                }
            }
            Given::Bb8 => match bb8_redis::RedisConnectionManager::new(server.url()) {
                Ok(manager) => match bb8_redis::bb8::Pool::builder().build(manager).await {
                    Ok(pool) => builder.pool(pool),
                    Err(e) => fail(&e),
                },
                Err(e) => fail(&e),
            },
        }
    }
}

/// A backend lock-core runs on, with the servers behind it: the cases that
/// must hold everywhere run on each.
pub enum Backend {
    /// The in-memory store: clients on it stand for processes sharing it.
    Memory(MemoryStore),
    /// One `redis-server`.
    Server(RedisServer),
    /// A Redis Cluster of three primaries.
    Cluster(RedisCluster),
    /// Redlock over three independent `redis-server`s.
    Redlock(Vec<RedisServer>),
    /// One `redis-server` reached over TLS (`rediss://`), with the
    /// certificates of its private CA.
    Tls(RedisServer, TestCertificates),
    /// One `redis-server` found through a Sentinel that monitors it.
    Sentinel(RedisServer, SentinelServer),
    /// One `redis-server`, reached over a connection of the test's own
    /// given to the builder: each client a connection of its own.
    Given(RedisServer, Given),
}

/// The service name of [`Backend::Sentinel`]'s primary.
const SENTINEL_SERVICE: &str = "suiteprimary";

impl Backend {
    /// A fresh in-memory store.
    pub fn memory() -> Backend {
        Backend::Memory(MemoryStore::new())
    }

    /// A `redis-server` of its own.
    pub fn server() -> Backend {
        Backend::Server(RedisServer::start())
    }

    /// A cluster of three primaries without replicas.
    pub fn cluster() -> Backend {
        Backend::Cluster(RedisCluster::start(3, 0))
    }

    /// Three independent servers.
    pub fn redlock() -> Backend {
        Backend::Redlock(start_servers(3))
    }

    /// A server that serves TLS only, or `None` (said on stderr) when the
    /// `redis-server` in use was built without TLS.
    pub fn tls() -> Option<Backend> {
        let certs = TestCertificates::generate();
        match RedisServer::builder().tls(&certs).try_start() {
            Ok(server) => Some(Backend::Tls(server, certs)),
            Err(e) if e.log_tail().is_some_and(|log| log.contains("TLS support")) => {
                eprintln!("skipped over TLS: this redis-server was built without TLS");
                None
            }
            Err(e) => panic!("{e}"),
        }
    }

    /// A server and a Sentinel that monitors it.
    pub fn sentinel() -> Backend {
        let primary = RedisServer::start();
        let sentinel = SentinelServer::start(&primary, SENTINEL_SERVICE, 1);
        Backend::Sentinel(primary, sentinel)
    }

    /// A server, reached over connections of kind `given`.
    pub fn given(given: Given) -> Backend {
        Backend::Given(RedisServer::start(), given)
    }

    /// A server for each kind of connection a service may give.
    pub fn every_given() -> Vec<Backend> {
        Backend::given_each(&Given::ALL)
    }

    /// A server for each of `kinds`.
    pub fn given_each(kinds: &[Given]) -> Vec<Backend> {
        kinds.iter().copied().map(Backend::given).collect()
    }

    /// The backends every transport and deployment the README names runs
    /// on: one server over plain TCP and over TLS (where the binary has
    /// it), a cluster, Redlock, and a server found through a Sentinel.
    pub fn every_transport() -> Vec<Backend> {
        let mut backends = vec![Backend::server()];
        backends.extend(Backend::tls());
        backends.push(Backend::cluster());
        backends.push(Backend::redlock());
        backends.push(Backend::sentinel());
        backends
    }

    /// What the backend is, in a test's messages.
    pub fn name(&self) -> &'static str {
        match self {
            Backend::Memory(_) => "in memory",
            Backend::Server(_) => "one server",
            Backend::Cluster(_) => "cluster",
            Backend::Redlock(_) => "redlock",
            Backend::Tls(..) => "one server over TLS",
            Backend::Sentinel(..) => "sentinel",
            Backend::Given(_, given) => given.name(),
        }
    }

    /// Whether `storage_key` is held anywhere. The in-memory store shows no
    /// keys: there, whether any lock is held.
    pub fn holds(&self, storage_key: &str) -> bool {
        match self {
            Backend::Memory(store) => store.held() > 0,
            Backend::Server(server)
            | Backend::Tls(server, _)
            | Backend::Sentinel(server, _)
            | Backend::Given(server, _) => server.cmd(&["EXISTS", storage_key]),
            Backend::Cluster(cluster) => {
                let primary = cluster
                    .primary_of_key(storage_key)
                    .unwrap()
                    .expect("every slot has a primary");
                cluster.nodes()[primary].cmd(&["EXISTS", storage_key])
            }
            Backend::Redlock(servers) => servers
                .iter()
                .any(|server| server.cmd(&["EXISTS", storage_key])),
        }
    }

    /// Deletes `storage_key` behind every holder's back, as an operator
    /// would; `false` on the in-memory store, which has no such door.
    pub fn delete(&self, storage_key: &str) -> bool {
        let del = |server: &RedisServer| {
            let _: i64 = server.cmd(&["DEL", storage_key]);
        };
        match self {
            Backend::Memory(_) => return false,
            Backend::Server(server)
            | Backend::Tls(server, _)
            | Backend::Sentinel(server, _)
            | Backend::Given(server, _) => del(server),
            Backend::Cluster(cluster) => {
                let primary = cluster
                    .primary_of_key(storage_key)
                    .unwrap()
                    .expect("every slot has a primary");
                del(&cluster.nodes()[primary]);
            }
            Backend::Redlock(servers) => servers.iter().for_each(del),
        }
        true
    }

    /// Whether nothing at all is stored: no lock, no fence counter (the
    /// in-memory store shows only its locks).
    pub fn is_empty(&self) -> bool {
        let empty = |server: &RedisServer| server.cmd::<i64>(&["DBSIZE"]) == 0;
        match self {
            Backend::Memory(store) => store.held() == 0,
            Backend::Server(server)
            | Backend::Tls(server, _)
            | Backend::Sentinel(server, _)
            | Backend::Given(server, _) => empty(server),
            Backend::Cluster(cluster) => cluster.nodes().iter().all(empty),
            Backend::Redlock(servers) => servers.iter().all(empty),
        }
    }
}

impl Store for Backend {
    fn point(&self, builder: LockClientBuilder) -> LockClientBuilder {
        match self {
            Backend::Memory(store) => builder.in_memory(store),
            Backend::Server(server) => server.point(builder),
            Backend::Cluster(cluster) => cluster.point(builder),
            Backend::Redlock(servers) => servers.point(builder),
            Backend::Tls(server, certs) => builder
                .url(server.tls_url())
                .tls_root_certificate(certs.ca_pem()),
            Backend::Sentinel(_, sentinel) => builder.sentinel([sentinel.url()], SENTINEL_SERVICE),
            Backend::Given(_, given) => panic!(
                "{}: opened on a runtime; build the client with client_with",
                given.name()
            ),
        }
    }

    async fn connect(&self, builder: LockClientBuilder) -> LockClientBuilder {
        match self {
            Backend::Given(server, given) => given.point(server, builder).await,
            _ => self.point(builder),
        }
    }

    fn logs(&self) -> String {
        match self {
            Backend::Memory(_) => String::from("(in memory: no server log)"),
            Backend::Server(server) => server.logs(),
            Backend::Cluster(cluster) => cluster.logs(),
            Backend::Redlock(servers) => servers.logs(),
            Backend::Tls(server, _) | Backend::Given(server, _) => server.logs(),
            Backend::Sentinel(server, sentinel) => {
                format!("{}\n--- sentinel ---\n{}", server.logs(), sentinel.log())
            }
        }
    }
}
