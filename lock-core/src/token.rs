//! Ownership tokens: the value stored under a lock key that says who owns it.

use rand::Rng;
use std::fmt;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Bytes of randomness in a token (128 bits).
pub(crate) const TOKEN_BYTES: usize = 16;

/// A fresh, unguessable owner token: 16 bytes from the thread-local CSPRNG
/// (ChaCha, seeded from the operating system), hex-encoded.
///
/// A new token is made for every acquisition, so a lock can only be renewed or
/// released by the acquisition that took it, never by another task or process
/// that happens to share a client. An exclusive lock's value goes on with
/// its holder's name (see [`Stamped`]); the token alone still decides
/// ownership.
#[derive(Clone)]
pub(crate) struct Token {
    hex: [u8; TOKEN_BYTES * 2],
    /// The acquisition time its exclusive value carries, in the server's
    /// milliseconds, when it was drawn for one ([`Token::stamped`]); 0
    /// when the value is dated as it is written. A value known to the byte
    /// can be deleted by a native compare-and-delete (`DELIFEQ`).
    at_ms: i64,
}

impl PartialEq for Token {
    fn eq(&self, other: &Token) -> bool {
        self.hex == other.hex
    }
}

impl Eq for Token {}

/// The longest holder name a client accepts, in bytes.
pub const MAX_HOLDER_LEN: usize = 256;

/// Who takes a client's locks, as written into every exclusive lock's
/// value, and the client's estimate of the server's clock, for the time of
/// acquisition written beside it.
pub(crate) struct Holder {
    name: Box<str>,
    /// The server's clock minus this machine's, in milliseconds; learned
    /// from `TIME` when the client connects and at every inspection.
    offset_ms: AtomicI64,
}

impl Holder {
    pub(crate) fn new(name: &str) -> Holder {
        Holder {
            name: name.into(),
            offset_ms: AtomicI64::new(0),
        }
    }

    /// The holder name.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Records that the server's clock read `server_ms` around `local_ms`
    /// on this machine's.
    pub(crate) fn learn_offset(&self, server_ms: i64, local_ms: i64) {
        self.offset_ms
            .store(server_ms.saturating_sub(local_ms), Ordering::Relaxed);
    }

    /// The server's clock now, as far as this client can tell, in
    /// milliseconds since 1970.
    pub(crate) fn server_now_ms(&self) -> i64 {
        local_now_ms().saturating_add(self.offset_ms.load(Ordering::Relaxed))
    }

    /// What an exclusive acquisition by `token` stores under the lock key
    /// (see [`Stamped`]).
    #[cfg(test)]
    pub(crate) fn stamp<'a>(&'a self, token: &'a Token) -> Stamped<'a> {
        Stamped {
            token,
            holder: Some(self),
        }
    }
}

/// The value of an exclusive lock: `<token>|<acquired ms>||<holder>`, the
/// acquisition dated when the command is written (the fence, when there is
/// one, goes between the two bars, written by the script that draws it),
/// or the token alone without a holder. See `docs/format.md`.
///
/// Written straight into the command, from a buffer on the stack: this
/// runs on every acquisition attempt, the uncontended one included. The
/// holder travels beside the token, not inside it: tokens are cloned on
/// every acquisition, and a shared `Arc` in each would have every task of
/// a busy process bump one reference count.
#[derive(Clone, Copy)]
pub(crate) struct Stamped<'a> {
    pub(crate) token: &'a Token,
    pub(crate) holder: Option<&'a Holder>,
}

impl Stamped<'_> {
    /// Calls `f` with the value's bytes.
    fn with_bytes<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        let Some(holder) = self.holder else {
            return f(&self.token.hex);
        };
        let mut buf = [0u8; TOKEN_BYTES * 2 + 24 + MAX_HOLDER_LEN];
        let mut len = 0;
        let mut push = |bytes: &[u8]| {
            let end = (len + bytes.len()).min(buf.len());
            buf[len..end].copy_from_slice(&bytes[..end - len]);
            len = end;
        };
        push(&self.token.hex);
        push(b"|");
        let mut digits = [0u8; 20];
        let at_ms = match self.token.at_ms {
            0 => holder.server_now_ms(),
            at_ms => at_ms,
        };
        push(decimal(at_ms, &mut digits));
        push(b"||");
        push(holder.name.as_bytes());
        f(&buf[..len])
    }

    /// Whether the value is the same at every write: the token alone, or
    /// a token dated when it was drawn ([`Token::stamped`]). Only such a
    /// value can be named to a native compare-and-delete.
    pub(crate) fn exact(&self) -> bool {
        self.holder.is_none() || self.token.at_ms != 0
    }

    /// The value as text, for the in-memory store.
    pub(crate) fn to_text(self) -> String {
        self.with_bytes(|bytes| String::from_utf8_lossy(bytes).into_owned())
    }
}

