//! [`LockClientBuilder`]: every setting of a client, checked when it is
//! built.

use super::LockClient;
use crate::backend::{
    Backend, ClusterNode, MemoryStore, MinReplicas, Node, Quorum, UserConnection, redact,
};
use crate::background::Spawner;
use crate::backoff::Backoff;
use crate::client_state::Settings;
use crate::error::{ErrorKind, LockError};
use crate::lease::{MAX_KEY_LEN, MIN_TTL, check_duration};
use crate::queue::HandoffBudget;
use crate::token::{MAX_HOLDER_LEN, default_holder_name};
use std::fmt;
use std::time::Duration;

/// Configures a [`LockClient`]. Every setting but the URL has a default.
///
/// | setting | default |
/// | --- | --- |
/// | [`key_prefix`](Self::key_prefix) | `"lock:"` |
/// | [`holder_name`](Self::holder_name) | `hostname:pid` |
/// | [`default_ttl`](Self::default_ttl) | 30 s |
/// | [`default_wait`](Self::default_wait) | 10 s |
/// | [`operation_timeout`](Self::operation_timeout) | 2 s |
/// | [`connect_timeout`](Self::connect_timeout) | 5 s |
/// | [`backoff`](Self::backoff) | 10 ms doubling to 200 ms, full jitter |
/// | [`handoff_budget`](Self::handoff_budget) | 250 hand-offs within 10 ms |
/// | [`min_replicas`](Self::min_replicas) | off |
/// | [`refuse_evicting_servers`](Self::refuse_evicting_servers) | off: warn |
/// | [`runtime`](Self::runtime) | lock-core's own threads |
///
/// Where the locks live is chosen by exactly one of: [`url`](Self::url)
/// once (one server), [`url`](Self::url)/[`urls`](Self::urls) for three or
/// more servers (Redlock), [`sentinel`](Self::sentinel) (the primary that
/// Redis Sentinel names, followed across failovers),
/// [`cluster`](Self::cluster) (a Redis Cluster), or
/// [`in_memory`](Self::in_memory). Two of them at once are a
/// [`ErrorKind::Config`] error at [`build`](Self::build).
///
/// Its `Debug` output shows where the locks live without credentials:
/// passwords in URLs are `***`, TLS certificates and keys only counted.
#[derive(Clone)]
#[must_use = "a builder does nothing until .build().await"]
pub struct LockClientBuilder {
    /// Where the locks live: the one choice those setters make.
    deployment: Deployment,
    /// With Sentinel, the primary's login. Its own field, not part of
    /// [`Deployment::Sentinel`]: it may be given before `.sentinel(...)`.
    sentinel_primary: Option<String>,
    min_replicas: Option<MinReplicas>,
    prefix: String,
    holder: Option<String>,
    default_ttl: Duration,
    default_wait: Duration,
    op_timeout: Duration,
    connect_timeout: Duration,
    node_timeout: Option<Duration>,
    backoff: Backoff,
    handoff: HandoffBudget,
    refuse_evicting: bool,
    native_commands: bool,
    runtime: Option<tokio::runtime::Handle>,
    #[cfg(feature = "tls")]
    tls: Option<redis::TlsCertificates>,
}

impl Default for LockClientBuilder {
    fn default() -> Self {
        LockClientBuilder {
            deployment: Deployment::Unset,
            sentinel_primary: None,
            min_replicas: None,
            prefix: "lock:".to_owned(),
            holder: None,
            default_ttl: Duration::from_secs(30),
            default_wait: Duration::from_secs(10),
            op_timeout: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(5),
            node_timeout: None,
            backoff: Backoff::default(),
            handoff: HandoffBudget::default(),
            refuse_evicting: false,
            native_commands: true,
            runtime: None,
            #[cfg(feature = "tls")]
            tls: None,
        }
    }
}

