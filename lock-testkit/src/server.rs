//! Throwaway `redis-server` processes.

use std::fmt::Write as _;
use std::fs::{self, File};
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::probe::{Probe, probe};
use crate::signal::{self, Signal};
use crate::{TestCertificates, TestkitError, redis_server_binary};

/// Fresh ports tried by a start before giving up.
pub(crate) const START_ATTEMPTS: usize = 5;
/// How long a spawned server has to answer before the start fails.
pub(crate) const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a restart keeps retrying while its port is taken.
const RESTART_PORT_WAIT: Duration = Duration::from_secs(5);
/// Pause between restart attempts on a busy port.
const RESTART_RETRY_DELAY: Duration = Duration::from_millis(100);
/// Pause between polls of [`RedisServer::wait_replica_synced`].
const SYNC_POLL_INTERVAL: Duration = Duration::from_millis(20);
/// Pause between readiness probes.
pub(crate) const PROBE_INTERVAL: Duration = Duration::from_millis(20);
/// Bound on reaping a killed server.
pub(crate) const REAP_TIMEOUT: Duration = Duration::from_secs(5);
/// Connect, read and write timeout of [`RedisServer::connection`].
pub(crate) const COMMAND_TIMEOUT: Duration = Duration::from_secs(5);

/// The server's own log file, inside its directory.
const LOG_FILE: &str = "redis.log";
/// Where the server's stderr goes (configuration errors land here).
const STDERR_FILE: &str = "redis.stderr";
/// The RDB snapshot written by `SAVE` and loaded at start.
const DUMP_FILE: &str = "dump.rdb";
/// The AOF directory, present only if a test enabled `--appendonly`.
const AOF_DIR: &str = "appendonlydir";
/// The TLS server certificate, key and trusted client CA, in the server's
/// directory (copied there so they outlive the [`TestCertificates`]).
const TLS_CERT_FILE: &str = "tls-server.crt";
const TLS_KEY_FILE: &str = "tls-server.key";
const TLS_CA_FILE: &str = "tls-ca.crt";

/// Options for a [`RedisServer`], made with [`RedisServer::builder`].
#[derive(Clone, Debug, Default)]
#[must_use = "a builder does nothing until `start` or `try_start` is called"]
pub struct ServerBuilder {
    password: Option<String>,
    args: Vec<String>,
    tls: Option<TlsOptions>,
}

/// What a TLS server is given.
#[derive(Clone, Debug)]
struct TlsOptions {
    cert: String,
    key: String,
    ca: String,
    require_client_certificates: bool,
}

impl ServerBuilder {
    /// Requires clients to authenticate with `password` (`--requirepass`).
    /// [`RedisServer::url`] then carries the password.
    pub fn password(mut self, password: impl Into<String>) -> Self {
        self.password = Some(password.into());
        self
    }

    /// Appends one command-line argument for `redis-server`, after the kit's
    /// own, so it can override them: `.arg("--maxmemory").arg("1mb")`.
    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// Serves TLS too, with the server certificate of `certificates`, on a
    /// port of its own: [`RedisServer::tls_port`], [`RedisServer::tls_url`].
    ///
    /// The plain port stays open, for the kit's readiness probe and for
    /// [`cmd`](RedisServer::cmd) and [`connection`](RedisServer::connection);
    /// the code under test is given the `rediss://` URL. Clients are not
    /// asked for a certificate unless
    /// [`require_client_certificates`](Self::require_client_certificates)
    /// is called.
    pub fn tls(mut self, certificates: &TestCertificates) -> Self {
        self.tls = Some(TlsOptions {
            cert: certificates.server_cert_pem().to_owned(),
            key: certificates.server_key_pem().to_owned(),
            ca: certificates.ca_pem().to_owned(),
            require_client_certificates: false,
        });
        self
    }

    /// Mutual TLS: the TLS port accepts only clients that show a certificate
    /// issued by the CA of [`tls`](Self::tls) (`--tls-auth-clients yes`).
    /// Does nothing without `tls`.
    pub fn require_client_certificates(mut self) -> Self {
        if let Some(tls) = &mut self.tls {
            tls.require_client_certificates = true;
        }
        self
    }

