//! The table's types: which workload a result belongs to, one row of
//! figures, one workload's rows, and the labels of the rows that are not
//! named after their implementation (W7, W8, W9, W10, W11). The workloads
//! fill them in and the report prints them and finds rows by them; this
//! module uses neither.

use crate::contenders::Impl;
use crate::transport::Transport;

/// A workload of the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkloadId {
    /// One task, one key.
    W1,
    /// 64 tasks, a key each.
    W2,
    /// 8 tasks, one key, one process.
    W3,
    /// 8 tasks, one key, 4 processes.
    W3p,
    /// W1 on 5-node Redlock.
    W4,
    /// 10,000 locks held with renewal.
    W5,
    /// Attribute overhead.
    W6,
    /// Takeover after a crash.
    W7,
    /// Two keys at once.
    W8,
    /// Shared readers and a writer.
    W9,
    /// Failover of an election's leader.
    W10,
    /// Deadlock detection: two owners in a cycle.
    W11,
}

impl WorkloadId {
    /// Every workload, in table order.
    pub const ALL: [WorkloadId; 12] = [
        WorkloadId::W1,
        WorkloadId::W2,
        WorkloadId::W3,
        WorkloadId::W3p,
        WorkloadId::W4,
        WorkloadId::W5,
        WorkloadId::W6,
        WorkloadId::W7,
        WorkloadId::W8,
        WorkloadId::W9,
        WorkloadId::W10,
        WorkloadId::W11,
    ];

    /// `W1`, ..., `W3p`, ...
    pub fn name(self) -> &'static str {
        match self {
            WorkloadId::W1 => "W1",
            WorkloadId::W2 => "W2",
            WorkloadId::W3 => "W3",
            WorkloadId::W3p => "W3p",
            WorkloadId::W4 => "W4",
            WorkloadId::W5 => "W5",
            WorkloadId::W6 => "W6",
            WorkloadId::W7 => "W7",
            WorkloadId::W8 => "W8",
            WorkloadId::W9 => "W9",
            WorkloadId::W10 => "W10",
            WorkloadId::W11 => "W11",
        }
    }

    /// The workload named `name`, ignoring case.
    pub fn parse(name: &str) -> Option<WorkloadId> {
        WorkloadId::ALL
            .into_iter()
            .find(|id| id.name().eq_ignore_ascii_case(name))
    }
}

/// One implementation's figures in one workload. `None` means "does not
/// apply" and shows as `-`.
#[derive(Clone, Debug)]
pub struct Row {
    /// Which implementation.
    pub implementation: Impl,
    /// A label of the row's own, where one implementation has several rows
    /// or is used in a particular way (W8, W9); otherwise the
    /// implementation's.
    pub label: Option<&'static str>,
    /// The main rate, per second.
    pub rate: Option<f64>,
    /// What [`rate`](Self::rate) counts ("cycles", "acquisitions", ...).
    pub rate_unit: &'static str,
    /// Median cycle time, or median wait in the contended workloads (µs).
    pub p50_us: Option<f64>,
    /// 99th percentile of the same (µs).
    pub p99_us: Option<f64>,
    /// Maximum of the same (µs).
    pub max_us: Option<f64>,
    /// Owner switches per second (contended workloads).
    pub switches_per_s: Option<f64>,
    /// Fewest and most acquisitions of one task (contended workloads).
    pub per_task: Option<(u64, u64)>,
    /// Critical sections that overlapped (must be 0).
    pub overlaps: Option<u64>,
    /// Acquisitions that failed or gave up.
    pub failed: Option<u64>,
    /// Locks lost while held (W5; must be 0).
    pub locks_lost: Option<u64>,
    /// Client CPU time over wall time, percent of one CPU (W5).
    pub cpu_percent: Option<f64>,
    /// Resident memory added per held lock, bytes (W5).
    pub rss_per_lock: Option<f64>,
    /// Extra time per call over the guard API, percent (W6).
    pub overhead_percent: Option<f64>,
    /// Commands the server ran per round (W7).
    pub commands_per_round: Option<f64>,
    /// CPU time of the bench process per cycle, µs (throughput rows): the
    /// client's cost, steadier than the rate on a shared machine.
    pub client_cpu_us: Option<f64>,
    /// CPU time of the redis-server processes per cycle, µs (throughput
    /// rows).
    pub server_cpu_us: Option<f64>,
    /// The rate of each interleaved round, in order (throughput rows): the
    /// rounds of two rows with the same index ran next to each other.
    pub round_rates: Vec<f64>,
    /// How many operations the figures come from.
    pub samples: u64,
    /// Anything else worth knowing (the first error, a breakdown).
    pub note: String,
}

