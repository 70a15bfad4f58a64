//! Leader election in one process: several `LockClient`s, each standing
//! for a replica of a service, campaign on `redis-server`s of their own.
//! What a user of [`LockClient::campaign`], [`LockClient::lead`] and
//! [`LockClient::watch_leader`] notices: terms that only grow, a leader
//! that resigns followed within milliseconds, a crashed one at its lease's
//! expiry (not later), work dropped when the lease is lost, a watcher that
//! hears each change at once and costs about one read per lease meanwhile,
//! and a campaign that ends when Redis stays away.
//!
//! A crash is a leader whose client reaches Redis through a proxy that
//! starts dropping everything: no renewal and no release arrive, as when
//! its process dies. tests/leader_processes.rs kills real processes.
use crate::support::{build, client_with, slow_backoff, spawn_waiting, storage_key};
use futures::StreamExt;
use lock_core::{ErrorKind, Leadership, LockClient, LockClientBuilder, LockError, LockState};
use lock_testkit::{Proxy, ProxyMode, RedisServer, start_servers};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;

const PREFIX: &str = "leader:";
/// The election.
const KEY: &str = "scheduler";
/// A lease longer than any wait of these tests: only a release ends it
/// sooner.
const LONG: Duration = Duration::from_secs(10);
/// A resigning leader is followed within milliseconds: the campaigners
/// hear the release. This bound is far under what else could bring them
/// back (their backoff, 5 s, and the 10 s ttl) and leaves a loaded 2-core
/// machine room; the figures printed are a few milliseconds.
const HEARD: Duration = Duration::from_millis(100);
/// A crashed leader is followed at its lease's expiry: within 100 ms of
/// it, and 50 ms for a loaded machine (as in tests/leader_processes.rs).
const AT_EXPIRY: Duration = Duration::from_millis(150);
/// A watcher reports each change within this.
const WATCHED: Duration = Duration::from_millis(100);
/// An expiry read from `PTTL` (milliseconds) may be this much late: a
/// grant this much before it is rounding, not two leaders at once.
const ROUNDING: Duration = Duration::from_millis(2);

/// A replica named `name` (its holder name, as a watcher sees it). On
/// Redlock each server's answer is bounded by 100 ms (a frozen one costs
/// no more); one server ignores that bound.
fn replica(name: &str) -> LockClientBuilder {
    LockClient::builder()
        .key_prefix(PREFIX)
        .holder_name(name)
        .node_timeout(Duration::from_millis(100))
}

/// A client of `servers` (one, or Redlock's), built as `builder` says.
async fn client(servers: &[RedisServer], builder: LockClientBuilder) -> LockClient {
    client_with(servers, builder).await
}

/// A replica that only a release message, or the leader's expiry, can
/// bring back before 5 s: its backoff is 5 s.
fn patient(name: &str) -> LockClientBuilder {
    replica(name).backoff(slow_backoff())
}

/// A replica whose every connection goes through a proxy: cutting them
/// off is a crash, as Redis sees it.
struct Crashable {
    client: LockClient,
    proxies: Vec<Proxy>,
}

impl Crashable {
    async fn start(servers: &[RedisServer], builder: LockClientBuilder) -> Crashable {
        let proxies: Vec<Proxy> = servers.iter().map(|s| Proxy::start(s.addr())).collect();
        let builder = builder.urls(proxies.iter().map(Proxy::url));
        Crashable {
            client: build(builder, servers).await,
            proxies,
        }
    }

    fn crash(&self) {
        for proxy in &self.proxies {
            proxy.set_mode(ProxyMode::Blackhole);
        }
    }
}

/// When the election's lease expires, by the servers that answer (the
/// latest: a campaigner needs them all free when one of three is
/// frozen). Read right after a crash, it is the crashed lease's expiry.
fn expiry(servers: &[&RedisServer]) -> Instant {
    let key = storage_key(PREFIX, KEY);
    servers
        .iter()
        .map(|server| {
            let asked = Instant::now();
            let pttl: i64 = server.cmd(&["PTTL", &key]);
            asked + Duration::from_millis(u64::try_from(pttl.max(0)).unwrap())
        })
        .max()
        .unwrap()
}

