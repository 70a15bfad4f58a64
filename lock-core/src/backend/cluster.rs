//! A Redis Cluster over lock-core's own connections: one [`Node`] per
//! primary, each command sent to the primary of its key's hash slot.
//!
//! Every lock command touches keys of one hash slot (`<prefix>{<key>}` and
//! `<prefix>{<key>}:fence`). The slot map comes from `CLUSTER SLOTS`, asked
//! of any node known; it is asked again when a node cannot be reached or
//! answers `MOVED` (a failover, a slot moved), one refresh at a time. `ASK`
//! (a slot being migrated) sends `ASKING` and the command together to the
//! node named. `CLUSTERDOWN` is retried within the call's bound.
//!
//! One view of the cluster per client ([`Topology`]): the heartbeat's
//! twin, the release wake-ups and the operators' calls have connections of
//! their own, but every slot map any of them learns is the map all of them
//! use from their next command on, and every node named in any map (the
//! replicas too) is a node any of them may ask for the next one. The seeds
//! are only the way in: a client whose seeds are all gone still finds the
//! cluster through the nodes it has heard of.
//!
//! While a slot migrates, a command whose keys are not all on one side is
//! refused with `TRYAGAIN` until the migration ends (see ALGORITHMS.md,
//! section 16). Such a command is retried once and then refused as
//! [`migrating`](is_migrating), and the lock commands that can fall back
//! to commands of one key each (which always complete on one side or the
//! other) do so (see `commands.rs`).
//!
//! Each primary is a [`Node`]: lock-core's own connection, with its read
//! turn, its unawaited release and its scripts loaded at connect, the same
//! as one server. So a cluster gets the same isolation and the same
//! round trips as one server.

use super::node::{Conn, redact};
use super::wire::Hear;
use super::{LockCommands, LockKeys, MinReplicas, Node, Server, Several};
use crate::error::{ErrorKind, LockError, TimedOut, from_redis};
use crate::observe;
use crate::scripts::Wake;
use crate::token::Token;
use arc_swap::ArcSwapOption;
use futures::future::BoxFuture;
use redis::aio::ConnectionLike;
use redis::{Cmd, Pipeline, RedisFuture, Value};
use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::time::Instant;

/// How often the slot map is asked for while a primary cannot be reached,
/// and for how long at most (a failover takes `cluster-node-timeout` and a
/// vote: a few seconds).
const FOLLOW_EVERY: Duration = Duration::from_millis(100);
const FOLLOW_FOR: Duration = Duration::from_secs(30);

/// Hash slots in a cluster.
const SLOTS: u16 = 16384;

/// Redirections (`MOVED`, `ASK`) and `TRYAGAIN`s one command follows.
const REDIRECTS: usize = 8;

/// How long a command waits before it is sent again after `TRYAGAIN` or
/// `CLUSTERDOWN` (a slot mid-migration, a failover under way).
const TRY_AGAIN: Duration = Duration::from_millis(20);

/// A node's address.
type Addr = (String, u16);

/// A Redis Cluster, and the nodes all locks share to it.
pub(crate) struct ClusterNode {
    /// Never set: `WAIT` is refused for a cluster by the builder.
    pub(crate) min_replicas: Option<MinReplicas>,
    routes: Arc<Routes>,
}

/// What every part of one client knows of the cluster: shared by the
/// client's connections and its twin's (the heartbeat's), and by its
/// release wake-ups.
pub(crate) struct Topology {
    /// The seeds, for messages.
    addr: String,
    /// The seeds' addresses, asked with the primaries of the last map.
    seeds: Vec<Addr>,
    /// The seeds' connection settings (credentials, database), for every
    /// node.
    info: redis::ConnectionInfo,
    /// The last slot map any part of the client learnt.
    layout: ArcSwapOption<Layout>,
    /// Every node named in a slot map so far, primaries and replicas, and
    /// the seeds: any of them can answer for the map.
    known: Mutex<Vec<Addr>>,
    /// Counts the maps learnt that moved a slot to another primary.
    changes: AtomicU64,
    /// Told of every such change (the waiters listen again: a failover may
    /// have lost what they had set on the old primary).
    on_change: Mutex<Vec<Box<dyn Fn() + Send + Sync>>>,
    /// Whether a task follows a failover (see [`Routes::follow_failover`]).
    following: AtomicBool,
}

/// Which primary serves which slots, by address.
struct Layout {
    /// `(first slot, last slot, primary)`, sorted.
    ranges: Vec<(u16, u16, Addr)>,
    /// Set when a node of it could not be reached or a slot moved: the
    /// next command asks for a new map first.
    stale: AtomicBool,
}

/// The slot map and the nodes of one set of connections.
struct Routes {
    topology: Arc<Topology>,
    connect_timeout: Duration,
    /// Read by every command: lock-free.
    map: ArcSwapOption<SlotMap>,
    /// Every node seen, by address: a node's connection outlives the maps
    /// that name it.
    nodes: Mutex<HashMap<Addr, Arc<Node>>>,
    /// One refresh at a time; the others wait for it.
    refreshing: tokio::sync::Mutex<()>,
}

