//! A Redis Cluster over lock-core's own connections: one [`Node`] per
//! primary, each command sent to the primary of its key's hash slot.
//!
//! Every lock command touches keys of one hash slot (`<prefix>{<key>}` and
//! `<prefix>{<key>}:fence`). The slot map comes from `CLUSTER SLOTS`, asked
//! of any node known (the seeds, then the primaries seen); it is asked
//! again when a node cannot be reached or answers `MOVED` (a failover, a
//! slot moved), one refresh at a time. `ASK` (a slot being migrated) sends
//! `ASKING` and the command together to the node named. `TRYAGAIN` and
//! `CLUSTERDOWN` are retried within the call's bound.
//!
//! Each primary is a [`Node`]: lock-core's own connection, with its read
//! turn, its unawaited release and its scripts loaded at connect, the same
//! as one server. So a cluster gets the same isolation and the same
//! round trips as one server.

use super::node::{Conn, redact};
use super::{LockCommands, LockKeys, MinReplicas, Node, Server, Several};
use crate::error::{ErrorKind, LockError, TimedOut, from_redis};
use crate::scripts::Wake;
use crate::token::Token;
use arc_swap::ArcSwapOption;
use futures::future::BoxFuture;
use redis::aio::ConnectionLike;
use redis::{Cmd, Pipeline, RedisFuture, Value};
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::time::Instant;

/// Hash slots in a cluster.
const SLOTS: u16 = 16384;

/// Redirections (`MOVED`, `ASK`) and `TRYAGAIN`s one command follows.
const REDIRECTS: usize = 8;

/// How long a command waits before it is sent again after `TRYAGAIN` or
/// `CLUSTERDOWN` (a slot mid-migration, a failover under way).
const TRY_AGAIN: Duration = Duration::from_millis(20);

/// A Redis Cluster, and the nodes all locks share to it.
pub(crate) struct ClusterNode {
    /// A plain client per seed URL, for the release wake-ups (`PUBLISH` is
    /// broadcast to every node of a cluster).
    seeds: Vec<redis::Client>,
    addr: String,
    /// Never set: `WAIT` is refused for a cluster by the builder.
    pub(crate) min_replicas: Option<MinReplicas>,
    routes: Arc<Routes>,
}

/// The slot map and the nodes.
struct Routes {
    /// The seeds' addresses, asked for the slot map when no primary answers.
    seeds: Vec<(String, u16)>,
    /// The seeds' connection settings (credentials, database), for every
    /// node.
    info: redis::ConnectionInfo,
    connect_timeout: Duration,
    /// Read by every command: lock-free.
    map: ArcSwapOption<SlotMap>,
    /// Every node seen, by address: a node's connection outlives the maps
    /// that name it.
    nodes: Mutex<HashMap<(String, u16), Arc<Node>>>,
    /// One refresh at a time; the others wait for it.
    refreshing: tokio::sync::Mutex<()>,
}

/// Which primary serves which slots.
struct SlotMap {
    /// `(first slot, last slot, primary)`, sorted.
    ranges: Vec<(u16, u16, Arc<Node>)>,
    /// Set when a node of it could not be reached or a slot moved: the
    /// next command asks for a new map first.
    stale: std::sync::atomic::AtomicBool,
}

impl SlotMap {
    fn primary(&self, slot: u16) -> Option<&Arc<Node>> {
        let at = self.ranges.partition_point(|(first, _, _)| *first <= slot);
        let (_, last, node) = self.ranges.get(at.checked_sub(1)?)?;
        (slot <= *last).then_some(node)
    }

    fn is_stale(&self) -> bool {
        self.stale.load(std::sync::atomic::Ordering::Acquire)
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
                        .with_source(e)
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
        let routes = Routes {
            seeds: addrs,
            info: seeds[0].get_connection_info().clone(),
            connect_timeout,
            map: ArcSwapOption::empty(),
            nodes: Mutex::new(HashMap::new()),
            refreshing: tokio::sync::Mutex::new(()),
        };
        Ok(ClusterNode {
            seeds,
            addr: format!("cluster[{}]", shown.join(", ")),
            min_replicas: None,
            routes: Arc::new(routes),
        })
    }

