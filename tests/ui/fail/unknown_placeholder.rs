use lock_core::{LockError, distributed_lock};

#[distributed_lock(key = "order:{ordr_id}")]
async fn typo(order_id: u64, amount: u64) -> Result<(), LockError> {
    let _ = (order_id, amount);
    Ok(())
}

#[distributed_lock(key = "order:{id}")]
async fn no_parameters() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "tenant:{self.id}")]
async fn no_receiver(tenant_id: u32) -> Result<(), LockError> {
    let _ = tenant_id;
    Ok(())
}

fn main() {}
