//! Checks of the kit itself: servers, pauses, restarts and the proxy.

use std::error::Error;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::panic;
use std::path::Path;
use std::time::{Duration, Instant};

use lock_testkit::{Proxy, ProxyMode, RedisServer, start_servers};

type TestResult = Result<(), Box<dyn Error>>;

/// Sends an inline `PING` over a fresh connection and returns the reply line.
fn ping(addr: SocketAddr, timeout: Duration) -> io::Result<String> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
    ping_on(&mut stream, timeout)
}

/// Sends an inline `PING` on `stream` and returns the reply line.
fn ping_on(stream: &mut TcpStream, timeout: Duration) -> io::Result<String> {
    stream.set_read_timeout(Some(timeout))?;
    stream.write_all(b"PING\r\n")?;
    read_reply(stream)
}

/// Reads one short reply line, however the bytes arrive.
fn read_reply(stream: &mut TcpStream) -> io::Result<String> {
    let mut reply = Vec::new();
    let mut buf = [0; 64];
    while !reply.ends_with(b"\r\n") {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        reply.extend_from_slice(&buf[..n]);
    }
    Ok(String::from_utf8_lossy(&reply).trim_end().to_owned())
}

/// Asserts that `result` is a read that timed out, saying what it was
/// otherwise.
#[track_caller]
fn assert_timed_out(result: io::Result<String>) {
    assert!(
        matches!(&result, Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut)),
        "expected a read that times out, got {result:?}"
    );
}

#[test]
fn server_starts_and_answers() -> TestResult {
    let server = RedisServer::start();
    assert!(server.is_running());
    assert!(server.pid().is_some());
    assert_ne!(server.port(), 6379);
    assert_eq!(server.url(), format!("redis://127.0.0.1:{}", server.port()));
    assert_eq!(ping(server.addr(), Duration::from_secs(2))?, "+PONG");

    let _: () = server.cmd(&["SET", "k", "v", "PX", "60000"]);
    let pttl: i64 = server.cmd(&["PTTL", "k"]);
    assert!(pttl > 0 && pttl <= 60_000, "PTTL was {pttl}");
    let value: Option<String> = redis::cmd("GET").arg("k").query(&mut server.connection())?;
    assert_eq!(value.as_deref(), Some("v"));
    assert!(server.log().contains("Ready to accept connections"));
    Ok(())
}

#[test]
fn stop_loses_data_and_save_and_stop_keeps_it() {
    let mut server = RedisServer::start();
    let port = server.port();
    let _: () = server.cmd(&["SET", "k", "v"]);

    server.stop();
    assert!(!server.is_running());
    assert_eq!(server.pid(), None);
    server.restart();
    assert_eq!(server.port(), port);
    assert_eq!(server.cmd::<Option<String>>(&["GET", "k"]), None);

    let _: () = server.cmd(&["SET", "k", "saved"]);
    server.save_and_stop();
    assert!(!server.is_running());
    server.restart();
    assert_eq!(server.port(), port);
    assert_eq!(
        server.cmd::<Option<String>>(&["GET", "k"]).as_deref(),
        Some("saved")
    );

    server.restart_empty();
    assert_eq!(server.cmd::<Option<String>>(&["GET", "k"]), None);
}

#[test]
fn pause_freezes_until_the_guard_drops() -> TestResult {
    let server = RedisServer::start();
    let guard = server.pause();
    assert!(server.is_running());
    assert_timed_out(ping(server.addr(), Duration::from_millis(300)));
    drop(guard);
    assert_eq!(ping(server.addr(), Duration::from_secs(2))?, "+PONG");

    server.pause().resume();
    assert_eq!(ping(server.addr(), Duration::from_secs(2))?, "+PONG");

    // A panicking test still resumes the server while unwinding.
    let outcome = panic::catch_unwind(panic::AssertUnwindSafe(|| {
        let _guard = server.pause();
        panic!("test failure while paused");
    }));
    assert!(outcome.is_err());
    assert_eq!(ping(server.addr(), Duration::from_secs(2))?, "+PONG");
    Ok(())
}

