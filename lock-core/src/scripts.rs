//! The Lua scripts that make acquire, renew and release atomic.
//!
//! Each is sent with `EVALSHA` through [`Eval`], which loads the script and
//! sends the call again when the server answers `NOSCRIPT` (after `SCRIPT
//! FLUSH` or a restart). lock-core's own connection (`backend/wire/`)
//! also queues a `SCRIPT LOAD` of each of [`ALL`] right after logging in,
//! without waiting for the answers: the commands after them find the
//! scripts loaded. A call sent again after `NOSCRIPT` is a new command,
//! behind whatever the connection carried meanwhile: a Redlock attempt's
//! call left to finish in the background could then set its key after the
//! attempt's undo had passed, leaving the key held until its ttl. Over the
//! `redis` crate's connections (Unix sockets, Sentinel, Cluster) scripts load
//! on first use, a `NOSCRIPT` answer and a `SCRIPT LOAD` once per script
//! and server.
//!
//! The Lua lives in `scripts/`, read in with `include_str!`: a script's
//! text is the helper files its static names (`lua_read!` is
//! `scripts/lib/read.lua`, and so on), in that order, then its own body
//! (`scripts/release.lua` for [`RELEASE`]). The files hold nothing else:
//! a comment or a changed byte there (a final newline an editor adds to a
//! body) is a new script, with a new SHA1 (`scripts/.editorconfig` tells
//! editors which files end with a newline). The contract of each script
//! (`KEYS`, `ARGV`, answers) is the doc comment on its static here. A body
//! calls its helpers, so a Lua tool is given the concatenation, e.g.
//! `cat lib/read.lua release.lua | luac -p -` (Lua 5.1's `luac`, the Lua
//! that Redis runs) for the syntax, or `luacheck - --std lua51
//! --read-globals redis KEYS ARGV` on the same input, which also flags the
//! helpers that this script does not call.

use redis::aio::ConnectionLike;
use redis::{
    Arg, Cmd, FromRedisValue, RedisResult, RedisWrite, Script, ToRedisArgs, ToSingleRedisArg,
};
use std::cell::RefCell;
use std::io::Write as _;
use std::ops::{Deref, DerefMut};
use std::sync::LazyLock;

/// A script and its source, which a connection can load before it is
/// first called (see the module docs).
pub(crate) struct Lua {
    /// The Lua source.
    pub(crate) code: &'static str,
    script: LazyLock<Script>,
}

impl Deref for Lua {
    type Target = Script;

    fn deref(&self) -> &Script {
        &self.script
    }
}

/// A [`Lua`] of this source.
macro_rules! lua {
    ($code:expr) => {
        Lua {
            code: $code,
            script: LazyLock::new(|| Script::new($code)),
        }
    };
}

/// Every script lock-core calls by its hash.
pub(crate) static ALL: [&Lua; 21] = [
    &RELEASE,
    &RELEASE_ASKING,
    &RENEW,
    &SET_TTL,
    &ACQUIRE_FENCED,
    &LIFT_FENCE,
    &RENEW_MANY,
    &TAKE_OVER,
    &ACQUIRE,
    &ACQUIRE_ALL,
    &SHARED_ACQUIRE,
    &SHARED_RELEASE,
    &SHARED_RENEW,
    &INSPECT,
    &FORCE_RELEASE,
    &WAIT_RECORD,
    &WAIT_HOP,
    &WAITERS,
    &LISTEN,
    &NEXT_FENCE,
    &MARK_FENCE,
];

/// A command built in buffers this thread kept from an earlier one, given
/// back to the spares of the thread it is dropped on. An acquisition's
/// `SET` and every script call are built anew on every acquisition and
/// release; a fresh command costs two allocations (its bytes and its list
/// of arguments), more than the rest of building it.
pub(crate) struct Built(Cmd);

/// How many built commands each thread keeps for the next ones.
const SPARE_COMMANDS: usize = 8;

/// A command longer than this (a long key list) is not kept.
const SPARE_COMMAND_BYTES: usize = 4096;

thread_local! {
    static SPARES: RefCell<Vec<Cmd>> = const { RefCell::new(Vec::new()) };
}

/// An empty command, with room for `args` arguments of `bytes` bytes in
/// all when it is a fresh one.
pub(crate) fn command(args: usize, bytes: usize) -> Built {
    let spare = SPARES
        .try_with(|spares| spares.try_borrow_mut().ok().and_then(|mut s| s.pop()))
        .ok()
        .flatten();
    Built(spare.unwrap_or_else(|| Cmd::with_capacity(args, bytes)))
}

impl Deref for Built {
    type Target = Cmd;

    fn deref(&self) -> &Cmd {
        &self.0
    }
}

impl DerefMut for Built {
    fn deref_mut(&mut self) -> &mut Cmd {
        &mut self.0
    }
}

impl Drop for Built {
    fn drop(&mut self) {
        let mut cmd = std::mem::take(&mut self.0);
        let bytes: usize = cmd
            .args_iter()
            .map(|arg| match arg {
                Arg::Simple(bytes) => bytes.len(),
                _ => 0,
            })
            .sum();
        if bytes > SPARE_COMMAND_BYTES {
            return;
        }
        cmd.clear();
        // On a thread being torn down, or (never) while borrowed: dropped.
        let _ = SPARES.try_with(|spares| {
            if let Ok(mut spares) = spares.try_borrow_mut()
                && spares.len() < SPARE_COMMANDS
            {
                spares.push(cmd);
            }
        });
    }
}

