//! What the crate tells operators: `tracing` spans and events, and, with the
//! `metrics` feature, counters and histograms.
//!
//! | signal | where |
//! | --- | --- |
//! | span `lock` (DEBUG): `key`, `attempts`, `waited_ms`, `outcome` | around each acquisition |
//! | DEBUG `lock busy, retrying`: `key`, `attempt`, `delay_ms` | each retry |
//! | WARN `lock renewal failed`: `key` (the first of the round), `leases`, `error` (with its cause) | a renewal round that could not reach Redis |
//! | WARN `lock lost`: `key`, `reason` | a held lock found lost |
//! | DEBUG `lock released`: `key`, `held_ms`, `owned` | each release |
//! | DEBUG `lock re-entered`: `key` | a nested acquisition of a lock the task holds |
//! | DEBUG `lock wait not recorded`: `key`, `error` | a wait record that could not be written (see `waits.rs`) |
//! | WARN `lock wait would deadlock, giving up`: `key`, `cycle` | an acquisition chosen as the victim of a cycle of waits |
//! | WARN `lock force-released; ...`: `key`, `holder`, `kind` | [`LockClient::force_release`](crate::LockClient::force_release) broke a lock |
//!
//! Keys are logged as the caller named them; tokens never are. With the
//! `metrics` feature: counters `lock_core_acquired_total`,
//! `lock_core_contended_total`, `lock_core_unavailable_total`,
//! `lock_core_lost_total`, `lock_core_released_total`,
//! `lock_core_deadlocks_total` (acquisitions that gave up as a cycle's victim),
//! `lock_core_at_capacity_total` (acquisitions refused because the client's
//! heartbeat renews all it can: `ErrorKind::AtCapacity`), and histograms
//! `lock_core_wait_seconds` (acquisitions, successful or not) and
//! `lock_core_hold_seconds` (from acquisition to release), and gauges
//! `lock_core_held` (locks held through a guard of this process: up at
//! acquisition, down at release, drop or loss, whichever comes first) and
//! `lock_core_waiting` (acquisitions under way: waiting for the lock or for
//! Redis's answer; down when they end, however they end, a dropped future
//! included). The histograms and gauges carry one label, `template`: the
//! attribute's key template as written (`order:{order_id}`; for
//! `keys = [..]`, the templates joined by `,`), or what
//! [`LockOptions::label`](crate::LockOptions::label) gave; `unlabelled`
//! ([`LockOptions::UNLABELLED`](crate::LockOptions::UNLABELLED)) for a
//! guard-API lock without one. No metric carries the
//! rendered key: keys like `order:42` would make one series per order. A
//! re-entry counts in none of them.

use crate::error::{ErrorKind, LockError};
#[cfg(feature = "metrics")]
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;
use tokio::time::Instant;

/// The `template` label of a guard-API lock taken without
/// [`LockOptions::label`](crate::LockOptions::label).
pub(crate) const UNLABELLED: &str = "unlabelled";

/// How an acquisition ended, for the span and the counters.
pub(crate) fn acquisition(
    span: &tracing::Span,
    result: Result<(), &LockError>,
    attempts: u32,
    started: Instant,
    label: &'static str,
) {
    // The clock is read only when something will use the figure.
    if span.is_disabled() && !cfg!(feature = "metrics") {
        return;
    }
    let waited = started.elapsed();
    let outcome = match result {
        Ok(()) => "acquired",
        Err(e) => match e.kind() {
            ErrorKind::Contended => "contended",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::InvalidKey | ErrorKind::Config => "invalid",
            ErrorKind::WouldDeadlock => "deadlock",
            ErrorKind::AtCapacity => "at_capacity",
            _ => "failed",
        },
    };
    span.record("attempts", attempts);
    span.record("waited_ms", millis(waited));
    span.record("outcome", outcome);
    #[cfg(not(feature = "metrics"))]
    let _ = label;
    #[cfg(feature = "metrics")]
    {
        let counter = match outcome {
            "acquired" => Some("lock_core_acquired_total"),
            "contended" => Some("lock_core_contended_total"),
            "unavailable" => Some("lock_core_unavailable_total"),
            "deadlock" => Some("lock_core_deadlocks_total"),
            "at_capacity" => Some("lock_core_at_capacity_total"),
            _ => None,
        };
        if let Some(counter) = counter {
            metrics::counter!(counter).increment(1);
        }
        metrics::histogram!("lock_core_wait_seconds", "template" => label)
            .record(waited.as_secs_f64());
    }
}

