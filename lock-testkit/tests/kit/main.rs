//! The kit's own tests, in one binary (one link instead of four).
//!
//! - `servers`: servers, pauses, restarts and the proxy;
//! - `tls`: generated certificates and TLS servers;
//! - `jepsen`: the fenced register, worker processes, a crash that keeps
//!   the AOF;
//! - `workers`: a crashed worker dies without stopping on its own.

mod jepsen;
mod servers;
mod tls;
mod workers;
