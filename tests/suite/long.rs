//! The long runs: many workers, many rounds, faults injected on a
//! schedule. `scripts/test --quick` leaves them out.

mod queue_stress;
mod soak;
mod soak_kinds;
