//! `wait = "forever"`: a leader election, with the arguments that go with
//! it, on free functions and methods; the futures are `Send`.
#![deny(warnings)]

use lock_core::{LockClient, LockError, distributed_lock};

/// A key template, a ttl, and the term read in the body.
#[distributed_lock(key = "scheduler:{region}", ttl = "10s", wait = "forever")]
pub async fn schedule(region: String) -> Result<u64, LockError> {
    drop(region);
    Ok(lock_core::current_lock()
        .and_then(|lock| lock.fencing_token())
        .unwrap_or(0))
}

/// The defaults a leader has anyway, written out, and `on_lost`.
#[distributed_lock(
    key = "relay",
    wait = "forever",
    fencing = true,
    renew = true,
    mode = "exclusive",
    on_lost = "continue"
)]
async fn relay() -> Result<(), LockError> {
    Ok(())
}

pub struct Shard {
    pub id: u32,
    pub locks: LockClient,
}

impl Shard {
    #[distributed_lock(key = "shard:{self.id}:leader", wait = "forever", client = self.locks)]
    pub async fn lead(&self) -> Result<u32, LockError> {
        Ok(self.id)
    }
}

fn assert_send<T: Send>(_: T) {}

fn main() {
    assert_send(schedule("eu".to_owned()));
    assert_send(relay());
    let shard = Shard {
        id: 4,
        locks: LockClient::in_memory(),
    };
    assert_send(shard.lead());
}
