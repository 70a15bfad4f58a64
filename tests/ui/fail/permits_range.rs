use lock_core::{LockError, distributed_lock};

#[distributed_lock(key = "a", permits = 0)]
async fn zero() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "b", permits = -2)]
async fn negative() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "c", permits = 2.5)]
async fn fraction() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "d", permits = 4294967296)]
async fn too_large() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "e", permits = "3")]
async fn string() -> Result<(), LockError> {
    Ok(())
}

const POOL: u32 = 3;

#[distributed_lock(key = "f", permits = POOL)]
async fn not_a_literal() -> Result<(), LockError> {
    Ok(())
}

fn main() {
    let _ = POOL;
}