/// One `EVALSHA` call of a script.
///
/// Built straight into one command (`redis::ScriptInvocation` collects the
/// keys and arguments into vectors first and copies them into a command on
/// every send), since these calls sit on every acquisition and release.
pub(crate) struct Eval {
    script: &'static Script,
    cmd: Built,
    keys_left: usize,
}

impl Eval {
    /// A call of `script` with `keys` keys: add exactly that many with
    /// [`key`](Self::key), then the arguments with [`arg`](Self::arg).
    pub(crate) fn new(script: &'static Script, keys: usize) -> Eval {
        let mut cmd = command(3 + 3 * keys, 64 + 64 * keys);
        cmd.arg("EVALSHA").arg(script.get_hash()).arg(keys);
        Eval {
            script,
            cmd,
            keys_left: keys,
        }
    }

    /// The next key (`KEYS[i]`).
    pub(crate) fn key(&mut self, key: impl ToRedisArgs) -> &mut Eval {
        debug_assert!(self.keys_left > 0, "more keys than announced");
        self.keys_left = self.keys_left.saturating_sub(1);
        self.cmd.arg(key);
        self
    }

    /// The next argument (`ARGV[i]`), after every key.
    pub(crate) fn arg(&mut self, arg: impl ToRedisArgs) -> &mut Eval {
        debug_assert_eq!(self.keys_left, 0, "an argument before the last key");
        self.cmd.arg(arg);
        self
    }

    /// The `EVALSHA` command, for a caller that sends it its own way.
    pub(crate) fn cmd(&self) -> &Cmd {
        &self.cmd
    }

    /// Sends the call; on `NOSCRIPT`, loads the script and sends it again.
    pub(crate) async fn invoke<T: FromRedisValue>(
        &self,
        conn: &mut impl ConnectionLike,
    ) -> RedisResult<T> {
        match self.cmd.query_async(conn).await {
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                // Rare (once per script and server, and after a flush or a
                // restart): boxed, so the common path's future stays small.
                Box::pin(self.reload_and_invoke(conn)).await
            }
            answer => answer,
        }
    }

    async fn reload_and_invoke<T: FromRedisValue>(
        &self,
        conn: &mut impl ConnectionLike,
    ) -> RedisResult<T> {
        self.script.load_async(conn).await?;
        self.cmd.query_async(conn).await
    }
}

/// Lua: `read(key)`, the value of a string key, read so that a key of
/// another type cannot fail the script.
///
/// Returns `true, value` (`false` when the key is absent); `false, nil`
/// when the key holds another type: another program's key, never our lock,
/// which the scripts answer as "not ours"; `false, error` for any other
/// error (an ACL refusal), which the script returns as its answer, so that
/// it still reads as a permission error.
///
/// And `owns(value, token)`: whether a lock value belongs to `token`: the
/// value is the token, or starts with it and a `|` (the holder's name and
/// the time of acquisition follow; see `docs/format.md`). A foreign
/// client's value (redis-py's 32 hex digits) never matches our token. It
/// runs in every release and renewal, so it makes no new Lua string (no
/// `string.sub`, no `..`): a byte test, then a plain find that matches at
/// the first position.
///
/// And `not_ours(key, token)`: `nil` when `key` holds `token`, otherwise
/// what the script answers (0, or the error), the check every script that
/// acts on our own lock starts with.
///
/// Every release and renewal runs it: what only acquisitions use lives in
/// `lua_fence!`, so that those calls do not define it.
macro_rules! lua_read {
    () => {
        include_str!("scripts/lib/read.lua")
    };
}

/// Lua: `next_fence(key, keep)`, the next fencing token of the counter at
/// `key`, stored with an expiry of `keep` milliseconds: one above the
/// counter, and never below the server's clock in microseconds (`TIME`).
/// So a counter may expire (one key per lock name would otherwise stay for
/// ever) and a new one still starts above every token the old one gave: the
/// counter never runs ahead of the clock by more than one a round trip,
/// and by the time it expires the clock has moved far past it. Lua numbers
/// are doubles, exact for microseconds since 1970 (below 2^53). Answers an
/// error table when the key holds another type or is not a number.
///
/// And `with_fence(value, fence)`: the value with its fence field (the
/// third) set to `fence`; a value without fields stays as it is. And
/// `fence_value(key, fence)`: the lock `key`'s value given that fence, its ttl kept.
macro_rules! lua_fence {
    () => {
        include_str!("scripts/lib/fence.lua")
    };
}

/// Lua: `foreign(value)`, 1 when a lock key's value was not written by
/// lock-core, whose releases publish a wake-up: a token (32 lowercase hex
/// digits, alone or followed by `|` and more) or a holder set's marker
/// (`shared`, `permits:N`). Another library's string gives 1, so its
/// waiters poll sooner; an absent key (gone between the `SET` and the read)
/// or a key of another type (never released as a lock) gives 0.
macro_rules! lua_foreign {
    () => {
        include_str!("scripts/lib/foreign.lua")
    };
}

