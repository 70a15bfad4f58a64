//! Locks kept in this process's memory, for unit tests without a server.
//!
//! The same semantics as one Redis server: leases with a ttl that expire on
//! their own, owner tokens checked on renew and release, fencing counters,
//! release wake-ups. Time is `tokio::time::Instant`, so tests that pause
//! tokio's clock (`tokio::time::pause`, `#[tokio::test(start_paused = true)]`)
//! see leases expire exactly when the clock is advanced.

use super::operators::{Forced, RawState, glob_match};
use super::wakeup::Channels;
use super::{
    Attempt, Hop, LockKeys, RenewOutcome, Renewable, Several, SharedAttempt, SharedKeys,
    SharedLease, WaitRecords, WaitersAt,
};
use crate::lease::fence_retention;
use crate::token::Token;
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::time::Instant;

/// Shared storage for in-memory lock clients.
///
/// Every [`LockClient`](crate::LockClient) built on one store sees the same
/// locks, as clients in different processes see the same Redis: give two
/// clients one store to test how two replicas of a service contend.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lock_core::LockError> {
/// use lock_core::{LockClient, MemoryStore};
/// use std::time::Duration;
///
/// let store = MemoryStore::new();
/// let replica_a = LockClient::in_memory_on(&store);
/// let replica_b = LockClient::in_memory_on(&store);
///
/// let held = replica_a.lock("job", Duration::from_secs(10)).await?;
/// assert!(replica_b.try_lock("job", Duration::from_secs(10)).await?.is_none());
/// held.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Default)]
pub struct MemoryStore {
    inner: Arc<Store>,
}

#[derive(Default)]
struct Store {
    state: Mutex<State>,
    /// The release channels of every client on this store.
    listeners: Mutex<Vec<std::sync::Weak<Channels>>>,
}

#[derive(Default)]
struct State {
    locks: HashMap<String, Held>,
    /// Fence counters: the last token, and when the counter expires.
    fences: HashMap<String, (u64, Instant)>,
    /// Shared holders and permits, by lock key.
    groups: HashMap<String, Group>,
    /// Writer marks: when each expires.
    writers: HashMap<String, Instant>,
    /// Tombstones of force-released locks: the evicted tokens, and until
    /// when they are kept.
    evicted: HashMap<String, (Vec<Token>, Instant)>,
    /// Waiters sets: each member, and when it expires.
    waiters: HashMap<String, Vec<(String, Instant)>>,
    /// Wait notes: each wait's note, and when it expires.
    notes: HashMap<String, Vec<(String, Instant)>>,
}

/// The holders of a shared lock or of permits.
struct Group {
    /// `shared` or `permits:N`.
    marker: String,
    holders: Vec<(Token, Instant)>,
}

impl Group {
    /// Drops expired holders; `true` while any remains.
    fn prune(&mut self, now: Instant) -> bool {
        self.holders.retain(|(_, expires)| *expires > now);
        !self.holders.is_empty()
    }
}

impl State {
    /// Whether anyone holds `key` now: an exclusive holder, or live shared
    /// holders or permits.
    fn taken(&mut self, key: &str, now: Instant) -> bool {
        if self.locks.get(key).is_some_and(|held| held.expires > now) {
            return true;
        }
        self.groups.get_mut(key).is_some_and(|g| g.prune(now))
    }

    /// How long the holder of `key` has left (the longest-lived, for shared
    /// holders and permits).
    fn left(&self, key: &str, now: Instant) -> Option<Duration> {
        let exclusive = self.locks.get(key).map(|held| held.expires);
        let members = self
            .groups
            .get(key)
            .and_then(|g| g.holders.iter().map(|(_, e)| *e).max());
        Some(exclusive.max(members)?.saturating_duration_since(now))
    }

    /// An exclusive attempt found `key` taken: with shared holders there,
    /// it marks that a writer waits, for `writer_for`.
    fn mark_writer(&mut self, key: &str, writer: Option<(&str, Duration)>, now: Instant) {
        let shared = self.groups.get(key).is_some_and(|g| g.marker == "shared");
        if let (true, Some((mark, writer_for))) = (shared, writer) {
            self.writers.insert(mark.to_owned(), now + writer_for);
        }
    }
}

struct Held {
    token: Token,
    expires: Instant,
    /// What a server would store: `<token>|<acquired ms>||<holder>`, or the
    /// token alone (see `Holder::value`); the fence is added when shown.
    value: Box<str>,
    fence: Option<u64>,
}

