//! The table a run prints: one row per run, in Markdown, so that a run's
//! output can go into the docs as it is.

use std::fmt::Write as _;

use super::check::Report;

/// The header, with the separator line under it.
pub fn header() -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| fault | backend | fencing | faults | ops | accepted | stale rejected | unknown \
         | lost updates | leases | takeovers | overlaps | unavailable | longest wait |"
    );
    let _ = write!(out, "|{}", " --- |".repeat(14));
    out
}

/// One run's row: its fault class, backend, whether it was fenced and how
/// many faults were injected, then what `report` counted.
pub fn row(fault: &str, backend: &str, fenced: bool, faults: usize, report: &Report) -> String {
    let wait = report.longest_wait;
    format!(
        "| {fault} | {backend} | {} | {faults} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} ms |",
        if fenced { "yes" } else { "no" },
        report.operations,
        report.accepted,
        report.stale_rejected,
        report.unknown,
        report.lost_updates,
        report.leases,
        report.takeovers,
        report.overlaps,
        report.unavailable,
        wait.as_millis(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_have_as_many_cells_as_the_header() {
        let cells = |line: &str| line.matches('|').count();
        let header = header();
        let mut lines = header.lines();
        let titles = lines.next().unwrap_or_default();
        let rule = lines.next().unwrap_or_default();
        let row = row("none", "1 server", true, 0, &Report::default());
        assert_eq!(cells(titles), cells(rule));
        assert_eq!(cells(titles), cells(&row));
    }
}
