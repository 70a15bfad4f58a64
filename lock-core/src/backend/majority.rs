//! How a Redlock quorum's servers decide an operation: one call per
//! server, all at once, counted by one rule.
//!
//! An operation is decided by the majority that answers first, so a slow
//! server does not slow every lock: [`gather`] returns as soon as the
//! answers in decide it, whichever way. What is done with the calls still
//! running is the caller's choice, made once on the [`Decided`] it gets:
//! [`keep_running`](Decided::keep_running) for commands that must still
//! reach every server (an acquisition, its undo, a release),
//! [`drop_rest`](Decided::drop_rest) for reads and wait records, whose late
//! answers nobody needs.

use futures::stream::{FuturesUnordered, StreamExt};
use futures::{FutureExt, future};
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::time::Instant;

/// How many calls may be left running in the background (per client):
/// past that, the calls an operation no longer needs are dropped instead, so
/// that a server that stops answering cannot have calls pile up on it
/// without bound, nor slow every operation down to its timeout. Dropping is
/// safe: each such call only concerns a minority of the servers (a lock they
/// keep expires with its ttl).
pub(super) const MAX_BACKGROUND: usize = 256;

/// The least grace [`OnSplit::GiveUp`] gives the silent servers.
const SPLIT_GRACE: Duration = Duration::from_millis(5);

/// How many of `servers` must agree.
pub(super) fn majority_of(servers: usize) -> usize {
    servers / 2 + 1
}

/// What one server's answer says, as [`gather`] counts it. `K` names an
/// outcome; a yes/no question has one, `()`, and [`Vote::YES`] for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Vote<K = ()> {
    /// For the outcome `K`: decided once a majority voted for the same one.
    For(K),
    /// No: decided once more than `N - majority` said no, since no outcome
    /// can have a majority any more.
    Against,
    /// Nothing (a failed call). It counts neither way, so that an error
    /// reports what every server that answers in time said.
    Abstain,
    /// This answer decides on its own.
    Decisive,
}

impl Vote {
    /// Yes, for a yes/no question.
    pub(super) const YES: Vote = Vote::For(());

    /// Yes for any answer; a failed call abstains. For a command whose
    /// every answer counts (an undo, a record written).
    pub(super) fn answered<T, E>(answer: &Result<T, E>) -> Vote {
        if answer.is_ok() {
            Vote::YES
        } else {
            Vote::Abstain
        }
    }
}

/// Whether an acquisition may give up on the silent servers once the
/// servers that answered split their votes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum OnSplit {
    /// Wait for the outcome, or for every server.
    Wait,
    /// Once a majority of the servers has answered without deciding (their
    /// grants split between contending clients), give the silent rest only
    /// a short grace, twice the time the answers took (at least
    /// [`SPLIT_GRACE`]), not their whole timeout. An attempt that gives up
    /// is undone and tried again, which is always safe; waiting out servers
    /// that are frozen would make every split vote cost their timeout.
    GiveUp,
}

/// What decided an operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Decision<K> {
    /// A majority voted for this outcome.
    Majority(K),
    /// More than `N - majority` voted against: no outcome can have a
    /// majority any more.
    Against,
    /// The answer of this server (by index) was [`Vote::Decisive`].
    Decisive(usize),
    /// No majority: every server answered without one agreeing, or a split
    /// vote ran out of grace.
    NoMajority,
}

/// The votes of a quorum's servers, counted toward a decision.
pub(super) struct Count<K> {
    needed: usize,
    /// More votes against than this and no majority can come.
    most_against: usize,
    /// How many voted for each outcome, in the order first seen.
    outcomes: Vec<(K, usize)>,
    against: usize,
}

impl<K: PartialEq> Count<K> {
    /// Nothing counted yet, of `servers` votes.
    pub(super) fn new(servers: usize) -> Count<K> {
        let needed = majority_of(servers);
        Count {
            needed,
            most_against: servers.saturating_sub(needed),
            outcomes: Vec::new(),
            against: 0,
        }
    }

