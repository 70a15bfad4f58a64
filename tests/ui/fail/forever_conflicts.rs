use lock_core::{LockError, distributed_lock};

#[distributed_lock(key = "a", wait = "forever", mode = "shared")]
async fn shared() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "b", wait = "forever", permits = 2)]
async fn permits() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(keys = ["c:{x}", "c:{y}"], wait = "forever")]
async fn several(x: u32, y: u32) -> Result<(), LockError> {
    let _ = (x, y);
    Ok(())
}

#[distributed_lock(key = "d", wait = "forever", fencing = false)]
async fn unfenced() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "e", wait = "forever", renew = false)]
async fn unrenewed() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "f", wait = "forever", min_hold = "5s", max_hold = "1m")]
async fn holds() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
