//! Release wake-ups: waiters hear a release at once instead of polling.
//!
//! The release script publishes on a channel named after the lock key. A
//! waiter subscribes before its next attempt and then waits for whichever
//! comes first: a message, or its backoff timer (the fallback when a message
//! is missed, or when wake-ups are unavailable: an ACL without `SUBSCRIBE`,
//! a lost connection).
//!
//! Each server has one subscriber connection (a *hub*), shared by every
//! waiter of the client and demultiplexed in-process: a waiter costs a map
//! entry, not a connection. The hub's task handles subscriptions one at a
//! time, so a subscribe and an unsubscribe of the same channel can never
//! overtake each other.
//!
//! A client unsubscribes as soon as its last waiter for a key is done. That
//! keeps the waiting processes fair to each other: Redis delivers a
//! release to a channel's subscribers in the order they subscribed, so the
//! process that has waited longest hears it first and usually wins the
//! next `SET NX`. A subscription kept after its waiter left would put that
//! process first in every later race. A sweep also drops channels nobody
//! waits on, should an unsubscribe have been lost with a connection.

use super::cluster::Topology;
use crate::background::Spawner;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{Notify, mpsc, oneshot};

/// How often a hub drops channels without waiters.
const SWEEP: Duration = Duration::from_secs(5);

/// Subscriber connections of a client to a cluster: two, on two nodes, so
/// that one node going away costs no release message while its hub moves.
const CLUSTER_HUBS: usize = 2;

/// The wake-up channels of one client, over all its servers.
pub(crate) struct Wakeups {
    channels: Arc<Channels>,
    hubs: Vec<Hub>,
    /// Where the hubs' tasks run.
    spawner: Spawner,
}

/// The channels some waiter of this client listens on.
#[derive(Default)]
pub(crate) struct Channels {
    map: Mutex<HashMap<String, Arc<Channel>>>,
}

impl Channels {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Channel>>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Wakes every waiter: a release may have been missed.
    fn wake_all(&self) {
        for channel in self.lock().values() {
            channel.released.notify_waiters();
        }
    }

    /// Wakes the waiters of `channel` (a release seen in-process).
    pub(crate) fn notify(&self, channel: &str) {
        let entry = self.lock().get(channel).cloned();
        if let Some(entry) = entry {
            entry.released.notify_waiters();
        }
    }
}

struct Channel {
    released: Notify,
    waiters: AtomicUsize,
}

/// A waiter's interest in one channel; ends when dropped.
pub(crate) struct Subscription {
    channel: Arc<Channel>,
    name: String,
    channels: Arc<Channels>,
    /// The hubs asked to subscribe, told to unsubscribe when the last
    /// waiter of the channel is done.
    hubs: Vec<mpsc::UnboundedSender<Request>>,
}

impl Subscription {
    /// Completes at the next release message published after this call
    /// (the returned future must be polled or enabled first).
    pub(crate) fn released(&self) -> tokio::sync::futures::Notified<'_> {
        self.channel.released.notified()
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut map = self.channels.lock();
        if self.channel.waiters.fetch_sub(1, Ordering::AcqRel) == 1
            && map
                .get(&self.name)
                .is_some_and(|c| Arc::ptr_eq(c, &self.channel))
        {
            // The last waiter: forget the channel and unsubscribe. Sent
            // under the map's lock, so a waiter that comes next queues its
            // subscribe behind this.
            map.remove(&self.name);
            for hub in &self.hubs {
                let _ = hub.send(Request::Unsubscribe {
                    channel: self.name.clone(),
                });
            }
        }
    }
}

/// One subscriber connection, run by a task.
struct Hub {
    source: Source,
    live: Mutex<Option<HubHandle>>,
}

/// Where a hub connects.
#[derive(Clone)]
enum Source {
    /// One server.
    Server(Box<redis::Client>),
    /// Any live node of a cluster, the `n`-th of those the client knows
    /// first, the next one after each failed attempt: `PUBLISH` reaches
    /// every node, so any node hears every release.
    Cluster(Arc<Topology>, usize),
}

impl Source {
    /// The client to connect with after `failed` failed attempts.
    fn client(&self, failed: u32) -> Option<redis::Client> {
        match self {
            Source::Server(client) => Some(redis::Client::clone(client)),
            Source::Cluster(topology, n) => topology.subscriber(n + failed as usize),
        }
    }
}

