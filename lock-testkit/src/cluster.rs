//! A throwaway Redis Cluster: `redis-server`s in cluster mode, joined with
//! `redis-cli --cluster create`.

use std::io::Read;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use crate::TestkitError;
use crate::binary::redis_cli_binary;
use crate::server::{RedisServer, free_port, info_field};

/// How long `redis-cli --cluster create` may take.
const CREATE_BOUND: Duration = Duration::from_secs(30);
/// How long the cluster may take to report `cluster_state:ok` everywhere
/// after creation.
const READY_BOUND: Duration = Duration::from_secs(30);
/// How often the cluster's state is polled.
const POLL: Duration = Duration::from_millis(50);
/// How many times a node start is retried (its bus port may be taken).
const START_ATTEMPTS: usize = 3;

/// A Redis Cluster of `redis-server` child processes owned by a test.
///
/// Each node is a [`RedisServer`] started with `--cluster-enabled yes`, its
/// own `nodes.conf` in its directory, `--cluster-node-timeout 1000` (a dead
/// primary is failed over within a few seconds) and a cluster bus port of
/// its own (`--cluster-port`). The first `primaries` nodes are primaries
/// when created; the others are their replicas. Dropping the cluster kills
/// and reaps every node.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    primaries: usize,
}

/// One line of `CLUSTER NODES`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct NodeLine {
    port: u16,
    primary: bool,
    failed: bool,
    slots: Vec<(u16, u16)>,
}

impl RedisCluster {
    /// Starts `primaries` primaries with `replicas` replicas each, creates
    /// the cluster and waits until every node reports `cluster_state:ok`.
    ///
    /// # Panics
    ///
    /// Panics with the reason (and a server log) if the cluster cannot be
    /// made.
    #[must_use = "the cluster is killed when dropped"]
    pub fn start(primaries: usize, replicas: usize) -> RedisCluster {
        Self::try_start(primaries, replicas)
            .unwrap_or_else(|e| panic!("lock-testkit: could not start a Redis Cluster: {e}"))
    }

    /// [`start`](Self::start), returning the failure instead of panicking.
    ///
    /// # Errors
    ///
    /// Fails when a node cannot start, when `redis-cli --cluster create`
    /// fails or takes over 30 s, or when the cluster is not ready within
    /// 30 s.
    pub fn try_start(primaries: usize, replicas: usize) -> Result<RedisCluster, TestkitError> {
        if primaries < 3 {
            return Err(TestkitError::new(
                "a Redis Cluster needs at least 3 primaries",
            ));
        }
        let total = primaries * (replicas + 1);
        let nodes = thread::scope(|scope| {
            let starting: Vec<_> = (0..total).map(|_| scope.spawn(start_node)).collect();
            starting
                .into_iter()
                .map(|handle| {
                    handle.join().unwrap_or_else(|_| {
                        Err(TestkitError::new("a cluster node start thread panicked"))
                    })
                })
                .collect::<Result<Vec<_>, _>>()
        })?;
        let cluster = RedisCluster { nodes, primaries };
        cluster.create(replicas)?;
        cluster.wait_ready(READY_BOUND)?;
        Ok(cluster)
    }