/// Deletes the key only if it still holds our token, and tells waiters.
///
/// `KEYS[1]` lock key, optional `KEYS[2]` its listeners mark (see
/// [`Wake::Listeners`]), `ARGV[1]` token, optional `ARGV[2]` = `quiet` to
/// publish nothing (the undo of a Redlock attempt that did not win: see
/// `Quorum::acquire`). Returns 1 when our lock was deleted, 0 when the key
/// is gone, belongs to another owner or holds another type.
/// A plain `DEL` would delete the next owner's lock after ours expired. On
/// release it publishes on the channel named like the key, which waiters
/// subscribe to (see `backend/wakeup.rs`); with no subscriber that costs
/// one server next to nothing. Given the listeners mark, it publishes only
/// while the mark exists.
pub(crate) static RELEASE: Lua = lua!(concat!(lua_read!(), include_str!("scripts/release.lua")));

/// [`RELEASE`], on one server, asking besides whether the next release
/// may go by the server's own `DELIFEQ` (see `backend/native.rs`): the
/// first release on each connection of a client that releases natively.
/// `redis.acl_check_cmd` (Redis 7.0) tells whether the command exists and
/// this user may run it on the key, without running it and without an
/// entry in `ACL LOG`.
///
/// `KEYS[1]` lock key, `ARGV[1]` token, `ARGV[2]` the lock's whole value
/// as this client believes it, optional `ARGV[3]` = `quiet`. Returns
/// `{released, native}`: released as [`RELEASE`]; native 1 when the
/// command may be used and the value was the lock's to the byte, 0 when
/// not, 2 when it may be used but the lock was no longer ours to compare.
pub(crate) static RELEASE_ASKING: Lua = lua!(concat!(
    lua_read!(),
    include_str!("scripts/release_asking.lua")
));

/// Whom a release's wake-up (`PUBLISH` on the channel named like the key)
/// goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wake {
    /// Published on every release: one server, or Redlock's, where a
    /// message with no subscriber costs next to nothing.
    Everyone,
    /// Published only while the key's listeners mark exists, which a
    /// waiter in another process sets (with [`LISTEN`]) before it asks
    /// again and then waits for the message. A cluster sends every
    /// `PUBLISH` to all its nodes over its bus: a release nobody waits for
    /// would cost every node of the cluster.
    Listeners,
    /// Nothing published: the undo of an attempt that did not win.
    Nobody,
}

/// The listeners mark of a lock key (see [`Wake::Listeners`]):
/// `<lock key>:listeners`, in the lock key's hash slot. Written straight
/// into the command, with no string of its own.
#[derive(Clone, Copy)]
pub(crate) struct ListenersKey<'a>(pub(crate) &'a str);

impl ToRedisArgs for ListenersKey<'_> {
    fn write_redis_args<W>(&self, out: &mut W)
    where
        W: ?Sized + RedisWrite,
    {
        let mut arg = out.writer_for_next_arg();
        // Writes into the command's own buffer cannot fail.
        let _ = arg.write_all(self.0.as_bytes());
        let _ = arg.write_all(b":listeners");
    }
}

impl ToSingleRedisArg for ListenersKey<'_> {}

/// A call of `script` over `keys`, the lock key first, that tells `wake`:
/// with [`Wake::Listeners`] the lock key's listeners mark follows as the
/// last key, which the release scripts publish for only while it exists.
/// The scripts' arguments are added after.
pub(crate) fn waking_call(script: &'static Script, keys: &[&str], wake: Wake) -> Eval {
    let listeners = wake == Wake::Listeners;
    let mut inv = Eval::new(script, keys.len() + usize::from(listeners));
    for key in keys {
        inv.key(*key);
    }
    if let (true, Some(lock)) = (listeners, keys.first()) {
        inv.key(ListenersKey(lock));
    }
    inv
}

/// The [`RELEASE`] call of `key` by `token`, telling `wake`.
pub(crate) fn release_call(key: &str, token: impl ToRedisArgs, wake: Wake) -> Eval {
    let mut inv = waking_call(&RELEASE, &[key], wake);
    inv.arg(token);
    if wake == Wake::Nobody {
        inv.arg("quiet");
    }
    inv
}

/// A waiter in another process says it listens for the key's release (see
/// [`Wake::Listeners`]): the mark lasts at least `ARGV[1]` milliseconds
/// from now, never less than it had.
///
/// `KEYS[1]` the listeners mark (`<lock key>:listeners`). Returns 1.
pub(crate) static LISTEN: Lua = lua!(include_str!("scripts/listen.lua"));

/// Renews the lease if the key still holds our token: raises its expiry to
/// the ttl, never lowers it.
///
/// `KEYS[1]` lock key, `ARGV[1]` token, `ARGV[2]` ttl in milliseconds.
/// Returns 1 when the lock is ours (its expiry now at least the ttl), 0
/// when it is not (gone, another owner, another type). A renewal that timed
/// out can still reach the server after a later, longer renewal or
/// extension: lowering the expiry then would cut the lease its holder
/// counts on, so the expiry is set with `PEXPIRE ... GT` (Redis 7.0), one
/// command where comparing `PTTL` first took two: the heartbeat's rounds
/// are most of a busy client's load on its server. Only when `GT` leaves
/// the expiry alone is `PTTL` read: a key of ours without an expiry (`GT`
/// counts none as infinite) gets one.
pub(crate) static RENEW: Lua = lua!(concat!(lua_read!(), include_str!("scripts/renew.lua")));

