//! More held locks than a slowed server can renew in time: the heartbeat
//! serves the most urgent first, loses only what it cannot serve, never
//! claims a lock Redis no longer holds, and says it is overloaded; and the
//! client takes no new lock meanwhile (`ErrorKind::AtCapacity`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use futures::StreamExt;
use lock_core::{ErrorKind, LockClient, LockGuard, LockOptions};
use lock_testkit::RedisServer;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;
use support::{client_with, storage_key};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::{Layer, registry::LookupSpan};

const PREFIX: &str = "overload:";

/// Counts the heartbeat's overload warnings, from every thread (the
/// heartbeat runs on whichever worker thread).
#[derive(Clone, Default)]
struct Warnings(Arc<AtomicUsize>);

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Warnings {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        if *event.metadata().level() == Level::WARN
            && event.metadata().fields().field("backlog").is_some()
        {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Keeps the server busy in back-to-back 30 ms scripts until `stop` is
/// set: between two of them it serves the other clients about one read's
/// worth of commands, so it renews some thousands of leases a second.
fn slow_down(port: u16, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).unwrap();
        let mut conn = client.get_connection().unwrap();
        let busy = r#"
local t = redis.call("TIME")
local start = t[1] * 1000000 + t[2]
repeat
  t = redis.call("TIME")
until t[1] * 1000000 + t[2] - start > 30000
return 1"#;
        while !stop.load(Ordering::Relaxed) {
            let _: i64 = redis::cmd("EVAL")
                .arg(busy)
                .arg(0)
                .query(&mut conn)
                .unwrap();
        }
    })
}

/// A client whose calls give up after 400 ms, so that a slowed server's
/// timeouts show within the test.
async fn overload_client(server: &RedisServer) -> LockClient {
    client_with(
        server,
        LockClient::builder()
            .key_prefix(PREFIX)
            .operation_timeout(Duration::from_millis(400)),
    )
    .await
}

/// Takes `{name}0` to `{name}{count - 1}`, in that order.
async fn take(client: &LockClient, name: &str, count: usize, ttl: Duration) -> Vec<LockGuard> {
    futures::stream::iter(0..count)
        .map(|i| {
            let client = client.clone();
            async move {
                client
                    .lock_with(&format!("{name}{i}"), LockOptions::new(ttl))
                    .await
                    .unwrap()
            }
        })
        // In order: guard `i` holds `{name}{i}`.
        .buffered(256)
        .collect()
        .await
}

/// Whether each of `{name}0` to `{name}{count - 1}` is in Redis.
async fn present(server: &RedisServer, name: &str, count: usize) -> Vec<bool> {
    let keys: Vec<String> = (0..count)
        .map(|i| storage_key(PREFIX, &format!("{name}{i}")))
        .collect();
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let mut present = Vec::with_capacity(keys.len());
    for chunk in keys.chunks(500) {
        let mut exists = redis::pipe();
        for key in chunk {
            exists.exists(key);
        }
        let answers: Vec<bool> = exists.query_async(&mut conn).await.unwrap();
        present.extend(answers);
    }
    present
}

/// Safety first: every guard that still claims its lock finds its key in
/// Redis (`present`, read before asking the guards: a lease only ever goes
/// from held to lost, and its deadline comes before Redis's expiry). How
/// many still claim theirs.
fn held_where_present(guards: &[LockGuard], present: &[bool], name: &str) -> usize {
    let held: Vec<bool> = guards.iter().map(|g| !g.is_lost()).collect();
    for (i, (&held, &present)) in held.iter().zip(present).enumerate() {
        assert!(
            !held || present,
            "guard {name}{i} claims a lock whose key Redis no longer has"
        );
    }
    held.iter().filter(|&&h| h).count()
}

/// One overload at a time: each keeps a server and both cores busy.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A long run: thousands of locks against a server kept busy. `scripts/test --quick`
/// leaves it out.
mod long {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn past_capacity_the_heartbeat_keeps_what_it_can_and_says_so() {
        let _serial = SERIAL.lock().await;
        let warnings = Warnings::default();
        tracing::subscriber::set_global_default(
            tracing_subscriber::registry().with(warnings.clone()),
        )
        .unwrap();
        let server = RedisServer::start();
        let client = overload_client(&server).await;
        let ttl = Duration::from_millis(1500);
        let count = 16000;
        let guards = take(&client, "k", count, ttl).await;