    /// Starts the server as a replica of `primary` (`--replicaof 127.0.0.1
    /// <port>`, with `--masterauth` when `primary` has a password). It is
    /// ready when it answers, not when it has synced: see
    /// [`RedisServer::wait_replica_synced`].
    pub fn replica_of(mut self, primary: &RedisServer) -> Self {
        self.args.extend([
            "--replicaof".to_owned(),
            "127.0.0.1".to_owned(),
            primary.port().to_string(),
        ]);
        if let Some(password) = primary.password() {
            self.args
                .extend(["--masterauth".to_owned(), password.to_owned()]);
        }
        self
    }

    /// Appends several command-line arguments, as by [`arg`](Self::arg).
    pub fn args<I>(mut self, args: I) -> Self
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Starts the server.
    ///
    /// # Panics
    ///
    /// Panics with the reason and the server log if it cannot start.
    #[must_use = "the server is killed when dropped"]
    pub fn start(self) -> RedisServer {
        self.try_start()
            .unwrap_or_else(|e| panic!("lock-testkit: could not start redis-server: {e}"))
    }

    /// Starts the server on a free port, in a new temporary directory, and
    /// waits until it answers.
    ///
    /// # Errors
    ///
    /// Fails when no binary is found, when it cannot be spawned, or when it
    /// does not come up (the error then carries the server log).
    pub fn try_start(self) -> Result<RedisServer, TestkitError> {
        let binary = redis_server_binary()?;
        let dir = tempfile::Builder::new()
            .prefix("lock-testkit-redis-")
            .tempdir()
            .map_err(|e| TestkitError::with_source("could not create a temporary directory", e))?;
        if let Some(tls) = &self.tls {
            for (name, pem) in [
                (TLS_CERT_FILE, &tls.cert),
                (TLS_KEY_FILE, &tls.key),
                (TLS_CA_FILE, &tls.ca),
            ] {
                fs::write(dir.path().join(name), pem)
                    .map_err(|e| TestkitError::with_source(format!("could not write {name}"), e))?;
            }
        }
        let mut server = RedisServer {
            binary,
            options: self,
            dir,
            port: 0,
            tls_port: None,
            child: Mutex::new(None),
            paused: AtomicBool::new(false),
        };
        let mut last_error = None;
        for _ in 0..START_ATTEMPTS {
            server.port = free_port()?;
            if server.options.tls.is_some() {
                server.tls_port = Some(loop {
                    let port = free_port()?;
                    if port != server.port {
                        break port;
                    }
                });
            }
            match server.launch() {
                Ok(child) => {
                    *server
                        .child
                        .get_mut()
                        .unwrap_or_else(PoisonError::into_inner) = Some(child);
                    return Ok(server);
                }
                Err(Launch::PortTaken(e)) => last_error = Some(e),
                Err(Launch::Failed(e)) => return Err(e),
            }
        }
        Err(last_error.unwrap_or_else(|| TestkitError::new("no start attempt was made")))
    }
}

/// A `redis-server` child process owned by a test.
///
/// It listens on `127.0.0.1` on a port of its own, keeps its files in a
/// temporary directory (`--dir`), logs to a file there, and persists nothing
/// by itself (`--save ""`, `--appendonly no`). Dropping it kills the process
/// (resuming it first if paused), reaps it and removes the directory.
///
/// Methods that take `&self` may be used from several threads or tasks at
/// once. Keep servers in locals, not in `static`s: statics are never
/// dropped, so their processes would outlive the test binary.
#[derive(Debug)]
pub struct RedisServer {
    binary: PathBuf,
    options: ServerBuilder,
    dir: TempDir,
    port: u16,
    tls_port: Option<u16>,
    child: Mutex<Option<Child>>,
    paused: AtomicBool,
}

/// Why a launch did not produce a ready server.
enum Launch {
    /// The port belongs to someone else; another port (or a later retry) may work.
    PortTaken(TestkitError),
    /// Anything else; retrying will not help.
    Failed(TestkitError),
}

