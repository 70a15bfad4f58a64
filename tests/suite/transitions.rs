//! Transitions: the promises hold while the world around a lock changes,
//! not only in steady state. Each test puts a client in one state a user
//! can be in (holding through a guard, an annotated call, `lock_all`, a
//! shared hold, a permit; leading; waiting; watching), makes one transition
//! happen, and checks the outcome the docs promise, with its bound:
//!
//! | transition | outcome |
//! | --- | --- |
//! | the holder's runtime shuts down (current-thread, multi-thread) | released: another process takes it within [`FOLLOWED`] |
//! | the holder's guard dropped on a thread outside any runtime | released within [`FOLLOWED`] |
//! | the holder's process returns from `main` | released within [`FOLLOWED`] |
//! | every connection cut | held leases kept; a waiter and a watcher follow the next change within [`FOLLOWED`] |
//! | the server restarted with its data | the same |
//! | the server restarted without its data | a holder is told `Lost` within its ttl; a leader campaigns again with a larger term |
//! | another runtime of the client blocked | its waiters and watchers elsewhere follow within [`FOLLOWED`] |
//!
//! Every case runs on one server and on Redlock over three; the drops run
//! over TLS too (the holder's connection; the observer's is plain). The observer
//! that takes what was held is patient (a backoff of 5 s, a ttl of 10 s):
//! only hearing the release brings it in within the bound.
//!
//! A process killed with SIGKILL sends nothing: its leases expire at their
//! ttl, which `tests/jepsen.rs` and `tests/leader_processes.rs` cover.

use crate::support::{build, client_with, slow_backoff, storage_key, subscribers};
use futures::StreamExt;
use lock_core::{
    ErrorKind, LockClient, LockClientBuilder, LockError, LockOptions, LossReason, distributed_lock,
};
use lock_testkit::{Proxy, RedisServer, start_servers};
use std::future::Future;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::time::Instant;

const PREFIX: &str = "transitions:";
const KEY: &str = "job";
/// The second key of `lock_all`.
const OTHER: &str = "job-2";
/// What the docs promise: a release or a change is followed within this.
/// The figures printed are a few milliseconds.
const FOLLOWED: Duration = Duration::from_millis(100);
/// The observer's lease and wait: far longer than the bound, so nothing
/// but the release brings it in.
const TTL: Duration = Duration::from_secs(10);
/// The lease of a holder that must be renewed across a transition.
const SHORT_TTL: Duration = Duration::from_secs(2);

/// One state a user holds something in.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Hold {
    Guard,
    Attribute,
    LockAll,
    Shared,
    Permit,
    Leading,
}

const HOLDS: [Hold; 6] = [
    Hold::Guard,
    Hold::Attribute,
    Hold::LockAll,
    Hold::Shared,
    Hold::Permit,
    Hold::Leading,
];

/// The holds `servers` offer: shared holds and permits are not available
/// on Redlock.
fn holds_on(servers: &[RedisServer]) -> Vec<Hold> {
    let redlock = servers.len() > 1;
    HOLDS
        .into_iter()
        .filter(|h| !(redlock && matches!(h, Hold::Shared | Hold::Permit)))
        .collect()
}

fn replica(name: &str) -> LockClientBuilder {
    LockClient::builder()
        .key_prefix(PREFIX)
        .holder_name(name)
        .backoff(slow_backoff())
        .node_timeout(Duration::from_millis(200))
}

fn options(hold: Hold, ttl: Duration) -> LockOptions {
    let options = LockOptions::new(ttl).wait(TTL);
    match hold {
        Hold::Shared => options.shared(true),
        Hold::Permit => options.permits(1),
        _ => options,
    }
}

/// The body of an annotated call that holds `key` until dropped.
#[distributed_lock(key = "{key}", client = client, ttl = "10s", wait = "10s")]
async fn in_body(
    client: &LockClient,
    key: &str,
    held: oneshot::Sender<()>,
) -> Result<(), LockError> {
    let _ = held.send(());
    std::future::pending::<()>().await;
    Ok(())
}

