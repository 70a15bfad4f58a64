//! Redlock: a lock held on a majority of N independent Redis primaries.
//!
//! # Acquire
//!
//! 1. Note the start on the monotonic clock.
//! 2. Send `SET NX PX` (or the fencing script) to all N servers at once,
//!    each bounded by the per-server timeout, so a server that is down or
//!    slow costs at most that timeout.
//! 3. The lock is ours if a majority (`N/2 + 1`) granted it and time is
//!    left: `ttl - elapsed - (ttl * 1% + 2 ms) > 0`. This is decided as
//!    soon as a majority has granted: the calls to the other
//!    servers finish in the background (see [`Quorum::gather`]), so a lock
//!    costs the round trip of the majority's slowest server, not of the
//!    slowest of all. An attempt that can no longer win (more servers said
//!    no than a majority allows) is decided as soon as that is known, too.
//! 4. Otherwise release it on *every* server, including those that did not
//!    answer (their `SET` may have been applied), waiting only until a
//!    majority answered, and report `Busy` when the servers that answered were held by others, or
//!    `Unavailable` when too few answered to decide. Every attempt sends a
//!    token of its own, so a late undo cannot delete a later attempt's key.
//!
//! Renewals and releases go to all servers; a renewal counts only when a
//! majority renewed before the validity deadline, and the lock is lost for
//! certain once more than `N - majority` servers say it is not ours. A
//! release, an `extend` and a ping return once a majority has answered; the
//! rest, as above, in the background. A server that stops answering thus
//! costs an operation at most the per-server timeout, never more.
//!
//! # Fencing across servers
//!
//! A per-server counter alone is not monotonic across quorums: failed
//! attempts raise counters on some servers and not others, so the highest
//! counter in one majority can be below that in another. With fencing on:
//!
//! 1. Each server runs one script: `SET NX PX`, and on success raises its
//!    fence counter to `max(counter + 1, its clock in µs)`. The token is `T = max` over the majority whose grants
//!    decided the attempt (a server that grants later is not counted).
//! 2. On each of those servers, a second script raises the counter to at
//!    least `T`, only while our key still holds our token there.
//! 3. The acquisition stands only if that lift succeeded on a majority
//!    within the validity window; otherwise it is released and retried.
//!
//! Why a later holder B gets a larger token than an earlier holder A: A's
//! lift succeeded on a majority `QA`, each while A's key existed there. B
//! was granted by a majority `QB`, and `QA` and `QB` share a server `n`. B's
//! `SET NX` on `n` succeeded only after A's key on `n` was gone, so after
//! A's lift on `n` had set the counter to at least `T_A`; B's raise on `n`
//! then gave at least `T_A + 1`, and `T_B`, a maximum that includes it,
//! is larger than `T_A`.
//!
//! What it assumes: servers do not lose their data (persistence with
//! `appendfsync always`, or a restarted server kept out for longer than the
//! longest ttl), and clocks drift within the 1 % allowance. A server that
//! restarts empty resets its counter, and the argument above no longer holds
//! for quorums that meet only on it.

use super::LockCommands;
use super::majority::{self, Count, Decision, OnSplit, Vote};
use super::{Attempt, LockKeys, Node, RenewOutcome, Renewable, Several};
use crate::error::{ErrorKind, LockError, NodeError, QuorumFailure};
use crate::lease::drift;
use crate::observe;
use crate::scripts::Wake;
use crate::token::{Holder, Token};
use futures::future::join_all;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;
use tokio::time::Instant;

/// The shortest default per-server timeout.
const MIN_NODE_TIMEOUT: Duration = Duration::from_millis(50);

/// N independent servers and the settings of the quorum.
pub(crate) struct Quorum {
    /// Shared with the calls left to finish in the background (see
    /// [`Quorum::gather`]).
    nodes: Arc<[Node]>,
    /// Calls left running by [`Quorum::gather`], which stops leaving any
    /// once there are [`majority::MAX_BACKGROUND`].
    background: Arc<AtomicUsize>,
    /// Set explicitly; otherwise 5 % of the ttl, within
    /// [`MIN_NODE_TIMEOUT`] and the operation timeout.
    node_timeout: Option<Duration>,
}

impl Quorum {
    pub(crate) fn new(nodes: Vec<Node>, node_timeout: Option<Duration>) -> Quorum {
        Quorum {
            nodes: nodes.into(),
            background: Arc::default(),
            node_timeout,
        }
    }

