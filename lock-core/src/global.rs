//! The process-wide client, set once at startup.

use crate::error::{ErrorKind, LockError};
use crate::state::LockClient;
use std::fmt;
use std::sync::OnceLock;

static GLOBAL: OnceLock<LockClient> = OnceLock::new();

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
            "call lock_core::set_global_client(client) at startup, or pass a client explicitly",
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
