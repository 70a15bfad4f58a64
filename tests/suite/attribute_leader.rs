//! `#[distributed_lock(wait = "forever")]` against a real `redis-server`:
//! the annotated function runs only on the leader of its key. A second
//! caller waits its turn however long the first leads, and runs after it
//! returns with a larger term; a leader cut off from Redis, or whose lease
//! an operator breaks, stops and is followed by the other; Redis staying
//! unreachable ends the campaign.
//!
//! Every test uses its own server and explicit clients (`client = ..`).
//! Ordering comes from channels; time appears only as generous upper
//! bounds, and once as the lower bound the campaign must outlast.
use crate::support::{build, spawn_waiting};
use lock_core::{LockClient, LockError, LossReason, current_lock, distributed_lock};
use lock_testkit::{Proxy, ProxyMode, RedisServer};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::time::{Instant, timeout};

const PREFIX: &str = "leader:";

/// A generous bound for anything that should take milliseconds, on a loaded
/// two-core machine.
const PROMPTLY: Duration = Duration::from_secs(2);

/// The clients' default wait: an annotated function with a bounded wait
/// gives up after it; one with `wait = "forever"` campaigns on.
const DEFAULT_WAIT: Duration = Duration::from_millis(200);

/// What the bodies did, in order, as `"<replica> in"` and `"<replica> out"`.
type Log = Arc<Mutex<Vec<String>>>;

/// One replica's call: its client, its name in the log, and the channels
/// that tell the test it leads and tell it to step down.
struct Replica {
    client: LockClient,
    name: &'static str,
    log: Log,
    leads: oneshot::Sender<u64>,
    step_down: oneshot::Receiver<()>,
}

/// Leads `scheduler:{region}`: says so with its term, read as the body
/// reads it, then leads until told to step down, and returns its term.
#[distributed_lock(key = "scheduler:{region}", client = replica.client, ttl = "1s", wait = "forever")]
async fn schedule(replica: Replica, region: &'static str) -> Result<u64, LockError> {
    let term = current_lock().unwrap().fencing_token().unwrap();
    let Replica {
        name,
        log,
        leads,
        step_down,
        ..
    } = replica;
    log.lock().unwrap().push(format!("{name} in"));
    let _ = leads.send(term);
    let _ = step_down.await;
    log.lock().unwrap().push(format!("{name} out"));
    Ok(term)
}

/// A replica's call to `schedule`, and the ends of its channels the test
/// holds.
struct Call {
    replica: Replica,
    leads: oneshot::Receiver<u64>,
    step_down: oneshot::Sender<()>,
}

fn call(client: &LockClient, name: &'static str, log: &Log) -> Call {
    let (leads, leads_rx) = oneshot::channel();
    let (step_down_tx, step_down) = oneshot::channel();
    Call {
        replica: Replica {
            client: client.clone(),
            name,
            log: log.clone(),
            leads,
            step_down,
        },
        leads: leads_rx,
        step_down: step_down_tx,
    }
}

