//! Leader election with terms: [`LockClient::campaign`], [`Leadership`],
//! [`LockClient::lead`] and [`LockClient::watch_leader`].
//!
//! A leader is the holder of a fenced lease on the election's key, and its
//! **term** is that lease's fencing token: it grows with every new leader
//! (on one server and on Redlock, also across the fence counter's expiry),
//! so whatever a leader writes can carry its term and be refused once a
//! later leader has written. Campaigners wait as any waiter does: a
//! resignation wakes them through the release message, a crashed leader's
//! lease is taken at its expiry.

use super::LockClient;
use super::operators::LockState;
use crate::acquire::Listener;
use crate::backend::Subscription;
use crate::error::{ErrorKind, LockError, LossReason, TimedOut};
use crate::guard::LockGuard;
use crate::options::LockOptions;
use futures::Stream;
use std::fmt;
use std::future::Future;
use std::pin::pin;
use std::time::Duration;
use tokio::time::Instant;

/// How long a campaign pauses after a round that failed at once (a server
/// refusing connections), before it asks again.
const UNAVAILABLE_PAUSE: Duration = Duration::from_millis(100);

/// A campaign's rounds per default wait: an outage ends a campaign after at
/// least the client's default wait and at most a quarter more.
const ROUNDS_PER_WAIT: u32 = 4;

/// The shortest round of a campaign (a client whose default wait is 0).
const MIN_ROUND: Duration = Duration::from_millis(100);

/// The first pause of a watcher that finds nobody leading: short, since a
/// campaigner usually takes over within milliseconds of a release.
const FIRST_LOOK: Duration = Duration::from_millis(5);

/// How long a watcher's wait is taken to last, for its listeners mark (a
/// cluster; see [`Listener::prepare`]): the mark is kept up for as long as
/// the watcher is polled.
const WATCHED_FOR: Duration = Duration::from_secs(24 * 60 * 60);

/// Leading an election: a fenced lease on its key, renewed while held.
///
/// [`term`](Self::term) is the lease's fencing token: strictly larger than
/// every earlier leader's term of the same key. Give it to whatever the
/// leader writes (a database row's `term` column, a conditional update) so
/// that a leader that paused past its ttl and kept going is refused once a
/// newer one has written; see [`docs/leader.md`].
///
/// Dropping it resigns in the background; [`resign`](Self::resign) resigns
/// and says whether it still led. Either way a waiting campaigner leads
/// within milliseconds, not at the ttl.
///
/// [`docs/leader.md`]: https://github.com/lock-rs/distributed-lock/blob/main/docs/leader.md
#[must_use = "dropping a Leadership resigns at once"]
pub struct Leadership {
    guard: LockGuard,
    term: u64,
}

impl Leadership {
    /// The election's key.
    pub fn key(&self) -> &str {
        self.guard.key()
    }

    /// This leader's term: the lease's fencing token, larger than every
    /// earlier leader's of this key.
    pub fn term(&self) -> u64 {
        self.term
    }

    /// Whether the lease is known lost: stop acting as the leader.
    pub fn is_lost(&self) -> bool {
        self.guard.is_lost()
    }

    /// Why it was lost, once it is.
    pub fn loss_reason(&self) -> Option<LossReason> {
        self.guard.loss_reason()
    }

    /// Completes when the lease is lost (at once if it already is).
    pub async fn lost(&self) {
        self.guard.lost().await;
    }

    /// How long the lease is known valid from now.
    pub fn remaining(&self) -> Duration {
        self.guard.remaining()
    }

    /// Steps down: releases the lease (compare-and-delete), which wakes the
    /// campaigners at once. `Ok(true)` when it still led.
    pub async fn resign(self) -> Result<bool, LockError> {
        self.guard.release().await
    }

    /// The lease underneath.
    pub fn guard(&self) -> &LockGuard {
        &self.guard
    }
}

impl fmt::Debug for Leadership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Leadership")
            .field("key", &self.key())
            .field("term", &self.term)
            .field("lost", &self.is_lost())
            .finish()
    }
}

