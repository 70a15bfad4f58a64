//! Locating the `redis-server` executable.

use std::env;
use std::path::{Path, PathBuf};

use crate::TestkitError;

/// The environment variable that names the `redis-server` binary to use.
pub const REDIS_SERVER_BIN_ENV: &str = "REDIS_SERVER_BIN";

/// The executable searched for on `PATH` when [`REDIS_SERVER_BIN_ENV`] is unset.
const DEFAULT_NAME: &str = "redis-server";

/// Finds the `redis-server` binary.
///
/// Uses the `REDIS_SERVER_BIN` environment variable when it is set and not
/// empty (a path, or a bare name looked up on `PATH`); otherwise looks for
/// `redis-server` on `PATH`.
///
/// # Errors
///
/// Returns an error naming what was tried when no executable is found.
pub fn redis_server_binary() -> Result<PathBuf, TestkitError> {
    match env::var_os(REDIS_SERVER_BIN_ENV) {
        Some(value) if !value.is_empty() => {
            let given = PathBuf::from(&value);
            if is_executable_file(&given) {
                return Ok(given);
            }
            if given.components().count() == 1
                && let Some(found) = search_path(&given)
            {
                return Ok(found);
            }
            Err(TestkitError::new(format!(
                "{REDIS_SERVER_BIN_ENV}={} does not name an executable file",
                given.display()
            )))
        }
        _ => search_path(Path::new(DEFAULT_NAME)).ok_or_else(|| {
            TestkitError::new(format!(
                "`{DEFAULT_NAME}` was not found on PATH; install Redis or set \
                 {REDIS_SERVER_BIN_ENV} to the path of a redis-server binary"
            ))
        }),
    }
}

/// Looks `name` up in the directories of `PATH`.
fn search_path(name: &Path) -> Option<PathBuf> {
    let path = env::var_os("PATH")?;
    env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable_file(candidate))
}

/// Whether `path` is a regular file that someone may execute.
fn is_executable_file(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;

    path.metadata()
        .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
}

/// The environment variable that names the `redis-cli` binary to use.
pub const REDIS_CLI_BIN_ENV: &str = "REDIS_CLI_BIN";

/// Finds the `redis-cli` binary (for `redis-cli --cluster create`).
///
/// Uses `REDIS_CLI_BIN` when it is set and not empty; otherwise a
/// `redis-cli` next to the `redis-server` in use, then one on `PATH`.
///
/// # Errors
///
/// Returns an error naming what was tried when no executable is found.
pub fn redis_cli_binary() -> Result<PathBuf, TestkitError> {
    if let Some(value) = env::var_os(REDIS_CLI_BIN_ENV).filter(|v| !v.is_empty()) {
        let given = PathBuf::from(&value);
        if is_executable_file(&given) {
            return Ok(given);
        }
        return search_path(&given).ok_or_else(|| {
            TestkitError::new(format!(
                "{REDIS_CLI_BIN_ENV}={} does not name an executable file",
                given.display()
            ))
        });
    }
    let beside = redis_server_binary()
        .ok()
        .and_then(|server| server.parent().map(|dir| dir.join("redis-cli")))
        .filter(|cli| is_executable_file(cli));
    beside
        .or_else(|| search_path(Path::new("redis-cli")))
        .ok_or_else(|| {
            TestkitError::new(format!(
                "`redis-cli` was not found next to redis-server or on PATH; install Redis or \
                 set {REDIS_CLI_BIN_ENV} to the path of a redis-cli binary"
            ))
        })
}