/// Holds `hold` of [`KEY`] through `client` with leases of `ttl` for as
/// long as the future lives; says so on `held` once it does. A loss ends
/// it, saying what was lost.
async fn hold(client: &LockClient, hold: Hold, ttl: Duration, held: oneshot::Sender<()>) -> String {
    let guard = match hold {
        Hold::Attribute => return in_body(client, KEY, held).await.unwrap_err().to_string(),
        Hold::Leading => {
            let leadership = client.campaign(KEY, ttl).await.unwrap();
            let _ = held.send(());
            leadership.lost().await;
            return format!("the leadership: {:?}", leadership.loss_reason());
        }
        Hold::LockAll => client.lock_all(&[KEY, OTHER], options(hold, ttl)).await,
        _ => client.lock_with(KEY, options(hold, ttl)).await,
    };
    let guard = guard.unwrap();
    let _ = held.send(());
    guard.lost().await;
    format!("the lease: {:?}", guard.loss_reason())
}

/// Takes, as another process would, what `hold` held, waiting for it; the
/// moment it did.
async fn take(observer: LockClient, hold: Hold) -> Instant {
    match hold {
        Hold::Leading => {
            let leadership = observer.campaign(KEY, TTL).await.unwrap();
            let at = Instant::now();
            leadership.resign().await.unwrap();
            at
        }
        // An exclusive lock waits for every shared holder.
        Hold::Shared => taken(observer.lock_with(KEY, options(Hold::Guard, TTL)).await),
        _ => taken(observer.lock_with(KEY, options(hold, TTL)).await),
    }
}

fn taken(guard: Result<lock_core::LockGuard, LockError>) -> Instant {
    let at = Instant::now();
    drop(guard.unwrap());
    at
}