impl RedisServer {
    /// Starts a server with default options.
    ///
    /// # Panics
    ///
    /// Panics with the reason and the server log if it cannot start.
    #[must_use = "the server is killed when dropped"]
    pub fn start() -> RedisServer {
        Self::builder().start()
    }

    /// Starts a server with default options.
    ///
    /// # Errors
    ///
    /// See [`ServerBuilder::try_start`].
    pub fn try_start() -> Result<RedisServer, TestkitError> {
        Self::builder().try_start()
    }

    /// Options for a server: a password, extra `redis-server` arguments.
    pub fn builder() -> ServerBuilder {
        ServerBuilder::default()
    }

    /// The TCP port it listens on; it keeps it across restarts.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:<port>`.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// A URL for the `redis` crate: `redis://127.0.0.1:<port>`, or
    /// `redis://:<password>@127.0.0.1:<port>` when a password is set.
    pub fn url(&self) -> String {
        match &self.options.password {
            Some(password) => format!(
                "redis://:{}@127.0.0.1:{}",
                percent_encode(password),
                self.port
            ),
            None => format!("redis://127.0.0.1:{}", self.port),
        }
    }

    /// The TLS port, for a server started with [`ServerBuilder::tls`]; it
    /// keeps it across restarts.
    pub fn tls_port(&self) -> Option<u16> {
        self.tls_port
    }

    /// A URL for the TLS port: `rediss://127.0.0.1:<tls port>`, with the
    /// password when one is set.
    ///
    /// # Panics
    ///
    /// Panics if the server was started without [`ServerBuilder::tls`].
    pub fn tls_url(&self) -> String {
        let Some(port) = self.tls_port else {
            panic!("lock-testkit: tls_url: this server was started without ServerBuilder::tls");
        };
        match &self.options.password {
            Some(password) => format!("rediss://:{}@127.0.0.1:{port}", percent_encode(password)),
            None => format!("rediss://127.0.0.1:{port}"),
        }
    }

    /// The password set with [`ServerBuilder::password`], if any.
    pub fn password(&self) -> Option<&str> {
        self.options.password.as_deref()
    }

    /// The server's working directory (`--dir`), holding its log and snapshot.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The whole server log, across restarts, followed by anything it wrote
    /// to stderr (where configuration errors go). Meant for failure messages.
    pub fn log(&self) -> String {
        let mut log = fs::read_to_string(self.dir.path().join(LOG_FILE)).unwrap_or_default();
        let stderr = fs::read_to_string(self.dir.path().join(STDERR_FILE)).unwrap_or_default();
        if !stderr.trim().is_empty() {
            let _ = write!(log, "\n--- stderr ---\n{stderr}");
        }
        log
    }

    /// The process id, while a process is held (between a start or restart
    /// and the next stop); `None` once stopped.
    pub fn pid(&self) -> Option<u32> {
        self.lock_child().as_ref().map(Child::id)
    }

    /// Whether the process is alive. A paused server counts as running.
    pub fn is_running(&self) -> bool {
        self.lock_child()
            .as_mut()
            .is_some_and(|child| matches!(child.try_wait(), Ok(None)))
    }

    /// Kills the server (`SIGKILL`) and reaps it, like a crash. Everything
    /// it holds is lost: any `dump.rdb` is deleted too, so [`restart`]
    /// brings it back empty. Does nothing if it is already stopped.
    ///
    /// [`restart`]: Self::restart
    pub fn stop(&mut self) {
        self.kill();
        self.remove_data();
    }

    /// Kills the server (`SIGKILL`) and reaps it, like [`stop`](Self::stop),
    /// but keeps its files: what it had written to disk is what
    /// [`restart`](Self::restart) loads. Started with `--appendonly yes
    /// --appendfsync always`, that is every write it acknowledged; without
    /// persistence, nothing. Does nothing if it is already stopped.
    pub fn crash(&mut self) {
        self.kill();
    }

