//! Operating locks: who holds a lock ([`LockClient::inspect`]), which locks
//! are held ([`LockClient::list`]), and breaking a stuck one
//! ([`LockClient::force_release`]). See `docs/operating.md`.

use super::LockClient;
use crate::backend::{Forced, OperatorKeys, RawState, ScanAt, glob_escape};
use crate::client_state::ClientInner;
use crate::error::{ErrorKind, LockError};
use crate::observe;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// What kind of holder a lock key has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LockKind {
    /// One exclusive holder (lock-core's, or another client's that follows
    /// `docs/format.md`).
    Exclusive,
    /// Shared holders ([`LockOptions::shared`](crate::LockOptions::shared)).
    Shared,
    /// Permits ([`LockOptions::permits`](crate::LockOptions::permits)): at
    /// most this many holders.
    Permits(u32),
    /// A key of another Redis type than a string: some other program's
    /// key, not a lock.
    Foreign,
}

/// What holds a lock, as [`LockClient::inspect`] and [`LockClient::list`]
/// found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockState {
    key: String,
    kind: LockKind,
    holder: Option<String>,
    held_for: Option<Duration>,
    remaining: Option<Duration>,
    fence: Option<u64>,
    holders: u64,
    waiters: Vec<LockWaiter>,
}

/// A task waiting for a lock, as its wait record in Redis says (see
/// [`LockState::waiters`] and `docs/deadlocks.md`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockWaiter {
    holder: String,
    waited: Duration,
}

impl LockWaiter {
    /// The holder name of the waiter's client
    /// ([`LockClientBuilder::holder_name`](crate::LockClientBuilder::holder_name)).
    pub fn holder(&self) -> &str {
        &self.holder
    }

    /// How long it has waited, by the server's clock.
    pub fn waited(&self) -> Duration {
        self.waited
    }

    /// A waiters set's member: `<owner>|<since ms>|<holder>`, at `now_ms`.
    fn parse(member: &str, now_ms: i64) -> Option<LockWaiter> {
        let mut fields = member.splitn(3, '|');
        let _owner = fields.next()?;
        let since_ms: i64 = fields.next()?.parse().ok()?;
        let holder = fields.next()?.to_owned();
        let waited = u64::try_from(now_ms.saturating_sub(since_ms)).unwrap_or(0);
        Some(LockWaiter {
            holder,
            waited: Duration::from_millis(waited),
        })
    }
}

impl LockState {
    /// The lock's name, as the caller gave it (without prefix and braces).
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Exclusive, shared, permits, or not a lock at all.
    pub fn kind(&self) -> LockKind {
        self.kind
    }

    /// The holder's name ([`LockClientBuilder::holder_name`](crate::LockClientBuilder::holder_name),
    /// `hostname:pid` by default) for an exclusive lock taken by lock-core;
    /// `None` for shared holders, permits and foreign clients' locks.
    pub fn holder(&self) -> Option<&str> {
        self.holder.as_deref()
    }

    /// How long the holder has held it, on the server's clock (as the
    /// acquiring client estimated it); `None` when the value does not say.
    pub fn held_for(&self) -> Option<Duration> {
        self.held_for
    }

    /// How long until the key expires unless renewed (the longest-lived
    /// holder's, for shared holders and permits); [`Duration::MAX`] for a
    /// key without expiry (a foreign client's lock taken without one).
    pub fn remaining(&self) -> Duration {
        self.remaining.unwrap_or(Duration::MAX)
    }

    /// Whether the key expires at all.
    pub fn expires(&self) -> bool {
        self.remaining.is_some()
    }

    /// The holder's fencing token, when it took one.
    pub fn fencing_token(&self) -> Option<u64> {
        self.fence
    }

    /// How many hold it: the live shared holders or permits, 1 for an
    /// exclusive holder.
    pub fn holders(&self) -> u64 {
        self.holders
    }

    /// How many tasks, in every process and client, wait for this lock
    /// now: those that have waited past a short threshold (50 ms), as their
    /// wait records in Redis say. A record outlives a crashed waiter by
    /// two seconds at most.
    pub fn waiting(&self) -> usize {
        self.waiters.len()
    }

