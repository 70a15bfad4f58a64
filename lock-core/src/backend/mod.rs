//! Where locks live: one Redis server, a Redlock quorum of several, or a
//! Redis Cluster.

mod cluster;
mod commands;
mod connection;
mod memory;
mod node;
mod operators;
mod quorum;
mod wakeup;
mod wire;

pub(crate) use cluster::ClusterNode;
pub use memory::MemoryStore;
pub(crate) use node::{MinReplicas, Node, redact};
pub(crate) use operators::{Forced, OperatorKeys, RawState, ScanAt, glob_escape};
pub(crate) use quorum::Quorum;
pub(crate) use wakeup::{Subscription, Wakeups};

use crate::error::{ErrorKind, LockError};
use crate::observe;
use crate::token::{Holder, Stamped, Token};
use futures::future::join_all;
use std::sync::Arc;
use std::time::Duration;

/// The most keys renewed by one script call.
pub(crate) const BATCH: usize = 256;

/// One lease in a round of renewals, as the servers need it.
pub(crate) trait Renewable: Sync {
    /// The Redis key.
    fn storage_key(&self) -> &str;
    fn token(&self) -> &Token;
    /// The ttl to renew it for.
    fn ttl(&self) -> Duration;
    /// The lock's name as its holder gave it, for messages.
    fn name(&self) -> &str;
}

impl<R: Renewable> Renewable for &R {
    fn storage_key(&self) -> &str {
        (**self).storage_key()
    }
    fn token(&self) -> &Token {
        (**self).token()
    }
    fn ttl(&self) -> Duration {
        (**self).ttl()
    }
    fn name(&self) -> &str {
        (**self).name()
    }
}

/// One server's answers to a round of batched renewals: for each lease,
/// whether it was still ours, or `None` when its batch's call failed (with
/// the first such failure in `error`).
pub(crate) struct Batched {
    pub(crate) each: Vec<Option<bool>>,
    pub(crate) error: Option<LockError>,
}

impl Batched {
    /// The answers as renewals, reporting a failure (with how many leases
    /// it left unanswered) under the first unanswered lease's name.
    fn renewals<R: Renewable>(self, due: &[R]) -> Vec<RenewOutcome> {
        if let Some(e) = &self.error {
            let unanswered = self.each.iter().filter(|r| r.is_none()).count();
            let first = self
                .each
                .iter()
                .position(Option::is_none)
                .and_then(|i| due.get(i));
            if let Some(first) = first {
                observe::renewal_failed(first.name(), unanswered, e);
            }
        }
        let failed = self
            .error
            .as_ref()
            .map_or(RenewOutcome::Failed, RenewOutcome::failed);
        self.each
            .into_iter()
            .map(|answer| match answer {
                Some(true) => RenewOutcome::Renewed,
                Some(false) => RenewOutcome::NotOurs,
                None => failed,
            })
            .collect()
    }
}

/// What a round of renewals said about one lease.
#[derive(Clone, Copy)]
pub(crate) enum RenewOutcome {
    Renewed,
    NotOurs,
    /// Not ours because an operator broke the lock (its tombstone names
    /// our token).
    Evicted,
    /// No answer, or not enough of them: nobody can tell.
    Failed,
    /// An error answer that waiting will not change (a permission the
    /// ACL denies): the lease cannot be kept.
    Refused,
}

impl RenewOutcome {
    /// What a failed renewal call means for its leases.
    pub(crate) fn failed(error: &LockError) -> RenewOutcome {
        match error.kind() {
            ErrorKind::Server => RenewOutcome::Refused,
            _ => RenewOutcome::Failed,
        }
    }
}

/// The answer to one acquisition attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Attempt {
    /// The lock is ours; `fence` is set when a fencing token was asked for.
    Granted { fence: Option<u64> },
    /// Someone else holds it; `left`: how long its lease has left, when
    /// the attempt learnt it (every attempt but a first one without
    /// fencing); `foreign`: its value is not one of ours (another library
    /// holds it, whose release publishes nothing), when the attempt learnt
    /// it (as `left`).
    Busy {
        left: Option<Duration>,
        foreign: bool,
    },
}

