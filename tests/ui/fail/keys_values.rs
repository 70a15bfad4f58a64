use lock_core::{LockError, distributed_lock};

#[distributed_lock(keys = "account:{from}")]
async fn not_a_list(from: u64) -> Result<(), LockError> {
    let _ = from;
    Ok(())
}

#[distributed_lock(keys = ["account:{from}", to])]
async fn not_a_literal(from: u64, to: u64) -> Result<(), LockError> {
    let _ = (from, to);
    Ok(())
}

#[distributed_lock(keys = ["account:{from}", "account:{to"])]
async fn unbalanced(from: u64, to: u64) -> Result<(), LockError> {
    let _ = (from, to);
    Ok(())
}

#[distributed_lock(["account:{from}", "account:{to}"])]
async fn positional(from: u64, to: u64) -> Result<(), LockError> {
    let _ = (from, to);
    Ok(())
}

fn main() {}