        let stop = Arc::new(AtomicBool::new(false));
        let slowing = slow_down(server.port(), stop.clone());
        // New locks asked meanwhile: the heartbeat measures the slowdown in
        // its rounds, and from then on refuses them without sending a SET.
        let mut refused = 0;
        for j in 0..24 {
            tokio::time::sleep(ttl / 6).await;
            let options = LockOptions::new(ttl).wait(Duration::ZERO);
            match client.lock_with(&format!("new{j}"), options).await {
                Err(e) if e.kind() == ErrorKind::AtCapacity => refused += 1,
                // Admitted before the slowdown was measured, or a SET the
                // slowed server did not answer in time.
                Ok(_) | Err(_) => {}
            }
        }

        let present = present(&server, "k", count).await;
        stop.store(true, Ordering::Relaxed);
        let kept = held_where_present(&guards, &present, "k");
        assert!(
            kept > 0,
            "every one of {count} locks was lost: a cliff, not a degradation"
        );
        assert!(
            kept < count,
            "the slowed server renewed all {count} locks: the test did not overload it"
        );
        assert!(
            warnings.0.load(Ordering::Relaxed) > 0,
            "the heartbeat lost {} locks without reporting overload",
            count - kept
        );
        assert!(
            refused > 0,
            "the client went on taking new locks while it lost {} of those it held",
            count - kept
        );
        slowing.join().unwrap();
        drop(guards);
    }
    /// A slowdown loses only the leases whose deadlines fall inside it:
    /// thousands of short leases the slowed server cannot all renew, and
    /// beside them leases whose ttl outlasts the slowdown. Those must all
    /// be kept, however late their renewals come (no round that timed out
    /// gives its leases up, no urgent lease's retries crowd them out past
    /// their deadlines), while short ones are lost.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_slowdown_loses_only_the_leases_whose_deadlines_it_passes() {
        let _serial = SERIAL.lock().await;
        let server = RedisServer::start();
        let client = overload_client(&server).await;
        let (urgent_ttl, urgent_count) = (Duration::from_millis(1500), 16000);
        let (long_ttl, long_count) = (Duration::from_secs(12), 1000);
        let slowdown = Duration::from_secs(3);
        let long = take(&client, "long", long_count, long_ttl).await;
        let urgent = take(&client, "urgent", urgent_count, urgent_ttl).await;

        let stop = Arc::new(AtomicBool::new(false));
        let slowing = slow_down(server.port(), stop.clone());
        let started = tokio::time::Instant::now();
        tokio::time::sleep(slowdown).await;
        stop.store(true, Ordering::Relaxed);
        slowing.join().unwrap();
        let slowed = started.elapsed();
        // A long lease always has at least a third of its ttl left (it is
        // renewed by then at the latest), so the slowdown ended before any
        // long lease's deadline.
        assert!(
            slowed < long_ttl / 3,
            "the slowdown lasted {slowed:?}: the test cannot tell what it forced"
        );
        // Past every long lease's deadline as it stood when the slowdown
        // began: each kept one was renewed since, during the slowdown or
        // after it.
        tokio::time::sleep_until(started + long_ttl + Duration::from_secs(1)).await;

        let long_present = present(&server, "long", long_count).await;
        let urgent_present = present(&server, "urgent", urgent_count).await;
        let long_kept = held_where_present(&long, &long_present, "long");
        let urgent_kept = held_where_present(&urgent, &urgent_present, "urgent");
        println!(
            "slowed for {slowed:?}: kept {long_kept} of {long_count} long leases, \
             {urgent_kept} of {urgent_count} short ones"
        );
        assert!(
            urgent_kept < urgent_count,
            "the slowed server renewed every short lease: the test did not overload it"
        );
        assert_eq!(
            long_kept, long_count,
            "leases whose deadlines lay past the slowdown were lost"
        );
        drop((long, urgent));
    }
}
