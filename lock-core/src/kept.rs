//! An acquisition nobody polls any more lets go of what it took.
//!
//! A caller may poll an acquisition and then keep its future without
//! polling it again: stored in a struct, raced in a `select!` whose other
//! branch runs on, its task's thread blocked by a synchronous call. What
//! the acquisition set in motion goes on meanwhile. Its `SET` is answered
//! and may have taken the key; as the first of this process's queue for
//! the key, it is woken by the key's release or by its backoff timer.
//! Left alone, the key would stay held, by a task that will not use it,
//! until its ttl, and the tasks queued behind it would wait for its promise
//! to pass (up to an operation timeout).
//!
//! So every acquisition runs with a waker of its own ([`Watched`]), which
//! notes when the acquisition is woken. One that is woken and not polled
//! within [`KEPT`] is dropped by lock-core's runtime, as its caller
//! dropping it would: a token its `SET` may have set is released (written
//! behind that `SET`), its places in the queues go to the next task, and an
//! offer handed to it is passed on. A poll and this drop exclude each
//! other. Polled again, the acquisition starts over within what is left of
//! its wait, and is given twice as long the next time: a caller that is
//! only slow (its task polled late by a busy scheduler) is not given up for
//! ever, and one that is kept costs others one [`KEPT`].
//!
//! The cost: a wake-up stores the watch's tick in the acquisition; an
//! acquisition its first poll leaves pending is listed, in one of several
//! lists, until it ends; and while any is listed, a watch on lock-core's
//! runtime looks at them every [`TICK`].
//!
//! A client given a runtime (`LockClientBuilder::runtime`) has a
//! [`Watcher`] of its own, whose watch runs there (`lock-core.kept`), so
//! that it starts none of lock-core's threads; should that runtime drop the
//! watch (it shut down), the watch goes on on lock-core's runtime. Every
//! other client shares lock-core's.

use crate::background::{self, Spawner};
use crate::sync::{self, AtomicWaker};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

/// How long a woken acquisition may go unpolled before it is dropped: three
/// times a hand-off offer's window ([`crate::queue`]'s `OFFER`). Starting
/// over costs a round trip, so this leaves room for a busy scheduler, and
/// it is still well inside what a kept acquisition may cost other tasks.
pub(crate) const KEPT: Duration = Duration::from_millis(30);

/// How often the watch looks at the woken acquisitions: wake-ups are
/// timed in its ticks, which costs them no clock read.
const TICK: Duration = Duration::from_millis(10);

/// Ticks from a wake-up to the drop of an acquisition still unpolled: one
/// more than [`KEPT`] holds, since a wake-up comes anywhere in its tick.
const KEPT_TICKS: u64 = KEPT.as_millis().div_ceil(TICK.as_millis()) as u64 + 1;

/// Ticks in a row with no acquisition in flight before the watch ends (one
/// second).
const IDLE_TICKS: u32 = 100;

/// An acquisition watched for being kept: `start(wait)` makes it, with
/// `wait` what is left of the caller's wait, at the first poll and again at
/// the first poll after it was given up.
pub(crate) struct Watched<F, S> {
    watch: Arc<Watch<F>>,
    /// Where it is listed, once its first poll left it pending.
    listed: Option<Listed>,
    /// The waker the acquisition is polled with: notes its wake-ups, then
    /// wakes the caller.
    waker: Waker,
    start: S,
    /// The caller's wait, and when it runs out.
    wait: Duration,
    deadline: Instant,
    /// Whether `start` was called: a second call starts over.
    started: bool,
}

/// Watches the acquisition `start` makes, with `watcher`, within a wait of
/// `wait` from `since`; `key` (the first of several) names it in the record.
pub(crate) fn watched<F, S>(
    watcher: &Arc<Watcher>,
    key: Arc<str>,
    since: Instant,
    wait: Duration,
    start: S,
) -> Watched<F, S>
where
    F: Future + Send + 'static,
    S: FnMut(Duration) -> F + Unpin,
{
    let watch = Arc::new(Watch {
        future: sync::Mutex::new(None),
        woken_at: sync::AtomicU64::new(0),
        patience: sync::AtomicU64::new(KEPT_TICKS),
        caller: AtomicWaker::new(),
        key,
        watcher: watcher.clone(),
    });
    Watched {
        waker: Waker::from(watch.clone()),
        watch,
        listed: None,
        start,
        wait,
        deadline: since.checked_add(wait).unwrap_or(since),
        started: false,
    }
}

