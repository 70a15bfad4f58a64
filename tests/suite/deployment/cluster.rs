//! See `deployment/mod.rs`.
