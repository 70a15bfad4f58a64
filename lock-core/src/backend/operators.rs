//! What operators ask of the servers: what holds a key, breaking a lock,
//! and which locks exist (`SCAN`, never `KEYS`).
//!
//! These talk in keys and raw answers; `client/operators.rs` turns them into the
//! public [`LockState`](crate::LockState).

use super::majority::{self, Decision, OnSplit, Vote};
use super::{ClusterNode, Node, Server};
use crate::error::{ErrorKind, LockError};
use crate::scripts::{self, Eval};
use redis::Value;
use std::time::Duration;

/// How many keys one `SCAN` call looks at (its `COUNT`).
const SCAN_COUNT: usize = 200;

/// What a lock key held when it was looked at, as the server said it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RawState {
    /// The value: an exclusive lock's value, a marker (`shared`,
    /// `permits:N`), or for a key of another type, that type.
    pub(crate) value: String,
    /// Whether the key holds another type than a string.
    pub(crate) foreign: bool,
    /// `PTTL`: -1 without expiry.
    pub(crate) pttl_ms: i64,
    /// The server's clock, in milliseconds since 1970.
    pub(crate) now_ms: i64,
    /// Live shared holders or permits; 1 for an exclusive holder.
    pub(crate) holders: u64,
}

/// What a forced release found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Forced {
    /// Nothing held the key.
    Free,
    /// This value held it, with this many live holders and this much of
    /// its lease left (`PTTL`: -1 without expiry), and was removed.
    Evicted {
        value: String,
        holders: u64,
        pttl_ms: i64,
    },
    /// A key of this other type: not a lock, left alone.
    Foreign(String),
}

/// Where a listing goes on: which server (of a cluster's primaries, in
/// address order) and that server's `SCAN` cursor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct ScanAt {
    pub(crate) server: usize,
    pub(crate) cursor: u64,
}

/// One page of lock keys, and where the next starts (`None`: done).
pub(crate) struct KeyPage {
    pub(crate) keys: Vec<String>,
    pub(crate) next: Option<ScanAt>,
}

/// The keys of one lock an operator acts on.
pub(crate) struct OperatorKeys<'a> {
    pub(crate) lock: &'a str,
    pub(crate) holders: &'a str,
    pub(crate) tombstone: &'a str,
}

/// What a majority of Redlock's servers say holds a key, decided as soon
/// as a majority agrees: the same value (the holder's token and, with
/// fencing, the token the lift wrote on a majority), or free. A server that
/// granted after the majority had decided holds the same token with a
/// fence of its own, so tokens and fences are compared (not the time of
/// acquisition, which each server's value dates by its own clock). When no
/// majority agrees once every server answered (a lock coming or going, a
/// server frozen), the value most servers hold, the first in server order
/// among equals; `None` when a majority answered and none holds it; else
/// the first error.
pub(super) async fn majority_state<F>(calls: Vec<F>) -> Result<Option<RawState>, LockError>
where
    F: std::future::Future<Output = Result<Option<RawState>, LockError>>,
{
    // One outcome per value held (`None`: free).
    let vote = |answer: &Result<Option<RawState>, LockError>| match answer {
        Ok(state) => Vote::For(state.as_ref().map(|s| holding(&s.value).map(str::to_owned))),
        Err(_) => Vote::Abstain,
    };
    let (decision, answers) = majority::gather(calls, vote, OnSplit::Wait)
        .await
        .drop_rest();
    let held = match decision {
        Decision::Majority(None) => return Ok(None),
        Decision::Majority(Some(held)) => Some(held),
        // Every server answered: the value most of them hold.
        _ => most_held(&answers.by_server),
    };
    let Some(held) = held else {
        // Free only on a majority's word: with most servers silent, the
        // lock may be held there.
        let first_error = answers.into_arrival_order().find_map(Result::err);
        return first_error.map_or(Ok(None), Err);
    };
    // The value as the first server to tell it said it.
    Ok(answers.into_arrival_order().find_map(|answer| {
        answer
            .ok()
            .flatten()
            .filter(|state| holding(&state.value).map(str::to_owned) == held)
    }))
}

