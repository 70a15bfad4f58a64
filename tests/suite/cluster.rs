//! Redis Cluster, against real `redis-server` processes in cluster mode
//! joined by `redis-cli --cluster create` (started by the test kit).

use crate::support::{client_with, eventually, hash_slot, slow_backoff, storage_key, subscribers};
use lock_core::{
    LockClient, LockClientBuilder, LockError, LockOptions, current_lock, distributed_lock,
};
use lock_testkit::{RedisCluster, RedisServer};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;
use tokio::time::Instant;

const PREFIX: &str = "cluster:lock:";
/// Bound on every wait for the topology (creation, failover).
const TOPOLOGY_BOUND: Duration = Duration::from_secs(30);

/// The clients of this file.
fn settings() -> LockClientBuilder {
    LockClient::builder()
        .key_prefix(PREFIX)
        .operation_timeout(Duration::from_millis(500))
        .connect_timeout(Duration::from_secs(2))
}

/// One key per primary: `key -> index of the node that serves it`.
fn keys_on_every_primary(cluster: &RedisCluster, stem: &str) -> BTreeMap<usize, String> {
    let mut found = BTreeMap::new();
    for i in 0..1000 {
        let key = format!("{stem}{i}");
        let primary = cluster
            .primary_of_key(&storage_key(PREFIX, &key))
            .unwrap()
            .expect("every slot has a primary");
        found.entry(primary).or_insert(key);
        if found.len() == cluster.primaries() {
            break;
        }
    }
    assert_eq!(found.len(), cluster.primaries(), "{found:?}");
    found
}

/// A key whose slot the first node does not serve, and the node that does.
fn key_off_the_first_node(cluster: &RedisCluster, stem: &str) -> (usize, String) {
    keys_on_every_primary(cluster, stem)
        .into_iter()
        .find(|(primary, _)| *primary != 0)
        .unwrap()
}