    /// The same cluster through connections of its own (see
    /// [`Backend::twin`](super::Backend::twin)).
    pub(crate) fn twin(&self) -> ClusterNode {
        let routes = &self.routes;
        ClusterNode {
            seeds: self.seeds.clone(),
            addr: self.addr.clone(),
            min_replicas: self.min_replicas,
            routes: Arc::new(Routes {
                seeds: routes.seeds.clone(),
                info: routes.info.clone(),
                connect_timeout: routes.connect_timeout,
                map: ArcSwapOption::empty(),
                nodes: Mutex::new(HashMap::new()),
                refreshing: tokio::sync::Mutex::new(()),
            }),
        }
    }

    /// Plain clients for the seed nodes, for the wake-up subscriptions.
    pub(crate) fn seed_clients(&self) -> Vec<redis::Client> {
        self.seeds.clone()
    }

    /// The seed nodes' addresses, for messages.
    pub(crate) fn addr(&self) -> &str {
        &self.addr
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

    /// The primary serving `key`'s slot in the map known now, when that
    /// map is fresh: for the calls that cannot follow a redirection (a
    /// release nobody waits for). `None` otherwise.
    fn settled_primary(&self, key: &str) -> Option<Arc<Node>> {
        let map = self.routes.map.load_full()?;
        if map.is_stale() {
            return None;
        }
        map.primary(slot_of(key.as_bytes())).cloned()
    }

    /// Compare-and-delete sent to `key`'s primary without waiting for its
    /// reply, as to one server ([`Node::send_release`]), while the slot map
    /// is fresh. Should the slot have moved meanwhile, the reply (`MOVED`)
    /// is only logged and counted, and the lock expires with its ttl. With
    /// no fresh map, or when the primary cannot be reached, the release is
    /// sent and waited for, following redirections.
    pub(crate) async fn send_release(
        &self,
        key: &str,
        token: &Token,
        limit: Duration,
    ) -> Result<(), LockError> {
        if let Some(primary) = self.settled_primary(key) {
            let started = Instant::now();
            if primary
                .send_release(key, token, self.wake(), limit)
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
    pub(crate) fn release_now(&self, key: &str, token: &Token) -> bool {
        self.settled_primary(key)
            .is_some_and(|primary| primary.release_now(key, token, self.wake()))
    }
}

impl Routes {
    fn node_at(&self, host: &str, port: u16) -> Result<Arc<Node>, LockError> {
        let mut nodes = self.nodes.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(node) = nodes.get(&(host.to_owned(), port)) {
            return Ok(node.clone());
        }
        let info = self
            .info
            .clone()
            .set_addr(redis::ConnectionAddr::Tcp(host.to_owned(), port));
        let client = redis::Client::open(info).map_err(|e| {
            LockError::config(format!("cannot use cluster node {host}:{port}")).with_source(e)
        })?;
        let node = Arc::new(Node::with_client(client, None, self.connect_timeout));
        nodes.insert((host.to_owned(), port), node.clone());
        Ok(node)
    }

    /// The slot map, asked for when there is none or it went stale, within
    /// `deadline`.
    async fn map(&self, deadline: Instant) -> Result<Arc<SlotMap>, LockError> {
        if let Some(map) = self.map.load_full().filter(|m| !m.is_stale()) {
            return Ok(map);
        }
        let _turn = tokio::time::timeout_at(deadline, self.refreshing.lock())
            .await
            .map_err(|_| unanswered("the cluster's slot map"))?;
        // Another refresh may have ended while this one waited its turn.
        if let Some(map) = self.map.load_full().filter(|m| !m.is_stale()) {
            return Ok(map);
        }
        let map = Arc::new(self.ask_slots(deadline).await?);
        self.map.store(Some(map.clone()));
        Ok(map)
    }

    /// Asks the known primaries and the seeds for `CLUSTER SLOTS`, all at
    /// once: the first readable answer wins, so a node that is down or
    /// frozen costs nothing. A map that is out of date (asked of a node
    /// that has not heard of a failover yet) is corrected by the `MOVED`
    /// its first command gets.
    async fn ask_slots(&self, deadline: Instant) -> Result<SlotMap, LockError> {
        let mut asked: Vec<(String, u16)> = Vec::new();
        if let Some(map) = self.map.load_full() {
            for (_, _, node) in &map.ranges {
                if let Some(at) = host_port(node.addr())
                    && !asked.contains(&at)
                {
                    asked.push(at);
                }
            }
        }
        for seed in &self.seeds {
            if !asked.contains(seed) {
                asked.push(seed.clone());
            }
        }
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
                self.slot_map(&slots)
            }));
        }
        match futures::future::select_ok(asks).await {
            Ok((map, _)) => Ok(map),
            Err(e) => Err(e),
        }
    }

    /// The map a `CLUSTER SLOTS` answer gives:
    /// `[[first, last, [host, port, id, ..], replicas..], ..]`.
    fn slot_map(&self, slots: &Value) -> Result<SlotMap, LockError> {
        let malformed = || {
            LockError::new(ErrorKind::Server)
                .with_message("CLUSTER SLOTS answered in a shape lock-core cannot read")
        };
        let Value::Array(ranges) = slots else {
            return Err(malformed());
        };
        let mut map = Vec::with_capacity(ranges.len());
        for range in ranges {
            let Value::Array(fields) = range else {
                return Err(malformed());
            };
            let number =
                |v: Option<&Value>| -> Option<u16> { redis::from_redis_value_ref::<u16>(v?).ok() };
            let (Some(first), Some(last), Some(Value::Array(primary))) =
                (number(fields.first()), number(fields.get(1)), fields.get(2))
            else {
                return Err(malformed());
            };
            let host: String = primary
                .first()
                .and_then(|v| redis::from_redis_value_ref(v).ok())
                .ok_or_else(malformed)?;
            let port = number(primary.get(1)).ok_or_else(malformed)?;
            map.push((first, last, self.node_at(&host, port)?));
        }
        if map.is_empty() {
            return Err(LockError::new(ErrorKind::Unavailable)
                .with_message("the cluster serves no slots (CLUSTER SLOTS answered none)"));
        }
        map.sort_by_key(|(first, _, _)| *first);
        Ok(SlotMap {
            ranges: map,
            stale: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Marks the map stale: the next command asks for a new one.
    fn stale(&self) {
        if let Some(map) = self.map.load_full() {
            map.stale.store(true, std::sync::atomic::Ordering::Release);
        }
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
        lost: &Mutex<Option<LockError>>,
    ) -> redis::RedisResult<Value> {
        let slot = routing_slot(cmd);
        // Where a redirection sends the command next, and whether it is an
        // `ASK` (sent after `ASKING`).
        let mut redirected: Option<(Arc<Node>, bool)> = None;
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
                    return Err(keep(lost, e));
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
                redis::ErrorKind::Server(
                    redis::ServerErrorKind::TryAgain | redis::ServerErrorKind::ClusterDown,
                ) => {
                    let pause = TRY_AGAIN.min(deadline.saturating_duration_since(Instant::now()));
                    tokio::time::sleep(pause).await;
                    self.stale();
                }
                _ => return answer,
            }
        }
        Err(keep(
            lost,
            LockError::new(ErrorKind::Unavailable).with_message(format!(
                "the cluster redirected a command {REDIRECTS} times: its slots are moving"
            )),
        ))
    }
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
fn keep(lost: &Mutex<Option<LockError>>, err: LockError) -> redis::RedisError {
    let message = err.to_string();
    *lost.lock().unwrap_or_else(PoisonError::into_inner) = Some(err);
    redis::RedisError::from(std::io::Error::new(
        std::io::ErrorKind::ConnectionAborted,
        message,
    ))
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
    lost: Arc<Mutex<Option<LockError>>>,
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

impl Server for ClusterNode {
    type Conn = Routed;

    fn addr(&self) -> &str {
        &self.addr
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
                            .with_message(format!("{} did not answer", self.addr))
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
                    Some(err) => {
                        if retry_on_drop && !retried && Instant::now() < deadline {
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
        assert!(node.is_ok_and(|n| n.seed_clients().len() == 2));
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
