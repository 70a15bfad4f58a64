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
//! - A new lease is admitted while the leases, at the pace they get then,
//!   ask under [`HEADROOM`] of the capacity ([`leases_kept`]), and the
//!   heartbeat is not pressed: its last round found no lease with less
//!   than a quarter of its ttl left before its deadline (at the late pace
//!   a lease is taken with a third left), and no lease lost at its
//!   deadline. The late pace halves what a lease asks only while rounds
//!   are short: a lease is renewed with three rounds' time to spare, and a
//!   round renews its leases back to back, so where the client's link or
//!   CPU bounds the renewals (a round then takes as long as its leases
//!   need), long rounds bring the pace back to the nominal one, and the
//!   count admitted is the one whose renewals fit at the pace they get.
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
//!   half of [`UNMEASURED`] are admitted (half a script call's worth of
//!   leases at a 1 s ttl); there the heartbeat runs a round at once, ahead
//!   of the due times, to measure (see the heartbeat's `take_round`), and
//!   further acquisitions wait for its figure.
//! - **Leases lost all the same.** A machine can slow down after the leases
//!   were taken. A lease the heartbeat lost at its deadline leaves room
//!   that a waiting acquisition would take, to be lost in turn: instead
//!   the leases held at such a loss set a ceiling on the demand, half of
//!   what was held and at least what is still held, which clean rounds
//!   raise by a twentieth each.
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

/// The most leases one round of the heartbeat takes: 64 script calls,
/// some tens of milliseconds of server time. A round renews them back to
/// back, so it bounds how long a round can take.
pub(crate) const MAX_ROUND: usize = 64 * BATCH;

/// How much the ceiling set by losses ([`Load::lost`]) rises after each
/// clean round: it doubles in about fifteen.
const RECOVERY: f64 = 1.05;

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

/// How many leases of `ttl` a heartbeat renewing `capacity` leases a
/// second keeps within [`HEADROOM`] of it, each at the late pace.
///
/// A lease at the late pace is renewed when a third of its ttl, or three
/// rounds if that is more, is left before its deadline (the heartbeat's
/// `next_renewal`): about once every two thirds of its ttl while rounds are
/// short. A round renews its leases back to back, so it can take as long as
/// renewing all of them, up to [`MAX_ROUND`], and past a ninth of the ttl
/// the late pace gains less, down to the nominal one (a renewal every third
/// of the ttl). Where the client's link or CPU, not the server, bounds the
/// renewals, rounds grow with the leases: the figure is the largest count
/// whose renewals at the pace they then get fit.
pub(crate) fn leases_kept(capacity: f64, ttl: Duration) -> f64 {
    if capacity <= 0.0 || !capacity.is_finite() {
        return 0.0;
    }
    let t = ttl.as_secs_f64();
    let usable = t - crate::lease::drift(ttl).as_secs_f64();
    let budget = HEADROOM * capacity;
    // Renewals a second that `n` leases ask at the late pace.
    let interval = |n: f64| {
        let round = n.min(MAX_ROUND as f64) / capacity;
        (usable - (3.0 * round).max(t / 3.0)).max(t / 3.0)
    };
    // n / interval(n) grows with n: find where it reaches the budget.
    let (mut low, mut high) = (0.0_f64, budget * t);
    for _ in 0..40 {
        let mid = (low + high) / 2.0;
        if mid / interval(mid) <= budget {
            low = mid;
        } else {
            high = mid;
        }
    }
    // Exact where the pace does not depend on the count (short rounds, or
    // the nominal pace), rather than the bisection's last lower bound.
    budget * interval(low)
}

/// Whether two ttls are within a thirty-second of each other.
fn close(a: Duration, b: Duration) -> bool {
    a.abs_diff(b) <= a.max(b) / 32
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
    /// How many leases are enrolled, and the ttl of the last that joined:
    /// with the demand, what the late pace of a typical lease can be.
    leases: usize,
    last_ttl: Option<Duration>,
    /// Leases were lost at their deadlines: the demand may not pass this
    /// (thousandths of renewals a second) until clean rounds raise it.
    after_loss: Option<f64>,
    /// The last [`leases_kept`] figure: the capacity and ttl it was for,
    /// and its result. A lease joining or leaving asks for it again, and
    /// the ttl moves little then.
    kept: std::cell::Cell<Option<(f64, Duration, f64)>>,
}

