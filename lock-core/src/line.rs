//! The in-process line for each key: two-level locking.
//!
//! Tasks of one process that want the same key queue here, first come first
//! served, behind the one task that holds the key or is acquiring it from
//! Redis. Only that task talks to Redis, so the tasks of a process never race
//! one another for the lease, and a task that releases and at once locks
//! again goes to the back of the line instead of barging in front of tasks
//! that waited.
//!
//! When the holder lets go while others wait in line, the Redis lease is
//! *handed off*: the next task takes it over (renewed for its own ttl, with a
//! new fencing token when it asked for one) without the lease ever being
//! given up, which saves two round trips and lets no other process slip in
//! between. Hand-offs are limited by a [`HandoffBudget`]: after that many, or that
//! long since the lease was taken from Redis, the lease is released for real
//! and the next task in line must win it in Redis against other processes,
//! so no process can keep a key to itself.

use crate::guard::Lease;
use crate::token::Token;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::time::Instant;

/// How long a process may keep a key through hand-offs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HandoffBudget {
    /// Hand-offs in a row before the lease is released for real.
    pub handoffs: u32,
    /// Time since the lease was taken from Redis after which it is released
    /// for real at the next release.
    pub hold: Duration,
}

impl HandoffBudget {
    /// No hand-offs: every release goes to Redis (the tasks of a process
    /// still queue fairly).
    pub const NONE: HandoffBudget = HandoffBudget {
        handoffs: 0,
        hold: Duration::ZERO,
    };
}

impl Default for HandoffBudget {
    /// Up to 250 hand-offs within 10 ms.
    fn default() -> HandoffBudget {
        HandoffBudget {
            handoffs: 250,
            hold: Duration::from_millis(10),
        }
    }
}

/// How long the next task of this process waits before trying Redis when a
/// hand-off budget ran out: long enough for a waiter of another process,
/// woken by the release message, to get its attempt in first.
pub(crate) const YIELD: Duration = Duration::from_millis(1);

/// Who is first in a line: changes at every hand-over, so a guard that lost
/// its place (its lease was lost and a waiter moved up) cannot disturb the
/// line any more.
pub(crate) type Owner = u64;

/// What a waiting task receives when its turn comes; it is first in line
/// from then on, as `owner`.
pub(crate) enum Baton {
    /// The lease itself, still held in Redis under its token.
    Lease(HandedLease, Owner),
    /// The key is free locally: acquire it from Redis. `after`: wait this
    /// long first, so waiters of other processes get their chance.
    Turn { after: Duration, owner: Owner },
}

pub(crate) struct HandedLease {
    pub(crate) token: Token,
    pub(crate) valid_until: Instant,
}

struct Line {
    owner: Owner,
    /// The lease of the task first in line, once it holds one.
    holder: Option<Arc<Lease>>,
    waiting: VecDeque<oneshot::Sender<Baton>>,
    /// Hand-offs since the lease was last taken from Redis.
    handoffs: u32,
    /// When the lease was last taken from Redis.
    taken: Option<Instant>,
}

/// Every key some task of this client holds or is acquiring.
pub(crate) struct Lines {
    /// The lines, spread over shards by key so that tasks on different keys
    /// seldom meet on one mutex (or one cache line).
    shards: Box<[Padded]>,
    pick: foldhash::fast::RandomState,
}

/// How many shards [`Lines`] has.
const SHARDS: usize = 32;

type Map = HashMap<Arc<str>, Line, foldhash::fast::RandomState>;

#[derive(Default)]
struct Shard {
    lines: Map,
    /// The last owner id given out here. A key always maps to the same
    /// shard, so a key's owner ids never repeat.
    owners: Owner,
}

/// A shard on cache lines of its own.
#[repr(align(128))]
#[derive(Default)]
struct Padded(Mutex<Shard>);

impl Default for Lines {
    fn default() -> Lines {
        Lines {
            shards: (0..SHARDS).map(|_| Padded::default()).collect(),
            pick: foldhash::fast::RandomState::default(),
        }
    }
}

