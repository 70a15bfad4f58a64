//! Admission control: a client takes a new lease only while its heartbeat
//! can renew it.
//!
//! One heartbeat renews every lease a client holds, and it has a capacity:
//! so many renewals a second, set by the server and by the client's own
//! CPU. Past it, renewals come late and leases are lost at their
//! deadlines, and they are leases whose work is running. A held lease is
//! worth more than a new one, so past capacity the client refuses the new
//! one, before any command is sent: the acquisition waits within its wait
//! for capacity to come back (a lease released, a faster server), then
//! fails with [`ErrorKind::AtCapacity`].
//!
//! The figures, kept by the heartbeat under its lock ([`Load`]):
//!
//! - **demand**: what the enrolled leases ask, in renewals a second, each
//!   lease three per ttl (the heartbeat renews a third of the ttl after
//!   the last renewal). Known exactly, and at once: a lease counts from the
//!   moment it joins, before its first renewal is due.
//! - **capacity**: leases renewed per second of the heartbeat's busy time
//!   (from taking a round to handling its answers; the time it sleeps
//!   between rounds does not count), averaged over recent rounds. Small
//!   rounds carry a round trip's fixed cost, so while the load is light
//!   the figure is below what the heartbeat could do; it rises with the
//!   load, and it reaches the true figure exactly where it matters, when
//!   rounds run back to back. A slow server, or a client whose CPU is
//!   busy, lowers it at once.
//!
//! Two thresholds, both on the measured capacity:
//!
//! - Once the demand passes [`STRETCH_AT`] of it, the heartbeat renews
//!   each lease as late as still leaves a third of its ttl before its
//!   deadline, not a third of its ttl after the last renewal (see the
//!   heartbeat's `next_renewal`): about three renewals every two ttls
//!   instead of three a ttl, so the same capacity keeps twice the leases,
//!   each still with a third of its ttl for retries.
//! - A new lease is admitted while the demand at that late pace (half the
//!   nominal one, [`STRETCH`]) stays under [`HEADROOM`] of the capacity,
//!   and the heartbeat is not pressed: its last round found no lease with
//!   less than a quarter of its ttl left before its deadline (at the late
//!   pace a lease is taken with a third left), and no lease lost at its
//!   deadline.
//!
//! Whatever the machine does, every way in is bounded:
//!
//! - **Rounds with unanswered calls.** A call that timed out took the
//!   heartbeat's time and renewed nothing: such a round counts what did
//!   answer over the whole time it took, so a server or a CPU too slow to
//!   answer in time lowers the figure instead of hiding from it. A round
//!   in which nothing answered at all (the server down, cut off) is no
//!   capacity and is left out of the figure, which would otherwise stay
//!   low long after the server came back. Pressure counts after either
//!   (a starved CPU makes whole rounds time out too): a refusal while
//!   nothing answers says so in its `AtCapacity` message, and nothing was
//!   sent. A client whose leases were all lost (the server down for longer
//!   than a ttl) admits again, and its acquisitions then fail as
//!   `Unavailable`.
//! - **No figure yet.** Before a round was measured, leases asking up to
//!   [`UNMEASURED`] are admitted (a script call's worth of leases at a 1 s
//!   ttl); once they ask half of it, the heartbeat runs a round at once,
//!   ahead of the due times, to measure (see the heartbeat's
//!   `take_round`).
//! - **Acquisitions in flight, and waiters woken together.** Admission is
//!   a reservation ([`Admitted`]), taken with one atomic update against the
//!   published spare and held until the lease has joined the heartbeat
//!   (or the attempt failed): a thousand acquisitions that look at once
//!   take what fits, not a thousand times the same spare.
//! - **An idle client.** A client that holds no renewed lease admits one,
//!   whatever the figures say, so that nothing measured long ago keeps it
//!   from starting again; only one, until it has joined.
//!
//! The margin is for what the figures do not see: leases gathered early
//! into shared rounds, a server slowing down after the leases were taken,
//! retries.

use crate::backend::BATCH;
use crate::error::{ErrorKind, LockError};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