    /// Issues `SAVE` (writing `dump.rdb` into [`dir`](Self::dir)), then kills
    /// and reaps the server, so that [`restart`](Self::restart) reloads the
    /// data as it was.
    ///
    /// # Panics
    ///
    /// Panics with the server log if `SAVE` fails (for instance when the
    /// server is not running).
    pub fn save_and_stop(&mut self) {
        if let Err(e) = self.try_cmd::<()>(&["SAVE"]) {
            panic!("lock-testkit: save_and_stop could not save: {e}");
        }
        self.kill();
    }

    /// Starts the server again on the same port and directory, loading
    /// `dump.rdb` if present: after [`stop`](Self::stop) it comes back empty,
    /// after [`save_and_stop`](Self::save_and_stop) with the saved data. A
    /// server still running is stopped first, as by `stop`. Returns once it
    /// answers; retries for a few seconds while the port is momentarily taken.
    ///
    /// # Panics
    ///
    /// Panics with the server log if it does not come back.
    pub fn restart(&mut self) {
        if let Err(e) = self.try_restart() {
            panic!("lock-testkit: could not restart redis-server: {e}");
        }
    }

    /// [`restart`](Self::restart), returning failures instead of panicking.
    ///
    /// # Errors
    ///
    /// Fails when the server cannot be spawned or does not answer in time, or
    /// when its port stays taken by another process.
    pub fn try_restart(&mut self) -> Result<(), TestkitError> {
        if self.lock_child().is_some() {
            self.stop();
        }
        let deadline = Instant::now() + RESTART_PORT_WAIT;
        loop {
            match self.launch() {
                Ok(child) => {
                    *self.lock_child() = Some(child);
                    return Ok(());
                }
                Err(Launch::PortTaken(e)) if Instant::now() >= deadline => return Err(e),
                Err(Launch::PortTaken(_)) => thread::sleep(RESTART_RETRY_DELAY),
                Err(Launch::Failed(e)) => return Err(e),
            }
        }
    }

    /// Stops the server if running, deletes any saved data, and restarts it
    /// empty.
    ///
    /// # Panics
    ///
    /// As [`restart`](Self::restart).
    pub fn restart_empty(&mut self) {
        self.stop();
        self.restart();
    }