fn next_owner(owners: &mut Owner) -> Owner {
    *owners += 1;
    *owners
}

/// Where a task stands when it asks for a key.
pub(crate) enum Place {
    /// First in line: acquire from Redis.
    First(Owner),
    /// Wait for the baton, or for the holder's lease to be lost.
    Behind {
        baton: oneshot::Receiver<Baton>,
        holder: Option<Arc<Lease>>,
        owner: Owner,
    },
}

/// How the holder lets go.
pub(crate) enum LetGo {
    /// Handed to the next task; nothing to do in Redis.
    HandedOff,
    /// Release in Redis, then [`Lines::pass`] the turn. `spent`: tasks
    /// wait, but the budget ran out.
    Release { spent: bool },
    /// The line is no longer ours (our lease was lost and another task
    /// moved up): release in Redis, there is nothing to pass.
    Ended,
}

impl Lines {
    /// The shard of `key`, locked.
    fn lock(&self, key: &str) -> std::sync::MutexGuard<'_, Shard> {
        let at = (std::hash::BuildHasher::hash_one(&self.pick, key) % SHARDS as u64) as usize;
        self.shards[at].0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How many keys have a line: held, or being acquired, by some task.
    pub(crate) fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|shard| {
                shard
                    .0
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .lines
                    .len()
            })
            .sum()
    }

    /// Joins the line for `key`; `queue: false` only looks (a caller that
    /// will not wait), and gets `None` when someone is ahead. A holder whose
    /// lease is lost is no longer ahead of anyone.
    pub(crate) fn join(&self, key: &Arc<str>, queue: bool) -> Option<Place> {
        let mut shard = self.lock(key);
        let Shard { lines, owners } = &mut *shard;
        let Some(line) = lines.get_mut(&**key) else {
            let owner = next_owner(owners);
            lines.insert(
                key.clone(),
                Line {
                    owner,
                    holder: None,
                    waiting: VecDeque::new(),
                    handoffs: 0,
                    taken: None,
                },
            );
            return Some(Place::First(owner));
        };
        if line.holder.as_ref().is_some_and(|h| h.is_lost()) {
            line.owner = next_owner(owners);
            line.holder = None;
            return Some(Place::First(line.owner));
        }
        if !queue {
            return None;
        }
        line.waiting.retain(|w| !w.is_closed());
        let (tx, rx) = oneshot::channel();
        line.waiting.push_back(tx);
        Some(Place::Behind {
            baton: rx,
            holder: line.holder.clone(),
            owner: line.owner,
        })
    }

    /// Moves a waiter up front when the holder it waited behind (`seen`) lost
    /// its lease and is still first.
    pub(crate) fn overtake(&self, key: &str, seen: Owner) -> Option<Owner> {
        let mut shard = self.lock(key);
        let Shard { lines, owners } = &mut *shard;
        let line = lines.get_mut(key)?;
        if line.owner != seen {
            return None;
        }
        line.owner = next_owner(owners);
        line.holder = None;
        Some(line.owner)
    }

    /// `owner` holds `lease` now; `from_redis`: it was just taken from Redis
    /// (a new hand-off budget), rather than handed over.
    pub(crate) fn holds(&self, key: &str, owner: Owner, lease: &Arc<Lease>, from_redis: bool) {
        if let Some(line) = self.lock(key).lines.get_mut(key)
            && line.owner == owner
        {
            line.holder = Some(lease.clone());
            if from_redis {
                line.handoffs = 0;
                line.taken = Some(Instant::now());
            }
        }
    }

    /// `owner` lets go of a lease still held in Redis (`lease`, unless it
    /// was lost): hands it to the next task if the budget allows and someone
    /// waits, otherwise says to release it.
    ///
    /// After `Release` the caller releases in Redis and then calls
    /// [`pass`](Self::pass); after `Ended`, it only releases.
    pub(crate) fn let_go(
        &self,
        key: &str,
        owner: Owner,
        lease: impl FnOnce() -> Option<HandedLease>,
        budget: HandoffBudget,
    ) -> LetGo {
        let mut shard = self.lock(key);
        let Shard { lines, owners } = &mut *shard;
        let Some(line) = lines.get_mut(key).filter(|line| line.owner == owner) else {
            return LetGo::Ended;
        };
        line.waiting.retain(|w| !w.is_closed());
        // With nobody waiting the line still stays until `pass`, after the
        // release: a task of this process that comes meanwhile queues and
        // goes to Redis once the key is free, at the same time as the other
        // processes' waiters hear of it. Were the line gone, its SET would
        // follow the release on the same connection and win every time:
        // the releasing process barging back in.
        if line.waiting.is_empty() {
            return LetGo::Release { spent: false };
        }
        let Some(mut lease) = lease() else {
            return LetGo::Release { spent: false };
        };
        let within = line.handoffs < budget.handoffs
            && line.taken.is_some_and(|t| t.elapsed() < budget.hold);
        if !within {
            return LetGo::Release { spent: true };
        }
        while let Some(next) = line.waiting.pop_front() {
            let owner = next_owner(owners);
            match next.send(Baton::Lease(lease, owner)) {
                Ok(()) => {
                    line.owner = owner;
                    line.holder = None;
                    line.handoffs += 1;
                    return LetGo::HandedOff;
                }
                // That waiter gave up; try the one behind it.
                Err(Baton::Lease(back, _)) => lease = back,
                Err(Baton::Turn { .. }) => return LetGo::Release { spent: false },
            }
        }
        // Every waiter had given up.
        LetGo::Release { spent: false }
    }

    /// `owner` is done with the key (released in Redis, or never acquired):
    /// gives the next task its turn, or ends the line. A task that comes
    /// after a budget ran out waits `after` first.
    pub(crate) fn pass(&self, key: &str, owner: Owner, after: Duration) {
        let mut shard = self.lock(key);
        let Shard { lines, owners } = &mut *shard;
        let Some(line) = lines.get_mut(key).filter(|line| line.owner == owner) else {
            return;
        };
        line.holder = None;
        while let Some(next) = line.waiting.pop_front() {
            let owner = next_owner(owners);
            if next.send(Baton::Turn { after, owner }).is_ok() {
                line.owner = owner;
                return;
            }
        }
        lines.remove(key);
    }
}