    /// The same servers through connections of their own (see
    /// [`Backend::twin`](super::Backend::twin)).
    pub(crate) fn twin(&self) -> Quorum {
        Quorum {
            nodes: self.nodes.iter().map(Node::twin).collect(),
            background: Arc::default(),
            node_timeout: self.node_timeout,
        }
    }

    pub(crate) fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// How many servers must agree.
    pub(crate) fn majority(&self) -> usize {
        majority::majority_of(self.nodes.len())
    }

    /// The bound on one server's answer for a lease of `ttl`, never above
    /// `limit`.
    pub(crate) fn node_timeout(&self, ttl: Duration, limit: Duration) -> Duration {
        self.node_timeout
            .unwrap_or_else(|| (ttl / 20).max(MIN_NODE_TIMEOUT))
            .min(limit)
    }

    pub(crate) async fn acquire(
        &self,
        keys: &LockKeys<'_>,
        token: &Token,
        ttl: Duration,
        limit: Duration,
    ) -> Result<Attempt, LockError> {
        let started = Instant::now();
        let per_node = self.node_timeout(ttl, limit);
        // Nothing more is needed from the servers that answer after a
        // majority granted. With fencing, the token is the highest counter
        // of the majority that granted: any later majority meets it on a
        // server whose counter was lifted to it (see the module docs).
        let owned = Arc::new(OwnedKeys::new(keys));
        let calls = self.each_node(|nodes, i| {
            let (owned, token) = (owned.clone(), token.clone());
            async move { nodes[i].acquire(&owned.keys(), &token, ttl, per_node).await }
        });
        let vote = |answer: &Result<Attempt, LockError>| match answer {
            Ok(Attempt::Granted { .. }) => Vote::YES,
            Ok(Attempt::Busy { .. }) => Vote::Against,
            Err(_) => Vote::Abstain,
        };
        let answers = self.gather(calls, vote, OnSplit::GiveUp).await;
        let left = majority_free_in(&answers, self.majority());
        let ahead = won_first_answer(&answers);
        let mut foreign = false;
        let mut tally = Tally::new(self.majority());
        let mut fence = 0u64;
        let mut granted_on = Vec::with_capacity(self.nodes.len());
        for (node, answer) in self.nodes.iter().zip(answers) {
            let Some(answer) = answer else {
                continue;
            };
            match answer {
                Ok(Attempt::Granted { fence: f }) => {
                    tally.granted += 1;
                    fence = fence.max(f.unwrap_or(0));
                    granted_on.push(node);
                }
                Ok(Attempt::Busy { foreign: f, .. }) => {
                    tally.busy += 1;
                    foreign |= f;
                }
                Err(e) => tally.failures.push(NodeError::new(node.addr(), e)),
            }
        }
        let valid_for = ttl
            .checked_sub(started.elapsed())
            .and_then(|left| left.checked_sub(drift(ttl)));
        if tally.granted >= tally.needed && valid_for.is_some() {
            if keys.fence.is_none() {
                return Ok(Attempt::Granted { fence: None });
            }
            // Within what is left of `limit`: the attempt as a whole stays
            // within the caller's bound.
            let left = per_node.min(limit.saturating_sub(started.elapsed()));
            if self
                .lift(keys, token, fence, &granted_on, started, ttl, left)
                .await
            {
                return Ok(Attempt::Granted { fence: Some(fence) });
            }
        }
        // Not ours: undo everywhere, the silent servers included, waiting
        // only until a majority has answered: every attempt has a token of
        // its own, so a late undo can never delete a later attempt's key.
        self.release_on(keys.lock, token, per_node, Wait::Undo)
            .await
            .ok();
        if tally.granted + tally.busy < tally.needed {
            return Err(tally.unavailable("too few Redis servers answered"));
        }
        if tally.granted >= tally.needed {
            return Err(tally.unavailable(
                "a majority granted the lock, but too late for any validity to remain",
            ));
        }
        Ok(Attempt::Busy {
            left,
            foreign,
            ahead,
        })
    }

