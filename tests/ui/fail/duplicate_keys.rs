use lock_core::{LockError, distributed_lock};

#[distributed_lock(keys = ["account:{from}", "account:{to}", "account:{from}"])]
async fn transfer(from: u64, to: u64) -> Result<(), LockError> {
    let _ = (from, to);
    Ok(())
}

fn main() {}