impl<F, S> Future for Watched<F, S>
where
    F: Future + Send + 'static,
    S: FnMut(Duration) -> F + Unpin,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        sync::register(&this.watch.caller, cx.waker());
        let mut future = this.watch.future();
        // Under the lock, which the drop of a kept acquisition takes too.
        this.watch.woken_at.store(0, Ordering::Release);
        let running = future.get_or_insert_with(|| {
            let wait = match std::mem::replace(&mut this.started, true) {
                false => this.wait,
                true => this.deadline.saturating_duration_since(Instant::now()),
            };
            spare::boxed((this.start)(wait))
        });
        let polled = running.as_mut().poll(&mut Context::from_waker(&this.waker));
        if polled.is_ready() {
            if let Some(done) = future.take() {
                spare::keep(done);
            }
        } else if this.listed.is_none() && cfg!(not(all(test, lock_core_loom))) {
            drop(future);
            this.listed = Some(this.watch.watcher.list(this.watch.clone()));
        }
        polled
    }
}

impl<F, S> Drop for Watched<F, S> {
    /// Done, or dropped by the caller: the acquisition is dropped here and
    /// now, and no longer listed.
    fn drop(&mut self) {
        let acquisition = self.watch.future().take();
        drop(acquisition);
        if let Some(listed) = self.listed {
            self.watch.watcher.unlist(listed);
        }
    }
}

/// What the caller and the watch share of one acquisition.
struct Watch<F> {
    /// The acquisition; `None` before the first poll, once done, and once
    /// given up. Boxed, to be dropped wherever it is given up.
    future: sync::Mutex<Option<Pin<Box<F>>>>,
    /// The watch's tick ([`Watcher`]'s) when the acquisition was woken and not
    /// polled since, or 0.
    woken_at: sync::AtomicU64,
    /// Ticks from a wake-up to the drop: [`KEPT_TICKS`], doubled at every
    /// give-up.
    patience: sync::AtomicU64,
    /// The caller's waker.
    caller: AtomicWaker,
    /// The key (the first of several), for the record.
    key: Arc<str>,
    /// Where it is listed, and whose ticks time its wake-ups.
    watcher: Arc<Watcher>,
}

impl<F> Watch<F> {
    fn future(&self) -> sync::MutexGuard<'_, Option<Pin<Box<F>>>> {
        self.future.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl<F: Future + Send + 'static> Wake for Watch<F> {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let _ = self.woken_at.compare_exchange(
            0,
            self.watcher.ticks(),
            Ordering::AcqRel,
            Ordering::Relaxed,
        );
        self.caller.wake();
    }
}

/// A listed acquisition, as the watch sees it.
trait Kept: Send + Sync {
    /// Whether it was woken and left unpolled since before tick `tick`
    /// minus its patience ([`KEPT_TICKS`] at first).
    fn kept_at(&self, tick: u64) -> bool;
    /// Drops the acquisition, unless it was polled since it was found kept.
    fn give_up(&self, tick: u64);
}

impl<F: Future + Send + 'static> Kept for Watch<F> {
    fn kept_at(&self, tick: u64) -> bool {
        let woken_at = self.woken_at.load(Ordering::Acquire);
        let patience = self.patience.load(Ordering::Relaxed);
        woken_at != 0 && tick.saturating_sub(woken_at) >= patience
    }

    fn give_up(&self, tick: u64) {
        let mut future = match self.future.try_lock() {
            Ok(future) => future,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            // Being polled right now.
            Err(std::sync::TryLockError::WouldBlock) => return,
        };
        if !self.kept_at(tick) {
            return;
        }
        // Dropped under the lock: a poll that comes meanwhile starts over
        // only once everything this one held has been let go. Then it is
        // no longer a kept acquisition, only a caller's future.
        self.woken_at.store(0, Ordering::Release);
        if future.take().is_some() {
            let patience = self.patience.load(Ordering::Relaxed);
            self.patience
                .store(patience.saturating_mul(2), Ordering::Relaxed);
            crate::observe::kept_acquisition_dropped(&self.key);
        }
    }
}

/// How many lists the acquisitions in flight are spread over, so that
/// tasks on different threads seldom meet on one mutex.
const LISTS: usize = 8;

/// Where an acquisition is listed: its list, and its place there.
#[derive(Clone, Copy)]
pub(crate) struct Listed(usize, usize);

/// One list of acquisitions in flight, on cache lines of its own.
#[repr(align(128))]
#[derive(Default)]
struct List(Mutex<Places>);

#[derive(Default)]
struct Places {
    taken: Vec<Option<Arc<dyn Kept>>>,
    free: Vec<usize>,
}

impl List {
    fn places(&self) -> MutexGuard<'_, Places> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The acquisitions in flight that one watch looks at, and the watch's
/// state: lock-core's, shared by every client without a runtime of its own,
/// or a client's, run on the runtime it was given.
pub(crate) struct Watcher {
    lists: [List; LISTS],
    /// Whether a watch runs.
    watching: AtomicBool,
    /// The watch's ticks so far, from 1 (0 means "not woken"). Only a
    /// running watch counts them, and one runs while any acquisition is in
    /// flight.
    ticks: AtomicU64,
    /// Where the watch runs.
    spawner: Spawner,
}

impl Watcher {
    /// The watcher of a client whose background work `spawner` runs.
    pub(crate) fn of(spawner: &Spawner) -> Arc<Watcher> {
        if !spawner.is_users() {
            return Watcher::ours().clone();
        }
        Arc::new(Watcher::new(spawner.clone()))
    }