    /// `redis-cli --cluster create ... --cluster-replicas R --cluster-yes`,
    /// bounded.
    fn create(&self, replicas: usize) -> Result<(), TestkitError> {
        let cli = redis_cli_binary()?;
        let mut command = Command::new(cli);
        command.arg("--cluster").arg("create");
        for node in &self.nodes {
            command.arg(format!("127.0.0.1:{}", node.port()));
        }
        command
            .arg("--cluster-replicas")
            .arg(replicas.to_string())
            .arg("--cluster-yes")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = command.spawn().map_err(|e| {
            TestkitError::with_source("could not run redis-cli --cluster create", e)
        })?;
        let deadline = Instant::now() + CREATE_BOUND;
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if Instant::now() < deadline => thread::sleep(POLL),
                Ok(None) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(TestkitError::new(format!(
                        "redis-cli --cluster create did not finish within {CREATE_BOUND:?}"
                    )));
                }
                Err(e) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(TestkitError::with_source(
                        "could not wait for redis-cli --cluster create",
                        e,
                    ));
                }
            }
        };
        let mut output = String::new();
        if let Some(mut out) = child.stdout.take() {
            let _ = out.read_to_string(&mut output);
        }
        if let Some(mut err) = child.stderr.take() {
            let _ = err.read_to_string(&mut output);
        }
        if !status.success() || output.contains("[ERR]") {
            return Err(TestkitError::new(format!(
                "redis-cli --cluster create failed ({status}):\n{output}"
            )));
        }
        Ok(())
    }

    /// Every node, in creation order (the first [`primaries`](Self::primaries)
    /// were created as primaries).
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// One node, to stop or pause it.
    ///
    /// # Panics
    ///
    /// Panics when `index` is out of range.
    pub fn node_mut(&mut self, index: usize) -> &mut RedisServer {
        &mut self.nodes[index]
    }

    /// How many primaries the cluster was created with.
    pub fn primaries(&self) -> usize {
        self.primaries
    }

    /// The `redis://` URL of every node.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// Starts one more node, empty and serving no slot, and has the
    /// cluster meet it: a primary to move slots to. Returns its index in
    /// [`nodes`](Self::nodes) once every running node knows it.
    ///
    /// # Errors
    ///
    /// Fails when the node cannot start, or is not known everywhere within
    /// 30 s.
    pub fn add_primary(&mut self) -> Result<usize, TestkitError> {
        let (node, bus) = start_node_on_bus()?;
        let port = node.port();
        let known = |nodes: &[RedisServer]| -> Result<bool, TestkitError> {
            for other in nodes.iter().filter(|n| n.is_running()) {
                let text: String = other.try_cmd(&["CLUSTER", "NODES"])?;
                if !parse_nodes(&text).iter().any(|line| line.port == port) {
                    return Ok(false);
                }
            }
            Ok(true)
        };
        let _: String = self.any_running()?.try_cmd(&[
            "CLUSTER",
            "MEET",
            "127.0.0.1",
            &port.to_string(),
            &bus.to_string(),
        ])?;
        self.nodes.push(node);
        let deadline = Instant::now() + READY_BOUND;
        while !known(&self.nodes)? {
            if Instant::now() >= deadline {
                return Err(TestkitError::new(format!(
                    "the node on port {port} was not known to every node within {READY_BOUND:?}"
                )));
            }
            thread::sleep(POLL);
        }
        Ok(self.nodes.len() - 1)
    }

    /// A running node to ask.
    fn any_running(&self) -> Result<&RedisServer, TestkitError> {
        self.nodes
            .iter()
            .find(|n| n.is_running())
            .ok_or_else(|| TestkitError::new("no cluster node is running"))
    }

    /// The hash slot of `key` (`CLUSTER KEYSLOT`).
    ///
    /// # Errors
    ///
    /// Fails when no node is running or the command fails.
    pub fn keyslot(&self, key: &str) -> Result<u16, TestkitError> {
        self.any_running()?.try_cmd(&["CLUSTER", "KEYSLOT", key])
    }

    /// The index (in [`nodes`](Self::nodes)) of the node that a running node
    /// names as the live primary of `slot`, `None` when it names none.
    ///
    /// # Errors
    ///
    /// Fails when no node is running or `CLUSTER NODES` fails.
    pub fn primary_of_slot(&self, slot: u16) -> Result<Option<usize>, TestkitError> {
        let text: String = self.any_running()?.try_cmd(&["CLUSTER", "NODES"])?;
        let port = parse_nodes(&text)
            .into_iter()
            .find(|line| {
                line.primary
                    && !line.failed
                    && line.slots.iter().any(|&(a, b)| a <= slot && slot <= b)
            })
            .map(|line| line.port);
        Ok(port.and_then(|port| self.nodes.iter().position(|n| n.port() == port)))
    }

    /// The index of the primary serving `key`.
    ///
    /// # Errors
    ///
    /// See [`keyslot`](Self::keyslot) and
    /// [`primary_of_slot`](Self::primary_of_slot).
    pub fn primary_of_key(&self, key: &str) -> Result<Option<usize>, TestkitError> {
        self.primary_of_slot(self.keyslot(key)?)
    }

    /// Waits, polling for at most `bound`, until every running node reports
    /// `cluster_state:ok`, knows every slot as served by a live primary, and
    /// every running replica's link to its primary is up.
    ///
    /// # Errors
    ///
    /// Fails with the last state seen when the bound passes first.
    pub fn wait_ready(&self, bound: Duration) -> Result<(), TestkitError> {
        let deadline = Instant::now() + bound;
        loop {
            let state = self.readiness();
            match state {
                Ok(()) => return Ok(()),
                Err(e) if Instant::now() >= deadline => {
                    return Err(TestkitError::new(format!(
                        "the Redis Cluster was not ready within {bound:?}: {}",
                        e.message()
                    )));
                }
                Err(_) => thread::sleep(POLL),
            }
        }
    }

    /// `Ok(())` when ready (see [`wait_ready`](Self::wait_ready)), otherwise
    /// why not.
    fn readiness(&self) -> Result<(), TestkitError> {
        for node in self.nodes.iter().filter(|n| n.is_running()) {
            let info: String = node.try_cmd(&["CLUSTER", "INFO"])?;
            let state = info_field(&info, "cluster_state").unwrap_or_default();
            if state != "ok" {
                return Err(TestkitError::new(format!(
                    "port {} says cluster_state:{state}",
                    node.port()
                )));
            }
            let text: String = node.try_cmd(&["CLUSTER", "NODES"])?;
            let covered: usize = parse_nodes(&text)
                .iter()
                .filter(|l| l.primary && !l.failed)
                .flat_map(|l| l.slots.iter())
                .map(|&(a, b)| usize::from(b) - usize::from(a) + 1)
                .sum();
            if covered != 16384 {
                return Err(TestkitError::new(format!(
                    "port {} sees {covered} of 16384 slots on live primaries",
                    node.port()
                )));
            }
            if node.try_info_field("replication", "role")?.as_deref() == Some("slave")
                && node
                    .try_info_field("replication", "master_link_status")?
                    .as_deref()
                    != Some("up")
            {
                return Err(TestkitError::new(format!(
                    "replica on port {} is not synced with its primary",
                    node.port()
                )));
            }
        }
        Ok(())
    }
}

