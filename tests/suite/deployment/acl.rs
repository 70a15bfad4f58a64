//! The least ACL of docs/deployment.md, on a real server: the users are
//! created from the very lines of that page, so the page and the tests
//! cannot drift. Under the lock client's user every lock kind acquires,
//! renews past a renewal (1 s ttls), releases and wakes its waiters, and
//! `ACL LOG` stays empty; the error a refusal gives lists exactly the
//! documented rules. `lockctl`'s case is in lock-cli/tests/lockctl.rs.

use crate::acl::{create_user, documented_rules, refusals, server, user_url};
use crate::support::{eventually, subscribers};
use futures::future::{BoxFuture, FutureExt, join_all};
use lock_core::{ErrorKind, LockClient, LockError, LockGuard, LockOptions, distributed_lock};
use lock_testkit::RedisServer;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Barrier;
use tokio::task::JoinHandle;
use tokio::time::{Instant, timeout};

const PREFIX: &str = "least:";

/// Short, so that every case renews within a second or two.
const TTL: Duration = Duration::from_secs(1);

/// Bound on anything expected to finish.
const BOUND: Duration = Duration::from_secs(10);

/// How soon after a release a subscribed waiter has the lock, with room
/// for a loaded two-core machine (it takes a few milliseconds).
const WOKEN: Duration = Duration::from_millis(500);

/// A client of user `user`, named `holder`.
async fn client_as(server: &RedisServer, user: &str, holder: &str) -> LockClient {
    timeout(
        BOUND,
        LockClient::builder()
            .url(user_url(server, user))
            .key_prefix(PREFIX)
            .holder_name(holder)
            .default_wait(BOUND)
            .operation_timeout(Duration::from_secs(1))
            .build(),
    )
    .await
    .expect("build is bounded")
    .unwrap_or_else(|e| panic!("client for {user}: {e}\n{}", server.log()))
}

/// Everything a case needs: the server, two holders and a waiter.
struct Ctx {
    server: RedisServer,
    a: LockClient,
    b: LockClient,
    waiter: LockClient,
}

impl Ctx {
    /// Holds `guard` (of lock `key`, `what` for messages) past a renewal:
    /// a ttl and a third later its key still exists, so it was renewed, and
    /// the guard is not lost.
    async fn hold_past_renewal(&self, what: &str, key: &str, guard: &LockGuard) {
        tokio::time::sleep(TTL + TTL / 3).await;
        let storage = self.a.storage_key(key).unwrap();
        assert_eq!(
            self.server.cmd::<i64>(&["EXISTS", &storage]),
            1,
            "{what}: not renewed"
        );
        assert!(!guard.is_lost(), "{what}: lost {:?}", guard.loss_reason());
    }

    /// Waits until a waiter listens for `key`'s release.
    async fn subscribed(&self, what: &str, key: &str) {
        let storage = self.a.storage_key(key).unwrap();
        let waiting = format!("{what}: the waiter subscribes to the release");
        eventually(BOUND, &waiting, || subscribers(&self.server, &storage) >= 1).await;
    }

    /// Releases `guard` and returns when `waiter` has its lock: within
    /// [`WOKEN`].
    async fn release_wakes<T>(&self, what: &str, guard: LockGuard, waiter: JoinHandle<T>) -> T {
        let released = Instant::now();
        assert!(guard.release().await.unwrap(), "{what}: released");
        let got = timeout(BOUND, waiter)
            .await
            .unwrap_or_else(|_| panic!("{what}: the waiter never got the lock"))
            .unwrap();
        let took = released.elapsed();
        assert!(
            took < WOKEN,
            "{what}: the waiter took {took:?} after the release"
        );
        got
    }
}

/// A waiter of `ctx` for `key` with `options`, which releases what it got.
fn wait_for(ctx: &Ctx, key: &str, options: LockOptions) -> JoinHandle<()> {
    let (waiter, key) = (ctx.waiter.clone(), key.to_owned());
    tokio::spawn(async move {
        let guard = waiter.lock_with(&key, options.wait(BOUND)).await.unwrap();
        assert!(guard.release().await.unwrap());
    })
}

