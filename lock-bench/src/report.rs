//! The results: one table for the terminal, and the same data as CSV and
//! JSON, plus the ratios the targets are stated in.

use crate::contenders::Impl;
use crate::network::NetworkNote;
use crate::sysinfo::Machine;
use crate::table::{Row, WorkloadId, WorkloadResult};
use crate::transport::Transport;
use std::fmt::Write as _;

/// What a ratio should be.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Target {
    /// At least this.
    AtLeast(f64),
    /// At most this.
    AtMost(f64),
}

impl Target {
    fn met(self, value: f64) -> bool {
        match self {
            Target::AtLeast(t) => value >= t,
            Target::AtMost(t) => value <= t,
        }
    }

    fn describe(self) -> String {
        match self {
            Target::AtLeast(t) => format!(">= {}", trim_number(t)),
            Target::AtMost(t) => format!("<= {}", trim_number(t)),
        }
    }
}

/// A figure compared across rows, with its target when the issue sets one.
#[derive(Clone, Debug)]
pub struct Ratio {
    /// Which workload it comes from.
    pub workload: WorkloadId,
    /// What that workload's rows talked over.
    pub transport: Transport,
    /// What is divided by what.
    pub name: String,
    /// The value.
    pub value: f64,
    /// The target, if any.
    pub target: Option<Target>,
}

/// Everything one run measured.
#[derive(Clone, Debug)]
pub struct Report {
    /// Where it ran.
    pub machine: Machine,
    /// The measured time of each row, seconds.
    pub seconds: f64,
    /// The workloads, in table order.
    pub workloads: Vec<WorkloadResult>,
    /// With `--rtt`: the proxy of each transport W1 and W2 ran through.
    pub networks: Vec<NetworkNote>,
}

impl Report {
    fn workload(&self, id: WorkloadId) -> Option<&WorkloadResult> {
        self.workloads.iter().find(|w| w.id == id)
    }

    /// The proxy `transport`'s W1 and W2 ran through, with `--rtt`.
    fn network(&self, transport: Transport) -> Option<&NetworkNote> {
        self.networks.iter().find(|n| n.transport == transport)
    }

    /// ` (rtt 0.5 ms)` after a transport's name, with `--rtt`.
    fn rtt_suffix(&self, transport: Transport) -> String {
        self.network(transport).map_or(String::new(), |n| {
            format!(" (rtt {} ms)", trim_number(n.rtt.as_secs_f64() * 1_000.0))
        })
    }

    /// The ratios the issue asks for, from the rows that ran.
    pub fn ratios(&self) -> Vec<Ratio> {
        let mut out = Ratios(Vec::new(), Transport::Plain);
        for w in &self.workloads {
            out.1 = w.transport;
            let network = self.network(w.transport).is_some();
            if matches!(w.id, WorkloadId::W1 | WorkloadId::W2 | WorkloadId::W4) {
                let (guard, attribute) = if network {
                    network_targets(w.id)
                } else {
                    (
                        guard_target(w.id, w.transport),
                        attribute_target(w.id, w.transport),
                    )
                };
                out.against_minimum(w, guard, attribute);
            }
            if w.id == WorkloadId::W1 && network {
                out.attribute_against_floor(w);
            }
            if w.id == WorkloadId::W8 {
                out.against_minimum(w, None, None);
            }
            if w.id == WorkloadId::W9 {
                out.shared(w);
            }
            if w.id == WorkloadId::W1 {
                out.against_floor(w);
            }
            if w.row(Impl::Rslock).is_some() && !matches!(w.id, WorkloadId::W7 | WorkloadId::W10) {
                out.against_rslock(w);
            }
            if matches!(w.id, WorkloadId::W3 | WorkloadId::W3p) {
                out.contended(w);
            }
            if w.id == WorkloadId::W7 {
                out.takeover(w);
            }
            if w.id == WorkloadId::W10 {
                out.failover(w);
            }
            if w.id == WorkloadId::W11 {
                out.deadlock(w);
            }
        }
        // The ratios across workloads: those run on plain TCP only.
        out.1 = Transport::Plain;
        if let Some(w3p) = self.workload(WorkloadId::W3p)
            && let Some(w3) = self.workload(WorkloadId::W3)
        {
            let rate = |w: &WorkloadResult| w.row(Impl::Guard).and_then(|r| r.rate);
            out.push(
                WorkloadId::W3p,
                "lock-core guard, W3 (1 process) / W3p (4 processes), acquisitions/s".to_owned(),
                div(rate(w3), rate(w3p)),
                None,
            );
        }
        if let Some(row) = self
            .workload(WorkloadId::W5)
            .and_then(|w| w.row(Impl::Guard))
        {
            out.push(
                WorkloadId::W5,
                "locks lost".to_owned(),
                row.locks_lost.map(|n| n as f64),
                Some(Target::AtMost(0.0)),
            );
            out.push(
                WorkloadId::W5,
                "RSS per held lock, bytes".to_owned(),
                row.rss_per_lock,
                Some(Target::AtMost(600.0)),
            );
            out.push(
                WorkloadId::W5,
                "client CPU while holding, % of one core".to_owned(),
                row.cpu_percent,
                Some(Target::AtMost(20.0)),
            );
        }
        if let Some(row) = self
            .workload(WorkloadId::W6)
            .and_then(|w| w.row(Impl::Attribute))
        {
            out.push(
                WorkloadId::W6,
                "attribute overhead over the guard API, %".to_owned(),
                row.overhead_percent,
                Some(Target::AtMost(3.0)),
            );
        }
        // One block per transport, in run order.
        out.0
            .sort_by_key(|r| Transport::ALL.iter().position(|&t| t == r.transport));
        out.0
    }

