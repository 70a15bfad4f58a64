//! Exclusion soak: many workers, many short critical sections on a shared
//! non-atomic counter, on one server and on a 5-server Redlock, clean and
//! under faults on a minority of servers.

use lock_core::{LockClient, LockOptions};
use lock_testkit::{Proxy, RedisServer, start_servers};
use rand::RngExt;
use redis::AsyncCommands;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

const WORKERS: usize = 16;

struct Outcome {
    most_inside: usize,
    sections: usize,
    counter: u64,
    lost_while_inside: usize,
}

/// Runs `WORKERS` workers over `clients`, each doing `rounds` critical
/// sections that read, pause and write a counter kept on `counter`.
async fn soak(
    clients: Vec<Arc<LockClient>>,
    counter: &RedisServer,
    rounds: usize,
    ttl: Duration,
) -> Outcome {
    let conn = redis::Client::open(counter.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let inside = Arc::new(AtomicUsize::new(0));
    let most_inside = Arc::new(AtomicUsize::new(0));
    let lost = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for worker in 0..WORKERS {
        let client = clients[worker % clients.len()].clone();
        let mut conn = conn.clone();
        let (inside, most_inside, lost) = (inside.clone(), most_inside.clone(), lost.clone());
        tasks.push(tokio::spawn(async move {
            let mut done = 0;
            while done < rounds {
                let opts = LockOptions::new(ttl).wait(Duration::from_secs(60));
                let Ok(guard) = client.lock_with("soak", opts).await else {
                    continue; // servers down for the whole wait: try again
                };
                let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                most_inside.fetch_max(now, Ordering::SeqCst);
                let value: Option<u64> = conn.get("soak-counter").await.unwrap();
                tokio::time::sleep(Duration::from_millis(1)).await;
                let _: () = conn
                    .set("soak-counter", value.unwrap_or(0) + 1)
                    .await
                    .unwrap();
                if guard.is_lost() {
                    lost.fetch_add(1, Ordering::SeqCst);
                }
                inside.fetch_sub(1, Ordering::SeqCst);
                let _ = guard.release().await;
                done += 1;
            }
        }));
    }
    // Bounded: a broken lock must fail the test, not hang it.
    let all = futures::future::join_all(tasks);
    for task in tokio::time::timeout(Duration::from_secs(240), all)
        .await
        .expect("the soak did not finish in 240 s")
    {
        task.unwrap();
    }
    Outcome {
        most_inside: most_inside.load(Ordering::SeqCst),
        sections: WORKERS * rounds,
        counter: counter
            .cmd::<Option<u64>>(&["GET", "soak-counter"])
            .unwrap_or(0),
        lost_while_inside: lost.load(Ordering::SeqCst),
    }
}

fn assert_exclusive(outcome: &Outcome) {
    assert_eq!(outcome.most_inside, 1, "two holders were inside at once");
    assert_eq!(
        outcome.counter, outcome.sections as u64,
        "updates were lost"
    );
}

async fn clients(urls: Vec<String>, count: usize) -> Vec<Arc<LockClient>> {
    let mut out = Vec::new();
    for _ in 0..count {
        let client = LockClient::builder()
            .urls(urls.clone())
            .key_prefix("soak:")
            .operation_timeout(Duration::from_millis(500))
            .node_timeout(Duration::from_millis(100))
            .build()
            .await
            .unwrap();
        out.push(Arc::new(client));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_server_clean() {
    let lock_server = RedisServer::start();
    let counter = RedisServer::start();
    let clients = clients(vec![lock_server.url()], 4).await;
    let outcome = soak(clients, &counter, 30, Duration::from_secs(2)).await;
    assert_exclusive(&outcome);
    assert_eq!(outcome.lost_while_inside, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_clean() {
    let servers = start_servers(5);
    let counter = RedisServer::start();
    let clients = clients(servers.iter().map(RedisServer::url).collect(), 4).await;
    let outcome = soak(clients, &counter, 25, Duration::from_secs(2)).await;
    assert_exclusive(&outcome);
    assert_eq!(outcome.lost_while_inside, 0);
}

/// Runs `faults` on a thread of its own until the soak is over.
async fn with_faults<S: Send + 'static>(
    state: S,
    faults: impl Fn(&mut S, &mut rand::rngs::ThreadRng) + Send + 'static,
    soak: impl std::future::Future<Output = Outcome>,
) -> (Outcome, S) {
    let stop = Arc::new(AtomicBool::new(false));
    let injector = {
        let stop = stop.clone();
        tokio::task::spawn_blocking(move || {
            let mut state = state;
            let mut rng = rand::rng();
            let mut injected = 0;
            while !stop.load(Ordering::SeqCst) {
                faults(&mut state, &mut rng);
                injected += 1;
            }
            (state, injected)
        })
    };
    let outcome = soak.await;
    stop.store(true, Ordering::SeqCst);
    let (state, injected) = injector.await.unwrap();
    assert!(injected > 0, "no fault was injected");
    (outcome, state)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_server_under_cuts_delays_and_short_pauses() {
    let lock_server = RedisServer::start();
    let proxy = Proxy::start(lock_server.addr());
    let counter = RedisServer::start();
    let clients = clients(vec![proxy.url()], 4).await;
    let ttl = Duration::from_secs(2);
    let (outcome, _) = with_faults(
        (proxy, lock_server),
        |(proxy, server), rng| {
            match rng.random_range(0..3) {
                0 => proxy.cut(),
                1 => {
                    proxy.set_mode(lock_testkit::ProxyMode::Delay(Duration::from_millis(20)));
                    std::thread::sleep(Duration::from_millis(150));
                    proxy.set_mode(lock_testkit::ProxyMode::Pass);
                }
                _ => {
                    // Shorter than the ttl: the lease survives it.
                    let _paused = server.pause();
                    std::thread::sleep(Duration::from_millis(300));
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        },
        soak(clients, &counter, 30, ttl),
    )
    .await;
    assert_exclusive(&outcome);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_under_stops_pauses_and_cuts_of_a_minority() {
    let servers = start_servers(5);
    let proxies: Vec<Proxy> = servers.iter().map(|s| Proxy::start(s.addr())).collect();
    let counter = RedisServer::start();
    let clients = clients(proxies.iter().map(Proxy::url).collect(), 4).await;
    let ttl = Duration::from_millis(1000);
    let (outcome, _) = with_faults(
        (servers, proxies),
        move |(servers, proxies), rng| {
            // Two distinct servers: one stopped (its data lost), one paused
            // longer than the ttl; every connection to a third is cut.
            let a = rng.random_range(0..5);
            let b = (a + rng.random_range(1..5)) % 5;
            let c = rng.random_range(0..5);
            servers[a].stop();
            {
                let _paused = servers[b].pause();
                proxies[c].cut();
                std::thread::sleep(ttl + Duration::from_millis(200));
            }
            // A server that lost its data rejoins only after every lease it
            // took part in has expired (the delayed restart operators use).
            std::thread::sleep(ttl / 2);
            servers[a].restart();
            std::thread::sleep(Duration::from_millis(200));
        },
        soak(clients, &counter, 25, ttl),
    )
    .await;
    assert_exclusive(&outcome);
}
