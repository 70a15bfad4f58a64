//! The lock commands on one server connection, over [`Server::call`].

use super::cluster::is_migrating;
use super::native::{self, Use};
use super::wire::native::Support;
use super::{
    Attempt, BATCH, Batched, LockKeys, MinReplicas, Renewable, Server, Several, SharedAttempt,
    SharedKeys, SharedLease,
};
use crate::error::{ErrorKind, LockError};
use crate::lease::fence_retention;
use crate::scripts::{self, Eval, Wake};
use crate::token::Token;
use futures::StreamExt;
use futures::future::join_all;
use std::time::Duration;

/// How many batched renewal calls go out at once: enough to keep a fast
/// server busy, few enough that calls which time out under load do not queue
/// up ahead of the next round's.
pub(super) const RENEW_WINDOW: usize = 8;

/// The lock commands, for every kind of server connection: written once
/// over [`Server::call`], for [`Node`](super::Node) (one server) and
/// [`ClusterNode`](super::ClusterNode) (a Redis Cluster, where each command
/// goes to its keys' slot).
pub(crate) trait LockCommands: Server {
    /// One acquisition attempt: `SET key token NX PX ttl`, or the fencing
    /// script.
    ///
    /// With `min_replicas` set, a granted attempt is followed on the same
    /// connection by `WAIT replicas timeout`; when fewer replicas
    /// acknowledge, the lock is deleted again (compare-and-delete, same
    /// connection) and the attempt fails as [`ErrorKind::Unavailable`], so
    /// the acquisition loop retries within its wait.
    async fn acquire(
        &self,
        keys: &LockKeys<'_>,
        token: &Token,
        ttl: Duration,
        limit: Duration,
    ) -> Result<Attempt, LockError> {
        let started = tokio::time::Instant::now();
        match self.acquire_at_once(keys, token, ttl, limit).await {
            Err(e) if is_migrating(&e) => {
                let left = limit.saturating_sub(started.elapsed());
                self.acquire_key_by_key(keys, token, ttl, left).await
            }
            answer => answer,
        }
    }

    /// [`acquire`](Self::acquire) in one command.
    async fn acquire_at_once(
        &self,
        keys: &LockKeys<'_>,
        token: &Token,
        ttl: Duration,
        limit: Duration,
    ) -> Result<Attempt, LockError> {
        let ttl_ms = ttl_millis(ttl);
        let min = self.min_replicas();
        let (attempt, short) = match (keys.fence, keys.writer) {
            (None, None) => {
                self.call(limit, false, |mut conn| {
                    // Sized up front: no regrowth on the hot path.
                    let value = keys.value_of(token);
                    let mut cmd = scripts::command(6, 96 + keys.lock.len());
                    cmd.arg("SET")
                        .arg(keys.lock)
                        .arg(value)
                        .arg("NX")
                        .arg("PX")
                        .arg(ttl_ms);
                    async move {
                        let ok: Option<redis::Value> = cmd.query_async(&mut conn).await?;
                        if ok.is_none() {
                            return Ok((Attempt::HELD, None));
                        }
                        let short = replicate(&mut conn, min, &[keys.lock], token).await?;
                        Ok((Attempt::Granted { fence: None }, short))
                    }
                })
                .await?
            }
            (Some(fence_key), None) => {
                self.call(limit, false, |mut conn| {
                    let mut inv = Eval::new(&scripts::ACQUIRE_FENCED, 2);
                    inv.key(keys.lock)
                        .key(fence_key)
                        .arg(keys.value_of(token))
                        .arg(ttl_ms)
                        .arg(ttl_millis(fence_retention(ttl)));
                    async move {
                        let fence: u64 = inv.invoke(&mut conn).await?;
                        if fence == 0 {
                            return Ok((Attempt::HELD, None));
                        }
                        let short = replicate(&mut conn, min, &[keys.lock], token).await?;
                        Ok((Attempt::Granted { fence: Some(fence) }, short))
                    }
                })
                .await?
            }
            (fence_key, Some((writer, writer_for))) => {
                self.call(limit, false, |mut conn| {
                    let mut inv =
                        Eval::new(&scripts::ACQUIRE, 2 + usize::from(fence_key.is_some()));
                    inv.key(keys.lock).key(writer);
                    if let Some(fence_key) = fence_key {
                        inv.key(fence_key);
                    }
                    inv.arg(keys.value_of(token))
                        .arg(ttl_ms)
                        .arg(ttl_millis(writer_for));
                    if fence_key.is_some() {
                        inv.arg(ttl_millis(fence_retention(ttl)));
                    }
                    async move {
                        let answer: (i64, i64) = match inv.invoke(&mut conn).await? {
                            Reply { granted: 1, n, .. } => (1, n),
                            busy => return Ok((busy.busy(), None)),
                        };
                        let short = replicate(&mut conn, min, &[keys.lock], token).await?;
                        let fence = fence_key.map(|_| answer.1.max(0) as u64);
                        Ok((Attempt::Granted { fence }, short))
                    }
                })
                .await?
            }
        };
        match (short, min) {
            (Some(acked), Some(min)) => Err(too_few_replicas(acked, min, self.addr())),
            _ => Ok(attempt),
        }
    }

