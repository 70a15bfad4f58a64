//! Several mistakes at once: every one is reported, and the function is
//! still emitted so the rest of the crate type-checks.
use lock_core::{LockError, distributed_lock};

#[distributed_lock(key = "order:{ordr_id}", ttl = "30x", wait = "0s", wiat = "1s", on_lost = "stop", ttl = "1m")]
fn charge(order_id: u64) -> Result<u64, LockError> {
    Ok(order_id)
}

fn main() {
    let _: Result<u64, LockError> = charge(1);
}
