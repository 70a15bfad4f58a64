use lock_core::{LockError, distributed_lock};

#[distributed_lock(key = "a", wait = "infinite")]
async fn a_word() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "b", wait = forever)]
async fn unquoted() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "c", leader = true)]
async fn leader_argument() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "d", election)]
async fn bare_word() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