    /// The machine, the table and the ratios, as printed to stdout.
    pub fn render(&self) -> String {
        let m = &self.machine;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "machine: {} CPUs, {}, Linux {}, redis-server {}",
            m.nproc, m.cpu_model, m.kernel, m.redis_version
        );
        let _ = writeln!(
            out,
            "{} s measured per row; rate = per second; µs columns are the cycle time \
             (W1, W2, W4, W6, W8), the wait for the lock (W3, W3p, W9), the takeover lag (W7), \
             the failover time (W10) or the deadlock detection time (W11)",
            trim_number(self.seconds)
        );
        for n in &self.networks {
            let _ = writeln!(
                out,
                "network on {}: {}; the client's cpu/op includes the proxy's (a thread of the \
                 bench)",
                n.transport.name(),
                n.describe()
            );
        }
        out.push('\n');
        out.push_str(&self.table());
        let ratios = self.ratios();
        let width = ratios
            .iter()
            .map(|r| r.name.chars().count() + 13)
            .max()
            .unwrap_or(0);
        let mut block = None;
        for r in &ratios {
            if block != Some(r.transport) {
                block = Some(r.transport);
                let _ = writeln!(
                    out,
                    "\nratios on {}{} (same run):",
                    r.transport.name(),
                    self.rtt_suffix(r.transport)
                );
            }
            let name = format!(
                "{:<4} {:<7} {}",
                r.workload.name(),
                r.transport.name(),
                r.name
            );
            let verdict = match r.target {
                Some(t) if t.met(r.value) => format!("target {}: met", t.describe()),
                Some(t) => format!("target {}: MISSED", t.describe()),
                None => String::new(),
            };
            let line = format!("  {name:<width$}  {:>10}  {verdict}", fixed(r.value, 3));
            let _ = writeln!(out, "{}", line.trim_end());
        }
        out
    }

    /// The aligned table: a parameter line per workload, then its rows.
    fn table(&self) -> String {
        const HEADER: [&str; 12] = [
            "implementation",
            "rate/s",
            "of",
            "p50 µs",
            "p99 µs",
            "max µs",
            "switches/s",
            "per task",
            "overlaps",
            "failed",
            "samples",
            "other",
        ];
        let mut lines: Vec<Option<Vec<String>>> = vec![Some(HEADER.map(str::to_owned).to_vec())];
        let mut sections = Vec::new();
        for w in &self.workloads {
            sections.push((lines.len(), w));
            lines.push(None);
            for row in &w.rows {
                lines.push(Some(cells(row)));
            }
        }
        let mut widths = [0usize; HEADER.len()];
        for cells in lines.iter().flatten() {
            for (width, cell) in widths.iter_mut().zip(cells) {
                *width = (*width).max(cell.chars().count());
            }
        }
        let mut out = String::new();
        let mut section = sections.iter().peekable();
        for (index, line) in lines.iter().enumerate() {
            match line {
                None => {
                    if let Some((_, w)) = section.next() {
                        // Plain TCP is where every workload runs; only the
                        // others are named.
                        let on = match w.transport {
                            Transport::Plain if self.networks.is_empty() => String::new(),
                            other => format!(" on {}{}", other.name(), self.rtt_suffix(other)),
                        };
                        let _ = writeln!(out, "{}{on}  {}  [{}]", w.id.name(), w.title, w.params);
                    }
                }
                Some(cells) => {
                    let mut text = String::from("    ");
                    for (i, (cell, width)) in cells.iter().zip(widths).enumerate() {
                        // Text columns left-aligned, numbers right-aligned.
                        let left = matches!(i, 0 | 2 | 11);
                        let pad = width.saturating_sub(cell.chars().count());
                        if left {
                            text.push_str(cell);
                            text.push_str(&" ".repeat(pad));
                        } else {
                            text.push_str(&" ".repeat(pad));
                            text.push_str(cell);
                        }
                        text.push_str("  ");
                    }
                    let _ = writeln!(out, "{}", text.trim_end());
                    if index == 0 {
                        let _ = writeln!(out);
                    }
                }
            }
        }
        out
    }

    /// One line per row, with the workload's parameters on every line.
    pub fn csv(&self) -> String {
        let mut out = String::from(
            "workload,title,params,implementation,label,rate_per_s,rate_unit,p50_us,p99_us,\
             max_us,switches_per_s,per_task_min,per_task_max,overlaps,failed,locks_lost,\
             cpu_percent,rss_per_lock_bytes,overhead_percent,client_cpu_us,server_cpu_us,\
             commands_per_round,samples,seconds,note\n",
        );
        for w in &self.workloads {
            for r in &w.rows {
                let fields = [
                    w.id.name().to_owned(),
                    csv_text(w.title),
                    csv_text(&w.params),
                    r.implementation.id().to_owned(),
                    csv_text(r.label()),
                    opt(r.rate),
                    r.rate_unit.to_owned(),
                    opt(r.p50_us),
                    opt(r.p99_us),
                    opt(r.max_us),
                    opt(r.switches_per_s),
                    opt(r.per_task.map(|p| p.0)),
                    opt(r.per_task.map(|p| p.1)),
                    opt(r.overlaps),
                    opt(r.failed),
                    opt(r.locks_lost),
                    opt(r.cpu_percent),
                    opt(r.rss_per_lock),
                    opt(r.overhead_percent),
                    opt(r.client_cpu_us),
                    opt(r.server_cpu_us),
                    opt(r.commands_per_round),
                    r.samples.to_string(),
                    self.seconds.to_string(),
                    csv_text(&r.note),
                ];
                out.push_str(&fields.join(","));
                out.push('\n');
            }
        }
        out
    }

    /// The machine, the rows and the ratios as one JSON document.
    pub fn json(&self) -> String {
        let m = &self.machine;
        let mut out = String::from("{\n");
        let _ = writeln!(
            out,
            "  \"machine\": {{\"nproc\": {}, \"cpu_model\": {}, \"kernel\": {}, \"redis_version\": {}}},",
            m.nproc,
            json_text(&m.cpu_model),
            json_text(&m.kernel),
            json_text(&m.redis_version)
        );
        let _ = writeln!(out, "  \"seconds_per_row\": {},", json_number(self.seconds));
        let networks: Vec<String> = self
            .networks
            .iter()
            .map(|n| {
                format!(
                    "{{\"transport\": {}, \"rtt_ms\": {}, \"ping_proxied_us\": {}, \"ping_direct_us\": {}}}",
                    json_text(n.transport.name()),
                    json_number(n.rtt.as_secs_f64() * 1_000.0),
                    json_number(n.proxied_us),
                    json_number(n.direct_us)
                )
            })
            .collect();
        let _ = writeln!(out, "  \"networks\": [{}],", networks.join(", "));
        out.push_str("  \"workloads\": [\n");
        for (i, w) in self.workloads.iter().enumerate() {
            let _ = writeln!(
                out,
                "    {{\"id\": {}, \"transport\": {}, \"title\": {}, \"params\": {}, \"rows\": [",
                json_text(w.id.name()),
                json_text(w.transport.name()),
                json_text(w.title),
                json_text(&w.params)
            );
            for (j, r) in w.rows.iter().enumerate() {
                let fields = [
                    ("implementation", json_text(r.implementation.id())),
                    ("label", json_text(r.label())),
                    ("rate_per_s", json_opt(r.rate)),
                    ("rate_unit", json_text(r.rate_unit)),
                    ("p50_us", json_opt(r.p50_us)),
                    ("p99_us", json_opt(r.p99_us)),
                    ("max_us", json_opt(r.max_us)),
                    ("switches_per_s", json_opt(r.switches_per_s)),
                    ("per_task_min", json_opt(r.per_task.map(|p| p.0 as f64))),
                    ("per_task_max", json_opt(r.per_task.map(|p| p.1 as f64))),
                    ("overlaps", json_opt(r.overlaps.map(|n| n as f64))),
                    ("failed", json_opt(r.failed.map(|n| n as f64))),
                    ("locks_lost", json_opt(r.locks_lost.map(|n| n as f64))),
                    ("cpu_percent", json_opt(r.cpu_percent)),
                    ("rss_per_lock_bytes", json_opt(r.rss_per_lock)),
                    ("overhead_percent", json_opt(r.overhead_percent)),
                    ("client_cpu_us", json_opt(r.client_cpu_us)),
                    ("server_cpu_us", json_opt(r.server_cpu_us)),
                    ("commands_per_round", json_opt(r.commands_per_round)),
                    ("samples", r.samples.to_string()),
                    (
                        "round_rates_per_s",
                        format!(
                            "[{}]",
                            r.round_rates
                                .iter()
                                .map(|&rate| json_number(rate))
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    ),
                    ("note", json_text(&r.note)),
                ];
                let body: Vec<String> = fields
                    .iter()
                    .map(|(k, v)| format!("\"{k}\": {v}"))
                    .collect();
                let comma = if j + 1 < w.rows.len() { "," } else { "" };
                let _ = writeln!(out, "      {{{}}}{comma}", body.join(", "));
            }
            let comma = if i + 1 < self.workloads.len() {
                ","
            } else {
                ""
            };
            let _ = writeln!(out, "    ]}}{comma}");
        }
        out.push_str("  ],\n  \"ratios\": [\n");
        let ratios = self.ratios();
        for (i, r) in ratios.iter().enumerate() {
            let (kind, bound) = match r.target {
                Some(Target::AtLeast(t)) => (json_text("at_least"), json_number(t)),
                Some(Target::AtMost(t)) => (json_text("at_most"), json_number(t)),
                None => ("null".to_owned(), "null".to_owned()),
            };
            let met = r
                .target
                .map_or("null".to_owned(), |t| t.met(r.value).to_string());
            let comma = if i + 1 < ratios.len() { "," } else { "" };
            let _ = writeln!(
                out,
                "    {{\"workload\": {}, \"transport\": {}, \"name\": {}, \"value\": {}, \"target\": {kind}, \"bound\": {bound}, \"met\": {met}}}{comma}",
                json_text(r.workload.name()),
                json_text(r.transport.name()),
                json_text(&r.name),
                json_number(r.value)
            );
        }
        out.push_str("  ]\n}\n");
        out
    }
}

