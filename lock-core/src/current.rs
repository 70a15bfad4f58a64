//! Which lock the running annotated body holds.

use std::future::Future;

tokio::task_local! {
    static CURRENT: LockInfo;
}

/// The lock an annotated function's body runs under; see [`current_lock`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockInfo {
    key: String,
    fence: Option<u64>,
}

impl LockInfo {
    pub(crate) fn new(key: String, fence: Option<u64>) -> LockInfo {
        LockInfo { key, fence }
    }

    /// The key, as rendered from the attribute's template.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The fencing token, with `fencing = true`.
    pub fn fencing_token(&self) -> Option<u64> {
        self.fence
    }
}

/// The lock the current `#[distributed_lock]` body runs under, or `None`
/// outside one. In nested annotated calls each body sees its own lock.
///
/// ```
/// assert!(lock_core::current_lock().is_none());
/// ```
pub fn current_lock() -> Option<LockInfo> {
    CURRENT.try_with(LockInfo::clone).ok()
}

pub(crate) fn scope<F: Future>(info: LockInfo, body: F) -> impl Future<Output = F::Output> {
    CURRENT.scope(info, body)
}
