//! The heartbeat: one task per client renews every held lease, many per
//! round trip.
//!
//! Each lease is due for renewal a third of its ttl after its last
//! successful renewal. When the task wakes it also takes every lease due
//! within the next quarter of its ttl (a twelfth near its capacity), so
//! leases acquired at different moments drift into shared rounds, and sends each round as one script call per
//! server carrying up to [`BATCH`](crate::backend::BATCH) keys: ten thousand held locks with a 3 s
//! ttl cost a handful of calls a second, not ten thousand.
//!
//! - A renewal that answers "not ours" marks the lease lost at once.
//! - A renewal that fails (timeout, connection) is retried soon, until the
//!   lease's validity deadline; past it the lease is lost whatever Redis
//!   says later. The heartbeat never re-acquires behind the owner's back.
//! - A guard leaves the heartbeat when it is released or dropped, so renewal
//!   never outlives its owner.
//! - Past the server's capacity it degrades instead of collapsing: a round
//!   takes at most `cap` leases, those with the earliest deadlines first
//!   (and in that order on the wire); after a round with failed calls the
//!   cap falls to what the server answered in time, and it doubles after
//!   clean ones, so timed-out calls do not pile up behind each other. While
//!   overdue leases wait, and while the leases ask most of the measured
//!   capacity, a lease renewed is due again as late as leaves a third of
//!   its ttl (and three rounds) before its deadline, instead of a third of
//!   its ttl after the renewal: the same renewals then serve more leases.
//!   Leases it cannot serve are lost at their deadlines, the others kept;
//!   a backlog of overdue leases is reported (a WARN at most every ten
//!   seconds, and metrics).
//! - It measures what it can renew, and a new lease is refused before it
//!   is taken once the heartbeat could not keep it renewed with the others
//!   (`admission.rs`): past capacity the client keeps what it holds.
//!
//! Nothing a task of the client's users does can hold a renewal up. The task
//! runs on a thread of its own with a runtime of its own, over connections of
//! its own (`Backend::twin`): a caller's future kept but never polled, a
//! worker thread blocked by a synchronous call, or a runtime shutting down
//! delays no renewal. Each call is bounded by half of what is left before
//! the round's last deadline, so a call to a connection that stopped
//! answering still leaves time for a retry on a new one. The thread ends
//! after a short idle period; the next guard starts another. (On the
//! in-memory store, which needs no I/O, the task runs on the runtime of the
//! first guard that needed it.)
//!
//! A client given a runtime (`LockClientBuilder::runtime`) runs the task
//! there instead, as `lock-core.heartbeat`, with its connections: the user
//! then promises it a free worker every third of a ttl. Should that runtime
//! drop the task (it shut down), every lease it renewed is lost at once
//! ([`LossReason::RuntimeShutDown`]) rather than left to look held until
//! its deadline; a lease that joins later finds the task dropped again and
//! is lost as it joins.

use crate::admission::{self, Admission, Load, MAX_ROUND};
use crate::backend::{BATCH, Backend, RenewOutcome, Renewable};
use crate::background::Spawner;
use crate::lease::{Lease, LossReason, Scope, renewal_due};
use crate::observe;
use crate::release::{self, Expiry};
use crate::token::Token;
use futures::future::join_all;
use std::collections::BTreeSet;
use std::num::NonZeroU32;
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
    /// Where the task runs: a runtime the user gave, or a thread of its own.
    spawner: Spawner,
    /// The bound on each round's call.
    op_timeout: Duration,
    /// Whether a new lease may join (see `admission.rs`).
    admission: Arc<Admission>,
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
    /// How many leases the next round may take (see the module's doc).
    cap: Cap,
    /// When overload was last reported.
    warned: Option<Instant>,
    /// How long the last round took, from sending to the answers.
    last_round: Duration,
    /// Whether the last round left overdue leases waiting: renewals then
    /// come as late as is safe (see [`next_renewal`]).
    behind: bool,
    /// When the round under way was taken: its busy time, for the
    /// capacity, runs from there to the end of its answers.
    round_taken: Option<Instant>,
}

/// The size limit of a round: between [`BATCH`] and [`MAX_ROUND`].
#[derive(Clone, Copy)]
struct Cap(usize);

impl Default for Cap {
    fn default() -> Cap {
        Cap(MAX_ROUND)
    }
}