impl Held {
    fn new(keys: &LockKeys<'_>, token: &Token, expires: Instant, fence: Option<u64>) -> Held {
        Held {
            token: token.clone(),
            expires,
            value: keys.value_of(token).to_text().into(),
            fence,
        }
    }

    /// The value a server would hold, its fence field filled in.
    fn value(&self) -> String {
        let (Some(fence), Some((head, rest))) = (self.fence, self.value.split_once('|')) else {
            return self.value.to_string();
        };
        let mut fields = rest.splitn(3, '|');
        match (fields.next(), fields.next(), fields.next()) {
            (Some(acquired), Some(_), Some(holder)) => {
                format!("{head}|{acquired}|{fence}|{holder}")
            }
            _ => self.value.to_string(),
        }
    }
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> MemoryStore {
        MemoryStore::default()
    }

    /// How many locks are held now (expired ones are not counted).
    pub fn held(&self) -> usize {
        let now = Instant::now();
        let state = self.inner.lock();
        let exclusive = state.locks.values().filter(|held| held.expires > now);
        let shared = state.groups.values().flat_map(|g| &g.holders);
        exclusive.count() + shared.filter(|(_, expires)| *expires > now).count()
    }

    /// The channels a client listens on, fed by this store's releases.
    pub(crate) fn channels(&self) -> Arc<Channels> {
        let channels = Arc::new(Channels::default());
        let mut listeners = self
            .inner
            .listeners
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        listeners.retain(|l| l.strong_count() > 0);
        listeners.push(Arc::downgrade(&channels));
        channels
    }

    fn publish(&self, key: &str) {
        let listeners: Vec<Arc<Channels>> = self
            .inner
            .listeners
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter_map(std::sync::Weak::upgrade)
            .collect();
        for channels in listeners {
            channels.notify(key);
        }
    }

    pub(crate) fn acquire(&self, keys: &LockKeys<'_>, token: &Token, ttl: Duration) -> Attempt {
        let now = Instant::now();
        let mut state = self.inner.lock();
        if state.taken(keys.lock, now) {
            state.mark_writer(keys.lock, keys.writer, now);
            // Only lock-core writes here: every holder tells its release.
            return Attempt::Busy {
                left: state.left(keys.lock, now),
                foreign: false,
                ahead: false,
            };
        }
        let fence = keys
            .fence
            .map(|fence_key| next_fence(&mut state, fence_key, ttl));
        state.locks.insert(
            keys.lock.to_owned(),
            Held::new(keys, token, now + ttl, fence),
        );
        if let Some((mark, _)) = keys.writer {
            state.writers.remove(mark);
        }
        Attempt::Granted { fence }
    }

