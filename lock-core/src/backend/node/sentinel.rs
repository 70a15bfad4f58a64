//! The primary of a Sentinel-monitored service, as one answer that all of
//! a client's connections follow.
//!
//! A client reaches the primary over two connections of its own: its
//! callers' and its heartbeat's (`Backend::twin`). Were each to ask the
//! Sentinels when it connects, the two could follow two answers for
//! seconds after a failover: a lock taken and released on the old primary
//! while the heartbeat renews on the new one. So the answer is a [`View`]
//! that both share: the primary's address, the Sentinels' configuration
//! epoch it came with, and a generation that changes with the address. A
//! connection remembers the generation it was opened for and is replaced
//! once the view moves on (`Node::call`), so whichever connection learns
//! of a failover moves the other one too.
//!
//! How the Sentinels are read (Redis' guide for Sentinel clients, and what
//! a failover looks like from outside):
//! - Every Sentinel is asked at once, each within a bound:
//!   `SENTINEL get-master-addr-by-name` and `SENTINEL MASTER`, pipelined,
//!   for the address and the epoch and flags of one moment.
//! - No answer is taken while any Sentinel reports a failover under way
//!   (`failover_in_progress`): between a replica's promotion and the end of
//!   the failover, every Sentinel still names the old primary (for about a
//!   second here), and the old primary still answers `ROLE` as a primary
//!   and takes writes until the Sentinels reconfigure it (about 11 s here).
//! - The answer with the highest epoch wins: a Sentinel that has not heard
//!   of the last failover names the old primary under an older epoch. The
//!   view never goes back to an older epoch, unless every Sentinel answers
//!   and agrees (Sentinels deployed afresh).
//! - The named server is used only if it answers `ROLE` as a primary.
//! - Connections also learn of a failover by themselves (a `READONLY`
//!   answer, a server that answers `ROLE` as a replica, one that cannot be
//!   reached): the view is then forgotten and the Sentinels asked again.
//!   And for as long as the client lives, the Sentinels are asked again
//!   every [`REFRESH_EVERY`] in the background (over connections kept for
//!   it), which bounds how long a client keeps using a primary that is no
//!   longer one: the old primary itself says nothing until it is
//!   reconfigured.

use super::super::wire::Wire;
use super::Conn;
use crate::background;
use redis::aio::MultiplexedConnection;
use redis::{ConnectionAddr, IntoConnectionInfo, RedisError, RedisResult, Role};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::time::Instant;

/// How often a client asks the Sentinels again in the background: about
/// how long, once the Sentinels agree on a failover, it may keep using the
/// primary it replaced (which answers as one until the Sentinels
/// reconfigure it).
pub(crate) const REFRESH_EVERY: Duration = Duration::from_secs(1);

/// Pause between two lookups while the Sentinels' answer is not settled (a
/// failover under way, or a named server that is not a primary yet).
const SETTLE_PAUSE: Duration = Duration::from_millis(50);

/// What is needed to ask the Sentinels for a service's primary, and the
/// answer the client follows.
#[derive(Clone)]
pub(super) struct SentinelTarget {
    /// The Sentinels (their own credentials included).
    sentinels: Vec<redis::ConnectionInfo>,
    /// The name the Sentinels monitor the primary under.
    service: String,
    /// The credentials, database and protocol for the primary.
    primary: redis::RedisConnectionInfo,
    /// Shared by the node and its twin.
    view: Arc<View>,
}

/// A server's address, as a Sentinel names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Named {
    host: String,
    port: u16,
}

/// The primary a client follows (see the module's docs).
#[derive(Default)]
pub(super) struct View {
    seen: Mutex<Seen>,
    /// Set once the background lookups run.
    watched: AtomicBool,
}

#[derive(Default)]
struct Seen {
    /// `None` before the first lookup, and once a connection found it wrong.
    primary: Option<Named>,
    /// The Sentinels' configuration epoch of the last answer taken.
    epoch: u64,
    /// Changes whenever `primary` does; connections opened for an older
    /// one are replaced.
    generation: u64,
}

/// One Sentinel's answer.
#[derive(Debug, PartialEq, Eq)]
struct Answer {
    primary: Option<Named>,
    epoch: u64,
    failing_over: bool,
}

/// What the Sentinels' answers, taken together, say.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// This server, under this epoch; `unanimous` when every Sentinel
    /// answered so.
    Primary {
        named: Named,
        epoch: u64,
        unanimous: bool,
    },
    /// No answer can be taken now; why.
    Unsettled(&'static str),
}

impl View {
    /// The primary to connect to and the generation a connection to it
    /// belongs to, if one is known.
    fn current(&self) -> Option<(Named, u64)> {
        let seen = self.lock();
        seen.primary.clone().map(|named| (named, seen.generation))
    }

