//! The renewal task that keeps a held lease alive.

use crate::client::ClientInner;
use crate::guard::Lease;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::task::AbortHandle;
use tokio::time::Instant;

/// Counts a running heartbeat for as long as its task exists, including when
/// it is aborted or its runtime shuts down.
struct Running(Arc<ClientInner>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.heartbeats.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Starts renewing `lease` every ttl/3 on the current runtime. The guard
/// aborts the task when it is released or dropped, so renewal never outlives
/// its owner.
pub(crate) fn spawn(client: Arc<ClientInner>, lease: Arc<Lease>) -> AbortHandle {
    client.heartbeats.fetch_add(1, Ordering::AcqRel);
    let running = Running(client);
    tokio::spawn(async move {
        let running = running;
        renew_until_lost(&running.0, &lease).await;
    })
    .abort_handle()
}

/// Renews until the lease is lost (then marks it lost and returns).
///
/// - A renewal that answers "not ours" means the lock is lost now.
/// - A renewal that fails (timeout, connection) is retried quickly until
///   the validity deadline; past it the lock is lost whatever Redis says
///   later, and the task never re-acquires behind the owner's back.
async fn renew_until_lost(client: &ClientInner, lease: &Lease) {
    let mut last_sent = Instant::now();
    loop {
        tokio::time::sleep_until(last_sent + lease.ttl() / 3).await;
        loop {
            let _one = lease.renewing.lock().await;
            let ttl = lease.ttl();
            let sent = Instant::now();
            let valid_until = lease.valid_until();
            if sent >= valid_until {
                lease.mark_lost();
                return;
            }
            // Never wait on Redis past the moment we stop trusting the lease.
            let limit = client.op_timeout.min(valid_until - sent);
            match client
                .backend
                .renew(&lease.storage_key, &lease.token, ttl, limit)
                .await
            {
                Ok(true) => {
                    lease.renewed(sent, ttl);
                    last_sent = sent;
                    break;
                }
                Ok(false) => {
                    lease.mark_lost();
                    return;
                }
                Err(_) => {
                    drop(_one);
                    let gap = retry_gap(ttl).min(
                        lease
                            .valid_until()
                            .saturating_duration_since(Instant::now()),
                    );
                    tokio::time::sleep(gap).await;
                }
            }
        }
    }
}

/// How soon a failed renewal is tried again: often enough to get several
/// tries into the remaining two thirds of the lease.
fn retry_gap(ttl: Duration) -> Duration {
    (ttl / 20).clamp(Duration::from_millis(5), Duration::from_millis(500))
}
