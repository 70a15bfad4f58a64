use lock_core::{LockError, distributed_lock};

#[distributed_lock(key = "a", ttl = "0s")]
async fn zero_ttl() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "b", ttl = "5ms")]
async fn ttl_too_short() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "c", ttl = "25h")]
async fn ttl_too_long() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "d", wait = "24h1ms")]
async fn wait_too_long() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