impl LockClientBuilder {
    /// A Redis server, as a `redis://` (or, with the `tls` feature,
    /// `rediss://`) URL; credentials go in it as
    /// `redis://user:password@host:port/db`.
    ///
    /// Called once: locks live on that server. Called for three or more
    /// independent primaries (or use [`urls`](Self::urls)): Redlock, where a
    /// lock is held on a majority of them. A URL without its scheme
    /// (`127.0.0.1:6379`) is a [`ErrorKind::Config`] error at
    /// [`build`](Self::build), which says what to write.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_core::LockError> {
    /// let client = lock_core::LockClient::builder()
    ///     .url("redis://app:secret@redis.internal:6379/0")
    ///     .build()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn url(self, url: impl Into<String>) -> Self {
        self.choose(Deployment::Single(url.into()))
    }

    /// Redis Sentinel: locks live on the primary that the Sentinels at
    /// `sentinel_urls` (`redis://[user:password@]host:port`, the Sentinels'
    /// own credentials) name for `service_name` (the name in their
    /// `sentinel monitor <name> ...`).
    ///
    /// The client asks the Sentinels for the primary, checks that it answers
    /// `ROLE` as a primary, and keeps one connection to it. Whenever that
    /// connection is replaced (it broke, timed out, or its runtime ended) the
    /// Sentinels are asked again, all within the
    /// [`connect_timeout`](Self::connect_timeout). After a failover the old
    /// primary, if it still answers, answers writes with `READONLY`: the
    /// client then drops the connection and the call fails as
    /// [`ErrorKind::Unavailable`], which an acquisition retries within its
    /// wait, on the new primary. Renewals and releases are retried once at
    /// once on the new primary.
    ///
    /// The primary's user, password and database are not those of the
    /// Sentinel URLs: give them with
    /// [`sentinel_primary_credentials`](Self::sentinel_primary_credentials)
    /// (default: none, database 0). Plain TCP only (`redis://`).
    ///
    /// Release wake-ups (pub/sub) are not used with Sentinel: a waiter polls
    /// with its [`backoff`](Self::backoff), so it notices a release within
    /// one backoff step instead of at once.
    ///
    /// Replication is asynchronous: a lock acquired just before a failover
    /// may be missing on the new primary. See
    /// [`min_replicas`](Self::min_replicas) for what can be done about it.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_core::LockError> {
    /// use std::time::Duration;
    ///
    /// let client = lock_core::LockClient::builder()
    ///     .sentinel(
    ///         ["redis://10.0.0.1:26379", "redis://10.0.0.2:26379", "redis://10.0.0.3:26379"],
    ///         "mymaster",
    ///     )
    ///     .sentinel_primary_credentials("redis://:primary-password@primary/0")
    ///     .min_replicas(1, Duration::from_millis(100))
    ///     .build()
    ///     .await?;
    /// # drop(client); Ok(()) }
    /// ```
    pub fn sentinel<I, S>(self, sentinel_urls: I, service_name: impl Into<String>) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.choose(Deployment::Sentinel(SentinelSettings {
            urls: sentinel_urls.into_iter().map(Into::into).collect(),
            service: service_name.into(),
        }))
    }

    /// With [`sentinel`](Self::sentinel): the user, password and database
    /// for the primary (the same for whichever server is primary), as a URL
    /// `redis://[user:]password@host[/db]` whose host and port are ignored
    /// (the Sentinels name the server). Without it: no login, database 0.
    pub fn sentinel_primary_credentials(mut self, url: impl Into<String>) -> Self {
        self.sentinel_primary = Some(url.into());
        self
    }

    /// After each successful acquisition, waits for `replicas` replicas to
    /// acknowledge the lock's write (`WAIT replicas timeout` on the same
    /// connection, right after the `SET`), for at most `timeout`; with fewer
    /// acknowledgements the lock is deleted again (compare-and-delete) and
    /// the attempt counts as failed with [`ErrorKind::Unavailable`] ("the
    /// lock was not replicated to N replicas"): it is retried within the
    /// acquisition's wait, and the error is returned when the wait runs out.
    /// Default: off. One server or Sentinel only, not Redlock.
    ///
    /// What it guarantees: a lock handed to the caller had reached at least
    /// `replicas` replicas' memory, so a failover that promotes one of them
    /// keeps it. What it does not: replication stays asynchronous, and
    /// `WAIT` does not make the lock strongly consistent. A failover can
    /// still lose the lock when the promoted replica is not one that
    /// acknowledged (with more replicas than `replicas`), or when a replica
    /// that acknowledged restarts without persistence; renewals are not
    /// waited for (a promoted replica may have an older expiry, so the lock
    /// can expire there sooner than the holder thinks, by up to the part of
    /// the ttl renewed since); nor are the lease take-overs between tasks of
    /// one process. Fencing tokens remain the way to make the protected
    /// resource safe against two holders.
    ///
    /// Costs: a round trip per acquisition, and `WAIT` blocks the client's
    /// one shared connection until the replicas answer (normally well under
    /// a millisecond on a local network; up to `timeout` when they are
    /// missing), delaying other calls of the client meanwhile. `timeout`
    /// must be shorter than the [`operation_timeout`](Self::operation_timeout),
    /// which bounds the acquisition call and its `WAIT` together. An ACL
    /// user needs `+wait` too.
    pub fn min_replicas(mut self, replicas: u32, timeout: Duration) -> Self {
        self.min_replicas = Some(MinReplicas { replicas, timeout });
        self
    }

    /// Keeps the locks in this process's memory, in `store`, instead of
    /// Redis: for unit tests. Clients built on one store see the same locks.
    /// See [`LockClient::in_memory`].
    pub fn in_memory(self, store: &MemoryStore) -> Self {
        self.choose(Deployment::InMemory(store.clone()))
    }

    /// A connection the service already has, to one Redis server: anything
    /// the `redis` crate sends commands over that clones into another handle
    /// on the same connection, such as its `MultiplexedConnection` (what
    /// lock-core's tests use) or `ConnectionManager`. Every lock kind, renewal, fencing and the
    /// operators' calls go over clones of it; lock-core opens no connection
    /// of its own.
    ///
    /// What lock-core's own connection does and this one cannot (see
    /// [docs/connection.md](https://github.com/lock-rs/distributed-lock/blob/main/docs/connection.md)):
    /// waiters are not woken by a release's message (a connection that
    /// carries calls cannot subscribe), so they come back on their
    /// [`backoff`](Self::backoff) timer, at most 200 ms by default; a broken
    /// connection is not replaced (a `ConnectionManager` reconnects by
    /// itself, a `MultiplexedConnection` does not); the heartbeat's renewals
    /// queue behind the service's own commands on it; and a release is sent
    /// and its reply awaited, also when the guard is dropped. Every call is
    /// still bounded by the [`operation_timeout`](Self::operation_timeout).
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
    /// let redis = redis::Client::open("redis://127.0.0.1:6379")?;
    /// let conn = redis.get_multiplexed_async_connection().await?;
    /// let client = lock_core::LockClient::builder().connection(conn).build().await?;
    /// # Ok(()) }
    /// ```
    pub fn connection<C>(self, conn: C) -> Self
    where
        C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
    {
        self.choose(Deployment::Connection(UserConnection::new(conn)))
    }

    /// A pool of connections to one Redis server that the service already
    /// has: a `deadpool_redis::Pool` (feature `deadpool-redis`) or a
    /// `bb8::Pool<bb8_redis::RedisConnectionManager>` (feature
    /// `bb8-redis`). As with [`connection`](Self::connection), and with
    /// what it cannot do: each command, the heartbeat's renewals too,
    /// checks a connection out of the pool for itself and gives it back
    /// once answered, so the pool's size and its wait for a free connection
    /// apply to lock-core's calls as to the service's; the
    /// [`operation_timeout`](Self::operation_timeout) bounds each call,
    /// the wait included.
    ///
    /// ```no_run
    /// # #[cfg(feature = "deadpool-redis")]
    /// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
    /// let pool = deadpool_redis::Config::from_url("redis://127.0.0.1:6379")
    ///     .create_pool(Some(deadpool_redis::Runtime::Tokio1))?;
    /// let client = lock_core::LockClient::builder().pool(pool).build().await?;
    /// # Ok(()) }
    /// ```
    #[cfg(any(feature = "deadpool-redis", feature = "bb8-redis"))]
    #[cfg_attr(
        docsrs,
        doc(cfg(any(feature = "deadpool-redis", feature = "bb8-redis")))
    )]
    pub fn pool(self, pool: impl crate::RedisPool) -> Self {
        self.choose(Deployment::Connection(crate::backend::pool_connection(
            pool,
        )))
    }

    /// A Redis Cluster, reached first through `urls`
    /// (`redis://[user:password@]host:port`; one node is enough, more help
    /// when some are down; the rest of the cluster is discovered).
    ///
    /// Each lock lives in the hash slot of its key: the key is stored as
    /// `<prefix>{<key>}` (and its fence counter as `<prefix>{<key>}:fence`),
    /// so every command of a lock goes to one primary, and locks spread over
    /// the primaries. Commands follow `MOVED`/`ASK` redirections and
    /// failovers. Release wake-ups subscribe on each given node (a
    /// `PUBLISH` reaches every node of a cluster).
    ///
    /// Plain TCP only (no TLS); [`min_replicas`](Self::min_replicas) is not
    /// available. Replication in a cluster is asynchronous: a failover
    /// right after an acquisition can lose the fresh lock.
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), lock_core::LockError> {
    /// let client = lock_core::LockClient::builder()
    ///     .cluster(["redis://10.0.0.1:7000", "redis://10.0.0.2:7000"])
    ///     .build()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn cluster<I, S>(self, urls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.choose(Deployment::Cluster(
            urls.into_iter().map(Into::into).collect(),
        ))
    }

    /// Several independent Redis primaries (at least 3, not replicas of one
    /// another): selects Redlock. Adds to any URL given before.
    pub fn urls<I, S>(self, urls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        // Each as if given to `url`: one URL alone is still one server.
        urls.into_iter().fold(self, |builder, url| builder.url(url))
    }

    /// Redlock only: the bound on each server's answer. Default: 5 % of the
    /// lock's ttl, at least 50 ms, at most the operation timeout. A server
    /// that is down or slow costs at most this, never the whole wait.
    pub fn node_timeout(mut self, timeout: Duration) -> Self {
        self.node_timeout = Some(timeout);
        self
    }

    /// The name written into every exclusive lock this client takes, so
    /// that [`LockClient::inspect`], [`LockClient::list`] and `lockctl`
    /// can say who holds a lock (default `hostname:pid`). Up to 256 bytes,
    /// not empty, no control characters; give each replica of a service
    /// its own (a pod name).
    ///
    /// The name is for people: ownership is still decided by each
    /// acquisition's random token, so two clients with one name still
    /// exclude each other.
    pub fn holder_name(mut self, name: impl Into<String>) -> Self {
        self.holder = Some(name.into());
        self
    }

    /// Whether releases use the server's own compare-and-delete where it
    /// has one (default `true`): `DELIFEQ key value` on Valkey 9.0 and
    /// later, found when each connection opens (`COMMAND INFO`), then a
    /// `PUBLISH` for the waiters in the same write. It spares the server
    /// the release script; on other servers, and for fenced, shared and
    /// several-key locks, the script runs as before. A user whose ACL
    /// lacks `+command|info` or `+delifeq` keeps the script too (see
    /// `docs/deployment.md`). `false` runs the script everywhere.
    pub fn native_commands(mut self, on: bool) -> Self {
        self.native_commands = on;
        self
    }

    /// The prefix of every key the client writes (default `"lock:"`).
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The ttl used when a caller gives none (the attribute without `ttl`).
    pub fn default_ttl(mut self, ttl: Duration) -> Self {
        self.default_ttl = ttl;
        self
    }

    /// How long an acquisition waits when the caller gives no wait.
    /// It is always bounded.
    pub fn default_wait(mut self, wait: Duration) -> Self {
        self.default_wait = wait;
        self
    }

    /// The bound on every Redis call (acquire attempt, renewal, release).
    pub fn operation_timeout(mut self, timeout: Duration) -> Self {
        self.op_timeout = timeout;
        self
    }

    /// The bound on opening a connection.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long the tasks of this process may pass a lease among themselves
    /// before it is released to other processes (default: 250 hand-offs
    /// within 10 ms). [`HandoffBudget::NONE`] turns hand-off off; the tasks
    /// of a process still queue in order.
    pub fn handoff_budget(mut self, budget: HandoffBudget) -> Self {
        self.handoff = budget;
        self
    }

    /// Whether [`build`](Self::build) refuses servers that may evict lock
    /// keys (default: `false`, a warning).
    ///
    /// With `maxmemory` set, every `maxmemory-policy` but `noeviction`
    /// evicts keys when memory runs out: `allkeys-*` any key, `volatile-*`
    /// keys with an expiry, which every lock key has (managed services
    /// often default to one). An evicted lock is free at once, and its
    /// holder learns of it at its next renewal, up to one renewal interval
    /// (a third of the ttl) later: until then two holders believe they
    /// hold it.
    ///
    /// `build` reads each server's `INFO memory` (the one server, Sentinel's
    /// primary, each Redlock server, each Cluster primary). Where one may
    /// evict, it logs one `WARN` event saying what to change
    /// (`maxmemory-policy noeviction`, or no `maxmemory`); with `true` it
    /// fails instead with [`ErrorKind::Config`], naming the server and its
    /// policy. A server that refuses `INFO` (an ACL user without `+info`)
    /// is not checked (a `DEBUG` event), unless this is `true`: then
    /// `build` fails with that refusal, saying to grant `+info`.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_core::LockError> {
    /// let client = lock_core::LockClient::builder()
    ///     .url("redis://redis.internal:6379")
    ///     .refuse_evicting_servers(true)
    ///     .build()
    ///     .await?; // Config error on a server with maxmemory-policy allkeys-lru
    /// # drop(client); Ok(()) }
    /// ```
    pub fn refuse_evicting_servers(mut self, refuse: bool) -> Self {
        self.refuse_evicting = refuse;
        self
    }

    /// Runs the client's background work on `runtime`, as named tasks
    /// that tokio-console and `runtime.metrics()` see: the heartbeat that
    /// renews every held lock (`lock-core.heartbeat`), the releases nobody
    /// waits for (`lock-core.release`: a guard dropped, a call cut short)
    /// the subscriber connections that hear releases (`lock-core.wakeups`)
    /// and the watch that drops an acquisition kept unpolled
    /// (`lock-core.kept`); the heartbeat's own connection is opened and
    /// driven there too.
    /// Without it (the default) they run on lock-core's own threads, one
    /// `lock-core-heartbeat` thread per client among them. With
    /// `--cfg tokio_unstable` the tasks carry those names to tokio-console;
    /// each also runs in a `lock_core_task` tracing span whose `task` field
    /// is the name.
    ///
    /// What the runtime must give, and what happens when it does not (see
    /// [docs/runtime.md](https://github.com/lock-rs/distributed-lock/blob/main/docs/runtime.md)):
    ///
    /// - A free worker every third of a ttl: a task that blocks one worker
    ///   of a multi-thread runtime holds up no renewal, but one that blocks
    ///   every worker (or the one thread of a current-thread runtime) holds
    ///   them all up, and a lock is lost at its validity deadline
    ///   ([`LossReason::Expired`](crate::LossReason::Expired)). Without this
    ///   option no task of the user's can hold a renewal up.
    /// - To outlive its locks: when the runtime shuts down, every lock the
    ///   client holds is marked lost at once
    ///   ([`LossReason::RuntimeShutDown`](crate::LossReason::RuntimeShutDown)),
    ///   and a release it dropped runs on lock-core's runtime instead, so a
    ///   guard dropped then still lets its key go. Nothing panics.
    ///
    /// Any runtime is accepted, of either flavor, with its time and I/O
    /// drivers on (`enable_all`); one without them panics at its first
    /// renewal, as any tokio timer does. There is nothing else to check,
    /// so nothing here fails at [`build`](Self::build).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_core::LockError> {
    /// // Inside the service's runtime: its handle.
    /// let client = lock_core::LockClient::builder()
    ///     .url("redis://127.0.0.1:6379")
    ///     .runtime(tokio::runtime::Handle::current())
    ///     .build()
    ///     .await?;
    /// # drop(client); Ok(()) }
    /// ```
    pub fn runtime(mut self, runtime: tokio::runtime::Handle) -> Self {
        self.runtime = Some(runtime);
        self
    }

    /// The delay between acquisition attempts.
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// Trusts the CA certificate(s) in `pem` (PEM text, one or more
    /// `-----BEGIN CERTIFICATE-----` blocks) for `rediss://` servers,
    /// instead of the system's trust store: for a server whose certificate
    /// a private CA issued. Called again, trusts those as well.
    ///
    /// Needs the `tls` feature.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let client = lock_core::LockClient::builder()
    ///     .url("rediss://redis.internal:6380")
    ///     .tls_root_certificate(std::fs::read("/etc/redis/ca.crt")?)
    ///     .build()
    ///     .await?;
    /// # drop(client); Ok(()) }
    /// ```
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub fn tls_root_certificate(mut self, pem: impl Into<Vec<u8>>) -> Self {
        let mut pem = pem.into();
        let tls = self.tls.get_or_insert(redis::TlsCertificates {
            client_tls: None,
            root_cert: None,
        });
        match &mut tls.root_cert {
            Some(roots) => {
                roots.push(b'\n');
                roots.append(&mut pem);
            }
            None => tls.root_cert = Some(pem),
        }
        self
    }

    /// Presents this client certificate (PEM chain) and private key (PEM,
    /// PKCS#8, PKCS#1 or SEC1) to `rediss://` servers that require one
    /// (mutual TLS, `tls-auth-clients yes`).
    ///
    /// Needs the `tls` feature.
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub fn tls_client_certificate(
        mut self,
        cert_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        let tls = self.tls.get_or_insert(redis::TlsCertificates {
            client_tls: None,
            root_cert: None,
        });
        tls.client_tls = Some(redis::ClientTlsConfig {
            client_cert: cert_pem.into(),
            client_key: key_pem.into(),
        });
        self
    }

    /// One server, with the TLS certificates when some were given.
    #[cfg(feature = "tls")]
    fn node(&self, url: &str) -> Result<Node, LockError> {
        match &self.tls {
            Some(tls) => Node::with_tls(url, self.connect_timeout, tls),
            None => Node::new(url, self.connect_timeout),
        }
    }

    /// One server.
    #[cfg(not(feature = "tls"))]
    fn node(&self, url: &str) -> Result<Node, LockError> {
        Node::new(url, self.connect_timeout)
    }

    /// The node that follows the primary the Sentinels name.
    fn sentinel_node(&self, sentinel: &SentinelSettings) -> Result<Node, LockError> {
        #[cfg(feature = "tls")]
        if self.tls.is_some() {
            return Err(LockError::config(
                "TLS certificates were configured, but TLS is not supported with Sentinel",
            ));
        }
        let primary = match &self.sentinel_primary {
            Some(url) => redis::IntoConnectionInfo::into_connection_info(url.as_str())
                .map_err(|e| {
                    LockError::config(format!(
                        "cannot use {:?} for the primary's credentials; write it as \
                         redis://[user:]password@host[/db]",
                        redact(url)
                    ))
                    .with_redis_source(e)
                })?
                .redis_settings()
                .clone(),
            None => redis::RedisConnectionInfo::default(),
        };
        Node::sentinel(
            &sentinel.urls,
            &sentinel.service,
            primary,
            self.connect_timeout,
        )
    }

    /// The settings every backend's client shares.
    pub(crate) fn settings(&self) -> Settings {
        Settings {
            prefix: self.prefix.clone(),
            holder: self.holder.clone().unwrap_or_else(default_holder_name),
            default_ttl: self.default_ttl,
            default_wait: self.default_wait,
            op_timeout: self.op_timeout,
            backoff: self.backoff,
            handoff: self.handoff,
            native: self.native_commands,
            spawner: self.runtime.clone().map(Spawner::on).unwrap_or_default(),
        }
    }

    /// The checks every kind of deployment shares: durations in range and
    /// a prefix that leaves room for keys.
    fn check_common(&self) -> Result<(), LockError> {
        check_duration("default_ttl", self.default_ttl, MIN_TTL)?;
        check_duration("default_wait", self.default_wait, Duration::ZERO)?;
        check_duration(
            "operation_timeout",
            self.op_timeout,
            Duration::from_millis(1),
        )?;
        check_duration(
            "connect_timeout",
            self.connect_timeout,
            Duration::from_millis(1),
        )?;
        if let Some(holder) = &self.holder {
            if holder.is_empty() || holder.len() > MAX_HOLDER_LEN {
                return Err(LockError::config(format!(
                    "holder_name is {} bytes; give a name of 1 to {MAX_HOLDER_LEN} bytes",
                    holder.len()
                )));
            }
            // It is printed in tables and logs: one line, no escapes.
            if holder.chars().any(char::is_control) {
                return Err(LockError::config(format!(
                    "holder_name {holder:?} has control characters; give a printable name"
                )));
            }
        }
        if self.prefix.len() > MAX_KEY_LEN / 2 {
            return Err(LockError::config(format!(
                "key prefix is {} bytes; keep it under {}",
                self.prefix.len(),
                MAX_KEY_LEN / 2
            )));
        }
        Ok(())
    }

    /// Checks the configuration, connects and proves the server answers.
    ///
    /// Errors: [`ErrorKind::Config`] for invalid settings or URL,
    /// [`ErrorKind::Unavailable`] when the server cannot be reached within
    /// the connect timeout, [`ErrorKind::Server`] when it refuses (wrong
    /// password, an ACL without `PING`); [`ErrorKind::Config`] also for a
    /// `rediss://` URL without the `tls` feature and for a failed TLS
    /// handshake (a server certificate no trusted CA issued);
    /// [`ErrorKind::Config`] too for a server that may evict lock keys
    /// when [`refuse_evicting_servers`](Self::refuse_evicting_servers) is
    /// on.
    ///
    /// A server that does not answer (a host that drops the connection
    /// attempt, a frozen server) holds `build` up for the
    /// [`connect_timeout`](Self::connect_timeout) (or the
    /// [`operation_timeout`](Self::operation_timeout), when longer): 5 s by
    /// default. A refused connection fails at once.
    ///
    /// ```no_run
    /// use lock_core::{ErrorKind, LockClient};
    /// use std::time::Duration;
    ///
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let built = LockClient::builder()
    ///     .url("redis://127.0.0.1:6379")
    ///     .key_prefix("billing:lock:")
    ///     .connect_timeout(Duration::from_secs(2))
    ///     .build()
    ///     .await;
    /// let client = match built {
    ///     Ok(client) => client,
    ///     Err(e) if e.kind() == ErrorKind::Unavailable => {
    ///         return Err(format!("Redis is not up yet, try again: {}", e.chain()).into());
    ///     }
    ///     Err(e) => return Err(e.into()), // a configuration or login to fix
    /// };
    /// lock_core::set_global_client(client)?;
    /// # Ok(()) }
    /// ```
    pub async fn build(self) -> Result<LockClient, LockError> {
        let (backend, unreachable) = self.backend()?;
        let client = LockClient::assemble(self.settings(), backend);
        // The in-memory store has nothing to reach.
        let Some(unreachable) = unreachable else {
            return Ok(client);
        };
        let ping_limit = self.connect_timeout.max(self.op_timeout);
        client.inner.backend.ping(ping_limit).await.map_err(|e| {
            // A refusal (credentials, ACL, TLS certificate) keeps its
            // own explanation.
            if e.kind() != ErrorKind::Unavailable {
                return e;
            }
            e.with_message(unreachable)
        })?;
        client.inner.learn_server_clock(ping_limit).await;
        client.inner.check_scripts(ping_limit).await?;
        client
            .inner
            .check_eviction(ping_limit, self.refuse_evicting)
            .await?;
        Ok(client)
    }

    /// Records one setter's choice of where the locks live (see
    /// [`Deployment::and`]).
    fn choose(mut self, choice: Deployment) -> Self {
        self.deployment = std::mem::take(&mut self.deployment).and(choice);
        self
    }

    /// The one place that decides: checks the settings against the chosen
    /// deployment and makes its backend, not yet connected, with what to
    /// say when it does not answer (`None`: there is nothing to reach).
    fn backend(&self) -> Result<(Backend, Option<String>), LockError> {
        self.deployment.check_schemes()?;
        let (backend, shown) = match &self.deployment {
            Deployment::Unset => {
                return Err(LockError::config(
                    "no Redis URL: call .url(\"redis://host:6379\") on the builder",
                ));
            }
            Deployment::Conflict(choices) => return Err(Deployment::conflict(choices)),
            Deployment::Single(url) => {
                self.no_sentinel_primary()?;
                self.check_min_replicas()?;
                self.check_shared()?;
                let mut node = self.node(url)?;
                node.min_replicas = self.min_replicas;
                (Backend::Single(node), redact(url))
            }
            Deployment::Redlock(urls) => {
                if urls.len() < 3 {
                    return Err(LockError::config(format!(
                        "{} Redis URLs: Redlock needs at least 3 independent servers \
                         (2 cannot outvote one failure); give 1, or 3 or more",
                        urls.len()
                    )));
                }
                self.no_sentinel_primary()?;
                self.no_min_replicas(MIN_REPLICAS_NEEDS_ONE)?;
                self.check_shared()?;
                let nodes = urls
                    .iter()
                    .map(|url| self.node(url))
                    .collect::<Result<Vec<_>, _>>()?;
                let shown = urls.iter().map(|u| redact(u)).collect::<Vec<_>>();
                let quorum = Quorum::new(nodes, self.node_timeout);
                (Backend::Redlock(quorum), shown.join(", "))
            }
            Deployment::Sentinel(sentinel) => {
                self.check_min_replicas()?;
                self.check_shared()?;
                let mut node = self.sentinel_node(sentinel)?;
                node.min_replicas = self.min_replicas;
                (Backend::Single(node), sentinel.shown())
            }
            Deployment::Cluster(urls) => return self.cluster_backend(urls),
            Deployment::Connection(conn) => {
                self.no_sentinel_primary()?;
                self.check_min_replicas()?;
                self.check_shared()?;
                #[cfg(feature = "tls")]
                if self.tls.is_some() {
                    return Err(LockError::config(
                        "TLS certificates were configured, but a connection was given: \
                         configure TLS where the connection is opened",
                    ));
                }
                let mut node = Node::with_connection(conn.clone(), self.connect_timeout);
                node.min_replicas = self.min_replicas;
                let unreachable = "cannot reach Redis through the connection given to the \
                                   builder; check that its server runs";
                return Ok((Backend::Single(node), Some(unreachable.to_owned())));
            }
            Deployment::InMemory(store) => {
                self.no_sentinel_primary()?;
                self.no_min_replicas(MIN_REPLICAS_NEEDS_ONE)?;
                self.check_shared()?;
                return Ok((Backend::Memory(store.clone()), None));
            }
        };
        let unreachable =
            format!("cannot reach Redis at {shown}; check the URL and that the server runs");
        Ok((backend, Some(unreachable)))
    }

    /// [`backend`](Self::backend) for a Redis Cluster: no Sentinel
    /// credentials, `min_replicas` or TLS; `node_timeout` (Redlock's) is
    /// not looked at.
    fn cluster_backend(&self, urls: &[String]) -> Result<(Backend, Option<String>), LockError> {
        self.no_sentinel_primary()?;
        self.no_min_replicas("min_replicas is not available with a Redis Cluster")?;
        #[cfg(feature = "tls")]
        if self.tls.is_some() {
            return Err(LockError::config(
                "TLS certificates were configured, but TLS is not supported with a Redis Cluster",
            ));
        }
        self.check_common()?;
        let node = ClusterNode::new(urls, self.connect_timeout)?;
        let unreachable = format!(
            "cannot reach the Redis Cluster at {}; check the URLs and that it runs",
            node.addr()
        );
        Ok((Backend::Cluster(node), Some(unreachable)))
    }

    /// [`check_common`](Self::check_common), and `node_timeout` in range:
    /// the checks of every deployment but a cluster.
    fn check_shared(&self) -> Result<(), LockError> {
        self.check_common()?;
        if let Some(timeout) = self.node_timeout {
            check_duration("node_timeout", timeout, Duration::from_millis(1))?;
        }
        Ok(())
    }

    /// Every deployment but Sentinel: no primary's credentials.
    fn no_sentinel_primary(&self) -> Result<(), LockError> {
        match self.sentinel_primary {
            Some(_) => Err(LockError::config(
                "sentinel_primary_credentials is only used with .sentinel(...)",
            )),
            None => Ok(()),
        }
    }

    /// A deployment where `min_replicas` cannot work: refuses it with `why`.
    fn no_min_replicas(&self, why: &'static str) -> Result<(), LockError> {
        match self.min_replicas {
            Some(_) => Err(LockError::config(why)),
            None => Ok(()),
        }
    }

    /// One server or Sentinel: `min_replicas`, when set, waits for at least
    /// one replica, within the operation timeout.
    fn check_min_replicas(&self) -> Result<(), LockError> {
        let Some(min) = self.min_replicas else {
            return Ok(());
        };
        if min.replicas == 0 {
            return Err(LockError::config(
                "min_replicas(0, ..) waits for nothing: give at least 1, or leave it off",
            ));
        }
        check_duration(
            "min_replicas timeout",
            min.timeout,
            Duration::from_millis(1),
        )?;
        if min.timeout >= self.op_timeout {
            return Err(LockError::config(format!(
                "min_replicas timeout {:?} must be shorter than operation_timeout {:?}, \
                 which bounds the acquisition and its WAIT together",
                min.timeout, self.op_timeout
            )));
        }
        Ok(())
    }
}

