//! One exclusive key ([`LockClient::lock`](crate::LockClient::lock) and
//! friends): join this process's wait queue for the key; take over a lease
//! handed over by the task ahead; or contend for the key in Redis.

use super::{Contender, Lost, MayHold, Request, Won, writer_key};
use crate::backend::Attempt;
use crate::client_state::ClientInner;
use crate::error::LockError;
use crate::guard::{LockGuard, RenewSchedule};
use crate::lease::{Held, MIN_TTL, renewal_due};
use crate::options::LockOptions;
use crate::queue::{Front, HandedLease, Handoff, Owner, Taken};
use crate::release::LetGo;
use crate::token::Token;
use std::sync::Arc;
use std::sync::atomic::AtomicU32;
use std::time::Duration;
use tokio::time::Instant;
impl ClientInner {
    pub(crate) async fn acquire_one(
        self: &Arc<Self>,
        key: &str,
        options: LockOptions,
        attempts: &AtomicU32,
    ) -> Result<LockGuard, LockError> {
        let request = self.request(key, &options)?;
        let inner = self;
        let (owner, handoff) = self.join_queue(&request).await?;
        let front = Front::new(&inner.queues, &request.storage_key, owner);
        let front = match handoff {
            Some(Handoff::Lease { lease: handed, .. }) => {
                match self.take_over(&request, handed, front).await {
                    Ok(guard) => return Ok(guard),
                    Err(front) => front,
                }
            }
            Some(Handoff::Free { after, .. }) if after > Duration::ZERO => {
                tokio::time::sleep_until(request.deadline.min(Instant::now() + after)).await;
                front
            }
            _ => front,
        };
        self.contend(&request, front, attempts).await
    }

    /// Joins this process's wait queue for the key: returns once this task
    /// is first, with what was handed over to it, if anything.
    async fn join_queue(
        self: &Arc<Self>,
        request: &Request<'_>,
    ) -> Result<(Owner, Option<Handoff>), LockError> {
        // First in the queue, the task makes its first attempt at once.
        let until = Instant::now() + request.limit(self.op_timeout);
        self.join_queue_of(&request.storage_key, request, until)
            .await
    }

    /// Takes over a lease the task ahead handed to this one. `Err(front)`:
    /// it could not be taken over (expired, lost, or not transferable) and
    /// was let go; acquire the key afresh.
    async fn take_over<'a>(
        self: &Arc<Self>,
        request: &Request<'_>,
        handed: HandedLease,
        front: Front<'a>,
    ) -> Result<LockGuard, Front<'a>> {
        let inner = self;
        let ttl = request.ttl;
        let now = Instant::now();
        if request.renew && request.fence_key.is_none() && now + MIN_TTL < handed.valid_until {
            // Nothing to change in Redis now: the lease stays as it is, and
            // the heartbeat sets it to our ttl when it is due (at once if
            // our ttl is the longer).
            let renew_at = handed
                .valid_until
                .checked_sub(ttl)
                .map_or(now, |start| renewal_due(start, ttl))
                .max(now);
            let lease = request.lease(handed.token, None, handed.valid_until);
            return Ok(LockGuard::new(
                inner.clone(),
                lease,
                RenewSchedule::From(renew_at),
                front,
                Taken::HandedOver,
            ));
        }
        let sent = Instant::now();
        if sent >= handed.valid_until {
            let held = Held::one(request.storage_key.clone(), handed.token);
            inner.release_in_background(held, LetGo::Release, handed.valid_until);
            return Err(front);
        }
        // Until the answer is in, the lease is this task's to let go: if the
        // call is cancelled, it is released in the background.
        // A fence drawn now goes into the value: no longer known to the
        // byte, it is released by the script.
        let token = match request.fence_key {
            Some(_) => handed.token.undated(),
            None => handed.token,
        };
        let held = MayHold::new(inner, &request.storage_key, token, request.ttl);
        let limit = request.limit(inner.op_timeout);
        front.promise(Instant::now() + limit);
        let taken = inner
            .backend
            .take_over(request.keys(None, None), held.token(), ttl, limit)
            .await;
        let Ok(Some(Attempt::Granted { fence })) = taken else {
            return Err(front);
        };
        Ok(request.guard(inner, held.keep(), fence, sent, front, Taken::HandedOver))
    }

    /// Acquires the key in Redis, first in this process's queue: one
    /// attempt, then, while the key is held elsewhere, more attempts woken
    /// by its release message or the backoff timer, until the wait runs out.
    async fn contend(
        self: &Arc<Self>,
        request: &Request<'_>,
        front: Front<'_>,
        attempts: &AtomicU32,
    ) -> Result<LockGuard, LockError> {
        let mut one = OneKey {
            inner: self,
            request,
            writer: None,
        };
        let fronts = std::slice::from_ref(&front);
        let Won { token, fence, sent } = self
            .contend_with(request, &mut one, fronts, attempts)
            .await?;
        Ok(request.guard(self, token, fence, sent, front, Taken::FromRedis))
    }
}

/// Attempts on one exclusive key.
struct OneKey<'a, 'k> {
    inner: &'a Arc<ClientInner>,
    request: &'a Request<'k>,
    /// The key's writer mark, made at the first retry.
    writer: Option<String>,
}

impl Contender for OneKey<'_, '_> {
    type Won = Won;

    /// One attempt with a token of its own: a late answer to an earlier
    /// attempt (or its undo) can never touch a later one's key.
    async fn attempt(&mut self, retry: bool) -> Result<Won, Lost> {
        let (inner, request) = (self.inner, self.request);
        if retry && self.writer.is_none() {
            self.writer = Some(writer_key(&request.storage_key));
        }
        // Should this future be dropped before the answer is in, the SET may
        // still be applied: the token is then released in the background.
        // Fenced, the value gets the fence the server draws: a token dated
        // for a native release would not name it.
        let token = match request.fence_key {
            Some(_) => Token::generate(),
            None => Token::stamped(&inner.holder),
        };
        let held = MayHold::new(inner, &request.storage_key, token, request.ttl);
        let limit = request.limit(inner.op_timeout);
        let sent = Instant::now();
        let writer = self
            .writer
            .as_deref()
            .map(|w| (w, request.writer_for(inner)));
        // Every backend bounds the call by `limit` as a whole.
        let outcome = inner
            .backend
            .acquire(
                request.keys(writer, Some(&inner.holder)),
                held.token(),
                request.ttl,
                limit,
            )
            .await;
        match outcome {
            Ok(Attempt::Granted { fence }) => Ok(Won {
                token: held.keep(),
                fence,
                sent,
            }),
            Ok(Attempt::Busy {
                left,
                foreign,
                ahead,
            }) => {
                held.keep();
                Err(if foreign {
                    Lost::Foreign(left)
                } else if ahead {
                    Lost::Ahead(left)
                } else {
                    Lost::Busy(left)
                })
            }
            // The SET may have been applied with its answer lost: `held`
            // releases that token as it goes.
            Err(e) => Err(Lost::from_error(e)),
        }
    }

    fn listen_on(&self) -> &Arc<str> {
        &self.request.storage_key
    }
}
