use lock_core::{LockError, distributed_lock};

#[distributed_lock(key = "a", on_lost = "stop")]
async fn on_lost_unknown() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "b", on_lost = "abrot")]
async fn on_lost_typo() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "c", on_lost = continue)]
async fn on_lost_unquoted() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "d", renew = "false", fencing = 1)]
async fn not_bools() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = format!("job:{}", 1))]
async fn key_not_a_literal() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "e", client = "self.locks")]
async fn client_as_string() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "f", crate = lock_core)]
async fn crate_unquoted() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "g", crate = "not a path")]
async fn crate_not_a_path() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