/// Why `min_replicas` is refused with Redlock and in memory.
const MIN_REPLICAS_NEEDS_ONE: &str =
    "min_replicas needs one Redis server or Sentinel, not Redlock or in-memory";

/// A URL without its scheme, like `127.0.0.1:6379`, which the redis crate
/// answers with no more than "Redis URL did not parse": say what to write.
fn check_scheme(url: &str) -> Result<(), LockError> {
    if url.contains("://") {
        return Ok(());
    }
    // Without a scheme, `redact` would not find the credentials.
    let (shown, fix) = match url.rsplit_once('@') {
        Some((_, host)) => (
            format!("***@{host}"),
            format!("redis://user:password@{host}"),
        ),
        None => (url.to_owned(), format!("redis://{url}")),
    };
    Err(LockError::config(format!(
        "Redis URL {shown:?} has no scheme: write it as {fix} (rediss:// for TLS)"
    )))
}

/// The Sentinels and the service name given to
/// [`LockClientBuilder::sentinel`]. No `Debug`: the URLs may hold
/// passwords ([`Deployment`]'s `Debug` shows them redacted).
#[derive(Clone)]
struct SentinelSettings {
    urls: Vec<String>,
    service: String,
}

impl SentinelSettings {
    /// Where the primary is, without credentials, for messages.
    fn shown(&self) -> String {
        format!(
            "the primary of {:?} named by sentinels {}",
            self.service,
            self.urls
                .iter()
                .map(|u| redact(u))
                .collect::<Vec<_>>()
                .join(", ")
        )
    }
}

