//! lock-core's own connection to one Redis server, over plain TCP or TLS.
//!
//! A lock cycle is two round trips, so what a round trip costs the client
//! is most of what a lock costs. The `redis` crate's multiplexed connection
//! sends each command through a channel to a driver task, which writes it,
//! reads the reply and hands it back through another channel: two hand-offs
//! between tasks, often between threads, per round trip.
//!
//! Here the calling task writes its command to the socket itself, and the
//! tasks that wait for replies take turns at reading: whichever holds the
//! read side reads for everyone, hands each reply to the task that waits
//! for it (replies come in the order the commands went out), and passes the
//! read side on once its own reply is in. A task with one command in flight
//! (an uncontended lock) so never wakes another task, and many tasks still
//! share one socket, their commands pipelined.
//!
//! Every step can be cancelled (the caller's timeout drops the future): the
//! bytes read and the commands not yet written live in the connection, not
//! in a caller's future, so the next reader carries on where it stopped.
//!
//! The read turn never depends on one caller's task being polled. A future
//! kept alive but never polled again (stored in a struct, a `select!` branch
//! left behind), or a task whose worker thread is blocked by a synchronous
//! call, may hold the turn; every other waiter watches the turn while it
//! waits, and when the holder has read nothing for [`STALL`] it takes the
//! turn over and reads for everyone, the heartbeat's renewals included. The
//! holder, polled again, finds the turn gone and waits like the others. The
//! bytes are read and dispatched under a lock held only for those
//! non-blocking steps, so two readers can never interleave a reply.
//!
//! Nor does it depend on the runtime that opened the connection, whose
//! driver tells the socket's readiness to every waiting task. Should that
//! be a current-thread runtime whose only thread is blocked, a reader told
//! nothing for [`STALL`] reads the socket itself; once that finds a reply
//! nobody was told of, readers read it every [`POLL_ALONE`] and no new call
//! is given the connection, so the next one opens another where it runs.
//!
//! It speaks RESP2, logs in (`AUTH`, with an ACL user name when given) and
//! selects the database. TLS runs over the same steps (see the `tls`
//! module). Unix sockets, RESP3 and Sentinel go through the `redis` crate's
//! connection instead (see `node.rs`).

use redis::aio::ConnectionLike;
use redis::{Cmd, Pipeline, RedisError, RedisFuture, RedisResult, Value};
use std::collections::VecDeque;
use std::io;
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError};
use std::task::{Poll, Waker};
use std::time::Duration;
use tokio::io::Interest;
use tokio::net::TcpStream;
use tokio::sync::{Notify, oneshot};
use tokio::time::{Instant, Sleep};

use crate::scripts;
// Loom's in the model tests (see `model` below).
use crate::sync::{AtomicU64, Mutex, MutexGuard};

pub(crate) mod native;
#[cfg(feature = "tls")]
mod tls;
pub(crate) use tls::TlsConfig;

/// Without the `tls` feature no TLS configuration exists, so no connection
/// has a session.
#[cfg(not(feature = "tls"))]
mod tls {
    use super::ReadBuf;
    use std::io;
    use tokio::net::TcpStream;

    #[derive(Clone)]
    pub(crate) enum TlsConfig {}

    pub(super) enum Session {}

    impl Session {
        pub(super) async fn handshake(
            _: TcpStream,
            _: &str,
            config: &TlsConfig,
        ) -> io::Result<(TcpStream, Session)> {
            match *config {}
        }

        pub(super) fn write(&self, _: &TcpStream, _: &[u8]) -> io::Result<bool> {
            match *self {}
        }

        pub(super) fn read(&self, _: &TcpStream, _: &mut ReadBuf, _: bool) -> io::Result<usize> {
            match *self {}
        }
    }
}

type Reply = RedisResult<Value>;

/// How much room a read asks for at least.
const READ_CHUNK: usize = 16 * 1024;

/// Queued commands go out at once when they reach this many bytes (about
/// fifty lock commands), without waiting for the flush after a yield. With
/// many tasks on one connection, waiting for every task that runs to queue
/// its command sends the commands of a whole wave of replies in one write:
/// the server idles while the client works through the wave, then the
/// client while the server does. Writing every few kilobytes keeps both
/// busy; smaller writes cost each side a system call (on loopback, the
/// delivery too) for a handful of commands (lock-bench's W2 row shows the
/// effect; lock-bench/RESULTS.md says how it was chosen).
const FLUSH_AT: usize = 4 * 1024;

/// How long the holder of the read turn may read nothing, while others wait
/// for replies, before one of them takes the turn over. A reader that is
/// polled reads within microseconds of its socket turning readable; one
/// that has not read for this long is kept unpolled or stuck on a blocked
/// thread. Taking the turn from a reader that was merely slow to run costs
/// nothing but the wake-up.
pub(crate) const STALL: Duration = Duration::from_millis(10);

/// How often a reader reads the socket itself once the runtime that opened
/// the connection stopped telling its readiness (see [`Inner::unheard_io`]).
const POLL_ALONE: Duration = Duration::from_millis(1);

/// Buffers grown past this by an unusually long command or reply are given
/// back once empty.
const KEEP_AT_MOST: usize = 1024 * 1024;

/// A connection to one Redis server; clones share it.
#[derive(Clone)]
pub(crate) struct Wire {
    inner: Arc<Inner>,
}

struct Inner {
    stream: TcpStream,
    /// The TLS session over `stream`, for a `rediss://` server.
    tls: Option<tls::Session>,
    db: i64,
    /// What writers and the reader share; held only for non-blocking steps.
    state: Mutex<State>,
    /// Bytes read and not parsed yet; locked only to read what the socket
    /// holds and hand the replies out, never across a wait.
    read_buf: Mutex<ReadBuf>,
    /// Woken when the read turn is given up.
    turn_free: Notify,
    /// How many reads brought data: a waiter that sees it unchanged for
    /// [`STALL`] takes the read turn over.
    reads: AtomicU64,
    /// Numbers the calls that wait for a reply, to tell who has the turn.
    callers: AtomicU64,
    /// Whether lock-core's scripts are known to be loaded on the server, so
    /// a command sent without waiting for its reply may call one by its
    /// SHA: set once their loads are queued at connect (or an awaited call
    /// succeeded), cleared when such a command is answered `NOSCRIPT` (a
    /// `SCRIPT FLUSH`).
    scripts_loaded: AtomicBool,
    /// Set once the socket held a reply that the runtime which opened the
    /// connection had not told of for [`STALL`]: that runtime is blocked
    /// (a current-thread runtime whose thread is stuck in a synchronous
    /// call). From then on readers read the socket themselves every
    /// [`POLL_ALONE`], and no new call is given this connection. Writes
    /// still go by tokio's readiness: a command that fills the socket's
    /// send buffer meanwhile waits for that runtime, within its bound.
    unheard_io: AtomicBool,
    /// Whether the server deletes by value natively (`DELIFEQ`), as the
    /// first release that asked was told.
    native: native::Support,
}

#[derive(Default)]
struct State {
    /// Where each awaited reply goes, in the order the commands went out.
    waiting: VecDeque<Waiter>,
    /// How many of `waiting` are callers waiting for their reply (not
    /// commands sent unheard).
    callers_waiting: usize,
    /// Commands not fully written yet, from `written` on: the socket's
    /// buffer was full, or nothing has tried since they were added.
    unsent: Vec<u8>,
    /// How much of `unsent` a partial write already took; both go back to
    /// zero once all of it is written, so a non-empty `unsent` always has
    /// bytes left to write.
    written: usize,
    /// How many bytes the socket has taken since the connection opened:
    /// a command queued when this plus what is unsent was `n` is written
    /// once this reaches `n`. Over TLS, bytes count once every record
    /// made so far is written.
    sent_total: u64,
    /// Over TLS: bytes handed to the session whose records are not all
    /// written yet.
    in_tls: u64,
    /// Why the connection broke; every later call fails with it.
    broken: Option<(io::ErrorKind, String)>,
    /// The caller whose turn it is to read for everyone, if any.
    turn: Option<u64>,
    /// The task of that caller while it waits for its socket: woken when
    /// the turn is taken over, so it goes back to waiting for its reply.
    /// The reader never registers on its own reply's channel, or handing
    /// itself its reply would wake its own task (a needless poll, and on a
    /// multi-thread runtime a parked worker woken, every round trip).
    reader: Option<Waker>,
}

/// A command queued without a waiter for its reply, and what was queued
/// before it.
struct Queued {
    /// Nothing was unsent before it.
    idle: bool,
    /// No caller waited for a reply before it.
    alone: bool,
    /// Where it ends in the connection's bytes.
    end: u64,
    /// How many bytes are unsent with it.
    unsent: usize,
}

/// Bytes read from the socket and not parsed yet: `buf[start..end]`.
/// `buf` is initialised all along, so reads go straight into its tail.
struct ReadBuf {
    buf: Vec<u8>,
    start: usize,
    end: usize,
}

impl Wire {
    /// Whether new calls may use this connection: not once the runtime that
    /// opened it stopped telling its socket's readiness (a call that finds
    /// it so opens another where it runs).
    pub(crate) fn takes_calls(&self) -> bool {
        !self.inner.unheard_io.load(Ordering::Relaxed)
    }

    /// Connects to `host:port` (over TLS with `tls`), logs in with the
    /// credentials of `settings` and selects its database.
    ///
    /// Not bounded here: the caller bounds connecting as a whole.
    pub(crate) async fn connect(
        host: &str,
        port: u16,
        settings: &redis::RedisConnectionInfo,
        tls: Option<&TlsConfig>,
    ) -> RedisResult<Wire> {
        let stream = TcpStream::connect((host, port)).await?;
        // Commands of many tasks go out in separate writes: Nagle's
        // algorithm would hold the later ones back for an acknowledgement.
        stream.set_nodelay(true)?;
        let (stream, tls) = match tls {
            Some(config) => {
                let (stream, session) = tls::Session::handshake(stream, host, config).await?;
                (stream, Some(session))
            }
            None => (stream, None),
        };
        let mut wire = Wire {
            inner: Arc::new(Inner {
                stream,
                tls,
                db: settings.db(),
                state: Mutex::new(State::default()),
                scripts_loaded: AtomicBool::new(false),
                read_buf: Mutex::new(ReadBuf {
                    buf: vec![0; READ_CHUNK],
                    start: 0,
                    end: 0,
                }),
                turn_free: Notify::new(),
                reads: AtomicU64::new(0),
                callers: AtomicU64::new(0),
                unheard_io: AtomicBool::new(false),
                native: native::Support::default(),
            }),
        };
        if let Some(password) = settings.password() {
            let mut auth = redis::cmd("AUTH");
            if let Some(user) = settings.username() {
                auth.arg(user);
            }
            match auth.arg(password).query_async::<()>(&mut wire).await {
                // A server older than ACLs (Redis 5) knows only
                // `AUTH password`.
                Err(e)
                    if settings.username().is_some()
                        && e.to_string().contains("wrong number of arguments") =>
                {
                    redis::cmd("AUTH")
                        .arg(password)
                        .query_async::<()>(&mut wire)
                        .await?;
                }
                answer => answer?,
            }
        }
        if settings.db() != 0 {
            redis::cmd("SELECT")
                .arg(settings.db())
                .query_async::<()>(&mut wire)
                .await?;
        }
        wire.load_scripts().await?;
        Ok(wire)
    }

