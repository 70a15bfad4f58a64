use lock_core::{LockError, distributed_lock};

pub struct Svc {
    pub n: u64,
}

pub struct Order {
    pub id: u64,
}

impl Svc {
    #[distributed_lock(key = "order:{self.m}:{id}", ttl = "10s")]
    async fn place(&mut self, id: u64) -> Result<(), LockError> {
        let _ = id;
        Ok(())
    }
}

#[distributed_lock(key = "order:{order.idd}")]
async fn ship(order: Order) -> Result<(), LockError> {
    let _ = order;
    Ok(())
}

fn main() {}