/// Where the locks live: the one choice that [`LockClientBuilder::url`],
/// [`urls`](LockClientBuilder::urls), [`sentinel`](LockClientBuilder::sentinel),
/// [`cluster`](LockClientBuilder::cluster) and
/// [`in_memory`](LockClientBuilder::in_memory) make, held in one field as
/// tokio's runtime builder holds its kind, so that
/// [`build`](LockClientBuilder::build) decides with one `match`.
#[derive(Clone, Default)]
enum Deployment {
    /// Nothing chosen: `build` says to call `.url(...)`.
    #[default]
    Unset,
    /// One server: `url` called once, or `urls` with one URL.
    Single(String),
    /// Independent primaries: two or more URLs. `build` refuses two (they
    /// cannot outvote one failure).
    Redlock(Vec<String>),
    /// The primary that Redis Sentinel names.
    Sentinel(SentinelSettings),
    /// A Redis Cluster, reached first through these nodes.
    Cluster(Vec<String>),
    /// This process's memory.
    InMemory(MemoryStore),
    /// A connection the service gave.
    Connection(UserConnection),
    /// Two kinds of the above or more: the choice made until the first
    /// setter of another kind, then every later setter's choice, in order;
    /// none `Unset` or `Conflict`. `build` refuses it, after checking every
    /// URL's scheme as for the others, with a message naming the kinds.
    Conflict(Vec<Deployment>),
}

