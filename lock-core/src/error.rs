//! The one error type of the crate, and the kinds a caller matches on.

use std::error::Error as StdError;
use std::fmt;
use std::time::Duration;

/// What went wrong, in terms a caller can act on.
///
/// Match on this rather than on message text. New kinds may be added, so a
/// `match` needs a wildcard arm.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Another owner held the lock for the whole wait.
    Contended,
    /// The lock was lost while it was held: it expired, was taken over, or
    /// could not be renewed before its validity ran out.
    Lost,
    /// [`global_client`](crate::global_client) was called before
    /// [`set_global_client`](crate::set_global_client).
    NotInitialized,
    /// [`set_global_client`](crate::set_global_client) was called a second time.
    AlreadyInitialized,
    /// Redis could not be reached or did not answer in time.
    Unavailable,
    /// Redis answered with an error: a permission denied by an ACL, a key of
    /// the wrong type, a script error, and also a refused login (a wrong
    /// user name or password, a disabled ACL user, a server that requires a
    /// password none was given for), whose message says which.
    Server,
    /// The lock key was empty, too long, or started with `}` (which would
    /// leave its Redis Cluster hash tag empty).
    InvalidKey,
    /// The configuration was invalid: the client's (a bad URL, a zero
    /// default ttl, ...: "invalid lock client configuration"), or the lock
    /// options of one call (a ttl or wait out of range, a kind of lock the
    /// key is not held as, ...: "invalid lock options").
    Config,
    /// The task asked for a lock it can never get because of what it holds:
    /// itself (an exclusive lock on a key it holds shared or with a permit,
    /// or several keys of which it holds only some), or with others, when
    /// its wait closed a cycle of waits across tasks or processes and was
    /// the youngest wait of the cycle (the message names the cycle; see
    /// `docs/deadlocks.md`). An annotated body unwinds and releases as on
    /// any error; retrying later, after the other owners finished, can
    /// succeed.
    WouldDeadlock,
    /// The client renews as many leases as it can keep renewed in time, and
    /// another would make its heartbeat fall behind and cost locks already
    /// held: the acquisition waited within its wait for capacity to come
    /// back (a lease released, the server answering faster), then gave up
    /// without sending anything. Held locks are not affected. The message
    /// says what to change: a longer ttl (a lease is renewed three times a
    /// ttl), fewer locks held at once, or another client. Counted by the
    /// `lock_core_at_capacity_total` metric.
    AtCapacity,
}

impl ErrorKind {
    fn describe(self) -> &'static str {
        match self {
            ErrorKind::Contended => "lock is held by another owner",
            ErrorKind::Lost => "lock was lost",
            ErrorKind::NotInitialized => "global lock client is not initialized",
            ErrorKind::AlreadyInitialized => "global lock client is already initialized",
            ErrorKind::Unavailable => "redis is unavailable",
            ErrorKind::Server => "redis answered with an error",
            ErrorKind::InvalidKey => "invalid lock key",
            ErrorKind::Config => "invalid lock client configuration",
            ErrorKind::WouldDeadlock => "the lock would deadlock",
            ErrorKind::AtCapacity => "lock client is at its renewal capacity",
        }
    }
}

/// Why a held lock was lost ([`LockGuard::loss_reason`](crate::LockGuard::loss_reason),
/// [`LockError::loss_reason`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LossReason {
    /// A renewal or an extension found the key gone or held by another
    /// owner: the lease expired on the server (a pause, a cut-off) and may
    /// have been taken since.
    TakenOver,
    /// The validity deadline passed without a successful renewal: Redis
    /// did not answer in time, so the lease cannot be trusted any more.
    Expired,
    /// `max_hold` was reached.
    MaxHold,
    /// An operator broke the lock ([`LockClient::force_release`](crate::LockClient::force_release),
    /// `lockctl release`); the holder found out at its next renewal.
    ForceReleased,
    /// Redis refused the renewal with an error that waiting will not
    /// change (an ACL user without `EVALSHA`, say); the WARN logged with
    /// it carries the server's words.
    Refused,
    /// The runtime given to
    /// [`LockClientBuilder::runtime`](crate::LockClientBuilder::runtime),
    /// which ran its renewals, shut down while the lock was held: nothing
    /// renews it any more.
    RuntimeShutDown,
}

