//! Exclusion soak of the lock kinds beyond one exclusive key, as
//! `soak.rs` does for the plain lock: 16 workers over 4 clients (four
//! processes' view of one Redis server), many short critical sections, clean
//! and under faults.
//!
//! - Several keys (`lock_all`): transfers between two of 6 accounts, in
//!   random order, whose balances live on a separate redis-server and are
//!   read, paused over and written back (non-atomic: two holders of an
//!   account at once would lose or make money). Also on a 5-server Redlock
//!   with a minority failing.
//! - Shared and exclusive holders of one key: 12 readers and 4 writers;
//!   every writer must get through its rounds while readers keep coming.
//! - Permits: 16 workers on 3 permits, two of which now and then crash
//!   holding a permit that nothing renews or releases.
//!
//! Every critical section is watched by a [`Room`], which records every
//! entry that breaks the kind's rule. Under faults a lease can run out
//! mid-section (a client cut off longer than the ttl); another holder may
//! then come in, and the holder that was there must know by the time it
//! leaves ([`LockGuard::is_lost`]). Such an entry is excused; any other is a
//! violation. A transfer whose lock is known lost before the write is
//! abandoned, as a careful user would.
//!
//! Each run is a fixed number of rounds, bounded in time. Their figures
//! (sections, locks lost inside, overlaps, faults) show with `--nocapture`.

use lock_core::{LockClient, LockError, LockGuard, LockOptions};
use lock_testkit::{Proxy, ProxyMode, RedisServer, start_servers};
use rand::RngExt;
use std::collections::{BTreeMap, HashSet};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

const WORKERS: usize = 16;
const CLIENTS: usize = 4;
const PREFIX: &str = "soak-kinds:";
/// The bound of one run: a lock that hangs fails the test instead.
const BOUND: Duration = Duration::from_secs(45);
/// How long one acquisition may wait.
const WAIT: Duration = Duration::from_secs(20);
/// The pause inside an ordinary section.
const SHORT: Duration = Duration::from_millis(1);

/// Prints one run's figures under the test's name (shown with
/// `--nocapture`).
fn report(figures: std::fmt::Arguments<'_>) {
    let thread = std::thread::current();
    eprintln!("{}: {figures}", thread.name().unwrap_or("soak"));
}

// ---------------------------------------------------------------------------
// Who is inside a critical section
// ---------------------------------------------------------------------------

/// Who may be inside a critical section together.
#[derive(Clone, Copy)]
enum Rule {
    /// One holder at a time.
    Exclusive,
    /// Any number of readers, or one writer alone.
    ReadWrite,
    /// At most this many holders.
    Permits(usize),
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    Reader,
    Writer,
}

struct Holder {
    id: u64,
    role: Role,
    /// For a crashed holder, which never leaves: the end of its lease's
    /// validity, after which it no longer counts.
    until: Option<Instant>,
}

/// An entry that broke the rule: at least `need` of the holders already
/// inside (`earlier`) must have known their lock lost when they left.
struct Intrusion {
    earlier: Vec<u64>,
    need: usize,
}

#[derive(Default)]
struct RoomState {
    next: u64,
    inside: Vec<Holder>,
    most: usize,
    most_writers: usize,
    intrusions: Vec<Intrusion>,
    left_lost: HashSet<u64>,
}

struct Room {
    rule: Rule,
    state: Mutex<RoomState>,
}

/// What a [`Room`] saw.
#[derive(Debug)]
struct Seen {
    /// The most holders inside at once.
    most: usize,
    /// The most writers inside at once.
    most_writers: usize,
    /// Entries that broke the rule.
    intrusions: usize,
    /// Of those, the ones no earlier holder's lost lock accounts for.
    unexcused: usize,
}

impl Room {
    fn new(rule: Rule) -> Room {
        Room {
            rule,
            state: Mutex::new(RoomState::default()),
        }
    }

    fn state(&self) -> MutexGuard<'_, RoomState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Comes in, just after the lock was granted.
    fn enter(&self, role: Role) -> u64 {
        self.admit(role, None)
    }