    /// The tasks that wait for this lock (see [`waiting`](Self::waiting)),
    /// the longest wait first.
    pub fn waiters(&self) -> &[LockWaiter] {
        &self.waiters
    }

    /// The state described by a server's raw answer about `key`.
    fn from_raw(key: &str, raw: RawState) -> LockState {
        let remaining = u64::try_from(raw.pttl_ms).ok().map(Duration::from_millis);
        let mut state = LockState {
            key: key.to_owned(),
            kind: LockKind::Exclusive,
            holder: None,
            held_for: None,
            remaining,
            fence: None,
            holders: raw.holders,
            waiters: Vec::new(),
        };
        if raw.foreign {
            state.kind = LockKind::Foreign;
            state.holders = 0;
        } else if raw.value == "shared" {
            state.kind = LockKind::Shared;
        } else if let Some(n) = raw.value.strip_prefix("permits:") {
            state.kind = LockKind::Permits(n.parse().unwrap_or(0));
        } else if let Some(fields) = ValueFields::parse(&raw.value) {
            state.holder = Some(fields.holder.to_owned());
            state.fence = fields.fence;
            state.held_for = u64::try_from(raw.now_ms.saturating_sub(fields.acquired_ms))
                .ok()
                .map(Duration::from_millis);
        }
        state
    }
}

/// The fields of an exclusive lock value: `<token>|<acquired ms>|<fence or
/// empty>|<holder>` (see `docs/format.md`).
struct ValueFields<'a> {
    acquired_ms: i64,
    fence: Option<u64>,
    holder: &'a str,
}

impl<'a> ValueFields<'a> {
    fn parse(value: &'a str) -> Option<ValueFields<'a>> {
        let mut fields = value.splitn(4, '|');
        let token = fields.next()?;
        let acquired_ms = fields.next()?.parse().ok()?;
        let fence = fields.next()?;
        let holder = fields.next()?;
        if token.is_empty() {
            return None;
        }
        Some(ValueFields {
            acquired_ms,
            fence: fence.parse().ok(),
            holder,
        })
    }
}

/// Where the next page of a [`LockClient::list`] starts. It prints and
/// parses as text (`server:cursor`), for tools that page across calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LockCursor(ScanAt);

impl fmt::Display for LockCursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.0.server, self.0.cursor)
    }
}

impl FromStr for LockCursor {
    type Err = LockError;

    fn from_str(s: &str) -> Result<LockCursor, LockError> {
        let parsed = s
            .split_once(':')
            .and_then(|(server, cursor)| Some((server.parse().ok()?, cursor.parse().ok()?)));
        match parsed {
            Some((server, cursor)) => Ok(LockCursor(ScanAt { server, cursor })),
            None => Err(LockError::config(format!(
                "{s:?} is not a lock listing cursor (server:cursor)"
            ))),
        }
    }
}

/// One page of [`LockClient::list`].
#[derive(Debug, Clone)]
pub struct LockPage {
    /// The locks held on this page.
    pub locks: Vec<LockState>,
    /// Where the next page starts; `None` when the listing is complete.
    pub next: Option<LockCursor>,
}

impl LockClient {
    /// What holds the lock `key` now; `Ok(None)` when it is free.
    ///
    /// Two script calls sent together: one reads the key (`GET`, `PTTL`,
    /// `TIME`, and `ZCOUNT` for shared holders and permits), the other its
    /// waiters ([`LockState::waiters`]); bounded by the operation timeout. A key of
    /// another Redis type is reported with [`LockKind::Foreign`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lock_core::LockError> {
    /// use std::time::Duration;
    /// let client = lock_core::LockClient::builder()
    ///     .in_memory(&lock_core::MemoryStore::new())
    ///     .holder_name("worker-7")
    ///     .build()
    ///     .await?;
    /// let _guard = client.lock("order:42", Duration::from_secs(30)).await?;
    /// let state = client.inspect("order:42").await?.expect("held");
    /// assert_eq!(state.holder(), Some("worker-7"));
    /// assert!(client.inspect("order:43").await?.is_none());
    /// # Ok(()) }
    /// ```
    pub async fn inspect(&self, key: &str) -> Result<Option<LockState>, LockError> {
        self.inspect_with(key, true).await
    }

