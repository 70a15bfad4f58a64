//! Where locks live. Today: one Redis server.

mod node;

pub(crate) use node::Node;
pub(crate) use node::redact;

use crate::error::LockError;
use crate::scripts;
use crate::token::Token;
use std::time::Duration;

/// The answer to one acquisition attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Attempt {
    /// The lock is ours; `fence` is set when a fencing token was asked for.
    Granted { fence: Option<u64> },
    /// Someone else holds it.
    Busy,
}

/// The storage behind a client.
pub(crate) enum Backend {
    Single(Node),
}

/// The keys one lock touches; they share a hash slot.
pub(crate) struct LockKeys<'a> {
    pub(crate) lock: &'a str,
    pub(crate) fence: Option<&'a str>,
}

impl Backend {
    /// One acquisition attempt: `SET key token NX PX ttl`, or the fencing
    /// script.
    pub(crate) async fn acquire(
        &self,
        keys: LockKeys<'_>,
        token: &Token,
        ttl: Duration,
        limit: Duration,
    ) -> Result<Attempt, LockError> {
        let Backend::Single(node) = self;
        let ttl_ms = ttl_millis(ttl);
        match keys.fence {
            None => {
                let ok: Option<redis::Value> = node
                    .call(limit, false, |mut conn| {
                        let mut cmd = redis::cmd("SET");
                        cmd.arg(keys.lock)
                            .arg(token)
                            .arg("NX")
                            .arg("PX")
                            .arg(ttl_ms);
                        async move { cmd.query_async(&mut conn).await }
                    })
                    .await?;
                Ok(match ok {
                    Some(_) => Attempt::Granted { fence: None },
                    None => Attempt::Busy,
                })
            }
            Some(fence_key) => {
                let fence: u64 = node
                    .call(limit, false, |mut conn| {
                        let mut inv = scripts::ACQUIRE_FENCED.key(keys.lock);
                        inv.key(fence_key).arg(token).arg(ttl_ms);
                        async move { inv.invoke_async(&mut conn).await }
                    })
                    .await?;
                Ok(if fence == 0 {
                    Attempt::Busy
                } else {
                    Attempt::Granted { fence: Some(fence) }
                })
            }
        }
    }

    /// Compare-and-pexpire. `Ok(false)`: the lock is no longer ours.
    pub(crate) async fn renew(
        &self,
        key: &str,
        token: &Token,
        ttl: Duration,
        limit: Duration,
    ) -> Result<bool, LockError> {
        let Backend::Single(node) = self;
        let ttl_ms = ttl_millis(ttl);
        let renewed: i64 = node
            .call(limit, true, |mut conn| {
                let mut inv = scripts::RENEW.key(key);
                inv.arg(token).arg(ttl_ms);
                async move { inv.invoke_async(&mut conn).await }
            })
            .await?;
        Ok(renewed == 1)
    }

    /// Compare-and-delete. `Ok(false)`: the lock was no longer ours.
    pub(crate) async fn release(
        &self,
        key: &str,
        token: &Token,
        limit: Duration,
    ) -> Result<bool, LockError> {
        let Backend::Single(node) = self;
        let released: i64 = node
            .call(limit, true, |mut conn| {
                let mut inv = scripts::RELEASE.key(key);
                inv.arg(token);
                async move { inv.invoke_async(&mut conn).await }
            })
            .await?;
        Ok(released == 1)
    }

    /// A round trip that proves the server answers.
    pub(crate) async fn ping(&self, limit: Duration) -> Result<(), LockError> {
        let Backend::Single(node) = self;
        node.call(limit, false, |mut conn| async move {
            redis::cmd("PING").query_async::<String>(&mut conn).await
        })
        .await
        .map(drop)
    }

    /// Where the locks live, for messages.
    pub(crate) fn describe(&self) -> String {
        let Backend::Single(node) = self;
        node.addr().to_owned()
    }
}

/// Milliseconds for `PX`/`PEXPIRE`, never below 1 (0 would be an error).
fn ttl_millis(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1)
}
