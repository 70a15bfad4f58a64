//! Operating locks: who holds a lock (`inspect`), which are held (`list`),
//! and breaking one (`force_release`), on one server, a Redis Cluster and
//! the in-memory store.

use crate::support::{self, Backend, Store, client_with};
use lock_core::{LockClient, LockKind, LockOptions, LossReason};
use std::time::Duration;
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(3);

async fn client(backend: &Backend, prefix: &str, holder: &str) -> LockClient {
    client_with(
        backend,
        LockClient::builder()
            .key_prefix(prefix)
            .holder_name(holder)
            .default_wait(Duration::from_secs(5)),
    )
    .await
}

/// The holder's name, how long it has held the lock, what is left of its
/// lease and its fencing token, as the guard itself sees them.
async fn inspect_names_the_holder(backend: &Backend) {
    let a = client(backend, "ops:", "worker-a").await;
    let b = client(backend, "ops:", "worker-b").await;
    assert!(b.inspect("job").await.unwrap().is_none());
    let guard = a.lock("job", TTL).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let state = b.inspect("job").await.unwrap().expect("held");
    assert_eq!(state.key(), "job");
    assert_eq!(state.kind(), LockKind::Exclusive);
    assert_eq!(state.holder(), Some("worker-a"));
    let held = state.held_for().expect("the value carries the time");
    assert!(
        held >= Duration::from_millis(200) && held < Duration::from_secs(2),
        "{held:?}"
    );
    assert!(state.remaining() <= TTL && state.remaining() > Duration::from_secs(1));
    assert_eq!(state.fencing_token(), None);
    assert_eq!(state.holders(), 1);
    guard.release().await.unwrap();
    assert!(b.inspect("job").await.unwrap().is_none());

    let fenced = a
        .lock_with("fenced", LockOptions::new(TTL).fencing(true))
        .await
        .unwrap();
    let state = b.inspect("fenced").await.unwrap().expect("held");
    assert_eq!(state.fencing_token(), fenced.fencing_token());
    assert!(state.fencing_token().is_some());
    fenced.release().await.unwrap();
}

/// Shared holders and permits are counted, not named.
async fn inspect_counts_shared_holders(backend: &Backend) {
    let a = client(backend, "ops:", "worker-a").await;
    let one = a
        .lock_with("r", LockOptions::new(TTL).shared(true))
        .await
        .unwrap();
    let two = a
        .lock_with("r", LockOptions::new(TTL).shared(true))
        .await
        .unwrap();
    let state = a.inspect("r").await.unwrap().expect("held");
    assert_eq!(state.kind(), LockKind::Shared);
    assert_eq!(state.holders(), 2);
    assert_eq!(state.holder(), None);
    let permit = a
        .lock_with("p", LockOptions::new(TTL).permits(3))
        .await
        .unwrap();
    let state = a.inspect("p").await.unwrap().expect("held");
    assert_eq!(state.kind(), LockKind::Permits(3));
    assert_eq!(state.holders(), 1);
    // Breaking a shared lock evicts every holder, and each learns why.
    let evicted = a.evict("r").await.unwrap().expect("held");
    assert_eq!(evicted.kind(), LockKind::Shared);
    assert_eq!(evicted.holders(), 2);
    assert!(a.inspect("r").await.unwrap().is_none());
    for guard in [&one, &two] {
        tokio::time::timeout(TTL, guard.lost()).await.unwrap();
        assert_eq!(guard.loss_reason(), Some(LossReason::ForceReleased));
    }
    drop((one, two));
    permit.release().await.unwrap();
}

