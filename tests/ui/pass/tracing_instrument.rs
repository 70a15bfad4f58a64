//! `#[tracing::instrument]` above or below the attribute.
#![deny(warnings)]

use lock_core::{LockError, distributed_lock};

#[tracing::instrument]
#[distributed_lock(key = "traced:{id}")]
pub async fn instrument_above(id: u64) -> Result<u64, LockError> {
    tracing::info!("holding the lock");
    Ok(id)
}

#[distributed_lock(key = "traced:{id}")]
#[tracing::instrument(err)]
pub async fn instrument_below(id: u64) -> Result<u64, LockError> {
    tracing::info!("holding the lock");
    Ok(id)
}

pub struct Service {
    pub id: u64,
}

impl Service {
    #[tracing::instrument(skip(self), fields(id = self.id))]
    #[distributed_lock(key = "service:{self.id}")]
    pub async fn method(&self, n: u32) -> Result<u32, LockError> {
        Ok(n)
    }
}

fn assert_send<T: Send>(_: T) {}

fn main() {
    assert_send(instrument_above(1));
    assert_send(instrument_below(1));
}
