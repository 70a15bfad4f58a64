//! Who waits for whom: wait records in Redis, and deadlocks across
//! processes found and broken (see `docs/deadlocks.md`).
//!
//! An acquisition that has waited [`THRESHOLD`] records that it waits: a
//! member of each waited key's waiters set (`<lock key>:waiters`: owner,
//! since when, holder name), which operators count, and, when its task
//! holds locks through annotated bodies of the same client, a wait note
//! beside each key it holds (a member of `<lock key>:waiting`: the holder's
//! token, its owner id, since when, the key it waits for). A task that
//! waits for two keys at once (`join!`) has two notes there, one per wait,
//! so a walker sees both edges. Every record lasts at most
//! [`RECORD_TTL`] and never past the end of the wait; it is refreshed while
//! the wait goes on and removed when the wait ends, however it ends.
//!
//! A waiter that holds locks also follows the chain, [`FIRST_TICK`] after
//! its first look and then every [`TICK`]: the key
//! it waits for is held by a token; the notes beside that key that are
//! that token's say what its holder waits for; and so on along every
//! branch, until keys with no such note (no cycle) or a key this task holds
//! (a cycle). In a cycle
//! every member sees the same members, and the youngest wait (the latest
//! `since`, the larger owner id among equals) gives up with
//! [`ErrorKind::WouldDeadlock`]; the others go on waiting.

use crate::backend::{Hop, WaitRecords};
use crate::client_state::ClientInner;
use crate::current;
use crate::error::{ErrorKind, LockError};
use crate::lease::{Lease, MIN_TTL, Scope};
use crate::observe;
use std::fmt::Write as _;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;
use tokio::time::Instant;

/// How long a wait goes unrecorded: the bench's contended acquisitions,
/// and most hand-offs, end sooner and write nothing.
pub(crate) const THRESHOLD: Duration = Duration::from_millis(50);

/// How often a waiter that holds locks follows the chain.
const TICK: Duration = Duration::from_millis(200);

/// The first pause between walks, shorter: owners that began to wait at
/// the same moment each walk before the others' records are written, and
/// their second walk finds the cycle.
const FIRST_TICK: Duration = Duration::from_millis(50);

/// How long a record lasts unless refreshed: a waiter that crashed leaves
/// its records this long at most.
const RECORD_TTL: Duration = Duration::from_secs(2);

/// How often records are refreshed.
const REFRESH: Duration = Duration::from_secs(1);

/// The longest chain followed.
const MAX_HOPS: usize = 16;

/// Watches an acquisition of `keys` (the caller's names) that waits at
/// most `wait`: once it has waited [`THRESHOLD`], records the wait and
/// follows the chain; completes only with the [`ErrorKind::WouldDeadlock`]
/// error of a wait that closed a cycle and is its youngest. The caller
/// races it against the acquisition (`select!`, the acquisition first) and
/// drops it when the acquisition ends, which removes the records.
///
/// Until [`THRESHOLD`] it has no timer of its own (a timer per acquisition
/// would cost the bench's short contended waits a tenth of their rate): it
/// reads the clock each time it is polled, and every wait of the
/// acquisition wakes its task at the threshold (`Request::check_at` in
/// `acquire/`), which polls it. A wait shorter than that costs a clock
/// read per poll.
pub(crate) async fn watch(inner: &Arc<ClientInner>, keys: &[&str], wait: Duration) -> LockError {
    if wait <= THRESHOLD {
        return std::future::pending().await;
    }
    let started = Instant::now();
    let check_at = started + THRESHOLD;
    std::future::poll_fn(|_| match Instant::now() >= check_at {
        true => Poll::Ready(()),
        false => Poll::Pending,
    })
    .await;
    let waited_ms = i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX);
    let since_ms = inner.holder.server_now_ms().saturating_sub(waited_ms);
    // Boxed: an acquisition that ends sooner carries none of it, and nested
    // annotated calls keep small futures on the stack.
    let deadline = started + wait;
    Box::pin(watch_recorded(inner, keys, since_ms, deadline))
        .await
        .with_waited(started.elapsed())
}