/// The share of the measured capacity that leases may ask for, at the
/// late pace.
pub(crate) const HEADROOM: f64 = 0.8;

/// How many times fewer renewals a lease asks at the late pace than at the
/// nominal one (about a renewal every two thirds of its ttl instead of
/// every third).
const STRETCH: f64 = 2.0;

/// The share of the capacity past which the heartbeat renews at the late
/// pace.
const STRETCH_AT: f64 = 0.7;

/// How much of the last round's figures the average keeps per round: the
/// capacity follows about the last twenty rounds.
const DECAY: f64 = 0.95;

/// How often an acquisition waiting for capacity looks again when nothing
/// wakes it: the capacity can grow without a lease leaving (the server
/// answers faster again).
const RECHECK: Duration = Duration::from_millis(100);

/// Renewals a second are kept in thousandths, as integers.
const MILLI: f64 = 1000.0;

/// What leases may ask before any round was measured (thousandths of
/// renewals a second): one script call's worth of leases ([`BATCH`]) at a
/// 1 s ttl, three renewals a second each; ten times as many at 10 s.
pub(crate) const UNMEASURED: u64 = BATCH as u64 * 3_000;

/// What a new acquisition reads, without a lock.
pub(crate) struct Admission {
    /// How many more renewals a second (in thousandths) the heartbeat can
    /// take on, at the nominal pace: 0 while pressed.
    spare: AtomicU64,
    /// What the admitted leases not yet enrolled ask: their reservations
    /// ([`Admitted`]), counted against `spare`.
    reserved: AtomicU64,
    /// No renewed lease is enrolled: one is admitted whatever `spare` says.
    idle: AtomicBool,
    /// Nothing answered in the heartbeat's last round.
    silent: AtomicBool,
    /// A ceiling on the capacity (thousandths of renewals a second), for
    /// tests that want a small one; `u64::MAX` when unset.
    ceiling: AtomicU64,
    /// Acquisitions waiting for capacity: a lease leaving wakes them only
    /// when there are some.
    waiting: AtomicUsize,
    freed: Notify,
}

impl Default for Admission {
    fn default() -> Admission {
        Admission {
            spare: AtomicU64::new(UNMEASURED),
            reserved: AtomicU64::new(0),
            idle: AtomicBool::new(true),
            silent: AtomicBool::new(false),
            ceiling: AtomicU64::new(u64::MAX),
            waiting: AtomicUsize::new(0),
            freed: Notify::new(),
        }
    }
}

/// What a lease of `ttl` asks of the heartbeat: three renewals a ttl, in
/// thousandths of renewals a second.
pub(crate) fn cost(ttl: Duration) -> u64 {
    // In microseconds, a 64-bit division: this runs before every attempt.
    let micros = u64::try_from(ttl.as_micros()).unwrap_or(u64::MAX).max(1);
    (3_000_000_000 / micros).max(1)
}

/// A new lease's admission: its cost reserved against the heartbeat's
/// spare until dropped. The acquisition keeps it until its lease has
/// joined the heartbeat (whose demand then counts it), or drops it when
/// the attempt did not win.
pub(crate) struct Admitted {
    admission: Arc<Admission>,
    cost: u64,
    /// Whether dropping it gives room back that a waiter may take (an
    /// attempt that did not win), rather than handing it to the demand.
    gives_back: bool,
}

impl Admitted {
    /// The attempt won: the lease joins the heartbeat, whose demand takes
    /// over the cost (for a moment it is counted twice, never zero times).
    pub(crate) fn won(mut self) -> Admitted {
        self.gives_back = false;
        self
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let admission = &self.admission;
        admission.reserved.fetch_sub(self.cost, Ordering::AcqRel);
        if self.gives_back && admission.waiting.load(Ordering::Acquire) > 0 {
            admission.freed.notify_waiters();
        }
    }
}