    /// Freezes the server with `SIGSTOP` until the returned guard is dropped
    /// (or [`PauseGuard::resume`] is called). While frozen, the kernel still
    /// accepts connections, but nothing is answered: clients time out.
    ///
    /// # Panics
    ///
    /// Panics if the server is not running or the signal cannot be sent.
    #[must_use = "the server resumes as soon as the guard is dropped"]
    pub fn pause(&self) -> PauseGuard<'_> {
        self.try_pause()
            .unwrap_or_else(|e| panic!("lock-testkit: could not pause redis-server: {e}"))
    }

    /// [`pause`](Self::pause), returning failures instead of panicking.
    ///
    /// # Errors
    ///
    /// Fails if the server is not running or the signal cannot be sent.
    pub fn try_pause(&self) -> Result<PauseGuard<'_>, TestkitError> {
        let pid = self.pid().filter(|_| self.is_running()).ok_or_else(|| {
            TestkitError::new(format!("redis-server on port {} is not running", self.port))
        })?;
        self.paused.store(true, Ordering::SeqCst);
        if let Err(e) = signal::send(Signal::Stop, pid) {
            self.paused.store(false, Ordering::SeqCst);
            return Err(e);
        }
        signal::wait_until_stopped(pid);
        Ok(PauseGuard { server: self })
    }

    /// A synchronous connection for assertions, with 5 s connect, read and
    /// write timeouts. Authenticated when a password is set.
    ///
    /// # Panics
    ///
    /// Panics with the server log if it cannot connect.
    pub fn connection(&self) -> redis::Connection {
        self.try_connection()
            .unwrap_or_else(|e| panic!("lock-testkit: {e}"))
    }

    /// [`connection`](Self::connection), returning failures instead of
    /// panicking.
    ///
    /// # Errors
    ///
    /// Fails with the server log if it cannot connect.
    pub fn try_connection(&self) -> Result<redis::Connection, TestkitError> {
        let fail = |e: redis::RedisError| {
            TestkitError::with_source(
                format!("could not connect to redis-server on port {}", self.port),
                e,
            )
            .with_log(&self.log())
        };
        let client = redis::Client::open(self.url()).map_err(fail)?;
        let connection = client
            .get_connection_with_timeout(COMMAND_TIMEOUT)
            .map_err(fail)?;
        connection
            .set_read_timeout(Some(COMMAND_TIMEOUT))
            .map_err(fail)?;
        connection
            .set_write_timeout(Some(COMMAND_TIMEOUT))
            .map_err(fail)?;
        Ok(connection)
    }

    /// Runs one command on a new connection and converts the reply:
    /// `server.cmd::<i64>(&["PTTL", "k"])`.
    ///
    /// # Panics
    ///
    /// Panics with the server log if `args` is empty, the command fails, or
    /// the reply does not convert to `T`.
    pub fn cmd<T: redis::FromRedisValue>(&self, args: &[&str]) -> T {
        self.try_cmd(args)
            .unwrap_or_else(|e| panic!("lock-testkit: {e}"))
    }

    /// [`cmd`](Self::cmd), returning failures instead of panicking.
    ///
    /// # Errors
    ///
    /// Fails with the server log if `args` is empty, the connection or the
    /// command fails, or the reply does not convert to `T`.
    pub fn try_cmd<T: redis::FromRedisValue>(&self, args: &[&str]) -> Result<T, TestkitError> {
        let Some((name, rest)) = args.split_first() else {
            return Err(TestkitError::new("cmd needs at least a command name"));
        };
        let mut connection = self.try_connection()?;
        redis::cmd(name)
            .arg(rest)
            .query(&mut connection)
            .map_err(|e| {
                TestkitError::with_source(
                    format!(
                        "`{}` failed on redis-server port {}",
                        args.join(" "),
                        self.port
                    ),
                    e,
                )
                .with_log(&self.log())
            })
    }

    /// The value of one field of `INFO <section>` (`role`,
    /// `master_link_status`, `connected_slaves`, ...), `None` when absent.
    ///
    /// # Errors
    ///
    /// Fails with the server log when the server cannot be asked.
    pub fn try_info_field(
        &self,
        section: &str,
        field: &str,
    ) -> Result<Option<String>, TestkitError> {
        let info: String = self.try_cmd(&["INFO", section])?;
        Ok(info_field(&info, field))
    }

    /// `master` or `slave`, from `INFO replication`.
    ///
    /// # Panics
    ///
    /// Panics with the server log if the server cannot be asked.
    pub fn role(&self) -> String {
        self.try_info_field("replication", "role")
            .unwrap_or_else(|e| panic!("lock-testkit: {e}"))
            .unwrap_or_default()
    }

    /// For a replica: waits until its link to the primary is up and the
    /// initial sync is done (`master_link_status:up`), polling, for at most
    /// `bound`.
    ///
    /// # Errors
    ///
    /// Fails with the server log when the link is not up within `bound`.
    pub fn wait_replica_synced(&self, bound: Duration) -> Result<(), TestkitError> {
        let deadline = Instant::now() + bound;
        loop {
            let status = self.try_info_field("replication", "master_link_status");
            if let Ok(Some(status)) = &status
                && status == "up"
            {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(TestkitError::new(format!(
                    "the replica on port {} did not sync within {bound:?} (last: {status:?})",
                    self.port
                ))
                .with_log(&self.log()));
            }
            thread::sleep(SYNC_POLL_INTERVAL);
        }
    }

    /// The redis-server command line: a throwaway server on `self.port`
    /// that keeps nothing on disk, with the options of the builder.
    fn command(&self, log_path: &Path, stderr: File) -> Command {
        let dir = self.dir.path();
        let mut command = Command::new(&self.binary);
        command
            .arg("--port")
            .arg(self.port.to_string())
            .args(["--bind", "127.0.0.1"])
            .arg("--dir")
            .arg(dir)
            .arg("--logfile")
            .arg(log_path)
            .args(["--save", ""])
            .args(["--appendonly", "no"])
            .args(["--daemonize", "no"])
            .args(["--protected-mode", "no"])
            // A replica's initial sync starts at once, not after 5 s.
            .args(["--repl-diskless-sync-delay", "0"])
            .args(["--dbfilename", DUMP_FILE]);
        if let Some(password) = &self.options.password {
            command.arg("--requirepass").arg(password);
        }
        if let (Some(tls), Some(tls_port)) = (&self.options.tls, self.tls_port) {
            command
                .arg("--tls-port")
                .arg(tls_port.to_string())
                .arg("--tls-cert-file")
                .arg(dir.join(TLS_CERT_FILE))
                .arg("--tls-key-file")
                .arg(dir.join(TLS_KEY_FILE))
                .arg("--tls-ca-cert-file")
                .arg(dir.join(TLS_CA_FILE))
                .arg("--tls-auth-clients")
                .arg(if tls.require_client_certificates {
                    "yes"
                } else {
                    "no"
                });
        }
        command
            .args(&self.options.args)
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr);
        command
    }

    /// Spawns the server on `self.port` and waits until it is ready.
    fn launch(&self) -> Result<Child, Launch> {
        let dir = self.dir.path();
        let log_path = dir.join(LOG_FILE);
        let log_start = fs::metadata(&log_path).map_or(0, |m| m.len());
        let stderr = File::options()
            .create(true)
            .append(true)
            .open(dir.join(STDERR_FILE))
            .map_err(|e| {
                Launch::Failed(TestkitError::with_source(
                    "could not create the server's stderr file",
                    e,
                ))
            })?;

        let mut command = self.command(&log_path, stderr);
        let mut child = command.spawn().map_err(|e| {
            Launch::Failed(TestkitError::with_source(
                format!("could not spawn {}", self.binary.display()),
                e,
            ))
        })?;

        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            match child.try_wait() {
                Ok(None) => {}
                Ok(Some(status)) => {
                    let error = TestkitError::new(format!(
                        "redis-server on port {} exited during startup ({status})",
                        self.port
                    ))
                    .with_log(&self.log());
                    return Err(if bind_failed(&log_path, log_start) {
                        Launch::PortTaken(error)
                    } else {
                        Launch::Failed(error)
                    });
                }
                Err(e) => {
                    reap(&mut child);
                    return Err(Launch::Failed(TestkitError::with_source(
                        "could not check on the spawned redis-server",
                        e,
                    )));
                }
            }
            match probe(self.port, self.options.password.as_deref(), child.id()) {
                Probe::Ready => return Ok(child),
                Probe::Foreign(pid) => {
                    reap(&mut child);
                    return Err(Launch::PortTaken(TestkitError::new(format!(
                        "port {} is served by another process (pid {pid})",
                        self.port
                    ))));
                }
                Probe::NotReady => {}
            }
            if Instant::now() >= deadline {
                reap(&mut child);
                return Err(Launch::Failed(
                    TestkitError::new(format!(
                        "redis-server on port {} did not answer within {READY_TIMEOUT:?}",
                        self.port
                    ))
                    .with_log(&self.log()),
                ));
            }
            thread::sleep(PROBE_INTERVAL);
        }
    }

    /// Kills and reaps the process, if any, resuming it first if paused.
    fn kill(&mut self) {
        let paused = self.paused.swap(false, Ordering::SeqCst);
        let child = self
            .child
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(mut child) = child {
            if paused {
                let _ = signal::send(Signal::Cont, child.id());
            }
            reap(&mut child);
        }
    }

    /// Deletes the snapshot and any AOF files.
    fn remove_data(&self) {
        let dir = self.dir.path();
        let _ = fs::remove_file(dir.join(DUMP_FILE));
        let _ = fs::remove_dir_all(dir.join(AOF_DIR));
    }

    fn lock_child(&self) -> MutexGuard<'_, Option<Child>> {
        self.child.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Keeps a server frozen (`SIGSTOP`); dropping it sends `SIGCONT`, also when
