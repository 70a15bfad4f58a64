//! What operators see in their dashboards: the `metrics` feature.

use crate::support::{client_with, eventually};
use lock_core::{LockClient, LockClientBuilder, LockError, LockOptions, distributed_lock};
use lock_testkit::RedisServer;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use std::cell::RefCell;
use std::collections::HashMap;
use std::time::Duration;
use tokio::sync::oneshot;

/// The clients of this file.
fn settings() -> LockClientBuilder {
    LockClient::builder()
        .key_prefix("obs:")
        .operation_timeout(Duration::from_millis(300))
}

#[test]
fn metrics_count_outcomes_and_time_waits_and_holds() {
    let server = RedisServer::start();
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let client = client_with(&server, settings()).await;
            let other_process = client_with(&server, settings()).await;
            let held = client.lock("k", Duration::from_secs(5)).await.unwrap();
            let short = LockOptions::new(Duration::from_secs(5)).wait(Duration::from_millis(50));
            assert!(other_process.lock_with("k", short).await.is_err());
            assert!(held.release().await.unwrap());
            let lost = client
                .lock_with(
                    "k",
                    LockOptions::new(Duration::from_millis(100)).renew(false),
                )
                .await
                .unwrap();
            lost.lost().await;
            // The store may not have expired it yet (the drift allowance):
            // either answer is right.
            lost.release().await.unwrap();
        });
    });
    let snapshot: HashMap<String, DebugValue> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| (key.key().name().to_owned(), value))
        .collect();
    let counter = |name: &str| match snapshot.get(name) {
        Some(DebugValue::Counter(n)) => *n,
        other => panic!("{name}: {other:?}"),
    };
    let samples = |name: &str| match snapshot.get(name) {
        Some(DebugValue::Histogram(values)) => values.len(),
        other => panic!("{name}: {other:?}"),
    };
    assert_eq!(counter("lock_core_acquired_total"), 2);
    assert_eq!(counter("lock_core_contended_total"), 1);
    assert_eq!(counter("lock_core_lost_total"), 1);
    assert_eq!(counter("lock_core_released_total"), 2);
    assert_eq!(samples("lock_core_wait_seconds"), 3);
    assert_eq!(samples("lock_core_hold_seconds"), 2);
}

/// Everything recorded so far, by name and `template` label: a counter's
/// total, a gauge's value, a histogram's sample count. A snapshot of the
/// debugging recorder drains it (counters and gauges back to 0, histograms
/// emptied), so each look adds what came since the last one.
struct Recorded {
    snapshotter: Snapshotter,
    totals: RefCell<HashMap<(String, String), f64>>,
}

impl Recorded {
    fn new(snapshotter: Snapshotter) -> Recorded {
        Recorded {
            snapshotter,
            totals: RefCell::default(),
        }
    }

    fn drain(&self) {
        let mut totals = self.totals.borrow_mut();
        for (key, _, _, value) in self.snapshotter.snapshot().into_vec() {
            let key = key.key();
            let label = key
                .labels()
                .find(|l| l.key() == "template")
                .map_or("", |l| l.value());
            let added = match value {
                DebugValue::Counter(n) => n as f64,
                DebugValue::Gauge(value) => value.into_inner(),
                DebugValue::Histogram(samples) => samples.len() as f64,
            };
            *totals
                .entry((key.name().to_owned(), label.to_owned()))
                .or_default() += added;
        }
    }

    /// `name{template=label}` now; 0 for a series never recorded.
    fn get(&self, name: &str, label: &str) -> f64 {
        self.drain();
        let key = (name.to_owned(), label.to_owned());
        self.totals.borrow().get(&key).copied().unwrap_or(0.0)
    }

    /// Every `template` label value recorded.
    fn labels(&self) -> Vec<String> {
        self.drain();
        let mut labels: Vec<String> = self
            .totals
            .borrow()
            .keys()
            .map(|(_, label)| label.clone())
            .filter(|label| !label.is_empty())
            .collect();
        labels.sort();
        labels.dedup();
        labels
    }
}

