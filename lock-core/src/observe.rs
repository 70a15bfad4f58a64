//! What the crate tells operators: `tracing` spans and events, and, with the
//! `metrics` feature, counters and histograms.
//!
//! | signal | where |
//! | --- | --- |
//! | span `lock` (DEBUG): `key`, `attempts`, `waited_ms`, `outcome` | around each acquisition |
//! | DEBUG `lock busy, retrying`: `key`, `attempt`, `delay_ms` | each retry |
//! | WARN `lock renewal failed`: `key` (the first of the round), `leases`, `error` | a renewal round that could not reach Redis |
//! | WARN `lock lost`: `key`, `reason` | a held lock found lost |
//! | DEBUG `lock released`: `key`, `held_ms`, `owned` | each release |
//! | DEBUG `lock re-entered`: `key` | a nested acquisition of a lock the task holds |
//! | WARN `lock force-released; ...`: `key`, `holder`, `kind` | [`LockClient::force_release`](crate::LockClient::force_release) broke a lock |
//!
//! Keys are logged as the caller named them; tokens never are. With the
//! `metrics` feature: counters `lock_core_acquired_total`,
//! `lock_core_contended_total`, `lock_core_unavailable_total`,
//! `lock_core_lost_total`, `lock_core_released_total`, and histograms
//! `lock_core_wait_seconds` (acquisitions, successful or not) and
//! `lock_core_hold_seconds` (from acquisition to release). No metric carries
//! the key as a label: keys like `order:{id}` would make one series per
//! order.

use crate::error::{ErrorKind, LockError};
use std::time::Duration;
use tokio::time::Instant;

/// How an acquisition ended, for the span and the counters.
pub(crate) fn acquisition(
    span: &tracing::Span,
    result: Result<(), &LockError>,
    attempts: u32,
    started: Instant,
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
            _ => "failed",
        },
    };
    span.record("attempts", attempts);
    span.record("waited_ms", millis(waited));
    span.record("outcome", outcome);
    #[cfg(feature = "metrics")]
    {
        let counter = match outcome {
            "acquired" => Some("lock_core_acquired_total"),
            "contended" => Some("lock_core_contended_total"),
            "unavailable" => Some("lock_core_unavailable_total"),
            _ => None,
        };
        if let Some(counter) = counter {
            metrics::counter!(counter).increment(1);
        }
        metrics::histogram!("lock_core_wait_seconds").record(waited.as_secs_f64());
    }
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
pub(crate) fn renewal_failed(key: &str, leases: usize, error: &dyn std::fmt::Display) {
    tracing::warn!(key, leases, error = %error, "lock renewal failed");
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
pub(crate) fn released(key: &str, acquired: Instant, owned: bool) {
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
        metrics::histogram!("lock_core_hold_seconds").record(acquired.elapsed().as_secs_f64());
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
