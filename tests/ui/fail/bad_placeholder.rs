use lock_core::{LockError, distributed_lock};

#[distributed_lock(key = "order:{}")]
async fn empty_placeholder(order_id: u64) -> Result<(), LockError> {
    let _ = order_id;
    Ok(())
}

#[distributed_lock(key = "order:{0}")]
async fn positional(order_id: u64) -> Result<(), LockError> {
    let _ = order_id;
    Ok(())
}

#[distributed_lock(key = "order:{order_id:?}")]
async fn format_spec(order_id: u64) -> Result<(), LockError> {
    let _ = order_id;
    Ok(())
}

#[distributed_lock(key = "order:{order id}")]
async fn malformed(order_id: u64) -> Result<(), LockError> {
    let _ = order_id;
    Ok(())
}

fn main() {}