#[derive(Clone)]
struct HubHandle {
    requests: mpsc::UnboundedSender<Request>,
    alive: Arc<AtomicBool>,
}

/// What a hub is asked to do, in order.
enum Request {
    /// Subscribe (unless subscribed already) and say whether it worked.
    Subscribe {
        channel: String,
        done: oneshot::Sender<bool>,
    },
    /// The client's last waiter for `channel` is done.
    Unsubscribe { channel: String },
}

impl Wakeups {
    /// Wake-ups through the release channels of these servers.
    pub(crate) fn new(clients: Vec<redis::Client>) -> Wakeups {
        Wakeups {
            channels: Arc::default(),
            hubs: clients
                .into_iter()
                .map(|client| Hub {
                    source: Source::Server(Box::new(client)),
                    live: Mutex::new(None),
                })
                .collect(),
            spawner: Spawner::default(),
        }
    }

    /// Wake-ups through a cluster's nodes: [`CLUSTER_HUBS`] subscriber
    /// connections, each to a different node while the client knows
    /// several, each moving to another node when its own goes. When a
    /// slot moves to another primary (a failover), every waiter is woken
    /// to look again and mark again that it listens: what it had marked
    /// on the old primary may not have reached the new one.
    pub(crate) fn cluster(topology: &Arc<Topology>) -> Wakeups {
        let channels: Arc<Channels> = Arc::default();
        let woken = Arc::downgrade(&channels);
        topology.on_change(Box::new(move || {
            if let Some(channels) = woken.upgrade() {
                channels.wake_all();
            }
        }));
        Wakeups {
            channels,
            hubs: (0..CLUSTER_HUBS)
                .map(|n| Hub {
                    source: Source::Cluster(topology.clone(), n),
                    live: Mutex::new(None),
                })
                .collect(),
            spawner: Spawner::default(),
        }
    }

    /// Wake-ups inside the process, on `channels` that an in-memory store
    /// notifies.
    pub(crate) fn local(channels: Arc<Channels>) -> Wakeups {
        Wakeups {
            channels,
            hubs: Vec::new(),
            spawner: Spawner::default(),
        }
    }

    /// The same wake-ups, their hubs run by `spawner`.
    pub(crate) fn spawning_on(mut self, spawner: Spawner) -> Wakeups {
        self.spawner = spawner;
        self
    }

    /// Subscribes to releases of `channel` on every server, waiting at most
    /// `limit` for the first server to confirm. `None` when no server could
    /// subscribe: the caller falls back to its timer.
    pub(crate) async fn subscribe(&self, channel: &str, limit: Duration) -> Option<Subscription> {
        let entry = {
            let mut map = self.channels.lock();
            let entry = map
                .entry(channel.to_owned())
                .or_insert_with(|| {
                    Arc::new(Channel {
                        released: Notify::new(),
                        waiters: AtomicUsize::new(0),
                    })
                })
                .clone();
            entry.waiters.fetch_add(1, Ordering::AcqRel);
            entry
        };
        let handles: Vec<HubHandle> = self
            .hubs
            .iter()
            .filter_map(|hub| hub.handle(&self.channels, &self.spawner))
            .collect();
        let subscription = Subscription {
            channel: entry,
            name: channel.to_owned(),
            channels: self.channels.clone(),
            hubs: handles.iter().map(|h| h.requests.clone()).collect(),
        };
        if self.hubs.is_empty() {
            // In-process locks: releases notify the channels directly.
            return Some(subscription);
        }
        // The first server that confirms is enough to hear a release (each
        // release publishes on every server it reaches, a majority at
        // least): a server that does not answer must not hold up the
        // waiter. The others' subscriptions go on in their hubs, so every
        // hub is asked here, before any answer is awaited: asked lazily,
        // inside the futures below, a hub whose future had not been polled
        // yet when the first confirmation came was never asked at all.
        let mut confirmations: FuturesUnordered<_> = handles
            .iter()
            .map(|handle| handle.subscribe(channel))
            .collect();
        let first = async {
            while let Some(ok) = confirmations.next().await {
                if ok {
                    return true;
                }
            }
            false
        };
        let confirmed = tokio::time::timeout(limit, first).await.unwrap_or(false);
        confirmed.then_some(subscription)
    }
}

