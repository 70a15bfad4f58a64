use lock_core::{LockError, distributed_lock};

#[distributed_lock(key = "account:{from}", keys = ["account:{from}", "account:{to}"])]
async fn keys_after_key(from: u64, to: u64) -> Result<(), LockError> {
    let _ = (from, to);
    Ok(())
}

#[distributed_lock(keys = ["account:{from}", "account:{to}"], key = "account:{from}")]
async fn key_after_keys(from: u64, to: u64) -> Result<(), LockError> {
    let _ = (from, to);
    Ok(())
}

fn main() {}
