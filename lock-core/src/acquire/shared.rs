//! A shared holder or a permit ([`LockOptions::shared`](crate::LockOptions::shared),
//! [`LockOptions::permits`](crate::LockOptions::permits)): a place in the
//! key's holder set.

use super::{Contender, Lost, MayHold, MayHoldKeys, Request, Won, writer_key};
use crate::backend::{SharedAttempt, SharedBackend};
use crate::client_state::ClientInner;
use crate::error::LockError;
use crate::guard::LockGuard;
use crate::lease::{HolderSet, Scope, validity_end};
use crate::options::{LockOptions, Mode};
use crate::release::shared_keys;
use crate::token::Token;
use std::sync::Arc;
use std::sync::atomic::AtomicU32;
use tokio::time::Instant;
impl ClientInner {
    /// A shared holder or a permit of `key`: no queue in this process (its
    /// holders do not wait for one another), one attempt after another in
    /// Redis until admitted or the wait runs out.
    pub(crate) async fn acquire_shared(
        self: &Arc<Self>,
        key: &str,
        options: LockOptions,
        attempts: &AtomicU32,
    ) -> Result<LockGuard, LockError> {
        let inner = self;
        let backend = inner.backend.shared().map_err(|e| e.with_key(key))?;
        if options.fencing {
            return Err(LockError::options(
                "fencing tokens order exclusive holders, one after another; shared holders \
                 and permits hold at the same time and have none",
            )
            .with_key(key));
        }
        let request = self.request(key, &options)?;
        let (marker, limit) = (
            shared_marker(options.mode),
            match options.mode {
                Mode::Permits(n) => n,
                _ => 0,
            },
        );
        let holder_set = HolderSet {
            holders: holders_key(&request.storage_key),
            writer: writer_key(&request.storage_key),
            marker,
            limit,
        };
        let mut holder = SharedHolder {
            inner,
            backend,
            request: &request,
            holder_set: &holder_set,
        };
        let Won { token, sent, .. } = self
            .contend_with(&request, &mut holder, &[], attempts)
            .await?;
        let lease = request
            .lease(token, None, validity_end(sent, request.ttl))
            .with_scope(Scope::Shared(Box::new(holder_set)));
        Ok(LockGuard::shared(
            inner.clone(),
            lease,
            request.renewal(sent),
        ))
    }
}

/// Attempts of a shared holder or a permit.
struct SharedHolder<'a, 'k> {
    inner: &'a Arc<ClientInner>,
    backend: SharedBackend<'a>,
    request: &'a Request<'k>,
    holder_set: &'a HolderSet,
}

impl Contender for SharedHolder<'_, '_> {
    type Won = Won<()>;

    async fn attempt(&mut self, _retry: bool) -> Result<Self::Won, Lost> {
        let (inner, request) = (self.inner, self.request);
        let what = MayHoldKeys::Shared(self.holder_set);
        let held = MayHold::of(
            inner,
            &request.storage_key,
            what,
            Token::generate(),
            request.ttl,
        );
        let keys = shared_keys(&request.storage_key, self.holder_set);
        let limit = request.limit(inner.op_timeout);
        let sent = Instant::now();
        let outcome = self
            .backend
            .shared_acquire(&keys, held.token(), request.ttl, limit)
            .await;
        match outcome {
            Ok(SharedAttempt::Granted) => Ok(Won {
                token: held.keep(),
                fence: (),
                sent,
            }),
            Ok(SharedAttempt::Busy { left }) => {
                held.keep();
                Err(Lost::Busy(left))
            }
            Ok(SharedAttempt::Mismatch(found)) => {
                held.keep();
                Err(Lost::Fail(mismatch(&found, &self.holder_set.marker)))
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
pub(crate) fn shared_marker(mode: Mode) -> String {
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
