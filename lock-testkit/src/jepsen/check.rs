//! The checker: what a run's history and the register's final state show.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use super::history::{Acquired, Event, OpKind, OpOutcome, Released};
use super::register::{LogEntry, RegisterState};

/// How many examples of one broken invariant a report quotes.
const EXAMPLES: usize = 5;

/// What a run shows. The counts of operations come from the register's
/// log, which also holds the operations whose answer no worker saw.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// Register operations sent by the workers.
    pub operations: usize,
    /// Operations the register carried out.
    pub accepted: usize,
    /// Operations it refused for a token below one it had seen.
    pub stale_rejected: usize,
    /// Operations whose answer the worker never saw (killed while waiting,
    /// timed out); the log tells whether they were carried out.
    pub unknown: usize,
    /// Writes the register carried out: the increments made.
    pub accepted_writes: usize,
    /// The counter at the end.
    pub counter: i64,
    /// Increments overwritten by a holder that had read an older value:
    /// accepted writes minus the counter.
    pub lost_updates: i64,
    /// Leases granted.
    pub leases: usize,
    /// Leases granted after the previous holder lost the lock instead of
    /// releasing it (it was paused, killed, cut off, or the server forgot).
    pub takeovers: usize,
    /// Leases still in use after the next one was granted: their holder
    /// operated on the register (or released) after another holder got
    /// the lock.
    pub overlaps: usize,
    /// Calls for the lock that ended with `Contended`.
    pub contended: usize,
    /// Calls for the lock that ended with `Unavailable`.
    pub unavailable: usize,
    /// The longest a worker kept asking for the lock before it got it,
    /// across calls that timed out or failed.
    pub longest_wait: Duration,
    /// Grants whose fencing token was not above the previous grant's, in
    /// the order they were granted.
    pub token_regressions: usize,
    /// Broken invariants, each with a few examples. Empty means the run is
    /// consistent with its register and, when fenced, safe.
    pub violations: Vec<String>,
}

/// Checks a run: `events` and `malformed` from its
/// [`History`](super::History), `register` as the run left it, and whether
/// the workers used fencing tokens.
///
/// Always: every line is an event; what the workers say the register
/// answered matches its log; the counter is not above the accepted writes.
/// With fencing, also: the counter equals the accepted writes (no update
/// lost); every accepted operation has a token, and none has a token below
/// one that an operation accepted before it (in the register's order, and
/// in real time: ended before it started) carried.
pub fn check(
    events: &[Event],
    malformed: &[String],
    register: &RegisterState,
    fenced: bool,
) -> Report {
    let mut report = Report {
        counter: register.value,
        ..Report::default()
    };
    if !malformed.is_empty() {
        report.violations.push(format!(
            "{} lines from workers are not events: {}",
            malformed.len(),
            examples(malformed.iter())
        ));
    }
    count_operations(events, register, &mut report);
    check_answers(events, &register.log, &mut report);
    check_counter(fenced, &mut report);
    if fenced {
        check_log_tokens(&register.log, &mut report);
        check_real_time_tokens(events, &mut report);
        check_leases_have_tokens(events, &mut report);
    }
    count_leases(events, &mut report);
    report
}

/// Fills in the operation counts, from the log and the history.
fn count_operations(events: &[Event], register: &RegisterState, report: &mut Report) {
    let reported: HashSet<&str> = ops(events).map(|op| op.tag).collect();
    let unreported = register
        .log
        .iter()
        .filter(|entry| !reported.contains(entry.tag.as_str()))
        .count();
    let unanswered = ops(events)
        .filter(|op| op.outcome == OpOutcome::Unknown)
        .count();
    report.operations = reported.len() + unreported;
    report.unknown = unanswered + unreported;
    report.accepted = register.log.iter().filter(|e| e.accepted).count();
    report.stale_rejected = register.log.len() - report.accepted;
    report.accepted_writes = register
        .log
        .iter()
        .filter(|e| e.accepted && e.op == OpKind::Write)
        .count();
}

