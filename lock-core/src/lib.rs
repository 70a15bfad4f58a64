//! Distributed locks on Redis for async Rust services.
//!
//! A lock here is a **lease**: a Redis key holding a random **token** that
//! names the owner, with an expiry (the **ttl**). Acquiring is
//! `SET key token NX PX ttl` (the value goes on with the holder's name and
//! the time of acquisition, for [`LockClient::inspect`]); only the holder
//! of the token can renew the lease or delete it, through small Lua
//! scripts that compare the token first, so a late release never frees
//! someone else's lock.
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
//! Waiting is bounded: [`LockClient::lock`] waits up to the client's default
//! wait and returns an [`ErrorKind::Contended`] error when it runs out. A
//! waiter does not poll: it hears the holder's release through Redis
//! pub/sub, and tasks of one process waiting for the same key queue in order
//! and can be handed the lease directly. A wait that lasts is recorded in
//! Redis, for operators ([`LockState::waiters`]) and to find deadlocks
//! across processes: when waits form a cycle, the youngest of them fails
//! with [`ErrorKind::WouldDeadlock`] and the others proceed. With three or
//! more independent servers ([`LockClientBuilder::urls`]) locks are held on
//! a majority of them (Redlock). Every failure is a [`LockError`] whose [`ErrorKind`] tells
//! contention, loss, unreachable servers and bad input apart.
//!
//! The guard API, here on the in-memory backend (the same calls work on
//! Redis: build the client with `.url("redis://host:6379")` instead):
//!
//! ```
//! use lock_core::{LockClient, LockOptions, MemoryStore};
//! use std::time::Duration;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), lock_core::LockError> {
//! let store = MemoryStore::new();
//! let client = LockClient::in_memory_on(&store);
//!
//! let guard = client
//!     .lock_with("order:42", LockOptions::new(Duration::from_secs(30)).fencing(true))
//!     .await?;
//! assert!(guard.fencing_token().is_some());
//! // Another replica of the service cannot take it meanwhile.
//! let replica = LockClient::in_memory_on(&store);
//! assert!(replica.try_lock("order:42", Duration::from_secs(30)).await?.is_none());
//! assert!(guard.release().await?, "it was still ours");
//! # Ok(()) }
//! ```
//!
//! The attribute, with the process-wide client:
//!
//! ```
//! use lock_core::{LockClient, LockError, distributed_lock};
//!
//! #[distributed_lock(key = "invoice:{customer_id}", ttl = "30s", wait = "5s")]
//! async fn bill(customer_id: u64) -> Result<u64, LockError> {
//!     let lock = lock_core::current_lock().expect("inside an annotated body");
//!     assert_eq!(lock.key(), format!("invoice:{customer_id}"));
//!     Ok(customer_id)
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // At startup; in production `LockClient::builder().url(..).build().await?`.
//! lock_core::set_global_client(LockClient::in_memory())?;
//! assert_eq!(bill(7).await?, 7);
//! # Ok(()) }
//! ```
//!
//! # Cargo features
//!
//! - `macros` (default): re-exports the `#[distributed_lock]` attribute.
//! - `metrics`: counters, histograms and gauges through the `metrics` facade.
//! - `tls`: `rediss://` URLs, through rustls.
//! - `tower`: `tower::LockLayer`, a lock around each request of a service.
//! - `testing`: hooks for this workspace's own tests and benchmarks on
//!   [`LockClient`] (the renewal capacity, the in-process queues). **Not a
//!   stable API**: they may change or go in any release.
#![cfg_attr(docsrs, feature(doc_cfg))]

// From the bottom layer up: a module uses only those above it in this list.
// (Blank lines keep rustfmt from sorting the layers into one alphabet.)
// lock-core's own runtime, for the work no task of the user's may hold up,
// and the `Spawner` that puts a client's work on the user's runtime instead.
mod background;
// Jittered exponential backoff between attempts.
mod backoff;
// `LockError`, `ErrorKind`, `LossReason`: every failure a caller can see.
mod error;
// The Lua scripts (`scripts/*.lua`) and their `EVALSHA` calls.
mod scripts;
// Tokens, holder names and the value a lock key stores.
mod token;

// Tracing spans and events, and metrics with the `metrics` feature.
mod observe;

// A lease: what is held, its validity deadline, loss, hold limits.
mod lease;
// `LockOptions`: ttl, wait, renewal, fencing, mode, hold limits.
mod options;

// Where locks live: one server, Redlock, Cluster, Sentinel, in memory.
mod backend;

// Letting go of what is held, and moving its expiry: the one release.
mod release;

// Admission control: no new lease past what the heartbeat can renew.
mod admission;
// The heartbeat: renews every held lease, on a thread of its own (or the
// runtime the user gave).
mod heartbeat;
// This process's wait queue per key, and hand-offs between its tasks.
mod queue;

// The primitives of state handed between tasks, loom's in model tests.
mod sync;

// An acquisition kept unpolled lets go of what it took.
mod kept;

// What every clone of a client shares, and the background release.
mod client_state;
// Whether the servers may evict lock keys, read at build.
mod eviction;

// The locks an annotated body holds (`current_lock`, re-entry).
mod current;
// `LockGuard`: the held lock, its loss signal, release and `Drop`.
mod guard;

// Wait records in Redis, and cycles of waits found and broken.
mod waits;

// Acquisition by kind: one key, several keys, shared holders and permits.
mod acquire;

// `LockClient`, its builder, the operators' calls and leader election.
mod client;

// The process-wide client and the per-task default client.
mod global;

// `run_locked`: a future run while a lock is held, the attribute's body.
mod run;

// The tower layer: a route run under a lock named by its request.
#[cfg(feature = "tower")]
#[cfg_attr(docsrs, doc(cfg(feature = "tower")))]
pub mod tower;

#[doc(hidden)]
pub mod __private {
    //! What `#[distributed_lock]` expands to. **Not a stable API.**
    pub use crate::private::*;
}
mod private;

pub use backend::MemoryStore;
#[cfg(any(feature = "deadpool-redis", feature = "bb8-redis"))]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "deadpool-redis", feature = "bb8-redis")))
)]
pub use backend::RedisPool;
pub use backoff::Backoff;
pub use client::{Leadership, LockClient, LockClientBuilder};
pub use client::{LockCursor, LockKind, LockPage, LockState, LockWaiter};
pub use current::{LockInfo, current_lock};
pub use error::{ErrorKind, LockError, LossReason, NodeError, QuorumFailure, TimedOut};
pub use global::{
    DefaultClientGuard, SetGlobalClientError, default_client, global_client, set_default_client,
    set_global_client, with_default_client,
};
pub use guard::LockGuard;
pub use lease::{MAX_DURATION, MAX_KEY_LEN, MIN_TTL};
pub use options::LockOptions;
pub use queue::HandoffBudget;
pub use run::{OnLost, RunOptions, run_locked};
pub use token::MAX_HOLDER_LEN;

/// The README's Rust examples, compiled as doctests (those that need a live
/// server are `no_run`), so the front door's code keeps compiling.
#[cfg(all(doctest, feature = "macros"))]
#[doc = include_str!("../../README.md")]
struct ReadmeDoctests;

/// Runs an async function only while this process holds a distributed lock.
#[cfg(feature = "macros")]
#[cfg_attr(docsrs, doc(cfg(feature = "macros")))]
pub use lock_macros::distributed_lock;
