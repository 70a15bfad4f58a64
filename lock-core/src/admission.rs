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
//!   moment it joins, before its first renewal is due, so a burst of
//!   acquisitions cannot overshoot by more than the acquisitions in flight.
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
//! Only rounds whose calls all answered count: a server that does not
//! answer at all (down, cut off) is not a capacity, and an acquisition
//! sent to it fails as `Unavailable`, which says what is wrong. A client
//! that holds no renewed lease admits one whatever the figures say, so
//! that nothing measured long ago keeps it from starting again.
//!
//! The margin is for what the figures do not see: leases gathered early
//! into shared rounds, a server slowing down, retries. Before the first
//! round there is no figure and every lease is admitted.
//!
//! The acquisition path reads one atomic ([`Admission::spare`]): what the
//! heartbeat could still take on, republished on every change of demand
//! or capacity. Acquisitions in flight at once may all read the same
//! spare; the headroom covers them.

use crate::error::{ErrorKind, LockError};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
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

/// What a new acquisition reads, without a lock.
pub(crate) struct Admission {
    /// How many more renewals a second (in thousandths) the heartbeat can
    /// take on, at the nominal pace: `u64::MAX` while nothing is
    /// measured, 0 while pressed.
    spare: AtomicU64,
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
            spare: AtomicU64::new(u64::MAX),
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

impl Admission {
    /// Whether a new lease of `ttl` may be taken now: one atomic load.
    pub(crate) fn admits(&self, ttl: Duration) -> bool {
        self.spare.load(Ordering::Relaxed) >= cost(ttl)
    }

    /// Waits until a new lease of `ttl` may be taken, at most until
    /// `deadline`, waking at `check_at` on the way when it falls before
    /// (the moment an acquisition records its wait, in `acquire/`);
    /// `Err` with an [`ErrorKind::AtCapacity`] error (no key yet) when the
    /// deadline comes first.
    pub(crate) async fn wait_for(
        &self,
        ttl: Duration,
        deadline: Instant,
        check_at: Instant,
    ) -> Result<(), LockError> {
        loop {
            if self.admits(ttl) {
                return Ok(());
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
            // Looked at again once registered, so a lease that left in
            // between is not missed.
            if !self.admits(ttl) {
                let _ = tokio::time::timeout_at(wake, freed).await;
            }
            self.waiting.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// The error of an acquisition refused for capacity.
    fn refusal(&self, ttl: Duration) -> LockError {
        let spare = self.spare.load(Ordering::Relaxed);
        let renewals = cost(ttl) as f64 / MILLI;
        let state = if spare == 0 {
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
    /// Some call of the last round did not answer.
    unanswered: bool,
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

    /// A round renewed (or tried) `leases` leases in `busy`; `answered`:
    /// every call of it answered.
    pub(crate) fn round(&mut self, leases: usize, busy: Duration, answered: bool) {
        self.unanswered = !answered;
        if answered {
            self.renewed = self.renewed * DECAY + leases as f64;
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

    /// What the heartbeat can still take on (thousandths of renewals a
    /// second), given a ceiling on its capacity.
    fn spare(&self, ceiling: u64) -> u64 {
        if self.demand == 0 {
            return u64::MAX;
        }
        if self.pressed && !self.unanswered {
            return 0;
        }
        let measured = self
            .capacity()
            .map_or(u64::MAX, |c| (c * MILLI).min(u64::MAX as f64) as u64);
        // In nominal renewals: the demand is counted at the nominal pace.
        let limit = (measured.min(ceiling) as f64 * HEADROOM * STRETCH).min(u64::MAX as f64);
        (limit as u64).saturating_sub(self.demand)
    }

    /// Makes the figures visible to acquisitions; wakes those waiting when
    /// the spare grew.
    pub(crate) fn publish(&self, admission: &Admission) {
        let spare = self.spare(admission.ceiling.load(Ordering::Relaxed));
        let before = admission.spare.swap(spare, Ordering::Relaxed);
        if spare > before && admission.waiting.load(Ordering::Acquire) > 0 {
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

    #[test]
    fn a_lease_costs_three_renewals_a_ttl() {
        assert_eq!(cost(Duration::from_secs(3)), 1000);
        assert_eq!(cost(Duration::from_secs(30)), 100);
        assert_eq!(cost(Duration::from_millis(1)), 3_000_000);
    }

    #[test]
    fn everything_is_admitted_until_a_round_is_measured() {
        let admission = Admission::default();
        let mut load = Load::default();
        load.joined(cost(Duration::from_secs(3)) * 1_000_000);
        load.publish(&admission);
        assert!(admission.admits(Duration::from_secs(3)));
    }

    #[test]
    fn demand_is_held_under_the_headroom_of_the_measured_capacity() {
        let admission = Admission::default();
        let mut load = Load::default();
        // 10,000 renewals in one second of busy time.
        load.round(10_000, Duration::from_secs(1), true);
        // A round whose calls went unanswered measures nothing.
        load.round(10, Duration::from_secs(5), false);
        let ttl = Duration::from_secs(3);
        let admitted = (0..40_000)
            .take_while(|_| {
                load.publish(&admission);
                let yes = admission.admits(ttl);
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
        assert!(admission.admits(ttl));
        // Pressed after a round that answered: nothing new, whatever the
        // figures say.
        load.round(10_000, Duration::from_secs(1), true);
        load.set_pressed(true);
        load.publish(&admission);
        assert!(!admission.admits(ttl));
        // Unless the server does not answer: that is no capacity.
        load.round(10, Duration::from_secs(5), false);
        load.publish(&admission);
        assert!(admission.admits(ttl));
        // With no lease left, one is admitted whatever was measured.
        load.round(10_000, Duration::from_secs(1), true);
        load.left(cost(ttl) * 16_000);
        load.publish(&admission);
        assert!(admission.admits(ttl));
    }

    #[test]
    fn a_ceiling_bounds_the_capacity_before_anything_is_measured() {
        let admission = Admission::default();
        let mut load = Load::default();
        load.set_ceiling(&admission, 10.0);
        let ttl = Duration::from_secs(3);
        for _ in 0..16 {
            assert!(admission.admits(ttl));
            load.joined(cost(ttl));
            load.publish(&admission);
        }
        assert!(!admission.admits(ttl));
        let err = admission.refusal(ttl);
        assert_eq!(err.kind(), ErrorKind::AtCapacity);
        assert!(err.to_string().contains("longer ttl"), "{err}");
    }
}