    /// Counts the vote of `server`: the decision, once it is made.
    pub(super) fn add(&mut self, server: usize, vote: Vote<K>) -> Option<Decision<K>> {
        match vote {
            Vote::For(outcome) => {
                let at = match self.outcomes.iter().position(|(seen, _)| *seen == outcome) {
                    Some(at) => at,
                    None => {
                        self.outcomes.push((outcome, 0));
                        self.outcomes.len() - 1
                    }
                };
                self.outcomes[at].1 += 1;
                (self.outcomes[at].1 >= self.needed)
                    .then(|| Decision::Majority(self.outcomes.swap_remove(at).0))
            }
            Vote::Against => {
                self.against += 1;
                (self.against > self.most_against).then_some(Decision::Against)
            }
            Vote::Abstain => None,
            Vote::Decisive => Some(Decision::Decisive(server)),
        }
    }

    /// Whether a majority of the servers voted (failed calls abstain).
    fn majority_voted(&self) -> bool {
        let votes: usize = self.outcomes.iter().map(|(_, votes)| votes).sum();
        votes + self.against >= self.needed
    }
}

/// Runs `calls` (one per server, in server order) until their answers
/// decide: a majority (`N/2 + 1`) voted for one outcome, more than
/// `N - majority` voted against, one answer was decisive, every call
/// answered, or (with [`OnSplit::GiveUp`]) a split vote ran out of grace.
/// `vote` reads each answer.
pub(super) async fn gather<T, K, F>(
    calls: Vec<F>,
    vote: impl Fn(&T) -> Vote<K>,
    on_split: OnSplit,
) -> Decided<T, K, F>
where
    F: Future<Output = T>,
    K: PartialEq,
{
    let started = Instant::now();
    let servers = calls.len();
    let mut running: FuturesUnordered<_> = calls
        .into_iter()
        .enumerate()
        .map(|(i, call)| future::join(future::ready(i), call))
        .collect();
    let mut answers = Answers {
        by_server: (0..servers).map(|_| None).collect(),
        arrived: Vec::with_capacity(servers),
    };
    let mut count = Count::new(servers);
    let decision = loop {
        let next = if on_split == OnSplit::GiveUp && count.majority_voted() {
            let grace = (started.elapsed() * 2).max(SPLIT_GRACE);
            match tokio::time::timeout(grace, running.next()).await {
                Ok(next) => next,
                Err(_) => break Decision::NoMajority,
            }
        } else {
            running.next().await
        };
        let Some((i, answer)) = next else {
            break Decision::NoMajority;
        };
        let vote = vote(&answer);
        answers.arrive(i, answer);
        if let Some(decision) = count.add(i, vote) {
            break decision;
        }
    };
    Decided {
        decision,
        answers,
        running,
    }
}

/// The answers [`gather`] waited for.
#[derive(Debug)]
pub(super) struct Answers<T> {
    /// In server order; `None` for a server whose answer was not in.
    pub(super) by_server: Vec<Option<T>>,
    /// The servers (by index) in the order their answers came.
    arrived: Vec<usize>,
}

impl<T> Answers<T> {
    fn arrive(&mut self, server: usize, answer: T) {
        self.by_server[server] = Some(answer);
        self.arrived.push(server);
    }

    /// The answers in the order they came.
    pub(super) fn into_arrival_order(mut self) -> impl Iterator<Item = T> {
        let arrived = std::mem::take(&mut self.arrived);
        arrived
            .into_iter()
            .filter_map(move |i| self.by_server[i].take())
    }
}

/// An operation [`gather`] decided, with the calls still running.
#[must_use = "say what becomes of the calls still running: keep_running or drop_rest"]
pub(super) struct Decided<T, K, F: Future<Output = T>> {
    decision: Decision<K>,
    answers: Answers<T>,
    /// Each call still running, answering with its server's index.
    running: FuturesUnordered<Running<F>>,
}

/// A call that answers with its server's index.
type Running<F> = future::Join<future::Ready<usize>, F>;

