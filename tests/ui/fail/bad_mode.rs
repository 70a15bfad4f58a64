use lock_core::{LockError, distributed_lock};

#[distributed_lock(key = "a", mode = "exlusive")]
async fn typo() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "b", mode = "read")]
async fn reader_writer_word() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "c", mode = "fair")]
async fn unrelated() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "d", mode = shared)]
async fn without_quotes() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