impl Deployment {
    /// This choice followed by `next`, one setter's choice (`Single`,
    /// `Sentinel`, `Cluster` or `InMemory`): another URL adds a server (two
    /// are Redlock), more cluster nodes add to the nodes, a new Sentinel
    /// or store replaces the old one, and any other kind conflicts.
    fn and(self, next: Deployment) -> Deployment {
        match (self, next) {
            (Self::Unset, next) => next,
            (Self::Single(first), Self::Single(url)) => Self::Redlock(vec![first, url]),
            (Self::Redlock(mut urls), Self::Single(url)) => {
                urls.push(url);
                Self::Redlock(urls)
            }
            (Self::Cluster(mut urls), Self::Cluster(more)) => {
                urls.extend(more);
                Self::Cluster(urls)
            }
            (Self::Sentinel(_), next @ Self::Sentinel(_))
            | (Self::InMemory(_), next @ Self::InMemory(_))
            | (Self::Connection(_), next @ Self::Connection(_)) => next,
            (Self::Conflict(mut choices), next) => {
                choices.push(next);
                Self::Conflict(choices)
            }
            (first, next) => Self::Conflict(vec![first, next]),
        }
    }

    /// Every URL given, Sentinels' and cluster nodes' included, starts
    /// with its scheme.
    fn check_schemes(&self) -> Result<(), LockError> {
        match self {
            Self::Unset | Self::InMemory(_) | Self::Connection(_) => Ok(()),
            Self::Single(url) => check_scheme(url),
            Self::Redlock(urls)
            | Self::Cluster(urls)
            | Self::Sentinel(SentinelSettings { urls, .. }) => {
                urls.iter().try_for_each(|url| check_scheme(url))
            }
            Self::Conflict(choices) => choices.iter().try_for_each(Self::check_schemes),
        }
    }

