//! A connection the service already has, given to the builder
//! ([`connection`](crate::LockClientBuilder::connection)): anything the
//! `redis` crate can send commands over that clones cheaply into another
//! handle on the same connection (its `MultiplexedConnection`,
//! `ConnectionManager`, a cluster connection). lock-core neither opens nor
//! replaces it: every call, the heartbeat's too, goes over a clone.

use redis::aio::ConnectionLike;
use redis::{Cmd, Pipeline, RedisFuture, Value};
use std::fmt;

/// What lock-core needs of a user's connection: the `redis` crate's
/// `ConnectionLike`, and a clone of it behind a box.
trait Given: ConnectionLike + Send + Sync {
    fn boxed_clone(&self) -> Box<dyn Given>;
}

impl<C> Given for C
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    fn boxed_clone(&self) -> Box<dyn Given> {
        Box::new(self.clone())
    }
}

/// A user's connection, of whatever type it is.
pub(crate) struct UserConnection(Box<dyn Given>);

impl UserConnection {
    pub(crate) fn new<C>(conn: C) -> UserConnection
    where
        C: ConnectionLike + Clone + Send + Sync + 'static,
    {
        UserConnection(Box::new(conn))
    }
}

impl Clone for UserConnection {
    fn clone(&self) -> Self {
        UserConnection(self.0.boxed_clone())
    }
}

impl fmt::Debug for UserConnection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("UserConnection { .. }")
    }
}

impl ConnectionLike for UserConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        self.0.req_packed_command(cmd)
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        self.0.req_packed_commands(pipeline, offset, count)
    }

    fn get_db(&self) -> i64 {
        self.0.get_db()
    }
}
