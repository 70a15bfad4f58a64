//! W11: deadlock detection. How long after two owners close a cycle of
//! waits the victim's acquisition fails with `WouldDeadlock`.
//!
//! Two owners in this process, each its own lock-core client with its own
//! holder name (two replicas of a service), on the single server. In each
//! round (`--w11-cycles`, after one unmeasured) each owner takes its own
//! key in an annotated body (`#[distributed_lock]`), waits at a barrier
//! until the other holds its key too, then asks for the other's key in a
//! nested annotated call: owner 1 holds `a` and asks for `b`, owner 2 holds
//! `b` and asks for `a`. Each round has keys of its own, so the wait
//! records of one round (removed in the background once its waits end)
//! never meet the next.
//!
//! The cycle closes when the later of the two asks starts (each owner
//! stamps the moment just before its nested call); the figure is from
//! then to the return of the victim's nested call with `WouldDeadlock`.
//! A round counts when exactly one nested call failed so and the other
//! owner's completed (it gets the key the victim's body gives back);
//! anything else is counted in `failed`.
//!
//! Only lock-core detects deadlocks, so the row is lock-core's alone: the
//! other libraries' owners would wait until their waits ran out.

use super::{Context, progress};
use crate::contenders::{Impl, LOCK_CORE_PREFIX, TTL};
use crate::error::{BenchResult, fail};
use crate::stats::{Spread, nanos};
use crate::table::{DEADLOCK_LABEL, Row, WorkloadId, WorkloadResult};
use crate::transport::Transport;
use lock_core::{ErrorKind, LockClient, LockError, distributed_lock};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Barrier;
use tokio::time::Instant;

/// How long an owner waits for a key: far longer than any detection, so
/// only a detected cycle ends a wait early.
const WAIT: Duration = Duration::from_secs(10);

/// The bound of one round, past both owners' waits.
const ROUND_BOUND: Duration = Duration::from_secs(30);

/// The owners' holder names.
const OWNERS: [&str; 2] = ["w11-owner-1", "w11-owner-2"];

/// Runs W11 on the single server.
pub async fn run(ctx: &Context) -> BenchResult<WorkloadResult> {
    progress(WorkloadId::W11, Impl::Attribute);
    let mut owners = Vec::with_capacity(OWNERS.len());
    for name in OWNERS {
        owners.push(owner(&ctx.url, name).await?);
    }
    let mut tally = Tally::default();
    for round in 0..=ctx.w11_cycles {
        let asks = cycle(&owners, round).await?;
        if round > 0 {
            tally.count(&asks);
        }
    }
    Ok(WorkloadResult {
        id: WorkloadId::W11,
        transport: Transport::Plain,
        title: "deadlock: two owners in a cycle, until the victim's WouldDeadlock",
        params: format!(
            "2 owners, each its own client and holder name, one server; each holds its own key \
             in an annotated body, waits at a barrier until the other holds its key, then asks \
             for the other's key in a nested annotated call (wait {} s); {} rounds after one \
             unmeasured, each on keys of its own; from the later of the two asks (the cycle \
             closing) to the return of the victim's call with WouldDeadlock; failed = rounds \
             without exactly one such victim and the other owner done; lock-core only (the \
             other libraries do not detect deadlocks); µs columns = detection time",
            WAIT.as_secs(),
            ctx.w11_cycles,
        ),
        rows: vec![tally.row()],
    })
}

/// An owner: a lock-core client with the bench's prefix and the holder
/// name `name`.
async fn owner(url: &str, name: &str) -> BenchResult<LockClient> {
    Ok(LockClient::builder()
        .url(url)
        .key_prefix(LOCK_CORE_PREFIX)
        .holder_name(name)
        .default_ttl(TTL)
        .default_wait(WAIT)
        .build()
        .await?)
}

/// What one owner's nested call did, and when.
#[derive(Debug)]
struct Ask {
    /// Just before the nested call.
    asked: Instant,
    /// When it returned.
    answered: Instant,
    /// How it ended.
    outcome: Outcome,
}

/// How a nested call ended.
#[derive(Debug, PartialEq)]
enum Outcome {
    /// It took the key and gave it back.
    Done,
    /// It failed with `WouldDeadlock`: the victim.
    Deadlock,
    /// Anything else, as text.
    Failed(String),
}

impl Outcome {
    fn of(result: Result<(), LockError>) -> Outcome {
        match result {
            Ok(()) => Outcome::Done,
            Err(e) if e.kind() == ErrorKind::WouldDeadlock => Outcome::Deadlock,
            Err(e) => Outcome::Failed(e.chain().to_string()),
        }
    }
}

/// Holds `first` (an annotated body), waits at `barrier` until the other
/// owner holds its own first key, then asks for `second` (a nested
/// annotated call): what that ask did.
#[distributed_lock(key = "{first}", client = client)]
async fn hold_then_take(
    client: &LockClient,
    first: &str,
    second: &str,
    barrier: &Barrier,
) -> Result<Ask, LockError> {
    barrier.wait().await;
    let asked = Instant::now();
    let result = take(client, second).await;
    Ok(Ask {
        asked,
        answered: Instant::now(),
        outcome: Outcome::of(result),
    })
}

/// Takes `key` and gives it back at once.
#[distributed_lock(key = "{key}", client = client)]
async fn take(client: &LockClient, key: &str) -> Result<(), LockError> {
    Ok(())
}

