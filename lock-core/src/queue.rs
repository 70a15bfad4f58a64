//! The in-process wait queue for each key: two-level locking.
//!
//! Tasks of one process that want the same key queue here, first come first
//! served, behind the one task that holds the key or is acquiring it from
//! Redis. Only that task talks to Redis, so the tasks of a process never race
//! one another for the lease, and a task that releases and at once locks
//! again goes to the back of the queue instead of barging in front of tasks
//! that waited.
//!
//! When the holder lets go while others wait, the Redis lease is
//! *handed off*: the next task takes it over (renewed for its own ttl, with a
//! new fencing token when it asked for one) without the lease ever being
//! given up, which saves two round trips and lets no other process slip in
//! between. Hand-offs are limited by a [`HandoffBudget`]: after that many, or that
//! long since the lease was taken from Redis, the lease is released for real
//! and the next task in the queue must win it in Redis against other processes,
//! so no process can keep a key to itself.
//!
//! Nothing here waits on a task that is not running. A hand-off is an
//! *offer*: a waiter that has not taken its lease or its turn within
//! [`OFFER`] (its future kept but never polled again, its thread blocked)
//! loses it, and it goes to the next waiter or back to Redis. The first task
//! in a queue, while it acquires, *promises* when it will next act (the
//! end of its call, or of its pause between attempts); the tasks behind it
//! move up past a front that let its promise pass by [`GRACE`] and contend
//! in Redis themselves, so a front that makes no progress holds nobody back
//! past their own waits.

use crate::lease::Lease;
use crate::sync;
use crate::token::Token;
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::Instant;

/// How long a process may keep a key through hand-offs.
///
/// Start from [`HandoffBudget::new`], [`Default`] or [`HandoffBudget::NONE`]
/// (more limits may be added, so it cannot be written as a struct
/// literal); the fields can be read, and set on a budget one has:
///
/// ```
/// use lock_core::HandoffBudget;
/// use std::time::Duration;
///
/// let budget = HandoffBudget::new(100, Duration::from_millis(5));
/// assert_eq!(budget.handoffs, 100);
/// let mut longer = HandoffBudget::default();
/// longer.hold = Duration::from_millis(50);
/// assert_eq!(longer.handoffs, HandoffBudget::default().handoffs);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct HandoffBudget {
    /// Hand-offs in a row before the lease is released for real.
    pub handoffs: u32,
    /// Time since the lease was taken from Redis after which it is released
    /// for real at the next release.
    pub hold: Duration,
}

impl HandoffBudget {
    /// Up to `handoffs` hand-offs in a row, within `hold` of the lease
    /// being taken from Redis.
    pub const fn new(handoffs: u32, hold: Duration) -> HandoffBudget {
        HandoffBudget { handoffs, hold }
    }

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

/// How long a waiter has to take what is handed to it before the offer is
/// withdrawn and passed on. A waiter that is polled takes it at once; this
/// only has to cover a busy scheduler.
pub(crate) const OFFER: Duration = Duration::from_millis(10);

/// How late past its promise the first task of a queue may be before the
/// tasks behind it move up past it.
pub(crate) const GRACE: Duration = Duration::from_millis(20);

/// Who is first in a queue: changes at every hand-over, so a guard that lost
/// its place (its lease was lost and a waiter moved up) cannot disturb the
/// queue any more.
pub(crate) type Owner = u64;

/// What a waiter receives when the task ahead lets go; it is first in the
/// queue from then on, as `owner`.
pub(crate) enum Handoff {
    /// The lease itself, still held in Redis under its token.
    Lease { lease: HandedLease, owner: Owner },
    /// The key is free locally: acquire it from Redis. `after`: wait this
    /// long first, so waiters of other processes get their chance.
    Free { after: Duration, owner: Owner },
}

pub(crate) struct HandedLease {
    pub(crate) token: Token,
    pub(crate) valid_until: Instant,
}

struct Queue {
    owner: Owner,
    /// The lease of the task first in queue, once it holds one.
    holder: Option<Arc<Lease>>,
    /// Until it holds: by when the task first in queue promised to act
    /// next (see [`Front::promise`]).
    due: Instant,
    waiting: Waiting,
    /// Hand-offs since the lease was last taken from Redis.
    handoffs: u32,
    /// When the lease was last taken from Redis.
    taken: Option<Instant>,
}

/// The tasks waiting behind a queue's first, in order: nothing allocated
/// until one waits (every held key has a queue; few have waiters, and a
/// process may hold a million keys).
#[derive(Default)]
// The box is the point: eight bytes in every queue instead of thirty-two.
#[allow(clippy::box_collection)]
struct Waiting(Option<Box<VecDeque<Arc<Slot>>>>);

impl Waiting {
    /// Drops the waiters that gave up.
    fn forget_gone(&mut self) {
        if let Some(waiting) = &mut self.0 {
            waiting.retain(|w| !w.is_closed());
        }
    }

