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
//!
//! A client built with `LockClientBuilder::runtime` runs its own
//! background work (renewals, releases nobody waits for, wake-up hubs) on
//! the runtime it was given instead, through its [`Spawner`], as named tasks
//! that tokio-console and the runtime's metrics see. docs/runtime.md lists
//! every thread and task lock-core starts, with and without it.

use std::future::Future;
use std::sync::OnceLock;
use tokio::runtime::Handle;
use tracing::Instrument;
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

/// Where one client's background work runs: the runtime the user gave
/// (`LockClientBuilder::runtime`), or lock-core's own threads.
#[derive(Clone, Default)]
pub(crate) struct Spawner {
    runtime: Option<Handle>,
}

impl Spawner {
    /// Background work on `runtime`.
    pub(crate) fn on(runtime: Handle) -> Spawner {
        Spawner {
            runtime: Some(runtime),
        }
    }

    /// Whether the work runs on a runtime the user gave.
    pub(crate) fn is_users(&self) -> bool {
        self.runtime.is_some()
    }

    /// Runs `work` as the task `name`, in a `lock_core_task` span whose
    /// `task` field is the name, with the
    /// subscriber of the code that spawned it: on the user's runtime when
    /// one was given, else on lock-core's (see [`spawn`]). A user's runtime
    /// that has shut down drops `work` unpolled, and one shutting down drops
    /// it where it waits; neither panics. Work that must happen all the same
    /// goes through [`spawn_must`](Self::spawn_must).
    pub(crate) fn spawn<F>(&self, name: &'static str, work: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let Some(runtime) = &self.runtime else {
            return spawn(work);
        };
        let work = work
            .instrument(tracing::debug_span!("lock_core_task", task = name))
            .with_current_subscriber();
        spawn_named(runtime, name, work);
    }

    /// [`spawn`](Self::spawn) for work that must be done (a release): should
    /// the user's runtime drop it unfinished, because it shut down before
    /// the work began or while it waited, `make`'s work runs again from the
    /// start on lock-core's runtime. So `make` makes work that is safe to
    /// repeat.
    pub(crate) fn spawn_must<M, F>(&self, name: &'static str, make: M)
    where
        M: Fn() -> F + Send + 'static,
        F: Future<Output = ()> + Send + 'static,
    {
        if !self.is_users() {
            return spawn(make());
        }
        let unfinished = Unfinished {
            make: Some(make),
            name,
        };
        self.spawn(name, async move {
            let mut unfinished = unfinished;
            let work = unfinished.make.as_ref().map(|make| make());
            if let Some(work) = work {
                work.await;
            }
            unfinished.make = None;
        });
    }
}

/// Work a user's runtime dropped before it was done: done on lock-core's
/// runtime instead.
struct Unfinished<M, F>
where
    M: Fn() -> F,
    F: Future<Output = ()> + Send + 'static,
{
    make: Option<M>,
    name: &'static str,
}

impl<M, F> Drop for Unfinished<M, F>
where
    M: Fn() -> F,
    F: Future<Output = ()> + Send + 'static,
{
    fn drop(&mut self) {
        if let Some(make) = self.make.take() {
            tracing::debug!(
                task = self.name,
                "the runtime given to lock-core dropped this task unfinished; it runs again on \
                 lock-core's"
            );
            spawn(make());
        }
    }
}

/// Spawns `work` on `runtime` named `name`, for tokio-console (tokio's
/// task names need `--cfg tokio_unstable`).
#[cfg(tokio_unstable)]
fn spawn_named<F>(runtime: &Handle, name: &'static str, work: F)
where
    F: Future<Output = ()> + Send + 'static,
{
    // Never an error for a task (only a blocking thread can be refused).
    drop(
        tokio::task::Builder::new()
            .name(name)
            .spawn_on(work, runtime),
    );
}

#[cfg(not(tokio_unstable))]
fn spawn_named<F>(runtime: &Handle, _name: &'static str, work: F)
where
    F: Future<Output = ()> + Send + 'static,
{
    drop(runtime.spawn(work));
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
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A handle on a runtime that has shut down.
    fn dead_runtime() -> Handle {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let handle = runtime.handle().clone();
        drop(runtime);
        handle
    }

    #[test]
    fn work_spawned_on_a_dead_runtime_is_dropped_without_a_panic() {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        Spawner::on(dead_runtime()).spawn("test", async move {
            let _ = tx.send(());
        });
        // Dropped unpolled: the sender is gone, nothing was sent.
        let got = rx.recv_timeout(std::time::Duration::from_secs(10));
        assert_eq!(got, Err(std::sync::mpsc::RecvTimeoutError::Disconnected));
    }

    #[test]
    fn work_that_must_be_done_runs_on_ours_after_the_users_runtime_died() {
        let (tx, rx) = std::sync::mpsc::channel();
        Spawner::on(dead_runtime()).spawn_must("test", move || {
            let tx = tx.clone();
            async move { tx.send(is_current()).unwrap() }
        });
        let on_ours = rx.recv_timeout(std::time::Duration::from_secs(10)).unwrap();
        assert!(on_ours);
    }

    /// Dropped where it waits, as its runtime shuts down: it starts over on
    /// lock-core's runtime, and is not done twice.
    #[test]
    fn work_that_must_be_done_starts_over_when_its_runtime_shuts_down() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let tries = Arc::new(AtomicUsize::new(0));
        let spawner = Spawner::on(runtime.handle().clone());
        let counted = tries.clone();
        spawner.spawn_must("test", move || {
            let (tx, try_no) = (tx.clone(), counted.fetch_add(1, Ordering::AcqRel));
            async move {
                if try_no == 0 {
                    std::future::pending::<()>().await;
                }
                tx.send(is_current()).unwrap();
            }
        });
        // Polled once, to its wait.
        runtime.block_on(async {
            for _ in 0..10 {
                tokio::task::yield_now().await;
            }
        });
        assert_eq!(tries.load(Ordering::Acquire), 1);
        drop(runtime);
        let on_ours = rx.recv_timeout(std::time::Duration::from_secs(10)).unwrap();
        assert!(on_ours);
        assert_eq!(tries.load(Ordering::Acquire), 2);
        assert!(
            rx.recv_timeout(std::time::Duration::from_millis(100))
                .is_err()
        );
    }

    #[test]
    fn work_that_must_be_done_and_was_runs_once() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        Spawner::on(runtime.handle().clone()).spawn_must("test", move || {
            let tx = tx.clone();
            async move { tx.send(is_current()).unwrap() }
        });
        // The task runs between two polls of this.
        runtime.block_on(async {
            for _ in 0..10 {
                tokio::task::yield_now().await;
            }
        });
        let on_ours = rx.recv_timeout(std::time::Duration::from_secs(10)).unwrap();
        assert!(!on_ours, "it ran on the runtime given");
        drop(runtime);
        assert!(
            rx.recv_timeout(std::time::Duration::from_millis(100))
                .is_err()
        );
    }

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
