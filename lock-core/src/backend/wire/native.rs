//! What a connection knows of the server's native compare-and-delete
//! (`DELIFEQ key value`, Valkey 9.0 and later). Nothing at first: the
//! first release that could use it runs the release script that also asks
//! (`RELEASE_ASKING`, with `redis.acl_check_cmd`), and its answer settles
//! it for the connection. An ACL changed later that refuses the command
//! settles it again.

use std::sync::atomic::{AtomicU8, Ordering};

/// Not known yet.
const UNKNOWN: u8 = 0;
/// The server has it and this user may run it.
const ALLOWED: u8 = 1;
/// The server lacks it, or refuses it to this user.
const REFUSED: u8 = 2;

/// A connection's knowledge of `DELIFEQ`.
#[derive(Default)]
pub(crate) struct Support(AtomicU8);

/// How a release may use `DELIFEQ` on a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Use {
    /// Not: the script.
    No,
    /// Not yet: the script that asks, its reply awaited.
    Ask,
    /// Yes, also without waiting for the reply.
    Yes,
}

impl Support {
    /// How a release may use it now.
    pub(crate) fn usable(&self) -> Use {
        match self.0.load(Ordering::Relaxed) {
            UNKNOWN => Use::Ask,
            ALLOWED => Use::Yes,
            _ => Use::No,
        }
    }

    /// The server allows it: releases of values known to the byte use it.
    pub(crate) fn allow(&self) {
        let _ = self
            .0
            .compare_exchange(UNKNOWN, ALLOWED, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// The server lacks or refuses it: the script from now on, on this
    /// connection.
    pub(crate) fn refuse(&self) {
        self.0.store(REFUSED, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn asked_then_allowed_or_refused_for_good() {
        let support = Support::default();
        assert_eq!(support.usable(), Use::Ask);
        support.allow();
        assert_eq!(support.usable(), Use::Yes);
        support.refuse();
        assert_eq!(support.usable(), Use::No);
        support.allow();
        assert_eq!(support.usable(), Use::No, "a refusal stands");
    }
}
