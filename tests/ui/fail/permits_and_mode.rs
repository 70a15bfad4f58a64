use lock_core::{LockError, distributed_lock};

#[distributed_lock(key = "pool", mode = "shared", permits = 3)]
async fn shared_with_permits() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "pool", permits = 3, mode = "exclusive")]
async fn exclusive_with_permits() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