    fn push_back(&mut self, waiter: Arc<Slot>) {
        self.0.get_or_insert_default().push_back(waiter);
    }

    fn pop_front(&mut self) -> Option<Arc<Slot>> {
        self.0.as_mut()?.pop_front()
    }

    fn is_empty(&self) -> bool {
        self.0.as_ref().is_none_or(|waiting| waiting.is_empty())
    }
}

/// Where the task ahead puts what it hands to one waiter.
pub(crate) struct Slot {
    state: sync::Mutex<SlotState>,
    waker: sync::AtomicWaker,
}

impl Default for Slot {
    fn default() -> Slot {
        Slot {
            state: sync::Mutex::new(SlotState::Empty),
            waker: sync::AtomicWaker::new(),
        }
    }
}

#[derive(Default)]
enum SlotState {
    #[default]
    Empty,
    Offered(Handoff),
    /// It takes nothing more: what was offered was taken or withdrawn, or
    /// the waiter is gone.
    Closed,
}

impl Slot {
    fn state(&self) -> sync::MutexGuard<'_, SlotState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn is_closed(&self) -> bool {
        matches!(*self.state(), SlotState::Closed)
    }

    /// Puts `handoff` in the slot; gives it back when the waiter is gone.
    fn offer(&self, handoff: Handoff) -> Result<(), Handoff> {
        {
            let mut state = self.state();
            if !matches!(*state, SlotState::Empty) {
                return Err(handoff);
            }
            *state = SlotState::Offered(handoff);
        }
        self.waker.wake();
        Ok(())
    }

    /// Takes back what the waiter has not taken, closing the slot.
    fn withdraw(&self) -> Option<Handoff> {
        let mut state = self.state();
        match std::mem::take(&mut *state) {
            SlotState::Offered(handoff) => {
                *state = SlotState::Closed;
                Some(handoff)
            }
            other => {
                *state = other;
                None
            }
        }
    }
}

/// A waiter's end of its [`Slot`]: completes with what the task ahead
/// handed over, or `None` when the offer was withdrawn (the waiter was too
/// slow to take it) and the waiter must queue again.
pub(crate) struct Offered(Arc<Slot>);

impl Offered {
    /// No more offers; returns what was offered and not taken yet, for the
    /// caller to pass on.
    pub(crate) fn close(&self) -> Option<Handoff> {
        let mut state = self.0.state();
        match std::mem::replace(&mut *state, SlotState::Closed) {
            SlotState::Offered(handoff) => Some(handoff),
            _ => None,
        }
    }
}

impl Drop for Offered {
    /// The waiter is gone: the task ahead passes over it. (Whoever drops
    /// it takes out and passes on what it was offered first, with
    /// [`close`](Offered::close).)
    fn drop(&mut self) {
        self.close();
    }
}

