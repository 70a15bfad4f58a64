//! A Redlock call left to finish after its majority decided, whose
//! caller's runtime then shuts down, is dropped without a panic. Its own
//! binary: it counts panics with a process-wide hook.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use lock_core::LockClient;
use lock_testkit::RedisServer;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

static PANICS: AtomicUsize = AtomicUsize::new(0);

/// A lock and its release on three servers, one of them frozen, from a
/// current-thread runtime that is then shut down: the frozen server's calls
/// are left running on lock-core's runtime, and their timers (the caller
/// runtime's) go with that runtime. Before, the next poll of such a call
/// panicked ("A Tokio 1.x context was found, but it is being shutdown";
/// caught, and that call dropped); now the runtime's end drops them.
#[test]
fn a_call_left_running_outlives_its_callers_runtime_without_a_panic() {
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        PANICS.fetch_add(1, Ordering::SeqCst);
        default_hook(info);
    }));
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    for round in 0..5 {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let builder = LockClient::builder()
            .urls(servers.iter().map(RedisServer::url))
            .node_timeout(Duration::from_millis(300));
        let client = runtime.block_on(builder.build()).unwrap();
        let frozen = servers[round % 3].pause();
        runtime.block_on(async {
            let guard = client.lock("late", Duration::from_secs(5)).await.unwrap();
            assert!(guard.release().await.unwrap());
        });
        // The frozen server's SET and release are still running.
        drop(runtime);
        // Past their 300 ms bound, which would have polled them.
        std::thread::sleep(Duration::from_millis(600));
        frozen.resume();
        drop(client);
    }
    assert_eq!(
        PANICS.load(Ordering::SeqCst),
        0,
        "a call left running panicked"
    );
}
