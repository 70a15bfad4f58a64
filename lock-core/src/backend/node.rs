//! One Redis server: a shared pipelined connection that reconnects, with a
//! bound on every call.

use super::Server;
use super::connection::{self, Failure, Opens, SharedConnection, TakesCalls};
use super::native::{self, Use};
use super::wire::native::Support;
use super::wire::{Hear, TlsConfig, Wire};
use crate::error::{ErrorKind, LockError, from_redis};
use crate::observe;
use crate::scripts::{self, Wake};
use crate::token::{Holder, Stamped, Token};
use futures::future::BoxFuture;
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{Cmd, Pipeline, RedisFuture, Value};
use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

// The Sentinels' answer, one per client, and how it is read.
mod sentinel;
// A connection the service gives the builder.
mod user;
// A pool the service gives the builder, behind the same seam.
#[cfg(any(feature = "deadpool-redis", feature = "bb8-redis"))]
mod pool;

#[cfg(any(feature = "deadpool-redis", feature = "bb8-redis"))]
pub use pool::RedisPool;
#[cfg(any(feature = "deadpool-redis", feature = "bb8-redis"))]
pub(crate) use pool::connection_of as pool_connection;
use sentinel::SentinelTarget;
pub(crate) use user::UserConnection;

/// A Redis server and the one connection all locks share to it.
///
/// Many concurrent commands are pipelined over the connection's one socket.
/// It is replaced as [`SharedConnection`] says: when it breaks, times out, or its
/// runtime has shut down.
///
/// A node may also stand for "whichever server the Sentinels name primary"
/// ([`Node::sentinel`]): its connections, and its twin's, then follow one
/// answer of the Sentinels (see `node/sentinel.rs`), and a connection to a
/// server that is no longer that answer's primary is replaced.
pub(crate) struct Node {
    target: Target,
    addr: String,
    connect_timeout: Duration,
    /// `WAIT n timeout` after each acquisition, when set.
    pub(crate) min_replicas: Option<MinReplicas>,
    connection: SharedConnection<Served>,
    /// The holder whose dated values this node's releases name to the
    /// server's own compare-and-delete where it has one (see `native`);
    /// unset, every release runs the script.
    native: OnceLock<Arc<Holder>>,
}

/// A connection and the generation of the Sentinels' answer it was opened
/// for (0 for a node that does not follow Sentinels).
#[derive(Clone)]
pub(crate) struct Served {
    conn: Conn,
    generation: u64,
}

impl TakesCalls for Served {
    fn takes_calls(&self) -> bool {
        self.conn.takes_calls()
    }
}

/// A connection to a node's server.
#[derive(Clone)]
pub(crate) enum Conn {
    /// lock-core's own, for plain TCP and TLS (see `wire/`), to one
    /// server, the primary a Sentinel names or a cluster's primary: the
    /// common case.
    Wire(Wire),
    /// The `redis` crate's, for Unix sockets and RESP3.
    Multiplexed(MultiplexedConnection),
    /// The service's own, given to the builder.
    User(UserConnection),
}

impl TakesCalls for Conn {
    fn takes_calls(&self) -> bool {
        match self {
            Conn::Wire(wire) => wire.takes_calls(),
            Conn::Multiplexed(_) | Conn::User(_) => true,
        }
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Wire(conn) => conn.req_packed_command(cmd),
            Conn::Multiplexed(conn) => conn.req_packed_command(cmd),
            Conn::User(conn) => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Wire(conn) => conn.req_packed_commands(pipeline, offset, count),
            Conn::Multiplexed(conn) => conn.req_packed_commands(pipeline, offset, count),
            Conn::User(conn) => conn.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Wire(conn) => conn.get_db(),
            Conn::Multiplexed(conn) => conn.get_db(),
            Conn::User(conn) => conn.get_db(),
        }
    }
}

/// Where a node's connections go. Cloned into each connection attempt,
/// which runs in a task of its own.
#[derive(Clone)]
enum Target {
    /// One server, always the same; over TLS, what lock-core's own
    /// connection trusts and presents.
    Direct(redis::Client, Option<TlsConfig>),
    /// The primary the Sentinels name at the time of connecting.
    Sentinel(SentinelTarget),
    /// The service's connection: "opening" it is taking a clone.
    User(UserConnection),
}

