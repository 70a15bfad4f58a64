//! Redis Sentinel and `min_replicas`, against real `redis-server` processes:
//! a primary, a replica and three Sentinels started by the test kit.

use crate::support::storage_key;
use lock_core::{ErrorKind, LockClient, LockOptions};
use lock_testkit::{RedisServer, SentinelServer};
use std::time::Duration;
use tokio::time::Instant;

const PREFIX: &str = "sentinel:lock:";
const SERVICE: &str = "lockprimary";
/// Bound on every wait for the topology (sync, discovery, failover).
const TOPOLOGY_BOUND: Duration = Duration::from_secs(20);

/// A primary and a replica that has finished its initial sync.
fn primary_and_replica() -> (RedisServer, RedisServer) {
    let primary = RedisServer::start();
    let replica = RedisServer::builder().replica_of(&primary).start();
    replica
        .wait_replica_synced(TOPOLOGY_BOUND)
        .unwrap_or_else(|e| panic!("{e}\n--- primary log ---\n{}", primary.log()));
    (primary, replica)
}

/// `SENTINEL FAILOVER`, repeated while the Sentinel has no replica it can
/// promote yet (`NOGOODSLAVE`) or another failover runs (`INPROG`).
fn force_failover(sentinel: &SentinelServer) {
    let deadline = std::time::Instant::now() + TOPOLOGY_BOUND;
    loop {
        match sentinel.try_cmd::<String>(&["SENTINEL", "FAILOVER", SERVICE]) {
            Ok(_) => return,
            Err(e) if std::time::Instant::now() < deadline => {
                eprintln!("SENTINEL FAILOVER refused, retrying: {}", e.message());
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => panic!("SENTINEL FAILOVER never accepted: {e}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_client_follows_a_failover() {
    let started = Instant::now();
    let (primary, replica) = primary_and_replica();
    let sentinels: Vec<SentinelServer> = (0..3)
        .map(|_| SentinelServer::start(&primary, SERVICE, 2))
        .collect();
    sentinels[0]
        .wait_for_replicas(SERVICE, 1, TOPOLOGY_BOUND)
        .unwrap();

    let client = LockClient::builder()
        .sentinel(sentinels.iter().map(SentinelServer::url), SERVICE)
        .key_prefix(PREFIX)
        .operation_timeout(Duration::from_millis(500))
        .connect_timeout(Duration::from_secs(2))
        .build()
        .await
        .unwrap_or_else(|e| panic!("sentinel client: {e}\n{}", sentinels[0].log()));
    assert!(format!("{client:?}").contains(SERVICE), "{client:?}");

    // Before the failover: on the first primary.
    let guard = client
        .lock("before", Duration::from_secs(10))
        .await
        .unwrap();
    assert!(
        primary
            .cmd::<Option<String>>(&["GET", &storage_key(PREFIX, "before")])
            .is_some()
    );
    assert!(guard.release().await.unwrap());
    assert_eq!(
        primary.cmd::<i64>(&["EXISTS", &storage_key(PREFIX, "before")]),
        0
    );

    force_failover(&sentinels[0]);
    sentinels[0]
        .wait_for_primary(SERVICE, replica.port(), TOPOLOGY_BOUND)
        .unwrap();
    // Until the Sentinels demote the old primary (which also disconnects
    // its clients), it still takes writes: wait for that, polling. A query
    // cut off by that disconnection counts as not demoted yet.
    let deadline = std::time::Instant::now() + TOPOLOGY_BOUND;
    while primary
        .try_info_field("replication", "role")
        .ok()
        .flatten()
        .as_deref()
        != Some("slave")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the old primary was not demoted\n--- sentinel log ---\n{}",
            sentinels[0].log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let failed_over = started.elapsed();

    // The same client, on the new primary.
    let acquiring = Instant::now();
    let guard = client
        .lock_with(
            "after",
            LockOptions::new(Duration::from_secs(10)).wait(Duration::from_secs(15)),
        )
        .await
        .unwrap_or_else(|e| {
            panic!(
                "lock after the failover: {e}\n--- sentinel log ---\n{}",
                sentinels[0].log()
            )
        });
    let took = acquiring.elapsed();
    assert_eq!(replica.role(), "master");
    let token: Option<String> = replica.cmd(&["GET", &storage_key(PREFIX, "after")]);
    assert!(token.is_some(), "the lock is not on the new primary");
    assert!(guard.release().await.unwrap());
    assert_eq!(
        replica.cmd::<i64>(&["EXISTS", &storage_key(PREFIX, "after")]),
        0
    );

    // And it keeps working: a second lock, held and released at once.
    let again = client.lock("again", Duration::from_secs(10)).await.unwrap();
    assert!(
        replica
            .cmd::<Option<String>>(&["GET", &storage_key(PREFIX, "again")])
            .is_some()
    );
    assert!(again.release().await.unwrap());
    eprintln!(
        "failover done after {failed_over:?}; first lock on the new primary took {took:?}; \
         test took {:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_replicas_succeeds_when_replicated_and_fails_cleanly_when_not() {
    let (primary, mut replica) = primary_and_replica();
    let op_timeout = Duration::from_millis(500);
    let client = |replicas: u32| {
        LockClient::builder()
            .url(primary.url())
            .key_prefix(PREFIX)
            .operation_timeout(op_timeout)
            .min_replicas(replicas, Duration::from_millis(200))
            .build()
    };
    let one = client(1).await.unwrap();
    let two = client(2).await.unwrap();

    // Replicated: granted, and the replica has the lock already (WAIT
    // returned only once it had acknowledged the write).
    let guard = one
        .lock("replicated", Duration::from_secs(10))
        .await
        .unwrap();
    let on_primary: Option<String> = primary.cmd(&["GET", &storage_key(PREFIX, "replicated")]);
    let on_replica: Option<String> = replica.cmd(&["GET", &storage_key(PREFIX, "replicated")]);
    assert!(on_primary.is_some());
    assert_eq!(on_primary, on_replica);
    assert!(guard.release().await.unwrap());

    // Fencing takes the same path.
    let fenced = one
        .lock_with(
            "fenced",
            LockOptions::new(Duration::from_secs(10)).fencing(true),
        )
        .await
        .unwrap();
    assert!(fenced.fencing_token().is_some());
    assert!(fenced.release().await.unwrap());

    // Two replicas asked for, one exists: never granted, nothing left.
    let wait = Duration::from_secs(1);
    let bound = wait + op_timeout + Duration::from_secs(1);
    let began = Instant::now();
    let err = two
        .lock_with("two", LockOptions::new(Duration::from_secs(10)).wait(wait))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(
        err.to_string().contains("not replicated to 2 replicas"),
        "{err}"
    );
    assert!(began.elapsed() < bound, "took {:?}", began.elapsed());
    assert_eq!(
        primary.cmd::<i64>(&["EXISTS", &storage_key(PREFIX, "two")]),
        0
    );

    // The replica gone: min_replicas 1 fails the same way.
    replica.stop();
    let deadline = Instant::now() + TOPOLOGY_BOUND;
    while primary
        .try_info_field("replication", "connected_slaves")
        .unwrap()
        .as_deref()
        != Some("0")
    {
        assert!(
            Instant::now() < deadline,
            "the primary still counts the replica"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let began = Instant::now();
    let err = one
        .lock_with(
            "alone",
            LockOptions::new(Duration::from_secs(10)).wait(wait),
        )
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(
        err.to_string().contains("not replicated to 1 replicas"),
        "{err}"
    );
    assert!(began.elapsed() < bound, "took {:?}", began.elapsed());
    assert_eq!(
        primary.cmd::<i64>(&["EXISTS", &storage_key(PREFIX, "alone")]),
        0
    );

    // A client without min_replicas is unaffected.
    let plain = LockClient::builder()
        .url(primary.url())
        .key_prefix(PREFIX)
        .build()
        .await
        .unwrap();
    let guard = plain.lock("alone", Duration::from_secs(10)).await.unwrap();
    assert!(guard.release().await.unwrap());
}

#[tokio::test]
async fn sentinel_and_min_replicas_misconfigurations_are_config_errors() {
    let misconfigured = [
        // Sentinels and a URL at once.
        LockClient::builder()
            .url("redis://127.0.0.1:1")
            .sentinel(["redis://127.0.0.1:2"], "m"),
        // No sentinel URL, no service name.
        LockClient::builder().sentinel(Vec::<String>::new(), "m"),
        LockClient::builder().sentinel(["redis://127.0.0.1:2"], ""),
        // Primary credentials without Sentinel.
        LockClient::builder()
            .url("redis://127.0.0.1:1")
            .sentinel_primary_credentials("redis://:pw@x/0"),
        // WAIT longer than the call that carries it.
        LockClient::builder()
            .url("redis://127.0.0.1:1")
            .operation_timeout(Duration::from_millis(500))
            .min_replicas(1, Duration::from_millis(500)),
        LockClient::builder()
            .url("redis://127.0.0.1:1")
            .min_replicas(0, Duration::from_millis(100)),
        // Redlock.
        LockClient::builder()
            .urls([
                "redis://127.0.0.1:1",
                "redis://127.0.0.1:2",
                "redis://127.0.0.1:3",
            ])
            .min_replicas(1, Duration::from_millis(100)),
    ];
    for (i, builder) in misconfigured.into_iter().enumerate() {
        let err = builder.build().await.err();
        assert_eq!(
            err.as_ref().map(|e| e.kind()),
            Some(ErrorKind::Config),
            "case {i}: {err:?}"
        );
    }
}
