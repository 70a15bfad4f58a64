//! Throwaway Redis Sentinel processes (`redis-server <config> --sentinel`).

use std::fmt::Write as _;
use std::fs::{self, File};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::probe::{Probe, probe};
use crate::server::{
    COMMAND_TIMEOUT, PROBE_INTERVAL, READY_TIMEOUT, START_ATTEMPTS, bind_failed, free_port, reap,
};
use crate::{RedisServer, TestkitError, redis_server_binary};

/// The Sentinel's configuration file, which it rewrites as it learns.
const CONFIG_FILE: &str = "sentinel.conf";
/// The Sentinel's log file.
const LOG_FILE: &str = "sentinel.log";
/// Where its stderr goes.
const STDERR_FILE: &str = "sentinel.stderr";
/// Pause between polls of [`SentinelServer::wait_for_primary`].
const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// A Redis Sentinel child process owned by a test, monitoring one primary.
///
/// It listens on `127.0.0.1` on a port of its own and keeps its
/// configuration (written by the kit, rewritten by the Sentinel) and log in
/// a temporary directory. The monitor is configured for tests: the primary
/// is deemed down after 1 s (`down-after-milliseconds 1000`) and a failover
/// may take 5 s (`failover-timeout 5000`). Dropping it kills and reaps the
/// process and deletes the directory.
///
/// ```no_run
/// use lock_testkit::{RedisServer, SentinelServer};
/// use std::time::Duration;
///
/// let primary = RedisServer::start();
/// let replica = RedisServer::builder().replica_of(&primary).start();
/// replica.wait_replica_synced(Duration::from_secs(10)).unwrap();
/// let sentinels: Vec<SentinelServer> =
///     (0..3).map(|_| SentinelServer::start(&primary, "mymaster", 2)).collect();
/// let _: String = sentinels[0].cmd(&["SENTINEL", "FAILOVER", "mymaster"]);
/// sentinels[0]
///     .wait_for_primary("mymaster", replica.port(), Duration::from_secs(20))
///     .unwrap();
/// ```
#[derive(Debug)]
pub struct SentinelServer {
    dir: TempDir,
    port: u16,
    child: Mutex<Option<Child>>,
}

impl SentinelServer {
    /// Starts a Sentinel monitoring `primary` as `service` with `quorum`.
    ///
    /// # Panics
    ///
    /// Panics with the reason and the Sentinel's log if it cannot start.
    #[must_use = "the sentinel is killed when dropped"]
    pub fn start(primary: &RedisServer, service: &str, quorum: u32) -> SentinelServer {
        Self::try_start(primary, service, quorum)
            .unwrap_or_else(|e| panic!("lock-testkit: could not start a sentinel: {e}"))
    }

    /// [`start`](Self::start), returning failures instead of panicking.
    ///
    /// # Errors
    ///
    /// Fails when no binary is found, when it cannot be spawned, or when it
    /// does not answer within 10 s (the error then carries its log).
    pub fn try_start(
        primary: &RedisServer,
        service: &str,
        quorum: u32,
    ) -> Result<SentinelServer, TestkitError> {
        let binary = redis_server_binary()?;
        let dir = tempfile::Builder::new()
            .prefix("lock-testkit-sentinel-")
            .tempdir()
            .map_err(|e| TestkitError::with_source("could not create a temporary directory", e))?;
        let mut sentinel = SentinelServer {
            dir,
            port: 0,
            child: Mutex::new(None),
        };
        let mut last_error = None;
        for _ in 0..START_ATTEMPTS {
            sentinel.port = free_port()?;
            sentinel.write_config(primary, service, quorum)?;
            match sentinel.launch(&binary) {
                Ok(child) => {
                    *sentinel
                        .child
                        .get_mut()
                        .unwrap_or_else(PoisonError::into_inner) = Some(child);
                    return Ok(sentinel);
                }
                Err((true, e)) => last_error = Some(e),
                Err((false, e)) => return Err(e),
            }
        }
        Err(last_error.unwrap_or_else(|| TestkitError::new("no start attempt was made")))
    }

    /// The TCP port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>`, for a Sentinel client.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Its working directory, holding its configuration and log.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Its whole log, then anything it wrote to stderr. For failure
    /// messages.
    pub fn log(&self) -> String {
        let mut log = fs::read_to_string(self.dir.path().join(LOG_FILE)).unwrap_or_default();
        let stderr = fs::read_to_string(self.dir.path().join(STDERR_FILE)).unwrap_or_default();
        if !stderr.trim().is_empty() {
            let _ = write!(log, "\n--- stderr ---\n{stderr}");
        }
        log
    }