impl Admission {
    /// Reserves a new lease of `ttl`, if it fits now: one atomic update.
    pub(crate) fn admit(self: &Arc<Self>, ttl: Duration) -> Option<Admitted> {
        let cost = cost(ttl);
        let spare = self.spare.load(Ordering::Acquire);
        let idle = self.idle.load(Ordering::Acquire);
        self.reserved
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |reserved| {
                let total = reserved.saturating_add(cost);
                (total <= spare || (idle && reserved == 0)).then_some(total)
            })
            .ok()?;
        Some(Admitted {
            admission: self.clone(),
            cost,
            gives_back: true,
        })
    }

    /// Waits until a new lease of `ttl` is admitted, at most until
    /// `deadline`, waking at `check_at` on the way when it falls before
    /// (the moment an acquisition records its wait, in `acquire/`);
    /// `Err` with an [`ErrorKind::AtCapacity`] error (no key yet) when the
    /// deadline comes first.
    pub(crate) async fn wait_for(
        self: &Arc<Self>,
        ttl: Duration,
        deadline: Instant,
        check_at: Instant,
    ) -> Result<Admitted, LockError> {
        loop {
            if let Some(admitted) = self.admit(ttl) {
                return Ok(admitted);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(self.refusal(ttl));
            }
            let mut wake = (now + RECHECK).min(deadline);
            if check_at > now {
                wake = wake.min(check_at);
            }
            let freed = self.freed.notified();
            let mut freed = std::pin::pin!(freed);
            freed.as_mut().enable();
            self.waiting.fetch_add(1, Ordering::AcqRel);
            // Tried again once registered, so room that came in between
            // is not missed.
            let admitted = self.admit(ttl);
            if admitted.is_none() {
                let _ = tokio::time::timeout_at(wake, freed).await;
            }
            self.waiting.fetch_sub(1, Ordering::AcqRel);
            if let Some(admitted) = admitted {
                return Ok(admitted);
            }
        }
    }

    /// The error of an acquisition refused for capacity.
    fn refusal(&self, ttl: Duration) -> LockError {
        let spare = self
            .spare
            .load(Ordering::Acquire)
            .saturating_sub(self.reserved.load(Ordering::Acquire));
        let renewals = cost(ttl) as f64 / MILLI;
        let state = if self.silent.load(Ordering::Acquire) {
            "its last round of renewals got no answer in time (the server is down, cut \
             off, or this machine or the server is too busy to answer within the operation \
             timeout)"
                .to_owned()
        } else if spare == 0 {
            "its renewals already run close to their deadlines or use all it can renew".to_owned()
        } else {
            format!(
                "it can take on {:.1} more renewals a second and a lease of this ttl needs \
                 {renewals:.1}",
                spare as f64 / MILLI
            )
        };
        LockError::new(ErrorKind::AtCapacity).with_message(format!(
            "this client renews every lock it holds, and {state}; a new lease would make \
             renewal fall behind and cost locks already held, so none was taken. Use a \
             longer ttl (a lease is renewed three times a ttl), hold fewer locks at once, \
             or spread the locks over another client (another process, or another \
             server)"
        ))
    }
}

/// The heartbeat's figures for admission, kept under its lock.
#[derive(Default)]
pub(crate) struct Load {
    /// What the enrolled leases ask (thousandths of renewals a second).
    demand: u64,
    /// Leases renewed and seconds busy, decayed by [`DECAY`] each round.
    renewed: f64,
    busy: f64,
    /// The last round found a lease close to its deadline (see the
    /// module's doc).
    pressed: bool,
    /// Nothing answered in the last round.
    silent: bool,
    /// A round was taken early to measure the capacity (see
    /// [`wants_measure`](Self::wants_measure)).
    measuring: bool,
}

impl Load {
    /// A lease asking `cost` joined.
    pub(crate) fn joined(&mut self, cost: u64) {
        self.demand = self.demand.saturating_add(cost);
    }

    /// A lease asking `cost` left.
    pub(crate) fn left(&mut self, cost: u64) {
        self.demand = self.demand.saturating_sub(cost);
    }