    /// The error for `choices` that conflict: a cluster is named first,
    /// then an in-memory store, then the URLs and Sentinels.
    fn conflict(choices: &[Deployment]) -> LockError {
        let any = |kind: fn(&Deployment) -> bool| choices.iter().any(kind);
        if any(|choice| matches!(choice, Self::Cluster(_))) {
            LockError::config(
                "a Redis Cluster and Redis URLs, Sentinels or an in-memory store given; \
                 choose one",
            )
        } else if any(|choice| matches!(choice, Self::Connection(_))) {
            LockError::config(
                "both a connection and Redis URLs, Sentinels or an in-memory store given; \
                 choose one",
            )
        } else if any(|choice| matches!(choice, Self::InMemory(_))) {
            LockError::config(
                "both Redis URLs or Sentinels and an in-memory store given; choose one",
            )
        } else {
            LockError::config(
                "both Redis URLs and Sentinels given; choose one (with Sentinel, give the \
                 primary's credentials with .sentinel_primary_credentials(...))",
            )
        }
    }
}

/// A URL as `Debug` shows it: without its password, whether in the user
/// part (`redis://user:***@host`, as [`redact`] writes it, also when the
/// scheme is missing) or in the query (`redis+unix:///run/redis.sock?pass=***`).
fn shown_url(url: &str) -> String {
    let shown = match (url.contains("://"), url.rsplit_once('@')) {
        (false, Some((_, host))) => format!("***@{host}"),
        _ => redact(url),
    };
    let Some((path, query)) = shown.split_once('?') else {
        return shown;
    };
    let params: Vec<String> = query
        .split('&')
        .map(|param| match param.split_once('=') {
            Some((name, _)) if name.eq_ignore_ascii_case("pass") => format!("{name}=***"),
            Some((name, _)) if name.eq_ignore_ascii_case("password") => format!("{name}=***"),
            _ => param.to_owned(),
        })
        .collect();
    format!("{path}?{}", params.join("&"))
}

