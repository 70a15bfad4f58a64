//! The ranges lock-core accepts for a ttl and a wait, checked here at
//! compile time. A proc-macro crate cannot depend on the crate that
//! re-exports it, so they are copies: the root package's `tests/ui.rs`
//! compiles this file and fails when they differ from lock-core's.

use std::time::Duration;

/// The shortest ttl: a renewal every ttl/3 must have a chance to finish a
/// round trip. `lock_core::MIN_TTL`.
pub(crate) const MIN_TTL: Duration = Duration::from_millis(10);

/// The longest ttl or wait (24 hours): anything longer is a unit mistake.
/// The attribute bounds `min_hold` and `max_hold` by it too.
/// `lock_core::MAX_DURATION`.
pub(crate) const MAX_DURATION: Duration = Duration::from_secs(24 * 60 * 60);