    /// Queues a `SCRIPT LOAD` of every script lock-core calls, without
    /// waiting for the answers, and writes them out: every later command
    /// on the connection finds them loaded, so none is answered `NOSCRIPT`
    /// and sent again behind commands queued after it (see the `scripts`
    /// module). A load the server refuses (an ACL without `script|load`)
    /// shows in the first call of that script, which then loads it itself
    /// and reports the refusal.
    async fn load_scripts(&self) -> RedisResult<()> {
        {
            let mut state = self.inner.state();
            for lua in scripts::ALL {
                redis::cmd("SCRIPT")
                    .arg("LOAD")
                    .arg(lua.code)
                    .write_packed_command(&mut state.unsent);
                state.expect(Waiter::Unheard(Hear::Log(drop)));
            }
        }
        self.mark_scripts_loaded();
        while self.inner.write_out(self.inner.state())? {
            if let Err(err) = self.inner.stream.writable().await {
                return Err(self.inner.fail(err));
            }
        }
        Ok(())
    }

    /// Queues the commands `write` encodes, which answer with `replies`
    /// replies, and gives `each` the receiver of every reply, in order.
    ///
    /// With nothing unsent and no caller waiting for a reply they are
    /// written at once. Otherwise they wait a moment in `unsent` so the
    /// commands of the tasks that run next go out in the same write (fewer
    /// system calls on both sides), up to [`FLUSH_AT`] bytes: `Ok(true)`
    /// tells the call that found `unsent` empty to [`flush`](Self::flush).
    /// Commands sent unheard do not count: the task that sent one (a
    /// release) has usually moved on to its next command, and waiting for
    /// others would cost that lone task a turn of the scheduler.
    fn send(
        &self,
        write: impl FnOnce(&mut Vec<u8>),
        replies: usize,
        mut each: impl FnMut(oneshot::Receiver<Reply>),
    ) -> RedisResult<bool> {
        let mut state = self.inner.state();
        if let Some(err) = state.error() {
            return Err(err);
        }
        // Commands of others not written yet go first: their flusher or
        // whoever reads writes them.
        let idle = state.unsent.is_empty();
        let alone = state.callers_waiting == 0;
        write(&mut state.unsent);
        for _ in 0..replies {
            let (tx, rx) = oneshot::channel();
            state.expect(Waiter::Caller(tx));
            each(rx);
        }
        if (!idle || !alone) && state.unsent.len() - state.written < FLUSH_AT {
            return Ok(idle);
        }
        self.inner.write_out(state)?;
        Ok(false)
    }

    /// Writes the commands queued by the tasks that ran while this one
    /// yielded, its own first. Dropped during the yield (its caller timed
    /// out or gave up), it still writes them: otherwise they would wait for
    /// the connection's next call.
    async fn flush(&self) -> RedisResult<()> {
        /// Writes out on drop unless disarmed.
        struct Pending<'a>(Option<&'a Inner>);
        impl Drop for Pending<'_> {
            fn drop(&mut self) {
                if let Some(inner) = self.0 {
                    // A write error breaks the connection for every caller.
                    let _ = inner.write_out(inner.state());
                }
            }
        }
        let mut pending = Pending(Some(&self.inner));
        tokio::task::yield_now().await;
        pending.0 = None;
        self.inner.write_out(self.inner.state())?;
        Ok(())
    }

    /// Waits for the reply `rx` is for, reading for everyone whenever
    /// nobody else does, or whenever the one who does makes no progress.
    async fn receive(&self, mut rx: oneshot::Receiver<Reply>) -> Reply {
        let me = self.inner.callers.fetch_add(1, Ordering::Relaxed);
        loop {
            if let Some(reply) = self.inner.wait_for_turn(&mut rx, me).await {
                return reply;
            }
            let _turn = Turn {
                inner: &self.inner,
                me,
            };
            if let Some(reply) = self.inner.read_until(&mut rx, me).await {
                return reply;
            }
            // The turn was taken over while this task was not polled.
        }
    }

    /// Sends `cmd` without waiting for its reply: returns once it is written
    /// to the socket, so it reaches the server even if the process exits
    /// next, and every later command on this connection is processed after
    /// it. `hear` gets the reply once some later call reads it, or the
    /// connection's failure.
    ///
    /// With other calls waiting for replies it goes out as
    /// [`send`](Self::send)'s do: the call that found nothing unsent writes
    /// after one turn of the scheduler, for every task that queued
    /// meanwhile. Any other call waits that turn too and writes only if its
    /// command is still unsent then. Each writing what it found would send
    /// many small writes, each costing a system call here and a read on the
    /// server.
    pub(crate) async fn send_unheard(&self, cmd: &Cmd, hear: Hear) -> RedisResult<()> {
        self.send_unheard_all([(cmd, hear)]).await
    }

    /// [`send_unheard`](Self::send_unheard) of several commands, one after
    /// the other with no other command between them.
    pub(crate) async fn send_unheard_all<const N: usize>(
        &self,
        cmds: [(&Cmd, Hear); N],
    ) -> RedisResult<()> {
        let Queued {
            idle,
            alone,
            end,
            unsent,
        } = self.queue_unheard(cmds)?;
        // Dropped at a wait below, it still writes what it can: no other
        // call may be left to write its bytes.
        struct Unwritten<'a>(Option<(&'a Inner, u64)>);
        impl Drop for Unwritten<'_> {
            fn drop(&mut self) {
                if let Some((inner, end)) = self.0 {
                    let _ = inner.sent_below(end);
                }
            }
        }
        let mut unwritten = Unwritten(Some((&self.inner, end)));
        if (!idle || !alone) && unsent < FLUSH_AT {
            if idle {
                self.flush().await?;
            } else {
                // The call that found nothing unsent writes after its turn.
                tokio::task::yield_now().await;
            }
        }
        while self.inner.sent_below(end)? {
            // The socket's buffer is full: wait until it takes more.
            if let Err(err) = self.inner.stream.writable().await {
                return Err(self.inner.fail(err));
            }
        }
        // Written: nothing left for the guard to do.
        unwritten.0 = None;
        Ok(())
    }

    /// Queues each command, whose reply goes to its `Hear`.
    fn queue_unheard<const N: usize>(&self, cmds: [(&Cmd, Hear); N]) -> RedisResult<Queued> {
        let mut state = self.inner.state();
        if let Some(err) = state.error() {
            return Err(err);
        }
        let idle = state.unsent.is_empty();
        let alone = state.callers_waiting == 0;
        for (cmd, hear) in cmds {
            cmd.write_packed_command(&mut state.unsent);
            state.expect(Waiter::Unheard(hear));
        }
        let unsent = state.unsent.len() - state.written;
        Ok(Queued {
            idle,
            alone,
            end: state.sent_total + state.in_tls + unsent as u64,
            unsent,
        })
    }

    /// [`send_unheard`](Self::send_unheard) without waiting for anything,
    /// for code that has no later moment (a guard dropped as its runtime
    /// shuts down or its process exits): whether `cmd` is written to the
    /// socket now. When it is not (the socket's buffer is full, the
    /// connection broke), it may still go out with the next write: the
    /// caller sends it again some other way, which must be safe to repeat.
    pub(crate) fn send_unheard_now(&self, cmd: &Cmd, hear: Hear) -> bool {
        self.send_unheard_all_now([(cmd, hear)])
    }

    /// [`send_unheard_now`](Self::send_unheard_now) of several commands,
    /// one after the other with no other command between them.
    pub(crate) fn send_unheard_all_now<const N: usize>(&self, cmds: [(&Cmd, Hear); N]) -> bool {
        self.queue_unheard(cmds)
            .and_then(|queued| self.inner.sent_below(queued.end))
            .is_ok_and(|unsent_left| !unsent_left)
    }

    /// Whether lock-core's scripts are known to be loaded on this
    /// connection's server (see [`mark_scripts_loaded`](Self::mark_scripts_loaded)).
    pub(crate) fn scripts_loaded(&self) -> bool {
        self.inner.scripts_loaded.load(Ordering::Relaxed)
    }

    /// Records that the scripts are loaded: queued for loading when the
    /// connection opened, or an awaited script call succeeded on it.
    pub(crate) fn mark_scripts_loaded(&self) {
        self.inner.scripts_loaded.store(true, Ordering::Relaxed);
    }

    /// Whether the server deletes by value natively, as far as known.
    pub(crate) fn native(&self) -> &native::Support {
        &self.inner.native
    }

    /// One command, one reply.
    async fn command(&self, cmd: &Cmd) -> Reply {
        let mut receiver = None;
        if self.send(
            |buf| cmd.write_packed_command(buf),
            1,
            |rx| receiver = Some(rx),
        )? {
            self.flush().await?;
        }
        match receiver {
            Some(rx) => self.receive(rx).await,
            None => Err(self.inner.error()),
        }
    }

    /// A pipeline: `offset + count` replies, of which the last `count` are
    /// returned (a transaction's `MULTI` and `QUEUED` answers come first).
    async fn pipeline(
        &self,
        pipeline: &Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        let packed = pipeline.get_packed_pipeline();
        let mut receivers = Vec::with_capacity(offset + count);
        if self.send(
            |buf| buf.extend_from_slice(&packed),
            offset + count,
            |rx| receivers.push(rx),
        )? {
            self.flush().await?;
        }
        let mut values = Vec::with_capacity(count);
        for (i, rx) in receivers.into_iter().enumerate() {
            // An error answer among the first `offset` (a transaction's
            // `MULTI` and `QUEUED`) is reported. Replies of receivers left
            // behind by an early return are dropped when they arrive.
            let value = self.receive(rx).await?;
            if i >= offset {
                values.push(value);
            } else {
                value.extract_error()?;
            }
        }
        Ok(values)
    }
}