    /// Whether the process is alive.
    pub fn is_running(&self) -> bool {
        self.lock_child()
            .as_mut()
            .is_some_and(|child| matches!(child.try_wait(), Ok(None)))
    }

    /// Kills and reaps the Sentinel. Does nothing if it is stopped already.
    pub fn stop(&mut self) {
        let child = self
            .child
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(mut child) = child {
            reap(&mut child);
        }
    }

    /// Runs one command on a new connection (5 s timeouts) and converts
    /// the reply: `sentinel.cmd::<String>(&["SENTINEL", "FAILOVER", "m"])`.
    ///
    /// # Panics
    ///
    /// Panics with the Sentinel's log if the command fails.
    pub fn cmd<T: redis::FromRedisValue>(&self, args: &[&str]) -> T {
        self.try_cmd(args)
            .unwrap_or_else(|e| panic!("lock-testkit: {e}"))
    }

    /// [`cmd`](Self::cmd), returning failures instead of panicking.
    ///
    /// # Errors
    ///
    /// Fails with the Sentinel's log if `args` is empty, or the connection
    /// or the command fails, or the reply does not convert to `T`.
    pub fn try_cmd<T: redis::FromRedisValue>(&self, args: &[&str]) -> Result<T, TestkitError> {
        let Some((name, rest)) = args.split_first() else {
            return Err(TestkitError::new("cmd needs at least a command name"));
        };
        let fail = |e: redis::RedisError| {
            TestkitError::with_source(
                format!(
                    "`{}` failed on the sentinel on port {}",
                    args.join(" "),
                    self.port
                ),
                e,
            )
            .with_log(&self.log())
        };
        let client = redis::Client::open(self.url()).map_err(fail)?;
        let mut connection = client
            .get_connection_with_timeout(COMMAND_TIMEOUT)
            .map_err(fail)?;
        connection
            .set_read_timeout(Some(COMMAND_TIMEOUT))
            .map_err(fail)?;
        connection
            .set_write_timeout(Some(COMMAND_TIMEOUT))
            .map_err(fail)?;
        redis::cmd(name)
            .arg(rest)
            .query(&mut connection)
            .map_err(fail)
    }

    /// The port of the primary it names for `service`
    /// (`SENTINEL get-master-addr-by-name`), `None` when it names none.
    ///
    /// # Errors
    ///
    /// Fails with the Sentinel's log when it cannot be asked.
    pub fn primary_port(&self, service: &str) -> Result<Option<u16>, TestkitError> {
        let addr: Option<(String, String)> =
            self.try_cmd(&["SENTINEL", "get-master-addr-by-name", service])?;
        Ok(addr.and_then(|(_, port)| port.parse().ok()))
    }

