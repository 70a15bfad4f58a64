//! The bench's error type: any error, boxed, so `?` works on everything.

use std::error::Error;

/// Any failure of the bench: a server that would not start, a connection that
/// failed, a worker process that misbehaved, a file that could not be written.
pub type BenchError = Box<dyn Error + Send + Sync + 'static>;

/// A result whose error is a [`BenchError`].
pub type BenchResult<T> = Result<T, BenchError>;

/// `error` and each of its sources, joined by `": "`: what a lock-core
/// error's own text leaves to its source (the Redis error) included.
pub fn whole(error: &(dyn Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// An error made of a message only.
pub fn fail(message: impl Into<String>) -> BenchError {
    message.into().into()
}