impl Cap {
    /// After a round in which some call failed: what the server did answer
    /// in time, at least one batch and at most half the cap.
    fn shrink_to(&mut self, answered: usize) {
        self.0 = answered.min(self.0 / 2).max(BATCH);
    }

    /// After a round every call answered: double.
    fn grow(&mut self) {
        self.0 = (self.0 * 2).min(MAX_ROUND);
    }
}

struct Entry {
    lease: Arc<Lease>,
    due: Instant,
    in_flight: bool,
    /// What it asks of the heartbeat ([`admission::cost`]), as counted in
    /// the demand.
    cost: u64,
}

/// A lease's place in the schedule; leaving it is [`Heartbeat::leave`].
/// Eight bytes (a guard and the due order carry one per held lock): the
/// slot and a 32-bit id, which [`Slots`] checks together with the lease
/// itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Enrolment {
    index: u32,
    id: NonZeroU32,
}

/// The enrolled leases: a slab (a vector with a free list), so joining and
/// leaving, once per lock, cost no hashing and, once the vector has grown,
/// no allocation. A reused slot gets a new id, and the calls from a guard
/// also name its lease, so a stale [`Enrolment`] finds nothing (even after
/// the ids wrap).
///
/// Beside it, the leases not in flight ordered by due time, so that a round
/// costs what it takes (a logarithm per lease), not a look at every lease:
/// with a million held, scanning them all for every round cost more CPU
/// than the renewals themselves. An entry is in `by_due`, under its due
/// time, exactly when it is not in flight; every change goes through the
/// methods here, which keep that so.
///
/// It also keeps the demand of the leases for admission (`admission.rs`),
/// republished on every change.
#[derive(Default)]
struct Slots {
    slots: Vec<Slot>,
    free: Vec<usize>,
    next_id: u32,
    by_due: BTreeSet<(Instant, Enrolment)>,
    load: Load,
    admission: Arc<Admission>,
}

struct Slot {
    id: NonZeroU32,
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