    /// A holder that crashed inside: it stays until `until`, the end of its
    /// lease's validity by the local clock (before the server's expiry).
    fn enter_crashed(&self, role: Role, until: Instant) {
        self.admit(role, Some(until));
    }

    fn admit(&self, role: Role, until: Option<Instant>) -> u64 {
        let mut state = self.state();
        let now = Instant::now();
        state
            .inside
            .retain(|h| h.until.is_none_or(|until| until > now));
        let conflicting = |h: &&Holder| match self.rule {
            Rule::ReadWrite => role == Role::Writer || h.role == Role::Writer,
            Rule::Exclusive | Rule::Permits(_) => true,
        };
        let earlier: Vec<u64> = state
            .inside
            .iter()
            .filter(conflicting)
            .map(|h| h.id)
            .collect();
        let need = match self.rule {
            Rule::Exclusive | Rule::ReadWrite => earlier.len(),
            Rule::Permits(n) => (earlier.len() + 1).saturating_sub(n),
        };
        if need > 0 {
            state.intrusions.push(Intrusion { earlier, need });
        }
        let id = state.next;
        state.next += 1;
        state.inside.push(Holder { id, role, until });
        state.most = state.most.max(state.inside.len());
        let writers = state.inside.iter().filter(|h| h.role == Role::Writer);
        state.most_writers = state.most_writers.max(writers.count());
        id
    }

    /// Leaves, saying whether the lock was known lost by then. `lost` is
    /// asked under the room's lock: any holder that came in while this one
    /// was inside came in before the question, so if it was let in because
    /// this lease ran out, the answer must be yes.
    fn leave(&self, id: u64, lost: impl FnOnce() -> bool) -> bool {
        let mut state = self.state();
        state.inside.retain(|h| h.id != id);
        let lost = lost();
        if lost {
            state.left_lost.insert(id);
        }
        lost
    }

    fn seen(&self) -> Seen {
        let state = self.state();
        let excused = |i: &&Intrusion| {
            let lost = i.earlier.iter().filter(|id| state.left_lost.contains(id));
            lost.count() >= i.need
        };
        Seen {
            most: state.most,
            most_writers: state.most_writers,
            intrusions: state.intrusions.len(),
            unexcused: state.intrusions.iter().filter(|i| !excused(i)).count(),
        }
    }
}

// ---------------------------------------------------------------------------
// What the workers did
// ---------------------------------------------------------------------------

#[derive(Default)]
struct Tally {
    /// Sections done (crashes are none).
    sections: AtomicUsize,
    /// Sections whose lock was known lost when they left.
    lost_inside: AtomicUsize,
    /// Transfers abandoned: the lock was known lost before the write.
    abandoned: AtomicUsize,
    /// Sections that wrote, and found the lock lost only afterwards.
    lost_after_write: AtomicUsize,
    /// Acquisitions that failed (and were tried again), by kind.
    failed: Mutex<BTreeMap<String, usize>>,
}

impl Tally {
    fn failure(&self, error: &LockError) {
        let mut failed = self.failed.lock().unwrap();
        *failed.entry(format!("{:?}", error.kind())).or_default() += 1;
    }

    fn failures(&self) -> BTreeMap<String, usize> {
        self.failed.lock().unwrap().clone()
    }

    fn section(&self, lost: bool) {
        self.sections.fetch_add(1, Ordering::SeqCst);
        if lost {
            self.lost_inside.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn get(count: &AtomicUsize) -> usize {
        count.load(Ordering::SeqCst)
    }
}

impl std::fmt::Display for Tally {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} sections, {} with the lock lost inside ({} writes abandoned, {} lost after \
             writing), failed acquisitions {:?}",
            Tally::get(&self.sections),
            Tally::get(&self.lost_inside),
            Tally::get(&self.abandoned),
            Tally::get(&self.lost_after_write),
            self.failures(),
        )
    }
}

/// How the workers of one run behave.
#[derive(Clone, Copy)]
struct Plan {
    ttl: Duration,
    /// One section in this many holds for longer than the ttl (renewed by
    /// the heartbeat), so that a fault can make it lose the lock inside.
    long_one_in: Option<u32>,
}

