//! Methods: `&self`, `&mut self`, `self`, `self: Arc<Self>`, `{self.field}`
//! in the key, and `client = ..` reading from `self` while the body uses it.
#![deny(warnings)]

use lock_core::{LockClient, LockError, distributed_lock};
use std::sync::{Arc, LazyLock};

static LOCKS: LazyLock<LockClient> = LazyLock::new(|| unimplemented!());

pub struct Tenant {
    pub id: u32,
    pub name: String,
    pub locks: LockClient,
    pub shared: Arc<LockClient>,
    pub reindexed: u32,
}

impl Tenant {
    #[distributed_lock(key = "tenant:{self.id}", client = self.locks)]
    pub async fn by_ref(&self) -> Result<&str, LockError> {
        Ok(&self.name)
    }

    #[distributed_lock(key = "tenant:{self.id}:reindex", client = self.shared)]
    pub async fn by_mut(&mut self, by: u32) -> Result<u32, LockError> {
        self.reindexed += by;
        Ok(self.reindexed)
    }

    /// The body moves `self`; the key and client were read before.
    #[distributed_lock(key = "tenant:{self.id}:close", client = self.locks)]
    pub async fn by_value(self) -> Result<String, LockError> {
        Ok(self.name)
    }

    #[distributed_lock(key = "tenant:{self.name}:arc", client = self.locks)]
    pub async fn by_arc(self: Arc<Self>, extra: u8) -> Result<u32, LockError> {
        let this = self;
        Ok(this.id + u32::from(extra))
    }

    #[distributed_lock(key = "tenant:{self}")]
    pub async fn self_as_key(&self) -> Result<(), LockError> {
        Ok(())
    }

    #[distributed_lock(key = "static:{id}", client = &*LOCKS)]
    pub async fn static_client(id: u32) -> Result<u32, LockError> {
        Ok(id)
    }

    #[distributed_lock(key = "param:{id}", client = client)]
    pub async fn client_parameter(client: &LockClient, id: u32) -> Result<u32, LockError> {
        let _ = client.key_prefix();
        Ok(id)
    }

    #[distributed_lock(key = "owned:{id}", client = client)]
    pub async fn owned_client_parameter(
        client: Arc<LockClient>,
        id: u32,
    ) -> Result<Arc<LockClient>, LockError> {
        Ok(client)
    }

    #[distributed_lock(key = "boxed", client = Box::new(make_client()))]
    pub async fn temporary_client() -> Result<(), LockError> {
        Ok(())
    }
}

/// A private field in the key, from a method of the same module.
mod private_fields {
    use lock_core::{LockError, distributed_lock};

    pub struct Job {
        id: u64,
        shard: (u8, u8),
    }

    impl Job {
        #[distributed_lock(key = "job:{self.id}:{self.shard.1}")]
        pub async fn run(&self) -> Result<u64, LockError> {
            Ok(self.id + u64::from(self.shard.0))
        }
    }
}

fn make_client() -> LockClient {
    unimplemented!()
}

impl std::fmt::Display for Tenant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name)
    }
}

fn assert_send<T: Send>(_: &T) {}

fn main() {
    fn _futures_are_send(mut tenant: Tenant, client: &LockClient, arc: Arc<LockClient>) {
        assert_send(&tenant.by_ref());
        assert_send(&tenant.by_mut(1));
        assert_send(&Tenant::static_client(1));
        assert_send(&Tenant::client_parameter(client, 1));
        assert_send(&Tenant::owned_client_parameter(arc, 1));
        assert_send(&Tenant::temporary_client());
        assert_send(&tenant.self_as_key());
        let _ = private_fields::Job::run;
        let arc = Arc::new(tenant);
        assert_send(&arc.clone().by_arc(1));
    }
}