/// Starts one cluster-mode node with a bus port of its own.
fn start_node() -> Result<RedisServer, TestkitError> {
    start_node_on_bus().map(|(server, _)| server)
}

/// [`start_node`], and the port of its cluster bus.
fn start_node_on_bus() -> Result<(RedisServer, u16), TestkitError> {
    let mut last = None;
    for _ in 0..START_ATTEMPTS {
        let bus = free_port()?;
        let started = RedisServer::builder()
            .args([
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                "1000",
                "--cluster-port",
            ])
            .arg(bus.to_string())
            .try_start();
        match started {
            Ok(server) => return Ok((server, bus)),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| TestkitError::new("no start attempt was made")))
}

/// The lines of a `CLUSTER NODES` reply.
fn parse_nodes(text: &str) -> Vec<NodeLine> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let addr = fields.get(1)?;
            let port = addr.split('@').next()?.rsplit(':').next()?.parse().ok()?;
            let flags = fields.get(2)?;
            let slots = fields
                .iter()
                .skip(8)
                .filter(|s| !s.starts_with('['))
                .filter_map(|s| match s.split_once('-') {
                    Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                    None => s.parse().ok().map(|a| (a, a)),
                })
                .collect();
            Some(NodeLine {
                port,
                primary: flags.split(',').any(|f| f == "master"),
                failed: flags.split(',').any(|f| f == "fail" || f == "fail?"),
                slots,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_nodes_lines_are_parsed() {
        let text = "\
a 127.0.0.1:30001@40001 myself,master - 0 0 1 connected 0-5460
b 127.0.0.1:30002@40002 master - 0 0 2 connected 5461-10922 [1->-x]
c 127.0.0.1:30003@40003 master,fail - 0 0 3 connected 10923 10924-16383
d 127.0.0.1:30004@40004 slave a 0 0 1 connected
";
        let lines = parse_nodes(text);
        assert_eq!(lines.len(), 4);
        assert_eq!(lines[0].port, 30001);
        assert!(lines[0].primary && !lines[0].failed);
        assert_eq!(lines[1].slots, vec![(5461, 10922)]);
        assert!(lines[2].failed);
        assert_eq!(lines[2].slots, vec![(10923, 10923), (10924, 16383)]);
        assert!(!lines[3].primary);
    }
}