impl Target {
    /// A new connection: to the server, or to the primary of the
    /// Sentinels' answer the node follows (asked for when there is none,
    /// and checked to answer `ROLE` as a primary). lock-core's own
    /// connection queues the scripts' loads behind its login without
    /// waiting for them; over the `redis` crate's connection they load on
    /// first use (`NOSCRIPT`, see `scripts.rs`).
    ///
    /// Bounded as a whole by the connect timeout, in [`SharedConnection`].
    async fn open(self, connect_timeout: Duration) -> redis::RedisResult<Served> {
        // No response timeout inside the redis crate (its default is
        // 500 ms): every call is bounded by the caller's limit (the
        // operation or node timeout) in `SharedConnection::call`, which also replaces
        // a connection that stopped answering. A second timer per call would
        // cost time and could cut a call short of the configured bound.
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(connect_timeout))
            .set_response_timeout(None);
        match self {
            Target::Direct(client, tls) => {
                let info = client.get_connection_info();
                let conn = if let Some((host, port, tls)) = wire_target(info, tls.as_ref()) {
                    let settings = info.redis_settings();
                    Conn::Wire(Wire::connect(host, port, settings, tls).await?)
                } else {
                    client
                        .get_multiplexed_async_connection_with_config(&config)
                        .await
                        .map(Conn::Multiplexed)?
                };
                Ok(Served {
                    conn,
                    generation: 0,
                })
            }
            Target::User(conn) => Ok(Served {
                conn: Conn::User(conn),
                generation: 0,
            }),
            Target::Sentinel(target) => {
                // Within the connect timeout, less a margin for the error
                // to say why rather than only that time ran out.
                let limit = connect_timeout.saturating_sub(connect_timeout / 10);
                let (conn, generation) = target.open(limit, &config).await?;
                Ok(Served { conn, generation })
            }
        }
    }
}

/// The `min_replicas` setting: after acquiring, `WAIT replicas timeout`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MinReplicas {
    /// How many replicas must acknowledge the lock's write.
    pub(crate) replicas: u32,
    /// How long `WAIT` may block for them.
    pub(crate) timeout: Duration,
}

impl Node {
    /// A server reached through `url`: `redis://`, or `rediss://` (TLS,
    /// with the `tls` feature) trusting the system's certificate store.
    pub(crate) fn new(url: &str, connect_timeout: Duration) -> Result<Node, LockError> {
        if is_tls_url(url) {
            #[cfg(not(feature = "tls"))]
            return Err(LockError::config(format!(
                "{:?} asks for TLS, which this build of lock-core leaves out: \
                 enable the `tls` feature of lock-core \
                 (lock-core = {{ version = \"0.1\", features = [\"tls\"] }})",
                redact(url)
            )));
        }
        let client = redis::Client::open(url).map_err(|e| {
            LockError::config(format!(
                "cannot use Redis URL {:?}: write it as redis://[user:password@]host:port[/db]",
                redact(url)
            ))
            .with_redis_source(e)
        })?;
        #[cfg(feature = "tls")]
        let tls = if is_tls_url(url) {
            tls::install_crypto_provider();
            Some(tls::config(None)?)
        } else {
            None
        };
        #[cfg(not(feature = "tls"))]
        let tls = None;
        Ok(Node::with_client(client, tls, connect_timeout))
    }

    /// A `rediss://` server whose certificate is checked against
    /// `certificates` (and which is shown a client certificate when they
    /// hold one).
    #[cfg(feature = "tls")]
    pub(crate) fn with_tls(
        url: &str,
        connect_timeout: Duration,
        certificates: &redis::TlsCertificates,
    ) -> Result<Node, LockError> {
        if !is_tls_url(url) {
            return Err(LockError::config(format!(
                "TLS certificates were configured, but {:?} is not a TLS URL: \
                 write it as rediss://host:port",
                redact(url)
            )));
        }
        tls::install_crypto_provider();
        let tls = tls::config(Some(certificates))?;
        let client = redis::Client::build_with_tls(url, certificates.clone()).map_err(|e| {
            LockError::config(format!(
                "cannot use Redis URL {:?} with the TLS certificates given to the builder",
                redact(url)
            ))
            .with_redis_source(e)
        })?;
        Ok(Node::with_client(client, Some(tls), connect_timeout))
    }