    /// Several keys on every server, each with the all-or-none script;
    /// granted when a majority granted in time, as [`acquire`](Self::acquire).
    /// With fencing each key's token is the highest its counter gave on the
    /// granting majority, lifted on a majority as for one key.
    pub(crate) async fn acquire_all(
        &self,
        keys: &[LockKeys<'_>],
        token: &Token,
        ttl: Duration,
        writer_for: Duration,
        limit: Duration,
    ) -> Result<Several, LockError> {
        let started = Instant::now();
        let per_node = self.node_timeout(ttl, limit);
        let owned: Arc<[OwnedKeys]> = keys.iter().map(OwnedKeys::new).collect();
        let calls = self.each_node(|nodes, i| {
            let (owned, token) = (owned.clone(), token.clone());
            async move {
                let keys: Vec<LockKeys<'_>> = owned.iter().map(OwnedKeys::keys).collect();
                nodes[i]
                    .acquire_all(&keys, &token, ttl, writer_for, per_node)
                    .await
            }
        });
        let vote = |answer: &Result<Several, LockError>| match answer {
            Ok(Several::Granted(_)) => Vote::YES,
            Ok(Several::Busy { .. }) => Vote::Against,
            Err(_) => Vote::Abstain,
        };
        let answers = self.gather(calls, vote, OnSplit::GiveUp).await;
        let mut tally = Tally::new(self.majority());
        let fenced = keys.iter().all(|k| k.fence.is_some());
        let mut fences = vec![0u64; if fenced { keys.len() } else { 0 }];
        let mut granted_on = Vec::with_capacity(self.nodes.len());
        let mut busy_at = 0;
        for (node, answer) in self.nodes.iter().zip(answers) {
            match answer {
                None => {}
                Some(Ok(Several::Granted(got))) => {
                    tally.granted += 1;
                    for (fence, f) in fences.iter_mut().zip(got) {
                        *fence = (*fence).max(f);
                    }
                    granted_on.push(node);
                }
                Some(Ok(Several::Busy { at })) => {
                    tally.busy += 1;
                    busy_at = at;
                }
                Some(Err(e)) => tally.failures.push(NodeError::new(node.addr(), e)),
            }
        }
        let in_time = started.elapsed() + drift(ttl) < ttl;
        if tally.granted >= tally.needed && in_time {
            let left = per_node.min(limit.saturating_sub(started.elapsed()));
            let lifts = keys
                .iter()
                .zip(&fences)
                .map(|(k, &fence)| self.lift(k, token, fence, &granted_on, started, ttl, left));
            if join_all(lifts).await.into_iter().all(|lifted| lifted) {
                return Ok(Several::Granted(fences));
            }
        }
        let undo = keys
            .iter()
            .map(|k| self.release_on(k.lock, token, per_node, Wait::Undo));
        join_all(undo).await;
        if tally.granted + tally.busy < tally.needed {
            return Err(tally.unavailable("too few Redis servers answered"));
        }
        if tally.granted >= tally.needed {
            return Err(tally.unavailable(
                "a majority granted the locks, but too late for any validity to remain",
            ));
        }
        Ok(Several::Busy { at: busy_at })
    }

    /// The second fencing step; `true` when it stood on a majority in time.
    #[allow(clippy::too_many_arguments)]
    async fn lift(
        &self,
        keys: &LockKeys<'_>,
        token: &Token,
        fence: u64,
        granted_on: &[&Node],
        started: Instant,
        ttl: Duration,
        per_node: Duration,
    ) -> bool {
        let lifted = join_all(
            granted_on
                .iter()
                .map(|node| node.lift_fence(keys, token, fence, ttl, per_node)),
        )
        .await;
        let lifted = lifted.into_iter().filter(|r| matches!(r, Ok(true))).count();
        lifted >= self.majority() && started.elapsed() + drift(ttl) < ttl
    }

    /// Renews on every server (each raises the expiry, never lowers it).
    pub(crate) async fn renew(
        &self,
        key: &str,
        token: &Token,
        ttl: Duration,
        limit: Duration,
    ) -> Result<bool, LockError> {
        self.expire(key, token, ttl, limit, false).await
    }

    /// Sets the expiry to exactly `ttl` on every server; decided as
    /// [`renew`](Self::renew).
    pub(crate) async fn set_ttl(
        &self,
        key: &str,
        token: &Token,
        ttl: Duration,
        limit: Duration,
    ) -> Result<bool, LockError> {
        self.expire(key, token, ttl, limit, true).await
    }

    /// [`renew`](Self::renew), or [`set_ttl`](Self::set_ttl) when `exact`;
    /// returns once a majority has answered.
    async fn expire(
        &self,
        key: &str,
        token: &Token,
        ttl: Duration,
        limit: Duration,
        exact: bool,
    ) -> Result<bool, LockError> {
        let per_node = self.node_timeout(ttl, limit);
        let key: Arc<str> = key.into();
        let calls = self.each_node(|nodes, i| {
            let (key, token) = (key.clone(), token.clone());
            async move {
                let node = &nodes[i];
                if exact {
                    node.set_ttl(&key, &token, ttl, per_node).await
                } else {
                    node.renew(&key, &token, ttl, per_node).await
                }
            }
        });
        let answers = self.gather(calls, said, OnSplit::Wait).await;
        let undecided = if exact {
            "could not set the lease's expiry on a majority of Redis servers"
        } else {
            "could not renew on a majority of Redis servers"
        };
        self.decide_expiry(answers, undecided)
    }

    /// The lease is ours when a majority said so, certainly not when more
    /// than `N - majority` said not; otherwise nobody can tell.
    fn decide_expiry(
        &self,
        answers: Vec<Option<Result<bool, LockError>>>,
        undecided: &str,
    ) -> Result<bool, LockError> {
        let tally = self.tally(answers);
        if tally.granted >= tally.needed {
            Ok(true)
        } else if tally.busy > self.nodes.len() - tally.needed {
            // A majority can no longer be ours.
            Ok(false)
        } else {
            Err(tally.unavailable(undecided))
        }
    }

    /// Renews a round of leases on every server; a lease is renewed when a
    /// majority renewed it, certainly lost when more than `N - majority`
    /// servers say it is not ours, and otherwise undecided (`Failed`).
    pub(crate) async fn renew_many<R: Renewable>(
        &self,
        due: &[R],
        limit: Duration,
    ) -> Vec<RenewOutcome> {
        let ttl = due.iter().map(Renewable::ttl).min().unwrap_or(limit);
        let per_node = self.node_timeout(ttl, limit);
        let answers = join_all(self.nodes.iter().map(|node| node.renew_many(due, per_node))).await;
        let failed = answers.iter().filter(|a| a.error.is_some()).count();
        if failed > self.nodes.len() - self.majority()
            && let (Some(first), Some(e)) =
                (due.first(), answers.iter().find_map(|a| a.error.as_ref()))
        {
            observe::renewal_failed(first.name(), due.len(), e);
        }
        (0..due.len())
            .map(|i| {
                let mut count = Count::new(self.nodes.len());
                let votes = answers.iter().map(|answer| match answer.each.get(i) {
                    Some(Some(true)) => Vote::YES,
                    Some(Some(false)) => Vote::Against,
                    _ => Vote::Abstain,
                });
                let decided = votes
                    .enumerate()
                    .find_map(|(server, vote)| count.add(server, vote));
                match decided {
                    Some(Decision::Majority(())) => RenewOutcome::Renewed,
                    Some(Decision::Against) => RenewOutcome::NotOurs,
                    _ => RenewOutcome::Failed,
                }
            })
            .collect()
    }

    /// Releases on every server; returns once a majority has released.
    pub(crate) async fn release(
        &self,
        key: &str,
        token: &Token,
        limit: Duration,
    ) -> Result<bool, LockError> {
        self.release_on(key, token, limit, Wait::Majority).await
    }

    /// Releases on every server, returning as `wait` says; the calls not
    /// waited for finish in the background.
    async fn release_on(
        &self,
        key: &str,
        token: &Token,
        limit: Duration,
        wait: Wait,
    ) -> Result<bool, LockError> {
        let per_node = self.node_timeout.unwrap_or(limit).min(limit);
        let key: Arc<str> = key.into();
        let calls = self.each_node(|nodes, i| {
            let (key, token) = (key.clone(), token.clone());
            async move {
                match wait {
                    Wait::Majority => nodes[i].release(&key, &token, per_node).await,
                    Wait::Undo => nodes[i].undo(&key, &token, per_node).await,
                }
            }
        });
        let answers = match wait {
            Wait::Majority => self.gather(calls, said, OnSplit::Wait).await,
            Wait::Undo => self.gather(calls, Vote::answered, OnSplit::Wait).await,
        };
        let tally = self.tally(answers);
        if tally.granted >= tally.needed {
            Ok(true)
        } else if tally.granted + tally.busy >= tally.needed {
            Ok(false)
        } else {
            Err(tally.unavailable("could not release on a majority of Redis servers"))
        }
    }

    /// [`release`](Self::release) without waiting for the replies: done once
    /// a majority of the servers have the command written; the others
    /// finish in the background.
    pub(crate) async fn send_release(
        &self,
        key: &str,
        token: &Token,
        limit: Duration,
    ) -> Result<(), LockError> {
        let per_node = self.node_timeout.unwrap_or(limit).min(limit);
        let key: Arc<str> = key.into();
        let calls = self.each_node(|nodes, i| {
            let (key, token) = (key.clone(), token.clone());
            async move {
                nodes[i]
                    .send_release(&key, &token, Wake::Everyone, per_node)
                    .await
            }
        });
        let answers = self.gather(calls, Vote::answered, OnSplit::Wait).await;
        let written = answers.iter().filter(|a| matches!(a, Some(Ok(())))).count();
        if written >= self.majority() {
            return Ok(());
        }
        let mut tally = Tally::new(self.majority());
        for (node, answer) in self.nodes.iter().zip(answers) {
            if let Some(Err(e)) = answer {
                tally.failures.push(NodeError::new(node.addr(), e));
            }
        }
        Err(tally.unavailable("could not send the release to a majority of Redis servers"))
    }

    /// [`Node::release_now`] on every server: whether every one of them
    /// has the release written. Sent to all even when one fails, so that
    /// a release the caller sends again finds most keys gone already.
    pub(crate) fn release_now(&self, key: &str, token: &Token) -> bool {
        let unsent = self
            .nodes
            .iter()
            .filter(|node| !node.release_now(key, token, Wake::Everyone));
        unsent.count() == 0
    }

    /// A round trip to every server, each bounded by `limit` (it may have
    /// to connect first); `Ok` once a majority answered.
    pub(crate) async fn ping(&self, limit: Duration) -> Result<(), LockError> {
        let calls =
            self.each_node(|nodes, i| async move { nodes[i].ping(limit).await.map(|()| true) });
        let answers = self.gather(calls, said, OnSplit::Wait).await;
        let tally = self.tally(answers);
        if tally.granted >= tally.needed {
            Ok(())
        } else {
            Err(tally.unavailable("too few Redis servers answered"))
        }
    }

    /// The Redis type of `key` as a majority of the servers see it: the
    /// first type other than a string found, or `None`. Servers that do not
    /// answer within the per-server timeout are not waited for.
    pub(crate) async fn key_type(
        &self,
        key: &str,
        ttl: Duration,
        limit: Duration,
    ) -> Option<String> {
        let per_node = self.node_timeout(ttl, limit);
        let key: Arc<str> = key.into();
        let calls = self.each_node(|nodes, i| {
            let key = key.clone();
            async move { nodes[i].key_type(&key, per_node).await }
        });
        let plain = |answer: &Result<String, LockError>| match answer.as_deref() {
            Ok("string" | "none") => Vote::YES,
            Ok(_) => Vote::Against,
            Err(_) => Vote::Abstain,
        };
        let answers = self.gather(calls, plain, OnSplit::Wait).await;
        answers.into_iter().flatten().find_map(|answer| {
            answer
                .ok()
                .filter(|kind| kind != "string" && kind != "none")
        })
    }
}

/// A yes/no answer as a vote; a failed call abstains.
fn said(answer: &Result<bool, LockError>) -> Vote {
    match answer {
        Ok(true) => Vote::YES,
        Ok(false) => Vote::Against,
        Err(_) => Vote::Abstain,
    }
}

/// How long [`Quorum::release_on`] waits.
#[derive(Clone, Copy)]
enum Wait {
    /// Until a majority released (or can no longer release).
    Majority,
    /// The undo of an attempt that did not win: until a majority answered,
    /// whatever they said, and without telling waiters. Those that found
    /// the key held by this attempt on some servers come back on their
    /// own jittered backoff: woken all at once, the clients would split
    /// the servers between them again the same way (with a frozen
    /// minority, each such split waits out its timeout).
    Undo,
}

impl Quorum {
    /// Counts per-server yes/no answers (in server order) and failures;
    /// `None`: not waited for.
    fn tally(&self, answers: impl IntoIterator<Item = Option<Result<bool, LockError>>>) -> Tally {
        let mut tally = Tally::new(self.majority());
        for (node, answer) in self.nodes.iter().zip(answers) {
            match answer {
                Some(Ok(true)) => tally.granted += 1,
                Some(Ok(false)) => tally.busy += 1,
                Some(Err(e)) => tally.failures.push(NodeError::new(node.addr(), e)),
                None => {}
            }
        }
        tally
    }

