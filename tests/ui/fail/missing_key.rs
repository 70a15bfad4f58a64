use lock_core::{LockError, distributed_lock};

#[distributed_lock(ttl = "30s")]
async fn no_key() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock]
async fn no_arguments() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock("job")]
async fn positional_key() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key)]
async fn key_without_value() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