/// Waits until the lease granted at `granted` has been renewed on the
/// `live` servers: it expires later than `ttl` after the grant.
async fn renewed(live: &[&RedisServer], granted: Instant, ttl: Duration) {
    let key = storage_key(PREFIX, KEY);
    let margin = ttl / 10;
    crate::support::eventually(ttl, "a renewal of the leader's lease", || {
        live.iter().all(|server| {
            let pttl: i64 = server.cmd(&["PTTL", &key]);
            let left = Duration::from_millis(u64::try_from(pttl.max(0)).unwrap());
            Instant::now() + left > granted + ttl + margin
        })
    })
    .await;
}

/// A campaign of `client`, spawned once it waits: the leader it is
/// returned with, and when `campaign` returned.
async fn campaigning(
    client: &LockClient,
    ttl: Duration,
) -> tokio::task::JoinHandle<(Leadership, Instant)> {
    let client = client.clone();
    spawn_waiting(async move {
        let leadership = client.campaign(KEY, ttl).await.unwrap();
        (leadership, Instant::now())
    })
    .await
}

#[tokio::test]
async fn terms_strictly_increase_from_leader_to_leader() {
    let server = [RedisServer::start()];
    successive_leaders(&server, &[&server[0]]).await;
    let servers = start_servers(3);
    successive_leaders(&servers, &servers.iter().collect::<Vec<_>>()).await;
}

/// Three replicas take turns: each leads, then resigns. The terms, in the
/// order the leaders were elected, only grow, also once the fence counter
/// is gone (it expires when no leader is elected for a while): deleted on
/// the `live` servers.
async fn successive_leaders(servers: &[RedisServer], live: &[&RedisServer]) {
    const TURNS: usize = 10;
    let (terms_tx, mut terms) = mpsc::unbounded_channel();
    let mut replicas = Vec::new();
    for name in ["a", "b", "c"] {
        let client = client(servers, replica(name)).await;
        let terms_tx = terms_tx.clone();
        replicas.push(tokio::spawn(async move {
            for _ in 0..TURNS {
                let leading = client.campaign(KEY, LONG).await.unwrap();
                // Sent before resigning: the next leader is elected after.
                terms_tx.send(leading.term()).unwrap();
                assert!(leading.resign().await.unwrap(), "it still led");
            }
        }));
    }
    drop(terms_tx);
    for replica in replicas {
        replica.await.unwrap();
    }
    let mut elected = Vec::new();
    while let Some(term) = terms.recv().await {
        elected.push(term);
    }
    assert_eq!(elected.len(), 3 * TURNS);
    assert!(
        elected.windows(2).all(|pair| pair[0] < pair[1]),
        "terms in the order of election: {elected:?}"
    );
    let fence = format!("{}:fence", storage_key(PREFIX, KEY));
    for server in live {
        let deleted: i64 = server.cmd(&["DEL", &fence]);
        assert_eq!(deleted, 1, "the fence counter is where it was expected");
    }
    let next = client(servers, replica("d")).await;
    let leading = next.campaign(KEY, LONG).await.unwrap();
    assert!(
        leading.term() > *elected.last().unwrap(),
        "after the counter expired, term {} follows {}",
        leading.term(),
        elected.last().unwrap()
    );
    leading.resign().await.unwrap();
}

#[tokio::test]
async fn a_resignation_is_followed_within_milliseconds() {
    let servers = [RedisServer::start()];
    let lags = resignations(&servers, 5).await;
    eprintln!("resignation to next leader, one server: {lags:?}");
}