/// Holds `order:{id}` until told to return.
#[distributed_lock(key = "order:{id}", ttl = "10s", wait = "5s", client = client)]
async fn ship(client: LockClient, id: u32, done: oneshot::Receiver<()>) -> Result<(), LockError> {
    let _ = done.await;
    Ok(())
}

#[distributed_lock(key = "crash:{id}", ttl = "10s", client = client)]
async fn crash(client: LockClient, id: u32) -> Result<(), LockError> {
    tokio::task::yield_now().await;
    panic!("the body of crash({id}) panics, on purpose");
}

const WITHIN: Duration = Duration::from_secs(2);

/// The gauges and the histograms, labelled by template: up while held or
/// waiting, back to zero on every way out.
async fn gauges_follow_every_exit(snap: &Recorded) {
    let client = LockClient::in_memory();
    let held = |label: &str| snap.get("lock_core_held", label);
    let waiting = |label: &str| snap.get("lock_core_waiting", label);

    // The attribute: one holder, one waiter behind it.
    let (done, done_rx) = oneshot::channel();
    let holder = tokio::spawn(ship(client.clone(), 1, done_rx));
    eventually(WITHIN, "the holder counted", || held("order:{id}") == 1.0).await;
    let (_never, never_rx) = oneshot::channel();
    let waiter = tokio::spawn(ship(client.clone(), 1, never_rx));
    eventually(WITHIN, "the waiter counted", || {
        waiting("order:{id}") == 1.0
    })
    .await;
    assert_eq!(held("order:{id}"), 1.0);

    // A waiter cancelled while it waits is no longer waiting.
    waiter.abort();
    assert!(waiter.await.unwrap_err().is_cancelled());
    assert_eq!(waiting("order:{id}"), 0.0);

    // The guard API: labelled, and not.
    let ttl = LockOptions::new(Duration::from_secs(10));
    let report = client
        .lock_with("report:7", ttl.clone().label("report:{day}"))
        .await
        .unwrap();
    let adhoc = client.lock_with("adhoc", ttl).await.unwrap();
    assert_eq!(held("report:{day}"), 1.0);
    assert_eq!(held(LockOptions::UNLABELLED), 1.0);

    // Release (the attribute's, the guard's) and drop.
    done.send(()).unwrap();
    holder.await.unwrap().unwrap();
    assert_eq!(held("order:{id}"), 0.0);
    assert!(report.release().await.unwrap());
    drop(adhoc);
    assert_eq!(held("report:{day}"), 0.0);
    assert_eq!(held(LockOptions::UNLABELLED), 0.0);

    // Loss: no longer held, though the guard lives on.
    let short = LockOptions::new(Duration::from_millis(100))
        .renew(false)
        .label("short");
    let lost = client.lock_with("short", short).await.unwrap();
    assert_eq!(held("short"), 1.0);
    lost.lost().await;
    assert_eq!(held("short"), 0.0);
    drop(lost);
    assert_eq!(held("short"), 0.0, "counted down once");

    // A panicking body.
    assert!(
        tokio::spawn(crash(client.clone(), 1))
            .await
            .unwrap_err()
            .is_panic()
    );
    assert_eq!(held("crash:{id}"), 0.0);
    assert_eq!(snap.get("lock_core_hold_seconds", "crash:{id}"), 1.0);

    // The histograms carry the template, never the rendered key.
    assert_eq!(snap.get("lock_core_wait_seconds", "order:{id}"), 1.0);
    assert_eq!(snap.get("lock_core_hold_seconds", "order:{id}"), 1.0);
    assert_eq!(snap.get("lock_core_hold_seconds", "report:{day}"), 1.0);
    assert_eq!(waiting("order:{id}") + waiting("report:{day}"), 0.0);
    assert_eq!(
        snap.labels(),
        [
            "crash:{id}",
            "order:{id}",
            "report:{day}",
            "short",
            "unlabelled"
        ]
    );
}

#[test]
fn gauges_are_labelled_by_template_and_go_back_down() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(gauges_follow_every_exit(&Recorded::new(snapshotter)));
    });
}
