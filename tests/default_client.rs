//! Scoped default clients: `with_default_client` and `set_default_client`
//! give `#[distributed_lock]` functions without `client = ..` a client of
//! their own, so that tests running at once in one binary do not share
//! (and fight over) the process-wide one.
//!
//! Every client here is in memory, each test's on a store of its own; which
//! store a body's lock landed on tells which client the attribute used.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use lock_core::{
    LockClient, LockError, MemoryStore, default_client, distributed_lock, set_default_client,
    set_global_client, with_default_client,
};
use std::sync::OnceLock;
use std::time::Duration;

/// The store of the process-wide client, installed on first use. Every
/// test calls it first, so the global is there whichever runs first: the
/// scopes must win over it, not merely stand in for a missing one.
fn global_store() -> &'static MemoryStore {
    static STORE: OnceLock<MemoryStore> = OnceLock::new();
    STORE.get_or_init(|| {
        let store = MemoryStore::new();
        set_global_client(LockClient::in_memory_on(&store)).unwrap();
        store
    })
}

/// Whether `key` is held on `store`, as another client of it sees it. Only
/// a look: tests that probe the same key on the global store at the same
/// moment must not see each other's probe as a holder.
async fn held_on(store: &MemoryStore, key: &str) -> bool {
    let other = LockClient::in_memory_on(store);
    other.inspect(key).await.unwrap().is_some()
}

/// The same key in both isolation tests, taken without waiting and held a
/// while: through one shared client, whichever test came second while the
/// other held it would fail with `Contended`.
#[distributed_lock(key = "nightly-report", ttl = "10s", wait = "0s")]
async fn nightly_report(store: &MemoryStore) -> Result<bool, LockError> {
    tokio::time::sleep(Duration::from_millis(300)).await;
    Ok(held_on(store, "nightly-report").await)
}

/// Reports whether its lock is on `store`, waiting for the key if need be.
#[distributed_lock(key = "job:{name}", ttl = "10s", wait = "5s")]
async fn job(name: &str, store: &MemoryStore) -> Result<bool, LockError> {
    Ok(held_on(store, &format!("job:{name}")).await)
}

/// One of the two isolation tests: its own client, its own store.
async fn run_isolated() {
    global_store();
    let store = MemoryStore::new();
    let client = LockClient::in_memory_on(&store);
    let on_own_store = with_default_client(client, nightly_report(&store)).await;
    assert!(on_own_store.unwrap(), "locked on this test's store");
    assert!(!held_on(global_store(), "nightly-report").await);
}

#[tokio::test]
async fn one_test_locks_on_its_own_client() {
    run_isolated().await;
}

#[tokio::test]
async fn another_test_at_once_locks_the_same_key_on_its_own() {
    run_isolated().await;
}

#[tokio::test]
async fn outside_any_scope_the_global_client_is_used() {
    let global = global_store();
    assert!(job("outside", global).await.unwrap());
    let own = MemoryStore::new();
    with_default_client(LockClient::in_memory_on(&own), async {
        assert!(job("outside", &own).await.unwrap());
    })
    .await;
    // The scope ended with its future.
    assert!(job("outside", global).await.unwrap());
}

#[tokio::test]
async fn nested_scopes_restore_the_outer_one() {
    global_store();
    let (outer, inner) = (MemoryStore::new(), MemoryStore::new());
    let outer_client = LockClient::in_memory_on(&outer);
    with_default_client(outer_client.clone(), async {
        assert!(job("nested", &outer).await.unwrap());
        let in_inner = with_default_client(LockClient::in_memory_on(&inner), async {
            job("nested", &inner).await.unwrap()
        });
        assert!(in_inner.await);
        assert!(job("nested", &outer).await.unwrap(), "the outer is back");
        assert_eq!(
            default_client().unwrap().key_prefix(),
            outer_client.key_prefix()
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spawned_task_does_not_inherit_the_scope_unless_wrapped() {
    let global = global_store();
    let own = MemoryStore::new();
    let client = LockClient::in_memory_on(&own);
    let scope = client.clone();
    with_default_client(scope, async move {
        // Another task: the process-wide client.
        let spawned = tokio::spawn(async { job("spawned", global_store()).await });
        assert!(spawned.await.unwrap().unwrap(), "on the global store");
        // Wrapped again: the scope's client.
        let own_copy = own.clone();
        let wrapped = tokio::spawn(with_default_client(client, async move {
            job("spawned", &own_copy).await
        }));
        assert!(wrapped.await.unwrap().unwrap(), "on the scope's store");
    })
    .await;
    assert!(!held_on(global, "job:spawned").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scope_follows_its_future_across_threads() {
    global_store();
    let own = MemoryStore::new();
    let scoped = with_default_client(LockClient::in_memory_on(&own), {
        let own = own.clone();
        async move {
            let mut on_own = true;
            for _ in 0..20 {
                // Each yield may resume on another worker thread.
                tokio::task::yield_now().await;
                on_own &= job("moving", &own).await.unwrap();
            }
            on_own
        }
    });
    assert!(tokio::spawn(scoped).await.unwrap());
}

#[tokio::test]
async fn a_thread_guard_sets_the_default_until_dropped() {
    let global = global_store();
    let (first, second) = (MemoryStore::new(), MemoryStore::new());
    let first_guard = set_default_client(LockClient::in_memory_on(&first));
    assert!(job("guard", &first).await.unwrap());
    {
        let _second_guard = set_default_client(LockClient::in_memory_on(&second));
        assert!(job("guard", &second).await.unwrap());
        // A task scope wins over the thread's guard.
        let scoped = MemoryStore::new();
        let in_scope = with_default_client(LockClient::in_memory_on(&scoped), async {
            job("guard", &scoped).await.unwrap()
        });
        assert!(in_scope.await);
    }
    assert!(job("guard", &first).await.unwrap(), "the first is back");
    drop(first_guard);
    assert!(job("guard", global).await.unwrap(), "then the global");
}