    /// The generation connections must belong to.
    pub(super) fn generation(&self) -> u64 {
        self.lock().generation
    }

    /// Takes the Sentinels' verdict, unless it is older than the one taken
    /// already; returns the view's primary and generation afterwards.
    fn take(&self, named: Named, epoch: u64, unanimous: bool) -> Option<(Named, u64)> {
        let mut seen = self.lock();
        if epoch >= seen.epoch || unanimous {
            seen.epoch = epoch;
            if seen.primary.as_ref() != Some(&named) {
                seen.primary = Some(named);
                seen.generation += 1;
            }
        }
        seen.primary.clone().map(|named| (named, seen.generation))
    }

    /// Forgets the primary of `generation` (a connection found it no
    /// primary, or could not reach it), so every connection asks again.
    pub(super) fn forget(&self, generation: u64) {
        let mut seen = self.lock();
        if seen.generation == generation && seen.primary.is_some() {
            seen.primary = None;
            seen.generation += 1;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl SentinelTarget {
    /// A target for `service` on the Sentinels at `urls`, whose primary is
    /// reached with `primary`'s credentials, database and protocol.
    pub(super) fn new(
        urls: &[String],
        service: &str,
        primary: redis::RedisConnectionInfo,
    ) -> RedisResult<SentinelTarget> {
        let sentinels = urls
            .iter()
            .map(|url| url.as_str().into_connection_info())
            .collect::<RedisResult<Vec<_>>>()?;
        Ok(SentinelTarget {
            sentinels,
            service: service.to_owned(),
            primary,
            view: Arc::default(),
        })
    }

    /// The view this target's connections follow.
    pub(super) fn view(&self) -> &View {
        &self.view
    }

    /// A connection to the view's primary, checked to answer `ROLE` as a
    /// primary, and the generation it belongs to. Asks the Sentinels when
    /// the view has no primary, or the one it has fails the check, until
    /// `limit` has passed; then the last reason is returned.
    pub(super) async fn open(
        &self,
        limit: Duration,
        config: &redis::AsyncConnectionConfig,
    ) -> RedisResult<(Conn, u64)> {
        let deadline = Instant::now() + limit;
        loop {
            let (named, generation) = match self.view.current() {
                Some(known) => known,
                None => self.settle(deadline).await?,
            };
            let left = deadline.saturating_duration_since(Instant::now());
            let checked =
                match tokio::time::timeout(left, self.connect_checked(&named, config)).await {
                    Ok(checked) => checked,
                    Err(_) => Err(not_reached(&named, left)),
                };
            match checked {
                Ok(conn) if self.view.generation() == generation => return Ok((conn, generation)),
                // The view moved on while connecting: follow it.
                Ok(_) => continue,
                Err(err) => {
                    self.view.forget(generation);
                    if Instant::now() + SETTLE_PAUSE >= deadline {
                        return Err(err);
                    }
                    tracing::debug!(
                        service = %self.service, error = %err,
                        "the primary the Sentinels named is not usable; asking them again"
                    );
                    tokio::time::sleep(SETTLE_PAUSE).await;
                }
            }
        }
    }

    /// Asks the Sentinels until their answer is settled or `deadline`
    /// passes, and takes it into the view.
    async fn settle(&self, deadline: Instant) -> RedisResult<(Named, u64)> {
        let mut kept = vec![None; self.sentinels.len()];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let why = match self.ask(left, &mut kept).await? {
                Verdict::Primary {
                    named,
                    epoch,
                    unanimous,
                } => match self.view.take(named, epoch, unanimous) {
                    Some(taken) => return Ok(taken),
                    None => "the Sentinels that answered have not heard of the last failover",
                },
                Verdict::Unsettled(why) => why,
            };
            if Instant::now() + SETTLE_PAUSE >= deadline {
                return Err(RedisError::from((
                    redis::ErrorKind::MasterNameNotFoundBySentinel,
                    "no primary to use",
                    format!("service {:?}: {why}", self.service),
                )));
            }
            tokio::time::sleep(SETTLE_PAUSE).await;
        }
    }

    /// Asks every Sentinel at once, each within `limit`, and weighs their
    /// answers. Fails only when none answered.
    /// `kept` holds a connection per Sentinel, kept from one lookup to the
    /// next (one that failed is dropped).
    async fn ask(
        &self,
        limit: Duration,
        kept: &mut [Option<MultiplexedConnection>],
    ) -> RedisResult<Verdict> {
        let asked = futures::future::join_all(self.sentinels.iter().zip(kept.iter_mut()).map(
            |(sentinel, kept)| async move {
                let asked = tokio::time::timeout(limit, self.ask_one(sentinel, kept)).await;
                if !matches!(asked, Ok(Ok(_))) {
                    *kept = None;
                }
                asked
            },
        ))
        .await;
        let mut answers = Vec::with_capacity(asked.len());
        let mut last_error = None;
        for answer in asked {
            match answer {
                Ok(Ok(answer)) => answers.push(answer),
                Ok(Err(err)) => last_error = Some(err),
                Err(_) => {
                    last_error = Some(RedisError::from((
                        redis::ErrorKind::Io,
                        "a Sentinel did not answer",
                        format!("within {limit:?}"),
                    )));
                }
            }
        }
        match (answers.is_empty(), last_error) {
            (true, Some(err)) => Err(err),
            _ => Ok(weigh(&answers, self.sentinels.len())),
        }
    }

    /// One Sentinel's answer for the service, over the connection `kept`
    /// (opened if need be).
    async fn ask_one(
        &self,
        sentinel: &redis::ConnectionInfo,
        kept: &mut Option<MultiplexedConnection>,
    ) -> RedisResult<Answer> {
        let conn = match kept {
            Some(conn) => conn,
            None => {
                let client = redis::Client::open(sentinel.clone())?;
                let config = redis::AsyncConnectionConfig::new().set_response_timeout(None);
                kept.insert(
                    client
                        .get_multiplexed_async_connection_with_config(&config)
                        .await?,
                )
            }
        };
        let (addr, master): (Option<(String, String)>, HashMap<String, String>) = redis::pipe()
            .cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(&self.service)
            .cmd("SENTINEL")
            .arg("MASTER")
            .arg(&self.service)
            .query_async(conn)
            .await?;
        Ok(answer(addr, &master))
    }

    /// A connection to `named`, used only if it answers `ROLE` as a
    /// primary: lock-core's own where it serves (plain TCP, RESP2), the
    /// `redis` crate's otherwise (RESP3).
    async fn connect_checked(
        &self,
        named: &Named,
        config: &redis::AsyncConnectionConfig,
    ) -> RedisResult<Conn> {
        let mut conn = if self.primary.protocol() == redis::ProtocolVersion::RESP2 {
            Conn::Wire(Wire::connect(&named.host, named.port, &self.primary, None).await?)
        } else {
            let info = ConnectionAddr::Tcp(named.host.clone(), named.port)
                .into_connection_info()?
                .set_redis_settings(self.primary.clone());
            let client = redis::Client::open(info)?;
            Conn::Multiplexed(
                client
                    .get_multiplexed_async_connection_with_config(config)
                    .await?,
            )
        };
        check_primary(&mut conn, named).await?;
        Ok(conn)
    }

    /// Asks the Sentinels again every [`REFRESH_EVERY`], each lookup
    /// within `limit`, for as long as the view is in use (once per view,
    /// however often it is called), and takes each settled answer: a
    /// failover then moves every connection to the new primary (see
    /// `Node::call`), even while the old one still answers.
    pub(super) fn watch(&self, limit: Duration) {
        // Called on every call: a read, until the one that starts it.
        if self.view.watched.load(Ordering::Acquire)
            || self.view.watched.swap(true, Ordering::AcqRel)
        {
            return;
        }
        let view = Arc::downgrade(&self.view);
        let target = SentinelTarget {
            sentinels: self.sentinels.clone(),
            service: self.service.clone(),
            primary: self.primary.clone(),
            view: Arc::new(View::default()),
        };
        background::spawn(async move {
            let mut kept = vec![None; target.sentinels.len()];
            loop {
                tokio::time::sleep(REFRESH_EVERY).await;
                // Only this task's copy of the target holds no view: the
                // lookup below must not keep the client's alive.
                if view.strong_count() == 0 {
                    return;
                }
                let verdict = target.ask(limit, &mut kept).await;
                let Some(view) = view.upgrade() else { return };
                match verdict {
                    Ok(Verdict::Primary {
                        named,
                        epoch,
                        unanimous,
                    }) => {
                        view.take(named, epoch, unanimous);
                    }
                    Ok(Verdict::Unsettled(why)) => {
                        tracing::debug!(service = %target.service, why, "Sentinels not settled");
                    }
                    Err(error) => {
                        tracing::debug!(service = %target.service, %error, "Sentinels not reached");
                    }
                }
            }
        });
    }
}

/// One Sentinel's answer, from its replies to `get-master-addr-by-name`
/// and `SENTINEL MASTER`.
fn answer(addr: Option<(String, String)>, master: &HashMap<String, String>) -> Answer {
    let primary = addr.and_then(|(host, port)| {
        let port = port.parse().ok()?;
        Some(Named { host, port })
    });
    let epoch = master
        .get("config-epoch")
        .and_then(|epoch| epoch.parse().ok())
        .unwrap_or(0);
    let failing_over = master
        .get("flags")
        .is_some_and(|flags| flags.split(',').any(|flag| flag == "failover_in_progress"));
    Answer {
        primary,
        epoch,
        failing_over,
    }
}

/// What the answers of the Sentinels that answered (of `asked`) say
/// together (see the module's docs).
fn weigh(answers: &[Answer], asked: usize) -> Verdict {
    if answers.iter().any(|answer| answer.failing_over) {
        return Verdict::Unsettled("a failover is under way");
    }
    let Some(best) = answers
        .iter()
        .filter(|answer| answer.primary.is_some())
        .max_by_key(|answer| answer.epoch)
    else {
        return Verdict::Unsettled("no Sentinel names a primary");
    };
    let Some(named) = best.primary.clone() else {
        return Verdict::Unsettled("no Sentinel names a primary");
    };
    let unanimous =
        answers.len() == asked && answers.iter().all(|a| a.primary.as_ref() == Some(&named));
    Verdict::Primary {
        named,
        epoch: best.epoch,
        unanimous,
    }
}

/// Fails unless the server behind `conn` answers `ROLE` as a primary.
async fn check_primary(conn: &mut Conn, named: &Named) -> RedisResult<()> {
    let role: Role = redis::cmd("ROLE").query_async(conn).await?;
    match role {
        Role::Primary { .. } => Ok(()),
        other => Err(RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly),
            "not a primary",
            format!(
                "{}:{} answers ROLE as {} (a failover is under way)",
                named.host,
                named.port,
                match other {
                    Role::Replica { .. } => "a replica",
                    Role::Sentinel { .. } => "a Sentinel",
                    _ => "something else",
                }
            ),
        ))),
    }
}

