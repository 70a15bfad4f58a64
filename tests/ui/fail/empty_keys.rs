use lock_core::{LockError, distributed_lock};

#[distributed_lock(keys = [])]
async fn no_keys() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