/// Sets the expiry to exactly the ttl, shorter or longer, if the key still
/// holds our token: for the holder that means to shorten its lease (a
/// release before `min_hold` is over, `extend` to a shorter ttl), which
/// [`RENEW`] never does.
///
/// `KEYS[1]` lock key, `ARGV[1]` token, `ARGV[2]` ttl in milliseconds.
/// Returns 1 when set, 0 when the lock is not ours (gone, another owner,
/// another type).
pub(crate) static SET_TTL: Lua = lua!(concat!(lua_read!(), include_str!("scripts/set_ttl.lua")));

/// `SET NX PX` and, when it succeeds, the next fencing token.
///
/// `KEYS[1]` lock key, `KEYS[2]` fence counter (same hash slot), `ARGV[1]`
/// the lock's value (its fence field empty: the script writes the fence
/// there), `ARGV[2]` ttl in milliseconds, `ARGV[3]` how long the counter is
/// kept, in milliseconds (refreshed at every fenced acquisition). Returns
/// the new fencing token, or 0 when the lock key exists (held, or of
/// another type: `SET NX` fails on either). Tokens keep growing across
/// holders, also across a counter that expired (see `lua_fence!`).
///
/// The fence is drawn before the key is set (the key checked free first,
/// in the same script), so the value carries it. When the counter cannot
/// be raised (another program's key of another type or not a number, an
/// ACL without `TIME`), nothing is set and that error is the answer: a
/// lock nobody knows was granted would stay held for its whole ttl. An
/// error, not 0: the lock can never be granted while the
/// counter key stays as it is, and "busy" would have the caller wait for
/// nothing.
pub(crate) static ACQUIRE_FENCED: Lua = lua!(concat!(
    lua_read!(),
    lua_fence!(),
    include_str!("scripts/acquire_fenced.lua")
));

/// The next fencing token of a counter, alone: [`ACQUIRE_FENCED`]'s
/// counter step, for a lock taken with commands of one key each while its
/// slot migrates (see `cluster.rs`). `KEYS[1]` fence counter, `ARGV[1]` how
/// long it is kept, in milliseconds. Returns the token, or the error that
/// kept the counter from being raised.
pub(crate) static NEXT_FENCE: Lua = lua!(concat!(
    lua_fence!(),
    include_str!("scripts/next_fence.lua")
));

/// Writes the fencing token `ARGV[2]` into the lock's value, only while
/// `KEYS[1]` holds our token `ARGV[1]`, keeping its ttl: the last step of
/// [`NEXT_FENCE`]'s acquisition. Returns 1, or 0 when the lock is not ours.
pub(crate) static MARK_FENCE: Lua = lua!(concat!(
    lua_read!(),
    lua_fence!(),
    include_str!("scripts/mark_fence.lua")
));

/// Raises the fence counter to at least `ARGV[2]`, only while `KEYS[1]`
/// still holds our token (Redlock fencing, second step).
///
/// `KEYS[1]` lock key, `KEYS[2]` fence counter, `ARGV[1]` token, `ARGV[2]`
/// the fencing token chosen for this acquisition, `ARGV[3]` how long the
/// counter is kept, in milliseconds (refreshed here too); the lock's value
/// gets the chosen token as its fence. Returns 1 when the
/// lock is ours here (and the counter is at least `ARGV[2]`), 0 otherwise: also
/// when either key is another program's (another type, or a counter that is
/// not a number), so the lift does not count on this server.
pub(crate) static LIFT_FENCE: Lua = lua!(concat!(
    lua_read!(),
    lua_fence!(),
    include_str!("scripts/lift_fence.lua")
));

/// [`RENEW`] for many locks in one call (the heartbeat's rounds).
///
/// `KEYS[i]` lock keys; `ARGV[2i-1]` the token and `ARGV[2i]` the ttl in
/// milliseconds for `KEYS[i]`. Returns an array: 1 where the lock is ours
/// (its expiry raised to at least the ttl, never lowered), 0 where it is
/// not. Each key is answered for itself: one that holds another type (some
/// other program's key) is 0, and does not fail the call, which would leave
/// every other lease of the batch unrenewed. Keys of one call must share a
/// server (and, in a cluster, a slot).
pub(crate) static RENEW_MANY: Lua =
    lua!(concat!(lua_read!(), include_str!("scripts/renew_many.lua")));

/// Takes over a lease handed off inside one process: sets the new holder's
/// ttl (exactly, as the new holder asked) and, when `KEYS[2]` is given, the
/// next fencing token.
///
/// `KEYS[1]` lock key, optional `KEYS[2]` fence counter, `ARGV[1]` token,
/// `ARGV[2]` ttl in milliseconds, `ARGV[3]` (with a counter) how long the
/// counter is kept, in milliseconds. Returns 0 when the lock is no longer ours
/// (or either key holds another type: the caller then releases and
/// acquires afresh); otherwise the new fencing token, or 1 without a fence
/// counter. The counter is raised before the expiry is set, so a refusal
/// leaves the lease as it was.
pub(crate) static TAKE_OVER: Lua = lua!(concat!(
    lua_read!(),
    lua_fence!(),
    include_str!("scripts/take_over.lua")
));

