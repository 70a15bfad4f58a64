//! The client `#[distributed_lock]` uses when it names none: the
//! process-wide one, set once at startup, unless a scope
//! ([`with_default_client`], [`set_default_client`]) gives another.

use crate::client::LockClient;
use crate::error::{ErrorKind, LockError};
use std::cell::RefCell;
use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

static GLOBAL: OnceLock<LockClient> = OnceLock::new();

/// Whether a scope was ever opened in this process: until then the
/// attribute goes straight to the global, without looking for one.
static SCOPED: AtomicBool = AtomicBool::new(false);

tokio::task_local! {
    /// The client of the innermost [`with_default_client`] of this task.
    static TASK_DEFAULT: LockClient;
}

thread_local! {
    /// The client of the latest live [`set_default_client`] guard of this
    /// thread.
    static THREAD_DEFAULT: RefCell<Option<LockClient>> = const { RefCell::new(None) };
}

/// Installs `client` as the process-wide client, used by
/// `#[distributed_lock]` functions that name no `client`.
///
/// Call it once, at startup. A second call changes nothing and hands the
/// rejected client back inside the error.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let client = lock_core::LockClient::builder()
///     .url("redis://127.0.0.1:6379")
///     .build()
///     .await?;
/// lock_core::set_global_client(client)?;
/// # Ok(()) }
/// ```
pub fn set_global_client(client: LockClient) -> Result<(), SetGlobalClientError> {
    GLOBAL
        .set(client)
        .map_err(|client| SetGlobalClientError { client })
}

/// The process-wide client.
///
/// Errors with [`ErrorKind::NotInitialized`] before
/// [`set_global_client`] was called.
pub fn global_client() -> Result<&'static LockClient, LockError> {
    GLOBAL.get().ok_or_else(|| {
        LockError::new(ErrorKind::NotInitialized).with_message(
            "call lock_core::set_global_client(client) at startup, pass a client explicitly, \
             or run the call inside lock_core::with_default_client(client, ..)",
        )
    })
}

/// [`set_global_client`] was called when a client was already installed.
pub struct SetGlobalClientError {
    client: LockClient,
}

impl SetGlobalClientError {
    /// The client that was not installed.
    pub fn into_client(self) -> LockClient {
        self.client
    }

    /// Always [`ErrorKind::AlreadyInitialized`].
    pub fn kind(&self) -> ErrorKind {
        ErrorKind::AlreadyInitialized
    }
}

impl fmt::Debug for SetGlobalClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SetGlobalClientError")
            .finish_non_exhaustive()
    }
}

impl fmt::Display for SetGlobalClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the global lock client is already set; set_global_client may be called once per process")
    }
}

impl std::error::Error for SetGlobalClientError {}

impl From<SetGlobalClientError> for LockError {
    fn from(err: SetGlobalClientError) -> LockError {
        LockError::new(ErrorKind::AlreadyInitialized).with_message(err.to_string())
    }
}

