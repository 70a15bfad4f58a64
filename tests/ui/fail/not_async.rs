use lock_core::{LockError, distributed_lock};

#[distributed_lock(key = "job")]
fn blocking() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "job")]
const fn constant() -> Result<(), LockError> {
    Ok(())
}

fn main() {
    // The functions are still emitted: callers type-check.
    let _: Result<(), LockError> = blocking();
    let _: Result<(), LockError> = constant();
}
