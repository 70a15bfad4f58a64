//! `crate = ".."` for a renamed dependency: the generated code reaches
//! lock-core only through the given path.
#![deny(warnings)]

extern crate lock_core as locks_renamed;

#[locks_renamed::distributed_lock(
    key = "renamed:{id}",
    crate = "::locks_renamed",
    ttl = "5s",
    on_lost = "continue"
)]
pub async fn absolute(id: u32) -> Result<u32, locks_renamed::LockError> {
    Ok(id)
}

#[locks_renamed::distributed_lock(key = "renamed", crate = "locks_renamed")]
pub async fn relative() -> Result<(), locks_renamed::LockError> {
    Ok(())
}

mod facade {
    //! A crate that re-exports lock-core, used through its own path.
    pub use lock_core::*;
}

#[facade::distributed_lock(key = "facade", crate = "crate::facade")]
pub async fn through_a_module() -> Result<(), facade::LockError> {
    Ok(())
}

fn main() {}
