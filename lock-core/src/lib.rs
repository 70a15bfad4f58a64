//! Distributed locks on Redis for async Rust services.
//!
//! A lock here is a **lease**: a Redis key holding a random **token** that
//! names the owner, with an expiry (the **ttl**). Acquiring is
//! `SET key token NX PX ttl`; only the holder of the token can renew the
//! lease or delete it, through small Lua scripts that compare the token
//! first, so a late release never frees someone else's lock.
//!
//! While a [`LockGuard`] lives, a **heartbeat** renews the lease every ttl/3
//! and keeps a local **validity** deadline on the monotonic clock. When a
//! renewal finds another owner, or the deadline passes without a successful
//! renewal, the lock is **lost**: [`LockGuard::is_lost`] turns true and
//! [`LockGuard::lost`] completes, so the work it protected can stop.
//!
//! A lease cannot protect against a process that pauses longer than its ttl
//! (a stop-the-world pause, a suspended VM) and then writes. For that, take
//! a **fencing token** ([`LockOptions::fencing`]): a number that grows with
//! every holder, which the protected resource checks and uses to refuse
//! stale writers.
//!
//! ```no_run
//! use lock_core::{LockClient, LockOptions};
//! use std::time::Duration;
//!
//! # async fn demo() -> Result<(), lock_core::LockError> {
//! let client = LockClient::builder()
//!     .url("redis://127.0.0.1:6379")
//!     .key_prefix("myapp:lock:")
//!     .build()
//!     .await?;
//!
//! let guard = client
//!     .lock_with("order:42", LockOptions::new(Duration::from_secs(30)).fencing(true))
//!     .await?;
//! println!("holding {} with fencing token {:?}", guard.key(), guard.fencing_token());
//! let still_ours = guard.release().await?;
//! assert!(still_ours);
//! # Ok(()) }
//! ```
#![warn(missing_docs)]

mod backend;
mod backoff;
mod client;
mod current;
mod error;
mod global;
mod guard;
mod heartbeat;
mod line;
mod scripts;
mod token;

#[doc(hidden)]
pub mod __private {
    //! What `#[distributed_lock]` expands to. **Not a stable API.**
    pub use crate::private::*;
}
mod private;

pub use backoff::Backoff;
pub use client::{LockClient, LockClientBuilder, LockOptions, MAX_DURATION, MAX_KEY_LEN, MIN_TTL};
pub use current::{LockInfo, current_lock};
pub use error::{ErrorKind, LockError, TimedOut};
pub use global::{SetGlobalClientError, global_client, set_global_client};
pub use guard::LockGuard;
pub use line::HandoffBudget;

/// Runs an async function only while this process holds a distributed lock;
/// see the `lock-macros` crate for the arguments.
#[cfg(feature = "macros")]
pub use lock_macros::distributed_lock;