    /// The primary of `service` as the Sentinels at `sentinel_urls` name
    /// it, reached with the credentials and database of `primary` (for
    /// instance parsed from `redis://:password@host/db`, host ignored).
    /// Plain TCP only.
    pub(crate) fn sentinel(
        sentinel_urls: &[String],
        service: &str,
        primary: redis::RedisConnectionInfo,
        connect_timeout: Duration,
    ) -> Result<Node, LockError> {
        if sentinel_urls.is_empty() {
            return Err(LockError::config(
                "Sentinel needs at least one sentinel URL",
            ));
        }
        if service.is_empty() {
            return Err(LockError::config(
                "Sentinel needs the service name the sentinels monitor (sentinel monitor <name> ...)",
            ));
        }
        if let Some(url) = sentinel_urls.iter().find(|url| is_tls_url(url)) {
            return Err(LockError::config(format!(
                "{:?}: TLS to Sentinels is not supported; use redis:// URLs",
                redact(url)
            )));
        }
        let primary_protocol = primary.protocol();
        // Checks the URLs now, so a typo is a configuration error at build.
        let target = SentinelTarget::new(sentinel_urls, service, primary).map_err(|e| {
            let shown: Vec<String> = sentinel_urls.iter().map(|u| redact(u)).collect();
            LockError::config(format!("cannot use sentinel URLs {}", shown.join(", ")))
                .with_redis_source(e)
        })?;
        let hosts: Vec<String> = sentinel_urls
            .iter()
            .map(|url| {
                redis::IntoConnectionInfo::into_connection_info(url.as_str())
                    .map(|info| info.addr().to_string())
                    .unwrap_or_else(|_| redact(url))
            })
            .collect();
        // The primary is reached over lock-core's own connection (see
        // `Target::open`), opened where it is called; over RESP3, over the
        // `redis` crate's, opened on lock-core's runtime.
        let opens = match primary_protocol {
            redis::ProtocolVersion::RESP2 => Opens::WhereCalled,
            _ => Opens::Apart,
        };
        Ok(Node {
            target: Target::Sentinel(target),
            addr: format!("sentinel[{}]/{service}", hosts.join(", ")),
            connect_timeout,
            min_replicas: None,
            connection: SharedConnection::new(connect_timeout, connect_error, opens),
            native: OnceLock::new(),
        })
    }

    pub(crate) fn with_client(
        client: redis::Client,
        tls: Option<TlsConfig>,
        connect_timeout: Duration,
    ) -> Node {
        let info = client.get_connection_info();
        let addr = info.addr().to_string();
        // lock-core's own connection where it serves (see `Target::open`).
        let opens = match wire_target(info, tls.as_ref()) {
            Some(_) => Opens::WhereCalled,
            None => Opens::Apart,
        };
        Node {
            target: Target::Direct(client, tls),
            addr,
            connect_timeout,
            min_replicas: None,
            connection: SharedConnection::new(connect_timeout, connect_error, opens),
            native: OnceLock::new(),
        }
    }

    /// A server reached only through `conn`, the service's own connection:
    /// lock-core opens no connection of its own to it.
    pub(crate) fn with_connection(conn: UserConnection, connect_timeout: Duration) -> Node {
        Node {
            target: Target::User(conn),
            addr: "the connection given to the builder".to_owned(),
            connect_timeout,
            min_replicas: None,
            connection: SharedConnection::new(connect_timeout, connect_error, Opens::WhereCalled),
            native: OnceLock::new(),
        }
    }

    /// A client for further connections to the same server; `None` for a
    /// Sentinel node, whose server changes with failovers, and for the
    /// service's connection, which cannot subscribe beside its calls.
    pub(crate) fn redis_client(&self) -> Option<redis::Client> {
        match &self.target {
            Target::Direct(client, _) => Some(client.clone()),
            Target::Sentinel(_) | Target::User(_) => None,
        }
    }

