//! Pieces of a Jepsen-style test: worker processes that increment a
//! counter under a lock, a fenced register holding the counter, the history
//! of what they did, and a checker.
//!
//! - [`FencedRegister`]: the resource, a counter on a `redis-server` of its
//!   own. An operation carrying a fencing token below the highest the
//!   register has seen is refused, reads included; every operation is
//!   logged by the register itself, so the checker knows what was carried
//!   out even when no worker lived to see the answer
//!   ([`RegisterState`]).
//! - [`Workers`]: separate processes, started from a command the test
//!   builds, each writing one [`Event`] per line on its stdout into a
//!   shared [`History`]; they can be paused, resumed and killed, and are
//!   told to stop by closing their stdin.
//! - [`Reporter`]: a worker's side: its register operations and the ends
//!   of its leases, reported as events on stdout ([`emit`]).
//! - [`check`]: what a history and the register's final state show
//!   ([`Report`]): operations, stale tokens refused, lost updates,
//!   takeovers and overlaps of leases, waits, and broken invariants.
//! - [`table`]: the Markdown table a run prints.

mod check;
mod history;
mod register;
mod reporter;
pub mod table;
mod workers;

pub use check::{Report, calls_ended_within, check};
pub use history::{Acquired, Event, History, OpKind, OpOutcome, Released, now_us};
pub use register::{Answer, FencedRegister, LOG_KEY, LogEntry, REGISTER_KEY, RegisterState};
pub use reporter::{Reporter, emit};
pub use workers::Workers;