impl HubHandle {
    /// Asks the hub to subscribe, at once (not when the returned future is
    /// first polled); the future tells whether it did.
    fn subscribe(&self, channel: &str) -> impl Future<Output = bool> + use<> {
        let (done, answer) = oneshot::channel();
        let request = Request::Subscribe {
            channel: channel.to_owned(),
            done,
        };
        let sent = self.requests.send(request).is_ok();
        async move { sent && answer.await.unwrap_or(false) }
    }
}

impl Hub {
    /// The running hub task, started by `spawner` if none runs.
    fn handle(&self, channels: &Arc<Channels>, spawner: &Spawner) -> Option<HubHandle> {
        let mut live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(handle) = live.as_ref()
            && handle.alive.load(Ordering::Acquire)
        {
            return Some(handle.clone());
        }
        let (requests, inbox) = mpsc::unbounded_channel();
        let alive = Arc::new(AtomicBool::new(true));
        let handle = HubHandle {
            requests,
            alive: alive.clone(),
        };
        let source = self.source.clone();
        let channels = Arc::downgrade(channels);
        // Not on the caller's runtime: a waiter on another runtime must
        // hear releases while this one's threads are blocked, and after it
        // shut down. (On a runtime the user gave, that one's: one that shut
        // down drops the task, `alive` says so, and waiters use their
        // timers until a hub runs again.)
        spawner.spawn("lock-core.wakeups", async move {
            let _alive = Alive(alive);
            serve(source, channels, inbox).await;
        });
        *live = Some(handle.clone());
        Some(handle)
    }
}

/// Clears the flag when the hub task ends or its runtime shuts down.
struct Alive(Arc<AtomicBool>);

