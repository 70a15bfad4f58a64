//! `#[distributed_lock]` without `client = ..` uses the process-wide client.
//!
//! One test in its own binary: the global client is set once per process,
//! so no other test can observe (or race with) it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use lock_core::{ErrorKind, LockError, current_lock, distributed_lock, set_global_client};
use lock_testkit::RedisServer;
use std::time::Duration;
use support::client_for;

#[distributed_lock(key = "global:{id}", ttl = "10s")]
async fn global_job(id: u32) -> Result<String, LockError> {
    Ok(current_lock().unwrap().key().to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_client_argument_the_global_client_is_used() {
    let server = RedisServer::start();

    // Before a client is installed: an error value naming the fix, not a
    // panic, and the body does not run.
    let err = global_job(1).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotInitialized);
    assert_eq!(err.key(), Some("global:1"));
    assert!(err.to_string().contains("set_global_client"), "{err}");

    set_global_client(client_for(&server, "global:").await).unwrap();
    assert_eq!(global_job(1).await.unwrap(), "global:1");

    // It locked on the global client's server, and released before returning.
    let observer = client_for(&server, "global:").await;
    let guard = observer
        .try_lock("global:1", Duration::from_secs(5))
        .await
        .unwrap()
        .expect("released before the function returned");
    guard.release().await.unwrap();
}