/// The ratios of one report, in the order they are printed; a ratio whose
/// rows did not run (or came out not finite) is left out.
struct Ratios(Vec<Ratio>, Transport);

impl Ratios {
    fn push(
        &mut self,
        workload: WorkloadId,
        name: String,
        value: Option<f64>,
        target: Option<Target>,
    ) {
        if let Some(value) = value.filter(|v| v.is_finite()) {
            self.0.push(Ratio {
                workload,
                transport: self.1,
                name,
                value,
                target,
            });
        }
    }

    /// W1, W2, W4, W8: lock-core against the minimum, in cycles and in CPU;
    /// `target` on the cycles.
    fn against_minimum(
        &mut self,
        w: &WorkloadResult,
        guard: Option<Target>,
        attribute: Option<Target>,
    ) {
        let label = |imp| w.row(imp).map_or(Impl::label(imp), Row::label);
        for (imp, target) in [(Impl::Guard, guard), (Impl::Attribute, attribute)] {
            let name = format!("{} / minimum, cycles/s", label(imp));
            for (name, value, target) in rate_ratios(w, name, imp, Impl::Minimum, 1.0, target) {
                self.push(w.id, name, value, target);
            }
        }
        let cpu = |imp| {
            w.row(imp)
                .and_then(|r| Some(r.client_cpu_us? + r.server_cpu_us?))
        };
        for imp in [Impl::Guard, Impl::Attribute] {
            self.push(
                w.id,
                format!("minimum / {}, CPU per cycle (client + server)", label(imp)),
                div(cpu(Impl::Minimum), cpu(imp)),
                None,
            );
        }
    }