    /// One call per server, in server order: `call(nodes, i)` for the
    /// `i`th, given its own share of the servers so that it can outlive the
    /// operation (see [`Quorum::gather`]).
    fn each_node<F>(&self, call: impl Fn(Arc<[Node]>, usize) -> F) -> Vec<F> {
        (0..self.nodes.len())
            .map(|i| call(self.nodes.clone(), i))
            .collect()
    }

    /// Runs `calls` (from [`each_node`](Self::each_node)) until their
    /// answers decide (see [`majority::gather`]); the answers come back in
    /// server order, `None` for a call not waited for. The calls still
    /// running finish in the background: their commands still matter.
    async fn gather<T, F>(
        &self,
        calls: Vec<F>,
        vote: impl Fn(&T) -> Vote,
        on_split: OnSplit,
    ) -> Vec<Option<T>>
    where
        F: Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        let decided = majority::gather(calls, vote, on_split).await;
        let (_, answers) = decided.keep_running(&self.background);
        answers.by_server
    }
}

struct Tally {
    granted: usize,
    busy: usize,
    needed: usize,
    failures: Vec<NodeError>,
}

impl Tally {
    fn new(needed: usize) -> Tally {
        Tally {
            granted: 0,
            busy: 0,
            needed,
            failures: Vec::new(),
        }
    }