    fn insert(&mut self, lease: Arc<Lease>, due: Instant) -> Enrolment {
        self.next_id = self.next_id.wrapping_add(1);
        let id = NonZeroU32::new(self.next_id).unwrap_or(NonZeroU32::MIN);
        let cost = admission::cost(lease.ttl());
        self.load.joined(cost, lease.ttl());
        self.load.publish(&self.admission);
        let slot = Slot {
            id,
            entry: Some(Entry {
                lease,
                due,
                in_flight: false,
                cost,
            }),
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
        // More slots than u32 holds would need 300 GiB of leases first.
        let index = u32::try_from(index).unwrap_or(u32::MAX);
        let at = Enrolment { index, id };
        self.by_due.insert((due, at));
        at
    }

    fn get(&self, at: Enrolment) -> Option<&Entry> {
        self.slots
            .get(at.index as usize)
            .filter(|slot| slot.id == at.id)?
            .entry
            .as_ref()
    }

    /// The entry at `at`, if it is `lease`'s.
    fn get_of(&self, at: Enrolment, lease: &Arc<Lease>) -> Option<&Entry> {
        self.get(at)
            .filter(|entry| Arc::ptr_eq(&entry.lease, lease))
    }

    fn get_mut(&mut self, at: Enrolment) -> Option<&mut Entry> {
        self.slots
            .get_mut(at.index as usize)
            .filter(|slot| slot.id == at.id)?
            .entry
            .as_mut()
    }

    /// Removes `lease`'s entry at `at`.
    fn remove(&mut self, at: Enrolment, lease: &Arc<Lease>) {
        if self.get_of(at, lease).is_some() {
            self.remove_current(at);
        }
    }

    /// Removes the entry at `at`, which the caller just found there.
    fn remove_current(&mut self, at: Enrolment) {
        let Some(slot) = self.slots.get_mut(at.index as usize) else {
            return;
        };
        if let Some(entry) = slot.entry.take() {
            if !entry.in_flight {
                self.by_due.remove(&(entry.due, at));
            }
            self.free.push(at.index as usize);
            self.load.left(entry.cost);
            self.load.publish(&self.admission);
        }
        if self.is_empty() && self.slots.len() > 1024 {
            // Give back what a burst of locks grew.
            self.slots = Vec::new();
            self.free = Vec::new();
        }
    }

    /// Moves `lease`'s next renewal to `due` (its ttl may have changed).
    fn set_due(&mut self, at: Enrolment, lease: &Arc<Lease>, due: Instant) {
        if self.get_of(at, lease).is_none() {
            return;
        }
        let Some(entry) = self.get_mut(at) else {
            return;
        };
        let (old, in_flight) = (entry.due, entry.in_flight);
        let (was, cost) = (entry.cost, admission::cost(lease.ttl()));
        entry.due = due;
        entry.cost = cost;
        self.load.left(was);
        self.load.joined(cost, lease.ttl());
        self.load.publish(&self.admission);
        if !in_flight {
            self.by_due.remove(&(old, at));
            self.by_due.insert((due, at));
        }
    }

    /// Takes a lease into a round: it leaves the due order until
    /// [`finish`](Self::finish).
    fn start(&mut self, at: Enrolment) {
        if let Some(entry) = self.get_mut(at).filter(|entry| !entry.in_flight) {
            entry.in_flight = true;
            let due = entry.due;
            self.by_due.remove(&(due, at));
        }
    }

    /// `lease`'s round is over: it is due again at `due`.
    fn finish(&mut self, at: Enrolment, lease: &Arc<Lease>, due: Instant) {
        if self.get_of(at, lease).is_none() {
            return;
        }
        if let Some(entry) = self.get_mut(at).filter(|entry| entry.in_flight) {
            entry.in_flight = false;
            entry.due = due;
            self.by_due.insert((due, at));
        }
    }

    /// Removes every entry, in flight or not: the leases that were in them.
    fn take_all(&mut self) -> Vec<Arc<Lease>> {
        let taken: Vec<(Enrolment, Arc<Lease>)> = (self.slots.iter().enumerate())
            .filter_map(|(index, slot)| {
                let entry = slot.entry.as_ref()?;
                let index = u32::try_from(index).ok()?;
                Some((Enrolment { index, id: slot.id }, entry.lease.clone()))
            })
            .collect();
        for (at, _) in &taken {
            self.remove_current(*at);
        }
        taken.into_iter().map(|(_, lease)| lease).collect()
    }

    /// The earliest due time of a lease not in flight.
    fn earliest_due(&self) -> Option<Instant> {
        self.by_due.first().map(|(due, _)| *due)
    }
}

impl Heartbeat {
    pub(crate) fn new(op_timeout: Duration, spawner: Spawner) -> Heartbeat {
        let schedule = Schedule::default();
        let admission = schedule.leases.admission.clone();
        Heartbeat {
            state: Mutex::new(schedule),
            wake: Notify::new(),
            spawner,
            op_timeout,
            admission,
        }
    }

    /// Whether a new lease may join, without taking the schedule's lock.
    pub(crate) fn admission(&self) -> &Arc<Admission> {
        &self.admission
    }

    #[cfg(feature = "testing")]
    /// The measured renewal capacity, in leases renewed a second, once a
    /// round was timed (see `admission.rs`).
    pub(crate) fn capacity(&self) -> Option<f64> {
        self.lock().leases.load.capacity()
    }

    #[cfg(feature = "testing")]
    /// Caps the renewal capacity at `renewals_per_second`, whatever is
    /// measured: a small capacity for tests.
    pub(crate) fn set_capacity_ceiling(&self, renewals_per_second: f64) {
        let schedule = self.lock();
        let leases = &schedule.leases;
        leases
            .load
            .set_ceiling(&leases.admission, renewals_per_second);
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
            let id = schedule.leases.insert(lease, due);
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
            // Nothing measured yet and leases enough to measure: a round at
            // once (see `admission.rs`).
            let measure = schedule.leases.load.wants_measure();
            let wake =
                start.is_none() && (measure || schedule.alarm.is_none_or(|alarm| due < alarm));
            (id, start, wake)
        };
        if let Some(flag) = start {
            self.start(backend, flag);
        } else if wake {
            heartbeat.wake.notify_one();
        }
        id
    }