    /// lock-core's, on its own runtime.
    pub(crate) fn ours() -> &'static Arc<Watcher> {
        static OURS: OnceLock<Arc<Watcher>> = OnceLock::new();
        OURS.get_or_init(|| Arc::new(Watcher::new(Spawner::default())))
    }

    fn new(spawner: Spawner) -> Watcher {
        Watcher {
            lists: Default::default(),
            watching: AtomicBool::new(false),
            ticks: AtomicU64::new(1),
            spawner,
        }
    }

    fn ticks(&self) -> u64 {
        self.ticks.load(Ordering::Acquire)
    }

    /// Lists an acquisition in flight, and starts the watch if none runs.
    fn list(self: &Arc<Self>, watch: Arc<dyn Kept>) -> Listed {
        // Spread by address: one acquisition's memory, one list.
        let list = (Arc::as_ptr(&watch).cast::<u8>() as usize >> 7) % LISTS;
        let place = {
            let mut places = self.lists[list].places();
            match places.free.pop() {
                Some(place) => {
                    places.taken[place] = Some(watch);
                    place
                }
                None => {
                    places.taken.push(Some(watch));
                    places.taken.len() - 1
                }
            }
        };
        // A load first: while a watch runs (nearly always, under load) no
        // acquisition writes the flag every thread reads.
        if !self.watching.load(Ordering::Acquire) && !self.watching.swap(true, Ordering::AcqRel) {
            self.start_watch();
        }
        Listed(list, place)
    }

    fn unlist(&self, Listed(list, place): Listed) {
        let mut places = self.lists[list].places();
        if let Some(taken) = places.taken.get_mut(place).and_then(Option::take) {
            places.free.push(place);
            // Its memory is freed by the task that made it, not under the lock.
            drop(places);
            drop(taken);
        }
    }

    fn start_watch(self: &Arc<Self>) {
        if self.spawner.is_users() {
            // Dropped unfinished with its runtime, it goes on on ours.
            let watcher = self.clone();
            return self
                .spawner
                .spawn_must("lock-core.kept", move || watch_kept(watcher.clone()));
        }
        let runtime = background::handle()
            .cloned()
            .or_else(|| tokio::runtime::Handle::try_current().ok());
        match runtime {
            Some(runtime) => drop(runtime.spawn(watch_kept(self.clone()))),
            // Nowhere to wait: the next acquisition inside a runtime starts it.
            None => self.watching.store(false, Ordering::Release),
        }
    }

    /// How many acquisitions are in flight, and those found kept at `tick`.
    fn look(&self, tick: u64) -> (usize, Vec<Arc<dyn Kept>>) {
        let mut in_flight = 0;
        let mut kept = Vec::new();
        for list in &self.lists {
            let places = list.places();
            in_flight += places.taken.len() - places.free.len();
            kept.extend(
                places
                    .taken
                    .iter()
                    .flatten()
                    .filter(|watch| watch.kept_at(tick))
                    .cloned(),
            );
        }
        (in_flight, kept)
    }
}

/// Every [`TICK`], drops the acquisitions woken and left unpolled for
/// [`KEPT`]; ends after [`IDLE_TICKS`] with none in flight.
async fn watch_kept(watcher: Arc<Watcher>) {
    let mut idle = 0;
    loop {
        tokio::time::sleep(TICK).await;
        let tick = watcher.ticks.fetch_add(1, Ordering::AcqRel) + 1;
        let (in_flight, kept) = watcher.look(tick);
        for watch in kept {
            watch.give_up(tick);
        }
        idle = if in_flight == 0 { idle + 1 } else { 0 };
        if idle < IDLE_TICKS {
            continue;
        }
        watcher.watching.store(false, Ordering::Release);
        // An acquisition listed as the watch ended would go unwatched:
        // watch on if one came.
        if watcher.look(tick).0 == 0 || watcher.watching.swap(true, Ordering::AcqRel) {
            return;
        }
        idle = 0;
    }
}

/// Each thread keeps the allocations of its last few finished acquisitions
/// for the next ones: an acquisition's state is a few kilobytes, more than
/// the allocator's per-thread cache takes, and a fresh allocation of that
/// size for every lock cost more than the rest of the watch together.
mod spare {
    use std::any::Any;
    use std::cell::RefCell;
    use std::future::Future;
    use std::pin::Pin;

    /// Spare allocations on one thread, at most (a few kilobytes each).
    const SPARES: usize = 8;

