//! The heartbeat: one task per client renews every held lease, many per
//! round trip.
//!
//! Each lease is due for renewal a third of its ttl after its last
//! successful renewal. When the task wakes it also takes every lease due
//! within the next quarter of its ttl, so leases acquired at different moments
//! drift into shared rounds, and sends each round as one script call per
//! server carrying up to [`BATCH`](crate::backend::BATCH) keys: ten thousand held locks with a 3 s
//! ttl cost a handful of calls a second, not ten thousand.
//!
//! - A renewal that answers "not ours" marks the lease lost at once.
//! - A renewal that fails (timeout, connection) is retried soon, until the
//!   lease's validity deadline; past it the lease is lost whatever Redis
//!   says later. The heartbeat never re-acquires behind the owner's back.
//! - A guard leaves the heartbeat when it is released or dropped, so renewal
//!   never outlives its owner.
//!
//! The task runs on the runtime of the first guard that needed it, and ends
//! after a short idle period. Should that runtime shut down while guards
//! from another runtime are still held, their leases are not renewed and are
//! reported lost at their validity deadline; the next guard starts a new task.

use crate::backend::{Backend, Renewable, Renewal};
use crate::hold::{self, Expiry};
use crate::lease::{Lease, LossReason, Scope, renewal_due};
use crate::observe;
use crate::token::Token;
use futures::future::join_all;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

/// How long the task waits for new leases before it ends.
const IDLE: Duration = Duration::from_secs(2);

/// The renewal schedule of one client.
pub(crate) struct Heartbeat {
    state: Mutex<Schedule>,
    wake: Notify,
    /// The bound on each round's call.
    op_timeout: Duration,
}

#[derive(Default)]
struct Schedule {
    leases: Slots,
    /// Set while a task runs; the flag is cleared by the task's drop (also
    /// when its runtime shuts down).
    running: Option<Arc<AtomicBool>>,
    /// When the running task wakes by itself next: a new lease due earlier
    /// must wake it, a later one need not.
    alarm: Option<Instant>,
}

struct Entry {
    lease: Arc<Lease>,
    due: Instant,
    in_flight: bool,
}

/// A lease's place in the schedule; leaving it is [`Heartbeat::leave`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Enrolment {
    index: usize,
    id: u64,
}

/// The enrolled leases: a slab (a vector with a free list), so joining and
/// leaving, once per lock, cost no hashing and, once the vector has grown,
/// no allocation. Ids are never reused, so a stale [`Enrolment`] finds
/// nothing.
#[derive(Default)]
struct Slots {
    slots: Vec<Slot>,
    free: Vec<usize>,
    next_id: u64,
}

struct Slot {
    id: u64,
    entry: Option<Entry>,
}

impl Slots {
    /// Every slot not on the free list holds an entry.
    fn len(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn insert(&mut self, entry: Entry) -> Enrolment {
        self.next_id += 1;
        let id = self.next_id;
        let slot = Slot {
            id,
            entry: Some(entry),
        };
        let index = match self.free.pop() {
            Some(index) => {
                self.slots[index] = slot;
                index
            }
            None => {
                self.slots.push(slot);
                self.slots.len() - 1
            }
        };
        Enrolment { index, id }
    }

    fn get_mut(&mut self, at: Enrolment) -> Option<&mut Entry> {
        self.slots
            .get_mut(at.index)
            .filter(|slot| slot.id == at.id)?
            .entry
            .as_mut()
    }

    fn remove(&mut self, at: Enrolment) {
        let Some(slot) = self.slots.get_mut(at.index).filter(|slot| slot.id == at.id) else {
            return;
        };
        if slot.entry.take().is_some() {
            self.free.push(at.index);
        }
        if self.is_empty() && self.slots.len() > 1024 {
            // Give back what a burst of locks grew.
            self.slots = Vec::new();
            self.free = Vec::new();
        }
    }

    fn iter_mut(&mut self) -> impl Iterator<Item = (Enrolment, &mut Entry)> {
        self.slots
            .iter_mut()
            .enumerate()
            .filter_map(|(index, slot)| {
                let id = slot.id;
                slot.entry
                    .as_mut()
                    .map(|entry| (Enrolment { index, id }, entry))
            })
    }

    fn values(&self) -> impl Iterator<Item = &Entry> {
        self.slots.iter().filter_map(|slot| slot.entry.as_ref())
    }
}

impl Heartbeat {
    pub(crate) fn new(op_timeout: Duration) -> Heartbeat {
        Heartbeat {
            state: Mutex::default(),
            wake: Notify::new(),
            op_timeout,
        }
    }