impl LossReason {
    /// The reason, in words, for logs.
    pub(crate) fn text(self) -> &'static str {
        match self {
            LossReason::TakenOver => "a renewal found the lock taken over or expired",
            LossReason::Expired => "the validity deadline passed without a successful renewal",
            LossReason::MaxHold => "max_hold reached",
            LossReason::ForceReleased => "an operator force-released the lock",
            LossReason::Refused => "Redis refused to renew the lock",
            LossReason::RuntimeShutDown => "the runtime that renewed the lock shut down",
        }
    }

    /// What a `Lost` error says happened, and what to look at.
    fn explain(self) -> &'static str {
        match self {
            LossReason::TakenOver => {
                "a renewal found the key gone or held by another owner: the lease ran out on the server before the work finished (this process paused, or could not reach Redis, for longer than the ttl)"
            }
            LossReason::Expired => {
                "no renewal succeeded before the lease's validity ran out (Redis did not answer in time), so the lock could no longer be trusted"
            }
            LossReason::MaxHold => {
                "max_hold was reached: the work ran longer than the lock may be held"
            }
            LossReason::Refused => {
                "Redis refused to renew it with an error (a missing ACL permission such as \
                 +evalsha; the WARN 'lock renewal failed' logged with it has the server's \
                 words)"
            }
            LossReason::ForceReleased => {
                "an operator force-released it (LockClient::force_release or lockctl release) before the work finished"
            }
            LossReason::RuntimeShutDown => {
                "the runtime given to LockClientBuilder::runtime, which ran its renewals, shut down while it was held; keep that runtime running as long as the client holds locks"
            }
        }
    }
}