/// The [`Layout`] over this set's connections.
pub(super) struct SlotMap {
    /// `(first slot, last slot, primary)`, sorted.
    ranges: Vec<(u16, u16, Arc<Node>)>,
    /// What it was made from: while that is the topology's layout and not
    /// stale, this map is current.
    from: Arc<Layout>,
}

impl SlotMap {
    pub(super) fn primary(&self, slot: u16) -> Option<&Arc<Node>> {
        let at = self.ranges.partition_point(|(first, _, _)| *first <= slot);
        let (_, last, node) = self.ranges.get(at.checked_sub(1)?)?;
        (slot <= *last).then_some(node)
    }
}

impl Layout {
    fn is_stale(&self) -> bool {
        self.stale.load(Ordering::Acquire)
    }

    fn primaries(&self) -> impl Iterator<Item = &Addr> {
        self.ranges.iter().map(|(_, _, at)| at)
    }

    /// Whether `other` has every slot on the same primary.
    fn same_as(&self, other: &Layout) -> bool {
        self.ranges == other.ranges
    }
}

impl Topology {
    /// Learns a slot map: the one every part of the client uses from now
    /// on, with its nodes (`also`: the replicas) known from now on.
    fn learn(&self, layout: Arc<Layout>, also: Vec<Addr>) {
        {
            let mut known = self.known.lock().unwrap_or_else(PoisonError::into_inner);
            for at in layout.primaries().cloned().chain(also) {
                if !known.contains(&at) {
                    known.push(at);
                }
            }
        }
        let before = self.layout.swap(Some(layout.clone()));
        if before.is_some_and(|before| !before.same_as(&layout)) {
            self.changes.fetch_add(1, Ordering::AcqRel);
            let hooks = self
                .on_change
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            for hook in hooks.iter() {
                hook();
            }
        }
    }

    /// The current layout, unless stale.
    fn fresh(&self) -> Option<Arc<Layout>> {
        self.layout.load_full().filter(|l| !l.is_stale())
    }

    fn stale(&self) {
        if let Some(layout) = self.layout.load_full() {
            layout.stale.store(true, Ordering::Release);
        }
    }

    /// The nodes to ask for the slot map, best first: the primaries of the
    /// last map, the seeds, then every other node heard of.
    fn to_ask(&self) -> Vec<Addr> {
        let mut asked: Vec<Addr> = Vec::new();
        let mut add = |at: &Addr| {
            if !asked.contains(at) {
                asked.push(at.clone());
            }
        };
        if let Some(layout) = self.layout.load_full() {
            layout.primaries().for_each(&mut add);
        }
        self.seeds.iter().for_each(&mut add);
        self.known
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .for_each(&mut add);
        asked
    }

    /// A plain client for the `index`-th node to try for a subscriber
    /// connection: the primaries first, then the other nodes heard of
    /// (`PUBLISH` reaches every node of a cluster, so any live one hears
    /// every release).
    pub(crate) fn subscriber(&self, index: usize) -> Option<redis::Client> {
        let asked = self.to_ask();
        let (host, port) = asked.get(index % asked.len().max(1))?.clone();
        let info = self
            .info
            .clone()
            .set_addr(redis::ConnectionAddr::Tcp(host, port));
        redis::Client::open(info).ok()
    }

    /// How many times a slot moved to another primary so far.
    pub(crate) fn changes(&self) -> u64 {
        self.changes.load(Ordering::Acquire)
    }

    /// Calls `hook` whenever a slot map moves a slot to another primary.
    pub(crate) fn on_change(&self, hook: Box<dyn Fn() + Send + Sync>) {
        self.on_change
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(hook);
    }
}