/// A client that polls only every 5 s: only a wake-up gets it a released
/// key quickly.
async fn patient_client(cluster: &RedisCluster) -> LockClient {
    let builder = LockClient::builder()
        .key_prefix(PREFIX)
        .backoff(slow_backoff());
    client_with(cluster, builder).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn locks_work_on_every_primary_of_a_cluster() {
    let started = Instant::now();
    let cluster = RedisCluster::start(3, 0);
    let created = started.elapsed();
    let client = client_with(&cluster, settings()).await;
    let other = client_with(&cluster, settings()).await;
    let keys = keys_on_every_primary(&cluster, "k");
    let slots: Vec<u16> = keys
        .values()
        .map(|k| cluster.keyslot(&storage_key(PREFIX, k)).unwrap())
        .collect();
    eprintln!("keys {keys:?} in slots {slots:?}");

    for (&primary, key) in &keys {
        let node = &cluster.nodes()[primary];
        // try_lock, contention, release.
        let guard = client
            .try_lock(key, Duration::from_secs(10))
            .await
            .unwrap()
            .expect("a free lock");
        assert!(
            node.cmd::<Option<String>>(&["GET", &storage_key(PREFIX, key)])
                .is_some(),
            "the lock is not on its slot's primary"
        );
        assert!(
            other
                .try_lock(key, Duration::from_secs(10))
                .await
                .unwrap()
                .is_none()
        );
        assert!(guard.release().await.unwrap());
        assert_eq!(node.cmd::<i64>(&["EXISTS", &storage_key(PREFIX, key)]), 0);

        // Fencing: the counter lives in the lock's slot, and grows.
        let opts = || LockOptions::new(Duration::from_secs(10)).fencing(true);
        let first = client.lock_with(key, opts()).await.unwrap();
        let a = first.fencing_token().unwrap();
        assert!(first.release().await.unwrap());
        let second = other.lock_with(key, opts()).await.unwrap();
        let b = second.fencing_token().unwrap();
        assert!(b > a, "fencing tokens {a} then {b}");
        let fence: Option<String> =
            node.cmd(&["GET", &format!("{}:fence", storage_key(PREFIX, key))]);
        assert_eq!(fence, Some(b.to_string()));
        assert!(second.release().await.unwrap());
    }

    // Renewal across several ttls, with locks on every primary held at
    // once (one renewal round spans slots).
    for ttl in [
        Duration::from_millis(300),
        Duration::from_millis(600),
        Duration::from_secs(1),
    ] {
        let mut guards = Vec::new();
        for key in keys.values() {
            guards.push(client.lock(key, ttl).await.unwrap());
        }
        // Held for three ttls: only renewal keeps them.
        tokio::time::sleep(ttl * 3).await;
        for ((&primary, key), guard) in keys.iter().zip(&guards) {
            assert!(!guard.is_lost(), "{key} lost with ttl {ttl:?}");
            let pttl: i64 = cluster.nodes()[primary].cmd(&["PTTL", &storage_key(PREFIX, key)]);
            assert!(pttl > 0, "{key}: PTTL {pttl} with ttl {ttl:?}");
        }
        for guard in guards {
            assert!(guard.release().await.unwrap(), "released late, ttl {ttl:?}");
        }
    }
    assert_eq!(client.heartbeats_running(), 0);
    eprintln!(
        "cluster created in {created:?}; test took {:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn contended_locks_on_a_cluster_exclude_each_other() {
    let cluster = RedisCluster::start(3, 0);
    let keys = keys_on_every_primary(&cluster, "c");
    let clients: Vec<Arc<LockClient>> = futures::future::join_all(
        (0..3).map(|_| async { Arc::new(client_with(&cluster, settings()).await) }),
    )
    .await;
    let mut tasks = Vec::new();
    for key in keys.values() {
        let inside = Arc::new(AtomicBool::new(false));
        let entered = Arc::new(AtomicUsize::new(0));
        for worker in 0..6 {
            let client = clients[worker % clients.len()].clone();
            let (key, inside, entered) = (key.clone(), inside.clone(), entered.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..5 {
                    let opts =
                        LockOptions::new(Duration::from_secs(5)).wait(Duration::from_secs(20));
                    let guard = client.lock_with(&key, opts).await.unwrap();
                    assert!(!inside.swap(true, Ordering::SeqCst), "two holders of {key}");
                    entered.fetch_add(1, Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    inside.store(false, Ordering::SeqCst);
                    assert!(guard.release().await.unwrap());
                }
                entered.load(Ordering::SeqCst)
            }));
        }
    }
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(60), task)
            .await
            .expect("contention finished")
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_hears_the_release_on_a_cluster() {
    let cluster = RedisCluster::start(3, 0);
    let holder = client_with(&cluster, settings()).await;
    // Polls only every 5 s: only a wake-up gets it in quickly.
    let waiter = patient_client(&cluster).await;
    // The release's PUBLISH must cross the cluster bus.
    let (_, key) = key_off_the_first_node(&cluster, "w");
    let held = holder.lock(&key, Duration::from_secs(10)).await.unwrap();
    let waiting = {
        let key = key.clone();
        tokio::spawn(async move {
            let opts = LockOptions::new(Duration::from_secs(10)).wait(Duration::from_secs(20));
            let guard = waiter.lock_with(&key, opts).await;
            (guard, Instant::now())
        })
    };
    let first = &cluster.nodes()[0];
    eventually(Duration::from_secs(5), "the waiter subscribes", || {
        subscribers(first, &storage_key(PREFIX, &key)) >= 1
    })
    .await;
    let released_at = Instant::now();
    assert!(held.release().await.unwrap());
    let (guard, acquired_at) = tokio::time::timeout(Duration::from_secs(3), waiting)
        .await
        .expect("the waiter slept through the release")
        .unwrap();
    guard.unwrap().release().await.unwrap();
    let took = acquired_at - released_at;
    assert!(
        took < Duration::from_millis(1000),
        "took {took:?} after the release"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_primary_killed_mid_hold_is_failed_over() {
    let started = Instant::now();
    let mut cluster = RedisCluster::start(3, 1);
    let client = client_with(&cluster, settings()).await;
    let keys = keys_on_every_primary(&cluster, "f");
    let (&victim, key) = keys.iter().next().unwrap();
    let key = key.clone();
    // Long enough to outlast the failover (about 2 s with a node timeout of
    // 1 s): the guard is expected to keep renewing on the promoted replica.
    let ttl = Duration::from_secs(5);
    let guard = client.lock(&key, ttl).await.unwrap();
    // Let the replica have the write before the crash (replication is
    // asynchronous; WAIT on the primary proves it).
    let acked: i64 = cluster.nodes()[victim].cmd(&["WAIT", "1", "2000"]);
    assert_eq!(acked, 1);

    let killed_at = Instant::now();
    cluster.node_mut(victim).stop();
    cluster
        .wait_ready(TOPOLOGY_BOUND)
        .unwrap_or_else(|e| panic!("no failover: {e}"));
    let failed_over = killed_at.elapsed();
    let promoted = cluster
        .primary_of_key(&storage_key(PREFIX, &key))
        .unwrap()
        .expect("the slot has a primary again");
    assert_ne!(promoted, victim);

    // The client's next lock on that slot works.
    let acquiring = Instant::now();
    let other_key = format!("{key}-again");
    let slot_key = {
        // Same primary as the held lock (the slot moved to the replica).
        let mut found = None;
        for i in 0..1000 {
            let k = format!("{other_key}{i}");
            if cluster.primary_of_key(&storage_key(PREFIX, &k)).unwrap() == Some(promoted) {
                found = Some(k);
                break;
            }
        }
        found.unwrap()
    };
    let next = client
        .lock_with(
            &slot_key,
            LockOptions::new(Duration::from_secs(5)).wait(Duration::from_secs(15)),
        )
        .await
        .unwrap_or_else(|e| panic!("lock after the failover: {e}"));
    let took = acquiring.elapsed();
    assert!(
        cluster.nodes()[promoted]
            .cmd::<Option<String>>(&["GET", &storage_key(PREFIX, &slot_key)])
            .is_some()
    );
    assert!(next.release().await.unwrap());

    // The held guard: renewing on the promoted replica, or reported lost;
    // never believed held without the key behind it. Checked over two ttls.
    let watch_until = Instant::now() + ttl * 2;
    while Instant::now() < watch_until {
        if guard.is_lost() {
            break;
        }
        let pttl: i64 = cluster.nodes()[promoted].cmd(&["PTTL", &storage_key(PREFIX, &key)]);
        // Between a renewal failing and the guard noticing, the key may be
        // gone only while the guard's validity still runs.
        assert!(
            pttl > 0 || guard.remaining() > Duration::ZERO || guard.is_lost(),
            "the guard believes it holds a lock that is gone (PTTL {pttl})"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let lost = guard.is_lost();
    if !lost {
        let pttl: i64 = cluster.nodes()[promoted].cmd(&["PTTL", &storage_key(PREFIX, &key)]);
        assert!(pttl > 0, "held past its validity without the key");
        assert!(guard.release().await.unwrap());
    }
    eprintln!(
        "failover took {failed_over:?}; next lock took {took:?}; held guard {}; \
         test took {:?}",
        if lost {
            "reported lost"
        } else {
            "kept renewing"
        },
        started.elapsed()
    );
}

/// Runs while holding `job:{id}`, fenced; returns what `current_lock` says
/// and whether another client could take the lock meanwhile.
#[distributed_lock(key = "job:{id}", client = client, ttl = "1s", fencing = true)]
async fn fenced_job(
    client: &LockClient,
    other: &LockClient,
    id: u32,
) -> Result<(String, Option<u64>, bool), LockError> {
    // Longer than the ttl: renewal keeps it.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let info = current_lock().expect("inside the lock");
    let taken = other
        .try_lock(&format!("job:{id}"), Duration::from_secs(1))
        .await?
        .is_some();
    Ok((info.key().to_owned(), info.fencing_token(), taken))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_attribute_works_on_a_cluster() {
    let cluster = RedisCluster::start(3, 0);
    let (client, other) = (
        client_with(&cluster, settings()).await,
        client_with(&cluster, settings()).await,
    );
    for id in 0..3 {
        let (key, fence, taken) = fenced_job(&client, &other, id).await.unwrap();
        assert_eq!(key, format!("job:{id}"));
        assert!(fence.is_some());
        assert!(!taken, "another client took job:{id} while it was held");
        let primary = cluster
            .primary_of_key(&storage_key(PREFIX, &key))
            .unwrap()
            .unwrap();
        assert_eq!(
            cluster.nodes()[primary].cmd::<i64>(&["EXISTS", &storage_key(PREFIX, &key)]),
            0,
            "released on return"
        );
    }
}

/// `key`'s slot on `cluster`, and the ids of its primary `from` and of
/// another primary `to`.
fn slot_and_ids(
    cluster: &RedisCluster,
    key: &str,
    from: usize,
    to: usize,
) -> (u16, String, String) {
    let slot = cluster.keyslot(&storage_key(PREFIX, key)).unwrap();
    let id = |i: usize| cluster.nodes()[i].cmd::<String>(&["CLUSTER", "MYID"]);
    (slot, id(from), id(to))
}

/// A slot moved from one primary to another while a lock in it is held.
/// Mid-move, a new lock in the slot is answered `ASK` by the old primary
/// and taken on the new one (`ASKING`); once moved, the held lock's
/// renewals and release are answered `MOVED` and follow the slot: the
/// lock is never lost, and its release deletes it where it now lives.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slot_moved_while_a_lock_in_it_is_held_is_followed() {
    let cluster = RedisCluster::start(3, 0);
    let client = client_with(&cluster, settings()).await;
    let keys = keys_on_every_primary(&cluster, "m");
    let mut primaries = keys.iter();
    let (&from, held_key) = primaries.next().unwrap();
    let (&to, _) = primaries.next().unwrap();
    let (slot, from_id, to_id) = slot_and_ids(&cluster, held_key, from, to);
    let ttl = Duration::from_millis(900);
    let held = client.lock(held_key, ttl).await.unwrap();

    // Mid-move: keys of the slot not on the old primary are asked of the
    // new one.
    let slot_arg = slot.to_string();
    let _: String =
        cluster.nodes()[to].cmd(&["CLUSTER", "SETSLOT", &slot_arg, "IMPORTING", &from_id]);
    let _: String =
        cluster.nodes()[from].cmd(&["CLUSTER", "SETSLOT", &slot_arg, "MIGRATING", &to_id]);
    // Another key of the slot (checked against the server's own count).
    let sibling_key = (0..1_000_000)
        .map(|i| format!("sibling{i}"))
        .find(|k| hash_slot(k) == slot)
        .unwrap();
    assert_eq!(
        cluster.keyslot(&storage_key(PREFIX, &sibling_key)).unwrap(),
        slot
    );
    let asked = client
        .try_lock(&sibling_key, Duration::from_secs(10))
        .await
        .unwrap_or_else(|e| panic!("a lock in a slot being moved: {e}"))
        .expect("a free key");
    let (on_new,): (i64,) = redis::pipe()
        .cmd("ASKING")
        .ignore()
        .cmd("EXISTS")
        .arg(storage_key(PREFIX, &sibling_key))
        .query(&mut cluster.nodes()[to].connection())
        .unwrap();
    assert_eq!(
        on_new, 1,
        "the lock taken mid-move is not on the new primary"
    );

    // The held lock's keys move, then the slot.
    let to_port = cluster.nodes()[to].port().to_string();
    let mut migrate = vec!["MIGRATE", "127.0.0.1", &to_port, "", "0", "5000", "KEYS"];
    let stored = storage_key(PREFIX, held_key);
    migrate.push(&stored);
    let _: String = cluster.nodes()[from].cmd(&migrate);
    for node in cluster.nodes() {
        let _: String = node.cmd(&["CLUSTER", "SETSLOT", &slot_arg, "NODE", &to_id]);
    }
    // Twice the ttl: only renewals where the slot now lives keep it.
    tokio::time::sleep(ttl * 2).await;
    assert!(
        !held.is_lost(),
        "the held lock was lost when its slot moved"
    );
    let pttl: i64 = cluster.nodes()[to].cmd(&["PTTL", &stored]);
    assert!(pttl > 0, "not renewed where its slot moved: PTTL {pttl}");
    assert!(
        held.release().await.unwrap(),
        "released where its slot moved"
    );
    assert_eq!(cluster.nodes()[to].cmd::<i64>(&["EXISTS", &stored]), 0);
    assert!(asked.release().await.unwrap());
}

/// A frozen primary costs the locks of the other primaries nothing: a call
/// on its slots ends within the operation timeout, and calls on the others
/// are answered meanwhile, as fast as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_frozen_primary_costs_the_other_slots_nothing() {
    let cluster = RedisCluster::start(3, 0);
    let client = client_with(&cluster, settings()).await;
    let keys = keys_on_every_primary(&cluster, "z");
    let mut primaries = keys.iter();
    let (&frozen, frozen_key) = primaries.next().unwrap();
    let others: Vec<&String> = primaries.map(|(_, k)| k).collect();
    for key in &others {
        assert!(
            client
                .lock(key, Duration::from_secs(5))
                .await
                .unwrap()
                .release()
                .await
                .unwrap()
        );
    }
    let _paused = cluster.nodes()[frozen].pause();
    let started = Instant::now();
    let stuck = tokio::spawn({
        let client = client.clone();
        let key = frozen_key.clone();
        async move {
            client
                .try_lock(&key, Duration::from_secs(5))
                .await
                .map(|g| g.is_some())
        }
    });
    for round in 0..5 {
        for key in &others {
            let asked = Instant::now();
            let guard = client
                .lock(key, Duration::from_secs(5))
                .await
                .unwrap_or_else(|e| {
                    panic!("round {round}: {key} with a frozen primary elsewhere: {e}")
                });
            assert!(guard.release().await.unwrap());
            let took = asked.elapsed();
            assert!(
                took < Duration::from_millis(300),
                "round {round}: {key} took {took:?} beside a frozen primary"
            );
        }
    }
    let err = stuck.await.unwrap().unwrap_err();
    let took = started.elapsed();
    assert_eq!(err.kind(), lock_core::ErrorKind::Unavailable, "{err}");
    // The operation timeout (500 ms) and a margin for a loaded machine.
    assert!(
        took < Duration::from_millis(1500),
        "the frozen call took {took:?}"
    );
}

/// Releases `key` (the caller's name) through the attribute: its release
/// goes out without waiting for the reply.
#[distributed_lock(key = "{key}", client = client, ttl = "10s")]
async fn attribute_hold(client: &LockClient, key: &str) -> Result<(), LockError> {
    let _ = key;
    Ok(())
}

/// The next message `messages` brings, within [`TOPOLOGY_BOUND`].
async fn next_message(messages: &mut (impl futures::Stream<Item = redis::Msg> + Unpin)) -> String {
    use futures::StreamExt;
    let message = tokio::time::timeout(TOPOLOGY_BOUND, messages.next())
        .await
        .expect("no message came")
        .expect("the subscriber's connection closed");
    message.get_payload().unwrap()
}

/// The primary that holds lock `key` (its index in the cluster's nodes),
/// and the name of the key's listeners mark there.
fn listeners_mark(cluster: &RedisCluster, key: &str) -> (usize, String) {
    let lock_key = storage_key(PREFIX, key);
    let primary = cluster.primary_of_key(&lock_key).unwrap().unwrap();
    (primary, format!("{lock_key}:listeners"))
}

/// Waits, at most `bound`, until `node` holds the listeners mark `mark`.
async fn marked(node: &RedisServer, mark: &str, bound: Duration) {
    eventually(bound, &format!("{mark} is set"), || {
        node.cmd::<i64>(&["EXISTS", mark]) == 1
    })
    .await;
}

/// A cluster sends every `PUBLISH` to all its nodes. A release that no
/// waiter of another process listens for publishes nothing there; one
/// that a waiter listens for still does, and wakes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_release_somebody_listens_for_is_published_on_a_cluster() {
    let cluster = RedisCluster::start(3, 0);
    let client = client_with(&cluster, settings()).await;
    // Served by another node than the subscriber's: its messages cross
    // the cluster bus.
    let (primary, key) = key_off_the_first_node(&cluster, "p");
    let channel = storage_key(PREFIX, &key);
    let subscriber = redis::Client::open(cluster.nodes()[0].url()).unwrap();
    let mut pubsub = subscriber.get_async_pubsub().await.unwrap();
    pubsub.subscribe(&channel).await.unwrap();
    let mut messages = pubsub.into_on_message();

    // Nobody waits: an awaited release, one sent without waiting (the
    // attribute), a shared holder's and a guard's drop.
    client
        .lock(&key, Duration::from_secs(10))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    attribute_hold(&client, &key).await.unwrap();
    let shared = LockOptions::new(Duration::from_secs(10)).shared(true);
    let reader = client.lock_with(&key, shared).await.unwrap();
    assert!(reader.release().await.unwrap());
    drop(client.lock(&key, Duration::from_secs(10)).await.unwrap());
    eventually(
        Duration::from_secs(5),
        "the dropped guard's release",
        || cluster.nodes()[primary].cmd::<i64>(&["EXISTS", &channel]) == 0,
    )
    .await;
    // A message published after them from the key's node comes first:
    // none of them published anything.
    let _: i64 = cluster.nodes()[primary].cmd(&["PUBLISH", &channel, "probe"]);
    assert_eq!(next_message(&mut messages).await, "probe");

    // With a waiter in another process, the release is published.
    let waiter = patient_client(&cluster).await;
    let held = client.lock(&key, Duration::from_secs(10)).await.unwrap();
    let waiting = {
        let key = key.clone();
        tokio::spawn(async move {
            let opts = LockOptions::new(Duration::from_secs(10)).wait(Duration::from_secs(20));
            waiter.lock_with(&key, opts).await
        })
    };
    let mark = format!("{channel}:listeners");
    marked(&cluster.nodes()[primary], &mark, Duration::from_secs(5)).await;
    assert!(held.release().await.unwrap());
    assert_eq!(next_message(&mut messages).await, "");
    // Polling every 5 s, it got the key because it heard the release.
    let guard = tokio::time::timeout(Duration::from_secs(3), waiting)
        .await
        .expect("the waiter slept through the release")
        .unwrap()
        .unwrap();
    guard.release().await.unwrap();
}

/// A leader's watcher on a cluster marks that it listens, so the leader's
/// resignation is published and heard at once, not at the lease's expiry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_watcher_hears_the_resignation_on_a_cluster() {
    use futures::StreamExt;
    let cluster = RedisCluster::start(3, 0);
    let leader = client_with(&cluster, settings()).await;
    let watcher = client_with(&cluster, settings()).await;
    let key = "scheduler";
    let leading = leader.campaign(key, Duration::from_secs(10)).await.unwrap();
    let mut leaders = Box::pin(watcher.watch_leader(key));
    let seen = tokio::time::timeout(Duration::from_secs(5), leaders.next())
        .await
        .expect("a first report")
        .expect("the watch goes on")
        .expect("a leader");
    assert_eq!(seen.fencing_token(), Some(leading.term()));
    let (primary, mark) = listeners_mark(&cluster, key);
    marked(&cluster.nodes()[primary], &mark, Duration::from_secs(5)).await;
    let resigned_at = Instant::now();
    assert!(leading.resign().await.unwrap());
    let next = tokio::time::timeout(Duration::from_secs(5), leaders.next())
        .await
        .expect("the vacancy was not reported before the lease's expiry")
        .expect("the watch goes on");
    assert!(next.is_none(), "reported {next:?} after the resignation");
    let took = resigned_at.elapsed();
    assert!(took < Duration::from_secs(1), "reported {took:?} after it");
}

/// A listeners mark lost (a failover, a restart) is set again by its
/// waiter within about a second, not when the mark would have run out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_listeners_mark_is_set_again() {
    let cluster = RedisCluster::start(3, 0);
    let holder = client_with(&cluster, settings()).await;
    let waiter = client_with(&cluster, settings()).await;
    let key = "remarked";
    let (primary, mark) = listeners_mark(&cluster, key);
    let primary = &cluster.nodes()[primary];
    let held = holder.lock(key, Duration::from_secs(30)).await.unwrap();
    let waiting = tokio::spawn(async move {
        let opts = LockOptions::new(Duration::from_secs(10)).wait(Duration::from_secs(20));
        waiter.lock_with(key, opts).await
    });
    marked(primary, &mark, Duration::from_secs(5)).await;
    let _: i64 = primary.cmd(&["DEL", &mark]);
    // Set for the whole 20 s wait, it would be set again only once less
    // than 15 s are left.
    marked(primary, &mark, Duration::from_secs(3)).await;
    assert!(held.release().await.unwrap());
    let guard = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the waiter got the key")
        .unwrap()
        .unwrap();
    guard.release().await.unwrap();
}

/// How many scripts every node of `cluster` has run (`INFO commandstats`).
fn scripts_run(cluster: &RedisCluster) -> u64 {
    cluster
        .nodes()
        .iter()
        .map(|node| {
            let info: String = node.cmd(&["INFO", "commandstats"]);
            info.lines()
                .find_map(|line| line.strip_prefix("cmdstat_evalsha:calls="))
                .and_then(|rest| rest.split(',').next())
                .map_or(0, |n| n.parse::<u64>().unwrap())
        })
        .sum()
}

/// Many locks held on a cluster are all renewed, over four ttls, and the
/// leases of one slot share a script call: the heartbeat sends each
/// primary pipelines of one renewal script per slot, not a call per lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_locks_on_a_cluster_are_renewed_a_script_per_slot() {
    const GROUPS: usize = 12;
    const PER_GROUP: usize = 100;
    let cluster = RedisCluster::start(3, 0);
    let client = client_with(&cluster, settings()).await;
    let ttl = Duration::from_secs(2);
    // `g3}17` is stored as `cluster:lock:{g3}17}`: its slot is `g3`'s, so
    // each group's locks share one.
    let keys: Vec<String> = (0..GROUPS * PER_GROUP)
        .map(|i| format!("g{}}}{}", i % GROUPS, i / GROUPS))
        .collect();
    let slots: std::collections::BTreeSet<u16> =
        (0..GROUPS).map(|g| hash_slot(&format!("g{g}"))).collect();
    assert_eq!(slots.len(), GROUPS, "the groups' slots differ");
    let guards = futures::future::try_join_all(keys.iter().map(|key| client.lock(key, ttl)))
        .await
        .unwrap();
    let before = scripts_run(&cluster);
    tokio::time::sleep(ttl * 4).await;
    let scripts = scripts_run(&cluster) - before;
    let lost = guards.iter().filter(|g| g.is_lost()).count();
    assert_eq!(lost, 0, "{lost} of {} locks lost", guards.len());
    // Each lock is renewed at least three times a ttl, so twelve times in
    // four: 14,400 renewals. A script per slot and round makes it about a
    // hundred times fewer calls; a call per lease would be 14,400.
    let renewals = (GROUPS * PER_GROUP * 12) as u64;
    assert!(
        scripts * 10 < renewals,
        "{scripts} scripts for about {renewals} renewals"
    );
    for guard in guards {
        assert!(guard.release().await.unwrap());
    }
}
