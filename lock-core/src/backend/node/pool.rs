//! A connection pool the service already has, given to the builder
//! ([`pool`](crate::LockClientBuilder::pool)): `deadpool-redis`'s or
//! `bb8-redis`'s. It goes behind the same seam as a given connection
//! ([`UserConnection`]): each command, or pipeline, checks one connection
//! out of the pool and gives it back once answered, so the heartbeat's
//! renewals and the service's own commands share the pool's connections
//! and its limits (its size, its wait for a free connection). lock-core
//! neither opens nor replaces connections: the pool does.
//!
//! A pool error becomes a `redis` error: the server's or the connection's
//! own as it is, any other (the pool closed, its wait timed out) an I/O
//! error, which lock-core reports as [`Unavailable`](crate::ErrorKind::Unavailable).

use super::UserConnection;
use redis::aio::ConnectionLike;
use redis::{Cmd, Pipeline, RedisError, RedisFuture, Value};

/// A pool of connections to one Redis server that
/// [`LockClientBuilder::pool`](crate::LockClientBuilder::pool) takes:
/// `deadpool_redis::Pool` (feature `deadpool-redis`) and
/// `bb8::Pool<bb8_redis::RedisConnectionManager>` (feature `bb8-redis`).
/// Sealed: lock-core implements it for those two only.
pub trait RedisPool: sealed::Sealed {}

mod sealed {
    /// What lock-core does with a pool: the seam every given connection
    /// goes through.
    pub trait Sealed {
        fn into_connection(self) -> Pooled;
    }

    /// A pool behind the seam. Public in this private module only, so
    /// that the sealed trait may name it.
    pub struct Pooled(pub(super) super::UserConnection);
}

use sealed::Pooled;

/// `pool` as the builder's connection.
pub(crate) fn connection_of(pool: impl RedisPool) -> UserConnection {
    sealed::Sealed::into_connection(pool).0
}

/// A pool's failure that is not a `redis` error, as an I/O error.
fn checkout_failed(pool: &str, what: impl std::fmt::Display) -> RedisError {
    RedisError::from(std::io::Error::other(format!(
        "no connection from the {pool} pool: {what}"
    )))
}

#[cfg(feature = "deadpool-redis")]
mod deadpool {
    use super::*;
    use deadpool_redis::{Pool, PoolError};

    impl RedisPool for Pool {}

    impl sealed::Sealed for Pool {
        fn into_connection(self) -> Pooled {
            Pooled(UserConnection::new(Deadpool(self)))
        }
    }

    /// Each command over a connection checked out of the pool.
    #[derive(Clone)]
    struct Deadpool(Pool);

    impl Deadpool {
        async fn checkout(&self) -> Result<deadpool_redis::Connection, RedisError> {
            self.0.get().await.map_err(|e| match e {
                PoolError::Backend(e) => e,
                other => checkout_failed("deadpool-redis", other),
            })
        }
    }

    impl ConnectionLike for Deadpool {
        fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
            Box::pin(async move { self.checkout().await?.req_packed_command(cmd).await })
        }

        fn req_packed_commands<'a>(
            &'a mut self,
            pipeline: &'a Pipeline,
            offset: usize,
            count: usize,
        ) -> RedisFuture<'a, Vec<Value>> {
            Box::pin(async move {
                let mut conn = self.checkout().await?;
                conn.req_packed_commands(pipeline, offset, count).await
            })
        }

        fn get_db(&self) -> i64 {
            // lock-core sends no SELECT: the pool's connections are in
            // whatever database the pool's URL names.
            0
        }
    }
}

#[cfg(feature = "bb8-redis")]
mod bb8 {
    use super::*;
    use bb8_redis::RedisConnectionManager;
    use bb8_redis::bb8::{Pool, RunError};

    impl RedisPool for Pool<RedisConnectionManager> {}

    impl sealed::Sealed for Pool<RedisConnectionManager> {
        fn into_connection(self) -> Pooled {
            Pooled(UserConnection::new(Bb8(self)))
        }
    }

    /// Each command over a connection checked out of the pool.
    #[derive(Clone)]
    struct Bb8(Pool<RedisConnectionManager>);

    fn checkout_error(e: RunError<RedisError>) -> RedisError {
        match e {
            RunError::User(e) => e,
            RunError::TimedOut => checkout_failed("bb8-redis", "timed out"),
        }
    }

    impl ConnectionLike for Bb8 {
        fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
            Box::pin(async move {
                let mut conn = self.0.get().await.map_err(checkout_error)?;
                conn.req_packed_command(cmd).await
            })
        }

        fn req_packed_commands<'a>(
            &'a mut self,
            pipeline: &'a Pipeline,
            offset: usize,
            count: usize,
        ) -> RedisFuture<'a, Vec<Value>> {
            Box::pin(async move {
                let mut conn = self.0.get().await.map_err(checkout_error)?;
                conn.req_packed_commands(pipeline, offset, count).await
            })
        }

        fn get_db(&self) -> i64 {
            // As for deadpool: lock-core sends no SELECT.
            0
        }
    }
}
