//! Examples and integration tests for lock-core.