    /// Several keys, all or none.
    pub(crate) fn acquire_all(
        &self,
        keys: &[LockKeys<'_>],
        token: &Token,
        ttl: Duration,
    ) -> Several {
        let now = Instant::now();
        let mut state = self.inner.lock();
        for (at, k) in keys.iter().enumerate() {
            if state.taken(k.lock, now) {
                state.mark_writer(k.lock, k.writer, now);
                return Several::Busy { at };
            }
        }
        let mut fences = Vec::new();
        for k in keys {
            let fence = k
                .fence
                .map(|fence_key| next_fence(&mut state, fence_key, ttl));
            fences.extend(fence);
            state
                .locks
                .insert(k.lock.to_owned(), Held::new(k, token, now + ttl, fence));
            if let Some((mark, _)) = k.writer {
                state.writers.remove(mark);
            }
        }
        Several::Granted(fences)
    }

    /// A shared holder or a permit joins, as `scripts::SHARED_ACQUIRE` does.
    pub(crate) fn shared_acquire(
        &self,
        keys: &SharedKeys<'_>,
        token: &Token,
        ttl: Duration,
    ) -> SharedAttempt {
        let now = Instant::now();
        let mut state = self.inner.lock();
        if state
            .locks
            .get(keys.lock)
            .is_some_and(|held| held.expires > now)
        {
            return SharedAttempt::Busy {
                left: state.left(keys.lock, now),
            };
        }
        let waiting_writer = state
            .writers
            .get(keys.writer)
            .is_some_and(|until| *until > now);
        let group = state
            .groups
            .entry(keys.lock.to_owned())
            .or_insert_with(|| Group {
                marker: keys.marker.to_owned(),
                holders: Vec::new(),
            });
        if !group.prune(now) {
            group.marker = keys.marker.to_owned();
        }
        if group.marker != keys.marker {
            return SharedAttempt::Mismatch(group.marker.clone());
        }
        let full = keys.limit > 0 && group.holders.len() >= keys.limit as usize;
        if full || (keys.limit == 0 && waiting_writer) {
            let first = group.holders.iter().map(|(_, e)| *e).min();
            return SharedAttempt::Busy {
                left: first
                    .filter(|_| full)
                    .map(|e| e.saturating_duration_since(now)),
            };
        }
        group.holders.push((token.clone(), now + ttl));
        SharedAttempt::Granted
    }

    /// A shared holder or a permit leaves; `false`: it was no longer held.
    pub(crate) fn shared_release(&self, keys: &SharedKeys<'_>, token: &Token) -> bool {
        let now = Instant::now();
        let released = {
            let mut state = self.inner.lock();
            let Some(group) = state.groups.get_mut(keys.lock) else {
                return false;
            };
            let before = group.holders.len();
            group
                .holders
                .retain(|(t, expires)| t != token && *expires > now);
            let ours = group.holders.len() < before;
            if group.holders.is_empty() {
                state.groups.remove(keys.lock);
            }
            ours
        };
        self.publish(keys.lock);
        released
    }

    /// Renews shared holders or permits; `exact` sets their expiry to the
    /// ttl, shorter or longer.
    pub(crate) fn shared_renew(&self, holders: &[SharedLease<'_>], exact: bool) -> Vec<bool> {
        let now = Instant::now();
        let mut state = self.inner.lock();
        holders
            .iter()
            .map(|h| {
                let Some(group) = state.groups.get_mut(h.keys.lock) else {
                    return false;
                };
                group.prune(now);
                let Some((_, expires)) = group.holders.iter_mut().find(|(t, _)| t == h.token)
                else {
                    return false;
                };
                let until = now + h.ttl;
                *expires = if exact { until } else { (*expires).max(until) };
                true
            })
            .collect()
    }

    /// The lock at `key` if it is ours and not expired.
    fn ours<'a>(state: &'a mut State, key: &str, token: &Token) -> Option<&'a mut Held> {
        let now = Instant::now();
        state
            .locks
            .get_mut(key)
            .filter(|held| held.expires > now && held.token == *token)
    }

    /// Raises the lease's expiry to `ttl` from now, never lowers it (as the
    /// renewal script does on a server).
    pub(crate) fn renew(&self, key: &str, token: &Token, ttl: Duration) -> bool {
        let mut state = self.inner.lock();
        match Self::ours(&mut state, key, token) {
            Some(held) => {
                held.expires = held.expires.max(Instant::now() + ttl);
                true
            }
            None => false,
        }
    }

    /// Sets the lease's expiry to exactly `ttl` from now.
    pub(crate) fn set_ttl(&self, key: &str, token: &Token, ttl: Duration) -> bool {
        let mut state = self.inner.lock();
        match Self::ours(&mut state, key, token) {
            Some(held) => {
                held.expires = Instant::now() + ttl;
                true
            }
            None => false,
        }
    }

    pub(crate) fn renew_many<R: Renewable>(&self, due: &[R]) -> Vec<RenewOutcome> {
        due.iter()
            .map(|d| {
                if self.renew(d.storage_key(), d.token(), d.ttl()) {
                    RenewOutcome::Renewed
                } else {
                    RenewOutcome::NotOurs
                }
            })
            .collect()
    }

    pub(crate) fn take_over(
        &self,
        keys: &LockKeys<'_>,
        token: &Token,
        ttl: Duration,
    ) -> Option<Attempt> {
        let mut state = self.inner.lock();
        let held = Self::ours(&mut state, keys.lock, token)?;
        held.expires = Instant::now() + ttl;
        let fence = keys
            .fence
            .map(|fence_key| next_fence(&mut state, fence_key, ttl));
        if let (Some(fence), Some(held)) = (fence, state.locks.get_mut(keys.lock)) {
            held.fence = Some(fence);
        }
        Some(Attempt::Granted { fence })
    }

