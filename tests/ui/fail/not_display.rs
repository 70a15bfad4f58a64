use lock_core::{LockError, distributed_lock};

#[derive(Debug)]
pub struct OrderId(u64);

#[distributed_lock(key = "order:{order_id}")]
async fn charge(order_id: OrderId) -> Result<(), LockError> {
    let _ = order_id;
    Ok(())
}

fn main() {}