/// [`watch`] once the wait passed [`THRESHOLD`].
async fn watch_recorded(
    inner: &Arc<ClientInner>,
    keys: &[&str],
    since_ms: i64,
    deadline: Instant,
) -> LockError {
    let Some(mut me) = Waiting::new(inner, keys, since_ms) else {
        return std::future::pending().await;
    };
    let mut records = Records::new(inner, &me);
    let mut refreshed: Option<Instant> = None;
    let mut tick = FIRST_TICK;
    loop {
        let now = Instant::now();
        let left = deadline.saturating_duration_since(now);
        if left < MIN_TTL {
            return std::future::pending().await;
        }
        let limit = inner.op_timeout.min(left);
        let first = me.first_busy(limit).await;
        let waits_for = first.as_ref().map(|(i, _)| *i);
        let changed = waits_for.is_some() && waits_for != me.waits_for;
        if changed {
            me.waits_for = waits_for;
            let stale = std::mem::replace(&mut records.notes, me.notes());
            records.forget_notes(stale, limit).await;
        }
        if changed || refreshed.is_none_or(|at| now >= at + REFRESH) {
            records.written = true;
            let ttl = left.min(RECORD_TTL);
            if let Err(e) = inner
                .backend
                .record_wait(&records.as_ref(), ttl, limit)
                .await
            {
                observe::wait_record_failed(me.keys[0], &e);
            }
            refreshed = Some(now);
        }
        if let Some((_, hop)) = first
            && let Some(cycle) = me.walk(hop, limit).await
            && cycle.victim_is_me()
        {
            return cycle.error(&me);
        }
        tokio::time::sleep(tick.min(left)).await;
        tick = TICK;
    }
}

/// The waiting task, as its records describe it.
struct Waiting<'a> {
    inner: &'a Arc<ClientInner>,
    /// The caller's names of the keys waited for.
    keys: &'a [&'a str],
    /// Their storage keys.
    waited: Vec<Arc<str>>,
    owner: u64,
    since_ms: i64,
    /// What the task holds through annotated bodies of this client.
    holds: Vec<Arc<Lease>>,
    /// The waited key the last look found held by another owner.
    waits_for: Option<usize>,
}

impl<'a> Waiting<'a> {
    fn new(inner: &'a Arc<ClientInner>, keys: &'a [&'a str], since_ms: i64) -> Option<Self> {
        let waited = keys
            .iter()
            .map(|k| inner.shared_storage_key(k).ok())
            .collect::<Option<Vec<_>>>()?;
        let (owner, holds) =
            current::holdings(inner).unwrap_or_else(|| (current::new_owner(), vec![]));
        Some(Waiting {
            inner,
            keys,
            waited,
            owner,
            since_ms,
            holds,
            waits_for: None,
        })
    }

    /// The member of the waiters sets: `<owner>|<since ms>|<holder>`.
    fn member(&self) -> String {
        format!(
            "{:016x}|{}|{}",
            self.owner,
            self.since_ms,
            self.inner.holder.name()
        )
    }

    /// The exclusive keys held, each with its lease.
    fn held_keys(&self) -> impl Iterator<Item = (&Arc<str>, &Lease)> {
        self.holds.iter().flat_map(|lease| {
            let keys: Vec<&Arc<str>> = match &lease.held.scope {
                Scope::One => vec![&lease.held.storage_key],
                Scope::Several(parts) => parts.iter().map(|p| &p.storage_key).collect(),
                Scope::Shared(_) => vec![],
            };
            keys.into_iter().map(move |k| (k, &**lease))
        })
    }

    /// Whether `token` is one this task holds a key with.
    fn is_mine(&self, token: &str) -> bool {
        self.holds
            .iter()
            .any(|lease| lease.held.token.as_str() == token)
    }

    /// The wait notes beside each key held: `<token>|<owner>|<since
    /// ms>|<length>|<waited storage key>|<holder>`.
    fn notes(&self) -> Vec<(String, String)> {
        let Some(waits_for) = self.waits_for.map(|i| &self.waited[i]) else {
            return Vec::new();
        };
        self.held_keys()
            .map(|(key, lease)| {
                let note = format!(
                    "{}|{:016x}|{}|{}|{}|{}",
                    lease.held.token.as_str(),
                    self.owner,
                    self.since_ms,
                    waits_for.len(),
                    waits_for,
                    self.inner.holder.name()
                );
                (note_key(key), note)
            })
            .collect()
    }

    /// The first waited key held by another owner, and what was read
    /// there; only for a task that holds keys (nobody waits for the others).
    async fn first_busy(&self, limit: Duration) -> Option<(usize, Hop)> {
        self.held_keys().next()?;
        for (i, key) in self.waited.iter().enumerate() {
            let Ok(hop) = self.hop(key, limit).await else {
                continue;
            };
            if token_of(&hop).is_some_and(|t| !self.is_mine(t)) {
                return Some((i, hop));
            }
        }
        None
    }

    async fn hop(&self, key: &str, limit: Duration) -> Result<Hop, LockError> {
        let decisive = |hop: &Hop| {
            token_of(hop).is_some_and(|t| self.is_mine(t) || Note::all(hop).next().is_some())
        };
        self.inner
            .backend
            .hop(key, &note_key(key), limit, decisive)
            .await
    }

    /// Follows the waits from `hop` (what the waited key holds), along
    /// every note of every holder, depth first: the members of a cycle that
    /// leads back to this task, if one does. At most [`MAX_HOPS`] keys are
    /// read.
    async fn walk(&self, hop: Hop, limit: Duration) -> Option<Cycle> {
        let first = self.waits_for?;
        let mut paths: Vec<(Hop, Vec<Link>)> = vec![(hop, Vec::new())];
        let mut reads = 0;
        while let Some((hop, links)) = paths.pop() {
            let Some(token) = token_of(&hop) else {
                continue;
            };
            if self.is_mine(token) {
                // Back here: a cycle, unless this task waits on itself.
                if links.is_empty() {
                    continue;
                }
                return Some(Cycle {
                    me: (self.owner, self.since_ms),
                    waits_for: self.waited[first].clone(),
                    links,
                });
            }
            for note in Note::all(&hop) {
                if note.owner == self.owner || links.iter().any(|l| l.owner == note.owner) {
                    // A cycle this task is not part of: its members see it.
                    continue;
                }
                if reads == MAX_HOPS {
                    return None;
                }
                reads += 1;
                let next: Arc<str> = note.waits_for.into();
                let Ok(next_hop) = self.hop(&next, limit).await else {
                    continue;
                };
                let mut path = links.clone();
                path.push(Link {
                    owner: note.owner,
                    since_ms: note.since_ms,
                    holder: note.holder.to_owned(),
                    waits_for: next,
                });
                paths.push((next_hop, path));
            }
        }
        None
    }

    /// The caller's name of a storage key.
    fn name_of<'k>(&self, storage_key: &'k str) -> &'k str {
        let prefix = &self.inner.prefix;
        storage_key
            .strip_prefix(prefix.as_str())
            .and_then(|k| k.strip_prefix('{'))
            .and_then(|k| k.strip_suffix('}'))
            .unwrap_or(storage_key)
    }
}

