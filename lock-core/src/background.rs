//! lock-core's own runtime: a few threads per process for the work that no
//! task of the user's may hold up.
//!
//! A user's runtime can stop serving a task at any moment: a worker thread
//! blocked by a synchronous call, a future kept and never polled again, a
//! runtime shutting down as `main` returns or a `#[tokio::test]` ends. A
//! task spawned there (a release nobody waits for, a connection's driver,
//! a wake-up subscription) stops with it, and a resource opened there
//! (a socket's readiness, the `redis` crate's driver task) is served only
//! while one of its threads is free. So every connection of a client is
//! opened here, and the releases, subscriptions and answers left behind by
//! callers that went away run here. Callers still use those connections
//! from their own tasks: only the readiness events and the drivers live on
//! this thread.
//!
//! The runtime starts at first use and lives as long as the process: a
//! thread that only waits for it to end, and two workers that sleep in
//! `epoll` when there is nothing to do. The heartbeat has a thread
//! of its own (see `heartbeat.rs`): its rounds can be long computations at
//! a million leases, and nothing here should wait behind them.

use std::future::Future;
use std::sync::OnceLock;
use tokio::runtime::Handle;
use tracing::instrument::WithSubscriber;

/// The runtime's handle, or `None` when the system refused a thread.
static RUNTIME: OnceLock<Option<Handle>> = OnceLock::new();

/// lock-core's runtime, started on first use.
pub(crate) fn handle() -> Option<&'static Handle> {
    RUNTIME.get_or_init(start).as_ref()
}

/// Runs `work` on lock-core's runtime, with the tracing subscriber of the
/// code that spawned it (a scoped one too). Should the system have refused
/// lock-core its thread, `work` runs on the caller's runtime instead, and
/// outside any runtime it is dropped.
pub(crate) fn spawn<F>(work: F)
where
    F: Future<Output = ()> + Send + 'static,
{
    let work = work.with_current_subscriber();
    if let Some(runtime) = handle() {
        drop(runtime.spawn(work));
    } else if let Ok(runtime) = Handle::try_current() {
        drop(runtime.spawn(work));
    }
}

/// Whether the code running now is on lock-core's runtime.
/// Runs `work` on a thread of the blocking pool of the runtime it is called
/// on (lock-core's), inside that runtime, so that tasks it spawns and
/// sockets it opens belong to it; `None` should the thread fail. For work
/// that blocks a while: opening a TLS connection loads the system's
/// certificates and runs the handshake's crypto synchronously, and on
/// lock-core's one thread that would hold up every other connection.
pub(crate) async fn off_thread<T, F>(work: F) -> Option<T>
where
    F: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let runtime = Handle::current();
    let inside = runtime.clone();
    runtime
        .spawn_blocking(move || inside.block_on(work))
        .await
        .ok()
}

#[cfg(test)]
fn is_current() -> bool {
    match (handle(), Handle::try_current()) {
        (Some(ours), Ok(current)) => ours.id() == current.id(),
        _ => false,
    }
}

fn start() -> Option<Handle> {
    let (sender, receiver) = std::sync::mpsc::channel();
    let started = std::thread::Builder::new()
        .name("lock-core".into())
        .spawn(move || {
            // Two workers: a connection whose work is heavy for a moment
            // (a TLS record, a burst of replies) holds up the others' wake-ups
            // no longer than it takes the second worker to steal them.
            let runtime = match tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("lock-core-io")
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime,
                Err(err) => {
                    tracing::error!(error = %err, "lock-core could not start its runtime");
                    let _ = sender.send(None);
                    return;
                }
            };
            let _ = sender.send(Some(runtime.handle().clone()));
            // Serves spawned tasks until the process exits.
            runtime.block_on(std::future::pending::<()>());
        });
    match started {
        Ok(_) => receiver.recv().ok().flatten(),
        Err(err) => {
            tracing::error!(error = %err, "lock-core could not start its thread");
            None
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn work_spawned_outside_any_runtime_runs() {
        let (tx, rx) = std::sync::mpsc::channel();
        spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            tx.send(is_current()).unwrap();
        });
        let on_ours = rx.recv_timeout(std::time::Duration::from_secs(10)).unwrap();
        assert!(on_ours);
        assert!(!is_current());
    }

    #[test]
    fn work_spawned_by_a_runtime_that_shuts_down_still_runs() {
        let (tx, rx) = std::sync::mpsc::channel();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            spawn(async move {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                tx.send(()).unwrap();
            });
        });
        drop(runtime);
        rx.recv_timeout(std::time::Duration::from_secs(10)).unwrap();
    }
}
