//! What the machine is, and what this process costs: read from `/proc`.

use std::fs;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

/// The machine a run was measured on.
#[derive(Clone, Debug, Default)]
pub struct Machine {
    /// CPUs this process may use.
    pub nproc: usize,
    /// `model name` from `/proc/cpuinfo`.
    pub cpu_model: String,
    /// The kernel release.
    pub kernel: String,
    /// `redis_version` of the servers started.
    pub redis_version: String,
}

impl Machine {
    /// Describes this machine; `redis_version` is filled in by the caller.
    pub fn describe() -> Machine {
        let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find_map(|line| {
                let (field, value) = line.split_once(':')?;
                (field.trim() == "model name").then(|| value.trim().to_owned())
            })
            .unwrap_or_else(|| "unknown".to_owned());
        Machine {
            nproc: std::thread::available_parallelism().map_or(0, usize::from),
            cpu_model,
            kernel: fs::read_to_string("/proc/sys/kernel/osrelease")
                .map(|s| s.trim().to_owned())
                .unwrap_or_default(),
            redis_version: String::new(),
        }
    }
}

/// CPU time used by this process so far (user + system), from
/// `/proc/self/stat`.
pub fn cpu_time() -> Option<Duration> {
    let stat = fs::read_to_string("/proc/self/stat").ok()?;
    // The command name may contain spaces; the fields after it do not.
    let after_name = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // Fields 14 and 15 of the line (utime, stime) are the 12th and 13th
    // after the name.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    let ticks = utime + stime;
    let hz = clock_ticks_per_second();
    Some(Duration::from_secs_f64(ticks as f64 / hz as f64))
}

/// The resident set size of this process in bytes (`VmRSS` of
/// `/proc/self/status`).
pub fn rss_bytes() -> Option<u64> {
    let status = fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The unit of the `/proc` CPU times (`getconf CLK_TCK`, 100 on Linux),
/// asked once.
fn clock_ticks_per_second() -> u64 {
    static HZ: OnceLock<u64> = OnceLock::new();
    *HZ.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|out| String::from_utf8(out.stdout).ok()?.trim().parse().ok())
            .filter(|&hz: &u64| hz > 0)
            .unwrap_or(100)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_a_size_and_a_cpu_time() {
        assert!(rss_bytes().is_some_and(|rss| rss > 0));
        assert!(cpu_time().is_some());
        assert!(Machine::describe().nproc > 0);
    }
}