/// `rounds` times, a leader resigns while a patient replica waits: the
/// next leader is elected within [`HEARD`]. The lags, in order.
async fn resignations(servers: &[RedisServer], rounds: usize) -> Vec<Duration> {
    let a = client(servers, patient("a")).await;
    let b = client(servers, patient("b")).await;
    let mut leader = a.campaign(KEY, LONG).await.unwrap();
    let mut lags = Vec::new();
    for round in 0..rounds {
        let next = if round % 2 == 0 { &b } else { &a };
        let follower = campaigning(next, LONG).await;
        let term = leader.term();
        let resigned = Instant::now();
        assert!(leader.resign().await.unwrap(), "it still led");
        let (next_leader, elected) = follower.await.unwrap();
        let lag = elected - resigned;
        assert!(
            lag < HEARD,
            "round {round}: elected {lag:?} after the resignation"
        );
        assert!(next_leader.term() > term);
        lags.push(lag);
        leader = next_leader;
    }
    leader.resign().await.unwrap();
    lags
}

/// Dropping a `Leadership` resigns in the background: a patient replica
/// is elected within [`HEARD`] of the drop, with a later term, on one
/// server and on Redlock.
#[tokio::test]
async fn a_dropped_leadership_is_followed_within_milliseconds() {
    let one = [RedisServer::start()];
    let three = start_servers(3);
    for servers in [&one[..], &three[..]] {
        let a = client(servers, patient("a")).await;
        let b = client(servers, patient("b")).await;
        let leader = a.campaign(KEY, LONG).await.unwrap();
        let term = leader.term();
        let follower = campaigning(&b, LONG).await;
        let dropped = Instant::now();
        drop(leader);
        let (next_leader, elected) = follower.await.unwrap();
        let lag = elected - dropped;
        eprintln!(
            "dropped leadership to next leader, {} server(s): {lag:?}",
            servers.len()
        );
        assert!(lag < HEARD, "elected {lag:?} after the drop");
        assert!(
            next_leader.term() > term,
            "term {} after {term}",
            next_leader.term()
        );
        next_leader.resign().await.unwrap();
    }
}

#[tokio::test]
async fn a_crashed_leader_is_followed_at_its_lease_expiry() {
    let servers = [RedisServer::start()];
    let lag = crashed_leader(&servers, &servers.iter().collect::<Vec<_>>()).await;
    eprintln!("crashed leader followed {lag:?} after its lease expired");
}

/// A leader crashes while a patient replica waits: the replica is elected
/// at the lease's expiry (read from the `live` servers), not before and
/// not [`AT_EXPIRY`] after; by then the crashed leader knows it lost.
async fn crashed_leader(servers: &[RedisServer], live: &[&RedisServer]) -> Duration {
    let ttl = Duration::from_secs(1);
    let crashing = Crashable::start(servers, replica("crashing")).await;
    let waiting = client(servers, patient("waiting")).await;
    let leader = crashing.client.campaign(KEY, ttl).await.unwrap();
    let granted = Instant::now();
    let follower = campaigning(&waiting, LONG).await;
    // A leader that crashes after a renewal: the waiter, timed by the
    // lease it saw first, must look again then.
    renewed(live, granted, ttl).await;
    crashing.crash();
    let expires = expiry(live);
    let (next, elected) = follower.await.unwrap();
    assert!(
        elected + ROUNDING >= expires,
        "elected {:?} before the crashed lease expired",
        expires - elected
    );
    let lag = elected.saturating_duration_since(expires);
    assert!(lag < AT_EXPIRY, "elected {lag:?} after the lease expired");
    assert!(next.term() > leader.term());
    assert!(leader.is_lost(), "the crashed leader still thinks it leads");
    assert!(leader.loss_reason().is_some());
    next.resign().await.unwrap();
    lag
}

/// What a work of `lead` fails with in these tests.
#[derive(Debug)]
enum WorkError {
    Lock(LockError),
    Failed(u64),
}

impl From<LockError> for WorkError {
    fn from(e: LockError) -> WorkError {
        WorkError::Lock(e)
    }
}