/// The error returned by every fallible operation of this crate.
///
/// It carries the [`ErrorKind`], the lock key concerned (when there is one),
/// how long the caller waited (for acquisitions), a message saying what to do,
/// and the underlying Redis error as [`source`](std::error::Error::source).
/// Its [`Display`](fmt::Display) says what happened and what to do, and
/// leaves the source out; [`chain`](Self::chain) prints both, for a log
/// line.
///
/// Decide on [`kind`](Self::kind), never on the message:
///
/// ```
/// use lock_core::{ErrorKind, LockClient, LockError, MemoryStore};
/// use std::time::Duration;
///
/// async fn run_report(client: &LockClient) -> Result<&'static str, LockError> {
///     match client.lock("report", Duration::from_secs(30)).await {
///         Ok(guard) => {
///             // ... build the report ...
///             guard.release().await?;
///             Ok("built")
///         }
///         // Another replica is on it: nothing to do.
///         Err(e) if e.kind() == ErrorKind::Contended => Ok("skipped"),
///         // Redis unreachable: worth another try later.
///         Err(e) if e.kind() == ErrorKind::Unavailable => Ok("retry later"),
///         Err(e) => Err(e),
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), LockError> {
/// let store = MemoryStore::new();
/// let other = LockClient::in_memory_on(&store);
/// let held = other.lock("report", Duration::from_secs(30)).await?;
/// let client = lock_core::LockClient::builder()
///     .in_memory(&store)
///     .default_wait(Duration::ZERO)
///     .build()
///     .await?;
/// assert_eq!(run_report(&client).await?, "skipped");
/// held.release().await?;
/// assert_eq!(run_report(&client).await?, "built");
/// # Ok(()) }
/// ```
pub struct LockError {
    inner: Box<Inner>,
}

struct Inner {
    kind: ErrorKind,
    /// What the message is about, when not the kind's own description.
    subject: Option<&'static str>,
    key: Option<String>,
    waited: Option<Duration>,
    message: Option<String>,
    loss: Option<LossReason>,
    source: Option<Box<dyn StdError + Send + Sync + 'static>>,
}

impl LockError {
    pub(crate) fn new(kind: ErrorKind) -> Self {
        LockError {
            inner: Box::new(Inner {
                kind,
                subject: None,
                key: None,
                waited: None,
                message: None,
                loss: None,
                source: None,
            }),
        }
    }

    pub(crate) fn with_key(mut self, key: impl Into<String>) -> Self {
        self.inner.key = Some(key.into());
        self
    }

    pub(crate) fn with_waited(mut self, waited: Duration) -> Self {
        self.inner.waited = Some(waited);
        self
    }

    pub(crate) fn with_message(mut self, message: impl Into<String>) -> Self {
        self.inner.message = Some(message.into());
        self
    }

    pub(crate) fn with_source(mut self, source: impl StdError + Send + Sync + 'static) -> Self {
        self.inner.source = Some(Box::new(source));
        self
    }

    /// `with_source` for an error of the `redis` crate, which prints a
    /// server's answer and gives it as its own source too: held so that a
    /// chain says it once (see [`RedisCause`]).
    pub(crate) fn with_redis_source(self, err: redis::RedisError) -> Self {
        self.with_source(RedisCause(err))
    }

    /// Invalid configuration of the client.
    pub(crate) fn config(message: impl Into<String>) -> Self {
        LockError::new(ErrorKind::Config).with_message(message)
    }

    /// Invalid lock options of one call.
    pub(crate) fn options(message: impl Into<String>) -> Self {
        LockError::config(message).in_options()
    }

    /// A [`config`](Self::config) error that a call's lock options caused.
    pub(crate) fn in_options(mut self) -> Self {
        self.inner.subject = Some("invalid lock options");
        self
    }

    /// A lock that was lost while it was held, for `reason` when it is
    /// known.
    pub(crate) fn lost(key: &str, reason: Option<LossReason>) -> Self {
        let mut error = LockError::new(ErrorKind::Lost).with_key(key);
        error.inner.loss = reason;
        error.with_message(reason.map_or(
            "the lease expired or was taken over before the work finished",
            LossReason::explain,
        ))
    }

    /// What went wrong.
    pub fn kind(&self) -> ErrorKind {
        self.inner.kind
    }

    /// The lock key this error concerns, as the caller named it.
    pub fn key(&self) -> Option<&str> {
        self.inner.key.as_deref()
    }

    /// Why the lock was lost, for an [`ErrorKind::Lost`] error (`None` for
    /// other kinds, and when the reason is not known).
    ///
    /// ```
    /// use lock_core::{ErrorKind, LockClient, LossReason};
    /// use std::time::Duration;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), lock_core::LockError> {
    /// let client = LockClient::in_memory();
    /// let guard = client.lock("report", Duration::from_secs(1)).await?;
    /// client.force_release("report").await?; // an operator breaks it
    /// guard.lost().await; // noticed at the next renewal, a third of the ttl later
    /// let err = guard.extend(Duration::from_secs(1)).await.unwrap_err();
    /// assert_eq!(err.kind(), ErrorKind::Lost);
    /// assert_eq!(err.loss_reason(), Some(LossReason::ForceReleased));
    /// assert!(err.to_string().contains("force-released"), "{err}");
    /// # Ok(()) }
    /// ```
    pub fn loss_reason(&self) -> Option<LossReason> {
        self.inner.loss
    }

    /// How long the caller waited before this error, for acquisitions.
    pub fn waited(&self) -> Option<Duration> {
        self.inner.waited
    }

    /// `true` when the lock was held by someone else for the whole wait.
    pub fn is_contended(&self) -> bool {
        self.kind() == ErrorKind::Contended
    }

    /// `true` when the lock was lost while held.
    pub fn is_lost(&self) -> bool {
        self.kind() == ErrorKind::Lost
    }

    /// `true` when Redis could not be reached or timed out.
    pub fn is_unavailable(&self) -> bool {
        self.kind() == ErrorKind::Unavailable
    }

    /// `true` when the client refused a new lease because its heartbeat
    /// renews all it can ([`ErrorKind::AtCapacity`]).
    pub fn is_at_capacity(&self) -> bool {
        self.kind() == ErrorKind::AtCapacity
    }

    /// `true` when the operation timed out (a kind of [`ErrorKind::Unavailable`]).
    pub fn is_timeout(&self) -> bool {
        self.source_ref::<TimedOut>().is_some()
    }

    /// Per-server detail when a Redlock quorum could not be reached: which
    /// servers failed and how. Empty otherwise.
    pub fn node_errors(&self) -> &[NodeError] {
        self.quorum_failure()
            .map(QuorumFailure::failures)
            .unwrap_or_default()
    }

    /// The whole quorum tally, when a Redlock quorum could not be reached.
    pub fn quorum_failure(&self) -> Option<&QuorumFailure> {
        self.source_ref::<QuorumFailure>()
    }

    /// The error and each of its [`source`](std::error::Error::source)s,
    /// joined by `": "`: the whole story, for a log line or a message to a
    /// person. The error's own [`Display`](fmt::Display) says what happened
    /// and what to do, but not why (the Redis error, the bound that ran
    /// out), which is its source, so that a report that walks the sources
    /// itself (`{:#}` of an `anyhow::Error`, `tracing-error`) says each once.
    ///
    /// ```
    /// use lock_core::LockClient;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// // Nothing listens on port 1.
    /// let err = LockClient::builder()
    ///     .url("redis://127.0.0.1:1")
    ///     .build()
    ///     .await
    ///     .unwrap_err();
    /// let whole = err.chain().to_string();
    /// assert!(whole.starts_with(&err.to_string()), "{whole}");
    /// assert!(whole.len() > err.to_string().len(), "{whole}");
    /// # }
    /// ```
    pub fn chain(&self) -> impl fmt::Display + '_ {
        Chain(self)
    }

    /// The `redis` crate's error this one comes from, if any: its source
    /// is a private wrapper, which `downcast_ref::<redis::RedisError>` on
    /// the source does not see through.
    pub(crate) fn redis_error(&self) -> Option<&redis::RedisError> {
        self.source_ref::<RedisCause>().map(|cause| &cause.0)
    }

    fn source_ref<T: StdError + 'static>(&self) -> Option<&T> {
        self.inner
            .source
            .as_deref()
            .and_then(|s| s.downcast_ref::<T>())
    }
}