    /// A round tried to renew `leases` leases in `busy`, and `answered` of
    /// them were answered: what answered counts over the whole time; a
    /// round in which nothing answered is left out of the figure.
    pub(crate) fn round(&mut self, leases: usize, answered: usize, busy: Duration) {
        self.silent = leases > 0 && answered == 0;
        if !self.silent {
            self.renewed = self.renewed * DECAY + answered as f64;
            self.busy = self.busy * DECAY + busy.as_secs_f64();
        }
    }

    pub(crate) fn set_pressed(&mut self, pressed: bool) {
        self.pressed = pressed;
    }

    /// Whether leases should be renewed at the late pace: the demand
    /// passed [`STRETCH_AT`] of the capacity.
    pub(crate) fn stretched(&self) -> bool {
        self.capacity()
            .is_some_and(|c| self.demand as f64 > c * MILLI * STRETCH_AT)
    }

    /// The measured capacity in renewals a second, once a round was timed.
    pub(crate) fn capacity(&self) -> Option<f64> {
        (self.busy > 0.0).then(|| self.renewed / self.busy)
    }

    /// Whether the heartbeat should take a round now, ahead of the due
    /// times, to measure its capacity: nothing is measured yet, and the
    /// leases ask half of what is admitted unmeasured. Once only: a round
    /// that measured nothing (no answer) leaves it to the due rounds.
    pub(crate) fn wants_measure(&self) -> bool {
        !self.measuring && self.capacity().is_none() && self.demand >= UNMEASURED / 2
    }

    /// The round that measures was taken.
    pub(crate) fn measured_early(&mut self) {
        self.measuring = true;
    }

    /// What the heartbeat can still take on (thousandths of renewals a
    /// second), given a ceiling on its capacity.
    fn spare(&self, ceiling: u64) -> u64 {
        if self.pressed {
            return 0;
        }
        let ceiling = ceiling as f64 * HEADROOM * STRETCH;
        // In nominal renewals: the demand is counted at the nominal pace.
        let limit = match self.capacity() {
            Some(c) => (c * MILLI * HEADROOM * STRETCH).min(ceiling),
            None => (UNMEASURED as f64).min(ceiling),
        };
        (limit.min(u64::MAX as f64) as u64).saturating_sub(self.demand)
    }

    /// Makes the figures visible to acquisitions; wakes those waiting when
    /// the spare grew.
    pub(crate) fn publish(&self, admission: &Admission) {
        let spare = self.spare(admission.ceiling.load(Ordering::Relaxed));
        admission.idle.store(self.demand == 0, Ordering::Release);
        admission.silent.store(self.silent, Ordering::Release);
        let before = admission.spare.swap(spare, Ordering::AcqRel);
        if (spare > before || self.demand == 0) && admission.waiting.load(Ordering::Acquire) > 0 {
            admission.freed.notify_waiters();
        }
    }

