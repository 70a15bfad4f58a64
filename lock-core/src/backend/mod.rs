//! Where locks live: one Redis server, a Redlock quorum of several, a
//! Redis Cluster, or this process's memory. The [`Backend`] enum and its
//! dispatch are here, in one place.

// What a call sends and answers: lock keys, attempts, renewal outcomes.
mod calls;
// A Redis Cluster: one connection routing each command to its slot.
mod cluster;
// A cluster's renewal rounds, pipelined per primary.
mod cluster_rounds;
// The lock commands, written once over `Server`.
mod commands;
// The connection a client's locks share, replaced when it breaks.
mod connection;
// How a Redlock quorum's answers decide: one rule, one loop.
mod majority;
// Locks in this process's memory, for users' tests.
mod memory;
// Releases by the server's own compare-and-delete (`DELIFEQ`).
mod native;
// One Redis server (or Sentinel's primary) and its connection.
mod node;
// The operators' commands: inspect, force release, list.
mod operators;
// Redlock: a majority of independent servers.
mod quorum;
// `Server`: what the commands need of a connection, one bounded call.
mod server;
// Wait records and the deadlock walk's reads.
mod waits;
// Release wake-ups over pub/sub.
mod wakeup;
// lock-core's own pipelined RESP connection over TCP.
mod wire;

pub(crate) use calls::{
    Attempt, BATCH, Batched, LockKeys, RenewOutcome, Renewable, Several, SharedAttempt, SharedKeys,
    SharedLease, no_shared_on_redlock,
};
pub(crate) use commands::LockCommands;
pub(crate) use operators::{KeyPage, OperatorCommands};
pub(crate) use server::Server;

pub(crate) use cluster::ClusterNode;
pub use memory::MemoryStore;
#[cfg(any(feature = "deadpool-redis", feature = "bb8-redis"))]
pub use node::RedisPool;
#[cfg(any(feature = "deadpool-redis", feature = "bb8-redis"))]
pub(crate) use node::pool_connection;
pub(crate) use node::{MinReplicas, Node, UserConnection, redact};
pub(crate) use operators::{Forced, OperatorKeys, RawState, ScanAt, glob_escape};
pub(crate) use quorum::Quorum;
use waits::WaitCommands;
pub(crate) use waits::{Hop, WaitRecords, WaitersAt};
pub(crate) use wakeup::{Subscription, Wakeups};