impl Inner {
    fn state(&self) -> MutexGuard<'_, State> {
        // Nothing panics while holding it; should something have, the state
        // is still consistent (every change is a single step).
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Writes what the socket takes of the unsent bytes, without waiting;
    /// whether some are left (the socket's buffer is full).
    fn flush(&self, state: &mut State) -> io::Result<bool> {
        if let Some(tls) = &self.tls {
            return flush_tls(tls, &self.stream, state);
        }
        while !state.unsent.is_empty() {
            match self.stream.try_write(&state.unsent[state.written..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    state.written += n;
                    state.sent_total += n as u64;
                    if state.written == state.unsent.len() {
                        state.all_written();
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(!state.unsent.is_empty())
    }

    /// [`flush`](Self::flush) with the state's lock, which it releases;
    /// a write error breaks the connection. Whether unsent bytes are left
    /// (the socket's buffer is full).
    fn write_out(&self, mut state: MutexGuard<'_, State>) -> RedisResult<bool> {
        match self.flush(&mut state) {
            Ok(left) => Ok(left),
            Err(err) => {
                drop(state);
                Err(self.fail(err))
            }
        }
    }

    /// Writes unsent bytes unless the socket has taken the first `end`
    /// bytes of the connection already; whether some of those are still
    /// unsent (the socket's buffer is full).
    fn sent_below(&self, end: u64) -> RedisResult<bool> {
        let mut state = self.state();
        // Written before the connection broke is written.
        if state.sent_total >= end {
            return Ok(false);
        }
        if let Some(err) = state.error() {
            return Err(err);
        }
        match self.flush(&mut state) {
            Ok(_) => Ok(state.sent_total < end),
            Err(err) => {
                drop(state);
                Err(self.fail(err))
            }
        }
    }

    /// Marks the connection broken by `err`: every waiting call and every
    /// later one fails. Returns the error for the caller.
    ///
    /// The error always reads as a dropped connection
    /// (`is_connection_dropped`), whatever broke it (a protocol violation, a
    /// timed-out or unreachable peer), so the node replaces the connection
    /// instead of reporting the same error for every later call. The first
    /// failure is the one every caller hears about.
    fn fail(&self, err: io::Error) -> RedisError {
        let (waiting, broken) = {
            let mut state = self.state();
            if state.broken.is_none() {
                let kind = if RedisError::from(io::Error::from(err.kind())).is_connection_dropped()
                {
                    err.kind()
                } else {
                    io::ErrorKind::ConnectionAborted
                };
                state.broken = Some((kind, err.to_string()));
            }
            state.unsent.clear();
            state.written = 0;
            state.in_tls = 0;
            state.callers_waiting = 0;
            (std::mem::take(&mut state.waiting), state.error())
        };
        // Their receivers now see the channel closed, and ask `error`; a
        // command nobody waits for hears it here.
        for waiter in waiting {
            if let Waiter::Unheard(hear) = waiter {
                hear.hear(Err(self.error()));
            }
        }
        broken.unwrap_or_else(|| RedisError::from(err))
    }

    /// The error of a broken connection.
    fn error(&self) -> RedisError {
        self.state().error().unwrap_or_else(|| {
            RedisError::from(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "the connection was closed",
            ))
        })
    }

    fn read_buf(&self) -> MutexGuard<'_, ReadBuf> {
        self.read_buf.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits until the reply `rx` is for is in (`Some`), or until it is the
    /// turn of caller `me` to read (`None`, the turn taken): when nobody
    /// reads, or when the reader has read nothing for [`STALL`].
    async fn wait_for_turn(&self, rx: &mut oneshot::Receiver<Reply>, me: u64) -> Option<Reply> {
        // The reader and its read count when this waiter started watching.
        let mut watched: Option<(u64, u64)> = None;
        let mut stall = pin!(None::<Sleep>);
        loop {
            match rx.try_recv() {
                Ok(reply) => return Some(reply),
                Err(oneshot::error::TryRecvError::Closed) => return Some(Err(self.error())),
                Err(oneshot::error::TryRecvError::Empty) => {}
            }
            let mut freed = pin!(self.turn_free.notified());
            freed.as_mut().enable();
            {
                let mut state = self.state();
                let reads = self.reads.load(Ordering::Acquire);
                match state.look_at_turn(me, reads, &mut watched, stall_over(stall.as_mut())) {
                    Look::Take { from } => {
                        drop(state);
                        if let Some(task) = from {
                            task.wake();
                        }
                        return None;
                    }
                    Look::Watch => {
                        stall.set(Some(tokio::time::sleep_until(Instant::now() + STALL)));
                    }
                    Look::Wait => {}
                }
            }
            let woke = std::future::poll_fn(|cx| {
                if let Poll::Ready(reply) = Pin::new(&mut *rx).poll(cx) {
                    return Poll::Ready(Some(reply.unwrap_or_else(|_| Err(self.error()))));
                }
                let stalled = stall
                    .as_mut()
                    .as_pin_mut()
                    .is_some_and(|sleep| sleep.poll(cx).is_ready());
                if stalled || freed.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(None);
                }
                Poll::Pending
            })
            .await;
            if woke.is_some() {
                return woke;
            }
        }
    }

    /// Gives up the read turn, if `me` still has it, and wakes a waiter.
    fn pass_turn(&self, me: u64) {
        if self.state().give_up_turn(me) {
            self.turn_free.notify_one();
        }
    }

    /// Reads replies for everyone, handing each to its caller, until the
    /// one `rx` waits for is in (`Some`), or until another caller took the
    /// read turn from `me` (`None`); writes unsent commands on the way.
    async fn read_until(&self, rx: &mut oneshot::Receiver<Reply>, me: u64) -> Option<Reply> {
        loop {
            if let Err(err) = self.dispatch(&mut self.read_buf()) {
                return Some(Err(self.fail(err)));
            }
            match rx.try_recv() {
                Ok(reply) => return Some(reply),
                Err(oneshot::error::TryRecvError::Closed) => return Some(Err(self.error())),
                Err(oneshot::error::TryRecvError::Empty) => {}
            }
            let writing = {
                let state = self.state();
                if let Some(err) = state.error() {
                    return Some(Err(err));
                }
                if state.turn != Some(me) {
                    return None;
                }
                match self.write_out(state) {
                    Ok(writing) => writing,
                    Err(err) => return Some(Err(err)),
                }
            };
            let interest = if writing {
                Interest::READABLE | Interest::WRITABLE
            } else {
                Interest::READABLE
            };
            // A reader that takes the turn over wakes this task, which then
            // waits for its reply like any other caller. Should the socket's
            // runtime say nothing for a stall, the socket is read directly.
            let alone = self.unheard_io.load(Ordering::Relaxed);
            let mut ready = pin!(self.stream.ready(interest));
            let mut stall = pin!(None::<Sleep>);
            let woke = std::future::poll_fn(|cx| {
                {
                    let mut state = self.state();
                    if state.turn != Some(me) {
                        return Poll::Ready(Woke::TakenOver);
                    }
                    match &mut state.reader {
                        Some(task) if task.will_wake(cx.waker()) => {}
                        task => *task = Some(cx.waker().clone()),
                    }
                }
                if !alone && let Poll::Ready(ready) = ready.as_mut().poll(cx) {
                    return Poll::Ready(Woke::Ready(ready));
                }
                if stall.is_none() {
                    let after = if alone { POLL_ALONE } else { STALL };
                    stall.set(Some(tokio::time::sleep(after)));
                }
                match stall.as_mut().as_pin_mut().map(|sleep| sleep.poll(cx)) {
                    Some(Poll::Ready(())) => Poll::Ready(Woke::Stalled),
                    _ => Poll::Pending,
                }
            })
            .await;
            let read = match woke {
                Woke::TakenOver => return None,
                Woke::Ready(Err(err)) => return Some(Err(self.fail(err))),
                // Taken over meanwhile: the new reader reads.
                _ if self.state().turn != Some(me) => continue,
                Woke::Ready(Ok(ready)) if ready.is_readable() => {
                    self.read(&mut self.read_buf(), false)
                }
                Woke::Ready(Ok(_)) => Ok(0),
                Woke::Stalled => {
                    let got = self.read(&mut self.read_buf(), true);
                    if matches!(got, Ok(n) if n > 0) && !alone {
                        // Bytes were there, and nobody was told.
                        self.unheard_io.store(true, Ordering::Relaxed);
                    }
                    got
                }
            };
            if let Err(err) = read {
                return Some(Err(self.fail(err)));
            }
        }
    }

    /// Reads what the socket holds into the buffer (nothing, when it turns
    /// out to hold nothing yet).
    ///
    /// A read that comes back short took all the socket held, so it also
    /// clears the read readiness, or the next wait would return at once and
    /// its read find nothing: a system call per round trip. The read runs
    /// inside `try_io` for that: readiness is cleared only as of when the
    /// read began, so data that arrives meanwhile still wakes the next wait.
    /// With `direct`, the socket is read whatever tokio knows of its
    /// readiness (the runtime that tells it may be blocked). How many bytes
    /// came in.
    fn read(&self, reader: &mut ReadBuf, direct: bool) -> io::Result<usize> {
        let got = match &self.tls {
            Some(tls) => tls.read(&self.stream, reader, direct)?,
            None => self.read_plain(reader, direct)?,
        };
        if got > 0 {
            self.reads.fetch_add(1, Ordering::Release);
        }
        Ok(got)
    }

    /// [`read`](Self::read) from a plain socket: how many bytes.
    fn read_plain(&self, reader: &mut ReadBuf, direct: bool) -> io::Result<usize> {
        reader.compact();
        let room = reader.buf.len() - reader.end;
        let dst = &mut reader.buf[reader.end..];
        let socket = socket2::SockRef::from(&self.stream);
        let mut got = 0;
        let outcome = read_io(&self.stream, direct, || {
            got = io::Read::read(&mut &*socket, &mut *dst)?;
            if got > 0 && got < room {
                // Handled below as data; tells tokio the socket is drained.
                return Err(io::ErrorKind::WouldBlock.into());
            }
            Ok(())
        });
        reader.end += got;
        match outcome {
            Ok(()) if got == 0 => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the server closed the connection",
            )),
            Ok(()) => Ok(got),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                ) =>
            {
                Ok(got)
            }
            Err(e) => Err(e),
        }
    }

    /// Hands every complete reply in the buffer to its caller.
    fn dispatch(&self, reader: &mut ReadBuf) -> io::Result<()> {
        dispatch(&self.state, &self.scripts_loaded, reader)
    }
}

