//! Wait records on one server connection, over [`Server::call`]: what a
//! waiter writes so that operators see it and other waiters can follow it
//! (see `waits.rs` at the crate root and `docs/deadlocks.md`), and the
//! reads the deadlock walk makes.

use super::Server;
use crate::error::LockError;
use crate::scripts::{self, Eval};
use redis::Value;
use std::time::Duration;

/// What one step of the walk read at a lock key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Hop {
    /// The lock's value: who holds it (`None`: free, or not an exclusive
    /// lock).
    pub(crate) value: Option<String>,
    /// The wait note beside it: what the holder that wrote it waits for.
    pub(crate) notes: Vec<String>,
}

/// The waiters of one key as a server listed them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct WaitersAt {
    /// The server's clock, in milliseconds since 1970.
    pub(crate) now_ms: i64,
    /// The live members of the key's waiters set.
    pub(crate) members: Vec<String>,
}

/// A waiter's records, as written to each server.
pub(crate) struct WaitRecords<'a> {
    /// The waiters set of each key waited for, and the member in them.
    pub(crate) sets: &'a [String],
    pub(crate) member: &'a str,
    /// The wait note of each key the waiter holds, and its value.
    pub(crate) notes: &'a [(String, String)],
}

/// The wait-record commands, for every kind of server connection.
pub(crate) trait WaitCommands: Server {
    /// Writes (or refreshes) every record of a waiter, lasting `ttl`.
    async fn record_wait(
        &self,
        records: &WaitRecords<'_>,
        ttl: Duration,
        limit: Duration,
    ) -> Result<(), LockError> {
        let ttl_ms = ttl.as_millis().max(1) as u64;
        let sets = records.sets.iter().map(|set| {
            self.call(limit, true, move |mut conn| {
                let mut inv = Eval::new(&scripts::WAIT_RECORD, 1);
                inv.key(set.as_str()).arg(records.member).arg(ttl_ms);
                async move { inv.invoke::<i64>(&mut conn).await.map(drop) }
            })
        });
        let notes = records.notes.iter().map(|(note, value)| {
            self.call(limit, true, move |mut conn| {
                let mut inv = Eval::new(&scripts::WAIT_RECORD, 1);
                inv.key(note.as_str()).arg(value.as_str()).arg(ttl_ms);
                async move { inv.invoke::<i64>(&mut conn).await.map(drop) }
            })
        });
        let (sets, notes) = futures::future::join(
            futures::future::join_all(sets),
            futures::future::join_all(notes),
        )
        .await;
        sets.into_iter().chain(notes).collect()
    }

    /// Removes a waiter's records (a note only while it is still its own).
    async fn forget_wait(
        &self,
        records: &WaitRecords<'_>,
        limit: Duration,
    ) -> Result<(), LockError> {
        let sets = records.sets.iter().map(|set| {
            self.call(limit, true, move |mut conn| {
                let mut cmd = redis::cmd("ZREM");
                cmd.arg(set).arg(records.member);
                async move { cmd.query_async::<()>(&mut conn).await }
            })
        });
        let notes = records.notes.iter().map(|(note, value)| {
            self.call(limit, true, move |mut conn| {
                let mut cmd = redis::cmd("ZREM");
                cmd.arg(note).arg(value);
                async move { cmd.query_async::<()>(&mut conn).await }
            })
        });
        let (sets, notes) = futures::future::join(
            futures::future::join_all(sets),
            futures::future::join_all(notes),
        )
        .await;
        sets.into_iter().chain(notes).collect()
    }

    /// Reads a lock key and its wait note (one slot: one script).
    async fn hop(&self, lock: &str, note: &str, limit: Duration) -> Result<Hop, LockError> {
        self.call(limit, true, |mut conn| {
            let mut inv = Eval::new(&scripts::WAIT_HOP, 2);
            inv.key(lock).key(note);
            async move {
                let (value, notes): (Option<String>, Vec<String>) = inv.invoke(&mut conn).await?;
                Ok(Hop { value, notes })
            }
        })
        .await
    }

    /// The live members of a waiters set, and the server's clock.
    async fn waiters(&self, set: &str, limit: Duration) -> Result<WaitersAt, LockError> {
        self.call(limit, true, |mut conn| {
            let mut inv = Eval::new(&scripts::WAITERS, 1);
            inv.key(set);
            async move {
                let answer: Vec<Value> = inv.invoke(&mut conn).await?;
                let mut answer = answer.into_iter();
                let now_ms = match answer.next() {
                    Some(v) => redis::from_redis_value::<i64>(v)?,
                    None => 0,
                };
                let members = answer
                    .map(redis::from_redis_value::<String>)
                    .collect::<Result<_, _>>()?;
                Ok(WaitersAt { now_ms, members })
            }
        })
        .await
    }
}

impl<S: Server> WaitCommands for S {}