    /// Starts the task: on the user's runtime when one was given, else on a
    /// thread of its own.
    fn start(self: &Arc<Heartbeat>, backend: &Arc<Backend>, flag: Arc<AtomicBool>) {
        let on_users = self.spawner.is_users();
        let running = Running {
            flag,
            heartbeat: Arc::downgrade(self),
            ended: !on_users,
        };
        let remote = backend.is_remote();
        let (heartbeat, backend) = (Arc::downgrade(self), Arc::downgrade(backend));
        let task = async move {
            let mut running = running;
            run(heartbeat, backend).await;
            running.ended = true;
        };
        match (on_users, remote) {
            (true, _) => self.spawner.spawn("lock-core.heartbeat", task),
            (false, true) => spawn_apart(task),
            // The in-memory store needs no I/O, and its users' tests may
            // pause the clock of their runtime: it stays there.
            (false, false) => drop(tokio::spawn(task)),
        }
    }

    /// The task was dropped unfinished: the runtime the user gave shut down
    /// (or the task panicked). No renewal can run, so every lease it renewed
    /// is lost now, rather than kept by its guard as if renewed until its
    /// validity deadline.
    fn stopped(&self) {
        let lost = {
            let mut schedule = self.lock();
            schedule.alarm = None;
            schedule.leases.take_all()
        };
        for lease in lost {
            lease.mark_lost(LossReason::RuntimeShutDown);
        }
    }

    /// Moves a lease's next renewal to `due` (after `extend` changed its
    /// ttl), waking the task when that is earlier than it would wake.
    pub(crate) fn reschedule(&self, enrolment: Enrolment, lease: &Arc<Lease>, due: Instant) {
        let wake = {
            let mut schedule = self.lock();
            if schedule.leases.get_of(enrolment, lease).is_none() {
                return;
            }
            schedule.leases.set_due(enrolment, lease, due);
            schedule.alarm.is_some_and(|alarm| due < alarm)
        };
        if wake {
            self.wake.notify_one();
        }
    }

    /// Stops renewing a lease.
    pub(crate) fn leave(&self, enrolment: Enrolment, lease: &Arc<Lease>) {
        self.lock().leases.remove(enrolment, lease);
    }
}

/// Runs the heartbeat on a thread of its own, with a runtime of its own
/// (falling back to the caller's runtime should the system refuse a
/// thread). A runtime's timers and sockets are served only while one of its
/// worker threads is free to poll them: a task that blocks its worker (a
/// synchronous call) can hold up every timer and socket of that runtime,
/// and a renewal there would wait with them.
fn spawn_apart(task: impl Future<Output = ()> + Send + 'static) {
    let (sender, receiver) = std::sync::mpsc::channel();
    // The thread reports (losses, failed renewals) to the subscriber of
    // the code that started it, also a scoped one.
    let dispatch = tracing::dispatcher::get_default(tracing::Dispatch::clone);
    let started = std::thread::Builder::new()
        .name("lock-core-heartbeat".into())
        .spawn(move || {
            let task = match receiver.recv() {
                Ok(task) => task,
                Err(_) => return,
            };
            tracing::dispatcher::with_default(&dispatch, || {
                match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime.block_on(task),
                    Err(err) => observe::heartbeat_unstarted(&err),
                }
            });
        });
    let task: std::pin::Pin<Box<dyn Future<Output = ()> + Send>> = Box::pin(task);
    match started {
        Ok(_) => {
            // The thread is running; it owns the task from now on.
            let _ = sender.send(task);
        }
        Err(err) => {
            observe::heartbeat_unstarted(&err);
            drop(tokio::spawn(task));
        }
    }
}

