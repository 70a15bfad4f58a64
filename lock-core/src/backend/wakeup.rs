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

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{Notify, mpsc, oneshot};

/// How often a hub drops channels without waiters.
const SWEEP: Duration = Duration::from_secs(5);

/// The wake-up channels of one client, over all its servers.
pub(crate) struct Wakeups {
    channels: Arc<Channels>,
    hubs: Vec<Hub>,
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

/// One server's subscriber connection, run by a task.
struct Hub {
    client: redis::Client,
    live: Mutex<Option<HubHandle>>,
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
                    client,
                    live: Mutex::new(None),
                })
                .collect(),
        }
    }

    /// Wake-ups inside the process, on `channels` that an in-memory store
    /// notifies.
    pub(crate) fn local(channels: Arc<Channels>) -> Wakeups {
        Wakeups {
            channels,
            hubs: Vec::new(),
        }
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
            .filter_map(|hub| hub.handle(&self.channels))
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
        // waiter. The others' subscriptions go on in their hubs.
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
    async fn subscribe(&self, channel: &str) -> bool {
        let (done, answer) = oneshot::channel();
        let request = Request::Subscribe {
            channel: channel.to_owned(),
            done,
        };
        if self.requests.send(request).is_err() {
            return false;
        }
        answer.await.unwrap_or(false)
    }
}

impl Hub {
    /// The running hub task, started on the current runtime if none runs.
    fn handle(&self, channels: &Arc<Channels>) -> Option<HubHandle> {
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
        let client = self.client.clone();
        let channels = Arc::downgrade(channels);
        tokio::runtime::Handle::try_current()
            .ok()?
            .spawn(async move {
                let _alive = Alive(alive);
                serve(client, channels, inbox).await;
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

/// The hub task: one subscriber connection, subscriptions in order, and
/// messages fanned out to the waiters of each channel. Ends when the
/// connection drops, or when the client is gone and nobody asks anything.
async fn serve(
    client: redis::Client,
    channels: std::sync::Weak<Channels>,
    mut inbox: mpsc::UnboundedReceiver<Request>,
) {
    let Ok(Ok(pubsub)) =
        tokio::time::timeout(Duration::from_secs(5), client.get_async_pubsub()).await
    else {
        return;
    };
    let (mut sink, mut messages) = pubsub.split();
    let mut subscribed: HashSet<String> = HashSet::new();
    let mut sweep = tokio::time::interval(SWEEP);
    sweep.tick().await;
    loop {
        tokio::select! {
            request = inbox.recv() => {
                let (channel, done) = match request {
                    None => return,
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
                    return; // connection lost: the next waiter starts a new hub
                };
                let Some(channels) = channels.upgrade() else {
                    return;
                };
                let entry = channels.lock().get(message.get_channel_name()).cloned();
                if let Some(entry) = entry {
                    entry.released.notify_waiters();
                }
            }
            _ = sweep.tick() => {
                let Some(channels) = channels.upgrade() else {
                    return;
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
