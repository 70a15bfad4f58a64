use lock_core::{LockError, distributed_lock};

#[derive(Debug)]
pub enum AppError {
    Lock(LockError),
}

impl From<LockError> for AppError {
    fn from(e: LockError) -> Self {
        AppError::Lock(e)
    }
}

#[derive(Debug)]
pub struct ParseError;

// The body's own mistakes are reported where they are written: `?` on an
// error that does not convert, and a value of the wrong type.
#[distributed_lock(key = "job")]
async fn job(input: &str) -> Result<u32, AppError> {
    let n: u32 = input.parse().map_err(|_| ParseError)?;
    Ok(n.to_string())
}

fn main() {}
