//! The error type of the kit.

use std::error::Error;
use std::fmt;

/// How many trailing lines of a server log an error message carries.
const LOG_TAIL_LINES: usize = 40;

/// A harness failure: a `redis-server` that could not be found, started,
/// reached or controlled, or a proxy that could not be set up.
///
/// The message says what was attempted; when a server was involved it ends
/// with the tail of that server's log, so a failing test shows why.
#[derive(Debug)]
pub struct TestkitError {
    message: String,
    source: Option<Box<dyn Error + Send + Sync + 'static>>,
    log_tail: Option<String>,
}

impl TestkitError {
    /// An error with only a message.
    pub(crate) fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            source: None,
            log_tail: None,
        }
    }

    /// An error caused by `source`.
    pub(crate) fn with_source(
        message: impl Into<String>,
        source: impl Into<Box<dyn Error + Send + Sync + 'static>>,
    ) -> Self {
        Self {
            source: Some(source.into()),
            ..Self::new(message)
        }
    }

    /// Attaches the last lines of a server log.
    pub(crate) fn with_log(mut self, log: &str) -> Self {
        let lines: Vec<&str> = log.lines().collect();
        let start = lines.len().saturating_sub(LOG_TAIL_LINES);
        self.log_tail = Some(lines[start..].join("\n"));
        self
    }

    /// What failed, without the cause or the log.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The tail of the server log attached to this error, if any.
    pub fn log_tail(&self) -> Option<&str> {
        self.log_tail.as_deref()
    }
}

impl fmt::Display for TestkitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)?;
        if let Some(source) = &self.source {
            write!(f, ": {source}")?;
        }
        if let Some(tail) = &self.log_tail {
            if tail.trim().is_empty() {
                f.write_str("\n--- redis-server log is empty ---")?;
            } else {
                write!(
                    f,
                    "\n--- redis-server log (tail) ---\n{tail}\n--- end of log ---"
                )?;
            }
        }
        Ok(())
    }
}

impl Error for TestkitError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.source
            .as_deref()
            .map(|source| source as &(dyn Error + 'static))
    }
}