/// A forced release frees the key for a waiter at once (its wake-up is
/// published), and the evicted guard learns why at its next renewal.
async fn force_release_wakes_waiters_and_tells_the_holder(backend: &Backend) {
    let a = client(backend, "ops:", "worker-a").await;
    let b = client(backend, "ops:", "worker-b").await;
    let op = client(backend, "ops:", "operator").await;
    let held = a.lock("stuck", TTL).await.unwrap();
    let waiter = tokio::spawn({
        let b = b.clone();
        async move {
            let started = Instant::now();
            let guard = b.lock("stuck", TTL).await.unwrap();
            (guard, started.elapsed())
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let evicted = op
        .evict("stuck")
        .await
        .unwrap()
        .expect("something was held");
    assert_eq!(evicted.holder(), Some("worker-a"));
    assert_eq!(evicted.holders(), 1);
    // What the broken lease had left (renewed a third of the ttl ago at
    // most), for the operator's record: not zero.
    assert!(
        evicted.remaining() > TTL / 2 && evicted.remaining() <= TTL,
        "{:?}",
        evicted.remaining()
    );
    let (guard, waited) = waiter.await.unwrap();
    assert!(waited < Duration::from_secs(2), "{waited:?}");
    // The evicted holder finds out within a third of its ttl and a bit.
    tokio::time::timeout(TTL, held.lost())
        .await
        .expect("the evicted guard reports its loss");
    assert_eq!(held.loss_reason(), Some(LossReason::ForceReleased));
    let state = op
        .inspect("stuck")
        .await
        .unwrap()
        .expect("the waiter holds it");
    assert_eq!(state.holder(), Some("worker-b"));
    guard.release().await.unwrap();
    assert!(
        !op.force_release("stuck").await.unwrap(),
        "nothing held now"
    );

    // A lock on several keys is lost when one of them is broken.
    let both = a
        .lock_all(&["pair:1", "pair:2"], LockOptions::new(TTL))
        .await
        .unwrap();
    assert!(op.force_release("pair:2").await.unwrap());
    tokio::time::timeout(TTL, both.lost()).await.unwrap();
    assert_eq!(both.loss_reason(), Some(LossReason::ForceReleased));
    drop(both);
    // The other key may stay until its ttl: the lost guard's drop does
    // not count on it.
    op.force_release("pair:1").await.unwrap();
}

/// Every held lock under the prefix, page after page; other prefixes and
/// the fence counters are not locks.
async fn list_finds_every_held_lock(backend: &Backend) {
    let a = client(backend, "ops:", "worker-a").await;
    let other = client(backend, "elsewhere:", "worker-z").await;
    let mut guards = Vec::new();
    for i in 0..30 {
        let options = LockOptions::new(TTL).fencing(i % 2 == 0);
        guards.push(a.lock_with(&format!("order:{i}"), options).await.unwrap());
    }
    guards.push(a.lock("invoice:1", TTL).await.unwrap());
    let _theirs = other.lock("order:99", TTL).await.unwrap();

    let all = a.list_all(None).await.unwrap();
    assert_eq!(all.len(), 31, "{all:?}");
    assert!(all.iter().all(|s| s.holder() == Some("worker-a")));
    let orders = a.list_all(Some("order:*")).await.unwrap();
    assert_eq!(orders.len(), 30);
    let fenced = orders
        .iter()
        .filter(|s| s.fencing_token().is_some())
        .count();
    assert_eq!(fenced, 15);

    // Paging by hand reaches the same locks.
    let mut seen = Vec::new();
    let mut cursor = None;
    loop {
        let page = a.list(Some("order:*"), cursor).await.unwrap();
        seen.extend(page.locks.into_iter().map(|s| s.key().to_owned()));
        match page.next {
            Some(next) => cursor = Some(next.to_string().parse().unwrap()),
            None => break,
        }
    }
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), 30);
    for guard in guards {
        guard.release().await.unwrap();
    }
    assert!(a.list_all(None).await.unwrap().is_empty());
}

async fn every_operation(backend: Backend) {
    inspect_names_the_holder(&backend).await;
    inspect_counts_shared_holders(&backend).await;
    force_release_wakes_waiters_and_tells_the_holder(&backend).await;
    list_finds_every_held_lock(&backend).await;
    let _ = backend.logs();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_on_one_server() {
    every_operation(Backend::server()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_on_a_cluster() {
    every_operation(Backend::cluster()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_in_memory() {
    every_operation(Backend::memory()).await;
}

/// The stored value: `<token>|<acquired ms>|<fence>|<holder>`, a plain
/// string key with an expiry, so other clients still see a lock.
#[tokio::test]
async fn the_value_names_holder_time_and_fence() {
    let backend = Backend::server();
    let Backend::Server(server) = &backend else {
        unreachable!()
    };
    let a = client(&backend, "ops:", "billing-7").await;
    let guard = a.lock("v", TTL).await.unwrap();
    let value: String = server.cmd(&["GET", "ops:{v}"]);
    let fields: Vec<&str> = value.splitn(4, '|').collect();
    assert_eq!(fields.len(), 4, "{value}");
    assert_eq!(fields[0].len(), 32);
    assert!(fields[0].bytes().all(|b| b.is_ascii_hexdigit()));
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let acquired: i64 = fields[1].parse().unwrap();
    assert!((now_ms - acquired).abs() < 5_000, "{value}");
    assert_eq!(fields[2], "");
    assert_eq!(fields[3], "billing-7");
    let kind: String = server.cmd(&["TYPE", "ops:{v}"]);
    assert_eq!(kind, "string");
    assert!(server.cmd::<i64>(&["PTTL", "ops:{v}"]) > 0);
    // Renewal and release still recognise the token inside the value.
    guard.extend(Duration::from_secs(10)).await.unwrap();
    assert!(server.cmd::<i64>(&["PTTL", "ops:{v}"]) > 5_000);
    assert!(guard.release().await.unwrap());

    let fenced = a
        .lock_with("f", LockOptions::new(TTL).fencing(true))
        .await
        .unwrap();
    let value: String = server.cmd(&["GET", "ops:{f}"]);
    let fence = fenced.fencing_token().unwrap().to_string();
    assert_eq!(value.split('|').nth(2), Some(fence.as_str()), "{value}");
    fenced.release().await.unwrap();
}

/// A key of another type is reported, never deleted.
#[tokio::test]
async fn a_foreign_key_is_shown_and_left_alone() {
    let backend = Backend::server();
    let Backend::Server(server) = &backend else {
        unreachable!()
    };
    let a = client(&backend, "ops:", "worker-a").await;
    let () = server.cmd(&["HSET", "ops:{h}", "field", "value"]);
    let state = a.inspect("h").await.unwrap().expect("something is there");
    assert_eq!(state.kind(), LockKind::Foreign);
    let err = a.force_release("h").await.unwrap_err();
    assert_eq!(err.kind(), lock_core::ErrorKind::InvalidKey, "{err}");
    let kind: String = server.cmd(&["TYPE", "ops:{h}"]);
    assert_eq!(kind, "hash");
    // A foreign client's plain lock (redis-py's value, no expiry) is held
    // by an unnamed holder and can be broken.
    let () = server.cmd(&["SET", "ops:{py}", "d2f0c5a4b0e611ee8c90f2d3a4b5c6d7"]);
    let state = a.inspect("py").await.unwrap().expect("held");
    assert_eq!(state.holder(), None);
    assert!(!state.expires());
    assert!(a.force_release("py").await.unwrap());
    assert_eq!(server.cmd::<i64>(&["EXISTS", "ops:{py}"]), 0);
}

/// A holder name out of range is refused when the client is built.
#[tokio::test]
async fn holder_names_are_checked() {
    let store = lock_core::MemoryStore::new();
    let too_long = "x".repeat(lock_core::MAX_HOLDER_LEN + 1);
    for bad in [String::new(), too_long, "two\nlines".to_owned()] {
        let err = LockClient::builder()
            .in_memory(&store)
            .holder_name(bad)
            .build()
            .await
            .unwrap_err();
        assert_eq!(err.kind(), lock_core::ErrorKind::Config, "{err}");
    }
    // The default names this host and process.
    let client = LockClient::builder()
        .in_memory(&store)
        .build()
        .await
        .unwrap();
    let _guard = client.lock("d", TTL).await.unwrap();
    let holder = client.inspect("d").await.unwrap().unwrap();
    let holder = holder.holder().unwrap();
    assert!(
        holder.ends_with(&format!(":{}", std::process::id())),
        "{holder}"
    );
}

/// Redlock: inspect and force_release ask every server; listing is refused
/// (each server's keys differ while locks come and go).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_on_redlock() {
    let backend = Backend::redlock();
    let a = client(&backend, "ops:", "worker-a").await;
    let guard = a
        .lock_with("r", LockOptions::new(TTL).fencing(true))
        .await
        .unwrap();
    let state = a.inspect("r").await.unwrap().expect("held");
    assert_eq!(state.holder(), Some("worker-a"));
    // The lift wrote the chosen token into the value on the servers.
    assert_eq!(state.fencing_token(), guard.fencing_token());
    let err = a.list_all(None).await.unwrap_err();
    assert_eq!(err.kind(), lock_core::ErrorKind::Config, "{err}");
    assert!(a.force_release("r").await.unwrap());
    assert!(!backend.holds(&a.storage_key("r").unwrap()));
    tokio::time::timeout(TTL, guard.lost()).await.unwrap();
    assert_eq!(guard.loss_reason(), Some(LossReason::ForceReleased));
}

/// Redlock: a server that grants after the majority decided holds the same
/// token with a fence of its own (its counter was never lifted). `inspect`
/// reports what a majority holds, the holder's fencing token, and does not
/// wait for a server that stopped answering.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_inspect_goes_by_the_majority() {
    let servers = lock_testkit::start_servers(3);
    let proxy = lock_testkit::Proxy::start(servers[2].addr());
    let node_timeout = Duration::from_secs(3);
    let a = support::build(
        LockClient::builder()
            // The late server first: an answer taken in server order would
            // be its own.
            .urls([proxy.url(), servers[0].url(), servers[1].url()])
            .key_prefix("ops:")
            .holder_name("worker-a")
            .node_timeout(node_timeout),
        &servers,
    )
    .await;
    a.ping().await.unwrap();
    let storage_key = a.storage_key("late").unwrap();
    // The proxied server answers 500 ms after the others.
    proxy.set_mode(lock_testkit::ProxyMode::Delay(Duration::from_millis(250)));
    let guard = a
        .lock_with("late", LockOptions::new(TTL).fencing(true))
        .await
        .unwrap();
    let token = guard.fencing_token().expect("fenced");
    support::eventually(Duration::from_secs(5), "the late server grants", || {
        servers[2].cmd::<i64>(&["EXISTS", &storage_key]) == 1
    })
    .await;
    let fence_on = |server: &lock_testkit::RedisServer| {
        let value: String = server.cmd(&["GET", &storage_key]);
        value.split('|').nth(2).unwrap().to_owned()
    };
    assert_eq!(fence_on(&servers[0]), token.to_string());
    assert_ne!(
        fence_on(&servers[2]),
        token.to_string(),
        "the late server's value has a fence of its own"
    );
    proxy.set_mode(lock_testkit::ProxyMode::Pass);
    for _ in 0..10 {
        let state = a.inspect("late").await.unwrap().expect("held");
        assert_eq!(state.fencing_token(), Some(token));
        assert_eq!(state.holder(), Some("worker-a"));
    }

    // One server silent: the other two agree, and inspect answers at once.
    proxy.set_mode(lock_testkit::ProxyMode::Blackhole);
    let started = Instant::now();
    let state = a.inspect("late").await.unwrap().expect("held");
    assert_eq!(state.fencing_token(), Some(token));
    let took = started.elapsed();
    assert!(took < node_timeout / 2, "inspect took {took:?}");
    proxy.set_mode(lock_testkit::ProxyMode::Pass);
    guard.release().await.unwrap();
}
