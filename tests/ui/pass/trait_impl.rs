//! `async fn` in trait impls (Rust 1.75+): the attribute goes on the method
//! in the `impl` block.
#![deny(warnings)]
#![allow(async_fn_in_trait)]

use lock_core::{LockClient, LockError, distributed_lock};

pub trait Job {
    async fn run(&self, shard: u32) -> Result<u32, LockError>;
    async fn default_method(&self) -> Result<(), LockError> {
        Ok(())
    }
}

pub struct Cleanup {
    pub locks: LockClient,
}

impl Job for Cleanup {
    #[distributed_lock(key = "cleanup:{shard}", client = self.locks, wait = "0s")]
    async fn run(&self, shard: u32) -> Result<u32, LockError> {
        Ok(shard)
    }

    #[distributed_lock(key = "cleanup:default", client = self.locks)]
    async fn default_method(&self) -> Result<(), LockError> {
        Ok(())
    }
}

pub trait WithDefault {
    fn id(&self) -> u32;

    #[distributed_lock(key = "default:{n}")]
    async fn locked_default(&self, n: u32) -> Result<u32, LockError> {
        Ok(self.id() + n)
    }
}

fn main() {}