impl Future for Offered {
    type Output = Option<Handoff>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Handoff>> {
        sync::register(&self.0.waker, cx.waker());
        let mut state = self.0.state();
        match std::mem::take(&mut *state) {
            SlotState::Empty => Poll::Pending,
            SlotState::Offered(handoff) => {
                *state = SlotState::Closed;
                Poll::Ready(Some(handoff))
            }
            SlotState::Closed => {
                *state = SlotState::Closed;
                Poll::Ready(None)
            }
        }
    }
}

/// What passes on an offer withdrawn from a waiter: the client whose
/// queues these are (the next waiter, or a release in Redis).
pub(crate) trait PassOn: Send + Sync + 'static {
    /// The queues of the client.
    fn queues(&self) -> &Queues;
    /// Passes `handoff` of `key` on, as if its waiter had dropped it.
    fn pass_on(self: Arc<Self>, key: &Arc<str>, handoff: Handoff);
}

/// An offer watched: the key, and the waiter's slot.
type Watched = (Arc<str>, Weak<Slot>);

/// The offers not taken yet, oldest first (all wait [`OFFER`]), and
/// whether a task watches them.
#[derive(Default)]
struct Offers {
    pending: VecDeque<(Instant, Arc<str>, Weak<Slot>)>,
    watched: bool,
}

/// Every key some task of this client holds or is acquiring.
pub(crate) struct Queues {
    /// The queues, spread over shards by key so that tasks on different keys
    /// seldom meet on one mutex (or one cache line).
    shards: Box<[CachePadded]>,
    pick: foldhash::fast::RandomState,
    offers: Mutex<Offers>,
    /// Who passes on a withdrawn offer; set once the client is assembled.
    client: OnceLock<Weak<dyn PassOn>>,
}

/// How many shards [`Queues`] has.
const SHARDS: usize = 32;

type Map = HashMap<Arc<str>, Queue, foldhash::fast::RandomState>;

#[derive(Default)]
struct Shard {
    queues: Map,
    /// The last owner id given out here. A key always maps to the same
    /// shard, so a key's owner ids never repeat.
    owners: Owner,
}

/// A shard on cache lines of its own.
#[repr(align(128))]
#[derive(Default)]
struct CachePadded(Mutex<Shard>);

impl Default for Queues {
    fn default() -> Queues {
        Queues {
            shards: (0..SHARDS).map(|_| CachePadded::default()).collect(),
            pick: foldhash::fast::RandomState::default(),
            offers: Mutex::default(),
            client: OnceLock::new(),
        }
    }
}

fn next_owner(owners: &mut Owner) -> Owner {
    *owners += 1;
    *owners
}

/// How the holder first in a queue came by its lease.
#[derive(Clone, Copy)]
pub(crate) enum Taken {
    /// Won in Redis: a new hand-off budget starts.
    FromRedis,
    /// Handed over by the task ahead.
    HandedOver,
}

/// Where a task stands when it asks for a key.
pub(crate) enum Position {
    /// First in the queue: acquire from Redis.
    Front(Owner),
    /// Wait for the hand-off, or for the holder's lease to be lost.
    Behind {
        handoff: Offered,
        holder: Option<Arc<Lease>>,
        /// The owner ahead.
        ahead: Owner,
    },
}

/// How the holder lets go.
pub(crate) enum Next {
    /// Handed to the next task; nothing to do in Redis.
    HandedOver,
    /// Release in Redis, then [`Queues::pass_front`]. `spent`: tasks wait,
    /// but the budget ran out.
    Release { spent: bool },
    /// This task is no longer first (its lease was lost and another task
    /// moved up): release in Redis, there is nothing to pass.
    NotFirst,
}

impl Queues {
    /// Names the client that passes on withdrawn offers.
    pub(crate) fn serve(&self, client: Weak<dyn PassOn>) {
        let _ = self.client.set(client);
    }

