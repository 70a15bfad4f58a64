use lock_core::{LockError, distributed_lock};

#[distributed_lock(key = "job", ttl = "30s", ttl = "1m")]
async fn twice() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