impl fmt::Display for LockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(
            self.inner
                .subject
                .unwrap_or_else(|| self.inner.kind.describe()),
        )?;
        if let Some(key) = &self.inner.key {
            write!(f, " (key {key:?}")?;
            if let Some(waited) = self.inner.waited {
                write!(f, ", waited {waited:?}")?;
            }
            f.write_str(")")?;
        } else if let Some(waited) = self.inner.waited {
            write!(f, " (waited {waited:?})")?;
        }
        if let Some(message) = &self.inner.message {
            write!(f, ": {message}")?;
        }
        Ok(())
    }
}

/// [`LockError::chain`]: the error, then each source in turn.
struct Chain<'a>(&'a LockError);

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = StdError::source(self.0);
        while let Some(cause) = source {
            write!(f, ": {cause}")?;
            source = cause.source();
        }
        Ok(())
    }
}

/// A `redis` crate error as the source of a [`LockError`], saying its text
/// once. A `RedisError` made from a server's answer (or an I/O error)
/// prints that answer and also gives it as its own source, so a chain
/// printed whole would repeat it; this source has none.
struct RedisCause(redis::RedisError);

impl fmt::Display for RedisCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl fmt::Debug for RedisCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl StdError for RedisCause {}

impl fmt::Debug for LockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("LockError");
        d.field("kind", &self.inner.kind);
        if let Some(key) = &self.inner.key {
            d.field("key", key);
        }
        if let Some(waited) = &self.inner.waited {
            d.field("waited", waited);
        }
        if let Some(message) = &self.inner.message {
            d.field("message", message);
        }
        if let Some(loss) = &self.inner.loss {
            d.field("loss_reason", loss);
        }
        if let Some(source) = &self.inner.source {
            d.field("source", source);
        }
        d.finish()
    }
}

