use lock_core::{LockError, distributed_lock};

#[distributed_lock(key = "order:{order_id")]
async fn unclosed(order_id: u64) -> Result<(), LockError> {
    let _ = order_id;
    Ok(())
}

#[distributed_lock(key = "order:order_id}")]
async fn unmatched(order_id: u64) -> Result<(), LockError> {
    let _ = order_id;
    Ok(())
}

fn main() {}
