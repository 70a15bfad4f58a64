//! The bench's own `redis-server` processes, `INFO`, and a `MONITOR` reader that
//! counts the commands clients send.
//!
//! Servers come from `lock-testkit`: each runs on a free port of
//! `127.0.0.1` in a temporary directory and is killed and reaped when its
//! [`RedisServer`] handle drops. [`Servers`] owns every handle for the whole
//! run, so they are dropped on every path out of it, errors included.

use crate::error::{BenchResult, fail};
use lock_testkit::{RedisServer, try_start_servers};
use redis::aio::MultiplexedConnection;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, ErrorKind, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

/// How many primaries the Redlock workload (W4) uses.
pub const REDLOCK_NODES: usize = 5;

/// Every server of a run.
#[derive(Debug)]
pub struct Servers {
    /// The single server of W1, W2, W3, W3p and W6.
    pub single: RedisServer,
    /// The independent primaries of W4 (empty when W4 is not run).
    pub redlock: Vec<RedisServer>,
    /// W5's own server, so its keys and command counters start clean
    /// (`None` when W5 is not run).
    pub hold: Option<RedisServer>,
}

impl Servers {
    /// Starts one server, plus five for Redlock when `redlock`, plus one for
    /// W5 when `hold`, all in parallel.
    pub fn start(redlock: bool, hold: bool) -> BenchResult<Servers> {
        let wanted = 1 + if redlock { REDLOCK_NODES } else { 0 } + usize::from(hold);
        let mut started = try_start_servers(wanted)?.into_iter();
        let single = started
            .next()
            .ok_or_else(|| fail("no server was started"))?;
        let hold = if hold { started.next() } else { None };
        Ok(Servers {
            single,
            redlock: started.collect(),
            hold,
        })
    }

    /// The URLs of the Redlock primaries.
    pub fn redlock_urls(&self) -> Vec<String> {
        self.redlock.iter().map(RedisServer::url).collect()
    }
}

/// One multiplexed connection (the `redis` crate's shared, pipelining
/// connection) to `url`.
pub async fn connect(url: &str) -> BenchResult<MultiplexedConnection> {
    let client = redis::Client::open(url)?;
    Ok(client.get_multiplexed_async_connection().await?)
}

/// `INFO section`, as field → value.
pub async fn info(
    conn: &mut MultiplexedConnection,
    section: &str,
) -> BenchResult<BTreeMap<String, String>> {
    let text: String = redis::cmd("INFO").arg(section).query_async(conn).await?;
    Ok(parse_info(&text))
}

/// Commands a server ran while a [`Monitor`] watched, by lower-case name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CommandCounts {
    /// Sent by clients (each is one command on the wire).
    pub sent: BTreeMap<String, u64>,
    /// Run by Lua scripts (`redis.call` inside `EVAL`/`EVALSHA`), which
    /// `INFO commandstats` counts too but no client sent.
    pub in_scripts: BTreeMap<String, u64>,
}

impl CommandCounts {
    /// Counts one line of `MONITOR` output:
    /// `+1712345678.123456 [0 127.0.0.1:5555] "evalsha" "..." ...`, where
    /// the client is `[0 lua]` for commands run by a script.
    fn count(&mut self, line: &str) {
        let Some(rest) = line.strip_prefix('+') else {
            return;
        };
        let Some((client, command)) = rest
            .split_once('[')
            .and_then(|(_, tail)| tail.split_once(']'))
        else {
            return;
        };
        let Some(name) = command
            .trim_start()
            .strip_prefix('"')
            .and_then(|c| c.split('"').next())
        else {
            return;
        };
        let name = name.to_ascii_lowercase();
        let counts = if client.ends_with(" lua") {
            &mut self.in_scripts
        } else {
            &mut self.sent
        };
        *counts.entry(name).or_insert(0) += 1;
    }
}

/// Counts, through `MONITOR` on a connection of its own, every command a
/// server runs from [`start`](Self::start) to [`stop`](Self::stop). It
/// costs the server a little per command, so it only watches W5's hold,
/// where the command rate is what is measured.
#[derive(Debug)]
pub struct Monitor {
    stop: Arc<AtomicBool>,
    reader: Option<JoinHandle<CommandCounts>>,
}

impl Monitor {
    /// Connects to `addr`, sends `MONITOR`, and returns once the server has
    /// confirmed it, so every later command is seen.
    pub fn start(addr: SocketAddr) -> BenchResult<Monitor> {
        let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
        stream.write_all(b"MONITOR\r\n")?;
        stream.set_read_timeout(Some(Duration::from_secs(5)))?;
        let mut reader = BufReader::new(stream);
        let mut ok = String::new();
        reader.read_line(&mut ok)?;
        if ok.trim_end() != "+OK" {
            return Err(fail(format!("MONITOR answered {:?}", ok.trim_end())));
        }
        reader
            .get_ref()
            .set_read_timeout(Some(Duration::from_millis(50)))?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::Builder::new()
            .name("lock-bench-monitor".to_owned())
            .spawn(move || read_monitor(reader, &stopping))?;
        Ok(Monitor {
            stop,
            reader: Some(thread),
        })
    }

    /// Stops watching and returns the counts.
    pub fn stop(mut self) -> BenchResult<CommandCounts> {
        self.stop.store(true, Ordering::Release);
        self.reader
            .take()
            .ok_or_else(|| fail("the monitor was already stopped"))?
            .join()
            .map_err(|_| fail("the monitor thread panicked"))
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(thread) = self.reader.take() {
            let _ = thread.join();
        }
    }
}

/// The monitor thread: counts lines until told to stop or the connection
/// ends.
fn read_monitor(mut reader: BufReader<TcpStream>, stop: &AtomicBool) -> CommandCounts {
    let mut counts = CommandCounts::default();
    let mut line = Vec::new();
    while !stop.load(Ordering::Acquire) {
        match reader.read_until(b'\n', &mut line) {
            Ok(0) => break,
            Ok(_) => {
                counts.count(&String::from_utf8_lossy(&line));
                line.clear();
            }
            // A timeout keeps the partial line and checks the stop flag.
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    counts
}

/// The `field:value` lines of an `INFO` reply.
fn parse_info(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| line.split_once(':'))
        .map(|(field, value)| (field.to_owned(), value.trim().to_owned()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_lines_become_fields() {
        let info = parse_info(
            "# Commandstats\r\ncmdstat_evalsha:calls=12,usec=30,usec_per_call=2.50\r\n\
             cmdstat_set:calls=3,usec=1\r\n",
        );
        assert_eq!(
            info.get("cmdstat_evalsha").map(String::as_str),
            Some("calls=12,usec=30,usec_per_call=2.50")
        );
        assert_eq!(info.len(), 2);
    }

    #[test]
    fn monitor_lines_split_clients_from_scripts() {
        let mut counts = CommandCounts::default();
        counts.count("+1796016839.068749 [0 127.0.0.1:60202] \"EVALSHA\" \"abc\" \"1\" \"k\"\r\n");
        counts.count("+1796016839.068801 [0 lua] \"GET\" \"k\"\r\n");
        counts.count("+1796016839.068810 [0 lua] \"pexpire\" \"k\" \"3000\"\r\n");
        counts.count("garbage");
        assert_eq!(counts.sent.get("evalsha"), Some(&1));
        assert_eq!(counts.sent.len(), 1);
        assert_eq!(counts.in_scripts.get("get"), Some(&1));
        assert_eq!(counts.in_scripts.get("pexpire"), Some(&1));
    }
}
