//! The integration tests that can share a process, as one test binary: one
//! link instead of one per file. Each module is a file of its own here and
//! holds no process-wide state (no global client, no global tracing
//! subscriber or metrics recorder, no environment changes). The tests that
//! need such state are binaries of their own beside this directory:
//! `global.rs`, `attribute_global.rs` and `default_client.rs` (the
//! process-wide client), `tracing_events.rs` (a tracing subscriber and its
//! callsites), `overload.rs` (a global subscriber), `ui.rs` (trybuild), and
//! `jepsen.rs`, whose worker processes and nemesis run alone.
//!
//! Long runs (soaks, stress, the kept variant of the cancellation harness)
//! sit in modules named `long`, so that a test's name says so:
//! `scripts/test --quick` leaves them out with `--skip long::`, and
//! `scripts/test` runs them after the rest.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../support/mod.rs"]
mod support;

mod acl;
mod attribute;
mod attribute_kinds;
mod attribute_leader;
mod behaviour;
mod bring_your_own;
mod cancellation;
mod capacity;
mod cluster;
mod core;
mod deadlock_processes;
mod deadlocks;
mod deployment;
mod faults;
mod framework;
mod interop;
mod isolation;
mod kinds;
mod leader;
mod liveness;
mod long;
mod metrics;
mod native;
mod operators;
mod reconnect;
mod redlock;
mod reentry;
mod runtime;
mod sentinel;
mod takeover;
mod tls;
mod transitions;