/// the test panics. Made by [`RedisServer::pause`].
#[derive(Debug)]
#[must_use = "the server resumes as soon as the guard is dropped"]
pub struct PauseGuard<'a> {
    server: &'a RedisServer,
}

impl PauseGuard<'_> {
    /// Resumes the server now (same as dropping the guard).
    pub fn resume(self) {
        drop(self);
    }
}

impl Drop for PauseGuard<'_> {
    fn drop(&mut self) {
        if self.server.paused.swap(false, Ordering::SeqCst)
            && let Some(pid) = self.server.pid()
            && let Err(e) = signal::send(Signal::Cont, pid)
        {
            eprintln!("lock-testkit: could not resume redis-server: {e}");
        }
    }
}

/// Starts `n` independent servers in parallel (for Redlock tests).
///
/// # Panics
///
/// Panics with the reason and the server log if any of them cannot start;
/// the others are then stopped.
#[must_use = "the servers are killed when dropped"]
pub fn start_servers(n: usize) -> Vec<RedisServer> {
    try_start_servers(n)
        .unwrap_or_else(|e| panic!("lock-testkit: could not start {n} redis-servers: {e}"))
}

/// [`start_servers`], returning the first failure instead of panicking.
///
/// # Errors
///
/// See [`ServerBuilder::try_start`].
pub fn try_start_servers(n: usize) -> Result<Vec<RedisServer>, TestkitError> {
    thread::scope(|scope| {
        let starting: Vec<_> = (0..n)
            .map(|_| scope.spawn(RedisServer::try_start))
            .collect();
        starting
            .into_iter()
            .map(|handle| {
                handle
                    .join()
                    .unwrap_or_else(|_| Err(TestkitError::new("a server start thread panicked")))
            })
            .collect()
    })
}