impl Drop for Alive {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// The hub task: one subscriber connection at a time, subscriptions in
/// order, and messages fanned out to the waiters of each channel. When the
/// connection drops (a cut, a server restarted) it connects again, at once
/// and then on a backoff, subscribes again to every channel some waiter of
/// the client listens on, and wakes every waiter: a release published while
/// it was away was missed, so each looks again. Ends when the client is
/// gone.
async fn serve(
    source: Source,
    channels: std::sync::Weak<Channels>,
    mut inbox: mpsc::UnboundedReceiver<Request>,
) {
    let mut attempt = 0u32;
    // Which node next, on a cluster: one further after each failure.
    let mut tries = 0u32;
    let mut reconnected = false;
    loop {
        // Off lock-core's thread, as every connection is opened (see
        // `connection.rs`).
        let opening = source.client(tries);
        let connected = crate::background::off_thread(async move {
            let opening = opening?;
            Some(tokio::time::timeout(CONNECT, opening.get_async_pubsub()).await)
        })
        .await
        .flatten();
        let Some(Ok(Ok(pubsub))) = connected else {
            // Asked while away: no subscription now, the waiter's timer
            // stands in.
            let pause = RECONNECT
                .saturating_mul(1 << attempt.min(5))
                .min(MAX_RECONNECT);
            attempt += 1;
            tries = tries.wrapping_add(1);
            // Waiters may have subscribed in vain meanwhile.
            reconnected = true;
            let until = tokio::time::Instant::now() + pause;
            loop {
                match tokio::time::timeout_at(until, inbox.recv()).await {
                    Err(_) => break,
                    Ok(None) => return,
                    Ok(Some(Request::Subscribe { done, .. })) => drop(done.send(false)),
                    Ok(Some(Request::Unsubscribe { .. })) => {}
                }
            }
            if channels.strong_count() == 0 {
                return;
            }
            continue;
        };
        attempt = 0;
        let Some(map) = channels.upgrade() else {
            return;
        };
        match serve_connection(pubsub, &map, &mut inbox, reconnected).await {
            Served::ClientGone => return,
            Served::ConnectionLost => reconnected = true,
        }
    }
}

/// How [`serve_connection`] ended.
enum Served {
    ClientGone,
    ConnectionLost,
}

/// How long connecting the subscriber connection may take.
const CONNECT: Duration = Duration::from_secs(5);
/// The first pause before connecting again after a failed attempt; it
/// doubles up to [`MAX_RECONNECT`].
const RECONNECT: Duration = Duration::from_millis(50);
const MAX_RECONNECT: Duration = Duration::from_secs(2);

/// Subscribes `sink` to every channel some waiter listens on, and wakes
/// those waiters once it is subscribed: a release published while the
/// hub was away was missed, so each looks again. `false`: the connection
/// failed meanwhile.
async fn resubscribe(
    sink: &mut redis::aio::PubSubSink,
    channels: &Channels,
    subscribed: &mut HashSet<String>,
) -> bool {
    let wanted: Vec<(String, Arc<Channel>)> = channels
        .lock()
        .iter()
        .filter(|(_, c)| c.waiters.load(Ordering::Acquire) > 0)
        .map(|(name, c)| (name.clone(), c.clone()))
        .collect();
    for (name, channel) in wanted {
        let again = tokio::time::timeout(Duration::from_secs(2), sink.subscribe(&name)).await;
        if !matches!(again, Ok(Ok(()))) {
            return false;
        }
        subscribed.insert(name);
        // Subscribed first, then woken: a release after this is heard.
        channel.released.notify_waiters();
    }
    true
}

/// Serves one subscriber connection until it drops or the client is gone.
/// `catch_up`: it replaces a connection that dropped, so every channel
/// with waiters is subscribed again and its waiters woken.
async fn serve_connection(
    pubsub: redis::aio::PubSub,
    channels: &Arc<Channels>,
    inbox: &mut mpsc::UnboundedReceiver<Request>,
    catch_up: bool,
) -> Served {
    let (mut sink, mut messages) = pubsub.split();
    let mut subscribed: HashSet<String> = HashSet::new();
    if catch_up && !resubscribe(&mut sink, channels, &mut subscribed).await {
        return Served::ConnectionLost;
    }
    let channels = Arc::downgrade(channels);
    let mut sweep = tokio::time::interval(SWEEP);
    sweep.tick().await;
    loop {
        tokio::select! {
            request = inbox.recv() => {
                let (channel, done) = match request {
                    None => return Served::ClientGone,
                    Some(Request::Subscribe { channel, done }) => (channel, done),
                    Some(Request::Unsubscribe { channel }) => {
                        if subscribed.remove(&channel) {
                            let _ = tokio::time::timeout(
                                Duration::from_secs(2),
                                sink.unsubscribe(&channel),
                            )
                            .await;
                        }
                        continue;
                    }
                };
                let ok = subscribed.contains(&channel)
                    || matches!(
                        tokio::time::timeout(Duration::from_secs(2), sink.subscribe(&channel)).await,
                        Ok(Ok(()))
                    );
                if ok {
                    subscribed.insert(channel);
                }
                let _ = done.send(ok);
            }
            message = messages.next() => {
                let Some(message) = message else {
                    return Served::ConnectionLost;
                };
                let Some(channels) = channels.upgrade() else {
                    return Served::ClientGone;
                };
                let entry = channels.lock().get(message.get_channel_name()).cloned();
                if let Some(entry) = entry {
                    entry.released.notify_waiters();
                }
            }
            _ = sweep.tick() => {
                let Some(channels) = channels.upgrade() else {
                    return Served::ClientGone;
                };
                // Channels this hub serves that nobody waits on any more.
                let idle: Vec<String> = {
                    let mut map = channels.lock();
                    let idle: Vec<String> = subscribed
                        .iter()
                        .filter(|name| {
                            map.get(*name)
                                .is_none_or(|c| c.waiters.load(Ordering::Acquire) == 0)
                        })
                        .cloned()
                        .collect();
                    for name in &idle {
                        if map
                            .get(name)
                            .is_some_and(|c| c.waiters.load(Ordering::Acquire) == 0)
                        {
                            map.remove(name);
                        }
                    }
                    idle
                };
                for name in idle {
                    subscribed.remove(&name);
                    let _ = tokio::time::timeout(
                        Duration::from_secs(2),
                        sink.unsubscribe(&name),
                    )
                    .await;
                }
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// A hub is asked when `subscribe` is called: the waiter awaits only
    /// the first confirmation, and a hub whose answer it never awaits must
    /// still subscribe, or a release published on that server alone goes
    /// unheard.
    #[test]
    fn a_hub_is_asked_without_its_answer_being_awaited() {
        let (requests, mut inbox) = mpsc::unbounded_channel();
        let handle = HubHandle {
            requests,
            alive: Arc::new(AtomicBool::new(true)),
        };
        let answer = handle.subscribe("lock:{a}");
        drop(answer);
        match inbox.try_recv() {
            Ok(Request::Subscribe { channel, .. }) => assert_eq!(channel, "lock:{a}"),
            Ok(Request::Unsubscribe { .. }) => panic!("asked to unsubscribe"),
            Err(e) => panic!("the hub was not asked: {e}"),
        }
    }
}