    /// Offers `handoff` to `waiter`, watched from now on: should the waiter
    /// not take it within [`OFFER`], it is withdrawn and passed on.
    fn offer(&self, key: &Arc<str>, waiter: &Arc<Slot>, handoff: Handoff) -> Result<(), Handoff> {
        waiter.offer(handoff)?;
        let Some(client) = self.client.get() else {
            return Ok(());
        };
        let start = {
            let mut offers = self.offers.lock().unwrap_or_else(|p| p.into_inner());
            let at = Instant::now() + OFFER;
            offers
                .pending
                .push_back((at, key.clone(), Arc::downgrade(waiter)));
            !std::mem::replace(&mut offers.watched, true)
        };
        if start {
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => drop(runtime.spawn(watch_offers(client.clone()))),
                // Outside a runtime nothing can wait: the next offer made
                // inside one starts the watch.
                Err(_) => self.offers_unwatched(),
            }
        }
        Ok(())
    }

    fn offers_unwatched(&self) {
        self.offers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .watched = false;
    }

    /// The offers due for a look: those made [`OFFER`] ago or earlier, and
    /// when the next one is due (`None`: none left, the watch ends).
    fn due_offers(&self) -> (Vec<Watched>, Option<Instant>) {
        let mut offers = self.offers.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        let mut due = Vec::new();
        while let Some((at, ..)) = offers.pending.front() {
            if *at > now {
                break;
            }
            if let Some((_, key, slot)) = offers.pending.pop_front() {
                due.push((key, slot));
            }
        }
        let next = offers.pending.front().map(|(at, ..)| *at);
        if next.is_none() && due.is_empty() {
            offers.watched = false;
        }
        (due, next)
    }

    /// The first task of `key`'s queue, while it acquires, promises to act
    /// again by `until`.
    fn promise(&self, key: &str, owner: Owner, until: Instant) {
        if let Some(queue) = self.lock(key).queues.get_mut(key)
            && queue.owner == owner
        {
            queue.due = until;
        }
    }

    /// When the tasks behind `ahead`, first in `key`'s queue, may move up
    /// past it: once it let its promise pass by [`GRACE`]. `None` when it
    /// holds the key (or is first no more): then only its release or loss
    /// moves the queue.
    fn stalled_after(&self, key: &str, ahead: Owner) -> Option<Instant> {
        let shard = self.lock(key);
        let queue = shard.queues.get(key)?;
        (queue.owner == ahead && queue.holder.is_none()).then_some(queue.due + GRACE)
    }

    /// Moves a waiter up front past `ahead`, first in `key`'s queue, when it
    /// let its promise pass (see [`stalled_after`](Self::stalled_after)):
    /// the new first task promises to act by `until`.
    fn replace_stalled_front(&self, key: &str, ahead: Owner, until: Instant) -> Option<Owner> {
        let mut shard = self.lock(key);
        let Shard { queues, owners } = &mut *shard;
        let queue = queues.get_mut(key)?;
        let stalled =
            queue.owner == ahead && queue.holder.is_none() && queue.due + GRACE <= Instant::now();
        if !stalled {
            return None;
        }
        queue.owner = next_owner(owners);
        queue.due = until;
        Some(queue.owner)
    }

    /// The shard of `key`, locked.
    fn lock(&self, key: &str) -> std::sync::MutexGuard<'_, Shard> {
        let at = (std::hash::BuildHasher::hash_one(&self.pick, key) % SHARDS as u64) as usize;
        self.shards[at].0.lock().unwrap_or_else(|p| p.into_inner())
    }

    #[cfg(feature = "testing")]
    /// How many keys have a queue: held, or being acquired, by some task.
    pub(crate) fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|shard| {
                shard
                    .0
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .queues
                    .len()
            })
            .sum()
    }

    /// Joins the queue for `key`; `wait: false` only looks (a caller that
    /// will not wait), and gets `None` when someone is ahead. A holder whose
    /// lease is lost is no longer ahead of anyone. A task that comes first
    /// promises to act by `until` (see [`Front::promise`]).
    pub(crate) fn join(&self, key: &Arc<str>, wait: bool, until: Instant) -> Option<Position> {
        let mut shard = self.lock(key);
        let Shard { queues, owners } = &mut *shard;
        let Some(queue) = queues.get_mut(&**key) else {
            let owner = next_owner(owners);
            queues.insert(
                key.clone(),
                Queue {
                    owner,
                    holder: None,
                    due: until,
                    waiting: Waiting::default(),
                    handoffs: 0,
                    taken: None,
                },
            );
            return Some(Position::Front(owner));
        };
        if queue.holder.as_ref().is_some_and(|h| h.is_lost()) {
            queue.owner = next_owner(owners);
            queue.holder = None;
            queue.due = until;
            return Some(Position::Front(queue.owner));
        }
        if !wait {
            return None;
        }
        queue.waiting.forget_gone();
        let slot = Arc::new(Slot::default());
        queue.waiting.push_back(slot.clone());
        Some(Position::Behind {
            handoff: Offered(slot),
            holder: queue.holder.clone(),
            ahead: queue.owner,
        })
    }

    /// Moves a waiter up front when the holder it waited behind (`seen`) lost
    /// its lease and is still first; the waiter promises to act by `until`.
    pub(crate) fn replace_lost_holder(
        &self,
        key: &str,
        seen: Owner,
        until: Instant,
    ) -> Option<Owner> {
        let mut shard = self.lock(key);
        let Shard { queues, owners } = &mut *shard;
        let queue = queues.get_mut(key)?;
        if queue.owner != seen {
            return None;
        }
        queue.owner = next_owner(owners);
        queue.holder = None;
        queue.due = until;
        Some(queue.owner)
    }

    /// `owner` holds `lease` now; taken from Redis, it starts a new hand-off
    /// budget.
    pub(crate) fn set_holder(&self, key: &str, owner: Owner, lease: &Arc<Lease>, taken: Taken) {
        // (`due` means nothing while a holder holds.)
        if let Some(queue) = self.lock(key).queues.get_mut(key)
            && queue.owner == owner
        {
            queue.holder = Some(lease.clone());
            if let Taken::FromRedis = taken {
                queue.handoffs = 0;
                queue.taken = Some(Instant::now());
            }
        }
    }

    /// `owner` lets go of a lease still held in Redis (`lease`, unless it
    /// was lost): hands it to the next task if the budget allows and someone
    /// waits, otherwise says to release it.
    ///
    /// After `Release` the caller releases in Redis and then calls
    /// [`pass_front`](Self::pass_front); after `NotFirst`, it only releases.
    pub(crate) fn hand_off(
        &self,
        key: &Arc<str>,
        owner: Owner,
        lease: impl FnOnce() -> Option<HandedLease>,
        budget: HandoffBudget,
    ) -> Next {
        let mut shard = self.lock(key);
        let Shard { queues, owners } = &mut *shard;
        let Some(queue) = queues.get_mut(&**key).filter(|queue| queue.owner == owner) else {
            return Next::NotFirst;
        };
        queue.waiting.forget_gone();
        // With nobody waiting the queue still stays until `pass_front`, after the
        // release: a task of this process that comes meanwhile queues and
        // goes to Redis once the key is free, at the same time as the other
        // processes' waiters hear of it. Were the queue gone, its SET would
        // follow the release on the same connection and win every time:
        // the releasing process barging back in.
        if queue.waiting.is_empty() {
            return Next::Release { spent: false };
        }
        let Some(mut lease) = lease() else {
            return Next::Release { spent: false };
        };
        let within = queue.handoffs < budget.handoffs
            && queue.taken.is_some_and(|t| t.elapsed() < budget.hold);
        if !within {
            return Next::Release { spent: true };
        }
        while let Some(next) = queue.waiting.pop_front() {
            let owner = next_owner(owners);
            match self.offer(key, &next, Handoff::Lease { lease, owner }) {
                Ok(()) => {
                    queue.owner = owner;
                    queue.holder = None;
                    queue.due = Instant::now() + OFFER;
                    queue.handoffs += 1;
                    return Next::HandedOver;
                }
                // That waiter gave up; try the one behind it.
                Err(Handoff::Lease { lease: back, .. }) => lease = back,
                Err(Handoff::Free { .. }) => return Next::Release { spent: false },
            }
        }
        // Every waiter had given up.
        Next::Release { spent: false }
    }

    /// `owner` is done with the key (released in Redis, or never acquired):
    /// gives the next waiter its turn, or ends the queue. A task that comes
    /// after a budget ran out waits `after` first.
    pub(crate) fn pass_front(&self, key: &Arc<str>, owner: Owner, after: Duration) {
        let mut shard = self.lock(key);
        let Shard { queues, owners } = &mut *shard;
        let Some(queue) = queues.get_mut(&**key).filter(|queue| queue.owner == owner) else {
            return;
        };
        queue.holder = None;
        while let Some(next) = queue.waiting.pop_front() {
            let owner = next_owner(owners);
            if self
                .offer(key, &next, Handoff::Free { after, owner })
                .is_ok()
            {
                queue.owner = owner;
                queue.due = Instant::now() + OFFER + after;
                return;
            }
        }
        queues.remove(&**key);
    }

    /// Waits behind `ahead`, first in `key`'s queue, until `handoff` brings
    /// something (`Some`), the offer is withdrawn (`None`: queue again), or
    /// the front is passed by: its lease lost, or its promise let pass
    /// (then this task is first, as the owner returned, promising `until`).
    pub(crate) async fn wait_behind(
        &self,
        key: &str,
        ahead: Owner,
        holder: Option<Arc<Lease>>,
        handoff: &mut Offered,
        until: Instant,
    ) -> Result<Option<Handoff>, Owner> {
        if let Some(holder) = holder {
            tokio::select! {
                received = &mut *handoff => return Ok(received),
                () = holder.lost() => {
                    if let Some(owner) = self.replace_lost_holder(key, ahead, until) {
                        return Err(owner);
                    }
                }
            }
        }
        loop {
            let Some(stalled) = self.stalled_after(key, ahead) else {
                return Ok(handoff.await);
            };
            tokio::select! {
                received = &mut *handoff => return Ok(received),
                () = tokio::time::sleep_until(stalled) => {
                    if let Some(owner) = self.replace_stalled_front(key, ahead, until) {
                        return Err(owner);
                    }
                }
            }
        }
    }
}

