//! A Redis Cluster changing under its clients: the only seed gone, a slot
//! migrated in each of its phases onto a node added for it, a graceful
//! failover and a killed primary, a cluster that is down.

use crate::support::{eventually, hash_slot, slow_backoff, storage_key, subscribers};
use lock_core::{LockClient, LockClientBuilder, LockGuard, LockOptions};
use lock_testkit::{RedisCluster, RedisServer};
use std::time::Duration;
use tokio::time::Instant;

const PREFIX: &str = "deploy:cluster:";
/// Bound on every wait for the topology (creation, failover, meeting).
const TOPOLOGY_BOUND: Duration = Duration::from_secs(30);
/// How soon a waiter must hear a release (docs/guarantees.md).
const WOKEN_WITHIN: Duration = Duration::from_millis(100);

fn settings() -> LockClientBuilder {
    LockClient::builder()
        .key_prefix(PREFIX)
        .operation_timeout(Duration::from_millis(500))
        .connect_timeout(Duration::from_secs(2))
}

/// A client of `urls` that polls only every 5 s: only a wake-up gets it a
/// released key quickly.
async fn patient(urls: Vec<String>) -> LockClient {
    settings()
        .backoff(slow_backoff())
        .cluster(urls)
        .build()
        .await
        .unwrap()
}

fn stored(key: &str) -> String {
    storage_key(PREFIX, key)
}

/// A lock name served by primary `index` of `cluster`.
fn key_on(cluster: &RedisCluster, index: usize, stem: &str) -> String {
    (0..10_000)
        .map(|i| format!("{stem}{i}"))
        .find(|k| cluster.primary_of_key(&stored(k)).unwrap() == Some(index))
        .expect("a key on that primary")
}

/// `n` lock names in `slot`.
fn keys_in_slot(slot: u16, n: usize, stem: &str) -> Vec<String> {
    (0..u32::MAX)
        .map(|i| format!("{stem}{i}"))
        .filter(|k| hash_slot(k) == slot)
        .take(n)
        .collect()
}

/// Spawns `client` waiting (up to 20 s) for `key`; returns when the waiter
/// listens (its mark set where the key's releases look for it, and a
/// subscription on some node), with the task that gives when it got the
/// lock.
async fn waiting(
    client: LockClient,
    key: &str,
    cluster: &RedisCluster,
) -> tokio::task::JoinHandle<(LockGuard, Instant)> {
    let task = {
        let key = key.to_owned();
        tokio::spawn(async move {
            let opts = LockOptions::new(Duration::from_secs(10)).wait(Duration::from_secs(20));
            let guard = client
                .lock_with(&key, opts)
                .await
                .unwrap_or_else(|e| panic!("the waiter: {e}"));
            (guard, Instant::now())
        })
    };
    let mark = format!("{}:listeners", stored(key));
    eventually(Duration::from_secs(5), "the waiter listens", || {
        let nodes = || cluster.nodes().iter().filter(|n| n.is_running());
        nodes().any(|n| exists_asking(n, &mark))
            && nodes().any(|n| subscribers(n, &stored(key)) > 0)
    })
    .await;
    task
}

/// Whether `node` has `key`, asked as after an `ASK` (so also while the
/// key's slot is being imported there).
/// A node that does not serve the key's slot (a replica, another
/// primary) answers `MOVED`: it does not have it.
fn exists_asking(node: &RedisServer, key: &str) -> bool {
    let answer: redis::RedisResult<(i64,)> = redis::pipe()
        .cmd("ASKING")
        .ignore()
        .cmd("EXISTS")
        .arg(key)
        .query(&mut node.connection());
    answer.is_ok_and(|(exists,)| exists == 1)
}

/// Releases `guard` and returns how long `waiter` took to get the lock
/// after that.
async fn woken_after_release(
    guard: LockGuard,
    waiter: tokio::task::JoinHandle<(LockGuard, Instant)>,
) -> Duration {
    let released_at = Instant::now();
    assert!(guard.release().await.unwrap(), "the release found no lock");
    let (next, at) = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter slept through the release")
        .unwrap();
    assert!(next.release().await.unwrap());
    at.saturating_duration_since(released_at)
}