impl<T, K, F> Decided<T, K, F>
where
    F: Future<Output = T>,
{
    /// The answers; the calls still running are dropped (a read or a
    /// record whose late answer matters to no one).
    pub(super) fn drop_rest(self) -> (Decision<K>, Answers<T>) {
        (self.decision, self.answers)
    }

    /// The answers, with those already in by now; the calls still running
    /// are left to finish in a task of their own rather than dropped: their
    /// commands still reach the servers, and a server that does not answer
    /// still runs into its timeout, which replaces its connection. With
    /// [`MAX_BACKGROUND`] calls already left running (`background` counts
    /// them), they are dropped instead.
    pub(super) fn keep_running(self, background: &Arc<AtomicUsize>) -> (Decision<K>, Answers<T>)
    where
        F: Send + 'static,
        T: Send + 'static,
    {
        let Decided {
            decision,
            mut answers,
            mut running,
        } = self;
        // Answers already in cost no task.
        while let Some(Some((i, answer))) = running.next().now_or_never() {
            answers.arrive(i, answer);
        }
        if !running.is_empty() && background.load(Ordering::Relaxed) < MAX_BACKGROUND {
            let left = running.len();
            background.fetch_add(left, Ordering::Relaxed);
            let mut counted = Counted {
                left,
                background: background.clone(),
            };
            let mut caller_gone = watch_callers_runtime();
            // On lock-core's runtime: the caller's may be about to stall or
            // shut down, and these answers (an undo, a release) still matter.
            crate::background::spawn(async move {
                while !running.is_empty() {
                    // Should the caller's runtime shut down, the calls lose
                    // the timers that bound them, and cannot be polled any
                    // more: they are dropped (their commands were sent). A
                    // panic all the same drops only the call that panicked.
                    let next = std::panic::AssertUnwindSafe(running.next()).catch_unwind();
                    tokio::select! {
                        biased;
                        _ = &mut caller_gone => return,
                        _answered_or_panicked = next => {}
                    }
                    let gone = counted.left - running.len();
                    counted.left -= gone;
                    counted.background.fetch_sub(gone, Ordering::Relaxed);
                }
            });
        }
        (decision, answers)
    }
}

/// Completes when the runtime the caller runs on shuts down (or at once,
/// outside any runtime): a task of that runtime holds the sender, and goes
/// with it. The task ends when the receiver is dropped.
fn watch_callers_runtime() -> impl Future<Output = ()> + Send + Unpin {
    let (alive, gone) = tokio::sync::oneshot::channel::<()>();
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        let mut alive = alive;
        drop(runtime.spawn(async move { alive.closed().await }));
    }
    gone.map(drop)
}

/// The calls of one background task still counted in `background`; a task
/// dropped unfinished (its runtime shutting down) takes its count back.
struct Counted {
    left: usize,
    background: Arc<AtomicUsize>,
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.background.fetch_sub(self.left, Ordering::Relaxed);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use tokio::sync::oneshot;