/// A client named `holder` (what `inspect` and `lockctl` show), reaching
/// Redis at `url`.
async fn replica(server: &RedisServer, url: &str, holder: &str) -> LockClient {
    let builder = LockClient::builder()
        .url(url)
        .key_prefix(PREFIX)
        .holder_name(holder)
        .default_wait(DEFAULT_WAIT)
        .operation_timeout(Duration::from_millis(300));
    build(builder, server).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_second_caller_leads_after_the_first_returns_with_a_larger_term() {
    let server = RedisServer::start();
    let a = replica(&server, &server.url(), "replica-a").await;
    let b = replica(&server, &server.url(), "replica-b").await;
    let log = Log::default();

    let first = call(&a, "a", &log);
    let first_task = tokio::spawn(schedule(first.replica, "eu"));
    let first_term = timeout(PROMPTLY, first.leads).await.unwrap().unwrap();
    let second = call(&b, "b", &log);
    let second_task = spawn_waiting(schedule(second.replica, "eu")).await;

    // Several of the campaign's rounds (each as long as the ttl, 1s), and
    // many times the default wait a bounded call would have given up after.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(!second_task.is_finished(), "the second caller gave up");
    let leader = a.inspect("scheduler:eu").await.unwrap().unwrap();
    assert_eq!(leader.holder(), Some("replica-a"));
    assert_eq!(leader.fencing_token(), Some(first_term));

    first.step_down.send(()).unwrap();
    assert_eq!(first_task.await.unwrap().unwrap(), first_term);
    let returned = Instant::now();
    let second_term = timeout(PROMPTLY, second.leads)
        .await
        .expect("the second caller leads once the first returns")
        .unwrap();
    assert!(returned.elapsed() < PROMPTLY);
    assert!(second_term > first_term, "{second_term} after {first_term}");
    let leader = a.inspect("scheduler:eu").await.unwrap().unwrap();
    assert_eq!(leader.holder(), Some("replica-b"));
    assert_eq!(leader.fencing_token(), Some(second_term));

    second.step_down.send(()).unwrap();
    assert_eq!(second_task.await.unwrap().unwrap(), second_term);
    assert_eq!(*log.lock().unwrap(), ["a in", "a out", "b in", "b out"]);
    assert!(a.inspect("scheduler:eu").await.unwrap().is_none());
}

/// Sets its flag when dropped: tells whether a body was dropped mid-way.
struct SetOnDrop(Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Leads `relay` until the lease is lost: the body never returns by itself.
#[distributed_lock(key = "relay", client = client, ttl = "1s", wait = "forever")]
async fn relay(
    client: LockClient,
    leads: oneshot::Sender<u64>,
    dropped: Arc<AtomicBool>,
) -> Result<(), LockError> {
    let _dropped = SetOnDrop(dropped);
    let _ = leads.send(current_lock().unwrap().fencing_token().unwrap());
    std::future::pending().await
}

/// A leader of `relay` on `leader`, and a follower on `follower`
/// campaigning behind it; `cut` takes the leader's lease away. Returns the
/// leader's result, whether its body was dropped, and the two terms.
async fn followed_after(
    leader: &LockClient,
    follower: &LockClient,
    cut: impl AsyncFnOnce(),
) -> (Result<(), LockError>, bool, u64, u64) {
    let dropped = Arc::new(AtomicBool::new(false));
    let (leads, leading) = oneshot::channel();
    let leader_task = tokio::spawn(relay(leader.clone(), leads, dropped.clone()));
    let first_term = timeout(PROMPTLY, leading).await.unwrap().unwrap();
    let (follows, following) = oneshot::channel();
    let never = Arc::new(AtomicBool::new(false));
    let follower_task = spawn_waiting(relay(follower.clone(), follows, never)).await;

    cut().await;
    // Within the lease's ttl (1s) of the cut, and a bound.
    let bound = Duration::from_secs(1) + PROMPTLY;
    let second_term = timeout(bound, following)
        .await
        .expect("the follower leads")
        .unwrap();
    let result = timeout(bound, leader_task)
        .await
        .expect("the leader stops")
        .unwrap();
    follower_task.abort();
    (
        result,
        dropped.load(Ordering::SeqCst),
        first_term,
        second_term,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_from_redis_stops_and_the_other_takes_over() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.addr());
    let a = replica(&server, &proxy.url(), "replica-a").await;
    let b = replica(&server, &server.url(), "replica-b").await;

    let cut = async || proxy.set_mode(ProxyMode::Blackhole);
    let (result, dropped, first_term, second_term) = followed_after(&a, &b, cut).await;
    let err = result.unwrap_err();
    assert!(err.is_lost(), "{err}");
    assert_eq!(err.loss_reason(), Some(LossReason::Expired), "{err}");
    assert!(dropped, "the cut-off leader's body was dropped");
    assert!(second_term > first_term, "{second_term} after {first_term}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_lease_an_operator_breaks_stops_and_the_other_takes_over() {
    let server = RedisServer::start();
    let a = replica(&server, &server.url(), "replica-a").await;
    let b = replica(&server, &server.url(), "replica-b").await;
    let operator = replica(&server, &server.url(), "operator").await;

    let cut = async || assert!(operator.force_release("relay").await.unwrap());
    let broken = Instant::now();
    let (result, dropped, first_term, second_term) = followed_after(&a, &b, cut).await;
    // The follower heard the release: it did not wait for the ttl.
    assert!(broken.elapsed() < PROMPTLY);
    let err = result.unwrap_err();
    assert_eq!(err.loss_reason(), Some(LossReason::ForceReleased), "{err}");
    assert!(dropped);
    assert!(second_term > first_term, "{second_term} after {first_term}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_unreachable_past_the_default_wait_ends_the_campaign() {
    let mut server = RedisServer::start();
    let a = replica(&server, &server.url(), "replica-a").await;
    // Held by nobody: the campaign would lead at once, were Redis there.
    server.stop();

    let started = Instant::now();
    let (leads, _) = oneshot::channel();
    let err = relay(a, leads, Arc::default()).await.unwrap_err();
    assert!(err.is_unavailable(), "{err}");
    assert!(started.elapsed() >= DEFAULT_WAIT, "{:?}", started.elapsed());
    assert!(started.elapsed() < DEFAULT_WAIT + PROMPTLY);
}
