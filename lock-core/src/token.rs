//! Ownership tokens: the value stored under a lock key that says who owns it.

use rand::Rng;
use std::fmt;

/// Bytes of randomness in a token (128 bits).
pub(crate) const TOKEN_BYTES: usize = 16;

/// A fresh, unguessable owner token: 16 bytes from the thread-local CSPRNG
/// (ChaCha, seeded from the operating system), hex-encoded.
///
/// A new token is made for every acquisition, so a lock can only be renewed or
/// released by the acquisition that took it, never by another task or process
/// that happens to share a client.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Token([u8; TOKEN_BYTES * 2]);

impl Token {
    pub(crate) fn generate() -> Token {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut raw = [0u8; TOKEN_BYTES];
        rand::rng().fill_bytes(&mut raw);
        let mut hex = [0u8; TOKEN_BYTES * 2];
        for (i, byte) in raw.iter().enumerate() {
            hex[2 * i] = HEX[usize::from(byte >> 4)];
            hex[2 * i + 1] = HEX[usize::from(byte & 0x0f)];
        }
        Token(hex)
    }

    #[cfg(test)]
    pub(crate) fn as_str(&self) -> &str {
        // Only ASCII hex digits are ever written into the array.
        std::str::from_utf8(&self.0).unwrap_or_default()
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
        out.write_arg(&self.0);
    }
}

impl redis::ToSingleRedisArg for Token {}

#[cfg(test)]
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
    fn debug_does_not_leak_the_token() {
        let token = Token::generate();
        assert!(!format!("{token:?}").contains(token.as_str()));
    }
}