/// Says when it is dropped: the work it lives in was given up.
struct DropAlarm(mpsc::UnboundedSender<Instant>);

impl Drop for DropAlarm {
    fn drop(&mut self) {
        let _ = self.0.send(Instant::now());
    }
}

#[tokio::test]
async fn lead_drops_the_work_when_the_lease_is_lost_and_campaigns_again() {
    let servers = [RedisServer::start()];
    let ttl = Duration::from_millis(900);
    let replica_a = client(&servers, replica("a")).await;
    let operator = client(&servers, replica("operator")).await;
    let (terms_tx, mut terms) = mpsc::unbounded_channel();
    let (dropped_tx, mut dropped) = mpsc::unbounded_channel();
    let leading = tokio::spawn(async move {
        let mut runs = 0;
        let outcome: Result<(), WorkError> = replica_a
            .lead(KEY, ttl, |term| {
                runs += 1;
                let first = runs == 1;
                let terms_tx = terms_tx.clone();
                let alarm = first.then(|| DropAlarm(dropped_tx.clone()));
                async move {
                    terms_tx.send(term).unwrap();
                    if first {
                        // Works until it is given up.
                        std::future::pending::<()>().await;
                    }
                    drop(alarm);
                    Ok(())
                }
            })
            .await;
        outcome
    });
    let bound = Duration::from_secs(5);
    let first = tokio::time::timeout(bound, terms.recv()).await.unwrap();
    let first = first.unwrap();
    // An operator breaks the lease: the leader hears it at its next
    // renewal, within a third of the ttl (two thirds when behind).
    let forced = Instant::now();
    assert!(operator.force_release(KEY).await.unwrap());
    let given_up = tokio::time::timeout(ttl * 2, dropped.recv()).await;
    let given_up = given_up.expect("the work was not dropped").unwrap();
    assert!(
        given_up - forced < ttl,
        "the work was dropped {:?} after the lease was broken",
        given_up - forced
    );
    let second = tokio::time::timeout(bound, terms.recv()).await.unwrap();
    assert!(second.unwrap() > first, "campaigned again, with a new term");
    let outcome = tokio::time::timeout(bound, leading).await.unwrap().unwrap();
    assert!(outcome.is_ok(), "{outcome:?}");
    assert!(
        operator.inspect(KEY).await.unwrap().is_none(),
        "lead resigned before it returned"
    );
}

#[tokio::test]
async fn lead_returns_what_the_work_returns_and_resigns_first() {
    let servers = [RedisServer::start()];
    let replica_a = client(&servers, replica("a")).await;
    let replica_b = client(&servers, patient("b")).await;
    for fail in [false, true] {
        let (leading_tx, mut leading) = mpsc::unbounded_channel();
        let (finish_tx, finish) = tokio::sync::oneshot::channel::<()>();
        let leader = replica_a.clone();
        let lead = tokio::spawn(async move {
            let mut finish = Some(finish);
            leader
                .lead(KEY, LONG, |term| {
                    let finish = finish.take().expect("the work runs once");
                    let leading_tx = leading_tx.clone();
                    async move {
                        leading_tx.send(term).unwrap();
                        finish.await.unwrap();
                        match fail {
                            true => Err(WorkError::Failed(term)),
                            false => Ok(()),
                        }
                    }
                })
                .await
        });
        let term = leading.recv().await.unwrap();
        let follower = campaigning(&replica_b, LONG).await;
        let finished = Instant::now();
        finish_tx.send(()).unwrap();
        match (fail, lead.await.unwrap()) {
            (false, Ok(())) => {}
            (true, Err(WorkError::Failed(failed))) => assert_eq!(failed, term),
            (_, Err(WorkError::Lock(e))) => panic!("lead failed: {e}"),
            (fail, outcome) => panic!("the work failed: {fail}; lead returned {outcome:?}"),
        }
        // Resigned, not left to expire: the follower was woken.
        let (next, elected) = follower.await.unwrap();
        let lag = elected - finished;
        assert!(
            lag < HEARD,
            "the next leader came {lag:?} after the work ended"
        );
        assert!(next.term() > term);
        next.resign().await.unwrap();
    }
}