    /// Writes or refreshes a waiter's records, as `scripts::WAIT_RECORD`
    /// does for its waiters sets and notes.
    pub(crate) fn record_wait(&self, records: &WaitRecords<'_>, ttl: Duration) {
        let now = Instant::now();
        let mut state = self.inner.lock();
        for set in records.sets {
            let members = state.waiters.entry(set.clone()).or_default();
            members.retain(|(m, expires)| *expires > now && m != records.member);
            members.push((records.member.to_owned(), now + ttl));
        }
        for (note, value) in records.notes {
            let notes = state.notes.entry(note.clone()).or_default();
            notes.retain(|(v, expires)| *expires > now && v != value);
            notes.push((value.clone(), now + ttl));
        }
    }

    /// Removes a waiter's records, as `ZREM` does.
    pub(crate) fn forget_wait(&self, records: &WaitRecords<'_>) {
        let mut state = self.inner.lock();
        for set in records.sets {
            if let Some(members) = state.waiters.get_mut(set) {
                members.retain(|(m, _)| m != records.member);
                if members.is_empty() {
                    state.waiters.remove(set);
                }
            }
        }
        for (note, value) in records.notes {
            if let Some(notes) = state.notes.get_mut(note) {
                notes.retain(|(v, _)| v != value);
                if notes.is_empty() {
                    state.notes.remove(note);
                }
            }
        }
    }

    /// A lock's value and its live wait notes, as `scripts::WAIT_HOP`
    /// answers.
    pub(crate) fn hop(&self, lock: &str, note: &str) -> Hop {
        let now = Instant::now();
        let state = self.inner.lock();
        let Some(held) = state.locks.get(lock).filter(|h| h.expires > now) else {
            return Hop::default();
        };
        Hop {
            value: Some(held.value()),
            notes: state.notes.get(note).map_or_else(Vec::new, |notes| {
                notes
                    .iter()
                    .filter(|(_, expires)| *expires > now)
                    .map(|(value, _)| value.clone())
                    .collect()
            }),
        }
    }

    /// The live members of a waiters set, as `scripts::WAITERS` answers.
    pub(crate) fn waiters(&self, set: &str) -> WaitersAt {
        let now = Instant::now();
        let state = self.inner.lock();
        let members = state.waiters.get(set).map_or_else(Vec::new, |members| {
            members
                .iter()
                .filter(|(_, expires)| *expires > now)
                .map(|(m, _)| m.clone())
                .collect()
        });
        WaitersAt {
            now_ms: crate::token::local_now_ms(),
            members,
        }
    }

    /// What holds `key` now, as `scripts::INSPECT` answers.
    pub(crate) fn inspect(&self, key: &str) -> Option<RawState> {
        let now = Instant::now();
        let now_ms = crate::token::local_now_ms();
        let mut state = self.inner.lock();
        let left = |until: Instant| {
            i64::try_from(until.saturating_duration_since(now).as_millis()).unwrap_or(i64::MAX)
        };
        if let Some(held) = state.locks.get(key).filter(|h| h.expires > now) {
            return Some(RawState {
                value: held.value(),
                foreign: false,
                pttl_ms: left(held.expires),
                now_ms,
                holders: 1,
            });
        }
        let group = state.groups.get_mut(key)?;
        if !group.prune(now) {
            return None;
        }
        let last = group.holders.iter().map(|(_, e)| *e).max()?;
        Some(RawState {
            value: group.marker.clone(),
            foreign: false,
            pttl_ms: left(last),
            now_ms,
            holders: group.holders.len() as u64,
        })
    }

    /// Removes whatever holds `key` and wakes its waiters, as
    /// `scripts::FORCE_RELEASE` does.
    pub(crate) fn force_release(&self, key: &str) -> Forced {
        let Some(found) = self.inspect(key) else {
            return Forced::Free;
        };
        {
            let mut state = self.inner.lock();
            let mut tokens: Vec<Token> = state
                .locks
                .remove(key)
                .map(|h| h.token)
                .into_iter()
                .collect();
            if let Some(group) = state.groups.remove(key) {
                tokens.extend(group.holders.into_iter().map(|(t, _)| t));
            }
            let keep =
                Instant::now() + Duration::from_millis(u64::try_from(found.pttl_ms).unwrap_or(0));
            let now = Instant::now();
            state.evicted.retain(|_, (_, until)| *until > now);
            let tomb = state
                .evicted
                .entry(key.to_owned())
                .or_insert((Vec::new(), keep));
            tomb.0.extend(tokens);
            tomb.1 = tomb.1.max(keep);
        }
        self.publish(key);
        Forced::Evicted {
            value: found.value,
            holders: found.holders,
            pttl_ms: found.pttl_ms,
        }
    }