/// The value of `field` in an `INFO` reply.
pub(crate) fn info_field(info: &str, field: &str) -> Option<String> {
    info.lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .map(|value| value.trim().to_owned())
}

/// A port that was free a moment ago.
///
/// Never a port it gave before in this process: a server stopped for a
/// restart leaves its port free for a while, and a server started
/// meanwhile by another test must not take it.
pub(crate) fn free_port() -> Result<u16, TestkitError> {
    static GIVEN: std::sync::Mutex<Option<std::collections::HashSet<u16>>> =
        std::sync::Mutex::new(None);
    let mut given = GIVEN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let given = given.get_or_insert_with(Default::default);
    for _ in 0..1000 {
        let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .and_then(|listener| listener.local_addr())
            .map(|addr| addr.port())
            .map_err(|e| TestkitError::with_source("could not find a free port", e))?;
        if given.insert(port) {
            return Ok(port);
        }
    }
    Err(TestkitError::new(
        "could not find a free port this process has not given out before",
    ))
}

/// Whether the log written since byte `start` reports a failed bind.
pub(crate) fn bind_failed(log_path: &Path, start: u64) -> bool {
    let log = fs::read(log_path).unwrap_or_default();
    let fresh = log
        .get(usize::try_from(start).unwrap_or(usize::MAX)..)
        .unwrap_or(&log);
    let fresh = String::from_utf8_lossy(fresh);
    fresh.contains("Address already in use") || fresh.contains("Failed listening on port")
}

/// Kills `child` (ignoring that it may be gone already) and reaps it, waiting
/// at most [`REAP_TIMEOUT`].
pub(crate) fn reap(child: &mut Child) {
    let _ = child.kill();
    let deadline = Instant::now() + REAP_TIMEOUT;
    loop {
        match child.try_wait() {
            Ok(Some(_)) | Err(_) => return,
            Ok(None) if Instant::now() >= deadline => {
                eprintln!(
                    "lock-testkit: process {} did not exit after SIGKILL",
                    child.id()
                );
                return;
            }
            Ok(None) => thread::sleep(Duration::from_millis(2)),
        }
    }
}

/// Percent-encodes everything but RFC 3986 unreserved characters.
fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(byte));
        } else {
            let _ = write!(out, "%{byte:02X}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_percent_encoded_in_urls() {
        assert_eq!(percent_encode("a b@c:d/é"), "a%20b%40c%3Ad%2F%C3%A9");
        assert_eq!(percent_encode("plain-pw_1.~"), "plain-pw_1.~");
    }
}
