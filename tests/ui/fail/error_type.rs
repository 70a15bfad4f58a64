use lock_core::distributed_lock;

#[derive(Debug)]
pub struct MyError;

#[distributed_lock(key = "a")]
async fn own_error() -> Result<(), MyError> {
    Ok(())
}

/// Converts from another error, but not from `LockError`.
#[derive(Debug)]
pub enum StoreError {
    Io(std::io::Error),
}

impl From<std::io::Error> for StoreError {
    fn from(e: std::io::Error) -> Self {
        StoreError::Io(e)
    }
}

#[distributed_lock(key = "b")]
async fn other_conversion() -> Result<u32, StoreError> {
    Ok(1)
}

fn main() {}
