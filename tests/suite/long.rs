//! The long runs: many workers, many rounds, faults injected on a
//! schedule.

mod queue_stress;
mod soak;
mod soak_kinds;