/// The wait note of a lock key; shares its hash slot.
fn note_key(storage_key: &str) -> String {
    format!("{storage_key}:waiting")
}

/// The waiters set of a lock key; shares its hash slot.
pub(crate) fn waiters_key(storage_key: &str) -> String {
    format!("{storage_key}:waiters")
}

/// The token of an exclusive lock's value: its first field.
fn token_of(hop: &Hop) -> Option<&str> {
    let value = hop.value.as_deref()?;
    let token = value.split('|').next()?;
    (token.len() == 32).then_some(token)
}

/// A wait note, parsed; only when it is the current holder's (its token is
/// the lock's).
#[derive(Debug)]
struct Note<'a> {
    owner: u64,
    since_ms: i64,
    waits_for: &'a str,
    holder: &'a str,
}

impl<'a> Note<'a> {
    /// The notes of the key's current holder: one per wait of its.
    fn all(hop: &'a Hop) -> impl Iterator<Item = Note<'a>> {
        let token = token_of(hop);
        hop.notes
            .iter()
            .filter_map(move |note| Note::of(token?, note))
    }

    fn of(token: &str, note: &'a str) -> Option<Note<'a>> {
        let mut fields = note.splitn(5, '|');
        if fields.next()? != token {
            return None;
        }
        let owner = u64::from_str_radix(fields.next()?, 16).ok()?;
        let since_ms = fields.next()?.parse().ok()?;
        let len: usize = fields.next()?.parse().ok()?;
        let rest = fields.next()?;
        let waits_for = rest.get(..len)?;
        let holder = rest.get(len..)?.strip_prefix('|')?;
        Some(Note {
            owner,
            since_ms,
            waits_for,
            holder,
        })
    }
}

/// One other member of a cycle: the owner that holds the key the member
/// before it waits for, and waits for `waits_for`.
#[derive(Clone)]
struct Link {
    owner: u64,
    since_ms: i64,
    holder: String,
    waits_for: Arc<str>,
}

/// A cycle of waits through this task.
struct Cycle {
    /// This task's owner id and since when it waits.
    me: (u64, i64),
    /// The key this task waits for.
    waits_for: Arc<str>,
    /// The other members, from the holder of the key this task waits for.
    links: Vec<Link>,
}

impl Cycle {
    /// Whether this task is the youngest wait of the cycle, the one every
    /// member agrees gives up.
    fn victim_is_me(&self) -> bool {
        let (owner, since_ms) = self.me;
        self.links
            .iter()
            .all(|l| (since_ms, owner) > (l.since_ms, l.owner))
    }

    /// The error naming the cycle.
    fn error(&self, me: &Waiting<'_>) -> LockError {
        let mut message = String::from("a cycle of waits: this task");
        let _ = write!(
            message,
            " ({}) waits for {:?}",
            me.inner.holder.name(),
            me.name_of(&self.waits_for)
        );
        for link in &self.links {
            let _ = write!(
                message,
                ", held by {} which waits for {:?}",
                link.holder,
                me.name_of(&link.waits_for)
            );
        }
        message.push_str(
            ", held by this task; this is the youngest wait of the cycle, so it gives up",
        );
        observe::deadlock(me.keys[0], &message);
        LockError::new(ErrorKind::WouldDeadlock)
            .with_key(me.name_of(&self.waits_for).to_owned())
            .with_message(message)
    }
}

/// A waiter's records as written, removed in the background when the wait
/// ends however it ends (acquired, timed out, failed, or its future
/// dropped).
struct Records {
    inner: Arc<ClientInner>,
    sets: Vec<String>,
    member: String,
    notes: Vec<(String, String)>,
    /// Whether a write may have reached the servers.
    written: bool,
}

impl Records {
    fn new(inner: &Arc<ClientInner>, me: &Waiting<'_>) -> Records {
        Records {
            inner: inner.clone(),
            sets: me.waited.iter().map(|k| waiters_key(k)).collect(),
            member: me.member(),
            notes: Vec::new(),
            written: false,
        }
    }

    /// Removes notes that no longer say what this wait waits for (it now
    /// waits for another key): each wait has one note per key it holds.
    async fn forget_notes(&self, stale: Vec<(String, String)>, limit: Duration) {
        if !self.written || stale.is_empty() {
            return;
        }
        let records = WaitRecords {
            sets: &[],
            member: &self.member,
            notes: &stale,
        };
        let _ = self.inner.backend.forget_wait(&records, limit).await;
    }

    fn as_ref(&self) -> WaitRecords<'_> {
        WaitRecords {
            sets: &self.sets,
            member: &self.member,
            notes: &self.notes,
        }
    }
}

impl Drop for Records {
    fn drop(&mut self) {
        if !self.written {
            return;
        }
        let inner = self.inner.clone();
        let sets = std::mem::take(&mut self.sets);
        let member = std::mem::take(&mut self.member);
        let notes = std::mem::take(&mut self.notes);
        let forget = async move {
            let records = WaitRecords {
                sets: &sets,
                member: &member,
                notes: &notes,
            };
            let _ = inner.backend.forget_wait(&records, inner.op_timeout).await;
        };
        // On the waiter's runtime, beside the connection its records went
        // out on: lock-core's threads may be busy with other clients'
        // connections. Outside a runtime, on lock-core's; a record whose
        // removal never runs expires within its short life anyway.
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn(forget)),
            Err(_) => crate::background::spawn(forget),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn hop(value: &str, note: &str) -> Hop {
        Hop {
            value: Some(value.to_owned()),
            notes: vec![note.to_owned()],
        }
    }

    #[test]
    fn notes_parse_keys_and_holders_with_bars_in_them() {
        let token = "0123456789abcdef0123456789abcdef";
        let waited = "lock:{a|b}";
        let note = format!(
            "{token}|00000000000000ff|1700|{}|{waited}|web|1",
            waited.len()
        );
        let read = hop(&format!("{token}|1700||web|1"), &note);
        let parsed = Note::all(&read).next().unwrap();
        assert_eq!(parsed.owner, 255);
        assert_eq!(parsed.since_ms, 1700);
        assert_eq!(parsed.waits_for, waited);
        assert_eq!(parsed.holder, "web|1");
    }

    #[test]
    fn a_note_of_another_token_is_not_followed() {
        let token = "0123456789abcdef0123456789abcdef";
        let other = "ffffffffffffffffffffffffffffffff";
        let note = format!("{other}|01|1700|3|k:2|web-1");
        assert!(
            Note::all(&hop(&format!("{token}|1||web-1"), &note))
                .next()
                .is_none()
        );
        // A value that is no lock-core token (shared marker, foreign) is
        // never followed either.
        assert!(token_of(&hop("shared", &note)).is_none());
    }
}
