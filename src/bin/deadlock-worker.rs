//! A worker process of tests/deadlock_processes.rs: one replica of a
//! service that holds one key in an annotated body and, when told, asks
//! for another in a nested annotated call.
//!
//! ```text
//! deadlock-worker NAME FIRST SECOND TTL_MS WAIT_MS single|redlock|cluster URL...
//! ```
//!
//! It prints one line per step on stdout: `holding FIRST` once it holds the
//! first key; then, after reading a line on stdin, `waiting SECOND`; and at
//! the end `ok` or `err KIND MESSAGE`.

use lock_core::{LockClient, LockError, distributed_lock};
use std::io::Write;
use std::time::Duration;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

#[distributed_lock(key = "{first}", client = client)]
async fn hold_then_take(client: &LockClient, first: &str, second: &str) -> Result<(), LockError> {
    say(&format!("holding {first}"));
    // The go-ahead: a line on stdin, read on a thread of its own.
    let _ = tokio::task::spawn_blocking(|| {
        let mut line = String::new();
        std::io::stdin().read_line(&mut line)
    })
    .await;
    say(&format!("waiting {second}"));
    take(client, second).await
}

#[distributed_lock(key = "{key}", client = client)]
async fn take(client: &LockClient, key: &str) -> Result<(), LockError> {
    Ok(())
}

fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [name, first, second, ttl_ms, wait_ms, mode, urls @ ..] = &args[..] else {
        return Err("usage: deadlock-worker NAME FIRST SECOND TTL_MS WAIT_MS MODE URL...".into());
    };
    let ttl = Duration::from_millis(ttl_ms.parse()?);
    let wait = Duration::from_millis(wait_ms.parse()?);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let builder = LockClient::builder()
            .key_prefix("deadlock:")
            .holder_name(name.as_str())
            .default_ttl(ttl)
            .default_wait(wait)
            .node_timeout(Duration::from_millis(200));
        let builder = match mode.as_str() {
            "single" => builder.url(urls[0].as_str()),
            "redlock" => builder.urls(urls.iter().map(String::as_str)),
            "cluster" => builder.cluster(urls.iter().map(String::as_str)),
            other => return Err(format!("unknown mode {other}").into()),
        };
        let client = builder.build().await?;
        match hold_then_take(&client, first, second).await {
            Ok(()) => say("ok"),
            Err(e) => say(&format!("err {:?} {e}", e.kind())),
        }
        Ok(())
    })
}