impl Attempt {
    /// Held by someone else, nothing more known (a first attempt's plain
    /// `SET NX`, or the fencing script).
    pub(crate) const HELD: Attempt = Attempt::Busy {
        left: None,
        foreign: false,
    };
}

/// The keys one lock touches; they share a hash slot.
pub(crate) struct LockKeys<'a> {
    pub(crate) lock: &'a str,
    pub(crate) fence: Option<&'a str>,
    /// On an attempt after the first: the key's writer mark, and how long an
    /// attempt that finds shared holders sets it for (see
    /// `scripts::ACQUIRE`). The first attempt without fencing is a plain
    /// `SET NX`.
    pub(crate) writer: Option<(&'a str, Duration)>,
    /// Who acquires: named in the value an acquisition stores (see
    /// `Stamped`); the token alone when `None`.
    pub(crate) holder: Option<&'a Arc<Holder>>,
}

impl LockKeys<'_> {
    /// The same keys, borrowed for a shorter time.
    pub(crate) fn reborrow(&self) -> LockKeys<'_> {
        LockKeys {
            lock: self.lock,
            fence: self.fence,
            writer: self.writer,
            holder: self.holder,
        }
    }

    /// What an acquisition by `token` stores under the lock key.
    pub(crate) fn value_of<'t>(&'t self, token: &'t Token) -> Stamped<'t> {
        Stamped {
            token,
            holder: self.holder.map(|h| &**h),
        }
    }
}

/// The answer to an attempt on several keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Several {
    /// Every key is ours: with fencing, each key's token, in order (empty
    /// without).
    Granted(Vec<u64>),
    /// The key at `at` is held; none was taken.
    Busy { at: usize },
}

/// The answer to a shared holder's or a permit's attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SharedAttempt {
    Granted,
    /// Held exclusively, an exclusive holder waits (for shared), or every
    /// permit is taken; `left`: how long until that may change, when known.
    Busy {
        left: Option<Duration>,
    },
    /// The key is held as something else: the marker found (`shared`, or
    /// `permits:N` with another N).
    Mismatch(String),
}

/// The keys of a lock with shared holders or permits; one hash slot.
#[derive(Clone, Copy)]
pub(crate) struct SharedKeys<'a> {
    /// The lock key: the marker while holders exist.
    pub(crate) lock: &'a str,
    /// The holder set.
    pub(crate) holders: &'a str,
    /// The writer mark.
    pub(crate) writer: &'a str,
    /// `shared` or `permits:N`.
    pub(crate) marker: &'a str,
    /// N, or 0 for shared.
    pub(crate) limit: u32,
}

/// One holder in a round of holder renewals.
pub(crate) struct SharedLease<'a> {
    pub(crate) keys: SharedKeys<'a>,
    pub(crate) token: &'a Token,
    pub(crate) ttl: Duration,
}

/// Why shared locks and permits are refused on Redlock.
pub(crate) fn no_shared_on_redlock() -> LockError {
    LockError::options(
        "shared locks and permits are not available on Redlock: a holder set \
         kept on several independent servers has no majority rule that keeps \
         its count; use one server, Sentinel or Cluster for them",
    )
}

/// The storage behind a client.
// One per client, behind its Arc: the size difference costs nothing.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Backend {
    Single(Node),
    Redlock(Quorum),
    Cluster(ClusterNode),
    Memory(MemoryStore),
}

impl Backend {
    /// The same servers through connections of their own, for the
    /// heartbeat: its renewals then never wait behind the calls of the
    /// client's tasks, nor on the runtime those tasks run on (see
    /// `heartbeat.rs`). The in-memory store is the same store.
    pub(crate) fn twin(&self) -> Backend {
        match self {
            Backend::Single(node) => Backend::Single(node.twin()),
            Backend::Redlock(quorum) => Backend::Redlock(quorum.twin()),
            Backend::Cluster(cluster) => Backend::Cluster(cluster.twin()),
            Backend::Memory(store) => Backend::Memory(store.clone()),
        }
    }

    /// Whether calls go over the network (every backend but the in-memory
    /// one).
    pub(crate) fn is_remote(&self) -> bool {
        !matches!(self, Backend::Memory(_))
    }