    /// The same server through connections of its own (see
    /// [`Backend::twin`](super::Backend::twin)). A Sentinel node's twin
    /// follows the same answer of the Sentinels: whichever of the two
    /// learns of a failover moves the other.
    pub(crate) fn twin(&self) -> Node {
        Node {
            target: self.target.clone(),
            addr: self.addr.clone(),
            connect_timeout: self.connect_timeout,
            min_replicas: self.min_replicas,
            connection: self.connection.twin(),
            native: self.native.clone(),
        }
    }

    /// Releases from now on name `holder`'s dated values to the server's
    /// own compare-and-delete where its connection found one.
    pub(crate) fn release_natively(&self, holder: &Arc<Holder>) {
        let _ = self.native.set(Arc::clone(holder));
    }

    /// The server's address, without credentials.
    pub(crate) fn addr(&self) -> &str {
        &self.addr
    }
}

impl Server for Node {
    type Conn = Conn;

    fn addr(&self) -> &str {
        &self.addr
    }

    fn min_replicas(&self) -> Option<MinReplicas> {
        self.min_replicas
    }

    fn native_value<'s>(&'s self, token: &'s Token) -> Option<Stamped<'s>> {
        let value = Stamped {
            token,
            holder: Some(self.native.get()?),
        };
        value.exact().then_some(value)
    }

    fn native_support(conn: &Conn) -> Option<&Support> {
        match conn {
            Conn::Wire(wire) => Some(wire.native()),
            Conn::Multiplexed(_) | Conn::User(_) => None,
        }
    }

    fn call<'a, T, F, Fut>(
        &'a self,
        limit: Duration,
        retry_on_drop: bool,
        f: F,
    ) -> BoxFuture<'a, Result<T, LockError>>
    where
        T: Send + 'a,
        F: Fn(Conn) -> Fut + Send + Sync + 'a,
        Fut: Future<Output = redis::RedisResult<T>> + Send + 'a,
    {
        Box::pin(async move {
            if let Target::Sentinel(target) = &self.target {
                self.follow(target);
            }
            let failure = |e: redis::RedisError| {
                if let (Target::Sentinel(target), true) = (&self.target, is_read_only(&e)) {
                    // The server we reach is a replica now (a failover
                    // happened): every connection of the client asks the
                    // Sentinels again, and the caller may retry.
                    target
                        .view()
                        .forget(self.connection.current().map_or(0, |s| s.generation));
                    return Failure::Replace(
                        LockError::new(ErrorKind::Unavailable)
                            .with_message(format!(
                                "{} answered as a replica (READONLY): a failover is under way; \
                                 reconnecting to the new primary",
                                self.addr
                            ))
                            .with_redis_source(e),
                    );
                }
                if e.is_connection_dropped() || e.is_unrecoverable_error() {
                    return connection::lost(&self.addr, e);
                }
                Failure::Answer(from_redis(e))
            };
            self.connection
                .call(
                    &self.addr,
                    limit,
                    retry_on_drop,
                    || self.target.clone().open(self.connect_timeout),
                    failure,
                    |served: Served| f(served.conn),
                )
                .await
        })
    }
}

impl Node {
    /// Keeps a Sentinel node's connection on the Sentinels' current answer:
    /// drops a connection opened for an older answer, so the next call
    /// connects where the answer says (the twin's learning of a failover,
    /// or the background lookups', moves this node too).
    fn follow(&self, target: &SentinelTarget) {
        target.watch(self.connect_timeout);
        let generation = target.view().generation();
        self.connection
            .retire_if(|served| served.generation != generation);
    }
}

impl Node {
    /// Compare-and-delete sent without waiting for its reply, over
    /// lock-core's own connection: returns once it is written (see
    /// [`Wire::send_unheard`]). Over the `redis` crate's connection (Unix
    /// sockets, RESP3, Sentinel) the reply is awaited as for
    /// [`release`](Self::release), and so is the first release on such a
    /// connection, which loads the script where the server lacks it. A
    /// failure the reply reports later is logged and counted; the lease then
    /// expires by itself. That includes the one release sent by SHA just
    /// after an operator's `SCRIPT FLUSH` (answered `NOSCRIPT`; the next one
    /// waits again and reloads).
    pub(crate) async fn send_release(
        &self,
        key: &str,
        token: &Token,
        wake: Wake,
        limit: Duration,
    ) -> Result<(), LockError> {
        let hear = || Hear::Log(observe::unheard_release);
        self.send_release_hearing(key, token, wake, limit, hear)
            .await
    }

