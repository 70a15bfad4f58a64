//! What every clone of a [`LockClient`](crate::LockClient) shares: its
//! backend, settings, heartbeat and wait queues; and the release that runs
//! in the background when nobody can wait for it.

use crate::backend::{Backend, Wakeups};
use crate::background::Spawner;
use crate::backoff::Backoff;
use crate::error::{ErrorKind, LockError};
use crate::eviction;
use crate::heartbeat::Heartbeat;
use crate::kept::Watcher;
use crate::lease::{Held, MAX_KEY_LEN};
use crate::queue::{HandoffBudget, PassOn, Queues};
use crate::release::{self, LetGo};
use crate::token::{Holder, Token, local_now_ms};
use std::cell::RefCell;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// What every clone of a client shares.
pub(crate) struct ClientInner {
    pub(crate) backend: Arc<Backend>,
    /// The same servers through connections of their own, for the
    /// heartbeat alone (the in-memory store: the same one).
    pub(crate) renewals: Arc<Backend>,
    pub(crate) prefix: String,
    /// Who this client's locks name as their holder, and its estimate of
    /// the server's clock.
    pub(crate) holder: Arc<Holder>,
    pub(crate) default_ttl: Duration,
    pub(crate) default_wait: Duration,
    pub(crate) op_timeout: Duration,
    pub(crate) backoff: Backoff,
    pub(crate) heartbeat: Arc<Heartbeat>,
    pub(crate) queues: Queues,
    pub(crate) handoff: HandoffBudget,
    pub(crate) wakeups: Wakeups,
    /// Where the background work runs: the user's runtime, or lock-core's.
    pub(crate) spawner: Spawner,
    /// What watches this client's acquisitions for being kept unpolled.
    pub(crate) kept: Arc<Watcher>,
}

/// The settings every client has, whatever its backend.
pub(crate) struct Settings {
    pub(crate) prefix: String,
    pub(crate) holder: String,
    pub(crate) default_ttl: Duration,
    pub(crate) default_wait: Duration,
    pub(crate) op_timeout: Duration,
    pub(crate) backoff: Backoff,
    pub(crate) handoff: HandoffBudget,
    /// Releases by the server's own compare-and-delete where it has one.
    pub(crate) native: bool,
    pub(crate) spawner: Spawner,
}

impl ClientInner {
    /// The shared state of a client of checked settings and a backend.
    pub(crate) fn assemble(settings: Settings, backend: Backend) -> Arc<ClientInner> {
        let wakeups = backend.wakeups().spawning_on(settings.spawner.clone());
        let holder = Arc::new(Holder::new(&settings.holder));
        if settings.native {
            backend.release_natively(&holder);
        }
        let backend = Arc::new(backend);
        let renewals = match backend.is_remote() {
            true => Arc::new(backend.twin()),
            false => backend.clone(),
        };
        let inner = Arc::new(ClientInner {
            backend,
            renewals,
            queues: Queues::default(),
            handoff: settings.handoff,
            wakeups,
            holder,
            prefix: settings.prefix,
            default_ttl: settings.default_ttl,
            default_wait: settings.default_wait,
            op_timeout: settings.op_timeout,
            backoff: settings.backoff,
            heartbeat: Arc::new(Heartbeat::new(
                settings.op_timeout,
                settings.spawner.clone(),
            )),
            kept: Watcher::of(&settings.spawner),
            spawner: settings.spawner,
        });
        let weak: std::sync::Weak<ClientInner> = Arc::downgrade(&inner);
        inner.queues.serve(weak as std::sync::Weak<dyn PassOn>);
        inner
    }
}

impl ClientInner {
    /// Runs the release script once, on a key no lock uses: a server that
    /// refuses lock-core's scripts (an ACL without `EVALSHA` or `EVAL`)
    /// fails here, at startup, rather than at the first renewal, when the
    /// lock taken by a plain `SET` would be lost. Only a refusal counts: a
    /// server slow to answer now is the calls' business.
    pub(crate) async fn check_scripts(&self, limit: Duration) -> Result<(), LockError> {
        let probe = self.storage_key("lock-core:script-check")?;
        match self
            .backend
            .release(&probe, &Token::generate(), limit)
            .await
        {
            // The error names the refused command and the ACL rule to add.
            Err(e) if e.kind() == ErrorKind::Server => Err(e),
            _ => Ok(()),
        }
    }

    /// Reads the servers' memory settings (`INFO memory`): a server that
    /// may evict lock keys is warned about once, or refused with `refuse`
    /// (see [`eviction::check`]).
    pub(crate) async fn check_eviction(
        &self,
        limit: Duration,
        refuse: bool,
    ) -> Result<(), LockError> {
        eviction::check(&self.backend, limit, refuse).await
    }

    /// Reads the server's clock (`TIME`) to date the acquisitions this
    /// client writes. Best effort: without an answer (an ACL without
    /// `TIME`) the local clock stands in.
    pub(crate) async fn learn_server_clock(&self, limit: Duration) {
        let before = local_now_ms();
        if let Ok(server_ms) = self.backend.server_time_ms(limit).await {
            let after = local_now_ms();
            self.holder
                .learn_offset(server_ms, before + (after - before) / 2);
        }
    }