impl Plan {
    fn clean() -> Plan {
        Plan {
            ttl: Duration::from_secs(2),
            long_one_in: None,
        }
    }

    fn faulty() -> Plan {
        Plan {
            ttl: Duration::from_secs(1),
            long_one_in: Some(25),
        }
    }

    /// How long the next section pauses inside.
    fn pause(&self) -> Duration {
        let long = self
            .long_one_in
            .is_some_and(|n| rand::rng().random_range(0..n) == 0);
        if long {
            self.ttl + Duration::from_millis(200)
        } else {
            SHORT
        }
    }
}

/// The clients of a run, one per process, and how many long sections the
/// workers of each are inside: where a long fault makes a lease run out
/// mid-section.
struct Fleet {
    clients: Vec<Arc<LockClient>>,
    long_inside: Vec<AtomicUsize>,
}

impl Fleet {
    /// One client per entry of `servers`: the URLs it locks on (several
    /// for Redlock).
    async fn connect(servers: Vec<Vec<String>>) -> Arc<Fleet> {
        let mut clients = Vec::new();
        for urls in &servers {
            let client = LockClient::builder()
                .urls(urls.clone())
                .key_prefix(PREFIX)
                .operation_timeout(Duration::from_millis(500))
                .node_timeout(Duration::from_millis(100))
                .build()
                .await
                .unwrap();
            clients.push(Arc::new(client));
        }
        let long_inside = servers.iter().map(|_| AtomicUsize::new(0)).collect();
        Arc::new(Fleet {
            clients,
            long_inside,
        })
    }

    /// `CLIENTS` clients of one server.
    async fn on(server: &RedisServer) -> Arc<Fleet> {
        Fleet::connect(vec![vec![server.url()]; CLIENTS]).await
    }

    /// The client of `worker`.
    fn client(&self, worker: usize) -> &LockClient {
        &self.clients[worker % self.clients.len()]
    }

    /// Pauses inside a section of `worker`.
    async fn pause(&self, worker: usize, pause: Duration) {
        let long = &self.long_inside[worker % self.clients.len()];
        let is_long = pause > SHORT;
        if is_long {
            long.fetch_add(1, Ordering::SeqCst);
        }
        tokio::time::sleep(pause).await;
        if is_long {
            long.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// A client whose workers are inside a long section now, if any.
    fn holding_long(&self) -> Option<usize> {
        (0..self.clients.len()).find(|&i| self.long_inside[i].load(Ordering::SeqCst) > 0)
    }
}

/// Takes a lock with `take`, again after every failure (under faults a
/// whole wait can fail), counting the failures.
async fn acquire<F, Fut>(tally: &Tally, mut take: F) -> LockGuard
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<LockGuard, LockError>>,
{
    loop {
        match take().await {
            Ok(guard) => return guard,
            Err(e) => tally.failure(&e),
        }
    }
}

/// One worker's section of `role` in `room` under `guard`.
struct Section<'a> {
    fleet: &'a Fleet,
    worker: usize,
    room: &'a Room,
    tally: &'a Tally,
}

impl Section<'_> {
    /// Goes in, pauses, comes out.
    async fn hold(&self, role: Role, guard: &LockGuard, pause: Duration) {
        let id = self.room.enter(role);
        self.fleet.pause(self.worker, pause).await;
        self.tally.section(self.room.leave(id, || guard.is_lost()));
    }
}

/// Waits for `tasks`, at most [`BOUND`].
async fn join_bounded<T>(what: &str, tasks: Vec<tokio::task::JoinHandle<T>>) -> Vec<T> {
    let all = futures::future::join_all(tasks);
    let done = tokio::time::timeout(BOUND, all).await;
    let done = done.unwrap_or_else(|_| panic!("{what}: not done within {BOUND:?}"));
    done.into_iter().map(|task| task.unwrap()).collect()
}

// ---------------------------------------------------------------------------
// Faults
// ---------------------------------------------------------------------------

/// A lock server behind one proxy per client: each client's network can
/// fail on its own.
struct Rig {
    server: RedisServer,
    proxies: Vec<Proxy>,
}