impl ClusterNode {
    /// A cluster reached first through `urls` (`redis://[user:password@]host:port`,
    /// any of its nodes; the others are discovered). Plain TCP only.
    pub(crate) fn new(
        urls: &[String],
        connect_timeout: Duration,
    ) -> Result<ClusterNode, LockError> {
        if urls.is_empty() {
            return Err(LockError::config(
                "Redis Cluster needs at least one node URL",
            ));
        }
        if let Some(url) = urls.iter().find(|url| {
            url.split_once("://")
                .is_some_and(|(scheme, _)| !scheme.eq_ignore_ascii_case("redis"))
        }) {
            return Err(LockError::config(format!(
                "{:?}: Redis Cluster is supported over redis:// URLs only",
                redact(url)
            )));
        }
        let seeds = urls
            .iter()
            .map(|url| {
                redis::Client::open(url.as_str()).map_err(|e| {
                    LockError::config(format!(
                "cannot use Redis URL {:?}: write it as redis://[user:password@]host:port[/db]",
                redact(url)
            ))
                        .with_redis_source(e)
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut addrs = Vec::with_capacity(seeds.len());
        for seed in &seeds {
            match seed.get_connection_info().addr() {
                redis::ConnectionAddr::Tcp(host, port) => addrs.push((host.clone(), *port)),
                _ => {
                    return Err(LockError::config(
                        "Redis Cluster is supported over TCP (redis://host:port) only",
                    ));
                }
            }
        }
        let shown: Vec<String> = addrs.iter().map(|(h, p)| format!("{h}:{p}")).collect();
        let topology = Topology {
            addr: format!("cluster[{}]", shown.join(", ")),
            known: Mutex::new(addrs.clone()),
            seeds: addrs,
            info: seeds[0].get_connection_info().clone(),
            layout: ArcSwapOption::empty(),
            changes: AtomicU64::new(0),
            on_change: Mutex::new(Vec::new()),
            following: AtomicBool::new(false),
        };
        Ok(ClusterNode {
            min_replicas: None,
            routes: Arc::new(Routes::new(Arc::new(topology), connect_timeout)),
        })
    }

    /// The same cluster through connections of its own (see
    /// [`Backend::twin`](super::Backend::twin)), with the same view of it.
    pub(crate) fn twin(&self) -> ClusterNode {
        ClusterNode {
            min_replicas: self.min_replicas,
            routes: Arc::new(Routes::new(
                self.routes.topology.clone(),
                self.routes.connect_timeout,
            )),
        }
    }

    /// What every part of the client knows of the cluster.
    pub(crate) fn topology(&self) -> &Arc<Topology> {
        &self.routes.topology
    }

    /// The seed nodes' addresses, for messages.
    pub(crate) fn addr(&self) -> &str {
        &self.routes.topology.addr
    }

    /// A cluster node over `routes`, for a release sent again.
    fn over(routes: Arc<Routes>) -> ClusterNode {
        ClusterNode {
            min_replicas: None,
            routes,
        }
    }

    /// The primaries, in address order (from the slot map, asked for again
    /// when stale): for listing every key.
    pub(crate) async fn primaries(&self, limit: Duration) -> Result<Vec<Arc<Node>>, LockError> {
        let map = self.routes.map(Instant::now() + limit).await?;
        let mut primaries: Vec<Arc<Node>> = map.ranges.iter().map(|(_, _, n)| n.clone()).collect();
        primaries.sort_by(|a, b| a.addr().cmp(b.addr()));
        primaries.dedup_by(|a, b| Arc::ptr_eq(a, b));
        Ok(primaries)
    }

    /// The slot map: the one known now when it is fresh, or else one asked
    /// for within `limit` (see `Routes::map`); `None` when none came.
    pub(super) async fn slot_map(&self, limit: Duration) -> Option<Arc<SlotMap>> {
        self.routes.map(Instant::now() + limit).await.ok()
    }

    /// The primary serving `key`'s slot in the map known now, when that
    /// map is fresh: for the calls that cannot follow a redirection (a
    /// release nobody waits for). `None` otherwise.
    fn settled_primary(&self, key: &str) -> Option<Arc<Node>> {
        let map = self.routes.current()?;
        map.primary(slot_of(key.as_bytes())).cloned()
    }

    /// Compare-and-delete sent to `key`'s primary without waiting for its
    /// reply, as to one server ([`Node::send_release`]), while the slot map
    /// is fresh. Should the slot be migrating or have moved meanwhile, or
    /// the connection break, the reply says so and the release is sent
    /// again in the background, through the cluster's redirections
    /// ([`hear_release`]). With no fresh map, or when the primary cannot be
    /// reached, the release is sent and waited for, following
    /// redirections.
    pub(crate) async fn send_release(
        &self,
        key: &str,
        token: &Token,
        limit: Duration,
    ) -> Result<(), LockError> {
        if let Some(primary) = self.settled_primary(key) {
            let started = Instant::now();
            let hear = || hear_release(&self.routes, key, token, limit);
            if primary
                .send_release_hearing(key, token, self.wake(), limit, hear)
                .await
                .is_ok()
            {
                return Ok(());
            }
            self.routes.stale();
            let left = limit.saturating_sub(started.elapsed());
            return self.release(key, token, left).await.map(drop);
        }
        self.release(key, token, limit).await.map(drop)
    }

    /// [`send_release`](Self::send_release) without waiting for anything
    /// (see [`Node::release_now`]): `false` when the slot map is not fresh
    /// or the primary's connection cannot take it now.
    pub(crate) fn release_now(&self, key: &str, token: &Token, limit: Duration) -> bool {
        self.settled_primary(key).is_some_and(|primary| {
            let hear = || hear_release(&self.routes, key, token, limit);
            primary.release_now_hearing(key, token, self.wake(), hear)
        })
    }
}

/// What hears a release sent to a key's primary without waiting for its
/// reply: a redirection (the slot migrating or moved), `TRYAGAIN`,
/// `CLUSTERDOWN` or a broken connection has the release sent again, in the
/// background, through the cluster's redirections, within `limit`; any
/// other answer is only logged, as for one server.
fn hear_release(routes: &Arc<Routes>, key: &str, token: &Token, limit: Duration) -> Hear {
    let routes = Arc::downgrade(routes);
    let key = key.to_owned();
    let token = token.clone();
    Hear::Then(Box::new(move |reply| {
        let again = match &reply {
            Ok(Value::ServerError(e)) => {
                matches!(e.code(), "ASK" | "MOVED" | "TRYAGAIN" | "CLUSTERDOWN")
            }
            Ok(_) => false,
            Err(_) => true,
        };
        if !again {
            return observe::unheard_release(reply);
        }
        let Some(routes) = routes.upgrade() else {
            return observe::unheard_release(reply);
        };
        crate::background::spawn(async move {
            let node = ClusterNode::over(routes);
            if let Err(error) = node.release(&key, &token, limit).await {
                observe::unheard_release(Err(redis::RedisError::from(std::io::Error::other(
                    error.chain().to_string(),
                ))));
            }
        });
    }))
}

impl Routes {
    fn new(topology: Arc<Topology>, connect_timeout: Duration) -> Routes {
        Routes {
            topology,
            connect_timeout,
            map: ArcSwapOption::empty(),
            nodes: Mutex::new(HashMap::new()),
            refreshing: tokio::sync::Mutex::new(()),
        }
    }

    /// After `node` could not be reached for `slot`: asks for the slot map
    /// every [`FOLLOW_EVERY`], for at most [`FOLLOW_FOR`], until `slot` has
    /// another primary, so that every part of the client learns of a
    /// failover when it happens, not at its next command: waiters are
    /// woken then ([`Topology::on_change`]). One such task per client.
    fn follow_failover(self: &Arc<Self>, node: &Arc<Node>, slot: u16) {
        if self.topology.following.swap(true, Ordering::AcqRel) {
            return;
        }
        let routes = Arc::downgrade(self);
        let topology = self.topology.clone();
        let node = node.clone();
        crate::background::spawn(async move {
            let until = Instant::now() + FOLLOW_FOR;
            while Instant::now() < until {
                tokio::time::sleep(FOLLOW_EVERY).await;
                let Some(routes) = routes.upgrade() else {
                    break;
                };
                routes.stale();
                let asked = routes.map(Instant::now() + FOLLOW_EVERY * 5).await;
                if asked.is_ok_and(|map| {
                    map.primary(slot)
                        .is_some_and(|primary| !Arc::ptr_eq(primary, &node))
                }) {
                    break;
                }
            }
            topology.following.store(false, Ordering::Release);
        });
    }

    fn node_at(&self, host: &str, port: u16) -> Result<Arc<Node>, LockError> {
        let mut nodes = self.nodes.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(node) = nodes.get(&(host.to_owned(), port)) {
            return Ok(node.clone());
        }
        let info = self
            .topology
            .info
            .clone()
            .set_addr(redis::ConnectionAddr::Tcp(host.to_owned(), port));
        let client = redis::Client::open(info).map_err(|e| {
            LockError::config(format!("cannot use cluster node {host}:{port}")).with_redis_source(e)
        })?;
        let node = Arc::new(Node::with_client(client, None, self.connect_timeout));
        nodes.insert((host.to_owned(), port), node.clone());
        Ok(node)
    }

    /// This set's map of the client's current layout, when that is not
    /// stale: two atomic reads.
    fn current(&self) -> Option<Arc<SlotMap>> {
        let map = self.map.load_full()?;
        let layout = self.topology.layout.load();
        let current = layout
            .as_ref()
            .is_some_and(|l| Arc::ptr_eq(l, &map.from) && !l.is_stale());
        current.then_some(map)
    }

    /// The slot map, within `deadline`: the client's current layout, or,
    /// when there is none or it went stale, a new one asked for.
    async fn map(&self, deadline: Instant) -> Result<Arc<SlotMap>, LockError> {
        if let Some(map) = self.current() {
            return Ok(map);
        }
        let _turn = tokio::time::timeout_at(deadline, self.refreshing.lock())
            .await
            .map_err(|_| unanswered("the cluster's slot map"))?;
        // Another refresh may have ended while this one waited its turn,
        // here or in another part of the client.
        if let Some(map) = self.current() {
            return Ok(map);
        }
        let layout = match self.topology.fresh() {
            Some(layout) => layout,
            None => {
                let (layout, replicas) = self.ask_slots(deadline).await?;
                let layout = Arc::new(layout);
                self.topology.learn(layout.clone(), replicas);
                layout
            }
        };
        let ranges = layout
            .ranges
            .iter()
            .map(|(first, last, (host, port))| Ok((*first, *last, self.node_at(host, *port)?)))
            .collect::<Result<Vec<_>, LockError>>()?;
        let map = Arc::new(SlotMap {
            ranges,
            from: layout,
        });
        self.map.store(Some(map.clone()));
        Ok(map)
    }

    /// Asks the nodes known for `CLUSTER SLOTS`: the primaries of the last
    /// map and the seeds all at once, where the first readable answer wins,
    /// so a node that is down or frozen costs nothing; should none of them
    /// answer, every other node heard of (replicas, nodes that were
    /// primaries once). A map that is out of date (asked of a node that
    /// has not heard of a failover yet) is corrected by the `MOVED` its
    /// first command gets. With the map, the replicas it names.
    async fn ask_slots(&self, deadline: Instant) -> Result<(Layout, Vec<Addr>), LockError> {
        let all = self.topology.to_ask();
        let mut first: Vec<Addr> = Vec::new();
        if let Some(layout) = self.topology.layout.load_full() {
            first.extend(layout.primaries().cloned());
        }
        first.extend(self.topology.seeds.iter().cloned());
        let (first, rest): (Vec<Addr>, Vec<Addr>) =
            all.into_iter().partition(|at| first.contains(at));
        match self.ask_any(first, deadline).await {
            Ok(answer) => Ok(answer),
            Err(e) if rest.is_empty() => Err(e),
            Err(_) => self.ask_any(rest, deadline).await,
        }
    }

    /// `CLUSTER SLOTS` of whichever of `asked` answers first.
    async fn ask_any(
        &self,
        asked: Vec<Addr>,
        deadline: Instant,
    ) -> Result<(Layout, Vec<Addr>), LockError> {
        let left = deadline.saturating_duration_since(Instant::now());
        let mut asks = Vec::with_capacity(asked.len());
        for (host, port) in asked {
            let node = self.node_at(&host, port)?;
            asks.push(Box::pin(async move {
                let slots: Value = node
                    .call(left, true, |mut conn| async move {
                        redis::cmd("CLUSTER")
                            .arg("SLOTS")
                            .query_async(&mut conn)
                            .await
                    })
                    .await?;
                slot_map(&slots)
            }));
        }
        if asks.is_empty() {
            return Err(LockError::new(ErrorKind::Unavailable)
                .with_message("no node of the cluster is known to ask for its slot map"));
        }
        match futures::future::select_ok(asks).await {
            Ok((map, _)) => Ok(map),
            Err(e) => Err(e),
        }
    }

    /// Marks the client's layout stale: the next command of any part of
    /// the client asks for a new one.
    fn stale(&self) {
        self.topology.stale();
    }

    /// Sends `cmd` to the primary of its slot (any node for a command
    /// without a key, or `last`, the node of the call's previous command: a
    /// `SCRIPT LOAD` after its `NOSCRIPT`), following redirections, within
    /// `deadline`.
    async fn send(
        &self,
        cmd: &Cmd,
        last: &mut Option<Arc<Node>>,
        deadline: Instant,
        lost: &Mutex<Option<Lost>>,
    ) -> redis::RedisResult<Value> {
        let slot = routing_slot(cmd);
        // Where a redirection sends the command next, and whether it is an
        // `ASK` (sent after `ASKING`).
        let mut redirected: Option<(Arc<Node>, bool)> = None;
        let mut tried_again = 0;
        let mut down = false;
        for _ in 0..REDIRECTS {
            let to = redirected.take();
            let node = match (&to, slot, &*last) {
                (Some((node, _)), _, _) => node.clone(),
                (None, None, Some(node)) => node.clone(),
                (None, slot, _) => {
                    let map = self.map(deadline).await.map_err(|e| keep(lost, e))?;
                    match slot {
                        Some(slot) => match map.primary(slot) {
                            Some(node) => node.clone(),
                            None => {
                                self.stale();
                                return Err(keep(lost, unserved(slot)));
                            }
                        },
                        None => map.ranges[0].2.clone(),
                    }
                }
            };
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(keep(lost, unanswered(node.addr())));
            }
            let asked = to.is_some_and(|(_, ask)| ask);
            let answer = node
                .call(left, false, |conn| async move {
                    // Broken connections fail the call (the node replaces
                    // its connection); an answer, an error reply included,
                    // comes back as it is.
                    match answered(conn, cmd, asked).await {
                        Err(e) if e.is_connection_dropped() || e.is_unrecoverable_error() => Err(e),
                        answer => Ok(answer),
                    }
                })
                .await;
            *last = Some(node.clone());
            let answer = match answer {
                Ok(answer) => answer,
                Err(e) => {
                    // Unreachable, or not answering: maybe failed over.
                    self.stale();
                    let at = slot.map(|slot| (node.clone(), slot));
                    return Err(keep_unreached(lost, e, at));
                }
            };
            let Err(e) = &answer else {
                return answer;
            };
            match e.kind() {
                // The slot lives elsewhere now: sent there at once, and the
                // map asked for again before the next command.
                redis::ErrorKind::Server(
                    kind @ (redis::ServerErrorKind::Moved | redis::ServerErrorKind::Ask),
                ) => {
                    let Some((host, port)) = e.redirect_node().and_then(|(at, _)| host_port(at))
                    else {
                        return answer;
                    };
                    let ask = kind == redis::ServerErrorKind::Ask;
                    if !ask {
                        self.stale();
                    }
                    let node = self.node_at(&host, port).map_err(|e| keep(lost, e))?;
                    redirected = Some((node, ask));
                }
                // Some of the command's keys are on the other side of a
                // slot migration: they may be moving right now, so once
                // more, and then the caller is told (see `is_migrating`).
                redis::ErrorKind::Server(redis::ServerErrorKind::TryAgain) => {
                    tried_again += 1;
                    if tried_again > 1 {
                        return answer;
                    }
                    pause_before_again(deadline).await;
                }
                redis::ErrorKind::Server(redis::ServerErrorKind::ClusterDown) => {
                    down = true;
                    pause_before_again(deadline).await;
                    self.stale();
                }
                _ => return answer,
            }
        }
        Err(keep(lost, gave_up(down)))
    }
}

/// The layout a `CLUSTER SLOTS` answer gives, and the replicas it names:
/// `[[first, last, [host, port, id, ..], replicas..], ..]`.
fn slot_map(slots: &Value) -> Result<(Layout, Vec<Addr>), LockError> {
    let malformed = || {
        LockError::new(ErrorKind::Server)
            .with_message("CLUSTER SLOTS answered in a shape lock-core cannot read")
    };
    let Value::Array(ranges) = slots else {
        return Err(malformed());
    };
    let number = |v: Option<&Value>| -> Option<u16> { redis::from_redis_value_ref::<u16>(v?).ok() };
    let node = |v: &Value| -> Option<Addr> {
        let Value::Array(node) = v else {
            return None;
        };
        let host: String = node
            .first()
            .and_then(|v| redis::from_redis_value_ref(v).ok())?;
        Some((host, number(node.get(1))?))
    };
    let mut map = Vec::with_capacity(ranges.len());
    let mut replicas = Vec::new();
    for range in ranges {
        let Value::Array(fields) = range else {
            return Err(malformed());
        };
        let (Some(first), Some(last), Some(primary)) = (
            number(fields.first()),
            number(fields.get(1)),
            fields.get(2).and_then(node),
        ) else {
            return Err(malformed());
        };
        map.push((first, last, primary));
        replicas.extend(fields.iter().skip(3).filter_map(node));
    }
    if map.is_empty() {
        return Err(LockError::new(ErrorKind::Unavailable)
            .with_message("the cluster serves no slots (CLUSTER SLOTS answered none)"));
    }
    map.sort_by_key(|(first, _, _)| *first);
    let layout = Layout {
        ranges: map,
        stale: AtomicBool::new(false),
    };
    Ok((layout, replicas))
}

/// Whether `err` is a command refused because its keys are on both sides
/// of a slot migration (`TRYAGAIN`, see [`Routes::send`]): the lock
/// commands that can, do the same with commands of one key each.
pub(crate) fn is_migrating(err: &LockError) -> bool {
    err.redis_error()
        .is_some_and(|e| e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::TryAgain))
}

/// `cmd`'s answer on `conn`, after `ASKING` when `asking`; an error reply
/// as an error, so that a redirection can be told.
async fn answered(mut conn: Conn, cmd: &Cmd, asking: bool) -> redis::RedisResult<Value> {
    if !asking {
        return conn.req_packed_command(cmd).await?.extract_error();
    }
    let mut pipe = redis::pipe();
    pipe.cmd("ASKING").ignore().add_command(cmd.clone());
    let mut answers = conn.req_packed_commands(&pipe, 1, 1).await?;
    answers.pop().unwrap_or(Value::Nil).extract_error()
}

/// Keeps `err` for the call to report, and stands for it as a dropped
/// connection (`Routed`'s callers see the `redis` crate's errors).
fn keep(lost: &Mutex<Option<Lost>>, err: LockError) -> redis::RedisError {
    let message = err.chain().to_string();
    *lost.lock().unwrap_or_else(PoisonError::into_inner) = Some(Lost { err, at: None });
    dropped(message)
}

/// [`keep`], for a node that could not be reached, with the slot the
/// command was for.
fn keep_unreached(
    lost: &Mutex<Option<Lost>>,
    err: LockError,
    at: Option<(Arc<Node>, u16)>,
) -> redis::RedisError {
    let message = err.chain().to_string();
    *lost.lock().unwrap_or_else(PoisonError::into_inner) = Some(Lost { err, at });
    dropped(message)
}

/// Waits [`TRY_AGAIN`] before a command is sent again, within `deadline`.
async fn pause_before_again(deadline: Instant) {
    tokio::time::sleep(TRY_AGAIN.min(deadline.saturating_duration_since(Instant::now()))).await;
}

/// The error of a command that kept being redirected: the cluster is down,
/// or its slots keep moving.
fn gave_up(down: bool) -> LockError {
    let why = if down {
        "the cluster is down (CLUSTERDOWN: a slot has no primary, or too few nodes \
         see each other); CLUSTER INFO on a node says which"
            .to_owned()
    } else {
        format!("the cluster redirected a command {REDIRECTS} times: its slots are moving")
    };
    LockError::new(ErrorKind::Unavailable).with_message(why)
}

/// A dropped connection saying `message`.
fn dropped(message: String) -> redis::RedisError {
    redis::RedisError::from(std::io::Error::new(
        std::io::ErrorKind::ConnectionAborted,
        message,
    ))
}

/// Why a cluster call could not be answered, for the call to report.
struct Lost {
    err: LockError,
    /// The node that could not be reached, and the slot the command was
    /// for: when the slot has another primary now (a failover), the
    /// command is sent there (see [`ClusterNode::failed_over`]).
    at: Option<(Arc<Node>, u16)>,
}

/// `what` did not answer within the call's bound.
fn unanswered(what: &str) -> LockError {
    LockError::new(ErrorKind::Unavailable).with_message(format!("{what} did not answer in time"))
}

fn unserved(slot: u16) -> LockError {
    LockError::new(ErrorKind::Unavailable)
        .with_message(format!("no primary of the cluster serves hash slot {slot}"))
}

/// `host:port` split.
fn host_port(addr: &str) -> Option<(String, u16)> {
    let (host, port) = addr.rsplit_once(':')?;
    Some((host.to_owned(), port.parse().ok()?))
}

/// What a cluster call is handed: sends each command to its slot's
/// primary.
#[derive(Clone)]
pub(crate) struct Routed {
    routes: Arc<Routes>,
    deadline: Instant,
    /// The node of the previous command.
    last: Option<Arc<Node>>,
    /// Why the node could not be reached, for the call to report.
    lost: Arc<Mutex<Option<Lost>>>,
}

impl ConnectionLike for Routed {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let routes = self.routes.clone();
            routes
                .send(cmd, &mut self.last, self.deadline, &self.lost)
                .await
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        // lock-core sends no pipeline to a cluster (`WAIT` is refused
        // there): one command at a time.
        Box::pin(async move {
            let mut answers = Vec::new();
            for cmd in pipeline.cmd_iter() {
                answers.push(self.req_packed_command(cmd).await?);
            }
            Ok(answers.into_iter().skip(offset).take(count).collect())
        })
    }

    fn get_db(&self) -> i64 {
        0
    }
}

impl ClusterNode {
    /// Whether the slot of a command that `at` could not serve has another
    /// primary in a map asked for now.
    async fn failed_over(&self, at: Option<(Arc<Node>, u16)>, deadline: Instant) -> bool {
        let Some((node, slot)) = at else {
            return false;
        };
        let Ok(map) = self.routes.map(deadline).await else {
            return false;
        };
        map.primary(slot)
            .is_some_and(|primary| !Arc::ptr_eq(primary, &node))
    }
}

impl Server for ClusterNode {
    type Conn = Routed;