/// Lua: `clock_ms()`, the server's clock in milliseconds (`TIME`): the
/// scores of shared holders and permits. Redis 7 replicates a script's
/// effects, not the script, so a replica stores the same scores.
///
/// And `stretch(lock, holders, marker, now)`: after the holder set changed,
/// the marker key lives exactly as long as the longest-lived holder, and the
/// set as long; an empty set deletes both. Every exclusive acquisition's
/// `SET NX` fails while the marker exists, so an exclusive holder and
/// shared holders (or permits) never meet. The caller has checked that
/// `lock` is the marker or absent.
macro_rules! lua_holder_sets {
    () => {
        include_str!("scripts/lib/holder_sets.lua")
    };
}

/// The acquisition attempt after a first one found the key held (and
/// every fenced attempt): `SET NX PX`, and the next fencing token when
/// `KEYS[3]` is given; when the key is held, its remaining time, and the
/// mark of a waiting exclusive holder when shared holders hold it.
///
/// `KEYS[1]` lock key, `KEYS[2]` its writer-waiting mark, optional
/// `KEYS[3]` fence counter (all one hash slot); `ARGV[1]` token, `ARGV[2]`
/// ttl in milliseconds, `ARGV[3]` how long the writer mark lasts, in
/// milliseconds, `ARGV[4]` (with a counter) how long the counter is kept;
/// `ARGV[1]` is the lock's value (the fence goes into its fence field).
/// Returns `{1, fence}` (fence 0 without a counter) or `{0, pttl,
/// foreign}`, `foreign` 1 when the holder's value is not one of ours (see
/// [`lua_foreign`]): its release will publish nothing.
///
/// The writer mark (a short-lived key, refreshed by every attempt of every
/// exclusive waiter) keeps new shared holders out while an exclusive one
/// waits, so a stream of readers cannot starve it; the attempt that wins
/// deletes it, so readers queue behind a writer only while one waits. When the counter cannot
/// be raised, nothing is set and the error is the answer (see
/// [`ACQUIRE_FENCED`]).
pub(crate) static ACQUIRE: Lua = lua!(concat!(
    lua_read!(),
    lua_fence!(),
    lua_foreign!(),
    include_str!("scripts/acquire.lua")
));

/// Several keys at once, all or none: checks every key, and sets them all
/// (with the token and ttl) only when none is held.
///
/// `KEYS[1..n]` the lock keys, `KEYS[n+1..2n]` their writer marks, and with
/// fencing `KEYS[2n+1..3n]` their fence counters (all one hash slot; on
/// one server any); `ARGV[1]` token, `ARGV[2]` ttl in milliseconds,
/// `ARGV[3]` n, `ARGV[4]` how long a writer mark lasts (0: set none),
/// `ARGV[5]` (with
/// fencing) how long the counters are kept. Returns `{1, fence_1, ..,
/// fence_n}` (fences 0 without counters), or `{0, i, pttl}` for the first
/// held key, whose waiters' release message the caller then listens for.
/// A key of another type reads as held. The fences are drawn before any
/// key is set: a counter that cannot be raised leaves every key unset and
/// is the answer. `ARGV[1]` is the lock's value, each key's fence written
/// into its fence field.
pub(crate) static ACQUIRE_ALL: Lua = lua!(concat!(
    lua_read!(),
    lua_fence!(),
    include_str!("scripts/acquire_all.lua")
));

/// A shared holder or a permit joins a key's holder set.
///
/// `KEYS[1]` lock key (the marker while the set has holders), `KEYS[2]`
/// the holder set (a sorted set: token → expiry on the server's clock, in
/// milliseconds), `KEYS[3]` the writer mark (see [`ACQUIRE`]); `ARGV[1]`
/// token, `ARGV[2]` ttl in milliseconds, `ARGV[3]` the marker (`shared` or
/// `permits:N`), `ARGV[4]` N (0 for shared).
///
/// Returns `{1, 0}` when admitted; `{0, ms}` when not, with how long until
/// it may change (the exclusive holder's or the writer mark's remaining
/// time, or the first permit's expiry); `{-1, marker}` when the key is
/// held with another marker (shared against permits, or another N): an
/// error for the caller, never a wait. Expired holders are pruned first: a
/// crashed holder's permit comes back when its lease runs out.
pub(crate) static SHARED_ACQUIRE: Lua = lua!(concat!(
    lua_read!(),
    lua_holder_sets!(),
    include_str!("scripts/shared_acquire.lua")
));

/// A shared holder or a permit leaves the holder set, and waiters are told.
///
/// `KEYS[1]` lock key, `KEYS[2]` holder set, optional `KEYS[3]` the
/// listeners mark (see [`Wake::Listeners`]); `ARGV[1]` token, `ARGV[2]`
/// marker. Returns 1 when the holder was still in the set and unexpired, 0
/// otherwise. The marker's expiry shrinks to the longest remaining holder's,
/// and goes with the last one.
pub(crate) static SHARED_RELEASE: Lua = lua!(concat!(
    lua_read!(),
    lua_holder_sets!(),
    include_str!("scripts/shared_release.lua")
));