async fn exclusive(ctx: &Ctx) {
    let guard = ctx.a.lock("exclusive", TTL).await.unwrap();
    guard.extend(TTL * 2).await.unwrap();
    let waiter = wait_for(ctx, "exclusive", LockOptions::new(TTL));
    ctx.hold_past_renewal("exclusive", "exclusive", &guard)
        .await;
    ctx.subscribed("exclusive", "exclusive").await;
    ctx.release_wakes("exclusive", guard, waiter).await;
}

async fn several_keys(ctx: &Ctx) {
    let guard = ctx
        .a
        .lock_all(&["all:1", "all:2"], LockOptions::new(TTL))
        .await
        .unwrap();
    let waiter = wait_for(ctx, "all:2", LockOptions::new(TTL));
    ctx.hold_past_renewal("lock_all", "all:1", &guard).await;
    ctx.hold_past_renewal("lock_all", "all:2", &guard).await;
    ctx.subscribed("lock_all", "all:2").await;
    ctx.release_wakes("lock_all", guard, waiter).await;
}

async fn shared(ctx: &Ctx) {
    let shared = LockOptions::new(TTL).shared(true);
    let first = ctx.a.lock_with("shared", shared.clone()).await.unwrap();
    let second = ctx.b.lock_with("shared", shared).await.unwrap();
    let writer = wait_for(ctx, "shared", LockOptions::new(TTL));
    ctx.hold_past_renewal("shared", "shared", &first).await;
    assert!(!second.is_lost(), "shared: the second holder lost");
    ctx.subscribed("shared", "shared").await;
    assert!(second.release().await.unwrap());
    ctx.release_wakes("shared", first, writer).await;
}

async fn permits(ctx: &Ctx) {
    let two = LockOptions::new(TTL).permits(2);
    let first = ctx.a.lock_with("permits", two.clone()).await.unwrap();
    let second = ctx.b.lock_with("permits", two.clone()).await.unwrap();
    let third = wait_for(ctx, "permits", two);
    ctx.hold_past_renewal("permits", "permits", &first).await;
    assert!(!second.is_lost(), "permits: the second holder lost");
    ctx.subscribed("permits", "permits").await;
    ctx.release_wakes("permits", first, third).await;
    assert!(second.release().await.unwrap());
}

async fn fenced(ctx: &Ctx) {
    let fenced = LockOptions::new(TTL).fencing(true);
    let guard = ctx.a.lock_with("fenced", fenced.clone()).await.unwrap();
    let token = guard.fencing_token().unwrap();
    let waiter = ctx.waiter.clone();
    let next = tokio::spawn(async move {
        let guard = waiter
            .lock_with("fenced", fenced.wait(BOUND))
            .await
            .unwrap();
        let next = guard.fencing_token().unwrap();
        assert!(guard.release().await.unwrap());
        next
    });
    ctx.hold_past_renewal("fenced", "fenced", &guard).await;
    ctx.subscribed("fenced", "fenced").await;
    let next = ctx.release_wakes("fenced", guard, next).await;
    assert!(next > token, "fenced: {next} after {token}");
}

async fn election(ctx: &Ctx) {
    let leader = ctx.a.campaign("leader", TTL).await.unwrap();
    let term = leader.term();
    let waiter = ctx.waiter.clone();
    let follower = tokio::spawn(async move { waiter.campaign("leader", TTL).await.unwrap() });
    ctx.hold_past_renewal("election", "leader", leader.guard())
        .await;
    ctx.subscribed("election", "leader").await;
    let resigned = Instant::now();
    assert!(leader.resign().await.unwrap());
    let next = timeout(BOUND, follower).await.unwrap().unwrap();
    let took = resigned.elapsed();
    assert!(
        took < WOKEN,
        "election: followed {took:?} after the resignation"
    );
    assert!(
        next.term() > term,
        "election: term {} after {term}",
        next.term()
    );
    assert!(next.resign().await.unwrap());
}

