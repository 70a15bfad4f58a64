use lock_core::{LockError, distributed_lock};

#[distributed_lock(key = "job", tll = "30s")]
async fn typo() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "job", timeout = "5s")]
async fn alias() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "job", retries = 3)]
async fn unrelated() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "job", shared = true)]
async fn kind_as_its_own_argument() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
