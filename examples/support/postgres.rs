//! Where an example finds PostgreSQL: `DATABASE_URL`, or a throwaway server
//! started from Debian's `postgresql` binaries
//! (`/usr/lib/postgresql/<version>/bin`: `initdb`, `postgres`) on a free
//! port of 127.0.0.1, in a temporary directory, for the length of the
//! example. As root it runs them as the `postgres` user (PostgreSQL refuses
//! to run as root), through `setpriv`.

use std::fs::{self, File};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Bound on the server's start, `initdb` included.
const START_BOUND: Duration = Duration::from_secs(60);
/// Bound on a clean shutdown before the server is killed.
const STOP_BOUND: Duration = Duration::from_secs(10);

/// The database the example uses; a started server lives as long as this.
pub enum ExamplePostgres {
    /// `DATABASE_URL` from the environment.
    External(String),
    /// A throwaway server, stopped and deleted when dropped.
    Throwaway(PostgresServer),
}

impl ExamplePostgres {
    /// Connection settings for `tokio_postgres::connect`: a URL or
    /// `key=value` pairs.
    pub fn config(&self) -> String {
        match self {
            ExamplePostgres::External(url) => url.clone(),
            ExamplePostgres::Throwaway(server) => server.config(),
        }
    }
}

/// `DATABASE_URL`, or a throwaway server.
pub async fn postgres() -> Result<ExamplePostgres, BoxError> {
    if let Ok(url) = std::env::var("DATABASE_URL") {
        println!("using DATABASE_URL");
        return Ok(ExamplePostgres::External(url));
    }
    let server = PostgresServer::start().await?;
    println!(
        "DATABASE_URL not set; started a throwaway PostgreSQL at 127.0.0.1:{}",
        server.port
    );
    Ok(ExamplePostgres::Throwaway(server))
}

/// A `postgres` child process with its data in a temporary directory.
pub struct PostgresServer {
    child: Child,
    port: u16,
    dir: TempDir,
}

impl PostgresServer {
    fn config(&self) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname=postgres",
            self.port
        )
    }

    async fn start() -> Result<PostgresServer, BoxError> {
        let bin = binaries()?;
        let dir = tempfile::Builder::new()
            .prefix("lock-example-postgres-")
            .tempdir()?;
        let as_postgres = is_root()?;
        if as_postgres {
            // PostgreSQL will not run as root: its files belong to `postgres`.
            let uid = id(&["-u", "postgres"])?;
            let gid = id(&["-g", "postgres"])?;
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid))?;
        }
        let data = dir.path().join("data");
        let initdb = command(as_postgres, &bin.join("initdb"))
            .arg("-D")
            .arg(&data)
            .args(["-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8"])
            .args(["--locale=C"])
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .output()?;
        if !initdb.status.success() {
            return Err(format!(
                "initdb failed ({}): {}{}",
                initdb.status,
                String::from_utf8_lossy(&initdb.stdout),
                String::from_utf8_lossy(&initdb.stderr)
            )
            .into());
        }

        let port = free_port()?;
        let log = File::create(dir.path().join("postgres.log"))?;
        let child = command(as_postgres, &bin.join("postgres"))
            .arg("-D")
            .arg(&data)
            .args(["-p", &port.to_string(), "-k"])
            .arg(dir.path())
            .args(["-c", "listen_addresses=127.0.0.1", "-c", "fsync=off"])
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        let mut server = PostgresServer { child, port, dir };
        server.wait_ready().await?;
        Ok(server)
    }

    /// Waits until a connection succeeds, or fails with the server's log.
    async fn wait_ready(&mut self) -> Result<(), BoxError> {
        let deadline = Instant::now() + START_BOUND;
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Err(format!("postgres exited ({status}):\n{}", self.log()).into());
            }
            if tokio_postgres::connect(&self.config(), tokio_postgres::NoTls)
                .await
                .is_ok()
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!("postgres did not answer:\n{}", self.log()).into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn log(&self) -> String {
        fs::read_to_string(self.dir.path().join("postgres.log")).unwrap_or_default()
    }
}

impl Drop for PostgresServer {
    /// A fast shutdown (SIGINT: sessions ended, no checkpoint wait), then
    /// SIGKILL if it takes too long; the directory goes with the `TempDir`.
    fn drop(&mut self) {
        if !matches!(self.child.try_wait(), Ok(None)) {
            return;
        }
        let _ = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + STOP_BOUND;
        while matches!(self.child.try_wait(), Ok(None)) {
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The newest `/usr/lib/postgresql/<version>/bin` holding `initdb` and
/// `postgres`.
fn binaries() -> Result<PathBuf, BoxError> {
    let mut found: Vec<(u32, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            (bin.join("initdb").is_file() && bin.join("postgres").is_file())
                .then_some((version, bin))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, bin)| bin).ok_or_else(|| {
        "no PostgreSQL: set DATABASE_URL=postgres://user@host/db, or install the server \
         (Debian/Ubuntu: apt-get install postgresql)"
            .into()
    })
}

/// `program`, run as the `postgres` user when `as_postgres`.
fn command(as_postgres: bool, program: &Path) -> Command {
    if as_postgres {
        let mut command = Command::new("setpriv");
        command
            .args([
                "--reuid=postgres",
                "--regid=postgres",
                "--init-groups",
                "--",
            ])
            .arg(program);
        command
    } else {
        Command::new(program)
    }
}

fn is_root() -> Result<bool, BoxError> {
    Ok(id(&["-u"])? == 0)
}

/// A number printed by `id` with `args`.
fn id(args: &[&str]) -> Result<u32, BoxError> {
    let output = Command::new("id").args(args).output()?;
    if !output.status.success() {
        return Err(format!("id {}: {}", args.join(" "), output.status).into());
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().parse()?)
}

fn free_port() -> Result<u16, BoxError> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}