/// Runs `future` with `client` as its default client: every
/// `#[distributed_lock]` function without `client = ..` called inside it
/// (by it, or by anything it awaits, joins or selects on) locks through
/// `client` instead of the process-wide one. In the spirit of
/// `tracing::subscriber::with_default`, for tests above all: two tests of
/// one binary run at once, and would share, and fight over, the one global
/// client.
///
/// The scope belongs to the future, not to a thread: it is in effect
/// whenever the future is polled, on whichever thread of a multi-thread
/// runtime, and nowhere else. Scopes nest: an inner one wins while its
/// future runs, and the outer one is back when it ends.
///
/// A task spawned inside (`tokio::spawn`) is another future and does **not**
/// inherit the scope: it uses the process-wide client, unless wrapped again,
/// `tokio::spawn(with_default_client(client.clone(), task))`.
///
/// ```
/// use lock_core::{LockClient, LockError, MemoryStore, distributed_lock};
/// use std::time::Duration;
///
/// #[distributed_lock(key = "report", ttl = "10s")]
/// async fn report() -> Result<(), LockError> {
///     Ok(())
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), LockError> {
/// let store = MemoryStore::new();
/// // No set_global_client: this test's own client, on its own store.
/// lock_core::with_default_client(LockClient::in_memory_on(&store), report()).await?;
/// # Ok(()) }
/// ```
pub fn with_default_client<F: Future>(
    client: LockClient,
    future: F,
) -> impl Future<Output = F::Output> {
    SCOPED.store(true, Ordering::Relaxed);
    TASK_DEFAULT.scope(client, future)
}

/// Makes `client` this thread's default client until the returned guard is
/// dropped; then the one before it is back. In the spirit of
/// `tracing::subscriber::set_default`.
///
/// Limits, by design:
///
/// - It is per **thread**, not per task. On a current-thread runtime (a
///   plain `#[tokio::test]`) every task runs on the test's thread and sees
///   it, spawned ones included. On a multi-thread runtime only what runs on
///   this thread sees it: a spawned task runs on a worker thread and does
///   not. For async code prefer [`with_default_client`], which follows its
///   future across threads.
/// - The guard is neither `Send` nor `Sync`, so it cannot leave its thread
///   (a future holding it across an `.await` cannot be spawned on a
///   multi-thread runtime).
/// - Inside a [`with_default_client`] future, that scope wins over any
///   guard.
/// - Guards must be dropped in the reverse order of their creation (as
///   scopes are); each restores the client that was in effect when it was
///   made.
///
/// ```
/// use lock_core::{LockClient, LockError, distributed_lock};
///
/// #[distributed_lock(key = "report", ttl = "10s")]
/// async fn report() -> Result<(), LockError> {
///     Ok(())
/// }
///
/// #[tokio::main(flavor = "current_thread")]
/// async fn main() -> Result<(), LockError> {
///     let _default = lock_core::set_default_client(LockClient::in_memory());
///     report().await
/// }
/// ```
#[must_use = "the client is the default only until the guard is dropped"]
pub fn set_default_client(client: LockClient) -> DefaultClientGuard {
    SCOPED.store(true, Ordering::Relaxed);
    let previous = THREAD_DEFAULT.with(|slot| slot.replace(Some(client)));
    DefaultClientGuard {
        previous,
        not_send: PhantomData,
    }
}

/// Keeps a client the default of this thread; see [`set_default_client`].
pub struct DefaultClientGuard {
    previous: Option<LockClient>,
    /// Per thread: the guard must be dropped where it was made.
    not_send: PhantomData<*const ()>,
}

impl Drop for DefaultClientGuard {
    fn drop(&mut self) {
        let previous = self.previous.take();
        // During thread teardown the slot may be gone: nothing to restore.
        let _ = THREAD_DEFAULT.try_with(|slot| slot.replace(previous));
    }
}

impl fmt::Debug for DefaultClientGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DefaultClientGuard").finish_non_exhaustive()
    }
}

/// The client a `#[distributed_lock]` function without `client = ..`
/// would use here: the innermost [`with_default_client`] of this task, else
/// this thread's [`set_default_client`], else the process-wide client (a
/// clone: clones share their locks and connections).
///
/// Errors with [`ErrorKind::NotInitialized`] when there is none of them.
pub fn default_client() -> Result<LockClient, LockError> {
    match scoped() {
        Some(client) => Ok(client),
        None => global_client().cloned(),
    }
}

/// The client of a scope in effect here, if any.
fn scoped() -> Option<LockClient> {
    if !SCOPED.load(Ordering::Relaxed) {
        return None;
    }
    if let Ok(client) = TASK_DEFAULT.try_with(LockClient::clone) {
        return Some(client);
    }
    THREAD_DEFAULT
        .try_with(|slot| slot.borrow().clone())
        .ok()
        .flatten()
}

/// The client an attribute without `client = ..` uses: a scope's, or the
/// process-wide one. **Not a stable API.**
#[doc(hidden)]
pub enum DefaultClient {
    /// The process-wide client.
    Global(&'static LockClient),
    /// A scope's.
    Scoped(LockClient),
}

impl DefaultClient {
    /// The one in effect here; the process-wide one without a lookup when
    /// no scope was ever opened.
    pub(crate) fn in_effect() -> Result<DefaultClient, LockError> {
        match scoped() {
            Some(client) => Ok(DefaultClient::Scoped(client)),
            None => global_client().map(DefaultClient::Global),
        }
    }

    /// The client.
    pub(crate) fn get(&self) -> &LockClient {
        match self {
            DefaultClient::Global(client) => client,
            DefaultClient::Scoped(client) => client,
        }
    }
}