/// Holds `key` as an annotated body and, inside it, takes it again: a
/// re-entry, at once, held past a renewal while a waiter of another
/// client waits; returns that waiter.
#[distributed_lock(key = "{key}", client = client, ttl = "1s")]
async fn reentering(
    client: &LockClient,
    ctx: &Ctx,
    key: &str,
) -> Result<JoinHandle<()>, LockError> {
    let started = Instant::now();
    let inner = client.lock(key, TTL).await?;
    assert!(started.elapsed() < WOKEN, "re-entry: waited for itself");
    let waiter = wait_for(ctx, key, LockOptions::new(TTL));
    ctx.hold_past_renewal("re-entry", key, &inner).await;
    ctx.subscribed("re-entry", key).await;
    // Only the outermost body lets go.
    assert!(inner.release().await?, "re-entry: the inner release");
    assert!(!waiter.is_finished(), "re-entry: the waiter got in early");
    Ok(waiter)
}

async fn reentry(ctx: &Ctx) {
    let waiter = reentering(&ctx.a, ctx, "reentry").await.unwrap();
    let returned = Instant::now();
    timeout(BOUND, waiter).await.unwrap().unwrap();
    let took = returned.elapsed();
    assert!(
        took < WOKEN,
        "re-entry: the waiter took {took:?} after the body"
    );
}

/// Holds `first`, waits at `barrier` until the other owner holds its own,
/// then asks for `second`: the wait records of both meet in a cycle.
#[distributed_lock(key = "{first}", client = client, ttl = "1s")]
async fn hold_then_take(
    client: &LockClient,
    first: &str,
    second: &str,
    barrier: &Barrier,
) -> Result<(), LockError> {
    barrier.wait().await;
    let guard = client.lock(second, TTL).await?;
    guard.release().await?;
    Ok(())
}

async fn deadlock(ctx: &Ctx) {
    let barrier = Arc::new(Barrier::new(2));
    let owners = [
        (ctx.a.clone(), "cycle:1", "cycle:2"),
        (ctx.b.clone(), "cycle:2", "cycle:1"),
    ];
    let calls = owners.into_iter().map(|(client, first, second)| {
        let barrier = barrier.clone();
        tokio::spawn(async move { hold_then_take(&client, first, second, &barrier).await })
    });
    let outcomes: Vec<Result<(), LockError>> = timeout(BOUND, join_all(calls))
        .await
        .expect("deadlock: the cycle is broken within its bound")
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let victims: Vec<&LockError> = outcomes.iter().filter_map(|o| o.as_ref().err()).collect();
    assert_eq!(victims.len(), 1, "deadlock: {outcomes:?}");
    assert_eq!(
        victims[0].kind(),
        ErrorKind::WouldDeadlock,
        "{}",
        victims[0]
    );
}

/// Every lock kind under the documented lock client's user: what a user
/// of shared locks, permits, elections or deadlock detection notices is
/// that it works, and the server refused nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_lock_kind_runs_under_the_documented_user() {
    let server = server();
    create_user(&server, "locker", &documented_rules("locker", PREFIX));
    let ctx = Ctx {
        a: client_as(&server, "locker", "holder-a").await,
        b: client_as(&server, "locker", "holder-b").await,
        waiter: client_as(&server, "locker", "waiter").await,
        server,
    };
    let cases: Vec<(&str, BoxFuture<'_, ()>)> = vec![
        ("exclusive", exclusive(&ctx).boxed()),
        ("lock_all", several_keys(&ctx).boxed()),
        ("shared", shared(&ctx).boxed()),
        ("permits", permits(&ctx).boxed()),
        ("fenced", fenced(&ctx).boxed()),
        ("election", election(&ctx).boxed()),
        ("re-entry", reentry(&ctx).boxed()),
        ("deadlock", deadlock(&ctx).boxed()),
    ];
    let started = Instant::now();
    let names: Vec<&str> = cases.iter().map(|(name, _)| *name).collect();
    timeout(BOUND * 2, join_all(cases.into_iter().map(|(_, case)| case)))
        .await
        .unwrap_or_else(|_| panic!("the cases {names:?} did not end"));
    println!("every kind under the least ACL in {:?}", started.elapsed());
    assert_eq!(refusals(&ctx.server), Vec::new(), "refused");
}