    /// [`send_release`](Self::send_release), its reply heard by what
    /// `hear` makes.
    pub(crate) async fn send_release_hearing(
        &self,
        key: &str,
        token: &Token,
        wake: Wake,
        limit: Duration,
        hear: impl Fn() -> Hear + Send + Sync,
    ) -> Result<(), LockError> {
        let hear = &hear;
        // Sent without waiting, a native release always tells everyone.
        let value = self.native_value(token).filter(|_| wake == Wake::Everyone);
        self.call(limit, false, |mut conn| async move {
            match (unheard_form(&conn, value, true), &conn) {
                (Some(Form::Native(value)), Conn::Wire(wire)) => {
                    let [delete, wake_up] = native::release_commands(key, value);
                    wire.send_unheard_all([(&delete, hear()), (&wake_up, Hear::Log(drop))])
                        .await
                }
                (Some(Form::Script), Conn::Wire(wire)) => {
                    let inv = scripts::release_call(key, token, wake);
                    wire.send_unheard(inv.cmd(), hear()).await
                }
                // The first release on a connection waits: by the native
                // command, to learn whether the server allows it; by the
                // script (also the first after a `SCRIPT FLUSH`), to load
                // it if the server lacks it, which a release nobody hears
                // could not do.
                _ => {
                    self.release_awaited(&mut conn, key, token, value, wake)
                        .await
                }
            }
        })
        .await
    }

    /// The awaited form of a release sent without waiting (see
    /// [`send_release`](Self::send_release)): natively where the
    /// connection may try, else by the script.
    async fn release_awaited(
        &self,
        conn: &mut Conn,
        key: &str,
        token: &Token,
        value: Option<Stamped<'_>>,
        wake: Wake,
    ) -> redis::RedisResult<()> {
        if let (Some(value), Conn::Wire(wire)) = (value, &*conn) {
            let wire = wire.clone();
            let usable = wire.native().usable();
            let (released, told) = native::release(conn, key, (token, value), wake, usable).await?;
            told.record(wire.native());
            if released.is_some() {
                return Ok(());
            }
        }
        scripts::release_call(key, token, wake)
            .invoke::<i64>(conn)
            .await?;
        if let Conn::Wire(wire) = conn {
            wire.mark_scripts_loaded();
        }
        Ok(())
    }
}

impl Node {
    /// [`send_release`](Self::send_release) without waiting for anything:
    /// whether the compare-and-delete is written to the server's socket
    /// now. Only over lock-core's own connection, open and with its
    /// scripts loaded; otherwise `false`, and the caller releases some
    /// other way (the command is safe to repeat).
    pub(crate) fn release_now(&self, key: &str, token: &Token, wake: Wake) -> bool {
        self.release_now_hearing(key, token, wake, || Hear::Log(observe::unheard_release))
    }

    /// [`release_now`](Self::release_now), its reply heard by what `hear`
    /// makes.
    pub(crate) fn release_now_hearing(
        &self,
        key: &str,
        token: &Token,
        wake: Wake,
        hear: impl FnOnce() -> Hear,
    ) -> bool {
        let Some(conn) = self.connection.current().map(|served| served.conn) else {
            return false;
        };
        let value = self.native_value(token).filter(|_| wake == Wake::Everyone);
        // Nothing can wait here (a runtime shutting down, a process about
        // to exit): a connection that has not asked yet runs the script.
        match (unheard_form(&conn, value, false), &conn) {
            (Some(Form::Native(value)), Conn::Wire(wire)) => {
                let [delete, wake_up] = native::release_commands(key, value);
                wire.send_unheard_all_now([(&delete, hear()), (&wake_up, Hear::Log(drop))])
            }
            (Some(Form::Script), Conn::Wire(wire)) => {
                let inv = scripts::release_call(key, token, wake);
                wire.send_unheard_now(inv.cmd(), hear())
            }
            _ => false,
        }
    }
}