    /// Caps the capacity at `renewals_per_second` (tests).
    pub(crate) fn set_ceiling(&self, admission: &Admission, renewals_per_second: f64) {
        let ceiling = (renewals_per_second * MILLI).clamp(0.0, u64::MAX as f64) as u64;
        admission.ceiling.store(ceiling, Ordering::Relaxed);
        self.publish(admission);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admits(admission: &Arc<Admission>, ttl: Duration) -> bool {
        admission.admit(ttl).is_some()
    }

    #[test]
    fn a_lease_costs_three_renewals_a_ttl() {
        assert_eq!(cost(Duration::from_secs(3)), 1000);
        assert_eq!(cost(Duration::from_secs(30)), 100);
        assert_eq!(cost(Duration::from_millis(1)), 3_000_000);
    }

    #[test]
    fn before_a_round_is_measured_a_batch_at_a_second_is_admitted() {
        let admission = Arc::new(Admission::default());
        let mut load = Load::default();
        let ttl = Duration::from_secs(3);
        let admitted = (0..1_000_000)
            .take_while(|_| {
                let yes = admits(&admission, ttl);
                if yes {
                    load.joined(cost(ttl));
                    load.publish(&admission);
                }
                yes
            })
            .count();
        assert_eq!(admitted, BATCH * 3);
        assert!(load.wants_measure());
        load.measured_early();
        assert!(!load.wants_measure());
    }

    #[test]
    fn demand_is_held_under_the_headroom_of_the_measured_capacity() {
        let admission = Arc::new(Admission::default());
        let mut load = Load::default();
        // 10,000 renewals in one second of busy time.
        load.round(10_000, 10_000, Duration::from_secs(1));
        // A round in which nothing answered measures nothing.
        load.round(10, 0, Duration::from_secs(5));
        let ttl = Duration::from_secs(3);
        let admitted = (0..40_000)
            .take_while(|_| {
                load.publish(&admission);
                let yes = admits(&admission, ttl);
                if yes {
                    load.joined(cost(ttl));
                }
                yes
            })
            .count();
        // 80 % of it at the late pace: half a renewal a second each.
        assert_eq!(admitted, 16_000);
        assert!(load.stretched());
        // One leaves: one more fits.
        load.left(cost(ttl));
        load.publish(&admission);
        assert!(admits(&admission, ttl));
        // Pressed: nothing new, whatever the figures say, also when
        // nothing answered (then the refusal says so).
        load.round(10_000, 10_000, Duration::from_secs(1));
        load.set_pressed(true);
        load.publish(&admission);
        assert!(!admits(&admission, ttl));
        assert_eq!(admission.refusal(ttl).kind(), ErrorKind::AtCapacity);
        load.round(10, 0, Duration::from_secs(5));
        load.publish(&admission);
        assert!(!admits(&admission, ttl));
        let err = admission.refusal(ttl);
        assert_eq!(err.kind(), ErrorKind::AtCapacity);
        assert!(err.to_string().contains("no answer"), "{err}");
        // With no lease left, one is admitted whatever was measured, and
        // only one until it joined.
        load.left(cost(ttl) * 16_000);
        load.publish(&admission);
        let first = admission.admit(ttl);
        assert!(first.is_some(), "an idle client admits one");
        assert!(!admits(&admission, ttl));
        drop(first);
        assert!(admits(&admission, ttl));
    }

    #[test]
    fn a_round_with_unanswered_calls_lowers_the_capacity() {
        let mut load = Load::default();
        load.round(10_000, 10_000, Duration::from_secs(1));
        let before = load.capacity().unwrap_or(0.0);
        // Half the calls timed out after a long wait: what answered, over
        // the whole time.
        for _ in 0..20 {
            load.round(10_000, 5_000, Duration::from_secs(2));
        }
        let after = load.capacity().unwrap_or(f64::MAX);
        assert!(after < before / 2.0, "{before} then {after}");
    }

    #[test]
    fn acquisitions_in_flight_reserve_what_they_take() {
        let admission = Arc::new(Admission::default());
        let mut load = Load::default();
        load.round(1_000, 1_000, Duration::from_secs(1));
        load.joined(1);
        load.publish(&admission);
        let ttl = Duration::from_secs(3);
        // 1,600 renewals a second: 1,599 more leases, however many look
        // at once before any joins.
        let held: Vec<Admitted> = (0..10_000).filter_map(|_| admission.admit(ttl)).collect();
        assert_eq!(held.len(), 1_599);
        // Those that win join the demand; the reservation hands over.
        for admitted in held {
            load.joined(cost(ttl));
            load.publish(&admission);
            drop(admitted.won());
        }
        assert!(!admits(&admission, ttl));
    }

    #[test]
    fn a_ceiling_bounds_the_capacity_before_anything_is_measured() {
        let admission = Arc::new(Admission::default());
        let mut load = Load::default();
        load.set_ceiling(&admission, 10.0);
        let ttl = Duration::from_secs(3);
        for _ in 0..16 {
            assert!(admits(&admission, ttl));
            load.joined(cost(ttl));
            load.publish(&admission);
        }
        assert!(!admits(&admission, ttl));
        let err = admission.refusal(ttl);
        assert_eq!(err.kind(), ErrorKind::AtCapacity);
        assert!(err.to_string().contains("longer ttl"), "{err}");
    }
}