/// A wait record that could not be written: the wait goes on, unseen by
/// operators and by other waiters' walks until a later refresh.
pub(crate) fn wait_record_failed(key: &str, error: &LockError) {
    tracing::debug!(key, error = %error.chain(), "lock wait not recorded");
}

/// An acquisition gives up as the victim of a cycle of waits.
pub(crate) fn deadlock(key: &str, cycle: &str) {
    tracing::warn!(key, cycle, "lock wait would deadlock, giving up");
}

/// A busy answer; another attempt follows after `delay`.
pub(crate) fn retry(key: &str, attempt: u32, delay: Duration) {
    tracing::debug!(
        key,
        attempt,
        delay_ms = millis(delay),
        "lock busy, retrying"
    );
}

/// A renewal round of `leases` leases (`key` the first of them) that could
/// not reach Redis; it is tried again until each lease's validity runs out.
pub(crate) fn renewal_failed(key: &str, leases: usize, error: &LockError) {
    tracing::warn!(key, leases, error = %error.chain(), "lock renewal failed");
}

/// The heartbeat's round left `backlog` leases overdue: more locks are held
/// than the server renews in time, and those it cannot serve will be lost.
pub(crate) fn heartbeat_overloaded(backlog: usize, held: usize, round_cap: usize) {
    tracing::warn!(
        backlog,
        held,
        round_cap,
        "lock renewal is falling behind: the server cannot renew every held lock in time; \
         the most urgent are renewed first and the rest may be lost"
    );
}

/// A lease or a turn handed to a waiter of this process that did not take
/// it in time (its future kept but not polled, its thread blocked) went
/// to the next waiter or back to Redis.
pub(crate) fn offer_withdrawn(key: &str) {
    tracing::debug!(
        key,
        "a waiter did not take the lock handed to it in time; passed on"
    );
}

/// An acquisition woken and not polled in time (its future kept, its
/// thread blocked) was dropped: what it took went to the next task or back
/// to Redis, and it starts over if polled again.
pub(crate) fn kept_acquisition_dropped(key: &str) {
    tracing::debug!(
        key,
        "a lock call was not polled in time after its answer or wake-up; let go of what it took"
    );
}

/// The heartbeat's own thread or runtime could not be started (the system
/// refused a thread): it runs on the caller's runtime instead, or, when
/// the runtime failed, the held leases go unrenewed until the next lock.
pub(crate) fn heartbeat_unstarted(err: &std::io::Error) {
    tracing::warn!(
        error = %err,
        "could not start the lock renewal thread; locks may be renewed late or lost"
    );
}

/// The leases the heartbeat's last round left overdue (0 when it keeps up);
/// rounds that left some are counted.
pub(crate) fn heartbeat_backlog(backlog: usize) {
    #[cfg(feature = "metrics")]
    {
        metrics::gauge!("lock_core_heartbeat_backlog").set(backlog as f64);
        if backlog > 0 {
            metrics::counter!("lock_core_heartbeat_overloaded_total").increment(1);
        }
    }
    #[cfg(not(feature = "metrics"))]
    let _ = backlog;
}

/// A held lock found lost.
pub(crate) fn lost(key: &str, reason: &'static str) {
    tracing::warn!(key, reason, "lock lost");
    #[cfg(feature = "metrics")]
    metrics::counter!("lock_core_lost_total").increment(1);
}

/// A nested acquisition of a lock this task holds: granted without a
/// round trip, so it is neither an acquisition nor, later, a release.
pub(crate) fn reentered(key: &str) {
    tracing::debug!(key, "lock re-entered");
}