    fn unavailable(self, message: &str) -> LockError {
        LockError::new(ErrorKind::Unavailable)
            .with_message(message)
            .with_source(QuorumFailure {
                granted: self.granted,
                busy: self.busy,
                needed: self.needed,
                failures: self.failures,
            })
    }
}

/// When a majority of the servers will be free of the key, by what the
/// answers say: a server that granted is free (the attempt is undone), a
/// busy one frees when its holder's lease runs out; that is the
/// majority-th smallest of those times. `None` when too few told.
fn majority_free_in(
    answers: &[Option<Result<Attempt, LockError>>],
    majority: usize,
) -> Option<Duration> {
    let mut free_in: Vec<Duration> = answers
        .iter()
        .filter_map(|answer| match answer {
            Some(Ok(Attempt::Granted { .. })) => Some(Duration::ZERO),
            Some(Ok(Attempt::Busy { left, .. })) => *left,
            _ => None,
        })
        .collect();
    free_in.sort_unstable();
    free_in.get(majority.checked_sub(1)?).copied()
}

/// Whether the attempt won the first server (in server order) that
/// answered. Contenders that split the servers between them see the same
/// servers answer, as a rule, and only one of them won the first: that one
/// tries again at once, the others back off, and the next vote does not
/// split. Where they saw different servers answer, two may both think
/// they are ahead and split again, no worse than two backoffs that ended
/// together.
fn won_first_answer(answers: &[Option<Result<Attempt, LockError>>]) -> bool {
    answers
        .iter()
        .find_map(|answer| match answer {
            Some(Ok(attempt)) => Some(matches!(attempt, Attempt::Granted { .. })),
            _ => None,
        })
        .unwrap_or(false)
}