    /// W9: what shared holds buy the readers over exclusive ones, and what
    /// they cost the writer.
    fn shared(&mut self, w: &WorkloadResult) {
        use crate::table::{EXCLUSIVE_READERS, EXCLUSIVE_WRITER, SHARED_READERS, SHARED_WRITER};
        let figure = |label, f: fn(&Row) -> Option<f64>| w.labelled(label).and_then(f);
        let rate = |label| figure(label, |r| r.rate);
        self.push(
            w.id,
            "readers, shared / all exclusive, acquisitions/s".to_owned(),
            div(rate(SHARED_READERS), rate(EXCLUSIVE_READERS)),
            None,
        );
        self.push(
            w.id,
            "writer, beside shared readers / beside exclusive ones, acquisitions/s".to_owned(),
            div(rate(SHARED_WRITER), rate(EXCLUSIVE_WRITER)),
            None,
        );
        let writer = |f| div(figure(SHARED_WRITER, f), figure(EXCLUSIVE_WRITER, f));
        self.push(
            w.id,
            "writer wait p50, beside shared readers / beside exclusive ones".to_owned(),
            writer(|r| r.p50_us),
            None,
        );
        self.push(
            w.id,
            "writer wait p99, beside shared readers / beside exclusive ones".to_owned(),
            writer(|r| r.p99_us),
            None,
        );
    }

    /// W1: lock-core and the minimum against two round trips.
    fn against_floor(&mut self, w: &WorkloadResult) {
        let rate = |imp| w.row(imp).and_then(|r| r.rate);
        let name = "lock-core guard / (floor / 2), cycles/s".to_owned();
        for (name, value, target) in rate_ratios(
            w,
            name,
            Impl::Guard,
            Impl::Floor,
            0.5,
            Some(Target::AtLeast(0.9)),
        ) {
            self.push(w.id, name, value, target);
        }
        // No target: the release is a Lua script, which costs the server
        // more than a SET, so no correct lock on Redis 7.0 makes two raw
        // round trips (see the minimum's ratio).
        for imp in [Impl::Minimum, Impl::Guard] {
            self.push(
                w.id,
                format!("{} / (raw floor / 2), cycles/s", imp.label()),
                div(rate(imp), rate(Impl::RawFloor).map(|f| f / 2.0)),
                None,
            );
        }
    }

    /// W1 with `--rtt`: the attribute, which waits for one round trip per
    /// call, against the floor's one round trip per `SET`. No target: how
    /// close it comes.
    fn attribute_against_floor(&mut self, w: &WorkloadResult) {
        let name = "lock-core attribute / floor (one round trip per call), cycles/s".to_owned();
        for (name, value, target) in rate_ratios(w, name, Impl::Attribute, Impl::Floor, 1.0, None) {
            self.push(w.id, name, value, target);
        }
    }

    /// Every workload rslock ran in: lock-core's rate against rslock's.
    fn against_rslock(&mut self, w: &WorkloadResult) {
        let rate = |imp| w.row(imp).and_then(|r| r.rate);
        for imp in [Impl::Guard, Impl::Attribute] {
            let name = format!("{} / rslock, {}/s", imp.label(), unit_of(w, imp));
            if w.id == WorkloadId::W4 {
                for (name, value, target) in
                    rate_ratios(w, name, imp, Impl::Rslock, 1.0, Some(Target::AtLeast(1.0)))
                {
                    self.push(w.id, name, value, target);
                }
            } else {
                self.push(w.id, name, div(rate(imp), rate(Impl::Rslock)), None);
            }
        }
    }

    /// W7: the lag of a takeover after a crash (lock-core's p50 and against
    /// rslock's), and after releases nobody announces, with what the
    /// polling that notices them costs.
    fn takeover(&mut self, w: &WorkloadResult) {
        use crate::table::{FOREIGN, PUBLISHED, UNANNOUNCED};
        let ms = |r: &Row| r.p50_us.map(|us| us / 1_000.0);
        let crash = |imp| {
            w.rows
                .iter()
                .find(|r| r.implementation == imp && r.label.is_none())
        };
        let lock_core = crash(Impl::Guard).and_then(ms);
        self.push(
            w.id,
            "lock-core, crash takeover lag p50, ms".to_owned(),
            lock_core,
            Some(Target::AtMost(5.0)),
        );
        self.push(
            w.id,
            "rslock / lock-core, crash takeover lag p50".to_owned(),
            div(crash(Impl::Rslock).and_then(ms), lock_core),
            Some(Target::AtLeast(10.0)),
        );
        self.push(
            w.id,
            "minimum / lock-core, crash takeover lag p50".to_owned(),
            div(crash(Impl::Minimum).and_then(ms), lock_core),
            None,
        );
        self.push(
            w.id,
            format!("{FOREIGN}, lag p50, ms"),
            w.labelled(FOREIGN).and_then(ms),
            Some(Target::AtMost(40.0)),
        );
        self.push(
            w.id,
            format!("{UNANNOUNCED} (as before), lag p50, ms"),
            w.labelled(UNANNOUNCED).and_then(ms),
            None,
        );
        let commands = |label| w.labelled(label).and_then(|r| r.commands_per_round);
        self.push(
            w.id,
            "commands per round, foreign release / own release".to_owned(),
            div(commands(FOREIGN), commands(PUBLISHED)),
            None,
        );
    }