    /// One acquisition attempt, bounded by `limit`.
    pub(crate) async fn acquire(
        &self,
        keys: LockKeys<'_>,
        token: &Token,
        ttl: Duration,
        limit: Duration,
    ) -> Result<Attempt, LockError> {
        match self {
            Backend::Single(node) => node.acquire(&keys, token, ttl, limit).await,
            Backend::Cluster(node) => node.acquire(&keys, token, ttl, limit).await,
            Backend::Redlock(quorum) => quorum.acquire(&keys, token, ttl, limit).await,
            Backend::Memory(store) => Ok(store.acquire(&keys, token, ttl)),
        }
    }

    /// One attempt on several keys, all or none, bounded by `limit`. The
    /// keys are in canonical order; on a Redis Cluster the keys of one hash
    /// slot go in one script, the slots one after another in that order,
    /// and the keys taken are released again when a later slot's are held.
    pub(crate) async fn acquire_all(
        &self,
        keys: &[LockKeys<'_>],
        token: &Token,
        ttl: Duration,
        writer_for: Duration,
        limit: Duration,
    ) -> Result<Several, LockError> {
        match self {
            Backend::Single(node) => node.acquire_all(keys, token, ttl, writer_for, limit).await,
            Backend::Cluster(node) => {
                cluster::acquire_all(node, keys, token, ttl, writer_for, limit).await
            }
            Backend::Redlock(quorum) => {
                quorum
                    .acquire_all(keys, token, ttl, writer_for, limit)
                    .await
            }
            Backend::Memory(store) => Ok(store.acquire_all(keys, token, ttl)),
        }
    }

    /// A shared holder's or a permit's attempt. Redlock has none.
    pub(crate) async fn shared_acquire(
        &self,
        keys: &SharedKeys<'_>,
        token: &Token,
        ttl: Duration,
        limit: Duration,
    ) -> Result<SharedAttempt, LockError> {
        match self {
            Backend::Single(node) => node.shared_acquire(keys, token, ttl, limit).await,
            Backend::Cluster(node) => node.shared_acquire(keys, token, ttl, limit).await,
            Backend::Redlock(_) => Err(no_shared_on_redlock()),
            Backend::Memory(store) => Ok(store.shared_acquire(keys, token, ttl)),
        }
    }

    /// A shared holder or a permit lets go. `Ok(false)`: it was no longer
    /// held.
    pub(crate) async fn shared_release(
        &self,
        keys: &SharedKeys<'_>,
        token: &Token,
        limit: Duration,
    ) -> Result<bool, LockError> {
        match self {
            Backend::Single(node) => node.shared_release(keys, token, limit).await,
            Backend::Cluster(node) => node.shared_release(keys, token, limit).await,
            Backend::Redlock(_) => Err(no_shared_on_redlock()),
            Backend::Memory(store) => Ok(store.shared_release(keys, token)),
        }
    }

    /// Renews shared holders or permits (`exact`: to exactly their ttl);
    /// one answer per holder, in order.
    pub(crate) async fn shared_renew(
        &self,
        holders: &[SharedLease<'_>],
        exact: bool,
        limit: Duration,
    ) -> Result<Vec<bool>, LockError> {
        match self {
            Backend::Single(node) => node.shared_renew(holders, exact, limit).await,
            // One call per holder: holders of different keys span slots.
            Backend::Cluster(node) => {
                let calls = holders
                    .iter()
                    .map(|h| node.shared_renew(std::slice::from_ref(h), exact, limit));
                let mut renewed = Vec::with_capacity(holders.len());
                for answer in join_all(calls).await {
                    renewed.extend(answer?);
                }
                Ok(renewed)
            }
            Backend::Redlock(_) => Err(no_shared_on_redlock()),
            Backend::Memory(store) => Ok(store.shared_renew(holders, exact)),
        }
    }

    /// Takes over a lease handed off in-process (see `queue.rs`). `Ok(None)`:
    /// not ours any more, or (Redlock with fencing, which needs the full
    /// acquisition) not possible: the caller releases and acquires afresh.
    pub(crate) async fn take_over(
        &self,
        keys: LockKeys<'_>,
        token: &Token,
        ttl: Duration,
        limit: Duration,
    ) -> Result<Option<Attempt>, LockError> {
        match self {
            Backend::Single(node) => node.take_over(&keys, token, ttl, limit).await,
            Backend::Cluster(node) => node.take_over(&keys, token, ttl, limit).await,
            Backend::Redlock(_) if keys.fence.is_some() => Ok(None),
            // The new holder's ttl exactly, as the take-over script sets it.
            Backend::Redlock(quorum) => Ok(quorum
                .set_ttl(keys.lock, token, ttl, limit)
                .await?
                .then_some(Attempt::Granted { fence: None })),
            Backend::Memory(store) => Ok(store.take_over(&keys, token, ttl)),
        }
    }

    /// Extends the lease to at least `ttl` from now if it is still ours;
    /// never shortens it, so a renewal that arrives late cannot cut a lease
    /// renewed or extended since. `Ok(false)`: it is certainly not ours any
    /// more. An error: nobody can tell right now.
    pub(crate) async fn renew(
        &self,
        key: &str,
        token: &Token,
        ttl: Duration,
        limit: Duration,
    ) -> Result<bool, LockError> {
        match self {
            Backend::Single(node) => node.renew(key, token, ttl, limit).await,
            Backend::Cluster(node) => node.renew(key, token, ttl, limit).await,
            Backend::Redlock(quorum) => quorum.renew(key, token, ttl, limit).await,
            Backend::Memory(store) => Ok(store.renew(key, token, ttl)),
        }
    }

    /// Sets the lease to exactly `ttl` from now if it is still ours, shorter
    /// or longer: for a holder that means to shorten it (`min_hold` on
    /// release, `extend` to a shorter ttl). Answers as [`renew`](Self::renew).
    pub(crate) async fn set_ttl(
        &self,
        key: &str,
        token: &Token,
        ttl: Duration,
        limit: Duration,
    ) -> Result<bool, LockError> {
        match self {
            Backend::Single(node) => node.set_ttl(key, token, ttl, limit).await,
            Backend::Cluster(node) => node.set_ttl(key, token, ttl, limit).await,
            Backend::Redlock(quorum) => quorum.set_ttl(key, token, ttl, limit).await,
            Backend::Memory(store) => Ok(store.set_ttl(key, token, ttl)),
        }
    }

    /// Renews a round of leases; one answer per lease, in order. A lease
    /// found not ours is looked up in its key's tombstone, to tell an
    /// operator's eviction from an expiry (see `operators.rs`).
    pub(crate) async fn renew_many<R: Renewable>(
        &self,
        due: &[R],
        limit: Duration,
    ) -> Vec<RenewOutcome> {
        let mut answers = self.renew_round(due, limit).await;
        if answers.iter().any(|a| matches!(a, RenewOutcome::NotOurs)) {
            self.tell_evicted(due, &mut answers, limit).await;
        }
        answers
    }

    /// [`renew_many`](Self::renew_many) without the tombstone lookup.
    async fn renew_round<R: Renewable>(&self, due: &[R], limit: Duration) -> Vec<RenewOutcome> {
        match self {
            Backend::Single(node) => node.renew_many(due, limit).await.renewals(due),
            // One script call per lease, all at once: a script with the
            // keys of many locks would span hash slots (CROSSSLOT).
            Backend::Cluster(node) => {
                let calls = due
                    .iter()
                    .map(|d| node.renew(d.storage_key(), d.token(), d.ttl(), limit));
                let mut failed = None;
                let answers: Vec<RenewOutcome> = join_all(calls)
                    .await
                    .into_iter()
                    .zip(due)
                    .map(|(answer, d)| match answer {
                        Ok(true) => RenewOutcome::Renewed,
                        Ok(false) => RenewOutcome::NotOurs,
                        Err(e) => {
                            let answer = RenewOutcome::failed(&e);
                            failed.get_or_insert((d, e, 0)).2 += 1;
                            answer
                        }
                    })
                    .collect();
                if let Some((first, e, count)) = failed {
                    observe::renewal_failed(first.name(), count, &e);
                }
                answers
            }
            Backend::Redlock(quorum) => quorum.renew_many(due, limit).await,
            Backend::Memory(store) => store.renew_many(due),
        }
    }

    /// Deletes the lock if it is ours. `Ok(false)`: it was not ours.
    pub(crate) async fn release(
        &self,
        key: &str,
        token: &Token,
        limit: Duration,
    ) -> Result<bool, LockError> {
        match self {
            Backend::Single(node) => node.release(key, token, limit).await,
            Backend::Cluster(node) => node.release(key, token, limit).await,
            Backend::Redlock(quorum) => quorum.release(key, token, limit).await,
            Backend::Memory(store) => Ok(store.release(key, token)),
        }
    }

    /// [`release`](Self::release) without waiting for its reply where the
    /// connection allows it (lock-core's own, over plain TCP): returns once
    /// the command is written, so a later command of this process on the
    /// same connection comes after it. Redlock sends it to every server and
    /// returns once a majority of them have it written. Elsewhere (Cluster,
    /// TLS and the like) the reply is awaited, its answer dropped.
    pub(crate) async fn send_release(
        &self,
        key: &str,
        token: &Token,
        limit: Duration,
    ) -> Result<(), LockError> {
        match self {
            Backend::Single(node) => node.send_release(key, token, limit).await,
            Backend::Redlock(quorum) => quorum.send_release(key, token, limit).await,
            Backend::Cluster(node) => node.release(key, token, limit).await.map(drop),
            Backend::Memory(store) => {
                store.release(key, token);
                Ok(())
            }
        }
    }

    /// A round trip that proves the servers answer (a majority of them for
    /// Redlock).
    pub(crate) async fn ping(&self, limit: Duration) -> Result<(), LockError> {
        match self {
            Backend::Single(node) => node.ping(limit).await,
            Backend::Cluster(node) => node.ping(limit).await,
            Backend::Redlock(quorum) => quorum.ping(limit).await,
            Backend::Memory(_) => Ok(()),
        }
    }

    /// Every server.
    fn nodes(&self) -> &[Node] {
        match self {
            Backend::Single(node) => std::slice::from_ref(node),
            Backend::Redlock(quorum) => quorum.nodes(),
            Backend::Cluster(_) | Backend::Memory(_) => &[],
        }
    }

    /// The longest one call about a lock of `ttl` waits on the servers,
    /// given the operation timeout: that timeout, or Redlock's per-server
    /// timeout (a call there is decided by the servers that answer within
    /// it).
    pub(crate) fn call_bound(&self, ttl: Duration, op_timeout: Duration) -> Duration {
        match self {
            Backend::Redlock(quorum) => quorum.node_timeout(ttl, op_timeout),
            _ => op_timeout,
        }
    }

    /// A type other than a string found at a lock key: some other program
    /// uses the key, and waiting will never help.
    pub(crate) async fn foreign_type(
        &self,
        key: &str,
        ttl: Duration,
        limit: Duration,
    ) -> Option<String> {
        let foreign = |kind: String| (kind != "string" && kind != "none").then_some(kind);
        match self {
            Backend::Single(node) => node.key_type(key, limit).await.ok().and_then(foreign),
            Backend::Cluster(node) => node.key_type(key, limit).await.ok().and_then(foreign),
            Backend::Redlock(quorum) => quorum.key_type(key, ttl, limit).await.and_then(foreign),
            Backend::Memory(_) => None,
        }
    }

    /// The wake-up channels for this backend's servers. A Sentinel node has
    /// none (its server changes with failovers): its waiters poll, on their
    /// backoff timer.
    pub(crate) fn wakeups(&self) -> Wakeups {
        match self {
            Backend::Memory(store) => Wakeups::local(store.channels()),
            // PUBLISH reaches every node of a cluster: a hub on each seed
            // node (each hears every release; a waiter wakes on the first).
            Backend::Cluster(node) => Wakeups::new(node.seed_clients()),
            _ => Wakeups::new(self.nodes().iter().filter_map(Node::redis_client).collect()),
        }
    }

    /// Where the locks live, for messages.
    pub(crate) fn describe(&self) -> String {
        match self {
            Backend::Single(node) => node.addr().to_owned(),
            Backend::Redlock(quorum) => {
                let addrs: Vec<&str> = quorum.nodes().iter().map(Node::addr).collect();
                format!("redlock[{}]", addrs.join(", "))
            }
            Backend::Cluster(node) => node.addr().to_owned(),
            Backend::Memory(_) => "in-memory".to_owned(),
        }
    }
}