/// URLs as `Debug` shows them, each through [`shown_url`].
struct ShownUrls<'a>(&'a [String]);

impl fmt::Debug for ShownUrls<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(|url| shown_url(url)))
            .finish()
    }
}

impl fmt::Debug for Deployment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unset => f.write_str("Unset"),
            Self::Single(url) => f.debug_tuple("Single").field(&shown_url(url)).finish(),
            Self::Redlock(urls) => f.debug_tuple("Redlock").field(&ShownUrls(urls)).finish(),
            Self::Sentinel(sentinel) => f
                .debug_struct("Sentinel")
                .field("urls", &ShownUrls(&sentinel.urls))
                .field("service", &sentinel.service)
                .finish(),
            Self::Cluster(urls) => f.debug_tuple("Cluster").field(&ShownUrls(urls)).finish(),
            Self::InMemory(store) => f.debug_tuple("InMemory").field(store).finish(),
            Self::Connection(_) => f.write_str("Connection(..)"),
            Self::Conflict(choices) => f.debug_tuple("Conflict").field(choices).finish(),
        }
    }
}

impl fmt::Debug for LockClientBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = f.debug_struct("LockClientBuilder");
        out.field("deployment", &self.deployment)
            .field(
                "sentinel_primary_credentials",
                &self.sentinel_primary.as_deref().map(shown_url),
            )
            .field("min_replicas", &self.min_replicas)
            .field("prefix", &self.prefix)
            .field("holder", &self.holder)
            .field("default_ttl", &self.default_ttl)
            .field("default_wait", &self.default_wait)
            .field("operation_timeout", &self.op_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("node_timeout", &self.node_timeout)
            .field("backoff", &self.backoff)
            .field("handoff_budget", &self.handoff)
            .field("refuse_evicting_servers", &self.refuse_evicting)
            .field("native_commands", &self.native_commands)
            .field("runtime", &self.runtime.as_ref().map(|_| "given"));
        // Certificates and the private key are not printed, only whether
        // they were given.
        #[cfg(feature = "tls")]
        if let Some(tls) = &self.tls {
            out.field(
                "tls_root_certificate",
                &tls.root_cert
                    .as_ref()
                    .map(|pem| format!("{} bytes", pem.len())),
            )
            .field(
                "tls_client_certificate",
                &tls.client_tls.as_ref().map(|_| "given (key not shown)"),
            );
        }
        out.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn builder_without_url_is_a_config_error() {
        let err = LockClient::builder().build().await.err();
        assert_eq!(err.map(|e| e.kind()), Some(ErrorKind::Config));
    }

    #[tokio::test]
    async fn bad_url_is_a_config_error() {
        let err = LockClient::builder().url("http://nope").build().await.err();
        assert_eq!(err.map(|e| e.kind()), Some(ErrorKind::Config));
    }

    #[tokio::test]
    async fn zero_ttl_is_a_config_error() {
        let err = LockClient::builder()
            .url("redis://127.0.0.1:16999")
            .default_ttl(Duration::ZERO)
            .build()
            .await
            .err();
        assert_eq!(err.map(|e| e.kind()), Some(ErrorKind::Config));
    }

    /// The message of `builder`'s build error, which must be a
    /// [`ErrorKind::Config`] error.
    async fn config_error(builder: LockClientBuilder) -> String {
        match builder.build().await {
            Err(e) if e.kind() == ErrorKind::Config => e.to_string(),
            Err(e) => panic!("not a Config error: {e}"),
            Ok(client) => panic!("built {client:?}"),
        }
    }

    /// Nothing listens on port 1 here: no test below reaches a server.
    const A: &str = "redis://127.0.0.1:1";
    const B: &str = "redis://127.0.0.1:2";
    const C: &str = "redis://127.0.0.1:3";

    #[test]
    fn the_setters_make_one_choice() {
        let chosen = |b: LockClientBuilder| b.deployment;
        let b = || LockClient::builder();
        assert!(matches!(chosen(b()), Deployment::Unset));
        assert!(matches!(
            chosen(b().urls(Vec::<String>::new())),
            Deployment::Unset
        ));
        assert!(matches!(chosen(b().url(A)), Deployment::Single(u) if u == A));
        assert!(matches!(chosen(b().urls([A])), Deployment::Single(u) if u == A));
        assert!(matches!(chosen(b().url(A).url(B)), Deployment::Redlock(u) if u == [A, B]));
        assert!(matches!(
            chosen(b().url(A).urls([B, C])),
            Deployment::Redlock(u) if u == [A, B, C]
        ));
        assert!(matches!(
            chosen(b().cluster([A]).cluster([B])),
            Deployment::Cluster(u) if u == [A, B]
        ));
        assert!(matches!(
            chosen(b().sentinel([A], "old").sentinel([B], "new")),
            Deployment::Sentinel(s) if s.service == "new" && s.urls == [B]
        ));
        assert!(matches!(
            chosen(
                b().in_memory(&MemoryStore::new())
                    .in_memory(&MemoryStore::new())
            ),
            Deployment::InMemory(_)
        ));
        // An empty list adds nothing, so it conflicts with nothing.
        assert!(matches!(
            chosen(b().sentinel([A], "m").urls(Vec::<String>::new())),
            Deployment::Sentinel(_)
        ));
        let Deployment::Conflict(choices) = chosen(b().url(A).url(B).sentinel([C], "m").url(C))
        else {
            panic!("not a conflict");
        };
        assert!(matches!(
            choices.as_slice(),
            [
                Deployment::Redlock(_),
                Deployment::Sentinel(_),
                Deployment::Single(_)
            ]
        ));
    }

    #[tokio::test]
    async fn two_places_at_once_are_refused_whatever_the_order() {
        let store = MemoryStore::new();
        let sentinel = "both Redis URLs and Sentinels given; choose one";
        let memory = "both Redis URLs or Sentinels and an in-memory store given; choose one";
        let cluster = "a Redis Cluster and Redis URLs, Sentinels or an in-memory store given; \
                       choose one";
        let b = || LockClient::builder();
        let cases = [
            (b().url(A).sentinel([B], "m"), sentinel),
            (b().sentinel([B], "m").urls([A, B, C]), sentinel),
            (b().url(A).in_memory(&store), memory),
            (b().in_memory(&store).sentinel([B], "m"), memory),
            (b().url(A).sentinel([B], "m").in_memory(&store), memory),
            (b().url(A).cluster([B]), cluster),
            (b().cluster([B]).in_memory(&store), cluster),
            (
                b().sentinel([A], "m").cluster(Vec::<String>::new()),
                cluster,
            ),
            (b().url(A).in_memory(&store).cluster([B]), cluster),
        ];
        for (i, (builder, expected)) in cases.into_iter().enumerate() {
            let message = config_error(builder).await;
            assert!(message.contains(expected), "case {i}: {message}");
        }
    }

    #[tokio::test]
    async fn every_url_of_a_conflict_is_checked_for_its_scheme_first() {
        let builder = LockClient::builder()
            .in_memory(&MemoryStore::new())
            .url(A)
            .cluster(["127.0.0.1:7000"]);
        let message = config_error(builder).await;
        assert!(
            message.contains("write it as redis://127.0.0.1:7000"),
            "{message}"
        );
    }

    #[tokio::test]
    async fn the_servers_are_counted_as_before() {
        let message = config_error(LockClient::builder()).await;
        assert!(message.contains("no Redis URL: call .url("), "{message}");
        let message = config_error(LockClient::builder().url(A).url(B)).await;
        assert!(
            message.contains("2 Redis URLs: Redlock needs at least 3 independent servers"),
            "{message}"
        );
        let message = config_error(LockClient::builder().urls([A, B])).await;
        assert!(message.contains("2 Redis URLs"), "{message}");
    }

    #[tokio::test]
    async fn settings_of_another_deployment_are_refused() {
        let wait = Duration::from_millis(100);
        let b = || LockClient::builder();
        let only_sentinel = "sentinel_primary_credentials is only used with .sentinel(...)";
        let needs_one = MIN_REPLICAS_NEEDS_ONE;
        let cases = [
            (b().url(A).sentinel_primary_credentials(B), only_sentinel),
            (
                b().urls([A, B, C]).sentinel_primary_credentials(B),
                only_sentinel,
            ),
            (
                b().cluster([A]).sentinel_primary_credentials(B),
                only_sentinel,
            ),
            (
                b().in_memory(&MemoryStore::new())
                    .sentinel_primary_credentials(B),
                only_sentinel,
            ),
            (b().urls([A, B, C]).min_replicas(1, wait), needs_one),
            (
                b().in_memory(&MemoryStore::new()).min_replicas(1, wait),
                needs_one,
            ),
            (
                b().cluster([A]).min_replicas(1, wait),
                "min_replicas is not available with a Redis Cluster",
            ),
            (
                b().url(A).min_replicas(0, wait),
                "min_replicas(0, ..) waits for nothing",
            ),
        ];
        for (i, (builder, expected)) in cases.into_iter().enumerate() {
            let message = config_error(builder).await;
            assert!(message.contains(expected), "case {i}: {message}");
        }
    }

    #[tokio::test]
    async fn in_memory_builds_on_the_last_store_given() {
        let (first, last) = (MemoryStore::new(), MemoryStore::new());
        let client = LockClient::builder()
            .in_memory(&first)
            .in_memory(&last)
            .build()
            .await
            .map_err(|e| e.to_string());
        let Ok(client) = client else {
            panic!("{client:?}");
        };
        let ttl = Duration::from_secs(5);
        let held = LockClient::in_memory_on(&last).try_lock("k", ttl).await;
        assert!(matches!(held, Ok(Some(_))));
        assert!(matches!(client.try_lock("k", ttl).await, Ok(None)));
    }

    #[test]
    fn debug_never_shows_a_password() {
        const SECRET: &str = "hunter2-secret";
        let url = format!("redis://locker:{SECRET}@10.0.0.1:6379/0");
        let b = || LockClient::builder();
        let builders = [
            ("url", b().url(&url)),
            ("urls", b().urls([url.clone(), url.clone(), url.clone()])),
            (
                "sentinel",
                b().sentinel([url.clone()], "mymaster")
                    .sentinel_primary_credentials(format!("redis://:{SECRET}@primary/0")),
            ),
            ("cluster", b().cluster([url.clone(), url.clone()])),
            ("conflict", b().url(&url).cluster([url.clone()])),
            (
                "no scheme",
                b().url(format!("locker:{SECRET}@10.0.0.1:6379")),
            ),
            (
                "unix socket",
                b().url(format!("redis+unix:///run/redis.sock?db=1&pass={SECRET}")),
            ),
        ];
        for (kind, builder) in builders {
            let shown = format!("{builder:?} {builder:#?}");
            assert!(!shown.contains(SECRET), "{kind}: {shown}");
            assert!(shown.contains("***"), "{kind}: {shown}");
        }
    }

    #[cfg(feature = "tls")]
    #[test]
    fn debug_never_shows_tls_keys() {
        let builder = LockClient::builder()
            .url("rediss://10.0.0.1:6380")
            .tls_root_certificate("-----BEGIN CERTIFICATE-----ca-bytes")
            .tls_client_certificate("cert-bytes", "private-key-bytes");
        let shown = format!("{builder:?}");
        assert!(!shown.contains("private-key"), "{shown}");
        // Bytes printed as numbers would show the key too.
        assert!(!shown.contains("112, 114, 105"), "{shown}");
        assert!(shown.contains("tls_client_certificate"), "{shown}");
    }

    #[test]
    fn durations_out_of_range_are_rejected() {
        assert!(check_duration("ttl", Duration::from_millis(9), MIN_TTL).is_err());
        assert!(check_duration("ttl", Duration::from_secs(25 * 3600), MIN_TTL).is_err());
        assert!(check_duration("ttl", Duration::from_secs(30), MIN_TTL).is_ok());
        assert!(check_duration("wait", Duration::ZERO, Duration::ZERO).is_ok());
    }
}