/// A task's place at the front of its key's queue while it acquires; passes
/// it on if the acquisition fails or is cancelled.
pub(crate) struct Front<'a> {
    queues: &'a Queues,
    key: &'a Arc<str>,
    owner: Owner,
    armed: bool,
}

impl<'a> Front<'a> {
    pub(crate) fn new(queues: &'a Queues, key: &'a Arc<str>, owner: Owner) -> Front<'a> {
        Front {
            queues,
            key,
            owner,
            armed: true,
        }
    }

    /// Promises to act again (an attempt, or giving up the place) by
    /// `until`: the tasks behind move up past a front that does not.
    pub(crate) fn promise(&self, until: Instant) {
        self.queues.promise(self.key, self.owner, until);
    }

    /// The acquisition succeeded: the guard (holding `lease`) owns the queue
    /// from now on.
    pub(crate) fn keep(mut self, lease: &Arc<Lease>, taken: Taken) -> Owner {
        self.armed = false;
        self.queues.set_holder(self.key, self.owner, lease, taken);
        self.owner
    }
}

impl Drop for Front<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.queues.pass_front(self.key, self.owner, Duration::ZERO);
        }
    }
}

/// Withdraws the offers their waiters did not take within [`OFFER`], and
/// passes them on; ends once no offer is left to watch.
async fn watch_offers(client: Weak<dyn PassOn>) {
    loop {
        let Some(owner) = client.upgrade() else {
            return;
        };
        // With nothing due and nothing pending, this also marks the watch
        // ended (under the same lock as new offers look at it).
        let (due, next) = owner.queues().due_offers();
        let Some(next) = next.filter(|_| due.is_empty()) else {
            if due.is_empty() {
                return;
            }
            for (key, slot) in due {
                if let Some(handoff) = slot.upgrade().and_then(|slot| slot.withdraw()) {
                    owner.clone().pass_on(&key, handoff);
                }
            }
            // Passing on may have made new offers: look again.
            continue;
        };
        drop(owner);
        tokio::time::sleep_until(next).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> Arc<str> {
        "k".into()
    }

    fn later() -> Instant {
        Instant::now() + Duration::from_secs(60)
    }

    fn handed() -> HandedLease {
        HandedLease {
            token: Token::generate(),
            valid_until: Instant::now() + Duration::from_secs(1),
        }
    }

    fn first(queues: &Queues) -> Owner {
        match queues.join(&key(), true, later()) {
            Some(Position::Front(owner)) => owner,
            _ => panic!("expected to be first"),
        }
    }

    fn behind(queues: &Queues) -> Offered {
        match queues.join(&key(), true, later()) {
            Some(Position::Behind { handoff, .. }) => handoff,
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
            crate::lease::HoldLimits::default(),
        ))
    }

    #[tokio::test]
    async fn first_comer_acquires_and_the_rest_queue_in_order() {
        let queues = Queues::default();
        let owner = first(&queues);
        let second = behind(&queues);
        let third = behind(&queues);
        queues.pass_front(&key(), owner, Duration::ZERO);
        let Some(Handoff::Free { owner, .. }) = second.await else {
            panic!("second gets the front")
        };
        queues.pass_front(&key(), owner, Duration::ZERO);
        let Some(Handoff::Free { owner, .. }) = third.await else {
            panic!("third gets the front")
        };
        queues.pass_front(&key(), owner, Duration::ZERO);
        first(&queues);
    }

    #[tokio::test]
    async fn hand_off_respects_the_budget() {
        let queues = Queues::default();
        let budget = HandoffBudget {
            handoffs: 1,
            hold: Duration::from_secs(60),
        };
        let owner = first(&queues);
        queues.set_holder("k", owner, &lease(), Taken::FromRedis);
        let second = behind(&queues);
        assert!(matches!(
            queues.hand_off(&key(), owner, || Some(handed()), budget),
            Next::HandedOver
        ));
        let Some(Handoff::Lease { owner, .. }) = second.await else {
            panic!("second gets the lease")
        };
        queues.set_holder("k", owner, &lease(), Taken::HandedOver);
        let _third = behind(&queues);
        // One hand-off used: the next let-go releases for real.
        assert!(matches!(
            queues.hand_off(&key(), owner, || Some(handed()), budget),
            Next::Release { spent: true }
        ));
    }

    #[tokio::test]
    async fn a_waiter_that_gave_up_is_skipped() {
        let queues = Queues::default();
        let owner = first(&queues);
        queues.set_holder("k", owner, &lease(), Taken::FromRedis);
        drop(behind(&queues));
        let next = behind(&queues);
        assert!(matches!(
            queues.hand_off(&key(), owner, || Some(handed()), HandoffBudget::default()),
            Next::HandedOver
        ));
        assert!(matches!(next.await, Some(Handoff::Lease { .. })));
    }

    #[test]
    fn nobody_waiting_means_release_and_the_line_stays_until_passed() {
        let queues = Queues::default();
        let owner = first(&queues);
        queues.set_holder("k", owner, &lease(), Taken::FromRedis);
        assert!(matches!(
            queues.hand_off(&key(), owner, || Some(handed()), HandoffBudget::default()),
            Next::Release { spent: false }
        ));
        // While the release is in flight, a newcomer waits its front.
        assert!(queues.join(&key(), false, later()).is_none());
        queues.pass_front(&key(), owner, Duration::ZERO);
        assert!(matches!(
            queues.join(&key(), false, later()),
            Some(Position::Front(_))
        ));
    }

    #[test]
    fn a_caller_that_will_not_wait_is_not_queued() {
        let queues = Queues::default();
        assert!(matches!(
            queues.join(&key(), false, later()),
            Some(Position::Front(_))
        ));
        assert!(queues.join(&key(), false, later()).is_none());
    }

    #[test]
    fn a_holder_whose_lease_is_lost_is_overtaken_and_cannot_disturb_the_line() {
        let queues = Queues::default();
        let stale = first(&queues);
        let lost = lease();
        queues.set_holder("k", stale, &lost, Taken::FromRedis);
        lost.mark_lost(crate::lease::LossReason::TakenOver);
        let fresh = first(&queues);
        assert_ne!(fresh, stale);
        let _waiter = behind(&queues);
        queues.pass_front(&key(), stale, Duration::ZERO);
        assert!(matches!(
            queues.hand_off(&key(), stale, || Some(handed()), HandoffBudget::default()),
            Next::NotFirst
        ));
        assert!(
            queues.join(&key(), false, later()).is_none(),
            "the fresh owner is still first"
        );
        assert_eq!(queues.replace_lost_holder("k", stale, later()), None);
        assert!(queues.replace_lost_holder("k", fresh, later()).is_some());
    }
}