impl StdError for LockError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.inner
            .source
            .as_deref()
            .map(|s| s as &(dyn StdError + 'static))
    }
}

/// The source of an [`ErrorKind::Unavailable`] error when Redis did not
/// answer within the configured bound.
///
/// Made by this crate only; more about the bound may be added.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct TimedOut {
    /// The bound that ran out.
    pub after: Duration,
}

impl fmt::Display for TimedOut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "no answer within {:?}", self.after)
    }
}

impl StdError for TimedOut {}

/// What went wrong on one server of a Redlock quorum.
#[derive(Debug)]
pub struct NodeError {
    addr: String,
    error: LockError,
}

impl NodeError {
    pub(crate) fn new(addr: &str, error: LockError) -> NodeError {
        NodeError {
            addr: addr.to_owned(),
            error,
        }
    }

    /// The server's address (`host:port`).
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// What went wrong there.
    pub fn error(&self) -> &LockError {
        &self.error
    }
}

impl fmt::Display for NodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.addr, self.error.chain())
    }
}

/// The source of an error when a Redlock quorum could not be reached: how
/// many servers granted, refused (held by another owner) or failed, and what
/// went wrong on each failed one. Reach it with [`LockError::node_errors`].
#[derive(Debug)]
pub struct QuorumFailure {
    pub(crate) granted: usize,
    pub(crate) busy: usize,
    pub(crate) needed: usize,
    pub(crate) failures: Vec<NodeError>,
}

impl QuorumFailure {
    /// Servers that said yes.
    pub fn granted(&self) -> usize {
        self.granted
    }

    /// Servers where another owner held the lock.
    pub fn busy(&self) -> usize {
        self.busy
    }

    /// How many servers had to agree.
    pub fn needed(&self) -> usize {
        self.needed
    }

    /// The servers that failed or did not answer in time.
    pub fn failures(&self) -> &[NodeError] {
        &self.failures
    }
}

impl fmt::Display for QuorumFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} of {} needed servers agreed ({} held elsewhere, {} failed",
            self.granted,
            self.needed,
            self.busy,
            self.failures.len()
        )?;
        for failure in &self.failures {
            write!(f, "; {failure}")?;
        }
        f.write_str(")")
    }
}

impl StdError for QuorumFailure {}