/// Renews holders in holder sets: each one's expiry raised to its ttl from
/// now (never lowered), or, with `ARGV[1]` = 1, set to exactly that
/// (`min_hold`, a shorter `extend`).
///
/// `KEYS[2i-1]` lock key and `KEYS[2i]` holder set of the i-th holder;
/// `ARGV[1]` exact (0 or 1), then per holder `ARGV[3i-1]` marker,
/// `ARGV[3i]` token, `ARGV[3i+1]` ttl in milliseconds. Returns an array: 1
/// where the holder is still in its set and unexpired, 0 where not (it is
/// then removed).
pub(crate) static SHARED_RENEW: Lua = lua!(concat!(
    lua_read!(),
    lua_holder_sets!(),
    include_str!("scripts/shared_renew.lua")
));

/// What holds a lock key now, for operators (`LockClient::inspect`).
///
/// `KEYS[1]` lock key, `KEYS[2]` its holder set. Returns `{state, pttl,
/// now_ms, value, holders}`: `state` is `free`, `held` or `foreign` (a key
/// of another type, whose type is then the value); `now_ms` the server's
/// clock (`TIME`); `holders` the live members of the holder set for a
/// shared or permits marker, 1 for an exclusive holder. Writes nothing.
pub(crate) static INSPECT: Lua = lua!(concat!(
    lua_read!(),
    lua_holder_sets!(),
    include_str!("scripts/inspect.lua")
));

/// Deletes whatever holds a lock key, for operators
/// (`LockClient::force_release`), and tells its waiters.
///
/// `KEYS[1]` lock key, `KEYS[2]` its holder set, `KEYS[3]` its tombstone
/// (`<lock key>:evicted`), optional `KEYS[4]` its listeners mark (see
/// [`Wake::Listeners`]). An exclusive holder's token, or every shared
/// holder's, goes into the tombstone for as long as the evicted lease had
/// left (added to the tokens already there), so the holders can tell at
/// their next renewal that they were evicted rather than expired. Returns
/// `{1, value, holders, pttl}` with the value removed, how many live
/// holders it had and what its lease had left (`PTTL`: -1 without expiry),
/// `{0, "", 0, -2}` when the key was free, `{-1, type, 0, -2}` for a key of
/// another type, which is left alone: it is not a lock.
pub(crate) static FORCE_RELEASE: Lua = lua!(concat!(
    lua_read!(),
    lua_holder_sets!(),
    include_str!("scripts/force_release.lua")
));

/// The scripts against a real `redis-server`.
/// A waiter records (or refreshes) that it waits for a key: one member of
/// the key's waiters set (see `waits.rs` and `docs/deadlocks.md`).
///
/// `KEYS[1]` the waiters set (`<lock key>:waiters`, a sorted set: member
/// → expiry on the server's clock, in milliseconds); `ARGV[1]` the member
/// (`<owner>|<since ms>|<holder>`), `ARGV[2]` how long it lasts, in
/// milliseconds. Expired members are pruned first; the set lasts as long
/// as its longest-lived member. Returns 1.
pub(crate) static WAIT_RECORD: Lua = lua!(include_str!("scripts/wait_record.lua"));

/// One step of the deadlock walk: who holds a key, and what that holder
/// waits for.
///
/// `KEYS[1]` lock key, `KEYS[2]` its wait notes (`<lock key>:waiting`, a
/// sorted set written by [`WAIT_RECORD`]: one member per wait of a holder
/// of the key, scored by its expiry). Returns `{value, notes}`: the value
/// (nil when absent) and the notes not yet expired; nil and none when the
/// lock key is not a string (shared holders, permits, another program's
/// key: never followed). Writes nothing.
pub(crate) static WAIT_HOP: Lua = lua!(include_str!("scripts/wait_hop.lua"));