#[test]
fn dropping_a_server_kills_its_process() {
    let server = RedisServer::start();
    let pid = server
        .pid()
        .unwrap_or_else(|| panic!("a started server has a pid"));
    let dir = server.dir().to_path_buf();
    let guard = server.pause();
    drop(guard);
    drop(server);
    assert!(!Path::new(&format!("/proc/{pid}")).exists());
    assert!(!dir.exists());
}

#[test]
fn password_servers_put_the_password_in_the_url() -> TestResult {
    let server = RedisServer::builder().password("s3cret pw").start();
    assert_eq!(
        server.url(),
        format!("redis://:s3cret%20pw@127.0.0.1:{}", server.port())
    );
    assert_eq!(server.cmd::<String>(&["PING"]), "PONG");
    assert!(ping(server.addr(), Duration::from_secs(2))?.starts_with("-NOAUTH"));
    Ok(())
}

#[test]
fn bad_arguments_fail_with_the_log() {
    let result = RedisServer::builder()
        .arg("--no-such-directive")
        .arg("1")
        .try_start();
    let message = match result {
        Ok(_) => panic!("a bad directive must fail the start"),
        Err(e) => e.to_string(),
    };
    assert!(message.contains("exited during startup"), "{message}");
    assert!(message.contains("no-such-directive"), "{message}");
}

#[test]
fn several_servers_run_at_once() {
    let servers = start_servers(2);
    assert_eq!(servers.len(), 2);
    assert_ne!(servers[0].port(), servers[1].port());
    let _: () = servers[0].cmd(&["SET", "only-in-first", "1"]);
    assert_eq!(
        servers[1].cmd::<Option<String>>(&["GET", "only-in-first"]),
        None
    );
}

#[test]
fn proxy_passes_and_delays() -> TestResult {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.addr());
    assert_eq!(proxy.mode(), ProxyMode::Pass);
    assert_eq!(proxy.url(), format!("redis://127.0.0.1:{}", proxy.port()));
    assert_ne!(proxy.port(), server.port());

    let mut connection = redis::Client::open(proxy.url())?.get_connection()?;
    let _: () = redis::cmd("SET")
        .arg("via")
        .arg("proxy")
        .query(&mut connection)?;
    assert_eq!(
        server.cmd::<Option<String>>(&["GET", "via"]).as_deref(),
        Some("proxy")
    );
    assert!(proxy.wait_for_connection_count(1, Duration::from_secs(2)));

    // The existing connection follows the new mode; both directions wait.
    proxy.set_mode(ProxyMode::Delay(Duration::from_millis(100)));
    let started = Instant::now();
    let pong: String = redis::cmd("PING").query(&mut connection)?;
    assert_eq!(pong, "PONG");
    assert!(started.elapsed() >= Duration::from_millis(200));
    Ok(())
}

/// Round trips of `PING` on `stream`, one after the other, each timed.
fn timed_pings(stream: &mut TcpStream, count: usize) -> io::Result<Vec<Duration>> {
    (0..count)
        .map(|_| {
            let started = Instant::now();
            let reply = ping_on(stream, Duration::from_secs(2))?;
            if reply != "+PONG" {
                return Err(io::Error::other(format!("PING answered {reply:?}")));
            }
            Ok(started.elapsed())
        })
        .collect()
}

#[test]
fn delay_holds_each_direction_as_long_as_asked() -> TestResult {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.addr());
    proxy.set_mode(ProxyMode::Delay(Duration::from_micros(500)));
    let mut stream = TcpStream::connect_timeout(&proxy.addr(), Duration::from_secs(1))?;
    stream.set_nodelay(true)?;
    timed_pings(&mut stream, 20)?;
    let mut rtts = timed_pings(&mut stream, 400)?;
    rtts.sort();
    let (fastest, median) = (rtts[0], rtts[rtts.len() / 2]);
    eprintln!("PING through Delay(500 µs): fastest {fastest:?}, median {median:?}");
    // Each direction is held 500 µs from the chunk's arrival: never less.
    assert!(fastest >= Duration::from_millis(1), "fastest {fastest:?}");
    // Not rounded up to tokio's millisecond ticks (that gave 2-4 ms): the
    // median is the delay plus the loopback's own round trip and wake-ups,
    // with room for a busy machine.
    assert!(median <= Duration::from_micros(1_500), "median {median:?}");
    Ok(())
}