    /// [`inspect`](Self::inspect), reading the key's waiters only with
    /// `waiters` (a second script call, beside the first).
    pub(crate) async fn inspect_with(
        &self,
        key: &str,
        waiters: bool,
    ) -> Result<Option<LockState>, LockError> {
        let inner = &self.inner;
        let keys = KeyNames::of(inner, key)?;
        let waiters_key = crate::waits::waiters_key(&keys.lock);
        let listed = async {
            match waiters {
                true => inner.backend.waiters(&waiters_key, inner.op_timeout).await,
                false => Ok(Default::default()),
            }
        };
        let (raw, waiters) = futures::future::join(
            inner
                .backend
                .inspect(&keys.operator_keys(), inner.op_timeout),
            listed,
        )
        .await;
        let raw = raw.map_err(|e| e.with_key(key))?;
        let Some(raw) = raw else {
            return Ok(None);
        };
        inner
            .holder
            .learn_offset(raw.now_ms, crate::token::local_now_ms());
        let mut state = LockState::from_raw(key, raw);
        let waiters = waiters.map_err(|e| e.with_key(key))?;
        state.waiters = waiters
            .members
            .iter()
            .filter_map(|m| LockWaiter::parse(m, waiters.now_ms))
            .collect();
        state.waiters.sort_by_key(|w| std::cmp::Reverse(w.waited));
        Ok(Some(state))
    }

    /// Breaks the lock `key`, whoever holds it (an exclusive holder, every
    /// shared holder or permit): deletes it, wakes its waiters, and logs a
    /// WARN naming the evicted holder. `Ok(true)` when something was held.
    ///
    /// The evicted holder is not told at once: its guard reports the loss
    /// at its next renewal (within a third of its ttl, two thirds while the
    /// heartbeat is behind), as for any lock
    /// taken over; until then it may still think it holds the lock. Use
    /// fencing tokens where that matters. A key of another Redis type is
    /// left alone, with an [`ErrorKind::InvalidKey`] error.
    pub async fn force_release(&self, key: &str) -> Result<bool, LockError> {
        Ok(self.evict(key).await?.is_some())
    }

    /// [`force_release`](Self::force_release), answering what was evicted
    /// (its holder, fencing token, how long it had been held, how many
    /// shared holders or permits), or `Ok(None)` when the lock was free.
    /// Its [`remaining`](LockState::remaining) is what the evicted lease
    /// had left when it was broken.
    pub async fn evict(&self, key: &str) -> Result<Option<LockState>, LockError> {
        let inner = &self.inner;
        let keys = KeyNames::of(inner, key)?;
        let forced = inner
            .backend
            .force_release(&keys.operator_keys(), inner.op_timeout)
            .await
            .map_err(|e| e.with_key(key))?;
        match forced {
            Forced::Free => Ok(None),
            Forced::Foreign(kind) => Err(LockError::new(ErrorKind::InvalidKey)
                .with_key(key)
                .with_message(format!(
                    "the key holds a Redis {kind}, not a lock: some other program uses it; \
                     nothing was deleted"
                ))),
            Forced::Evicted {
                value,
                holders,
                pttl_ms,
            } => {
                let raw = RawState {
                    value,
                    foreign: false,
                    pttl_ms,
                    now_ms: inner.holder.server_now_ms(),
                    holders,
                };
                let state = LockState::from_raw(key, raw);
                observe::force_released(key, state.holder(), state.kind());
                Ok(Some(state))
            }
        }
    }