use crate::error::LockError;
use crate::observe;
use crate::scripts::Wake;
use crate::token::{Holder, Token};
use futures::future::join_all;
use majority::{Decision, OnSplit, Vote};
use std::sync::Arc;
use std::time::Duration;

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

    /// Releases from now on name `holder`'s dated values to the servers'
    /// own compare-and-delete where they have one (see `native`): on one
    /// server and on each of a Redlock's. A cluster keeps the script, which
    /// publishes only while a waiter listens.
    pub(crate) fn release_natively(&self, holder: &Arc<Holder>) {
        for node in self.nodes() {
            node.release_natively(holder);
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

    /// The backend as one that has shared locks and permits: every one but
    /// Redlock, which is refused here, once, with the reason.
    pub(crate) fn shared(&self) -> Result<SharedBackend<'_>, LockError> {
        match self {
            Backend::Single(node) => Ok(SharedBackend::Single(node)),
            Backend::Cluster(node) => Ok(SharedBackend::Cluster(node)),
            Backend::Redlock(_) => Err(no_shared_on_redlock()),
            Backend::Memory(store) => Ok(SharedBackend::Memory(store)),
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
            // Pipelined per primary, a script per slot; what that leaves
            // (a slot that moved, no fresh map) one script call per lease,
            // following the cluster's redirections.
            Backend::Cluster(node) => {
                let started = tokio::time::Instant::now();
                let mut answers = cluster_rounds::renew_by_primary(node, due, limit).await;
                let apart: Vec<usize> = (0..due.len()).filter(|&i| answers[i].is_none()).collect();
                if !apart.is_empty() {
                    let left = limit.saturating_sub(started.elapsed());
                    let each: Vec<&R> = apart.iter().map(|&i| &due[i]).collect();
                    let renewed = renew_one_by_one(node, &each, left).await;
                    for (i, answer) in apart.into_iter().zip(renewed) {
                        answers[i] = Some(answer);
                    }
                }
                answers
                    .into_iter()
                    .map(|a| a.unwrap_or(RenewOutcome::Failed))
                    .collect()
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
    /// connection allows it (lock-core's own, over plain TCP or TLS): returns
    /// once the command is written, so a later command of this process on
    /// the same connection comes after it. Redlock sends it to every server
    /// and returns once a majority of them have it written; a cluster sends
    /// it to the key's primary (see [`ClusterNode::send_release`]).
    /// Elsewhere (the `redis` crate's connections for Unix sockets and
    /// RESP3) the reply is awaited, its answer dropped.
    pub(crate) async fn send_release(
        &self,
        key: &str,
        token: &Token,
        limit: Duration,
    ) -> Result<(), LockError> {
        match self {
            Backend::Single(node) => node.send_release(key, token, Wake::Everyone, limit).await,
            Backend::Redlock(quorum) => quorum.send_release(key, token, limit).await,
            Backend::Cluster(node) => node.send_release(key, token, limit).await,
            Backend::Memory(store) => {
                store.release(key, token);
                Ok(())
            }
        }
    }

    /// How long a cluster's release that was redirected is given when sent
    /// again, when the caller set no bound (see [`release_now`](Self::release_now)).
    const RELEASE_AGAIN: Duration = Duration::from_secs(2);

    /// Releases `key` without waiting for anything, where that can be done
    /// (see [`Node::release_now`]; in memory, it is done): `true` once the
    /// compare-and-delete is written to every server. For a guard dropped
    /// at a moment with no later one: its runtime shutting down, its
    /// process about to exit, a thread outside any runtime.
    pub(crate) fn release_now(&self, key: &str, token: &Token) -> bool {
        match self {
            Backend::Single(node) => node.release_now(key, token, Wake::Everyone),
            Backend::Redlock(quorum) => quorum.release_now(key, token),
            Backend::Cluster(node) => node.release_now(key, token, Self::RELEASE_AGAIN),
            Backend::Memory(store) => {
                store.release(key, token);
                true
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

    /// Whom a release tells (see [`Wake`]): on a cluster, only waiters
    /// that marked that they listen, with [`listen`](Self::listen).
    pub(crate) fn wake(&self) -> Wake {
        match self {
            Backend::Cluster(node) => node.wake(),
            _ => Wake::Everyone,
        }
    }

    /// Marks that a waiter listens for `key`'s release, for `how_long` at
    /// least, where releases publish only then ([`Wake::Listeners`]); does
    /// nothing elsewhere.
    pub(crate) async fn listen(
        &self,
        key: &str,
        how_long: Duration,
        limit: Duration,
    ) -> Result<(), LockError> {
        match self {
            Backend::Cluster(node) => node.listen(key, how_long, limit).await,
            _ => Ok(()),
        }
    }

    /// How many times a slot of the cluster moved to another primary so
    /// far, as this client learnt it (0 elsewhere): a waiter marks again
    /// that it listens after each.
    pub(crate) fn moves(&self) -> u64 {
        match self {
            Backend::Cluster(node) => node.topology().changes(),
            _ => 0,
        }
    }

    /// The wake-up channels for this backend's servers. A Sentinel node has
    /// none (its server changes with failovers): its waiters poll, on their
    /// backoff timer.
    pub(crate) fn wakeups(&self) -> Wakeups {
        match self {
            Backend::Memory(store) => Wakeups::local(store.channels()),
            // PUBLISH reaches every node of a cluster: hubs on any nodes
            // the client knows (each hears every release; a waiter wakes
            // on the first).
            Backend::Cluster(node) => Wakeups::cluster(node.topology()),
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

/// A backend that has shared locks and permits: there is no Redlock here,
/// since a holder set kept on several independent servers has no majority
/// rule that keeps its count (see [`Backend::shared`]).
pub(crate) enum SharedBackend<'a> {
    Single(&'a Node),
    Cluster(&'a ClusterNode),
    Memory(&'a MemoryStore),
}

impl SharedBackend<'_> {
    /// A shared holder's or a permit's attempt.
    pub(crate) async fn shared_acquire(
        &self,
        keys: &SharedKeys<'_>,
        token: &Token,
        ttl: Duration,
        limit: Duration,
    ) -> Result<SharedAttempt, LockError> {
        match self {
            SharedBackend::Single(node) => node.shared_acquire(keys, token, ttl, limit).await,
            SharedBackend::Cluster(node) => node.shared_acquire(keys, token, ttl, limit).await,
            SharedBackend::Memory(store) => Ok(store.shared_acquire(keys, token, ttl)),
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
            SharedBackend::Single(node) => node.shared_release(keys, token, limit).await,
            SharedBackend::Cluster(node) => node.shared_release(keys, token, limit).await,
            SharedBackend::Memory(store) => Ok(store.shared_release(keys, token)),
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
            SharedBackend::Single(node) => node.shared_renew(holders, exact, limit).await,
            // One call per holder: holders of different keys span slots.
            SharedBackend::Cluster(node) => {
                let calls = holders
                    .iter()
                    .map(|h| node.shared_renew(std::slice::from_ref(h), exact, limit));
                let mut renewed = Vec::with_capacity(holders.len());
                for answer in join_all(calls).await {
                    renewed.extend(answer?);
                }
                Ok(renewed)
            }
            SharedBackend::Memory(store) => Ok(store.shared_renew(holders, exact)),
        }
    }
}

// What operators ask of the servers (see `operators.rs`).
impl Backend {
    /// The server's clock in milliseconds (`TIME`); on Redlock the first
    /// server's to answer, in memory this machine's.
    pub(crate) async fn server_time_ms(&self, limit: Duration) -> Result<i64, LockError> {
        match self {
            Backend::Single(node) => node.server_time_ms(limit).await,
            Backend::Cluster(node) => node.server_time_ms(limit).await,
            // The first server to answer: the clock only dates values, and
            // a frozen server must not hold the caller up.
            Backend::Redlock(quorum) if !quorum.nodes().is_empty() => {
                let calls = quorum
                    .nodes()
                    .iter()
                    .map(|node| Box::pin(node.server_time_ms(limit)));
                Ok(futures::future::select_ok(calls).await?.0)
            }
            Backend::Redlock(_) => Ok(crate::token::local_now_ms()),
            Backend::Memory(_) => Ok(crate::token::local_now_ms()),
        }
    }

    /// What holds `keys.lock` now; on Redlock, what a majority of the
    /// servers agree on (see [`majority_state`](operators::majority_state)).
    pub(crate) async fn inspect(
        &self,
        keys: &OperatorKeys<'_>,
        limit: Duration,
    ) -> Result<Option<RawState>, LockError> {
        match self {
            Backend::Single(node) => node.inspect(keys, limit).await,
            Backend::Cluster(node) => node.inspect(keys, limit).await,
            Backend::Redlock(quorum) => {
                let calls = quorum.nodes().iter().map(|n| n.inspect(keys, limit));
                operators::majority_state(calls.collect()).await
            }
            Backend::Memory(store) => Ok(store.inspect(keys.lock)),
        }
    }

    /// Removes whatever holds `keys.lock`, publishes the wake-up and leaves
    /// the tombstone; on Redlock on every server (evicted where any was).
    pub(crate) async fn force_release(
        &self,
        keys: &OperatorKeys<'_>,
        limit: Duration,
    ) -> Result<Forced, LockError> {
        match self {
            Backend::Single(node) => node.force_release(keys, limit).await,
            Backend::Cluster(node) => node.force_release(keys, limit).await,
            Backend::Redlock(quorum) => {
                let answers =
                    join_all(quorum.nodes().iter().map(|n| n.force_release(keys, limit))).await;
                let mut best = None;
                let mut first_error = None;
                for answer in answers {
                    match answer {
                        Ok(evicted @ Forced::Evicted { .. }) => best = Some(evicted),
                        Ok(other) => {
                            best.get_or_insert(other);
                        }
                        Err(e) => {
                            first_error.get_or_insert(e);
                        }
                    }
                }
                match (best, first_error) {
                    (Some(forced), _) => Ok(forced),
                    (None, Some(e)) => Err(e),
                    (None, None) => Ok(Forced::Free),
                }
            }
            Backend::Memory(store) => Ok(store.force_release(keys.lock)),
        }
    }

    /// One page of the keys matching `pattern` (a `SCAN MATCH` pattern),
    /// from `at`. A cluster is scanned primary by primary; Redlock has no
    /// listing (the servers' key sets differ while locks come and go).
    pub(crate) async fn scan(
        &self,
        pattern: &str,
        at: ScanAt,
        limit: Duration,
    ) -> Result<KeyPage, LockError> {
        match self {
            Backend::Single(node) => {
                let (cursor, keys) = node.scan_once(pattern, at.cursor, limit).await?;
                let next = (cursor != 0).then_some(ScanAt { server: 0, cursor });
                Ok(KeyPage { keys, next })
            }
            Backend::Cluster(node) => node.scan_page(pattern, at, limit).await,
            Backend::Redlock(_) => Err(LockError::config(
                "listing locks is not available on Redlock: ask each server with \
                 a client of its own, or inspect a key you know",
            )),
            Backend::Memory(store) => Ok(KeyPage {
                keys: store.keys_matching(pattern),
                next: None,
            }),
        }
    }

    /// Turns the `NotOurs` answers of a renewal round into `Evicted` where
    /// the key's tombstone names the lease's token. A second call, and only
    /// for leases already lost: the renewal itself stays as it was, and the
    /// uncontended path pays nothing. Without an answer a lease stays
    /// `NotOurs`.
    pub(crate) async fn tell_evicted<R: Renewable>(
        &self,
        due: &[R],
        answers: &mut [RenewOutcome],
        limit: Duration,
    ) {
        let lost: Vec<usize> = (0..due.len().min(answers.len()))
            .filter(|&i| matches!(answers[i], RenewOutcome::NotOurs))
            .collect();
        let checks = lost
            .iter()
            .map(|&i| self.was_evicted(due[i].storage_key(), due[i].token(), limit));
        for (i, evicted) in lost.iter().zip(join_all(checks).await) {
            if evicted {
                answers[*i] = RenewOutcome::Evicted;
            }
        }
    }

    /// Whether the tombstone of `key` names `token`.
    pub(crate) async fn was_evicted(&self, key: &str, token: &Token, limit: Duration) -> bool {
        let tombstone = format!("{key}:evicted");
        let found = match self {
            Backend::Single(node) => node.tombstone(&tombstone, limit).await.ok().flatten(),
            Backend::Cluster(node) => node.tombstone(&tombstone, limit).await.ok().flatten(),
            Backend::Redlock(quorum) => {
                let answers = join_all(
                    quorum
                        .nodes()
                        .iter()
                        .map(|n| n.tombstone(&tombstone, limit)),
                )
                .await;
                answers.into_iter().flatten().flatten().next()
            }
            Backend::Memory(store) => return store.was_evicted(key, token),
        };
        found.is_some_and(|tokens| tokens.split(' ').any(|t| t == token.as_str()))
    }
}

// Wait records and the deadlock walk (see `waits.rs` at the crate root).
impl Backend {
    /// Writes or refreshes a waiter's records, lasting `ttl`. On Redlock on
    /// every server, returning once a majority has them (the walk reads a
    /// majority too), so a frozen server costs nothing.
    pub(crate) async fn record_wait(
        &self,
        records: &WaitRecords<'_>,
        ttl: Duration,
        limit: Duration,
    ) -> Result<(), LockError> {
        match self {
            Backend::Single(node) => node.record_wait(records, ttl, limit).await,
            Backend::Cluster(node) => node.record_wait(records, ttl, limit).await,
            Backend::Redlock(quorum) => {
                let calls = quorum
                    .nodes()
                    .iter()
                    .map(|n| n.record_wait(records, ttl, limit));
                on_majority(calls).await
            }
            Backend::Memory(store) => {
                store.record_wait(records, ttl);
                Ok(())
            }
        }
    }

    /// Removes a waiter's records; on Redlock from every server, returning
    /// once a majority answered.
    pub(crate) async fn forget_wait(
        &self,
        records: &WaitRecords<'_>,
        limit: Duration,
    ) -> Result<(), LockError> {
        match self {
            Backend::Single(node) => node.forget_wait(records, limit).await,
            Backend::Cluster(node) => node.forget_wait(records, limit).await,
            Backend::Redlock(quorum) => {
                let calls = quorum.nodes().iter().map(|n| n.forget_wait(records, limit));
                on_majority(calls).await
            }
            Backend::Memory(store) => {
                store.forget_wait(records);
                Ok(())
            }
        }
    }

    /// Who holds `lock`, and its holder's wait note. On Redlock the first
    /// answer for which `decisive` holds, or else the first of a majority
    /// of answers: a frozen server never holds the walk up.
    pub(crate) async fn hop(
        &self,
        lock: &str,
        note: &str,
        limit: Duration,
        decisive: impl Fn(&Hop) -> bool,
    ) -> Result<Hop, LockError> {
        match self {
            Backend::Single(node) => node.hop(lock, note, limit).await,
            Backend::Cluster(node) => node.hop(lock, note, limit).await,
            Backend::Redlock(quorum) => {
                let calls = quorum.nodes().iter().map(|n| n.hop(lock, note, limit));
                let vote = |answer: &Result<Hop, LockError>| match answer {
                    Ok(hop) if decisive(hop) => Vote::Decisive,
                    other => Vote::answered(other),
                };
                let (decision, mut answers) =
                    majority::gather(calls.collect(), vote, OnSplit::Wait)
                        .await
                        .drop_rest();
                if let Decision::Decisive(i) = decision
                    && let Some(Ok(hop)) = answers.by_server[i].take()
                {
                    return Ok(hop);
                }
                let mut first_error = None;
                for answer in answers.into_arrival_order() {
                    match answer {
                        Ok(hop) => return Ok(hop),
                        Err(e) => {
                            first_error.get_or_insert(e);
                        }
                    }
                }
                first_error.map_or_else(|| Ok(Hop::default()), Err)
            }
            Backend::Memory(store) => Ok(store.hop(lock, note)),
        }
    }

    /// The live waiters of a key (`set` is its waiters set); on Redlock
    /// the longest list among a majority of the servers (a server that was
    /// down when a waiter wrote misses it).
    pub(crate) async fn waiters(&self, set: &str, limit: Duration) -> Result<WaitersAt, LockError> {
        match self {
            Backend::Single(node) => node.waiters(set, limit).await,
            Backend::Cluster(node) => node.waiters(set, limit).await,
            Backend::Redlock(quorum) => {
                let calls = quorum.nodes().iter().map(|n| n.waiters(set, limit));
                let (_, answers) = majority::gather(calls.collect(), Vote::answered, OnSplit::Wait)
                    .await
                    .drop_rest();
                let (mut best, mut first_error) = (None::<WaitersAt>, None);
                for answer in answers.into_arrival_order() {
                    match answer {
                        Ok(at) => {
                            if best
                                .as_ref()
                                .is_none_or(|b| at.members.len() > b.members.len())
                            {
                                best = Some(at);
                            }
                        }
                        Err(e) => {
                            first_error.get_or_insert(e);
                        }
                    }
                }
                match (best, first_error) {
                    (Some(at), _) => Ok(at),
                    (None, Some(e)) => Err(e),
                    (None, None) => Ok(WaitersAt::default()),
                }
            }
            Backend::Memory(store) => Ok(store.waiters(set)),
        }
    }
}

/// Runs `calls`, one per Redlock server, until a majority of them
/// succeeded (the rest are dropped) or all have answered: `Ok` with a
/// majority, else the first error.
async fn on_majority<F>(calls: impl Iterator<Item = F>) -> Result<(), LockError>
where
    F: std::future::Future<Output = Result<(), LockError>>,
{
    let (decision, answers) = majority::gather(calls.collect(), Vote::answered, OnSplit::Wait)
        .await
        .drop_rest();
    if decision == Decision::Majority(()) {
        return Ok(());
    }
    answers
        .into_arrival_order()
        .find_map(Result::err)
        .map_or(Ok(()), Err)
}

/// Renews each of `due` with a script call of its own, all at once,
/// through the cluster's routing.
async fn renew_one_by_one<R: Renewable>(
    node: &ClusterNode,
    due: &[R],
    limit: Duration,
) -> Vec<RenewOutcome> {
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
