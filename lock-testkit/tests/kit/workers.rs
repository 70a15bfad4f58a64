//! A worker crashed with `Workers::crash` never sees its stdin close: it
//! dies without stopping on its own.

use std::error::Error;
use std::process::Command;

use lock_testkit::jepsen::{Event, Workers};

type TestResult = Result<(), Box<dyn Error>>;

/// A worker that reports `Started`, waits for its stdin to close, then
/// reports that it stopped (a `Lost` event stands for the release a real
/// worker would send).
fn stopping_worker(id: u32) -> Command {
    let started = Event::Started {
        worker: id,
        pid: 0,
        at: 0,
    }
    .to_line();
    let stopped = Event::Lost {
        worker: id,
        lease: 0,
        at: 0,
    }
    .to_line();
    let mut command = Command::new("sh");
    command.args([
        "-c",
        &format!("echo '{started}'; cat >/dev/null; echo '{stopped}'"),
    ]);
    command
}

#[test]
fn a_crashed_worker_does_not_stop_on_its_own_first() -> TestResult {
    let mut workers = Workers::new();
    for id in 1..=5 {
        workers.spawn(id, stopping_worker(id))?;
        workers.crash(id)?;
        assert!(!workers.is_running(id));
    }
    let events = workers.history().events();
    assert!(
        events.iter().all(|e| matches!(e, Event::Started { .. })),
        "a crashed worker reported something after its start: {events:?}"
    );
    assert!(workers.crash(1).is_err(), "crashed twice");
    // The shell worker stops when told, as before.
    workers.spawn(6, stopping_worker(6))?;
    assert!(
        workers
            .stop_all(std::time::Duration::from_secs(5))
            .is_empty()
    );
    assert!(matches!(
        workers.history().events().last(),
        Some(Event::Lost { worker: 6, .. })
    ));
    Ok(())
}
