//! The lock kinds beyond one exclusive key: several keys at once
//! ([`LockClient::lock_all`]), shared holders and permits
//! ([`LockOptions::shared`], [`LockOptions::permits`]). Each is an
//! acquisition of its own built from the same steps as the plain lock's
//! (`acquire.rs`): the request, this process's queues, and the loop of
//! attempts woken by release messages.

use crate::acquire::{Contender, Lost, MayHold, MayHoldKeys, Request, Won, fence_key, writer_key};
use crate::backend::Backend;
use crate::backend::{Joined, LockKeys, Several, no_members_on_redlock};
use crate::error::LockError;
use crate::guard::LockGuard;
use crate::hold::member_keys;
use crate::lease::{Membership, Part, Scope, validity_end};
use crate::options::{LockOptions, Mode};
use crate::queue::{Front, Handoff};
use crate::state::{ClientInner, LockClient, spawn_release};
use crate::token::Token;
use std::sync::Arc;
use std::sync::atomic::AtomicU32;
use std::time::Duration;
use tokio::time::Instant;

impl LockClient {
    /// Several keys, exclusively, all or none: `keys` already in canonical
    /// order, without duplicates, at least two.
    pub(crate) async fn acquire_several(
        &self,
        keys: &[&str],
        options: LockOptions,
        attempts: &AtomicU32,
    ) -> Result<LockGuard, LockError> {
        let inner = &self.inner;
        if options.mode != Mode::Exclusive {
            return Err(LockError::options(
                "lock_all takes exclusive locks only: shared locks and permits are one key each",
            )
            .with_key(keys[0]));
        }
        let request = self.request(keys[0], &options)?;
        let storage_keys = keys
            .iter()
            .map(|key| inner.shared_storage_key(key).map_err(|e| e.with_key(*key)))
            .collect::<Result<Vec<Arc<str>>, LockError>>()?;
        // This process's queues, in canonical order: two tasks asking for
        // the same keys in opposite orders meet in the same order here too.
        let mut fronts = Vec::with_capacity(storage_keys.len());
        for key in &storage_keys {
            // First in one key's queue, the task may wait in the next one's
            // until its wait ends.
            let (owner, handoff) = self.join_queue_of(key, &request, request.end).await?;
            fronts.push(Front::new(&inner.queues, key, owner));
            self.free_handoff(key, handoff, request.deadline).await;
        }
        let mut several = SeveralKeys {
            inner,
            request: &request,
            keys: &storage_keys,
            fences: options
                .fencing
                .then(|| storage_keys.iter().map(|k| fence_key(k)).collect()),
            writers: storage_keys.iter().map(|k| writer_key(k)).collect(),
            busy: 0,
        };
        let Won(token, fences, sent) = self
            .contend_with(&request, &mut several, &fronts, attempts)
            .await?;
        let parts: Box<[Part]> = storage_keys
            .iter()
            .enumerate()
            .map(|(i, key)| Part {
                storage_key: key.clone(),
                key_start: request.key_start,
                fence: fences.get(i).copied(),
            })
            .collect();
        let first_fence = parts.first().and_then(|p| p.fence);
        let lease = request
            .lease(token, first_fence, validity_end(sent, request.ttl))
            .with_scope(Scope::Several(parts));
        Ok(LockGuard::several(
            inner.clone(),
            lease,
            request.renewal(sent),
            fronts,
        ))
    }

    /// What the task ahead handed over to a lock on several keys: a lease
    /// of one key under another token is released (this lock needs its own
    /// token on every key), a turn after a spent budget waits its pause.
    async fn free_handoff(&self, key: &Arc<str>, handoff: Option<Handoff>, deadline: Instant) {
        match handoff {
            Some(Handoff::Lease(handed, _)) => {
                let until = handed.valid_until;
                spawn_release(self.inner.clone(), key.clone(), handed.token, None, until);
            }
            Some(Handoff::Free { after, .. }) if after > Duration::ZERO => {
                tokio::time::sleep_until(deadline.min(Instant::now() + after)).await;
            }
            _ => {}
        }
    }

    /// A shared holder or a permit of `key`: no queue in this process (its
    /// holders do not wait for one another), one attempt after another in
    /// Redis until admitted or the wait runs out.
    pub(crate) async fn acquire_member(
        &self,
        key: &str,
        options: LockOptions,
        attempts: &AtomicU32,
    ) -> Result<LockGuard, LockError> {
        let inner = &self.inner;
        if let Backend::Redlock(_) = *inner.backend {
            return Err(no_members_on_redlock().with_key(key));
        }
        if options.fencing {
            return Err(LockError::options(
                "fencing tokens order exclusive holders, one after another; shared holders \
                 and permits hold at the same time and have none",
            )
            .with_key(key));
        }
        let request = self.request(key, &options)?;
        let (marker, limit) = (
            member_marker(options.mode),
            match options.mode {
                Mode::Permits(n) => n,
                _ => 0,
            },
        );
        let membership = Membership {
            holders: holders_key(&request.storage_key),
            writer: writer_key(&request.storage_key),
            marker,
            limit,
        };
        let mut member = Member {
            inner,
            request: &request,
            membership: &membership,
        };
        let Won(token, (), sent) = self
            .contend_with(&request, &mut member, &[], attempts)
            .await?;
        let lease = request
            .lease(token, None, validity_end(sent, request.ttl))
            .with_scope(Scope::Member(Box::new(membership)));
        Ok(LockGuard::member(
            inner.clone(),
            lease,
            request.renewal(sent),
        ))
    }
}