/// Whether what the workers were answered is what the register logged.
fn check_answers(events: &[Event], log: &[LogEntry], report: &mut Report) {
    let mut logged: HashMap<&str, &LogEntry> = HashMap::new();
    let mut repeated = Vec::new();
    for entry in log {
        if logged.insert(entry.tag.as_str(), entry).is_some() {
            repeated.push(entry.tag.clone());
        }
    }
    if !repeated.is_empty() {
        report.violations.push(format!(
            "{} tags logged twice by the register: {}",
            repeated.len(),
            examples(repeated.iter())
        ));
    }
    let mismatched: Vec<String> = ops(events)
        .filter(|op| op.outcome != OpOutcome::Unknown)
        .filter(|op| {
            let accepted = op.outcome == OpOutcome::Accepted;
            !logged.get(op.tag).is_some_and(|entry| {
                entry.op == op.kind
                    && entry.accepted == accepted
                    && entry.token == op.token
                    && (!accepted || entry.value == op.value)
            })
        })
        .map(|op| format!("{} ({:?} {:?})", op.tag, op.kind, op.outcome))
        .collect();
    if !mismatched.is_empty() {
        report.violations.push(format!(
            "{} answers that the register's log does not show: {}",
            mismatched.len(),
            examples(mismatched.iter())
        ));
    }
}

/// Lost updates, and whether they are allowed.
fn check_counter(fenced: bool, report: &mut Report) {
    let accepted = i64::try_from(report.accepted_writes).unwrap_or(i64::MAX);
    report.lost_updates = accepted - report.counter;
    if report.lost_updates < 0 {
        report.violations.push(format!(
            "the counter ({}) is above the number of accepted writes ({accepted})",
            report.counter
        ));
    } else if fenced && report.lost_updates > 0 {
        report.violations.push(format!(
            "{} updates lost with fencing: {accepted} accepted writes, counter {}",
            report.lost_updates, report.counter
        ));
    }
}

/// In the register's order, accepted tokens never go down.
fn check_log_tokens(log: &[LogEntry], report: &mut Report) {
    let mut highest: Option<(u64, &str)> = None;
    let mut broken = Vec::new();
    let mut untokened = Vec::new();
    for entry in log.iter().filter(|e| e.accepted) {
        let Some(token) = entry.token else {
            untokened.push(entry.tag.clone());
            continue;
        };
        match highest {
            Some((top, tag)) if token < top => {
                broken.push(format!("{} ({token}) after {tag} ({top})", entry.tag));
            }
            _ => highest = Some((token, entry.tag.as_str())),
        }
    }
    if !untokened.is_empty() {
        report.violations.push(format!(
            "{} operations accepted without a token in a fenced run: {}",
            untokened.len(),
            examples(untokened.iter())
        ));
    }
    if !broken.is_empty() {
        report.violations.push(format!(
            "{} operations accepted by the register with a token below one it had seen: {}",
            broken.len(),
            examples(broken.iter())
        ));
    }
}

/// In real time, an accepted operation never carries a token below that of
/// an accepted operation that ended before it started.
fn check_real_time_tokens(events: &[Event], report: &mut Report) {
    let accepted: Vec<Op<'_>> = ops(events)
        .filter(|op| op.outcome == OpOutcome::Accepted && op.token.is_some())
        .collect();
    let mut by_end: Vec<&Op<'_>> = accepted.iter().collect();
    by_end.sort_by_key(|op| op.end);
    let mut by_start: Vec<&Op<'_>> = accepted.iter().collect();
    by_start.sort_by_key(|op| op.start);
    let mut ended = by_end.iter().peekable();
    let mut highest: Option<&Op<'_>> = None;
    let mut broken = Vec::new();
    for op in by_start {
        while let Some(before) = ended.next_if(|before| before.end < op.start) {
            if highest.is_none_or(|top| before.token > top.token) {
                highest = Some(before);
            }
        }
        if let Some(top) = highest
            && op.token < top.token
        {
            broken.push(format!(
                "{} ({:?}) after {} ({:?}) had ended",
                op.tag, op.token, top.tag, top.token
            ));
        }
    }
    if !broken.is_empty() {
        report.violations.push(format!(
            "{} accepted operations carry a token below one accepted before they started: {}",
            broken.len(),
            examples(broken.iter())
        ));
    }
}

/// With fencing, every lease granted has a token.
fn check_leases_have_tokens(events: &[Event], report: &mut Report) {
    let missing: Vec<String> = events
        .iter()
        .filter_map(|event| match event {
            Event::Acquire {
                worker,
                lease,
                outcome: Acquired::Ok,
                token: None,
                ..
            } => Some(format!("w{worker} lease {lease}")),
            _ => None,
        })
        .collect();
    if !missing.is_empty() {
        report.violations.push(format!(
            "{} leases granted without a fencing token: {}",
            missing.len(),
            examples(missing.iter())
        ));
    }
}

