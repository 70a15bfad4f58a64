use lock_core::{LockError, distributed_lock};

#[distributed_lock(key = "a", ttl = "30")]
async fn no_unit() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "b", ttl = "30sec")]
async fn unknown_unit() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "c", ttl = "1.5s")]
async fn fraction() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "d", wait = "30s1m")]
async fn out_of_order() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "e", wait = "")]
async fn empty() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "f", ttl = 30)]
async fn not_a_string() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