/// Attempts on several keys at once.
struct SeveralKeys<'a, 'k> {
    inner: &'a Arc<ClientInner>,
    request: &'a Request<'k>,
    /// The storage keys, in canonical order.
    keys: &'a [Arc<str>],
    /// Their fence counters, with fencing.
    fences: Option<Vec<String>>,
    /// Their writer marks.
    writers: Vec<String>,
    /// The key the last attempt found held.
    busy: usize,
}

impl Contender for SeveralKeys<'_, '_> {
    type Won = Won<Vec<u64>>;

    async fn attempt(&mut self, _retry: bool) -> Result<Self::Won, Lost> {
        let (inner, request) = (self.inner, self.request);
        let writer_for = request.writer_for(inner);
        let what = MayHoldKeys::Several(self.keys);
        let held = MayHold::of(inner, &self.keys[0], what, Token::generate(), request.ttl);
        let keys: Vec<LockKeys<'_>> = self
            .keys
            .iter()
            .enumerate()
            .map(|(i, lock)| LockKeys {
                lock,
                fence: self.fences.as_ref().map(|f| f[i].as_str()),
                writer: Some((self.writers[i].as_str(), writer_for)),
                holder: Some(&inner.holder),
            })
            .collect();
        let limit = request.limit(inner.op_timeout);
        let sent = Instant::now();
        let outcome = inner
            .backend
            .acquire_all(&keys, held.token(), request.ttl, writer_for, limit)
            .await;
        match outcome {
            Ok(Several::Granted(fences)) => Ok(Won(held.keep(), fences, sent)),
            Ok(Several::Busy { at }) => {
                held.keep();
                self.busy = at.min(self.keys.len() - 1);
                Err(Lost::Busy(None))
            }
            Err(e) => Err(Lost::from_error(e)),
        }
    }

    fn listen_on(&self) -> &Arc<str> {
        &self.keys[self.busy]
    }
}

/// Attempts of a shared holder or a permit.
struct Member<'a, 'k> {
    inner: &'a Arc<ClientInner>,
    request: &'a Request<'k>,
    membership: &'a Membership,
}

impl Contender for Member<'_, '_> {
    type Won = Won<()>;

    async fn attempt(&mut self, _retry: bool) -> Result<Self::Won, Lost> {
        let (inner, request) = (self.inner, self.request);
        let what = MayHoldKeys::Member(self.membership);
        let held = MayHold::of(
            inner,
            &request.storage_key,
            what,
            Token::generate(),
            request.ttl,
        );
        let keys = member_keys(&request.storage_key, self.membership);
        let limit = request.limit(inner.op_timeout);
        let sent = Instant::now();
        let outcome = inner
            .backend
            .member_acquire(&keys, held.token(), request.ttl, limit)
            .await;
        match outcome {
            Ok(Joined::Granted) => Ok(Won(held.keep(), (), sent)),
            Ok(Joined::Busy { left }) => {
                held.keep();
                Err(Lost::Busy(left))
            }
            Ok(Joined::Mismatch(found)) => {
                held.keep();
                Err(Lost::Fail(mismatch(&found, &self.membership.marker)))
            }
            Err(e) => Err(Lost::from_error(e)),
        }
    }

    fn listen_on(&self) -> &Arc<str> {
        &self.request.storage_key
    }
}

/// The error for a holder asking for another kind than the key is held as.
pub(crate) fn mismatch(found: &str, asked: &str) -> LockError {
    let says = |marker: &str| match marker.strip_prefix("permits:") {
        Some(n) => format!("with {n} permits"),
        None => "shared".to_owned(),
    };
    LockError::options(format!(
        "the key is held {}, and this asked for it {}: every holder of a key must \
         ask for the same kind of lock (and the same number of permits)",
        says(found),
        says(asked),
    ))
}

/// What the lock key of a shared lock (`shared`) or of permits
/// (`permits:N`) holds while it has holders.
pub(crate) fn member_marker(mode: Mode) -> String {
    match mode {
        Mode::Permits(n) => format!("permits:{n}"),
        _ => "shared".to_owned(),
    }
}

/// The holder set of a lock; shares its hash slot.
fn holders_key(storage_key: &str) -> String {
    let mut out = String::with_capacity(storage_key.len() + 8);
    out.push_str(storage_key);
    out.push_str(":holders");
    out
}

/// The keys in canonical order: sorted, each once.
pub(crate) fn canonical<'k>(keys: &[&'k str]) -> Vec<&'k str> {
    let mut keys = keys.to_vec();
    keys.sort_unstable();
    keys.dedup();
    keys
}