impl Rig {
    fn start() -> Arc<Rig> {
        let server = RedisServer::start();
        let proxies = (0..CLIENTS).map(|_| Proxy::start(server.addr())).collect();
        Arc::new(Rig { server, proxies })
    }

    /// Each client's URL: a proxy of its own.
    fn urls(&self) -> Vec<Vec<String>> {
        self.proxies.iter().map(|p| vec![p.url()]).collect()
    }

    /// One fault, then a short calm. Most are shorter than the ttl (the
    /// leases survive them); some cut a client off for longer, often one
    /// whose worker is inside a long section: its lease runs out there.
    fn fault(&self, rng: &mut rand::rngs::ThreadRng, fleet: &Fleet, ttl: Duration) {
        let random = rng.random_range(0..self.proxies.len());
        let blackhole = |proxy: &Proxy, time: Duration, then_cut: bool| {
            proxy.set_mode(ProxyMode::Blackhole);
            std::thread::sleep(time);
            if then_cut {
                proxy.cut(); // what was held back is discarded
            }
            proxy.set_mode(ProxyMode::Pass); // or delivered late
        };
        let long = ttl + Duration::from_millis(400);
        if let Some(busy) = fleet.holding_long()
            && rng.random_bool(0.5)
        {
            blackhole(&self.proxies[busy], long, rng.random());
        } else {
            let proxy = &self.proxies[random];
            match rng.random_range(0..5) {
                0 => proxy.cut(),
                1 => blackhole(proxy, Duration::from_millis(300), rng.random()),
                2 => {
                    proxy.set_mode(ProxyMode::Delay(Duration::from_millis(20)));
                    std::thread::sleep(Duration::from_millis(200));
                    proxy.set_mode(ProxyMode::Pass);
                }
                3 => {
                    let _paused = self.server.pause();
                    std::thread::sleep(Duration::from_millis(300));
                }
                _ => blackhole(proxy, long, rng.random()),
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Sets its flag when dropped: the fault injector stops when the run ends,
/// also when it fails (a runtime waits for its blocking tasks to end).
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Runs `run` while a thread of its own injects `fault` after `fault`.
async fn with_faults<T>(
    mut fault: impl FnMut(&mut rand::rngs::ThreadRng) + Send + 'static,
    run: impl Future<Output = T>,
) -> T {
    let stop = Arc::new(AtomicBool::new(false));
    let injector = {
        let stop = stop.clone();
        tokio::task::spawn_blocking(move || {
            let mut rng = rand::rng();
            let mut injected = 0;
            while !stop.load(Ordering::SeqCst) {
                fault(&mut rng);
                injected += 1;
            }
            injected
        })
    };
    let stopping = StopOnDrop(stop);
    let out = run.await;
    drop(stopping);
    let injected = injector.await.unwrap();
    assert!(injected > 0, "no fault was injected");
    report(format_args!("{injected} faults injected"));
    out
}

/// Runs `run` under faults of `rig` (see [`Rig::fault`]).
async fn on_rig<T>(
    rig: &Arc<Rig>,
    fleet: &Arc<Fleet>,
    ttl: Duration,
    run: impl Future<Output = T>,
) -> T {
    let (rig, fleet) = (rig.clone(), fleet.clone());
    with_faults(move |rng| rig.fault(rng, &fleet, ttl), run).await
}

// ---------------------------------------------------------------------------
// Several keys: transfers between accounts
// ---------------------------------------------------------------------------

const ACCOUNTS: usize = 6;
const OPENING: i64 = 1000;

fn account(i: usize) -> String {
    format!("acct:{i}")
}

/// The balances, on a server of their own; who is inside each account;
/// the ledger of the transfers written: what each balance must come to.
struct Bank {
    conn: redis::aio::MultiplexedConnection,
    rooms: Vec<Room>,
    ledger: Mutex<Vec<i64>>,
}

impl Bank {
    async fn open(server: &RedisServer) -> Bank {
        let mut conn = redis::Client::open(server.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let mut mset = redis::cmd("MSET");
        for i in 0..ACCOUNTS {
            mset.arg(account(i)).arg(OPENING);
        }
        mset.query_async::<()>(&mut conn).await.unwrap();
        Bank {
            conn,
            rooms: (0..ACCOUNTS).map(|_| Room::new(Rule::Exclusive)).collect(),
            ledger: Mutex::new(vec![OPENING; ACCOUNTS]),
        }
    }

    async fn balances(&self) -> Vec<i64> {
        let mut mget = redis::cmd("MGET");
        for i in 0..ACCOUNTS {
            mget.arg(account(i));
        }
        mget.query_async(&mut self.conn.clone()).await.unwrap()
    }
}

/// Two distinct accounts in random order, an amount, a pause.
fn pick(plan: &Plan) -> (usize, usize, i64, Duration) {
    let mut rng = rand::rng();
    let from = rng.random_range(0..ACCOUNTS);
    let to = (from + rng.random_range(1..ACCOUNTS)) % ACCOUNTS;
    (from, to, rng.random_range(1..=50), plan.pause())
}

/// One worker: `rounds` transfers, each under `lock_all` of both accounts:
/// read both balances, pause, write both back (unless the lock is known
/// lost by then).
async fn transfers(
    fleet: Arc<Fleet>,
    worker: usize,
    bank: Arc<Bank>,
    tally: Arc<Tally>,
    plan: Plan,
    rounds: usize,
) {
    let mut conn = bank.conn.clone();
    for _ in 0..rounds {
        let (from, to, amount, pause) = pick(&plan);
        let keys = [account(from), account(to)];
        let names = [keys[0].as_str(), keys[1].as_str()];
        let options = LockOptions::new(plan.ttl).wait(WAIT);
        let client = fleet.client(worker);
        let guard = acquire(&tally, || client.lock_all(&names, options.clone())).await;
        let ids = [from, to].map(|i| bank.rooms[i].enter(Role::Writer));
        let (a, b): (i64, i64) = redis::cmd("MGET")
            .arg(&keys)
            .query_async(&mut conn)
            .await
            .unwrap();
        fleet.pause(worker, pause).await;
        let wrote = !guard.is_lost();
        if wrote {
            let mut mset = redis::cmd("MSET");
            mset.arg(&keys[0])
                .arg(a - amount)
                .arg(&keys[1])
                .arg(b + amount);
            mset.query_async::<()>(&mut conn).await.unwrap();
            let mut ledger = bank.ledger.lock().unwrap();
            ledger[from] -= amount;
            ledger[to] += amount;
        } else {
            tally.abandoned.fetch_add(1, Ordering::SeqCst);
        }
        let mut lost = false;
        for (i, id) in [from, to].into_iter().zip(ids) {
            lost |= bank.rooms[i].leave(id, || guard.is_lost());
        }
        tally.section(lost);
        if lost && wrote {
            tally.lost_after_write.fetch_add(1, Ordering::SeqCst);
        }
        let _ = guard.release().await;
    }
}

/// `WORKERS` transfer workers, `rounds` each. Checks what a user would: no
/// account had two holders at once unless the earlier one knew its lock
/// lost, and no money was lost or made. Returns the tally and how many
/// entries overlapped a holder whose lock had run out.
async fn several_keys(fleet: Arc<Fleet>, plan: Plan, rounds: usize) -> (Arc<Tally>, usize) {
    let balances = RedisServer::start();
    let bank = Arc::new(Bank::open(&balances).await);
    let tally = Arc::new(Tally::default());
    let tasks = (0..WORKERS)
        .map(|w| {
            let run = transfers(fleet.clone(), w, bank.clone(), tally.clone(), plan, rounds);
            tokio::spawn(run)
        })
        .collect();
    join_bounded("the transfers", tasks).await;

    let seen: Vec<Seen> = bank.rooms.iter().map(Room::seen).collect();
    let overlaps: usize = seen.iter().map(|s| s.intrusions).sum();
    report(format_args!(
        "{tally}; {overlaps} overlaps after a lost lock"
    ));
    for (i, seen) in seen.iter().enumerate() {
        assert_eq!(
            seen.unexcused, 0,
            "account {i}: two holders at once: {seen:?}"
        );
    }
    assert_eq!(Tally::get(&tally.sections), WORKERS * rounds);
    // A transfer written before its lock was known lost may have raced
    // another: only then can the money be off.
    if Tally::get(&tally.lost_after_write) == 0 {
        let balances = bank.balances().await;
        let total: i64 = balances.iter().sum();
        assert_eq!(
            total,
            OPENING * ACCOUNTS as i64,
            "money was lost or made: {balances:?}"
        );
        let ledger = bank.ledger.lock().unwrap().clone();
        assert_eq!(
            balances, ledger,
            "the balances differ from the transfers written"
        );
    }
    (tally, overlaps)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_keys_clean() {
    let server = RedisServer::start();
    let fleet = Fleet::on(&server).await;
    let (tally, overlaps) = several_keys(fleet, Plan::clean(), 30).await;
    assert_eq!(overlaps, 0, "an account had two holders at once");
    assert_eq!(Tally::get(&tally.lost_inside), 0);
    assert!(tally.failures().is_empty(), "{tally}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_keys_under_faults() {
    let rig = Rig::start();
    let fleet = Fleet::connect(rig.urls()).await;
    let plan = Plan::faulty();
    let run = several_keys(fleet.clone(), plan, 20);
    on_rig(&rig, &fleet, plan.ttl, run).await;
}

/// Redlock on 5 servers, each behind a proxy, while a minority fails as in
/// `soak.rs`: one server stopped (its data lost), another frozen for
/// longer than the ttl, every connection to a third cut; the stopped one
/// comes back empty once every lease it took part in has expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_keys_on_redlock_under_faults_of_a_minority() {
    let servers = start_servers(5);
    let proxies: Vec<Proxy> = servers.iter().map(|s| Proxy::start(s.addr())).collect();
    let urls: Vec<String> = proxies.iter().map(Proxy::url).collect();
    let fleet = Fleet::connect(vec![urls; CLIENTS]).await;
    let plan = Plan {
        ttl: Duration::from_secs(1),
        long_one_in: None,
    };
    let ttl = plan.ttl;
    let mut servers = servers;
    let fault = move |rng: &mut rand::rngs::ThreadRng| {
        let a = rng.random_range(0..5);
        let b = (a + rng.random_range(1..5)) % 5;
        let c = rng.random_range(0..5);
        servers[a].stop();
        {
            let _paused = servers[b].pause();
            proxies[c].cut();
            std::thread::sleep(ttl + Duration::from_millis(200));
        }
        std::thread::sleep(ttl / 2);
        servers[a].restart();
        std::thread::sleep(Duration::from_millis(200));
    };
    with_faults(fault, several_keys(fleet, plan, 30)).await;
}

// ---------------------------------------------------------------------------
// Shared and exclusive holders of one key
// ---------------------------------------------------------------------------

const WRITERS: usize = 4;
/// Reader sections before the writers start: they come into a key that
/// readers keep busy.
const READERS_FIRST: usize = 30;

/// One writer: `rounds` exclusive sections, a little apart (readers come
/// in between); returns its longest wait for the lock, failed attempts
/// included.
async fn writer(section: Section<'_>, plan: Plan, rounds: usize) -> Duration {
    let mut longest = Duration::ZERO;
    for _ in 0..rounds {
        let asked = Instant::now();
        let options = LockOptions::new(plan.ttl).wait(WAIT);
        let client = section.fleet.client(section.worker);
        let guard = acquire(section.tally, || client.lock_with("doc", options.clone())).await;
        longest = longest.max(asked.elapsed());
        section.hold(Role::Writer, &guard, plan.pause()).await;
        let _ = guard.release().await;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    longest
}

/// One reader: shared sections, one after another, until `done`.
async fn reader(section: Section<'_>, plan: Plan, done: &AtomicBool, count: &watch::Sender<usize>) {
    while !done.load(Ordering::SeqCst) {
        let options = LockOptions::new(plan.ttl).shared(true).wait(WAIT);
        let client = section.fleet.client(section.worker);
        let guard = acquire(section.tally, || client.lock_with("doc", options.clone())).await;
        section.hold(Role::Reader, &guard, plan.pause()).await;
        let _ = guard.release().await;
        count.send_modify(|n| *n += 1);
    }
}

/// What the readers and the writers of one run did.
struct ReadWrite {
    readers: Arc<Tally>,
    writers: Arc<Tally>,
    seen: Seen,
    longest_writer_wait: Duration,
}

/// 12 readers and 4 writers on one key; once the readers are busy, each
/// writer does `rounds` sections. Checks that no reader was inside with a
/// writer, nor two writers together, unless an earlier holder knew its lock
/// lost, and that every writer got through.
async fn shared_and_exclusive(fleet: Arc<Fleet>, plan: Plan, rounds: usize) -> ReadWrite {
    let room = Arc::new(Room::new(Rule::ReadWrite));
    let (readers, writers) = (Arc::new(Tally::default()), Arc::new(Tally::default()));
    let done = Arc::new(AtomicBool::new(false));
    let count = Arc::new(watch::channel(0).0);
    let reading: Vec<_> = (WRITERS..WORKERS)
        .map(|worker| {
            let (fleet, room, tally) = (fleet.clone(), room.clone(), readers.clone());
            let (done, count) = (done.clone(), count.clone());
            tokio::spawn(async move {
                let section = Section {
                    fleet: &fleet,
                    worker,
                    room: &room,
                    tally: &tally,
                };
                reader(section, plan, &done, &count).await;
            })
        })
        .collect();
    let mut busy = count.subscribe();
    busy.wait_for(|n| *n >= READERS_FIRST).await.unwrap();
    let before = Tally::get(&readers.sections);
    let started = Instant::now();
    let writing: Vec<_> = (0..WRITERS)
        .map(|worker| {
            let (fleet, room, tally) = (fleet.clone(), room.clone(), writers.clone());
            tokio::spawn(async move {
                let section = Section {
                    fleet: &fleet,
                    worker,
                    room: &room,
                    tally: &tally,
                };
                writer(section, plan, rounds).await
            })
        })
        .collect();
    let waits = join_bounded("the writers (starved?)", writing).await;
    let (took, meanwhile) = (started.elapsed(), Tally::get(&readers.sections) - before);
    done.store(true, Ordering::SeqCst);
    join_bounded("the readers", reading).await;

    let seen = room.seen();
    let longest_writer_wait = waits.into_iter().max().unwrap();
    report(format_args!(
        "writers done in {took:?} ({meanwhile} reader sections meanwhile), longest writer \
         wait {longest_writer_wait:?}; writers: {writers}; readers: {readers}; {seen:?}"
    ));
    assert_eq!(
        seen.unexcused, 0,
        "a reader beside a writer, or two writers"
    );
    assert_eq!(Tally::get(&writers.sections), WRITERS * rounds);
    assert!(meanwhile > 0, "no reader got in while the writers worked");
    ReadWrite {
        readers,
        writers,
        seen,
        longest_writer_wait,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_and_exclusive_clean() {
    let server = RedisServer::start();
    let fleet = Fleet::on(&server).await;
    let run = shared_and_exclusive(fleet, Plan::clean(), 50).await;
    assert_eq!(run.seen.intrusions, 0);
    assert!(run.seen.most > 1, "readers never shared the key");
    assert_eq!(run.seen.most_writers, 1);
    for tally in [run.readers, run.writers] {
        assert_eq!(Tally::get(&tally.lost_inside), 0);
        assert!(tally.failures().is_empty(), "{tally}");
    }
    assert!(
        run.longest_writer_wait < Duration::from_secs(2),
        "a writer waited {:?}",
        run.longest_writer_wait
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_and_exclusive_under_faults() {
    let rig = Rig::start();
    let fleet = Fleet::connect(rig.urls()).await;
    let plan = Plan::faulty();
    let run = shared_and_exclusive(fleet.clone(), plan, 15);
    on_rig(&rig, &fleet, plan.ttl, run).await;
}

// ---------------------------------------------------------------------------
// Permits
// ---------------------------------------------------------------------------

const PERMITS: u32 = 3;
/// The ttl of a permit taken by a worker that then crashes.
const CRASH_TTL: Duration = Duration::from_millis(500);

fn permit(ttl: Duration) -> LockOptions {
    LockOptions::new(ttl).permits(PERMITS).wait(WAIT)
}

/// One worker: `rounds` sections on a permit. At the rounds in `crashes`
/// it crashes instead: takes a permit nothing renews, and leaks it.
async fn permit_holder(section: Section<'_>, plan: Plan, rounds: usize, crashes: &[usize]) {
    let client = section.fleet.client(section.worker);
    for round in 0..rounds {
        if crashes.contains(&round) {
            let options = permit(CRASH_TTL).renew(false);
            let guard = acquire(section.tally, || client.lock_with("pool", options.clone())).await;
            section
                .room
                .enter_crashed(Role::Writer, Instant::now() + guard.remaining());
            std::mem::forget(guard);
            continue;
        }
        let guard = acquire(section.tally, || client.lock_with("pool", permit(plan.ttl))).await;
        section.hold(Role::Writer, &guard, plan.pause()).await;
        let _ = guard.release().await;
    }
}

/// 16 workers on 3 permits, `rounds` each, two of which crash twice
/// holding a permit: four leaks, one more than the permits, so the run ends
/// only if leaked permits come back. Checks that no more than 3 were inside
/// at once unless an earlier holder knew its lock lost.
async fn permits(fleet: Arc<Fleet>, plan: Plan, rounds: usize) -> (Arc<Tally>, Seen) {
    let room = Arc::new(Room::new(Rule::Permits(PERMITS as usize)));
    let tally = Arc::new(Tally::default());
    let tasks = (0..WORKERS)
        .map(|worker| {
            let (fleet, room, tally) = (fleet.clone(), room.clone(), tally.clone());
            let crashes = match worker {
                0 | 1 => vec![rounds / 3, 2 * rounds / 3],
                _ => vec![],
            };
            tokio::spawn(async move {
                let section = Section {
                    fleet: &fleet,
                    worker,
                    room: &room,
                    tally: &tally,
                };
                permit_holder(section, plan, rounds, &crashes).await;
            })
        })
        .collect();
    join_bounded("the permit holders", tasks).await;
    let seen = room.seen();
    report(format_args!("{tally}; {seen:?}"));
    assert_eq!(seen.unexcused, 0, "more than {PERMITS} holders at once");
    assert_eq!(Tally::get(&tally.sections), WORKERS * rounds - 2 * 2);
    (tally, seen)
}

/// Every permit is back, leaked ones included: 3 can be held at once, and
/// no more.
async fn all_permits_back(client: &LockClient) {
    let mut held = Vec::new();
    for _ in 0..PERMITS {
        let options = permit(Duration::from_secs(2)).wait(Duration::from_secs(5));
        let guard = client.lock_with("pool", options).await;
        held.push(guard.expect("a permit never came back"));
    }
    let fourth = client.lock_with("pool", permit(Duration::from_secs(2)).wait(Duration::ZERO));
    let refused = fourth.await.err().map(|e| e.kind());
    assert_eq!(
        refused,
        Some(lock_core::ErrorKind::Contended),
        "a fourth permit"
    );
    for guard in held {
        assert!(guard.release().await.unwrap());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_with_crashes_clean() {
    let server = RedisServer::start();
    let fleet = Fleet::on(&server).await;
    let (tally, seen) = permits(fleet.clone(), Plan::clean(), 25).await;
    all_permits_back(fleet.client(0)).await;
    assert_eq!(seen.intrusions, 0);
    assert_eq!(
        seen.most, PERMITS as usize,
        "the permits were never all in use"
    );
    assert_eq!(Tally::get(&tally.lost_inside), 0);
    assert!(tally.failures().is_empty(), "{tally}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_with_crashes_under_faults() {
    let rig = Rig::start();
    let fleet = Fleet::connect(rig.urls()).await;
    let plan = Plan::faulty();
    let run = permits(fleet.clone(), plan, 15);
    on_rig(&rig, &fleet, plan.ttl, run).await;
    all_permits_back(fleet.client(0)).await;
}
