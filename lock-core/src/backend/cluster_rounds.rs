//! A Redis Cluster's renewal rounds: the leases of one key each, grouped by
//! the primary of their slot, go out as pipelines of one `RENEW_MANY` call
//! per slot (a script's keys must share a slot). One pipeline carries up
//! to [`BATCH`] leases, so a round costs the client a call per primary and
//! pipeline rather than a call per lease, as on one server; the servers
//! still run a script per slot, which is why a cluster renews more leases
//! when it has more primaries.
//!
//! Sent through each primary's own connection in the slot map (asked for
//! again when it went stale), they follow no redirection: a lease whose
//! slot has no primary there, or whose call answered an error (a slot that
//! moved, `TRYAGAIN` in a migration, a script flushed), is left for the
//! caller to renew on its own through the cluster's routing, which follows
//! them, and so is every lease of a pipeline that failed as a whole (its
//! primary down, or not answering within the round's time).

use super::cluster::{ClusterNode, slot_of};
use super::commands::{RENEW_WINDOW, ttl_millis};
use super::{BATCH, Node, RenewOutcome, Renewable, Server};
use crate::error::LockError;
use crate::scripts::{self, Eval};
use futures::StreamExt;
use redis::aio::ConnectionLike;
use redis::{Pipeline, Value};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// The leases of one pipeline: per slot, the indices into the round.
type Groups = Vec<Vec<usize>>;

/// A primary's leases in a round, by slot.
type BySlot = BTreeMap<u16, Vec<usize>>;

/// Renews `due` through the primaries of the slot map known now, within
/// `limit`. One answer per lease, in order; `None` for those the caller
/// renews one by one (see the module).
pub(crate) async fn renew_by_primary<R: Renewable>(
    cluster: &ClusterNode,
    due: &[R],
    limit: Duration,
) -> Vec<Option<RenewOutcome>> {
    let mut answers: Vec<Option<RenewOutcome>> = due.iter().map(|_| None).collect();
    let started = Instant::now();
    // A map gone stale (a call that timed out marks it so) is asked for
    // again here, once for the round, rather than by each lease's call.
    let Some(map) = cluster.slot_map(limit / 2).await else {
        return answers;
    };
    let mut by_primary: Vec<(Arc<Node>, BySlot)> = Vec::new();
    for (i, lease) in due.iter().enumerate() {
        let slot = slot_of(lease.storage_key().as_bytes());
        let Some(primary) = map.primary(slot) else {
            continue;
        };
        let at = match by_primary.iter().position(|(p, _)| Arc::ptr_eq(p, primary)) {
            Some(at) => at,
            None => {
                by_primary.push((primary.clone(), BTreeMap::new()));
                by_primary.len() - 1
            }
        };
        by_primary[at].1.entry(slot).or_default().push(i);
    }
    let primaries = by_primary.len().max(1);
    let calls: Vec<(Arc<Node>, Groups)> = by_primary
        .into_iter()
        .flat_map(|(primary, slots)| {
            pipelines(slots)
                .into_iter()
                .map(move |groups| (primary.clone(), groups))
        })
        .collect();
    let until = started + limit;
    let sent: Vec<_> =
        futures::stream::iter(calls.into_iter().map(|(primary, groups)| async move {
            let left = until.saturating_duration_since(Instant::now());
            let replies = renew_on(&primary, due, &groups, left).await;
            (groups, replies)
        }))
        .buffer_unordered(RENEW_WINDOW * primaries)
        .collect()
        .await;
    for (groups, replies) in sent {
        // A pipeline that failed as a whole (its primary unreachable, or
        // not answering in time) leaves its leases to the caller too: the
        // cluster's routing follows a failover, and with the round's time
        // spent they fail there at once.
        if let Ok(replies) = replies {
            hear(&groups, replies, &mut answers);
        }
    }
    answers
}

/// The slots of one primary cut into pipelines of at most [`BATCH`]
/// leases (a slot with more takes several script calls).
fn pipelines(slots: BySlot) -> Vec<Groups> {
    let mut pipelines = Vec::new();
    let (mut groups, mut size): (Groups, usize) = (Vec::new(), 0);
    for leases in slots.into_values() {
        for part in leases.chunks(BATCH) {
            if size + part.len() > BATCH && !groups.is_empty() {
                pipelines.push(std::mem::take(&mut groups));
                size = 0;
            }
            size += part.len();
            groups.push(part.to_vec());
        }
    }
    if !groups.is_empty() {
        pipelines.push(groups);
    }
    pipelines
}

/// One pipeline: a `RENEW_MANY` per group, on `primary`'s connection.
async fn renew_on<R: Renewable>(
    primary: &Node,
    due: &[R],
    groups: &Groups,
    limit: Duration,
) -> Result<Vec<Value>, LockError> {
    let mut pipe = Pipeline::with_capacity(groups.len());
    for group in groups {
        let mut inv = Eval::new(&scripts::RENEW_MANY, group.len());
        for &i in group {
            inv.key(due[i].storage_key());
        }
        for &i in group {
            inv.arg(due[i].token()).arg(ttl_millis(due[i].ttl()));
        }
        pipe.add_command(inv.cmd().clone());
    }
    let pipe = &pipe;
    primary
        .call(limit, true, move |mut conn| async move {
            conn.req_packed_commands(pipe, 0, groups.len()).await
        })
        .await
}

/// Each group's answer: one number per lease, 1 renewed and 0 not ours;
/// anything else leaves the group's leases to the caller.
fn hear(groups: &Groups, replies: Vec<Value>, answers: &mut [Option<RenewOutcome>]) {
    for (group, reply) in groups.iter().zip(replies) {
        let Value::Array(each) = reply else {
            continue;
        };
        if each.len() != group.len() {
            continue;
        }
        for (&i, answer) in group.iter().zip(each) {
            answers[i] = match answer {
                Value::Int(1) => Some(RenewOutcome::Renewed),
                Value::Int(0) => Some(RenewOutcome::NotOurs),
                _ => None,
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pipelines_hold_whole_slots_up_to_a_batch() {
        let slots = BTreeMap::from([
            (1, (0..200).collect::<Vec<_>>()),
            (2, (200..300).collect()),
            (3, (300..900).collect()),
        ]);
        let cut = pipelines(slots);
        let sizes: Vec<Vec<usize>> = cut
            .iter()
            .map(|groups| groups.iter().map(Vec::len).collect())
            .collect();
        assert_eq!(
            sizes,
            vec![vec![200], vec![100], vec![256], vec![256], vec![88]]
        );
        let all: Vec<usize> = cut.into_iter().flatten().flatten().collect();
        assert_eq!(all, (0..900).collect::<Vec<_>>());
    }
}
