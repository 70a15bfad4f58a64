//! The Lua scripts that make acquire, renew and release atomic.
//!
//! Each is sent with `EVALSHA` through [`Eval`], which loads the script and
//! sends the call again when the server answers `NOSCRIPT` (after `SCRIPT
//! FLUSH` or a restart). That is also how a script is first loaded: the
//! server's script cache serves all its connections, so this costs a
//! `NOSCRIPT` answer and a `SCRIPT LOAD` once per script and server, and
//! reconnecting costs nothing more than logging in.

use redis::aio::ConnectionLike;
use redis::{Cmd, FromRedisValue, RedisResult, Script, ToRedisArgs};
use std::sync::LazyLock;

/// One `EVALSHA` call of a script.
///
/// Built straight into one command (`redis::ScriptInvocation` collects the
/// keys and arguments into vectors first and copies them into a command on
/// every send), since these calls sit on every acquisition and release.
pub(crate) struct Eval {
    script: &'static Script,
    cmd: Cmd,
    keys_left: usize,
}

impl Eval {
    /// A call of `script` with `keys` keys: add exactly that many with
    /// [`key`](Self::key), then the arguments with [`arg`](Self::arg).
    pub(crate) fn new(script: &'static Script, keys: usize) -> Eval {
        let mut cmd = Cmd::with_capacity(3 + 3 * keys, 64 + 64 * keys);
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

/// Deletes the key only if it still holds our token, and tells waiters.
///
/// `KEYS[1]` lock key, `ARGV[1]` token. Returns 1 when our lock was deleted,
/// 0 when the key is gone or belongs to another owner. A plain `DEL` would
/// delete the next owner's lock after ours expired. On release it publishes
/// on the channel named like the key, which waiters subscribe to (see
/// `backend/wakeup.rs`); with no subscriber that costs next to nothing.
pub(crate) static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"if redis.call("GET", KEYS[1]) == ARGV[1] then
  redis.call("DEL", KEYS[1])
  redis.call("PUBLISH", KEYS[1], "")
  return 1
end
return 0"#,
    )
});

/// Sets a new expiry only if the key still holds our token.
///
/// `KEYS[1]` lock key, `ARGV[1]` token, `ARGV[2]` ttl in milliseconds.
/// Returns 1 when extended, 0 when the lock is no longer ours.
pub(crate) static RENEW: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"if redis.call("GET", KEYS[1]) == ARGV[1] then
  return redis.call("PEXPIRE", KEYS[1], ARGV[2])
end
return 0"#,
    )
});

/// `SET NX PX` and, when it succeeds, the next fencing token.
///
/// `KEYS[1]` lock key, `KEYS[2]` fence counter (same hash slot), `ARGV[1]`
/// token, `ARGV[2]` ttl in milliseconds. Returns the new fencing token, or 0
/// when the lock is held. The counter never expires, so tokens keep growing
/// across holders for as long as the server keeps its data.
pub(crate) static ACQUIRE_FENCED: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"if redis.call("SET", KEYS[1], ARGV[1], "NX", "PX", ARGV[2]) then
  return redis.call("INCR", KEYS[2])
end
return 0"#,
    )
});

/// Raises the fence counter to at least `ARGV[2]`, only while `KEYS[1]`
/// still holds our token (Redlock fencing, second step).
///
/// `KEYS[1]` lock key, `KEYS[2]` fence counter, `ARGV[1]` token, `ARGV[2]`
/// the fencing token chosen for this acquisition. Returns 1 when the lock is
/// ours here (and the counter is at least `ARGV[2]`), 0 otherwise.
pub(crate) static LIFT_FENCE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"if redis.call("GET", KEYS[1]) == ARGV[1] then
  local current = tonumber(redis.call("GET", KEYS[2]) or "0")
  if current < tonumber(ARGV[2]) then
    redis.call("SET", KEYS[2], ARGV[2])
  end
  return 1
end
return 0"#,
    )
});

/// [`RENEW`] for many locks in one call (the heartbeat's rounds).
///
/// `KEYS[i]` lock keys; `ARGV[2i-1]` the token and `ARGV[2i]` the ttl in
/// milliseconds for `KEYS[i]`. Returns an array: 1 where extended, 0 where
/// the lock is no longer ours. Keys of one call must share a server (and,
/// in a cluster, a slot).
pub(crate) static RENEW_MANY: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"local renewed = {}
for i, key in ipairs(KEYS) do
  if redis.call("GET", key) == ARGV[2 * i - 1] then
    renewed[i] = redis.call("PEXPIRE", key, ARGV[2 * i])
  else
    renewed[i] = 0
  end
end
return renewed"#,
    )
});

/// Takes over a lease handed off inside one process: sets the new holder's
/// ttl and, when `KEYS[2]` is given, the next fencing token.
///
/// `KEYS[1]` lock key, optional `KEYS[2]` fence counter, `ARGV[1]` token,
/// `ARGV[2]` ttl in milliseconds. Returns 0 when the lock is no longer ours;
/// otherwise the new fencing token, or 1 without a fence counter.
pub(crate) static TAKE_OVER: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"if redis.call("GET", KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call("PEXPIRE", KEYS[1], ARGV[2])
if KEYS[2] then
  return redis.call("INCR", KEYS[2])
end
return 1"#,
    )
});