    /// [`acquire`](Self::acquire) while the key's slot migrates and some of
    /// the keys of the one-command form are on the other side (see
    /// `cluster.rs`): with commands of one key each, which always complete
    /// on one side or the other. The lock is taken without its writer mark
    /// (which only keeps shared holders out while an exclusive one waits);
    /// fenced, the counter then gives the next token and the lock's value
    /// gets it, while the lock is still ours. The token is as good as the
    /// one-command form's: the counter is raised while the lock is held,
    /// so the next holder's token, drawn after this lock is gone, is
    /// larger. Should a step fail, the lock is released again.
    async fn acquire_key_by_key(
        &self,
        keys: &LockKeys<'_>,
        token: &Token,
        ttl: Duration,
        limit: Duration,
    ) -> Result<Attempt, LockError> {
        let started = tokio::time::Instant::now();
        let left = || limit.saturating_sub(started.elapsed());
        let ttl_ms = ttl_millis(ttl);
        let reply: Reply = self
            .call(left(), false, |mut conn| {
                let mut inv = Eval::new(&scripts::ACQUIRE, 1);
                inv.key(keys.lock)
                    .arg(keys.value_of(token))
                    .arg(ttl_ms)
                    .arg(0);
                async move { inv.invoke(&mut conn).await }
            })
            .await?;
        if reply.granted != 1 {
            return Ok(reply.busy());
        }
        let Some(fence_key) = keys.fence else {
            return Ok(Attempt::Granted { fence: None });
        };
        let keep = ttl_millis(fence_retention(ttl));
        let fenced = async {
            let fence: u64 = self
                .call(left(), false, |mut conn| {
                    let mut inv = Eval::new(&scripts::NEXT_FENCE, 1);
                    inv.key(fence_key).arg(keep);
                    async move { inv.invoke(&mut conn).await }
                })
                .await?;
            let marked: i64 = self
                .call(left(), true, |mut conn| {
                    let mut inv = Eval::new(&scripts::MARK_FENCE, 1);
                    inv.key(keys.lock).arg(token).arg(fence);
                    async move { inv.invoke(&mut conn).await }
                })
                .await?;
            Ok::<_, LockError>((fence, marked == 1))
        };
        match fenced.await {
            Ok((fence, true)) => Ok(Attempt::Granted { fence: Some(fence) }),
            // Gone meanwhile (expired): as if found held.
            Ok((_, false)) => Ok(Attempt::HELD),
            Err(e) => {
                let _ = self
                    .undo(keys.lock, token, left().max(Duration::from_millis(1)))
                    .await;
                Err(e)
            }
        }
    }

