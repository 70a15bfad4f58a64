//! What the state handed between tasks is made of (a waiter's hand-off
//! slot, a kept acquisition's watch, the connection's read turn): std's
//! mutex and atomics and futures' waker cell, or loom's when the model
//! tests run (`RUSTFLAGS="--cfg lock_core_loom" cargo test -p lock-core
//! --lib model::`), so that loom runs the real code through every
//! interleaving of its steps. Only a test build takes loom's: the library
//! itself builds the same with the cfg.

#[cfg(all(test, lock_core_loom))]
pub(crate) use loom::{
    future::AtomicWaker,
    sync::atomic::AtomicU64,
    sync::{Mutex, MutexGuard},
};
#[cfg(not(all(test, lock_core_loom)))]
pub(crate) use {
    futures::task::AtomicWaker,
    std::sync::atomic::AtomicU64,
    std::sync::{Mutex, MutexGuard},
};

/// Registers `waker` in `cell` (the two cells spell it differently).
pub(crate) fn register(cell: &AtomicWaker, waker: &std::task::Waker) {
    #[cfg(all(test, lock_core_loom))]
    cell.register_by_ref(waker);
    #[cfg(not(all(test, lock_core_loom)))]
    cell.register(waker);
}
