//! What a call to the servers sends and what it answers: the keys of one
//! lock, the answers of an attempt, a renewal round's outcomes.

use crate::error::{ErrorKind, LockError};
use crate::observe;
use crate::token::{Holder, Stamped, Token};
use std::sync::Arc;
use std::time::Duration;

/// The most keys renewed by one script call.
pub(crate) const BATCH: usize = 256;

/// One lease in a round of renewals, as the servers need it.
pub(crate) trait Renewable: Sync {
    /// The Redis key.
    fn storage_key(&self) -> &str;
    fn token(&self) -> &Token;
    /// The ttl to renew it for.
    fn ttl(&self) -> Duration;
    /// The lock's name as its holder gave it, for messages.
    fn name(&self) -> &str;
}

impl<R: Renewable> Renewable for &R {
    fn storage_key(&self) -> &str {
        (**self).storage_key()
    }
    fn token(&self) -> &Token {
        (**self).token()
    }
    fn ttl(&self) -> Duration {
        (**self).ttl()
    }
    fn name(&self) -> &str {
        (**self).name()
    }
}

/// One server's answers to a round of batched renewals: for each lease,
/// whether it was still ours, or `None` when its batch's call failed (with
/// the first such failure in `error`).
pub(crate) struct Batched {
    pub(crate) each: Vec<Option<bool>>,
    pub(crate) error: Option<LockError>,
}

impl Batched {
    /// The answers as renewals, reporting a failure (with how many leases
    /// it left unanswered) under the first unanswered lease's name.
    pub(super) fn renewals<R: Renewable>(self, due: &[R]) -> Vec<RenewOutcome> {
        if let Some(e) = &self.error {
            let unanswered = self.each.iter().filter(|r| r.is_none()).count();
            let first = self
                .each
                .iter()
                .position(Option::is_none)
                .and_then(|i| due.get(i));
            if let Some(first) = first {
                observe::renewal_failed(first.name(), unanswered, e);
            }
        }
        let failed = self
            .error
            .as_ref()
            .map_or(RenewOutcome::Failed, RenewOutcome::failed);
        self.each
            .into_iter()
            .map(|answer| match answer {
                Some(true) => RenewOutcome::Renewed,
                Some(false) => RenewOutcome::NotOurs,
                None => failed,
            })
            .collect()
    }
}

/// What a round of renewals said about one lease.
#[derive(Clone, Copy)]
pub(crate) enum RenewOutcome {
    Renewed,
    NotOurs,
    /// Not ours because an operator broke the lock (its tombstone names
    /// our token).
    Evicted,
    /// No answer, or not enough of them: nobody can tell.
    Failed,
    /// An error answer that waiting will not change (a permission the
    /// ACL denies): the lease cannot be kept.
    Refused,
}

impl RenewOutcome {
    /// What a failed renewal call means for its leases.
    pub(crate) fn failed(error: &LockError) -> RenewOutcome {
        match error.kind() {
            ErrorKind::Server => RenewOutcome::Refused,
            _ => RenewOutcome::Failed,
        }
    }
}

/// The answer to one acquisition attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Attempt {
    /// The lock is ours; `fence` is set when a fencing token was asked for.
    Granted { fence: Option<u64> },
    /// Someone else holds it; `left`: how long its lease has left, when
    /// the attempt learnt it (every attempt but a first one without
    /// fencing); `foreign`: its value is not one of ours (another library
    /// holds it, whose release publishes nothing), when the attempt learnt
    /// it (as `left`); `ahead`: on Redlock, this attempt won some servers
    /// but not a majority, the first server that answered among them: of
    /// contenders that split the servers between them, it is the one to
    /// come back at once (see [`Quorum::acquire`](super::quorum::Quorum::acquire)).
    Busy {
        left: Option<Duration>,
        foreign: bool,
        ahead: bool,
    },
}

impl Attempt {
    /// Held by someone else, nothing more known (a first attempt's plain
    /// `SET NX`, or the fencing script).
    pub(crate) const HELD: Attempt = Attempt::Busy {
        left: None,
        foreign: false,
        ahead: false,
    };
}

/// The keys one lock touches; they share a hash slot.
pub(crate) struct LockKeys<'a> {
    pub(crate) lock: &'a str,
    pub(crate) fence: Option<&'a str>,
    /// On an attempt after the first: the key's writer mark, and how long an
    /// attempt that finds shared holders sets it for (see
    /// `scripts::ACQUIRE`). The first attempt without fencing is a plain
    /// `SET NX`.
    pub(crate) writer: Option<(&'a str, Duration)>,
    /// Who acquires: named in the value an acquisition stores (see
    /// `Stamped`); the token alone when `None`.
    pub(crate) holder: Option<&'a Arc<Holder>>,
}

impl LockKeys<'_> {
    /// The same keys, borrowed for a shorter time.
    pub(crate) fn reborrow(&self) -> LockKeys<'_> {
        LockKeys {
            lock: self.lock,
            fence: self.fence,
            writer: self.writer,
            holder: self.holder,
        }
    }

    /// What an acquisition by `token` stores under the lock key.
    pub(crate) fn value_of<'t>(&'t self, token: &'t Token) -> Stamped<'t> {
        Stamped {
            token,
            holder: self.holder.map(|h| &**h),
        }
    }
}

/// The answer to an attempt on several keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Several {
    /// Every key is ours: with fencing, each key's token, in order (empty
    /// without).
    Granted(Vec<u64>),
    /// The key at `at` is held; none was taken.
    Busy { at: usize },
}

/// The answer to a shared holder's or a permit's attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SharedAttempt {
    Granted,
    /// Held exclusively, an exclusive holder waits (for shared), or every
    /// permit is taken; `left`: how long until that may change, when known.
    Busy {
        left: Option<Duration>,
    },
    /// The key is held as something else: the marker found (`shared`, or
    /// `permits:N` with another N).
    Mismatch(String),
}

/// The keys of a lock with shared holders or permits; one hash slot.
#[derive(Clone, Copy)]
pub(crate) struct SharedKeys<'a> {
    /// The lock key: the marker while holders exist.
    pub(crate) lock: &'a str,
    /// The holder set.
    pub(crate) holders: &'a str,
    /// The writer mark.
    pub(crate) writer: &'a str,
    /// `shared` or `permits:N`.
    pub(crate) marker: &'a str,
    /// N, or 0 for shared.
    pub(crate) limit: u32,
}

/// One holder in a round of holder renewals.
pub(crate) struct SharedLease<'a> {
    pub(crate) keys: SharedKeys<'a>,
    pub(crate) token: &'a Token,
    pub(crate) ttl: Duration,
}

/// Why shared locks and permits are refused on Redlock.
pub(crate) fn no_shared_on_redlock() -> LockError {
    LockError::options(
        "shared locks and permits are not available on Redlock: a holder set \
         kept on several independent servers has no majority rule that keeps \
         its count; use one server, Sentinel or Cluster for them",
    )
}