    /// Whether `key`'s tombstone names `token`.
    pub(crate) fn was_evicted(&self, key: &str, token: &Token) -> bool {
        let now = Instant::now();
        let state = self.inner.lock();
        state
            .evicted
            .get(key)
            .is_some_and(|(tokens, until)| *until > now && tokens.contains(token))
    }

    /// The keys held now that match `pattern` (a `SCAN MATCH` pattern).
    pub(crate) fn keys_matching(&self, pattern: &str) -> Vec<String> {
        let now = Instant::now();
        let mut state = self.inner.lock();
        let mut keys: Vec<String> = state
            .locks
            .iter()
            .filter(|(key, held)| held.expires > now && glob_match(pattern, key))
            .map(|(key, _)| key.clone())
            .collect();
        let groups = state
            .groups
            .iter_mut()
            .filter(|(key, g)| g.holders.iter().any(|(_, e)| *e > now) && glob_match(pattern, key));
        keys.extend(groups.map(|(key, _)| key.clone()));
        keys.sort();
        keys
    }

    pub(crate) fn release(&self, key: &str, token: &Token) -> bool {
        let released = {
            let mut state = self.inner.lock();
            let ours = Self::ours(&mut state, key, token).is_some();
            if ours {
                state.locks.remove(key);
            }
            ours
        };
        if released {
            self.publish(key);
        }
        released
    }
}

impl Store {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The next fencing token, as the fencing scripts make it: one above the
/// counter, never below the wall clock in microseconds, and the counter kept
/// for [`fence_retention`] from now.
fn next_fence(state: &mut State, fence_key: &str, ttl: Duration) -> u64 {
    let now = Instant::now();
    let last = state
        .fences
        .get(fence_key)
        .filter(|(_, expires)| *expires > now)
        .map_or(0, |(last, _)| *last);
    let clock = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| {
            u64::try_from(since.as_micros()).unwrap_or(u64::MAX)
        });
    let fence = last.saturating_add(1).max(clock);
    state
        .fences
        .insert(fence_key.to_owned(), (fence, now + fence_retention(ttl)));
    fence
}

impl fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStore")
            .field("held", &self.held())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn fence_counters_expire_and_the_next_token_is_still_larger() {
        let store = MemoryStore::new();
        let keys = LockKeys {
            lock: "k",
            fence: Some("k:fence"),
            writer: None,
            holder: None,
        };
        let ttl = Duration::from_secs(1);
        let fence = |store: &MemoryStore| {
            let token = Token::generate();
            let Attempt::Granted { fence: Some(fence) } = store.acquire(&keys, &token, ttl) else {
                panic!("not granted");
            };
            assert!(store.release("k", &token));
            fence
        };
        let first = fence(&store);
        let second = fence(&store);
        assert!(second > first);
        // Kept for its retention from the last acquisition.
        let kept = store
            .inner
            .lock()
            .fences
            .get("k:fence")
            .map(|(_, until)| *until);
        assert!(kept.is_some_and(|until| until > Instant::now() + fence_retention(ttl) / 2));
        // Once that has passed the counter counts for nothing; tokens
        // still grow.
        if let Some(counter) = store.inner.lock().fences.get_mut("k:fence") {
            counter.1 = Instant::now();
        }
        let third = fence(&store);
        assert!(third > second, "{third} after {second}");
    }

    #[tokio::test]
    async fn renew_never_shortens_and_set_ttl_sets_exactly() {
        let store = MemoryStore::new();
        let token = Token::generate();
        let keys = LockKeys {
            lock: "k",
            fence: None,
            writer: None,
            holder: None,
        };
        assert_eq!(
            store.acquire(&keys, &token, Duration::from_secs(30)),
            Attempt::Granted { fence: None }
        );
        // A late renewal for a shorter ttl: still ours, the expiry stays.
        assert!(store.renew("k", &token, Duration::from_millis(50)));
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(store.held(), 1, "a renewal shortened the lease");
        // The exact path shortens.
        assert!(store.set_ttl("k", &token, Duration::from_millis(50)));
        let started = Instant::now();
        while store.held() != 0 {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "set_ttl did not shorten the lease"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(!store.set_ttl("k", &token, Duration::from_secs(1)));
        assert!(!store.renew("k", &token, Duration::from_secs(1)));
    }
}