/// One holding of the lock, from its grant to its holder's last act.
#[derive(Debug)]
struct Lease {
    granted: u64,
    last: u64,
    released: bool,
    token: Option<u64>,
}

/// Leases, takeovers, overlaps, waits, and how the calls for the lock
/// ended.
fn count_leases(events: &[Event], report: &mut Report) {
    let mut leases: HashMap<(u32, u32), Lease> = HashMap::new();
    // Per worker, when it began asking for the lock it has not got yet.
    let mut asking_since: HashMap<u32, u64> = HashMap::new();
    for event in events {
        match *event {
            Event::Acquire {
                worker,
                lease,
                start,
                end,
                outcome,
                token,
            } => {
                let since = *asking_since.entry(worker).or_insert(start);
                match outcome {
                    Acquired::Ok => {
                        asking_since.remove(&worker);
                        let waited = Duration::from_micros(end.saturating_sub(since));
                        report.longest_wait = report.longest_wait.max(waited);
                        let granted = Lease {
                            granted: end,
                            last: end,
                            released: false,
                            token,
                        };
                        leases.insert((worker, lease), granted);
                    }
                    Acquired::Contended => report.contended += 1,
                    Acquired::Unavailable => report.unavailable += 1,
                    Acquired::Failed => {}
                }
            }
            Event::Op {
                worker, lease, end, ..
            }
            | Event::Lost {
                worker,
                lease,
                at: end,
            } => {
                if let Some(held) = leases.get_mut(&(worker, lease)) {
                    held.last = held.last.max(end);
                }
            }
            Event::Release {
                worker,
                lease,
                start,
                outcome,
                ..
            } => {
                if let Some(held) = leases.get_mut(&(worker, lease)) {
                    held.last = held.last.max(start);
                    held.released = outcome == Released::Released;
                }
            }
            Event::Started { .. } => {}
        }
    }
    let mut leases: Vec<Lease> = leases.into_values().collect();
    leases.sort_by_key(|lease| lease.granted);
    report.leases = leases.len();
    for pair in leases.windows(2) {
        let (before, after) = (&pair[0], &pair[1]);
        if before.last > after.granted {
            report.overlaps += 1;
        }
        if !before.released {
            report.takeovers += 1;
        }
        if let (Some(earlier), Some(later)) = (before.token, after.token)
            && later <= earlier
        {
            report.token_regressions += 1;
        }
    }
}

/// Calls for the lock that returned within `[start, end]` (both in
/// [`now_us`] time), by outcome. A window in which no lock may be granted
/// (a majority of the servers down) is checked with it: no `Ok` in it.
///
/// [`now_us`]: super::now_us
pub fn calls_ended_within(events: &[Event], start: u64, end: u64) -> HashMap<Acquired, usize> {
    let mut calls = HashMap::new();
    for event in events {
        if let Event::Acquire {
            end: returned,
            outcome,
            ..
        } = *event
            && (start..=end).contains(&returned)
        {
            *calls.entry(outcome).or_insert(0) += 1;
        }
    }
    calls
}

/// A register operation from the history, borrowed.
struct Op<'a> {
    kind: OpKind,
    tag: &'a str,
    token: Option<u64>,
    start: u64,
    end: u64,
    value: Option<i64>,
    outcome: OpOutcome,
}

fn ops(events: &[Event]) -> impl Iterator<Item = Op<'_>> {
    events.iter().filter_map(|event| match event {
        Event::Op {
            op,
            tag,
            token,
            start,
            end,
            value,
            outcome,
            ..
        } => Some(Op {
            kind: *op,
            tag,
            token: *token,
            start: *start,
            end: *end,
            value: *value,
            outcome: *outcome,
        }),
        _ => None,
    })
}

