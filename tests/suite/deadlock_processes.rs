//! Who waits for whom, across processes: each replica is a worker process
//! of its own (`src/bin/deadlock-worker.rs`) that holds one key in an
//! annotated body and, when told, asks for another in a nested annotated
//! call, with a wait of 30 s. What a user notices: in a cycle one replica
//! fails with `WouldDeadlock` within a second of the cycle closing and the
//! others complete, on one server, on a Redis Cluster (keys in different
//! slots) and on Redlock; a chain without a cycle completes; a replica
//! killed while it waits leaves nothing that fails anyone once its records
//! expired.

use lock_core::LockClient;
use lock_testkit::{RedisCluster, RedisServer, start_servers};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const WORKER_BIN: &str = env!("CARGO_BIN_EXE_deadlock-worker");

/// The promised bound: the victim fails within a second of the cycle closing.
const DETECTED: Duration = Duration::from_secs(1);
/// The workers' wait: only a detected cycle ends it sooner.
const WAIT: Duration = Duration::from_secs(30);
/// How long any one step of a worker may take on a loaded machine.
const STEP: Duration = Duration::from_secs(20);

/// Where the workers' locks live.
struct Servers {
    mode: &'static str,
    urls: Vec<String>,
}

/// A worker process and what it said, line by line.
struct Worker {
    name: String,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<(String, Instant)>,
}

impl Worker {
    fn start(servers: &Servers, name: &str, first: &str, second: &str, ttl: Duration) -> Worker {
        let mut child = Command::new(WORKER_BIN)
            .args([name, first, second])
            .arg(ttl.as_millis().to_string())
            .arg(WAIT.as_millis().to_string())
            .arg(servers.mode)
            .args(&servers.urls)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("the worker starts");
        let stdout = child.stdout.take().expect("piped");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send((line, Instant::now())).is_err() {
                    break;
                }
            }
        });
        Worker {
            name: name.to_owned(),
            stdin: child.stdin.take(),
            child,
            lines,
        }
    }

    /// The next line, and when it was read.
    fn next(&self) -> (String, Instant) {
        self.lines
            .recv_timeout(STEP)
            .unwrap_or_else(|_| panic!("{} said nothing for {STEP:?}", self.name))
    }

    /// Waits for a line that starts with `what`.
    fn expect(&self, what: &str) -> Instant {
        let (line, at) = self.next();
        assert!(
            line.starts_with(what),
            "{}: {line:?}, not {what:?}",
            self.name
        );
        at
    }

    /// Tells it to ask for its second key; returns when it said it does.
    fn go(&mut self) -> Instant {
        let stdin = self.stdin.as_mut().expect("told once");
        writeln!(stdin, "go").expect("the worker reads its stdin");
        stdin.flush().unwrap();
        self.expect("waiting")
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts one worker per `(name, first, second)`, waits until each holds
/// its first key, then lets them all ask for their second; returns when
/// each said how it ended, with the moment the last started waiting.
fn cycle(
    servers: &Servers,
    owners: &[(&str, &str, &str)],
) -> (Vec<(String, String, Instant)>, Instant) {
    let mut workers: Vec<Worker> = owners
        .iter()
        .map(|(name, first, second)| {
            Worker::start(servers, name, first, second, Duration::from_secs(10))
        })
        .collect();
    for worker in &workers {
        worker.expect("holding");
    }
    let closed = workers.iter_mut().map(Worker::go).max().expect("workers");
    let ends = workers
        .iter()
        .map(|w| {
            let (line, at) = w.next();
            (w.name.clone(), line, at)
        })
        .collect();
    (ends, closed)
}

/// Exactly one worker failed with `WouldDeadlock` within [`DETECTED`] of
/// `closed`, naming every replica; the others said `ok`.
fn one_victim(servers: &Servers, ends: &[(String, String, Instant)], closed: Instant) -> Duration {
    let victims: Vec<_> = ends.iter().filter(|(_, line, _)| line != "ok").collect();
    assert_eq!(
        victims.len(),
        1,
        "{}: exactly one victim: {ends:?}",
        servers.mode
    );
    let (victim, line, at) = victims[0];
    assert!(line.starts_with("err WouldDeadlock "), "{victim}: {line}");
    for (name, ..) in ends {
        assert!(line.contains(name.as_str()), "{name} named in {line}");
    }
    let took = at.saturating_duration_since(closed);
    assert!(
        took < DETECTED,
        "{}: {victim} failed {took:?} after the cycle closed",
        servers.mode
    );
    eprintln!(
        "{}, {} processes: {victim} gave up {took:?} after the cycle closed",
        servers.mode,
        ends.len()
    );
    took
}

/// A client of the test itself on the workers' keys.
async fn observer(server: &RedisServer) -> LockClient {
    LockClient::builder()
        .url(server.url())
        .key_prefix("deadlock:")
        .build()
        .await
        .unwrap()
}

fn single(server: &RedisServer) -> Servers {
    Servers {
        mode: "single",
        urls: vec![server.url()],
    }
}

/// Two replicas, `charge(order 42)` → `debit(account 7)` and
/// `refund(account 7)` → `restore(order 42)`: on one server, on a cluster
/// and on Redlock.
#[test]
fn two_replicas_in_a_cycle_one_gives_up_within_a_second() {
    let owners = [
        ("replica-1", "order:42", "account:7"),
        ("replica-2", "account:7", "order:42"),
    ];
    let server = RedisServer::start();
    let cluster = RedisCluster::start(3, 0);
    let redlock = start_servers(3);
    for servers in [
        single(&server),
        Servers {
            mode: "cluster",
            urls: cluster.urls(),
        },
        Servers {
            mode: "redlock",
            urls: redlock.iter().map(RedisServer::url).collect(),
        },
    ] {
        let (ends, closed) = cycle(&servers, &owners);
        one_victim(&servers, &ends, closed);
    }
}

/// Three replicas in a ring, on one server, on a cluster and on Redlock.
#[test]
fn three_replicas_in_a_cycle_one_gives_up_within_a_second() {
    let owners = [
        ("replica-1", "a:1", "b:2"),
        ("replica-2", "b:2", "c:3"),
        ("replica-3", "c:3", "a:1"),
    ];
    let server = RedisServer::start();
    let cluster = RedisCluster::start(3, 0);
    let redlock = start_servers(3);
    for servers in [
        single(&server),
        Servers {
            mode: "cluster",
            urls: cluster.urls(),
        },
        Servers {
            mode: "redlock",
            urls: redlock.iter().map(RedisServer::url).collect(),
        },
    ] {
        let (ends, closed) = cycle(&servers, &owners);
        one_victim(&servers, &ends, closed);
    }
}

/// A chain of three replicas that ends at a key this test holds for two
/// seconds: every replica waits, walks the chain several times, and
/// completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_of_replicas_without_a_cycle_completes() {
    let server = RedisServer::start();
    let servers = single(&server);
    let test = observer(&server).await;
    let end = test.lock("end:4", Duration::from_secs(30)).await.unwrap();
    let letting_go = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(2)).await;
        end.release().await.unwrap();
    });
    let owners = [
        ("replica-1", "a:1", "b:2"),
        ("replica-2", "b:2", "c:3"),
        ("replica-3", "c:3", "end:4"),
    ];
    let (ends, _) = tokio::task::spawn_blocking(move || cycle(&servers, &owners))
        .await
        .unwrap();
    letting_go.await.unwrap();
    for (name, line, _) in &ends {
        assert_eq!(line, "ok", "{name}");
    }
}

