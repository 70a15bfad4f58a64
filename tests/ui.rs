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
