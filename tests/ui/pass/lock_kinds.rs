//! `keys`, `mode` and `permits`: with the other arguments, on free
//! functions and methods.
#![deny(warnings)]

use lock_core::{LockClient, LockError, distributed_lock};

pub struct Account {
    pub id: u64,
}

/// Several keys, rendered from parameters and fields; the body may move
/// them.
#[distributed_lock(keys = ["account:{from.id}", "account:{to.id}"], ttl = "30s", fencing = true)]
pub async fn transfer(from: Account, to: Account, amount: u64) -> Result<u64, LockError> {
    drop((from, to));
    Ok(amount)
}

/// One template in the list, the explicit default mode, and literal braces.
#[distributed_lock(keys = ["{{ledger}}:{day}"], mode = "exclusive", wait = "0s")]
async fn single_key_in_a_list(day: u32) -> Result<(), LockError> {
    let _ = day;
    Ok(())
}

#[distributed_lock(key = "catalog:{region}", mode = "shared")]
pub async fn read_catalog(region: &str) -> Result<usize, LockError> {
    Ok(region.len())
}

#[distributed_lock(key = "exports", permits = 3, ttl = "1m", on_lost = "continue")]
pub async fn export(batch: u32) -> Result<u32, LockError> {
    Ok(batch)
}

pub struct Warehouse {
    pub site: String,
    pub locks: LockClient,
}

impl Warehouse {
    #[distributed_lock(keys = ["bin:{self.site}:{a}", "bin:{self.site}:{b}"], client = self.locks)]
    pub async fn swap(&self, a: u32, b: u32) -> Result<(), LockError> {
        let _ = (a, b);
        Ok(())
    }

    #[distributed_lock(key = "dock:{dock}", permits = 1u32, client = &self.locks)]
    pub async fn unload(&mut self, dock: u8) -> Result<u8, LockError> {
        Ok(dock)
    }
}

fn assert_send<T: Send>(_: T) {}

fn main() {
    assert_send(transfer(Account { id: 1 }, Account { id: 2 }, 5));
    assert_send(single_key_in_a_list(1));
    assert_send(read_catalog("eu"));
    assert_send(export(1));
    let mut warehouse = Warehouse {
        site: "north".to_owned(),
        locks: LockClient::in_memory(),
    };
    assert_send(warehouse.swap(1, 2));
    assert_send(warehouse.unload(3));
}