/// One round: the owners of `owners` (two) in a cycle on the keys of
/// `round`; what each one's ask did, in owner order.
async fn cycle(owners: &[LockClient], round: usize) -> BenchResult<Vec<Ask>> {
    let keys = [format!("w11:{round}:a"), format!("w11:{round}:b")];
    let barrier = Arc::new(Barrier::new(owners.len()));
    let mut tasks = Vec::with_capacity(owners.len());
    for (i, client) in owners.iter().enumerate() {
        let (client, barrier) = (client.clone(), barrier.clone());
        let first = keys[i % keys.len()].clone();
        let second = keys[(i + 1) % keys.len()].clone();
        tasks.push(tokio::spawn(async move {
            hold_then_take(&client, &first, &second, &barrier).await
        }));
    }
    let mut asks = Vec::with_capacity(tasks.len());
    for task in tasks {
        let joined = tokio::time::timeout(ROUND_BOUND, task)
            .await
            .map_err(|_| fail(format!("a W11 round took over {ROUND_BOUND:?}")))?;
        let ask = joined.map_err(|e| fail(format!("a W11 owner died: {e}")))??;
        asks.push(ask);
    }
    Ok(asks)
}

/// The detections of the row.
#[derive(Default)]
struct Tally {
    /// From the cycle closing to the victim's error, ns.
    detections: Vec<u64>,
    /// From the victim's error to the other owner's ask returning, ns.
    survivors: Vec<u64>,
    /// Rounds whose victim was the later asker (the one that closed the
    /// cycle).
    later_victims: u64,
    /// Rounds without exactly one victim and the other owner done.
    failed: u64,
    /// What the first such round's asks returned.
    first_error: Option<String>,
}

impl Tally {
    /// Counts one round's asks.
    fn count(&mut self, asks: &[Ask]) {
        let victims: Vec<&Ask> = asks
            .iter()
            .filter(|ask| ask.outcome == Outcome::Deadlock)
            .collect();
        let done = asks.iter().filter(|ask| ask.outcome == Outcome::Done);
        let done = done.count();
        let (Some(closed), [victim]) = (asks.iter().map(|ask| ask.asked).max(), &victims[..])
        else {
            return self.failure(asks);
        };
        if done + 1 != asks.len() {
            return self.failure(asks);
        }
        self.detections
            .push(nanos(victim.answered.saturating_duration_since(closed)));
        self.later_victims += u64::from(victim.asked == closed);
        for survivor in asks.iter().filter(|ask| ask.outcome == Outcome::Done) {
            let lag = survivor.answered.saturating_duration_since(victim.answered);
            self.survivors.push(nanos(lag));
        }
    }

    /// Counts a round that did not end with one victim.
    fn failure(&mut self, asks: &[Ask]) {
        self.failed += 1;
        if self.first_error.is_none() {
            let outcomes: Vec<String> = asks
                .iter()
                .map(|ask| match &ask.outcome {
                    Outcome::Done => "done".to_owned(),
                    Outcome::Deadlock => "WouldDeadlock".to_owned(),
                    Outcome::Failed(e) => e.clone(),
                })
                .collect();
            self.first_error = Some(format!("a round ended: {}", outcomes.join(" / ")));
        }
    }

    /// The row.
    fn row(mut self) -> Row {
        let spread = Spread::of(&mut self.detections);
        let survivors = Spread::of(&mut self.survivors);
        let mut row = Row::new(Impl::Attribute, "deadlocks");
        row.label = Some(DEADLOCK_LABEL);
        row.samples = self.detections.len() as u64;
        if row.samples > 0 {
            row.p50_us = Some(spread.p50_us);
            row.p99_us = Some(spread.p99_us);
            row.max_us = Some(spread.max_us);
            row.note = format!(
                "victim = the later asker in {} of {}; the other owner done {:.1} ms (p50) after \
                 the victim's error",
                self.later_victims,
                row.samples,
                survivors.p50_us / 1_000.0
            );
        }
        row.failed = Some(self.failed);
        if let Some(error) = self.first_error {
            if !row.note.is_empty() {
                row.note.push_str("; ");
            }
            row.note.push_str(&error);
        }
        row
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An ask of `outcome`, at the given milliseconds of one start.
    fn ask(asked_ms: u64, answered_ms: u64, outcome: Outcome) -> Ask {
        static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        let start = *START.get_or_init(Instant::now);
        Ask {
            asked: start + Duration::from_millis(asked_ms),
            answered: start + Duration::from_millis(answered_ms),
            outcome,
        }
    }

    #[test]
    fn a_round_with_one_victim_counts_from_the_later_ask() {
        let mut tally = Tally::default();
        tally.count(&[ask(0, 120, Outcome::Done), ask(2, 100, Outcome::Deadlock)]);
        assert_eq!(tally.detections, [98_000_000]);
        assert_eq!(tally.survivors, [20_000_000]);
        assert_eq!((tally.later_victims, tally.failed), (1, 0));
        let row = tally.row();
        assert_eq!(row.p50_us, Some(98_000.0));
        assert_eq!(row.failed, Some(0));
        assert!(row.note.contains("later asker in 1 of 1"), "{}", row.note);
    }

    #[test]
    fn rounds_without_one_victim_are_failed() {
        let mut tally = Tally::default();
        tally.count(&[ask(0, 10, Outcome::Done), ask(0, 10, Outcome::Done)]);
        tally.count(&[ask(0, 10, Outcome::Deadlock), ask(0, 10, Outcome::Deadlock)]);
        let row = tally.row();
        assert_eq!((row.failed, row.samples, row.p50_us), (Some(2), 0, None));
        assert!(row.note.contains("done / done"), "{}", row.note);
    }
}