/// The value the most servers hold, the first in server order among
/// equals; `None` when none holds one.
fn most_held(answers: &[Option<Result<Option<RawState>, LockError>>]) -> Option<[String; 3]> {
    // (holding, how many servers hold it), in the order first held.
    let mut held: Vec<([&str; 3], usize)> = Vec::new();
    for answer in answers {
        if let Some(Ok(Some(state))) = answer {
            let same = holding(&state.value);
            match held.iter_mut().find(|(seen, _)| *seen == same) {
                Some((_, votes)) => *votes += 1,
                None => held.push((same, 1)),
            }
        }
    }
    // `max_by_key` keeps the last of equals.
    let most = held.iter().rev().max_by_key(|(_, votes)| *votes)?;
    Some(most.0.map(str::to_owned))
}

/// What tells two servers' values of a lock apart: an exclusive value's
/// token, fence and holder (`<token>|<acquired ms>|<fence>|<holder>`),
/// without its time; any other value (a marker, a foreign one) whole.
fn holding(value: &str) -> [&str; 3] {
    let mut fields = value.splitn(4, '|');
    match (fields.next(), fields.next(), fields.next(), fields.next()) {
        (Some(token), Some(_acquired), Some(fence), Some(holder)) => [token, fence, holder],
        _ => [value, "", ""],
    }
}

/// The operators' commands, for every kind of server connection: written
/// once over [`Server::call`], as [`LockCommands`](super::LockCommands) are.
pub(crate) trait OperatorCommands: Server {
    /// [`scripts::INSPECT`] on this server.
    async fn inspect(
        &self,
        keys: &OperatorKeys<'_>,
        limit: Duration,
    ) -> Result<Option<RawState>, LockError> {
        let answer: Vec<Value> = self
            .call(limit, true, |mut conn| {
                let mut inv = Eval::new(&scripts::INSPECT, 2);
                inv.key(keys.lock).key(keys.holders);
                async move { inv.invoke(&mut conn).await }
            })
            .await?;
        raw_state(&answer)
    }

    /// The tokens a tombstone names (space-separated), if any.
    async fn tombstone(
        &self,
        tombstone: &str,
        limit: Duration,
    ) -> Result<Option<String>, LockError> {
        self.call(limit, true, |mut conn| {
            let mut cmd = redis::cmd("GET");
            cmd.arg(tombstone);
            async move { cmd.query_async(&mut conn).await }
        })
        .await
    }

    /// [`scripts::FORCE_RELEASE`] on this server.
    async fn force_release(
        &self,
        keys: &OperatorKeys<'_>,
        limit: Duration,
    ) -> Result<Forced, LockError> {
        let (done, value, holders, pttl_ms): (i64, String, u64, i64) = self
            .call(limit, false, |mut conn| {
                let inv = scripts::waking_call(
                    &scripts::FORCE_RELEASE,
                    &[keys.lock, keys.holders, keys.tombstone],
                    self.wake(),
                );
                async move { inv.invoke(&mut conn).await }
            })
            .await?;
        Ok(match done {
            1 => Forced::Evicted {
                value,
                holders,
                pttl_ms,
            },
            -1 => Forced::Foreign(value),
            _ => Forced::Free,
        })
    }

    /// The server's clock in milliseconds (`TIME`).
    async fn server_time_ms(&self, limit: Duration) -> Result<i64, LockError> {
        self.call(limit, true, |mut conn| async move {
            let (secs, micros): (i64, i64) = redis::cmd("TIME").query_async(&mut conn).await?;
            Ok(secs * 1000 + micros / 1000)
        })
        .await
    }
}

impl<S: Server> OperatorCommands for S {}

impl Node {
    /// One `SCAN cursor MATCH pattern COUNT n`.
    pub(super) async fn scan_once(
        &self,
        pattern: &str,
        cursor: u64,
        limit: Duration,
    ) -> Result<(u64, Vec<String>), LockError> {
        self.call(limit, true, |mut conn| {
            let mut cmd = redis::cmd("SCAN");
            cmd.arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(SCAN_COUNT);
            async move { cmd.query_async(&mut conn).await }
        })
        .await
    }
}

