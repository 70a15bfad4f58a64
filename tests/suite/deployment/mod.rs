//! The deployment suite: what a client does while the deployment changes
//! under it, as users run it. A Cluster's topology changes (failovers, a
//! seed gone, slots migrating, a node added), Sentinel fails the primary
//! over, the server runs the least ACL or an evicting memory policy, and
//! the machine is busy. Each test asserts the documented outcome and its
//! bound (docs/deployment.md, docs/guarantees.md): a lock kept, or its
//! holder told within one renewal interval; no two holders beyond the
//! documented window; waiters woken within 100 ms; a clear error.
//!
//! Longer rounds sit in modules named `long`, as elsewhere in the suite.

mod acl;
mod busy;
mod cluster;
mod eviction;
mod fairness;
mod sentinel;