    /// Takes over a lease handed off in-process: the new holder's ttl, and a
    /// new fencing token when `keys.fence` is set. `Ok(None)`: not ours.
    async fn take_over(
        &self,
        keys: &LockKeys<'_>,
        token: &Token,
        ttl: Duration,
        limit: Duration,
    ) -> Result<Option<Attempt>, LockError> {
        let ttl_ms = ttl_millis(ttl);
        let answer: u64 = self
            .call(limit, true, |mut conn| {
                let mut inv = Eval::new(&scripts::TAKE_OVER, 1 + usize::from(keys.fence.is_some()));
                inv.key(keys.lock);
                if let Some(fence_key) = keys.fence {
                    inv.key(fence_key);
                }
                inv.arg(token).arg(ttl_ms);
                if keys.fence.is_some() {
                    inv.arg(ttl_millis(fence_retention(ttl)));
                }
                async move { inv.invoke(&mut conn).await }
            })
            .await?;
        Ok(match (answer, keys.fence) {
            (0, _) => None,
            (fence, Some(_)) => Some(Attempt::Granted { fence: Some(fence) }),
            (_, None) => Some(Attempt::Granted { fence: None }),
        })
    }

    /// Renews the lease: its expiry raised to `ttl` if it is ours, never
    /// lowered. `Ok(false)`: the lock is no longer ours here.
    async fn renew(
        &self,
        key: &str,
        token: &Token,
        ttl: Duration,
        limit: Duration,
    ) -> Result<bool, LockError> {
        self.expire_if_ours(&scripts::RENEW, key, token, ttl, limit)
            .await
    }

    /// Sets the lease's expiry to exactly `ttl` if it is ours, shorter or
    /// longer. `Ok(false)`: the lock is no longer ours here.
    async fn set_ttl(
        &self,
        key: &str,
        token: &Token,
        ttl: Duration,
        limit: Duration,
    ) -> Result<bool, LockError> {
        self.expire_if_ours(&scripts::SET_TTL, key, token, ttl, limit)
            .await
    }

    /// [`renew`](Self::renew) or [`set_ttl`](Self::set_ttl): `script`
    /// takes the key, the token and the ttl, and answers 1 when ours.
    async fn expire_if_ours(
        &self,
        script: &'static redis::Script,
        key: &str,
        token: &Token,
        ttl: Duration,
        limit: Duration,
    ) -> Result<bool, LockError> {
        let ttl_ms = ttl_millis(ttl);
        let answer: i64 = self
            .call(limit, true, |mut conn| {
                let mut inv = Eval::new(script, 1);
                inv.key(key).arg(token).arg(ttl_ms);
                async move { inv.invoke(&mut conn).await }
            })
            .await?;
        Ok(answer == 1)
    }

    /// [`renew`](Self::renew) for many leases in one script call each
    /// [`BATCH`] of them, at most [`RENEW_WINDOW`] calls in flight, all
    /// within `limit`; the answers in order. A call that fails (a
    /// timeout under load, say) leaves only its own leases unanswered,
    /// and calls not sent when the time is up are not sent at all: a
    /// round too large for the server loses its tail, not all of it,
    /// and leaves at most the window's calls queued at the server.
    async fn renew_many<R: Renewable>(&self, due: &[R], limit: Duration) -> Batched {
        let until = tokio::time::Instant::now() + limit;
        // Made up front (each starts when first polled): a stream's
        // `map` closure here makes the heartbeat's future not `Send`
        // for the compiler.
        let calls: Vec<_> = due
            .chunks(BATCH)
            .map(|chunk| async move {
                let left = until.saturating_duration_since(tokio::time::Instant::now());
                let answer = if left.is_zero() {
                    Err(LockError::new(ErrorKind::Unavailable).with_message(
                        "the renewal round ran out of time before this batch was sent",
                    ))
                } else {
                    self.renew_batch(chunk, left).await
                };
                answer.map_err(|e| (e, chunk.len()))
            })
            .collect();
        let calls = futures::stream::iter(calls).buffered(RENEW_WINDOW);
        let mut batched = Batched {
            each: Vec::with_capacity(due.len()),
            error: None,
        };
        let answers: Vec<_> = calls.collect().await;
        for answer in answers {
            match answer {
                Ok(renewed) => batched
                    .each
                    .extend(renewed.into_iter().map(|r| Some(r == 1))),
                Err((e, len)) => {
                    batched.each.extend(std::iter::repeat_n(None, len));
                    batched.error.get_or_insert(e);
                }
            }
        }
        batched
    }