    /// W10: how soon the next leader writes, lock-core's campaigners against
    /// the rslock loop (the baseline), after a resignation and after a
    /// crash (from the kill and from the lease's expiry).
    fn failover(&mut self, w: &WorkloadResult) {
        use crate::table::{
            CAMPAIGN_EXPIRED, CAMPAIGN_KILLED, CAMPAIGN_RESIGNED, RSLOCK_EXPIRED, RSLOCK_KILLED,
            RSLOCK_RESIGNED,
        };
        let figure = |label, f: fn(&Row) -> Option<f64>| w.labelled(label).and_then(f);
        let p50: fn(&Row) -> Option<f64> = |r| r.p50_us;
        let p99: fn(&Row) -> Option<f64> = |r| r.p99_us;
        let cases = [
            ("a resignation", CAMPAIGN_RESIGNED, RSLOCK_RESIGNED),
            ("a crash, from the kill", CAMPAIGN_KILLED, RSLOCK_KILLED),
            ("a crash, from the expiry", CAMPAIGN_EXPIRED, RSLOCK_EXPIRED),
        ];
        for (case, ours, baseline) in cases {
            for (name, f) in [("p50", p50), ("p99", p99)] {
                self.push(
                    w.id,
                    format!("lock-core / rslock, failover after {case}, {name}"),
                    div(figure(ours, f), figure(baseline, f)),
                    None,
                );
            }
        }
        for (case, label) in [
            ("a resignation", CAMPAIGN_RESIGNED),
            ("a crash, from the expiry", CAMPAIGN_EXPIRED),
        ] {
            self.push(
                w.id,
                format!("lock-core, failover after {case}, p50, ms"),
                figure(label, p50).map(|us| us / 1_000.0),
                None,
            );
        }
    }

    /// W11: how soon the victim of a cycle of waits fails, in ms; the
    /// bound on the p99 is the one the detection promises (a second).
    fn deadlock(&mut self, w: &WorkloadResult) {
        use crate::table::DEADLOCK_LABEL;
        let row = w.labelled(DEADLOCK_LABEL);
        let ms = |us: Option<f64>| us.map(|us| us / 1_000.0);
        self.push(
            w.id,
            "lock-core, victim's WouldDeadlock after the cycle closed, p50, ms".to_owned(),
            ms(row.and_then(|r| r.p50_us)),
            None,
        );
        self.push(
            w.id,
            "lock-core, victim's WouldDeadlock after the cycle closed, p99, ms".to_owned(),
            ms(row.and_then(|r| r.p99_us)),
            Some(Target::AtMost(1_000.0)),
        );
    }

    /// W3, W3p: owner switches and the longest wait against rslock's.
    fn contended(&mut self, w: &WorkloadResult) {
        let switches = |imp| w.row(imp).and_then(|r| r.switches_per_s);
        let max_wait = |imp| w.row(imp).and_then(|r| r.max_us);
        for imp in [Impl::Guard, Impl::Attribute] {
            self.push(
                w.id,
                format!("{} / rslock, owner switches/s", imp.label()),
                div(switches(imp), switches(Impl::Rslock)),
                Some(Target::AtLeast(10.0)),
            );
            self.push(
                w.id,
                format!("{} / rslock, max wait", imp.label()),
                div(max_wait(imp), max_wait(Impl::Rslock)),
                Some(Target::AtMost(0.1)),
            );
        }
    }
}

/// `a / b`, when both are there and `b` is positive.
/// The guard's target against the minimum. Plain TCP keeps its own; on
/// TLS and a cluster the issue asks W1's guard for 0.95 and sets none for
/// W2's.
fn guard_target(id: WorkloadId, transport: Transport) -> Option<Target> {
    match (transport, id) {
        (Transport::Plain, _) => Some(Target::AtLeast(0.9)),
        (_, WorkloadId::W1) => Some(Target::AtLeast(0.95)),
        _ => None,
    }
}

/// The attribute's target against the minimum: it waits for one round trip
/// per call (its release is sent, not awaited), where the minimum waits for
/// two, so it must beat it clearly where the round trip dominates. On TLS
/// and a cluster the issue asks W2's attribute for 1.0 (plain TCP keeps
/// 1.2).
fn attribute_target(id: WorkloadId, transport: Transport) -> Option<Target> {
    match (id, transport) {
        (WorkloadId::W1, _) => Some(Target::AtLeast(1.5)),
        (WorkloadId::W2, Transport::Plain) => Some(Target::AtLeast(1.2)),
        (WorkloadId::W2, _) => Some(Target::AtLeast(1.0)),
        _ => Some(Target::AtLeast(0.9)),
    }
}