    thread_local! {
        static SPARE: RefCell<Vec<Box<dyn Any>>> = const { RefCell::new(Vec::new()) };
    }

    /// `future`, in the spare allocation of its kind if this thread has one.
    pub(super) fn boxed<F: Future + 'static>(future: F) -> Pin<Box<F>> {
        let spare = SPARE
            .try_with(|spare| {
                let mut spare = spare.try_borrow_mut().ok()?;
                let at = spare.iter().rposition(|s| s.is::<Pin<Box<F>>>())?;
                spare.swap_remove(at).downcast::<Pin<Box<F>>>().ok()
            })
            .ok()
            .flatten();
        match spare {
            Some(mut spare) => {
                spare.as_mut().set(future);
                *spare
            }
            None => Box::pin(future),
        }
    }

    /// Keeps the allocation of a finished acquisition for the next one.
    pub(super) fn keep<F: Future + 'static>(done: Pin<Box<F>>) {
        // (A model test's acquisitions hold loom's primitives, which must
        // not outlive the model.)
        if cfg!(all(test, lock_core_loom)) {
            return;
        }
        let _ = SPARE.try_with(|spare| {
            if let Ok(mut spare) = spare.try_borrow_mut()
                && spare.len() < SPARES
            {
                spare.push(Box::new(done));
            }
        });
    }
}

/// Model tests of a kept acquisition's watch, with loom: the caller
/// polling, the acquisition's reply waking it, and lock-core's thread
/// giving it up, run through every interleaving of their steps. An
/// acquisition is given up only once woken and unpolled, never while it is
/// polled; a caller that polls again gets an answer, from the acquisition
/// or from its new start. `scripts/test` runs them:
/// `RUSTFLAGS="--cfg lock_core_loom" cargo test -p lock-core --lib model::`.
#[cfg(all(test, lock_core_loom))]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod model {
    use super::*;
    use loom::sync::atomic::AtomicBool;
    use std::sync::atomic::AtomicUsize;

    /// An acquisition that ends once its reply is in; its start number is
    /// its answer. Dropped unfinished, it says whether its reply was in.
    struct Acquisition {
        start: usize,
        reply: Arc<(AtomicBool, sync::AtomicWaker)>,
        done: bool,
        dropped_unfinished: Arc<Mutex<Vec<(usize, bool)>>>,
    }

    impl Future for Acquisition {
        type Output = usize;

        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<usize> {
            sync::register(&self.reply.1, cx.waker());
            if self.reply.0.load(Ordering::Acquire) {
                self.done = true;
                return Poll::Ready(self.start);
            }
            Poll::Pending
        }
    }

    impl Drop for Acquisition {
        fn drop(&mut self) {
            if !self.done {
                let replied = self.reply.0.load(Ordering::Acquire);
                let mut dropped = self.dropped_unfinished.lock().unwrap();
                dropped.push((self.start, replied));
            }
        }
    }

    #[test]
    fn a_woken_acquisition_is_given_up_only_unpolled_and_its_caller_gets_an_answer() {
        loom::model(|| {
            let reply = Arc::new((AtomicBool::new(false), sync::AtomicWaker::new()));
            let dropped = Arc::new(Mutex::new(Vec::new()));
            let starts = AtomicUsize::new(0);
            let mut acquisition = Box::pin(watched(
                Watcher::ours(),
                "k".into(),
                Instant::now(),
                KEPT,
                {
                    let (reply, dropped) = (reply.clone(), dropped.clone());
                    move |_| {
                        let start = starts.fetch_add(1, Ordering::Relaxed) + 1;
                        // A start after a give-up finds its reply in at once.
                        Acquisition {
                            start,
                            reply: reply.clone(),
                            done: false,
                            dropped_unfinished: dropped.clone(),
                        }
                    }
                },
            ));
            let waker = futures::task::noop_waker();
            let first = acquisition.as_mut().poll(&mut Context::from_waker(&waker));
            assert!(first.is_pending(), "no reply yet");
            let replier = loom::thread::spawn({
                let reply = reply.clone();
                move || {
                    reply.0.store(true, Ordering::Release);
                    reply.1.wake();
                }
            });
            let watch = acquisition.watch.clone();
            // Long past any wake-up.
            let giver = loom::thread::spawn(move || watch.give_up(u64::MAX / 2));
            let answer = loom::future::block_on(acquisition.as_mut());
            replier.join().unwrap();
            giver.join().unwrap();
            drop(acquisition);
            let dropped = dropped.lock().unwrap();
            match answer {
                // Answered by its first start: nothing was given up.
                1 => assert!(dropped.is_empty(), "{dropped:?}"),
                // Given up once woken by its reply, then started again.
                2 => assert_eq!(*dropped, [(1, true)]),
                other => panic!("start {other}"),
            }
        });
    }
}
