//! Checks of the Jepsen-style pieces against real processes: the fenced
//! register on a `redis-server`, worker processes, and a crash that keeps
//! the AOF.

#![allow(clippy::expect_used)]

use std::error::Error;
use std::process::Command;
use std::time::Duration;

use lock_testkit::RedisServer;
use lock_testkit::jepsen::{Answer, Event, FencedRegister, OpKind, RegisterState, Workers};

type TestResult = Result<(), Box<dyn Error>>;

#[tokio::test]
async fn the_register_refuses_tokens_below_the_highest_seen_reads_included() -> TestResult {
    let server = RedisServer::start();
    let mut register = FencedRegister::connect(&server.url(), Duration::from_secs(5)).await?;
    assert_eq!(register.read(Some(10), "a").await, Answer::Accepted(0));
    assert_eq!(register.write(Some(10), 1, "b").await, Answer::Accepted(1));
    // A read with 20 raises the bar: a write with 10 is refused from now on.
    assert_eq!(register.read(Some(20), "c").await, Answer::Accepted(1));
    assert_eq!(
        register.write(Some(10), 2, "d").await,
        Answer::Rejected { max_seen: 20 }
    );
    assert_eq!(register.write(Some(20), 2, "e").await, Answer::Accepted(2));
    // Tokens from a clock in microseconds compare exactly.
    let big = 1_796_123_259_894_530;
    assert_eq!(register.write(Some(big), 3, "f").await, Answer::Accepted(3));
    assert_eq!(
        register.read(Some(big - 1), "g").await,
        Answer::Rejected { max_seen: big }
    );
    // Without a token nothing is checked.
    assert_eq!(register.write(None, 5, "h").await, Answer::Accepted(5));

    let state = RegisterState::read(&server)?;
    assert_eq!((state.value, state.max_seen), (5, Some(big)));
    let log: Vec<(&str, OpKind, bool, Option<u64>)> = state
        .log
        .iter()
        .map(|e| (e.tag.as_str(), e.op, e.accepted, e.token))
        .collect();
    assert_eq!(
        log,
        [
            ("a", OpKind::Read, true, Some(10)),
            ("b", OpKind::Write, true, Some(10)),
            ("c", OpKind::Read, true, Some(20)),
            ("d", OpKind::Write, false, Some(10)),
            ("e", OpKind::Write, true, Some(20)),
            ("f", OpKind::Write, true, Some(big)),
            ("g", OpKind::Read, false, Some(big - 1)),
            ("h", OpKind::Write, true, None),
        ]
    );
    Ok(())
}

/// A worker that reports `Started` and then waits for its stdin to close.
fn shell_worker(id: u32) -> Command {
    let started = Event::Started {
        worker: id,
        pid: 0,
        at: 0,
    }
    .to_line();
    let mut command = Command::new("sh");
    command.args(["-c", &format!("echo '{started}'; cat >/dev/null")]);
    command
}

#[test]
fn workers_start_pause_resume_and_stop_when_their_stdin_closes() -> TestResult {
    let mut workers = Workers::new();
    workers.spawn(1, shell_worker(1))?;
    workers.spawn(2, shell_worker(2))?;
    assert_eq!(workers.running(), [1, 2]);
    assert_eq!(workers.history().len(), 2);

    workers.pause(1)?;
    assert_eq!(workers.running(), [2]);
    workers.resume(1)?;
    workers.kill(2);
    assert_eq!(workers.running(), [1]);
    workers.pause(1)?;
    // Paused workers are resumed, then told to stop: none needs killing.
    assert_eq!(workers.stop_all(Duration::from_secs(5)), Vec::<u32>::new());
    assert!(workers.running().is_empty());

    let mut failing = Command::new("sh");
    failing.args(["-c", "echo 'not an event'; exit 3"]);
    let mut others = Workers::new();
    let started = std::time::Instant::now();
    let err = others
        .spawn(3, failing)
        .expect_err("started without Started");
    assert!(
        err.to_string().contains("exited before it started"),
        "{err}"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(others.running().is_empty());
    assert_eq!(others.history().malformed().len(), 1);
    Ok(())
}

#[test]
fn a_crash_keeps_what_an_aof_with_fsync_always_acknowledged() {
    let mut server = RedisServer::builder()
        .args(["--appendonly", "yes", "--appendfsync", "always"])
        .start();
    let _: () = server.cmd(&["SET", "k", "kept"]);
    server.crash();
    assert!(!server.is_running());
    server.restart();
    assert_eq!(
        server.cmd::<Option<String>>(&["GET", "k"]).as_deref(),
        Some("kept")
    );
}
