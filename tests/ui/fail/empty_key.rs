use lock_core::{LockError, distributed_lock};

#[distributed_lock(key = "")]
async fn empty() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