/// The first few of `items`, and how many more.
fn examples<T: std::fmt::Display>(items: impl ExactSizeIterator<Item = T>) -> String {
    let more = items.len().saturating_sub(EXAMPLES);
    let mut shown: Vec<String> = items.take(EXAMPLES).map(|i| i.to_string()).collect();
    if more > 0 {
        shown.push(format!("and {more} more"));
    }
    shown.join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small history written by hand: leases, then register operations,
    /// and the register log that goes with it.
    #[derive(Default)]
    struct Run {
        events: Vec<Event>,
        log: Vec<LogEntry>,
        value: i64,
        next_tag: u32,
    }

    impl Run {
        fn lease(&mut self, worker: u32, lease: u32, granted: u64, token: Option<u64>) {
            self.events.push(Event::Acquire {
                worker,
                lease,
                start: granted.saturating_sub(3),
                end: granted,
                outcome: Acquired::Ok,
                token,
            });
        }

        fn release(&mut self, worker: u32, lease: u32, at: u64, outcome: Released) {
            self.events.push(Event::Release {
                worker,
                lease,
                start: at,
                end: at + 1,
                outcome,
            });
        }

        /// An operation the register carries out or refuses as the real
        /// register would, given the tokens; returns the value read.
        fn op(
            &mut self,
            worker: u32,
            lease: u32,
            kind: OpKind,
            token: Option<u64>,
            at: u64,
            written: i64,
        ) -> i64 {
            self.next_tag += 1;
            let tag = format!("w{worker}.{}", self.next_tag);
            let seen = self
                .log
                .iter()
                .filter(|e| e.accepted)
                .filter_map(|e| e.token)
                .max();
            let accepted = token.is_none() || token >= seen;
            let value = match (accepted, kind) {
                (false, _) => None,
                (true, OpKind::Read) => Some(self.value),
                (true, OpKind::Write) => {
                    self.value = written;
                    Some(written)
                }
            };
            self.log.push(LogEntry {
                op: kind,
                accepted,
                token,
                value,
                tag: tag.clone(),
            });
            self.events.push(Event::Op {
                worker,
                lease,
                op: kind,
                tag,
                token,
                start: at,
                end: at + 1,
                value: if kind == OpKind::Write {
                    Some(written)
                } else {
                    value
                },
                outcome: if accepted {
                    OpOutcome::Accepted
                } else {
                    OpOutcome::Rejected
                },
            });
            value.unwrap_or(-1)
        }

        fn check(&self, fenced: bool) -> Report {
            let register = RegisterState {
                value: self.value,
                max_seen: None,
                log: self.log.clone(),
            };
            check(&self.events, &[], &register, fenced)
        }
    }

    #[test]
    fn successive_holders_make_a_clean_run() {
        let mut run = Run::default();
        for (worker, at, token) in [(1, 10, 100), (2, 20, 200), (1, 30, 300)] {
            run.lease(worker, 1 + at as u32, at, Some(token));
            let v = run.op(worker, 1 + at as u32, OpKind::Read, Some(token), at + 1, 0);
            run.op(
                worker,
                1 + at as u32,
                OpKind::Write,
                Some(token),
                at + 3,
                v + 1,
            );
            run.release(worker, 1 + at as u32, at + 5, Released::Released);
        }
        let report = run.check(true);
        assert_eq!(report.violations, Vec::<String>::new());
        assert_eq!(
            (report.counter, report.accepted_writes, report.lost_updates),
            (3, 3, 0)
        );
        assert_eq!(
            (report.operations, report.accepted, report.stale_rejected),
            (6, 6, 0)
        );
        assert_eq!(
            (report.leases, report.takeovers, report.overlaps),
            (3, 0, 0)
        );
        assert_eq!(report.token_regressions, 0);
    }

    #[test]
    fn read_read_write_write_without_fencing_is_a_lost_update() {
        let mut run = Run::default();
        run.lease(1, 1, 10, None);
        let a = run.op(1, 1, OpKind::Read, None, 11, 0);
        // Worker 1 stalls; its lease runs out and worker 2 takes over.
        run.lease(2, 1, 20, None);
        let b = run.op(2, 1, OpKind::Read, None, 21, 0);
        run.op(2, 1, OpKind::Write, None, 23, b + 1);
        run.op(1, 1, OpKind::Write, None, 25, a + 1);
        run.release(1, 1, 26, Released::NotOurs);
        run.release(2, 1, 27, Released::Released);
        let report = run.check(false);
        assert_eq!(report.violations, Vec::<String>::new());
        assert_eq!(
            (report.counter, report.accepted_writes, report.lost_updates),
            (1, 2, 1)
        );
        assert_eq!((report.takeovers, report.overlaps), (1, 1));
    }

    #[test]
    fn with_fencing_the_late_write_is_refused_and_nothing_is_lost() {
        let mut run = Run::default();
        run.lease(1, 1, 10, Some(100));
        let a = run.op(1, 1, OpKind::Read, Some(100), 11, 0);
        run.lease(2, 1, 20, Some(200));
        let b = run.op(2, 1, OpKind::Read, Some(200), 21, 0);
        run.op(2, 1, OpKind::Write, Some(200), 23, b + 1);
        run.op(1, 1, OpKind::Write, Some(100), 25, a + 1);
        let report = run.check(true);
        assert_eq!(report.violations, Vec::<String>::new());
        assert_eq!(
            (report.counter, report.lost_updates, report.stale_rejected),
            (1, 0, 1)
        );
    }

    #[test]
    fn a_register_that_accepts_a_stale_token_is_caught() {
        let mut run = Run::default();
        run.lease(1, 1, 10, Some(100));
        run.lease(2, 1, 20, Some(200));
        let b = run.op(2, 1, OpKind::Read, Some(200), 21, 0);
        run.op(2, 1, OpKind::Write, Some(200), 23, b + 1);
        // A broken register: accepts token 100 after 200.
        run.op(1, 1, OpKind::Write, None, 25, 1);
        if let (Some(Event::Op { token, .. }), Some(entry)) =
            (run.events.last_mut(), run.log.last_mut())
        {
            *token = Some(100);
            entry.token = Some(100);
        }
        let report = run.check(true);
        assert_eq!(report.lost_updates, 1);
        let all = report.violations.join("\n");
        assert!(all.contains("updates lost with fencing"), "{all}");
        assert!(all.contains("below one it had seen"), "{all}");
        assert!(
            all.contains("below one accepted before they started"),
            "{all}"
        );
    }

    #[test]
    fn answers_missing_from_the_log_and_unanswered_operations_are_told_apart() {
        let mut run = Run::default();
        run.lease(1, 1, 10, Some(100));
        run.op(1, 1, OpKind::Read, Some(100), 11, 0);
        // Carried out, but the worker was killed before it saw the answer.
        run.op(1, 1, OpKind::Write, Some(100), 13, 1);
        run.events.pop();
        let report = run.check(true);
        assert_eq!(report.violations, Vec::<String>::new());
        assert_eq!(
            (report.operations, report.unknown, report.accepted_writes),
            (2, 1, 1)
        );
        // A worker told "accepted" for something the register never logged.
        run.log.clear();
        run.value = 0;
        let report = run.check(true);
        assert!(
            report
                .violations
                .iter()
                .any(|v| v.contains("does not show")),
            "{:?}",
            report.violations
        );
    }

    #[test]
    fn waits_span_failed_calls_and_token_regressions_are_counted() {
        let events = [
            Event::Acquire {
                worker: 1,
                lease: 1,
                start: 0,
                end: 1_000,
                outcome: Acquired::Ok,
                token: Some(50),
            },
            Event::Acquire {
                worker: 2,
                lease: 1,
                start: 100,
                end: 600_000,
                outcome: Acquired::Contended,
                token: None,
            },
            Event::Acquire {
                worker: 2,
                lease: 2,
                start: 600_000,
                end: 900_000,
                outcome: Acquired::Ok,
                token: Some(40),
            },
        ];
        let report = check(&events, &[], &RegisterState::default(), true);
        assert_eq!(report.longest_wait, Duration::from_micros(899_900));
        assert_eq!(
            (report.token_regressions, report.contended, report.takeovers),
            (1, 1, 1)
        );
    }

    #[test]
    fn calls_that_ended_within_a_window_are_counted_by_outcome() {
        let events = [
            Event::Acquire {
                worker: 1,
                lease: 1,
                start: 5,
                end: 15,
                outcome: Acquired::Ok,
                token: None,
            },
            Event::Acquire {
                worker: 1,
                lease: 2,
                start: 11,
                end: 19,
                outcome: Acquired::Unavailable,
                token: None,
            },
            Event::Acquire {
                worker: 2,
                lease: 1,
                start: 12,
                end: 25,
                outcome: Acquired::Ok,
                token: None,
            },
        ];
        let calls = calls_ended_within(&events, 10, 20);
        assert_eq!(calls.get(&Acquired::Unavailable), Some(&1));
        assert_eq!(calls.get(&Acquired::Ok), Some(&1));
        assert_eq!(calls_ended_within(&events, 16, 20).get(&Acquired::Ok), None);
    }
}