impl ClusterNode {
    /// One `SCAN` call on the primary `at.server` (in address order); the
    /// next page moves to the next primary once this one is done.
    pub(super) async fn scan_page(
        &self,
        pattern: &str,
        at: ScanAt,
        limit: Duration,
    ) -> Result<KeyPage, LockError> {
        let primaries = self.primaries(limit).await?;
        let Some(primary) = primaries.get(at.server) else {
            return Ok(KeyPage {
                keys: Vec::new(),
                next: None,
            });
        };
        let (cursor, keys) = primary.scan_once(pattern, at.cursor, limit).await?;
        let next = if cursor != 0 {
            Some(ScanAt {
                server: at.server,
                cursor,
            })
        } else if at.server + 1 < primaries.len() {
            Some(ScanAt {
                server: at.server + 1,
                cursor: 0,
            })
        } else {
            None
        };
        Ok(KeyPage { keys, next })
    }
}

/// [`scripts::INSPECT`]'s answer.
fn raw_state(answer: &[Value]) -> Result<Option<RawState>, LockError> {
    let malformed =
        || LockError::new(ErrorKind::Server).with_message("the inspection answered in a bad shape");
    let [state, pttl, now, value, holders] = answer else {
        return Err(malformed());
    };
    let state: String = redis::from_redis_value_ref(state).map_err(|_| malformed())?;
    if state == "free" {
        return Ok(None);
    }
    Ok(Some(RawState {
        value: redis::from_redis_value_ref(value).map_err(|_| malformed())?,
        foreign: state == "foreign",
        pttl_ms: redis::from_redis_value_ref(pttl).map_err(|_| malformed())?,
        now_ms: redis::from_redis_value_ref(now).map_err(|_| malformed())?,
        holders: redis::from_redis_value_ref(holders).map_err(|_| malformed())?,
    }))
}

/// A `SCAN MATCH` pattern that matches `text` literally.
pub(crate) fn glob_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Whether `text` matches the glob `pattern` as `SCAN MATCH` does, for the
/// in-memory store: `*`, `?`, `\x` and `[...]` classes (`^` negates, `a-z`
/// ranges).
pub(crate) fn glob_match(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    glob_at(&p, &t)
}

fn glob_at(p: &[char], t: &[char]) -> bool {
    match p.first() {
        None => t.is_empty(),
        Some('*') => (0..=t.len()).any(|i| glob_at(&p[1..], &t[i..])),
        Some('?') => !t.is_empty() && glob_at(&p[1..], &t[1..]),
        Some('\\') if p.len() > 1 => t.first() == Some(&p[1]) && glob_at(&p[2..], &t[1..]),
        Some('[') => {
            let Some(close) = p.iter().position(|c| *c == ']') else {
                return t.first() == Some(&'[') && glob_at(&p[1..], &t[1..]);
            };
            let Some(c) = t.first() else {
                return false;
            };
            let class = &p[1..close];
            let (negate, class) = match class.first() {
                Some('^') => (true, &class[1..]),
                _ => (false, class),
            };
            let mut hit = false;
            let mut i = 0;
            while i < class.len() {
                if i + 2 < class.len() && class[i + 1] == '-' {
                    hit |= class[i] <= *c && *c <= class[i + 2];
                    i += 3;
                } else {
                    hit |= class[i] == *c;
                    i += 1;
                }
            }
            hit != negate && glob_at(&p[close + 1..], &t[1..])
        }
        Some(c) => t.first() == Some(c) && glob_at(&p[1..], &t[1..]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_as_scan_does() {
        assert!(glob_match("lock:{*}", "lock:{order:42}"));
        assert!(!glob_match("lock:{*}", "lock:{order:42}:fence"));
        assert!(glob_match("order:?", "order:4"));
        assert!(glob_match("order:[0-9]", "order:4"));
        assert!(!glob_match("order:[^0-9]", "order:4"));
        assert!(glob_match(&glob_escape("a*b"), "a*b"));
        assert!(!glob_match(&glob_escape("a*b"), "axb"));
    }
}