    /// Five calls, each answering what its sender sends (`None` once the
    /// sender is dropped).
    fn calls<T: Send + 'static>() -> (
        Vec<oneshot::Sender<T>>,
        Vec<impl Future<Output = Option<T>> + Send + 'static>,
    ) {
        (0..5)
            .map(|_| {
                let (tx, rx) = oneshot::channel::<T>();
                (tx, async move { rx.await.ok() })
            })
            .unzip()
    }

    /// Yes for `true`, no for `false`; a dropped call abstains.
    fn yes_no(answer: &Option<bool>) -> Vote {
        match answer {
            Some(true) => Vote::YES,
            Some(false) => Vote::Against,
            None => Vote::Abstain,
        }
    }

    fn answered<T>(answers: &Answers<T>) -> Vec<bool> {
        answers.by_server.iter().map(Option::is_some).collect()
    }

    /// Waits (a second at most) until `count` calls are left running.
    async fn until_in_background(background: &AtomicUsize, count: usize) {
        within_a_second(async {
            while background.load(Ordering::Relaxed) != count {
                tokio::task::yield_now().await;
            }
        })
        .await;
    }

    async fn within_a_second<T>(work: impl Future<Output = T>) -> T {
        tokio::time::timeout(Duration::from_secs(1), work)
            .await
            .expect("waited for calls not needed")
    }

    /// Counted over every server's answer at once (a renewal round), the
    /// decision does not depend on the order of the votes.
    #[test]
    fn a_count_decides_yes_no_or_nothing() {
        let decide = |votes: &[Vote]| {
            let mut count = Count::new(votes.len());
            votes
                .iter()
                .cloned()
                .enumerate()
                .find_map(|(server, vote)| count.add(server, vote))
        };
        let (yes, no, failed) = (Vote::YES, Vote::Against, Vote::Abstain);
        assert_eq!(
            decide(&[
                no.clone(),
                yes.clone(),
                yes.clone(),
                failed.clone(),
                yes.clone()
            ]),
            Some(Decision::Majority(()))
        );
        // Of four, three must agree: two noes leave no majority possible.
        assert_eq!(
            decide(&[yes.clone(), no.clone(), no.clone(), failed.clone()]),
            Some(Decision::Against)
        );
        assert_eq!(
            decide(&[yes.clone(), no.clone(), failed.clone(), failed, yes]),
            None
        );
    }

    #[tokio::test]
    async fn a_majority_decides_and_the_rest_finish_in_the_background() {
        let background = Arc::new(AtomicUsize::new(0));
        let (senders, calls) = calls::<bool>();
        let mut senders = senders.into_iter();
        for tx in senders.by_ref().take(3) {
            tx.send(true).unwrap();
        }
        let decided = within_a_second(gather(calls, yes_no, OnSplit::Wait)).await;
        let (decision, answers) = decided.keep_running(&background);
        assert_eq!(decision, Decision::Majority(()));
        assert_eq!(answered(&answers), [true, true, true, false, false]);
        assert_eq!(background.load(Ordering::Relaxed), 2);
        // Still running: their receivers are there to answer.
        for tx in senders {
            tx.send(false).expect("a call left behind was dropped");
        }
        until_in_background(&background, 0).await;
    }

    /// A call left running that panics (one started on a runtime that has
    /// shut down since) is dropped alone: the others still finish.
    #[tokio::test]
    async fn a_call_left_running_that_panics_leaves_the_others_running() {
        let background = Arc::new(AtomicUsize::new(0));
        let (senders, calls) = calls::<bool>();
        let calls: Vec<_> = calls
            .into_iter()
            .map(|call| async move {
                let answer = call.await;
                assert!(answer != Some(false), "a call that panics");
                answer
            })
            .collect();
        let mut senders = senders.into_iter();
        for tx in senders.by_ref().take(3) {
            tx.send(true).unwrap();
        }
        let decided = within_a_second(gather(calls, yes_no, OnSplit::Wait)).await;
        let (_, answers) = decided.keep_running(&background);
        assert_eq!(answered(&answers), [true, true, true, false, false]);
        let (panics, last) = (senders.next().unwrap(), senders.next().unwrap());
        panics.send(false).unwrap();
        until_in_background(&background, 1).await;
        last.send(true).expect("the other call was dropped with it");
        until_in_background(&background, 0).await;
    }

    #[tokio::test]
    async fn no_is_decided_as_soon_as_a_majority_is_out_of_reach() {
        // Of four servers, three must agree: two noes settle it.
        let (senders, mut calls) = calls::<bool>();
        calls.pop();
        let mut senders = senders.into_iter();
        for tx in senders.by_ref().take(2) {
            tx.send(false).unwrap();
        }
        let decided = within_a_second(gather(calls, yes_no, OnSplit::Wait)).await;
        let (decision, answers) = decided.drop_rest();
        assert_eq!(decision, Decision::Against);
        assert_eq!(answered(&answers), [true, true, false, false]);
        // Dropped: their receivers are gone.
        for tx in senders.take(2) {
            assert!(tx.send(true).is_err(), "a read was kept running");
        }
    }

    #[tokio::test]
    async fn a_failed_call_does_not_count_against() {
        let (senders, calls) = calls::<bool>();
        let mut senders = senders.into_iter();
        // Three fail (their senders dropped): yes is out of reach, but the
        // others are still heard.
        drop(senders.by_ref().take(3).collect::<Vec<_>>());
        let decided = gather(calls, yes_no, OnSplit::Wait);
        let mut decided = Box::pin(decided);
        assert!(
            decided.as_mut().now_or_never().is_none(),
            "decided without the servers that answer"
        );
        for tx in senders {
            tx.send(false).unwrap();
        }
        let (decision, answers) = within_a_second(decided).await.drop_rest();
        assert_eq!(decision, Decision::NoMajority);
        assert_eq!(answered(&answers), [true; 5]);
    }

    #[tokio::test]
    async fn the_same_outcome_on_a_majority_decides() {
        let (senders, calls) = calls::<&str>();
        let mut senders = senders.into_iter();
        for value in ["a", "b", "a", "a"] {
            senders.next().unwrap().send(value).unwrap();
        }
        let vote = |answer: &Option<&'static str>| answer.map_or(Vote::Abstain, Vote::For);
        let decided = within_a_second(gather(calls, vote, OnSplit::Wait)).await;
        let (decision, answers) = decided.drop_rest();
        assert_eq!(decision, Decision::Majority("a"));
        assert!(!answered(&answers)[4], "waited for a silent server");
    }

    #[tokio::test]
    async fn a_decisive_answer_decides_alone() {
        let (mut senders, calls) = calls::<u8>();
        senders.remove(1).send(7).unwrap();
        let vote = |answer: &Option<u8>| match answer {
            Some(7) => Vote::Decisive,
            Some(_) => Vote::YES,
            None => Vote::Abstain,
        };
        let decided = within_a_second(gather(calls, vote, OnSplit::Wait)).await;
        let (decision, answers) = decided.drop_rest();
        assert_eq!(decision, Decision::Decisive(1));
        assert_eq!(answers.into_arrival_order().collect::<Vec<_>>(), [Some(7)]);
    }

    #[tokio::test]
    async fn a_split_vote_gives_the_silent_servers_only_a_grace() {
        let (senders, calls) = calls::<bool>();
        let mut senders = senders.into_iter();
        for yes in [true, false, true] {
            senders.next().unwrap().send(yes).unwrap();
        }
        // Without `GiveUp` the silent two would be waited for.
        let decided = within_a_second(gather(calls, yes_no, OnSplit::GiveUp)).await;
        let (decision, answers) = decided.drop_rest();
        assert_eq!(decision, Decision::NoMajority);
        assert_eq!(answered(&answers), [true, true, true, false, false]);
        drop(senders);
    }

    #[tokio::test]
    async fn with_too_many_calls_in_the_background_the_rest_are_dropped() {
        let background = Arc::new(AtomicUsize::new(MAX_BACKGROUND));
        let (senders, calls) = calls::<bool>();
        let mut senders = senders.into_iter();
        for tx in senders.by_ref().take(3) {
            tx.send(true).unwrap();
        }
        let decided = within_a_second(gather(calls, yes_no, OnSplit::Wait)).await;
        let (_, answers) = decided.keep_running(&background);
        assert_eq!(answered(&answers), [true, true, true, false, false]);
        for tx in senders {
            assert!(tx.send(false).is_err(), "a call was kept");
        }
        assert_eq!(background.load(Ordering::Relaxed), MAX_BACKGROUND);
    }

    #[tokio::test]
    async fn answers_already_in_are_taken_not_left_behind() {
        let background = Arc::new(AtomicUsize::new(0));
        let (senders, calls) = calls::<bool>();
        for tx in senders {
            tx.send(true).unwrap();
        }
        let decided = within_a_second(gather(calls, yes_no, OnSplit::Wait)).await;
        let (_, answers) = decided.keep_running(&background);
        assert_eq!(answered(&answers), [true; 5]);
        assert_eq!(background.load(Ordering::Relaxed), 0);
    }
}