impl redis::ToRedisArgs for Stamped<'_> {
    fn write_redis_args<W>(&self, out: &mut W)
    where
        W: ?Sized + redis::RedisWrite,
    {
        self.with_bytes(|bytes| out.write_arg(bytes));
    }
}

impl redis::ToSingleRedisArg for Stamped<'_> {}

/// `n` in decimal, written at the end of `digits` (no allocation).
fn decimal(n: i64, digits: &mut [u8; 20]) -> &[u8] {
    let mut rest = n.max(0).unsigned_abs();
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    &digits[at..]
}

/// This machine's clock, in milliseconds since 1970.
pub(crate) fn local_now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// `hostname:pid`, the holder name a client has unless told otherwise.
pub(crate) fn default_holder_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .or_else(|| std::env::var("COMPUTERNAME").ok())
        .unwrap_or_else(|| "unknown-host".to_owned());
    format!("{host}:{}", std::process::id())
}

impl Token {
    pub(crate) fn generate() -> Token {
        Token {
            hex: random_hex(),
            at_ms: 0,
        }
    }

    /// The same token, its value no longer taken as known to the byte (a
    /// fence was written into it).
    pub(crate) fn undated(self) -> Token {
        Token { at_ms: 0, ..self }
    }

    /// A token for one exclusive acquisition attempt by `holder`, dated
    /// now: the value it stores is then known to the byte (see
    /// [`Stamped::exact`]).
    pub(crate) fn stamped(holder: &Holder) -> Token {
        Token {
            hex: random_hex(),
            at_ms: holder.server_now_ms().max(1),
        }
    }
}

fn random_hex() -> [u8; TOKEN_BYTES * 2] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut raw = [0u8; TOKEN_BYTES];
    rand::rng().fill_bytes(&mut raw);
    let mut hex = [0u8; TOKEN_BYTES * 2];
    for (i, byte) in raw.iter().enumerate() {
        hex[2 * i] = HEX[usize::from(byte >> 4)];
        hex[2 * i + 1] = HEX[usize::from(byte & 0x0f)];
    }
    hex
}

impl Token {
    /// The token's 32 hex digits.
    pub(crate) fn as_str(&self) -> &str {
        // Only ASCII hex digits are ever written into the array.
        std::str::from_utf8(&self.hex).unwrap_or_default()
    }
}

impl fmt::Debug for Token {
    // A token is a capability: keep it out of logs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(..)")
    }
}

impl redis::ToRedisArgs for Token {
    fn write_redis_args<W>(&self, out: &mut W)
    where
        W: ?Sized + redis::RedisWrite,
    {
        out.write_arg(&self.hex);
    }
}

impl redis::ToSingleRedisArg for Token {}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn tokens_are_32_hex_chars_and_unique() {
        let mut seen = HashSet::new();
        for _ in 0..10_000 {
            let token = Token::generate();
            let s = token.as_str();
            assert_eq!(s.len(), 32);
            assert!(
                s.bytes()
                    .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
            );
            assert!(seen.insert(s.to_owned()), "duplicate token {s}");
        }
    }

    #[test]
    fn values_carry_the_time_in_decimal_and_the_holder() {
        for n in [0, 7, 10, 1_764_637_200_123, i64::MAX] {
            let mut digits = [0u8; 20];
            assert_eq!(decimal(n, &mut digits), n.to_string().as_bytes());
        }
        let holder = Holder::new("web-1:42");
        let token = Token::generate();
        let value = holder.stamp(&token).to_text();
        let fields: Vec<&str> = value.splitn(4, '|').collect();
        assert_eq!(fields[0], token.as_str());
        assert!(fields[1].parse::<i64>().unwrap() > 1_700_000_000_000);
        assert_eq!(&fields[2..], ["", "web-1:42"]);
        let long = Holder::new(&"h".repeat(MAX_HOLDER_LEN));
        let value = long.stamp(&token).to_text();
        assert!(value.ends_with(&"h".repeat(MAX_HOLDER_LEN)), "{value}");
    }

    #[test]
    fn debug_does_not_leak_the_token() {
        let token = Token::generate();
        assert!(!format!("{token:?}").contains(token.as_str()));
    }
}
