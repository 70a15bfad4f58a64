use lock_core::{LockError, distributed_lock};

pub struct Service {
    pub locks: Option<lock_core::LockClient>,
}

impl Service {
    #[distributed_lock(key = "job", client = self.locks)]
    async fn run(&self) -> Result<(), LockError> {
        Ok(())
    }
}

fn main() {}
