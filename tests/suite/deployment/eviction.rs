//! A server that may evict lock keys (`maxmemory` with any policy but
//! `noeviction`): `build` warns once, naming the policy and what to change,
//! or, with `refuse_evicting_servers(true)`, fails with a `Config` error
//! naming it. `noeviction` and no `maxmemory` build silently. Under the
//! documented least ACL (`+info`) the check runs; a user without `+info`
//! builds unchecked, unless refusing was asked.

use crate::acl::{create_user, documented_rules, server, user_url};
use lock_core::{ErrorKind, LockClient, LockClientBuilder, LockError};
use lock_testkit::{RedisServer, start_servers};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

/// Every policy that evicts once `maxmemory` is reached.
const EVICTING: [&str; 7] = [
    "allkeys-lru",
    "allkeys-lfu",
    "allkeys-random",
    "volatile-lru",
    "volatile-lfu",
    "volatile-random",
    "volatile-ttl",
];

const BOUND: Duration = Duration::from_secs(10);

/// The text of every WARN event seen on this thread.
#[derive(Clone, Default)]
struct Warnings(Arc<Mutex<Vec<String>>>);

impl<S: Subscriber> Layer<S> for Warnings {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        if *event.metadata().level() == Level::WARN {
            let mut text = String::new();
            event.record(
                &mut |field: &tracing::field::Field, value: &dyn std::fmt::Debug| {
                    text.push_str(&format!("{}={value:?} ", field.name()));
                },
            );
            self.0.lock().unwrap().push(text);
        }
    }
}

/// Builds `builder`, returning the result and the warnings it logged. The
/// subscriber is this thread's: the tests here run on a current-thread
/// runtime, where `build` runs.
async fn build_seen(builder: LockClientBuilder) -> (Result<LockClient, LockError>, Vec<String>) {
    let warnings = Warnings::default();
    let _seen =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(warnings.clone()));
    let built = tokio::time::timeout(BOUND, builder.build())
        .await
        .expect("build is bounded");
    let seen = warnings.0.lock().unwrap().clone();
    (built, seen)
}

fn builder() -> LockClientBuilder {
    LockClient::builder()
        .key_prefix("evict:")
        .operation_timeout(Duration::from_secs(1))
}

/// The warnings about eviction among `seen`.
fn about_eviction(seen: &[String]) -> Vec<&String> {
    seen.iter()
        .filter(|w| w.contains("may evict lock keys"))
        .collect()
}

fn set_policy(server: &RedisServer, maxmemory: &str, policy: &str) {
    let _: () = server.cmd(&["CONFIG", "SET", "maxmemory", maxmemory]);
    let _: () = server.cmd(&["CONFIG", "SET", "maxmemory-policy", policy]);
}

/// Each evicting policy: one warning naming it and what to change, or
/// refused; then `noeviction` and no `maxmemory`, silent.
#[tokio::test]
async fn each_evicting_policy_is_warned_about_or_refused() {
    // Started with a policy, as a managed service's default would be.
    let server = RedisServer::builder()
        .args(["--maxmemory", "64mb", "--maxmemory-policy", "volatile-lru"])
        .start();
    for policy in EVICTING {
        set_policy(&server, "64mb", policy);
        let (built, seen) = build_seen(builder().url(server.url())).await;
        built.unwrap_or_else(|e| panic!("{policy}: {e}"));
        let warned = about_eviction(&seen);
        assert_eq!(warned.len(), 1, "{policy}: {seen:#?}");
        for needle in [
            policy,
            "maxmemory-policy noeviction",
            "renewal",
            "refuse_evicting_servers",
        ] {
            assert!(
                warned[0].contains(needle),
                "{policy}: {needle} not in {}",
                warned[0]
            );
        }

        let (built, seen) =
            build_seen(builder().url(server.url()).refuse_evicting_servers(true)).await;
        let err = built.expect_err(policy);
        assert_eq!(err.kind(), ErrorKind::Config, "{policy}: {err}");
        let text = err.to_string();
        assert!(
            text.contains(&format!("maxmemory-policy {policy}")),
            "{text}"
        );
        assert!(text.contains("maxmemory-policy noeviction"), "{text}");
        assert!(
            about_eviction(&seen).is_empty(),
            "{policy}: refused and warned"
        );
    }
    for (maxmemory, policy) in [("64mb", "noeviction"), ("0", "allkeys-lru")] {
        set_policy(&server, maxmemory, policy);
        let (built, seen) =
            build_seen(builder().url(server.url()).refuse_evicting_servers(true)).await;
        built.unwrap_or_else(|e| panic!("{maxmemory} {policy}: {e}"));
        let (built, seen_too) = build_seen(builder().url(server.url())).await;
        built.unwrap();
        assert!(about_eviction(&seen).is_empty(), "{policy}: {seen:#?}");
        assert!(
            about_eviction(&seen_too).is_empty(),
            "{policy}: {seen_too:#?}"
        );
    }
}

/// Redlock: each server is read, and the one that may evict is named.
#[tokio::test]
async fn redlock_names_the_evicting_server() {
    let servers = start_servers(3);
    set_policy(&servers[1], "64mb", "allkeys-lfu");
    let urls = servers.iter().map(RedisServer::url);
    let (built, _) = build_seen(builder().urls(urls).refuse_evicting_servers(true)).await;
    let err = built.expect_err("the second server evicts");
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    let text = err.to_string();
    assert!(
        text.contains(&format!("127.0.0.1:{}", servers[1].port())),
        "{text}"
    );
    assert!(
        !text.contains(&format!("127.0.0.1:{}", servers[0].port())),
        "{text}"
    );
}

/// The documented least user may run `INFO`: the check runs under it. A
/// user without `+info` builds unchecked, unless refusing was asked, and
/// is then told to grant `+info`.
#[tokio::test]
async fn the_least_acl_user_is_checked_and_without_info_says_so() {
    let server = server();
    set_policy(&server, "64mb", "volatile-ttl");
    create_user(&server, "locker", &documented_rules("locker", "evict:"));
    let without_info: Vec<String> = documented_rules("locker", "evict:")
        .into_iter()
        .filter(|rule| rule != "+info")
        .collect();
    create_user(&server, "no-info", &without_info);

    let least = || builder().url(user_url(&server, "locker"));
    let (built, seen) = build_seen(least()).await;
    built.unwrap();
    assert_eq!(about_eviction(&seen).len(), 1, "{seen:#?}");
    let (built, _) = build_seen(least().refuse_evicting_servers(true)).await;
    assert_eq!(built.unwrap_err().kind(), ErrorKind::Config);

    let no_info = || builder().url(user_url(&server, "no-info"));
    let (built, seen) = build_seen(no_info()).await;
    built.unwrap();
    assert!(about_eviction(&seen).is_empty(), "{seen:#?}");
    let (built, _) = build_seen(no_info().refuse_evicting_servers(true)).await;
    let err = built.unwrap_err();
    let text = err.to_string();
    assert_eq!(err.kind(), ErrorKind::Server, "{text}");
    assert!(
        text.contains("refuse_evicting_servers(true) needs"),
        "{text}"
    );
    assert!(text.contains("+info"), "{text}");
}