    /// The Redis key a lock named `key` is stored under: the prefix, then the
    /// key inside braces (a hash tag, so the lock and its fence counter share
    /// a Redis Cluster slot).
    pub(crate) fn storage_key(&self, key: &str) -> Result<String, LockError> {
        let mut out = String::with_capacity(self.storage_key_len(key)?);
        self.write_storage_key(key, &mut out);
        Ok(out)
    }

    fn write_storage_key(&self, key: &str, out: &mut String) {
        out.push_str(&self.prefix);
        out.push('{');
        out.push_str(key);
        out.push('}');
    }

    /// [`storage_key`](Self::storage_key) as shared text: the lease and the
    /// process's wait queue for the key share it. Written in a buffer the
    /// thread keeps, so that the text is allocated once, where it is shared.
    pub(crate) fn shared_storage_key(&self, key: &str) -> Result<Arc<str>, LockError> {
        thread_local! {
            static TEXT: RefCell<String> = const { RefCell::new(String::new()) };
        }
        // At most `MAX_KEY_LEN` bytes: the buffer stays small.
        self.storage_key_len(key)?;
        let shared = TEXT.try_with(|text| {
            let mut text = text.try_borrow_mut().ok()?;
            text.clear();
            self.write_storage_key(key, &mut text);
            Some(Arc::from(text.as_str()))
        });
        match shared {
            Ok(Some(shared)) => Ok(shared),
            _ => self.storage_key(key).map(Arc::from),
        }
    }

    /// The length of the storage key of `key`, or why `key` is not valid.
    fn storage_key_len(&self, key: &str) -> Result<usize, LockError> {
        if key.is_empty() {
            return Err(
                LockError::new(ErrorKind::InvalidKey).with_message("a lock key must not be empty")
            );
        }
        if key.starts_with('}') {
            // `<prefix>{}...}`: an empty hash tag, so Redis Cluster would
            // hash the whole name and put the fence counter and the holder
            // set of the lock in other slots. Refused everywhere, so a key
            // that works on one server works on Cluster too.
            return Err(LockError::new(ErrorKind::InvalidKey).with_message(
                "a lock key must not start with '}': the key goes inside braces (a Redis \
                 Cluster hash tag) and '}' first would leave the tag empty, scattering the \
                 lock's keys over slots; put another character first",
            ));
        }
        let len = self.prefix.len() + key.len() + 2;
        if len > MAX_KEY_LEN {
            return Err(LockError::new(ErrorKind::InvalidKey).with_message(format!(
                "the key is {len} bytes with its prefix; the limit is {MAX_KEY_LEN}"
            )));
        }
        Ok(len)
    }
}

impl ClientInner {
    /// Lets go of `held` without waiting. Where the connection allows
    /// ([`release::release_now`]) it is written at once, so that it leaves
    /// even when the caller's runtime is shutting down or its process exits
    /// next. Either way it is also sent on lock-core's runtime
    /// ([`LetGo::send`]) and awaited there, sent again while Redis does not
    /// answer until `until` (when it would have expired anyway): a
    /// connection cut just before would swallow the first without a word,
    /// and both are safe to repeat. What the guard's `Drop`, a `release`
    /// cut short, an acquisition cut short and a hand-off nobody took all
    /// call, inside a runtime or not.
    ///
    /// On a runtime the user gave, the release is a task there; should that
    /// runtime drop it unfinished (it shut down), it runs on lock-core's.
    pub(crate) fn release_in_background(self: &Arc<Self>, held: Held, how: LetGo, until: Instant) {
        let done = matches!(how, LetGo::Release) && release::release_now(&self.backend, &held);
        if done && !self.backend.is_remote() {
            // In memory it is done, and nothing can have swallowed it.
            return;
        }
        let inner = self.clone();
        self.spawner.spawn_must("lock-core.release", move || {
            let (inner, held) = (inner.clone(), held.clone());
            async move {
                let limit = inner.op_timeout;
                until_answered(&inner, until, || how.send(&inner.backend, &held, limit)).await;
            }
        });
    }
}

/// Runs `op` until Redis answers it, or until `until` (when what it lets go
/// would have expired anyway), pausing on the client's backoff between
/// tries. A release that timed out (a server paused longer than the
/// operation timeout) is sent again, rather than leaving the key held by
/// nobody for the rest of its ttl once the server resumes and applies what
/// it was sent before.
async fn until_answered<F, Fut>(inner: &ClientInner, until: Instant, mut op: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<bool, LockError>>,
{
    let mut attempt = 0;
    loop {
        match op().await {
            Err(e) if e.kind() == ErrorKind::Unavailable && Instant::now() < until => {
                let pause = inner
                    .backoff
                    .delay(attempt)
                    .min(until.saturating_duration_since(Instant::now()));
                attempt += 1;
                tokio::time::sleep(pause).await;
            }
            _ => return,
        }
    }
}