impl LockClient {
    /// Waits until this client leads the election `key`, with a lease of
    /// `ttl` renewed while the [`Leadership`] lives.
    ///
    /// There is no bound on the wait: drop the future to stop campaigning.
    /// A resigning leader is followed within milliseconds (its release
    /// wakes the campaigners); a crashed one at its lease's expiry. An error
    /// ends the campaign at once, except [`ErrorKind::Unavailable`], which
    /// ends it only once Redis has stayed unreachable for the client's
    /// [`default_wait`](Self::default_wait) (and at most a quarter more): a
    /// shorter outage is waited out.
    ///
    /// ```
    /// use lock_core::{LockClient, MemoryStore};
    /// use std::time::Duration;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), lock_core::LockError> {
    /// let store = MemoryStore::new();
    /// let (a, b) = (LockClient::in_memory_on(&store), LockClient::in_memory_on(&store));
    /// let ttl = Duration::from_secs(10);
    /// let first = a.campaign("scheduler", ttl).await?;
    /// let follower = tokio::spawn(async move { b.campaign("scheduler", ttl).await });
    /// let first_term = first.term();
    /// first.resign().await?;
    /// let second = follower.await.expect("no panic")?;
    /// assert!(second.term() > first_term);
    /// # Ok(()) }
    /// ```
    pub async fn campaign(&self, key: &str, ttl: Duration) -> Result<Leadership, LockError> {
        // A campaign is rounds of lock calls. The pub/sub wake-up and the
        // expiry-timed retry make a round's length irrelevant to how fast a
        // leader is followed; it bounds how late an outage is noticed: a
        // round that fails may have found Redis away from its start, so an
        // outage is counted from the start of the first failed round, and
        // the campaign ends once that is a default wait and a round ago.
        let round_wait = (self.default_wait() / ROUNDS_PER_WAIT).max(MIN_ROUND);
        let give_up_after = self.default_wait() + round_wait;
        let round = LockOptions::new(ttl).fencing(true).wait(round_wait);
        let mut unreachable_since: Option<Instant> = None;
        // What the servers said last, for the error at the end.
        let mut last_error: Option<LockError> = None;
        loop {
            let started = Instant::now();
            // A round cannot outlast the campaign's give-up time: against a
            // server that stopped answering, each of its calls takes the
            // whole operation timeout, and the last round would overshoot
            // the bound by as much.
            let give_up_at = unreachable_since.unwrap_or(started) + give_up_after;
            let attempt = tokio::time::timeout_at(give_up_at, self.lock_with(key, round.clone()));
            let Ok(attempt) = attempt.await else {
                if let Some(e) = last_error {
                    return Err(e);
                }
                return Err(LockError::new(ErrorKind::Unavailable)
                    .with_message(format!(
                        "no answer from Redis within {give_up_after:?} (the default wait and \
                         a round)"
                    ))
                    .with_source(TimedOut {
                        after: give_up_after,
                    })
                    .with_key(key));
            };
            match attempt {
                Ok(guard) => {
                    let Some(term) = guard.fencing_token() else {
                        // A re-entry of a lock taken without fencing is
                        // refused by lock_with; nothing else lacks a token.
                        return Err(LockError::options(
                            "an election needs a fenced lease: the key is held by this task \
                             without fencing",
                        )
                        .with_key(key));
                    };
                    return Ok(Leadership { guard, term });
                }
                Err(e) if e.kind() == ErrorKind::Contended => {
                    unreachable_since = None;
                    last_error = None;
                }
                Err(e) if e.kind() == ErrorKind::Unavailable => {
                    let since = *unreachable_since.get_or_insert(started);
                    if since.elapsed() >= give_up_after {
                        return Err(e);
                    }
                    last_error = Some(e);
                    let left = (since + give_up_after).saturating_duration_since(Instant::now());
                    tokio::time::sleep(UNAVAILABLE_PAUSE.min(left)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The loop of a service that must run on one replica at a time:
    /// campaigns for `key`, runs `work(term)` while leading, and when the
    /// lease is lost drops `work`'s future (at its next `.await`) and
    /// campaigns again. Returns when `work` returns: `Ok(())` after
    /// resigning, or `work`'s error after resigning. Campaign errors (see
    /// [`campaign`](Self::campaign)) come back through `E: From<LockError>`.
    ///
    /// ```
    /// use lock_core::{LockClient, LockError};
    /// use std::time::Duration;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), LockError> {
    /// let client = LockClient::in_memory();
    /// let mut runs = 0;
    /// client
    ///     .lead("outbox-relay", Duration::from_secs(10), |term| {
    ///         runs += 1;
    ///         async move {
    ///             // Relay the outbox, each write fenced with `term`; return
    ///             // to step down.
    ///             assert!(term > 0);
    ///             Ok::<(), LockError>(())
    ///         }
    ///     })
    ///     .await?;
    /// assert_eq!(runs, 1);
    /// # Ok(()) }
    /// ```
    pub async fn lead<F, Fut, E>(&self, key: &str, ttl: Duration, mut work: F) -> Result<(), E>
    where
        F: FnMut(u64) -> Fut,
        Fut: Future<Output = Result<(), E>>,
        E: From<LockError>,
    {
        loop {
            let leadership = self.campaign(key, ttl).await?;
            let outcome = {
                let working = work(leadership.term());
                tokio::select! {
                    biased;
                    () = leadership.lost() => None,
                    outcome = working => Some(outcome),
                }
            };
            let Some(outcome) = outcome else {
                // Lost: `work` is dropped; the lease is let go (a no-op on
                // a key no longer ours) and the campaign starts again.
                drop(leadership);
                continue;
            };
            let resigned = leadership.resign().await;
            outcome?;
            return resigned.map(drop).map_err(E::from);
        }
    }

    /// Who leads the election `key`, as it changes: the current leader
    /// first (`None` while nobody leads), then each change. A
    /// [`LockState`]'s [`fencing_token`](LockState::fencing_token) is the
    /// leader's term, [`holder`](LockState::holder) its holder name.
    ///
    /// A resignation is seen at once (the watcher hears the release
    /// message), and the next leader within milliseconds of it; a crashed
    /// leader's expiry at the expiry. While a leader holds and nothing
    /// changes, Redis is asked once per remaining lease (about once a ttl);
    /// while nobody leads, at pauses that grow from 5 ms to the last
    /// leader's ttl. A read that fails is tried again after a pause. The
    /// states carry no waiters ([`LockClient::inspect`] reads them).
    ///
    /// ```
    /// use futures::StreamExt;
    /// use lock_core::LockClient;
    /// use std::time::Duration;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), lock_core::LockError> {
    /// let client = LockClient::in_memory();
    /// let mut leaders = std::pin::pin!(client.watch_leader("scheduler"));
    /// assert!(leaders.next().await.expect("a first state").is_none());
    /// let leading = client.campaign("scheduler", Duration::from_secs(10)).await?;
    /// let seen = leaders.next().await.flatten().expect("a leader");
    /// assert_eq!(seen.fencing_token(), Some(leading.term()));
    /// # Ok(()) }
    /// ```
    pub fn watch_leader(
        &self,
        key: &str,
    ) -> impl Stream<Item = Option<LockState>> + Send + 'static {
        let watch = Watch {
            client: self.clone(),
            key: key.to_owned(),
            listener: Listener::default(),
            last: None,
            idle_cap: Duration::from_secs(1),
        };
        futures::stream::unfold(watch, |mut watch| async move {
            let next = watch.next_change().await;
            Some((next, watch))
        })
    }
}

/// A watcher of an election's leader.
struct Watch {
    client: LockClient,
    key: String,
    /// The key's release messages.
    listener: Listener,
    /// The leader last reported (term and holder), `None` inside when
    /// nobody led; the outer `None` before the first report.
    last: Option<Option<(Option<u64>, Option<String>)>>,
    /// The longest pause while nobody leads: the last leader's ttl as seen.
    idle_cap: Duration,
}

impl Watch {
    /// Waits for the next change of leader and says who leads now.
    async fn next_change(&mut self) -> Option<LockState> {
        let mut idle = FIRST_LOOK;
        let mut failures: u32 = 0;
        loop {
            if failures > 0 {
                // The read failed: the connection may be gone, and the
                // subscription with it; make a new one.
                self.listener.renew();
            }
            self.listen().await;
            let subscription = self.listener.subscription.as_ref();
            // Listen before asking, so a release in between is not missed.
            let mut released = pin!(subscription.map(Subscription::released));
            if let Some(released) = released.as_mut().as_pin_mut() {
                released.enable();
            }
            let pause = match self.client.inspect_with(&self.key, false).await {
                Ok(state) => {
                    failures = 0;
                    let seen = state
                        .as_ref()
                        .map(|s| (s.fencing_token(), s.holder().map(str::to_owned)));
                    if self.last.as_ref() != Some(&seen) {
                        self.last = Some(seen);
                        return state;
                    }
                    match &state {
                        Some(held) if held.expires() => {
                            idle = FIRST_LOOK;
                            self.idle_cap = self.idle_cap.max(held.remaining());
                            // Just past its expiry: renewed by then, or gone.
                            held.remaining() + Duration::from_millis(1)
                        }
                        // Another program's key without expiry (remaining
                        // is Duration::MAX): its release publishes
                        // nothing, so look again as at a vacancy.
                        Some(_) => self.idle_cap,
                        None => {
                            let pause = idle;
                            idle = (idle * 2).min(self.idle_cap);
                            pause
                        }
                    }
                }
                Err(_) => {
                    failures = failures.saturating_add(1);
                    self.client
                        .inner
                        .backoff
                        .delay(failures)
                        .max(UNAVAILABLE_PAUSE)
                }
            };
            // Back before the mark that has releases heard runs out.
            let pause = pause.min(self.listener.heard_for());
            match released.as_mut().as_pin_mut() {
                Some(released) => {
                    if tokio::time::timeout(pause, released).await.is_ok() {
                        // A release: the next leader follows within
                        // milliseconds.
                        idle = FIRST_LOOK;
                    }
                }
                None => tokio::time::sleep(pause).await,
            }
        }
    }

    /// Subscribes to the key's release messages, if not yet, and keeps
    /// the mark that has its releases published on a cluster (see
    /// [`Listener::prepare`]). A watcher waits for as long as it is
    /// polled.
    async fn listen(&mut self) {
        let inner = &self.client.inner;
        if self.listener.target.key.is_none() {
            if let Ok(storage_key) = inner.shared_storage_key(&self.key) {
                self.listener.target.follow(&storage_key);
            }
        } else if self.listener.subscription.is_none() {
            // Subscribing (or marking) failed last time: again.
            self.listener.renew();
        }
        let forever = Instant::now() + WATCHED_FOR;
        self.listener.prepare(inner, forever, &|_| {}).await;
    }
}
