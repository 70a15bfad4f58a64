use lock_core::{LockError, distributed_lock};

#[distributed_lock(key = "job")]
pub struct Job;

pub trait Service {
    #[distributed_lock(key = "job")]
    async fn run(&self) -> Result<(), LockError>;
}

fn main() {
    let _ = Job;
}