/// The guard's and the attribute's targets against the minimum through
/// `--rtt`'s proxy, the issue's: W1 guard 1.0 (two round trips each, the
/// guard's client costing less), W1 attribute 1.8 (one round trip against
/// two), W2 attribute 1.0.
fn network_targets(id: WorkloadId) -> (Option<Target>, Option<Target>) {
    match id {
        WorkloadId::W1 => (Some(Target::AtLeast(1.0)), Some(Target::AtLeast(1.8))),
        WorkloadId::W2 => (None, Some(Target::AtLeast(1.0))),
        _ => (None, None),
    }
}

fn div(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    }
}

/// The rate of `a` over `scale` × the rate of `b`, twice: over the whole
/// run, and as the median over the interleaved rounds of the ratio of the
/// two rows' rounds with the same index (which ran next to each other).
/// The target goes on the median when there are rounds: a pause of a shared
/// machine lands on the rounds it hits, and moves the whole-run ratio but
/// not the median.
fn rate_ratios(
    w: &WorkloadResult,
    name: String,
    a: Impl,
    b: Impl,
    scale: f64,
    target: Option<Target>,
) -> Vec<(String, Option<f64>, Option<Target>)> {
    let (Some(row_a), Some(row_b)) = (w.row(a), w.row(b)) else {
        return Vec::new();
    };
    let ratio = |x: f64, y: f64| (y > 0.0).then(|| x / (y * scale));
    let whole = row_a.rate.zip(row_b.rate).and_then(|(x, y)| ratio(x, y));
    let mut rounds: Vec<f64> = row_a
        .round_rates
        .iter()
        .zip(&row_b.round_rates)
        .filter_map(|(&x, &y)| ratio(x, y))
        .collect();
    if rounds.is_empty() {
        return vec![(name, whole, target)];
    }
    rounds.sort_by(f64::total_cmp);
    let mid = rounds.len() / 2;
    let median = if rounds.len().is_multiple_of(2) {
        f64::midpoint(rounds[mid - 1], rounds[mid])
    } else {
        rounds[mid]
    };
    vec![
        (format!("{name}, whole run"), whole, None),
        (
            format!("{name}, median of {} paired rounds", rounds.len()),
            Some(median),
            target,
        ),
    ]
}

/// What the rate of `imp` in `w` counts.
fn unit_of(w: &WorkloadResult, imp: Impl) -> &'static str {
    w.row(imp).map_or("ops", |r| r.rate_unit)
}

/// The table cells of a row.
fn cells(r: &Row) -> Vec<String> {
    let mut other = Vec::new();
    if let Some(n) = r.locks_lost {
        other.push(format!("lost {n}"));
    }
    if let Some(cpu) = r.cpu_percent {
        other.push(format!("cpu {}%", fixed(cpu, 1)));
    }
    if let Some(rss) = r.rss_per_lock {
        other.push(format!("{} B/lock", fixed(rss, 0)));
    }
    if let Some(pct) = r.overhead_percent {
        other.push(format!("overhead {pct:+.2}%"));
    }
    if let Some(n) = r.commands_per_round {
        other.push(format!("{} commands/round", fixed(n, 1)));
    }
    if let (Some(client), Some(server)) = (r.client_cpu_us, r.server_cpu_us) {
        other.push(format!(
            "cpu/op {} + {} µs",
            fixed(client, 1),
            fixed(server, 1)
        ));
    }
    if !r.note.is_empty() {
        other.push(r.note.clone());
    }
    vec![
        r.label().to_owned(),
        r.rate.map_or("-".to_owned(), |v| fixed(v, 0)),
        r.rate_unit.to_owned(),
        r.p50_us.map_or("-".to_owned(), |v| fixed(v, 1)),
        r.p99_us.map_or("-".to_owned(), |v| fixed(v, 1)),
        r.max_us.map_or("-".to_owned(), |v| fixed(v, 1)),
        r.switches_per_s.map_or("-".to_owned(), |v| fixed(v, 1)),
        r.per_task
            .map_or("-".to_owned(), |(lo, hi)| format!("{lo}..{hi}")),
        r.overlaps.map_or("-".to_owned(), |n| n.to_string()),
        r.failed.map_or("-".to_owned(), |n| n.to_string()),
        r.samples.to_string(),
        other.join("; "),
    ]
}

/// `value` with `decimals` decimals.
fn fixed(value: f64, decimals: usize) -> String {
    format!("{value:.decimals$}")
}

/// A number without trailing zeros (`0.9`, `3`, `1024`).
fn trim_number(value: f64) -> String {
    let text = format!("{value:.3}");
    text.trim_end_matches('0').trim_end_matches('.').to_owned()
}

/// A CSV field: empty for `None`.
fn opt<T: ToString>(value: Option<T>) -> String {
    value.map_or(String::new(), |v| v.to_string())
}

/// A CSV text field, quoted when needed.
fn csv_text(text: &str) -> String {
    if text.contains([',', '"', '\n']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text.to_owned()
    }
}