    /// Waits until it names the server on `port` as the primary of
    /// `service`, polling, for at most `bound`.
    ///
    /// # Errors
    ///
    /// Fails with the Sentinel's log when it does not within `bound`.
    pub fn wait_for_primary(
        &self,
        service: &str,
        port: u16,
        bound: Duration,
    ) -> Result<(), TestkitError> {
        let deadline = Instant::now() + bound;
        loop {
            let named = self.primary_port(service);
            if matches!(named, Ok(Some(p)) if p == port) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(TestkitError::new(format!(
                    "the sentinel on port {} did not name port {port} the primary of \
                     {service:?} within {bound:?} (last answer: {named:?})",
                    self.port
                ))
                .with_log(&self.log()));
            }
            thread::sleep(POLL_INTERVAL);
        }
    }

    /// Waits until it knows at least `replicas` replicas of `service` that
    /// it does not deem down (`SENTINEL REPLICAS`), polling, for at most
    /// `bound`: before that, `SENTINEL FAILOVER` has nobody to promote.
    ///
    /// # Errors
    ///
    /// Fails with the Sentinel's log when it does not within `bound`.
    pub fn wait_for_replicas(
        &self,
        service: &str,
        replicas: usize,
        bound: Duration,
    ) -> Result<(), TestkitError> {
        let deadline = Instant::now() + bound;
        loop {
            let known: Result<Vec<Vec<String>>, _> =
                self.try_cmd(&["SENTINEL", "REPLICAS", service]);
            let healthy = known.as_ref().map_or(0, |list| {
                list.iter()
                    .filter(|fields| {
                        fields
                            .chunks(2)
                            .find(|pair| pair.first().map(String::as_str) == Some("flags"))
                            .and_then(|pair| pair.get(1))
                            .is_some_and(|flags| flags == "slave")
                    })
                    .count()
            });
            if healthy >= replicas {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(TestkitError::new(format!(
                    "the sentinel on port {} did not see {replicas} healthy replicas of \
                     {service:?} within {bound:?} (last answer: {known:?})",
                    self.port
                ))
                .with_log(&self.log()));
            }
            thread::sleep(POLL_INTERVAL);
        }
    }

    fn write_config(
        &self,
        primary: &RedisServer,
        service: &str,
        quorum: u32,
    ) -> Result<(), TestkitError> {
        let dir = self.dir.path();
        let mut config = String::new();
        let _ = writeln!(config, "port {}", self.port);
        let _ = writeln!(config, "bind 127.0.0.1");
        let _ = writeln!(config, "protected-mode no");
        let _ = writeln!(config, "daemonize no");
        let _ = writeln!(config, "dir {}", dir.display());
        let _ = writeln!(config, "logfile {}", dir.join(LOG_FILE).display());
        let _ = writeln!(config, "sentinel resolve-hostnames no");
        let _ = writeln!(
            config,
            "sentinel monitor {service} 127.0.0.1 {} {quorum}",
            primary.port()
        );
        let _ = writeln!(config, "sentinel down-after-milliseconds {service} 1000");
        let _ = writeln!(config, "sentinel failover-timeout {service} 5000");
        let _ = writeln!(config, "sentinel parallel-syncs {service} 1");
        if let Some(password) = primary.password() {
            let _ = writeln!(config, "sentinel auth-pass {service} {password}");
        }
        fs::write(dir.join(CONFIG_FILE), config)
            .map_err(|e| TestkitError::with_source("could not write sentinel.conf", e))
    }

    /// Spawns the Sentinel and waits until it answers. The error's flag
    /// says whether another port may help.
    fn launch(&self, binary: &Path) -> Result<Child, (bool, TestkitError)> {
        let dir = self.dir.path();
        let log_path = dir.join(LOG_FILE);
        let log_start = fs::metadata(&log_path).map_or(0, |m| m.len());
        let stderr = File::options()
            .create(true)
            .append(true)
            .open(dir.join(STDERR_FILE))
            .map_err(|e| {
                (
                    false,
                    TestkitError::with_source("could not create the sentinel's stderr file", e),
                )
            })?;
        let mut child = Command::new(binary)
            .arg(dir.join(CONFIG_FILE))
            .arg("--sentinel")
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .map_err(|e| {
                (
                    false,
                    TestkitError::with_source(format!("could not spawn {}", binary.display()), e),
                )
            })?;
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            match child.try_wait() {
                Ok(None) => {}
                Ok(Some(status)) => {
                    let error = TestkitError::new(format!(
                        "the sentinel on port {} exited during startup ({status})",
                        self.port
                    ))
                    .with_log(&self.log());
                    return Err((bind_failed(&log_path, log_start), error));
                }
                Err(e) => {
                    reap(&mut child);
                    return Err((
                        false,
                        TestkitError::with_source("could not check on the spawned sentinel", e),
                    ));
                }
            }
            match probe(self.port, None, child.id()) {
                Probe::Ready => return Ok(child),
                Probe::Foreign(pid) => {
                    reap(&mut child);
                    return Err((
                        true,
                        TestkitError::new(format!(
                            "port {} is served by another process (pid {pid})",
                            self.port
                        )),
                    ));
                }
                Probe::NotReady => {}
            }
            if Instant::now() >= deadline {
                reap(&mut child);
                return Err((
                    false,
                    TestkitError::new(format!(
                        "the sentinel on port {} did not answer within {READY_TIMEOUT:?}",
                        self.port
                    ))
                    .with_log(&self.log()),
                ));
            }
            thread::sleep(PROBE_INTERVAL);
        }
    }

    fn lock_child(&self) -> MutexGuard<'_, Option<Child>> {
        self.child.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for SentinelServer {
    fn drop(&mut self) {
        self.stop();
    }
}