/// Clears the running flag when the task ends or is dropped with its
/// runtime; on a user's runtime, a task dropped before it ended loses its
/// leases ([`Heartbeat::stopped`]).
struct Running {
    flag: Arc<AtomicBool>,
    heartbeat: Weak<Heartbeat>,
    /// Set when `run` returns (and from the start off a user's runtime,
    /// where the task is dropped only as its thread or process ends).
    ended: bool,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.flag.store(false, Ordering::Release);
        if !self.ended
            && let Some(heartbeat) = self.heartbeat.upgrade()
        {
            heartbeat.stopped();
        }
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
        &self.lease.held.storage_key
    }

    fn token(&self) -> &Token {
        &self.lease.held.token
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

/// When a lease is due, takes it and every lease due soon (see [`gather`]),
/// at most the cap of them, earliest deadline first. Otherwise returns
/// no lease and sets the alarm: the earliest due time, or the end of the
/// idle period.
fn take_round(heartbeat: &Heartbeat) -> (Vec<Due>, Instant) {
    let now = Instant::now();
    let mut schedule = heartbeat.lock();
    // A round starts only when some lease is due; then it gathers all that
    // will be due soon. (Waking for a new lease only moves the alarm.)
    let earliest = schedule.leases.earliest_due();
    // Or, once, ahead of the due times to measure the capacity before
    // admission goes past what it grants unmeasured.
    let measure = schedule.leases.load.wants_measure();
    if earliest.is_none_or(|due| due > now) && !(measure && earliest.is_some()) {
        let alarm = earliest.unwrap_or(now + IDLE);
        schedule.alarm = Some(alarm);
        return (Vec::new(), alarm);
    }
    // Busy with a round: new leases are due later than it ends.
    schedule.alarm = Some(now);
    schedule.round_taken = Some(now);
    if measure {
        schedule.leases.load.measured_early();
    }
    let cap = schedule.cap.0;
    let (mut wanted, mut next, expired) = gather(&mut schedule.leases, now, cap, measure);
    // Pressed: a lease lost at its deadline, or one with less than a
    // quarter of its ttl left; no new lease is admitted until a round
    // finds none (see `admission.rs`).
    let pressed = expired > 0 || wanted.iter().any(|w| w.close);
    // Falling behind: leases lost at their deadline while waiting for a
    // renewal, leases left out of this round though overdue, and leases
    // taken late (by more than half their renewal interval).
    let mut backlog = expired;
    // Overdue leases this round leaves waiting: the heartbeat is behind.
    let mut left_waiting = 0;
    if wanted.len() > cap {
        // Earliest deadline first, except for the leases whose deadline
        // comes before a round like the last one could answer: renewing
        // them would spend the round on locks it cannot save, and under
        // overload that would lose every lock in turn instead of the few.
        let hopeless = now + schedule.last_round;
        wanted.select_nth_unstable_by_key(cap, |w| (w.deadline < hopeless, w.deadline));
        for left in wanted.drain(cap..) {
            left_waiting += usize::from(left.due <= now);
            next = Some(next.map_or(left.due, |n| n.min(left.due)));
        }
    }
    wanted.sort_unstable_by_key(|w| w.deadline);
    let mut round = Vec::with_capacity(wanted.len());
    for w in wanted {
        let Some(entry) = schedule.leases.get(w.id) else {
            continue;
        };
        let ttl = entry.lease.ttl();
        backlog += usize::from(w.due + ttl / 6 <= now);
        // `extend` holds this lock only for one round trip; a lease
        // being extended joins the next round.
        match Due::take(w.id, &entry.lease, ttl) {
            Some(due) => {
                schedule.leases.start(w.id);
                round.push(due);
            }
            None => next = Some(next.map_or(w.due, |n| n.min(w.due))),
        }
    }
    report_backlog(&mut schedule, backlog + left_waiting, now);
    schedule.behind = left_waiting > 0;
    let leases = &mut schedule.leases;
    leases.load.set_pressed(pressed);
    leases.load.publish(&leases.admission);
    let next = next.map_or(now + IDLE, |due| due.max(now + Duration::from_millis(1)));
    (round, next)
}

/// A lease a round would take.
struct Wanted {
    id: Enrolment,
    due: Instant,
    deadline: Instant,
    /// Less than a quarter of its ttl is left before its deadline.
    close: bool,
}

/// The leases due within a quarter of their ttl (a twelfth while the
/// demand is close to the capacity: a lease renewed early is a renewal the
/// others lack), in due order: every overdue one (so that the caller can
/// choose by deadline), then the others until `cap` are taken; the due
/// time of the first lease left; and how many leases were past their
/// deadline (marked lost, and gone).
///
/// `early`: take leases up to the cap whenever they are due (the round that
/// measures the capacity).
fn gather(
    leases: &mut Slots,
    now: Instant,
    cap: usize,
    early: bool,
) -> (Vec<Wanted>, Option<Instant>, usize) {
    let ahead = if leases.load.stretched() { 12 } else { 4 };
    let mut wanted = Vec::new();
    let mut expired = Vec::new();
    let mut next: Option<Instant> = None;
    for &(due, id) in &leases.by_due {
        let Some(entry) = leases.get(id) else {
            continue;
        };
        let deadline = entry.lease.valid_until();
        if now >= deadline {
            // Past its deadline: lost, whatever a late renewal would say.
            entry.lease.mark_lost(entry.lease.deadline_reason());
            expired.push(id);
        } else if due <= now
            || (wanted.len() < cap && (early || due <= now + entry.lease.ttl() / ahead))
        {
            let close = deadline < now + entry.lease.ttl() / 4;
            wanted.push(Wanted {
                id,
                due,
                deadline,
                close,
            });
        } else {
            // In due order, so every lease after it is due later still
            // (one with a longer ttl might have been taken early: it waits
            // for its own due time instead).
            next = Some(due);
            break;
        }
    }
    let lapsed = expired.len();
    let cost: u64 = expired
        .iter()
        .filter_map(|&id| leases.get(id).map(|entry| entry.cost))
        .sum();
    for id in expired {
        leases.remove_current(id);
    }
    leases.load.lost(lapsed, cost);
    (wanted, next, lapsed)
}

/// Reports a heartbeat falling behind (see [`take_round`]), at most every
/// ten seconds, and the backlog gauge on every round.
fn report_backlog(schedule: &mut Schedule, backlog: usize, now: Instant) {
    let quiet = schedule
        .warned
        .is_some_and(|at| now.saturating_duration_since(at) < Duration::from_secs(10));
    if backlog > 0 && !quiet {
        schedule.warned = Some(now);
        observe::heartbeat_overloaded(backlog, schedule.leases.len(), schedule.cap.0);
    }
    observe::heartbeat_backlog(backlog);
}

async fn renew_round(heartbeat: &Heartbeat, backend: &Backend, round: Vec<Due>) {
    let sent = Instant::now();
    // Never wait on Redis past the last deadline in the round: by then an
    // answer saves none of its leases. (Waiting past the first one costs
    // nothing: a lease is lost at its deadline whoever looks, and a later
    // answer cannot revive it; giving up then would fail every other lease
    // of the round with it, which under load loses them all.)
    let last_deadline = round
        .iter()
        .map(|due| due.lease.valid_until())
        .max()
        .unwrap_or(sent);
    // Half of what is left: a call that times out (a connection that went
    // silent) leaves the other half for a retry on a new connection.
    let limit = heartbeat
        .op_timeout
        .min(last_deadline.saturating_duration_since(sent) / 2)
        .max(Duration::from_millis(1));
    let answers = renew_each(backend, &round, limit).await;
    let now = Instant::now();
    let mut schedule = heartbeat.lock();
    schedule.last_round = now.saturating_duration_since(sent);
    let taken = schedule.round_taken.take().unwrap_or(sent);
    let answered = answers
        .iter()
        .filter(|a| !matches!(a, RenewOutcome::Failed | RenewOutcome::Refused))
        .count();
    if answered < answers.len() {
        schedule.cap.shrink_to(answered);
    } else {
        schedule.cap.grow();
    }
    let (mut lapsed, mut lapsed_cost) = (0, 0);
    for (due, answer) in round.iter().zip(answers) {
        let lease = &due.lease;
        let keep = match answer {
            RenewOutcome::Renewed => {
                lease.renewed(sent, due.ttl);
                // Late while behind, and while the demand is close to the
                // capacity (see `admission.rs`).
                let late = schedule.behind || schedule.leases.load.stretched();
                let pace = late.then_some(schedule.last_round);
                Some(next_renewal(sent, lease.valid_until(), due.ttl, pace))
            }
            RenewOutcome::NotOurs => {
                lease.mark_lost(LossReason::TakenOver);
                None
            }
            RenewOutcome::Evicted => {
                lease.mark_lost(LossReason::ForceReleased);
                None
            }
            RenewOutcome::Refused => {
                lease.mark_lost(LossReason::Refused);
                None
            }
            RenewOutcome::Failed if now >= lease.valid_until() => {
                lease.mark_lost(lease.deadline_reason());
                lapsed += 1;
                lapsed_cost += admission::cost(due.ttl);
                None
            }
            RenewOutcome::Failed => Some(now + retry_gap(due.ttl)),
        };
        match keep {
            Some(next) => schedule.leases.finish(due.id, &due.lease, next),
            None => {
                schedule.leases.remove(due.id, &due.lease);
            }
        }
    }
    // The round's cost, taking and answers included, for the capacity:
    // what answered over the whole time (see `admission.rs`).
    let clean = answered == round.len() && !schedule.behind;
    let leases = &mut schedule.leases;
    leases.load.lost(lapsed, lapsed_cost);
    leases.load.round(round.len(), answered, taken.elapsed());
    if clean {
        // Every lease that was close to its deadline is renewed again:
        // the pressure it put on admission is over.
        leases.load.set_pressed(false);
    }
    leases.load.publish(&leases.admission);
}

/// Renews a round: the leases of one key each in batched script calls, the
/// others (several keys, shared holders, permits) each in its own calls, at
/// the same time. One answer per lease, in order.
async fn renew_each(backend: &Backend, round: &[Due], limit: Duration) -> Vec<RenewOutcome> {
    let one_key = |due: &Due| matches!(due.lease.held.scope, Scope::One);
    if round.iter().all(one_key) {
        return backend.renew_many(round, limit).await;
    }
    let (batched, apart): (Vec<usize>, Vec<usize>) =
        (0..round.len()).partition(|&i| one_key(&round[i]));
    let batch: Vec<&Due> = batched.iter().map(|&i| &round[i]).collect();
    let each = apart.iter().map(|&i| {
        let due = &round[i];
        async move {
            match release::expire(backend, &due.lease, due.ttl, Expiry::Renew, limit).await {
                Ok(true) => RenewOutcome::Renewed,
                Ok(false) => RenewOutcome::NotOurs,
                Err(e) => {
                    observe::renewal_failed(due.lease.key(), 1, &e);
                    RenewOutcome::failed(&e)
                }
            }
        }
    });
    let (batch_answers, each_answers) =
        tokio::join!(backend.renew_many(&batch, limit), join_all(each));
    let mut answers: Vec<Option<RenewOutcome>> = round.iter().map(|_| None).collect();
    for (i, answer) in batched.into_iter().zip(batch_answers) {
        answers[i] = Some(answer);
    }
    for (i, answer) in apart.into_iter().zip(each_answers) {
        answers[i] = Some(answer);
    }
    answers
        .into_iter()
        .map(|a| a.unwrap_or(RenewOutcome::Failed))
        .collect()
}

/// When a lease renewed at `sent` is due again: a third of its ttl later;
/// but while the heartbeat is behind, as late as still leaves a third of
/// the ttl, and three rounds like the last, before its deadline. Renewing
/// every lease three times a ttl is what the server cannot keep up with
/// past its capacity; renewing each about twice serves more of them, each
/// still with the time of several rounds to spare.
///
/// `pace` is how long the last round took, given only while behind.
fn next_renewal(
    sent: Instant,
    deadline: Instant,
    ttl: Duration,
    pace: Option<Duration>,
) -> Instant {
    let due = renewal_due(sent, ttl);
    let Some(round) = pace else {
        return due;
    };
    let spare = (round * 3).max(ttl / 3);
    deadline
        .checked_sub(spare)
        .map_or(due, |late| due.max(late))
}

/// How soon a failed renewal is tried again: often enough to get several
/// tries into what is left of the lease (two thirds of it, or one third
/// after a renewal while behind).
fn retry_gap(ttl: Duration) -> Duration {
    (ttl / 20).clamp(Duration::from_millis(5), Duration::from_millis(500))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renewals_come_later_only_while_behind_and_never_too_late() {
        let sent = Instant::now();
        let ttl = Duration::from_secs(3);
        let deadline = sent + ttl - crate::lease::drift(ttl);
        assert_eq!(next_renewal(sent, deadline, ttl, None), sent + ttl / 3);
        // Behind, with short rounds: a third of the ttl left to renew in.
        let late = next_renewal(sent, deadline, ttl, Some(Duration::from_millis(50)));
        assert_eq!(late, deadline - ttl / 3);
        assert!(late > sent + ttl / 3);
        // With long rounds: three of them left.
        let round = Duration::from_millis(600);
        assert_eq!(
            next_renewal(sent, deadline, ttl, Some(round)),
            deadline - round * 3
        );
        // Never sooner than a third of the ttl.
        let slow = Duration::from_secs(1);
        assert_eq!(
            next_renewal(sent, deadline, ttl, Some(slow)),
            sent + ttl / 3
        );
    }
}