/// How a release goes without waiting for its reply.
enum Form<'v> {
    /// By the server's compare-and-delete, of this value.
    Native(Stamped<'v>),
    /// By the script, loaded on the connection.
    Script,
}

/// How a release of what may be `value` goes over `conn` without waiting
/// for its reply; `None` when it must wait (the `redis` crate's
/// connection, a script not known loaded). With `may_ask`, also when the
/// connection has not yet asked whether the native command may be used,
/// which only an awaited release asks; without, such a release runs the
/// script.
fn unheard_form<'v>(conn: &Conn, value: Option<Stamped<'v>>, may_ask: bool) -> Option<Form<'v>> {
    let Conn::Wire(wire) = conn else {
        return None;
    };
    match (value, wire.native().usable()) {
        (Some(value), Use::Yes) => Some(Form::Native(value)),
        (Some(_), Use::Ask) if may_ask => None,
        _ => wire.scripts_loaded().then_some(Form::Script),
    }
}

/// The error for a connection that could not be opened. A refusal the
/// server answered (a wrong password, a missing permission) and a TLS
/// handshake that failed keep their own explanation; anything else says the
/// server could not be reached.
fn connect_error(addr: &str, err: redis::RedisError) -> LockError {
    #[cfg(feature = "tls")]
    if let Some(hint) = tls::handshake_hint(&err) {
        return LockError::config(format!("TLS handshake with {addr} failed; {hint}"))
            .with_redis_source(err);
    }
    let err = from_redis(err);
    if err.kind() == ErrorKind::Unavailable {
        err.with_message(format!("cannot connect to {addr}"))
    } else {
        err
    }
}

/// Whether `err` is a server refusing a write because it is a replica, at
/// the top level (`READONLY ...`) or from inside a script.
pub(super) fn is_read_only(err: &redis::RedisError) -> bool {
    err.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly)
        || err.code() == Some("READONLY")
        || err.to_string().contains("READONLY")
}

/// Where lock-core's own connection serves a server, as its host, port
/// and TLS configuration: over plain TCP, or over TLS with a configuration
/// of its own and the server's certificate checked, speaking RESP2.
fn wire_target<'a>(
    info: &'a redis::ConnectionInfo,
    tls: Option<&'a TlsConfig>,
) -> Option<(&'a str, u16, Option<&'a TlsConfig>)> {
    if info.redis_settings().protocol() != redis::ProtocolVersion::RESP2 {
        return None;
    }
    match info.addr() {
        redis::ConnectionAddr::Tcp(host, port) => Some((host, *port, None)),
        redis::ConnectionAddr::TcpTls {
            host,
            port,
            insecure: false,
            ..
        } => Some((host, *port, Some(tls?))),
        _ => None,
    }
}

/// Whether `url` asks for TLS (`rediss://` or `valkeys://`).
fn is_tls_url(url: &str) -> bool {
    url.split_once("://").is_some_and(|(scheme, _)| {
        scheme.eq_ignore_ascii_case("rediss") || scheme.eq_ignore_ascii_case("valkeys")
    })
}

/// TLS through rustls: the crypto provider, checks of the certificates
/// given, and explanations for failed handshakes.
#[cfg(feature = "tls")]
mod tls {
    use crate::error::LockError;

    /// What lock-core's own `rediss://` connections trust and present:
    /// `certificates`, or the system's trust store without them.
    pub(super) fn config(
        certificates: Option<&redis::TlsCertificates>,
    ) -> Result<super::TlsConfig, LockError> {
        super::TlsConfig::new(certificates)
            .map_err(|why| LockError::config(format!("cannot set up TLS: {why}")))
    }

