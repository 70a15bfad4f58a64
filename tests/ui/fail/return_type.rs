use lock_core::{LockError, distributed_lock};

#[distributed_lock(key = "a")]
async fn nothing() {}

#[distributed_lock(key = "b")]
async fn not_a_result() -> u32 {
    1
}

#[distributed_lock(key = "c")]
async fn option() -> Option<u32> {
    Some(1)
}

fn main() {
    let _ = (nothing(), not_a_result(), option());
    let _: Result<(), LockError> = Ok(());
}