/// [`Inner::dispatch`], over the parts of the connection it uses.
fn dispatch(
    state: &Mutex<State>,
    scripts_loaded: &AtomicBool,
    reader: &mut ReadBuf,
) -> io::Result<()> {
    while let Some((value, len)) = parse(&reader.buf[reader.start..reader.end])? {
        reader.start += len;
        let waiter = {
            let mut state = state.lock().unwrap_or_else(PoisonError::into_inner);
            if state.broken.is_some() {
                // Another task failed the connection meanwhile (and
                // failed the callers these replies were for); `fail`
                // reports its error.
                return Err(io::ErrorKind::ConnectionAborted.into());
            }
            state.next_waiter()
        };
        let Some(waiter) = waiter else {
            return Err(protocol("a reply that no command asked for"));
        };
        match waiter {
            // The caller may have given up (timed out); its reply goes.
            Waiter::Caller(tx) => {
                let _ = tx.send(Ok(value));
            }
            Waiter::Unheard(hear) => {
                if is_noscript(&value) {
                    scripts_loaded.store(false, Ordering::Relaxed);
                }
                hear.hear(Ok(value))
            }
        }
    }
    Ok(())
}

/// [`Inner::flush`] over TLS: every unsent byte goes to the session, which
/// writes what the socket takes of its records; the bytes count as sent
/// once none of those is left.
fn flush_tls(tls: &tls::Session, stream: &TcpStream, state: &mut State) -> io::Result<bool> {
    let fresh = &state.unsent[state.written..];
    let handed = fresh.len() as u64;
    let left = tls.write(stream, fresh)?;
    state.in_tls += handed;
    state.all_written();
    if !left {
        state.sent_total += std::mem::take(&mut state.in_tls);
    }
    Ok(left)
}

/// Whether `value` is a `NOSCRIPT` error reply.
fn is_noscript(value: &Value) -> bool {
    matches!(value, Value::ServerError(e) if e.code() == "NOSCRIPT")
}

/// The read turn of one caller; given up when the caller's reply is in or
/// its future is dropped.
struct Turn<'a> {
    inner: &'a Inner,
    me: u64,
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        self.inner.pass_turn(self.me);
    }
}

/// Whether the stall timer has run out, without registering for a wake-up.
fn stall_over(stall: Pin<&mut Option<Sleep>>) -> bool {
    stall
        .as_pin_mut()
        .is_some_and(|sleep| sleep.is_elapsed() || Instant::now() >= sleep.deadline())
}

/// Where a reply goes.
enum Waiter {
    /// To the call that waits for it.
    Caller(oneshot::Sender<Reply>),
    /// To a function, for a command sent without waiting for its reply
    /// ([`Wire::send_unheard`]): it hears the reply when whoever reads next
    /// reads it, or the connection's failure.
    Unheard(Hear),
}

/// What hears the reply of a command sent without waiting for it.
pub(crate) enum Hear {
    /// A function of the reply alone (it logs a failure): no allocation.
    Log(fn(Reply)),
    /// A closure, for a caller that does something more on a failure (a
    /// cluster's release, sent again through its redirection).
    Then(Box<dyn FnOnce(Reply) + Send>),
}

impl Hear {
    fn hear(self, reply: Reply) {
        match self {
            Hear::Log(hear) => hear(reply),
            Hear::Then(hear) => hear(reply),
        }
    }
}

/// What ended a reader's wait for its socket.
enum Woke {
    /// The socket's runtime told its readiness (or its failure).
    Ready(io::Result<tokio::io::Ready>),
    /// Nothing was told within [`STALL`] (or [`POLL_ALONE`]).
    Stalled,
    /// Another caller took the read turn over.
    TakenOver,
}

/// Runs the read `io` inside tokio's `try_io`, which runs it only when the
/// socket was told readable and clears that on `WouldBlock`; or, `direct`,
/// runs it as it is.
fn read_io<R>(
    stream: &TcpStream,
    direct: bool,
    io: impl FnOnce() -> io::Result<R>,
) -> io::Result<R> {
    if direct {
        io()
    } else {
        stream.try_io(Interest::READABLE, io)
    }
}

/// What a caller waiting for its reply does about the read turn, after a
/// look at it ([`State::look_at_turn`]).
enum Look {
    /// It has the turn now, taken over from the task in `from` (to be woken
    /// so that it waits like the others), if any.
    Take { from: Option<Waker> },
    /// It watches a reader it had not seen: the stall timer starts.
    Watch,
    /// It goes on waiting.
    Wait,
}

impl State {
    /// Caller `me`, waiting for its reply, looks at the read turn, with the
    /// connection's read count at `reads`: takes it when nobody reads, or
    /// when the reader it watches (`watched`: reader and read count when it
    /// started watching) has read nothing since and `stalled` says a stall
    /// has passed; otherwise starts watching the reader it sees now.
    fn look_at_turn(
        &mut self,
        me: u64,
        reads: u64,
        watched: &mut Option<(u64, u64)>,
        stalled: bool,
    ) -> Look {
        let seen = match self.turn {
            None => {
                self.turn = Some(me);
                self.reader = None;
                return Look::Take { from: None };
            }
            Some(reader) => (reader, reads),
        };
        if *watched != Some(seen) {
            *watched = Some(seen);
            return Look::Watch;
        }
        if !stalled {
            return Look::Wait;
        }
        self.turn = Some(me);
        Look::Take {
            from: self.reader.take(),
        }
    }

    /// Caller `me` gives the read turn up, if it has it: whether it had
    /// (a waiter is then woken to take it).
    fn give_up_turn(&mut self, me: u64) -> bool {
        if self.turn != Some(me) {
            return false;
        }
        self.turn = None;
        self.reader = None;
        true
    }

    /// Queues where the reply of the command just queued goes.
    fn expect(&mut self, waiter: Waiter) {
        if matches!(waiter, Waiter::Caller(_)) {
            self.callers_waiting += 1;
        }
        self.waiting.push_back(waiter);
    }

    /// Where the next reply goes.
    fn next_waiter(&mut self) -> Option<Waiter> {
        let waiter = self.waiting.pop_front();
        if matches!(waiter, Some(Waiter::Caller(_))) {
            self.callers_waiting -= 1;
        }
        waiter
    }

    /// Everything unsent has left `unsent` (to the socket, or to the TLS
    /// session); a buffer grown past [`KEEP_AT_MOST`] is given back.
    fn all_written(&mut self) {
        self.unsent.clear();
        self.written = 0;
        if self.unsent.capacity() > KEEP_AT_MOST {
            self.unsent.shrink_to(READ_CHUNK);
        }
    }

    fn error(&self) -> Option<RedisError> {
        self.broken
            .as_ref()
            .map(|(kind, text)| RedisError::from(io::Error::new(*kind, text.clone())))
    }
}

impl ReadBuf {
    /// Drops the parsed bytes and makes room for a read: at least
    /// `READ_CHUNK` bytes, or as much again as a long reply already holds.
    fn compact(&mut self) {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
            if self.buf.len() > KEEP_AT_MOST {
                self.buf.truncate(READ_CHUNK);
                self.buf.shrink_to_fit();
            }
        }
        if self.buf.len() - self.end >= READ_CHUNK {
            return;
        }
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        let room = READ_CHUNK.max(self.end);
        if self.buf.len() - self.end < room {
            self.buf.resize(self.end + room, 0);
        }
    }
}

fn protocol(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("the server broke the protocol: {what}"),
    )
}

/// Parses one RESP2 reply from the start of `buf`: the value and its length
/// in bytes, or `None` when `buf` does not hold all of it yet.
fn parse(buf: &[u8]) -> io::Result<Option<(Value, usize)>> {
    parse_at(buf, 0, 0)
}

/// Arrays deeper than this are refused (the server's replies to lock-core's
/// commands are at most two deep).
const MAX_DEPTH: usize = 32;

fn parse_at(buf: &[u8], at: usize, depth: usize) -> io::Result<Option<(Value, usize)>> {
    let Some(&tag) = buf.get(at) else {
        return Ok(None);
    };
    let Some(line_len) = buf[at + 1..].windows(2).position(|w| w == b"\r\n") else {
        return Ok(None);
    };
    let line = &buf[at + 1..at + 1 + line_len];
    let next = at + 1 + line_len + 2;
    let value = match tag {
        b'+' if line == b"OK" => Value::Okay,
        b'+' => Value::SimpleString(
            String::from_utf8(line.to_vec())
                .map_err(|_| protocol("a status line that is not UTF-8"))?,
        ),
        b':' => Value::Int(integer(line)?),
        b'-' => {
            // The redis crate's own parser, so errors are classified
            // (NOSCRIPT, READONLY, NOPERM, ...) exactly as elsewhere.
            redis::parse_redis_value(&buf[at..next])
                .map_err(|e| protocol(&format!("an unreadable error reply ({e})")))?
        }
        b'$' => {
            let len = integer(line)?;
            if len < 0 {
                Value::Nil
            } else {
                let len = usize::try_from(len).map_err(|_| protocol("a bulk string too long"))?;
                let end = next
                    .checked_add(len)
                    .and_then(|end| end.checked_add(2))
                    .ok_or_else(|| protocol("a bulk string too long"))?;
                if buf.len() < end {
                    return Ok(None);
                }
                if &buf[end - 2..end] != b"\r\n" {
                    return Err(protocol("a bulk string without its line end"));
                }
                return Ok(Some((
                    Value::BulkString(buf[next..end - 2].to_vec()),
                    end - at,
                )));
            }
        }
        b'*' => {
            let len = integer(line)?;
            if len < 0 {
                Value::Nil
            } else {
                if depth >= MAX_DEPTH {
                    return Err(protocol("arrays nested too deep"));
                }
                let len = usize::try_from(len).map_err(|_| protocol("an array too long"))?;
                // Not trusting the announced length for the allocation.
                let mut items = Vec::with_capacity(len.min(1024));
                let mut pos = next;
                for _ in 0..len {
                    let Some((item, item_len)) = parse_at(buf, pos, depth + 1)? else {
                        return Ok(None);
                    };
                    items.push(item);
                    pos += item_len;
                }
                return Ok(Some((Value::Array(items), pos - at)));
            }
        }
        _ => return Err(protocol("an unknown reply type (is this a Redis server?)")),
    };
    Ok(Some((value, next - at)))
}