/// The live members of a key's waiters set, for operators.
///
/// `KEYS[1]` the waiters set. Returns `{now_ms, member, ...}`: the
/// server's clock, then every member not yet expired. Writes nothing.
pub(crate) static WAITERS: Lua = lua!(include_str!("scripts/waiters.lua"));

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use lock_testkit::RedisServer;
    use redis::aio::MultiplexedConnection;

    async fn connect(server: &RedisServer) -> MultiplexedConnection {
        redis::Client::open(server.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    }

    /// `script` called with `keys` and `args`.
    async fn call<T: FromRedisValue>(
        conn: &mut MultiplexedConnection,
        script: &'static Script,
        keys: &[&str],
        args: &[&str],
    ) -> RedisResult<T> {
        let mut eval = Eval::new(script, keys.len());
        for key in keys {
            eval.key(*key);
        }
        for arg in args {
            eval.arg(*arg);
        }
        eval.invoke(conn).await
    }

    fn pttl(server: &RedisServer, key: &str) -> i64 {
        server.cmd(&["PTTL", key])
    }

    /// Every script compiles on a server, under the hash it is called by:
    /// a helper file that lost its final newline would run into the first
    /// line of the file after it.
    #[test]
    fn every_script_loads_under_its_hash() {
        let server = RedisServer::start();
        for lua in ALL {
            let hash: String = server.cmd(&["SCRIPT", "LOAD", lua.code]);
            assert_eq!(hash, lua.get_hash(), "{}", lua.code);
        }
    }

    /// A command built after another was dropped on the same thread reuses
    /// its buffers and holds none of its arguments.
    #[test]
    fn a_spare_command_starts_empty() {
        let mut first = command(2, 16);
        first.arg("SET").arg("k").arg("v");
        assert_eq!(first.args_iter().count(), 3);
        drop(first);
        let mut next = command(2, 16);
        assert_eq!(next.args_iter().count(), 0);
        next.arg("GET").arg("k");
        assert_eq!(next.get_packed_command(), b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n");
    }

    /// The listeners mark is one key named after the lock's, so it shares
    /// its hash slot, and the release scripts find it last.
    #[tokio::test]
    async fn the_listeners_mark_is_named_after_the_lock_key() {
        let server = RedisServer::start();
        let mut conn = connect(&server).await;
        let mut listen = Eval::new(&LISTEN, 1);
        listen.key(ListenersKey("lock:{a}")).arg(5000);
        let listened: i64 = listen.invoke(&mut conn).await.unwrap();
        assert_eq!(listened, 1);
        assert!(pttl(&server, "lock:{a}:listeners") > 3000);

        let call = waking_call(&RELEASE, &["lock:{a}"], Wake::Listeners);
        let packed = String::from_utf8(call.cmd.get_packed_command()).unwrap();
        assert!(
            packed.ends_with("$8\r\nlock:{a}\r\n$18\r\nlock:{a}:listeners\r\n"),
            "{packed:?}"
        );
        let call = waking_call(&RELEASE, &["lock:{a}"], Wake::Everyone);
        let packed = String::from_utf8(call.cmd.get_packed_command()).unwrap();
        assert!(
            packed.ends_with("\r\n1\r\n$8\r\nlock:{a}\r\n"),
            "{packed:?}"
        );
    }

    #[tokio::test]
    async fn renewals_raise_the_expiry_and_never_lower_it() {
        let server = RedisServer::start();
        let mut conn = connect(&server).await;
        let () = server.cmd(&["SET", "k", "ours", "PX", "10000"]);
        // A late renewal for a shorter ttl: still ours, the expiry stays.
        let renewed: i64 = call(&mut conn, &RENEW, &["k"], &["ours", "1000"])
            .await
            .unwrap();
        assert_eq!(renewed, 1);
        assert!(pttl(&server, "k") > 5000, "{}", pttl(&server, "k"));
        let renewed: i64 = call(&mut conn, &RENEW, &["k"], &["ours", "20000"])
            .await
            .unwrap();
        assert_eq!(renewed, 1);
        assert!(pttl(&server, "k") > 15_000, "{}", pttl(&server, "k"));

        // The same in a batch, per key: one longer, one shorter than left.
        let () = server.cmd(&["SET", "long", "ours", "PX", "10000"]);
        let () = server.cmd(&["SET", "short", "ours", "PX", "500"]);
        let renewed: Vec<i64> = call(
            &mut conn,
            &RENEW_MANY,
            &["long", "short"],
            &["ours", "1000", "ours", "10000"],
        )
        .await
        .unwrap();
        assert_eq!(renewed, [1, 1]);
        assert!(pttl(&server, "long") > 5000, "{}", pttl(&server, "long"));
        assert!(pttl(&server, "short") > 5000, "{}", pttl(&server, "short"));

        // A key of ours without an expiry gets one.
        let () = server.cmd(&["SET", "forever", "ours"]);
        let renewed: i64 = call(&mut conn, &RENEW, &["forever"], &["ours", "1000"])
            .await
            .unwrap();
        assert_eq!(renewed, 1);
        let left = pttl(&server, "forever");
        assert!(left > 0 && left <= 1000, "{left}");
    }

    #[tokio::test]
    async fn a_value_is_ours_when_it_is_the_token_or_starts_with_it_and_a_bar() {
        let server = RedisServer::start();
        let mut conn = connect(&server).await;
        let () = server.cmd(&["SET", "k", "tok|1700000000000||web-1", "PX", "10000"]);
        for (token, ours) in [("tok", 1), ("to", 0), ("tok|", 0), ("tok|1", 0), ("x", 0)] {
            let renewed: i64 = call(&mut conn, &RENEW, &["k"], &[token, "20000"])
                .await
                .unwrap();
            assert_eq!(renewed, ours, "{token}");
        }
        // The Redlock lift writes the chosen fence into the value.
        let lifted: i64 = call(&mut conn, &LIFT_FENCE, &["k", "f"], &["tok", "42", "60000"])
            .await
            .unwrap();
        assert_eq!(lifted, 1);
        let value: String = server.cmd(&["GET", "k"]);
        assert_eq!(value, "tok|1700000000000|42|web-1");
        assert!(pttl(&server, "k") > 5000, "the lift kept the expiry");
        let released: i64 = call(&mut conn, &RELEASE, &["k"], &["tok"]).await.unwrap();
        assert_eq!(released, 1);
    }

    #[tokio::test]
    async fn set_ttl_sets_the_expiry_exactly_if_ours() {
        let server = RedisServer::start();
        let mut conn = connect(&server).await;
        let () = server.cmd(&["SET", "k", "ours", "PX", "10000"]);
        let set: i64 = call(&mut conn, &SET_TTL, &["k"], &["ours", "300"])
            .await
            .unwrap();
        assert_eq!(set, 1);
        let left = pttl(&server, "k");
        assert!(left > 0 && left <= 300, "{left}");
        let set: i64 = call(&mut conn, &SET_TTL, &["k"], &["theirs", "10000"])
            .await
            .unwrap();
        assert_eq!(set, 0);
        assert!(pttl(&server, "k") <= 300);
    }

    #[tokio::test]
    async fn a_key_of_another_type_is_not_ours_and_fails_no_script() {
        let server = RedisServer::start();
        let mut conn = connect(&server).await;
        let () = server.cmd(&["HSET", "h", "field", "value"]);
        let () = server.cmd(&["SET", "k", "ours", "PX", "10000"]);
        let one_key: [(&'static Script, &[&str]); 4] = [
            (&RELEASE, &["ours"]),
            (&RENEW, &["ours", "1000"]),
            (&SET_TTL, &["ours", "1000"]),
            (&TAKE_OVER, &["ours", "1000"]),
        ];
        for (script, args) in one_key {
            let answer: i64 = call(&mut conn, script, &["h"], args).await.unwrap();
            assert_eq!(answer, 0);
        }
        // In a batch the foreign key is answered 0, and the others as usual.
        let renewed: Vec<i64> = call(
            &mut conn,
            &RENEW_MANY,
            &["h", "k", "gone"],
            &["ours", "20000", "ours", "20000", "ours", "20000"],
        )
        .await
        .unwrap();
        assert_eq!(renewed, [0, 1, 0]);
        assert!(pttl(&server, "k") > 15_000);

        // A foreign lock key or fence counter: the lift and the take-over
        // do not count here, and the take-over leaves the lease alone.
        let lifted: i64 = call(&mut conn, &LIFT_FENCE, &["h", "f"], &["ours", "5"])
            .await
            .unwrap();
        assert_eq!(lifted, 0);
        let lifted: i64 = call(&mut conn, &LIFT_FENCE, &["k", "h"], &["ours", "5"])
            .await
            .unwrap();
        assert_eq!(lifted, 0);
        let taken: i64 = call(&mut conn, &TAKE_OVER, &["k", "h"], &["ours", "100"])
            .await
            .unwrap();
        assert_eq!(taken, 0);
        assert!(pttl(&server, "k") > 15_000);

        // Fenced acquisition: a foreign lock key is busy; a foreign counter
        // is an error, with the lock just set undone.
        let fence: i64 = call(&mut conn, &ACQUIRE_FENCED, &["h", "f"], &["ours", "1000"])
            .await
            .unwrap();
        assert_eq!(fence, 0);
        let err = call::<i64>(
            &mut conn,
            &ACQUIRE_FENCED,
            &["free", "h"],
            &["ours", "1000"],
        )
        .await
        .unwrap_err();
        assert_eq!(err.code(), Some("WRONGTYPE"), "{err}");
        assert_eq!(server.cmd::<i64>(&["EXISTS", "free"]), 0);

        let kind: String = server.cmd(&["TYPE", "h"]);
        assert_eq!(kind, "hash", "the other program's key was changed");
    }

    #[tokio::test]
    async fn a_busy_attempt_tells_another_librarys_holder_from_ours() {
        let server = RedisServer::start();
        let mut conn = connect(&server).await;
        let token = "0123456789abcdef0123456789abcdef";
        let suffixed = format!("{token}|1733100000000|7|host:42");
        let cases = [
            (token, 0),
            (suffixed.as_str(), 0),
            ("shared", 0),
            ("permits:3", 0),
            ("0123456789ABCDEF0123456789ABCDEF", 1),
            ("0123456789abcdef0123456789abcdef0", 1),
            ("0123456789abcdef", 1),
            ("6f1c2a9e-1b7d-4c55-9a0e-3f2d8c7b6a51", 1),
            ("1", 1),
        ];
        for (value, foreign) in cases {
            let () = server.cmd(&["SET", "k", value, "PX", "10000"]);
            let answer: Vec<i64> = call(&mut conn, &ACQUIRE, &["k", "k:w"], &["t", "1000", "500"])
                .await
                .unwrap();
            assert_eq!(answer[0], 0, "{value}");
            assert!(answer[1] > 5000, "{value}: {answer:?}");
            assert_eq!(answer[2], foreign, "{value}");
        }
        // Another type's key is never released as a lock: not polled sooner.
        let () = server.cmd(&["DEL", "k"]);
        let _: i64 = server.cmd(&["LPUSH", "k", "x"]);
        let answer: Vec<i64> = call(&mut conn, &ACQUIRE, &["k", "k:w"], &["t", "1000", "500"])
            .await
            .unwrap();
        assert_eq!(answer, [0, -1, 0]);
    }
}