    fn addr(&self) -> &str {
        ClusterNode::addr(self)
    }

    fn min_replicas(&self) -> Option<MinReplicas> {
        self.min_replicas
    }

    /// A cluster sends every `PUBLISH` to all its nodes: only a release
    /// somebody listens for publishes.
    fn wake(&self) -> Wake {
        Wake::Listeners
    }

    fn call<'a, T, F, Fut>(
        &'a self,
        limit: Duration,
        retry_on_drop: bool,
        f: F,
    ) -> BoxFuture<'a, Result<T, LockError>>
    where
        T: Send + 'a,
        F: Fn(Routed) -> Fut + Send + Sync + 'a,
        Fut: Future<Output = redis::RedisResult<T>> + Send + 'a,
    {
        Box::pin(async move {
            let deadline = Instant::now() + limit;
            let mut retried = false;
            loop {
                let lost = Arc::new(Mutex::new(None));
                let conn = Routed {
                    routes: self.routes.clone(),
                    deadline,
                    last: None,
                    lost: lost.clone(),
                };
                let answer = match tokio::time::timeout_at(deadline, f(conn)).await {
                    Ok(answer) => answer,
                    Err(_) => {
                        self.routes.stale();
                        return Err(LockError::new(ErrorKind::Unavailable)
                            .with_message(format!("{} did not answer", self.addr()))
                            .with_source(TimedOut { after: limit }));
                    }
                };
                let e = match answer {
                    Ok(value) => return Ok(value),
                    Err(e) => e,
                };
                let lost = lost.lock().unwrap_or_else(PoisonError::into_inner).take();
                match lost {
                    // A node could not be reached, or its connection broke.
                    Some(Lost { err, at }) => {
                        if let Some((node, slot)) = &at {
                            self.routes.follow_failover(node, *slot);
                        }
                        // A call that is not safe to repeat is sent again
                        // where its slot's primary moved: the node that
                        // failed is no longer the primary, so whatever it
                        // did does not stand.
                        if !retried
                            && Instant::now() < deadline
                            && (retry_on_drop || self.failed_over(at, deadline).await)
                        {
                            retried = true;
                            continue;
                        }
                        return Err(err);
                    }
                    None => return Err(from_redis(e)),
                }
            }
        })
    }
}

