//! Releases by the server's own compare-and-delete, `DELIFEQ key value`
//! (Valkey 9.0 and later), where the connection found it (see
//! `wire::native`): no script runs on the server's one thread. The value
//! must be the lock's to the byte, which it is for a token drawn dated
//! ([`Token::stamped`](crate::token::Token::stamped)) and a lock that was
//! never fenced; anything else, and any server without the command, keeps
//! the `RELEASE` script. The wake-up the script publishes goes in a
//! `PUBLISH` right behind it, in the same write: waiters hear the release
//! as they do from the script. `DELIFEQ` never touches a value that is not
//! ours to the byte, so another library's lock is safe as with the script.

use super::wire::native::Support;
pub(crate) use super::wire::native::Use;
use crate::scripts::{self, Eval, Wake};
use crate::token::{Stamped, Token};
use redis::aio::ConnectionLike;
use redis::{Cmd, RedisResult, Value};

/// `DELIFEQ key value`.
pub(crate) fn delete(key: &str, value: Stamped<'_>) -> Cmd {
    let mut cmd = redis::cmd("DELIFEQ");
    cmd.arg(key).arg(value);
    cmd
}

/// The release's wake-up: the empty message on the key's channel, as the
/// script publishes it.
pub(crate) fn wake_up(key: &str) -> Cmd {
    let mut cmd = redis::cmd("PUBLISH");
    cmd.arg(key).arg("");
    cmd
}

/// A release that tells everyone: `DELIFEQ`, then the wake-up.
pub(crate) fn release_commands(key: &str, value: Stamped<'_>) -> [Cmd; 2] {
    [delete(key, value), wake_up(key)]
}

/// Whether a release telling `wake` can go natively at all: a cluster
/// publishes only while waiters listen, which takes the script.
pub(crate) fn tells(wake: Wake) -> bool {
    wake != Wake::Listeners
}

/// What a release learned of the command, for the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Told {
    Allowed,
    Refused,
    Nothing,
}

impl Told {
    /// Records it on what the connection knows.
    pub(crate) fn record(self, support: &Support) {
        match self {
            Told::Allowed => support.allow(),
            Told::Refused => support.refuse(),
            Told::Nothing => {}
        }
    }
}

/// Releases `key` if it holds `value` (`token`'s exclusive lock), telling
/// `wake`, as `usable` allows, and awaits the answer: whether it was
/// deleted, or `None` when the caller is to release with the script (the
/// command may not be used, or the server refused it just now).
pub(crate) async fn release<C: ConnectionLike>(
    conn: &mut C,
    key: &str,
    (token, value): (&Token, Stamped<'_>),
    wake: Wake,
    usable: Use,
) -> RedisResult<(Option<bool>, Told)> {
    match usable {
        Use::No => Ok((None, Told::Nothing)),
        Use::Ask => {
            let mut inv = Eval::new(&scripts::RELEASE_ASKING, 1);
            inv.key(key).arg(token).arg(value);
            if wake == Wake::Nobody {
                inv.arg("quiet");
            }
            let (released, native): (i64, i64) = inv.invoke(conn).await?;
            let told = match native {
                1 => Told::Allowed,
                0 => Told::Refused,
                _ => Told::Nothing,
            };
            Ok((Some(released == 1), told))
        }
        Use::Yes => delete_if_equal(conn, key, value, wake).await,
    }
}

/// `DELIFEQ`, and the wake-up behind it.
async fn delete_if_equal<C: ConnectionLike>(
    conn: &mut C,
    key: &str,
    value: Stamped<'_>,
    wake: Wake,
) -> RedisResult<(Option<bool>, Told)> {
    let mut pipe = redis::pipe();
    pipe.add_command(delete(key, value));
    let count = if wake == Wake::Everyone {
        pipe.add_command(wake_up(key));
        2
    } else {
        1
    };
    let answers = conn.req_packed_commands(&pipe, 0, count).await?;
    match answers.into_iter().next() {
        // 0: not that value, so not ours: the value of a lock of ours is
        // known to the byte (the first release on each connection checked
        // that it is, see `RELEASE_ASKING`).
        Some(Value::Int(n)) => Ok((Some(n == 1), Told::Nothing)),
        // Another type under the key: not ours, as the script answers.
        Some(Value::ServerError(e)) if e.code() == "WRONGTYPE" => Ok((Some(false), Told::Nothing)),
        Some(Value::ServerError(e)) if refused(e.code(), e.details().unwrap_or_default()) => {
            Ok((None, Told::Refused))
        }
        Some(other) => Err(other.extract_error().err().unwrap_or_else(unexpected)),
        None => Err(unexpected()),
    }
}

/// Whether an error answer says the command may not be used here: no
/// such command, or an ACL without it.
fn refused(code: &str, details: &str) -> bool {
    code == "NOPERM" || (code == "ERR" && details.contains("unknown command"))
}

fn unexpected() -> redis::RedisError {
    redis::RedisError::from((
        redis::ErrorKind::Parse,
        "DELIFEQ answered neither a number nor an error",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_told_from_other_errors() {
        assert!(refused(
            "NOPERM",
            "User locker has no permissions to run the 'delifeq' command"
        ));
        assert!(refused(
            "ERR",
            "unknown command 'DELIFEQ', with args beginning with: "
        ));
        assert!(!refused(
            "WRONGTYPE",
            "Operation against a key holding the wrong kind of value"
        ));
        assert!(!refused(
            "READONLY",
            "You can't write against a read only replica."
        ));
        assert!(!refused("ERR", "syntax error"));
    }
}
