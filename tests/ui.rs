//! Compile-time behaviour of `#[distributed_lock]`: what must compile
//! (`ui/pass`, also run) and every error a user may see, with its message and
//! span pinned in a checked-in `.stderr` (`ui/fail`).
//!
//! Regenerate the `.stderr` files after a deliberate change with
//! `TRYBUILD=overwrite cargo test --test ui`, then read every diff.
#![allow(clippy::unwrap_used)]

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

/// trybuild builds without incremental compilation, as CI does; a user's
/// `cargo build` is incremental, where rustc once reported a missing
/// `From<LockError>` twice (the second time a bare "trait bound not
/// satisfied"). This builds `ui/fail/error_type.rs` as a user would and
/// counts the errors: one per function.
#[test]
fn a_missing_error_conversion_is_one_error_in_an_incremental_build() {
    use std::process::Command;

    let root = env!("CARGO_MANIFEST_DIR");
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("incremental-error-type");
    std::fs::create_dir_all(dir.join("src")).unwrap();
    let manifest = format!(
        "[package]\nname = \"incremental-error-type\"\nversion = \"0.0.0\"\nedition = \"2024\"\n\
         publish = false\n\n[dependencies]\nlock-core = {{ path = {:?} }}\n\n[workspace]\n",
        format!("{root}/lock-core")
    );
    std::fs::write(dir.join("Cargo.toml"), manifest).unwrap();
    std::fs::copy(format!("{root}/Cargo.lock"), dir.join("Cargo.lock")).unwrap();
    std::fs::copy(
        format!("{root}/tests/ui/fail/error_type.rs"),
        dir.join("src/main.rs"),
    )
    .unwrap();
    let out = Command::new(env!("CARGO"))
        .args(["check", "--offline", "--quiet", "--message-format=short"])
        .current_dir(&dir)
        .env("CARGO_INCREMENTAL", "1")
        .env("CARGO_TARGET_DIR", dir.join("target"))
        .env_remove("RUSTFLAGS")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|line| line.contains(": error"))
        .collect();
    assert!(!out.status.success(), "{stderr}");
    assert_eq!(errors.len(), 4, "one error per function:\n{stderr}");
    assert!(
        errors
            .iter()
            .all(|e| e.contains("needs an error type that converts")),
        "{stderr}"
    );
}