/// Error codes a server answers while it cannot serve for a moment: waiting
/// helps, so they count as [`ErrorKind::Unavailable`] (retried within an
/// acquisition's wait, and by the heartbeat), not as a final answer.
const PASSING: [&str; 5] = ["LOADING", "BUSY", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN"];

/// Everything a lock client's ACL user needs, in `ACL SETUSER` syntax:
/// the documented user of docs/deployment.md ("Redis ACL"), which the
/// suite creates from that page and checks this text against.
const LOCK_CLIENT_ACL: &str = "+set +get +del +exists +pexpire +pttl +time +evalsha \
                               +script|load +publish +subscribe +unsubscribe +ping +info \
                               +type +zadd +zrem +zremrangebyscore +zrange +zcard +zscore \
                               ~<prefix>* &<prefix>*";

/// Classifies a Redis error: connection trouble, and a server that cannot
/// serve for a moment, is `Unavailable`; an error the server answered with
/// is `Server`.
///
/// A refusal by an ACL (`NOPERM`, also from a command inside a script) says
/// which permission is missing and how to grant it; a failed login says to
/// check the credentials.
pub(crate) fn from_redis(err: redis::RedisError) -> LockError {
    /// The commands lock-core's Lua scripts call, each checked against the
    /// user's rules as it runs.
    const SCRIPT_COMMANDS: &str = "+set +get +del +exists +pexpire +pttl +time +publish +type \
                                   +zadd +zrem +zremrangebyscore +zrange +zcard +zscore, and \
                                   +zcount for inspect and force_release";
    /// What some deployments and calls need on top of [`LOCK_CLIENT_ACL`].
    const EXTRA_ACL: &str = "(and +cluster|slots +asking on a Redis Cluster, +role with \
                             Sentinel, +wait with min_replicas, +scan +zcount for the \
                             operators' inspect, list and force_release)";

    /// The explanation of an ACL refusal: which permission, and how to
    /// grant it. Understands the wordings of Redis 6.2 to 7.4 and Valkey,
    /// at the top level (`NOPERM ...`) and inside a script (`ERR The user
    /// executing the script can't run this command ...`, `ERR ACL failure
    /// in script: ...`).
    fn missing_permission(detail: &str) -> String {
        let lower = detail.to_ascii_lowercase();
        let in_script = lower.contains("script");
        let what = if let Some(command) = lower
            .split_once("permissions to run the '")
            .and_then(|(_, rest)| rest.split_once('\''))
            .map(|(command, _)| command)
        {
            format!("may not run `{command}` (grant it with ACL SETUSER <user> +{command})")
        } else if lower.contains("can't run this command") {
            format!(
                "may not run one of the commands the lock's Lua script calls (ACL LOG names \
                 it; scripts need {SCRIPT_COMMANDS})"
            )
        } else if lower.contains("channel") {
            // Before the keys: a refused PUBLISH inside a script is "can't
            // publish to the channel mentioned in the command".
            "may not use the lock's release channel (grant the client's key prefix as a \
             channel pattern with ACL SETUSER <user> &<prefix>*)"
                .to_owned()
        } else if lower.contains("keys") || lower.contains("a key") {
            "may not access the lock's key (grant the client's key prefix with \
             ACL SETUSER <user> ~<prefix>*)"
                .to_owned()
        } else {
            "lacks a permission (ACL LOG names it)".to_owned()
        };
        let place = if in_script { " inside a script" } else { "" };
        format!(
            "permission denied by the server's ACL{place}: the Redis user {what}; \
             a lock client needs {LOCK_CLIENT_ACL} {EXTRA_ACL}"
        )
    }

    let passing = err.code().filter(|code| PASSING.contains(code));
    let kind = match err.kind() {
        _ if passing.is_some() => ErrorKind::Unavailable,
        redis::ErrorKind::Server(_) | redis::ErrorKind::Extension => ErrorKind::Server,
        redis::ErrorKind::AuthenticationFailed => ErrorKind::Server,
        redis::ErrorKind::InvalidClientConfig => ErrorKind::Config,
        _ => ErrorKind::Unavailable,
    };
    let detail = err.detail().unwrap_or_default();
    let message = if let Some(code) = passing {
        Some(format!(
            "the server cannot serve for a moment ({code}: loading its data, running a long \
             script, or a failover under way); acquisitions try again within their wait"
        ))
    } else if err.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm)
        || detail.contains("no permissions to")
        || detail.contains("can't run this command")
        || detail.contains("ACL failure")
        || detail.contains("The user executing the script can't")
    {
        Some(missing_permission(detail))
    } else if err.code() == Some("NOAUTH") {
        Some(
            "the server requires a login: put the user name and password in the URL \
             (redis://user:password@host:port)"
                .to_owned(),
        )
    } else if err.kind() == redis::ErrorKind::AuthenticationFailed
        || err.code() == Some("WRONGPASS")
    {
        Some(
            "the server refused the credentials: check the user name and password in the URL \
             (redis://user:password@host:port) and that the ACL user is enabled (on)"
                .to_owned(),
        )
    } else {
        None
    };
    let error = LockError::new(kind).with_redis_source(err);
    match message {
        Some(message) => error.with_message(message),
        None => error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_key_wait_and_message() {
        let err = LockError::new(ErrorKind::Contended)
            .with_key("order:1")
            .with_waited(Duration::from_millis(250))
            .with_message("try again later");
        let text = err.to_string();
        assert!(text.contains("held by another owner"), "{text}");
        assert!(text.contains("\"order:1\""), "{text}");
        assert!(text.contains("250ms"), "{text}");
        assert!(text.contains("try again later"), "{text}");
        assert_eq!(err.key(), Some("order:1"));
        assert!(err.is_contended());
    }

    #[test]
    fn timeout_is_reachable_as_source() {
        let err = LockError::new(ErrorKind::Unavailable).with_source(TimedOut {
            after: Duration::from_secs(1),
        });
        assert!(err.is_timeout());
        assert!(err.source().is_some());
    }

    #[test]
    fn passing_server_states_are_unavailable_and_say_so() {
        for (kind, code) in [
            (redis::ServerErrorKind::BusyLoading, "LOADING"),
            (redis::ServerErrorKind::TryAgain, "TRYAGAIN"),
            (redis::ServerErrorKind::ClusterDown, "CLUSTERDOWN"),
            (redis::ServerErrorKind::MasterDown, "MASTERDOWN"),
        ] {
            let err = from_redis(redis::RedisError::from((
                redis::ErrorKind::Server(kind),
                "the server cannot serve",
            )));
            assert_eq!(err.kind(), ErrorKind::Unavailable, "{code}");
            assert!(err.to_string().contains(code), "{err}");
        }
        let busy = from_redis(redis::make_extension_error(
            "BUSY".to_owned(),
            Some("Redis is busy running a script.".to_owned()),
        ));
        assert_eq!(busy.kind(), ErrorKind::Unavailable, "{busy}");
        let wrong_type = from_redis(redis::make_extension_error(
            "WRONGTYPE".to_owned(),
            Some("Operation against a key holding the wrong kind of value".to_owned()),
        ));
        assert_eq!(wrong_type.kind(), ErrorKind::Server, "{wrong_type}");
    }

    #[test]
    fn display_leaves_the_source_to_the_chain_which_says_it_once() {
        // A server's answer: the `redis` crate's error prints it and also
        // gives it as its own source.
        let answer = redis::make_extension_error(
            "WRONGTYPE".to_owned(),
            Some("Operation against a key holding the wrong kind of value".to_owned()),
        );
        assert!(StdError::source(&answer).is_some());
        let err = from_redis(answer).with_key("order:1");
        let said = err.to_string();
        assert_eq!(said, "redis answered with an error (key \"order:1\")");
        let Some(source) = err.source() else {
            panic!("no source: {err:?}");
        };
        assert!(
            source.to_string().contains("wrong kind of value"),
            "{source}"
        );
        assert!(source.source().is_none(), "{source:?}");
        assert!(
            err.redis_error()
                .is_some_and(|e| e.code() == Some("WRONGTYPE"))
        );
        let whole = err.chain().to_string();
        assert_eq!(whole, format!("{said}: {source}"));
        assert_eq!(whole.matches("wrong kind of value").count(), 1, "{whole}");

        let timed_out = LockError::new(ErrorKind::Unavailable)
            .with_message("cannot connect to a:1")
            .with_source(TimedOut {
                after: Duration::from_secs(1),
            });
        assert_eq!(
            timed_out.to_string(),
            "redis is unavailable: cannot connect to a:1"
        );
        assert_eq!(
            timed_out.chain().to_string(),
            "redis is unavailable: cannot connect to a:1: no answer within 1s"
        );
    }

    #[test]
    fn errors_are_send_sync_and_small() {
        fn assert_send_sync<T: Send + Sync + 'static>() {}
        assert_send_sync::<LockError>();
        assert_eq!(
            std::mem::size_of::<LockError>(),
            std::mem::size_of::<usize>()
        );
    }
}