    /// How many leases are being renewed.
    pub(crate) fn len(&self) -> usize {
        self.lock().leases.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Schedule> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts renewing `lease` from `due` on, and the task if none runs.
    pub(crate) fn join(
        self: &Arc<Heartbeat>,
        backend: &Arc<Backend>,
        lease: Arc<Lease>,
        due: Instant,
    ) -> Enrolment {
        let heartbeat = self;
        let (id, start, wake) = {
            let mut schedule = heartbeat.lock();
            let id = schedule.leases.insert(Entry {
                lease,
                due,
                in_flight: false,
            });
            let alive = schedule
                .running
                .as_ref()
                .is_some_and(|flag| flag.load(Ordering::Acquire));
            let start = if alive {
                None
            } else {
                let flag = Arc::new(AtomicBool::new(true));
                schedule.running = Some(flag.clone());
                schedule.alarm = Some(Instant::now());
                Some(flag)
            };
            let wake = start.is_none() && schedule.alarm.is_none_or(|alarm| due < alarm);
            (id, start, wake)
        };
        if let Some(flag) = start {
            let running = Running(flag);
            let (heartbeat, backend) = (Arc::downgrade(self), Arc::downgrade(backend));
            tokio::spawn(async move {
                let _running = running;
                run(heartbeat, backend).await;
            });
        } else if wake {
            heartbeat.wake.notify_one();
        }
        id
    }

    /// Moves a lease's next renewal to `due` (after `extend` changed its
    /// ttl), waking the task when that is earlier than it would wake.
    pub(crate) fn reschedule(&self, enrolment: Enrolment, due: Instant) {
        let wake = {
            let mut schedule = self.lock();
            let Some(entry) = schedule.leases.get_mut(enrolment) else {
                return;
            };
            entry.due = due;
            schedule.alarm.is_some_and(|alarm| due < alarm)
        };
        if wake {
            self.wake.notify_one();
        }
    }

    /// Stops renewing a lease.
    pub(crate) fn leave(&self, enrolment: Enrolment) {
        self.lock().leases.remove(enrolment);
    }
}

/// Clears the running flag when the task ends or is dropped with its
/// runtime.
struct Running(Arc<AtomicBool>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// One lease taken into a round, holding the lease's renewal permit (which
/// keeps `extend` out while it is in flight) until dropped.
struct Due {
    id: Enrolment,
    lease: Arc<Lease>,
    ttl: Duration,
}

impl Due {
    /// Takes `lease` into a round, if no renewal of it is under way.
    fn take(id: Enrolment, lease: &Arc<Lease>, ttl: Duration) -> Option<Due> {
        lease.renewing.try_acquire().ok()?.forget();
        Some(Due {
            id,
            lease: lease.clone(),
            ttl,
        })
    }
}

impl Renewable for Due {
    fn storage_key(&self) -> &str {
        &self.lease.storage_key
    }

    fn token(&self) -> &Token {
        &self.lease.token
    }

    fn ttl(&self) -> Duration {
        self.ttl
    }

    fn name(&self) -> &str {
        self.lease.key()
    }
}

impl Drop for Due {
    fn drop(&mut self) {
        self.lease.renewing.add_permits(1);
    }
}

/// The task: renews rounds of leases until it is idle, or its client is
/// gone.
async fn run(heartbeat: Weak<Heartbeat>, backend: Weak<Backend>) {
    loop {
        let (Some(heartbeat), Some(backend)) = (heartbeat.upgrade(), backend.upgrade()) else {
            return;
        };
        let (round, alarm) = take_round(&heartbeat);
        if round.is_empty() {
            let woken = tokio::select! {
                () = heartbeat.wake.notified() => true,
                () = tokio::time::sleep_until(alarm) => false,
            };
            if !woken {
                let mut schedule = heartbeat.lock();
                if schedule.leases.is_empty() {
                    // Idle: end. Decided under the lock, so a lease that
                    // joins now starts a new task.
                    schedule.running = None;
                    schedule.alarm = None;
                    return;
                }
            }
            continue;
        }
        renew_round(&heartbeat, &backend, round).await;
    }
}

/// When a lease is due, takes it and every lease due within a quarter of its
/// ttl. Otherwise returns no lease and sets the alarm: the earliest due
/// time, or the end of the idle period.
fn take_round(heartbeat: &Heartbeat) -> (Vec<Due>, Instant) {
    let now = Instant::now();
    let mut schedule = heartbeat.lock();
    // A round starts only when some lease is due; then it gathers all that
    // will be due soon. (Waking for a new lease only moves the alarm.)
    let earliest = schedule
        .leases
        .values()
        .filter(|entry| !entry.in_flight)
        .map(|entry| entry.due)
        .min();
    if earliest.is_none_or(|due| due > now) {
        let alarm = earliest.unwrap_or(now + IDLE);
        schedule.alarm = Some(alarm);
        return (Vec::new(), alarm);
    }
    // Busy with a round: new leases are due later than it ends.
    schedule.alarm = Some(now);
    let mut round = Vec::new();
    let mut expired = Vec::new();
    let mut next: Option<Instant> = None;
    for (id, entry) in schedule.leases.iter_mut() {
        if entry.in_flight {
            continue;
        }
        let ttl = entry.lease.ttl();
        if now >= entry.lease.valid_until() {
            // Past its deadline: lost, whatever a late renewal would say.
            entry.lease.mark_lost(entry.lease.deadline_reason());
            expired.push(id);
            continue;
        }
        if entry.due <= now + ttl / 4 {
            // `extend` holds this lock only for one round trip; a lease
            // being extended joins the next round.
            if let Some(due) = Due::take(id, &entry.lease, ttl) {
                entry.in_flight = true;
                round.push(due);
                continue;
            }
        }
        let due = entry.due.max(now + Duration::from_millis(1));
        next = Some(next.map_or(due, |n| n.min(due)));
    }
    for id in expired {
        schedule.leases.remove(id);
    }
    (round, next.unwrap_or(now + IDLE))
}

async fn renew_round(heartbeat: &Heartbeat, backend: &Backend, round: Vec<Due>) {
    let sent = Instant::now();
    // Never wait on Redis past the first deadline in the round.
    let first_deadline = round
        .iter()
        .map(|due| due.lease.valid_until())
        .min()
        .unwrap_or(sent);
    let limit = heartbeat
        .op_timeout
        .min(first_deadline.saturating_duration_since(sent))
        .max(Duration::from_millis(1));
    let answers = renew_each(backend, &round, limit).await;
    let now = Instant::now();
    let mut schedule = heartbeat.lock();
    for (due, answer) in round.iter().zip(answers) {
        let lease = &due.lease;
        let keep = match answer {
            Renewal::Renewed => {
                lease.renewed(sent, due.ttl);
                Some(renewal_due(sent, due.ttl))
            }
            Renewal::NotOurs => {
                lease.mark_lost(LossReason::TakenOver);
                None
            }
            Renewal::Evicted => {
                lease.mark_lost(LossReason::ForceReleased);
                None
            }
            Renewal::Failed if now >= lease.valid_until() => {
                lease.mark_lost(lease.deadline_reason());
                None
            }
            Renewal::Failed => Some(now + retry_gap(due.ttl)),
        };
        match keep {
            Some(next) => {
                if let Some(entry) = schedule.leases.get_mut(due.id) {
                    entry.due = next;
                    entry.in_flight = false;
                }
            }
            None => {
                schedule.leases.remove(due.id);
            }
        }
    }
}

/// Renews a round: the leases of one key each in batched script calls, the
/// others (several keys, shared holders, permits) each in its own calls, at
/// the same time. One answer per lease, in order.
async fn renew_each(backend: &Backend, round: &[Due], limit: Duration) -> Vec<Renewal> {
    let one_key = |due: &Due| matches!(due.lease.scope, Scope::One);
    if round.iter().all(one_key) {
        return backend.renew_many(round, limit).await;
    }
    let (batched, apart): (Vec<usize>, Vec<usize>) =
        (0..round.len()).partition(|&i| one_key(&round[i]));
    let batch: Vec<&Due> = batched.iter().map(|&i| &round[i]).collect();
    let each = apart.iter().map(|&i| {
        let due = &round[i];
        async move {
            match hold::expire(backend, &due.lease, due.ttl, Expiry::Renew, limit).await {
                Ok(true) => Renewal::Renewed,
                Ok(false) => Renewal::NotOurs,
                Err(e) => {
                    observe::renewal_failed(due.lease.key(), 1, &e);
                    Renewal::Failed
                }
            }
        }
    });
    let (batch_answers, each_answers) =
        tokio::join!(backend.renew_many(&batch, limit), join_all(each));
    let mut answers: Vec<Option<Renewal>> = round.iter().map(|_| None).collect();
    for (i, answer) in batched.into_iter().zip(batch_answers) {
        answers[i] = Some(answer);
    }
    for (i, answer) in apart.into_iter().zip(each_answers) {
        answers[i] = Some(answer);
    }
    answers
        .into_iter()
        .map(|a| a.unwrap_or(Renewal::Failed))
        .collect()
}

/// How soon a failed renewal is tried again: often enough to get several
/// tries into the remaining two thirds of the lease.
fn retry_gap(ttl: Duration) -> Duration {
    (ttl / 20).clamp(Duration::from_millis(5), Duration::from_millis(500))
}