/// A replica killed (SIGKILL) while it waits: its records expire within
/// two seconds, and after that the replica it waited for asks for the
/// dead one's key (which stays held until its ttl) without being taken
/// for a cycle: it gets the key at the dead lease's expiry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_killed_while_waiting_causes_no_false_cycle() {
    let server = RedisServer::start();
    let servers = single(&server);
    let observer = observer(&server).await;
    let ttl = Duration::from_secs(5);
    let mut doomed = Worker::start(&servers, "doomed", "k:1", "k:2", ttl);
    let mut survivor = Worker::start(&servers, "survivor", "k:2", "k:1", ttl);
    doomed.expect("holding");
    survivor.expect("holding");
    doomed.go();
    let recorded = || async {
        let state = observer.inspect("k:2").await.unwrap().unwrap();
        state.waiting()
    };
    let started = Instant::now();
    while recorded().await == 0 {
        assert!(
            started.elapsed() < STEP,
            "the doomed replica's wait was never recorded"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    doomed.child.kill().unwrap();
    doomed.child.wait().unwrap();
    let killed = Instant::now();
    while recorded().await > 0 {
        // A record lives 2 s past its last refresh, which came before the
        // kill; the rest is this loop's polling on a busy machine.
        assert!(
            killed.elapsed() < Duration::from_millis(2_500),
            "a dead waiter's record outlived its two seconds"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The dead replica's lease on k:1 is still there; its records are not.
    assert!(observer.inspect("k:1").await.unwrap().is_some());
    let (line, at) = tokio::task::spawn_blocking(move || {
        survivor.go();
        survivor.next()
    })
    .await
    .unwrap();
    assert_eq!(line, "ok", "the survivor got the dead replica's key");
    assert!(
        at.duration_since(killed) < ttl + Duration::from_secs(2),
        "at the dead lease's expiry, not later"
    );
}