    /// One call of [`renew_many`](Self::renew_many): at most
    /// [`BATCH`] leases.
    async fn renew_batch<R: Renewable>(
        &self,
        chunk: &[R],
        limit: Duration,
    ) -> Result<Vec<i64>, LockError> {
        let renewed = self
            .call(limit, true, move |mut conn| {
                let mut inv = Eval::new(&scripts::RENEW_MANY, chunk.len());
                for d in chunk {
                    inv.key(d.storage_key());
                }
                for d in chunk {
                    inv.arg(d.token()).arg(ttl_millis(d.ttl()));
                }
                async move { inv.invoke::<Vec<i64>>(&mut conn).await }
            })
            .await?;
        if renewed.len() != chunk.len() {
            return Err(LockError::new(ErrorKind::Server)
                .with_message("the batch renewal answered for the wrong number of keys"));
        }
        Ok(renewed)
    }

    /// Compare-and-delete. `Ok(false)`: the lock was no longer ours here.
    async fn release(&self, key: &str, token: &Token, limit: Duration) -> Result<bool, LockError> {
        self.delete_if_ours(key, token, true, limit).await
    }

    /// [`release`](Self::release) telling no waiter: the undo of an
    /// attempt that did not win.
    async fn undo(&self, key: &str, token: &Token, limit: Duration) -> Result<bool, LockError> {
        self.delete_if_ours(key, token, false, limit).await
    }

    async fn delete_if_ours(
        &self,
        key: &str,
        token: &Token,
        publish: bool,
        limit: Duration,
    ) -> Result<bool, LockError> {
        let started = tokio::time::Instant::now();
        let wake = if publish { self.wake() } else { Wake::Nobody };
        let release = |wake: Wake, limit: Duration| {
            self.call(limit, true, move |mut conn| {
                let value = self.native_value(token).filter(|_| native::tells(wake));
                async move {
                    if let Some(value) = value {
                        let usable = Self::native_support(&conn).map_or(Use::No, Support::usable);
                        let (released, told) =
                            native::release(&mut conn, key, (token, value), wake, usable).await?;
                        if let Some(support) = Self::native_support(&conn) {
                            told.record(support);
                        }
                        if let Some(released) = released {
                            return Ok(i64::from(released));
                        }
                    }
                    scripts::release_call(key, token, wake)
                        .invoke::<i64>(&mut conn)
                        .await
                }
            })
        };
        let released = match release(wake, limit).await {
            // The listeners mark is on the other side of a slot migration:
            // the lock alone, publishing whether anyone listens or not.
            Err(e) if wake == Wake::Listeners && is_migrating(&e) => {
                release(Wake::Everyone, limit.saturating_sub(started.elapsed())).await?
            }
            answer => answer?,
        };
        Ok(released == 1)
    }

    /// Marks that a waiter of this client listens for `key`'s release, for
    /// `how_long` at least (see [`Wake::Listeners`]).
    async fn listen(
        &self,
        key: &str,
        how_long: Duration,
        limit: Duration,
    ) -> Result<(), LockError> {
        self.call(limit, true, |mut conn| {
            let mut inv = Eval::new(&scripts::LISTEN, 1);
            inv.key(scripts::ListenersKey(key))
                .arg(ttl_millis(how_long));
            async move { inv.invoke::<i64>(&mut conn).await }
        })
        .await
        .map(drop)
    }

    /// Raises the fence counter to at least `fence` while our lock is held
    /// here. `Ok(false)`: the lock is not ours here (any more).
    async fn lift_fence(
        &self,
        keys: &LockKeys<'_>,
        token: &Token,
        fence: u64,
        ttl: Duration,
        limit: Duration,
    ) -> Result<bool, LockError> {
        let Some(fence_key) = keys.fence else {
            return Ok(true);
        };
        let lifted: i64 = self
            .call(limit, true, |mut conn| {
                let mut inv = Eval::new(&scripts::LIFT_FENCE, 2);
                inv.key(keys.lock)
                    .key(fence_key)
                    .arg(token)
                    .arg(fence)
                    .arg(ttl_millis(fence_retention(ttl)));
                async move { inv.invoke(&mut conn).await }
            })
            .await?;
        Ok(lifted == 1)
    }

