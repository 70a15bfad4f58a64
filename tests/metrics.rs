//! What operators see in their dashboards: the `metrics` feature.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use lock_core::{LockClient, LockClientBuilder, LockOptions};
use lock_testkit::RedisServer;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use std::collections::HashMap;
use std::time::Duration;
use support::client_with;

/// The clients of this file.
fn settings() -> LockClientBuilder {
    LockClient::builder()
        .key_prefix("obs:")
        .operation_timeout(Duration::from_millis(300))
}

#[test]
fn metrics_count_outcomes_and_time_waits_and_holds() {
    let server = RedisServer::start();
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let client = client_with(&server, settings()).await;
            let other_process = client_with(&server, settings()).await;
            let held = client.lock("k", Duration::from_secs(5)).await.unwrap();
            let short = LockOptions::new(Duration::from_secs(5)).wait(Duration::from_millis(50));
            assert!(other_process.lock_with("k", short).await.is_err());
            assert!(held.release().await.unwrap());
            let lost = client
                .lock_with(
                    "k",
                    LockOptions::new(Duration::from_millis(100)).renew(false),
                )
                .await
                .unwrap();
            lost.lost().await;
            // The store may not have expired it yet (the drift allowance):
            // either answer is right.
            lost.release().await.unwrap();
        });
    });
    let snapshot: HashMap<String, DebugValue> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| (key.key().name().to_owned(), value))
        .collect();
    let counter = |name: &str| match snapshot.get(name) {
        Some(DebugValue::Counter(n)) => *n,
        other => panic!("{name}: {other:?}"),
    };
    let samples = |name: &str| match snapshot.get(name) {
        Some(DebugValue::Histogram(values)) => values.len(),
        other => panic!("{name}: {other:?}"),
    };
    assert_eq!(counter("lock_core_acquired_total"), 2);
    assert_eq!(counter("lock_core_contended_total"), 1);
    assert_eq!(counter("lock_core_lost_total"), 1);
    assert_eq!(counter("lock_core_released_total"), 2);
    assert_eq!(samples("lock_core_wait_seconds"), 3);
    assert_eq!(samples("lock_core_hold_seconds"), 2);
}