impl Row {
    /// A row with only the implementation and the rate's unit set.
    pub fn new(implementation: Impl, rate_unit: &'static str) -> Row {
        Row {
            implementation,
            label: None,
            rate: None,
            rate_unit,
            p50_us: None,
            p99_us: None,
            max_us: None,
            switches_per_s: None,
            per_task: None,
            overlaps: None,
            failed: None,
            locks_lost: None,
            cpu_percent: None,
            rss_per_lock: None,
            overhead_percent: None,
            commands_per_round: None,
            samples: 0,
            round_rates: Vec::new(),
            client_cpu_us: None,
            server_cpu_us: None,
            note: String::new(),
        }
    }

    /// The name shown in the table.
    pub fn label(&self) -> &'static str {
        self.label.unwrap_or(self.implementation.label())
    }
}

/// One workload's rows and the parameters they were measured with.
#[derive(Clone, Debug)]
pub struct WorkloadResult {
    /// Which workload.
    pub id: WorkloadId,
    /// What its rows talked over.
    pub transport: Transport,
    /// What it does, in a few words.
    pub title: &'static str,
    /// Its parameters, as printed.
    pub params: String,
    /// One row per implementation.
    pub rows: Vec<Row>,
}

impl WorkloadResult {
    /// The row of `implementation`, if it ran.
    pub fn row(&self, implementation: Impl) -> Option<&Row> {
        self.rows
            .iter()
            .find(|row| row.implementation == implementation)
    }

    /// The row labelled `label`, if it ran.
    pub fn labelled(&self, label: &str) -> Option<&Row> {
        self.rows.iter().find(|row| row.label() == label)
    }
}

/// W7: the release row whose holder is another library (a value not in
/// lock-core's format, compare-and-delete without `PUBLISH`).
pub const FOREIGN: &str = "lock-core, foreign release";
/// W7: a value in lock-core's format, released without `PUBLISH`.
pub const UNANNOUNCED: &str = "lock-core, silent release, our format";
/// W7: a lock-core holder: the release publishes.
pub const PUBLISHED: &str = "lock-core, own release";

/// W8: lock-core's row.
pub const LOCK_ALL_LABEL: &str = "lock-core lock_all";

/// W9: the readers taking shared holds.
pub const SHARED_READERS: &str = "lock-core shared: readers";
/// W9: the writer beside shared readers.
pub const SHARED_WRITER: &str = "lock-core shared: writer";
/// W9: the readers of the baseline, every hold exclusive.
pub const EXCLUSIVE_READERS: &str = "lock-core exclusive: readers";
/// W9: the writer of the baseline.
pub const EXCLUSIVE_WRITER: &str = "lock-core exclusive: writer";

/// W10: lock-core's campaigners, from the leader's resignation.
pub const CAMPAIGN_RESIGNED: &str = "lock-core campaign: resignation";
/// W10: lock-core's campaigners, from the crashed leader's kill.
pub const CAMPAIGN_KILLED: &str = "lock-core campaign: crash (kill)";
/// W10: lock-core's campaigners, from the crashed leader's lease expiry.
pub const CAMPAIGN_EXPIRED: &str = "lock-core campaign: crash (expiry)";
/// W10: the rslock loop (the baseline), from the leader's resignation.
pub const RSLOCK_RESIGNED: &str = "rslock loop: resignation";
/// W10: the rslock loop, from the crashed leader's kill.
pub const RSLOCK_KILLED: &str = "rslock loop: crash (kill)";
/// W10: the rslock loop, from the crashed leader's lease expiry.
pub const RSLOCK_EXPIRED: &str = "rslock loop: crash (expiry)";

/// W11: lock-core's row, two owners in a cycle of waits.
pub const DEADLOCK_LABEL: &str = "lock-core: 2 owners in a cycle";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workload_names_parse_back() {
        for id in WorkloadId::ALL {
            assert_eq!(WorkloadId::parse(id.name()), Some(id));
        }
        assert_eq!(WorkloadId::parse("w3P"), Some(WorkloadId::W3p));
        assert_eq!(WorkloadId::parse("w7"), Some(WorkloadId::W7));
        assert_eq!(WorkloadId::parse("w10"), Some(WorkloadId::W10));
        assert_eq!(WorkloadId::parse("w11"), Some(WorkloadId::W11));
        assert_eq!(WorkloadId::parse("W12"), None);
    }
}