/// What a watcher reported (term and holder, `None` when nobody led), and
/// when.
type Seen = (Instant, Option<(Option<u64>, Option<String>)>);

/// The reports of a watcher of the election, as they come.
fn watching(client: &LockClient) -> mpsc::UnboundedReceiver<Seen> {
    let (seen_tx, seen) = mpsc::unbounded_channel();
    let mut leaders = Box::pin(client.watch_leader(KEY));
    tokio::spawn(async move {
        while let Some(state) = leaders.next().await {
            let leader = state
                .as_ref()
                .map(|s: &LockState| (s.fencing_token(), s.holder().map(str::to_owned)));
            if seen_tx.send((Instant::now(), leader)).is_err() {
                return;
            }
        }
    });
    seen
}

async fn next_report(reports: &mut mpsc::UnboundedReceiver<Seen>, bound: Duration) -> Seen {
    tokio::time::timeout(bound, reports.recv())
        .await
        .unwrap_or_else(|_| panic!("no report within {bound:?}"))
        .expect("the watcher ended")
}

/// The leader as a watcher reports it.
fn as_seen(leadership: &Leadership, name: &str) -> Option<(Option<u64>, Option<String>)> {
    Some((Some(leadership.term()), Some(name.to_owned())))
}

/// Waits for the watcher to report `leader`, reported within [`WATCHED`]
/// of `elected`, perhaps after reporting nobody: the change away from the
/// last leader, reported within [`WATCHED`] of `changed` and not before.
async fn reported(
    reports: &mut mpsc::UnboundedReceiver<Seen>,
    changed: Instant,
    leader: Option<(Option<u64>, Option<String>)>,
    elected: Instant,
) {
    let (at, seen) = next_report(reports, Duration::from_secs(5)).await;
    assert!(
        at + ROUNDING >= changed,
        "a change reported before it happened"
    );
    let late = at.saturating_duration_since(changed);
    assert!(late < WATCHED, "the change was reported {late:?} after it");
    let at = match seen {
        seen if seen == leader => at,
        None => {
            let (at, seen) = next_report(reports, Duration::from_secs(5)).await;
            assert_eq!(seen, leader);
            at
        }
        other => panic!("reported {other:?}, expected nobody or {leader:?}"),
    };
    let late = at.saturating_duration_since(elected);
    assert!(
        late < WATCHED,
        "the new leader was reported {late:?} after it"
    );
}

#[tokio::test]
async fn a_watcher_reports_each_change_within_milliseconds() {
    let servers = [RedisServer::start()];
    let ttl = Duration::from_secs(1);
    let watcher = client(&servers, replica("watcher")).await;
    let replica_a = client(&servers, replica("a")).await;
    let replica_b = Crashable::start(&servers, patient("b")).await;
    let replica_c = client(&servers, patient("c")).await;
    let mut reports = watching(&watcher);
    let (_, nobody) = next_report(&mut reports, Duration::from_secs(5)).await;
    assert_eq!(nobody, None, "nobody leads yet");
    // A vacancy is looked at in growing pauses (from 5 ms to a ttl), so a
    // first leader is seen within one; only changes are timed here.
    let a_leads = replica_a.campaign(KEY, ttl).await.unwrap();
    let (_, seen) = next_report(&mut reports, ttl * 2).await;
    assert_eq!(seen, as_seen(&a_leads, "a"));

    let follower = campaigning(&replica_b.client, ttl).await;
    let resigned = Instant::now();
    a_leads.resign().await.unwrap();
    let (b_leads, elected) = follower.await.unwrap();
    reported(&mut reports, resigned, as_seen(&b_leads, "b"), elected).await;

    let follower = campaigning(&replica_c, ttl).await;
    renewed(&[&servers[0]], elected, ttl).await;
    replica_b.crash();
    let expires = expiry(&[&servers[0]]);
    let (c_leads, elected) = follower.await.unwrap();
    reported(&mut reports, expires, as_seen(&c_leads, "c"), elected).await;
    c_leads.resign().await.unwrap();
}

