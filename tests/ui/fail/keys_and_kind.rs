use lock_core::{LockError, distributed_lock};

#[distributed_lock(keys = ["account:{from}", "account:{to}"], mode = "shared")]
async fn shared(from: u64, to: u64) -> Result<(), LockError> {
    let _ = (from, to);
    Ok(())
}

#[distributed_lock(keys = ["account:{from}", "account:{to}"], permits = 2)]
async fn permits(from: u64, to: u64) -> Result<(), LockError> {
    let _ = (from, to);
    Ok(())
}

#[distributed_lock(keys = ["account:{from}", "account:{to}"], mode = "shared", permits = 2)]
async fn both(from: u64, to: u64) -> Result<(), LockError> {
    let _ = (from, to);
    Ok(())
}

fn main() {}
