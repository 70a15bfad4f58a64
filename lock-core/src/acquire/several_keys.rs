//! Several keys at once, exclusively, all or none
//! ([`LockClient::lock_all`](crate::LockClient::lock_all)).

use super::{Contender, Lost, MayHold, MayHoldKeys, Request, Won, fence_key, writer_key};
use crate::backend::{LockKeys, Several};
use crate::client_state::ClientInner;
use crate::error::LockError;
use crate::guard::LockGuard;
use crate::lease::{Held, Part, Scope, validity_end};
use crate::options::{LockOptions, Mode};
use crate::queue::{Front, Handoff};
use crate::release::LetGo;
use crate::token::Token;
use std::sync::Arc;
use std::sync::atomic::AtomicU32;
use std::time::Duration;
use tokio::time::Instant;
impl ClientInner {
    /// Several keys, exclusively, all or none: `keys` already in canonical
    /// order, without duplicates, at least two.
    pub(crate) async fn acquire_several(
        self: &Arc<Self>,
        keys: &[&str],
        options: LockOptions,
        attempts: &AtomicU32,
    ) -> Result<LockGuard, LockError> {
        let inner = self;
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
        let Won {
            token,
            fence: fences,
            sent,
        } = self
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
    async fn free_handoff(
        self: &Arc<Self>,
        key: &Arc<str>,
        handoff: Option<Handoff>,
        deadline: Instant,
    ) {
        match handoff {
            Some(Handoff::Lease { lease: handed, .. }) => {
                let held = Held::one(key.clone(), handed.token);
                self.release_in_background(held, LetGo::Release, handed.valid_until);
            }
            Some(Handoff::Free { after, .. }) if after > Duration::ZERO => {
                tokio::time::sleep_until(deadline.min(Instant::now() + after)).await;
            }
            _ => {}
        }
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
            Ok(Several::Granted(fences)) => Ok(Won {
                token: held.keep(),
                fence: fences,
                sent,
            }),
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

/// The keys in canonical order: sorted, each once.
pub(crate) fn canonical<'k>(keys: &[&'k str]) -> Vec<&'k str> {
    let mut keys = keys.to_vec();
    keys.sort_unstable();
    keys.dedup();
    keys
}