    /// One page of the locks held under this client's key prefix whose
    /// names match `pattern` (a Redis glob on the name as the caller gives
    /// it, `*` when `None`), from `cursor` (`None` for the first page).
    ///
    /// Uses `SCAN` (never `KEYS`), so a large keyspace is walked a few
    /// hundred keys per call without blocking the server; on a Redis
    /// Cluster every primary is walked in turn. As with `SCAN`, a page may
    /// be empty while `next` is set, and a lock taken or released during
    /// the listing may or may not appear. Each call, and each inspection
    /// of a key found, is bounded by the operation timeout. Not on Redlock
    /// ([`ErrorKind::Config`]).
    pub async fn list(
        &self,
        pattern: Option<&str>,
        cursor: Option<LockCursor>,
    ) -> Result<LockPage, LockError> {
        let inner = &self.inner;
        let scan = format!(
            "{}{{{}}}",
            glob_escape(&inner.prefix),
            pattern.unwrap_or("*")
        );
        let at = cursor.map(|c| c.0).unwrap_or_default();
        let page = inner.backend.scan(&scan, at, inner.op_timeout).await?;
        let names: Vec<&str> = page
            .keys
            .iter()
            .filter_map(|storage| caller_key(&inner.prefix, storage))
            .collect();
        let states = futures::future::join_all(names.iter().map(|name| self.inspect(name))).await;
        let mut locks = Vec::with_capacity(states.len());
        for state in states {
            locks.extend(state?);
        }
        locks.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(LockPage {
            locks,
            next: page.next.map(LockCursor),
        })
    }

    /// Every lock [`list`](Self::list) finds, page after page, sorted by
    /// name.
    pub async fn list_all(&self, pattern: Option<&str>) -> Result<Vec<LockState>, LockError> {
        let mut all = Vec::new();
        let mut cursor = None;
        loop {
            let page = self.list(pattern, cursor).await?;
            all.extend(page.locks);
            match page.next {
                Some(next) => cursor = Some(next),
                None => break,
            }
        }
        all.sort_by(|a, b| a.key.cmp(&b.key));
        all.dedup_by(|a, b| a.key == b.key);
        Ok(all)
    }
}

/// The caller's name inside a storage key `<prefix>{<name>}`.
fn caller_key<'a>(prefix: &str, storage: &'a str) -> Option<&'a str> {
    storage
        .strip_prefix(prefix)?
        .strip_prefix('{')?
        .strip_suffix('}')
        .filter(|name| !name.is_empty())
}

/// The Redis keys of one lock an operator acts on.
struct KeyNames {
    lock: String,
    holders: String,
    tombstone: String,
}

impl KeyNames {
    fn of(inner: &ClientInner, key: &str) -> Result<KeyNames, LockError> {
        let lock = inner.storage_key(key)?;
        Ok(KeyNames {
            holders: format!("{lock}:holders"),
            tombstone: format!("{lock}:evicted"),
            lock,
        })
    }

    fn operator_keys(&self) -> OperatorKeys<'_> {
        OperatorKeys {
            lock: &self.lock,
            holders: &self.holders,
            tombstone: &self.tombstone,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_parse_into_holder_time_and_fence() {
        let raw = RawState {
            value: "0123456789abcdef0123456789abcdef|1000|77|web-1:42".to_owned(),
            foreign: false,
            pttl_ms: 5000,
            now_ms: 4000,
            holders: 1,
        };
        let state = LockState::from_raw("k", raw);
        assert_eq!(state.holder(), Some("web-1:42"));
        assert_eq!(state.held_for(), Some(Duration::from_secs(3)));
        assert_eq!(state.fencing_token(), Some(77));
        assert_eq!(state.remaining(), Duration::from_secs(5));
        // A foreign client's value: held, nobody named.
        let raw = RawState {
            value: "d2f0c5a4b0e611ee8c90".to_owned(),
            foreign: false,
            pttl_ms: -1,
            now_ms: 4000,
            holders: 1,
        };
        let state = LockState::from_raw("k", raw);
        assert_eq!(state.holder(), None);
        assert!(!state.expires());
        assert_eq!(caller_key("lock:", "lock:{a:b}"), Some("a:b"));
        assert_eq!(caller_key("lock:", "lock:{a}:fence"), None);
    }
}