    /// Several keys in one script, all or none (see
    /// [`scripts::ACQUIRE_ALL`]); every key in `keys` on this server
    /// (in a cluster, in one slot).
    async fn acquire_all(
        &self,
        keys: &[LockKeys<'_>],
        token: &Token,
        ttl: Duration,
        writer_for: Duration,
        limit: Duration,
    ) -> Result<Several, LockError> {
        let fenced = keys.iter().all(|k| k.fence.is_some());
        let min = self.min_replicas();
        let (answer, short) = self
            .call(limit, false, |mut conn| {
                let n = keys.len();
                let mut inv = Eval::new(&scripts::ACQUIRE_ALL, n * if fenced { 3 } else { 2 });
                for k in keys {
                    inv.key(k.lock);
                }
                for k in keys {
                    // Without marks the key's own name stands in
                    // (same slot), and a mark lasting 0 ms tells the
                    // script to write none.
                    inv.key(k.writer.map_or(k.lock, |(w, _)| w));
                }
                if fenced {
                    for k in keys {
                        inv.key(k.fence.unwrap_or_default());
                    }
                }
                let marked = keys.iter().all(|k| k.writer.is_some());
                let writer_ms = if marked { ttl_millis(writer_for) } else { 0 };
                // One value for every key: the token and holder
                // are the same, the fences differ (the script
                // writes each into its key's value).
                match keys.first() {
                    Some(k) => inv.arg(k.value_of(token)),
                    None => inv.arg(token),
                };
                inv.arg(ttl_millis(ttl)).arg(n).arg(writer_ms);
                if fenced {
                    inv.arg(ttl_millis(fence_retention(ttl)));
                }
                async move {
                    let answer: Vec<i64> = inv.invoke(&mut conn).await?;
                    if answer.first() != Some(&1) {
                        return Ok((answer, None));
                    }
                    let locks: Vec<&str> = keys.iter().map(|k| k.lock).collect();
                    let short = replicate(&mut conn, min, &locks, token).await?;
                    Ok((answer, short))
                }
            })
            .await?;
        if let (Some(acked), Some(min)) = (short, min) {
            return Err(too_few_replicas(acked, min, self.addr()));
        }
        Ok(several(&answer, keys.len(), fenced))
    }

    /// A shared holder or a permit joins the key's holder set (see
    /// [`scripts::SHARED_ACQUIRE`]).
    async fn shared_acquire(
        &self,
        keys: &SharedKeys<'_>,
        token: &Token,
        ttl: Duration,
        limit: Duration,
    ) -> Result<SharedAttempt, LockError> {
        let answer: (i64, redis::Value) = self
            .call(limit, false, |mut conn| {
                let mut inv = Eval::new(&scripts::SHARED_ACQUIRE, 3);
                inv.key(keys.lock)
                    .key(keys.holders)
                    .key(keys.writer)
                    .arg(token)
                    .arg(ttl_millis(ttl))
                    .arg(keys.marker)
                    .arg(keys.limit);
                async move { inv.invoke(&mut conn).await }
            })
            .await?;
        Ok(match answer {
            (1, _) => SharedAttempt::Granted,
            (-1, held) => {
                SharedAttempt::Mismatch(redis::from_redis_value::<String>(held).unwrap_or_default())
            }
            (_, left) => SharedAttempt::Busy {
                left: redis::from_redis_value::<i64>(left)
                    .ok()
                    .filter(|ms| *ms >= 0)
                    .map(|ms| Duration::from_millis(ms as u64)),
            },
        })
    }

    /// A holder leaves its key's holder set; `Ok(false)`: it was no
    /// longer in it.
    async fn shared_release(
        &self,
        keys: &SharedKeys<'_>,
        token: &Token,
        limit: Duration,
    ) -> Result<bool, LockError> {
        let released: i64 = self
            .call(limit, true, |mut conn| {
                let mut inv = scripts::waking_call(
                    &scripts::SHARED_RELEASE,
                    &[keys.lock, keys.holders],
                    self.wake(),
                );
                inv.arg(token).arg(keys.marker);
                async move { inv.invoke(&mut conn).await }
            })
            .await?;
        Ok(released == 1)
    }

    /// Renews holders in their holder sets (`exact`: sets their
    /// expiry to the ttl, shorter or longer); the answers in order.
    async fn shared_renew(
        &self,
        holders: &[SharedLease<'_>],
        exact: bool,
        limit: Duration,
    ) -> Result<Vec<bool>, LockError> {
        let calls = holders.chunks(BATCH).map(|chunk| {
            self.call(limit, true, move |mut conn| {
                let mut inv = Eval::new(&scripts::SHARED_RENEW, 2 * chunk.len());
                for h in chunk {
                    inv.key(h.keys.lock).key(h.keys.holders);
                }
                inv.arg(u8::from(exact));
                for h in chunk {
                    inv.arg(h.keys.marker).arg(h.token).arg(ttl_millis(h.ttl));
                }
                async move { inv.invoke::<Vec<i64>>(&mut conn).await }
            })
        });
        let mut renewed = Vec::with_capacity(holders.len());
        for answer in join_all(calls).await {
            renewed.extend(answer?.into_iter().map(|r| r == 1));
        }
        if renewed.len() != holders.len() {
            return Err(LockError::new(ErrorKind::Server)
                .with_message("the holder renewal answered for the wrong number of holders"));
        }
        Ok(renewed)
    }

    /// The Redis type of `key` (`"string"` for a lock, `"none"` when absent).
    async fn key_type(&self, key: &str, limit: Duration) -> Result<String, LockError> {
        self.call(limit, true, |mut conn| {
            let mut cmd = redis::cmd("TYPE");
            cmd.arg(key);
            async move { cmd.query_async(&mut conn).await }
        })
        .await
    }

    /// A round trip that proves the server answers.
    async fn ping(&self, limit: Duration) -> Result<(), LockError> {
        self.call(limit, false, |mut conn| async move {
            redis::cmd("PING").query_async::<String>(&mut conn).await
        })
        .await
        .map(drop)
    }
}

impl<S: Server> LockCommands for S {}

/// After a granted acquisition, with `min_replicas`: `WAIT` on the same
/// connection (so it covers the lock's write). When too few replicas
/// acknowledged, or `WAIT` itself failed, deletes the lock again if it is
/// still ours (compare-and-delete) on that connection. `Ok(Some(acked))`:
/// too few acknowledged, and the lock was released.
async fn replicate<C: redis::aio::ConnectionLike>(
    conn: &mut C,
    min: Option<MinReplicas>,
    keys: &[&str],
    token: &Token,
) -> redis::RedisResult<Option<i64>> {
    match min {
        None => Ok(None),
        // Boxed: rare, and kept out of the acquisition's future.
        Some(min) => Box::pin(wait_for_replicas(conn, min, keys, token)).await,
    }
}

/// [`replicate`] once `min_replicas` is set.
async fn wait_for_replicas<C: redis::aio::ConnectionLike>(
    conn: &mut C,
    min: MinReplicas,
    keys: &[&str],
    token: &Token,
) -> redis::RedisResult<Option<i64>> {
    let waited: redis::RedisResult<i64> = redis::cmd("WAIT")
        .arg(min.replicas)
        .arg(ttl_millis(min.timeout))
        .query_async(conn)
        .await;
    let acked = match waited {
        Ok(acked) if acked >= i64::from(min.replicas) => return Ok(None),
        Ok(acked) => Ok(acked),
        Err(e) => Err(e),
    };
    let mut released: redis::RedisResult<i64> = Ok(0);
    for key in keys {
        let mut release = Eval::new(&scripts::RELEASE, 1);
        release.key(*key).arg(token);
        released = released.and(release.invoke(conn).await);
    }
    match (acked, released) {
        (Err(e), _) => Err(e),
        (Ok(_), Err(e)) => Err(e),
        (Ok(acked), Ok(_)) => Ok(Some(acked)),
    }
}

/// The error for a lock that was released again because too few replicas
/// acknowledged it.
fn too_few_replicas(acked: i64, min: MinReplicas, addr: &str) -> LockError {
    LockError::new(ErrorKind::Unavailable).with_message(format!(
        "the lock was not replicated to {} replicas within {:?} \
         ({acked} acknowledged on {addr}); it was released again",
        min.replicas, min.timeout,
    ))
}

/// [`scripts::ACQUIRE`]'s answer: `{1, fence}`, or `{0, pttl, foreign}`
/// (`foreign` left out by a server still running an older version of the
/// script reads as ours).
struct Reply {
    /// 1 when granted.
    granted: i64,
    /// Granted: the fencing token; busy: the holder's `PTTL`.
    n: i64,
    /// Busy: the value is not one of lock-core's.
    foreign: bool,
}

impl Reply {
    /// The attempt a busy answer stands for.
    fn busy(&self) -> Attempt {
        // PTTL: -2 gone since (free now), -1 no expiry (not a lock of
        // ours: unknown).
        let left = match self.n {
            -1 => None,
            ms => Some(Duration::from_millis(ms.max(0) as u64)),
        };
        Attempt::Busy {
            left,
            foreign: self.foreign,
            ahead: false,
        }
    }
}

impl redis::FromRedisValue for Reply {
    fn from_redis_value(v: redis::Value) -> Result<Reply, redis::ParsingError> {
        let answer: Vec<i64> = redis::from_redis_value(v)?;
        match answer[..] {
            [granted, n] => Ok(Reply {
                granted,
                n,
                foreign: false,
            }),
            [granted, n, foreign, ..] => Ok(Reply {
                granted,
                n,
                foreign: foreign == 1,
            }),
            _ => Err(redis::ParsingError::from(format!(
                "unexpected acquisition answer {answer:?}"
            ))),
        }
    }
}

/// [`scripts::ACQUIRE_ALL`]'s answer for `n` keys.
fn several(answer: &[i64], n: usize, fenced: bool) -> Several {
    match answer {
        [1, fences @ ..] if fences.len() == n => Several::Granted(if fenced {
            fences.iter().map(|f| (*f).max(0) as u64).collect()
        } else {
            Vec::new()
        }),
        [_, at, ..] => Several::Busy {
            at: usize::try_from(*at).unwrap_or(1).saturating_sub(1),
        },
        _ => Several::Busy { at: 0 },
    }
}

/// Milliseconds for `PX`/`PEXPIRE`, never below 1 (0 would be an error).
pub(super) fn ttl_millis(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::backend::Node;
    use lock_testkit::RedisServer;

    const LIMIT: Duration = Duration::from_secs(5);

    #[tokio::test]
    async fn a_late_shorter_renewal_leaves_the_longer_expiry() {
        let server = RedisServer::start();
        let node = Node::new(&server.url(), LIMIT).unwrap();
        let token = Token::generate();
        let keys = LockKeys {
            lock: "k",
            fence: None,
            writer: None,
            holder: None,
        };
        let ttl = Duration::from_secs(3);
        let granted = node.acquire(&keys, &token, ttl, LIMIT).await.unwrap();
        assert_eq!(granted, Attempt::Granted { fence: None });
        let pttl = || server.cmd::<i64>(&["PTTL", "k"]);

        // An extension to 60 s, then a renewal for the old 3 s that was
        // sent before it and arrives after it.
        assert!(
            node.renew("k", &token, Duration::from_secs(60), LIMIT)
                .await
                .unwrap()
        );
        assert!(node.renew("k", &token, ttl, LIMIT).await.unwrap());
        assert!(
            pttl() > 50_000,
            "the late renewal shortened the lease: {}",
            pttl()
        );

        // The exact path shortens, and only for the owner.
        let other = Token::generate();
        assert!(
            !node
                .set_ttl("k", &other, Duration::from_millis(300), LIMIT)
                .await
                .unwrap()
        );
        assert!(pttl() > 50_000);
        assert!(
            node.set_ttl("k", &token, Duration::from_millis(300), LIMIT)
                .await
                .unwrap()
        );
        assert!((1..=300).contains(&pttl()), "{}", pttl());
    }
}
