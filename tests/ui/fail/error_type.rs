use lock_core::{LockClient, distributed_lock};

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

pub struct Service {
    pub locks: LockClient,
}

impl Service {
    /// A method with its own client, several keys, `?` in the body: still
    /// one error, on the error type.
    #[distributed_lock(keys = ["c:{id}", "d:{id}"], client = self.locks)]
    async fn method(&self, id: u32) -> std::result::Result<(), MyError> {
        let step: Result<(), MyError> = Ok(());
        step?;
        let _ = id;
        Ok(())
    }
}

/// The error type behind an alias: reported on the return type.
type StoreResult<T> = Result<T, StoreError>;

#[distributed_lock(key = "e")]
async fn aliased() -> StoreResult<()> {
    Ok(())
}

fn main() {}
