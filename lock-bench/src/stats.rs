//! Figures from raw samples: percentiles, and the contended workloads'
//! acquisition records merged into throughput, owner switches, waits,
//! fairness and overlaps.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A duration in nanoseconds, saturating.
pub fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Nanoseconds since the Unix epoch on the system's real-time clock.
///
/// The contended workloads stamp acquisitions with it because it is the one
/// clock every process of the machine shares (`Instant` cannot be compared
/// across processes); over a run of seconds its slewing is negligible.
pub fn wall_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, nanos)
}

/// The `p`-th percentile (0..=100) of `sorted` (ascending), nearest rank;
/// 0 when empty.
pub fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (p / 100.0 * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Median, 99th percentile and maximum of durations in nanoseconds,
/// reported in microseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Spread {
    /// Median, µs.
    pub p50_us: f64,
    /// 99th percentile, µs.
    pub p99_us: f64,
    /// Maximum, µs.
    pub max_us: f64,
}

impl Spread {
    /// Sorts `samples_ns` and summarises it.
    pub fn of(samples_ns: &mut [u64]) -> Spread {
        samples_ns.sort_unstable();
        let us = |ns: u64| ns as f64 / 1_000.0;
        Spread {
            p50_us: us(percentile(samples_ns, 50.0)),
            p99_us: us(percentile(samples_ns, 99.0)),
            max_us: us(samples_ns.last().copied().unwrap_or(0)),
        }
    }
}

/// One acquisition in a contended workload, on the [`wall_ns`] clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record {
    /// The task, numbered across processes.
    pub task: u32,
    /// When the task started asking for the lock.
    pub wait_start: u64,
    /// When its critical section started (after the lock was granted).
    pub acquired: u64,
    /// When its critical section ended (before the release was sent).
    pub released: u64,
}

impl Record {
    /// The record as a line of the worker protocol.
    pub fn to_line(self) -> String {
        format!(
            "rec {} {} {} {}",
            self.task, self.wait_start, self.acquired, self.released
        )
    }

    /// Parses what [`to_line`](Self::to_line) wrote.
    pub fn from_line(line: &str) -> Option<Record> {
        let mut parts = line.strip_prefix("rec ")?.split(' ');
        let mut next = || parts.next()?.parse::<u64>().ok();
        Some(Record {
            task: u32::try_from(next()?).ok()?,
            wait_start: next()?,
            acquired: next()?,
            released: next()?,
        })
    }
}

/// The figures of a contended workload.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Contention {
    /// Acquisitions in the measured window.
    pub acquisitions: u64,
    /// Acquisitions per second over the window.
    pub acquisitions_per_s: f64,
    /// Acquisitions by another task than the previous holder, per second.
    pub switches_per_s: f64,
    /// From asking to holding, over every acquisition.
    pub wait: Spread,
    /// The fewest acquisitions of any task in the window.
    pub per_task_min: u64,
    /// The most acquisitions of any task in the window.
    pub per_task_max: u64,
    /// Critical sections that started before an earlier one had ended.
    pub overlaps: u64,
}

impl Contention {
    /// Merges the records of every task (`tasks` of them, ids `0..tasks`)
    /// measured over `[start, end]` (wall-clock ns). Rates count the
    /// acquisitions inside the window; waits cover every record, so a task
    /// that waited across the end still counts.
    pub fn from_records(records: &mut [Record], tasks: u32, start: u64, end: u64) -> Contention {
        records.sort_unstable_by_key(|r| (r.acquired, r.task));
        let seconds = end.saturating_sub(start) as f64 / 1e9;
        let mut per_task = vec![0u64; usize::try_from(tasks).unwrap_or(0)];
        let mut acquisitions = 0u64;
        let mut switches = 0u64;
        let mut previous: Option<u32> = None;
        let mut overlaps = 0u64;
        let mut latest_release = 0u64;
        for record in records.iter() {
            if record.acquired < latest_release {
                overlaps += 1;
            }
            latest_release = latest_release.max(record.released);
            if record.acquired < start || record.acquired > end {
                continue;
            }
            acquisitions += 1;
            if let Some(count) = usize::try_from(record.task)
                .ok()
                .and_then(|i| per_task.get_mut(i))
            {
                *count += 1;
            }
            if previous.is_some_and(|p| p != record.task) {
                switches += 1;
            }
            previous = Some(record.task);
        }
        let mut waits: Vec<u64> = records
            .iter()
            .map(|r| r.acquired.saturating_sub(r.wait_start))
            .collect();
        let rate = |n: u64| {
            if seconds > 0.0 {
                n as f64 / seconds
            } else {
                0.0
            }
        };
        Contention {
            acquisitions,
            acquisitions_per_s: rate(acquisitions),
            switches_per_s: rate(switches),
            wait: Spread::of(&mut waits),
            per_task_min: per_task.iter().copied().min().unwrap_or(0),
            per_task_max: per_task.iter().copied().max().unwrap_or(0),
            overlaps,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(task: u32, wait_start: u64, acquired: u64, released: u64) -> Record {
        Record {
            task,
            wait_start,
            acquired,
            released,
        }
    }

    #[test]
    fn percentiles_use_nearest_rank() {
        let sorted: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&sorted, 50.0), 50);
        assert_eq!(percentile(&sorted, 99.0), 99);
        assert_eq!(percentile(&sorted, 100.0), 100);
        assert_eq!(percentile(&[7], 99.0), 7);
        assert_eq!(percentile(&[], 50.0), 0);
    }

    #[test]
    fn records_merge_into_switches_fairness_and_waits() {
        let second = 1_000_000_000;
        let mut records = vec![
            rec(1, 0, 30, 40),
            rec(0, 0, 10, 20),
            rec(0, 20, 50, 60),
            rec(2, 0, 70, 80),
        ];
        let c = Contention::from_records(&mut records, 3, 0, second);
        assert_eq!(c.acquisitions, 4);
        assert_eq!(c.switches_per_s, 3.0);
        assert_eq!((c.per_task_min, c.per_task_max), (1, 2));
        assert_eq!(c.overlaps, 0);
        assert_eq!(c.wait.max_us, 0.07);
    }

    #[test]
    fn intersecting_sections_are_overlaps() {
        let mut records = vec![rec(0, 0, 10, 50), rec(1, 0, 20, 30), rec(2, 0, 40, 60)];
        let c = Contention::from_records(&mut records, 3, 0, 1_000);
        assert_eq!(c.overlaps, 2);
    }

    #[test]
    fn acquisitions_outside_the_window_are_not_counted() {
        let mut records = vec![rec(0, 0, 5, 6), rec(1, 0, 15, 16), rec(0, 0, 25, 26)];
        let c = Contention::from_records(&mut records, 2, 10, 20);
        assert_eq!(c.acquisitions, 1);
        assert_eq!((c.per_task_min, c.per_task_max), (0, 1));
    }

    #[test]
    fn records_survive_the_worker_protocol() {
        let r = rec(5, 1, 2, 3);
        assert_eq!(Record::from_line(&r.to_line()), Some(r));
        assert_eq!(Record::from_line("rec 1 2"), None);
    }
}
