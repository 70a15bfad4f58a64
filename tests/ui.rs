//! Compile-time behaviour of `#[distributed_lock]`: what must compile
//! (`ui/pass`, also run) and every error a user may see, with its message and
//! span pinned in a checked-in `.stderr` (`ui/fail`).
//!
//! Regenerate the `.stderr` files after a deliberate change with
//! `TRYBUILD=overwrite cargo test --test ui`, then read every diff.

#[test]
fn ui() {
    let cases = trybuild::TestCases::new();
    cases.pass("tests/ui/pass/*.rs");
    cases.compile_fail("tests/ui/fail/*.rs");
}

/// The attribute checks ttl and wait ranges at compile time with copies of
/// lock-core's limits (a proc-macro crate cannot depend on lock-core); this
/// fails when a copy drifts from the original.
#[test]
fn the_attribute_checks_lock_cores_limits() {
    #[path = "../lock-macros/src/limits.rs"]
    mod copied;

    assert_eq!(
        copied::MIN_TTL,
        lock_core::MIN_TTL,
        "update MIN_TTL in lock-macros/src/limits.rs to lock-core's"
    );
    assert_eq!(
        copied::MAX_DURATION,
        lock_core::MAX_DURATION,
        "update MAX_DURATION in lock-macros/src/limits.rs to lock-core's"
    );
}