impl Load {
    /// A lease of `ttl` asking `cost` joined.
    pub(crate) fn joined(&mut self, cost: u64, ttl: Duration) {
        self.demand = self.demand.saturating_add(cost);
        self.leases += 1;
        self.last_ttl = Some(ttl);
    }

    /// A lease asking `cost` left.
    pub(crate) fn left(&mut self, cost: u64) {
        self.demand = self.demand.saturating_sub(cost);
        self.leases = self.leases.saturating_sub(1);
        if self.leases == 0 {
            // Nothing held: nothing measured under a load remains true.
            self.after_loss = None;
        }
    }

    /// The heartbeat lost `count` leases at their deadlines (each asking
    /// ), having failed to renew them in time: it holds more than it
    /// can renew. The leases still held set a ceiling, so that what the
    /// lost ones leave is not taken again by waiting acquisitions (which
    /// would lose those in turn); clean rounds raise it again.
    /// `cost` is what they asked together.
    pub(crate) fn lost(&mut self, count: usize, cost: u64) {
        if count == 0 {
            return;
        }
        let before = self.demand as f64 + cost as f64;
        // Half of what was held at the loss, at most what is held now.
        let ceiling = (before / 2.0).max(self.demand as f64);
        self.after_loss = Some(self.after_loss.map_or(ceiling, |c| c.min(ceiling)));
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
        if leases > 0 && answered == leases {
            self.after_loss = self.after_loss.map(|c| c * RECOVERY);
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
        let ceiling = ceiling as f64 / MILLI;
        // In nominal renewals: the demand is counted at the nominal pace.
        let limit = match self.capacity() {
            Some(c) => self.nominal_limit(c.min(ceiling)),
            // Until the round that measures has answered, what leases ask
            // at which it is taken (see `wants_measure`).
            None => (UNMEASURED as f64 / 2.0).min(self.nominal_limit(ceiling)),
        };
        let limit = self.after_loss.map_or(limit, |c| limit.min(c));
        (limit.min(u64::MAX as f64) as u64).saturating_sub(self.demand)
    }

    /// The demand (thousandths of renewals a second, at the nominal pace)
    /// that leases like those held may ask of a heartbeat renewing
    /// `capacity` leases a second (see [`leases_kept`]).
    fn nominal_limit(&self, capacity: f64) -> f64 {
        if !capacity.is_finite() {
            return f64::MAX;
        }
        let ttl = match (self.leases, self.last_ttl) {
            // The mean cost of a held lease, as a ttl.
            (n, _) if n > 0 && self.demand > 0 => {
                Duration::from_micros(3_000_000_000 / (self.demand / n as u64).max(1))
            }
            (_, Some(ttl)) => ttl,
            (_, None) => Duration::from_secs(3),
        };
        let kept = match self.kept.get() {
            Some((c, t, kept)) if c == capacity && close(t, ttl) => kept,
            _ => {
                let kept = leases_kept(capacity, ttl);
                self.kept.set(Some((capacity, ttl, kept)));
                kept
            }
        };
        kept * cost(ttl) as f64
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

    #[cfg(any(test, feature = "testing"))]
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
    fn before_a_round_is_measured_half_a_batch_at_a_second_is_admitted() {
        let admission = Arc::new(Admission::default());
        let mut load = Load::default();
        let ttl = Duration::from_secs(3);
        let admitted = (0..1_000_000)
            .take_while(|_| {
                let yes = admits(&admission, ttl);
                if yes {
                    load.joined(cost(ttl), ttl);
                    load.publish(&admission);
                }
                yes
            })
            .count();
        // Half a batch at 1 s, three renewals a second each: the round
        // that measures is taken there, and more wait for its figure.
        assert_eq!(admitted, BATCH * 3 / 2);
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
                    load.joined(cost(ttl), ttl);
                }
                yes
            })
            .count();
        // 80 % of it: rounds of all of them would take 1.6 s, longer than
        // a ninth of the ttl, so they get the nominal pace, a renewal a
        // second each.
        assert_eq!(admitted, 8_000);
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
        for _ in 0..admitted {
            load.left(cost(ttl));
        }
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
    fn short_rounds_keep_leases_at_the_late_pace_long_ones_at_the_nominal() {
        // A server-bound heartbeat: rounds of MAX_ROUND take 16 ms, and a
        // lease of 30 s is renewed about every 20 s instead of every 10.
        let kept = leases_kept(1_000_000.0, Duration::from_secs(30));
        let late = 0.8 * 1_000_000.0 * (30.0 - 0.302 - 10.0);
        assert!((kept - late).abs() < late * 1e-6, "{kept} against {late}");
        // A client-bound one (a slow link, a starved CPU): a round of all
        // 424 leases takes 0.8 s, three of them more than a ttl of 3 s
        // leaves, so each is renewed every second.
        let kept = leases_kept(530.0, Duration::from_secs(3));
        assert!((kept - 424.0).abs() < 1e-6, "{kept}");
        assert_eq!(leases_kept(0.0, Duration::from_secs(3)), 0.0);
    }

