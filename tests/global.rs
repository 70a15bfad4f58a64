//! The process-wide client. One test: the global is per process.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use lock_core::{ErrorKind, LockClient};
use lock_testkit::RedisServer;
use std::time::Duration;

#[test]
fn global_client_is_set_once_and_read_before_set_is_an_error() {
    let server = RedisServer::start();
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    };

    let err = lock_core::global_client().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotInitialized);
    assert!(err.to_string().contains("set_global_client"), "{err}");

    let build = || {
        runtime().block_on(
            LockClient::builder()
                .url(server.url())
                .key_prefix("first:")
                .build(),
        )
    };
    lock_core::set_global_client(build().unwrap()).unwrap();

    let second = runtime()
        .block_on(
            LockClient::builder()
                .url(server.url())
                .key_prefix("second:")
                .build(),
        )
        .unwrap();
    let rejected = lock_core::set_global_client(second).unwrap_err();
    assert_eq!(rejected.kind(), ErrorKind::AlreadyInitialized);
    assert_eq!(rejected.into_client().key_prefix(), "second:");

    let global = lock_core::global_client().unwrap();
    assert_eq!(global.key_prefix(), "first:");
    // The runtime that built it is gone; the global still locks.
    runtime().block_on(async {
        let guard = global
            .try_lock("k", Duration::from_secs(5))
            .await
            .unwrap()
            .expect("free");
        assert!(guard.release().await.unwrap());
    });
}