/// A JSON string literal.
fn json_text(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A JSON number, or `null` when not finite.
fn json_number(value: f64) -> String {
    if value.is_finite() {
        value.to_string()
    } else {
        "null".to_owned()
    }
}

/// A JSON number or `null`.
fn json_opt(value: Option<f64>) -> String {
    value.map_or("null".to_owned(), json_number)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> Report {
        let mut floor = Row::new(Impl::Floor, "round trips");
        floor.rate = Some(20_000.0);
        let mut minimum = Row::new(Impl::Minimum, "cycles");
        minimum.rate = Some(10_000.0);
        let mut guard = Row::new(Impl::Guard, "cycles");
        guard.rate = Some(9_500.0);
        guard.note = "a \"quoted\", note".to_owned();
        let mut rslock = Row::new(Impl::Rslock, "cycles");
        rslock.rate = Some(5_000.0);
        Report {
            machine: Machine::default(),
            seconds: 1.0,
            networks: Vec::new(),
            workloads: vec![WorkloadResult {
                id: WorkloadId::W1,
                transport: Transport::Plain,
                title: "one task",
                params: "ttl 10s".to_owned(),
                rows: vec![floor, minimum, guard, rslock],
            }],
        }
    }

    /// The value and target of the ratio called `name`.
    fn find(ratios: &[Ratio], name: &str) -> Option<(f64, Option<Target>)> {
        ratios
            .iter()
            .find(|r| r.name == name)
            .map(|r| (r.value, r.target))
    }

    #[test]
    fn ratios_compare_rows_of_one_workload() {
        let ratios = report().ratios();
        let find = |name: &str| find(&ratios, name);
        assert_eq!(
            find("lock-core guard / minimum, cycles/s"),
            Some((0.95, Some(Target::AtLeast(0.9))))
        );
        assert_eq!(
            find("lock-core guard / (floor / 2), cycles/s"),
            Some((0.95, Some(Target::AtLeast(0.9))))
        );
        assert_eq!(
            find("lock-core guard / rslock, cycles/s").map(|r| r.0),
            Some(1.9)
        );
        // No attribute row: no attribute ratios.
        assert!(ratios.iter().all(|r| !r.name.contains("attribute")));
    }

    #[test]
    fn the_target_goes_on_the_median_of_paired_rounds() {
        let mut report = report();
        let rows = &mut report.workloads[0].rows;
        // Round 2 of the guard hit a pause: it moves the whole-run ratio,
        // not the median of the per-round ratios (1.0, 0.95, 0.2, 0.9, 1.1).
        rows[1].round_rates = vec![100.0, 100.0, 100.0, 100.0, 100.0];
        rows[2].round_rates = vec![100.0, 95.0, 20.0, 90.0, 110.0];
        rows[2].rate = Some(83.0);
        rows[1].rate = Some(100.0);
        let ratios = report.ratios();
        let find = |name: &str| find(&ratios, name);
        assert_eq!(
            find("lock-core guard / minimum, cycles/s, whole run"),
            Some((0.83, None))
        );
        assert_eq!(
            find("lock-core guard / minimum, cycles/s, median of 5 paired rounds"),
            Some((0.95, Some(Target::AtLeast(0.9))))
        );
        // The floor has no rounds: its ratio keeps one line with the target.
        assert!(find("lock-core guard / (floor / 2), cycles/s").is_some());
    }

    #[test]
    fn rows_of_one_implementation_keep_their_labels() {
        use crate::table::{EXCLUSIVE_READERS, EXCLUSIVE_WRITER, SHARED_READERS, SHARED_WRITER};
        let rates = [
            (SHARED_READERS, 100.0),
            (SHARED_WRITER, 10.0),
            (EXCLUSIVE_READERS, 50.0),
            (EXCLUSIVE_WRITER, 20.0),
        ];
        let rows = rates
            .into_iter()
            .map(|(label, rate)| {
                let mut row = Row::new(Impl::Guard, "acquisitions");
                row.label = Some(label);
                row.rate = Some(rate);
                row
            })
            .collect();
        let report = Report {
            machine: Machine::default(),
            seconds: 1.0,
            networks: Vec::new(),
            workloads: vec![WorkloadResult {
                id: WorkloadId::W9,
                transport: Transport::Plain,
                title: "shared",
                params: String::new(),
                rows,
            }],
        };
        let ratios = report.ratios();
        let find = |name: &str| find(&ratios, name).map(|r| r.0);
        assert_eq!(
            find("readers, shared / all exclusive, acquisitions/s"),
            Some(2.0)
        );
        assert_eq!(
            find("writer, beside shared readers / beside exclusive ones, acquisitions/s"),
            Some(0.5)
        );
        assert!(report.render().contains(EXCLUSIVE_WRITER));
        assert!(report.csv().contains(SHARED_READERS));
    }

    #[test]
    fn failover_rows_are_compared_with_the_rslock_loop() {
        use crate::table::{CAMPAIGN_EXPIRED, CAMPAIGN_RESIGNED, RSLOCK_EXPIRED, RSLOCK_RESIGNED};
        let figures = [
            (Impl::Guard, CAMPAIGN_RESIGNED, 500.0, 2_000.0),
            (Impl::Guard, CAMPAIGN_EXPIRED, 1_000.0, 4_000.0),
            (Impl::Rslock, RSLOCK_RESIGNED, 50_000.0, 200_000.0),
            (Impl::Rslock, RSLOCK_EXPIRED, 40_000.0, 160_000.0),
        ];
        let rows = figures
            .into_iter()
            .map(|(imp, label, p50, p99)| {
                let mut row = Row::new(imp, "failovers");
                row.label = Some(label);
                row.p50_us = Some(p50);
                row.p99_us = Some(p99);
                row
            })
            .collect();
        let report = Report {
            machine: Machine::default(),
            seconds: 1.0,
            networks: Vec::new(),
            workloads: vec![WorkloadResult {
                id: WorkloadId::W10,
                transport: Transport::Plain,
                title: "failover",
                params: String::new(),
                rows,
            }],
        };
        let ratios = report.ratios();
        let find = |name: &str| find(&ratios, name).map(|r| r.0);
        assert_eq!(
            find("lock-core / rslock, failover after a resignation, p50"),
            Some(0.01)
        );
        assert_eq!(
            find("lock-core / rslock, failover after a crash, from the expiry, p99"),
            Some(0.025)
        );
        assert_eq!(
            find("lock-core, failover after a resignation, p50, ms"),
            Some(0.5)
        );
        // No kill rows: no ratio of them, and no rates against rslock.
        assert!(ratios.iter().all(|r| !r.name.contains("kill")));
        assert!(ratios.iter().all(|r| !r.name.contains("/s")));
        assert!(report.render().contains("W10  failover"));
    }

    #[test]
    fn deadlock_detection_is_printed_in_ms_with_its_bound() {
        use crate::table::DEADLOCK_LABEL;
        let mut row = Row::new(Impl::Attribute, "deadlocks");
        row.label = Some(DEADLOCK_LABEL);
        row.p50_us = Some(120_000.0);
        row.p99_us = Some(310_000.0);
        let report = Report {
            machine: Machine::default(),
            seconds: 1.0,
            networks: Vec::new(),
            workloads: vec![WorkloadResult {
                id: WorkloadId::W11,
                transport: Transport::Plain,
                title: "deadlock",
                params: String::new(),
                rows: vec![row],
            }],
        };
        let ratios = report.ratios();
        let find = |name: &str| find(&ratios, name);
        assert_eq!(
            find("lock-core, victim's WouldDeadlock after the cycle closed, p50, ms"),
            Some((120.0, None))
        );
        assert_eq!(
            find("lock-core, victim's WouldDeadlock after the cycle closed, p99, ms"),
            Some((310.0, Some(Target::AtMost(1_000.0))))
        );
        assert_eq!(ratios.len(), 2);
        let text = report.render();
        assert!(text.contains("W11  deadlock"));
        assert!(text.contains(DEADLOCK_LABEL));
        assert!(text.contains("target <= 1000: met"));
    }

    #[test]
    fn csv_quotes_and_json_escapes() {
        let report = report();
        let csv = report.csv();
        assert!(csv.contains("\"a \"\"quoted\"\", note\""));
        assert_eq!(csv.lines().count(), 5);
        let json = report.json();
        assert!(json.contains("\"note\": \"a \\\"quoted\\\", note\""));
        assert!(json.contains("\"p50_us\": null"));
    }

    #[test]
    fn each_transport_gets_its_block_of_ratios_and_targets() {
        let mut report = report();
        let mut tls = report.workloads[0].clone();
        tls.transport = Transport::Tls;
        // Plain first in the output, whatever the order of the workloads.
        report.workloads.insert(0, tls);
        let ratios = report.ratios();
        let on = |t: Transport| ratios.iter().filter(move |r| r.transport == t);
        assert_eq!(on(Transport::Plain).count(), on(Transport::Tls).count());
        assert!(ratios[0].transport == Transport::Plain);
        let guard = |t| {
            on(t)
                .find(|r| r.name.starts_with("lock-core guard / minimum") && r.target.is_some())
                .and_then(|r| r.target)
        };
        assert_eq!(guard(Transport::Plain), Some(Target::AtLeast(0.9)));
        assert_eq!(guard(Transport::Tls), Some(Target::AtLeast(0.95)));
        let text = report.render();
        assert!(text.contains("ratios on plain (same run):"));
        assert!(text.contains("ratios on tls (same run):"));
        assert!(text.contains("W1 on tls  one task"));
        assert!(text.contains("W1   tls     lock-core guard / minimum"));
    }

    #[test]
    fn a_network_gets_its_targets_the_floor_ratio_and_its_round_trip() {
        use crate::network::NetworkNote;
        use std::time::Duration;
        let mut report = report();
        let mut attribute = Row::new(Impl::Attribute, "cycles");
        attribute.rate = Some(18_500.0);
        report.workloads[0].rows.push(attribute);
        report.workloads[0].transport = Transport::Tls;
        report.networks.push(NetworkNote {
            transport: Transport::Tls,
            rtt: Duration::from_micros(500),
            proxied_us: 640.0,
            direct_us: 40.0,
        });
        let ratios = report.ratios();
        assert_eq!(
            find(&ratios, "lock-core attribute / minimum, cycles/s"),
            Some((1.85, Some(Target::AtLeast(1.8))))
        );
        assert_eq!(
            find(&ratios, "lock-core guard / minimum, cycles/s"),
            Some((0.95, Some(Target::AtLeast(1.0))))
        );
        assert_eq!(
            find(
                &ratios,
                "lock-core attribute / floor (one round trip per call), cycles/s"
            ),
            Some((0.925, None))
        );
        let text = report.render();
        assert!(text.contains("network on tls: rtt 0.5 ms asked"), "{text}");
        assert!(text.contains("PING through the proxy 0.640 ms"), "{text}");
        assert!(text.contains("W1 on tls (rtt 0.5 ms)  one task"), "{text}");
        assert!(
            text.contains("ratios on tls (rtt 0.5 ms) (same run):"),
            "{text}"
        );
        assert!(report.json().contains("\"rtt_ms\": 0.5"));
        // Without a network, no floor ratio and the transport's own targets.
        report.networks.clear();
        let ratios = report.ratios();
        assert!(
            ratios
                .iter()
                .all(|r| !r.name.contains("one round trip per call"))
        );
        assert_eq!(
            find(&ratios, "lock-core attribute / minimum, cycles/s").map(|r| r.1),
            Some(Some(Target::AtLeast(1.5)))
        );
    }

    #[test]
    fn table_aligns_columns() {
        let text = report().render();
        assert!(text.contains("W1  one task  [ttl 10s]"));
        assert!(text.contains("target >= 0.9: met"));
    }
}