/// A task's place at the front of its line while it acquires; passes the
/// turn on if the acquisition fails or is cancelled.
pub(crate) struct Turn<'a> {
    lines: &'a Lines,
    key: &'a str,
    owner: Owner,
    armed: bool,
}

impl<'a> Turn<'a> {
    pub(crate) fn new(lines: &'a Lines, key: &'a str, owner: Owner) -> Turn<'a> {
        Turn {
            lines,
            key,
            owner,
            armed: true,
        }
    }

    /// The acquisition succeeded: the guard (holding `lease`) owns the line
    /// from now on.
    pub(crate) fn keep(mut self, lease: &Arc<Lease>, from_redis: bool) -> Owner {
        self.armed = false;
        self.lines.holds(self.key, self.owner, lease, from_redis);
        self.owner
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.lines.pass(self.key, self.owner, Duration::ZERO);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handed() -> HandedLease {
        HandedLease {
            token: Token::generate(),
            valid_until: Instant::now() + Duration::from_secs(1),
        }
    }

    fn first(lines: &Lines) -> Owner {
        match lines.join(&"k".into(), true) {
            Some(Place::First(owner)) => owner,
            _ => panic!("expected to be first"),
        }
    }

    fn behind(lines: &Lines) -> oneshot::Receiver<Baton> {
        match lines.join(&"k".into(), true) {
            Some(Place::Behind { baton, .. }) => baton,
            _ => panic!("expected to wait"),
        }
    }

    fn lease() -> Arc<Lease> {
        Arc::new(Lease::new(
            "{k}".into(),
            1,
            Token::generate(),
            None,
            Duration::from_secs(10),
            Instant::now() + Duration::from_secs(10),
            crate::guard::Holds::default(),
        ))
    }

    #[tokio::test]
    async fn first_comer_acquires_and_the_rest_queue_in_order() {
        let lines = Lines::default();
        let owner = first(&lines);
        let second = behind(&lines);
        let third = behind(&lines);
        lines.pass("k", owner, Duration::ZERO);
        let Ok(Baton::Turn { owner, .. }) = second.await else {
            panic!("second gets the turn")
        };
        lines.pass("k", owner, Duration::ZERO);
        let Ok(Baton::Turn { owner, .. }) = third.await else {
            panic!("third gets the turn")
        };
        lines.pass("k", owner, Duration::ZERO);
        first(&lines);
    }

    #[tokio::test]
    async fn hand_off_respects_the_budget() {
        let lines = Lines::default();
        let budget = HandoffBudget {
            handoffs: 1,
            hold: Duration::from_secs(60),
        };
        let owner = first(&lines);
        lines.holds("k", owner, &lease(), true);
        let second = behind(&lines);
        assert!(matches!(
            lines.let_go("k", owner, || Some(handed()), budget),
            LetGo::HandedOff
        ));
        let Ok(Baton::Lease(_, owner)) = second.await else {
            panic!("second gets the lease")
        };
        lines.holds("k", owner, &lease(), false);
        let _third = behind(&lines);
        // One hand-off used: the next let-go releases for real.
        assert!(matches!(
            lines.let_go("k", owner, || Some(handed()), budget),
            LetGo::Release { spent: true }
        ));
    }

    #[tokio::test]
    async fn a_waiter_that_gave_up_is_skipped() {
        let lines = Lines::default();
        let owner = first(&lines);
        lines.holds("k", owner, &lease(), true);
        drop(behind(&lines));
        let next = behind(&lines);
        assert!(matches!(
            lines.let_go("k", owner, || Some(handed()), HandoffBudget::default()),
            LetGo::HandedOff
        ));
        assert!(matches!(next.await, Ok(Baton::Lease(..))));
    }

    #[test]
    fn nobody_waiting_means_release_and_the_line_stays_until_passed() {
        let lines = Lines::default();
        let owner = first(&lines);
        lines.holds("k", owner, &lease(), true);
        assert!(matches!(
            lines.let_go("k", owner, || Some(handed()), HandoffBudget::default()),
            LetGo::Release { spent: false }
        ));
        // While the release is in flight, a newcomer waits its turn.
        assert!(lines.join(&"k".into(), false).is_none());
        lines.pass("k", owner, Duration::ZERO);
        assert!(matches!(
            lines.join(&"k".into(), false),
            Some(Place::First(_))
        ));
    }

    #[test]
    fn a_caller_that_will_not_wait_is_not_queued() {
        let lines = Lines::default();
        assert!(matches!(
            lines.join(&"k".into(), false),
            Some(Place::First(_))
        ));
        assert!(lines.join(&"k".into(), false).is_none());
    }

    #[test]
    fn a_holder_whose_lease_is_lost_is_overtaken_and_cannot_disturb_the_line() {
        let lines = Lines::default();
        let stale = first(&lines);
        let lost = lease();
        lines.holds("k", stale, &lost, true);
        lost.mark_lost("test");
        let fresh = first(&lines);
        assert_ne!(fresh, stale);
        let _waiter = behind(&lines);
        lines.pass("k", stale, Duration::ZERO);
        assert!(matches!(
            lines.let_go("k", stale, || Some(handed()), HandoffBudget::default()),
            LetGo::Ended
        ));
        assert!(
            lines.join(&"k".into(), false).is_none(),
            "the fresh owner is still first"
        );
        assert_eq!(lines.overtake("k", stale), None);
        assert!(lines.overtake("k", fresh).is_some());
    }
}