/// The error for a named server that did not let itself be reached and
/// checked within `limit`.
fn not_reached(named: &Named, limit: Duration) -> RedisError {
    RedisError::from((
        redis::ErrorKind::Io,
        "the primary did not answer",
        format!("{}:{} within {limit:?}", named.host, named.port),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(port: u16) -> Named {
        Named {
            host: "127.0.0.1".to_owned(),
            port,
        }
    }

    fn says(port: u16, epoch: u64) -> Answer {
        Answer {
            primary: Some(named(port)),
            epoch,
            failing_over: false,
        }
    }

    #[test]
    fn the_highest_epoch_wins_and_a_failover_under_way_settles_nothing() {
        let late = [says(1, 0), says(2, 1), says(1, 0)];
        assert_eq!(
            weigh(&late, 3),
            Verdict::Primary {
                named: named(2),
                epoch: 1,
                unanimous: false
            }
        );
        let mut under_way = [says(1, 0), says(1, 1), says(1, 0)];
        under_way[1].failing_over = true;
        assert_eq!(
            weigh(&under_way, 3),
            Verdict::Unsettled("a failover is under way")
        );
        let agreed = [says(2, 1), says(2, 1)];
        assert!(matches!(
            weigh(&agreed, 3),
            Verdict::Primary {
                unanimous: false,
                ..
            }
        ));
        assert!(matches!(
            weigh(&agreed, 2),
            Verdict::Primary {
                unanimous: true,
                ..
            }
        ));
    }

    #[test]
    fn answers_are_read_from_the_sentinels_replies() {
        let master: HashMap<String, String> = [
            ("flags", "master,failover_in_progress"),
            ("config-epoch", "7"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let read = answer(Some(("10.0.0.1".to_owned(), "6380".to_owned())), &master);
        assert_eq!(read.epoch, 7);
        assert!(read.failing_over);
        assert_eq!(read.primary.map(|n| n.port), Some(6380));
        assert!(answer(None, &HashMap::new()).primary.is_none());
    }

    #[test]
    fn the_view_never_goes_back_to_an_older_epoch_unless_all_agree() {
        let view = View::default();
        assert_eq!(view.take(named(1), 3, false), Some((named(1), 1)));
        // A late Sentinel's older answer is not taken.
        assert_eq!(view.take(named(2), 2, false), Some((named(1), 1)));
        // The same primary again: same generation.
        assert_eq!(view.take(named(1), 3, false), Some((named(1), 1)));
        view.forget(1);
        assert_eq!(view.current(), None);
        assert_eq!(view.generation(), 2);
        assert_eq!(view.take(named(2), 2, false), None);
        assert_eq!(view.take(named(2), 2, true), Some((named(2), 3)));
        // Forgetting an older generation does nothing.
        view.forget(1);
        assert_eq!(view.current(), Some((named(2), 3)));
    }
}
