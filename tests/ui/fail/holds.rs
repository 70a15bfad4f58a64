use lock_core::{LockError, distributed_lock};

#[distributed_lock(key = "a", ttl = "30s", max_hold = "10s")]
async fn max_hold_below_ttl() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "b", ttl = "1s", min_hold = "2m", max_hold = "1m")]
async fn min_hold_above_max_hold() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "c", min_hold = "0s", max_hold = "25h")]
async fn holds_out_of_range() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