fn integer(line: &[u8]) -> io::Result<i64> {
    std::str::from_utf8(line)
        .ok()
        .and_then(|text| text.parse().ok())
        .ok_or_else(|| protocol("a number that is not one"))
}

impl ConnectionLike for Wire {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(self.command(cmd))
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(self.pipeline(pipeline, offset, count))
    }

    fn get_db(&self) -> i64 {
        self.inner.db
    }
}

/// Model tests of the read turn and of how replies reach their callers,
/// with loom: callers of one connection queue their commands and wait for
/// their replies, taking turns at reading for everyone, through every
/// interleaving of their steps. The steps are the connection's own: the
/// look at the turn ([`State::look_at_turn`]), giving it up
/// ([`State::give_up_turn`]), reading into the buffer and routing each
/// reply in order ([`dispatch`]). In the first tests the waits between
/// them (for the socket, the stall timer, the turn's wake-up) are spins,
/// and a watched reader counts as stalled at the third look that finds it
/// unchanged; in those of [`waits`](model::waits) callers sleep until
/// something wakes them, so a wake-up missed is a run where everybody
/// sleeps. Callers are patient, kept (never polled again once they hold
/// the turn, or once they sleep) or dropped after some number of steps;
/// every caller still waiting gets its own reply, and no reply goes
/// astray. `scripts/test`
/// runs them: `RUSTFLAGS="--cfg lock_core_loom" cargo test -p lock-core
/// --lib model::`.
#[cfg(all(test, lock_core_loom))]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod model {
    use super::*;

    /// The shared parts of one connection, and a server that answers each
    /// command at once, in order: caller `n`'s reply is the integer `n`.
    struct Conn {
        state: Mutex<State>,
        read_buf: Mutex<ReadBuf>,
        reads: AtomicU64,
        scripts_loaded: AtomicBool,
        /// What the server answered and no reader took yet.
        socket: Mutex<Vec<u8>>,
        /// The wake-ups of waiting callers (see [`waits`]).
        wakes: Mutex<waits::Wakes>,
        /// Signalled whenever `wakes`, or a reply, may wake a caller.
        changed: loom::sync::Condvar,
        /// How its callers wait.
        waiting: Waiting,
    }

    /// How callers wait between their looks at the turn.
    #[derive(Clone, Copy, PartialEq)]
    enum Waiting {
        /// They spin: look again at once (`Conn::receive`).
        Spinning,
        /// They sleep until woken (`Conn::receive_waking`, see [`waits`]).
        Sleeping,
    }

    /// How a caller behaves.
    #[derive(Clone, Copy, PartialEq, Debug)]
    enum Caller {
        /// Waits until its reply is in.
        Patient,
        /// Never polled again once it holds the read turn: keeps it.
        Kept,
        /// Never polled again once it sleeps (the waits model only).
        KeptAsleep,
        /// Its future is dropped after this many steps.
        DroppedAfter(usize),
    }

    /// What became of a caller.
    #[derive(Debug)]
    enum Outcome {
        Replied(Value),
        /// Kept or dropped; a kept caller's receiver lives on.
        Gone {
            _receiver: Option<oneshot::Receiver<Reply>>,
        },
    }

    impl Conn {
        fn new(waiting: Waiting) -> Conn {
            Conn {
                waiting,
                state: Mutex::new(State::default()),
                read_buf: Mutex::new(ReadBuf {
                    buf: Vec::new(),
                    start: 0,
                    end: 0,
                }),
                reads: AtomicU64::new(0),
                scripts_loaded: AtomicBool::new(true),
                socket: Mutex::new(Vec::new()),
                wakes: Mutex::new(waits::Wakes::default()),
                changed: loom::sync::Condvar::new(),
            }
        }

        /// Queues caller `id`'s command; the server answers it after the
        /// ones queued before.
        fn send(&self, id: u64) -> oneshot::Receiver<Reply> {
            let mut state = self.state.lock().unwrap();
            let (tx, rx) = oneshot::channel();
            state.expect(Waiter::Caller(tx));
            let mut socket = self.socket.lock().unwrap();
            socket.extend_from_slice(format!(":{id}\r\n").as_bytes());
            rx
        }

        /// The reader's step: what the socket holds goes into the buffer,
        /// and every complete reply to its caller.
        fn read(&self) {
            let mut reader = self.read_buf.lock().unwrap();
            let bytes = std::mem::take(&mut *self.socket.lock().unwrap());
            if !bytes.is_empty() {
                reader.compact();
                let end = reader.end;
                reader.buf[end..end + bytes.len()].copy_from_slice(&bytes);
                reader.end += bytes.len();
                self.reads.fetch_add(1, Ordering::Release);
            }
            dispatch(&self.state, &self.scripts_loaded, &mut reader).unwrap();
        }

        /// Caller `me` waits for the reply `rx` is for, as `caller` does.
        fn receive(&self, me: u64, mut rx: oneshot::Receiver<Reply>, caller: Caller) -> Outcome {
            let mut watched = None;
            let mut stalled = false;
            let mut steps = 0;
            loop {
                if let Ok(reply) = rx.try_recv() {
                    return Outcome::Replied(reply.unwrap());
                }
                if caller == Caller::DroppedAfter(steps) {
                    return Outcome::Gone { _receiver: None };
                }
                steps += 1;
                let reads = self.reads.load(Ordering::Acquire);
                let look =
                    self.state
                        .lock()
                        .unwrap()
                        .look_at_turn(me, reads, &mut watched, stalled);
                match look {
                    Look::Take { .. } if caller == Caller::Kept => {
                        return Outcome::Gone {
                            _receiver: Some(rx),
                        };
                    }
                    Look::Take { .. } => {
                        if let Some(outcome) =
                            self.read_for_everyone(me, &mut rx, caller, &mut steps)
                        {
                            return outcome;
                        }
                        stalled = false;
                    }
                    Look::Watch => stalled = false,
                    Look::Wait => stalled = true,
                }
                loom::thread::yield_now();
            }
        }

        /// Caller `me` holds the read turn: reads until its reply is
        /// in or its future is dropped, giving the turn up (and
        /// waking a caller for it, as `pass_turn` does); `None` once
        /// the turn was taken over.
        fn read_for_everyone(
            &self,
            me: u64,
            rx: &mut oneshot::Receiver<Reply>,
            caller: Caller,
            steps: &mut usize,
        ) -> Option<Outcome> {
            loop {
                if caller == Caller::DroppedAfter(*steps) {
                    // Dropped while it waits for its socket.
                    self.pass_turn(me);
                    return Some(Outcome::Gone { _receiver: None });
                }
                *steps += 1;
                self.read();
                // The replies read may wake their callers.
                self.wake_sleepers(|_| {});
                if let Ok(reply) = rx.try_recv() {
                    self.pass_turn(me);
                    return Some(Outcome::Replied(reply.unwrap()));
                }
                if self.state.lock().unwrap().turn != Some(me) {
                    return None;
                }
                loom::thread::yield_now();
            }
        }

        fn wakes(&self) -> MutexGuard<'_, waits::Wakes> {
            self.wakes.lock().unwrap()
        }

        /// Sleeping callers: applies `change` to what wakes them, and has
        /// each look again. Spinning ones look again anyway.
        fn wake_sleepers(&self, change: impl FnOnce(&mut waits::Wakes)) {
            if self.waiting == Waiting::Sleeping {
                change(&mut self.wakes());
                self.changed.notify_all();
            }
        }

        /// `Inner::pass_turn`: gives the turn up and wakes a caller for it.
        fn pass_turn(&self, me: u64) {
            if self.state.lock().unwrap().give_up_turn(me) {
                self.wake_sleepers(waits::Wakes::notify_one);
            }
        }
    }

    /// How a model is explored. Sleeping callers get at most two
    /// preemptions, unless `LOOM_WAITS_PREEMPTIONS` says otherwise (three
    /// take minutes): taking either wake-up out of their model (the turn
    /// given up without waking a caller, a notification dropped instead of
    /// passed on) fails every one of their tests within two.
    fn explorer(waiting: Waiting) -> loom::model::Builder {
        let mut builder = loom::model::Builder::new();
        if waiting == Waiting::Sleeping {
            builder.preemption_bound = Some(
                std::env::var("LOOM_WAITS_PREEMPTIONS")
                    .ok()
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(2),
            );
        }
        builder
    }

    /// Runs `callers` on one connection, each on a thread of its own and
    /// waiting as `waiting` says, and checks that each that waited to the
    /// end got its own reply.
    fn run(callers: &'static [Caller], waiting: Waiting) {
        explorer(waiting).check(move || {
            let conn = Arc::new(Conn::new(waiting));
            let threads: Vec<_> = callers
                .iter()
                .enumerate()
                .map(|(i, caller)| {
                    let (conn, caller, id) = (conn.clone(), *caller, i as u64 + 1);
                    loom::thread::spawn(move || {
                        let rx = conn.send(id);
                        let outcome = match waiting {
                            Waiting::Spinning => conn.receive(id, rx, caller),
                            Waiting::Sleeping => conn.receive_waking(id, rx, caller),
                        };
                        (id, caller, outcome)
                    })
                })
                .collect();
            let outcomes: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
            for (id, caller, outcome) in outcomes {
                match (caller, outcome) {
                    (_, Outcome::Replied(value)) => {
                        assert_eq!(
                            value,
                            Value::Int(id as i64),
                            "caller {id} got another's reply"
                        )
                    }
                    (Caller::Patient, outcome) => panic!("caller {id} ended with {outcome:?}"),
                    (_, Outcome::Gone { .. }) => {}
                }
            }
        });
    }

    #[test]
    fn patient_callers_each_get_their_own_reply() {
        run(
            &[Caller::Patient, Caller::Patient, Caller::Patient],
            Waiting::Spinning,
        );
    }

    #[test]
    fn a_caller_kept_with_the_turn_is_taken_over() {
        run(
            &[Caller::Kept, Caller::Patient, Caller::Patient],
            Waiting::Spinning,
        );
    }

    /// One caller dropped after each number of steps, beside two patient
    /// ones.
    static DROPPED: [[Caller; 3]; 4] = [
        [Caller::DroppedAfter(0), Caller::Patient, Caller::Patient],
        [Caller::DroppedAfter(1), Caller::Patient, Caller::Patient],
        [Caller::DroppedAfter(2), Caller::Patient, Caller::Patient],
        [Caller::DroppedAfter(3), Caller::Patient, Caller::Patient],
    ];

    #[test]
    fn a_caller_dropped_at_any_step_holds_nobody_up() {
        for callers in &DROPPED {
            run(callers, Waiting::Spinning);
        }
    }

    /// The same callers, now sleeping while they wait, as
    /// [`Wire::receive`] does: until their reply comes, until the turn is
    /// given up (tokio's `Notify`: `notify_one` wakes the oldest caller
    /// that enabled its `Notified`, or leaves a permit that the next to
    /// enable takes; a `Notified` woken by `notify_one` and dropped unused
    /// passes the notification on, one that took the permit does not),
    /// or until their stall timer fires. Here that timer fires only while
    /// a kept caller holds what the others wait for: the turn (it will
    /// never read again) or the notification that the turn is free (it
    /// will never wake). A caller that is polled reads on and wakes, so a
    /// caller left to its timer behind it would be a lost wake-up, and
    /// loom reports every run where all callers sleep. A caller is dropped
    /// only where it can be, at a wait.
    mod waits {
        use super::*;

        #[derive(Default)]
        pub(super) struct Wakes {
            /// Callers whose `Notified` is enabled, oldest first.
            enabled: VecDeque<u64>,
            /// Callers a `notify_one` picked that have not woken for it.
            notified: Vec<u64>,
            /// A `notify_one` that found nobody enabled.
            permit: bool,
            /// Callers whose `Notified` took that permit when enabled: it
            /// is ready, and it is not passed on if dropped unused.
            took_permit: Vec<u64>,
            /// The caller that will never read again, if any.
            kept: Option<u64>,
            /// The caller that will never wake again, if any.
            kept_asleep: Option<u64>,
        }

        impl Wakes {
            /// `Notify::notify_one`.
            pub(super) fn notify_one(&mut self) {
                match self.enabled.pop_front() {
                    Some(caller) => self.notified.push(caller),
                    None => self.permit = true,
                }
            }

            /// `Notified::enable`, for a fresh `Notified` of `me`.
            fn enable(&mut self, me: u64) {
                match std::mem::take(&mut self.permit) {
                    true => self.took_permit.push(me),
                    false => self.enabled.push_back(me),
                }
            }

            /// `me`'s `Notified` dropped (or done with): a notification it
            /// did not use goes on to the next caller.
            fn drop_notified(&mut self, me: u64) {
                self.enabled.retain(|&c| c != me);
                take(&mut self.took_permit, me);
                if take(&mut self.notified, me) {
                    self.notify_one();
                }
            }

            /// `me` woke for its notification, and uses it.
            fn take_notified(&mut self, me: u64) -> bool {
                take(&mut self.took_permit, me) || take(&mut self.notified, me)
            }
        }

        /// Takes `me` out of `callers`: whether it was there.
        fn take(callers: &mut Vec<u64>, me: u64) -> bool {
            match callers.iter().position(|&c| c == me) {
                Some(at) => {
                    callers.swap_remove(at);
                    true
                }
                None => false,
            }
        }

        /// What woke a sleeping caller.
        enum Woke {
            Reply(Reply),
            Freed,
            Stalled,
        }

        impl Conn {
            /// Caller `me` waits for the reply `rx` is for, as `caller`
            /// does, sleeping between its looks at the turn.
            pub(super) fn receive_waking(
                &self,
                me: u64,
                mut rx: oneshot::Receiver<Reply>,
                caller: Caller,
            ) -> Outcome {
                let mut watched = None;
                let mut stalled = false;
                let mut steps = 0;
                loop {
                    if let Ok(reply) = rx.try_recv() {
                        return Outcome::Replied(reply.unwrap());
                    }
                    // Enabled before the look, as in `wait_for_turn`.
                    self.wakes().enable(me);
                    let reads = self.reads.load(Ordering::Acquire);
                    let look =
                        self.state
                            .lock()
                            .unwrap()
                            .look_at_turn(me, reads, &mut watched, stalled);
                    stalled = false;
                    match look {
                        Look::Take { .. } if caller == Caller::Kept => {
                            self.wake_sleepers(|wakes| {
                                wakes.drop_notified(me);
                                wakes.kept = Some(me);
                            });
                            return Outcome::Gone {
                                _receiver: Some(rx),
                            };
                        }
                        Look::Take { .. } => {
                            self.wake_sleepers(|wakes| wakes.drop_notified(me));
                            if let Some(outcome) =
                                self.read_for_everyone(me, &mut rx, caller, &mut steps)
                            {
                                return outcome;
                            }
                            continue;
                        }
                        Look::Watch | Look::Wait => {}
                    }
                    if caller == Caller::DroppedAfter(steps) {
                        // Dropped at its wait: its `Notified` goes.
                        self.wake_sleepers(|wakes| wakes.drop_notified(me));
                        return Outcome::Gone { _receiver: None };
                    }
                    if caller == Caller::KeptAsleep {
                        // Kept at its wait: its `Notified` stays, and a
                        // notification it gets is never used.
                        self.wake_sleepers(|wakes| wakes.kept_asleep = Some(me));
                        return Outcome::Gone {
                            _receiver: Some(rx),
                        };
                    }
                    steps += 1;
                    match self.sleep(me, &mut rx) {
                        Woke::Reply(reply) => {
                            self.wake_sleepers(|wakes| wakes.drop_notified(me));
                            return Outcome::Replied(reply.unwrap());
                        }
                        Woke::Freed => {}
                        Woke::Stalled => {
                            self.wake_sleepers(|wakes| wakes.drop_notified(me));
                            stalled = true;
                        }
                    }
                }
            }

            /// Sleeps until `me`'s reply is in, its `Notified` is
            /// notified, or its stall timer fires: only while a kept caller
            /// holds what the others wait for, the turn or the
            /// notification that the turn is free.
            fn sleep(&self, me: u64, rx: &mut oneshot::Receiver<Reply>) -> Woke {
                let mut wakes = self.wakes();
                loop {
                    if let Ok(reply) = rx.try_recv() {
                        return Woke::Reply(reply);
                    }
                    if wakes.take_notified(me) {
                        return Woke::Freed;
                    }
                    let held =
                        wakes.kept.is_some() && self.state.lock().unwrap().turn == wakes.kept;
                    let swallowed = wakes
                        .kept_asleep
                        .is_some_and(|kept| wakes.notified.contains(&kept));
                    if held || swallowed {
                        return Woke::Stalled;
                    }
                    wakes = self.changed.wait(wakes).unwrap();
                }
            }
        }

        #[test]
        fn patient_callers_sleeping_each_get_their_own_reply() {
            run(
                &[Caller::Patient, Caller::Patient, Caller::Patient],
                Waiting::Sleeping,
            );
        }

        #[test]
        fn callers_sleeping_behind_a_kept_reader_take_over() {
            run(
                &[Caller::Kept, Caller::Patient, Caller::Patient],
                Waiting::Sleeping,
            );
        }

        #[test]
        fn callers_sleeping_beside_a_kept_sleeper_get_their_replies() {
            run(
                &[Caller::KeptAsleep, Caller::Patient, Caller::Patient],
                Waiting::Sleeping,
            );
            run(
                &[Caller::Patient, Caller::KeptAsleep, Caller::Patient],
                Waiting::Sleeping,
            );
        }

        #[test]
        fn a_caller_dropped_at_any_step_wakes_whoever_it_owes() {
            for callers in &DROPPED {
                run(callers, Waiting::Sleeping);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(bytes: &[u8]) -> Option<(Value, usize)> {
        parse(bytes).ok().flatten()
    }

    #[test]
    fn parses_each_reply_type() {
        assert_eq!(parsed(b"+OK\r\n"), Some((Value::Okay, 5)));
        assert_eq!(
            parsed(b"+PONG\r\n"),
            Some((Value::SimpleString("PONG".into()), 7))
        );
        assert_eq!(parsed(b":-12\r\n"), Some((Value::Int(-12), 6)));
        assert_eq!(parsed(b"$-1\r\n"), Some((Value::Nil, 5)));
        assert_eq!(parsed(b"*-1\r\n"), Some((Value::Nil, 5)));
        assert_eq!(
            parsed(b"$5\r\na\r\nbc\r\n+OK\r\n"),
            Some((Value::BulkString(b"a\r\nbc".to_vec()), 11))
        );
        assert_eq!(
            parsed(b"*2\r\n:1\r\n*1\r\n$0\r\n\r\n"),
            Some((
                Value::Array(vec![
                    Value::Int(1),
                    Value::Array(vec![Value::BulkString(Vec::new())])
                ]),
                18
            ))
        );
    }

    #[test]
    fn errors_keep_their_kind() {
        let Some((value, len)) = parsed(b"-NOSCRIPT No matching script.\r\n") else {
            panic!("an error reply must parse");
        };
        assert_eq!(len, 31);
        let err = value.extract_error().err();
        assert_eq!(
            err.map(|e| e.kind()),
            Some(redis::ErrorKind::Server(redis::ServerErrorKind::NoScript))
        );
    }

    #[test]
    fn incomplete_replies_wait_for_more() {
        let whole = b"*3\r\n$3\r\nabc\r\n:7\r\n+OK\r\n";
        for cut in 0..whole.len() {
            assert_eq!(parsed(&whole[..cut]), None, "cut at {cut}");
        }
        assert!(parsed(whole).is_some());
    }

    #[test]
    fn garbage_is_a_protocol_error() {
        assert!(parse(b"HTTP/1.1 400\r\n").is_err());
        assert!(parse(b":abc\r\n").is_err());
        assert!(parse(b"$3\r\nabcde\r\n").is_err());
        let deep = "*1\r\n".repeat(MAX_DEPTH + 1);
        assert!(parse(deep.as_bytes()).is_err());
    }

    /// The connection against a real `redis-server`.
    #[allow(clippy::unwrap_used, clippy::expect_used)]
    mod live {
        use super::super::*;
        use lock_testkit::RedisServer;
        use std::time::Duration;

        /// The test `$name`: `$on` (a server and a connection to it) run
        /// over each transport in turn, as [`each_transport`] gives them.
        macro_rules! over_each_transport {
            ($(#[$attr:meta])* fn $name:ident => $on:ident) => {
                $(#[$attr])*
                async fn $name() {
                    for (server, wire) in each_transport().await {
                        $on(server, wire).await;
                    }
                }
            };
        }

        /// A fresh server and a connection to it over each transport the
        /// connection runs on: plain TCP, and TLS when built with it. The
        /// transport shows in the test's output should an assertion fail.
        async fn each_transport() -> Vec<(RedisServer, Wire)> {
            let server = RedisServer::start();
            let wire = connect(&server).await;
            #[allow(unused_mut)]
            let mut each = vec![(server, wire)];
            #[cfg(feature = "tls")]
            each.push(over_tls().await);
            each
        }

        /// A server serving TLS with a private CA, and a connection to it
        /// that trusts that CA.
        #[cfg(feature = "tls")]
        async fn over_tls() -> (RedisServer, Wire) {
            let _ = rustls::crypto::ring::default_provider().install_default();
            let certificates = lock_testkit::TestCertificates::generate();
            let server = RedisServer::builder().tls(&certificates).start();
            let config = TlsConfig::new(Some(&redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(certificates.ca_pem().as_bytes().to_vec()),
            }))
            .expect("TLS configuration");
            let info = redis::RedisConnectionInfo::default();
            let port = server.tls_port().expect("a TLS port");
            let wire = Wire::connect("127.0.0.1", port, &info, Some(&config))
                .await
                .expect("connect over TLS");
            eprintln!("the same over TLS");
            (server, wire)
        }

        async fn connect(server: &RedisServer) -> Wire {
            let info = redis::RedisConnectionInfo::default();
            Wire::connect("127.0.0.1", server.port(), &info, None)
                .await
                .expect("connect")
        }

        /// `cmd`'s reply, failing the test instead of hanging should it
        /// never come.
        async fn query<T: redis::FromRedisValue>(wire: &Wire, cmd: &Cmd) -> RedisResult<T> {
            let mut conn = wire.clone();
            tokio::time::timeout(Duration::from_secs(30), cmd.query_async(&mut conn))
                .await
                .expect("no reply within 30 s")
        }

        async fn echo(wire: &Wire, text: &str) -> RedisResult<String> {
            query(wire, redis::cmd("ECHO").arg(text)).await
        }

        over_each_transport! {
            /// Many tasks share the socket, with replies of every size mixed
            /// in (some longer than a read): each gets the reply to its own
            /// command.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            fn concurrent_callers_each_get_their_own_reply =>
                concurrent_callers_each_get_their_own_reply_on
        }

        async fn concurrent_callers_each_get_their_own_reply_on(_server: RedisServer, wire: Wire) {
            let tasks: Vec<_> = (0..64)
                .map(|task| {
                    let wire = wire.clone();
                    tokio::spawn(async move {
                        for i in 0..150 {
                            // Every 16th reply is 40 to 100 KB long.
                            let len = if i % 16 == 0 { 40_000 + task * 1000 } else { i };
                            let text = format!("{task}:{i}:{}", "x".repeat(len));
                            assert_eq!(echo(&wire, &text).await.unwrap(), text);
                        }
                    })
                })
                .collect();
            for task in tasks {
                task.await.unwrap();
            }
        }

        /// Polls `future` once: whether it is still pending.
        async fn poll_once<F: Future>(future: Pin<&mut F>) -> bool {
            let mut future = future;
            std::future::poll_fn(|cx| Poll::Ready(future.as_mut().poll(cx).is_pending())).await
        }

        /// An `ECHO text` call polled once and left waiting for its reply.
        /// A loaded machine can deliver the reply within that one poll
        /// (the call then completed and holds nothing): another call is
        /// made until one waits.
        async fn waiting_echo(
            wire: &Wire,
            text: &str,
        ) -> Pin<Box<impl Future<Output = RedisResult<String>>>> {
            for _ in 0..100 {
                let mut call = Box::pin(echo(wire, text));
                if poll_once(call.as_mut()).await {
                    return call;
                }
            }
            panic!("every ECHO call was answered within its first poll");
        }

        over_each_transport! {
            /// A caller's future that took the read turn and is then kept but
            /// never polled again holds nobody up: the next callers take the
            /// turn over within a stall, and the kept one still gets its own
            /// reply when it is polled again.
            #[tokio::test]
            fn a_kept_reader_does_not_hold_up_the_others =>
                a_kept_reader_does_not_hold_up_the_others_on
        }

        async fn a_kept_reader_does_not_hold_up_the_others_on(_server: RedisServer, wire: Wire) {
            // The script loads queued at connect are answered first.
            assert_eq!(echo(&wire, "first").await.unwrap(), "first");
            let kept = waiting_echo(&wire, "kept").await;
            assert!(wire.inner.state().turn.is_some(), "it holds the read turn");
            for i in 0..20 {
                let text = format!("other {i}");
                let started = Instant::now();
                assert_eq!(echo(&wire, &text).await.unwrap(), text);
                assert!(
                    started.elapsed() < STALL * 10,
                    "answered after {:?}",
                    started.elapsed()
                );
            }
            assert_eq!(kept.await.unwrap(), "kept");
        }

        over_each_transport! {
            /// A task whose worker thread blocks right after its call took the
            /// read turn holds up no task of the other worker.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            fn a_reader_on_a_blocked_thread_does_not_hold_up_the_others =>
                a_reader_on_a_blocked_thread_does_not_hold_up_the_others_on
        }

        async fn a_reader_on_a_blocked_thread_does_not_hold_up_the_others_on(
            _server: RedisServer,
            wire: Wire,
        ) {
            let (took, turn_taken) = oneshot::channel();
            let blocker = tokio::spawn({
                let wire = wire.clone();
                async move {
                    assert_eq!(echo(&wire, "first").await.unwrap(), "first");
                    let call = waiting_echo(&wire, "blocked").await;
                    assert!(wire.inner.state().turn.is_some());
                    let _ = took.send(());
                    std::thread::sleep(Duration::from_millis(1500));
                    call.await
                }
            });
            turn_taken.await.unwrap();
            // A blocked worker may have left the runtime's timers and sockets
            // to nobody (tokio serves them from a parked worker); a task
            // spawned now wakes the other worker, as any other task of a
            // busy service would. The heartbeat does not rely on this: it
            // runs on a runtime of its own (`heartbeat.rs`).
            tokio::spawn(async {}).await.unwrap();
            let started = Instant::now();
            assert_eq!(echo(&wire, "free").await.unwrap(), "free");
            assert!(
                started.elapsed() < Duration::from_millis(500),
                "answered after {:?}",
                started.elapsed()
            );
            assert_eq!(blocker.await.unwrap().unwrap(), "blocked");
        }

        over_each_transport! {
            /// Callers that give up while the server is frozen (the reader
            /// among them) leave no stray reply behind: once it answers again,
            /// the next callers get their own replies.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            fn callers_that_give_up_do_not_shift_the_replies =>
                callers_that_give_up_do_not_shift_the_replies_on
        }

        async fn callers_that_give_up_do_not_shift_the_replies_on(server: RedisServer, wire: Wire) {
            assert_eq!(echo(&wire, "before").await.unwrap(), "before");
            let pause = server.pause();
            let gave_up: Vec<_> = (0..16)
                .map(|i| {
                    let wire = wire.clone();
                    tokio::spawn(async move {
                        let text = format!("lost {i}");
                        tokio::time::timeout(Duration::from_millis(100), echo(&wire, &text)).await
                    })
                })
                .collect();
            for task in gave_up {
                assert!(task.await.unwrap().is_err(), "a frozen server answered");
            }
            pause.resume();
            for i in 0..32 {
                let text = format!("after {i}");
                assert_eq!(echo(&wire, &text).await.unwrap(), text);
            }
        }

        over_each_transport! {
            /// A command longer than the socket's buffers goes out whole (in
            /// several writes), and others' commands queued behind it still
            /// follow it in order.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            fn a_command_larger_than_the_socket_buffer_goes_out_whole =>
                a_command_larger_than_the_socket_buffer_goes_out_whole_on
        }

        async fn a_command_larger_than_the_socket_buffer_goes_out_whole_on(
            _server: RedisServer,
            wire: Wire,
        ) {
            let big = vec![7u8; 24 * 1024 * 1024];
            let writer = {
                let wire = wire.clone();
                let big = big.clone();
                tokio::spawn(async move {
                    query::<()>(&wire, redis::cmd("SET").arg("big").arg(big)).await
                })
            };
            let others: Vec<_> = (0..8)
                .map(|i| {
                    let wire = wire.clone();
                    tokio::spawn(async move {
                        let text = format!("behind {i}");
                        assert_eq!(echo(&wire, &text).await.unwrap(), text);
                    })
                })
                .collect();
            writer.await.unwrap().unwrap();
            for task in others {
                task.await.unwrap();
            }
            let back: Vec<u8> = query(&wire, redis::cmd("GET").arg("big")).await.unwrap();
            assert!(back == big, "the value came back changed");
        }

        /// A task waiting on `wire` in `BLPOP list 0`, once the server has
        /// it blocked.
        async fn blpop(
            server: &RedisServer,
            wire: &Wire,
            list: &str,
        ) -> tokio::task::JoinHandle<RedisResult<Value>> {
            let waiting = {
                let wire = wire.clone();
                let cmd = redis::cmd("BLPOP").arg(list).arg(0).clone();
                tokio::spawn(async move { query::<Value>(&wire, &cmd).await })
            };
            until(Duration::from_secs(10), "BLPOP reached the server", || {
                server
                    .cmd::<String>(&["CLIENT", "LIST"])
                    .contains("cmd=blpop")
            })
            .await;
            waiting
        }

        /// Waits until `done()`, checking every 5 ms; fails the test saying
        /// `what` did not happen within `limit`.
        async fn until(limit: Duration, what: &str, done: impl Fn() -> bool) {
            let deadline = std::time::Instant::now() + limit;
            while !done() {
                assert!(
                    std::time::Instant::now() < deadline,
                    "not within {limit:?}: {what}"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }

        over_each_transport! {
            /// A caller dropped while it yields before writing the commands
            /// queued behind another in flight (its timeout fired) still has
            /// them written, rather than left for the connection's next call.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            fn a_caller_dropped_before_writing_still_writes =>
                a_caller_dropped_before_writing_still_writes_on
        }

        async fn a_caller_dropped_before_writing_still_writes_on(server: RedisServer, wire: Wire) {
            use futures::FutureExt;
            let waiting = blpop(&server, &wire, "list").await;
            let set = redis::cmd("SET").arg("k").arg("v").clone();
            let mut conn = wire.clone();
            {
                let mut call = std::pin::pin!(conn.req_packed_command(&set));
                assert!(
                    (&mut call).now_or_never().is_none(),
                    "SET answered without waiting"
                );
            }
            // The server runs the SET once the BLPOP it queued behind is
            // done; nothing else writes on the connection meanwhile.
            let _: i64 = server.cmd(&["RPUSH", "list", "x"]);
            assert!(waiting.await.unwrap().is_ok(), "BLPOP failed");
            until(
                Duration::from_secs(10),
                "the dropped SET was applied",
                || server.cmd::<Option<String>>(&["GET", "k"]).as_deref() == Some("v"),
            )
            .await;
        }

        over_each_transport! {
            /// Commands sent without waiting for their replies, by many tasks
            /// on a busy connection, have each left the process when their
            /// call returns.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            fn unheard_commands_are_written_when_their_calls_return =>
                unheard_commands_are_written_when_their_calls_return_on
        }

        async fn unheard_commands_are_written_when_their_calls_return_on(
            server: RedisServer,
            wire: Wire,
        ) {
            let waiting = blpop(&server, &wire, "list").await;
            let sends = (0..16).map(|i| {
                let wire = wire.clone();
                tokio::spawn(async move {
                    let set = redis::cmd("SET").arg(format!("k{i}")).arg("v").clone();
                    // Its bytes end at least this far into the stream.
                    let end = {
                        let state = wire.inner.state();
                        state.sent_total + (state.unsent.len() - state.written) as u64
                    } + set.get_packed_command().len() as u64;
                    wire.send_unheard(&set, Hear::Log(drop)).await.unwrap();
                    let sent = wire.inner.state().sent_total;
                    assert!(sent >= end, "returned with its command unwritten");
                })
            });
            for sent in futures::future::join_all(sends).await {
                sent.unwrap();
            }
            assert!(wire.inner.state().unsent.is_empty(), "left unsent");
            let _: i64 = server.cmd(&["RPUSH", "list", "x"]);
            assert!(waiting.await.unwrap().is_ok(), "BLPOP failed");
            until(Duration::from_secs(10), "every SET was applied", || {
                (0..16).all(|i| {
                    server
                        .cmd::<Option<String>>(&["GET", &format!("k{i}")])
                        .is_some()
                })
            })
            .await;
        }

        over_each_transport! {
            /// A task alone on the connection is polled once per reply it
            /// waits for, and once to start: handing itself its own reply
            /// does not wake it again. Each needless wake-up costs a poll,
            /// and on a multi-thread runtime a parked worker woken, per
            /// round trip.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            fn a_lone_caller_is_polled_once_per_reply =>
                a_lone_caller_is_polled_once_per_reply_on
        }

        async fn a_lone_caller_is_polled_once_per_reply_on(_server: RedisServer, wire: Wire) {
            const CALLS: usize = 200;
            let polls = tokio::spawn(async move {
                let mut calls = pin!(async {
                    for i in 0..CALLS {
                        let text = format!("call {i}");
                        assert_eq!(echo(&wire, &text).await.unwrap(), text);
                    }
                });
                let mut polls = 0;
                std::future::poll_fn(|cx| {
                    polls += 1;
                    calls.as_mut().poll(cx)
                })
                .await;
                polls
            })
            .await
            .unwrap();
            // A reply that arrives in two reads may cost one poll more.
            assert!(
                polls <= CALLS + CALLS / 10 + 1,
                "{polls} polls for {CALLS} calls"
            );
        }

        over_each_transport! {
            /// A command sent unheard (a release) and not answered yet does
            /// not hold back the next command of a caller that is otherwise
            /// alone: it is written at once, not after a turn of the
            /// scheduler spent waiting for other callers' commands.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            fn a_call_behind_an_unheard_command_alone_is_written_at_once =>
                a_call_behind_an_unheard_command_alone_is_written_at_once_on
        }

        async fn a_call_behind_an_unheard_command_alone_is_written_at_once_on(
            _server: RedisServer,
            wire: Wire,
        ) {
            let set = redis::cmd("SET").arg("k").arg("v").clone();
            wire.send_unheard(&set, Hear::Log(drop)).await.unwrap();
            let get = redis::cmd("GET").arg("k").clone();
            let mut receivers = Vec::new();
            let flush = wire
                .send(
                    |buf| get.write_packed_command(buf),
                    1,
                    |rx| receivers.push(rx),
                )
                .unwrap();
            assert!(!flush, "left for a flush after a turn of the scheduler");
            assert!(wire.inner.state().unsent.is_empty(), "not written");
            let reply = wire.receive(receivers.pop().unwrap()).await.unwrap();
            assert_eq!(reply, Value::BulkString(b"v".to_vec()));
        }

        over_each_transport! {
            /// Unheard commands whose calls are dropped at their first wait
            /// (the one that would write for both, and the one that would have
            /// waited for it) still go out.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            fn unheard_commands_dropped_while_waiting_their_turn_still_go_out =>
                unheard_commands_dropped_while_waiting_their_turn_still_go_out_on
        }

        async fn unheard_commands_dropped_while_waiting_their_turn_still_go_out_on(
            server: RedisServer,
            wire: Wire,
        ) {
            use futures::FutureExt;
            let waiting = blpop(&server, &wire, "list").await;
            let first = redis::cmd("SET").arg("a").arg("v").clone();
            let second = redis::cmd("SET").arg("b").arg("v").clone();
            {
                let mut writer = std::pin::pin!(wire.send_unheard(&first, Hear::Log(drop)));
                let mut follower = std::pin::pin!(wire.send_unheard(&second, Hear::Log(drop)));
                assert!(
                    (&mut writer).now_or_never().is_none(),
                    "did not wait its turn"
                );
                assert!(
                    (&mut follower).now_or_never().is_none(),
                    "did not wait its turn"
                );
            }
            assert!(wire.inner.state().unsent.is_empty(), "left unsent");
            let _: i64 = server.cmd(&["RPUSH", "list", "x"]);
            assert!(waiting.await.unwrap().is_ok(), "BLPOP failed");
            until(Duration::from_secs(10), "both SETs were applied", || {
                ["a", "b"]
                    .iter()
                    .all(|k| server.cmd::<Option<String>>(&["GET", k]).is_some())
            })
            .await;
        }

        over_each_transport! {
            /// The server closing the connection fails the calls waiting on it
            /// and every later one, as a dropped connection (which the node
            /// replaces).
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            fn a_closed_connection_fails_waiting_and_later_calls =>
                a_closed_connection_fails_waiting_and_later_calls_on
        }

        async fn a_closed_connection_fails_waiting_and_later_calls_on(
            server: RedisServer,
            wire: Wire,
        ) {
            // This connection by its id: the test's own connections for
            // `CLIENT LIST` may still be closing (over TLS, for longer).
            let id: i64 = query(&wire, &redis::cmd("CLIENT").arg("ID").clone())
                .await
                .unwrap();
            // Blocks until the connection goes.
            let waiting = blpop(&server, &wire, "nothing").await;
            let killed: i64 = server.cmd(&["CLIENT", "KILL", "ID", &id.to_string()]);
            assert_eq!(killed, 1);
            let err = waiting.await.unwrap().unwrap_err();
            assert!(err.is_connection_dropped(), "{err}");
            let later = echo(&wire, "later").await.unwrap_err();
            assert!(later.is_connection_dropped(), "{later}");
        }

        /// Something that is not a Redis server (here an HTTP server)
        /// breaks the connection as a dropped one, so the node replaces it,
        /// instead of every later call failing the same way on it.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_protocol_violation_drops_the_connection() {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let port = listener.local_addr().unwrap().port();
            let http = tokio::spawn(async move {
                let (mut socket, _) = listener.accept().await.unwrap();
                let mut request = [0u8; 256];
                let _ = socket.read(&mut request).await;
                socket
                    .write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n")
                    .await
                    .unwrap();
                // Kept open: the client must not wait for more.
                socket
            });
            let info = redis::RedisConnectionInfo::default();
            let wire = Wire::connect("127.0.0.1", port, &info, None).await.unwrap();
            let err = echo(&wire, "hello").await.unwrap_err();
            assert!(err.is_connection_dropped(), "{err}");
            assert!(err.to_string().contains("protocol"), "{err}");
            let later = echo(&wire, "again").await.unwrap_err();
            assert!(later.is_connection_dropped(), "{later}");
            drop(http.await.unwrap());
        }

        /// A password and a database from the URL are used.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn logs_in_and_selects_the_database() {
            let server = RedisServer::builder().password("s3cret").start();
            let info = redis::IntoConnectionInfo::into_connection_info(format!(
                "redis://:s3cret@127.0.0.1:{}/3",
                server.port()
            ))
            .unwrap();
            let mut wire = Wire::connect("127.0.0.1", server.port(), info.redis_settings(), None)
                .await
                .unwrap();
            assert_eq!(wire.get_db(), 3);
            redis::cmd("SET")
                .arg("where")
                .arg("three")
                .query_async::<()>(&mut wire)
                .await
                .unwrap();
            let in_db_3: Option<String> = redis::pipe()
                .cmd("SELECT")
                .arg(3)
                .ignore()
                .cmd("GET")
                .arg("where")
                .query(&mut server.connection())
                .map(|(value,): (Option<String>,)| value)
                .unwrap();
            assert_eq!(in_db_3.as_deref(), Some("three"));

            let wrong = redis::IntoConnectionInfo::into_connection_info(format!(
                "redis://:wrong@127.0.0.1:{}",
                server.port()
            ))
            .unwrap();
            let refused =
                Wire::connect("127.0.0.1", server.port(), wrong.redis_settings(), None).await;
            assert_eq!(
                refused
                    .err()
                    .and_then(|e| e.code().map(str::to_owned))
                    .as_deref(),
                Some("WRONGPASS")
            );
        }

        /// A pipeline gets its replies in order; a transaction's are the
        /// `EXEC` answer only.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn pipelines_and_transactions() {
            let server = RedisServer::start();
            let mut wire = connect(&server).await;
            let (a, b): (i64, i64) = redis::pipe()
                .incr("n", 1)
                .incr("n", 2)
                .query_async(&mut wire)
                .await
                .unwrap();
            assert_eq!((a, b), (1, 3));
            let (c,): (i64,) = redis::pipe()
                .atomic()
                .incr("n", 4)
                .query_async(&mut wire)
                .await
                .unwrap();
            assert_eq!(c, 7);
            assert_eq!(echo(&wire, "still in step").await.unwrap(), "still in step");
        }
    }
}