/// An observer waiting to take what `hold` holds: spawned, and past its
/// first attempt.
async fn observer_waiting(servers: &[RedisServer], hold: Hold) -> tokio::task::JoinHandle<Instant> {
    let observer = client_with(servers, replica("observer")).await;
    let task = tokio::spawn(take(observer, hold));
    // Its first attempt found the key held and it listens for the release.
    let channel = storage_key(PREFIX, KEY);
    for server in servers {
        let deadline = Instant::now() + Duration::from_secs(5);
        while subscribers(server, &channel) == 0 {
            assert!(Instant::now() < deadline, "the observer never listened");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    task
}

/// `future`, which must end well within the test's time.
async fn bounded<T>(future: impl Future<Output = T>, what: &str) -> T {
    tokio::time::timeout(Duration::from_secs(30), future)
        .await
        .unwrap_or_else(|_| panic!("{what} within 30 s"))
}

fn deployments() -> [Vec<RedisServer>; 2] {
    [vec![RedisServer::start()], start_servers(3)]
}

/// Where a holder that is dropped runs, and how it reaches its servers.
/// The observer always uses plain TCP: the release it hears is sent over
/// the holder's transport.
struct Deployment {
    servers: Vec<RedisServer>,
    /// The CA the servers' TLS certificates are issued by, when the holder
    /// reaches them over TLS.
    ca: Option<String>,
}

impl Deployment {
    /// The holder's URLs and settings.
    fn holder(&self, name: &str) -> LockClientBuilder {
        match &self.ca {
            Some(ca) => replica(name)
                .urls(self.servers.iter().map(RedisServer::tls_url))
                .tls_root_certificate(ca.clone()),
            None => replica(name).urls(self.servers.iter().map(RedisServer::url)),
        }
    }

    /// The deployment, in the test's messages.
    fn name(&self) -> String {
        let over = if self.ca.is_some() { " over TLS" } else { "" };
        format!("{} server(s){over}", self.servers.len())
    }
}

/// [`deployments`], and one server the holder reaches over TLS (where the
/// `redis-server` binary has TLS).
fn drop_deployments() -> Vec<Deployment> {
    let mut each: Vec<Deployment> = deployments()
        .into_iter()
        .map(|servers| Deployment { servers, ca: None })
        .collect();
    let certificates = lock_testkit::TestCertificates::generate();
    match RedisServer::builder().tls(&certificates).try_start() {
        Ok(server) => each.push(Deployment {
            servers: vec![server],
            ca: Some(certificates.ca_pem().to_owned()),
        }),
        Err(e) if e.log_tail().is_some_and(|log| log.contains("TLS support")) => {
            eprintln!("skipped over TLS: this redis-server was built without TLS");
        }
        Err(e) => panic!("{e}"),
    }
    each
}

/// How a holder's runtime ends.
#[derive(Clone, Copy, Debug)]
enum Flavor {
    CurrentThread,
    MultiThread,
}

fn runtime(flavor: Flavor) -> tokio::runtime::Runtime {
    match flavor {
        Flavor::CurrentThread => tokio::runtime::Builder::new_current_thread(),
        Flavor::MultiThread => {
            let mut builder = tokio::runtime::Builder::new_multi_thread();
            builder.worker_threads(2);
            builder
        }
    }
    .enable_all()
    .build()
    .unwrap()
}

/// The holder's client is built on a runtime of its own and holds in a
/// task of it, as a service does; the runtime is then dropped, as
/// returning from `main` drops it. The observer takes it within
/// [`FOLLOWED`] of the drop.
async fn dropped_with_its_runtime(
    deployment: &Deployment,
    hold_what: Hold,
    flavor: Flavor,
) -> Duration {
    let servers = &deployment.servers;
    let builder = deployment.holder("holder");
    let (held_tx, held) = oneshot::channel();
    let (go, stop) = oneshot::channel::<()>();
    let holder = std::thread::spawn(move || {
        let runtime = runtime(flavor);
        runtime.block_on(async move {
            let client = builder.build().await.unwrap();
            tokio::spawn(async move { hold(&client, hold_what, TTL, held_tx).await });
            let _ = stop.await;
        });
        // As `main` returns: the task holding is dropped with the runtime.
        drop(runtime);
    });
    bounded(held, "the holder never held").await.unwrap();
    let follower = observer_waiting(servers, hold_what).await;
    let dropped = Instant::now();
    go.send(()).unwrap();
    let followed = bounded(follower, "never followed").await.unwrap();
    holder.join().unwrap();
    followed.saturating_duration_since(dropped)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_is_held_is_released_when_the_runtime_shuts_down() {
    for deployment in drop_deployments() {
        for flavor in [Flavor::CurrentThread, Flavor::MultiThread] {
            for hold in holds_on(&deployment.servers) {
                let lag = dropped_with_its_runtime(&deployment, hold, flavor).await;
                let name = deployment.name();
                eprintln!("{name}, {flavor:?}, {hold:?}: followed {lag:?} after the runtime went");
                assert!(
                    lag < FOLLOWED,
                    "{name}, {flavor:?} runtime, {hold:?}: followed {lag:?} after the runtime went"
                );
            }
        }
    }
}

/// A guard moved to a plain thread (no runtime there) and dropped: the
/// release is sent all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_dropped_outside_any_runtime_is_released() {
    for deployment in drop_deployments() {
        let servers = &deployment.servers;
        for hold in holds_on(servers)
            .into_iter()
            .filter(|h| !matches!(h, Hold::Attribute | Hold::Leading))
        {
            let client = build(deployment.holder("holder"), &servers[..]).await;
            let guard = match hold {
                Hold::LockAll => client.lock_all(&[KEY, OTHER], options(hold, TTL)).await,
                _ => client.lock_with(KEY, options(hold, TTL)).await,
            }
            .unwrap();
            let follower = observer_waiting(servers, hold).await;
            let dropped = Instant::now();
            std::thread::spawn(move || drop(guard)).join().unwrap();
            let lag = bounded(follower, "never followed")
                .await
                .unwrap()
                .saturating_duration_since(dropped);
            let name = deployment.name();
            eprintln!("{name}, {hold:?} dropped on a plain thread: followed {lag:?}");
            assert!(
                lag < FOLLOWED,
                "{name}, {hold:?}: followed {lag:?} after the drop"
            );
        }
    }
}

/// The child process of [`the_process_returning_from_main_releases`]:
/// holds what `LOCK_TRANSITION_CHILD` names, says `held`, and on a line on
/// its standard input drops its runtime and exits, as a `main` returns.
#[test]
#[ignore = "a child process of the_process_returning_from_main_releases"]
fn holder_process() {
    let Ok(spec) = std::env::var("LOCK_TRANSITION_CHILD") else {
        return;
    };
    let mut parts = spec.split(' ');
    let hold_what = match parts.next().unwrap() {
        "Guard" => Hold::Guard,
        "Attribute" => Hold::Attribute,
        "Leading" => Hold::Leading,
        other => panic!("unknown hold {other}"),
    };
    let urls: Vec<String> = parts.map(str::to_owned).collect();
    let mut builder = replica("child").urls(urls);
    if let Ok(ca) = std::env::var("LOCK_TRANSITION_CA") {
        builder = builder.tls_root_certificate(ca);
    }
    let runtime = runtime(Flavor::MultiThread);
    let (held_tx, held) = oneshot::channel();
    runtime.block_on(async move {
        let client = builder.build().await.unwrap();
        tokio::spawn(async move { hold(&client, hold_what, TTL, held_tx).await });
        held.await.unwrap();
    });
    println!("held");
    std::io::stdout().flush().unwrap();
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    drop(runtime);
    std::process::exit(0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_process_returning_from_main_releases() {
    for deployment in drop_deployments() {
        let servers = &deployment.servers;
        for hold_what in [Hold::Guard, Hold::Attribute, Hold::Leading] {
            let urls: Vec<String> = match deployment.ca {
                Some(_) => servers.iter().map(RedisServer::tls_url).collect(),
                None => servers.iter().map(RedisServer::url).collect(),
            };
            let mut child = Command::new(std::env::current_exe().unwrap());
            child
                .args([
                    "--ignored",
                    "--exact",
                    "transitions::holder_process",
                    "--nocapture",
                ])
                .env(
                    "LOCK_TRANSITION_CHILD",
                    format!("{hold_what:?} {}", urls.join(" ")),
                );
            if let Some(ca) = &deployment.ca {
                child.env("LOCK_TRANSITION_CA", ca);
            }
            let mut child = child
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap();
            let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
            let held = tokio::task::spawn_blocking(move || {
                lines
                    .find(|l| l.as_deref().is_ok_and(|l| l == "held"))
                    .is_some()
            });
            assert!(held.await.unwrap(), "the child never held");
            let follower = observer_waiting(servers, hold_what).await;
            let exited = Instant::now();
            writeln!(child.stdin.take().unwrap(), "go").unwrap();
            let lag = bounded(follower, "never followed")
                .await
                .unwrap()
                .saturating_duration_since(exited);
            let status = tokio::task::spawn_blocking(move || child.wait())
                .await
                .unwrap();
            assert!(status.unwrap().success());
            let name = deployment.name();
            eprintln!("{name}, {hold_what:?}: followed {lag:?} after the process was told to exit");
            assert!(
                lag < FOLLOWED,
                "{name}, {hold_what:?}: followed {lag:?} after the exit"
            );
        }
    }
}

/// A client whose connections all go through proxies, to be cut.
async fn through_proxies(servers: &[RedisServer], name: &str) -> (LockClient, Vec<Proxy>) {
    through_proxies_as(servers, replica(name)).await
}

/// [`through_proxies`] with the settings of `builder`.
async fn through_proxies_as(
    servers: &[RedisServer],
    builder: LockClientBuilder,
) -> (LockClient, Vec<Proxy>) {
    let proxies: Vec<Proxy> = servers.iter().map(|s| Proxy::start(s.addr())).collect();
    let builder = builder.urls(proxies.iter().map(Proxy::url));
    (build(builder, servers).await, proxies)
}

/// What a transition does to the servers, or to the client's connections.
#[derive(Clone, Copy, Debug)]
enum Break {
    Cut,
    Restart,
}

fn apply(how: Break, servers: &mut [RedisServer], proxies: &[Proxy]) {
    match how {
        Break::Cut => proxies.iter().for_each(Proxy::cut),
        Break::Restart => {
            for server in servers.iter_mut() {
                server.save_and_stop();
                server.restart();
            }
        }
    }
}

/// Leases held through a cut, or a restart that keeps the data, are kept:
/// renewed on new connections, never lost, still their holder's after
/// twice their ttl. Every hold at once, each under a key prefix of its own,
/// through one transition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_leases_are_kept_through_a_cut_and_a_restart() {
    for mut servers in deployments() {
        for how in [Break::Cut, Break::Restart] {
            let mut holdings = Vec::new();
            let mut proxies = Vec::new();
            for hold_what in holds_on(&servers) {
                let prefix = format!("{PREFIX}{hold_what:?}:");
                let (client, through) =
                    through_proxies_as(&servers, replica("holder").key_prefix(&prefix)).await;
                proxies.extend(through);
                let (held_tx, held) = oneshot::channel();
                let holding = tokio::spawn(async move {
                    let client = client;
                    hold(&client, hold_what, SHORT_TTL, held_tx).await
                });
                bounded(held, "never held").await.unwrap();
                holdings.push((hold_what, prefix, holding));
            }
            apply(how, &mut servers, &proxies);
            // Two ttls: a lease not renewed after the transition is gone.
            tokio::time::sleep(SHORT_TTL * 2).await;
            for (hold_what, prefix, holding) in holdings {
                assert!(
                    !holding.is_finished(),
                    "{} server(s), {how:?}, {hold_what:?}: lost: {:?}",
                    servers.len(),
                    holding.await.map_err(|e| e.to_string())
                );
                let other = client_with(&servers[..], replica("other").key_prefix(&prefix)).await;
                let at_once = |hold| options(hold, TTL).wait(Duration::ZERO);
                let taken = match hold_what {
                    Hold::Permit => other.lock_with(KEY, at_once(hold_what)).await,
                    _ => other.lock_with(KEY, at_once(Hold::Guard)).await,
                };
                assert_eq!(
                    taken.map(drop).unwrap_err().kind(),
                    ErrorKind::Contended,
                    "{how:?}, {hold_what:?}: taken by another"
                );
                holding.abort();
            }
            drop(proxies);
            clear(&servers);
        }
    }
}

/// Forgets every key, for the next case.
fn clear(servers: &[RedisServer]) {
    for server in servers {
        let _: () = server.cmd(&["FLUSHALL"]);
    }
}

/// A server restarted without its data: the holder hears that it lost the
/// lease within its ttl (the renewal finds the key gone); a leader in
/// `lead` campaigns again and leads with a larger term.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_without_data_is_a_loss_and_a_new_term() {
    for mut servers in deployments() {
        let client = client_with(&servers[..], replica("holder")).await;
        let guard = client
            .lock_with(KEY, LockOptions::new(SHORT_TTL))
            .await
            .unwrap();
        let leadership = client.campaign(OTHER, SHORT_TTL).await.unwrap();
        let term = leadership.term();
        for server in servers.iter_mut() {
            server.restart_empty();
        }
        let restarted = Instant::now();
        tokio::time::timeout(SHORT_TTL, guard.lost())
            .await
            .expect("the loss was never told");
        tokio::time::timeout(SHORT_TTL, leadership.lost())
            .await
            .expect("the loss was never told");
        eprintln!(
            "{} server(s): loss told {:?} after the restart",
            servers.len(),
            restarted.elapsed()
        );
        assert_eq!(
            guard.loss_reason(),
            Some(LossReason::TakenOver),
            "{:?}",
            guard.loss_reason()
        );
        let next = client.campaign(OTHER, SHORT_TTL).await.unwrap();
        assert!(next.term() > term, "term {} after {term}", next.term());
        next.resign().await.unwrap();
    }
}

/// The holder resigns, or releases, after the transition; `follow` says
/// when the waiter or watcher noticed.
async fn after(
    how: Break,
    servers: &mut [RedisServer],
    follower: impl FnOnce(LockClient) -> tokio::task::JoinHandle<Instant>,
) -> Duration {
    let (client, proxies) = through_proxies(servers, "follower").await;
    let holder = client_with(&servers[..], replica("holder")).await;
    let leadership = holder.campaign(KEY, TTL).await.unwrap();
    let following = follower(client);
    // The follower listens before the transition.
    wait_for_subscribers_on(servers, KEY).await;
    apply(how, servers, &proxies);
    // And again after it: the subscription was renewed.
    wait_for_subscribers_on(servers, KEY).await;
    let resigned = Instant::now();
    assert!(leadership.resign().await.is_ok());
    let lag = bounded(following, "never followed")
        .await
        .unwrap()
        .saturating_duration_since(resigned);
    drop(proxies);
    clear(servers);
    lag
}

/// A watcher and a campaigner, each through connections that are cut (or
/// whose server restarts) while they listen, hear the next resignation
/// within [`FOLLOWED`].
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchers_and_waiters_follow_after_a_cut_and_a_restart() {
    for mut servers in deployments() {
        for how in [Break::Cut, Break::Restart] {
            let watched = after(how, &mut servers, |client| {
                tokio::spawn(async move {
                    let mut leaders = Box::pin(client.watch_leader(KEY));
                    // The first report is the leader as it is.
                    assert!(leaders.next().await.unwrap().is_some());
                    while let Some(state) = leaders.next().await {
                        if state.is_none() {
                            return Instant::now();
                        }
                    }
                    panic!("the watch ended");
                })
            })
            .await;
            let waited = after(how, &mut servers, |client| {
                tokio::spawn(async move { take(client, Hold::Leading).await })
            })
            .await;
            eprintln!(
                "{} server(s), after a {how:?}: watcher {watched:?}, campaigner {waited:?}",
                servers.len()
            );
            assert!(
                watched < FOLLOWED,
                "{how:?}: the watcher saw it {watched:?} later"
            );
            assert!(
                waited < FOLLOWED,
                "{how:?}: the campaigner led {waited:?} later"
            );
        }
    }
}

/// The client first waits on a runtime whose only thread then blocks (a
/// synchronous call): a waiter of the same client on another runtime still
/// hears its release within [`FOLLOWED`]. (They wait for different keys:
/// this is about the client's subscription, not its queue.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_on_another_runtime_follow_while_the_first_is_blocked() {
    for servers in deployments() {
        let client = client_with(&servers[..], replica("waiter")).await;
        let holder = client_with(&servers[..], replica("holder")).await;
        let guard = holder.lock(KEY, TTL).await.unwrap();
        let _other = holder.lock(OTHER, TTL).await.unwrap();
        let (block, blocking) = std::sync::mpsc::channel::<()>();
        let blocked = {
            let client = client.clone();
            std::thread::spawn(move || {
                runtime(Flavor::CurrentThread).block_on(async move {
                    let waiting = LockOptions::new(TTL).wait(Duration::from_secs(5));
                    let task = tokio::spawn(async move { client.lock_with(OTHER, waiting).await });
                    // Running (and subscribing) until told to block.
                    while blocking.try_recv().is_err() {
                        tokio::time::sleep(Duration::from_millis(2)).await;
                    }
                    std::thread::sleep(Duration::from_secs(3));
                    let _ = task.await;
                });
            })
        };
        wait_for_subscribers_on(&servers, OTHER).await;
        block.send(()).unwrap();
        let other = other_runtime(move || async move { take(client, Hold::Guard).await });
        wait_for_subscribers_on(&servers, KEY).await;
        let released = Instant::now();
        guard.release().await.unwrap();
        let lag = bounded(other, "never followed")
            .await
            .unwrap()
            .saturating_duration_since(released);
        blocked.join().unwrap();
        eprintln!(
            "{} server(s): a waiter on another runtime followed {lag:?} later",
            servers.len()
        );
        assert!(lag < FOLLOWED, "followed {lag:?} after the release");
    }
}

/// Waits until some connection listens for releases of `key` on every
/// server.
async fn wait_for_subscribers_on(servers: &[RedisServer], key: &str) {
    let channel = storage_key(PREFIX, key);
    let deadline = Instant::now() + Duration::from_secs(10);
    for server in servers {
        while subscribers(server, &channel) < 1 {
            assert!(Instant::now() < deadline, "nobody subscribed");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// Runs `work` on a runtime of its own, on a thread of its own.
fn other_runtime<F, Fut>(work: F) -> tokio::task::JoinHandle<Instant>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = Instant> + Send + 'static,
{
    let (tx, rx) = oneshot::channel();
    std::thread::spawn(move || {
        let at = runtime(Flavor::CurrentThread).block_on(work());
        let _ = tx.send(at);
    });
    tokio::spawn(async move { rx.await.unwrap() })
}