/// Model tests of a hand-off, with loom: the task ahead offering, the
/// waiter taking its offer, going away or kept after a poll, and the watch
/// withdrawing an offer not taken in time, run through every interleaving
/// of their steps. Whatever the order, the hand-off ends in exactly one
/// place, and a waiter that waits is woken. `scripts/test` runs them:
/// `RUSTFLAGS="--cfg lock_core_loom" cargo test -p lock-core --lib model::`.
#[cfg(all(test, lock_core_loom))]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod model {
    use super::*;
    use loom::thread::{self, JoinHandle};

    fn turn() -> Handoff {
        Handoff::Free {
            after: Duration::ZERO,
            owner: 1,
        }
    }

    /// The task ahead offers the turn (it comes back when the waiter is
    /// gone: `true`), and the watch withdraws it if not taken (`true`).
    fn ahead_and_watch(slot: &Arc<Slot>) -> [JoinHandle<bool>; 2] {
        let ahead = slot.clone();
        let watch = slot.clone();
        [
            thread::spawn(move || ahead.offer(turn()).is_err()),
            thread::spawn(move || watch.withdraw().is_some()),
        ]
    }

    fn ends_once(ends: &[bool]) {
        let count = ends.iter().filter(|end| **end).count();
        assert_eq!(count, 1, "taken, closed, given back, withdrawn: {ends:?}");
    }

    #[test]
    fn a_waiting_waiter_is_woken_and_the_hand_off_ends_once() {
        loom::model(|| {
            let slot = Arc::new(Slot::default());
            let waiter = Offered(slot.clone());
            let [ahead, watch] = ahead_and_watch(&slot);
            let taken = loom::future::block_on(waiter).is_some();
            let given_back = ahead.join().unwrap();
            ends_once(&[taken, false, given_back, watch.join().unwrap()]);
        });
    }

    #[test]
    fn a_waiter_gone_or_kept_after_a_poll_loses_no_hand_off() {
        for polls in [0, 1] {
            loom::model(move || {
                let slot = Arc::new(Slot::default());
                let mut waiter = Offered(slot.clone());
                let [ahead, watch] = ahead_and_watch(&slot);
                let mut taken = false;
                if polls == 1 {
                    let waker = futures::task::noop_waker();
                    let polled = Pin::new(&mut waiter).poll(&mut Context::from_waker(&waker));
                    taken = matches!(polled, Poll::Ready(Some(_)));
                }
                // Gone: whoever drops it passes on what `close` returns.
                let closed = waiter.close().is_some();
                drop(waiter);
                let given_back = ahead.join().unwrap();
                ends_once(&[taken, closed, given_back, watch.join().unwrap()]);
            });
        }
    }
}