/// The hash slot of `key`: CRC16 (XMODEM) of its hash tag (the part
/// between the first `{` and the next `}`, when not empty) or of the whole
/// key, modulo 16384.
pub(crate) fn slot_of(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    crc16(tagged.unwrap_or(key)) % SLOTS
}

fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in bytes {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The slot `cmd` is routed by: its first key's. `None` for a command with
/// no key (`PING`, `TIME`, `CLUSTER`, `SCAN`, `SCRIPT`).
fn routing_slot(cmd: &Cmd) -> Option<u16> {
    let mut args = cmd.args_iter().map(|arg| match arg {
        redis::Arg::Simple(bytes) => bytes,
        _ => &[][..],
    });
    let name = args.next()?;
    let is = |what: &str| name.eq_ignore_ascii_case(what.as_bytes());
    if [
        "PING", "TIME", "CLUSTER", "SCAN", "SCRIPT", "INFO", "ROLE", "ASKING",
    ]
    .iter()
    .any(|n| is(n))
    {
        return None;
    }
    let key = if ["EVAL", "EVALSHA", "EVAL_RO", "EVALSHA_RO", "FCALL"]
        .iter()
        .any(|n| is(n))
    {
        let _script = args.next()?;
        let keys: usize = std::str::from_utf8(args.next()?).ok()?.parse().ok()?;
        if keys == 0 {
            return None;
        }
        args.next()?
    } else {
        args.next()?
    };
    Some(slot_of(key))
}

/// Several keys on a cluster, all or none: the keys of one hash slot in one
/// script, the slots one after another in the keys' canonical order (the
/// order of each slot's first key). When a slot's keys are held, the slots
/// already taken are released again (compare-and-delete, so nobody else's
/// key is touched) and the attempt is busy; so is a failure, which
/// releases in the same way.
pub(crate) async fn acquire_all(
    node: &ClusterNode,
    keys: &[LockKeys<'_>],
    token: &Token,
    ttl: Duration,
    writer_for: Duration,
    limit: Duration,
) -> Result<Several, LockError> {
    let started = tokio::time::Instant::now();
    let groups = by_slot(keys);
    let fenced = keys.iter().all(|k| k.fence.is_some());
    let mut fences = vec![0u64; if fenced { keys.len() } else { 0 }];
    let mut taken: Vec<&str> = Vec::with_capacity(keys.len());
    for group in &groups {
        let slot_keys: Vec<LockKeys<'_>> = group.iter().map(|&i| keys[i].reborrow()).collect();
        let left = limit.saturating_sub(started.elapsed());
        let answer = node
            .acquire_all(&slot_keys, token, ttl, writer_for, left)
            .await;
        match answer {
            Ok(Several::Granted(got)) => {
                for (&i, fence) in group.iter().zip(got) {
                    if let Some(slot) = fences.get_mut(i) {
                        *slot = fence;
                    }
                }
                taken.extend(group.iter().map(|&i| keys[i].lock));
            }
            other => {
                // Undo within the same bound as a release; the keys taken
                // expire by themselves should this fail too.
                let undo = taken
                    .iter()
                    .map(|key| node.release(key, token, limit.max(Duration::from_millis(1))));
                futures::future::join_all(undo).await;
                return match other {
                    Ok(Several::Busy { at }) => Ok(Several::Busy {
                        at: group[at.min(group.len() - 1)],
                    }),
                    Ok(Several::Granted(_)) => Ok(Several::Busy { at: group[0] }),
                    Err(e) => Err(e),
                };
            }
        }
    }
    Ok(Several::Granted(fences))
}

/// The indexes of `keys` grouped by hash slot, each group in canonical
/// order, the groups in the order of their first key.
fn by_slot(keys: &[LockKeys<'_>]) -> Vec<Vec<usize>> {
    let mut groups: Vec<(u16, Vec<usize>)> = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        let slot = slot_of(key.lock.as_bytes());
        match groups.iter_mut().find(|(s, _)| *s == slot) {
            Some((_, group)) => group.push(i),
            None => groups.push((slot, vec![i])),
        }
    }
    groups.into_iter().map(|(_, group)| group).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_settings_are_checked() {
        let limit = Duration::from_secs(1);
        assert!(ClusterNode::new(&[], limit).is_err());
        let tls = ["rediss://127.0.0.1:7000".to_owned()];
        assert!(ClusterNode::new(&tls, limit).is_err());
        let urls = [
            "redis://127.0.0.1:7000".to_owned(),
            "redis://:pw@127.0.0.1:7001".to_owned(),
        ];
        let node = ClusterNode::new(&urls, limit);
        assert!(
            node.as_ref()
                .is_ok_and(|n| n.addr() == "cluster[127.0.0.1:7000, 127.0.0.1:7001]")
        );
        assert!(node.is_ok_and(|n| n.topology().to_ask().len() == 2));
    }

    /// The slots Redis computes (`CLUSTER KEYSLOT`), hash tags included.
    #[test]
    fn keys_hash_to_the_slots_redis_gives_them() {
        assert_eq!(slot_of(b"123456789"), 0x31c3);
        assert_eq!(slot_of(b"foo"), 12182);
        assert_eq!(slot_of(b"lock:{order:42}"), slot_of(b"order:42"));
        assert_eq!(slot_of(b"lock:{order:42}:fence"), slot_of(b"order:42"));
        // An empty tag does not count: the whole key is hashed.
        assert_eq!(slot_of(b"a{}b"), crc16(b"a{}b") % SLOTS);
        assert_eq!(slot_of(b"{}{x}"), crc16(b"{}{x}") % SLOTS);
    }

    #[test]
    fn commands_are_routed_by_their_first_key() {
        let mut set = redis::cmd("SET");
        set.arg("k{a}").arg("v");
        assert_eq!(routing_slot(&set), Some(slot_of(b"a")));
        let mut eval = redis::cmd("EVALSHA");
        eval.arg("sha").arg(2).arg("x{b}").arg("y{b}").arg("arg");
        assert_eq!(routing_slot(&eval), Some(slot_of(b"b")));
        let mut keyless = redis::cmd("EVALSHA");
        keyless.arg("sha").arg(0);
        assert_eq!(routing_slot(&keyless), None);
        assert_eq!(routing_slot(&redis::cmd("TIME")), None);
        let mut load = redis::cmd("SCRIPT");
        load.arg("LOAD").arg("return 1");
        assert_eq!(routing_slot(&load), None);
    }
}
