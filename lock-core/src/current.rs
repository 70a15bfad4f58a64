//! What this task holds through annotated bodies: the lock the running body
//! runs under ([`current_lock`]), and the locks a nested acquisition of the
//! same key re-enters instead of waiting behind itself.

use crate::client_state::ClientInner;
use crate::lease::Lease;
use std::future::Future;
use std::sync::Arc;

tokio::task_local! {
    /// The innermost annotated body this task runs; each level points at
    /// the one around it. A task-local rather than a map keyed by task id:
    /// tokio restores the outer level when a body ends or is dropped, and a
    /// spawned task starts without one, so it is another owner by itself.
    static CURRENT: Arc<Level>;
}

/// The lock an annotated function's body runs under; see [`current_lock`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockInfo {
    key: String,
    fence: Option<u64>,
    /// With `keys = [..]`, the keys after the first, in canonical order.
    more: Vec<(String, Option<u64>)>,
}

impl LockInfo {
    pub(crate) fn new(key: String, fence: Option<u64>) -> LockInfo {
        LockInfo {
            key,
            fence,
            more: Vec::new(),
        }
    }

    /// The description of a lock on several keys, in canonical order, each
    /// with its fencing token.
    #[allow(dead_code)] // used by lock_all, next
    pub(crate) fn several(mut keys: Vec<(String, Option<u64>)>) -> LockInfo {
        let rest = keys.split_off(1.min(keys.len()));
        let (key, fence) = keys.pop().unwrap_or_default();
        LockInfo {
            key,
            fence,
            more: rest,
        }
    }

    /// The key, as rendered from the attribute's template; with
    /// `keys = [..]`, the first of them in canonical (sorted) order.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Every key held, in canonical (sorted) order: one, or with
    /// `keys = [..]` each distinct rendered key.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.key.as_str()).chain(self.more.iter().map(|(k, _)| k.as_str()))
    }

    /// The fencing token, with `fencing = true`, or the one the outermost
    /// body took when this body re-entered a lock it holds. With
    /// `keys = [..]`, the first key's; see
    /// [`fencing_token_of`](Self::fencing_token_of).
    pub fn fencing_token(&self) -> Option<u64> {
        self.fence
    }

    /// The fencing token of one of the keys held (each key of a lock on
    /// several keys has its own), or `None` when `key` is not held here or
    /// was taken without fencing.
    pub fn fencing_token_of(&self, key: &str) -> Option<u64> {
        if key == self.key {
            return self.fence;
        }
        self.more
            .iter()
            .find(|(k, _)| k == key)
            .and_then(|(_, f)| *f)
    }

    /// Whether `key` is one of the keys held.
    pub(crate) fn holds(&self, key: &str) -> bool {
        self.key == key || self.more.iter().any(|(k, _)| k == key)
    }
}

/// One annotated body on this task's stack.
pub(crate) struct Level {
    info: LockInfo,
    /// The client the lock was taken through: another client is another
    /// owner, even on the same servers.
    client: Arc<ClientInner>,
    /// The lease held, shared with the guard of the outermost body of this
    /// key (re-entered levels share it too), so a re-entry sees its loss.
    lease: Arc<Lease>,
    /// Who holds the locks of this task's annotated bodies, as others see
    /// it in wait records: drawn by the outermost body, kept by the nested
    /// ones.
    owner: u64,
    outer: Option<Arc<Level>>,
}

/// The lock the current `#[distributed_lock]` body runs under, or `None`
/// outside one. In nested annotated calls each body sees its own lock; a
/// body that re-entered a lock its caller holds sees that lock (same key,
/// same fencing token).
///
/// ```
/// assert!(lock_core::current_lock().is_none());
/// ```
pub fn current_lock() -> Option<LockInfo> {
    CURRENT.try_with(|level| level.info.clone()).ok()
}

/// The lease this task holds on `key` through `client` in an enclosing
/// annotated body, if any. Outside every annotated body this is one failed
/// task-local lookup.
pub(crate) fn held(client: &Arc<ClientInner>, key: &str) -> Option<Arc<Lease>> {
    CURRENT
        .try_with(|innermost| {
            let mut level = Some(innermost);
            while let Some(here) = level {
                if Arc::ptr_eq(&here.client, client) && here.info.holds(key) {
                    return Some(here.lease.clone());
                }
                level = here.outer.as_ref();
            }
            None
        })
        .ok()
        .flatten()
}

/// This task's owner id and what its annotated bodies hold through
/// `client` (each lease's token and keys), for a wait record: `None`
/// outside every annotated body.
pub(crate) fn holdings(client: &Arc<ClientInner>) -> Option<(u64, Vec<Arc<Lease>>)> {
    CURRENT
        .try_with(|innermost| {
            let mut leases = Vec::new();
            let mut level = Some(innermost);
            while let Some(here) = level {
                if Arc::ptr_eq(&here.client, client)
                    && !leases.iter().any(|l| Arc::ptr_eq(l, &here.lease))
                {
                    leases.push(here.lease.clone());
                }
                level = here.outer.as_ref();
            }
            (innermost.owner, leases)
        })
        .ok()
}

/// A fresh owner id, for a task outside every annotated body.
pub(crate) fn new_owner() -> u64 {
    use rand::Rng;
    rand::rng().next_u64()
}

/// Runs `body` as a new innermost level: holding `lease` on `info`'s key
/// through `client`.
pub(crate) fn scope<F: Future>(
    info: LockInfo,
    client: Arc<ClientInner>,
    lease: Arc<Lease>,
    body: F,
) -> impl Future<Output = F::Output> {
    let outer = CURRENT.try_with(Arc::clone).ok();
    let owner = outer.as_ref().map_or_else(new_owner, |outer| outer.owner);
    let level = Level {
        info,
        client,
        lease,
        owner,
        outer,
    };
    CURRENT.scope(Arc::new(level), body)
}