/// A client seeded with one node only keeps working when that node dies:
/// its heartbeat, its wake-ups and its operators' calls learn the other
/// nodes from the slot map the client already has. Before, the heartbeat
/// asked only the seed for its own map, and every lock taken after the
/// seed died was lost at its ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_whose_only_seed_died_keeps_renewing_and_waking() {
    let mut cluster = RedisCluster::start(3, 1);
    let seed = (0..cluster.nodes().len())
        .find(|&i| cluster.nodes()[i].role() == "slave")
        .expect("a replica");
    let url = vec![cluster.nodes()[seed].url()];
    let holder = settings().cluster(url.clone()).build().await.unwrap();
    let waiter = patient(url).await;
    cluster.node_mut(seed).stop();
    cluster.wait_ready(TOPOLOGY_BOUND).unwrap();

    // One lock per primary, renewed every 0.5 s, watched for three ttls.
    let ttl = Duration::from_millis(1500);
    let keys: Vec<String> = (0..3).map(|i| key_on(&cluster, i, "seed")).collect();
    let mut guards = Vec::new();
    for key in &keys {
        guards.push(holder.lock(key, ttl).await.unwrap());
    }
    let watch_until = Instant::now() + ttl * 3;
    while Instant::now() < watch_until {
        for (guard, key) in guards.iter().zip(&keys) {
            assert!(
                !guard.is_lost(),
                "{key} lost after the seed died: {:?}",
                guard.loss_reason()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for (i, key) in keys.iter().enumerate() {
        let pttl: i64 = cluster.nodes()[i].cmd(&["PTTL", &stored(key)]);
        assert!(pttl > 0, "{key} not renewed on its primary: PTTL {pttl}");
    }
    // The operators' calls find the locks too.
    assert!(holder.inspect(&keys[0]).await.unwrap().is_some());

    // A waiter seeded with the dead node hears a release.
    let first = guards.remove(0);
    let task = waiting(waiter, &keys[0], &cluster).await;
    let took = woken_after_release(first, task).await;
    eprintln!("woken {took:?} after the release, its only seed dead");
    assert!(took < WOKEN_WITHIN, "woken {took:?} after the release");
    for guard in guards {
        assert!(guard.release().await.unwrap());
    }
}

/// What one phase of a migration is checked with: locks taken before it
/// started, each in the migrating slot.
struct Phase {
    name: &'static str,
    /// Held: `Contended` for another client, then released and waited for.
    held: (String, LockGuard),
    /// Dropped: its release, sent without waiting, must still land.
    dropped: (String, LockGuard),
    /// Free, with a fence counter drawn before: the next fenced lock gets
    /// a larger token.
    fenced: (String, u64),
}

async fn prepare(client: &LockClient, keys: &[String], name: &'static str) -> Phase {
    let ttl = Duration::from_secs(10);
    let fenced_opts = LockOptions::new(ttl).fencing(true);
    let fenced = client.lock_with(&keys[2], fenced_opts).await.unwrap();
    let token = fenced.fencing_token().unwrap();
    assert!(fenced.release().await.unwrap());
    Phase {
        name,
        held: (keys[0].clone(), client.lock(&keys[0], ttl).await.unwrap()),
        dropped: (keys[1].clone(), client.lock(&keys[1], ttl).await.unwrap()),
        fenced: (keys[2].clone(), token),
    }
}

/// The checks of one phase, by a client that did not take the locks and a
/// patient waiter.
async fn check(phase: Phase, other: &LockClient, waiter: LockClient, cluster: &RedisCluster) {
    let name = phase.name;
    let (held_key, held) = phase.held;
    let refused = other
        .lock_with(
            &held_key,
            LockOptions::new(Duration::from_secs(10)).wait(Duration::from_millis(300)),
        )
        .await
        .err()
        .unwrap_or_else(|| panic!("{name}: a held lock was granted"));
    assert!(
        refused.is_contended(),
        "{name}: waiting for a held lock: {refused}"
    );

    let task = waiting(waiter, &held_key, cluster).await;
    let took = woken_after_release(held, task).await;
    eprintln!("{name}: waiter woken {took:?} after the release");
    assert!(
        took < WOKEN_WITHIN,
        "{name}: woken {took:?} after the release"
    );

    let (dropped_key, dropped) = phase.dropped;
    let dropped_at = Instant::now();
    drop(dropped);
    let mut freed = None;
    while dropped_at.elapsed() < Duration::from_secs(3) {
        if let Some(guard) = other
            .try_lock(&dropped_key, Duration::from_secs(10))
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"))
        {
            freed = Some(dropped_at.elapsed());
            assert!(guard.release().await.unwrap());
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let freed = freed.unwrap_or_else(|| panic!("{name}: a dropped guard's lock stayed held"));
    eprintln!("{name}: a dropped guard's lock was free {freed:?} later");

    let (fenced_key, before) = phase.fenced;
    let guard = other
        .lock_with(
            &fenced_key,
            LockOptions::new(Duration::from_secs(10)).fencing(true),
        )
        .await
        .unwrap_or_else(|e| panic!("{name}: a fenced lock of a free key: {e}"));
    let token = guard.fencing_token().unwrap();
    assert!(
        token > before,
        "{name}: fencing tokens {before} then {token}"
    );
    assert!(guard.release().await.unwrap());
}

/// `MIGRATE` of `keys` (those that exist) from node `from` to node `to`.
fn migrate(cluster: &RedisCluster, from: usize, to: usize, keys: &[String]) {
    let port = cluster.nodes()[to].port().to_string();
    for key in keys {
        let _: redis::Value =
            cluster.nodes()[from].cmd(&["MIGRATE", "127.0.0.1", &port, key, "0", "5000"]);
    }
}

/// Every lock command works through every phase of a slot's migration
/// onto a node added for it: a lock held is `Contended` for others and its
/// release (awaited, or sent from a dropped guard) frees it at once and
/// wakes its waiter; a fenced lock of a free key is granted with a larger
/// token. Phases: both nodes open with every key on the old one; the lock
/// keys moved, their fence counters and listeners marks not; the slot
/// given to the new node. Before, a release there failed after 8
/// redirections and the lock stayed held for its ttl, and fenced and
/// waiting acquisitions were refused `Unavailable`. Last, a cluster that
/// is down says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_lock_command_works_through_a_slot_migration() {
    let mut cluster = RedisCluster::start(3, 0);
    let client = settings().cluster(cluster.urls()).build().await.unwrap();
    let other = settings().cluster(cluster.urls()).build().await.unwrap();
    let from = 0;
    let slot = hash_slot(&key_on(&cluster, from, "slot"));
    let keys = keys_in_slot(slot, 9, "m");
    let phases = [
        prepare(&client, &keys[0..3], "migrating, keys on the old node").await,
        prepare(&client, &keys[3..6], "migrating, lock keys moved").await,
        prepare(&client, &keys[6..9], "moved").await,
    ];
    let to = cluster.add_primary().unwrap();
    // The new node serves commands once it sees the cluster as whole.
    cluster.wait_ready(TOPOLOGY_BOUND).unwrap();
    let id = |i: usize| cluster.nodes()[i].cmd::<String>(&["CLUSTER", "MYID"]);
    let (from_id, to_id) = (id(from), id(to));
    let slot_arg = slot.to_string();
    let _: String =
        cluster.nodes()[to].cmd(&["CLUSTER", "SETSLOT", &slot_arg, "IMPORTING", &from_id]);
    let _: String =
        cluster.nodes()[from].cmd(&["CLUSTER", "SETSLOT", &slot_arg, "MIGRATING", &to_id]);
    let all_keys = |range: std::ops::Range<usize>| -> Vec<String> {
        keys[range]
            .iter()
            .flat_map(|k| {
                let s = stored(k);
                [format!("{s}:fence"), format!("{s}:listeners"), s]
            })
            .collect()
    };
    let [first, second, third] = phases;

    check(first, &other, patient(cluster.urls()).await, &cluster).await;

    migrate(&cluster, from, to, &[stored(&keys[3]), stored(&keys[4])]);
    check(second, &other, patient(cluster.urls()).await, &cluster).await;

    migrate(&cluster, from, to, &all_keys(0..9));
    for node in cluster.nodes() {
        let _: String = node.cmd(&["CLUSTER", "SETSLOT", &slot_arg, "NODE", &to_id]);
    }
    check(third, &other, patient(cluster.urls()).await, &cluster).await;

    // No node serves a slot: the whole cluster refuses commands.
    let owner = cluster.primary_of_slot(0).unwrap().unwrap();
    let _: String = cluster.nodes()[owner].cmd(&["CLUSTER", "DELSLOTS", "0"]);
    let down = eventually_down(&client, &keys_in_slot(0, 1, "down")[0]).await;
    assert!(
        !down.contains("slots are moving")
            && (down.contains("the cluster is down")
                || down.contains("no primary of the cluster serves hash slot 0")),
        "the error for a cluster that is down: {down}"
    );
}

/// The error of a lock taken once the cluster reports itself down.
async fn eventually_down(client: &LockClient, key: &str) -> String {
    let started = Instant::now();
    loop {
        match client.try_lock(key, Duration::from_secs(1)).await {
            Err(e) => return e.chain().to_string(),
            Ok(guard) => drop(guard),
        }
        assert!(
            started.elapsed() < TOPOLOGY_BOUND,
            "the cluster never went down"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Through a graceful failover, then a killed primary: the held lock is
/// kept (renewed on the promoted replica), the waiter hears its release
/// within 100 ms, and fencing tokens keep rising. The waiter is seeded
/// with the primary that is killed. Before, a waiter's first attempt after
/// the kill went to the dead primary and it came back on its backoff; and
/// a waiter whose listeners mark went to the dead primary dropped its
/// subscription, to hear nothing until its timer (1.7-3.5 s after the
/// release in 4 of 18 killed rounds).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn locks_and_waiters_follow_failovers() {
    let mut cluster = RedisCluster::start(3, 1);
    let holder = settings().cluster(cluster.urls()).build().await.unwrap();
    let key = key_on(&cluster, 0, "fo");
    let ttl = Duration::from_secs(6);
    let fenced = || LockOptions::new(ttl).fencing(true);
    let mut last_token = 0;
    for round in ["graceful", "killed"] {
        let primary = cluster.primary_of_key(&stored(&key)).unwrap().unwrap();
        let replica = (0..cluster.nodes().len())
            .find(|&i| {
                cluster.nodes()[i].is_running()
                    && i != primary
                    && cluster.nodes()[i].role() == "slave"
                    && cluster.nodes()[i]
                        .try_info_field("replication", "master_port")
                        .unwrap()
                        == Some(cluster.nodes()[primary].port().to_string())
            })
            .expect("the primary's replica");
        let waiter = patient(vec![cluster.nodes()[primary].url()]).await;
        let guard = holder.lock_with(&key, fenced()).await.unwrap();
        let token = guard.fencing_token().unwrap();
        assert!(
            token > last_token,
            "{round}: tokens {last_token} then {token}"
        );
        let task = waiting(waiter, &key, &cluster).await;
        let acked: i64 = cluster.nodes()[primary].cmd(&["WAIT", "1", "2000"]);
        assert_eq!(acked, 1, "{round}: the replica has the lock and the mark");
        match round {
            "graceful" => {
                let _: String = cluster.nodes()[replica].cmd(&["CLUSTER", "FAILOVER"]);
            }
            _ => cluster.node_mut(primary).stop(),
        }
        eventually(TOPOLOGY_BOUND, "the replica is promoted", || {
            cluster.nodes()[replica].role() == "master"
        })
        .await;
        cluster.wait_ready(TOPOLOGY_BOUND).unwrap();
        // Renewed on the promoted replica within a renewal interval.
        let promoted_pttl = |node: &RedisServer| node.cmd::<i64>(&["PTTL", &stored(&key)]);
        let before = promoted_pttl(&cluster.nodes()[replica]);
        eventually(ttl / 2, "renewed on the promoted replica", || {
            promoted_pttl(&cluster.nodes()[replica]) > before
        })
        .await;
        assert!(!guard.is_lost(), "{round}: lost {:?}", guard.loss_reason());
        let took = woken_after_release(guard, task).await;
        eprintln!("{round} failover: waiter woken {took:?} after the release");
        assert!(
            took < WOKEN_WITHIN,
            "{round}: woken {took:?} after the release"
        );
        last_token = token;
    }
    let guard = holder.lock_with(&key, fenced()).await.unwrap();
    assert!(guard.fencing_token().unwrap() > last_token);
    assert!(guard.release().await.unwrap());
}