/// A refusal's hint lists exactly the documented rules: a user missing
/// `+zcard` (the rule the page once left out) is told, at a permit's
/// acquisition, to grant what the page's user has.
#[tokio::test]
async fn the_hint_lists_the_documented_rules() {
    let server = server();
    let rules: Vec<String> = documented_rules("locker", PREFIX)
        .into_iter()
        .filter(|rule| rule != "+zcard")
        .collect();
    create_user(&server, "no-zcard", &rules);
    let client = client_as(&server, "no-zcard", "holder").await;
    let err = client
        .lock_with("p", LockOptions::new(TTL).permits(2).wait(Duration::ZERO))
        .await
        .unwrap_err();
    let text = err.to_string();
    eprintln!("{text}");
    assert_eq!(err.kind(), ErrorKind::Server, "{text}");
    let documented = documented_rules("locker", "<prefix>").join(" ");
    assert!(
        text.contains(&format!("a lock client needs {documented} ")),
        "the documented rules {documented:?} not in: {text}"
    );
    assert!(text.contains("+zcard"), "{text}");
}

/// The operators' documented user runs inspect, list and force_release
/// on every kind of lock, shared locks and permits included, without a
/// denial.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operators_documented_user_sees_every_kind() {
    let server = server();
    create_user(&server, "locker", &documented_rules("locker", PREFIX));
    create_user(
        &server,
        "lock-operator",
        &documented_rules("lock-operator", PREFIX),
    );
    let locker = client_as(&server, "locker", "holder").await;
    let operator = client_as(&server, "lock-operator", "operator").await;
    let long = Duration::from_secs(2);
    let exclusive = locker.lock("x", long).await.unwrap();
    let shared = locker
        .lock_with("s", LockOptions::new(long).shared(true))
        .await
        .unwrap();
    let permit = locker
        .lock_with("p", LockOptions::new(long).permits(3))
        .await
        .unwrap();
    for key in ["x", "s", "p"] {
        let state = operator.inspect(key).await.unwrap().unwrap();
        assert_eq!(state.holders(), 1, "{key}: {state:?}");
    }
    assert_eq!(operator.list_all(None).await.unwrap().len(), 3);
    for key in ["x", "s", "p"] {
        assert!(operator.force_release(key).await.unwrap(), "{key}");
    }
    // Each holder learns at its next renewal.
    let lost = join_all([exclusive.lost(), shared.lost(), permit.lost()]);
    timeout(BOUND, lost).await.unwrap();
    assert_eq!(refusals(&server), Vec::new(), "refused");
}

/// A user without the channel pattern: `release` deletes the key (a
/// script is not rolled back) and says what to grant, as every other
/// refusal does.
#[tokio::test]
async fn release_without_the_channel_pattern_says_what_to_grant() {
    let server = server();
    let rules: Vec<String> = documented_rules("locker", PREFIX)
        .into_iter()
        .filter(|rule| !rule.starts_with('&'))
        .collect();
    create_user(&server, "no-channels", &rules);
    let client = client_as(&server, "no-channels", "holder").await;
    let guard = client.lock("c", Duration::from_secs(30)).await.unwrap();
    let key = client.storage_key("c").unwrap();
    let err = guard.release().await.unwrap_err();
    let text = err.to_string();
    eprintln!("{text}");
    assert_eq!(err.kind(), ErrorKind::Server, "{text}");
    assert!(
        text.contains("permission denied by the server's ACL inside a script"),
        "{text}"
    );
    assert!(
        text.contains("may not use the lock's release channel"),
        "{text}"
    );
    assert!(text.contains("ACL SETUSER <user> &<prefix>*"), "{text}");
    assert_eq!(server.cmd::<i64>(&["EXISTS", &key]), 0);
}
