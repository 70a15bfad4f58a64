//! What lock-core needs of a connection to Redis: one bounded call. The lock
//! commands ([`LockCommands`](super::LockCommands)) and the operators'
//! ([`OperatorCommands`](super::OperatorCommands)) are written once over it,
//! as provided methods, the way redis-rs writes its commands over
//! `ConnectionLike`; [`Node`](super::Node) (one server) and
//! [`ClusterNode`](super::ClusterNode) (a Redis Cluster, each command sent to
//! its keys' slot) implement it.

use super::MinReplicas;
use super::wire::native::Support;
use crate::error::LockError;
use crate::scripts::Wake;
use crate::token::{Stamped, Token};
use futures::future::BoxFuture;
use redis::aio::ConnectionLike;
use std::future::Future;
use std::time::Duration;

/// A server connection lock-core's commands run over.
pub(crate) trait Server: Sync {
    /// What one call is handed: a clone of the shared connection.
    type Conn: ConnectionLike + Send + 'static;

    /// Where the server is, without credentials, for messages.
    fn addr(&self) -> &str;

    /// `WAIT n timeout` after each acquisition, when set.
    fn min_replicas(&self) -> Option<MinReplicas>;

    /// Whom a release here tells: everyone subscribed, or (a cluster) only
    /// while a waiter has marked that it listens.
    fn wake(&self) -> Wake {
        Wake::Everyone
    }

    /// The value `token`'s exclusive lock holds here, to the byte, when a
    /// release of it may go by the server's own compare-and-delete (see
    /// `native`): a dated token, on a client that releases natively.
    fn native_value<'s>(&'s self, _token: &'s Token) -> Option<Stamped<'s>> {
        None
    }

    /// How a release over `conn` may use the native command, and where
    /// what it is answered is recorded.
    fn native_support(_conn: &Self::Conn) -> Option<&Support> {
        None
    }

    /// Runs `f` on the shared connection, bounded by `limit` in all
    /// (waiting for a connection included). A broken connection is
    /// replaced; with `retry_on_drop`, `f` runs once more on the new one:
    /// only for calls that are safe to repeat (the compare-and-delete and
    /// compare-and-pexpire scripts).
    ///
    /// Boxed: a future of a concrete type, so that the commands written over
    /// it stay `Send` where they are spawned (an opaque future per server
    /// type here runs into the compiler's limits on proving that for
    /// futures generic over the connection). One allocation per round trip.
    fn call<'a, T, F, Fut>(
        &'a self,
        limit: Duration,
        retry_on_drop: bool,
        f: F,
    ) -> BoxFuture<'a, Result<T, LockError>>
    where
        T: Send + 'a,
        F: Fn(Self::Conn) -> Fut + Send + Sync + 'a,
        Fut: Future<Output = redis::RedisResult<T>> + Send + 'a;
}