#[test]
fn delay_keeps_pipelined_traffic_flowing_in_order() -> TestResult {
    const COMMANDS: usize = 100;
    let delay = Duration::from_millis(5);
    let server = RedisServer::start();
    let proxy = Proxy::start(server.addr());
    proxy.set_mode(ProxyMode::Delay(delay));
    let mut stream = TcpStream::connect_timeout(&proxy.addr(), Duration::from_secs(1))?;
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    // One command per write, a little apart, so the proxy reads them as
    // separate chunks while earlier ones are still held.
    let started = Instant::now();
    let mut expected = Vec::new();
    for i in 0..COMMANDS {
        stream.write_all(format!("ECHO {i}\r\n").as_bytes())?;
        expected.extend_from_slice(format!("${}\r\n{i}\r\n", i.to_string().len()).as_bytes());
        std::thread::sleep(Duration::from_micros(100));
    }
    let sent = started.elapsed();
    let mut replies = vec![0; expected.len()];
    stream.read_exact(&mut replies)?;
    let elapsed = started.elapsed();
    assert_eq!(
        String::from_utf8_lossy(&replies),
        String::from_utf8_lossy(&expected)
    );
    // Each chunk is held from its own arrival: the last reply comes about
    // one round trip after the last write. Held one after another, the
    // chunks would take COMMANDS × delay each way (500 ms).
    assert!(
        elapsed < sent + 2 * delay + Duration::from_millis(150),
        "{COMMANDS} pipelined ECHOs took {elapsed:?}, the last sent after {sent:?}"
    );
    Ok(())
}

#[test]
fn blackhole_hangs_and_heals() -> TestResult {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.addr());
    let mut stream = TcpStream::connect(proxy.addr())?;
    assert_eq!(ping_on(&mut stream, Duration::from_secs(2))?, "+PONG");

    proxy.set_mode(ProxyMode::Blackhole);
    assert_timed_out(ping_on(&mut stream, Duration::from_millis(300)));
    // New connections are accepted, and hang too.
    assert_timed_out(ping(proxy.addr(), Duration::from_millis(300)));

    // The held PING goes through once the partition heals.
    proxy.set_mode(ProxyMode::Pass);
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    assert_eq!(read_reply(&mut stream)?, "+PONG");
    Ok(())
}

#[test]
fn cut_closes_connections() -> TestResult {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.addr());
    let mut stream = TcpStream::connect(proxy.addr())?;
    assert_eq!(ping_on(&mut stream, Duration::from_secs(2))?, "+PONG");
    assert_eq!(proxy.connection_count(), 1);

    proxy.cut();
    assert_eq!(proxy.connection_count(), 0);
    let mut buf = [0; 16];
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    assert!(matches!(stream.read(&mut buf), Ok(0) | Err(_)));

    assert_eq!(ping(proxy.addr(), Duration::from_secs(2))?, "+PONG");
    assert!(proxy.wait_for_connection_count(0, Duration::from_secs(2)));
    Ok(())
}

#[tokio::test]
async fn proxy_serves_async_clients_from_a_test_runtime() -> TestResult {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.addr());
    let client = redis::Client::open(proxy.url())?;
    let mut connection = client.get_multiplexed_async_connection().await?;
    let pong: String = redis::cmd("PING").query_async(&mut connection).await?;
    assert_eq!(pong, "PONG");

    proxy.set_mode(ProxyMode::Blackhole);
    let hung = tokio::time::timeout(
        Duration::from_millis(300),
        redis::cmd("PING").query_async::<String>(&mut connection),
    )
    .await;
    assert!(hung.is_err());
    Ok(())
}

#[test]
fn restart_waits_for_a_momentarily_busy_port() -> TestResult {
    let mut server = RedisServer::start();
    server.stop();
    let squatter = std::net::TcpListener::bind(server.addr())?;
    let release = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        drop(squatter);
    });
    server.restart();
    assert_eq!(ping(server.addr(), Duration::from_secs(2))?, "+PONG");
    release
        .join()
        .unwrap_or_else(|_| panic!("the squatter thread panicked"));
    Ok(())
}