/// A lock let go of after `held`; `owned`: it was still ours.
pub(crate) fn released(key: &str, acquired: Instant, owned: bool, label: &'static str) {
    // Field values are computed only when the event is enabled.
    tracing::debug!(
        key,
        held_ms = millis(acquired.elapsed()),
        owned,
        "lock released"
    );
    #[cfg(feature = "metrics")]
    {
        metrics::counter!("lock_core_released_total").increment(1);
        metrics::histogram!("lock_core_hold_seconds", "template" => label)
            .record(acquired.elapsed().as_secs_f64());
    }
    #[cfg(not(feature = "metrics"))]
    let _ = label;
}

/// An acquisition under way, counted in `lock_core_waiting` until it is
/// dropped: when the acquisition ends, and when its future is dropped
/// while it waits. Without the `metrics` feature it is nothing.
pub(crate) struct Waiting {
    #[cfg(feature = "metrics")]
    label: &'static str,
}

impl Waiting {
    pub(crate) fn start(label: &'static str) -> Waiting {
        #[cfg(feature = "metrics")]
        {
            metrics::gauge!("lock_core_waiting", "template" => label).increment(1.0);
            Waiting { label }
        }
        #[cfg(not(feature = "metrics"))]
        {
            let _ = label;
            Waiting {}
        }
    }
}

#[cfg(feature = "metrics")]
impl Drop for Waiting {
    fn drop(&mut self) {
        metrics::gauge!("lock_core_waiting", "template" => self.label).decrement(1.0);
    }
}

/// A lease's place in `lock_core_held`: counted from [`up`](Self::up) (its
/// guard made) to the first [`down`](Self::down) (released, handed on,
/// dropped or lost), each at most once, in whatever order they come.
pub(crate) struct Held {
    /// Only with metrics: without, a lease (a million of them, in some
    /// processes) carries nothing for them.
    #[cfg(feature = "metrics")]
    label: &'static str,
    /// Not yet counted, counted, or done.
    #[cfg(feature = "metrics")]
    state: AtomicU8,
}

#[cfg(feature = "metrics")]
const NOT_COUNTED: u8 = 0;
#[cfg(feature = "metrics")]
const COUNTED: u8 = 1;
#[cfg(feature = "metrics")]
const DONE: u8 = 2;

impl Held {
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn new(label: &'static str) -> Held {
        Held {
            #[cfg(feature = "metrics")]
            label,
            #[cfg(feature = "metrics")]
            state: AtomicU8::new(NOT_COUNTED),
        }
    }

    /// The `template` label ("" without metrics, where nothing reads it).
    pub(crate) fn label(&self) -> &'static str {
        #[cfg(feature = "metrics")]
        return self.label;
        #[cfg(not(feature = "metrics"))]
        ""
    }

    /// The guard is made: counted, unless the lease is over already.
    pub(crate) fn up(&self) {
        #[cfg(feature = "metrics")]
        if self
            .state
            .compare_exchange(NOT_COUNTED, COUNTED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            metrics::gauge!("lock_core_held", "template" => self.label).increment(1.0);
        }
    }

    /// The lease is over: no longer counted, and never again.
    pub(crate) fn down(&self) {
        #[cfg(feature = "metrics")]
        if self.state.swap(DONE, Ordering::AcqRel) == COUNTED {
            metrics::gauge!("lock_core_held", "template" => self.label).decrement(1.0);
        }
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The reply to a release sent without waiting for it (the attribute's
/// release): an error means the key was not released, and expires by
/// itself; 0 means it was no longer ours.
pub(crate) fn unheard_release(reply: redis::RedisResult<redis::Value>) {
    let failed = match reply {
        Ok(redis::Value::ServerError(e)) => Some(format!("{e:?}")),
        Ok(_) => None,
        Err(e) => Some(e.to_string()),
    };
    if let Some(error) = failed {
        tracing::warn!(
            error,
            "a release sent without waiting for its reply failed; the lock expires at the end of its ttl"
        );
        #[cfg(feature = "metrics")]
        metrics::counter!("lock_core_release_failures_total").increment(1);
    }
}

/// An operator broke a lock (`LockClient::force_release`).
pub(crate) fn force_released(key: &str, holder: Option<&str>, kind: crate::LockKind) {
    tracing::warn!(
        key,
        holder = holder.unwrap_or("unknown"),
        kind = ?kind,
        "lock force-released; its holder loses it at its next renewal"
    );
}