    #[test]
    fn what_lost_leases_leave_is_not_taken_again_until_rounds_are_clean() {
        let admission = Arc::new(Admission::default());
        let mut load = Load::default();
        load.round(1_000, 1_000, Duration::from_secs(1));
        let ttl = Duration::from_secs(3);
        for _ in 0..600 {
            load.joined(cost(ttl), ttl);
        }
        load.publish(&admission);
        assert!(admits(&admission, ttl), "room for 800");
        // 400 lost at their deadlines: 200 are held, and the ceiling is
        // half of the 600 held at the loss.
        for _ in 0..400 {
            load.left(cost(ttl));
        }
        load.lost(400, cost(ttl) * 400);
        load.publish(&admission);
        let again: Vec<Admitted> = (0..1_000).filter_map(|_| admission.admit(ttl)).collect();
        assert_eq!(again.len(), 100, "up to the ceiling of 300");
        drop(again);
        // A round with a failed call raises nothing; clean ones do.
        load.round(200, 100, Duration::from_millis(300));
        load.publish(&admission);
        let again: Vec<Admitted> = (0..1_000).filter_map(|_| admission.admit(ttl)).collect();
        assert_eq!(again.len(), 100);
        drop(again);
        for _ in 0..30 {
            load.round(200, 200, Duration::from_millis(200));
        }
        load.publish(&admission);
        let again: Vec<Admitted> = (0..1_000).filter_map(|_| admission.admit(ttl)).collect();
        assert!(again.len() > 500, "{}", again.len());
    }

    #[test]
    fn acquisitions_in_flight_reserve_what_they_take() {
        let admission = Arc::new(Admission::default());
        let mut load = Load::default();
        load.round(1_000, 1_000, Duration::from_secs(1));
        let ttl = Duration::from_secs(3);
        load.joined(cost(ttl), ttl);
        load.publish(&admission);
        // 800 leases of 3 s (a renewal a second each, rounds of them all
        // taking most of a second): 799 more, however many look at once
        // before any joins.
        let held: Vec<Admitted> = (0..10_000).filter_map(|_| admission.admit(ttl)).collect();
        assert_eq!(held.len(), 799);
        // Those that win join the demand; the reservation hands over.
        for admitted in held {
            load.joined(cost(ttl), ttl);
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
        // Ten renewals a second keep 8 leases of 3 s.
        for _ in 0..8 {
            assert!(admits(&admission, ttl));
            load.joined(cost(ttl), ttl);
            load.publish(&admission);
        }
        assert!(!admits(&admission, ttl));
        let err = admission.refusal(ttl);
        assert_eq!(err.kind(), ErrorKind::AtCapacity);
        assert!(err.to_string().contains("longer ttl"), "{err}");
    }
}