/// Script calls (`EVALSHA`, `EVAL`, ...) the server has answered: every
/// read and write of a lock client is one.
fn script_calls(server: &RedisServer) -> u64 {
    let info: String = server.cmd(&["INFO", "commandstats"]);
    info.lines()
        .filter(|line| line.starts_with("cmdstat_eval") || line.starts_with("cmdstat_fcall"))
        .filter_map(|line| {
            line.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// Script calls answered over `window`, from now.
async fn calls_over(server: &RedisServer, window: Duration) -> u64 {
    let before = script_calls(server);
    tokio::time::sleep(window).await;
    script_calls(server) - before
}

#[tokio::test]
async fn a_watcher_reads_about_once_per_lease_while_nothing_changes() {
    let servers = [RedisServer::start()];
    let server = &servers[0];
    let ttl = Duration::from_millis(600);
    let window = ttl * 4;
    let replica_a = client(&servers, replica("a")).await;
    let watcher = client(&servers, replica("watcher")).await;
    let a_leads = replica_a.campaign(KEY, ttl).await.unwrap();
    // The leader's renewals alone, then with a watcher.
    let renewals = calls_over(server, window).await;
    let mut reports = watching(&watcher);
    let (_, seen) = next_report(&mut reports, Duration::from_secs(5)).await;
    assert_eq!(seen, as_seen(&a_leads, "a"));
    let reads = calls_over(server, window).await.saturating_sub(renewals);
    assert!(
        reports.try_recv().is_err(),
        "nothing changed, yet it reported"
    );
    // A read when the lease it saw would expire unless renewed: 2/3 of a
    // ttl to a ttl apart, since the leader renews every third of one.
    let most = ceil_div(window, ttl * 2 / 3) + 2;
    eprintln!("over {window:?}: {renewals} renewals, {reads} reads by the watcher");
    assert!(
        reads <= most,
        "the watcher read {reads} times in {window:?} of a ttl of {ttl:?}: more than {most}"
    );

    // Nobody leads: pauses grow from 5 ms to at least a ttl, and stay.
    let resigned = Instant::now();
    a_leads.resign().await.unwrap();
    let (at, seen) = next_report(&mut reports, Duration::from_secs(5)).await;
    assert_eq!(seen, None);
    assert!(at - resigned < WATCHED);
    // The pauses growing: 5 + 10 + ... + 640 ms before they reach a ttl.
    tokio::time::sleep(Duration::from_millis(1300)).await;
    let reads = calls_over(server, window).await;
    let most = ceil_div(window, ttl) + 1;
    eprintln!("over {window:?} without a leader: {reads} reads by the watcher");
    assert!(
        reads <= most,
        "without a leader the watcher read {reads} times in {window:?}: more than {most}"
    );
    assert!(
        reports.try_recv().is_err(),
        "nothing changed, yet it reported"
    );
}

/// How many `part`s it takes to cover `whole`.
fn ceil_div(whole: Duration, part: Duration) -> u64 {
    u64::try_from(whole.as_nanos().div_ceil(part.as_nanos())).unwrap()
}

#[tokio::test]
async fn a_campaign_ends_unavailable_once_redis_stays_away_past_the_default_wait() {
    let wait = Duration::from_secs(2);
    let mut stopped = [RedisServer::start()];
    let frozen = [RedisServer::start()];
    // The default operation timeout: against a frozen server each call
    // takes all of it, and the bound must still hold.
    let settings = || replica("a").default_wait(wait);
    let refused = client(&stopped, settings()).await;
    let unanswered = client(&frozen, settings()).await;
    // Every attempt refused at once, or every attempt timed out.
    stopped[0].stop();
    let _paused = frozen[0].pause();
    for (campaigner, how) in [(refused, "stopped"), (unanswered, "frozen")] {
        let started = Instant::now();
        let err = campaigner
            .campaign(KEY, Duration::from_millis(500))
            .await
            .unwrap_err();
        let took = started.elapsed();
        eprintln!("{how} server: the campaign ended after {took:?}: {err}");
        assert_eq!(err.kind(), ErrorKind::Unavailable, "{how}: {err}");
        // The wait and at most a round more (a quarter of it), as the
        // rustdoc says; a quarter of a second for the load.
        assert!(
            took >= wait && took < wait * 5 / 4 + Duration::from_millis(250),
            "{how}: the campaign ended after {took:?}, with a default wait of {wait:?}"
        );
    }
}

#[tokio::test]
async fn on_redlock_with_a_server_frozen_leaders_are_followed() {
    let servers = start_servers(3);
    let _frozen = servers[2].pause();
    let live = [&servers[0], &servers[1]];
    successive_leaders(&servers, &live).await;
    let lags = resignations(&servers, 3).await;
    eprintln!("resignation to next leader, Redlock with a server frozen: {lags:?}");
    let lag = crashed_leader(&servers, &live).await;
    eprintln!("crashed leader followed {lag:?} after its lease expired (Redlock, 1 frozen)");
}

#[tokio::test]
async fn a_watcher_survives_a_lock_without_expiry() {
    let servers = [RedisServer::start()];
    let watcher = client(&servers, replica("watcher")).await;
    // Another program holds the election's key, without an expiry.
    let key = storage_key(PREFIX, KEY);
    let _: () = servers[0].cmd(&["SET", &key, "another-program"]);
    let mut reports = watching(&watcher);
    let (_, held) = next_report(&mut reports, Duration::from_secs(5)).await;
    assert_eq!(held, Some((None, None)), "held, by nobody lock-core knows");
    let quiet = tokio::time::timeout(Duration::from_millis(300), reports.recv()).await;
    assert!(quiet.is_err(), "nothing changed, yet: {quiet:?}");
    // Deleted without a release message: seen at the next look.
    let _: i64 = servers[0].cmd(&["DEL", &key]);
    let (_, seen) = next_report(&mut reports, Duration::from_secs(3)).await;
    assert_eq!(seen, None);
}

#[tokio::test]
async fn a_campaign_outlasts_a_blip_shorter_than_the_default_wait() {
    let servers = [RedisServer::start()];
    let wait = Duration::from_secs(2);
    let ttl = Duration::from_secs(1);
    let settings = |name| {
        replica(name)
            .default_wait(wait)
            .operation_timeout(Duration::from_millis(200))
    };
    let replica_a = client(&servers, settings("a")).await;
    let replica_b = client(&servers, settings("b")).await;
    let a_leads = replica_a.campaign(KEY, LONG).await.unwrap();
    // Redis is away from 1.6 s to 2.4 s, 0.8 s in all, across the end of a
    // campaign's round (a quarter of the default wait: 0.5 s).
    let started = Instant::now();
    let follower = spawn_waiting(async move { replica_b.campaign(KEY, ttl).await }).await;
    tokio::time::sleep_until(started + wait * 4 / 5).await;
    let frozen = servers[0].pause();
    tokio::time::sleep_until(started + wait * 6 / 5).await;
    drop(frozen);
    a_leads.resign().await.unwrap();
    // A campaign ends Unavailable only once Redis has stayed away for its
    // default wait; this blip is shorter, whenever it falls in a round.
    let elected = follower.await.unwrap();
    assert!(
        elected.is_ok(),
        "the campaign ended {:?} after it began, during a 0.8 s blip: {elected:?}",
        started.elapsed()
    );
}