/// [`LockKeys`] owned, for calls that may outlive the caller.
struct OwnedKeys {
    lock: Arc<str>,
    fence: Option<Arc<str>>,
    writer: Option<(Arc<str>, Duration)>,
    holder: Option<Arc<Holder>>,
}

impl OwnedKeys {
    fn new(keys: &LockKeys<'_>) -> OwnedKeys {
        OwnedKeys {
            lock: keys.lock.into(),
            fence: keys.fence.map(Into::into),
            writer: keys.writer.map(|(w, d)| (w.into(), d)),
            holder: keys.holder.cloned(),
        }
    }

    fn keys(&self) -> LockKeys<'_> {
        LockKeys {
            lock: &self.lock,
            fence: self.fence.as_deref(),
            writer: self.writer.as_ref().map(|(w, d)| (&**w, *d)),
            holder: self.holder.as_ref(),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    /// Of contenders that split the servers, the one that won the first
    /// server to answer is ahead; a silent or failing server is no answer.
    #[test]
    fn the_first_answer_decides_who_is_ahead() {
        let granted = || Some(Ok(Attempt::Granted { fence: None }));
        let busy = || Some(Ok(Attempt::HELD));
        let failed = || Some(Err(LockError::new(ErrorKind::Unavailable)));
        assert!(won_first_answer(&[granted(), busy(), None]));
        assert!(won_first_answer(&[None, granted(), busy()]));
        assert!(won_first_answer(&[failed(), granted(), busy()]));
        assert!(!won_first_answer(&[busy(), granted(), None]));
        assert!(!won_first_answer(&[None, busy(), granted()]));
        assert!(!won_first_answer(&[None, None, None]));
    }
}