    /// Makes rustls' `ring` provider the process default, unless the
    /// application installed one (of its choice) before.
    ///
    /// The `redis` crate and lock-core's own connection build their rustls
    /// configuration from the process default, and rustls finds none by
    /// itself when no provider or more than one was compiled in.
    pub(super) fn install_crypto_provider() {
        if rustls::crypto::CryptoProvider::get_default().is_none() {
            // Losing a race to another thread is fine: a provider is set.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
    }

    /// What to check when a TLS handshake failed, or `None` when `err` is
    /// not a handshake failure.
    ///
    /// A handshake's rustls error arrives inside an I/O error that hides
    /// its type (from the `redis` crate's connection and from tokio-rustls
    /// alike), so they are told apart by rustls' wording.
    pub(super) fn handshake_hint(err: &redis::RedisError) -> Option<&'static str> {
        if !err.is_io_error() {
            return None;
        }
        let text = err.to_string();
        if text.contains("invalid peer certificate") {
            Some(
                "the server's certificate is not trusted: check that the CA certificate given \
                 to tls_root_certificate (or, without one, the system's trust store) issued \
                 it, that it names the host of the URL, and that it has not expired",
            )
        } else if text.contains("received fatal alert") {
            Some(
                "the server refused the handshake: if it requires client certificates \
                 (tls-auth-clients yes), give one with tls_client_certificate; check that \
                 it accepts TLS 1.2 or 1.3",
            )
        } else if text.contains("received corrupt message")
            || text.contains("peer is incompatible")
            || text.contains("peer misbehaved")
            || text.contains("peer sent no certificates")
        {
            Some("check that the port serves TLS (rediss://) and not plain TCP (redis://)")
        } else {
            None
        }
    }
}

/// A URL with its password replaced, for messages.
pub(crate) fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            format!("{}://***@{}", &url[..scheme_end], &url[at + 1..])
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redact_hides_credentials() {
        assert_eq!(redact("redis://:pw@host:1/0"), "redis://***@host:1/0");
        assert_eq!(redact("redis://u:pw@host"), "redis://***@host");
        assert_eq!(redact("redis://host:6379"), "redis://host:6379");
    }

    #[test]
    fn read_only_answers_are_recognised() {
        let top = redis::RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly),
            "You can't write against a read only replica.",
        ));
        assert!(is_read_only(&top));
        let in_script = redis::RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError),
            "Error running script",
            "READONLY You can't write against a read only replica. script: abc".to_owned(),
        ));
        assert!(is_read_only(&in_script));
        let other = redis::RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError),
            "WRONGTYPE Operation against a key holding the wrong kind of value",
        ));
        assert!(!is_read_only(&other));
    }

    #[test]
    fn sentinel_nodes_check_their_settings() {
        let limit = Duration::from_secs(1);
        let none = redis::RedisConnectionInfo::default;
        assert!(Node::sentinel(&[], "m", none(), limit).is_err());
        let urls = ["redis://127.0.0.1:26379".to_owned()];
        assert!(Node::sentinel(&urls, "", none(), limit).is_err());
        let node = Node::sentinel(&urls, "m", none(), limit);
        assert!(node.as_ref().is_ok_and(|n| n.redis_client().is_none()));
        assert!(node.is_ok_and(|n| n.addr() == "sentinel[127.0.0.1:26379]/m"));
        let tls = ["rediss://127.0.0.1:26379".to_owned()];
        assert!(Node::sentinel(&tls, "m", none(), limit).is_err());
    }

    #[test]
    fn tls_urls_are_recognised() {
        assert!(is_tls_url("rediss://host:6380"));
        assert!(is_tls_url("REDISS://host"));
        assert!(is_tls_url("valkeys://u:p@host"));
        assert!(!is_tls_url("redis://host:6379"));
        assert!(!is_tls_url("unix:///tmp/redis.sock"));
        assert!(!is_tls_url("rediss"));
    }

    #[cfg(not(feature = "tls"))]
    #[test]
    fn rediss_without_the_tls_feature_says_to_enable_it() {
        let Err(err) = Node::new("rediss://:pw@127.0.0.1:1", Duration::from_secs(1)) else {
            panic!("a rediss URL must be refused without the tls feature");
        };
        assert_eq!(err.kind(), ErrorKind::Config);
        let text = err.to_string();
        assert!(text.contains("enable the `tls` feature"), "{text}");
        assert!(!text.contains("pw"), "{text}");
    }

    #[cfg(feature = "tls")]
    #[test]
    fn rediss_with_the_tls_feature_is_accepted() {
        let node = Node::new("rediss://127.0.0.1:1", Duration::from_secs(1));
        assert!(node.is_ok());
    }
}
